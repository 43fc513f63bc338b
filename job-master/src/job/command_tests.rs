//! Unit tests of how a plan is carried out for a user command that does not speak the master's
//! protocol (restart at the new size), and of the deadline on a consistent cut.

use super::*;
use crate::scale::Capacity;

fn command_spec(kind: &str, ps: u32, workers: u32) -> JobSpec {
    let ps_role = if ps > 0 {
        format!("  ps: {{ replicas: {ps}, min: 1, max: 3 }}\n")
    } else {
        String::new()
    };
    JobSpec::from_yaml(&format!(
        "name: t\nkind: {kind}\nroles:\n{ps_role}  worker: {{ replicas: {workers}, min: 1, max: 4 }}\n\
         workload:\n  command: [train]\n  grace_period_ms: 7000\n\
         data: {{ num_samples: 100, shard_size: 10 }}\ncheckpoint: {{ dir: /tmp/brain-job-test }}\n"
    ))
    .unwrap()
}

pub(super) fn key(role: Role, index: u32) -> SlotKey {
    SlotKey { role, index }
}

/// Registers every slot's agent at its current incarnation, then has every live slot join
/// twice (the first pass forms the group, the second sees it); returns the joins' answers.
pub(super) fn everyone_joins(ctx: &mut JobContext, now: u64) -> BTreeMap<SlotKey, JoinView> {
    let keys: Vec<SlotKey> = ctx.keys_where(|s| s.phase.is_live());
    for &k in &keys {
        if ctx.roles.slot(k).unwrap().phase == SlotPhase::Launching {
            let inc = ctx.roles.slot(k).unwrap().incarnation;
            ctx.register_agent(
                k,
                inc,
                "h".into(),
                format!("127.0.0.1:{}", 9000 + k.index),
                now,
            )
            .unwrap();
        }
    }
    let mut views = BTreeMap::new();
    for _ in 0..2 {
        for &k in &keys {
            let inc = ctx.roles.slot(k).unwrap().incarnation;
            let addr = format!("127.0.0.1:{}", 7000 + 10 * inc + u64::from(k.index));
            views.insert(k, ctx.join_rendezvous_at(k, inc, Some(addr), now).unwrap());
        }
    }
    views
}

#[test]
fn a_plan_on_a_command_restarts_the_whole_group_at_the_new_size() {
    let (mut ctx, _) = JobContext::new(
        command_spec("allreduce", 0, 2),
        "t-1".into(),
        Timing::default(),
        0,
    );
    assert_eq!(ctx.grace_period_ms(), 7000, "the spec's grace period wins");
    let views = everyone_joins(&mut ctx, 1);
    assert!(views.values().all(|v| v.ready && v.world_size == 2));
    let (w0, w1, w2) = (
        key(Role::WORKER, 0),
        key(Role::WORKER, 1),
        key(Role::WORKER, 2),
    );

    // 2 -> 3: no cut to wait for; the new worker launches and both survivors restart.
    let effects = ctx
        .apply_plan(
            ScalePlan::count(1, Role::WORKER, 3),
            &Capacity::default(),
            10,
        )
        .unwrap();
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::LaunchAgent { key, .. } if *key == w2)),
        "{effects:?}"
    );
    assert_eq!(ctx.transition.as_ref().map(|t| t.step), Some(Step::Settle));
    for k in [w0, w1] {
        assert_eq!(
            ctx.roles.slot(k).unwrap().phase,
            SlotPhase::Restarting,
            "{k}"
        );
        let agent = ctx.roles.slot(k).unwrap().agent_id;
        let (action, inc, restarts) = ctx.heartbeat(k, agent, 1, None, 100, 11).unwrap();
        assert_eq!((action, inc, restarts), (AgentAction::Restart, 2, 1), "{k}");
    }
    let views = everyone_joins(&mut ctx, 12);
    for (k, v) in &views {
        assert!(v.ready && v.world_size == 3, "{k}: {v:?}");
        assert_eq!(
            v.restart_count, 1,
            "{k}: one restart count for the whole group"
        );
    }
    // A new port for the new group: rank 0 serves where it asked to, not where it registered.
    assert_eq!(views[&w0].peers[0], format!("127.0.0.1:{}", 7000 + 10 * 2));
    ctx.advance(13);
    assert_eq!(ctx.plans.reached, 1);
    assert!(ctx.transition.is_none());

    // 3 -> 1: the removed workers' agents are stopped (their grace period applies).
    let effects = ctx
        .apply_plan(
            ScalePlan::count(2, Role::WORKER, 1),
            &Capacity::default(),
            20,
        )
        .unwrap();
    for k in [w1, w2] {
        assert!(
            effects.contains(&Effect::StopAgent {
                key: k,
                graceful: true
            }),
            "{k}: {effects:?}"
        );
    }
    let views = everyone_joins(&mut ctx, 21);
    assert_eq!(views.len(), 1);
    assert!(views[&w0].ready && views[&w0].world_size == 1);
    assert_eq!(views[&w0].restart_count, 2);
    ctx.advance(22);
    assert_eq!(ctx.plans.reached, 2);

    // The only worker exits 0: the job is done although no shard was ever leased.
    let inc = ctx.roles.slot(w0).unwrap().incarnation;
    let effects = ctx.process_exited(w0, inc, 0, 0, None, 30).unwrap();
    assert_eq!(effects, vec![Effect::Finish]);
    assert!(
        !ctx.data_tracked(),
        "the master never saw the command's data"
    );
}

