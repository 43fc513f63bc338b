//! A real PyTorch DDP script (torch from PyPI, gloo on the CPU) as a command job, without any
//! Brain SDK: `examples/pytorch-ddp/train_plain.py`, which only reads torchrun's environment and
//! checkpoints to `BRAIN_CHECKPOINT_DIR` (every few steps, and on SIGTERM).
//!
//! A plan is carried out by restarting the group at the new size; a kill -9 of a rank restarts
//! the group too. The job must never hang, must succeed, and every restart must resume from a
//! checkpoint (never from the start) with the new world size and a higher restart count.
//!
//! Needs a Python with torch: `BRAIN_TORCH_PYTHON` names it (`.ci/run` makes a virtualenv from
//! `.ci/torch-requirements.txt`); without it the test prints SKIPPED, and fails when
//! `BRAIN_REQUIRE_TORCH` is set.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn torch_python() -> Option<String> {
    python_with("torch", "BRAIN_TORCH_PYTHON", "BRAIN_REQUIRE_TORCH")
}

fn example() -> PathBuf {
    example_script("pytorch-ddp/train_plain.py")
}

fn spec(python: &str, ckpt: &Path, workers: u32, extra: &[&str]) -> job_master::spec::JobSpec {
    let mut argv = vec![
        python.to_string(),
        example().display().to_string(),
        "--samples".into(),
        "12000".into(),
        "--epochs".into(),
        "3".into(),
        "--step-sleep".into(),
        "0.02".into(),
        "--checkpoint-every".into(),
        "20".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let yaml = format!(
        r#"
name: ddp
kind: allreduce
roles:
  worker: {{ replicas: {workers}, min: 1, max: 4, max_restarts: 3 }}
workload:
  command: {argv:?}
  grace_period_ms: 15000
  env: {{ OMP_NUM_THREADS: "1" }}
data: {{ num_samples: 12000, shard_size: 1000 }}
checkpoint: {{ dir: {ckpt:?} }}
"#
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    spec
}

#[derive(Debug, serde::Deserialize)]
struct Resume {
    step: u64,
    world: u32,
    restart: u64,
}

fn resumes(ckpt: &Path) -> Vec<Resume> {
    std::fs::read_to_string(ckpt.join("resumes.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits until the script recorded `n` resumes; panics after `timeout`.
async fn resumed(ckpt: &Path, n: usize, timeout: Duration) -> Vec<Resume> {
    let start = Instant::now();
    loop {
        let r = resumes(ckpt);
        if r.len() >= n {
            return r;
        }
        assert!(
            start.elapsed() < timeout,
            "no resume {n} after {timeout:?}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for rank 0 to save a checkpoint newer than `after`.
async fn checkpoint_after(ckpt: &Path, after: std::time::SystemTime) {
    let path = ckpt.join("checkpoint.pt");
    let start = Instant::now();
    while std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .map_or(true, |t| t <= after)
    {
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ddp_script_rescaled_2_3_1_and_killed_resumes_from_its_checkpoints_and_succeeds() {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let mut run = start(spec(&python, &ckpt, 2, &[]), dir.path()).await;
    let addr = run.addr;
    let wait = Duration::from_secs(120);

    checkpoint_after(&ckpt, std::time::UNIX_EPOCH).await;
    send(addr, plan(1, Some(3), None)).await;
    let s = reached(addr, 1).await;
    assert_eq!(live_workers(&s), 3);
    let r = resumed(&ckpt, 1, wait).await;

    // kill -9 of a rank mid-epoch, once the group of 3 has checkpointed.
    checkpoint_after(&ckpt, std::time::SystemTime::now()).await;
    kill9(pid_of(addr, "worker", 1).await);
    let r2 = resumed(&ckpt, r.len() + 1, wait).await;

    checkpoint_after(&ckpt, std::time::SystemTime::now()).await;
    send(addr, plan(2, Some(1), None)).await;
    reached(addr, 2).await;
    let r3 = resumed(&ckpt, r2.len() + 1, wait).await;

    let report = run.report().await;
    assert!(
        report.succeeded(),
        "{:?}\n{}",
        report.reason,
        report.events.join("\n")
    );
    assert!(!report.data_tracked);
    assert_eq!(report.exactly_once, "not tracked");
    let done: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("done.json")).unwrap()).unwrap();
    assert_eq!(done["epoch"], 3, "every epoch trained: {done}");
    assert_eq!(done["world"], 1);

    // Every restart resumed from a checkpoint, at the world size in force, with a higher
    // restart count; progress is never lost back to the start.
    let last = &r3[r3.len() - 1];
    assert_eq!(
        (r[0].world, r2.last().unwrap().world, last.world),
        (3, 3, 1),
        "{r3:?}"
    );
    for w in r3.windows(2) {
        assert!(w[1].restart > w[0].restart, "{r3:?}");
        assert!(w[1].step >= w[0].step, "{r3:?}");
    }
    assert!(
        r3.iter().all(|r| r.step > 0),
        "a restart went back to the start: {r3:?}"
    );
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("the command's processes restart at the new size")),
        "{}",
        report.events.join("\n")
    );
}
