//! Helpers for the multi-process tests: start a real job master on port 0 with real worker
//! agents (the `worker-agent` binary), watch it over gRPC, kill processes, and check that none
//! is left behind.
#![allow(dead_code)]

pub mod rl;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use job_master::job::Timing;
use job_master::platform::PlatformConfig;
use job_master::spec::JobSpec;
use job_master::{JobReport, MasterConfig};
use proto::jobmaster::v1 as pb;

/// The worker-agent binary beside ours, built once per test binary so that a test never runs a
/// stale agent.
pub fn agent_bin() -> PathBuf {
    test_support::workspace_bins(env!("CARGO_BIN_EXE_job-master")).join("worker-agent")
}

/// Where the secret of the job master at each address is (`job.token` in its run directory):
/// [`client`] and [`status`] send it.
static SECRETS: Mutex<BTreeMap<SocketAddr, PathBuf>> = Mutex::new(BTreeMap::new());
/// The TLS directory of each job master started with the job's TLS.
static TLS_DIRS: Mutex<BTreeMap<SocketAddr, PathBuf>> = Mutex::new(BTreeMap::new());

/// The job's TLS of the master at `addr`, once it has made it; `None` for a job without.
pub fn tls_of(addr: SocketAddr) -> Option<auth::tls::JobTls> {
    let dir = TLS_DIRS.lock().unwrap().get(&addr).cloned()?;
    auth::tls::JobTls::load(&dir).ok()
}

/// The job master at `addr` keeps its job's secret in `file`.
pub fn secret_at(addr: SocketAddr, file: PathBuf) {
    SECRETS.lock().unwrap().insert(addr, file);
}

/// The secret of the job master at `addr` (read each time: a master writes it as it starts).
pub fn secret_of(addr: SocketAddr) -> Option<auth::Token> {
    let file = SECRETS.lock().unwrap().get(&addr).cloned()?;
    auth::read_secret(&file).ok()
}

