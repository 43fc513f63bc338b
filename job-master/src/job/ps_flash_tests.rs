//! Unit tests of a ps job's flash cuts: the parameter servers copy their partitions into their
//! agents' memory at the drained cut, training goes on once every copy is taken, and the step
//! is committed with the ledger of the cut once every partition is written out.

use super::flash::{FlashPart, PartWritten};
use super::tests::{PS0, W0, W1, lease, running_spec, spec};
use super::*;

const PS1: SlotKey = SlotKey {
    role: Role::PS,
    index: 1,
};

/// A ps job of 2 PS and 2 workers with flash checkpoints, a cut every 2 shards.
fn flash_job() -> JobContext {
    let mut spec = spec("ps", 2, 2, 2);
    spec.checkpoint.flash = Some(vocab::spec::FlashSpec {
        memory: Some(vocab::units::Bytes(4 << 20)),
    });
    running_spec(spec)
}

/// Two shards done by worker 0: the cut is due and drained. Its effects.
fn two_shards(ctx: &mut JobContext, now: u64) -> Vec<Effect> {
    let mut effects = Vec::new();
    for t in 0..2 {
        let s = lease(ctx, W0, 1).unwrap();
        effects = ctx.shard_done(W0, 1, s, now + t).unwrap();
    }
    effects
}

/// Two shards done at 10 ms: the cut at step 2 is copied into the PS' memory. Its generation.
fn copying_at_step_2(ctx: &mut JobContext) -> u64 {
    match two_shards(ctx, 10).as_slice() {
        [Effect::CopyPsCut { generation, .. }] => *generation,
        e => panic!("{e:?}"),
    }
}

fn part(step: u64, rank: u32) -> PartWritten {
    PartWritten {
        step,
        rank,
        parts: 2,
        part: FlashPart {
            path: format!("/c/flash/step-{step}/part-{rank}.bin").into(),
            digest: format!("d{rank}"),
            bytes: 10,
        },
        hurried: false,
    }
}

fn events(ctx: &JobContext) -> String {
    let text: Vec<&str> = ctx.events.iter().map(|e| e.text.as_str()).collect();
    text.join("\n")
}

#[test]
fn a_ps_cut_in_memory_lets_training_go_on_and_commits_with_the_cut_s_ledger() {
    let mut ctx = flash_job();
    let effects = two_shards(&mut ctx, 10);
    let [
        Effect::CopyPsCut {
            id: 1,
            step: 2,
            generation,
            ps,
            committed: None,
            ..
        },
    ] = effects.as_slice()
    else {
        panic!("{effects:?}");
    };
    assert_eq!(ps.len(), 2);
    let generation = *generation;
    // Drained until every PS holds its copy.
    assert_eq!(ctx.lease(W1, 1).unwrap().outcome, LeaseOutcome::Wait);
    assert!(ctx.ps_cut_in_memory(2, generation, 12).is_empty());
    assert!(!ctx.checkpoint_pending && !ctx.checkpoint_saving);
    assert!(
        events(&ctx).contains(
            "cut at step 2 held in the parameter servers' memory (2 of 10 shards done): \
             training goes on"
        ),
        "{}",
        events(&ctx)
    );
    // Training goes on past the cut while the parts are written out.
    let s = lease(&mut ctx, W1, 1).unwrap();
    ctx.shard_done(W1, 1, s, 13).unwrap();
    assert_eq!(
        ctx.flash_part_written(PS1, 1, part(2, 1), 14).unwrap(),
        None
    );
    let (step, done) = ctx
        .flash_part_written(PS0, 1, part(2, 0), 15)
        .unwrap()
        .expect("both partitions in");
    assert_eq!((step, done.written.len()), (2, 2));
    ctx.checkpoint_committed(1, "/c/flash/step-2/manifest.json".into(), 2, generation, 16)
        .unwrap();
    // The record holds the ledger as it was at the cut, not the shard done since.
    let rec = ctx.checkpoints.last().unwrap();
    assert_eq!((rec.step, rec.ledger.done.len()), (2, 2));
    assert_eq!(ctx.ledger.done_shards(), 3);
    assert!(ctx.flash.cuts.is_empty());
    // The next cut tells each PS the step committed, whose copy it keeps (its agent may not
    // have heard of the commit yet).
    let s = lease(&mut ctx, W1, 1).unwrap();
    let effects = ctx.shard_done(W1, 1, s, 20).unwrap();
    assert!(
        matches!(
            effects.as_slice(),
            [Effect::CopyPsCut {
                step: 4,
                committed: Some(2),
                ..
            }]
        ),
        "{effects:?}"
    );
}

