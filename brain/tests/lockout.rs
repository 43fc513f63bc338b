//! Nobody locks the brain out without a credential (issue 40, attack 1): a brain whose
//! open-file limit is the common 1,024 is flooded with thousands of connections that never send
//! a byte (`--insecure`, plain text) or never start their TLS handshake (the default: the
//! brain's own TLS), held and renewed the whole time, and a real `brainctl` is still answered,
//! again and again. Afterwards `/metrics` counts what the listener closed.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Starts a brain with the open-file limit at 1,024 (soft and hard: it cannot raise it).
fn brain_at_1024(d: &Path, insecure: bool) -> (test_support::Spawned, String) {
    std::fs::write(d.join("policy.toml"), "[live]\ninterval_s = 1\n").unwrap();
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=1024:1024")
        .arg(env!("CARGO_BIN_EXE_brain"))
        .args(["--listen", "127.0.0.1:0", "--cpus", "2"])
        .arg("--database")
        .arg(d.join("brain.db"))
        .arg("--runs-dir")
        .arg(d.join("runs"))
        .arg("--policy")
        .arg(d.join("policy.toml"))
        .stderr(std::fs::File::create(d.join("brain.log")).unwrap());
    if insecure {
        cmd.arg("--insecure");
    }
    test_support::brain_run_as(&mut cmd);
    let (brain, addr) =
        test_support::spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(60));
    common::register(&addr, &cmd);
    (brain, addr)
}

fn served_under_flood(insecure: bool) {
    // The flood holds thousands of descriptors in this process.
    auth::listen::raise_open_files().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_brain, addr) = brain_at_1024(d, insecure);
    let url = format!("http://{addr}");

    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let flooder =
        test_support::hold_silent_connections(addr.clone(), 3000, stop.clone(), made.clone());
    // The flood is well past the brain's 1,024 descriptors before the client comes.
    test_support::wait_until(Duration::from_secs(60), "3,000 connections", || {
        (made.load(Ordering::Relaxed) >= 3000).then_some(())
    });
    for _ in 0..5 {
        let (ok, said) = common::brainctl(&["jobs", "--brain", &url]);
        assert!(ok, "brainctl under the flood: {said}");
    }
    stop.store(true, Ordering::Relaxed);
    flooder.join().unwrap();
    let made = made.load(Ordering::Relaxed);
    assert!(made >= 3000, "{made}");

    // The listener said what it did.
    let metrics = common::scrape(&url);
    let evicted: f64 = metrics
        .lines()
        .find(|l| l.starts_with("brain_connections_closed_total{reason=\"evicted\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no eviction count in /metrics:\n{metrics}"));
    assert!(evicted >= 2000.0, "{evicted} of {made}");
    let log = std::fs::read_to_string(d.join("brain.log")).unwrap();
    assert!(log.contains("connection cap reached"), "{log}");
}

#[test]
fn thousands_of_silent_connections_do_not_lock_out_a_plain_brain() {
    served_under_flood(true);
}

#[test]
fn thousands_of_connections_that_never_start_tls_do_not_lock_out_a_tls_brain() {
    served_under_flood(false);
}
