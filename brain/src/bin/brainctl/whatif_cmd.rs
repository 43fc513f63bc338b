//! `brainctl whatif`: traces replayed under policies on a simulated cluster, side by side.

use std::path::PathBuf;

use anyhow::bail;
use brain::whatif;
use indicatif::{ProgressBar, ProgressStyle};
use optimizer::sim::engine::{FaultHandling, Handling, NodeFailures, Slowdowns};
use optimizer::sim::{CheckpointModel, ClusterSpec, SimConfig};

#[derive(clap::Args)]
pub struct WhatifArgs {
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
    /// The name of each policy's row, in the order of the --policy flags (default: its file's
    /// name without `.toml`; two policies may not share a name).
    #[arg(long = "label", value_name = "NAME")]
    labels: Vec<String>,
    /// Seconds of simulated time between scheduling rounds.
    #[arg(long, default_value_t = 60.0)]
    round_s: f64,
    /// Seconds a job makes no progress after its allocation changes.
    #[arg(long, default_value_t = 30.0)]
    restart_penalty_s: f64,
    /// Stop the replay at this simulated time; later jobs count as unfinished.
    #[arg(long)]
    max_time_s: Option<f64>,
    /// Refuse traces with arrivals later than this many seconds after their start (a typo such
    /// as 1e30 would otherwise replay as a job that never ran).
    #[arg(long, default_value_t = datasets::limits::DEFAULT_HORIZON_S)]
    horizon_s: f64,
    /// Seed of every random draw; the same inputs and seed give the same results.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Directory for the results: jobs (each finished job's JCT in parts among its columns),
    /// rounds and summary as Parquet and CSV, bound (the lower bound and each policy over it)
    /// and account (where each policy's distance to the bound goes) likewise, and the charts
    /// jct_cdf.svg and utilisation.svg (several traces: one utilisation-TRACE.svg each).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Simulations at once (default: the cores available).
    #[arg(long)]
    jobs: Option<usize>,
    /// Replay through the live brain's own round around each policy's scheduler (its cool-down,
    /// minimum sizes and capacity repair, with the policy file's [live] settings), as the
    /// brain would decide; the cluster must then have one GPU type.
    #[arg(long)]
    live_round: bool,
    /// Replay Philly job lists row by row, in memory that follows the jobs in the system and
    /// not the trace's length (a million-job list: see `brainctl trace philly-like`). The
    /// rows must be in order of submission. With --out, the jobs and rounds tables (CSV and
    /// Parquet) are written as the replay goes (each replay's jobs in the order they finished;
    /// no charts), and the summary at the end. The median and p99 JCT come from a
    /// quantile sketch, within 0.1 % of the exact figures; the others are exact.
    #[arg(long)]
    stream: bool,
    /// Also find the offline plan of each trace (small traces: tens of jobs, a few nodes): the
    /// best schedule that never resizes a job, with every arrival known in advance, from a
    /// time-indexed model in slots of this many seconds (a multiple of --round-s), solved
    /// exactly when it is small enough, replayed; printed beside the lower bound, with each
    /// policy's distance to the bound split at it (docs/whatif.md, "How tight the bound is").
    #[arg(long, value_name = "SECONDS")]
    offline_slot_s: Option<f64>,
    /// The largest offline model (in variables) also solved exactly by branch and bound; a
    /// larger one is only relaxed and rounded. Branch and bound can take long: 17–33 s for
    /// 5,234 variables and 5 min for 7,491 were measured (docs/whatif.md).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3000,
        requires = "offline_slot_s"
    )]
    offline_exact_variables: usize,
    /// The largest offline model (in variables) built at all; a larger one is refused with its
    /// size.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 60_000,
        requires = "offline_slot_s"
    )]
    offline_max_variables: usize,
    #[command(flatten)]
    faults: FaultArgs,
}

