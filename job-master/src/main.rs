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
    /// Run a job to its end on local processes or a Ray cluster; exit code 0 only when it
    /// succeeded.
    Run {
        /// The job spec (YAML); see examples/.
        spec: PathBuf,
        /// Where the job context, agent logs and report.json go [default: runs/<job name>].
        #[arg(long)]
        run_dir: Option<PathBuf>,
        /// Continue the unfinished job in the run directory after its job master died (kill -9,
        /// a lost machine): every process is launched anew and the job goes on from its latest
        /// checkpoint, nothing lost or counted twice. Without it, a run directory that holds an
        /// unfinished job is refused.
        #[arg(long)]
        resume: bool,
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
        /// Processes of the job the platform may run at once; scale plans above it are
        /// rejected [default: 32 on local processes, the cluster's whole CPUs on Ray].
        #[arg(long)]
        max_processes: Option<u32>,
        /// Where the job's processes run: local processes, or Ray jobs on an existing Ray
        /// cluster [default: the spec's `platform`, else local].
        #[arg(long, value_enum)]
        platform: Option<PlatformKind>,
        /// The Ray cluster's dashboard (Job Submission API) for `--platform ray`, e.g.
        /// http://127.0.0.1:8265. The master's `--listen` address must be reachable from
        /// Ray's nodes, and the worker-agent binary must exist at `--agent-bin` on them.
        #[arg(long, env = "BRAIN_RAY_ADDRESS")]
        ray_address: Option<String>,
        /// The brain to register with (e.g. http://127.0.0.1:50070): the job reports its
        /// metrics there and carries out the brain's scale plans. Without it the job runs
        /// alone at its spec's size.
        #[arg(long, env = "BRAIN_URL")]
        brain: Option<String>,
        /// How often metrics go to the brain and plans are polled, milliseconds.
        #[arg(long, default_value_t = 1000)]
        brain_interval_ms: u64,
    },
    /// Send a scale plan to a running job and (with --wait) follow it until it is carried out.
    /// Counts must respect the spec's min, max and node_unit; a plan that cannot be carried out
    /// is rejected with the reason and the job runs on untouched.
    Scale {
        /// The job master's address as `job-master run` printed it, e.g. 127.0.0.1:40319.
        #[arg(long, alias = "job", env = "BRAIN_JOB_MASTER")]
        master: String,
        /// Target number of workers.
        #[arg(long)]
        workers: Option<u32>,
        /// Target number of parameter servers (ps jobs): keys are resharded while training.
        #[arg(long)]
        ps: Option<u32>,
        /// Replace one process (e.g. ps-1 or worker-0) by one with the --cpu/--memory given,
        /// handing its state over.
        #[arg(long)]
        migrate: Option<String>,
        /// CPU of the migrated process: cores (2, 0.5) or millicores (500m).
        #[arg(long)]
        cpu: Option<String>,
        /// Memory of the migrated process: bytes or a quantity (512Mi, 2Gi).
        #[arg(long)]
        memory: Option<String>,
        /// Why (recorded in the job's events).
        #[arg(long, default_value = "by hand")]
        reason: String,
        /// Plan version [default: one above the newest the job accepted].
        #[arg(long)]
        version: Option<u64>,
        /// Wait until the job has carried the plan out, printing its progress.
        #[arg(long)]
        wait: bool,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum PlatformKind {
    /// Child processes of the job master on this machine.
    Local,
    /// Ray jobs on an existing Ray cluster (needs --ray-address or the spec's address).
    Ray,
}

/// The platform from the flags, the spec, or the default (local).
fn choose_platform(
    flag: Option<PlatformKind>,
    ray_address: Option<String>,
    agent_bin: Option<PathBuf>,
    max_processes: Option<u32>,
    spec: Option<PlatformConfig>,
) -> anyhow::Result<PlatformConfig> {
    let local = |agent_bin| PlatformConfig::Local {
        agent_bin,
        max_processes: Some(max_processes.unwrap_or(32)),
    };
    Ok(match (flag, spec) {
        (Some(PlatformKind::Local), _) => local(agent_bin),
        (Some(PlatformKind::Ray), spec) => {
            let from_spec = match spec {
                Some(PlatformConfig::Ray {
                    address,
                    place_timeout_ms,
                    env,
                    agent_bin: spec_bin,
                    max_processes: spec_max,
                }) => Some((address, place_timeout_ms, env, spec_bin, spec_max)),
                _ => None,
            };
            let (spec_address, place_timeout_ms, env, spec_bin, spec_max) =
                from_spec.unwrap_or_default();
            let address = ray_address
                .or((!spec_address.is_empty()).then_some(spec_address))
                .context("--platform ray needs --ray-address (e.g. http://127.0.0.1:8265)")?;
            PlatformConfig::Ray {
                address,
                agent_bin: agent_bin.or(spec_bin),
                max_processes: max_processes.or(spec_max),
                place_timeout_ms,
                env,
            }
        }
        (
            None,
            Some(PlatformConfig::Ray {
                address,
                agent_bin: spec_bin,
                max_processes: spec_max,
                place_timeout_ms,
                env,
            }),
        ) => PlatformConfig::Ray {
            address: ray_address.unwrap_or(address),
            agent_bin: agent_bin.or(spec_bin),
            max_processes: max_processes.or(spec_max),
            place_timeout_ms,
            env,
        },
        (
            None,
            Some(PlatformConfig::Local {
                agent_bin: spec_bin,
                max_processes: spec_max,
            }),
        ) => PlatformConfig::Local {
            agent_bin: agent_bin.or(spec_bin),
            max_processes: max_processes.or(spec_max).or(Some(32)),
        },
        (None, Some(PlatformConfig::External)) => PlatformConfig::External,
        (None, None) => local(agent_bin),
    })
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
        Command::Scale {
            master,
            workers,
            ps,
            migrate,
            cpu,
            memory,
            reason,
            version,
            wait,
        } => {
            let mut c = client(&master).await?;
            let before = c.get_status(pb::StatusRequest {}).await?.into_inner();
            let mut plan = pb::ScalePlan {
                version: version.unwrap_or(before.desired_plan_version + 1),
                ..Default::default()
            };
            for (role, count) in [(pb::Role::Worker, workers), (pb::Role::Ps, ps)] {
                if let Some(count) = count {
                    plan.roles.push(pb::RoleTarget {
                        role: role as i32,
                        count,
                        resources: None,
                    });
                }
            }
            if let Some(m) = migrate {
                if cpu.is_none() && memory.is_none() {
                    anyhow::bail!("--migrate {m} needs --cpu or --memory for the new process");
                }
                let key: job_master::job::SlotKey = m
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--migrate {m}: {e}"))?;
                let cpu = cpu
                    .map(|c| {
                        serde_norway::from_str::<job_master::spec::Millicores>(&c).map(|m| m.0)
                    })
                    .transpose()
                    .context("--cpu")?
                    .unwrap_or(0);
                let memory = memory
                    .map(|m| serde_norway::from_str::<job_master::spec::Bytes>(&m).map(|b| b.0))
                    .transpose()
                    .context("--memory")?
                    .unwrap_or(0);
                plan.migrations.push(pb::Migration {
                    role: match key.role {
                        job_master::spec::RoleName::Ps => pb::Role::Ps,
                        job_master::spec::RoleName::Worker => pb::Role::Worker,
                    } as i32,
                    index: key.index,
                    resources: Some(pb::Resources {
                        cpu_millicores: cpu,
                        memory_bytes: memory,
                        gpus: 0,
                    }),
                    reason,
                });
            }
            if plan.roles.is_empty() && plan.migrations.is_empty() {
                anyhow::bail!("nothing to do: give --workers, --ps or --migrate");
            }
            let answer = c.apply_scale_plan(plan.clone()).await?.into_inner();
            if !answer.accepted {
                eprintln!("plan {} rejected: {}", plan.version, answer.reason);
                return Ok(std::process::ExitCode::from(3));
            }
            println!("plan {} accepted", plan.version);
            if !wait {
                return Ok(std::process::ExitCode::SUCCESS);
            }
            loop {
                let s = c.get_status(pb::StatusRequest {}).await?.into_inner();
                println!("{}", summary_line(&s));
                if s.reached_plan_version >= plan.version {
                    println!("plan {} reached", plan.version);
                    break;
                }
                if s.phase != "running" {
                    anyhow::bail!(
                        "the job is {} before reaching plan {}",
                        s.phase,
                        plan.version
                    );
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Status { master } => {
            let mut c = client(&master).await?;
            let s = c.get_status(pb::StatusRequest {}).await?.into_inner();
            println!("{}", summary_line(&s));
            println!(
                "{:<10} {:>11} {:>10} {:>8} {:>9} {:>11} {:>5}  given",
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
                let given = p.resources.as_ref().map_or_else(
                    || "-".to_string(),
                    |r| {
                        format!(
                            "{}m cpu, {:.0} MiB, {} gpu",
                            r.cpu_millicores,
                            r.memory_bytes as f64 / 1048576.0,
                            r.gpus
                        )
                    },
                );
                println!(
                    "{:<10} {:>11} {:>10} {:>8} {:>9} {:>11} {:>5}  {given}",
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
            resume,
            listen,
            agent_bin,
            heartbeat_interval_ms,
            heartbeat_timeout_ms,
            last_call_ms,
            grace_period_ms,
            register_timeout_ms,
            progress_secs,
            max_processes,
            platform,
            ray_address,
            brain,
            brain_interval_ms,
        } => {
            let spec = JobSpec::from_file(&spec)?;
            let platform = choose_platform(
                platform,
                ray_address,
                agent_bin,
                max_processes,
                spec.platform.clone(),
            )?;
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
                platform,
                brain: brain.map(|url| {
                    let url = if url.starts_with("http") {
                        url
                    } else {
                        format!("http://{url}")
                    };
                    job_master::brain_link::BrainLink {
                        report_interval_ms: brain_interval_ms,
                        ..job_master::brain_link::BrainLink::new(url)
                    }
                }),
                resume,
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
            for t in &report.transitions {
                println!(
                    "plan {}: {:?} -> {:?} reached after {} ms{}",
                    t.version,
                    t.from,
                    t.to,
                    t.reached_ms - t.accepted_ms,
                    t.resumed_ms
                        .map(|r| format!(
                            ", every worker training again after {} ms",
                            r - t.accepted_ms
                        ))
                        .unwrap_or_default()
                );
            }
            for r in &report.reshards {
                println!(
                    "reshard (plan {}): ps {} -> {} moved {} of {} keys in {} ms, parameter digest {:016x} unchanged: {}",
                    r.version,
                    r.from_ps,
                    r.to_ps,
                    r.moved_keys,
                    r.total_keys,
                    r.took_ms,
                    r.digest_after,
                    r.digest_before == r.digest_after
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

async fn client(
    master: &str,
) -> anyhow::Result<pb::job_master_client::JobMasterClient<tonic::transport::Channel>> {
    let url = if master.starts_with("http") {
        master.to_string()
    } else {
        format!("http://{master}")
    };
    pb::job_master_client::JobMasterClient::connect(url)
        .await
        .with_context(|| format!("cannot reach a job master at {master}"))
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
    let members = s.processes.iter().filter(|p| p.state != "removed").count();
    let plan = match (s.desired_plan_version, s.transition.is_empty()) {
        (0, _) => String::new(),
        (_, true) => format!(" plan {}", s.reached_plan_version),
        (_, false) => format!(" [{}]", s.transition),
    };
    let reason = if s.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", s.reason)
    };
    format!(
        "[{}{reason}] epoch {} shards {}/{} step {} {:.0} samples/s loss {:.4} checkpoints {} processes alive {}/{}{plan}",
        s.phase,
        s.epoch,
        s.shards_done,
        s.shards_total,
        s.global_step,
        s.samples_per_second,
        s.loss,
        s.checkpoints,
        alive,
        members
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ray(address: &str) -> PlatformConfig {
        PlatformConfig::Ray {
            address: address.into(),
            agent_bin: None,
            max_processes: Some(6),
            place_timeout_ms: Some(5000),
            env: Default::default(),
        }
    }

    #[test]
    fn flags_override_the_spec_and_local_is_the_default() {
        let local = choose_platform(None, None, None, None, None).unwrap();
        assert_eq!(
            local,
            PlatformConfig::Local {
                agent_bin: None,
                max_processes: Some(32)
            }
        );
        // The spec's Ray platform, its address replaced by the flag.
        let p = choose_platform(None, Some("h:1".into()), None, None, Some(ray("h:2"))).unwrap();
        assert_eq!(p, {
            let mut r = ray("h:1");
            if let PlatformConfig::Ray { max_processes, .. } = &mut r {
                *max_processes = Some(6);
            }
            r
        });
        // --platform local wins over the spec.
        let p = choose_platform(
            Some(PlatformKind::Local),
            None,
            None,
            Some(4),
            Some(ray("h:2")),
        );
        assert_eq!(
            p.unwrap(),
            PlatformConfig::Local {
                agent_bin: None,
                max_processes: Some(4)
            }
        );
        // --platform ray takes the spec's settings and the flag's address.
        let p = choose_platform(Some(PlatformKind::Ray), None, None, None, Some(ray("h:2")));
        assert_eq!(p.unwrap(), ray("h:2"));
        let p = choose_platform(
            Some(PlatformKind::Ray),
            Some("h:3".into()),
            None,
            None,
            None,
        );
        assert!(
            matches!(p.unwrap(), PlatformConfig::Ray { address, place_timeout_ms: None, .. } if address == "h:3")
        );
        let e = choose_platform(Some(PlatformKind::Ray), None, None, None, None).unwrap_err();
        assert!(e.to_string().contains("--ray-address"), "{e}");
    }
}