/// The secret of the job master at `addr`, once it has written it.
pub async fn wait_secret(addr: SocketAddr) -> auth::Token {
    loop {
        if let Some(t) = secret_of(addr) {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `job-master run` with `args` after the spec (which name its `--run-dir`), on
/// `127.0.0.1:0`: returns the process (killed when dropped) and the address it printed. The
/// helpers' clients speak the job's TLS with it, as any client must (unless `args` say
/// `--job-insecure`).
pub fn spawn_run(spec: &Path, args: &[&std::ffi::OsStr]) -> (test_support::Spawned, SocketAddr) {
    let run_dir = args
        .iter()
        .position(|a| *a == "--run-dir")
        .map(|i| PathBuf::from(args[i + 1]))
        .expect("spawn_run needs --run-dir");
    let mut cmd = std::process::Command::new(job_master_bin());
    cmd.arg("run")
        .arg(spec)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("BRAIN_WORKER_AGENT_BIN", agent_bin());
    let (child, addr) =
        test_support::spawn_announcing(&mut cmd, "job master on ", Duration::from_secs(60));
    let addr: SocketAddr = addr.parse().expect("an address");
    secret_at(addr, run_dir.join(auth::JOB_TOKEN_FILE));
    // The job's TLS, made before the master announces itself, unless run --job-insecure.
    if !args.iter().any(|a| *a == "--job-insecure") {
        TLS_DIRS
            .lock()
            .unwrap()
            .insert(addr, run_dir.join(job_master::master::JOB_TLS_DIR));
    }
    (child, addr)
}

pub fn job_master_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_job-master"))
}

/// A spec for the built-in workload; `kind` is `ps` or `allreduce`.
#[allow(clippy::too_many_arguments)]
pub fn builtin_spec(
    dir: &Path,
    name: &str,
    kind: &str,
    ps: u32,
    workers: u32,
    samples: u64,
    epochs: u32,
    step_delay_us: u64,
    every_shards: u64,
) -> JobSpec {
    let yaml = builtin_yaml(
        dir,
        name,
        kind,
        ps,
        workers,
        samples,
        epochs,
        step_delay_us,
        every_shards,
    );
    let spec = JobSpec::from_yaml(&yaml).expect("test spec parses");
    spec.validate().expect("test spec is valid");
    spec
}

/// [`builtin_spec`] as the YAML a user would write.
#[allow(clippy::too_many_arguments)]
pub fn builtin_yaml(
    dir: &Path,
    name: &str,
    kind: &str,
    ps: u32,
    workers: u32,
    samples: u64,
    epochs: u32,
    step_delay_us: u64,
    every_shards: u64,
) -> String {
    let ps_role = if ps > 0 {
        format!("  ps: {{ replicas: {ps}, max_restarts: 3 }}\n")
    } else {
        String::new()
    };
    format!(
        r#"
name: {name}
kind: {kind}
roles:
{ps_role}  worker: {{ replicas: {workers}, min: 1, max: 8, max_restarts: 3 }}
workload:
  builtin: {{ seed: 11, num_fields: 8, vocab_per_field: 500, hash_buckets: 16384, batch_size: 128, learning_rate: 0.1, step_delay_us: {step_delay_us} }}
data: {{ num_samples: {samples}, shard_size: 1000, eval_samples: 10000 }}
epochs: {epochs}
checkpoint: {{ dir: {ckpt}, every_shards: {every_shards} }}
"#,
        ckpt = dir.join("checkpoints").display()
    )
}

/// The workload config the job's processes get, for the single-process reference run.
pub fn workload_of(spec: &JobSpec) -> pb::WorkloadConfig {
    let b = spec.workload.builtin.clone().unwrap();
    pb::WorkloadConfig {
        kind: spec.kind.to_string(),
        seed: b.seed,
        num_samples: spec.data.num_samples as u64,
        eval_samples: spec.data.eval_samples as u64,
        num_fields: b.num_fields as u32,
        vocab_per_field: b.vocab_per_field as u64,
        hash_buckets: b.hash_buckets as u64,
        batch_size: b.batch_size as u32,
        learning_rate: b.learning_rate as f32,
        epochs: spec.epochs as u32,
        ..Default::default()
    }
}

pub struct Running {
    pub addr: SocketAddr,
    pub handle: tokio::task::JoinHandle<Result<JobReport, job_master::Error>>,
    pub run_dir: PathBuf,
}

pub fn test_timing() -> Timing {
    Timing {
        heartbeat_interval_ms: 200,
        heartbeat_timeout_ms: 10_000,
        last_call_ms: 1_000,
        grace_period_ms: 2_000,
        register_timeout_ms: 30_000,
        cut_timeout_ms: 120_000,
        persist_give_up_ms: 60_000,
        ps_save_timeout_ms: 300_000,
    }
}

pub async fn start(spec: JobSpec, dir: &Path) -> Running {
    start_with(spec, dir, test_timing()).await
}

pub async fn start_with(spec: JobSpec, dir: &Path, timing: Timing) -> Running {
    let platform = PlatformConfig::Local {
        agent_bin: Some(agent_bin()),
        max_processes: None,
        gpus: None,
    };
    start_on(spec, dir, timing, platform).await
}

/// Starts the job on `platform`.
pub async fn start_on(
    spec: JobSpec,
    dir: &Path,
    timing: Timing,
    platform: PlatformConfig,
) -> Running {
    start_at("127.0.0.1", spec, dir, timing, platform).await
}

/// Starts the job on `platform` with its master listening on `ip` (port 0).
pub async fn start_at(
    ip: &str,
    spec: JobSpec,
    dir: &Path,
    timing: Timing,
    platform: PlatformConfig,
) -> Running {
    start_full(ip, spec, dir, timing, platform, false).await
}

/// [`start`] with mutual TLS inside the job (`job-master run --job-tls`); the helpers'
/// clients then speak it too.
pub async fn start_tls(spec: JobSpec, dir: &Path) -> Running {
    let platform = PlatformConfig::Local {
        agent_bin: Some(agent_bin()),
        max_processes: None,
        gpus: None,
    };
    start_full("127.0.0.1", spec, dir, test_timing(), platform, true).await
}

async fn start_full(
    ip: &str,
    spec: JobSpec,
    dir: &Path,
    timing: Timing,
    platform: PlatformConfig,
    job_tls: bool,
) -> Running {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let run_dir = dir.join("run");
    secret_at(addr, run_dir.join(auth::JOB_TOKEN_FILE));
    if job_tls {
        TLS_DIRS
            .lock()
            .unwrap()
            .insert(addr, run_dir.join(job_master::master::JOB_TLS_DIR));
    }
    let config = MasterConfig {
        spec,
        run_dir: run_dir.clone(),
        timing,
        platform,
        brain: None,
        resume: false,
        advertise: None,
        token_file: None,
        job_tls,
        connections: Default::default(),
    };
    let handle = tokio::spawn(job_master::run(config, listener, std::future::pending()));
    Running {
        addr,
        handle,
        run_dir,
    }
}

impl Running {
    /// Waits for the job to end (a hang fails the test instead of the CI run).
    pub async fn report(&mut self) -> JobReport {
        match tokio::time::timeout(Duration::from_secs(300), &mut self.handle).await {
            Ok(ended) => ended
                .expect("the job master task panicked")
                .expect("the job master returned an error"),
            Err(_) => panic!(
                "the job did not end within 300 s; its status: {:#?}\nits last events:\n{}",
                status(self.addr).await,
                self.last_events(40)
            ),
        }
    }

    /// The last `n` events of the job's persisted context, one per line.
    pub fn last_events(&self, n: usize) -> String {
        let path = self.run_dir.join(job_master::persist::CONTEXT_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return format!("({} cannot be read)", path.display());
        };
        let ctx: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let events = ctx["events"].as_array().cloned().unwrap_or_default();
        events[events.len().saturating_sub(n)..]
            .iter()
            .map(|e| {
                format!(
                    "{:>9} ms  {}",
                    e["at_ms"],
                    e["text"].as_str().unwrap_or("?")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

pub async fn status(addr: SocketAddr) -> Option<pb::JobStatus> {
    let mut c = try_client(addr).await?;
    Some(c.get_status(pb::StatusRequest {}).await.ok()?.into_inner())
}

/// Polls the status until `pred` holds; panics after `timeout`.
pub async fn wait_for(
    addr: SocketAddr,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&pb::JobStatus) -> bool,
) -> pb::JobStatus {
    let start = Instant::now();
    let mut last = None;
    loop {
        if let Some(s) = status(addr).await {
            if pred(&s) {
                return s;
            }
            assert!(
                s.phase != "failed",
                "job failed while waiting for {what}: {}{}",
                s.reason,
                output_named_in(&s.reason)
            );
            last = Some(s);
        }
        assert!(
            start.elapsed() < timeout,
            "timed out waiting for {what}; the last status: {last:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last lines of the process output a failure's reason names (`its output: PATH`), so a
/// failed test shows why the process failed before its temporary directory goes.
pub fn output_named_in(reason: &str) -> String {
    let Some(path) = reason.split("its output: ").nth(1) else {
        return String::new();
    };
    let path = path.split_whitespace().next().unwrap_or_default();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            format!("\n--- the last lines of {path} ---\n{tail}")
        }
        Err(e) => format!("\n({path} cannot be read: {e})"),
    }
}

/// pid of the training process of `role`/`index`, once it runs.
pub async fn pid_of(addr: SocketAddr, role: &str, index: u32) -> u32 {
    let s = wait_for(
        addr,
        Duration::from_secs(30),
        "a training process pid",
        |s| {
            s.processes
                .iter()
                .any(|p| p.role == role && p.index == index && p.pid != 0)
        },
    )
    .await;
    s.processes
        .iter()
        .find(|p| p.role == role && p.index == index)
        .unwrap()
        .pid
}

#[allow(unused_imports)]
pub use test_support::{DutyCycle, duty_cycle, freeze, kill9, parent_of};

/// Processes whose command line or environment names the master at `addr`: its agents and
/// their training processes.
pub fn processes_of(addr: SocketAddr) -> Vec<u32> {
    let needle = format!("http://{addr}");
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let read = |f: &str| std::fs::read(entry.path().join(f)).unwrap_or_default();
        let hit = |b: Vec<u8>| {
            b.split(|&c| c == 0)
                .any(|part| String::from_utf8_lossy(part).contains(&needle))
        };
        if hit(read("cmdline")) || hit(read("environ")) {
            // A zombie already reaped by nobody yet is not "alive".
            let stat = String::from_utf8_lossy(&read("stat")).to_string();
            if !stat.contains(") Z ") {
                out.push(pid);
            }
        }
    }
    out
}

/// Waits briefly for every process of the job to be gone.
pub async fn assert_no_process_left(addr: SocketAddr) {
    let start = Instant::now();
    loop {
        let left = processes_of(addr);
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "processes left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for a `job-master run` process (`spawn_run`) to end, which must be a success, and
/// reads the report it wrote in `run_dir`.
pub async fn finished_run(mut master: test_support::Spawned, run_dir: &Path) -> JobReport {
    let status = tokio::task::spawn_blocking(move || master.wait(Duration::from_secs(300)))
        .await
        .unwrap();
    assert!(status.success(), "the job master exited with {status}");
    serde_json::from_slice(&std::fs::read(run_dir.join("report.json")).unwrap()).unwrap()
}

/// Reads the persisted job context.
pub fn context(run_dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run_dir.join("job-context.json")).unwrap()).unwrap()
}

/// Every PS applied each training sample exactly once per epoch (sum of indices included).
pub fn assert_ps_applied_each_sample_once(report: &JobReport, samples: u64, epochs: u64) {
    assert!(
        !report.ps_stats.is_empty(),
        "no PS statistics in the report"
    );
    for ps in &report.ps_stats {
        assert_eq!(
            ps.applied_samples,
            epochs * samples,
            "ps {}: {ps:?}",
            ps.index
        );
        assert_eq!(
            ps.applied_index_sum,
            epochs * (samples * (samples - 1) / 2),
            "ps {}: {ps:?}",
            ps.index
        );
    }
}

/// An allreduce job succeeded and consumed each sample once per epoch: by its ledger, and by
/// the model itself (samples and the sum of their indices, as applied).
pub fn assert_each_sample_once(report: &JobReport, samples: u64, epochs: u64) {
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert!(report.samples_per_epoch.values().all(|&s| s == samples));
    assert_eq!(report.applied_samples, epochs * samples);
    assert_eq!(
        report.applied_index_sum,
        epochs * (samples * (samples - 1) / 2)
    );
}

/// The job succeeded, its ledger proves exactly-once per epoch, and it logged `event`.
pub fn assert_recovered(report: &JobReport, event: &str) {
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert!(
        report.events.iter().any(|e| e.contains(event)),
        "no event {event:?} in {:#?}",
        report.events
    );
}

// Scale plans and their progress.

pub type Client = pb::job_master_client::JobMasterClient<auth::Channel>;

/// A client of the job master at `addr` with its job's secret.
pub async fn client(addr: SocketAddr) -> Client {
    try_client(addr)
        .await
        .unwrap_or_else(|| panic!("no job master with a secret at {addr}"))
}

/// [`client`], or `None` while the master or its secret is not there yet.
pub async fn try_client(addr: SocketAddr) -> Option<Client> {
    client_with(addr, secret_of(addr)).await
}

/// A client of the job master at `addr` that sends `token` (or nothing), over the job's TLS
/// when its master was started with it.
pub async fn client_with(addr: SocketAddr, token: Option<auth::Token>) -> Option<Client> {
    let tls = if TLS_DIRS.lock().unwrap().contains_key(&addr) {
        Some(tls_of(addr)?.client())
    } else {
        None
    };
    let channel = auth::endpoint(format!("http://{addr}"), tls)
        .ok()?
        .connect()
        .await
        .ok()?;
    Some(Client::new(auth::with_token(
        channel,
        auth::WithToken::new(token),
    )))
}

pub fn plan(version: u64, workers: Option<u32>, ps: Option<u32>) -> pb::ScalePlan {
    let mut p = pb::ScalePlan {
        version,
        ..Default::default()
    };
    for (role, n) in [("worker", workers), ("ps", ps)] {
        if let Some(count) = n {
            p.roles.push(pb::RoleTarget {
                nodes: Vec::new(),
                role: role.into(),
                count,
                resources: None,
            });
        }
    }
    p
}

/// `job-master scale --job ADDR ARGS` with the job's secret from `run_dir`, in plain text
/// (`--insecure`): what it printed and how it exited.
pub async fn scale_cli(addr: SocketAddr, run_dir: &Path, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(job_master_bin())
        .args(["scale", "--job", &addr.to_string()])
        .args(args)
        .arg("--token-file")
        .arg(run_dir.join(auth::JOB_TOKEN_FILE))
        .arg("--insecure")
        .output()
        .await
        .unwrap()
}

/// Sends a plan that must be accepted.
pub async fn send(addr: SocketAddr, p: pb::ScalePlan) {
    let a = client(addr)
        .await
        .apply_scale_plan(p.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(a.accepted, "plan {} rejected: {}", p.version, a.reason);
}

pub async fn reached(addr: SocketAddr, version: u64) -> pb::JobStatus {
    wait_for(
        addr,
        Duration::from_secs(90),
        &format!("plan {version} reached"),
        |s| s.reached_plan_version >= version,
    )
    .await
}

/// Sends plan `version` resizing the workers to `workers`, waits until it is reached and checks
/// that exactly that many workers are live.
pub async fn rescale_workers(addr: SocketAddr, version: u64, workers: u32) -> pb::JobStatus {
    send(addr, plan(version, Some(workers), None)).await;
    let s = reached(addr, version).await;
    assert_eq!(live_workers(&s), workers as usize, "plan {version}");
    s
}

pub async fn shards_at_least(addr: SocketAddr, n: u64) {
    wait_for(
        addr,
        Duration::from_secs(90),
        &format!("{n} shards done"),
        |s| s.shards_done >= n,
    )
    .await;
}

pub fn live_workers(s: &pb::JobStatus) -> usize {
    s.processes
        .iter()
        .filter(|p| p.role == "worker" && p.state != "removed")
        .count()
}

#[allow(unused_imports)]
pub use test_support::{python_with, torch_with_sdk};

/// `examples/PATH` of this repository.
pub fn example_script(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{path}"))
}

/// A client of a parameter server.
pub type Ps = pb::parameter_server_client::ParameterServerClient<auth::Channel>;

/// A parameter server over loopback, as the built-in workload serves it.
pub async fn start_ps(token: &auth::Token) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut table = worker_agent::workload::model::SparseTable::default();
    table.params.insert(0, [0.5, 1.0]);
    let svc =
        worker_agent::workload::ps_server::PsService::new(0, 1, 0.1, table, token.clone().into());
    tokio::spawn(worker_agent::workload::ps_server::serve(
        svc,
        listener,
        std::future::pending(),
    ));
    addr
}

pub async fn ps_with(addr: &str, token: Option<auth::Token>) -> Ps {
    let channel = loop {
        if let Ok(c) = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Ps::new(auth::with_token(channel, auth::WithToken::new(token)))
}

/// Sends `signal` to every pid of `pids`.
pub fn signal_all(pids: &[u32], signal: nix::sys::signal::Signal) {
    for &p in pids {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), signal)
            .unwrap_or_else(|e| panic!("kill -{signal} {p}: {e}"));
    }
}

/// Spoils the files of the job's newest committed checkpoint in place (their length kept,
/// their middle bytes flipped) while `workers` are frozen, so that nothing commits meanwhile;
/// the checkpoint's id and step.
pub async fn spoil_the_newest_checkpoint(run: &Running, workers: &[u32]) -> (u64, u64) {
    signal_all(workers, nix::sys::signal::Signal::SIGSTOP);
    // A commit already on its way lands first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ctx = context(&run.run_dir);
    let newest = ctx["checkpoints"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let manifest = newest["manifest"].as_str().unwrap();
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    let files: Vec<String> = m["model"]["path"]
        .as_str()
        .into_iter()
        .chain(
            m["ps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["path"].as_str()),
        )
        .map(String::from)
        .collect();
    assert!(!files.is_empty(), "{m}");
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        let (mid, len) = (bytes.len() / 2, bytes.len());
        for b in &mut bytes[mid..(mid + 64).min(len)] {
            *b ^= 0xFF;
        }
        std::fs::write(f, bytes).unwrap();
    }
    (
        newest["id"].as_u64().unwrap(),
        newest["step"].as_u64().unwrap(),
    )
}
