//! The worker-agent binary on its own: clear errors when its master or its environment is
//! missing, and the single-process reference run.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_worker-agent"))
}

fn agent_to_nowhere(token_file: Option<&std::path::Path>) -> std::process::Output {
    let mut cmd = bin();
    cmd.args([
        "agent",
        "--master",
        "http://127.0.0.1:1",
        "--role",
        "worker",
        "--index",
        "0",
        "--master-timeout-secs",
        "1",
    ])
    .env_remove(auth::JOB_TOKEN_ENV);
    if let Some(f) = token_file {
        cmd.arg("--token-file").arg(f);
    }
    cmd.output().unwrap()
}

#[test]
fn an_agent_without_a_master_gives_up_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("job.token");
    auth::write_secret(&token, &auth::Token::generate()).unwrap();
    let out = agent_to_nowhere(Some(&token));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach the job master at http://127.0.0.1:1"),
        "{stderr}"
    );
}

#[test]
fn an_agent_needs_the_jobs_secret_in_a_file_only_its_owner_reads() {
    let out = agent_to_nowhere(None);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--token-file"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("job.token");
    auth::write_secret(&token, &auth::Token::generate()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = agent_to_nowhere(Some(&token));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the job's secret") && stderr.contains("readable by others"),
        "{stderr}"
    );
}

#[test]
fn a_workload_without_its_environment_names_the_missing_variable() {
    let out = bin()
        .args(["workload", "ps-worker"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("environment variable BRAIN_ROLE"),
        "{stderr}"
    );
}

#[test]
fn a_bad_role_is_refused_by_the_argument_parser() {
    let out = bin()
        .args([
            "agent",
            "--master",
            "http://127.0.0.1:1",
            "--role",
            "Chief_1",
            "--index",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid value 'Chief_1'") && stderr.contains("is not a DNS-1123 label"),
        "{stderr}"
    );
}

#[test]
fn the_reference_run_prints_the_held_out_loss() {
    let out = bin()
        .args([
            "reference",
            "--layout",
            "sparse",
            "--num-samples",
            "5000",
            "--eval-samples",
            "1000",
            "--hash-buckets",
            "4096",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let loss: f64 = stdout
        .strip_prefix("held-out log-loss ")
        .and_then(|s| s.split(';').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        loss > 0.2 && loss < 0.69,
        "a trained model beats the constant 0.69: {loss}"
    );
}
