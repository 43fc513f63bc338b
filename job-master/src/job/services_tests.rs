//! Unit tests of role groups outside the training group: started with the job, restarted at
//! their failover level, resized without touching the training group.

use super::*;
use crate::scale::Capacity;

fn spec(rollout: &str) -> JobSpec {
    let spec = JobSpec::from_yaml(&format!(
        "name: rl\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, min: 1, max: 4 }}\n\
         \x20 rollout: {{ replicas: 2, min: 1, max: 4, command: [rollout, --fast]{rollout} }}\n\
         \x20 driver: {{ topology: single, command: [drive], env: {{ MODE: eval }} }}\n\
         workload:\n  builtin: {{}}\n\
         data: {{ num_samples: 1000, shard_size: 10 }}\ncheckpoint: {{ dir: /tmp/brain-svc-test }}\n"
    ))
    .unwrap();
    spec.validate().unwrap();
    spec
}

fn rollout(index: u32) -> SlotKey {
    SlotKey {
        role: Role::new("rollout").unwrap(),
        index,
    }
}

fn worker(index: u32) -> SlotKey {
    SlotKey {
        role: Role::WORKER,
        index,
    }
}

fn launched(effects: &[Effect]) -> Vec<SlotKey> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::LaunchAgent { key, .. } => Some(*key),
            _ => None,
        })
        .collect()
}

/// Registers every launching slot of the job (training and services).
fn register_all(ctx: &mut JobContext, now: u64) {
    let keys: Vec<(SlotKey, u64)> = ctx
        .all_slots()
        .filter(|s| s.phase == SlotPhase::Launching)
        .map(|s| (s.key, s.incarnation))
        .collect();
    for (k, inc) in keys {
        ctx.register_agent(k, inc, "h".into(), format!("127.0.0.1:{}", k.index), now)
            .unwrap();
    }
}

fn incarnations(ctx: &JobContext) -> BTreeMap<SlotKey, u64> {
    ctx.all_slots().map(|s| (s.key, s.incarnation)).collect()
}

#[test]
fn service_roles_start_with_the_job_apart_from_the_training_group() {
    let (ctx, effects) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    let keys = launched(&effects);
    assert_eq!(keys.len(), 5, "{keys:?}");
    assert!(keys.contains(&rollout(1)));
    assert_eq!(
        ctx.roles.slots().count(),
        2,
        "only the workers are the training group's"
    );
    assert_eq!(
        ctx.roles
            .service(Role::new("rollout").unwrap())
            .unwrap()
            .desired,
        2
    );
    assert_eq!(
        ctx.roles
            .service(Role::new("driver").unwrap())
            .unwrap()
            .live(),
        1
    );
    assert!(ctx.is_service(Role::new("driver").unwrap()));
    assert!(!ctx.is_service(Role::WORKER));
    // A service has no rendezvous or data.
    let e = ctx
        .clone()
        .join_rendezvous(rollout(0), 1, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout-0 is a service role"), "{e}");
}

#[test]
fn a_failed_service_process_restarts_alone_by_default() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let before = incarnations(&ctx);
    let effects = ctx.process_exited(rollout(1), 1, 1, 0, None, 10).unwrap();
    assert!(effects.is_empty(), "{effects:?}");
    let after = incarnations(&ctx);
    for (k, inc) in &before {
        let want = if *k == rollout(1) { inc + 1 } else { *inc };
        assert_eq!(after[k], want, "{k}");
    }
    assert_eq!(
        ctx.any_slot(rollout(1)).unwrap().phase,
        SlotPhase::Restarting
    );
    // Its agent learns the new incarnation at its next heartbeat.
    let agent = ctx.any_slot(rollout(1)).unwrap().agent_id;
    let (action, inc, _) = ctx.heartbeat(rollout(1), agent, 1, None, 0, 11).unwrap();
    assert_eq!((action, inc), (AgentAction::Restart, 2));
    let (action, _, _) = ctx.heartbeat(rollout(1), agent, 2, None, 4242, 12).unwrap();
    assert_eq!(action, AgentAction::Continue);
    assert_eq!(ctx.any_slot(rollout(1)).unwrap().phase, SlotPhase::Running);
    // A lost agent is relaunched for the same slot; nobody else moves.
    let effects = ctx.agent_lost(rollout(0), 1, "gone".into(), 20);
    assert_eq!(launched(&effects), vec![rollout(0)]);
    assert_eq!(ctx.phase, JobPhase::Running);
    // Both relaunches count in what the report and the summary say, as the training
    // group's do.
    assert_eq!(ctx.roles.restarts().get(&rollout(0).role), Some(&2));
}

