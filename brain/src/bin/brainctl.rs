//! `brainctl`: the operator's command line.
//!
//! Its doc comments are `--help` texts, where `[live]` names a TOML table, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;

use anyhow::{Context, bail};
use brain::whatif;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use optimizer::sim::{ClusterSpec, SimConfig};
use proto::service::v1 as pb;
use proto::service::v1::brain_client::BrainClient;

#[derive(Parser)]
#[command(
    name = "brainctl",
    version,
    about = "Operate Brain: submit jobs without resources, look at what a brain runs and \
             would do, set its policy, and replay traces under policies before they touch a \
             cluster."
)]
struct Cli {
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
    /// Fit the job-profile model on the brain's finished jobs and store it in its database (the
    /// brain sizes submitted jobs' memory with it from then on); with --evaluate, score it
    /// against DLRover's rule, the user's request and the global median on a time-ordered
    /// split of that history and of Alibaba's 2023 and 2025 GPU traces.
    Train {
        /// Score instead of storing.
        #[arg(long)]
        evaluate: bool,
        /// The brain's database.
        #[arg(long, default_value = "brain-data/brain.db")]
        database: PathBuf,
        /// Folder holding alibaba_gpu_v2023/ and alibaba_gpu_v2025/ (for --evaluate)
        /// [default: the nearest shared/data above this directory].
        #[arg(long)]
        data: Option<PathBuf>,
        /// Share of the jobs (the earliest) the model is fitted on.
        #[arg(long, default_value_t = 0.7)]
        train_share: f64,
        /// Share of jobs the model's margin covers (1 − the under-provisioning it aims at).
        #[arg(long, default_value_t = 0.95)]
        quantile: f64,
        /// Histories to score with --evaluate (repeat for more) [default: all three].
        #[arg(long = "history", value_enum, value_name = "HISTORY")]
        histories: Vec<brain::train::HistoryKind>,
    },
    /// Show or set the operator's policy of a running brain (TOML: [scheduler], [live]
    /// interval_s and cooldown_s, [allocation], [[heuristics]]).
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Replay job traces on a simulated cluster under each policy, side by side.
    ///
    /// Every trace is replayed under every policy (one simulation per core); the table shows,
    /// per policy, the jobs of all traces pooled. Traces are workload CSVs in Pollux's and Sia's
    /// format (`name,time,application,num_replicas,batch_size`), whose jobs train applications
    /// known by their profiles (directories of measured step times and training curves, as in
    /// Pollux's `traces/`), or Philly job lists (`timestamp,duration,num_gpus,gpu_time,cluster`),
    /// whose jobs run for their duration on exactly the GPUs they asked for.
    Whatif {
        /// A trace CSV, or a directory of them; repeat for more.
        #[arg(long = "trace", required = true, value_name = "PATH")]
        traces: Vec<PathBuf>,
        /// The traces' format.
        #[arg(long, value_enum, default_value_t = whatif::TraceFormat::Auto)]
        format: whatif::TraceFormat,
        /// Directory of application profiles (default: the nearest `traces/` beside the trace's
        /// directory or its parents;
        /// not needed for Philly job lists).
        #[arg(long, value_name = "DIR")]
        profiles: Option<PathBuf>,
        /// The simulated cluster: NODESxGPUS:TYPE, comma-separated for several kinds.
        #[arg(long, default_value = "16x4:t4")]
        cluster: String,
        /// A policy file with a `[scheduler]` table (see examples/policies); repeat to compare.
        #[arg(long = "policy", required = true, value_name = "TOML")]
        policies: Vec<PathBuf>,
        /// Seconds of simulated time between scheduling rounds.
        #[arg(long, default_value_t = 60.0)]
        round_s: f64,
        /// Seconds a job makes no progress after its allocation changes.
        #[arg(long, default_value_t = 30.0)]
        restart_penalty_s: f64,
        /// Mean seconds between failures of a node (default: nodes never fail).
        #[arg(long)]
        node_mtbf_s: Option<f64>,
        /// Seconds a failed node stays down.
        #[arg(long, default_value_t = 3600.0)]
        node_repair_s: f64,
        /// Stop the replay at this simulated time; later jobs count as unfinished.
        #[arg(long)]
        max_time_s: Option<f64>,
        /// Seed of every random draw; the same inputs and seed give the same results.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Directory for the results: jobs, rounds and summary as Parquet and CSV, and the
        /// charts jct_cdf.svg and utilisation.svg.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Simulations at once (default: the cores available).
        #[arg(long)]
        jobs: Option<usize>,
    },
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

/// Asks a running brain, on a runtime of its own (the rest of brainctl is synchronous).
fn ask_brain<T>(
    address: &str,
    f: impl AsyncFnOnce(BrainClient<tonic::transport::Channel>) -> Result<T, tonic::Status>,
) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = BrainClient::connect(address.to_string())
            .await
            .with_context(|| format!("connecting to the brain at {address}"))?;
        f(client)
            .await
            .map_err(|s| anyhow::anyhow!("the brain answered {:?}: {}", s.code(), s.message()))
    })
}

