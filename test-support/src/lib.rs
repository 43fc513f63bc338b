//! What Brain's multi-process tests and benches share (a dev-dependency only):
//!
//! * [`Spawned`]: a child process that is killed when dropped (also when a test fails), started
//!   with [`spawn_announcing`], which reads the address the child printed after binding port 0,
//!   so no test reserves a port and hopes it stays free.
//! * [`wait_exit`], [`kill9`], [`parent_of`], [`descendants`], [`alive`]: processes by pid.
//! * [`wait_until`]: polling with a deadline and a message that says what was awaited.
//! * [`workspace_bins`]: the `job-master` and `worker-agent` binaries, built once per test
//!   binary so that a test never runs a stale one.
//! * [`python_sdk`]: this checkout's Python SDK, built for a test's Python; [`python_with`] and
//!   [`torch_with_sdk`] find the Python (and build the SDK for it).
//! * [`optional_server`]: a real server a test needs (Ray, influxd, a Python with packages) is
//!   missing: say `SKIPPED` loudly, or fail when `.ci/run` made it mandatory.
//! * [`fuzz`]: mangled text for fuzzing parsers (proptest).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
pub mod fuzz;

use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child process, killed and reaped when dropped.
pub struct Spawned {
    pub child: Child,
}

impl Spawned {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and reap; a process that already ended is fine.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to end; kills it and panics after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        wait_exit(&mut self.child, timeout)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `cmd` with its standard output piped and waits (up to `timeout`) for the first line
/// that starts with `prefix`; returns the process and what follows the prefix on that line up
/// to the first space or comma (an address such as `127.0.0.1:41234`). Lines before it are
/// skipped. Panics with the output seen so far when the process ends or the deadline passes.
/// Its later output is copied to this test's stderr (shown when the test fails), so a chatty
/// child never blocks on a full pipe.
pub fn spawn_announcing(cmd: &mut Command, prefix: &str, timeout: Duration) -> (Spawned, String) {
    cmd.stdout(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()));
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    let prefix_owned = prefix.to_string();
    // A reader thread, so that the deadline holds even when the child prints nothing.
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Err(seen));
                    return;
                }
                Ok(_) => {
                    if let Some(rest) = line.trim_end().strip_prefix(&prefix_owned) {
                        let word = rest
                            .split([' ', ','])
                            .next()
                            .unwrap_or_default()
                            .to_string();
                        let _ = tx.send(Ok(word));
                        drain(reader);
                        return;
                    }
                    seen.push_str(&line);
                }
            }
        }
    });
    let mut spawned = Spawned { child };
    match rx.recv_timeout(timeout) {
        Ok(Ok(word)) => (spawned, word),
        Ok(Err(seen)) => {
            let status = spawned.child.wait().ok();
            panic!(
                "{:?} ended ({status:?}) before printing {prefix:?}; its output:\n{seen}",
                cmd.get_program()
            )
        }
        Err(_) => panic!(
            "{:?} printed no line starting with {prefix:?} within {timeout:?}",
            cmd.get_program()
        ),
    }
}

fn drain(mut reader: BufReader<ChildStdout>) {
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
        eprint!("| {line}");
        line.clear();
    }
}

/// Waits for `child` to end; kills it and panics after `timeout`.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not end within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `f` every 50 ms until it returns `Some`; panics naming `what` after `timeout`.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL to `pid`; panics when there is no such process.
pub fn kill9(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
}

/// Freezes `pid` (SIGSTOP): alive, holding its sockets, making no progress.
pub fn freeze(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
}

/// Stops `pid` for `stopped` out of every `period` until the guard is dropped or the process
/// is gone: a node that gives the process only part of its time.
pub fn duty_cycle(pid: u32, stopped: Duration, period: Duration) -> DutyCycle {
    use nix::sys::signal::{Signal, kill};
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            if kill(pid, Signal::SIGSTOP).is_err() {
                return;
            }
            std::thread::sleep(stopped);
            let _ = kill(pid, Signal::SIGCONT);
            std::thread::sleep(period - stopped);
        }
        let _ = kill(pid, Signal::SIGCONT);
    });
    DutyCycle(done)
}

