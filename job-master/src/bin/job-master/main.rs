//! `job-master`: run one training job on this machine or a Ray cluster, check a job spec,
//! follow a running job or send it a scale plan. One module per command:
//! [`run`] (with the platform choice), [`scale`], [`status`] (and the progress line);
//! `validate` is here.

/// `println!` for what job-master prints: a job's text in it (events, reasons, output) goes
/// through [`vocab::text::printable`], so no escape sequence reaches the terminal.
macro_rules! say {
    () => { ::std::println!() };
    ($($t:tt)*) => { ::std::println!("{}", ::vocab::text::printable(&::std::format!($($t)*))) };
}

/// `eprintln!` as [`say!`] is `println!`.
macro_rules! say_err {
    ($($t:tt)*) => { ::std::eprintln!("{}", ::vocab::text::printable(&::std::format!($($t)*))) };
}

mod logs;
mod run;
mod scale;
mod status;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use proto::jobmaster::v1 as pb;

#[derive(Parser)]
#[command(
    version,
    about = "Brain's job master: runs one elastic training job (rendezvous, data shards, failures, checkpoints)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job to its end on local processes or a Ray cluster; exit code 0 only when it
    /// succeeded.
    Run(run::RunArgs),
    /// Send a scale plan to a running job and (with --wait) follow it until it is carried out.
    /// Counts must respect the spec's min, max and node_unit; a plan that cannot be carried out
    /// is rejected with the reason and the job runs on untouched.
    Scale(scale::ScaleArgs),
    /// Check a job spec and print what would run.
    Validate { spec: PathBuf },
    /// Show a running job: phase, progress, and every process with its pid and resources.
    Status {
        #[command(flatten)]
        master: MasterArgs,
    },
    /// What went wrong in a job and what it cost, read from its run directory (running or
    /// ended): the timeline of faults, restarts, plans, checkpoints, stragglers, hangs and
    /// nodes; each hang with the stacks captured; the job's effective training time.
    Diagnose {
        /// The job's run directory (`job-master run`'s --run-dir, runs/<job name> by default).
        run_dir: PathBuf,
        /// Every event, not only those about trouble or change.
        #[arg(long)]
        all: bool,
    },
    /// Every event of a job (running or ended), one line each: seconds since its start, kind,
    /// text. Read from its run directory.
    Events {
        /// The job's run directory (`job-master run`'s --run-dir, runs/<job name> by default).
        run_dir: PathBuf,
    },
    /// The output of one process of a job (its newest incarnation), read from its run
    /// directory's logs/; with --follow, what it writes next too, until the job ends.
    Logs(logs::LogsArgs),
}

/// Which running job master to call, and the job's secret (and TLS) every call carries: from
/// its run directory, or each given.
#[derive(clap::Args)]
pub struct MasterArgs {
    /// The job's run directory (`job-master run`'s --run-dir, runs/<job name> by default):
    /// the master's address, the job's secret and its TLS are read from it.
    #[arg(long, env = "BRAIN_JOB_RUN_DIR")]
    run_dir: Option<PathBuf>,
    /// The job master's address as `job-master run` printed it, e.g. 127.0.0.1:40319
    /// [default: master.addr in --run-dir].
    #[arg(long, alias = "job", env = "BRAIN_JOB_MASTER")]
    master: Option<String>,
    /// The job's secret file (owner-only; the master refuses calls without it) [default:
    /// job.token in --run-dir].
    #[arg(long = "token-file", env = "BRAIN_JOB_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// The job's TLS directory, which proves the master is the job's and this client one of
    /// the job's [default: tls/ beside the secret file].
    #[arg(long = "tls-dir", env = "BRAIN_JOB_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// Plain text, the master not checked: for a master run with --job-insecure (overrides
    /// --tls-dir).
    #[arg(long)]
    insecure: bool,
}