#[test]
fn a_process_killed_after_its_grace_period_is_recorded() {
    let (mut ctx, _) = JobContext::new(
        command_spec("allreduce", 0, 2),
        "t-1".into(),
        Timing::default(),
        0,
    );
    everyone_joins(&mut ctx, 1);
    let w1 = key(Role::WORKER, 1);
    ctx.apply_plan(
        ScalePlan::count(1, Role::WORKER, 1),
        &Capacity::default(),
        10,
    )
    .unwrap();
    // The agent of worker 0 had to SIGKILL its old process: the exit of the replaced
    // incarnation changes nothing but is written down.
    let why = "did not exit within its grace period of 7000 ms after SIGTERM and was killed";
    let effects = ctx
        .process_exited(key(Role::WORKER, 0), 1, -1, 9, Some(why), 11)
        .unwrap();
    assert!(effects.is_empty());
    assert!(
        ctx.events
            .iter()
            .any(|e| e.text == format!("worker-0 incarnation 1 {why}")),
        "{:?}",
        ctx.events
    );
    assert_eq!(ctx.roles.slot(w1).unwrap().phase, SlotPhase::Removed);
}

#[test]
fn a_ps_command_starts_once_every_task_joined_and_ends_with_its_chief() {
    let (mut ctx, _) =
        JobContext::new(command_spec("ps", 1, 3), "t-1".into(), Timing::default(), 0);
    let keys: Vec<SlotKey> = ctx.roles.slots().map(|s| s.key).collect();
    for &k in &keys {
        ctx.register_agent(k, 1, "h".into(), format!("127.0.0.1:{}", 9000 + k.index), 1)
            .unwrap();
    }
    // Nobody starts until the last task asks: TF needs the whole cluster spec.
    for (i, &k) in keys.iter().enumerate() {
        let v = ctx.join_rendezvous(k, 1, 2).unwrap();
        assert_eq!(v.ready, i + 1 == keys.len(), "{k}: {v:?}");
        if !v.ready {
            assert!(
                v.waiting_reason.contains("every task"),
                "{}",
                v.waiting_reason
            );
        }
    }
    let v = ctx.join_rendezvous(key(Role::WORKER, 0), 1, 3).unwrap();
    let cluster = v.cluster.unwrap();
    assert_eq!((cluster.ps.len(), cluster.workers.len()), (1, 3));
    // Adding a worker restarts every task, parameter servers too, with a new cluster spec.
    ctx.apply_plan(
        ScalePlan::count(1, Role::WORKER, 4),
        &Capacity::default(),
        5,
    )
    .unwrap();
    assert_eq!(
        ctx.roles.slot(key(Role::PS, 0)).unwrap().phase,
        SlotPhase::Restarting
    );
    let views = everyone_joins(&mut ctx, 6);
    assert!(views.values().all(|v| v.ready), "{views:?}");
    assert_eq!(
        views[&key(Role::WORKER, 3)]
            .cluster
            .as_ref()
            .unwrap()
            .workers
            .len(),
        4
    );
    ctx.advance(7);
    assert_eq!(ctx.plans.reached, 1);
    // The chief (worker 0) exits 0; the other TF servers never end on their own.
    let inc = ctx.roles.slot(key(Role::WORKER, 0)).unwrap().incarnation;
    let effects = ctx
        .process_exited(key(Role::WORKER, 0), inc, 0, 0, None, 8)
        .unwrap();
    assert_eq!(effects, vec![Effect::Finish]);
}

