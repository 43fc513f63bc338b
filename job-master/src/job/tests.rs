//! Unit tests of the job context (its properties are in `properties.rs`).

use super::*;
use crate::scale::Capacity;

pub(super) fn spec(kind: &str, ps: u32, workers: u32, every_shards: u32) -> JobSpec {
    let ps_role = if ps > 0 {
        format!("  ps: {{ replicas: {ps}, max_restarts: 1 }}\n")
    } else {
        String::new()
    };
    JobSpec::from_yaml(&format!(
        "name: t\nkind: {kind}\nroles:\n{ps_role}  worker: {{ replicas: {workers}, max_restarts: 2 }}\n\
         workload:\n  builtin: {{}}\ndata: {{ num_samples: 100, shard_size: 10 }}\n\
         checkpoint: {{ dir: /tmp/brain-job-test, every_shards: {every_shards} }}\n"
    ))
    .unwrap()
}

pub(super) const W0: SlotKey = SlotKey {
    role: Role::WORKER,
    index: 0,
};
pub(super) const W1: SlotKey = SlotKey {
    role: Role::WORKER,
    index: 1,
};
pub(super) const PS0: SlotKey = SlotKey {
    role: Role::PS,
    index: 0,
};

/// A job whose agents all registered and joined.
pub(super) fn running(kind: &str, ps: u32, workers: u32, every: u32) -> JobContext {
    running_spec(spec(kind, ps, workers, every))
}

/// A job of `spec` whose agents all registered and joined.
pub(super) fn running_spec(spec: JobSpec) -> JobContext {
    let (mut ctx, effects) = JobContext::new(spec, "t-1".into(), Timing::default(), 0);
    assert_eq!(effects.len(), ctx.roles.slots().count());
    for key in ctx.roles.slots().map(|s| s.key).collect::<Vec<_>>() {
        ctx.register_agent(
            key,
            1,
            "127.0.0.1".into(),
            format!("127.0.0.1:{}", 9000 + key.index),
            1,
        )
        .unwrap();
    }
    // Everyone joins; then everyone sees the closed round (or the complete cluster spec).
    for key in ctx.roles.slots().map(|s| s.key).collect::<Vec<_>>() {
        ctx.join_rendezvous(key, 1, 2).unwrap();
    }
    for key in ctx.roles.slots().map(|s| s.key).collect::<Vec<_>>() {
        assert!(ctx.join_rendezvous(key, 1, 2).unwrap().ready, "{key}");
    }
    ctx
}

pub(super) fn lease(ctx: &mut JobContext, key: SlotKey, inc: u64) -> Option<u64> {
    match ctx.lease(key, inc).unwrap().outcome {
        LeaseOutcome::Granted(s) => Some(s.id),
        _ => None,
    }
}

#[test]
fn a_resumed_context_launches_every_process_anew_from_the_latest_checkpoint() {
    let mut ctx = running("ps", 1, 2, 1);
    let a = lease(&mut ctx, W0, 1).unwrap();
    let effects = ctx.shard_done(W0, 1, a, 10).unwrap();
    assert!(matches!(
        effects.as_slice(),
        [Effect::SavePsCheckpoint { id: 1, .. }]
    ));
    let generation = ctx.generation;
    ctx.checkpoint_committed(1, "/tmp/c1".into(), 5, generation, 20)
        .unwrap();
    // After the checkpoint: one more shard done, one held, a save under way; then the
    // master dies. What it persisted is all the next one has.
    let b = lease(&mut ctx, W1, 1).unwrap();
    lease(&mut ctx, W0, 1).unwrap();
    ctx.shard_done(W1, 1, b, 30).unwrap();
    let mut back: JobContext = serde_json::from_str(&serde_json::to_string(&ctx).unwrap()).unwrap();
    assert_eq!(back.ledger.done_shards(), 2);
    let clock = back.clock_ms();
    assert!(clock >= 30, "{clock}");
    let launches = back.resume(clock + 1).unwrap();
    // Every process, each with a new incarnation, as a fresh launch.
    assert_eq!(launches.len(), 3);
    for e in &launches {
        let Effect::LaunchAgent { key, incarnation } = e else {
            panic!("{e:?}");
        };
        assert!(*incarnation > 1, "{key}");
        assert_eq!(back.roles.slot(*key).unwrap().phase, SlotPhase::Launching);
    }
    // The data rolls back to the checkpoint: the shard done after it is done again.
    assert_eq!(back.ledger.done_shards(), 1);
    assert_eq!(back.ledger.in_flight(), 0);
    assert!(!back.checkpoint_pending && !back.checkpoint_saving);
    assert!(back.generation > generation);
    back.ledger.verify_exactly_once(false).unwrap();
    // A finished job has nothing to resume.
    back.fail("for the test".into(), clock + 2);
    assert!(matches!(
        back.resume(clock + 3),
        Err(Error::InvalidRequest(_))
    ));
}

