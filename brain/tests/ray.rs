//! The brain on a Ray cluster (the head `.ci/run` starts, 8 logical CPUs; see
//! `job-master/tests/ray.rs`): its capacity is read from Ray's state API, not from `--cpus`,
//! and a resource-free job submitted to it runs its processes as Ray jobs; a job beside
//! another Ray user who holds most CPUs starts with the workers the nodes' free room holds
//! (`pending_shrink` stays in its policy, for room taken between a round and the placement),
//! and finishes. Without `BRAIN_RAY_ADDRESS` the tests say so
//! and pass, unless `BRAIN_REQUIRE_RAY=1`. They share the cluster, so they run one at a time.

mod common;

use std::time::{Duration, Instant};

use common::{bin_dir, brainctl};

/// The tests share one Ray cluster: one at a time.
static RAY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The Ray cluster's dashboard, or `None` (said so) where there is none.
fn ray_address() -> Option<String> {
    let address = std::env::var("BRAIN_RAY_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty());
    if address.is_none() {
        test_support::optional_server(
            "BRAIN_REQUIRE_RAY",
            "a Ray cluster",
            "set BRAIN_RAY_ADDRESS to its dashboard, as .ci/run does with .ci/ray-head",
        );
    }
    address
}

#[test]
fn the_brain_reads_its_capacity_from_ray_and_runs_a_submitted_job_there() {
    let Some(address) = ray_address() else {
        return;
    };
    let _one = RAY.lock().unwrap_or_else(|e| e.into_inner());
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
        // The test's Ray head on loopback answers anyone: accepted here, refused by default
        // (sandbox.rs).
        .arg("--allow-open-ray-dashboard")
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

/// Another Ray user's job holding `cpus` CPUs until dropped (then stopped).
struct Blocker {
    address: String,
    id: String,
}

impl Blocker {
    fn start(address: &str, cpus: u32) -> Blocker {
        // Ray keeps a submission id for good: each blocker of this process gets its own.
        static BLOCKERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = BLOCKERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let id = format!("blocker-{}-{n}", std::process::id());
        let body = serde_json::json!({
            "entrypoint": "sleep 900",
            "submission_id": id,
            "entrypoint_num_cpus": cpus,
        });
        let answer = post(&format!("{address}/api/jobs/"), &body);
        assert!(answer.contains(&id), "{answer}");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let status = get(&format!("{address}/api/jobs/{id}"));
            if status.contains("\"RUNNING\"") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the blocker did not start: {status}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        // Ray's usage report lags placement by seconds: until it shows the blocker's CPUs, the
        // platform would count them free and submit processes Ray keeps waiting.
        loop {
            let status: serde_json::Value =
                serde_json::from_str(&get(&format!("{address}/api/cluster_status")))
                    .unwrap_or_default();
            let used: f64 = status
                .pointer("/data/clusterStatus/loadMetricsReport/usageByNode")
                .and_then(|u| u.as_object())
                .map_or(0.0, |nodes| {
                    nodes.values().filter_map(|n| n["CPU"][0].as_f64()).sum()
                });
            if used >= cpus as f64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Ray's usage report never showed the blocker's {cpus} CPUs: {status}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        Blocker {
            address: address.into(),
            id,
        }
    }
}

impl Drop for Blocker {
    fn drop(&mut self) {
        post(
            &format!("{}/api/jobs/{}/stop", self.address, self.id),
            &serde_json::json!({}),
        );
    }
}

/// Another Ray user holds 6 of the 8 CPUs. The brain's pool is Ray's whole capacity, which
/// holds the job's request (1 PS + 4 workers of 1 CPU), but the round places new processes on
/// the nodes' free room (Ray's available resources): the job starts with the PS and one
/// worker, and nothing waits for room.
#[test]
fn a_job_starts_at_what_the_nodes_free_room_holds_beside_another_ray_user() {
    let Some(address) = ray_address() else {
        return;
    };
    // A process still waiting after 15 s is given up: the job runs about 25 s, so workers left
    // waiting for room would be, while Ray's start of the PS (5.4 s once in CI under load,
    // given up at 5 s) is not.
    let events = beside_another_ray_user(&address, 15.0);
    // No plan changed it: the brain held it at what the free room holds.
    assert!(
        !events.iter().any(|e| e.contains(" accepted: ")),
        "{events:#?}"
    );
}

/// The same job, its PS moved to other resources while it still waits for Ray to start it
/// (`pending_shrink` after 0.3 s; Ray takes longer than that to start a job): the move's cut
/// comes before any process of the job started, so the master writes the checkpoint; the
/// moved PS must read it (as the job's user, the master as root), and the agent of the launch
/// the move replaced must not be taken for the new one (it is stopped: adopted, the workers
/// would wait on a PS that is gone). The job trains on, nothing relaunched.
#[test]
fn a_ps_moved_while_it_waits_for_ray_trains_on() {
    let Some(address) = ray_address() else {
        return;
    };
    let events = beside_another_ray_user(&address, 0.3);
    assert!(
        events
            .iter()
            .any(|e| e.ends_with("plan 1: migrating ps-0 (pending too long)")),
        "the PS was not moved while it waited (Ray started it within 0.3 s?): {events:#?}"
    );
}

/// Runs the job of [`a_job_starts_at_what_the_nodes_free_room_holds_beside_another_ray_user`]
/// with `pending_shrink` after `pending_timeout_s`, checks it ran as said there, but for
/// the plans; its master's events.
fn beside_another_ray_user(address: &str, pending_timeout_s: f64) -> Vec<String> {
    let _one = RAY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let blocker = Blocker::start(address, 6);
    std::fs::write(
        dir.path().join("policy.toml"),
        format!(
            "[[heuristics]]\nkind = \"pending_shrink\"\npending_timeout_s = \
             {pending_timeout_s}\ncooldown_s = 5\n[scheduler]\nkind = \"fifo\"\n[live]\n\
             interval_s = 1\ncooldown_s = 600\n"
        ),
    )
    .unwrap();
    let (child, addr) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--max-processes", "8"])
            .args(["--ray-address", address])
            .arg("--allow-open-ray-dashboard")
            .arg("--database")
            .arg(dir.path().join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.path().join("runs"))
            .arg("--policy")
            .arg(dir.path().join("policy.toml"))
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
    let name = format!("pending-{}", std::process::id());
    let spec = dir.path().join("job.yaml");
    // About 25 s on one worker (200 µs per sample): the shrink comes long before the end.
    std::fs::write(
        &spec,
        format!(
            "name: {name}\nkind: ps\nroles:\n  ps: {{ replicas: 1, resources: {{ cpu: 1 }} }}\n  \
             worker: {{ replicas: 4, min: 1, max: 4, resources: {{ cpu: 1 }} }}\n\
             workload:\n  builtin: {{ batch_size: 128, step_delay_us: 200 }}\n\
             data: {{ num_samples: 120000, shard_size: 1000, eval_samples: 2000 }}\n\
             checkpoint: {{ dir: checkpoints, every_shards: 20 }}\n"
        ),
    )
    .unwrap();
    let (ok, out) = brainctl(&["submit", spec.to_str().unwrap(), "--wait", "--brain", &url]);
    let log = || std::fs::read_to_string(dir.path().join("brain.log")).unwrap_or_default();
    assert!(ok, "{out}\n{}", log());
    drop(blocker);
    let report = dir
        .path()
        .join("runs")
        .join(&name)
        .join("master/report.json");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let events: Vec<&str> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e.ends_with(&format!("job {name} (ps) started with 2 processes"))),
        "{events:#?}"
    );
    // No plan changed its size: the brain held it at what the free room holds.
    assert!(
        !events
            .iter()
            .any(|e| e.contains(" accepted: ") && !e.contains("ps 1, worker 1 -> ps 1, worker 1")),
        "{events:#?}"
    );
    // No process was lost or relaunched.
    assert!(
        !events.iter().any(|e| e.contains("relaunch")),
        "{events:#?}\n{}",
        log()
    );
    assert_eq!(report["exactly_once"], "ok", "{report:#}");
    let (ok, status) = brainctl(&["status", &name, "--brain", &url]);
    assert!(ok && status.contains("succeeded"), "{status}");
    events.iter().map(|e| e.to_string()).collect()
}

/// GET `url`'s body (on a runtime of its own: the test is synchronous).
fn get(url: &str) -> String {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() })
}

/// POST `body` as JSON to `url`; the answer's body.
fn post(url: &str, body: &serde_json::Value) -> String {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
}
