//! The brain service in mini-redis shape: [`run`] serves the gRPC API and `GET /metrics` on a
//! listener the caller bound (tests bind port 0) and runs the optimisation loop until
//! `shutdown` resolves.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::routing::get;
use optimizer::live::{LiveCluster, LiveNode};
use proto::service::v1::brain_server::BrainServer;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::BrainError;
use crate::control::Control;
use crate::launch::{JobMasters, Launcher, LauncherConfig};
pub use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::service::BrainService;
use crate::store::Store;

/// The brain's configuration (TOML; unknown fields are errors).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrainConfig {
    /// The SQLite database (created if missing; WAL mode) [default: brain-data/brain.db, or
    /// the command line's `--database`].
    #[serde(default = "default_database")]
    pub database: PathBuf,
    /// The operator's policy file (TOML, see `optimizer::config`); read again when it
    /// changes. Without one the defaults apply and `brainctl policy set` is refused.
    #[serde(default)]
    pub policy: Option<PathBuf>,
    /// Where the job masters the brain starts keep their specs, logs and checkpoints.
    #[serde(default = "default_runs_dir")]
    pub runs_dir: PathBuf,
    #[serde(default)]
    pub cluster: ClusterConfig,
    #[serde(default)]
    pub launcher: LauncherConfig,
    /// The address job masters on other machines reach the brain by, with the listener's
    /// port: needed when job masters run on Ray's nodes and the brain listens on every
    /// interface (0.0.0.0) [default: the listener's address].
    #[serde(default)]
    pub advertise: Option<std::net::IpAddr>,
    /// The operator token's file: created (mode 0600) at the first start, read after; brainctl
    /// sends what it holds [default: `operator.token` beside the database].
    #[serde(default)]
    pub operator_token_file: Option<PathBuf>,
    /// The token `GET /metrics` asks for (a scraper's, which may do nothing else; the operator
    /// token is taken too): created (mode 0600) at the first start [default: `metrics.token`
    /// beside the database].
    #[serde(default)]
    pub metrics_token_file: Option<PathBuf>,
    /// What one caller may send (`[limits]`).
    #[serde(default)]
    pub limits: Limits,
    /// TLS on the brain's address (`[tls]` cert_file, key_file; client_ca_file for mutual TLS:
    /// every client then presents a certificate that CA signed). `brainctl certs` makes the
    /// files. Required to listen beyond loopback unless `insecure`.
    #[serde(default)]
    pub tls: Option<auth::tls::ServerTls>,
    /// No token is checked (every caller may do everything), and the brain may listen beyond
    /// loopback without TLS. For a trusted network and for measuring what security costs,
    /// never for a shared one.
    #[serde(default)]
    pub insecure: bool,
    /// Where raw metric time series go (InfluxDB); without it only summaries are kept.
    #[serde(default)]
    pub sink: Option<crate::sink::SinkConfig>,
    /// The web console (`[console.whatif]`: the traces its what-if page replays).
    #[serde(default)]
    pub console: ConsoleConfig,
}

/// `[console]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    #[serde(default)]
    pub whatif: crate::console::whatif::WhatifSettings,
}

fn default_database() -> PathBuf {
    PathBuf::from("brain-data/brain.db")
}

fn default_runs_dir() -> PathBuf {
    PathBuf::from("brain-data/runs")
}

/// What the brain may hand out to the jobs it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// CPUs for all jobs' processes [default: this machine's].
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    /// Memory the jobs' processes may reserve, without Ray (`64Gi`): a submission whose
    /// process, or `strict_pack` group, asks for more is refused [default: this machine's
    /// physical memory]. With Ray each node's `memory` resource is used instead.
    #[serde(default, with = "vocab::units::quantity::opt_memory")]
    pub memory: Option<vocab::Bytes>,
    /// CPU of one scheduling slot (a process gets whole slots), millicores.
    #[serde(default = "default_slot")]
    pub slot_millicores: u64,
    /// Processes of all jobs at once.
    #[serde(default = "default_max_processes")]
    pub max_processes: u32,
    /// A Ray cluster's dashboard (e.g. `http://127.0.0.1:8265`): the jobs' processes run there
    /// as Ray jobs, and its alive nodes' CPUs, read before every round, replace `cpus`.
    #[serde(default)]
    pub ray_address: Option<String>,
    /// The nodes with GPUs, without a Ray cluster (with one, Ray's nodes replace them), e.g.
    /// `[[cluster.gpu_nodes]] name = "gpu-1"`, `gpus = 4`, `gpu_type = "A100"`.
    #[serde(default)]
    pub gpu_nodes: Vec<LiveNode>,
}