#[test]
fn failover_role_restarts_the_group_and_job_restarts_everything() {
    let (mut ctx, _) = JobContext::new(spec(", failover: role"), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let before = incarnations(&ctx);
    ctx.process_exited(rollout(0), 1, 0, 9, None, 10).unwrap();
    let after = incarnations(&ctx);
    for (k, inc) in &before {
        let moved = k.role.as_str() == "rollout";
        assert_eq!(after[k], inc + u64::from(moved), "{k}");
    }

    let (mut ctx, _) = JobContext::new(spec(", failover: job"), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let before = incarnations(&ctx);
    ctx.process_exited(rollout(0), 1, 0, 9, None, 10).unwrap();
    let after = incarnations(&ctx);
    for (k, inc) in &before {
        assert_eq!(after[k], inc + 1, "{k}: every process restarts");
    }
    assert_eq!(ctx.generation, 1, "the training group restarted");
}

#[test]
fn a_service_over_its_restart_limit_fails_the_job() {
    let (mut ctx, _) = JobContext::new(spec(", max_restarts: 1"), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    ctx.process_exited(rollout(0), 1, 1, 0, None, 10).unwrap();
    ctx.process_exited(rollout(0), 2, 1, 0, None, 20).unwrap();
    match &ctx.phase {
        JobPhase::Failed { reason } => {
            assert!(reason.contains("exceed the limit of 1"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn resizing_a_service_touches_no_other_process_and_is_reached_at_once() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let before = incarnations(&ctx);
    let role = Role::new("rollout").unwrap();
    let effects = ctx
        .apply_plan(ScalePlan::count(1, role, 4), &Capacity::default(), 10)
        .unwrap();
    assert_eq!(launched(&effects), vec![rollout(2), rollout(3)]);
    assert_eq!(ctx.plans.reached, 1);
    assert!(ctx.transition.is_none(), "no cut, no transition");
    for (k, inc) in &before {
        assert_eq!(incarnations(&ctx)[k], *inc, "{k} untouched");
    }
    // 4 -> 1: the highest indexes leave with a grace period.
    let effects = ctx
        .apply_plan(ScalePlan::count(2, role, 1), &Capacity::default(), 20)
        .unwrap();
    let stopped: Vec<SlotKey> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::StopAgent {
                key,
                graceful: true,
            } => Some(*key),
            _ => None,
        })
        .collect();
    assert_eq!(stopped, vec![rollout(1), rollout(2), rollout(3)]);
    assert_eq!(ctx.role_counts()[&role], 1);
    assert_eq!(ctx.role_counts()[&Role::WORKER], 2);
    // Back to 2: index 1 returns with a new incarnation.
    let effects = ctx
        .apply_plan(ScalePlan::count(3, role, 2), &Capacity::default(), 30)
        .unwrap();
    assert_eq!(launched(&effects), vec![rollout(1)]);
    assert!(ctx.any_slot(rollout(1)).unwrap().incarnation > before[&rollout(1)]);
    // Bounds hold for services as for any role; unknown roles are refused.
    let e = ctx
        .apply_plan(ScalePlan::count(4, role, 5), &Capacity::default(), 40)
        .unwrap_err();
    assert_eq!(e.to_string(), "rollout count 5 is outside [min 1, max 4]");
    let e = ctx
        .apply_plan(
            ScalePlan::count(4, Role::new("critic").unwrap(), 1),
            &Capacity::default(),
            40,
        )
        .unwrap_err();
    assert_eq!(e.to_string(), "the job has no critic role");
}

#[test]
fn a_plan_for_workers_and_a_service_resizes_the_service_now_and_the_workers_by_transition() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let mut plan = ScalePlan::count(1, Role::WORKER, 3);
    plan.set_count(Role::new("rollout").unwrap(), 3);
    let effects = ctx.apply_plan(plan, &Capacity::default(), 10).unwrap();
    let keys = launched(&effects);
    assert!(keys.contains(&rollout(2)), "{keys:?}");
    assert!(keys.contains(&worker(2)), "{keys:?}");
    let t = ctx.transition.as_ref().expect("the workers' transition");
    assert!(!t.plan.roles.contains_key(&Role::new("rollout").unwrap()));
}

#[test]
fn the_processes_a_plan_adds_go_to_the_nodes_it_names_for_their_first_launch_only() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let named = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let role = Role::new("rollout").unwrap();
    let mut plan = ScalePlan::count(1, Role::WORKER, 4);
    plan.roles.get_mut(&Role::WORKER).unwrap().nodes = named(&["n2", "n3"]);
    plan.set_count(role, 3);
    plan.roles.get_mut(&role).unwrap().nodes = named(&["n1"]);
    ctx.apply_plan(plan, &Capacity::default(), 10).unwrap();
    let node = |ctx: &JobContext, k| ctx.any_slot(k).unwrap().node.clone();
    assert_eq!(node(&ctx, worker(2)).as_deref(), Some("n2"));
    assert_eq!(node(&ctx, worker(3)).as_deref(), Some("n3"));
    assert_eq!(node(&ctx, rollout(2)).as_deref(), Some("n1"));
    // The processes that ran before are not moved.
    assert_eq!(node(&ctx, worker(0)), None);
    assert_eq!(node(&ctx, rollout(0)), None);
    // It persists with the job's state, for a master restarted before the launch.
    let back: JobContext = serde_json::from_str(&serde_json::to_string(&ctx).unwrap()).unwrap();
    assert_eq!(node(&back, rollout(2)).as_deref(), Some("n1"));
    // A relaunch (its agent lost) is placed by the platform, wherever there is room.
    register_all(&mut ctx, 11);
    ctx.agent_lost(rollout(2), 1, "gone".into(), 20);
    assert_eq!(ctx.any_slot(rollout(2)).unwrap().incarnation, 2);
    assert_eq!(node(&ctx, rollout(2)), None);
    // More nodes than processes added: refused, nothing changed.
    let mut plan = ScalePlan::count(2, role, 4);
    plan.roles.get_mut(&role).unwrap().nodes = named(&["n1", "n2"]);
    let e = ctx.apply_plan(plan, &Capacity::default(), 30).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rollout: the plan names 2 nodes for the 1 processes it adds (at most one each)"
    );
    assert_eq!(ctx.roles.service(role).unwrap().desired, 3);
}

#[test]
fn a_starts_processes_go_first_to_the_nodes_the_brains_round_placed_them_on() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    let named = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let role = Role::new("rollout").unwrap();
    let typo = Role::new("rollot").unwrap();
    let nodes = BTreeMap::from([
        (Role::WORKER, named(&["n1", "n2"])),
        // More than the role has: the one past it is left out.
        (role, named(&["n2", "n3", "n1"])),
        (typo, named(&["n1"])),
    ]);
    ctx.start_on(&nodes, 1);
    let node = |ctx: &JobContext, k| ctx.any_slot(k).unwrap().node.clone();
    assert_eq!(node(&ctx, worker(0)).as_deref(), Some("n1"));
    assert_eq!(node(&ctx, worker(1)).as_deref(), Some("n2"));
    assert_eq!(node(&ctx, rollout(0)).as_deref(), Some("n2"));
    assert_eq!(node(&ctx, rollout(1)).as_deref(), Some("n3"));
    let said: Vec<&str> = ctx.events.iter().map(|e| e.text.as_str()).collect();
    assert!(
        said.contains(&"placed by the brain's round: worker-0 on n1, worker-1 on n2"),
        "{said:?}"
    );
    for left in ["rollout-2 on n1", "rollot-0 on n1"] {
        assert!(
            said.contains(
                &format!("the brain placed {left}, but the job has no such process: left out")
                    .as_str()
            ),
            "{said:?}"
        );
    }
    // A relaunch is placed by room; a process launched already is not moved.
    register_all(&mut ctx, 2);
    ctx.agent_lost(rollout(0), 1, "gone".into(), 3);
    assert_eq!(node(&ctx, rollout(0)), None);
    ctx.start_on(&nodes, 4);
    assert_eq!(node(&ctx, rollout(0)), None);
}

#[test]
fn a_restarted_master_relaunches_the_services_too() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let effects = ctx.resume(100).unwrap();
    let keys = launched(&effects);
    assert_eq!(keys.len(), 5, "{keys:?}");
    let text = serde_json::to_string(&ctx).unwrap();
    let back: JobContext = serde_json::from_str(&text).unwrap();
    assert_eq!(back, ctx, "the role groups persist");
}

