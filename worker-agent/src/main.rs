//! `worker-agent`: the per-process supervisor, and the built-in workload it launches.
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use proto::jobmaster::v1 as pb;
use worker_agent::agent::{AgentArgs, run};
use worker_agent::workload::{self, ProcessEnv};

#[derive(Parser)]
#[command(
    version,
    about = "Brain's worker agent: launches and supervises one training process for a job master"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Builtin {
    /// A parameter server holding one partition of the model.
    PsServer,
    /// A ps-job worker (pull, compute, push).
    PsWorker,
    /// An allreduce-job worker (ring all-reduce).
    AllreduceWorker,
}

#[derive(Clone, Copy, ValueEnum)]
enum Layout {
    /// Dense replica with synchronous batches (the allreduce computation).
    Dense,
    /// Sparse table (the ps computation without staleness).
    Sparse,
}

#[derive(Subcommand)]
enum Command {
    /// Supervise one process slot of a job (what a platform starts).
    Agent {
        /// The job master's address, e.g. http://127.0.0.1:7000.
        #[arg(long, env = "BRAIN_MASTER_ADDR")]
        master: String,
        /// The role group this process belongs to (`worker`, `ps`, `rollout`, ...).
        #[arg(long)]
        role: vocab::Role,
        #[arg(long)]
        index: u32,
        /// The incarnation the master launched this agent for.
        #[arg(long, default_value_t = 1)]
        incarnation: u64,
        /// Exit when the master has not answered for this many seconds.
        #[arg(long, default_value_t = 15)]
        master_timeout_secs: u64,
        /// The address the training process serves on (PS, ring member, torch store) and the
        /// other nodes reach it by [default: this node's address on the route to the master:
        /// 127.0.0.1 when the master is on this machine].
        #[arg(long, env = "BRAIN_ADVERTISE_HOST")]
        advertise: Option<std::net::IpAddr>,
        /// The job's secret file (`job.token` in the job master's run directory, owner-only):
        /// the master, the parameter servers and ring peers refuse calls without it. Its path,
        /// never the secret, goes on to the training process. The job master's platform sets
        /// it.
        #[arg(long, env = auth::JOB_TOKEN_ENV)]
        token_file: std::path::PathBuf,
        /// The job's TLS directory (`tls/` in the job master's run directory), for a job run
        /// with TLS (`job-master run --job-tls`): the agent, its process, the parameter servers
        /// and ring peers then speak mutual TLS with the job's certificate. The platform sets it.
        #[arg(long, env = auth::tls::JOB_TLS_ENV)]
        tls_dir: Option<std::path::PathBuf>,
        /// How the job's processes (a `command:` or the built-in workload) are confined (JSON,
        /// `vocab::sandbox::Sandbox`): the user they run as and bubblewrap's view. A brain's job masters set it; none: they run as
        /// this agent's user, unconfined (a job master run by hand).
        #[arg(long, env = vocab::sandbox::SANDBOX_ENV, value_parser = parse_sandbox)]
        sandbox: Option<vocab::sandbox::Sandbox>,
    },
    /// Run the built-in workload (started by the agent, with its environment).
    Workload {
        #[arg(value_enum)]
        which: Builtin,
    },
    /// Train the built-in model in this one process and print the held-out log-loss.
    Reference {
        #[arg(long, value_enum, default_value = "dense")]
        layout: Layout,
        #[arg(long, default_value_t = 100_000)]
        num_samples: u64,
        #[arg(long, default_value_t = 10_000)]
        eval_samples: u64,
        #[arg(long, default_value_t = 1_000)]
        shard_size: u64,
        #[arg(long, default_value_t = 1)]
        epochs: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 8)]
        num_fields: u32,
        #[arg(long, default_value_t = 1000)]
        vocab_per_field: u64,
        #[arg(long, default_value_t = 65_536)]
        hash_buckets: u64,
        #[arg(long, default_value_t = 256)]
        batch_size: u32,
        #[arg(long, default_value_t = 0.1)]
        learning_rate: f32,
    },
}

fn parse_sandbox(s: &str) -> Result<vocab::sandbox::Sandbox, String> {
    serde_json::from_str(s).map_err(|e| format!("not a sandbox (JSON): {e}"))
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Bounded, whatever the job makes the agent say.
        .with_writer(worker_agent::own_log::Bounded::new(
            std::io::stderr,
            worker_agent::own_log::OWN_LOG_CAP,
        ))
        // Colour only on a terminal: log files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    // A parameter server holds a descriptor per connection: room for many.
    if let Err(e) = auth::listen::raise_open_files() {
        tracing::warn!("cannot raise the open-file limit: {e}");
    }
    // The agent and the workload processes are small: one thread drives them; the PS serves
    // from a multi-threaded runtime so pulls and pushes of several workers run in parallel.
    let multi = matches!(
        cli.command,
        Command::Workload {
            which: Builtin::PsServer
        }
    );
    let rt = if multi {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    let result: Result<i32, worker_agent::Error> = rt.block_on(async move {
        match cli.command {
            Command::Agent {
                master,
                role,
                index,
                incarnation,
                master_timeout_secs,
                advertise,
                token_file,
                tls_dir,
                sandbox,
            } => {
                let args = AgentArgs {
                    master,
                    role,
                    index,
                    incarnation,
                    master_timeout: Duration::from_secs(master_timeout_secs),
                    advertise,
                    // The training process may run elsewhere: it gets the path as an absolute one.
                    token_file: std::path::absolute(&token_file).unwrap_or(token_file),
                    tls_dir: tls_dir.map(|d| std::path::absolute(&d).unwrap_or(d)),
                    sandbox,
                };
                run(args, terminated()).await
            }
            Command::Workload { which } => {
                let env = ProcessEnv::from_env()?;
                match which {
                    Builtin::PsServer => workload::ps_server::run(env, terminated()).await?,
                    Builtin::PsWorker => workload::ps_worker::run(env).await?,
                    Builtin::AllreduceWorker => workload::allreduce_worker::run(env).await?,
                }
                Ok(0)
            }
            Command::Reference {
                layout,
                num_samples,
                eval_samples,
                shard_size,
                epochs,
                seed,
                num_fields,
                vocab_per_field,
                hash_buckets,
                batch_size,
                learning_rate,
            } => {
                let cfg = pb::WorkloadConfig {
                    seed,
                    num_samples,
                    eval_samples,
                    num_fields,
                    vocab_per_field,
                    hash_buckets,
                    batch_size,
                    learning_rate,
                    epochs,
                    ..Default::default()
                };
                let start = std::time::Instant::now();
                let loss = match layout {
                    Layout::Dense => workload::reference::train_dense(&cfg, shard_size)?.0,
                    Layout::Sparse => workload::reference::train_sparse(&cfg, shard_size)?.0,
                };
                let secs = start.elapsed().as_secs_f64();
                println!(
                    "held-out log-loss {loss:.5}; {:.0} samples/s in one process",
                    (num_samples * epochs as u64) as f64 / secs
                );
                Ok(0)
            }
        }
    });
    match result {
        Ok(code) => std::process::ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(if e.is_stale() { 3 } else { 1 })
        }
    }
}

async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