/// Ends a [`duty_cycle`] when dropped.
pub struct DutyCycle(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DutyCycle {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether `pid` is a live process (a zombie is not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// The parent of `pid`.
pub fn parent_of(pid: u32) -> u32 {
    try_parent_of(pid).unwrap_or_else(|| panic!("no parent of {pid} in /proc/{pid}/stat"))
}

fn try_parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
}

/// Every process descended from `pid` (its children, theirs, ...), from /proc: what killing a
/// process group misses when a child started its own session (torchrun's workers do).
pub fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| Some((p, try_parent_of(p)?)))
        .collect();
    let (mut out, mut frontier) = (Vec::new(), vec![pid]);
    while let Some(p) = frontier.pop() {
        for &(child, parent) in &parents {
            if parent == p {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// The directory holding the workspace's `job-master` and `worker-agent` binaries, built
/// once per test binary (`cargo test -p X` does not rebuild another package's binary; when
/// they are up to date this costs a fraction of a second). `beside` is a binary of the
/// calling test's own package (`env!("CARGO_BIN_EXE_...")`), whose directory they are built
/// into. Every caller builds the same selection, so whichever runs second finds everything
/// built (another package set would resolve other features).
pub fn workspace_bins(beside: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = Path::new(beside)
                .parent()
                .expect("a binary path has a directory")
                .to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut build = Command::new(cargo);
            // What cargo sets for a running test (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, OUT_DIR,
            // ...) is what build scripts such as ring's watch (`rerun-if-env-changed`): seen
            // here, they would rebuild ring, rustls and tonic, and again at the next build
            // from a shell (a minute and a half each way on 2 cores).
            for (name, _) in std::env::vars_os() {
                let n = name.to_string_lossy();
                if set_for_tests(&n) {
                    build.env_remove(&name);
                }
            }
            let ok = build
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
                // The running test's package (cargo sets it at run time): the value compiled
                // into this crate may name another checkout that shared the target directory.
                .current_dir(
                    std::env::var_os("CARGO_MANIFEST_DIR")
                        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from),
                )
                .status()
                .expect("cargo runs");
            assert!(ok.success(), "cannot build job-master and worker-agent");
            for bin in ["job-master", "worker-agent"] {
                assert!(
                    dir.join(bin).exists(),
                    "{bin} was not built in {}",
                    dir.display()
                );
            }
            dir
        })
        .clone()
}

/// Whether cargo sets the environment variable `name` for the test binary it runs (and for
/// build scripts), rather than it coming from the user's environment.
fn set_for_tests(name: &str) -> bool {
    ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_"]
        .iter()
        .any(|p| name.starts_with(p))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
            "OUT_DIR",
        ]
        .contains(&name)
}

/// Builds this checkout's Python SDK (`python/`) with `python` into a directory to put on
/// `PYTHONPATH`: `pip install --no-build-isolation --target`, with the grpcio-tools of
/// `python`'s environment (`.ci/run` installs the SDK's pinned build requirements into its
/// torch virtualenv), so nothing is downloaded. The directory is named by a digest of the
/// SDK's sources, the job master's `.proto` and `python`, and shared by every test process
/// (cargo nextest runs each test in one of its own): the first builds it beside and renames
/// it into place; the others wait for it under a lock and find it. `Err`: pip's output.
pub fn python_sdk(python: &str) -> Result<PathBuf, String> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let sdk = root.join("python");
            let key = sources_digest(&[&sdk, &root.join("proto/proto")], python)
                .map_err(|e| format!("reading {}: {e}", sdk.display()))?;
            let dir = std::env::temp_dir().join(format!("brain-sdk-{key:016x}"));
            if dir.is_dir() {
                return Ok(dir);
            }
            // pip builds in the source tree (python/build): one build at a time.
            let lock = std::fs::File::create(std::env::temp_dir().join("brain-sdk.lock"))
                .map_err(|e| format!("the SDK build's lock: {e}"))?;
            let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| format!("the SDK build's lock: {e}"))?;
            if dir.is_dir() {
                return Ok(dir);
            }
            let building = dir.with_extension(format!("{}.part", std::process::id()));
            let _ = std::fs::remove_dir_all(&building);
            let out = Command::new(python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(["--no-build-isolation", "--no-deps", "--target"])
                .arg(&building)
                .arg(&sdk)
                .output()
                .map_err(|e| format!("{python}: {e}"))?;
            if !out.status.success() {
                let _ = std::fs::remove_dir_all(&building);
                return Err(String::from_utf8_lossy(&out.stderr).into_owned());
            }
            std::fs::rename(&building, &dir)
                .map_err(|e| format!("{} not put in place: {e}", dir.display()))?;
            Ok(dir)
        })
        .clone()
}

