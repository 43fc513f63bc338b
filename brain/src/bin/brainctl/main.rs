//! `brainctl`: the operator's command line.
//!
//! Its doc comments are `--help` texts, where `[live]` names a TOML table, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

mod link;
mod nodes_cmd;
mod trace_cmd;
mod train;
mod whatif_cmd;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use link::{Client, LINK, Link, ask_brain, brain_tls};
use proto::service::v1 as pb;

#[derive(Parser)]
#[command(
    name = "brainctl",
    version,
    about = "Operate Brain: submit jobs without resources, look at what a brain runs and \
             would do, set its policy, and replay traces under policies before they touch a \
             cluster."
)]
struct Cli {
    /// The operator token the brain wrote at its first start (mode 0600, beside its database),
    /// sent with every call to the brain.
    #[arg(
        long,
        global = true,
        env = "BRAIN_TOKEN_FILE",
        default_value = "brain-data/operator.token"
    )]
    token_file: PathBuf,
    /// TLS to the brain: the CA that signed its certificate (`ca.pem` of `brainctl certs`);
    /// the brain's address may then be given as http:// or https://.
    #[arg(long, global = true, env = "BRAIN_CA_FILE")]
    ca: Option<PathBuf>,
    /// Mutual TLS: the certificate brainctl presents (`client.pem`), with --tls-key.
    #[arg(long, global = true, env = "BRAIN_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Mutual TLS: brainctl's private key (`client.key`, owner-only).
    #[arg(long, global = true, env = "BRAIN_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS with the files `brainctl certs --out DIR` made: --ca DIR/ca.pem --tls-cert
    /// DIR/client.pem --tls-key DIR/client.key.
    #[arg(long, global = true, env = "BRAIN_TLS_DIR", conflicts_with_all = ["ca", "tls_cert", "tls_key"])]
    tls_dir: Option<PathBuf>,
    /// Talk to a brain started with --insecure: plain text, no token sent. Without it
    /// brainctl checks the brain's certificate before it sends the operator token: against
    /// --ca, or the CA the brain made beside its database (tls/ca.pem next to --token-file).
    #[arg(long, global = true, env = "BRAIN_INSECURE", conflicts_with_all = ["ca", "tls_cert", "tls_key", "tls_dir"])]
    insecure: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the jobs a running brain knows, with their metric summaries and plan versions.
    Jobs {
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Show one job of a running brain: its state, size, why the brain sized it so, its
    /// metrics and plans, and how it ended.
    Status {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// What went wrong in one job (running or ended) and what it cost: its effective training
    /// time, its pre-run check, a timeline of faults, relaunches, plans, checkpoints,
    /// stragglers, hangs (with the stacks captured) and nodes. The brain reads the job's run
    /// directory on its own machine (`job-master diagnose` of it).
    Diagnose {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// Every event in the timeline, not only those about trouble or change.
        #[arg(long)]
        all: bool,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Submit a job spec (YAML) that names no replicas or resources: the brain predicts them
    /// from its history, records why, and starts the job's master when a round gives it room.
    /// Counts or resources the spec does name are kept.
    Submit {
        /// The job spec; see examples/ (resource-free specs omit replicas and resources).
        spec: PathBuf,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
        /// Follow the job until it ends; exit 0 only if it succeeded.
        #[arg(long)]
        wait: bool,
    },
    /// Show what the brain's next round would decide for every queued and running job, and
    /// why, without dispatching anything.
    Plan {
        /// Required: the brain dispatches plans itself every round; this only shows them.
        #[arg(long)]
        dry_run: bool,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Resize a running job through the brain: a versioned plan like the brain's own, which
    /// its job master carries out (a job master a brain manages refuses plans from anywhere
    /// else). Counts outside the job's bounds or node unit are refused with the reason.
    Scale {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// Target number of workers.
        #[arg(long)]
        workers: Option<u32>,
        /// Target number of parameter servers (ps jobs; keys are resharded while training).
        #[arg(long)]
        ps: Option<u32>,
        /// Target count of any role group by name, e.g. `--role rollout=4` (repeatable).
        #[arg(long = "role", value_name = "ROLE=N")]
        roles: Vec<vocab::role::RoleCount>,
        /// Why (recorded with the plan).
        #[arg(long, default_value = "by hand (brainctl scale)")]
        reason: String,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Cancel a job through the brain: a queued job never starts; a running one takes a last
    /// checkpoint (where its job master tracks its data), stops every process and is recorded
    /// as cancelled. An unknown or ended job is refused, saying so.
    Cancel {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// Why (recorded with the job).
        #[arg(long, default_value = "cancelled by hand (brainctl cancel)")]
        reason: String,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// List the nodes the brain plans on (ok, cordoned: why, since and until when; or holding
    /// a running job's stragglers: which, how much slower), or
    /// cordon and uncordon one. A cordoned node is taken out of every round's capacity: no
    /// process of a new plan goes there and jobs on it are planned off it.
    Nodes {
        #[command(subcommand)]
        action: Option<nodes_cmd::NodesAction>,
        /// The brain's gRPC address.
        #[arg(long, global = true, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Fit the job-profile model on the brain's finished jobs and store it in its database (the
    /// brain sizes submitted jobs' memory with it from then on); with --evaluate, score it
    /// against DLRover's rule, the user's request and the global median on a time-ordered
    /// split of that history and of Alibaba's 2023 and 2025 GPU traces.
    Train(train::TrainArgs),
    /// Show or set the operator's policy of a running brain (TOML: [scheduler] sizes the jobs,
    /// [[heuristics]] correct their PS count and processes' resources, [live] interval_s,
    /// cooldown_s, pin_while_plan_in_flight, max_resumes pace the rounds).
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Make a private CA and, signed by it, the brain's TLS certificate and a client
    /// certificate (for mutual TLS), then print the configuration that uses them. Nothing is
    /// ever overwritten; private keys are owner-only.
    Certs {
        /// Where to write ca.pem, ca.key, brain.pem, brain.key, client.pem, client.key.
        #[arg(long, default_value = "brain-data/tls")]
        out: PathBuf,
        /// A name or address clients reach the brain by (repeatable); localhost and 127.0.0.1
        /// are always included.
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
    /// Replay job traces on a simulated cluster under each policy, side by side.
    ///
    /// Every trace is replayed under every policy (one simulation per core); the table shows,
    /// per policy, the jobs of all traces pooled. Traces are workload CSVs in Pollux's and Sia's
    /// format (`name,time,application,num_replicas,batch_size`), whose jobs train applications
    /// known by their profiles (directories of measured step times and training curves, as in
    /// Pollux's `traces/`), or Philly job lists (`timestamp,duration,num_gpus,gpu_time,cluster`),
    /// whose jobs run for their duration on exactly the GPUs they asked for.
    Whatif(Box<whatif_cmd::WhatifArgs>),
    /// Make traces for `brainctl whatif`: larger ones drawn from a real trace's distribution.
    Trace {
        #[command(subcommand)]
        action: trace_cmd::TraceAction,
    },
}

impl Command {
    /// Whether the command calls a running brain (the others work on files alone).
    fn talks_to_a_brain(&self) -> bool {
        !matches!(
            self,
            Command::Train(_) | Command::Certs { .. } | Command::Whatif(_) | Command::Trace { .. }
        )
    }
}

#[derive(Subcommand)]
enum PolicyAction {
    /// Print the policy in force and the file it lives in.
    Show {
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Check a policy file and make it the brain's policy from the next round on.
    Set {
        file: PathBuf,
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
}

fn print_jobs(jobs: &[pb::JobRecord]) {
    println!(
        "{:>4}  {:<24} {:<9} {:>7} {:>8} {:>12} {:>12} {:>9} {:>6} {:>8}  plan (newest/accepted/reached)",
        "id",
        "name",
        "state",
        "workers",
        "reports",
        "last step",
        "samples/s",
        "peak MiB",
        "gpu %",
        "gpu MiB"
    );
    for j in jobs {
        let workers = j.shape.as_ref().map_or("-".to_string(), |s| {
            if s.ps > 0 {
                format!("{}+{}ps", s.workers, s.ps)
            } else {
                s.workers.to_string()
            }
        });
        let (gpu_pct, gpu_mib) = if j.gpu_processes.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.0}", j.gpu_utilisation_pct),
                (j.gpu_memory_bytes >> 20).to_string(),
            )
        };
        println!(
            "{:>4}  {:<24} {:<9} {:>7} {:>8} {:>12} {:>12.1} {:>9} {:>6} {:>8}  {}/{}/{}",
            j.job_id,
            j.job_name,
            j.state,
            workers,
            j.reports,
            j.last_global_step,
            j.mean_samples_per_second,
            j.peak_memory_bytes >> 20,
            gpu_pct,
            gpu_mib,
            j.plan_version,
            j.acked_version,
            j.reached_version
        );
        if !j.gpu_processes.is_empty() {
            let each: Vec<String> = j
                .gpu_processes
                .iter()
                .map(|p| {
                    format!(
                        "{}-{} {:.0}% {} MiB",
                        p.role,
                        p.index,
                        p.utilisation_pct,
                        p.memory_bytes >> 20
                    )
                })
                .collect();
            println!("      gpu: {}", each.join(", "));
        }
    }
}

fn print_shape(s: &pb::JobShape) {
    let res = |r: &Option<proto::jobmaster::v1::Resources>| {
        r.as_ref().map_or("-".to_string(), |r| {
            format!(
                "{}m cpu, {} MiB{}",
                r.cpu_millicores,
                r.memory_bytes >> 20,
                if r.gpu_milli > 0 {
                    format!(", {} gpu", vocab::Gpus::from_milli(r.gpu_milli))
                } else {
                    String::new()
                }
            )
        })
    };
    println!(
        "{} job: {} workers (min {}, max {}, node unit {}) of {}",
        s.kind,
        s.workers,
        s.min_workers,
        s.max_workers,
        s.worker_node_unit,
        res(&s.worker_resources)
    );
    if s.ps > 0 {
        println!("  {} ps of {}", s.ps, res(&s.ps_resources));
    }
    for r in &s.services {
        println!(
            "  {} {} ({}, min {}, max {}) of {}",
            r.count,
            r.role,
            r.topology,
            r.min,
            r.max,
            res(&r.resources)
        );
    }
    println!("  {} samples to train", s.total_samples);
}

/// A job id, or a name looked up among the brain's jobs.
async fn job_id(c: &mut Client, job: &str) -> Result<u64, tonic::Status> {
    if let Ok(id) = job.parse() {
        return Ok(id);
    }
    let jobs = c.list_jobs(pb::ListJobsRequest {}).await?.into_inner().jobs;
    jobs.iter()
        .find(|j| j.job_name == job)
        .map(|j| j.job_id)
        .ok_or_else(|| tonic::Status::not_found(format!("no job named {job:?}")))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Offline commands (whatif, trace, train, certs) talk to no brain: nothing to check.
    let tls = if cli.command.talks_to_a_brain() {
        brain_tls(&cli)?
    } else {
        None
    };
    LINK.set(Link {
        token_file: cli.token_file.clone(),
        tls,
    })
    .unwrap_or_else(|_| unreachable!("set once, before any call"));
    match cli.command {
        Command::Jobs { brain } => {
            let jobs = ask_brain(&brain, async |mut c| {
                Ok(c.list_jobs(pb::ListJobsRequest {}).await?.into_inner().jobs)
            })?;
            print_jobs(&jobs);
            Ok(())
        }
        Command::Status { job, brain } => {
            let record = ask_brain(&brain, async |mut c| {
                let id = job_id(&mut c, &job).await?;
                Ok(c.get_job(pb::GetJobRequest { job_id: id })
                    .await?
                    .into_inner())
            })?;
            print_jobs(std::slice::from_ref(&record));
            if let Some(shape) = &record.shape {
                print_shape(shape);
            }
            if !record.reasons.is_empty() {
                println!("sized by the brain because:");
                for r in &record.reasons {
                    println!("  - {r}");
                }
            }
            println!(
                "master: {}",
                if record.master_address.is_empty() {
                    "(not started)"
                } else {
                    &record.master_address
                }
            );
            if !record.run_dir.is_empty() {
                println!("run directory: {}", record.run_dir);
            }
            println!("samples trained: {}", record.samples_done);
            if !record.outcome.is_empty() {
                println!("outcome: {}", record.outcome);
            }
            Ok(())
        }
        Command::Diagnose { job, all, brain } => {
            let text = ask_brain(&brain, async |mut c| {
                let job_id = job_id(&mut c, &job).await?;
                Ok(c.diagnose(pb::DiagnoseRequest { job_id, all })
                    .await?
                    .into_inner()
                    .text)
            })?;
            print!("{text}");
            Ok(())
        }
        Command::Submit { spec, brain, wait } => {
            let text = std::fs::read_to_string(&spec)
                .with_context(|| format!("reading {}", spec.display()))?;
            let origin = spec.display().to_string();
            let answer = ask_brain(&brain, async |mut c| {
                Ok(c.submit_job(pb::SubmitJobRequest {
                    spec_yaml: text,
                    origin,
                })
                .await?
                .into_inner())
            })?;
            println!("job {} {}", answer.job_id, answer.state);
            if let Some(shape) = &answer.shape {
                print_shape(shape);
            }
            for r in &answer.reasons {
                println!("  - {r}");
            }
            if !wait {
                return Ok(());
            }
            let id = answer.job_id;
            let mut last = String::new();
            loop {
                let record = ask_brain(&brain, async |mut c| {
                    Ok(c.get_job(pb::GetJobRequest { job_id: id })
                        .await?
                        .into_inner())
                })?;
                let line = format!(
                    "{} workers {} samples {}/{}",
                    record.state,
                    record.shape.as_ref().map_or(0, |s| s.workers),
                    record.samples_done,
                    record.shape.as_ref().map_or(0, |s| s.total_samples)
                );
                if line != last {
                    println!("{line}");
                    last = line;
                }
                match record.state.as_str() {
                    "succeeded" => {
                        println!("{}", record.outcome);
                        return Ok(());
                    }
                    "failed" => bail!("job {id} failed: {}", record.outcome),
                    _ => std::thread::sleep(std::time::Duration::from_secs(1)),
                }
            }
        }
        Command::Plan { dry_run, brain } => {
            if !dry_run {
                bail!(
                    "the brain dispatches plans itself every round; `brainctl plan --dry-run` \
                     shows what the next one would decide"
                );
            }
            let r = ask_brain(&brain, async |mut c| {
                Ok(c.dry_run(pb::DryRunRequest {}).await?.into_inner())
            })?;
            println!(
                "scheduler {}: {:.1} of {:.1} CPUs, {} of {} processes after the round (solved in {:.2} ms)",
                r.scheduler,
                r.cpu_millicores as f64 / 1000.0,
                r.capacity_millicores as f64 / 1000.0,
                r.processes,
                r.max_processes,
                r.solve_ms
            );
            for note in &r.notes {
                println!("note: {note}");
            }
            for d in &r.decisions {
                let corrected =
                    d.ps != d.to_ps || !d.migrations.is_empty() || !d.role_targets.is_empty();
                let change = if d.from_workers == d.to_workers && corrected {
                    "corrects".to_string()
                } else if d.from_workers == d.to_workers {
                    "keeps".to_string()
                } else if d.state == "queued" && d.to_workers > 0 {
                    "starts".to_string()
                } else if d.state == "queued" {
                    "waits".to_string()
                } else {
                    "resizes".to_string()
                };
                println!(
                    "{:>4} {:<24} {:<8} {change} {} -> {} workers{} (predicted {:.0} samples/s)",
                    d.job_id,
                    d.job_name,
                    d.state,
                    d.from_workers,
                    d.to_workers,
                    match (d.ps, d.to_ps) {
                        (0, 0) => String::new(),
                        (a, b) if a == b => format!(" + {a} ps"),
                        (a, b) => format!(" + {a} -> {b} ps"),
                    },
                    d.predicted_samples_per_second
                );
                for m in &d.migrations {
                    let r = m.resources.clone().unwrap_or_default();
                    println!(
                        "       migrates {}-{} to {}m CPU, {} MiB ({})",
                        if m.role == "ps" { "ps" } else { "worker" },
                        m.index,
                        r.cpu_millicores,
                        r.memory_bytes >> 20,
                        m.reason
                    );
                }
                for t in &d.role_targets {
                    println!("       resizes role {} to {}", t.role, t.count);
                }
                for why in &d.reasons {
                    println!("       - {why}");
                }
            }
            Ok(())
        }
        Command::Scale {
            job,
            workers,
            ps,
            roles,
            reason,
            brain,
        } => {
            let targets =
                vocab::role::role_targets(workers, ps, &roles).map_err(anyhow::Error::msg)?;
            if targets.is_empty() {
                bail!("say what to change: --workers N, --ps M and/or --role NAME=N");
            }
            let roles: Vec<_> = targets
                .into_iter()
                .map(|(role, count)| proto::jobmaster::v1::RoleTarget {
                    role: role.to_string(),
                    count,
                    resources: None,
                })
                .collect();
            let version = ask_brain(&brain, async |mut c| {
                let id = job_id(&mut c, &job).await?;
                Ok(c.propose_plan(pb::ProposePlanRequest {
                    job_id: id,
                    roles,
                    migrations: Vec::new(),
                    reason,
                })
                .await?
                .into_inner()
                .version)
            })?;
            println!(
                "plan {version} proposed for {job}; its job master takes it at its next poll \
                 (`brainctl status {job}` shows the plan reached)"
            );
            Ok(())
        }
        Command::Cancel { job, reason, brain } => {
            let state = ask_brain(&brain, async |mut c| {
                let id = job_id(&mut c, &job).await?;
                Ok(c.cancel_job(pb::CancelJobRequest { job_id: id, reason })
                    .await?
                    .into_inner()
                    .state)
            })?;
            if state == "cancelled" {
                println!("{job} cancelled before it started");
            } else {
                println!(
                    "{job} is being cancelled: its job master takes a last checkpoint and stops \
                     every process at its next poll (`brainctl status {job}` shows it end)"
                );
            }
            Ok(())
        }
        Command::Train(args) => train::train(args),
        Command::Nodes { action, brain } => nodes_cmd::nodes(action, &brain),
        Command::Policy { action } => match action {
            PolicyAction::Show { brain } => {
                let p = ask_brain(&brain, async |mut c| {
                    Ok(c.get_policy(pb::GetPolicyRequest {}).await?.into_inner())
                })?;
                if p.path.is_empty() {
                    println!("# no policy file: the defaults are in force");
                } else {
                    println!("# {}", p.path);
                }
                print!("{}", p.toml);
                Ok(())
            }
            PolicyAction::Set { file, brain } => {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                optimizer::config::PolicyConfig::from_toml(&text)
                    .with_context(|| format!("{} is not a valid policy", file.display()))?;
                let p = ask_brain(&brain, async |mut c| {
                    Ok(c.set_policy(pb::PolicyText {
                        toml: text,
                        path: String::new(),
                    })
                    .await?
                    .into_inner())
                })?;
                println!("policy set: written to {}", p.path);
                Ok(())
            }
        },
        Command::Whatif(args) => whatif_cmd::whatif(*args),
        Command::Trace { action } => trace_cmd::trace(action),
        Command::Certs { out, hosts } => certs(&out, &hosts),
    }
}

/// `brainctl certs`: the files, and the configuration that uses them.
fn certs(out: &std::path::Path, hosts: &[String]) -> anyhow::Result<()> {
    use auth::tls::*;
    let written = auth::tls::make(out, hosts)?;
    for f in &written {
        println!("wrote {}", f.display());
    }
    let p = |f: &str| out.join(f).display().to_string();
    println!(
        "\nIn the brain's configuration (brain --config FILE):\n\n\
         [tls]\ncert_file = {:?}\nkey_file = {:?}\n\
         # mutual TLS: every client presents a certificate this CA signed\n\
         client_ca_file = {:?}\n\n\
         [launcher.tls]  # how the job masters the brain starts reach it\n\
         ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n\n\
         brainctl: --ca {} (mutual TLS: --tls-cert {} --tls-key {})\n\
         job-master run --brain URL: --brain-ca {} (--brain-cert {} --brain-key {})",
        p(SERVER_CERT),
        p(SERVER_KEY),
        p(CA_CERT),
        p(CA_CERT),
        p(CLIENT_CERT),
        p(CLIENT_KEY),
        p(CA_CERT),
        p(CLIENT_CERT),
        p(CLIENT_KEY),
        p(CA_CERT),
        p(CLIENT_CERT),
        p(CLIENT_KEY),
    );
    Ok(())
}
