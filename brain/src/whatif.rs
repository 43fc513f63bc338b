//! `brainctl whatif`: replay traces under operators' policies, side by side.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use datasets::export::{Cell, TableWriter, Values, columns, write_table};
use datasets::limits::TraceLimits;
use optimizer::PolicyError;
use optimizer::config::PolicyConfig;
use optimizer::live::{LiveConfig, LiveRound};
use optimizer::schedule::{Assignment, Scheduler, SchedulerKind, Snapshot};
use optimizer::sim::engine::{NodeFailures, SimHooks};
use optimizer::sim::{
    AppProfile, ClusterSpec, JobRecord, ReplaySink, Report, RoundRecord, SimConfig, Summary,
    SummaryBuilder, TraceJob, Work, replay, simulate,
};

use crate::BrainError;

/// A policy file and the label its column carries (the file's stem).
#[derive(Clone, Debug)]
pub struct NamedPolicy {
    pub label: String,
    pub scheduler: SchedulerKind,
    /// Replay through the live brain's round around the scheduler, with this `[live]` pacing
    /// (`--live-round`); `None`: the scheduler alone, as a simulator would.
    pub live_round: Option<LiveConfig>,
}

/// Reads an operator's policy file; it must have a `[scheduler]` table. With `live_round`, the
/// replay goes through the live brain's round with the file's `[live]` pacing.
pub fn load_policy(path: &Path, live_round: bool) -> Result<NamedPolicy, BrainError> {
    let text = std::fs::read_to_string(path).map_err(|source| {
        BrainError::Data(datasets::DatasetError::Io {
            path: path.to_path_buf(),
            source,
        })
    })?;
    let config = PolicyConfig::from_toml(&text).map_err(|source| BrainError::Policy {
        path: path.to_path_buf(),
        source,
    })?;
    let scheduler = config.scheduler.ok_or_else(|| {
        BrainError::Config(format!(
            "{}: no [scheduler] table (e.g. `[scheduler]` then `kind = \"pollux\"`)",
            path.display()
        ))
    })?;
    let label = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| scheduler.name().to_string());
    Ok(NamedPolicy {
        label,
        scheduler,
        live_round: live_round.then_some(config.live),
    })
}

/// A trace by name (its file stem).
#[derive(Clone, Debug)]
pub struct NamedTrace {
    pub name: String,
    pub jobs: Vec<TraceJob>,
    /// The file it was read from, and as what.
    pub path: PathBuf,
    pub format: TraceFormat,
}

/// How a trace file is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// Each file by its header: `timestamp,duration,num_gpus,...` is a Philly job list,
    /// anything else a workload CSV.
    #[default]
    Auto,
    /// Pollux's and Sia's workload CSV (`name,time,application,num_replicas,batch_size`):
    /// training jobs, progress from application profiles.
    Workload,
    /// The Philly job list (`timestamp,duration,num_gpus,gpu_time,cluster`): rigid jobs that
    /// run for their duration on exactly their GPUs; no profiles needed.
    Philly,
}

impl TraceFormat {
    fn of(self, path: &Path) -> Result<TraceFormat, BrainError> {
        if self != TraceFormat::Auto {
            return Ok(self);
        }
        let io = |source| datasets::DatasetError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut first = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(std::fs::File::open(path).map_err(io)?),
            &mut first,
        )
        .map_err(io)?;
        let columns: Vec<&str> = first.trim().split(',').map(str::trim).collect();
        Ok(
            if columns.contains(&"timestamp") && columns.contains(&"num_gpus") {
                TraceFormat::Philly
            } else {
                TraceFormat::Workload
            },
        )
    }
}

/// The applications the training jobs of `traces` run, in order of first appearance.
pub fn applications(traces: &[NamedTrace]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for j in traces.iter().flat_map(|t| &t.jobs) {
        if let Work::Train { application, .. } = &j.work
            && !out.contains(&application.as_str())
        {
            out.push(application);
        }
    }
    out
}

