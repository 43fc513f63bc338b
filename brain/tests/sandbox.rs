//! Jobs never run as the brain's user (issue 40, attack 5): a `command:` job the operator
//! allows runs as the unprivileged `--run-as` user (when the tests run as root) inside
//! bubblewrap, and tries what a hostile job would: read the brain's data directory and the
//! operator token, see its master's credential with the brain, write into its own code. It
//! sees its checkpoint directory (writable), its own copy of the job's secret, its code read
//! only, and nothing of the brain's. An interpreter's `-c` is no way around the allow-list;
//! a brain that runs as root refuses to start without a user for its jobs.
//!
//! Needs bubblewrap (`.ci/run` installs Debian's `bubblewrap`); without it the test says
//! SKIPPED, unless BRAIN_REQUIRE_SANDBOX is set.

mod common;

use std::path::Path;

fn have_bwrap() -> bool {
    if vocab::spec::host::resolve_program("bwrap").is_some() {
        return true;
    }
    test_support::optional_server(
        "BRAIN_REQUIRE_SANDBOX",
        "bubblewrap",
        "apt-get install bubblewrap",
    );
    false
}

/// What the job's process finds, one `what=how` per line.
const PROBE: &str = r#"
out="$BRAIN_CHECKPOINT_DIR/probe-$BRAIN_INDEX.txt"
{
  echo "uid=$(id -u)"
  if [ -e "$DATA/brain.db" ] || [ -e "$DATA/operator.token" ] || [ -e "$DATA/tls" ]; then echo "data=visible"; else echo "data=hidden"; fi
  echo "runs=$(ls "$DATA/runs" | tr '\n' ' ')"
  echo "run=$(ls -A "$RUN" | tr '\n' ' ')"
  if cat "$DATA/operator.token" >/dev/null 2>&1; then echo "operator_token=read"; else echo "operator_token=unreadable"; fi
  if [ -e "$RUN/brain.token" ]; then echo "credential=visible"; else echo "credential=hidden"; fi
  if echo x > "$CODE/planted" 2>/dev/null; then echo "code=writable"; else echo "code=read-only"; fi
  if [ -s "$BRAIN_JOB_TOKEN_FILE" ] && [ -r "$BRAIN_JOB_TOKEN_FILE" ]; then echo "secret=own"; else echo "secret=missing"; fi
  if echo x > "$BRAIN_CHECKPOINT_DIR/written"; then echo "checkpoints=writable"; fi
  if [ -e /root/.bashrc ] || [ -e /home ]; then echo "home=visible"; else echo "home=hidden"; fi
} > "$out"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_job_runs_as_its_user_in_a_sandbox_that_hides_the_brain() {
    if !have_bwrap() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let code = d.join("code");
    std::fs::create_dir(&code).unwrap();
    let data = d.join("data");
    let script = code.join("job.sh");
    std::fs::write(&script, PROBE).unwrap();
    // Code the job's user may read (the test's directory is root's).
    for p in [d, code.as_path(), script.as_path()] {
        use std::os::unix::fs::PermissionsExt;
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let allowed = format!("/bin/sh {}", script.display());
    std::fs::write(
        d.join("policy.toml"),
        format!(
            "heuristics = []\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n\
             [submissions]\ncommands = [{allowed:?}]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("brain.toml"),
        format!(
            "database = {:?}\n[launcher.sandbox]\nread_only = [{:?}]\n",
            data.join("brain.db"),
            code
        ),
    )
    .unwrap();
    let (_b, addr) = common::spawn_brain(|cmd| {
        cmd.arg("--config")
            .arg(d.join("brain.toml"))
            .args(["--listen", "127.0.0.1:0", "--cpus", "2"])
            .arg("--database")
            .arg(data.join("brain.db"))
            .arg("--runs-dir")
            .arg(data.join("runs"))
            .arg("--policy")
            .arg(d.join("policy.toml"))
            .arg("--job-master-bin")
            .arg(common::bin_dir().join("job-master"))
            .stderr(std::fs::File::create(d.join("brain.log")).unwrap());
    });
    let url = format!("http://{addr}");
    let run = data.join("runs").join("probe");
    let spec = |name: &str, command: &str| {
        let p = d.join(format!("{name}.yaml"));
        std::fs::write(
            &p,
            format!(
                "name: {name}\nkind: allreduce\nroles:\n  worker: {{ replicas: 1 }}\n\
                 workload:\n  command: {command}\n  env: {{ DATA: {:?}, CODE: {:?}, RUN: {:?} }}\n\
                 data: {{ num_samples: 10, shard_size: 10 }}\n\
                 checkpoint: {{ dir: checkpoints }}\n",
                data, code, run
            ),
        )
        .unwrap();
        p
    };
    // The interpreter with code of the job's choosing: refused, whatever the program.
    let (ok, said) = common::brainctl(&[
        "submit",
        spec("escape", "[/bin/sh, -c, \"cat /etc/shadow\"]")
            .to_str()
            .unwrap(),
        "--brain",
        &url,
    ]);
    assert!(!ok && said.contains("is not one of the commands"), "{said}");

    let probe = spec("probe", &format!("[/bin/sh, {:?}]", script));
    let (ok, said) =
        common::brainctl(&["submit", probe.to_str().unwrap(), "--brain", &url, "--wait"]);
    assert!(ok, "{said}\n{}", log(&run));
    let report = std::fs::read_to_string(run.join("checkpoints/probe-0.txt"))
        .unwrap_or_else(|e| panic!("{e}\n{}", log(&run)));
    let uid = test_support::run_as()
        .map(|u| {
            nix::unistd::User::from_name(&u)
                .unwrap()
                .unwrap()
                .uid
                .to_string()
        })
        .unwrap_or_else(|| nix::unistd::geteuid().to_string());
    for line in [
        format!("uid={uid}"),
        "data=hidden".into(),
        // Of the runs directory only the way to its own checkpoints and secrets.
        "runs=probe ".into(),
        "run=checkpoints master ".into(),
        "operator_token=unreadable".into(),
        "credential=hidden".into(),
        "code=read-only".into(),
        "secret=own".into(),
        "checkpoints=writable".into(),
        "home=hidden".into(),
    ] {
        assert!(
            report.lines().any(|l| l == line),
            "{line} not in:\n{report}"
        );
    }
    assert!(!code.join("planted").exists());
}

fn log(run: &Path) -> String {
    let mut out = std::fs::read_to_string(run.join("job-master.log")).unwrap_or_default();
    if let Ok(logs) = std::fs::read_dir(run.join("master/logs")) {
        for l in logs.flatten() {
            out += &format!("--- {}\n", l.path().display());
            out += &std::fs::read_to_string(l.path()).unwrap_or_default();
        }
    }
    out
}

/// A brain that runs as root refuses to start without an unprivileged user for its jobs.
#[test]
fn a_root_brain_without_a_user_for_its_jobs_refuses_to_start() {
    if !nix::unistd::geteuid().is_root() {
        test_support::skipped("not root: a brain that is not root runs its jobs as its own user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brain"))
        .args(["--listen", "127.0.0.1:0", "--cpus", "2", "--database"])
        .arg(dir.path().join("brain.db"))
        .env_remove("BRAIN_RUN_AS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("runs as root") && err.contains("--run-as"),
        "{err}"
    );
    for (user, says) in [("root", "is root"), ("no-such-user-x", "no user named")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_brain"))
            .args(["--listen", "127.0.0.1:0", "--cpus", "2", "--run-as", user])
            .arg("--database")
            .arg(dir.path().join("brain.db"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
    assert!(!dir.path().join("operator.token").exists());
}
