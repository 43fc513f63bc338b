//! What the brain's multi-process tests share.

#![allow(dead_code)]

pub mod confined;
pub mod ray;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use tonic::transport::Channel;

use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use proto::service::v1::brain_client::BrainClient;

/// The operator token file of every brain this test process started, by its `host:port`:
/// [`brainctl`] and the clients here send the right brain its own.
static TOKEN_FILES: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());

/// The `--tls-dir` of every brain this test process started with one, by its `host:port`:
/// [`brainctl`] and the clients here then speak mutual TLS to it with that directory's files.
static TLS_DIRS: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());

/// The CA of every brain this test process started with its own TLS (neither `--tls-dir` nor
/// `--insecure`: the default), by its `host:port`.
static OWN_CAS: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());

fn registered(of: &Mutex<BTreeMap<String, PathBuf>>, url: &str) -> Option<PathBuf> {
    let addr = url
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    of.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(addr)
        .cloned()
}

/// Starts the `brain` binary (on port 0: `--listen 127.0.0.1:0` is the caller's) as
/// `configure` sets it up and waits for the address it prints; returns the process (killed
/// when dropped, also when a test fails) and `host:port`. Its operator token is the one
/// beside its `--database`.
pub fn spawn_brain(configure: impl FnOnce(&mut Command)) -> (Brain, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brain"));
    configure(&mut cmd);
    test_support::brain_run_as(&mut cmd);
    let (brain, addr) =
        test_support::spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(60));
    register(&addr, &cmd);
    (brain, addr)
}

