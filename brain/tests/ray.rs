//! The brain on a Ray cluster (the head `.ci/run` starts, 8 logical CPUs; see
//! `job-master/tests/ray.rs`): its capacity is read from Ray's state API, not from `--cpus`,
//! and a resource-free job submitted to it runs its processes as Ray jobs. Without
//! `BRAIN_RAY_ADDRESS` the test says so and passes, unless `BRAIN_REQUIRE_RAY=1`.

mod common;

use std::time::{Duration, Instant};

use common::{bin_dir, brainctl};

#[test]
fn the_brain_reads_its_capacity_from_ray_and_runs_a_submitted_job_there() {
    let Some(address) = std::env::var("BRAIN_RAY_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
    else {
        test_support::optional_server(
            "BRAIN_REQUIRE_RAY",
            "a Ray cluster",
            "set BRAIN_RAY_ADDRESS to its dashboard, as .ci/run does with .ci/ray-head",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (child, addr) = common::spawn_brain(|cmd| {
        // --cpus 1: what Ray says replaces it.
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--cpus",
            "1",
            "--max-processes",
            "8",
        ])
        .args(["--ray-address", &address])
        .arg("--database")
        .arg(dir.path().join("brain.db"))
        .arg("--runs-dir")
        .arg(dir.path().join("runs"))
        .arg("--job-master-bin")
        .arg(bin_dir().join("job-master"))
        .args([
            "--job-master-arg=--brain-interval-ms",
            "--job-master-arg=300",
        ])
        .stderr(std::fs::File::create(dir.path().join("brain.log")).unwrap());
    });
    let _brain = child;
    let url = format!("http://{addr}");

    let (ok, out) = brainctl(&["plan", "--dry-run", "--brain", &url]);
    assert!(ok, "{out}");
    assert!(
        out.contains("of 8.0 CPUs"),
        "the capacity is not Ray's: {out}"
    );

    let name = format!("on-ray-{}", std::process::id());
    let spec = dir.path().join("job.yaml");
    std::fs::write(
        &spec,
        format!(
            "name: {name}\nkind: allreduce\nroles:\n  worker:\n    min: 1\n    max: 2\n\
             workload:\n  builtin:\n    batch_size: 128\n    step_delay_us: 100\n\
             data:\n  num_samples: 20000\n  shard_size: 500\n  eval_samples: 2000\n\
             checkpoint:\n  dir: checkpoints\n  every_shards: 10\n"
        ),
    )
    .unwrap();
    let start = Instant::now();
    let (ok, out) = brainctl(&["submit", spec.to_str().unwrap(), "--wait", "--brain", &url]);
    assert!(ok, "{out}");
    assert!(start.elapsed() < Duration::from_secs(300));
    let (ok, status) = brainctl(&["status", &name, "--brain", &url]);
    assert!(ok && status.contains("succeeded"), "{status}");

    // Its processes were Ray jobs, and each ended.
    let body = get(&format!("{address}/api/jobs/"));
    let jobs: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let mine: Vec<(&str, &str)> = jobs
        .iter()
        .filter_map(|j| {
            let id = j["submission_id"].as_str()?;
            id.starts_with(&format!("brain-{name}-worker-"))
                .then(|| (id, j["status"].as_str().unwrap_or("")))
        })
        .collect();
    assert!(!mine.is_empty(), "no Ray job of {name}: {jobs:?}");
    assert!(
        mine.iter()
            .all(|(_, s)| *s == "SUCCEEDED" || *s == "STOPPED"),
        "{mine:?}"
    );
    // The spec the brain wrote names the Ray platform.
    let written =
        std::fs::read_to_string(dir.path().join("runs").join(&name).join("spec.yaml")).unwrap();
    assert!(written.contains("type: ray"), "{written}");
}

/// GET `url`'s body (on a runtime of its own: the test is synchronous).
fn get(url: &str) -> String {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() })
}