impl MasterArgs {
    /// The master's address and the job's credentials.
    fn resolve(&self) -> anyhow::Result<(String, auth::JobCreds)> {
        let from_run_dir = |file: &str| self.run_dir.as_ref().map(|d| d.join(file));
        let master = match (&self.master, from_run_dir(job_master::master::ADDRESS_FILE)) {
            (Some(m), _) => m.clone(),
            (None, Some(f)) => std::fs::read_to_string(&f)
                .with_context(|| {
                    format!(
                        "--run-dir: the master's address ({}); is the job running there?",
                        f.display()
                    )
                })?
                .trim()
                .to_string(),
            (None, None) => anyhow::bail!(
                "which job master? give --run-dir DIR (the job's run directory), or --master \
                 ADDR with --token-file FILE"
            ),
        };
        let token_file = self
            .token_file
            .clone()
            .or_else(|| from_run_dir(auth::JOB_TOKEN_FILE))
            .context("--token-file: the job's secret file (job.token in its run directory)")?;
        let tls_dir = match (&self.tls_dir, self.insecure) {
            (_, true) => None,
            (Some(d), false) => Some(d.clone()),
            (None, false) => {
                let beside = token_file
                    .parent()
                    .unwrap_or(std::path::Path::new("."))
                    .join(job_master::master::JOB_TLS_DIR);
                if !beside.is_dir() {
                    anyhow::bail!(
                        "no TLS directory beside {} ({} does not exist): give --tls-dir, or \
                         --insecure for a master run with --job-insecure",
                        token_file.display(),
                        beside.display()
                    );
                }
                Some(beside)
            }
        };
        let creds = auth::JobCreds {
            token: auth::read_secret(&token_file).context("--token-file")?,
            tls: tls_dir
                .as_deref()
                .map(auth::tls::JobTls::load)
                .transpose()
                .context("--tls-dir")?,
        };
        Ok((master, creds))
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // A server holds a descriptor per connection: room for many, not the common 1,024.
    if let Err(e) = auth::listen::raise_open_files() {
        tracing::warn!("cannot raise the open-file limit: {e}");
    }
    let result = match Cli::parse().command {
        Command::Run(args) => run::run(args).await,
        Command::Scale(args) => scale::scale(args).await,
        Command::Validate { spec } => validate(&spec),
        Command::Status { master } => status::status(&master).await,
        Command::Diagnose { run_dir, all } => diagnose(&run_dir, all),
        Command::Events { run_dir } => events(&run_dir),
        Command::Logs(args) => logs::logs(&args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            say_err!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The job context persisted in `run_dir`.
fn context_in(run_dir: &std::path::Path) -> anyhow::Result<job_master::job::JobContext> {
    let context = run_dir.join(job_master::persist::CONTEXT_FILE);
    job_master::persist::load(&context).with_context(|| {
        format!(
            "{}: is this a job's run directory (job-master run --run-dir)?",
            run_dir.display()
        )
    })
}

fn events(run_dir: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    let text = job_master::diagnose::events(&context_in(run_dir)?);
    print!("{}", vocab::text::printable(&text));
    Ok(std::process::ExitCode::SUCCESS)
}

fn diagnose(run_dir: &std::path::Path, all: bool) -> anyhow::Result<std::process::ExitCode> {
    let ctx = context_in(run_dir)?;
    let report_file = run_dir.join(vocab::run_dir::REPORT_FILE);
    // A report is the ended job's; a run directory whose job runs again may hold an old one.
    let ended = ctx.phase.is_terminal();
    let report: Option<vocab::report::JobReport> = match std::fs::read(&report_file) {
        Ok(bytes) if ended => Some(
            serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: not a job report", report_file.display()))?,
        ),
        _ => None,
    };
    let text = job_master::diagnose::diagnosis(&ctx, report.as_ref(), all);
    print!("{}", vocab::text::printable(&text));
    Ok(std::process::ExitCode::SUCCESS)
}

fn validate(spec: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    let spec = job_master::spec::load(spec)?;
    say!("{} ({} job) is valid:", spec.name, spec.kind);
    for role in spec.roles.keys() {
        let p = spec.role_plan(*role)?;
        let program = match spec.roles[role].command.as_ref() {
            Some(argv) => shlex::try_join(argv.iter().map(String::as_str))
                .unwrap_or_else(|_| format!("{argv:?}")),
            None => "the job's workload".to_string(),
        };
        say!(
            "  {role} ({}, failover {}): {} replicas (min {}, max {}, node_unit {}, max_restarts \
             {}), runs {program}",
            spec.topology(*role),
            spec.failover(*role),
            p.replicas,
            p.min,
            p.max,
            p.node_unit,
            p.max_restarts
        );
    }
    for g in &spec.placement {
        say!(
            "  placement group {} ({}): {} processes laid out together before they start, \
             more beside them as the roles grow{}",
            g.name(),
            g.strategy.as_str(),
            spec.bundles(g).len(),
            if g.share_devices {
                format!(
                    "; process i of each role shares one GPU ({} of it: {})",
                    g.roles.iter().map(|r| spec.gpu_of(*r)).sum::<vocab::Gpus>(),
                    g.roles
                        .iter()
                        .map(|r| format!("{r} {}", spec.gpu_of(*r)))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                String::new()
            }
        );
    }
    say!(
        "  data: {} samples in {} shards per epoch, {} epochs",
        spec.data.num_samples,
        spec.shards_per_epoch(),
        spec.epochs
    );
    Ok(std::process::ExitCode::SUCCESS)
}

type Client = pb::job_master_client::JobMasterClient<auth::Channel>;

/// How long a call of these commands to a job master may take: every one answers at once, so a
/// master that takes longer is stopped or hung, and the command says so rather than wait.
const CALLS: auth::Deadlines = auth::Deadlines::all(std::time::Duration::from_secs(30));

/// A client of the master `args` name, with the job's credentials.
async fn client(args: &MasterArgs) -> anyhow::Result<Client> {
    let (master, creds) = args.resolve()?;
    connect(&master, &creds).await
}

async fn connect(master: &str, creds: &auth::JobCreds) -> anyhow::Result<Client> {
    let url = if master.starts_with("http") {
        master.to_string()
    } else {
        format!("http://{master}")
    };
    creds
        .connect(url, CALLS)
        .await
        .map(Client::new)
        .with_context(|| format!("cannot reach a job master at {master}"))
}
