//! One role of a running job resized, side by side in one run: the reinforcement-learning
//! example (`examples/rl-ppo`: an actor all-reduce group of 2 ranks, rollout engines, a
//! reward model, a critic; real PyTorch on the CPU) has its rollout role resized 2 → 4 while
//! the actor trains:
//! * **in place** (the rollout role's default): only the two new engines start;
//! * **restart** (`rescale: restart` on the rollout role, the anchor's behaviour: DLRover's
//!   unified controller changes a role's size by restarting the job): every process of the job
//!   stops and starts again at the new size, the actor from its latest checkpoint.
//!
//! For each: the actor's **lost updates** (updates begun and never finished, redone after a
//! restart); its **pause**: the longest gap between two finished updates from the plan until 4
//! engines serve, beside the median and the longest gap before the plan (the step and its
//! jitter; a pause "beyond the jitter" is the excess over the longest gap before); and the time
//! until an update used 4 engines. Each way runs `BRAIN_BENCH_EVENTS` times (default 2). Needs a Python
//! with torch (`BRAIN_TORCH_PYTHON`, else `python3`) and the SDK's build requirements.
//!
//! cargo build --release -p job-master -p worker-agent && cargo bench -p benches --bench role_resize

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{master_client, start_master, stop_master};
use proto::jobmaster::v1 as pb;

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `examples/rl-ppo/job.yaml` with this run's Python, SDK, files, and the rollout role's
/// `rescale`.
fn spec(python: &str, sdk: &Path, dir: &Path, log: &Path, rescale: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("examples/rl-ppo/job.yaml")).unwrap();
    let script = root.join("examples/rl-ppo/rl.py");
    let text = text
        .replace("python3", python)
        .replace("examples/rl-ppo/rl.py", &script.display().to_string())
        .replace("runs/rl-ppo/returns.jsonl", &log.display().to_string())
        .replace(
            "runs/rl-ppo/checkpoints",
            &dir.join("checkpoints").display().to_string(),
        )
        .replace(
            "--updates, \"40\"",
            "--updates, \"100000\", --update-sleep, \"0.05\"",
        )
        .replace(
            "OMP_NUM_THREADS: \"1\" }",
            &format!("OMP_NUM_THREADS: \"1\", PYTHONPATH: {:?} }}", sdk.display()),
        )
        .replace(
            "    replicas: 2\n    min: 1",
            &format!("    replicas: 2\n    rescale: {rescale}\n    min: 1"),
        );
    let text = text.replace(
        "  reward:\n    command:",
        &format!(
            "  reward:\n    env: {{ PYTHONPATH: {:?} }}\n    command:",
            sdk.display()
        ),
    );
    let path = dir.join("job.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn log_lines(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

struct Measured {
    lost: usize,
    /// The longest gap between two finished updates from the plan until 4 engines served.
    gap_after_s: f64,
    /// The median and the longest gap before the plan (the step and its jitter).
    median_s: f64,
    gap_before_s: f64,
    to_four_s: f64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// The measures of one run from the actor's log; `t0` is when the plan was sent.
fn measure(log: &Path, t0: f64) -> Measured {
    let lines = log_lines(log);
    let done: Vec<(u64, f64, u64)> = lines
        .iter()
        .filter(|l| l.get("return").is_some())
        .map(|l| {
            (
                l["update"].as_u64().unwrap(),
                l["at"].as_f64().unwrap(),
                l["engines"].as_u64().unwrap(),
            )
        })
        .collect();
    let last = done.last().map_or(0, |d| d.0);
    let begun = lines
        .iter()
        .filter_map(|l| l["begin"].as_u64())
        .filter(|&u| u <= last)
        .count();
    // Gaps between consecutive finished updates, the later of the two in (from, to].
    let gaps = |from: f64, to: f64| -> Vec<f64> {
        done.windows(2)
            .filter(|w| w[1].1 > from && w[1].1 <= to)
            .map(|w| w[1].1 - w[0].1)
            .collect()
    };
    let four = done
        .iter()
        .find(|d| d.1 > t0 && d.2 == 4)
        .map_or(f64::NAN, |d| d.1);
    // The first 5 updates warm up (imports, the first calls): not the step's jitter.
    let warm = done.get(5).map_or(0.0, |d| d.1);
    let before = gaps(warm, t0);
    Measured {
        lost: begun - done.len(),
        gap_after_s: gaps(t0, four).into_iter().fold(0.0, f64::max),
        median_s: median(before.clone()),
        gap_before_s: before.into_iter().fold(0.0, f64::max),
        to_four_s: four - t0,
    }
}

async fn until(log: &Path, what: &str, within: Duration, f: impl Fn(&[serde_json::Value]) -> bool) {
    let deadline = Instant::now() + within;
    while !f(&log_lines(log)) {
        assert!(Instant::now() < deadline, "no {what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn finished(l: &[serde_json::Value]) -> usize {
    l.iter().filter(|x| x.get("return").is_some()).count()
}

async fn one(python: &str, sdk: &Path, rescale: &str) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("returns.jsonl");
    let spec = spec(python, sdk, dir.path(), &log, rescale);
    let run_dir = dir.path().join("run");
    let (mut master, addr) = start_master(&spec, &run_dir, None);
    until(&log, "20 updates", Duration::from_secs(180), |l| {
        finished(l) >= 20
    })
    .await;
    let mut c = master_client(&addr, &run_dir).await;
    let t0 = now_s();
    let answer = c
        .apply_scale_plan(pb::ScalePlan {
            version: 1,
            roles: vec![pb::RoleTarget {
                nodes: Vec::new(),
                role: "rollout".into(),
                count: 4,
                resources: None,
            }],
            migrations: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.accepted, "{}", answer.reason);
    until(
        &log,
        "an update with 4 engines",
        Duration::from_secs(180),
        |l| l.iter().any(|x| x["engines"] == 4),
    )
    .await;
    let now = finished(&log_lines(&log));
    until(&log, "10 updates more", Duration::from_secs(60), |l| {
        finished(l) >= now + 10
    })
    .await;
    stop_master(&mut master.child);
    measure(&log, t0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(python) = common::torch_python("torch, grpc") else {
        eprintln!("role_resize: SKIPPED (no Python with torch and grpcio: set BRAIN_TORCH_PYTHON)");
        return;
    };
    let sdk = test_support::python_sdk(&python).expect("the SDK builds");
    let events: usize = std::env::var("BRAIN_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    println!(
        "rollout role resized 2 -> 4 while the actor trains ({events} runs each, this machine)"
    );
    println!(
        "{:<10} {:>13} {:>16} {:>15} {:>17} {:>15} {:>14}",
        "way",
        "lost updates",
        "gap after (s)",
        "median gap (s)",
        "gap before (s)",
        "beyond jitter",
        "4 engines (s)"
    );
    for (way, rescale) in [("in place", "in_place"), ("restart", "restart")] {
        for _ in 0..events {
            let m = one(&python, &sdk, rescale).await;
            println!(
                "{way:<10} {:>13} {:>16.3} {:>15.3} {:>17.3} {:>15.3} {:>14.2}",
                m.lost,
                m.gap_after_s,
                m.median_s,
                m.gap_before_s,
                (m.gap_after_s - m.gap_before_s).max(0.0),
                m.to_four_s
            );
        }
    }
}
