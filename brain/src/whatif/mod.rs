//! `brainctl whatif`: replay traces under operators' policies, side by side.
//!
//! This module loads policies and traces, checks them and runs every (policy, trace) replay in
//! memory; `stream` replays job lists too large to hold row by row (`--stream`), and
//! `tables` renders the side-by-side table and writes the result tables; `bound` the lower
//! bound no scheduler beats on the same traces and cluster, and each policy's distance to it;
//! `account` where that distance goes (queueing, restarts, sizing, fragmentation, ...);
//! `offline` the best plan that never resizes a job on small traces (`--offline-slot-s`), which
//! splits that distance.

mod account;
mod bound;
mod offline;
mod stream;
mod tables;

pub use account::{render_account, write_account};
pub use bound::{BoundRow, bound, render_bound, write_bound};
pub use offline::{OfflineRow, offline, render_offline, write_offline};
pub use stream::{StreamOutputs, StreamedTrace, check_streamed, run_streamed};
pub use tables::{
    JOB_COLUMNS, ROUND_COLUMNS, render_table, render_timing, write_outputs, write_summary,
};

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use datasets::limits::TraceLimits;
use optimizer::PolicyError;
use optimizer::config::PolicyConfig;
use optimizer::live::{LiveConfig, LiveRound};
use optimizer::schedule::{Assignment, Scheduler, SchedulerKind, Snapshot};
use optimizer::sim::engine::{Handling, SimHooks};
use optimizer::sim::{
    AppProfile, ClusterSpec, Report, SimConfig, Summary, TraceJob, Work, simulate,
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
    /// How its replays handle faults, where it differs from the options' (`--fault-handling
    /// both`: each policy twice, its label saying which).
    pub handling: Option<Handling>,
}

impl NamedPolicy {
    /// The simulator's settings for its replays: `sim` with its fault handling.
    pub fn sim(&self, sim: &SimConfig) -> SimConfig {
        let mut sim = sim.clone();
        if let Some(h) = self.handling {
            sim.fault_handling.handling = h;
        }
        sim
    }
}

/// Each policy under each of `handlings`: with more than one, a policy's rows are labelled
/// `POLICY/detect`, `POLICY/wait`, all of one handling first.
pub fn with_handlings(policies: &[NamedPolicy], handlings: &[Handling]) -> Vec<NamedPolicy> {
    if handlings.len() < 2 {
        return policies
            .iter()
            .map(|p| NamedPolicy {
                handling: handlings.first().copied(),
                ..p.clone()
            })
            .collect();
    }
    handlings
        .iter()
        .flat_map(|h| {
            policies.iter().map(move |p| NamedPolicy {
                label: format!("{}/{}", p.label, h.as_str()),
                handling: Some(*h),
                ..p.clone()
            })
        })
        .collect()
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
        handling: None,
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
pub(crate) fn stem(path: &Path) -> String {
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

/// The application profiles the training jobs of `traces` need: from `given`, else the
/// `traces/` folder beside or above the first trace ([`default_profiles`]); none when every
/// job is rigid.
pub fn profiles_for(
    traces: &[NamedTrace],
    given: Option<&Path>,
) -> Result<Vec<optimizer::sim::AppProfile>, BrainError> {
    let names = applications(traces);
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let first = traces
        .first()
        .map(|t| t.path.as_path())
        .unwrap_or(Path::new(""));
    let dir = match given {
        Some(d) => d.to_path_buf(),
        None => default_profiles(first).ok_or_else(|| {
            BrainError::Config(format!(
                "no application profiles (a traces/ folder) beside {}: give --profiles DIR",
                first.display()
            ))
        })?,
    };
    datasets::pollux::read_apps_named(&dir, &names).map_err(|e| {
        BrainError::Config(format!(
            "reading application profiles in {}: {e}",
            dir.display()
        ))
    })
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
    pub(crate) fn of(
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

pub(crate) struct Timed<'a> {
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
                &policies[p].sim(&options.sim),
                &mut hooks,
            )
        })
        .map_err(|error| BrainError::Simulation {
            trace: traces[t].name.clone(),
            policy: policies[p].label.clone(),
            error,
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
pub(crate) fn each_replay<T: Send>(
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
pub(crate) fn with_scheduler<T>(policy: &NamedPolicy, f: impl FnOnce(&dyn Scheduler) -> T) -> T {
    match policy.live_round.clone() {
        Some(c) => f(&LiveRound::new(policy.scheduler.scheduler(), c)),
        None => f(&policy.scheduler),
    }
}