#[test]
fn a_cut_that_never_comes_is_abandoned_and_the_job_keeps_its_size() {
    let spec = JobSpec::from_yaml(
        "name: t\nkind: allreduce\nroles:\n  worker: { replicas: 2, min: 1, max: 4 }\n\
         workload:\n  builtin: {}\ndata: { num_samples: 100, shard_size: 10 }\n\
         checkpoint: { dir: /tmp/brain-job-test }\n",
    )
    .unwrap();
    let timing = Timing {
        cut_timeout_ms: 1_000,
        ..Timing::default()
    };
    let (mut ctx, _) = JobContext::new(spec, "t-1".into(), timing, 0);
    everyone_joins(&mut ctx, 1);
    let (w0, w2) = (key(Role::WORKER, 0), key(Role::WORKER, 2));
    // Worker 0 holds a shard and never gives it back: the cut cannot be reached.
    assert!(matches!(
        ctx.lease(w0, 1).unwrap().outcome,
        LeaseOutcome::Granted(_)
    ));
    ctx.apply_plan(
        ScalePlan::count(1, Role::WORKER, 3),
        &Capacity::default(),
        10,
    )
    .unwrap();
    assert_eq!(ctx.transition.as_ref().map(|t| t.step), Some(Step::Cut));
    let deadline = 10 + ctx.timing.cut_timeout_ms;
    assert!(ctx.tick(deadline).is_empty(), "not before the deadline");
    let effects = ctx.tick(deadline + 1);
    assert!(
        effects.contains(&Effect::StopAgent {
            key: w2,
            graceful: true
        }),
        "the worker the plan added leaves: {effects:?}"
    );
    assert!(ctx.transition.is_none());
    assert_eq!(ctx.role_counts()[&Role::WORKER], 2);
    let abandoned = ctx.plans.abandoned.clone().unwrap();
    assert_eq!(abandoned.version, 1);
    assert!(
        abandoned.reason.contains("consistent cut was not reached"),
        "{}",
        abandoned.reason
    );
    assert!(!ctx.checkpoint_pending);
    // The job goes on: a newer plan is accepted.
    ctx.apply_plan(
        ScalePlan::count(2, Role::WORKER, 1),
        &Capacity::default(),
        deadline + 2,
    )
    .unwrap();
}