/// Faults injected into the replays, and how they are handled (docs/faults.md, "In the
/// what-if"). Without --faults, --node-mtbf-s, --gpu-mtbf-s or --slowdown-mtbs-s nothing fails.
#[derive(clap::Args)]
#[command(next_help_heading = "Faults")]
struct FaultArgs {
    /// A fault trace: crashes, hangs and slowdowns at set times on set nodes, besides any
    /// drawn at random (CSV `time_s,node,kind,seconds,factor`; kind crash, hang or slow; node
    /// by its position in --cluster, from 0; factor for slow only).
    #[arg(long, value_name = "CSV")]
    faults: Option<PathBuf>,
    /// Mean seconds between failures of each node (default: nodes never fail).
    #[arg(long, conflicts_with = "gpu_mtbf_s")]
    node_mtbf_s: Option<f64>,
    /// Mean seconds between failures of each GPU: a node fails as often as its GPUs together.
    /// Meta's 419 interruptions in 54 days on 16,384 GPUs is 1.82e8.
    #[arg(long)]
    gpu_mtbf_s: Option<f64>,
    /// Seconds a failed node stays down.
    #[arg(long, default_value_t = 3600.0)]
    node_repair_s: f64,
    /// Share of failures whose jobs hang in a collective instead of exiting, in [0, 1].
    #[arg(long, default_value_t = 0.0)]
    hang_share: f64,
    /// Mean seconds between slowdowns of each node (default: nodes never slow down).
    #[arg(long)]
    slowdown_mtbs_s: Option<f64>,
    /// A slowed node's speed, in (0, 1).
    #[arg(long, default_value_t = 0.5)]
    slowdown_factor: f64,
    /// Seconds a slowdown lasts.
    #[arg(long, default_value_t = 3600.0)]
    slowdown_s: f64,
    /// detect: hangs found by the step clock, slow nodes found and isolated (Brain's); wait:
    /// hangs last until the collective's timeout, slow nodes are kept; both: each policy's
    /// replays under each, side by side (rows POLICY/detect and POLICY/wait).
    #[arg(long, value_enum, default_value_t = HandlingArg::Detect)]
    fault_handling: HandlingArg,
    /// Seconds until a failed node's crash is noticed (the job master's heartbeat timeout).
    #[arg(long, default_value_t = 10.0)]
    crash_detect_s: f64,
    /// Seconds until a hang is found by the step clock (`hang_min_s` and the stacks' capture).
    #[arg(long, default_value_t = 125.0)]
    hang_detect_s: f64,
    /// Seconds a hang lasts with nobody looking: the collective's own timeout (NCCL: 30 min).
    #[arg(long, default_value_t = 1800.0)]
    hang_timeout_s: f64,
    /// Seconds until a slow node is found a straggler (two one-second reports).
    #[arg(long, default_value_t = 2.0)]
    straggler_detect_s: f64,
    /// Seconds of training between two checkpoints of each training job: a failure then
    /// throws away the training since its last one (counted per job in `lost_training_s` and
    /// in the table's `lost train s`). Without it, a failure loses no work.
    #[arg(long, value_name = "SECONDS")]
    checkpoint_every_s: Option<f64>,
    /// Seconds each checkpoint stops training: the whole write for a synchronous save, the
    /// memory copy for a flash checkpoint (docs/checkpoints.md has both, measured).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 0.0,
        requires = "checkpoint_every_s"
    )]
    checkpoint_save_s: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum HandlingArg {
    Detect,
    Wait,
    Both,
}

impl FaultArgs {
    /// The simulator's fault settings on `cluster`, and the handlings to replay under.
    fn config(&self, sim: &mut SimConfig, cluster: &ClusterSpec) -> anyhow::Result<Vec<Handling>> {
        if let Some(path) = &self.faults {
            sim.faults = datasets::faults::read_faults(path, cluster.nodes.len())?;
        }
        let mtbf = self
            .node_mtbf_s
            .map(|m| (m, false))
            .or(self.gpu_mtbf_s.map(|m| (m, true)));
        sim.node_failures = mtbf.map(|(mtbf_s, per_gpu)| NodeFailures {
            mtbf_s,
            repair_s: self.node_repair_s,
            per_gpu,
            hang_share: self.hang_share,
        });
        sim.slowdowns = self.slowdown_mtbs_s.map(|mtbs_s| Slowdowns {
            mtbs_s,
            factor: self.slowdown_factor,
            duration_s: self.slowdown_s,
        });
        sim.checkpoint = self.checkpoint_every_s.map(|every_s| CheckpointModel {
            every_s,
            save_s: self.checkpoint_save_s,
        });
        sim.fault_handling = FaultHandling {
            handling: Handling::DetectAndIsolate,
            crash_detect_s: self.crash_detect_s,
            hang_detect_s: self.hang_detect_s,
            hang_timeout_s: self.hang_timeout_s,
            straggler_detect_s: self.straggler_detect_s,
        };
        Ok(match self.fault_handling {
            HandlingArg::Detect => vec![Handling::DetectAndIsolate],
            HandlingArg::Wait => vec![Handling::WaitForCrash],
            HandlingArg::Both => vec![Handling::DetectAndIsolate, Handling::WaitForCrash],
        })
    }
}

