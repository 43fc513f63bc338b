//! What a confined job's process sees and what it looks like from outside (issue 40, attack
//! 5): the probe a `command:` job runs, what it must report, and `/proc`'s view of the
//! built-in workload's processes. Shared by the local sandbox test and the Ray cluster's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What the job's process finds, one `what=how` per line, in
/// `$BRAIN_CHECKPOINT_DIR/probe-$BRAIN_INDEX.txt`. `DATA`, `CODE` and `RUN` (the brain's
/// data directory, the job's code, its run directory) come in the job's env.
pub const PROBE: &str = r#"
out="$BRAIN_CHECKPOINT_DIR/probe-$BRAIN_INDEX.txt"
{
  echo "uid=$(id -u)"
  echo "node=${BRAIN_SERVICE_ADDR%:*}"
  if [ -e "$DATA/brain.db" ] || [ -e "$DATA/operator.token" ] || [ -e "$DATA/tls" ]; then echo "data=visible"; else echo "data=hidden"; fi
  echo "runs=$(ls "$DATA/runs" | tr '\n' ' ')"
  echo "run=$(ls -A "$RUN" | tr '\n' ' ')"
  if cat "$DATA/operator.token" >/dev/null 2>&1; then echo "operator_token=read"; else echo "operator_token=unreadable"; fi
  if [ -e "$RUN/brain.token" ]; then echo "credential=visible"; else echo "credential=hidden"; fi
  if echo x > "$CODE/planted" 2>/dev/null; then echo "code=writable"; else echo "code=read-only"; fi
  if [ -s "$BRAIN_JOB_TOKEN_FILE" ] && [ -r "$BRAIN_JOB_TOKEN_FILE" ]; then echo "secret=own"; else echo "secret=missing"; fi
  if echo x > "$BRAIN_CHECKPOINT_DIR/written"; then echo "checkpoints=writable"; fi
  if t=$(mktemp) && echo x > "$t" && rm "$t"; then echo "tmp=writable"; else echo "tmp=read-only"; fi
  if [ -e /root/.bashrc ] || [ -e /home ]; then echo "home=visible"; else echo "home=hidden"; fi
  if [ -n "$SECRET_CANARY$OLDPWD" ]; then echo "brain_env=leaked"; else echo "brain_env=absent"; fi
  echo "env=$(env | cut -d= -f1 | sort | tr '\n' ' ')"
} > "$out"
"#;

/// Writes [`PROBE`] to `code/job.sh` with modes the job's user may read (the test's
/// directories are root's); returns the script's path.
pub fn write_probe(code: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(code).unwrap();
    let script = code.join("job.sh");
    std::fs::write(&script, PROBE).unwrap();
    let mut up: Vec<&Path> = code
        .ancestors()
        .take_while(|p| p.starts_with("/tmp"))
        .collect();
    up.push(&script);
    for p in up.into_iter().filter(|p| *p != Path::new("/tmp")) {
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    script
}

/// The uid a brain the tests start runs its jobs as: the `--run-as` user when the tests run
/// as root, else the tests' own.
pub fn job_uid() -> nix::unistd::Uid {
    match test_support::run_as() {
        Some(u) => nix::unistd::User::from_name(&u).unwrap().unwrap().uid,
        None => nix::unistd::geteuid(),
    }
}

/// Checks a probe's report of job `job`: the job's user, the brain's data hidden but the way
/// to the job's own checkpoints and secrets, the operator token and the master's credential
/// out of reach, the code read only, the secret its own, the checkpoints and a private /tmp
/// writable (torch and Python's tempfile need one), no home.
pub fn assert_probe(report: &str, job: &str) {
    for line in [
        format!("uid={}", job_uid()),
        "data=hidden".into(),
        format!("runs={job} "),
        "run=checkpoints master ".into(),
        "operator_token=unreadable".into(),
        "credential=hidden".into(),
        "code=read-only".into(),
        "secret=own".into(),
        "checkpoints=writable".into(),
        "tmp=writable".into(),
        "home=hidden".into(),
        "brain_env=absent".into(),
    ] {
        assert!(
            report.lines().any(|l| l == line),
            "{line} not in:\n{report}"
        );
    }
}

/// What `/proc` says of one of a job's processes: its real, effective, saved and file-system
/// user, whether it may gain privileges, its effective capabilities, and whether it sees the
/// brain's database or operator token (through its own root: the view bubblewrap gave it).
#[derive(Debug)]
pub struct Seen {
    pub what: String,
    pub uids: String,
    pub no_new_privs: bool,
    pub cap_eff: String,
    pub sees_data: bool,
}

/// Adds to `seen` (by pid) the processes of the built-in workload (`worker-agent workload
/// ...`) whose checkpoint directory is `checkpoints`, as they look from outside now.
pub fn look_at_builtin(checkpoints: &Path, data: &Path, seen: &mut BTreeMap<i32, Seen>) {
    let want = format!("BRAIN_CHECKPOINT_DIR={}", checkpoints.display());
    for p in procfs::process::all_processes().unwrap().flatten() {
        if seen.contains_key(&p.pid) {
            continue;
        }
        let Ok(cmd) = p.cmdline() else { continue };
        if cmd.get(1).map(String::as_str) != Some("workload") {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{}/environ", p.pid)) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", p.pid)) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        let root = PathBuf::from(format!("/proc/{}/root", p.pid));
        let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap());
        seen.insert(
            p.pid,
            Seen {
                what: cmd.get(2).cloned().unwrap_or_default(),
                uids: field("Uid:"),
                no_new_privs: field("NoNewPrivs:") == "1",
                cap_eff: field("CapEff:"),
                sees_data: inside(&data.join("brain.db")).exists()
                    || inside(&data.join("operator.token")).exists(),
            },
        );
    }
}

/// Checks that every process seen ran as the job's user, without privileges or a way to gain
/// any, the brain's data out of its sight.
pub fn assert_confined(seen: &BTreeMap<i32, Seen>) {
    let uid = job_uid();
    for s in seen.values() {
        assert_eq!(s.uids, format!("{uid} {uid} {uid} {uid}"), "{s:?}");
        assert!(s.no_new_privs, "{s:?}");
        assert_eq!(s.cap_eff, "0000000000000000", "{s:?}");
        assert!(!s.sees_data, "it sees the brain's data: {s:?}");
    }
}
