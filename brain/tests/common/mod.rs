//! What the brain's multi-process tests share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use proto::service::v1::brain_client::BrainClient;

/// Starts the `brain` binary (on port 0: `--listen 127.0.0.1:0` is the caller's) as
/// `configure` sets it up and waits for the address it prints; returns the process (killed
/// when dropped, also when a test fails) and `host:port`.
pub fn spawn_brain(configure: impl FnOnce(&mut Command)) -> (Brain, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brain"));
    configure(&mut cmd);
    test_support::spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(60))
}

/// Builds the job master and worker agent the brain starts (beside the brain binary).
pub fn bin_dir() -> PathBuf {
    test_support::workspace_bins(env!("CARGO_BIN_EXE_brain"))
}

/// A brain process, killed when dropped (also when a test fails).
pub type Brain = test_support::Spawned;

/// Runs `brainctl`; returns whether it succeeded and its stdout and stderr.
pub fn brainctl(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_brainctl"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Starts `brain` on `listen`; returns the process and the address it bound.
pub fn start_brain(dir: &Path, listen: &str, cpus: u32) -> (Brain, String) {
    let (child, addr) = spawn_brain(|cmd| {
        cmd.args(["--listen", listen, "--cpus", &cpus.to_string()])
            .args(["--max-processes", "8"])
            .arg("--database")
            .arg(dir.join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.join("runs"))
            .arg("--policy")
            .arg(dir.join("policy.toml"))
            .arg("--job-master-bin")
            .arg(bin_dir().join("job-master"))
            .args([
                "--job-master-arg=--brain-interval-ms",
                "--job-master-arg=300",
            ])
            .stderr(std::fs::File::create(dir.join(format!("brain-{}.log", now_ms()))).unwrap());
    });
    (child, addr)
}

pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

pub async fn jobs(url: &str) -> Option<Vec<pb::JobRecord>> {
    let mut c = BrainClient::connect(url.to_string()).await.ok()?;
    Some(
        c.list_jobs(pb::ListJobsRequest {})
            .await
            .ok()?
            .into_inner()
            .jobs,
    )
}

/// Training processes alive in a job (any not yet removed or finished), from its master.
pub async fn alive(master: &str) -> Option<u32> {
    let mut c = jm::job_master_client::JobMasterClient::connect(format!("http://{master}"))
        .await
        .ok()?;
    let s = c.get_status(jm::StatusRequest {}).await.ok()?.into_inner();
    Some(
        s.processes
            .iter()
            .filter(|p| !matches!(p.state.as_str(), "removed" | "succeeded"))
            .count() as u32,
    )
}