/// Notes how clients reach the brain that `cmd` started at `addr` (its token file, its TLS),
/// from the flags `cmd` gave it (the binary may come after a wrapper such as `prlimit`).
pub fn register(addr: &str, cmd: &Command) {
    let args: Vec<_> = cmd.get_args().map(PathBuf::from).collect();
    let after = |flag: &str| {
        args.iter()
            .position(|a| a.as_os_str() == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let database = after("--database").unwrap_or_else(|| PathBuf::from("brain-data/brain.db"));
    let token_file = database.with_file_name("operator.token");
    let insecure = args.iter().any(|a| a.as_os_str() == "--insecure");
    TOKEN_FILES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(addr.to_string(), token_file.clone());
    match after("--tls-dir") {
        Some(dir) => {
            TLS_DIRS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(addr.to_string(), dir);
        }
        None if !insecure => {
            OWN_CAS.lock().unwrap_or_else(|e| e.into_inner()).insert(
                addr.to_string(),
                token_file
                    .with_file_name(brain::server::TLS_DIR)
                    .join(auth::tls::CA_CERT),
            );
        }
        None => {}
    }
}

/// How clients reach the brain at `url`: mutual TLS with its `--tls-dir`, TLS checked against
/// the CA it made itself, or plain text (`--insecure`).
pub fn client_tls(url: &str) -> Option<auth::tls::ClientTls> {
    if let Some(d) = tls_dir(url) {
        return Some(auth::tls::ClientTls::in_dir(&d));
    }
    registered(&OWN_CAS, url).map(|ca_file| auth::tls::ClientTls {
        ca_file,
        cert_file: None,
        key_file: None,
    })
}

/// The CA file the brain at `url` made itself, if it runs with its own TLS.
pub fn own_ca(url: &str) -> Option<PathBuf> {
    registered(&OWN_CAS, url)
}

/// The operator token file of the brain at `url` (`http://host:port` or `host:port`).
pub fn token_file(url: &str) -> PathBuf {
    registered(&TOKEN_FILES, url)
        .unwrap_or_else(|| panic!("no brain started at {url} by this test"))
}

/// The `--tls-dir` the brain at `url` was started with, if any.
pub fn tls_dir(url: &str) -> Option<PathBuf> {
    registered(&TLS_DIRS, url)
}

/// The operator token of the brain at `url`.
pub fn operator_token(url: &str) -> auth::Token {
    auth::read_secret(&token_file(url)).unwrap()
}

/// A client of the brain that sends `token` (none: no header at all).
pub type Client =
    BrainClient<tonic::service::interceptor::InterceptedService<Channel, auth::WithToken>>;

pub async fn client_with(url: &str, token: Option<auth::Token>) -> Client {
    try_client_with(url, token)
        .await
        .unwrap_or_else(|| panic!("cannot connect to the brain at {url}"))
}

/// [`client_with`], or `None` while the brain does not answer.
pub async fn try_client_with(url: &str, token: Option<auth::Token>) -> Option<Client> {
    let tls = client_tls(url).map(|t| t.config().unwrap());
    let url = if url.starts_with("http") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let channel = auth::endpoint(url, tls).ok()?.connect().await.ok()?;
    Some(BrainClient::with_interceptor(
        channel,
        auth::WithToken::new(token),
    ))
}

/// A client of the brain at `url` with its operator token.
pub async fn operator_client(url: &str) -> Client {
    client_with(url, Some(operator_token(url))).await
}

/// Builds the job master and worker agent the brain starts (beside the brain binary).
pub fn bin_dir() -> PathBuf {
    test_support::workspace_bins(env!("CARGO_BIN_EXE_brain"))
}

/// A brain process, killed when dropped (also when a test fails).
pub type Brain = test_support::Spawned;

/// Runs `brainctl`; returns whether it succeeded and its stdout and stderr. With `--brain URL`
/// of a brain this test started, it sends that brain's operator token (over mutual TLS when
/// the brain has a `--tls-dir`).
pub fn brainctl(args: &[&str]) -> (bool, String) {
    brainctl_as(None, args)
}

/// The job owner's token `brainctl submit` kept for job `id` of the brain at `url`.
pub fn owner_token_file(url: &str, id: u64) -> PathBuf {
    token_file(url)
        .parent()
        .unwrap()
        .join("owners")
        .join(format!("job-{id}.owner.token"))
}

/// `brainctl` as [`brainctl`] runs it, with the token in `token` (the operator's: `None`).
pub fn brainctl_as(token: Option<&Path>, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brainctl"));
    cmd.args(args);
    if let Some(url) = args
        .iter()
        .position(|a| *a == "--brain")
        .and_then(|i| args.get(i + 1))
    {
        let operator = token_file(url);
        cmd.arg("--token-file").arg(token.unwrap_or(&operator));
        if let Some(dir) = tls_dir(url) {
            cmd.arg("--tls-dir").arg(dir);
        } else if let Some(ca) = own_ca(url) {
            cmd.arg("--ca").arg(ca);
        } else {
            cmd.arg("--insecure");
        }
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Starts `brain` on port 0 with a config file in `d` (its runs there, then `toml`: tables
/// such as `[cluster]` or `[limits]`; the database is the command line's `--database`, in `d`)
/// and `more` flags; the process and its URL.
pub fn configured_brain(d: &Path, toml: &str, more: impl FnOnce(&mut Command)) -> (Brain, String) {
    std::fs::write(
        d.join("brain.toml"),
        format!("runs_dir = \"{}\"\n{toml}", d.join("runs").display()),
    )
    .unwrap();
    let (brain, addr) = spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--config"])
            .arg(d.join("brain.toml"))
            // Where the registry of the test's brains looks for the operator token.
            .arg("--database")
            .arg(d.join("brain.db"))
            .stderr(std::process::Stdio::null());
        more(cmd);
    });
    (brain, format!("http://{addr}"))
}

/// A brain on `cpus` CPUs in `d` that resizes no job by itself (rounds every second, an hour
/// of cool-down, no heuristics): what a test does to its jobs is all that happens to them.
/// The process and its URL.
pub fn still_brain(d: &Path, cpus: u32) -> (Brain, String) {
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[live]\ninterval_s = 1\ncooldown_s = 3600\n",
    )
    .unwrap();
    let (brain, addr) = start_brain(d, "127.0.0.1:0", cpus);
    (brain, format!("http://{addr}"))
}

/// A port nothing listens on now (for a server that must be told its port).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `brain` on `listen`; returns the process and the address it bound.
pub fn start_brain(dir: &Path, listen: &str, cpus: u32) -> (Brain, String) {
    start_brain_with(dir, listen, cpus, |_| {})
}

/// [`start_brain`] with more flags `more` adds.
pub fn start_brain_with(
    dir: &Path,
    listen: &str,
    cpus: u32,
    more: impl FnOnce(&mut Command),
) -> (Brain, String) {
    let (child, addr) = spawn_brain(|cmd| {
        more(cmd);
        cmd.args(["--listen", listen, "--cpus", &cpus.to_string()])
            .args(["--max-processes", "8"])
            .arg("--database")
            .arg(dir.join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.join("runs"))
            .arg("--policy")
            .arg(dir.join("policy.toml"))
            .arg("--job-master-bin")
            .arg(bin_dir().join("job-master"))
            .args([
                "--job-master-arg=--brain-interval-ms",
                "--job-master-arg=300",
            ])
            .stderr(std::fs::File::create(dir.join(format!("brain-{}.log", now_ms()))).unwrap());
    });
    (child, addr)
}

/// A report's role counts: `workers` in the training group `worker`, `ps` parameter servers
/// (none where 0).
pub fn counts(workers: u32, ps: u32) -> Vec<pb::RoleCount> {
    let mut c = vec![pb::RoleCount {
        role: "worker".into(),
        count: workers,
        training: true,
    }];
    if ps > 0 {
        c.push(pb::RoleCount {
            role: "ps".into(),
            count: ps,
            training: false,
        });
    }
    c
}

pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

pub async fn jobs(url: &str) -> Option<Vec<pb::JobRecord>> {
    let mut c = try_client_with(url, Some(operator_token(url))).await?;
    Some(
        c.list_jobs(pb::ListJobsRequest {})
            .await
            .ok()?
            .into_inner()
            .jobs,
    )
}

pub type MasterClient = jm::job_master_client::JobMasterClient<auth::Channel>;

/// A client of the job master at `master` of the job in `run_dir` (as the brain's record
/// says), with the job's secret its master made there.
pub async fn master_client(master: &str, run_dir: &str) -> Option<MasterClient> {
    let token = auth::read_secret(&brain::launch::job_secret_file(Path::new(run_dir))).ok()?;
    // A brain with TLS runs its jobs with TLS inside them: the job's own certificate then.
    let tls_dir = Path::new(run_dir).join("master").join(auth::tls::JOB_DIR);
    let tls = match tls_dir.exists() {
        true => Some(auth::tls::JobTls::load(&tls_dir).ok()?),
        false => None,
    };
    let channel = auth::JobCreds { token, tls }
        .connect(
            format!("http://{master}"),
            auth::Deadlines::all(Duration::from_secs(30)),
        )
        .await
        .ok()?;
    Some(MasterClient::new(channel))
}

/// The status of the job master at `master` of the job in `run_dir`.
pub async fn master_status(master: &str, run_dir: &str) -> Option<jm::JobStatus> {
    let mut c = master_client(master, run_dir).await?;
    Some(c.get_status(jm::StatusRequest {}).await.ok()?.into_inner())
}

/// Training processes alive in a job (any not yet removed or finished), from its master.
pub async fn alive(master: &str, run_dir: &str) -> Option<u32> {
    let s = master_status(master, run_dir).await?;
    Some(
        s.processes
            .iter()
            .filter(|p| !matches!(p.state.as_str(), "removed" | "succeeded"))
            .count() as u32,
    )
}

/// `GET path` on the brain at `url` (`http://` or `https://HOST:PORT`) with `token` as a
/// bearer token, over the TLS its clients use; the status and the body.
pub fn get(url: &str, path: &str, token: Option<&auth::Token>) -> (u16, String) {
    let (client, base) = http_client(url);
    let client = client.build().unwrap();
    let full = format!("{base}{path}");
    let token = token.cloned();
    // A thread of its own: callers may be inside a runtime already.
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let mut req = client.get(&full);
                if let Some(t) = token {
                    req = req.bearer_auth(t.expose());
                }
                let r = req
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("GET {full}: {e}"));
                (r.status().as_u16(), r.text().await.unwrap())
            })
    })
    .join()
    .unwrap()
}