fn print_jobs(jobs: &[pb::JobRecord]) {
    println!(
        "{:>4}  {:<24} {:<9} {:>7} {:>8} {:>12} {:>12} {:>9}  plan (newest/accepted/reached)",
        "id", "name", "state", "workers", "reports", "last step", "samples/s", "peak MiB"
    );
    for j in jobs {
        let workers = j.shape.as_ref().map_or("-".to_string(), |s| {
            if s.ps > 0 {
                format!("{}+{}ps", s.workers, s.ps)
            } else {
                s.workers.to_string()
            }
        });
        println!(
            "{:>4}  {:<24} {:<9} {:>7} {:>8} {:>12} {:>12.1} {:>9}  {}/{}/{}",
            j.job_id,
            j.job_name,
            j.state,
            workers,
            j.reports,
            j.last_global_step,
            j.mean_samples_per_second,
            j.peak_memory_bytes >> 20,
            j.plan_version,
            j.acked_version,
            j.reached_version
        );
    }
}

fn print_shape(s: &pb::JobShape) {
    let res = |r: &Option<proto::jobmaster::v1::Resources>| {
        r.as_ref().map_or("-".to_string(), |r| {
            format!(
                "{}m cpu, {} MiB{}",
                r.cpu_millicores,
                r.memory_bytes >> 20,
                if r.gpus > 0 {
                    format!(", {} gpu", r.gpus)
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
    println!("  {} samples to train", s.total_samples);
}

/// A job id, or a name looked up among the brain's jobs.
async fn job_id(
    c: &mut BrainClient<tonic::transport::Channel>,
    job: &str,
) -> Result<u64, tonic::Status> {
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
    match Cli::parse().command {
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
                let change = if d.from_workers == d.to_workers {
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
                    if d.ps > 0 {
                        format!(" + {} ps", d.ps)
                    } else {
                        String::new()
                    },
                    d.predicted_samples_per_second
                );
                for why in &d.reasons {
                    println!("       - {why}");
                }
            }
            Ok(())
        }
        Command::Train {
            evaluate,
            database,
            data,
            train_share,
            quantile,
            histories,
        } => {
            if !(0.1..=0.9).contains(&train_share) {
                bail!("--train-share {train_share}: expected 0.1 to 0.9");
            }
            let store = if database.exists() {
                Some(brain::store::Store::open(&database)?)
            } else {
                None
            };
            let own = match &store {
                Some(s) => brain::train::from_store(&s.jobs()?),
                None => Vec::new(),
            };
            if !evaluate {
                let Some(mut store) = store else {
                    bail!("no brain database at {}", database.display());
                };
                let model = optimizer::profile::LearnedModel::fit(
                    &{
                        let mut v = own;
                        v.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
                        v
                    },
                    quantile,
                )
                .with_context(|| {
                    format!("fitting on the finished jobs of {}", database.display())
                })?;
                let body = serde_json::to_string(&model)?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_millis() as i64;
                store.save_model(brain::train::MODEL_NAME, &body, now)?;
                println!(
                    "job-profile model fitted on {} finished jobs, margin for {:.0} % of jobs; stored in {}",
                    model.trained_on,
                    quantile * 100.0,
                    database.display()
                );
                return Ok(());
            }
            use brain::train::HistoryKind;
            let histories = if histories.is_empty() {
                vec![
                    HistoryKind::Own,
                    HistoryKind::Alibaba2023,
                    HistoryKind::Alibaba2025,
                ]
            } else {
                histories
            };
            let data = || -> anyhow::Result<PathBuf> {
                match &data {
                    Some(d) => Ok(d.clone()),
                    None => std::env::current_dir()?
                        .ancestors()
                        .map(|a| a.join("shared/data"))
                        .find(|p| p.join("alibaba_gpu_v2023").is_dir())
                        .context("no shared/data with alibaba_gpu_v2023/ above this directory: give --data DIR"),
                }
            };
            let mut own = Some(own);
            for h in histories {
                let (name, samples) = match h {
                    HistoryKind::Own => {
                        let own = own.take().unwrap_or_default();
                        if own.len() < 40 {
                            println!(
                                "own history ({}): {} finished jobs with metrics, too few to score (40 needed)\n",
                                database.display(),
                                own.len()
                            );
                            continue;
                        }
                        (format!("own history ({})", database.display()), own)
                    }
                    HistoryKind::Alibaba2023 => {
                        let f = data()?.join("alibaba_gpu_v2023/openb_pod_list_default.csv");
                        let s = brain::train::alibaba_2023(&f)
                            .with_context(|| f.display().to_string())?;
                        ("Alibaba GPU 2023 (openb pods)".to_string(), s)
                    }
                    HistoryKind::Alibaba2025 => {
                        let f = data()?.join("alibaba_gpu_v2025/disaggregated_DLRM_trace.csv");
                        let s = brain::train::alibaba_2025(&f)
                            .with_context(|| f.display().to_string())?;
                        ("Alibaba GPU 2025 (DLRM CPU/GPU-node roles)".to_string(), s)
                    }
                };
                let s = brain::train::score(&name, samples, train_share, quantile)?;
                println!("{}", brain::train::render(&s));
            }
            Ok(())
        }
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
        Command::Whatif {
            traces: trace_paths,
            format,
            profiles,
            cluster,
            policies,
            round_s,
            restart_penalty_s,
            node_mtbf_s,
            node_repair_s,
            max_time_s,
            seed,
            out,
            jobs,
        } => {
            let cluster = ClusterSpec::parse(&cluster)?;
            let sim = SimConfig {
                round_s,
                restart_penalty_s,
                node_failures: whatif::failures(node_mtbf_s, node_repair_s),
                seed,
                max_time_s,
            };
            sim.validate()?;
            let policies = policies
                .iter()
                .map(|p| whatif::load_policy(p))
                .collect::<Result<Vec<_>, _>>()?;
            let traces = whatif::load_traces(&trace_paths, format)?;
            let profiles_dir = match profiles {
                Some(p) => Some(p),
                None if whatif::applications(&traces).is_empty() => None,
                None => match whatif::default_profiles(&trace_paths[0]) {
                    Some(p) => Some(p),
                    None => bail!(
                        "no application profiles beside {}: give --profiles DIR",
                        trace_paths[0].display()
                    ),
                },
            };
            let profiles = match profiles_dir {
                Some(dir) => {
                    let names = whatif::applications(&traces);
                    datasets::pollux::read_apps_named(&dir, &names).with_context(|| {
                        format!("reading application profiles in {}", dir.display())
                    })?
                }
                None => Vec::new(),
            };
            let total: u64 =
                traces.iter().map(|t| t.jobs.len() as u64).sum::<u64>() * policies.len() as u64;
            let bar = ProgressBar::new(total).with_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:40}] {pos}/{len} jobs finished ({eta} left)",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            let parallel =
                jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let options = whatif::Options {
                cluster,
                sim,
                parallel,
            };
            let on_done = |n: u64| bar.inc(n);
            let results = whatif::run(&traces, &profiles, &policies, &options, &on_done)?;
            bar.finish_and_clear();
            print!("{}", whatif::render_table(&results));
            eprintln!("{}", whatif::render_timing(&results));
            if let Some(dir) = out {
                let mut written = whatif::write_outputs(&dir, &results)?;
                written.extend(brain::plots::draw(&dir, &results)?);
                for path in written {
                    eprintln!("wrote {}", path.display());
                }
            }
            Ok(())
        }
    }
}
