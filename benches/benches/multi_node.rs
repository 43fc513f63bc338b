//! Issue 20's figures on the three-node Ray cluster of `.ci/ray-cluster` (each node 4 CPUs, in
//! its own network namespace on a bridge), side by side in one run: an allreduce job whose
//! workers are spread over the nodes (each worker asks for 1 CPU; the Ray platform places each
//! on the node with the most CPU free) vs the same job held on one node (each worker also asks
//! for a sliver of Ray's `node:ADDRESS` resource of the head):
//! * `job-master run` to the first training step, 2 workers (5 runs each);
//! * rescale 2 → 4 and 4 → 2: plan accepted → every worker of the new group stepping, and →
//!   the group formed (6 events each way).
//!
//! The job master runs on this machine and listens on the bridge.
//!
//! .ci/ray-cluster start /tmp/brc && cargo build --release -p job-master -p worker-agent &&
//! BRAIN_RAY_CLUSTER=/tmp/brc cargo bench -p benches --bench multi_node

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{alternate_rescales, master_client, start_master_at, stop_master, transitions};
use proto::jobmaster::v1 as pb;

const FIRSTS: usize = 5;
const EVENTS: u64 = 6;

fn spec(dir: &Path, resources: &str) -> PathBuf {
    let yaml = format!(
        "name: bench-multi-node\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, min: 1, max: 4, \
         resources: {resources} }}\n\
         workload:\n  builtin: {{ batch_size: 256, hash_buckets: 65536 }}\n\
         data: {{ num_samples: 100000000, shard_size: 2000, eval_samples: 1000 }}\n\
         checkpoint: {{ dir: {}, every_shards: 0 }}\n",
        dir.join("ckpt").display()
    );
    let path = dir.join("job.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

async fn step(c: &mut common::MasterClient) -> u64 {
    c.get_status(pb::StatusRequest {})
        .await
        .map_or(0, |s| s.into_inner().global_step)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (first-step times, resumed ms and reached ms for 2 → 4, the same for 4 → 2).
async fn measure(
    c: &test_support::RayClusterDir,
    resources: &str,
) -> (Vec<f64>, [Vec<f64>; 2], [Vec<f64>; 2]) {
    let ray = Some(c.dashboard.as_str());
    let mut firsts = Vec::new();
    for _ in 0..FIRSTS {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path(), resources);
        let t0 = Instant::now();
        let (mut master, addr) = start_master_at(&spec, &dir.path().join("run"), ray, &c.host);
        let mut client = master_client(&addr, &dir.path().join("run")).await;
        while step(&mut client).await == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        firsts.push(t0.elapsed().as_secs_f64() * 1000.0);
        stop_master(&mut master.child);
    }

    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), resources);
    let run_dir = dir.path().join("run");
    let (mut master, addr) = start_master_at(&spec, &run_dir, ray, &c.host);
    let mut client = master_client(&addr, &run_dir).await;
    while step(&mut client).await == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    alternate_rescales(&mut client, &run_dir, EVENTS, Duration::from_secs(90)).await;
    stop_master(&mut master.child);
    let mut up = [Vec::new(), Vec::new()];
    let mut down = [Vec::new(), Vec::new()];
    for r in transitions(&run_dir) {
        let ms = |f: &str| (r[f].as_u64().unwrap() - r["accepted_ms"].as_u64().unwrap()) as f64;
        let side = if r["version"].as_u64().unwrap() % 2 == 1 {
            &mut up
        } else {
            &mut down
        };
        side[0].push(ms("resumed_ms"));
        side[1].push(ms("reached_ms"));
    }
    (firsts, up, down)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("multi_node: bench");
        return;
    }
    if std::env::var("BRAIN_RAY_CLUSTER").is_err() {
        println!("multi_node: BRAIN_RAY_CLUSTER is not set (start one with .ci/ray-cluster)");
        return;
    }
    let c = test_support::ray_cluster().expect("BRAIN_RAY_CLUSTER");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let one_node = format!("{{ cpu: 1, custom: {{ \"node:{}\": 0.001 }} }}", c.nodes[0]);
        println!(
            "allreduce on {} Ray nodes, release build: medians (first step over {FIRSTS} \
             runs; rescales over {EVENTS} events each way)",
            c.nodes.len()
        );
        println!(
            "{:<16} {:>16} {:>24} {:>24}",
            "workers", "first step (ms)", "2 -> 4 resumed/formed", "4 -> 2 resumed/formed"
        );
        for (name, resources) in [
            ("across nodes", "{ cpu: 1 }".to_string()),
            ("on one node", one_node),
        ] {
            let (mut firsts, mut up, mut down) = measure(&c, &resources).await;
            println!(
                "{name:<16} {:>16.0} {:>12.0} / {:<10.0} {:>12.0} / {:<10.0}",
                median(&mut firsts),
                median(&mut up[0]),
                median(&mut up[1]),
                median(&mut down[0]),
                median(&mut down[1])
            );
        }
    });
}
