//! `brainctl`: the operator's command line.

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
    about = "Operate Brain: look at the jobs a brain runs, and replay traces under policies \
             before they touch a cluster."
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
    /// Show one job of a running brain.
    Status {
        /// The job's id (from `brainctl jobs`).
        job: u64,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
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
        "{:>4}  {:<24} {:>8} {:>12} {:>12} {:>12}  plan (newest/accepted/reached)",
        "id", "name", "reports", "last step", "samples/s", "peak MiB"
    );
    for j in jobs {
        println!(
            "{:>4}  {:<24} {:>8} {:>12} {:>12.1} {:>12}  {}/{}/{}",
            j.job_id,
            j.job_name,
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
                Ok(c.get_job(pb::GetJobRequest { job_id: job })
                    .await?
                    .into_inner())
            })?;
            print_jobs(std::slice::from_ref(&record));
            println!("master: {}", record.master_address);
            Ok(())
        }
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
