//! Runtime figures of whole jobs on local processes, printed as a table:
//! * time from starting `job-master run` to the first training step, 1 PS + 4 workers, and,
//!   with `BRAIN_RAY_ADDRESS` set (a Ray dashboard, e.g. from `.ci/ray-head`), the same job
//!   on Ray in the same run;
//! * samples/s per worker of the built-in workload (ps: 1 PS + 4 workers; allreduce: 4 workers),
//!   beside the same model trained in one process.
//!
//! cargo build --release -p job-master -p worker-agent && cargo bench -p benches --bench job_runtime
//! (BRAIN_RAY_ADDRESS=http://127.0.0.1:8265 for the Ray row)

mod common;

use std::path::{Path, PathBuf};

use common::{ray_address, release_bin, start_master, stop_master};
use std::process::Command;
use std::time::{Duration, Instant};

use proto::jobmaster::v1 as pb;

fn spec(dir: &Path, kind: &str, ps: u32, workers: u32, samples: u64) -> PathBuf {
    let ps_role = if ps > 0 {
        format!("  ps: {{ replicas: {ps} }}\n")
    } else {
        String::new()
    };
    let yaml = format!(
        "name: bench-{kind}\nkind: {kind}\nroles:\n{ps_role}  worker: {{ replicas: {workers} }}\n\
         workload:\n  builtin: {{ batch_size: 256, hash_buckets: 65536 }}\n\
         data: {{ num_samples: {samples}, shard_size: 4000, eval_samples: 10000 }}\n\
         checkpoint: {{ dir: {}, every_shards: 50 }}\n",
        dir.join("ckpt").display()
    );
    let path = dir.join(format!("{kind}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

async fn status(addr: &str, run_dir: &Path) -> Option<pb::JobStatus> {
    let mut c = common::try_master_client(addr, run_dir).await?;
    Some(c.get_status(pb::StatusRequest {}).await.ok()?.into_inner())
}

/// Wall time from spawning `job-master run` to the first reported training step.
async fn time_to_first_step(ray: Option<&str>) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), "ps", 1, 4, 400_000);
    let t0 = Instant::now();
    let (mut child, addr) = start_master(&spec, &dir.path().join("run"), ray);
    let t = loop {
        if let Some(s) = status(&addr, &dir.path().join("run")).await
            && s.global_step > 0
        {
            break t0.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    stop_master(&mut child.child);
    t
}

/// Mean samples/s per worker while the job trains (status sampled every 250 ms).
async fn per_worker_throughput(kind: &str, ps: u32, workers: u32) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), kind, ps, workers, 1_200_000);
    let (mut child, addr) = start_master(&spec, &dir.path().join("run"), None);
    let mut rates = Vec::new();
    loop {
        if let Ok(Some(_)) = child.child.try_wait() {
            break;
        }
        if let Some(s) = status(&addr, &dir.path().join("run")).await
            && s.phase == "running"
            && s.samples_per_second > 0.0
            && s.shards_done > 0
        {
            rates.push(s.samples_per_second);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!rates.is_empty(), "no throughput observed");
    rates.iter().sum::<f64>() / rates.len() as f64 / workers as f64
}

fn single_process(layout: &str) -> f64 {
    let out = Command::new(release_bin("worker-agent"))
        .args([
            "reference",
            "--layout",
            layout,
            "--num-samples",
            "400000",
            "--shard-size",
            "4000",
            "--hash-buckets",
            "65536",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("; ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the reference's throughput from {text:?}"))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("job_runtime: bench");
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!("| figure | value |");
        println!("|---|---|");
        let ray = ray_address();
        let mut platforms = vec![("local processes", None)];
        if let Some(a) = ray.as_deref() {
            platforms.push(("Ray", Some(a)));
        }
        for (name, ray) in platforms {
            let mut firsts: Vec<Duration> = Vec::new();
            for _ in 0..7 {
                firsts.push(time_to_first_step(ray).await);
            }
            firsts.sort();
            println!(
                "| `job-master run` to first training step, 1 PS + 4 workers, {name} (7 runs) | median {:.0} ms (min {:.0}, max {:.0}) |",
                ms(firsts[3]),
                ms(firsts[0]),
                ms(firsts[6])
            );
        }
        let ps = per_worker_throughput("ps", 1, 4).await;
        println!("| samples/s per worker, ps job (1 PS + 4 workers, async push/pull) | {ps:.0} |");
        let ar = per_worker_throughput("allreduce", 0, 4).await;
        println!("| samples/s per worker, allreduce job (4 workers, ring all-reduce) | {ar:.0} |");
        println!("| samples/s, same model in one process (sparse table) | {:.0} |", single_process("sparse"));
        println!("| samples/s, same model in one process (dense replica) | {:.0} |", single_process("dense"));
    });
}
