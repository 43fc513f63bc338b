//! The decision time of one live round (`optimizer::live::plan_round`, what the brain runs
//! between reading its store and dispatching plans) with 10,000 CPU jobs, a fifth of them
//! with a service role, on 1,000 nodes, per scheduler: the median of 3 rounds, and what the
//! round decided. The brain's target (issue 22, issue 45) is a round of 10,000 jobs within
//! half a second; `live_brain` measures it through the service on one machine's pool, which
//! has no node room. This bench adds the Ray-sized view side by side in one run: each node's
//! free room as Ray reports it, where the round also places every new process whole on a
//! node, a placement group's by its strategy (`LiveCluster::free`, the nodes check).
//!
//! The cluster: 1,000 nodes of 32 cores (32,000). The first 7,000 jobs run (1 to 4 workers
//! of 1 core, with reported speeds), placed node by node; the other 3,000 wait. Every fifth
//! job has a rollout role of 2 engines of 0.5 core (its callers waiting 40% of their time
//! for it, so the round may grow it), every other one of those strictly spread
//! (`placement: [{ roles: [rollout], strategy: strict_spread }]`). Run with
//! `cargo bench -p benches --bench cpu_round`.

mod common;

use optimizer::heuristics::SpeedPoint;
use optimizer::live::{
    LiveCluster, LiveGroup, LiveJob, LiveRole, LiveSnapshot, LiveState, LiveWorkers, NodeRoom,
    RoleRate,
};
use optimizer::units::JobId;
use vocab::Role;

const NODES: usize = 1000;
const CORES: u64 = 32;
const JOBS: u64 = 10_000;
const RUNNING: u64 = 7000;

/// A rollout role of 2 engines, the callers waiting 40% of their time for it.
fn rollout(nodes: Vec<String>) -> LiveRole {
    LiveRole {
        role: "rollout".parse().expect("a role name"),
        count: 2,
        min: 1,
        max: 4,
        millicores: 500,
        memory_bytes: 0,
        gpus: vocab::Gpus::ZERO,
        gpu_type: None,
        beside_workers: false,
        nodes,
        sizing: Default::default(),
        rate: Some(RoleRate {
            served_per_s: 20.0,
            busy_share: 0.9,
            callers_wait_share: 0.4,
            training_wait_share: 0.0,
        }),
    }
}

/// The snapshot without node room (one machine's pool), and each node's millicores used.
fn snapshot() -> (LiveSnapshot, Vec<u64>) {
    // A small deterministic generator: the same snapshot every run.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let name = |n: usize| format!("10.0.{}.{}", n / 250, n % 250 + 1);
    let mut used = vec![0u64; NODES];
    let mut node = 0;
    // Takes `m` millicores on the next node that has them (round robin): its name.
    let mut place = |m: u64| {
        for _ in 0..NODES {
            node = (node + 1) % NODES;
            if used[node] + m <= CORES * 1000 {
                used[node] += m;
                return Some(name(node));
            }
        }
        None
    };
    let jobs = (0..JOBS)
        .map(|i| {
            let workers = 1 + next(4) as u32;
            let running = i < RUNNING;
            let with_role = i % 5 == 0;
            let spread = i % 10 == 0;
            let state = match running {
                true => LiveState::Running,
                false => LiveState::Queued,
            };
            if running {
                for _ in 0..workers {
                    place(1000);
                }
            }
            let roles = match with_role {
                true => {
                    let nodes = match running {
                        true => (0..2).filter_map(|_| place(500)).collect(),
                        false => Vec::new(),
                    };
                    vec![rollout(nodes)]
                }
                false => Vec::new(),
            };
            let groups = match spread {
                true => vec![LiveGroup {
                    roles: vec![Role::new("rollout").expect("a role name")],
                    strategy: vocab::spec::Strategy::StrictSpread,
                    share_devices: false,
                }],
                false => Vec::new(),
            };
            let per = 50.0 + next(100) as f64;
            LiveJob {
                id: JobId(i + 1),
                name: format!("job-{i}"),
                state,
                submitted_s: i as f64,
                speed: match running {
                    true => vec![SpeedPoint {
                        workers,
                        samples_per_s: per * workers as f64 * 0.9,
                    }],
                    false => Vec::new(),
                },
                samples_left: 1e6 + next(1_000_000) as f64,
                last_change_s: running.then_some(0.0),
                running_s: 100.0,
                roles,
                groups,
                workers: LiveWorkers {
                    millicores: 1000,
                    count: workers,
                    held: if running { workers } else { 0 },
                    min: 1,
                    max: 8,
                    node_unit: 1,
                    peak: workers,
                    ..LiveWorkers::default()
                },
                ..LiveJob::default()
            }
        })
        .collect();
    let snap = LiveSnapshot {
        now_s: 1000.0,
        cluster: LiveCluster {
            free: Vec::new(),
            cpu_millicores: NODES as u64 * CORES * 1000,
            slot_millicores: 1000,
            max_processes: 100_000,
            memory_bytes: 0,
            nodes: Vec::new(),
        },
        jobs,
    };
    (snap, used)
}

/// The snapshot with each node's free room: its cores less what its processes take.
fn with_rooms(snap: &LiveSnapshot, used: &[u64]) -> LiveSnapshot {
    let mut snap = snap.clone();
    snap.cluster.free = used
        .iter()
        .enumerate()
        .map(|(n, &u)| NodeRoom {
            name: format!("10.0.{}.{}", n / 250, n % 250 + 1),
            cpu_millicores: CORES * 1000 - u,
            memory_bytes: 0,
            gpus: vocab::Gpus::ZERO,
            devices: Vec::new(),
        })
        .collect();
    snap
}

fn main() {
    let (snap, used) = snapshot();
    let rooms = with_rooms(&snap, &used);
    let busy: u64 = used.iter().sum();
    println!(
        "one live round: {JOBS} CPU jobs ({RUNNING} running, every fifth with a rollout role, \
         every tenth strictly spread), {NODES} nodes of {CORES} cores, {:.0}% used (median of 3)",
        busy as f64 / (NODES as u64 * CORES * 1000) as f64 * 100.0
    );
    println!(
        "{:<20} {:<12} {:>12} {:>10} {:>10} {:>14} {:>10}",
        "scheduler", "view", "round (ms)", "started", "resized", "roles resized", "on nodes"
    );
    for name in ["elastic_lp", "pollux", "optimus", "fifo"] {
        for (view, snap) in [("pool", &snap), ("node rooms", &rooms)] {
            let (ms, plan) = common::timed_rounds(snap, name, 3);
            let started = plan.decisions.iter().filter(|d| d.starts()).count();
            let resized = plan
                .decisions
                .iter()
                .filter(|d| d.state == LiveState::Running && d.to_workers() != d.from_workers())
                .count();
            let roles = plan
                .decisions
                .iter()
                .filter(|d| !d.resized_roles().is_empty())
                .count();
            let on_nodes = common::changed_by_nodes(&plan);
            println!(
                "{:<20} {:<12} {:>12.1} {:>10} {:>10} {:>14} {:>10}",
                plan.scheduler, view, ms, started, resized, roles, on_nodes
            );
        }
    }
}