#[test]
fn a_ps_worker_failure_requeues_only_its_shard_and_restarts_only_it() {
    let mut ctx = running("ps", 1, 2, 0);
    let a = lease(&mut ctx, W0, 1).unwrap();
    let b = lease(&mut ctx, W1, 1).unwrap();
    ctx.shard_done(W1, 1, b, 3).unwrap();
    let effects = ctx.process_exited(W0, 1, 0, 9, None, 4).unwrap();
    assert!(effects.is_empty());
    assert_eq!(ctx.roles.slot(W0).unwrap().incarnation, 2);
    assert_eq!(ctx.roles.slot(W1).unwrap().incarnation, 1);
    assert_eq!(ctx.roles.slot(PS0).unwrap().incarnation, 1);
    // The dead incarnation is fenced; the new one gets the shard back first.
    assert!(matches!(
        ctx.lease(W0, 1),
        Err(Error::StaleIncarnation { .. })
    ));
    assert_eq!(
        ctx.heartbeat(W0, ctx.roles.slot(W0).unwrap().agent_id, 1, None, 0, 5)
            .unwrap()
            .0,
        AgentAction::Restart
    );
    assert_eq!(lease(&mut ctx, W0, 2), Some(a));
    assert_eq!(ctx.ledger.done_shards(), 1);
}

#[test]
fn a_ps_failure_restarts_everyone_from_the_checkpoint_and_rolls_the_ledger_back() {
    let mut ctx = running("ps", 1, 1, 2);
    for _ in 0..2 {
        let s = lease(&mut ctx, W0, 1).unwrap();
        let effects = ctx.shard_done(W0, 1, s, 3).unwrap();
        if ctx.checkpoint_pending {
            assert!(
                matches!(effects.as_slice(), [Effect::SavePsCheckpoint { id: 1, .. }]),
                "{effects:?}"
            );
        }
    }
    // Draining: no new leases until the checkpoint commits.
    assert_eq!(ctx.lease(W0, 1).unwrap().outcome, LeaseOutcome::Wait);
    ctx.checkpoint_committed(1, "/tmp/m.json".into(), 2, 0, 4)
        .unwrap();
    let s = lease(&mut ctx, W0, 1).unwrap();
    ctx.shard_done(W0, 1, s, 5).unwrap();
    assert_eq!(ctx.ledger.done_shards(), 3);
    ctx.process_exited(PS0, 1, 0, 9, None, 6).unwrap();
    assert_eq!(
        ctx.ledger.done_shards(),
        2,
        "rolled back to the checkpoint's data position"
    );
    assert!(
        ctx.roles
            .slots()
            .all(|s| s.incarnation == 2 && s.phase == SlotPhase::Restarting)
    );
    let view = ctx.join_rendezvous(PS0, 2, 7).unwrap();
    assert_eq!(view.resume_from, Some("/tmp/m.json".into()));
    ctx.ledger.verify_exactly_once(false).unwrap();
}

#[test]
fn a_checkpoint_from_before_a_restart_is_refused() {
    let mut ctx = running("ps", 1, 1, 1);
    let s = lease(&mut ctx, W0, 1).unwrap();
    ctx.shard_done(W0, 1, s, 3).unwrap();
    ctx.process_exited(PS0, 1, 1, 0, None, 4).unwrap();
    assert!(
        ctx.checkpoint_committed(1, "/tmp/m.json".into(), 1, 0, 5)
            .is_err()
    );
    assert!(ctx.checkpoints.is_empty());
}