/// A digest of the files under `dirs` (paths and contents, in name order; build outputs and
/// caches left out) and of `salt`.
fn sources_digest(dirs: &[&Path], salt: &str) -> std::io::Result<u64> {
    use std::hash::{Hash, Hasher};
    fn walk(dir: &Path, h: &mut impl Hasher) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name();
            let n = name.to_string_lossy();
            if n == "build" || n == "__pycache__" || n.ends_with(".egg-info") {
                continue;
            }
            let path = e.path();
            n.hash(h);
            if e.file_type()?.is_dir() {
                walk(&path, h)?;
            } else {
                std::fs::read(&path)?.hash(h);
            }
        }
        Ok(())
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    salt.hash(&mut h);
    for d in dirs {
        walk(d, &mut h)?;
    }
    Ok(h.finish())
}

/// The Python named by `var` (else `python3`) when it imports `module`; otherwise SKIPPED, or
/// a failure when `require` is set (as `.ci/run` sets it).
pub fn python_with(module: &str, var: &str, require: &str) -> Option<String> {
    let python = std::env::var(var).unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    optional_server(
        require,
        &format!("a Python with {module}"),
        &format!("set {var} to one, as .ci/run does with its virtualenv"),
    );
    None
}

/// The torch Python of [`python_with`] and a directory to put on its `PYTHONPATH` that holds
/// this checkout's SDK ([`python_sdk`]).
pub fn torch_with_sdk() -> Option<(String, PathBuf)> {
    let python = python_with("torch", "BRAIN_TORCH_PYTHON", "BRAIN_REQUIRE_TORCH")?;
    match python_sdk(&python) {
        Ok(dir) => Some((python, dir)),
        Err(e) => panic!(
            "cannot build the SDK in python/ with {python} (it needs the build requirements of \
             python/pyproject.toml, as .ci/run installs them): {e}"
        ),
    }
}

/// A real server or tool a test needs is missing (`what`, and how to get it in `how`).
/// When the environment variable `require` is set (`.ci/run` sets it), the test fails;
/// otherwise it prints a loud `SKIPPED` line and the caller returns.
pub fn optional_server(require: &str, what: &str, how: &str) {
    if std::env::var_os(require).is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("{require} is set but {what} is missing: {how}");
    }
    skipped(&format!(
        "{what} is missing ({how}); set {require}=1 to make this a failure"
    ));
}

/// The multi-node Ray cluster `.ci/ray-cluster start DIR` made, from `BRAIN_RAY_CLUSTER=DIR`.
pub struct RayClusterDir {
    pub dir: std::path::PathBuf,
    /// The head's dashboard, `http://NODE0:8265`.
    pub dashboard: String,
    /// This machine's address on the nodes' bridge (where processes here are reached).
    pub host: String,
    /// Each node's address, by node index (0: the head).
    pub nodes: Vec<String>,
}