/// The trace files `paths` name: a directory stands for the `*.csv` files in it, in name order.
pub fn trace_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, BrainError> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|source| datasets::DatasetError::Io {
                    path: p.clone(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "csv"))
                .collect();
            if inside.is_empty() {
                return Err(BrainError::Config(format!(
                    "{}: no .csv traces in the directory",
                    p.display()
                )));
            }
            inside.sort_by_key(|p| natural_key(p));
            files.extend(inside);
        } else {
            files.push(p.clone());
        }
    }
    Ok(files)
}

/// A trace's name: its file's stem.
fn stem(path: &Path) -> String {
    path.file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string()
}

/// Reads traces; a directory stands for the `*.csv` files in it, in name order.
pub fn load_traces(paths: &[PathBuf], format: TraceFormat) -> Result<Vec<NamedTrace>, BrainError> {
    trace_files(paths)?
        .iter()
        .map(|f| {
            let format = format.of(f)?;
            Ok(NamedTrace {
                name: stem(f),
                jobs: match format {
                    TraceFormat::Philly => datasets::philly::read_jobs(f)?,
                    TraceFormat::Workload | TraceFormat::Auto => {
                        datasets::pollux::read_workload(f)?
                    }
                },
                path: f.clone(),
                format,
            })
        })
        .collect()
}

/// What the replay of `traces` on `cluster` with `profiles` can honour, `horizon_s` the
/// latest arrival the operator accepts.
pub fn limits(cluster: &ClusterSpec, profiles: &[AppProfile], horizon_s: f64) -> TraceLimits {
    let mut per_type: std::collections::BTreeMap<&str, u32> = Default::default();
    for n in &cluster.nodes {
        *per_type.entry(&n.worker_type).or_default() += n.gpus;
    }
    TraceLimits {
        largest_type_gpus: per_type.values().copied().max().unwrap_or(0),
        horizon_s,
        batch_sizes: profiles
            .iter()
            .filter_map(|p| {
                let lo = *p.curves.keys().next()?;
                let hi = *p.curves.keys().last()?;
                Some((p.name.clone(), (lo, hi)))
            })
            .collect(),
    }
}

/// Refuses, with file:line:column, the first value of any trace no cluster or profile can
/// honour (see [`datasets::limits`]).
pub fn check_traces(traces: &[NamedTrace], limits: &TraceLimits) -> Result<(), BrainError> {
    for t in traces {
        match t.format {
            TraceFormat::Philly => datasets::philly::check_jobs(&t.path, limits)?,
            TraceFormat::Workload | TraceFormat::Auto => {
                datasets::pollux::check_workload(&t.path, limits)?
            }
        }
    }
    Ok(())
}

/// `workload-10` after `workload-9`.
fn natural_key(p: &Path) -> (String, u64) {
    let stem = p
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let digits: String = stem
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let n = digits
        .chars()
        .rev()
        .collect::<String>()
        .parse()
        .unwrap_or(0);
    (
        stem.trim_end_matches(|c: char| c.is_ascii_digit())
            .to_string(),
        n,
    )
}

/// The application profiles of a Pollux/Sia-layout trace: the nearest `traces/` directory
/// beside the trace's directory or one of its parents (`workloads/x.csv` → `traces/`,
/// `workloads/saturn/x.csv` → `traces/` too).
pub fn default_profiles(trace: &Path) -> Option<PathBuf> {
    let dir = if trace.is_dir() {
        trace
    } else {
        trace.parent()?
    };
    dir.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("traces"))
        .find(|c| c.is_dir())
}

#[derive(Clone, Debug)]
pub struct Options {
    pub cluster: ClusterSpec,
    pub sim: SimConfig,
    /// Simulations run at once (at least 1).
    pub parallel: usize,
}

/// One policy's results over all traces.
#[derive(Debug)]
pub struct PolicyResult {
    pub label: String,
    /// (trace name, report), in trace order.
    pub runs: Vec<(String, Report)>,
    /// Over the jobs of all traces pooled (equal-size traces: the mean of the per-trace means).
    pub summary: Summary,
    /// The slowest scheduling round, in microseconds.
    pub max_decide_us: u64,
}

