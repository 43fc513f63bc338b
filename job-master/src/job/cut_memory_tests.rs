//! Unit tests of a plan's cut held in flash memory for an in-place command: the ranks a grow
//! adds and the processes a move replaces get the cut's state from rank 0 over the new group
//! instead of waiting for the copy on disk.

use super::command_tests::{everyone_joins, granted, in_place_spec, key};
use super::*;
use crate::scale::Capacity;

/// A grow whose cut is held in flash memory: the job goes on without waiting for the copy on
/// disk, and every rank of the round formed after the cut (led by a survivor) is told to take
/// the cut's state from rank 0; a later round is not.
#[test]
fn a_grow_s_cut_held_in_memory_has_rank_0_send_its_state_to_the_round_after_it() {
    let (mut ctx, _) = JobContext::new(in_place_spec(2), "t-1".into(), Timing::default(), 0);
    let views = everyone_joins(&mut ctx, 1);
    let round = views[&key(Role::WORKER, 0)].round;
    let (w0, w1, w2) = (
        key(Role::WORKER, 0),
        key(Role::WORKER, 1),
        key(Role::WORKER, 2),
    );
    let shard = granted(ctx.lease_with(w0, 1, None, Some(round), 2).unwrap().0).unwrap();
    ctx.apply_plan(
        ScalePlan::count(1, Role::WORKER, 3),
        &Capacity::default(),
        3,
    )
    .unwrap();
    ctx.register_agent(w2, 1, "h".into(), "127.0.0.1:9002".into(), 4)
        .unwrap();
    assert!(!ctx.join_rendezvous(w2, 1, 5).unwrap().ready);
    ctx.advance(5);
    ctx.shard_done(w0, 1, shard.id, 6).unwrap();
    assert!(
        ctx.lease_with(w0, 1, None, Some(round), 6)
            .unwrap()
            .0
            .checkpoint_due
    );
    ctx.cut_in_memory(w0, 1, 3, 7).unwrap();
    assert!(
        !ctx.checkpoint_saving,
        "the grow does not wait for the disk"
    );
    let after = ctx.transition.as_ref().unwrap().round_after;
    assert_eq!(
        ctx.flash.peer_round,
        Some(super::flash::PeerRound {
            round: after,
            step: 3,
            survivors: 2,
            moved: Vec::new(),
        })
    );
    let text: Vec<&str> = ctx.events.iter().map(|e| e.text.as_str()).collect();
    assert!(
        text.iter()
            .any(|e| e.contains("the ranks the plan adds get it from rank 0 over the new group")),
        "{text:?}"
    );
    assert_eq!(ctx.join_rendezvous(w2, 1, 8).unwrap().resume_from, None);
    for k in [w0, w1] {
        ctx.join_rendezvous_at(k, 1, Some(format!("127.0.0.1:{}", 8000 + k.index)), 9)
            .unwrap();
    }
    for k in [w2, w0, w1] {
        let v = ctx.join_rendezvous(k, 1, 9).unwrap();
        assert!(
            v.ready && v.round == after && v.world_size == 3,
            "{k}: {v:?}"
        );
        assert_eq!(v.state_from_rank0, Some(3), "{k}: {v:?}");
        assert!(!v.restore_together, "survivors train in it: {k}: {v:?}");
    }
    // A member that polls its answer after the plan is reached is told the same.
    ctx.transition = None;
    assert_eq!(
        ctx.join_rendezvous(w2, 1, 10).unwrap().state_from_rank0,
        Some(3)
    );
    // Only that round: one after it (or one a new process leads) restores as any other.
    assert_eq!(
        ctx.peer_state_for(after + 1, &["127.0.0.1:8000".into()]),
        None
    );
    assert_eq!(ctx.peer_state_for(after, &["127.0.0.1:9002".into()]), None);
}

/// A job of two workers whose plan moves the workers `moved`: worker 1 trains a shard, worker
/// 0 drains, and `cut_by` reports the cut held in memory at step 3 (at 6 ms).
fn moved_at_cut(moved: &[u32], cut_by: SlotKey) -> JobContext {
    let (w0, w1) = (key(Role::WORKER, 0), key(Role::WORKER, 1));
    let (mut ctx, _) = JobContext::new(in_place_spec(2), "t-1".into(), Timing::default(), 0);
    let round = everyone_joins(&mut ctx, 1)[&w0].round;
    let shard = granted(ctx.lease_with(w1, 1, None, Some(round), 2).unwrap().0).unwrap();
    let mut plan = ScalePlan {
        version: 1,
        ..Default::default()
    };
    for &index in moved {
        plan.migrations.push(vocab::plan::Migration {
            key: key(Role::WORKER, index),
            resources: crate::spec::Resources {
                cpu: Some(vocab::Millicores(2000)),
                ..Default::default()
            },
            reason: "test".into(),
        });
    }
    ctx.apply_plan(plan, &Capacity::default(), 3).unwrap();
    ctx.shard_done(w1, 1, shard.id, 4).unwrap();
    assert!(
        ctx.lease_with(w0, 1, None, Some(round), 5)
            .unwrap()
            .0
            .checkpoint_due
    );
    ctx.cut_in_memory(cut_by, 1, 3, 6).unwrap();
    ctx
}