#[test]
fn a_role_group_lists_the_members_that_serve_calls() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let role = Role::new("rollout").unwrap();
    let view = ctx.role_group(role).unwrap();
    assert_eq!(
        (view.topology.as_str(), view.members.len(), view.desired),
        ("service", 0, 2)
    );
    ctx.serve_role(rollout(1), 1, "127.0.0.1:7001".into(), String::new(), 2)
        .unwrap();
    let members = ctx.role_group(role).unwrap().members;
    assert_eq!(
        members,
        vec![services::Member {
            index: 1,
            incarnation: 1,
            address: "127.0.0.1:7001".into(),
            collective_addr: String::new(),
        }]
    );
    // A stale incarnation or a bad address is refused; a restarted member leaves the list
    // until its successor serves.
    assert!(
        ctx.serve_role(rollout(0), 9, "127.0.0.1:1".into(), String::new(), 3)
            .is_err()
    );
    assert!(
        ctx.serve_role(rollout(0), 1, "nowhere".into(), String::new(), 3)
            .is_err()
    );
    ctx.process_exited(rollout(1), 1, 1, 0, None, 4).unwrap();
    assert!(ctx.role_group(role).unwrap().members.is_empty());
    let e = ctx.role_group(Role::new("critic").unwrap()).unwrap_err();
    assert_eq!(e.to_string(), "invalid request: the job has no critic role");
}