#[test]
fn where_a_process_restored_from_is_an_event_and_nonsense_is_refused() {
    let mut ctx = running("allreduce", 0, 2, 0);
    ctx.restored(W1, 1, "memory", 40, 3).unwrap();
    assert!(
        ctx.events
            .iter()
            .any(|e| e.text == "worker-1 (incarnation 1) restored step 40 from memory"),
        "{:?}",
        ctx.events
    );
    let e = ctx.restored(W1, 1, "tape", 40, 4).unwrap_err().to_string();
    assert!(
        e.contains("restored_from is \"tape\": memory, disk or peer"),
        "{e}"
    );
    // A stale incarnation is refused like any of its calls.
    assert!(ctx.restored(W1, 7, "disk", 40, 5).is_err());
}

#[test]
fn an_allreduce_worker_failure_opens_a_new_round_for_everyone() {
    let mut ctx = running("allreduce", 0, 2, 0);
    let round = ctx.group.rendezvous().unwrap().current().unwrap().number;
    ctx.process_exited(W1, 1, 1, 0, None, 3).unwrap();
    assert!(ctx.group.rendezvous().unwrap().current().is_none());
    // The neighbour's ring error arrives with the old incarnation: ignored, not counted.
    ctx.process_exited(W0, 1, 1, 0, None, 3).unwrap();
    assert_eq!(ctx.roles.restarts()[&Role::WORKER], 1);
    assert!(!ctx.join_rendezvous(W0, 2, 4).unwrap().ready);
    let v = ctx.join_rendezvous(W1, 2, 4).unwrap();
    assert!(v.ready);
    assert_eq!(v.round, round + 1);
}

#[test]
fn exceeding_the_relaunch_limit_fails_the_job_with_the_reason() {
    let mut ctx = running("ps", 1, 1, 0);
    for inc in 1..=2 {
        ctx.process_exited(W0, inc, 3, 0, None, inc).unwrap();
        assert_eq!(ctx.phase, JobPhase::Running);
    }
    ctx.process_exited(W0, 3, 3, 0, None, 9).unwrap();
    let JobPhase::Failed { reason } = &ctx.phase else {
        panic!("{:?}", ctx.phase)
    };
    assert!(
        reason.contains("worker-0 failed (exited with code 3)"),
        "{reason}"
    );
    assert!(reason.contains("limit of 2"), "{reason}");
    // The master reads the process's last lines: they become an event and the failure
    // names the file.
    let lines = vec!["ModuleNotFoundError: No module named 'torch'".to_string()];
    ctx.note_output(W0, "/runs/j/logs/worker-0.3.log", &lines, 9);
    let JobPhase::Failed { reason } = &ctx.phase else {
        panic!("{:?}", ctx.phase)
    };
    assert!(
        reason.ends_with("; its output: /runs/j/logs/worker-0.3.log"),
        "{reason}"
    );
    let last = &ctx.events.last().unwrap().text;
    assert!(
        last.starts_with("worker-0's last output (/runs/j/logs/worker-0.3.log):\n")
            && last.ends_with("No module named 'torch'"),
        "{last}"
    );
    let ps_agent = ctx.roles.slot(PS0).unwrap().agent_id;
    assert_eq!(
        ctx.heartbeat(PS0, ps_agent, 1, None, 0, 10).unwrap().0,
        AgentAction::Shutdown
    );
}

#[test]
fn a_node_without_the_shared_checkpoint_directory_fails_the_job_at_once() {
    let mut ctx = running("ps", 1, 2, 0);
    let why = format!(
        "{}: on this node (10.0.0.7) /ckpt/.brain-shared cannot be read",
        proto::CHECKPOINT_NOT_SHARED
    );
    let effects = ctx.process_exited(W1, 1, 1, 0, Some(&why), 5).unwrap();
    assert!(effects.is_empty(), "no relaunch: {effects:?}");
    let JobPhase::Failed { reason } = &ctx.phase else {
        panic!("{:?}", ctx.phase)
    };
    assert!(
        reason.starts_with("worker-1: ") && reason.contains("10.0.0.7"),
        "{reason}"
    );
    let ps_agent = ctx.roles.slot(PS0).unwrap().agent_id;
    assert_eq!(
        ctx.heartbeat(PS0, ps_agent, 1, None, 0, 10).unwrap().0,
        AgentAction::Shutdown,
        "the other processes are told to stop"
    );
}