/// `ctx` after a cut held in memory and a plan that moved worker 0 (see [`moved_at_cut`]): the
/// move goes on without waiting for the disk, worker 0's process leaves, its successor is
/// launched, and the round after forms with worker 1 as its rank 0, which sends the cut's
/// state (step 3) to worker 0's new process.
fn worker_1_leads_moved_worker_0(ctx: &mut JobContext) {
    let (w0, w1) = (key(Role::WORKER, 0), key(Role::WORKER, 1));
    assert!(
        !ctx.checkpoint_saving,
        "the move does not wait for the disk"
    );
    let after = ctx.transition.as_ref().unwrap().round_after;
    assert!(ctx.join_rendezvous(w0, 1, 7).unwrap().removed);
    ctx.advance(7);
    assert_eq!(
        ctx.roles.slot(w0).unwrap().incarnation,
        2,
        "its successor launched"
    );
    ctx.register_agent(w0, 2, "h2".into(), "127.0.0.1:9100".into(), 7)
        .unwrap();
    ctx.join_rendezvous_at(w0, 2, Some("127.0.0.1:7100".into()), 8)
        .unwrap();
    ctx.join_rendezvous_at(w1, 1, Some("127.0.0.1:8001".into()), 8)
        .unwrap();
    for (k, inc, rank) in [(w0, 2, 1), (w1, 1, 0)] {
        let v = ctx.join_rendezvous(k, inc, 9).unwrap();
        assert!(v.ready && v.round == after, "{k}: {v:?}");
        assert_eq!((v.rank, v.state_from_rank0), (rank, Some(3)), "{k}: {v:?}");
    }
}

/// A round whose every member starts in it from a checkpoint (the whole group restarted) is
/// told it restores together, as each member asks; a first round with nothing to resume from
/// is not, nor (above) a round with survivors in it, nor one with a member whose context an
/// older master wrote (it may be a survivor).
#[test]
fn only_a_round_of_processes_that_all_start_from_a_checkpoint_restores_together() {
    let (mut ctx, _) = JobContext::new(in_place_spec(2), "t-1".into(), Timing::default(), 0);
    let views = everyone_joins(&mut ctx, 1);
    assert!(
        views.values().all(|v| v.ready && !v.restore_together),
        "{views:?}"
    );
    ctx.checkpoints.push(CheckpointRecord {
        id: 1,
        manifest: "/m".into(),
        ledger: ctx.ledger.snapshot(),
        taken_at_ms: 1,
        step: 4,
        training_ms: 0,
    });
    let w1 = key(Role::WORKER, 1);
    ctx.process_exited(w1, 1, -1, 9, None, 2).unwrap();
    let views = everyone_joins(&mut ctx, 3);
    assert!(
        views
            .values()
            .all(|v| v.ready && v.restore_together && v.resume_from.is_some()),
        "{views:?}"
    );
    let round = views[&w1].round;
    assert!(ctx.restores_together(round));
    let w0 = key(Role::WORKER, 0);
    ctx.roles.slot_mut(w0).unwrap().first_round = Some(FIRST_ROUND_UNKNOWN);
    assert!(!ctx.restores_together(round));
    // Nor once it has asked again: it counts as told an earlier round in its incarnation.
    let inc = ctx.roles.slot(w0).unwrap().incarnation;
    assert!(!ctx.join_rendezvous(w0, inc, 4).unwrap().restore_together);
    assert!(!ctx.restores_together(round));
}