fn default_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}
fn default_slot() -> u64 {
    1000
}
fn default_max_processes() -> u32 {
    64
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            cpus: default_cpus(),
            memory: None,
            slot_millicores: default_slot(),
            max_processes: default_max_processes(),
            ray_address: None,
            gpu_nodes: Vec::new(),
        }
    }
}

impl BrainConfig {
    /// The defaults around `database`.
    pub fn with_database(database: PathBuf) -> BrainConfig {
        BrainConfig {
            database,
            policy: None,
            runs_dir: default_runs_dir(),
            cluster: ClusterConfig::default(),
            launcher: LauncherConfig::default(),
            advertise: None,
            operator_token_file: None,
            metrics_token_file: None,
            limits: Limits::default(),
            sink: None,
            tls: None,
            insecure: false,
            console: ConsoleConfig::default(),
        }
    }

    pub fn validate(&self) -> Result<(), BrainError> {
        if self.database.as_os_str().is_empty() {
            return Err(BrainError::Config("database: an empty path".into()));
        }
        self.console.whatif.validate()?;
        let c = &self.cluster;
        if !(c.cpus.is_finite() && c.cpus > 0.0 && c.cpus < 1e6) {
            return Err(BrainError::Config(format!(
                "cluster.cpus is {}, expected more than 0",
                c.cpus
            )));
        }
        if c.slot_millicores == 0 || (c.slot_millicores as f64) > c.cpus * 1000.0 {
            return Err(BrainError::Config(format!(
                "cluster.slot_millicores is {}, expected 1 to the cluster's {} millicores",
                c.slot_millicores,
                c.cpus * 1000.0
            )));
        }
        if c.memory.is_some_and(|m| m.0 == 0) {
            return Err(BrainError::Config(
                "cluster.memory is 0, expected more (e.g. \"64Gi\"), or leave it out for this \
                 machine's"
                    .into(),
            ));
        }
        if let Some(a) = &c.ray_address {
            ray_client::RayApi::new(a)
                .map_err(|e| BrainError::Config(format!("cluster.ray_address: {e}")))?;
        }
        for (i, n) in c.gpu_nodes.iter().enumerate() {
            if n.name.is_empty() || n.gpus == 0 || n.gpu_type.is_empty() {
                return Err(BrainError::Config(format!(
                    "cluster.gpu_nodes[{i}]: a name, 1 GPU or more and a gpu_type are needed \
                     (got {:?}, {}, {:?})",
                    n.name, n.gpus, n.gpu_type
                )));
            }
        }
        let l = &self.limits;
        if l.max_message_bytes < 4096 || l.max_spec_bytes == 0 || l.max_active_jobs == 0 {
            return Err(BrainError::Config(format!(
                "limits: max_message_bytes {} (at least 4096), max_spec_bytes {} and \
                 max_active_jobs {} (at least 1)",
                l.max_message_bytes, l.max_spec_bytes, l.max_active_jobs
            )));
        }
        l.connections
            .validate("limits.connections")
            .map_err(BrainError::Config)?;
        if c.max_processes == 0 {
            return Err(BrainError::Config("cluster.max_processes is 0".into()));
        }
        if let Some(sink) = &self.sink {
            sink.validate()?;
        }
        Ok(())
    }

    /// `name` in the database's directory.
    fn beside_database(&self, name: &str) -> PathBuf {
        self.database
            .parent()
            .unwrap_or(std::path::Path::new(""))
            .join(name)
    }

    /// Where the operator token is kept.
    pub fn operator_token_file(&self) -> PathBuf {
        self.operator_token_file
            .clone()
            .unwrap_or_else(|| self.beside_database("operator.token"))
    }

    /// Where the scrapers' token for `GET /metrics` is kept.
    pub fn metrics_token_file(&self) -> PathBuf {
        self.metrics_token_file
            .clone()
            .unwrap_or_else(|| self.beside_database("metrics.token"))
    }

