//! What the bench binaries share.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

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
/// printed.
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