/// A plan that moves a process, with its cut held in flash memory: the job goes on without
/// waiting for the copy on disk, and the moved process's successor takes the cut's state from
/// rank 0 (a process that took part in the cut) as the round after it forms; rank 0 of the cut
/// leads that round whatever the moved indices. A plan that moves rank 0 of the cut has the
/// lowest index it keeps lead instead, and rank 0's copy is still the one committed; a plan
/// that moves every process of the cut waits for the disk.
#[test]
fn a_move_s_cut_held_in_memory_has_rank_0_send_its_state_to_the_moved_process() {
    let (w0, w1) = (key(Role::WORKER, 0), key(Role::WORKER, 1));
    // Moving worker 1: worker 0 leads the round after and sends the cut's state.
    let mut ctx = moved_at_cut(&[1], w0);
    assert!(
        !ctx.checkpoint_saving,
        "the move does not wait for the disk"
    );
    let after = ctx.transition.as_ref().unwrap().round_after;
    assert_eq!(
        ctx.flash.peer_round,
        Some(super::flash::PeerRound {
            round: after,
            step: 3,
            survivors: 2,
            moved: vec![1],
        })
    );
    let text: Vec<&str> = ctx.events.iter().map(|e| e.text.as_str()).collect();
    assert!(
        text.iter()
            .any(|e| e
                .contains("the processes the plan moves get it from rank 0 over the new group")),
        "{text:?}"
    );
    // Worker 1's process leaves the old group at its rejoin, as a removed member does, and
    // only then is its successor launched (stopped at the cut, it would have broken the old
    // group's last collectives).
    assert_eq!(
        ctx.roles.slot(w1).unwrap().incarnation,
        1,
        "still in the old group"
    );
    let v = ctx.join_rendezvous(w1, 1, 7).unwrap();
    assert!(v.removed && !v.ready, "{v:?}");
    let launched = ctx.advance(7);
    assert!(
        launched.iter().any(|e| matches!(
            e,
            Effect::LaunchAgent { key, incarnation: 2 } if *key == w1
        )),
        "{launched:?}"
    );
    assert_eq!(
        ctx.roles
            .slot(w1)
            .unwrap()
            .resources
            .as_ref()
            .and_then(|r| r.cpu),
        Some(vocab::Millicores(2000)),
        "with the plan's resources"
    );
    assert!(ctx.advance(7).is_empty(), "launched once");
    ctx.register_agent(w1, 2, "h2".into(), "127.0.0.1:9101".into(), 7)
        .unwrap();
    ctx.join_rendezvous_at(w1, 2, Some("127.0.0.1:7101".into()), 8)
        .unwrap();
    ctx.join_rendezvous_at(w0, 1, Some("127.0.0.1:8000".into()), 8)
        .unwrap();
    for (k, inc) in [(w0, 1), (w1, 2)] {
        let v = ctx.join_rendezvous(k, inc, 9).unwrap();
        assert!(
            v.ready && v.round == after && v.world_size == 2,
            "{k}: {v:?}"
        );
        assert_eq!(v.state_from_rank0, Some(3), "{k}: {v:?}");
    }
    // The moved process's new address never counts as one that took part in the cut.
    assert_eq!(ctx.peer_state_for(after, &["127.0.0.1:7101".into()]), None);

    // A moved process that never asks to join again is stopped and launched anew after the
    // register timeout.
    let mut ctx = moved_at_cut(&[1], w0);
    let timeout = ctx.timing.register_timeout_ms;
    for k in [w0, w1] {
        let inc = ctx.roles.slot(k).unwrap().incarnation;
        ctx.heartbeat(
            k,
            ctx.roles.slot(k).unwrap().agent_id,
            inc,
            None,
            0,
            6 + timeout,
        )
        .unwrap();
    }
    assert!(ctx.tick(6 + timeout).is_empty(), "not before the timeout");
    let launched = ctx.tick(7 + timeout);
    assert!(
        launched.iter().any(|e| matches!(
            e,
            Effect::LaunchAgent { key, incarnation: 2 } if *key == w1
        )),
        "{launched:?}"
    );

    // Moving worker 0 when worker 1 was rank 0 of the cut (as after a round it led): worker 1
    // leads the round after (rank 0) though worker 0's successor has the lower index, and
    // sends it the state.
    let mut ctx = moved_at_cut(&[0], w1);
    worker_1_leads_moved_worker_0(&mut ctx);
    // The round after that goes by index again.
    ctx.transition = None;
    ctx.group.rendezvous_mut().unwrap().invalidate();
    for (k, inc) in [(w1, 1), (w0, 2)] {
        ctx.join_rendezvous(k, inc, 10).unwrap();
    }
    assert_eq!(ctx.join_rendezvous(w0, 2, 10).unwrap().rank, 0);

    // Moving rank 0 of the cut: worker 1, which the plan keeps, leads the round after and
    // sends the state, and is asked to write its copy out too; rank 0's copy, written out by
    // its agent once it has been moved, is still the cut's and is committed.
    let mut ctx = moved_at_cut(&[0], w0);
    assert_eq!(
        (ctx.persist_step_for(w1), ctx.persist_step_for(w0)),
        (Some(3), None)
    );
    worker_1_leads_moved_worker_0(&mut ctx);
    let part = super::flash::PartWritten {
        step: 3,
        rank: 0,
        parts: 1,
        part: super::flash::FlashPart {
            path: "/c/flash/step-3/part-0.bin".into(),
            digest: "d0".into(),
            bytes: 10,
        },
        hurried: false,
    };
    // Its first incarnation's part is taken, though that process is gone (worker 1's would
    // be too: it is current).
    let (step, done) = ctx
        .flash_part_written(w0, 1, part, 10)
        .unwrap()
        .expect("rank 0's copy completes the step");
    assert_eq!((step, done.written.len()), (3, 1));
    let generation = ctx.generation;
    ctx.checkpoint_committed(1, "/c/flash/step-3/manifest.json".into(), 3, generation, 11)
        .unwrap();
    assert_eq!(ctx.checkpoints.last().map(|c| c.step), Some(3));
    assert_eq!(ctx.persist_step_for(w1), None, "committed: asked no more");

    // Moving both: no process of the cut is left to send it; the cut waits for the disk.
    let ctx = moved_at_cut(&[0, 1], w0);
    assert!(ctx.checkpoint_saving, "the move waits for the disk");
    assert_eq!(ctx.flash.peer_round, None);
    let text: Vec<&str> = ctx.events.iter().map(|e| e.text.as_str()).collect();
    assert!(
        text.iter()
            .any(|e| e.contains("the plan moves every process of the cut it keeps")),
        "{text:?}"
    );
}