#[test]
fn a_ps_cut_commits_even_when_its_parts_are_written_out_before_the_last_copy_answers() {
    let mut ctx = flash_job();
    let generation = copying_at_step_2(&mut ctx);
    ctx.flash_part_written(PS0, 1, part(2, 0), 11).unwrap();
    ctx.flash_part_written(PS1, 1, part(2, 1), 12).unwrap();
    ctx.checkpoint_committed(1, "/c/m.json".into(), 2, generation, 13)
        .unwrap();
    // The commit ended the cut; the late answer changes nothing.
    assert!(!ctx.checkpoint_pending && !ctx.checkpoint_saving);
    let before = ctx.events.len();
    assert!(ctx.ps_cut_in_memory(2, generation, 14).is_empty());
    assert_eq!(ctx.events.len(), before);
}

#[test]
fn a_ps_cut_that_a_ps_cannot_copy_goes_to_disk_and_refuses_the_copies_taken() {
    let mut ctx = flash_job();
    let generation = copying_at_step_2(&mut ctx);
    ctx.ps_cut_not_in_memory(2, generation, "ps 1 could not copy it: no slot is free", 11);
    assert!(
        events(&ctx).contains("cut at step 2 saved to disk: ps 1 could not copy it"),
        "{}",
        events(&ctx)
    );
    // PS 0's copy, written out, is not a cut held in memory any more.
    assert!(ctx.flash_part_written(PS0, 1, part(2, 0), 12).is_err());
    // Still drained: the disk save commits the cut as a synchronous one would.
    assert_eq!(ctx.lease(W1, 1).unwrap().outcome, LeaseOutcome::Wait);
    ctx.checkpoint_committed(1, "/c/ckpt-000001/manifest.json".into(), 2, generation, 13)
        .unwrap();
    assert!(!ctx.checkpoint_pending && !ctx.checkpoint_saving);
    assert!(lease(&mut ctx, W1, 1).is_some());
}

#[test]
fn a_ps_cut_that_a_cancel_follows_goes_to_disk_and_one_cancelled_during_the_copy_waits_for_it() {
    // Cancelled at the cut: straight to disk.
    let mut ctx = flash_job();
    let s = lease(&mut ctx, W0, 1).unwrap();
    ctx.shard_done(W0, 1, s, 10).unwrap();
    let effects = ctx.cancel("by the test".into(), 11);
    assert!(
        matches!(
            effects.as_slice(),
            [Effect::SavePsCheckpoint { step: 1, .. }]
        ),
        "{effects:?}"
    );
    assert!(ctx.flash.cuts.is_empty());
    // Cancelled while the PS copy: the cut is held until it is on disk.
    let mut ctx = flash_job();
    let generation = copying_at_step_2(&mut ctx);
    assert!(ctx.cancel("by the test".into(), 11).is_empty());
    assert!(ctx.ps_cut_in_memory(2, generation, 12).is_empty());
    assert!(ctx.checkpoint_pending && ctx.checkpoint_saving);
    assert!(
        events(&ctx).contains("the job is cancelled after it, so the job waits for it"),
        "{}",
        events(&ctx)
    );
}

#[test]
fn a_ps_cut_with_no_shard_done_since_the_last_checkpoint_goes_to_disk() {
    let mut ctx = flash_job();
    let generation = copying_at_step_2(&mut ctx);
    ctx.ps_cut_in_memory(2, generation, 11);
    ctx.flash_part_written(PS0, 1, part(2, 0), 12).unwrap();
    ctx.flash_part_written(PS1, 1, part(2, 1), 13).unwrap();
    ctx.checkpoint_committed(1, "/c/m.json".into(), 2, generation, 14)
        .unwrap();
    // A worker fails with nothing done since: the cut that replaces it is at the same step.
    ctx.checkpoint_pending = true;
    let effects = ctx.ps_checkpoint_if_drained(15);
    assert!(
        matches!(
            effects.as_slice(),
            [Effect::SavePsCheckpoint { step: 2, .. }]
        ),
        "{effects:?}"
    );
}

#[test]
fn a_ps_cut_after_one_never_written_out_goes_to_disk() {
    let mut ctx = flash_job();
    let generation = copying_at_step_2(&mut ctx);
    ctx.ps_cut_in_memory(2, generation, 11);
    // PS 1's agent never writes its part out; the routine cuts wait for it, for a while.
    let later = 11 + super::flash::HELD_CUT_DEFERS_MS;
    let effects = two_shards(&mut ctx, later);
    assert!(
        matches!(
            effects.as_slice(),
            [Effect::SavePsCheckpoint { step: 4, .. }]
        ),
        "{effects:?}"
    );
    ctx.checkpoint_committed(
        1,
        "/c/ckpt-000001/manifest.json".into(),
        4,
        generation,
        later + 2,
    )
    .unwrap();
    assert!(ctx.flash.cuts.is_empty(), "the stale copy is dropped");
    assert!(!ctx.checkpoint_pending);
}
