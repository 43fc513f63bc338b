//! `job-master run` on bad specs: a clear message naming the field and the value, a non-zero exit
//! code, and no process left behind.

mod common;

use std::process::Command;

use common::*;

const GOOD: &str = r#"
name: bad
kind: ps
roles:
  ps: { replicas: 1 }
  worker: { replicas: 2, min: 1, max: 4, node_unit: 1 }
workload:
  builtin: { batch_size: 64 }
data: { num_samples: 1000, shard_size: 100 }
epochs: 1
checkpoint: { dir: CKPT }
"#;

/// Runs `job-master run` on `yaml`; returns (exit code, stderr).
fn run_spec(yaml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.yaml");
    std::fs::write(
        &spec,
        yaml.replace("CKPT", &dir.path().join("ckpt").display().to_string()),
    )
    .unwrap();
    let out = Command::new(job_master_bin())
        .arg("run")
        .arg(&spec)
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .env("BRAIN_WORKER_AGENT_BIN", agent_bin())
        .output()
        .unwrap();
    // Nothing ran: no agent was started, so no log directory exists.
    assert!(
        !dir.path().join("run/logs").exists(),
        "a bad spec must not start processes"
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `job-master validate` of `yaml`.
fn validate(yaml: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.yaml");
    std::fs::write(
        &spec,
        yaml.replace("CKPT", &dir.path().join("ckpt").display().to_string()),
    )
    .unwrap();
    Command::new(job_master_bin())
        .arg("validate")
        .arg(&spec)
        .output()
        .unwrap()
}

#[test]
fn the_good_spec_is_accepted() {
    let out = validate(GOOD);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_specs_are_rejected_with_the_field_path_and_value() {
    let cases: Vec<(String, &str)> = vec![
        (
            GOOD.replace("epochs: 1", "epochs: 1\nepoch: 3"),
            "epoch: unknown field `epoch`, expected one of",
        ),
        (
            GOOD.replace("kind: ps", "kind: mpi"),
            "kind: unknown variant `mpi`",
        ),
        (
            GOOD.replace("replicas: 2, min: 1", "replicas: -2, min: 1"),
            "roles.worker.replicas: -2 must be greater than zero",
        ),
        (
            GOOD.replace("shard_size: 100", "shard_size: 0"),
            "data.shard_size: 0 must be greater than zero",
        ),
        (
            GOOD.replace("min: 1, max: 4", "min: 5, max: 4"),
            "roles.worker.min: 5 is greater than max 4",
        ),
        (
            GOOD.replace("max: 4, node_unit: 1", "max: 5, node_unit: 2"),
            "roles.worker.max: 5 is not a multiple of node_unit 2",
        ),
        (
            GOOD.replace("builtin: { batch_size: 64 }", "env: { A: b }"),
            "workload: names no command",
        ),
        (
            GOOD.replace(
                "builtin: { batch_size: 64 }",
                "command: [/nonexistent/train.py, --lr, '0.1']",
            ),
            "workload.command[0]: \"/nonexistent/train.py\" is not an executable file nor found on PATH",
        ),
        (
            GOOD.replace("dir: CKPT", "dir: /etc/hostname/ckpt"),
            "checkpoint.dir: /etc/hostname is not a directory",
        ),
        (
            GOOD.replace("  ps: { replicas: 1 }\n", ""),
            "roles.ps: is missing: a ps job needs parameter servers",
        ),
        (
            GOOD.replace(
                "replicas: 2, min",
                "replicas: 2, resources: { cpu: lots }, min",
            ),
            "cpu quantity \"lots\" is not a number of cores",
        ),
        (
            GOOD.replace("batch_size: 64", "batch_size: 64, learning_rate: -1"),
            "workload.builtin.learning_rate: -1 must be a positive number",
        ),
        (
            GOOD.replace("epochs: 1", "epochs: 0"),
            "epochs: 0 must be greater than zero",
        ),
        (
            format!("{GOOD}placement:\n  - {{ roles: [ps, critic], strategy: pack }}\n"),
            "placement[0].roles: names critic, which is not a role of the job",
        ),
    ];
    assert!(cases.len() >= 8);
    for (yaml, expected) in cases {
        let (code, stderr) = run_spec(&yaml);
        assert_eq!(
            code, 2,
            "expected a usage error for {expected:?}, got {code}: {stderr}"
        );
        assert!(stderr.contains("invalid job spec"), "{stderr}");
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in: {stderr}"
        );
    }
}

/// Local processes share one machine: a strict spread that may grow to two cannot be held
/// there, and says so before anything starts; `validate` shows the groups.
#[test]
fn a_placement_one_machine_cannot_hold_is_refused_at_start() {
    let placed = GOOD.replace("replicas: 2, min: 1, max: 4", "replicas: 1, min: 1, max: 2");
    let (code, stderr) = run_spec(&format!(
        "{placed}placement:\n  - {{ roles: [worker], strategy: strict_spread }}\n"
    ));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("placement group worker is strict_spread over up to 2 processes")
            && stderr.contains("--platform ray"),
        "{stderr}"
    );
    let out = validate(&format!(
        "{placed}placement:\n  - {{ roles: [ps, worker], strategy: strict_pack }}\n"
    ));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && said.contains("placement group ps+worker (strict_pack): 2 processes"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_missing_spec_file_is_a_clear_error() {
    let out = Command::new(job_master_bin())
        .args(["run", "/nonexistent/job.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read job spec /nonexistent/job.yaml"),
        "{stderr}"
    );
}

/// A valid spec whose command fails every time: relaunched up to the limit, then the job fails
/// with the reason, exit code 1, and no agent or training process survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_always_fails_fails_the_job_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = r#"
name: always-fails
kind: allreduce
roles:
  worker: { replicas: 2, max_restarts: 2 }
workload:
  command: [sh, -c, "echo rank $RANK of $WORLD_SIZE restart $TORCHELASTIC_RESTART_COUNT; echo the last words of $RANK >&2; exit 3"]
data: { num_samples: 100, shard_size: 10 }
checkpoint: { dir: CKPT }
"#
    .replace("CKPT", &dir.path().join("ckpt").display().to_string());
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, yaml).unwrap();
    let out = tokio::process::Command::new(job_master_bin())
        .arg("run")
        .arg(&spec)
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .args(["--listen", "127.0.0.1:0"])
        .env("BRAIN_WORKER_AGENT_BIN", agent_bin())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("always-fails failed"), "{stdout}");
    assert!(stdout.contains("exited with code 3"), "{stdout}");
    assert!(
        stdout.contains("relaunches exceed the limit of 2"),
        "{stdout}"
    );
    // The failure names the failed process's output file; its last lines are an event.
    let log = stdout
        .split("its output: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no output file named in {stdout}"));
    assert!(
        log.starts_with(&dir.path().join("run/logs/worker-").display().to_string())
            && log.ends_with(".1.log"),
        "{log}"
    );
    // The agent's one file holds each incarnation it started, the last one's words last.
    let rank = log.rsplit('/').next().unwrap()[7..]
        .split('.')
        .next()
        .unwrap();
    let context = std::fs::read_to_string(dir.path().join("run/job-context.json")).unwrap();
    assert!(
        context.contains(&format!("last output ({log}):"))
            && context.contains(&format!(
                "rank {rank} of 2 restart 2\\nthe last words of {rank}\","
            )),
        "{context}"
    );
    // The address it bound, as it printed it.
    let addr = stdout
        .lines()
        .find_map(|l| l.strip_prefix("job master on "))
        .and_then(|rest| rest.split(',').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {stdout}"));
    assert_no_process_left(addr).await;
}

/// A command that exists but cannot be executed (its interpreter is missing) is reported as
/// exit code 127, relaunched up to the limit, and the job fails with that reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_start_fails_the_job_with_exit_code_127() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.sh");
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let yaml = format!(
        "name: cannot-start\nkind: allreduce\nroles:\n  worker: {{ replicas: 1, max_restarts: 1 }}\n\
         workload:\n  command: [{}]\ndata: {{ num_samples: 10, shard_size: 10 }}\ncheckpoint: {{ dir: {} }}\n",
        script.display(),
        dir.path().join("ckpt").display()
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let mut run = start(spec, dir.path()).await;
    let report = run.report().await;
    assert!(!report.succeeded());
    let reason = report.reason.clone().unwrap();
    assert!(reason.contains("exited with code 127"), "{reason}");
    assert_no_process_left(run.addr).await;
}
