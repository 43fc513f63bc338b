//! `job-master`: run one training job on this machine or a Ray cluster, check a job spec,
//! follow a running job or send it a scale plan. One module per command:
//! [`run`] (with the platform choice), [`scale`], [`status`] (and the progress line);
//! `validate` is here.

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
        /// The job master's address as `job-master run` printed it, e.g. 127.0.0.1:40319.
        #[arg(long, env = "BRAIN_JOB_MASTER")]
        master: String,
        #[command(flatten)]
        secret: JobSecret,
    },
}

/// The job's secret, which every call to its master carries.
#[derive(clap::Args)]
pub struct JobSecret {
    /// The job's secret file: `job.token` in the job master's run directory, as `job-master
    /// run` printed it (owner-only; the master refuses calls without it).
    #[arg(long = "token-file", env = "BRAIN_JOB_TOKEN_FILE")]
    token_file: PathBuf,
    /// The job's TLS directory (`tls/` in the run directory), for a master run with
    /// --job-tls: it takes no call without the job's certificate.
    #[arg(long = "tls-dir", env = "BRAIN_JOB_TLS_DIR")]
    tls_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // A server holds a descriptor per connection: room for many, not the common 1,024.
    if let Err(e) = auth::listen::raise_open_files() {
        tracing::warn!("cannot raise the open-file limit: {e}");
    }
    let result = match Cli::parse().command {
        Command::Run(args) => run::run(args).await,
        Command::Scale(args) => scale::scale(args).await,
        Command::Validate { spec } => validate(&spec),
        Command::Status { master, secret } => status::status(&master, &secret).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn validate(spec: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    let spec = job_master::spec::load(spec)?;
    println!("{} ({} job) is valid:", spec.name, spec.kind);
    for role in spec.roles.keys() {
        let p = spec.role_plan(*role)?;
        let program = match spec.roles[role].command.as_ref() {
            Some(argv) => shlex::try_join(argv.iter().map(String::as_str))
                .unwrap_or_else(|_| format!("{argv:?}")),
            None => "the job's workload".to_string(),
        };
        println!(
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
    println!(
        "  data: {} samples in {} shards per epoch, {} epochs",
        spec.data.num_samples,
        spec.shards_per_epoch(),
        spec.epochs
    );
    Ok(std::process::ExitCode::SUCCESS)
}

type Client = pb::job_master_client::JobMasterClient<auth::Channel>;

async fn client(master: &str, secret: &JobSecret) -> anyhow::Result<Client> {
    let creds = auth::JobCreds {
        token: auth::read_secret(&secret.token_file).context("--token-file")?,
        tls: secret
            .tls_dir
            .as_deref()
            .map(auth::tls::JobTls::load)
            .transpose()
            .context("--tls-dir")?,
    };
    connect(master, &creds).await
}

async fn connect(master: &str, creds: &auth::JobCreds) -> anyhow::Result<Client> {
    let url = if master.starts_with("http") {
        master.to_string()
    } else {
        format!("http://{master}")
    };
    creds
        .connect(url)
        .await
        .map(Client::new)
        .with_context(|| format!("cannot reach a job master at {master}"))
}