impl PolicyResult {
    /// A policy's result over `runs`: `summary` is over their jobs pooled, but for the
    /// makespan, the longest run's (traces are separate replays, not one pooled span).
    fn of(
        label: &str,
        runs: Vec<(String, Report)>,
        mut summary: Summary,
        max_decide_us: u64,
    ) -> Self {
        summary.makespan_s = runs
            .iter()
            .map(|(_, r)| r.summary.makespan_s)
            .fold(0.0, f64::max);
        PolicyResult {
            label: label.to_string(),
            runs,
            summary,
            max_decide_us,
        }
    }
}

struct Timed<'a> {
    on_jobs_done: &'a (dyn Fn(u64) + Sync),
    done: usize,
}

impl SimHooks for Timed<'_> {
    fn decide(
        &mut self,
        scheduler: &dyn Scheduler,
        snapshot: &Snapshot,
    ) -> (Result<Assignment, PolicyError>, u64) {
        let start = Instant::now();
        let answer = scheduler.schedule(snapshot);
        (answer, start.elapsed().as_micros() as u64)
    }

    fn after_round(&mut self, _round: &optimizer::sim::RoundRecord, finished: usize) {
        if finished > self.done {
            (self.on_jobs_done)((finished - self.done) as u64);
            self.done = finished;
        }
    }
}

/// Replays every trace under every policy. `on_jobs_done(n)` is called as jobs finish (for a
/// progress bar), from several threads.
pub fn run(
    traces: &[NamedTrace],
    profiles: &[AppProfile],
    policies: &[NamedPolicy],
    options: &Options,
    on_jobs_done: &(dyn Fn(u64) + Sync),
) -> Result<Vec<PolicyResult>, BrainError> {
    let results = each_replay(policies.len(), traces.len(), options.parallel, |p, t| {
        let mut hooks = Timed {
            on_jobs_done,
            done: 0,
        };
        with_scheduler(&policies[p], |scheduler| {
            simulate(
                &traces[t].jobs,
                profiles,
                &options.cluster,
                scheduler,
                &options.sim,
                &mut hooks,
            )
        })
        .map_err(|source| BrainError::Simulation {
            trace: traces[t].name.clone(),
            policy: policies[p].label.clone(),
            source,
        })
    });
    let mut results = results.into_iter();
    let mut out = Vec::new();
    for policy in policies {
        let mut runs = Vec::new();
        for trace in traces {
            let report = results.next().expect("every task ran")?;
            runs.push((trace.name.clone(), report));
        }
        let jobs: Vec<_> = runs
            .iter()
            .flat_map(|(_, r)| r.jobs.iter().cloned())
            .collect();
        let up: f64 = runs.iter().map(|(_, r)| r.gpu_seconds_up).sum();
        let summary = Summary::of(&jobs, up);
        let max_decide_us = runs
            .iter()
            .flat_map(|(_, r)| r.rounds.iter().map(|x| x.decide_us))
            .max()
            .unwrap_or(0);
        out.push(PolicyResult::of(
            &policy.label,
            runs,
            summary,
            max_decide_us,
        ));
    }
    Ok(out)
}