#[test]
fn a_lost_agent_is_replaced_and_its_late_registration_refused() {
    let (mut ctx, _) = JobContext::new(spec("ps", 1, 1, 0), "t".into(), Timing::default(), 0);
    let (agent, _) = ctx
        .register_agent(PS0, 1, "h".into(), "a".into(), 1)
        .unwrap();
    let t = Timing::default().register_timeout_ms + 1;
    ctx.heartbeat(PS0, agent, 1, None, 0, t - 1).unwrap();
    assert!(ctx.agent_placed(W0, 1, 0));
    // The worker's agent, placed, never registers: after the registration timeout it is
    // relaunched.
    let effects = ctx.tick(t);
    assert_eq!(
        effects,
        vec![
            Effect::StopAgent {
                key: W0,
                graceful: false
            },
            Effect::LaunchAgent {
                key: W0,
                incarnation: 2
            }
        ]
    );
    // The agent of the launch replaced registers late: it is not adopted (its platform stops
    // it; adopted, the slot would be its until it died). The new launch's agent registers.
    assert!(
        ctx.register_agent(W0, 1, "h".into(), "b".into(), 40_000)
            .is_err()
    );
    let (_, inc) = ctx
        .register_agent(W0, 2, "h".into(), "b".into(), 40_000)
        .unwrap();
    assert_eq!(inc, 2);
    // A registered slot does not adopt stale agents.
    assert!(
        ctx.register_agent(W0, 1, "h".into(), "c".into(), 40_001)
            .is_err()
    );
}

#[test]
fn an_agent_launched_before_a_group_restart_is_adopted_with_the_new_incarnation() {
    let (mut ctx, _) = JobContext::new(spec("ps", 1, 2, 0), "t".into(), Timing::default(), 0);
    let (ps, _) = ctx
        .register_agent(PS0, 1, "h".into(), "a".into(), 1)
        .unwrap();
    ctx.register_agent(W0, 1, "h".into(), "w0".into(), 1)
        .unwrap();
    ctx.heartbeat(PS0, ps, 1, None, 0, 2).unwrap();
    // worker-1 is still launching when the PS fails: the group restarts, every incarnation
    // goes up, and worker-1's launch stands.
    ctx.process_exited(PS0, 1, 1, 0, None, 3).unwrap();
    let now = ctx.roles.slot(W1).unwrap().incarnation;
    assert!(now > 1, "{:?}", ctx.roles.slot(W1).unwrap());
    let (_, inc) = ctx
        .register_agent(W1, 1, "h".into(), "w1".into(), 4)
        .unwrap();
    assert_eq!(inc, now);
}

#[test]
fn a_process_the_platform_cannot_place_is_pending_not_lost() {
    let (mut ctx, _) = JobContext::new(spec("ps", 1, 2, 0), "t".into(), Timing::default(), 0);
    let (agent, _) = ctx
        .register_agent(PS0, 1, "h".into(), "a".into(), 1)
        .unwrap();
    ctx.agent_placed(W0, 1, 10);
    let long = 10 * Timing::default().register_timeout_ms;
    ctx.heartbeat(PS0, agent, 1, None, 0, long).unwrap();
    // Placed at 10 ms and silent since: lost. Never placed: still waiting, however long.
    let effects = ctx.tick(long);
    assert!(
        effects.contains(&Effect::LaunchAgent {
            key: W0,
            incarnation: 2
        }),
        "{effects:?}"
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::LaunchAgent { key, .. } if *key == W1))
    );
    assert_eq!(ctx.roles.slot(W1).unwrap().phase, SlotPhase::Launching);
    assert_eq!(ctx.roles.restarts().get(&Role::WORKER), Some(&1));
    // The platform gives up placing it in its time: asked for again, the same incarnation,
    // no relaunch counted, its pending clock kept (the brain gives it up by it).
    let again = ctx.agent_not_placed(W1, 1, "no node has room".into(), long + 1);
    assert_eq!(
        again,
        vec![Effect::LaunchAgent {
            key: W1,
            incarnation: 1
        }]
    );
    assert_eq!(ctx.roles.restarts().get(&Role::WORKER), Some(&1));
    assert_eq!(ctx.roles.slot(W1).unwrap().last_heartbeat_ms, 0);
    assert!(
        ctx.events
            .last()
            .unwrap()
            .text
            .contains("worker-1 still pending after")
    );
    // A late word about an older incarnation, or a placed one, changes nothing.
    assert!(ctx.agent_not_placed(W0, 1, "x".into(), long + 2).is_empty());
    assert!(!ctx.agent_placed(W0, 1, long + 2));
    // The platform's reason is kept for the brain until the process is placed.
    assert_eq!(
        ctx.roles.slot(W1).unwrap().pending_reason,
        "no node has room"
    );
    // Placed at last: the register timeout runs from then.
    assert!(ctx.agent_placed(W1, 1, long + 3));
    assert_eq!(ctx.roles.slot(W1).unwrap().pending_reason, "");
    let w1_relaunched = |effects: &[Effect]| {
        effects
            .iter()
            .any(|e| matches!(e, Effect::LaunchAgent { key, .. } if *key == W1))
    };
    let due = long + 3 + Timing::default().register_timeout_ms;
    assert!(!w1_relaunched(&ctx.tick(due)));
    assert!(w1_relaunched(&ctx.tick(due + 1)));
}