impl RayClusterDir {
    /// `.ci/ray-cluster kill|revive DIR N`: SIGKILLs every process of node `index` (a node
    /// lost), or starts it again.
    pub fn node(&self, what: &str, index: usize) {
        self.script(&[what, &index.to_string()]);
    }

    /// `.ci/ray-cluster slow DIR N PERCENT`: caps node `index` at `percent` % of one CPU
    /// (every process of it, those it starts later too) until the guard is dropped.
    #[must_use]
    pub fn slow(&self, index: usize, percent: u32) -> SlowNode<'_> {
        self.script(&["slow", &index.to_string(), &percent.to_string()]);
        SlowNode {
            cluster: self,
            index,
        }
    }

    /// The last lines of each node's `ray start` output and of Ray's record of the processes
    /// that exited: what a test that finds a node gone needs to say why.
    pub fn logs(&self) -> String {
        let mut out: Vec<String> = (0..self.nodes.len())
            .map(|i| tail(&self.dir.join(format!("node{i}.log")), 15))
            .collect();
        let sessions = std::fs::read_dir(self.dir.join("tmp"))
            .into_iter()
            .flatten();
        // Each session once: `session_latest` is a link to one of them.
        for s in sessions
            .flatten()
            .filter(|s| s.file_type().is_ok_and(|t| t.is_dir()))
        {
            let exits = s.path().join("logs/ray_process_exit.log");
            if exits.exists() {
                out.push(tail(&exits, 15));
            }
        }
        out.join("\n")
    }

    fn script(&self, args: &[&str]) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/ray-cluster");
        let (what, rest) = args.split_first().expect("a command");
        let shown = rest.join(" ");
        let out = Command::new(script)
            .arg(what)
            .arg(&self.dir)
            .args(rest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ray-cluster {what} {shown}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The last `n` lines of the file at `path` under a header naming it (empty when it cannot be
/// read): what a failing test prints of a log that is gone once it ends.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    format!(
        "--- {} (last {n} lines)\n{}",
        path.display(),
        lines[from..].join("\n")
    )
}

/// A node [`RayClusterDir::slow`] capped: uncapped when dropped.
pub struct SlowNode<'a> {
    cluster: &'a RayClusterDir,
    index: usize,
}

impl Drop for SlowNode<'_> {
    fn drop(&mut self) {
        // Not asserted: a drop while a failed test unwinds must not abort.
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/ray-cluster");
        let _ = Command::new(script)
            .arg("fast")
            .arg(&self.cluster.dir)
            .arg(self.index.to_string())
            .output();
    }
}

/// The cluster of `BRAIN_RAY_CLUSTER`, or `None` (said so, or a failure with
/// `BRAIN_REQUIRE_RAY_CLUSTER=1`) where there is none.
pub fn ray_cluster() -> Option<RayClusterDir> {
    let dir = match std::env::var("BRAIN_RAY_CLUSTER") {
        Ok(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => {
            optional_server(
                "BRAIN_REQUIRE_RAY_CLUSTER",
                "a multi-node Ray cluster",
                "start one with `.ci/ray-cluster start DIR` (as root) and set \
                 BRAIN_RAY_CLUSTER=DIR, as .ci/run does",
            );
            return None;
        }
    };
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(f).display()))
            .trim()
            .to_string()
    };
    Some(RayClusterDir {
        dashboard: read("address"),
        host: read("host"),
        nodes: read("nodes")
            .lines()
            .map(|l| {
                l.split_whitespace()
                    .nth(2)
                    .expect("index ns address")
                    .into()
            })
            .collect(),
        dir,
    })
}

/// Prints `*** SKIPPED: why ***` where it is seen even when the test passes (straight to the
/// process's stderr: the test harness captures only `eprintln!`).
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {why} ***\n");
}

