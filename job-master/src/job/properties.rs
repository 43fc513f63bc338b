//! Properties of the job context under random event sequences (proptest): capacity, exactly-once
//! data, plans carried out or refused.

use proptest::prelude::*;

use super::*;
use crate::scale::{Capacity, ScalePlan};

#[derive(Clone, Debug)]
enum Ev {
    Lease(u32),
    Done(u32),
    /// The training process of worker `i` (or the PS when `i` = 9) exits with this code.
    Exit(u32, i32),
    AgentLost(u32),
    Checkpoint,
    Tick(u64),
}

fn ev(workers: u32) -> impl Strategy<Value = Ev> {
    prop_oneof![
        5 => (0..workers).prop_map(Ev::Lease),
        5 => (0..workers).prop_map(Ev::Done),
        1 => (prop_oneof![0..workers, Just(9)], prop_oneof![Just(1), Just(137)]).prop_map(|(i, c)| Ev::Exit(i, c)),
        1 => (0..workers).prop_map(Ev::AgentLost),
        1 => Just(Ev::Checkpoint),
        1 => (0u64..20_000).prop_map(Ev::Tick),
    ]
}

fn key(i: u32) -> SlotKey {
    if i == 9 {
        SlotKey {
            role: Role::PS,
            index: 0,
        }
    } else {
        SlotKey {
            role: Role::WORKER,
            index: i,
        }
    }
}

#[derive(Clone, Debug)]
enum Pe {
    Plan {
        workers: u32,
        ps: u32,
    },
    /// Process `i` (workers 0..6, PS 10..13) registers, joins and leases as it can.
    Act(u32),
    Done(u32),
    Exit(u32),
    Commit,
    ReshardDone,
    Tick,
}

fn pkey(i: u32) -> SlotKey {
    if i >= 10 {
        SlotKey {
            role: Role::PS,
            index: i - 10,
        }
    } else {
        SlotKey {
            role: Role::WORKER,
            index: i,
        }
    }
}