#[test]
fn the_job_succeeds_once_all_data_is_done_evaluated_and_workers_exited() {
    let mut ctx = running("allreduce", 0, 2, 0);
    while let Some(s) = lease(&mut ctx, W0, 1) {
        ctx.shard_done(W0, 1, s, 3).unwrap();
    }
    let v0 = ctx.lease(W0, 1).unwrap();
    let v1 = ctx.lease(W1, 1).unwrap();
    assert_eq!(v0.outcome, LeaseOutcome::EndOfData);
    assert!(v0.evaluate && !v1.evaluate, "exactly one evaluator");
    assert!(ctx.process_exited(W1, 1, 0, 0, None, 4).unwrap().is_empty());
    let m = MetricsRecord::default();
    assert!(
        ctx.report_metrics(W0, 1, m.clone(), Some(f64::NAN), None, 5)
            .is_err()
    );
    ctx.report_metrics(W0, 1, m, Some(0.45), Some("d".into()), 5)
        .unwrap();
    assert_eq!(
        ctx.process_exited(W0, 1, 0, 0, None, 6).unwrap(),
        vec![Effect::Finish]
    );
    ctx.finish(7);
    assert_eq!(ctx.phase, JobPhase::Succeeded);
    ctx.ledger.verify_exactly_once(true).unwrap();
}

/// Worker 0 leases every shard, is the one to evaluate, reports the final loss (the job not
/// over while it runs) and exits 0: the job finishes.
fn worker_0_does_the_data_alone_and_ends_the_job(ctx: &mut JobContext) {
    while let Some(s) = lease(ctx, W0, 1) {
        ctx.shard_done(W0, 1, s, 3).unwrap();
    }
    let v = ctx.lease(W0, 1).unwrap();
    assert_eq!(v.outcome, LeaseOutcome::EndOfData);
    assert!(v.evaluate, "the only worker evaluates");
    ctx.report_metrics(
        W0,
        1,
        MetricsRecord::default(),
        Some(0.4),
        Some("d".into()),
        5,
    )
    .unwrap();
    assert_eq!(ctx.phase, JobPhase::Running, "worker 0 still runs");
    assert_eq!(
        ctx.process_exited(W0, 1, 0, 0, None, 6).unwrap(),
        vec![Effect::Finish]
    );
}

#[test]
fn a_worker_never_started_does_not_hold_the_job_open_once_the_data_is_done() {
    // A ps job's worker 1 is lost and asked for again; no room takes it (its node is gone),
    // while worker 0 does every shard and the final evaluation.
    let mut ctx = running("ps", 1, 2, 0);
    assert!(!ctx.agent_lost(W1, 1, "its node died".into(), 2).is_empty());
    assert_eq!(ctx.roles.slot(W1).unwrap().phase, SlotPhase::Launching);
    worker_0_does_the_data_alone_and_ends_the_job(&mut ctx);
    assert!(
        ctx.events
            .iter()
            .any(|e| e.text.contains("worker-1 was never started")),
        "{:?}",
        ctx.events.last()
    );
    ctx.finish(7);
    assert_eq!(ctx.phase, JobPhase::Succeeded);
    ctx.ledger.verify_exactly_once(true).unwrap();
}