/// Runs `replay(policy, trace)` for every policy and trace, `parallel` at once; the results by
/// policy, then trace.
fn each_replay<T: Send>(
    policies: usize,
    traces: usize,
    parallel: usize,
    replay: impl Fn(usize, usize) -> T + Sync,
) -> Vec<T> {
    let tasks: Vec<(usize, usize)> = (0..policies)
        .flat_map(|p| (0..traces).map(move |t| (p, t)))
        .collect();
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..tasks.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..parallel.max(1).min(tasks.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let k = {
                        let mut n = next.lock().expect("no panics while held");
                        let k = *n;
                        *n += 1;
                        k
                    };
                    let Some(&(p, t)) = tasks.get(k) else { break };
                    let result = replay(p, t);
                    results.lock().expect("no panics while held")[k] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .expect("no panics while held")
        .into_iter()
        .map(|r| r.expect("every task ran"))
        .collect()
}

/// Calls `f` with the policy's scheduler, inside the live brain's round with `--live-round`.
fn with_scheduler<T>(policy: &NamedPolicy, f: impl FnOnce(&dyn Scheduler) -> T) -> T {
    match policy.live_round.clone() {
        Some(c) => f(&LiveRound::new(policy.scheduler.scheduler(), c)),
        None => f(&policy.scheduler),
    }
}

/// A Philly job list to replay row by row (`--stream`).
#[derive(Clone, Debug)]
pub struct StreamedTrace {
    pub name: String,
    pub path: PathBuf,
    /// Its jobs, as [`check_streamed`] counted them.
    pub jobs: u64,
}

/// Checks job lists for a replay row by row, reading each once in bounded memory: each must be
/// a Philly job list, in order of submission, within `limits` (see [`datasets::philly::JobStream`]).
/// Returns them with their jobs counted.
pub fn check_streamed(
    paths: &[PathBuf],
    format: TraceFormat,
    limits: &TraceLimits,
    on_rows: &dyn Fn(u64),
) -> Result<Vec<StreamedTrace>, BrainError> {
    trace_files(paths)?
        .into_iter()
        .map(|path| {
            if format.of(&path)? != TraceFormat::Philly {
                return Err(BrainError::Config(format!(
                    "{}: --stream replays Philly job lists \
                     (timestamp,duration,num_gpus,gpu_time,cluster) row by row; this is a \
                     workload CSV: replay it without --stream",
                    path.display()
                )));
            }
            let mut jobs = 0u64;
            for job in datasets::philly::JobStream::open(&path, limits.clone())? {
                job?;
                jobs += 1;
                if jobs.is_multiple_of(65_536) {
                    on_rows(65_536);
                }
            }
            on_rows(jobs % 65_536);
            Ok(StreamedTrace {
                name: stem(&path),
                path,
                jobs,
            })
        })
        .collect()
}

/// Where a streamed replay writes its records as they are made: the `jobs` and `rounds` tables
/// (CSV and Parquet) in a directory, shared by the replays running at once (batches of several
/// replays interleave, each row names its policy and trace; a replay's jobs come in the order
/// they finished).
pub struct StreamOutputs {
    jobs: Mutex<TableWriter>,
    rounds: Mutex<TableWriter>,
}

impl StreamOutputs {
    pub fn create(dir: &Path) -> Result<StreamOutputs, BrainError> {
        create_dir(dir)?;
        Ok(StreamOutputs {
            jobs: Mutex::new(TableWriter::create(&dir.join("jobs"), &JOB_COLUMNS)?),
            rounds: Mutex::new(TableWriter::create(&dir.join("rounds"), &ROUND_COLUMNS)?),
        })
    }

    /// Writes out what is buffered; returns the files' paths.
    pub fn finish(self) -> Result<Vec<PathBuf>, BrainError> {
        let mut paths = Vec::new();
        for w in [self.jobs, self.rounds] {
            paths.extend(w.into_inner().expect("no panics while held").finish()?);
        }
        Ok(paths)
    }

    /// After a replay that stopped: removes the tables it had begun (a Parquet file without
    /// its footer does not read, a CSV cut short reads as if complete); returns their paths.
    pub fn abandon(self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for w in [self.jobs, self.rounds] {
            for path in w.into_inner().expect("no panics while held").paths() {
                if std::fs::remove_file(&path).is_ok() {
                    paths.push(path);
                }
            }
        }
        paths
    }
}

/// Rows a replay gathers before it takes the shared writer.
const STREAM_BATCH: usize = 4096;

/// A streamed replay's sink: its summary built job by job, its rows out in batches.
struct StreamSink<'a> {
    policy: &'a str,
    trace: &'a str,
    summary: SummaryBuilder,
    max_decide_us: u64,
    out: Option<&'a StreamOutputs>,
    jobs: Vec<Vec<Cell>>,
    rounds: Vec<Vec<Cell>>,
}

/// What stops a streamed replay: the replay's own error, or the trace's reader or the writers.
enum StreamError {
    Replay(optimizer::PolicyError),
    Other(BrainError),
}

