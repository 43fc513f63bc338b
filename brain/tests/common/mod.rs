//! What the brain's multi-process tests share.

use std::io::{BufRead, BufReader};
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