/// A further all-reduce group (`topology: allreduce` with a program of its own): its members
/// say where their collective store would listen, the group's view lists them, a resize
/// restarts its staying processes (each must learn the new world size) and a failure restarts
/// it whole; the training group and the services are never touched.
#[test]
fn a_further_all_reduce_group_forms_at_its_size_and_restarts_whole() {
    let spec = JobSpec::from_yaml(
        "name: rl\nkind: allreduce\nroles:\n  worker: { replicas: 2, min: 1, max: 4 }\n  \
         rollout: { replicas: 1, command: [rollout] }\n  \
         critic: { topology: allreduce, replicas: 2, min: 1, max: 3, command: [critic] }\n\
         workload:\n  builtin: {}\n\
         data: { num_samples: 1000, shard_size: 10 }\ncheckpoint: { dir: /tmp/brain-svc-test }\n",
    )
    .unwrap();
    let critic = Role::new("critic").unwrap();
    spec.validate().unwrap();
    assert_eq!(spec.training_role(), Role::WORKER);
    assert_eq!(spec.failover(critic), crate::spec::Failover::Role);
    let (mut ctx, effects) = JobContext::new(spec, "r".into(), Timing::default(), 0);
    let key = |index| SlotKey {
        role: critic,
        index,
    };
    assert!(launched(&effects).contains(&key(1)));
    assert!(ctx.is_service(critic), "outside the training group");
    register_all(&mut ctx, 1);
    let view = ctx.role_group(critic).unwrap();
    assert_eq!(
        (view.topology, view.desired),
        (crate::spec::Topology::Allreduce, 2)
    );
    assert!(view.members.is_empty());
    // Its members join with their store's address; no one else gives one.
    let e = ctx
        .serve_role(key(0), 1, "127.0.0.1:7000".into(), String::new(), 2)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("joins with the address of its collective store")
    );
    let e = ctx
        .serve_role(rollout(0), 1, "127.0.0.1:7000".into(), "h:1".into(), 2)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("rollout is not a further all-reduce group"),
        "{e}"
    );
    // The training group's processes may serve calls, without a store of their own.
    ctx.serve_role(worker(0), 1, "127.0.0.1:6000".into(), String::new(), 2)
        .unwrap();
    let e = ctx
        .serve_role(worker(0), 1, "127.0.0.1:6000".into(), "h:1".into(), 2)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("worker is not a further all-reduce group")
    );
    assert!(
        ctx.serve_role(key(0), 1, "127.0.0.1:7000".into(), "nowhere".into(), 2)
            .is_err()
    );
    for i in 0..2 {
        ctx.serve_role(
            key(i),
            1,
            format!("127.0.0.1:700{i}"),
            format!("127.0.0.1:800{i}"),
            3,
        )
        .unwrap();
    }
    let members = ctx.role_group(critic).unwrap().members;
    let stores: Vec<&str> = members.iter().map(|m| m.collective_addr.as_str()).collect();
    assert_eq!(stores, ["127.0.0.1:8000", "127.0.0.1:8001"]);

    // 2 -> 3: the third starts, the two staying restart to form a group of 3.
    let before = incarnations(&ctx);
    let effects = ctx
        .apply_plan(ScalePlan::count(1, critic, 3), &Capacity::default(), 10)
        .unwrap();
    assert_eq!(launched(&effects), vec![key(2)]);
    let after = incarnations(&ctx);
    for (k, inc) in &before {
        let moved = k.role == critic;
        assert_eq!(after[k], inc + u64::from(moved), "{k}");
    }
    assert_eq!(after[&key(2)], 1);
    assert!(ctx.role_group(critic).unwrap().members.is_empty());
    assert!(ctx.events.iter().any(|e| e.text.contains(
        "critic resized: 2 -> 3 (an all-reduce group: its processes restart to form it at its \
         new size)"
    )));
    // A member's failure restarts the group whole (failover role), nothing else.
    register_all(&mut ctx, 11);
    let before = incarnations(&ctx);
    ctx.process_exited(key(1), 2, 0, 9, None, 12).unwrap();
    let after = incarnations(&ctx);
    for (k, inc) in &before {
        let moved = k.role == critic;
        assert_eq!(after[k], inc + u64::from(moved), "{k}");
    }
}

