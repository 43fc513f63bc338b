//! What the brain's multi-process tests share.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

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