pub fn whatif(args: WhatifArgs) -> anyhow::Result<()> {
    let WhatifArgs {
        traces: trace_paths,
        format,
        profiles,
        cluster,
        policies,
        labels,
        round_s,
        restart_penalty_s,
        faults,
        max_time_s,
        horizon_s,
        seed,
        out,
        jobs,
        live_round,
        stream,
        offline_slot_s,
        offline_exact_variables,
        offline_max_variables,
    } = args;
    let cluster = ClusterSpec::parse(&cluster)?;
    let mut sim = SimConfig {
        round_s,
        restart_penalty_s,
        seed,
        max_time_s,
        ..SimConfig::default()
    };
    let handlings = faults.config(&mut sim, &cluster)?;
    sim.validate()?;
    if let Some(slot_s) = offline_slot_s {
        optimizer::sim::offline::OfflineOptions {
            slot_s,
            max_variables: offline_max_variables,
            max_exact_variables: offline_exact_variables,
        }
        .validate(&sim)?;
        if stream {
            bail!("--offline-slot-s is for small traces in memory, not with --stream");
        }
    }
    let policies = labelled(&policies, &labels, live_round)?;
    let policies = whatif::with_handlings(&policies, &handlings);
    if !(horizon_s.is_finite() && horizon_s > 0.0) {
        bail!("--horizon-s is {horizon_s}, expected a number of seconds > 0");
    }
    let parallel =
        jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if stream {
        if profiles.is_some() {
            bail!(
                "--profiles is not read with --stream: it replays Philly job lists, which need none"
            );
        }
        let options = whatif::Options {
            cluster,
            sim,
            parallel,
        };
        return whatif_streamed(&trace_paths, format, &policies, &options, horizon_s, out);
    }
    let traces = whatif::load_traces(&trace_paths, format)?;
    let profiles = whatif::profiles_for(&traces, profiles.as_deref())?;
    whatif::check_traces(&traces, &whatif::limits(&cluster, &profiles, horizon_s))?;
    let total: u64 =
        traces.iter().map(|t| t.jobs.len() as u64).sum::<u64>() * policies.len() as u64;
    let bar = jobs_bar(total);
    let options = whatif::Options {
        cluster,
        sim,
        parallel,
    };
    let on_done = |n: u64| bar.inc(n);
    let results = whatif::run(&traces, &profiles, &policies, &options, &on_done)?;
    bar.finish();
    let bound = whatif::bound(&traces, &profiles, &options)?;
    // Found before anything is printed: a model too large prints no half report.
    let offline = match offline_slot_s {
        Some(slot_s) => {
            let o = optimizer::sim::offline::OfflineOptions {
                slot_s,
                max_variables: offline_max_variables,
                max_exact_variables: offline_exact_variables,
            };
            Some(whatif::offline(&traces, &profiles, &options, &o)?)
        }
        None => None,
    };
    print!("{}", whatif::render_table(&results));
    print!("\n{}", whatif::render_bound(&results, &bound));
    print!("\n{}", whatif::render_account(&results, &bound));
    if let Some(o) = &offline {
        print!("\n{}", whatif::render_offline(&results, &bound, o));
    }
    say_err!("{}", whatif::render_timing(&results));
    if let Some(dir) = out {
        let mut written = whatif::write_outputs(&dir, &results)?;
        written.extend(whatif::write_bound(&dir, &results, &bound)?);
        written.extend(whatif::write_account(&dir, &results, &bound)?);
        if let Some(o) = &offline {
            written.extend(whatif::write_offline(&dir, &bound, o)?);
        }
        written.extend(brain::plots::draw(&dir, &results)?);
        for path in written {
            say_err!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The policies, each named by its --label or its file's name; two of one name are refused.
fn labelled(
    paths: &[PathBuf],
    labels: &[String],
    live_round: bool,
) -> anyhow::Result<Vec<whatif::NamedPolicy>> {
    if !labels.is_empty() && labels.len() != paths.len() {
        bail!(
            "{} --label for {} --policy: give one label per policy, in the same order",
            labels.len(),
            paths.len()
        );
    }
    let mut policies = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let mut p = whatif::load_policy(path, live_round)?;
        if let Some(label) = labels.get(i) {
            if label.trim().is_empty() {
                bail!("--label {}: a row's name may not be empty", i + 1);
            }
            p.label = label.clone();
        }
        if let Some(j) = policies
            .iter()
            .position(|q: &whatif::NamedPolicy| q.label == p.label)
        {
            bail!(
                "two policies would both be named {:?} ({} and {}): name them with --label, one \
                 per --policy",
                p.label,
                paths[j].display(),
                path.display()
            );
        }
        policies.push(p);
    }
    Ok(policies)
}

/// Progress over `total` jobs: a bar on a terminal; elsewhere (a log, CI) a line at every
/// tenth of the way, so that a long replay shows it is alive.
enum Progress {
    Bar(ProgressBar),
    Lines {
        total: u64,
        done: std::sync::atomic::AtomicU64,
        started: std::time::Instant,
    },
}

impl Progress {
    fn inc(&self, n: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        match self {
            Progress::Bar(bar) => bar.inc(n),
            Progress::Lines {
                total,
                done,
                started,
            } => {
                let before = done.fetch_add(n, Relaxed);
                let tenth = |x: u64| x * 10 / (*total).max(1);
                if tenth(before + n) > tenth(before) {
                    say_err!(
                        "whatif: {}/{total} jobs finished ({} %), {:.0} s",
                        before + n,
                        (before + n) * 100 / (*total).max(1),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        }
    }

    fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// Progress over `total` jobs (see [`Progress`]).
fn jobs_bar(total: u64) -> Progress {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return Progress::Lines {
            total,
            done: Default::default(),
            started: std::time::Instant::now(),
        };
    }
    Progress::Bar(
        ProgressBar::new(total).with_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} jobs finished ({eta} left)",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        ),
    )
}

/// `--stream`: job lists checked, then replayed, row by row.
fn whatif_streamed(
    trace_paths: &[PathBuf],
    format: whatif::TraceFormat,
    policies: &[whatif::NamedPolicy],
    options: &whatif::Options,
    horizon_s: f64,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let limits = whatif::limits(&options.cluster, &[], horizon_s);
    let checking = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{elapsed_precise} checking the traces: {pos} jobs")
            .expect("a valid template"),
    );
    let traces = whatif::check_streamed(trace_paths, format, &limits, &|n| checking.inc(n))?;
    checking.finish_and_clear();
    let total = traces.iter().map(|t| t.jobs).sum::<u64>() * policies.len() as u64;
    let outputs = out
        .as_deref()
        .map(whatif::StreamOutputs::create)
        .transpose()?;
    let bar = jobs_bar(total);
    let on_done = |n: u64| bar.inc(n);
    let replayed = whatif::run_streamed(
        &traces,
        &limits,
        policies,
        options,
        outputs.as_ref(),
        &on_done,
    );
    bar.finish();
    let results = match replayed {
        Ok(results) => results,
        Err(e) => {
            let Some(outputs) = outputs else {
                return Err(e.into());
            };
            let removed: Vec<String> = outputs
                .abandon()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            return Err(anyhow::Error::from(e).context(format!(
                "the replay stopped; the tables it had begun are removed ({})",
                removed.join(", ")
            )));
        }
    };
    print!("{}", whatif::render_table(&results));
    say!(
        "median and p99 JCT: from a quantile sketch, within {} % of the exact figures (--stream)",
        100.0 * optimizer::sim::SKETCH_ACCURACY
    );
    say_err!("{}", whatif::render_timing(&results));
    if let (Some(dir), Some(outputs)) = (out, outputs) {
        let mut written = outputs.finish()?;
        written.extend(whatif::write_summary(&dir, &results)?);
        for path in written {
            say_err!("wrote {}", path.display());
        }
    }
    Ok(())
}