fn pe() -> impl Strategy<Value = Pe> {
    prop_oneof![
        1 => (1u32..7, 1u32..4).prop_map(|(workers, ps)| Pe::Plan { workers, ps }),
        8 => prop_oneof![0u32..6, 10u32..13].prop_map(Pe::Act),
        5 => (0u32..6).prop_map(Pe::Done),
        1 => prop_oneof![0u32..6, 10u32..13].prop_map(Pe::Exit),
        2 => Just(Pe::Commit),
        2 => Just(Pe::ReshardDone),
        2 => Just(Pe::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random scale plans interleaved with work and failures: no sample is lost or counted
    /// twice, plans are reached in version order, live processes never exceed the
    /// platform's capacity, a rejected plan changes nothing, and the context survives a
    /// JSON round trip.
    #[test]
    fn random_plan_sequences_keep_the_invariants(kind in prop_oneof![Just("ps"), Just("allreduce")],
                                                 events in proptest::collection::vec(pe(), 1..160)) {
        let ps_role = if kind == "ps" { "  ps: { replicas: 1, min: 1, max: 3, max_restarts: 50 }\n" } else { "" };
        let spec = JobSpec::from_yaml(&format!(
            "name: p\nkind: {kind}\nroles:\n{ps_role}  worker: {{ replicas: 2, min: 1, max: 6, max_restarts: 50 }}\n\
             workload:\n  builtin: {{}}\ndata: {{ num_samples: 400, shard_size: 10 }}\nepochs: 2\n\
             checkpoint: {{ dir: /tmp/brain-prop, every_shards: 5 }}\n"
        )).unwrap();
        let (mut ctx, _) = JobContext::new(spec, "p".into(), Timing::default(), 0);
        let cap = Capacity { max_processes: 7, ..Capacity::default() };
        let mut now = 1;
        let mut version = 0;
        let mut held: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        let mut ckpt = 0;
        for e in events {
            now += 10;
            match e {
                Pe::Plan { workers, ps } => {
                    version += 1;
                    let mut plan = ScalePlan { version, ..Default::default() };
                    plan.roles.insert(Role::WORKER, crate::scale::RoleTarget { count: workers, resources: None, nodes: Vec::new() });
                    if kind == "ps" {
                        plan.roles.insert(Role::PS, crate::scale::RoleTarget { count: ps, resources: None, nodes: Vec::new() });
                    }
                    let before = ctx.clone();
                    if ctx.apply_plan(plan, &cap, now).is_err() {
                        prop_assert_eq!(&before, &ctx, "a rejected plan changed the job");
                    }
                }
                Pe::Act(i) => {
                    let k = pkey(i);
                    let Some(slot) = ctx.roles.slot(k).cloned() else { continue };
                    if slot.phase == SlotPhase::Launching {
                        let _ = ctx.register_agent(k, slot.incarnation, "h".into(), format!("a{k}"), now);
                        let _ = ctx.advance(now);
                    }
                    let inc = ctx.roles.slot(k).unwrap().incarnation;
                    let _ = ctx.join_rendezvous(k, inc, now);
                    let _ = ctx.advance(now);
                    if k.role == Role::WORKER && !held.contains_key(&i) {
                        let layout = ctx.group.cluster().map(|c| c.ps_version);
                        if let Ok((LeaseView { outcome: LeaseOutcome::Granted(s), .. }, _)) = ctx.lease_with(k, inc, layout, None, now) {
                            held.insert(i, (s.id, inc));
                        }
                    }
                }
                Pe::Done(i) => {
                    if let Some((shard, inc)) = held.remove(&i) {
                        let _ = ctx.shard_done(pkey(i), inc, shard, now);
                    }
                }
                Pe::Exit(i) => {
                    let k = pkey(i);
                    if let Some(inc) = ctx.roles.slot(k).map(|s| s.incarnation) {
                        let _ = ctx.process_exited(k, inc, 137, 0, None, now);
                    }
                }
                Pe::Commit => {
                    if ctx.checkpoint_pending && ctx.ledger.in_flight() == 0 {
                        ckpt += 1;
                        let _ = ctx.checkpoint_committed(ckpt, format!("/tmp/c{ckpt}").into(), 0, ctx.generation, now);
                    }
                }
                Pe::ReshardDone => {
                    if let Some(t) = ctx.transition.clone().filter(|t| t.resharding) {
                        let record = ReshardRecord {
                            version: t.plan.version,
                            from_ps: t.from[&Role::PS],
                            to_ps: t.to[&Role::PS],
                            moved_keys: 1,
                            moved_bytes: 16,
                            total_keys: 2,
                            digest_before: 7,
                            digest_after: 7,
                            took_ms: 1,
                        };
                        let _ = ctx.reshard_done(ctx.generation, record, now);
                    }
                }
                Pe::Tick => {
                    for k in ctx.roles.slots().map(|s| s.key).collect::<Vec<_>>() {
                        let s = &ctx.roles.slot(k).unwrap();
                        let (agent, inc) = (s.agent_id, s.incarnation);
                        let _ = ctx.heartbeat(k, agent, inc, None, 0, now);
                    }
                    let _ = ctx.tick(now);
                }
            }
            prop_assert!(ctx.ledger.verify_exactly_once(false).is_ok());
            let live = ctx.roles.slots().filter(|s| s.phase.is_live()).count();
            prop_assert!(live <= cap.max_processes as usize, "{} live processes", live);
            let reached: Vec<u64> = ctx.transitions.iter().map(|t| t.version).collect();
            prop_assert!(reached.windows(2).all(|w| w[0] < w[1]), "plans reached out of order: {:?}", reached);
            prop_assert!(ctx.plans.reached <= ctx.plans.desired);
            held.retain(|i, (_, inc)| ctx.roles.slot(pkey(*i)).is_some_and(|s| s.incarnation == *inc && s.phase.is_live()));
        }
        let json = serde_json::to_string(&ctx).unwrap();
        let back: JobContext = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(back, ctx);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Whatever happens, in whatever order: the ledger never counts a sample twice, only
    /// current incarnations hold shards, incarnations never go back, a failed job stays
    /// failed, and the context survives a JSON round trip.
    #[test]
    fn the_job_state_machine_keeps_its_invariants(kind in prop_oneof![Just("ps"), Just("allreduce")],
                                                  events in proptest::collection::vec(ev(3), 1..120)) {
        let ps = if kind == "ps" { 1 } else { 0 };
        let spec = JobSpec::from_yaml(&format!(
            "name: p\nkind: {kind}\nroles:\n{}  worker: {{ replicas: 3, max_restarts: 6 }}\n\
             workload:\n  builtin: {{}}\ndata: {{ num_samples: 200, shard_size: 10 }}\nepochs: 2\n\
             checkpoint: {{ dir: /tmp/brain-prop, every_shards: 4 }}\n",
            if ps == 1 { "  ps: { replicas: 1, max_restarts: 6 }\n" } else { "" }
        )).unwrap();
        let (mut ctx, _) = JobContext::new(spec, "p".into(), Timing::default(), 0);
        let mut now = 1;
        for k in ctx.roles.slots().map(|s| s.key).collect::<Vec<_>>() {
            ctx.register_agent(k, 1, "h".into(), format!("a{k}"), now).unwrap();
        }
        let mut held: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        let mut incarnations: BTreeMap<SlotKey, u64> = ctx.roles.slots().map(|s| (&s.key, s)).map(|(k, s)| (*k, s.incarnation)).collect();
        let mut ckpt = 0;
        for e in events {
            now += 10;
            let failed_before = matches!(ctx.phase, JobPhase::Failed { .. });
            match e {
                Ev::Lease(i) => {
                    let inc = ctx.roles.slot(key(i)).unwrap().incarnation;
                    let _ = ctx.join_rendezvous(key(i), inc, now);
                    if let Ok(LeaseView { outcome: LeaseOutcome::Granted(s), .. }) = ctx.lease(key(i), inc) {
                        held.insert(i, (s.id, inc));
                    }
                }
                Ev::Done(i) => {
                    if let Some((shard, inc)) = held.remove(&i) {
                        let _ = ctx.shard_done(key(i), inc, shard, now);
                    }
                }
                Ev::Exit(i, _) if ctx.roles.slot(key(i)).is_none() => {}
                Ev::Exit(i, code) => {
                    let inc = ctx.roles.slot(key(i)).unwrap().incarnation;
                    let _ = ctx.process_exited(key(i), inc, code, 0, None, now);
                }
                Ev::AgentLost(i) => {
                    let inc = ctx.roles.slot(key(i)).unwrap().incarnation;
                    let _ = ctx.agent_lost(key(i), inc, "test".into(), now);
                    // The platform relaunches it and the new agent registers.
                    let inc = ctx.roles.slot(key(i)).unwrap().incarnation;
                    let _ = ctx.register_agent(key(i), inc, "h".into(), format!("a{i}"), now);
                }
                Ev::Checkpoint => {
                    if ctx.checkpoint_pending && ctx.ledger.in_flight() == 0 {
                        ckpt += 1;
                        let _ = ctx.checkpoint_committed(ckpt, format!("/tmp/c{ckpt}").into(), 0, ctx.generation, now);
                    }
                }
                Ev::Tick(dt) => {
                    now += dt;
                    // Live agents keep heartbeating; only the tick's timing is under test.
                    for k in ctx.roles.slots().map(|s| s.key).collect::<Vec<_>>() {
                        let s = &ctx.roles.slot(k).unwrap();
                        let (agent, inc) = (s.agent_id, s.incarnation);
                        let _ = ctx.heartbeat(k, agent, inc, None, 0, now);
                    }
                    let _ = ctx.tick(now);
                }
            }
            prop_assert!(ctx.ledger.verify_exactly_once(false).is_ok());
            let failed_now = matches!(ctx.phase, JobPhase::Failed { .. });
            prop_assert!(!failed_before || failed_now, "a failed job came back");
            for (k, s) in ctx.roles.slots().map(|s| (&s.key, s)) {
                prop_assert!(s.incarnation >= incarnations[k], "{k} went back");
                incarnations.insert(*k, s.incarnation);
            }
            // Shards the test still thinks it holds under an old incarnation are no longer
            // that holder's: completing them must fail.
            held.retain(|i, (_, inc)| *inc == ctx.roles.slot(key(*i)).unwrap().incarnation);
        }
        let json = serde_json::to_string(&ctx).unwrap();
        let back: JobContext = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(back, ctx);
    }
}