impl From<optimizer::PolicyError> for StreamError {
    fn from(e: optimizer::PolicyError) -> Self {
        StreamError::Replay(e)
    }
}

impl StreamSink<'_> {
    /// Writes the rows gathered (all of them with `all`, else once a batch is full).
    fn write(&mut self, all: bool) -> Result<(), StreamError> {
        let Some(out) = self.out else {
            return Ok(());
        };
        for (rows, writer) in [(&mut self.jobs, &out.jobs), (&mut self.rounds, &out.rounds)] {
            if rows.is_empty() || (!all && rows.len() < STREAM_BATCH) {
                continue;
            }
            writer
                .lock()
                .expect("no panics while held")
                .write_batch(std::mem::take(rows))
                .map_err(|e| StreamError::Other(BrainError::Data(e)))?;
        }
        Ok(())
    }
}

impl ReplaySink for StreamSink<'_> {
    type Error = StreamError;

    fn job(&mut self, _id: usize, record: JobRecord) -> Result<(), StreamError> {
        self.summary.add(&record);
        if self.out.is_some() {
            self.jobs.push(job_row(self.policy, self.trace, &record));
        }
        self.write(false)
    }

    fn round(&mut self, round: &RoundRecord) -> Result<(), StreamError> {
        self.max_decide_us = self.max_decide_us.max(round.decide_us);
        if self.out.is_some() {
            self.rounds.push(round_row(self.policy, self.trace, round));
        }
        self.write(false)
    }
}

/// Replays Philly job lists row by row under every policy, in memory that follows the jobs in
/// the system and not the lists' length: each job's and round's record goes to `out` as it is
/// made, and the summaries are built job by job, their median and p99 JCT from a quantile
/// sketch within [`optimizer::sim::SKETCH_ACCURACY`]. The reports hold no jobs or rounds.
pub fn run_streamed(
    traces: &[StreamedTrace],
    limits: &TraceLimits,
    policies: &[NamedPolicy],
    options: &Options,
    out: Option<&StreamOutputs>,
    on_jobs_done: &(dyn Fn(u64) + Sync),
) -> Result<Vec<PolicyResult>, BrainError> {
    let results = each_replay(policies.len(), traces.len(), options.parallel, |p, t| {
        let (policy, trace) = (&policies[p], &traces[t]);
        let mut sink = StreamSink {
            policy: &policy.label,
            trace: &trace.name,
            summary: SummaryBuilder::default(),
            max_decide_us: 0,
            out,
            jobs: Vec::new(),
            rounds: Vec::new(),
        };
        let mut hooks = Timed {
            on_jobs_done,
            done: 0,
        };
        let jobs = datasets::philly::JobStream::open(&trace.path, limits.clone())?
            .enumerate()
            .map(|(i, job)| {
                job.map(|j| (i, j))
                    .map_err(|e| StreamError::Other(e.into()))
            });
        let end = with_scheduler(policy, |scheduler| {
            replay(
                jobs,
                &[],
                &options.cluster,
                scheduler,
                &options.sim,
                &mut hooks,
                &mut sink,
            )
        })
        .and_then(|end| sink.write(true).map(|()| end))
        .map_err(|e| match e {
            StreamError::Replay(source) => BrainError::Simulation {
                trace: trace.name.clone(),
                policy: policy.label.clone(),
                source,
            },
            StreamError::Other(e) => e,
        })?;
        Ok::<_, BrainError>((sink.summary, end.gpu_seconds_up, sink.max_decide_us))
    });
    let mut results = results.into_iter();
    let mut out = Vec::new();
    for policy in policies {
        let mut runs = Vec::new();
        let mut pooled = SummaryBuilder::default();
        let (mut up, mut max_decide_us) = (0.0, 0);
        for trace in traces {
            let (summary, trace_up, decide_us) = results.next().expect("every task ran")?;
            pooled.merge(&summary);
            up += trace_up;
            max_decide_us = max_decide_us.max(decide_us);
            runs.push((
                trace.name.clone(),
                Report {
                    policy: policy.label.clone(),
                    jobs: Vec::new(),
                    rounds: Vec::new(),
                    summary: summary.summary(trace_up),
                    gpu_seconds_up: trace_up,
                },
            ));
        }
        out.push(PolicyResult::of(
            &policy.label,
            runs,
            pooled.summary(up),
            max_decide_us,
        ));
    }
    Ok(out)
}