    /// The memory of the pool without Ray: `cluster.memory`, else this machine's (0: not
    /// known, nothing is checked against it).
    pub fn pool_memory_bytes(&self) -> u64 {
        self.cluster.memory.map_or_else(
            || {
                use procfs::Current;
                procfs::Meminfo::current().map_or(0, |m| m.mem_total)
            },
            |m| m.0,
        )
    }

    fn live_cluster(&self) -> LiveCluster {
        LiveCluster {
            free: Vec::new(),
            cpu_millicores: (self.cluster.cpus * 1000.0).round() as u64,
            slot_millicores: self.cluster.slot_millicores,
            max_processes: self.cluster.max_processes,
            memory_bytes: self.pool_memory_bytes(),
            nodes: self.cluster.gpu_nodes.clone(),
        }
    }
}

/// The directory beside the database where the brain keeps the CA and certificate it makes
/// itself (TLS by default).
pub const TLS_DIR: &str = "tls";

impl BrainConfig {
    /// TLS by default, as tokens are: unless the config names its own (`[tls]`) or says
    /// `insecure`, the brain serves with a certificate of its own, made at its first start with
    /// a private CA of its own in [`TLS_DIR`] beside the database (keys owner-only), for
    /// localhost, 127.0.0.1 and `hosts`. Clients pin that CA (`brainctl` finds it there, as it
    /// finds the operator token; the job masters the brain starts are given it), so a server
    /// that is not this brain never receives a token. The brain does not ask clients for
    /// certificates (tokens name them); `[tls] client_ca_file` does. Returns the directory
    /// when the brain's own TLS is used.
    pub fn default_tls(&mut self, hosts: &[String]) -> Result<Option<PathBuf>, BrainError> {
        if self.tls.is_some() || self.insecure {
            return Ok(None);
        }
        use auth::tls::{CA_CERT, SERVER_CERT, SERVER_KEY};
        let dir = self.beside_database(TLS_DIR);
        if ![CA_CERT, SERVER_CERT, SERVER_KEY]
            .iter()
            .all(|f| dir.join(f).exists())
        {
            if let Some(parent) = dir.parent().filter(|d| !d.as_os_str().is_empty()) {
                private_dir(parent)?;
            }
            auth::tls::make(&dir, hosts).map_err(|e| {
                BrainError::Config(format!(
                    "making the brain's certificate in {}: {e}",
                    dir.display()
                ))
            })?;
        }
        self.tls = Some(auth::tls::ServerTls {
            cert_file: dir.join(SERVER_CERT),
            key_file: dir.join(SERVER_KEY),
            client_ca_file: None,
        });
        if self.launcher.tls.is_none() {
            self.launcher.tls = Some(auth::tls::ClientTls {
                ca_file: dir.join(CA_CERT),
                cert_file: None,
                key_file: None,
            });
        }
        Ok(Some(dir))
    }

    /// What serving on `addr` needs, checked before anyone is told the address: refuses what
    /// would expose the brain (an address beyond loopback without TLS, where tokens would cross
    /// the network in the clear, unless `insecure` says so; TLS without the CA the job masters
    /// it starts should trust) and reads the TLS files (the server's configuration).
    pub fn check_listen(
        &self,
        addr: std::net::SocketAddr,
    ) -> Result<Option<Arc<rustls::ServerConfig>>, BrainError> {
        check_exposure(addr, self)?;
        self.tls
            .as_ref()
            .map(auth::tls::ServerTls::rustls)
            .transpose()
            .map_err(|e| BrainError::Config(format!("[tls]: {e}")))
    }
}

fn check_exposure(addr: std::net::SocketAddr, config: &BrainConfig) -> Result<(), BrainError> {
    if config.tls.is_none() && !config.insecure && !addr.ip().is_loopback() {
        return Err(BrainError::Config(format!(
            "listening on {addr}, beyond this machine, without TLS: every token would cross the \
             network in the clear. Give [tls] cert_file and key_file (`brainctl certs` makes \
             them), or start with --insecure on a network you trust"
        )));
    }
    if config.tls.is_some() && config.launcher.tls.is_none() {
        return Err(BrainError::Config(
            "[tls] without [launcher.tls]: the job masters the brain starts need the CA that \
             signed its certificate (ca_file; with mutual TLS also cert_file and key_file)"
                .into(),
        ));
    }
    Ok(())
}