/// An HTTP client set up for the brain at `url` (its CA, its client certificate when it asks
/// for one) and the base URL to reach it by (`https://HOST:PORT`).
pub fn http_client(url: &str) -> (reqwest::ClientBuilder, String) {
    let mut client = reqwest::Client::builder();
    if let Some(tls) = client_tls(url) {
        let ca = std::fs::read(&tls.ca_file).unwrap();
        client = client.add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap());
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            let mut identity = std::fs::read(cert).unwrap();
            identity.extend(std::fs::read(key).unwrap());
            client = client.identity(reqwest::Identity::from_pem(&identity).unwrap());
        }
    }
    let scheme = if client_tls(url).is_some() {
        "https"
    } else {
        "http"
    };
    let addr = url
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    (client, format!("{scheme}://{addr}"))
}

/// `GET /metrics` of the brain at `url` with its metrics token (beside its operator token).
pub fn scrape(url: &str) -> String {
    let token = auth::read_secret(&token_file(url).with_file_name("metrics.token")).unwrap();
    let (status, body) = get(url, "/metrics", Some(&token));
    assert_eq!(status, 200, "GET /metrics: {body}");
    body
}

/// The pid of the `job-master run` process whose command line names `run_dir`.
pub fn master_pid(run_dir: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains("job-master") && cmd.contains(" run ") && cmd.contains(run_dir))
            .then_some(pid)
    })
}
