//! The live brain, measured on this machine, printed as tables:
//!
//! 1. Three reference jobs (two allreduce, one PS) submitted 6 s apart to a brain that may hand
//!    out 4 CPUs, side by side in one run: resource-free under the brain (Pollux-style sharing,
//!    resized as jobs arrive and finish) vs the same jobs at a static user request (2 workers,
//!    and 1 PS for the PS job), admitted first come first served and never resized. Aggregate
//!    samples/s = all samples trained / (last end − first submission).
//! 2. One optimisation round with 1,000 registered running jobs (each with reported speeds):
//!    `DryRun` over gRPC, i.e. the SQLite snapshot plus the scheduler, per scheduler.
//!
//! cargo build --release -p brain -p job-master -p worker-agent && cargo bench -p benches --bench live_brain

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use std::time::{Duration, Instant};
use test_support::Spawned;

use common::release_bin;
use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use proto::service::v1::brain_client::BrainClient;
use tonic::transport::Channel;

const SAMPLES: u64 = 40_000;
const EPOCHS: u64 = 2;

fn start_brain(dir: &Path, cpus: u32) -> (Spawned, String) {
    let mut cmd = Command::new(release_bin("brain"));
    cmd.args(["--listen", "127.0.0.1:0", "--cpus", &cpus.to_string()])
        .args(["--max-processes", "100000"])
        .arg("--database")
        .arg(dir.join("brain.db"))
        .arg("--runs-dir")
        .arg(dir.join("runs"))
        .arg("--policy")
        .arg(dir.join("policy.toml"))
        .arg("--job-master-bin")
        .arg(release_bin("job-master"))
        .args([
            "--job-master-arg=--brain-interval-ms",
            "--job-master-arg=300",
        ])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null());
    let (child, addr) =
        test_support::spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(60));
    (child, format!("http://{addr}"))
}

async fn client(url: &str) -> BrainClient<Channel> {
    BrainClient::connect(url.to_string()).await.unwrap()
}

fn spec(name: &str, kind: &str, fixed: bool) -> String {
    let ps = match (kind, fixed) {
        ("ps", true) => "  ps: { replicas: 1, resources: { cpu: 1, memory: 512Mi } }\n",
        ("ps", false) => "  ps: {}\n",
        _ => "",
    };
    let worker = if fixed {
        "  worker: { replicas: 2, min: 2, max: 2, resources: { cpu: 1, memory: 512Mi } }\n"
    } else {
        "  worker: { min: 1, max: 4 }\n"
    };
    format!(
        "name: {name}\nkind: {kind}\nroles:\n{ps}{worker}\
         workload:\n  builtin: {{ batch_size: 128, step_delay_us: 600 }}\n\
         data: {{ num_samples: {SAMPLES}, shard_size: 500, eval_samples: 2000 }}\n\
         epochs: {EPOCHS}\ncheckpoint: {{ dir: checkpoints, every_shards: 16 }}\n"
    )
}

struct Outcome {
    makespan_s: f64,
    mean_jct_s: f64,
    plans: u64,
}