/// The address the brain's job masters reach it by: `advertise` with the listener's port, else
/// the listener's (127.0.0.1 for one on every interface: the masters are on this machine). Job
/// masters on Ray's nodes need an address those reach: a listener on every interface without
/// `advertise` is refused for them, and a loopback one is said (only nodes on this machine
/// reach it).
fn brain_address(
    listener: std::net::SocketAddr,
    advertise: Option<std::net::IpAddr>,
    masters: &JobMasters,
) -> Result<std::net::SocketAddr, BrainError> {
    let on_ray = matches!(masters, JobMasters::Ray { .. });
    let reach = match advertise {
        Some(ip) => std::net::SocketAddr::new(ip, listener.port()),
        None if listener.ip().is_unspecified() && on_ray => {
            return Err(BrainError::Config(format!(
                "the brain listens on {listener} and its job masters run on Ray's nodes: give \
                 the address they reach this machine by (advertise, --advertise)"
            )));
        }
        None if listener.ip().is_unspecified() => {
            std::net::SocketAddr::from(([127, 0, 0, 1], listener.port()))
        }
        None => listener,
    };
    if on_ray && reach.ip().is_loopback() {
        tracing::warn!(
            "job masters run on Ray's nodes and reach the brain at {reach}: only nodes on this \
             machine can (listen on, or advertise, an address the nodes reach)"
        );
    }
    Ok(reach)
}

/// Makes `dir` (with its parents) owner-only (0700) when it is made here; one that exists is
/// said in the log when others may read it (the operator chose it; it may be shared).
fn private_dir(dir: &std::path::Path) -> Result<(), BrainError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Ok(m) if m.permissions().mode() & 0o077 != 0 => {
            tracing::warn!(
                "{} may be read by others (mode {:o}): the brain's data is its user's alone \
                 (chmod 700 {})",
                dir.display(),
                m.permissions().mode() & 0o777,
                dir.display()
            );
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(_) => Ok(std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?),
    }
}

/// Makes the file at `path` owner-only (0600) if it exists.
fn private_file(path: &std::path::Path) -> Result<(), BrainError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o077 != 0 => Ok(
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?,
        ),
        _ => Ok(()),
    }
}