/// The user a brain started by a test runs its jobs' processes as (`brain --run-as`), when the
/// tests run as root (a brain refuses to run jobs as root): `BRAIN_TEST_RUN_AS`, or
/// `brain-job`, which must exist (`.ci/run` makes it: `useradd --system --no-create-home
/// brain-job`). `None` when the tests do not run as root.
pub fn run_as() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let name = std::env::var("BRAIN_TEST_RUN_AS").unwrap_or_else(|_| "brain-job".into());
    match nix::unistd::User::from_name(&name) {
        Ok(Some(_)) => Some(name),
        _ => panic!(
            "the tests run as root, and a brain runs its jobs as an unprivileged user: make \
             {name:?} (`useradd --system --no-create-home {name}`; .ci/run does) or name \
             another in BRAIN_TEST_RUN_AS"
        ),
    }
}

/// Adds `--run-as USER` ([`run_as`]) to a `brain` command line when the tests run as root.
pub fn brain_run_as(cmd: &mut Command) {
    if let Some(user) = run_as() {
        cmd.args(["--run-as", &user]);
    }
}

/// Holds `held` TCP connections to `addr` that never send a byte, replacing each the server
/// closes (the oldest first), until `stop` is set; counts the connections made in `made`. What
/// an attacker without a credential does to lock a server out.
pub fn hold_silent_connections(
    addr: String,
    held: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    made: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        let mut open = std::collections::VecDeque::new();
        while !stop.load(Ordering::Relaxed) {
            match std::net::TcpStream::connect(&addr) {
                Ok(s) => {
                    open.push_back(s);
                    made.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
            if open.len() > held {
                open.pop_front();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_digest_follows_the_sources_and_not_their_build_outputs() {
        let d = tempfile_dir("digest");
        std::fs::create_dir_all(d.join("pkg/__pycache__")).unwrap();
        std::fs::write(d.join("pkg/a.py"), "x = 1").unwrap();
        let first = sources_digest(&[&d], "py").unwrap();
        std::fs::write(d.join("pkg/__pycache__/a.pyc"), "cached").unwrap();
        std::fs::create_dir_all(d.join("build/lib")).unwrap();
        std::fs::write(d.join("build/lib/a.py"), "x = 1").unwrap();
        assert_eq!(sources_digest(&[&d], "py").unwrap(), first);
        assert_ne!(sources_digest(&[&d], "other python").unwrap(), first);
        std::fs::write(d.join("pkg/a.py"), "x = 2").unwrap();
        assert_ne!(sources_digest(&[&d], "py").unwrap(), first);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempfile_dir(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("test-support-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_inner_build_drops_what_cargo_set_for_the_test_and_keeps_the_users_settings() {
        for set in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_BIN_EXE_brain",
            "OUT_DIR",
            "CARGO_TARGET_TMPDIR",
        ] {
            assert!(set_for_tests(set), "{set}");
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "RUSTFLAGS",
            "CC",
        ] {
            assert!(!set_for_tests(kept), "{kept}");
        }
        // A test binary does run with them.
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    }

    #[test]
    fn the_announced_address_is_read_and_later_output_does_not_block_the_child() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo starting; echo 'listening on 127.0.0.1:4567, more'; \
             head -c 300000 /dev/zero | tr '\\0' x; echo; exit 7",
        ]);
        let (mut child, addr) =
            spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(10));
        assert_eq!(addr, "127.0.0.1:4567");
        // 300 kB after the announcement, more than a pipe holds: the child still ends.
        assert_eq!(child.wait(Duration::from_secs(10)).code(), Some(7));
    }

    #[test]
    #[should_panic(expected = "before printing")]
    fn a_child_that_ends_without_announcing_fails_the_test() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo no address here"]);
        spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(10));
    }

    #[test]
    fn a_killed_process_is_no_longer_alive() {
        let mut child = Spawned {
            child: Command::new("sleep").arg("30").spawn().unwrap(),
        };
        let pid = child.pid();
        assert!(alive(pid));
        assert_eq!(parent_of(pid), std::process::id());
        kill9(pid);
        child.wait(Duration::from_secs(10));
        assert!(!alive(pid));
    }
}