async fn scenario(resource_free: bool) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let policy = if resource_free {
        "[scheduler]\nkind = \"pollux\"\nrestart_delay_s = 3\n[live]\ninterval_s = 1\ncooldown_s = 3\n"
    } else {
        "[scheduler]\nkind = \"fifo\"\n[live]\ninterval_s = 1\n"
    };
    std::fs::write(dir.path().join("policy.toml"), policy).unwrap();
    let (mut brain, url) = start_brain(dir.path(), 4);
    let mut c = client(&url).await;
    let jobs = [("a", "allreduce"), ("b", "ps"), ("c", "allreduce")];
    let t0 = Instant::now();
    let mut submitted = Vec::new();
    for (i, (name, kind)) in jobs.iter().enumerate() {
        let at = Duration::from_secs(6 * i as u64);
        tokio::time::sleep(at.saturating_sub(t0.elapsed())).await;
        let r = c
            .submit_job(pb::SubmitJobRequest {
                spec_yaml: spec(name, kind, !resource_free),
                origin: name.to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        submitted.push((r.job_id, t0.elapsed()));
    }
    let mut ended = std::collections::BTreeMap::new();
    let mut plans = 0;
    while ended.len() < jobs.len() {
        let all = c
            .list_jobs(pb::ListJobsRequest {})
            .await
            .unwrap()
            .into_inner()
            .jobs;
        for j in &all {
            match j.state.as_str() {
                "succeeded" => {
                    ended.entry(j.job_id).or_insert(t0.elapsed());
                }
                "failed" => panic!("{} failed: {}", j.job_name, j.outcome),
                _ => {}
            }
        }
        plans = all.iter().map(|j| j.plan_version).sum();
        assert!(t0.elapsed() < Duration::from_secs(600), "jobs did not end");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    brain.kill();
    let makespan_s = ended.values().max().unwrap().as_secs_f64();
    let mean_jct_s = submitted
        .iter()
        .map(|(id, at)| ended[id].as_secs_f64() - at.as_secs_f64())
        .sum::<f64>()
        / submitted.len() as f64;
    Outcome {
        makespan_s,
        mean_jct_s,
        plans,
    }
}

async fn round_with(jobs: usize) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policy.toml"),
        "[live]\ninterval_s = 3600\n",
    )
    .unwrap();
    let (mut brain, url) = start_brain(dir.path(), (jobs * 3) as u32);
    let mut c = client(&url).await;
    for i in 0..jobs {
        let workers = 1 + (i % 4) as u32;
        let id = c
            .register_job(pb::RegisterJobRequest {
                job_name: format!("job-{i}"),
                master_address: "127.0.0.1:9".into(),
                shape: Some(pb::JobShape {
                    kind: "allreduce".into(),
                    workers,
                    min_workers: 1,
                    max_workers: 8,
                    worker_node_unit: 1,
                    ps: 0,
                    worker_resources: Some(jm::Resources {
                        cpu_millicores: 1000,
                        memory_bytes: 1 << 30,
                        gpus: 0,
                    }),
                    ps_resources: None,
                    total_samples: 1_000_000,
                    min_ps: 0,
                    max_ps: 0,
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .job_id;
        let per = 500.0 + (i % 7) as f64 * 100.0;
        let reports = (1..=workers)
            .map(|n| pb::MetricReport {
                at_unix_ms: 1_700_000_000_000 + n as i64,
                global_step: n as u64,
                samples_per_second: per * n as f64 / (1.0 + 0.1 * n as f64),
                workers: n,
                samples_done: 1000 * i as u64 % 900_000,
                ..Default::default()
            })
            .collect();
        c.report_metrics(pb::MetricsBatch {
            job_id: id,
            reports,
        })
        .await
        .unwrap();
    }
    println!(
        "\n{:<14} {:>12} {:>14} {:>14}",
        "scheduler", "solve (ms)", "round (ms)", "resized jobs"
    );
    for kind in ["elastic_lp", "pollux", "optimus", "fifo"] {
        c.set_policy(pb::PolicyText {
            toml: format!(
                "[scheduler]\nkind = \"{kind}\"\n[live]\ninterval_s = 3600\ncooldown_s = 0\n"
            ),
            path: String::new(),
        })
        .await
        .unwrap();
        let mut solve = Vec::new();
        let mut round = Vec::new();
        let mut changed = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let r = c.dry_run(pb::DryRunRequest {}).await.unwrap().into_inner();
            round.push(t.elapsed().as_secs_f64() * 1000.0);
            solve.push(r.solve_ms);
            changed = r
                .decisions
                .iter()
                .filter(|d| d.from_workers != d.to_workers)
                .count();
            assert_eq!(r.decisions.len(), jobs);
        }
        solve.sort_by(f64::total_cmp);
        round.sort_by(f64::total_cmp);
        println!(
            "{kind:<14} {:>12.1} {:>14.1} {:>14}",
            solve[2], round[2], changed
        );
    }
    brain.kill();
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!(
        "three jobs (2 allreduce, 1 ps; {SAMPLES} samples x {EPOCHS} epochs each) submitted 6 s apart, 4 CPUs"
    );
    let brain = scenario(true).await;
    let fixed = scenario(false).await;
    let total = 3.0 * (SAMPLES * EPOCHS) as f64;
    println!(
        "{:<40} {:>12} {:>16} {:>12} {:>8}",
        "mode", "makespan (s)", "aggregate sps", "mean JCT (s)", "plans"
    );
    for (name, o) in [
        ("brain (resource-free, pollux, resized)", &brain),
        ("static requests (2 workers, fifo)", &fixed),
    ] {
        println!(
            "{name:<40} {:>12.1} {:>16.0} {:>12.1} {:>8}",
            o.makespan_s,
            total / o.makespan_s,
            o.mean_jct_s,
            o.plans
        );
    }
    println!(
        "aggregate samples/s, brain / static: {:.2}x",
        fixed.makespan_s / brain.makespan_s
    );
    println!("\none round with 1,000 registered running jobs (median of 5 dry runs):");
    round_with(1000).await;
}