/// Opens the store, starts the optimisation loop and serves until `shutdown`.
pub async fn run(
    config: BrainConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrainError> {
    config.validate()?;
    // Everything the brain and the job masters it starts write is their user's alone: the
    // store, specs (with their env values), logs, tokens.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    if let Some(dir) = config
        .database
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        private_dir(dir)?;
    }
    private_dir(&config.runs_dir)?;
    let runs_dir = std::path::absolute(&config.runs_dir)?;
    let path = config.database.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&path))
        .await
        .map_err(|e| BrainError::Internal(format!("opening the store: {e}")))??;
    // A store an older brain made world-readable is made private.
    for suffix in ["", "-wal", "-shm"] {
        let mut f = config.database.clone().into_os_string();
        f.push(suffix);
        private_file(std::path::Path::new(&f))?;
    }
    let store = Arc::new(Mutex::new(store));
    let addr = listener.local_addr()?;
    let tls = config.check_listen(addr)?;
    let reach = brain_address(addr, config.advertise, &config.launcher.job_masters)?;
    // One message per job master that ends; a reaper waits while the channel is full.
    let (exited_tx, mut exited_rx) = tokio::sync::mpsc::channel(1024);
    // Hidden from the jobs' processes: the store, the tokens, the other jobs' directories.
    let data_dir = config
        .database
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(std::path::absolute)
        .transpose()?;
    let launcher = Launcher::new(
        config.launcher.clone(),
        runs_dir,
        data_dir,
        format!(
            "{}://{reach}",
            if config.tls.is_some() {
                "https"
            } else {
                "http"
            }
        ),
        config.cluster.max_processes,
        config.cluster.ray_address.clone(),
        exited_tx,
    )?;
    let metrics = Arc::new(Metrics::default());
    let sink = config
        .sink
        .as_ref()
        .map(|s| crate::sink::Sink::start(s, metrics.clone()))
        .transpose()?;
    // Read before the first request: a submission is checked against the nodes' GPUs.
    let pool_memory = config.pool_memory_bytes();
    let capacity =
        crate::capacity::Source::new(config.cluster.ray_address.as_deref(), pool_memory)?;
    let fixed = config.live_cluster();
    let nodes = crate::capacity::fixed_nodes(&fixed, pool_memory);
    let cluster = capacity.read(&(fixed, nodes)).await;
    let token_file = config.operator_token_file();
    let (operator, created) =
        auth::read_or_create(&token_file).map_err(|e| BrainError::Config(e.to_string()))?;
    if created {
        tracing::info!(path = %token_file.display(), "operator token created");
    }
    let metrics_file = config.metrics_token_file();
    let (scraper, created) =
        auth::read_or_create(&metrics_file).map_err(|e| BrainError::Config(e.to_string()))?;
    if created {
        tracing::info!(path = %metrics_file.display(), "metrics token created");
    }
    let known = {
        let store = store.lock().expect("no panic under the lock");
        store.job_tokens()?
    };
    let keys = Arc::new(if config.insecure {
        tracing::warn!(
            "--insecure: no token is checked; anyone who reaches {addr} may submit, cancel and \
             steer every job"
        );
        crate::auth::Keys::insecure()
    } else {
        crate::auth::Keys::new(operator, known).scraped_with(scraper)
    });
    let control = Arc::new(Control::new(
        store.clone(),
        config.policy.clone(),
        (cluster, capacity),
        launcher,
        crate::control::Outputs {
            metrics: metrics.clone(),
            sink,
        },
        keys.clone(),
    )?);
    control.follow_masters().await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rounds = tokio::spawn(control.clone().run(stop_rx));
    let reaper = {
        let control = control.clone();
        tokio::spawn(async move {
            while let Some(e) = exited_rx.recv().await {
                control.exited(e).await;
            }
        })
    };

    let scrape = {
        let (store, metrics, keys) = (store.clone(), metrics.clone(), keys.clone());
        let control = control.clone();
        move |headers: axum::http::HeaderMap| async move {
            let presented = headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            if !keys.may_scrape(presented) {
                return Err((
                    axum::http::StatusCode::UNAUTHORIZED,
                    "GET /metrics needs `Authorization: Bearer TOKEN` with the metrics token \
                     (metrics.token beside the brain's database; Prometheus: \
                     authorization.credentials_file)\n",
                ));
            }
            let nodes = control.nodes();
            Ok(tokio::task::spawn_blocking(move || {
                metrics.render(&store.lock().expect("no panic under the lock"), &nodes)
            })
            .await
            .unwrap_or_default())
        }
    };
    let throttle = Arc::new(crate::throttle::Throttle::new(
        &config.limits,
        control.metrics.clone(),
    ));
    let console = crate::console::router(Arc::new(crate::console::Console::new(
        BrainService::new(control.clone(), config.limits.clone(), throttle.clone()),
        control.clone(),
        keys.clone(),
        throttle.clone(),
        tls.is_some(),
        config.console.whatif.clone(),
    )));
    let api = BrainServer::new(BrainService::new(
        control.clone(),
        config.limits.clone(),
        throttle.clone(),
    ))
    .max_decoding_message_size(config.limits.max_message_bytes);
    use tonic::service::interceptor::InterceptedService;
    // The token first (it names the caller), then the caller's rate.
    let app = tonic::service::Routes::new(InterceptedService::new(
        InterceptedService::new(api, throttle.interceptor()),
        keys.interceptor(),
    ))
    .prepare()
    .into_axum_router()
    .route("/metrics", get(scrape))
    .merge(console);
    tracing::info!(address = %addr, database = %config.database.display(), tls = tls.is_some(), "brain serving");
    // HTTP/1.1 too: Prometheus scrapes GET /metrics on the same address. TLS and the
    // connection limits are the listener's (`auth::listen`).
    let mut builder = tonic::transport::Server::builder().accept_http1(true);
    let listening = auth::listen::Listening {
        name: "brain",
        limits: config.limits.connections,
        tls,
        stats: metrics.conn_stats.clone(),
    };
    let (quit_tx, quit_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(
        builder
            .add_routes(tonic::service::Routes::from(app))
            .serve_with_incoming_shutdown(auth::listen::incoming(listener, listening), async {
                let _ = quit_rx.await;
            }),
    );
    let served = tokio::select! {
        r = &mut server => Some(r),
        _ = shutdown => None,
    };
    let _ = stop_tx.send(true);
    let _ = rounds.await;
    reaper.abort();
    let served = match served {
        Some(r) => r,
        None => {
            let _ = quit_tx.send(());
            // Job masters keep their connections open; they reconnect to the next brain.
            match tokio::time::timeout(std::time::Duration::from_secs(2), &mut server).await {
                Ok(r) => r,
                Err(_) => {
                    server.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    served
        .map_err(|e| BrainError::Internal(format!("serving task: {e}")))?
        .map_err(|e| BrainError::Internal(format!("serving: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, SocketAddr};

    #[test]
    fn a_config_names_where_job_masters_run_and_rejects_what_it_does_not_know() {
        let c: BrainConfig = toml::from_str(
            "database = \"b.db\"\nadvertise = \"10.0.0.1\"\n\
             [cluster]\nray_address = \"http://10.0.0.2:8265\"\n\
             [launcher.job_masters.ray]\nresources = { brain_job_master = 1 }\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.advertise, Some([10, 0, 0, 1].into()));
        assert_eq!(
            c.launcher.job_masters,
            JobMasters::Ray {
                resources: [("brain_job_master".to_string(), 1.0)].into()
            }
        );
        let c: BrainConfig =
            toml::from_str("database = \"b.db\"\n[launcher]\njob_masters = \"local\"\n").unwrap();
        assert_eq!(c.launcher.job_masters, JobMasters::Local);
        let e = toml::from_str::<BrainConfig>(
            "database = \"b.db\"\n[launcher.job_masters.ray]\nresource = { x = 1 }\n",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("unexpected keys in table: resource"),
            "{e}"
        );
        let e = toml::from_str::<BrainConfig>(
            "database = \"b.db\"\n[launcher]\njob_masters = \"kubernetes\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
    }

    #[test]
    fn limits_default_and_bad_ones_are_refused_at_start() {
        let c: BrainConfig = toml::from_str("database = \"b.db\"\n").unwrap();
        assert_eq!(c.limits, Limits::default());
        // A file without `database` takes the default (the command line may name one).
        let c: BrainConfig = toml::from_str("[cluster]\ncpus = 2\n").unwrap();
        assert_eq!(c.database, PathBuf::from("brain-data/brain.db"));
        assert_eq!(c.limits.max_message_bytes, 4 << 20);
        let c: BrainConfig =
            toml::from_str("database = \"b.db\"\n[limits]\nmax_active_jobs = 0\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("max_active_jobs 0"), "{e}");
        let e = toml::from_str::<BrainConfig>("database = \"b.db\"\n[limits]\nmax_jobs = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_jobs"), "{e}");
    }

    #[test]
    fn the_pools_memory_is_the_configs_or_this_machines() {
        let c: BrainConfig = toml::from_str("[cluster]\nmemory = \"6Gi\"\n").unwrap();
        c.validate().unwrap();
        assert_eq!(c.pool_memory_bytes(), 6 << 30);
        let c: BrainConfig = toml::from_str("[cluster]\ncpus = 2\n").unwrap();
        let total = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = total.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(c.pool_memory_bytes(), kib * 1024, "MemTotal");
        let c: BrainConfig = toml::from_str("[cluster]\nmemory = \"0\"\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("cluster.memory is 0"), "{e}");
        let e = toml::from_str::<BrainConfig>("[cluster]\nmemory = \"lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory"), "{e}");
    }

    #[test]
    fn job_masters_on_ray_need_an_address_the_nodes_reach() {
        let ray = JobMasters::Ray {
            resources: Default::default(),
        };
        let every: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        let bridge: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        let ip: IpAddr = [10, 0, 0, 9].into();
        assert_eq!(
            brain_address(every, None, &JobMasters::Local).unwrap(),
            "127.0.0.1:7000".parse().unwrap()
        );
        assert_eq!(brain_address(bridge, None, &ray).unwrap(), bridge);
        assert_eq!(
            brain_address(every, Some(ip), &ray).unwrap(),
            SocketAddr::new(ip, 7000)
        );
        let e = brain_address(every, None, &ray).unwrap_err().to_string();
        assert!(e.contains("--advertise"), "{e}");
    }
}
