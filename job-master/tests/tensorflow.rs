//! A real TensorFlow 2 ParameterServerStrategy job (tensorflow-cpu from PyPI) as a ps-kind
//! command job: `examples/tf-ps/train.py`, whose chief is Brain's worker 0 and whose other
//! workers and parameter servers are TF servers described by `TF_CONFIG`.
//!
//! kill -9 of a TF worker restarts every task (their `TF_CONFIG` names its address); a plan that
//! adds a worker restarts them with a new `TF_CONFIG`. The chief resumes from its checkpoint each
//! time, and the job succeeds when the chief has trained every step.
//!
//! Needs a Python with TensorFlow: `BRAIN_TF_PYTHON` names it (`.ci/run` makes a virtualenv from
//! `.ci/tf-requirements.txt`); without it the test prints SKIPPED, and fails when
//! `BRAIN_REQUIRE_TF` is set.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn tf_python() -> Option<String> {
    python_with("tensorflow", "BRAIN_TF_PYTHON", "BRAIN_REQUIRE_TF")
}

fn example() -> PathBuf {
    example_script("tf-ps/train.py")
}

const STEPS: u64 = 2000;

fn spec(python: &str, ckpt: &Path) -> job_master::spec::JobSpec {
    let argv = [
        python.to_string(),
        example().display().to_string(),
        "--steps".into(),
        STEPS.to_string(),
        "--step-sleep".into(),
        "0.2".into(),
        "--checkpoint-every".into(),
        "100".into(),
    ];
    let yaml = format!(
        r#"
name: tf
kind: ps
roles:
  ps: {{ replicas: 1, max_restarts: 3 }}
  worker: {{ replicas: 3, min: 2, max: 4, max_restarts: 3 }}
workload:
  command: {argv:?}
  grace_period_ms: 15000
  env: {{ OMP_NUM_THREADS: "1" }}
data: {{ num_samples: 4096, shard_size: 1024 }}
checkpoint: {{ dir: {ckpt:?} }}
"#
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    spec
}

fn resumes(ckpt: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(ckpt.join("resumes.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tf_ps_job_survives_a_worker_kill_and_a_rescale_and_succeeds() {
    let Some(python) = tf_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let mut run = start(spec(&python, &ckpt), dir.path()).await;
    let addr = run.addr;
    // TF's CheckpointManager writes its index file `checkpoint` with each save.
    wait_until("a first checkpoint", || ckpt.join("checkpoint").exists()).await;

    // kill -9 of TF worker 0 (Brain's worker 1; worker 0 is the chief).
    kill9(pid_of(addr, "worker", 1).await);
    wait_until("a resume after the kill", || !resumes(&ckpt).is_empty()).await;

    send(addr, plan(1, Some(4), None)).await;
    let s = reached(addr, 1).await;
    assert_eq!(live_workers(&s), 4);
    wait_until("a resume after the plan", || resumes(&ckpt).len() >= 2).await;

    let report = run.report().await;
    let events = report.events.join("\n");
    assert!(report.succeeded(), "{:?}\n{events}", report.reason);
    assert_eq!(report.exactly_once, "not tracked");
    let done: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("done.json")).unwrap()).unwrap();
    assert_eq!(done["step"], STEPS, "{done}");
    let r = resumes(&ckpt);
    assert!(
        r.iter().all(|r| r["step"].as_u64() > Some(0)),
        "a restart went back to the start: {r:?}"
    );
    assert!(
        r.windows(2)
            .all(|w| w[1]["restart"].as_u64() > w[0]["restart"].as_u64()),
        "{r:?}"
    );
    assert!(
        events.contains("worker-1 failed (killed by signal 9)"),
        "{events}"
    );
    assert!(events.contains("plan 1 reached"), "{events}");
}
