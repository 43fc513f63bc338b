//! What the bench binaries share.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The deadline of a bench's call to a job master.
const CALLS: auth::Deadlines = auth::Deadlines::all(std::time::Duration::from_secs(60));

/// A release binary of the workspace; the benches measure release builds only.
pub fn release_bin(name: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap()
                .join("target")
        });
    let bin = target.join("release").join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p job-master -p worker-agent` first",
        bin.display()
    );
    bin
}

/// The Python to run PyTorch scripts with (`BRAIN_TORCH_PYTHON`, else `python3`), if it
/// imports `modules` (e.g. "torch" or "torch, grpc").
pub fn torch_python(modules: &str) -> Option<String> {
    let python = std::env::var("BRAIN_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// A client of the brain at `url` (`http://host:port`) that sends `token`, once the brain
/// accepts connections.
pub async fn brain_client(
    url: &str,
    token: Option<auth::Token>,
) -> proto::service::v1::brain_client::BrainClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, auth::WithToken>,
> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string()).unwrap();
    loop {
        if let Ok(channel) = endpoint.connect().await {
            return proto::service::v1::brain_client::BrainClient::with_interceptor(
                channel,
                auth::WithToken::new(token),
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The Ray cluster to measure on as well (its dashboard), from `BRAIN_RAY_ADDRESS`.
pub fn ray_address() -> Option<String> {
    std::env::var("BRAIN_RAY_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
}

/// `job-master run` arguments that put the job on Ray (none for local processes).
pub fn platform_args(ray: Option<&str>) -> Vec<String> {
    match ray {
        Some(address) => vec![
            "--platform".into(),
            "ray".into(),
            "--ray-address".into(),
            address.into(),
            "--agent-bin".into(),
            release_bin("worker-agent").to_string_lossy().into_owned(),
        ],
        None => Vec::new(),
    }
}

/// `job-master run SPEC --run-dir RUN_DIR` (release build) on `127.0.0.1:0`, on Ray when
/// `ray` names a dashboard; returns the process (killed when dropped) and the address it
/// printed. Plain text inside the job (`--job-insecure`), as the figures in docs/ were
/// measured: the job's TLS is measured on its own (`shard_lease`).
pub fn start_master(
    spec: &Path,
    run_dir: &Path,
    ray: Option<&str>,
) -> (test_support::Spawned, String) {
    start_master_at(spec, run_dir, ray, "127.0.0.1")
}

/// [`start_master`] listening on `ip` (a multi-node cluster's nodes reach it there).
pub fn start_master_at(
    spec: &Path,
    run_dir: &Path,
    ray: Option<&str>,
    ip: &str,
) -> (test_support::Spawned, String) {
    let mut cmd = std::process::Command::new(release_bin("job-master"));
    cmd.arg("run")
        .arg(spec)
        .args(platform_args(ray))
        .arg("--run-dir")
        .arg(run_dir)
        .args(["--listen", &format!("{ip}:0"), "--progress-secs", "3600"])
        .arg("--job-insecure")
        .env("BRAIN_WORKER_AGENT_BIN", release_bin("worker-agent"))
        .stderr(std::process::Stdio::null());
    test_support::spawn_announcing(
        &mut cmd,
        "job master on ",
        std::time::Duration::from_secs(60),
    )
}

/// Stops a job master as an operator would (SIGTERM: it stops its processes, on Ray too),
/// killing it after 30 s.
pub fn stop_master(child: &mut std::process::Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub type MasterClient = proto::jobmaster::v1::job_master_client::JobMasterClient<auth::Channel>;

/// A gRPC client of the job master at `addr` with the job's secret from its `run_dir`, once
/// it answers.
pub async fn master_client(addr: &str, run_dir: &Path) -> MasterClient {
    loop {
        if let Some(c) = try_master_client(addr, run_dir).await {
            return c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// [`master_client`], or `None` if the master or its secret is not there yet.
pub async fn try_master_client(addr: &str, run_dir: &Path) -> Option<MasterClient> {
    let token = auth::read_secret(&run_dir.join(auth::JOB_TOKEN_FILE)).ok()?;
    let channel = auth::connect(format!("http://{addr}"), &token, CALLS)
        .await
        .ok()?;
    Some(MasterClient::new(channel))
}

/// The transitions recorded in the job master's persisted context in `run_dir`.
pub fn transitions(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read(run_dir.join("job-context.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["transitions"].as_array().cloned())
        .unwrap_or_default()
}

/// Sends plans 1..=2·`events` alternating 2 → 4 and 4 → 2 workers, each once the one before
/// has every worker training again (and 300 ms of training more).
pub async fn alternate_rescales(
    client: &mut MasterClient,
    run_dir: &Path,
    events: u64,
    within: std::time::Duration,
) {
    use job_master::scale::ScalePlan;
    use job_master::spec::Role;
    for version in 1..=2 * events {
        let workers = if version % 2 == 1 { 4 } else { 2 };
        let a = client
            .apply_scale_plan(proto::jobmaster::v1::ScalePlan::from(&ScalePlan::count(
                version,
                Role::WORKER,
                workers,
            )))
            .await
            .unwrap()
            .into_inner();
        assert!(a.accepted, "{}", a.reason);
        let deadline = std::time::Instant::now() + within;
        loop {
            let t = transitions(run_dir);
            if t.len() as u64 == version && !t[version as usize - 1]["resumed_ms"].is_null() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "plan {version} did not complete: {:?}",
                t.last()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Let the new group train a little before the next change.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

/// One live round of `snap` (`optimizer::live::plan_round`, no cool-down, no heuristics) under
/// the scheduler named `scheduler`, `n` times: the median time in milliseconds, and the last
/// round's plan.
pub fn timed_rounds(
    snap: &optimizer::live::LiveSnapshot,
    scheduler: &str,
    n: usize,
) -> (f64, optimizer::live::RoundPlan) {
    let kind: optimizer::schedule::SchedulerKind =
        serde_json::from_value(serde_json::json!({ "kind": scheduler })).expect("a scheduler");
    let config = optimizer::live::LiveConfig {
        cooldown_s: 0.0,
        ..optimizer::live::LiveConfig::default()
    };
    let heuristics = optimizer::heuristics::Heuristics { heuristics: vec![] };
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..n {
        let t = std::time::Instant::now();
        let plan = optimizer::live::plan_round(snap, kind.scheduler(), &config, &heuristics)
            .expect("the round plans");
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        last = Some(plan);
    }
    times.sort_by(f64::total_cmp);
    (times[n / 2], last.expect("at least one round"))
}

/// The decisions of `plan` that the nodes' check changed (cut, kept, kept waiting, moved):
/// those whose reasons say so.
pub fn changed_by_nodes(plan: &optimizer::live::RoundPlan) -> usize {
    plan.decisions
        .iter()
        .filter(|d| {
            d.reasons.iter().any(|r| {
                ["no node has room", "nodes' free room", "nodes have no room"]
                    .iter()
                    .any(|x| r.contains(x))
            })
        })
        .count()
}