#[test]
fn a_worker_that_never_joined_the_working_group_does_not_hold_the_job_open() {
    // Seen in CI's Ray chaos soak: a worker placed 40 s late, after the group formed without
    // it; registered, it waited to join a round that never came, and the job never ended.
    // Here worker 1's agent came back as incarnation 2 (registered, its process not started)
    // while the round that does the work holds incarnation 1 of it.
    let mut ctx = running("allreduce", 0, 2, 0);
    let w1 = ctx.roles.slot_mut(W1).unwrap();
    (w1.incarnation, w1.process_pid) = (2, 0);
    ctx.roles.slot_mut(W0).unwrap().process_pid = 4242;
    worker_0_does_the_data_alone_and_ends_the_job(&mut ctx);
    assert!(
        ctx.events.iter().any(|e| e.text
            == "worker-1 never joined the group that did the work (its process not started) \
                and the data is all done: it is not needed, and is stopped with the job"),
        "{:?}",
        ctx.events.last()
    );
    ctx.finish(7);
    assert_eq!(ctx.phase, JobPhase::Succeeded);
}

#[test]
fn a_script_s_worker_waiting_to_join_once_the_data_is_done_does_not_hold_the_job_open() {
    // A script joins the rendezvous itself: worker 1's process started late and waits to
    // join while worker 0's round does all the data.
    let mut ctx = running("allreduce", 0, 2, 0);
    ctx.spec.workload.builtin = None;
    ctx.spec.workload.command = Some(vec!["train".into()]);
    ctx.spec.workload.rescale = Some(crate::spec::Rescale::InPlace);
    assert!(ctx.process_joins());
    let w1 = ctx.roles.slot_mut(W1).unwrap();
    (w1.incarnation, w1.process_pid) = (2, 4343);
    ctx.roles.slot_mut(W0).unwrap().process_pid = 4242;
    worker_0_does_the_data_alone_and_ends_the_job(&mut ctx);
    assert!(
        ctx.events.iter().any(|e| e.text
            == "worker-1 never joined the group that did the work (its process waits to join) \
                and the data is all done: it is not needed, and is stopped with the job"),
        "{:?}",
        ctx.events.last()
    );
}

/// How many members the training group's current round has.
pub(super) fn round_size(ctx: &JobContext) -> usize {
    let round = ctx.group.rendezvous().and_then(|r| r.current());
    round.expect("a closed round").members.len()
}

/// Makes the workers of `ctx` elastic between 1 and 4.
pub(super) fn elastic(ctx: &mut JobContext) {
    let w = ctx.spec.roles.get_mut(&Role::WORKER).unwrap();
    (w.min, w.max) = (Some(1), Some(4));
    if let Some(r) = ctx.group.rendezvous_mut() {
        (r.min, r.max) = (1, 4);
    }
}

pub(super) fn workers(version: u64, n: u32) -> ScalePlan {
    let mut p = ScalePlan {
        version,
        ..Default::default()
    };
    p.roles.insert(
        Role::WORKER,
        crate::scale::RoleTarget {
            count: n,
            resources: None,
            ..Default::default()
        },
    );
    p
}

#[test]
fn a_removed_ps_worker_hands_back_its_shard_and_a_queued_plan_replaces_an_older_one() {
    let mut ctx = running("ps", 1, 2, 0);
    let cap = Capacity::default();
    elastic(&mut ctx);
    let held = lease(&mut ctx, W1, 1).unwrap();
    ctx.apply_plan(workers(1, 1), &cap, 5).unwrap();
    // Plans arriving meanwhile wait; the newer replaces the older.
    ctx.apply_plan(workers(2, 2), &cap, 6).unwrap();
    ctx.apply_plan(workers(3, 2), &cap, 7).unwrap();
    assert_eq!(ctx.plans.queued.as_ref().map(|p| p.version), Some(3));
    assert!(ctx.apply_plan(workers(3, 2), &cap, 7).is_err());
    let (v, _) = ctx.lease_with(W1, 1, None, None, 8).unwrap();
    assert!(v.removed);
    assert_eq!(ctx.roles.slot(W1).unwrap().phase, SlotPhase::Removed);
    // Its shard went back to the queue; worker 0 gets it.
    assert_eq!(lease(&mut ctx, W0, 1), Some(held));
    // Plan 1 is reached, plan 3 starts and brings worker 1 back with a new incarnation.
    assert_eq!(ctx.plans.reached, 1);
    assert_eq!(ctx.transition.as_ref().map(|t| t.plan.version), Some(3));
    assert_eq!(ctx.roles.slot(W1).unwrap().incarnation, 2);
    assert_eq!(ctx.roles.slot(W1).unwrap().phase, SlotPhase::Launching);
    ctx.ledger.verify_exactly_once(false).unwrap();
}