/// The side-by-side table, one row per policy. Everything in it follows from the inputs and
/// the seed (decision times, which depend on the machine, are in [`render_timing`]).
pub fn render_table(results: &[PolicyResult]) -> String {
    let header = [
        "policy",
        "jobs",
        "finished",
        "mean JCT s",
        "median JCT s",
        "p99 JCT s",
        "makespan s",
        "GPU util %",
        "mean queue s",
        "restarts",
        "restart GPU %",
        "rho>1 %",
        "max rho",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let s = &r.summary;
            vec![
                r.label.clone(),
                s.jobs.to_string(),
                s.finished.to_string(),
                format!("{:.0}", s.mean_jct_s),
                format!("{:.0}", s.median_jct_s),
                format!("{:.0}", s.p99_jct_s),
                format!("{:.0}", s.makespan_s),
                format!("{:.1}", 100.0 * s.gpu_utilisation),
                format!("{:.0}", s.mean_queueing_s),
                s.restarts.to_string(),
                format!("{:.1}", 100.0 * s.restart_gpu_share),
                format!("{:.1}", 100.0 * s.unfair_share),
                format!("{:.2}", s.max_rho),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c == 0 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = String::from("JCT, queue and rho columns: finished jobs only\n");
    out.push_str(&line(header.iter().map(|h| h.to_string()).collect()));
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    for r in results {
        let why = &r.summary.unfinished;
        if why.is_empty() {
            continue;
        }
        let parts: Vec<String> = why
            .iter()
            .map(|(w, n)| format!("{n} {}", w.as_str()))
            .collect();
        out.push_str(&format!(
            "{}: {} unfinished ({})\n",
            r.label,
            why.values().sum::<u32>(),
            parts.join(", ")
        ));
    }
    out
}

/// The columns of the jobs table, one row per job of each (policy, trace) replay.
pub const JOB_COLUMNS: [&str; 16] = [
    "policy",
    "trace",
    "job",
    "application",
    "submit_s",
    "start_s",
    "finish_s",
    "jct_s",
    "queueing_s",
    "gpu_seconds",
    "restart_gpu_seconds",
    "rho",
    "unfinished",
    "restarts",
    "requested_gpus",
    "peak_gpus",
];

/// A job's row of the jobs table.
fn job_row(policy: &str, trace: &str, j: &JobRecord) -> Vec<Cell> {
    let text = |s: &str| Cell::Text(s.to_string());
    vec![
        text(policy),
        text(trace),
        text(&j.name),
        text(&j.application),
        Cell::F64(Some(j.submit_s)),
        Cell::F64(j.start_s),
        Cell::F64(j.finish_s),
        Cell::F64(j.jct_s()),
        Cell::F64(j.queueing_s()),
        Cell::F64(Some(j.gpu_seconds)),
        Cell::F64(Some(j.restart_gpu_seconds)),
        Cell::F64(j.rho),
        text(j.unfinished.map_or("", |w| w.as_str())),
        Cell::U64(j.restarts as u64),
        Cell::U64(j.requested_replicas as u64),
        Cell::U64(j.peak_replicas as u64),
    ]
}

/// The columns of the rounds table.
pub const ROUND_COLUMNS: [&str; 9] = [
    "policy",
    "trace",
    "time_s",
    "active_jobs",
    "queued_jobs",
    "gpus_used",
    "gpus_up",
    "changed_jobs",
    "decide_us",
];

/// A round's row of the rounds table.
fn round_row(policy: &str, trace: &str, r: &RoundRecord) -> Vec<Cell> {
    vec![
        Cell::Text(policy.to_string()),
        Cell::Text(trace.to_string()),
        Cell::F64(Some(r.time_s)),
        Cell::U64(r.active_jobs as u64),
        Cell::U64(r.queued_jobs as u64),
        Cell::U64(r.gpus_used as u64),
        Cell::U64(r.gpus_up as u64),
        Cell::U64(r.changed_jobs as u64),
        Cell::U64(r.decide_us),
    ]
}

/// Writes `jobs.{parquet,csv}`, `rounds.{parquet,csv}` and `summary.{parquet,csv}` into `dir`.
pub fn write_outputs(dir: &Path, results: &[PolicyResult]) -> Result<Vec<PathBuf>, BrainError> {
    create_dir(dir)?;
    let mut written = Vec::new();
    let runs = || {
        results.iter().flat_map(|r| {
            r.runs
                .iter()
                .map(move |(t, rep)| (r.label.as_str(), t, rep))
        })
    };
    let jobs = runs().flat_map(|(p, t, rep)| rep.jobs.iter().map(move |j| job_row(p, t, j)));
    written.extend(write_table(&dir.join("jobs"), columns(&JOB_COLUMNS, jobs))?);
    let rounds = runs().flat_map(|(p, t, rep)| rep.rounds.iter().map(move |r| round_row(p, t, r)));
    written.extend(write_table(
        &dir.join("rounds"),
        columns(&ROUND_COLUMNS, rounds),
    )?);
    written.extend(write_summary(dir, results)?);
    Ok(written)
}

fn create_dir(dir: &Path) -> Result<(), BrainError> {
    std::fs::create_dir_all(dir).map_err(|source| datasets::DatasetError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(())
}

/// Writes `summary.{parquet,csv}` into `dir`: one row per policy.
pub fn write_summary(dir: &Path, results: &[PolicyResult]) -> Result<Vec<PathBuf>, BrainError> {
    let mut written = Vec::new();
    let f = |g: &dyn Fn(&PolicyResult) -> f64| {
        Values::F64(results.iter().map(|r| Some(g(r))).collect())
    };
    written.extend(write_table(
        &dir.join("summary"),
        vec![
            (
                "policy",
                Values::Text(results.iter().map(|r| r.label.clone()).collect()),
            ),
            (
                "jobs",
                Values::U64(results.iter().map(|r| r.summary.jobs as u64).collect()),
            ),
            (
                "finished",
                Values::U64(results.iter().map(|r| r.summary.finished as u64).collect()),
            ),
            ("mean_jct_s", f(&|r| r.summary.mean_jct_s)),
            ("median_jct_s", f(&|r| r.summary.median_jct_s)),
            ("p99_jct_s", f(&|r| r.summary.p99_jct_s)),
            ("makespan_s", f(&|r| r.summary.makespan_s)),
            ("gpu_utilisation", f(&|r| r.summary.gpu_utilisation)),
            ("mean_queueing_s", f(&|r| r.summary.mean_queueing_s)),
            (
                "restarts",
                Values::U64(results.iter().map(|r| r.summary.restarts as u64).collect()),
            ),
            ("restart_gpu_share", f(&|r| r.summary.restart_gpu_share)),
            ("unfair_share", f(&|r| r.summary.unfair_share)),
            ("max_rho", f(&|r| r.summary.max_rho)),
            ("slowest_round_ms", f(&|r| r.max_decide_us as f64 / 1000.0)),
        ],
    )?);
    Ok(written)
}

/// Node failures from the two CLI numbers, when the MTBF is given.
pub fn failures(mtbf_s: Option<f64>, repair_s: f64) -> Option<NodeFailures> {
    mtbf_s.map(|mtbf_s| NodeFailures { mtbf_s, repair_s })
}

/// How long each policy's slowest scheduling round took, on this machine.
pub fn render_timing(results: &[PolicyResult]) -> String {
    let parts: Vec<String> = results
        .iter()
        .map(|r| format!("{} {:.1} ms", r.label, r.max_decide_us as f64 / 1000.0))
        .collect();
    format!("slowest scheduling round: {}", parts.join(", "))
}