#[test]
fn any_failure_of_a_ps_command_restarts_every_task() {
    let (mut ctx, _) =
        JobContext::new(command_spec("ps", 1, 2), "t-1".into(), Timing::default(), 0);
    everyone_joins(&mut ctx, 1);
    // A worker dies: its address is in every task's TF_CONFIG, so all of them restart.
    let w1 = key(Role::WORKER, 1);
    ctx.process_exited(w1, 1, -1, 9, None, 2).unwrap();
    for (k, s) in ctx.roles.slots().map(|s| (&s.key, s)) {
        assert_eq!(
            (s.phase, s.incarnation, s.restart_count),
            (SlotPhase::Restarting, 2, 1),
            "{k}"
        );
    }
    let views = everyone_joins(&mut ctx, 3);
    assert!(views.values().all(|v| v.ready), "{views:?}");
}

/// An allreduce command that trains through the Python SDK (`rescale: in_place`).
pub(super) fn in_place_spec(workers: u32) -> JobSpec {
    let mut spec = command_spec("allreduce", 0, workers);
    spec.workload.rescale = Some(crate::spec::Rescale::InPlace);
    spec
}

pub(super) fn granted(v: LeaseView) -> Option<crate::ledger::ShardRange> {
    match v.outcome {
        LeaseOutcome::Granted(s) => Some(s),
        _ => None,
    }
}

#[test]
fn an_in_place_command_re_forms_at_a_cut_and_keeps_its_processes() {
    let (mut ctx, _) = JobContext::new(in_place_spec(2), "t-1".into(), Timing::default(), 0);
    assert!(!ctx.restarts_to_rescale());
    let views = everyone_joins(&mut ctx, 1);
    let round = views[&key(Role::WORKER, 0)].round;
    let (w0, w1, w2) = (
        key(Role::WORKER, 0),
        key(Role::WORKER, 1),
        key(Role::WORKER, 2),
    );
    let (lease, _) = ctx.lease_with(w0, 1, None, Some(round), 2).unwrap();
    let shard = granted(lease).expect("a shard");
    assert!(ctx.data_tracked());

    let effects = ctx
        .apply_plan(
            ScalePlan::count(1, Role::WORKER, 3),
            &Capacity::default(),
            3,
        )
        .unwrap();
    // Only the new worker launches: nobody is stopped or restarted.
    assert_eq!(
        effects,
        vec![Effect::LaunchAgent {
            key: w2,
            incarnation: 1
        }]
    );
    // The group trains on while the new process starts (its agent starts it at once).
    assert!(ctx.process_joins());
    assert_eq!(ctx.transition.as_ref().unwrap().step, Step::Launch);
    let (lease, _) = ctx.lease_with(w1, 1, None, Some(round), 4).unwrap();
    let shard1 = granted(lease).expect("training goes on during the launch");
    ctx.register_agent(w2, 1, "h".into(), "127.0.0.1:9002".into(), 4)
        .unwrap();
    assert!(!ctx.join_rendezvous(w2, 1, 5).unwrap().ready);
    ctx.advance(5);
    // It has joined: now the leases drain to a cut.
    assert_eq!(ctx.transition.as_ref().unwrap().step, Step::Cut);
    ctx.shard_done(w1, 1, shard1.id, 5).unwrap();
    assert!(
        ctx.lease_with(w1, 1, None, Some(round), 5)
            .unwrap()
            .0
            .checkpoint_due
    );
    // A checkpoint before every lease is back is no cut.
    let early = ctx.checkpoint_committed(1, "/tmp/m.json".into(), 3, 0, 5);
    assert!(
        early
            .unwrap_err()
            .to_string()
            .contains("must be taken at a consistent cut"),
    );
    ctx.shard_done(w0, 1, shard.id, 6).unwrap();
    ctx.checkpoint_committed(1, "/tmp/m.json".into(), 3, 0, 7)
        .unwrap();
    assert!(
        ctx.lease_with(w0, 1, None, Some(round), 8)
            .unwrap()
            .0
            .reform
    );
    assert_eq!(
        ctx.join_rendezvous(w2, 1, 8).unwrap().resume_from,
        Some("/tmp/m.json".into()),
        "the new rank loads the cut checkpoint"
    );
    for k in [w0, w1] {
        ctx.join_rendezvous_at(k, 1, Some(format!("127.0.0.1:{}", 8000 + k.index)), 9)
            .unwrap();
    }
    let v = ctx.join_rendezvous(w0, 1, 9).unwrap();
    assert!(v.ready && v.world_size == 3 && v.round > round, "{v:?}");
    ctx.advance(10);
    assert_eq!(ctx.plans.reached, 1);
    assert_eq!(
        (
            ctx.roles.slot(w0).unwrap().incarnation,
            ctx.roles.slot(w1).unwrap().incarnation
        ),
        (1, 1)
    );
    assert_eq!(
        ctx.roles.slot(w0).unwrap().restart_count,
        0,
        "survivors were not restarted"
    );

    // A survivor still speaking for the old group is refused, with the reason.
    let stale = ctx.lease_with(w1, 1, None, Some(round), 11).unwrap_err();
    assert_eq!(
        stale.to_string(),
        format!(
            "worker 1 asked from rendezvous round {round}, but the group re-formed in round {}: \
             join the rendezvous again",
            v.round
        )
    );
    assert!(ctx.lease_with(w1, 1, None, Some(v.round), 12).is_ok());
    // Worker 2 has not polled its answer yet: a plan now (removing it) would leave the others
    // waiting for it in their group's forming. It waits until every member has heard.
    ctx.apply_plan(
        ScalePlan::count(2, Role::WORKER, 2),
        &Capacity::default(),
        13,
    )
    .unwrap();
    assert!(ctx.transition.is_none(), "the plan waits");
    assert_eq!(ctx.plans.queued.as_ref().map(|p| p.version), Some(2));
    ctx.tick(14);
    assert!(ctx.transition.is_none());
    assert!(ctx.join_rendezvous(w2, 1, 15).unwrap().ready);
    ctx.tick(15);
    assert_eq!(ctx.transition.as_ref().map(|t| t.plan.version), Some(2));
}