#[test]
fn a_service_with_rescale_restart_restarts_the_job_when_resized() {
    let (mut ctx, _) =
        JobContext::new(spec(", rescale: restart"), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let before = incarnations(&ctx);
    let role = Role::new("rollout").unwrap();
    ctx.apply_plan(ScalePlan::count(1, role, 3), &Capacity::default(), 10)
        .unwrap();
    assert_eq!(ctx.generation, 1, "the training group restarted");
    let after = incarnations(&ctx);
    for (k, inc) in &before {
        assert!(after[k] > *inc, "{k} restarted");
    }
    assert!(after.contains_key(&rollout(2)));
    assert_eq!(ctx.plans.reached, 1);
}

#[test]
fn a_service_that_finished_stays_finished() {
    let (mut ctx, _) = JobContext::new(spec(", failover: role"), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    ctx.process_exited(rollout(0), 1, 0, 0, None, 5).unwrap();
    assert_eq!(
        ctx.any_slot(rollout(0)).unwrap().phase,
        SlotPhase::Succeeded
    );
    // Its group restarts on another member's failure, and after a master restart: it does not.
    ctx.process_exited(rollout(1), 1, 1, 0, None, 6).unwrap();
    assert_eq!(ctx.any_slot(rollout(0)).unwrap().incarnation, 1);
    let keys = launched(&ctx.resume(10).unwrap());
    assert!(!keys.contains(&rollout(0)), "{keys:?}");
    assert!(keys.contains(&rollout(1)), "{keys:?}");
}

#[test]
fn call_reports_become_role_rates_and_bad_ones_are_refused() {
    let (mut ctx, _) = JobContext::new(spec(""), "r".into(), Timing::default(), 0);
    register_all(&mut ctx, 1);
    let role = Role::new("rollout").unwrap();
    let calls = |n: u64, waited: f64| CallTotals {
        calls: [(role, (n, waited))].into(),
        ..Default::default()
    };
    let served = |n: u64, busy: f64| CallTotals {
        served: n,
        busy_s: busy,
        ..Default::default()
    };
    ctx.report_calls(worker(0), 1, calls(0, 0.0), 1_000)
        .unwrap();
    ctx.report_calls(rollout(0), 1, served(0, 0.0), 1_000)
        .unwrap();
    ctx.report_calls(worker(0), 1, calls(40, 9.0), 11_000)
        .unwrap();
    ctx.report_calls(rollout(0), 1, served(40, 10.0), 11_000)
        .unwrap();
    let rates = ctx.calls.rates(11_000);
    assert_eq!(rates.len(), 1, "{rates:?}");
    assert_eq!(
        (rates[0].role, rates[0].processes, rates[0].callers),
        (role, 1, 1)
    );
    assert!((rates[0].served_per_s - 4.0).abs() < 1e-9, "{rates:?}");
    assert!(
        (rates[0].callers_wait_share - 0.9).abs() < 1e-9,
        "{rates:?}"
    );
    // A stale incarnation, a time that is not a number, a role the job has not: refused.
    assert!(
        ctx.report_calls(rollout(0), 7, served(1, 0.1), 12_000)
            .is_err()
    );
    let e = ctx
        .report_calls(rollout(0), 1, served(41, f64::NAN), 12_000)
        .unwrap_err();
    assert!(e.to_string().contains("not a finite, non-negative"), "{e}");
    let critic = Role::new("critic").unwrap();
    let e = ctx
        .report_calls(
            worker(0),
            1,
            CallTotals {
                calls: [(critic, (1, 0.1))].into(),
                ..Default::default()
            },
            12_000,
        )
        .unwrap_err();
    assert!(e.to_string().contains("the job has no critic role"), "{e}");
    // The rates are not persisted: a master that restarts measures again.
    let back: JobContext = serde_json::from_str(&serde_json::to_string(&ctx).unwrap()).unwrap();
    assert!(back.calls.rates(12_000).is_empty());
}