#[test]
fn the_context_round_trips_through_json() {
    let mut ctx = running("ps", 1, 2, 3);
    let s = lease(&mut ctx, W0, 1).unwrap();
    ctx.shard_done(W0, 1, s, 3).unwrap();
    lease(&mut ctx, W1, 1).unwrap();
    let json = serde_json::to_string(&ctx).unwrap();
    let back: JobContext = serde_json::from_str(&json).unwrap();
    assert_eq!(back, ctx);
}

/// A spec at every limit `vocab::spec::limits` sets is valid, and the job master takes it
/// without a panic or an allocation beyond its shards (issue 40: `num_samples` of i64::MAX
/// used to end in "capacity overflow"); one past a limit is refused with the limit.
#[test]
fn a_spec_at_the_limits_is_taken_and_one_past_them_refused() {
    use vocab::spec::limits::*;
    let at = |samples: i64, shard: i64, workers: i64| {
        JobSpec::from_yaml(&format!(
            "name: big\nkind: ps\nroles:\n  ps: {{ replicas: 1, max_restarts: {MAX_RESTARTS} }}\n  \
             worker: {{ replicas: {workers}, max: {MAX_REPLICAS}, resources: {{ cpu: 1024, \
             memory: 64Ti, gpu: {MAX_GPUS} }} }}\n\
             workload:\n  builtin: {{ hash_buckets: {MAX_HASH_BUCKETS}, num_fields: {MAX_FIELDS}, \
             batch_size: {MAX_BATCH}, step_delay_us: {MAX_STEP_DELAY_US} }}\n\
             data: {{ num_samples: {samples}, shard_size: {shard}, eval_samples: \
             {MAX_EVAL_SAMPLES} }}\nepochs: {MAX_EPOCHS}\n\
             checkpoint: {{ dir: /tmp/brain-job-test }}\n"
        ))
        .unwrap()
    };
    // Every shard of every epoch at the limit.
    let shard = (MAX_SAMPLES as u64 * MAX_EPOCHS as u64).div_ceil(MAX_SHARDS) as i64;
    let spec = at(MAX_SAMPLES, shard, 1);
    spec.validate().unwrap();
    let (ctx, _) = JobContext::new(spec, "big-1".into(), Timing::default(), 0);
    assert!(ctx.spec.shards_per_epoch() * MAX_EPOCHS as u64 <= MAX_SHARDS);
    for (spec, says) in [
        (at(i64::MAX, shard, 1), "data.num_samples"),
        (at(MAX_SAMPLES, 1, 1), "data.shard_size"),
        (at(1000, 10, MAX_REPLICAS + 1), "roles.worker.replicas"),
    ] {
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.starts_with(says) && e.contains("limit"), "{e}");
    }
    for (res, says) in [
        ("{ memory: 1e30 }", "roles.worker.resources.memory"),
        ("{ cpu: 100000 }", "roles.worker.resources.cpu"),
        ("{ gpu: 65 }", "roles.worker.resources.gpu"),
    ] {
        let s = JobSpec::from_yaml(&format!(
            "name: j\nkind: allreduce\nroles:\n  worker: {{ resources: {res} }}\nworkload:\n  \
             builtin: {{}}\ndata: {{ num_samples: 10, shard_size: 1 }}\ncheckpoint: {{ dir: /t }}\n"
        ))
        .unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.starts_with(says) && e.contains("above the limit"), "{e}");
    }
}
