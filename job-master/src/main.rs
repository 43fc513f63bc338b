//! `job-master`: run one training job on this machine, or check a job spec.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use job_master::job::Timing;
use job_master::platform::PlatformConfig;
use job_master::spec::JobSpec;
use job_master::{MasterConfig, run};
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
    /// Run a job to its end on local processes; exit code 0 only when it succeeded.
    Run {
        /// The job spec (YAML); see examples/.
        spec: PathBuf,
        /// Where the job context, agent logs and report.json go [default: runs/<job name>].
        #[arg(long)]
        run_dir: Option<PathBuf>,
        /// Address the master serves agents on.
        #[arg(long, default_value = "127.0.0.1:0", env = "BRAIN_JOB_MASTER_LISTEN")]
        listen: String,
        /// The worker-agent binary [default: next to this binary].
        #[arg(long, env = "BRAIN_WORKER_AGENT_BIN")]
        agent_bin: Option<PathBuf>,
        /// How often agents send heartbeats, milliseconds.
        #[arg(long, default_value_t = 500)]
        heartbeat_interval_ms: u64,
        /// An agent silent for this long is declared lost and relaunched, milliseconds.
        #[arg(long, default_value_t = 10_000)]
        heartbeat_timeout_ms: u64,
        /// Rendezvous last-call window once `min` workers joined, milliseconds.
        #[arg(long, default_value_t = 2_000)]
        last_call_ms: u64,
        /// Time a training process gets between SIGTERM and SIGKILL, milliseconds.
        #[arg(long, default_value_t = 5_000)]
        grace_period_ms: u64,
        /// A launched agent that has not registered after this long is relaunched, milliseconds.
        #[arg(long, default_value_t = 30_000)]
        register_timeout_ms: u64,
        /// Seconds between progress lines.
        #[arg(long, default_value_t = 2)]
        progress_secs: u64,
    },
    /// Check a job spec and print what would run.
    Validate { spec: PathBuf },
    /// Show a running job: phase, progress, and every process with its pid and resources.
    Status {
        /// The job master's address as `job-master run` printed it, e.g. 127.0.0.1:40319.
        #[arg(long, env = "BRAIN_JOB_MASTER")]
        master: String,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match real_main().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn real_main() -> anyhow::Result<std::process::ExitCode> {
    match Cli::parse().command {
        Command::Validate { spec } => {
            let spec = JobSpec::from_file(&spec)?;
            println!("{} ({} job) is valid:", spec.name, spec.kind);
            for role in spec.roles.keys() {
                let p = spec.role_plan(*role)?;
                println!(
                    "  {role}: {} replicas (min {}, max {}, node_unit {}, max_restarts {})",
                    p.replicas, p.min, p.max, p.node_unit, p.max_restarts
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
        Command::Status { master } => {
            let url = if master.starts_with("http") {
                master.clone()
            } else {
                format!("http://{master}")
            };
            let mut c = pb::job_master_client::JobMasterClient::connect(url)
                .await
                .with_context(|| format!("cannot reach a job master at {master}"))?;
            let s = c.get_status(pb::StatusRequest {}).await?.into_inner();
            println!("{}", summary_line(&s));
            println!(
                "{:<10} {:>11} {:>10} {:>8} {:>9} {:>11} {:>5}",
                "process", "incarnation", "state", "pid", "cpu (m)", "rss (MiB)", "gpu"
            );
            for p in &s.processes {
                let role = if p.role == pb::Role::Ps as i32 {
                    "ps"
                } else {
                    "worker"
                };
                let (cpu, rss, gpu) = p
                    .sample
                    .as_ref()
                    .map(|x| {
                        (
                            x.cpu_millicores.to_string(),
                            format!("{:.1}", x.rss_bytes as f64 / 1048576.0),
                            if x.gpu_present { "yes" } else { "no" },
                        )
                    })
                    .unwrap_or(("-".into(), "-".into(), "-"));
                println!(
                    "{:<10} {:>11} {:>10} {:>8} {:>9} {:>11} {:>5}",
                    format!("{role}-{}", p.index),
                    p.incarnation,
                    p.state,
                    p.pid,
                    cpu,
                    rss,
                    gpu
                );
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Run {
            spec,
            run_dir,
            listen,
            agent_bin,
            heartbeat_interval_ms,
            heartbeat_timeout_ms,
            last_call_ms,
            grace_period_ms,
            register_timeout_ms,
            progress_secs,
        } => {
            let spec = JobSpec::from_file(&spec)?;
            let run_dir = run_dir.unwrap_or_else(|| PathBuf::from("runs").join(&spec.name));
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            let addr = listener.local_addr()?;
            let config = MasterConfig {
                spec,
                run_dir: run_dir.clone(),
                timing: Timing {
                    heartbeat_interval_ms,
                    heartbeat_timeout_ms,
                    last_call_ms,
                    grace_period_ms,
                    register_timeout_ms,
                },
                platform: PlatformConfig::Local { agent_bin },
            };
            println!("job master on {addr}, run directory {}", run_dir.display());
            let progress = tokio::spawn(show_progress(
                addr,
                Duration::from_secs(progress_secs.max(1)),
            ));
            let shutdown = async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("signal handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            };
            let report = run(config, listener, shutdown).await?;
            progress.abort();
            println!(
                "\n== {} {} in {:.1} s ==",
                report.job,
                report.phase,
                report.elapsed_ms as f64 / 1000.0
            );
            if let Some(r) = &report.reason {
                println!("reason: {r}");
            }
            if let Some(t) = report.first_step_after_ms {
                println!("first training step after {t} ms");
            }
            if let Some(l) = report.final_eval_loss {
                println!("held-out log-loss: {l:.5}");
            }
            println!(
                "shards: {}/{}; exactly-once per epoch: {}; samples per epoch: {:?}",
                report.shards_done,
                report.shards_total,
                report.exactly_once,
                report.samples_per_epoch
            );
            println!(
                "relaunches: {:?}; checkpoints: {}",
                report.restarts, report.checkpoints
            );
            for ps in &report.ps_stats {
                println!(
                    "ps {}: {} keys, {} batches / {} samples applied, {} duplicate pushes ignored",
                    ps.index, ps.keys, ps.applied_batches, ps.applied_samples, ps.duplicate_pushes
                );
            }
            println!("report: {}", run_dir.join("report.json").display());
            Ok(if report.succeeded() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            })
        }
    }
}

/// Prints one progress line every `every`, read over the master's own gRPC status call.
async fn show_progress(addr: std::net::SocketAddr, every: Duration) {
    let mut client = loop {
        match pb::job_master_client::JobMasterClient::connect(format!("http://{addr}")).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Ok(s) = client.get_status(pb::StatusRequest {}).await else {
            continue;
        };
        let s = s.into_inner();
        println!("{}", summary_line(&s));
    }
}

/// One line of a job's status: phase, progress, throughput, loss and processes alive.
fn summary_line(s: &pb::JobStatus) -> String {
    let alive = s.processes.iter().filter(|p| p.state == "running").count();
    let reason = if s.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", s.reason)
    };
    format!(
        "[{}{reason}] epoch {} shards {}/{} step {} {:.0} samples/s loss {:.4} checkpoints {} processes alive {}/{}",
        s.phase,
        s.epoch,
        s.shards_done,
        s.shards_total,
        s.global_step,
        s.samples_per_second,
        s.loss,
        s.checkpoints,
        alive,
        s.processes.len()
    )
}
