//! The three-node Ray cluster of `.ci/ray-cluster` for the brain's tests: a brain on it (its
//! job masters as Ray jobs on the worker nodes, over mutual TLS), its nodes alive, killed and
//! started again, and the capacity the brain sees.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use test_support::RayClusterDir;

use super::{bin_dir, brainctl};

/// A brain on the cluster listening on `listen`, with its database, run directories and
/// policy in `dir` and its log in `dir/log`, plus `extra` arguments.
pub fn brain_on(
    c: &RayClusterDir,
    dir: &Path,
    listen: &str,
    extra: &[String],
    log: &str,
) -> (super::Brain, String) {
    super::spawn_brain(|cmd| {
        cmd.args(["--listen", listen, "--max-processes", "12"])
            .args(["--ray-address", &c.dashboard])
            .arg("--database")
            .arg(dir.join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.join("runs"))
            .arg("--policy")
            .arg(dir.join("policy.toml"))
            .arg("--job-master-bin")
            .arg(bin_dir().join("job-master"))
            .arg("--job-master-arg=--brain-interval-ms=300")
            .args(extra)
            .stderr(std::fs::File::create(dir.join(log)).unwrap());
    })
}

/// Waits until Ray shows `want` alive nodes.
pub async fn wait_alive(c: &RayClusterDir, want: usize, within: Duration) {
    let api = ray_client::RayApi::new(&c.dashboard).unwrap();
    let start = Instant::now();
    loop {
        let alive = api.cluster().await.map_or(0, |c| c.nodes.len());
        if alive == want {
            return;
        }
        assert!(
            start.elapsed() < within,
            "Ray shows {alive} alive nodes, not {want}, after {within:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The brain's flags that run job masters as Ray jobs on the worker nodes (their
/// `brain_job_master` resource) with a 6 s heartbeat timeout, over mutual TLS with
/// certificates for the bridge's address made in `dir/tls` (a brain beyond loopback refuses
/// plain text; the masters on the nodes present the client certificate and check the brain's).
pub fn masters_on_ray(c: &RayClusterDir, dir: &Path) -> Vec<String> {
    let tls = dir.join("tls");
    let (ok, said) = brainctl(&["certs", "--out", tls.to_str().unwrap(), "--host", &c.host]);
    assert!(ok, "{said}");
    [
        "--job-masters",
        "ray",
        "--job-master-resource",
        "brain_job_master=1",
        "--job-master-arg=--heartbeat-timeout-ms=6000",
        "--tls-dir",
        tls.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// Nodes a test killed, started again when it ends (also when it fails): the next test needs
/// the whole cluster.
pub struct Revive<'a> {
    cluster: &'a RayClusterDir,
    dead: BTreeSet<usize>,
    /// Job masters run as Ray jobs outlive the brain: those started under this directory are
    /// SIGKILLed at the end (their agents follow when they lose them).
    masters_of: PathBuf,
}

impl<'a> Revive<'a> {
    /// Nothing killed yet; job masters started under `masters_of` are SIGKILLed at the end.
    pub fn new(cluster: &'a RayClusterDir, masters_of: &Path) -> Self {
        Self {
            cluster,
            dead: BTreeSet::new(),
            masters_of: masters_of.to_path_buf(),
        }
    }

    pub fn kill(&mut self, node: usize) {
        self.cluster.node("kill", node);
        self.dead.insert(node);
    }

    pub fn revive(&mut self, node: usize) {
        self.cluster.node("revive", node);
        self.dead.remove(&node);
    }
}

impl Drop for Revive<'_> {
    fn drop(&mut self) {
        let dir = self.masters_of.display().to_string();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains("job-master run") && cmd.contains(&dir) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        for &n in &self.dead {
            self.cluster.node("revive", n);
        }
    }
}

/// The brain's capacity, CPUs, as `brainctl plan --dry-run` shows it ("... of 12.0 CPUs").
pub fn capacity(url: &str) -> Option<f64> {
    let (ok, out) = brainctl(&["plan", "--dry-run", "--brain", url]);
    let line = out.lines().find(|l| l.starts_with("scheduler "))?;
    ok.then(|| {
        line.split(" of ")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
    .flatten()
}

pub async fn until_capacity(url: &str, cpus: f64, within: Duration) {
    let start = Instant::now();
    while capacity(url) != Some(cpus) {
        assert!(
            start.elapsed() < within,
            "the brain's capacity is {:?} CPUs, not {cpus}, after {within:?}",
            capacity(url)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
