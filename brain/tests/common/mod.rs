//! What the brain's multi-process tests share.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Starts the `brain` binary as `configure` sets it up (its arguments, stderr) and waits for
/// the address it prints; returns the process and `host:port`.
pub fn spawn_brain(configure: impl FnOnce(&mut Command)) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brain"));
    cmd.stdout(Stdio::piped());
    configure(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (child, addr)
}

/// Builds the job master and worker agent the brain starts (beside the brain binary).
pub fn bin_dir() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_BIN_EXE_brain"))
                .parent()
                .unwrap()
                .to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            // The same selection as job-master's tests build (see there).
            let ok = Command::new(cargo)
                .args([
                    "build",
                    "-p",
                    "job-master",
                    "--bin",
                    "job-master",
                    "-p",
                    "worker-agent",
                    "--bin",
                    "worker-agent",
                ])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("cargo runs");
            assert!(ok.success(), "cannot build job-master and worker-agent");
            dir
        })
        .clone()
}

/// A brain process, killed when dropped (also when a test fails).
pub struct Brain(pub Child);

impl Brain {
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Brain {
    fn drop(&mut self) {
        self.kill();
    }
}

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