#[test]
fn a_checkpoint_outside_a_cut_counts_only_when_the_master_tracks_no_data() {
    let (mut ctx, _) = JobContext::new(in_place_spec(2), "t-1".into(), Timing::default(), 0);
    everyone_joins(&mut ctx, 1);
    // The script saved on SIGTERM; it reads its own data, so that is its resume point.
    ctx.checkpoint_committed(1, "/tmp/sigterm/manifest.json".into(), 40, 0, 2)
        .unwrap();
    assert_eq!(ctx.latest_checkpoint().unwrap().step, 40);
    let w0 = key(Role::WORKER, 0);
    ctx.lease_with(w0, 1, None, None, 3).unwrap();
    assert!(
        ctx.checkpoint_committed(2, "/tmp/later/manifest.json".into(), 41, 0, 4)
            .is_err(),
        "once shards are leased, a checkpoint must be at a cut"
    );
}

#[test]
fn a_script_that_stops_leasing_before_the_end_of_its_data_fails_the_job() {
    let (mut ctx, _) = JobContext::new(in_place_spec(1), "t-1".into(), Timing::default(), 0);
    everyone_joins(&mut ctx, 1);
    let w0 = key(Role::WORKER, 0);
    let shard = granted(ctx.lease_with(w0, 1, None, None, 2).unwrap().0).unwrap();
    ctx.shard_done(w0, 1, shard.id, 3).unwrap();
    ctx.process_exited(w0, 1, 0, 0, None, 4).unwrap();
    match &ctx.phase {
        JobPhase::Failed { reason } => assert_eq!(
            reason,
            "every worker exited 0 with 1 of 10 shards done: the script stopped leasing before \
             the end of its data"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_plan_whose_new_processes_start_after_the_data_ran_out_is_abandoned_and_the_job_succeeds() {
    let (mut ctx, _) = JobContext::new(in_place_spec(2), "t-1".into(), Timing::default(), 0);
    everyone_joins(&mut ctx, 1);
    let (w0, w1, w2) = (
        key(Role::WORKER, 0),
        key(Role::WORKER, 1),
        key(Role::WORKER, 2),
    );
    ctx.apply_plan(
        ScalePlan::count(1, Role::WORKER, 3),
        &Capacity::default(),
        2,
    )
    .unwrap();
    assert_eq!(ctx.transition.as_ref().unwrap().step, Step::Launch);
    // The group of 2 trains through every shard while worker 2 is still starting.
    let mut now = 3;
    while let Some(s) = granted(ctx.lease_with(w0, 1, None, None, now).unwrap().0) {
        ctx.shard_done(w0, 1, s.id, now).unwrap();
        now += 1;
    }
    assert!(ctx.ledger.is_complete());
    let mut effects = Vec::new();
    for k in [w0, w1] {
        effects.extend(ctx.process_exited(k, 1, 0, 0, None, now).unwrap());
    }
    effects.extend(ctx.tick(now + 1));
    assert!(ctx.transition.is_none());
    assert_eq!(ctx.roles.slot(w2).unwrap().phase, SlotPhase::Removed);
    assert!(effects.contains(&Effect::Finish), "{effects:?}");
    assert_eq!(ctx.phase, JobPhase::Finishing);
    assert!(
        ctx.events
            .iter()
            .any(|e| e.text.contains("plan 1 abandoned: every shard was done")),
    );
}

#[test]
fn checkpoints_beyond_keep_leave_the_record_and_their_directories_are_deleted() {
    let mut spec = in_place_spec(2);
    spec.checkpoint.keep = Some(2);
    let root = spec.checkpoint.dir.clone();
    let (mut ctx, _) = JobContext::new(spec, "t-1".into(), Timing::default(), 0);
    everyone_joins(&mut ctx, 1);
    let removed = |effects: &[Effect]| -> Vec<PathBuf> {
        effects
            .iter()
            .flat_map(|e| match e {
                Effect::RemoveCheckpoints { dirs } => dirs.clone(),
                _ => Vec::new(),
            })
            .collect()
    };
    for (id, step) in [(1, 10), (2, 20)] {
        let manifest = root.join(format!("s{step}/manifest.json"));
        let effects = ctx
            .checkpoint_committed(id, manifest, step, 0, step)
            .unwrap();
        assert!(removed(&effects).is_empty(), "{effects:?}");
    }
    let effects = ctx
        .checkpoint_committed(3, root.join("s30/manifest.json"), 30, 0, 30)
        .unwrap();
    assert_eq!(removed(&effects), [root.join("s10")]);
    let ids: Vec<u64> = ctx.checkpoints.iter().map(|c| c.id).collect();
    assert_eq!(ids, [2, 3]);
    assert_eq!(ctx.latest_checkpoint().unwrap().step, 30);
    let said = &ctx.events.last().unwrap().text;
    assert!(
        said.starts_with("checkpoint 1 (step 10) deleted: checkpoint.keep is 2"),
        "{said}"
    );
    // A manifest in the checkpoint root itself: dropped from the record when older than the
    // kept ones, its directory (the root, holding the others) never deleted.
    let mut spec = in_place_spec(1);
    spec.checkpoint.keep = Some(1);
    let root = spec.checkpoint.dir.clone();
    let (mut ctx, _) = JobContext::new(spec, "t-2".into(), Timing::default(), 0);
    everyone_joins(&mut ctx, 1);
    ctx.checkpoint_committed(1, root.join("manifest.json"), 5, 0, 5)
        .unwrap();
    let effects = ctx
        .checkpoint_committed(2, root.join("s6/manifest.json"), 6, 0, 6)
        .unwrap();
    assert!(removed(&effects).is_empty(), "{effects:?}");
    assert_eq!(ctx.checkpoints.len(), 1);
    assert!(ctx.events.last().unwrap().text.contains("stays"));
}
