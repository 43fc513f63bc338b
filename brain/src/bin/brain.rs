//! `brain`: the cluster-wide brain service.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "brain",
    version,
    about = "The cluster-wide brain: sizes submitted jobs, starts their job masters, takes their \
             metrics and resizes running jobs every round under the operator's policy.",
    after_help = "The gRPC API and Prometheus' GET /metrics share the --listen address; \
                  /metrics asks for the metrics token (metrics.token beside the database).\n\
                  Flags override what a --config file says."
)]
struct Cli {
    /// Address to serve the gRPC API and /metrics on.
    #[arg(long, default_value = "127.0.0.1:50070", env = "BRAIN_LISTEN")]
    listen: String,
    /// A TOML config file (`database`, `policy`, `runs_dir`, `[cluster]`, `[launcher]`,
    /// `[limits]` (sizes, jobs and rate limits per client), `[tls]`, `[sink]`; unknown keys are
    /// errors).
    #[arg(long)]
    config: Option<PathBuf>,
    /// SQLite database of jobs, metric summaries and plans (created if missing)
    /// [default: brain-data/brain.db].
    #[arg(long)]
    database: Option<PathBuf>,
    /// The operator's policy file (TOML: [scheduler], [live] interval_s and cooldown_s, ...),
    /// read again whenever it changes.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Where started jobs keep their specs, logs and checkpoints [default: brain-data/runs].
    #[arg(long)]
    runs_dir: Option<PathBuf>,
    /// CPUs the brain may hand out to jobs [default: this machine's].
    #[arg(long)]
    cpus: Option<f64>,
    /// Processes of all jobs at once [default: 64].
    #[arg(long)]
    max_processes: Option<u32>,
    /// Run the jobs' processes on this Ray cluster (its dashboard, e.g.
    /// http://127.0.0.1:8265) and read the CPUs to hand out from it before every round
    /// [config: cluster.ray_address].
    #[arg(long)]
    ray_address: Option<String>,
    /// The job-master binary [default: next to this binary].
    #[arg(long, env = "BRAIN_JOB_MASTER_BIN")]
    job_master_bin: Option<PathBuf>,
    /// Extra arguments for every `job-master run` the brain starts (repeatable).
    #[arg(long = "job-master-arg", allow_hyphen_values = true)]
    job_master_args: Vec<String>,
    /// Where job masters run: child processes of the brain (local), or Ray jobs on the
    /// --ray-address cluster (ray: a node lost takes only its masters, and the brain resumes
    /// them on nodes left; --runs-dir must be shared by the nodes at the same path)
    /// [config: launcher.job_masters; default: local].
    #[arg(long, value_enum)]
    job_masters: Option<MastersOn>,
    /// With --job-masters ray: a custom resource the nodes that may hold job masters declare
    /// (`ray start --resources '{"NAME": N}'`), as NAME=AMOUNT taken per master (repeatable)
    /// [default: none, Ray's choice of node].
    #[arg(long = "job-master-resource", value_parser = parse_resource)]
    job_master_resources: Vec<(String, f64)>,
    /// The operator token's file: created (mode 0600) at the first start, read after; every
    /// operator call (brainctl) must send it [config: operator_token_file; default:
    /// operator.token beside the database].
    #[arg(long)]
    operator_token_file: Option<PathBuf>,
    /// The address job masters on other machines reach the brain by, with --listen's port
    /// (needed for --job-masters ray when --listen is 0.0.0.0) [config: advertise].
    #[arg(long)]
    advertise: Option<std::net::IpAddr>,
    /// Mutual TLS with the files `brainctl certs --out DIR` made: the brain presents
    /// DIR/brain.pem and admits only clients with a certificate DIR/ca.pem signed; the job
    /// masters it starts present DIR/client.pem, and run their jobs with mutual TLS inside
    /// them too (`job-master run --job-tls`) [config: tls, launcher.tls, launcher.job_tls].
    /// Without it (and without [tls]) the brain still serves TLS, with a certificate and CA of
    /// its own made at its first start in tls/ beside the database; clients pin that CA.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Check no token and serve without TLS (plain text, also beyond loopback): anyone who
    /// reaches the address may submit, cancel and steer every job, and a client cannot tell
    /// the brain from an impostor. For a network you trust only [config: insecure].
    #[arg(long)]
    insecure: bool,
    /// The unprivileged user the jobs' processes run as (a `command:` and the built-in
    /// workload alike), in a bubblewrap sandbox that shows them only the system, their code
    /// and working directory (read only) and their checkpoint directory; required when the
    /// brain runs as root
    /// [config: launcher.sandbox.run_as].
    #[arg(long, env = "BRAIN_RUN_AS")]
    run_as: Option<String>,
    /// Start even beside a Ray dashboard that answers without a credential on loopback (at
    /// 127.0.0.1:8265, or at --ray-address): the jobs' processes share this host's network,
    /// and any of them could run code through it outside the sandbox. Without this flag the
    /// brain refuses, saying so [config: launcher.allow_open_ray_dashboard].
    #[arg(long)]
    allow_open_ray_dashboard: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MastersOn {
    Local,
    Ray,
}

fn parse_resource(s: &str) -> Result<(String, f64), String> {
    let (name, amount) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=AMOUNT, e.g. brain_job_master=1"))?;
    let amount: f64 = amount
        .parse()
        .map_err(|e| format!("{s:?}: the amount: {e}"))?;
    if name.is_empty() || !(amount.is_finite() && amount > 0.0) {
        return Err(format!(
            "{s:?}: expected a resource name and an amount above 0"
        ));
    }
    Ok((name.to_string(), amount))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    // What the brain writes (its certificate's keys, tokens, store, specs) is its user's alone.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    // A connection takes a descriptor: room for many, not the common 1,024.
    match auth::listen::raise_open_files() {
        Ok(n) => tracing::debug!("open-file limit {n}"),
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
    let mut config = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("{}", path.display()))?
        }
        None => brain::BrainConfig::with_database(PathBuf::from("brain-data/brain.db")),
    };
    if let Some(d) = cli.database {
        config.database = d;
    }
    if let Some(p) = cli.policy {
        config.policy = Some(p);
    }
    if let Some(r) = cli.runs_dir {
        config.runs_dir = r;
    }
    if let Some(c) = cli.cpus {
        config.cluster.cpus = c;
    }
    if let Some(a) = cli.ray_address {
        config.cluster.ray_address = Some(a);
    }
    if let Some(m) = cli.max_processes {
        config.cluster.max_processes = m;
    }
    if let Some(b) = cli.job_master_bin {
        config.launcher.job_master_bin = Some(b);
    }
    config.launcher.job_master_args.extend(cli.job_master_args);
    match cli.job_masters {
        Some(MastersOn::Local) => config.launcher.job_masters = brain::launch::JobMasters::Local,
        Some(MastersOn::Ray) if config.launcher.job_masters == brain::launch::JobMasters::Local => {
            config.launcher.job_masters = brain::launch::JobMasters::Ray {
                resources: Default::default(),
            }
        }
        _ => {}
    }
    if !cli.job_master_resources.is_empty() {
        match &mut config.launcher.job_masters {
            brain::launch::JobMasters::Ray { resources } => {
                resources.extend(cli.job_master_resources)
            }
            brain::launch::JobMasters::Local => {
                anyhow::bail!(
                    "--job-master-resource places job masters on Ray: give --job-masters ray"
                )
            }
        }
    }
    if let Some(ip) = cli.advertise {
        config.advertise = Some(ip);
    }
    if let Some(f) = cli.operator_token_file {
        config.operator_token_file = Some(f);
    }
    if let Some(dir) = cli.tls_dir {
        config.tls = Some(auth::tls::ServerTls::in_dir(&dir));
        config.launcher.tls = Some(auth::tls::ClientTls::in_dir(&dir));
    }
    config.insecure |= cli.insecure;
    if let Some(user) = cli.run_as {
        config.launcher.sandbox.run_as = Some(user);
    }
    config.launcher.allow_open_ray_dashboard |= cli.allow_open_ray_dashboard;
    config.validate()?;
    // Never the jobs as root, nor beside a dashboard that would run their code unconfined:
    // refused before anything is made.
    brain::launch::check_run_as(&config.launcher)?;
    brain::launch::refuse_open_dashboards(&config.launcher, config.cluster.ray_address.as_deref())
        .await?;
    let listener = tokio::net::TcpListener::bind(&cli.listen)
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    let bound = listener.local_addr()?;
    // TLS by default, on loopback too: a certificate of the brain's own, pinned by its clients.
    let hosts: Vec<String> = [Some(bound.ip()), config.advertise]
        .into_iter()
        .flatten()
        .filter(|ip| !ip.is_unspecified())
        .map(|ip| ip.to_string())
        .collect();
    // A listener on every interface without --advertise: no name for the certificate to
    // carry; such a brain needs [tls] (`brainctl certs --host`) or --insecure (checked below).
    let nameless = bound.ip().is_unspecified() && config.advertise.is_none();
    if !nameless && let Some(dir) = config.default_tls(&hosts)? {
        println!(
            "TLS with the brain's own certificate: {} (clients check it against {}; brainctl \
             run from here finds it, elsewhere --ca)",
            dir.join(auth::tls::SERVER_CERT).display(),
            dir.join(auth::tls::CA_CERT).display()
        );
    }
    // Nothing is announced on an address the brain would then refuse to serve.
    config.check_listen(bound)?;
    if config.insecure {
        println!(
            "--insecure: no token is checked and nothing is encrypted; anyone who reaches {bound} \
             may submit, cancel and steer every job (brainctl --insecure talks to it)"
        );
    } else {
        // The operator token exists before anyone is told where to call.
        let token_file = config.operator_token_file();
        auth::read_or_create(&token_file)?;
        println!(
            "operator token in {} (brainctl --token-file reads it)",
            token_file.display()
        );
        let metrics_file = config.metrics_token_file();
        auth::read_or_create(&metrics_file)?;
        println!(
            "metrics token in {} (GET /metrics asks for it: Prometheus' \
             authorization.credentials_file)",
            metrics_file.display()
        );
    }
    // The address actually bound (port 0 picks one), for whoever started us.
    println!("listening on {}", listener.local_addr()?);
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    brain::run(config, listener, shutdown).await?;
    Ok(())
}
