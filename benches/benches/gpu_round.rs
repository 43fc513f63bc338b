//! Issue 20's figure: the decision time of one live round (`optimizer::live::plan_round`, what
//! the brain runs between reading its store and dispatching plans) with 1,000 GPU jobs over 3
//! GPU models on 100 nodes, per scheduler: the median of 5 rounds, and what the round decided.
//!
//! The cluster is Sia's three models at 100 nodes: 34 nodes of 4 K80s, 33 of 4 P100s, 33 of 8
//! V100s (532 GPUs). The first jobs run (1 to 4 workers, a fifth of them of 2 GPUs per worker,
//! on one model, with reported speeds) until they hold about 70 % of the GPUs; the rest wait
//! (a third ask for a model, the others take any).
//!
//! Each scheduler runs twice, side by side: with the GPU pool alone (one machine's view), and
//! with each node's free room as Ray reports it (its CPU, 8 cores a GPU less a core for each
//! worker placed on it, and its free GPUs), where the round also places every new process of a
//! GPU job whole on a node of its model (`LiveCluster::free`, the nodes check). Run with
//! `cargo bench -p benches --bench gpu_round`.

mod common;

use optimizer::heuristics::SpeedPoint;
use optimizer::live::{
    LiveCluster, LiveJob, LiveNode, LiveSnapshot, LiveState, LiveWorkers, NodeRoom,
};
use optimizer::units::JobId;

const MODELS: [&str; 3] = ["K80", "P100", "V100"];

/// Each node's CPU: 8 cores a GPU.
const CORES_PER_GPU: u64 = 8;

/// The snapshot, and the workers (1 core each) and GPUs its running jobs hold on each node.
fn snapshot() -> (LiveSnapshot, Vec<(u64, u32)>) {
    let mut nodes = Vec::new();
    for i in 0..100 {
        let (model, gpus) = match i % 3 {
            0 => (MODELS[0], 4),
            1 => (MODELS[1], 4),
            _ => (MODELS[2], 8),
        };
        nodes.push(LiveNode {
            name: format!("10.0.{}.{}", i / 250, i % 250 + 1),
            gpus,
            gpu_type: model.into(),
        });
    }
    // A small deterministic generator: the same snapshot every run.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut used = vec![0u32; nodes.len()];
    let mut cores = vec![0u64; nodes.len()];
    let jobs = (0..1000u64)
        .map(|i| {
            let gpus = if next(5) == 0 { 2 } else { 1 };
            let mut workers = 1 + next(4) as u32;
            let mut state = LiveState::Queued;
            let mut model = (next(3) == 0).then(|| MODELS[next(3) as usize].to_string());
            if i < 600 && used.iter().sum::<u32>() < 370 {
                // Running where its workers fit now.
                let m = next(3) as usize;
                let mut placed = 0;
                for (n, node) in nodes.iter().enumerate() {
                    while placed < workers
                        && node.gpu_type == MODELS[m]
                        && used[n] + gpus <= node.gpus
                    {
                        used[n] += gpus;
                        cores[n] += 1;
                        placed += 1;
                    }
                }
                if placed > 0 {
                    workers = placed;
                    state = LiveState::Running;
                    model = Some(MODELS[m].to_string());
                }
            }
            let per = 50.0 + next(100) as f64;
            LiveJob {
                id: JobId(i + 1),
                name: format!("job-{i}"),
                state,
                submitted_s: i as f64,
                speed: if state == LiveState::Running {
                    vec![SpeedPoint {
                        workers,
                        samples_per_s: per * workers as f64 * 0.9,
                    }]
                } else {
                    Vec::new()
                },
                samples_left: 1e6 + next(1_000_000) as f64,
                last_change_s: (state == LiveState::Running).then_some(0.0),
                running_s: 100.0,
                workers: LiveWorkers {
                    millicores: 1000,
                    count: workers,
                    held: if state == LiveState::Running {
                        workers
                    } else {
                        0
                    },
                    min: 1,
                    max: 8,
                    node_unit: 1,
                    peak: workers,
                    gpus: optimizer::units::Gpus::whole(gpus),
                    gpu_type: model,
                    ..LiveWorkers::default()
                },
                ..LiveJob::default()
            }
        })
        .collect();
    let cpu: u64 = nodes
        .iter()
        .map(|n| u64::from(n.gpus) * CORES_PER_GPU * 1000)
        .sum();
    let held = cores.into_iter().zip(used).collect();
    let snap = LiveSnapshot {
        now_s: 1000.0,
        cluster: LiveCluster {
            free: Vec::new(),
            cpu_millicores: cpu,
            slot_millicores: 1000,
            max_processes: 10_000,
            memory_bytes: 0,
            nodes,
        },
        jobs,
    };
    (snap, held)
}

/// The snapshot with each node's free room: its cores less the workers on it, its GPUs less
/// those held.
fn with_rooms(snap: &LiveSnapshot, held: &[(u64, u32)]) -> LiveSnapshot {
    let mut snap = snap.clone();
    snap.cluster.free = snap
        .cluster
        .nodes
        .iter()
        .zip(held)
        .map(|(n, &(cores, gpus))| NodeRoom {
            name: n.name.clone(),
            cpu_millicores: (u64::from(n.gpus) * CORES_PER_GPU - cores) * 1000,
            memory_bytes: 0,
            gpus: optimizer::units::Gpus::whole(n.gpus - gpus),
            devices: Vec::new(),
        })
        .collect();
    snap
}

fn main() {
    let (snap, held) = snapshot();
    let rooms = with_rooms(&snap, &held);
    let running = snap
        .jobs
        .iter()
        .filter(|j| j.state == LiveState::Running)
        .count();
    println!(
        "one live round: {} GPU jobs ({running} running), {} nodes, 532 GPUs of 3 models, \
         {} cores (median of 5)",
        snap.jobs.len(),
        snap.cluster.nodes.len(),
        snap.cluster.cpu_millicores / 1000
    );
    println!(
        "{:<12} {:<12} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "scheduler", "view", "round (ms)", "started", "resized", "GPUs used", "on nodes"
    );
    for name in ["elastic_lp", "pollux", "optimus", "fifo"] {
        for (view, snap) in [("pool", &snap), ("node rooms", &rooms)] {
            let (ms, plan) = common::timed_rounds(snap, name, 5);
            let started = plan.decisions.iter().filter(|d| d.starts()).count();
            let resized = plan
                .decisions
                .iter()
                .filter(|d| d.state == LiveState::Running && d.to_workers() != d.from_workers())
                .count();
            let gpus: u32 = plan
                .decisions
                .iter()
                .map(|d| d.gpu_placement.iter().map(|p| p.1).sum::<u32>())
                .sum();
            let on_nodes = common::changed_by_nodes(&plan);
            println!(
                "{:<12} {:<12} {:>12.1} {:>10} {:>10} {:>10} {:>10}",
                plan.scheduler, view, ms, started, resized, gpus, on_nodes
            );
        }
    }
}
