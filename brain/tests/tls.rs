//! The brain over mutual TLS, as an operator sets it up: `brainctl certs` makes a CA and the
//! certificates, `brain --tls-dir` serves with them, and a job submitted over TLS runs to its
//! end (its master reports to the brain over TLS with its own certificate). A client with a
//! foreign CA, without a client certificate, or in plain text is refused; a brain that would
//! listen beyond loopback without TLS refuses to start unless told `--insecure`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Brain, spawn_brain, start_brain_with, token_file};

fn brainctl_with(url: &str, tls: &[&std::ffi::OsStr], args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_brainctl"))
        .args(args)
        .args(["--brain", url])
        .arg("--token-file")
        .arg(token_file(url))
        .args(tls)
        .env_remove("BRAIN_CA_FILE")
        .env_remove("BRAIN_TLS_DIR")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn certs(dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_brainctl"))
        .args(["certs", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("[launcher.tls]"), "{said}");
}

fn tls_brain(d: &Path, tls: &Path) -> (Brain, String) {
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n",
    )
    .unwrap();
    start_brain_with(d, "127.0.0.1:0", 4, |cmd| {
        cmd.arg("--tls-dir").arg(tls);
    })
}

#[test]
fn a_job_runs_over_mutual_tls_and_clients_without_the_right_certificates_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ours, foreign) = (d.join("tls"), d.join("other-tls"));
    certs(&ours);
    certs(&foreign);
    // Certificates are never overwritten.
    let out = Command::new(env!("CARGO_BIN_EXE_brainctl"))
        .args(["certs", "--out"])
        .arg(&ours)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists already"));

    let (_brain, addr) = tls_brain(d, &ours);
    let url = format!("https://{addr}");
    let dir_flag = |p: &Path| vec![std::ffi::OsString::from("--tls-dir"), p.into()];
    let ours_flags = dir_flag(&ours);
    let ours_flags: Vec<&std::ffi::OsStr> = ours_flags.iter().map(|s| s.as_os_str()).collect();

    // The brain's own CA and a client certificate: answered.
    let (ok, said) = brainctl_with(&url, &ours_flags, &["jobs"]);
    assert!(ok, "{said}");

    // A client that trusts another CA refuses the brain's certificate.
    let foreign_flags = dir_flag(&foreign);
    let foreign_flags: Vec<&std::ffi::OsStr> =
        foreign_flags.iter().map(|s| s.as_os_str()).collect();
    let (ok, said) = brainctl_with(&url, &foreign_flags, &["jobs"]);
    assert!(!ok);
    assert!(said.contains("cannot reach the brain"), "{said}");
    assert!(said.to_lowercase().contains("certificate"), "{said}");

    // The right CA but a client certificate another CA signed: the brain refuses it.
    let ca = ours.join(auth::tls::CA_CERT);
    let (cert, key) = (
        foreign.join(auth::tls::CLIENT_CERT),
        foreign.join(auth::tls::CLIENT_KEY),
    );
    let mixed: Vec<&std::ffi::OsStr> = vec![
        "--ca".as_ref(),
        ca.as_os_str(),
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ];
    let (ok, said) = brainctl_with(&url, &mixed, &["jobs"]);
    assert!(!ok, "{said}");

    // No client certificate at all: refused (mutual TLS).
    let (ok, said) = brainctl_with(&url, &["--ca".as_ref(), ca.as_os_str()], &["jobs"]);
    assert!(!ok, "{said}");

    // Plain text to a TLS brain: no answer.
    let (ok, said) = brainctl_with(&format!("http://{addr}"), &[], &["jobs"]);
    assert!(!ok, "{said}");

    // A job over TLS end to end: its master registers, reports and finishes with its own
    // certificate.
    let spec = d.join("tls-job.yaml");
    std::fs::write(
        &spec,
        "name: tls-job\nkind: allreduce\nroles:\n  worker: { min: 1, max: 2 }\n\
         workload:\n  builtin: { batch_size: 128 }\n\
         data: { num_samples: 8000, shard_size: 500, eval_samples: 1000 }\n\
         checkpoint: { dir: checkpoints, every_shards: 8 }\n",
    )
    .unwrap();
    let (ok, said) = brainctl_with(
        &url,
        &ours_flags,
        &["submit", spec.to_str().unwrap(), "--wait"],
    );
    assert!(ok, "{said}");
    assert!(said.contains("succeeded"), "{said}");
    let (ok, said) = brainctl_with(&url, &ours_flags, &["status", "tls-job"]);
    assert!(ok, "{said}");
    assert!(said.contains("succeeded"), "{said}");
}

#[test]
fn a_brain_beyond_loopback_without_tls_refuses_to_start_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brain"))
        .args(
            test_support::run_as()
                .map(|u| ["--run-as".to_string(), u])
                .into_iter()
                .flatten(),
        )
        .args(["--listen", "0.0.0.0:0", "--cpus", "2"])
        .arg("--database")
        .arg(dir.path().join("brain.db"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("without TLS") && err.contains("--insecure") && err.contains("brainctl certs"),
        "{err}"
    );
    // Refused before anything is announced or made.
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!said.contains("listening on"), "{said}");
    assert!(!dir.path().join("operator.token").exists());
    // TLS without the CA for the masters it starts: refused, named.
    std::fs::write(
        dir.path().join("brain.toml"),
        format!(
            "database = {:?}\n[tls]\ncert_file = \"x.pem\"\nkey_file = \"x.key\"\n",
            dir.path().join("b2.db")
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brain"))
        .args(
            test_support::run_as()
                .map(|u| ["--run-as".to_string(), u])
                .into_iter()
                .flatten(),
        )
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(dir.path().join("brain.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[launcher.tls]"), "{err}");
}

/// `--insecure`: no token is asked for (on loopback here; the flag is what allows an address
/// beyond it without TLS).
#[tokio::test]
async fn an_insecure_brain_answers_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, addr) = spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--cpus", "2", "--insecure"])
            .arg("--database")
            .arg(dir.path().join("brain.db"));
    });
    let mut c = common::client_with(&addr, None).await;
    let jobs = tokio::time::timeout(
        Duration::from_secs(10),
        c.list_jobs(proto::service::v1::ListJobsRequest {}),
    )
    .await
    .unwrap();
    assert!(jobs.is_ok(), "{jobs:?}");
}
