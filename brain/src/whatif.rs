//! `brainctl whatif`: replay traces under operators' policies, side by side.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use datasets::export::{Values, write_table};
use datasets::limits::TraceLimits;
use optimizer::PolicyError;
use optimizer::config::PolicyConfig;
use optimizer::live::{LiveConfig, LiveRound};
use optimizer::schedule::{Assignment, Scheduler, SchedulerKind, Snapshot};
use optimizer::sim::engine::{NodeFailures, SimHooks};
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

/// Reads traces; a directory stands for the `*.csv` files in it, in name order.
pub fn load_traces(paths: &[PathBuf], format: TraceFormat) -> Result<Vec<NamedTrace>, BrainError> {
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
    files
        .iter()
        .map(|f| {
            let format = format.of(f)?;
            Ok(NamedTrace {
                name: f
                    .file_stem()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string(),
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
    let tasks: Vec<(usize, usize)> = (0..policies.len())
        .flat_map(|p| (0..traces.len()).map(move |t| (p, t)))
        .collect();
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Result<Report, BrainError>>>> =
        Mutex::new((0..tasks.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..options.parallel.max(1).min(tasks.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let k = {
                        let mut n = next.lock().expect("no panics while held");
                        let k = *n;
                        *n += 1;
                        k
                    };
                    let Some(&(p, t)) = tasks.get(k) else { break };
                    let mut hooks = Timed {
                        on_jobs_done,
                        done: 0,
                    };
                    let policy = &policies[p];
                    let live = policy
                        .live_round
                        .clone()
                        .map(|c| LiveRound::new(policy.scheduler.scheduler(), c));
                    let scheduler: &dyn Scheduler = match &live {
                        Some(l) => l,
                        None => &policy.scheduler,
                    };
                    let report = simulate(
                        &traces[t].jobs,
                        profiles,
                        &options.cluster,
                        scheduler,
                        &options.sim,
                        &mut hooks,
                    )
                    .map_err(|source| BrainError::Simulation {
                        trace: traces[t].name.clone(),
                        policy: policies[p].label.clone(),
                        source,
                    });
                    results.lock().expect("no panics while held")[k] = Some(report);
                }
            });
        }
    });
    let mut results = results
        .into_inner()
        .expect("no panics while held")
        .into_iter();
    let mut out = Vec::new();
    for policy in policies {
        let mut runs = Vec::new();
        for trace in traces {
            let report = results.next().flatten().expect("every task ran")?;
            runs.push((trace.name.clone(), report));
        }
        let jobs: Vec<_> = runs
            .iter()
            .flat_map(|(_, r)| r.jobs.iter().cloned())
            .collect();
        let up: f64 = runs.iter().map(|(_, r)| r.gpu_seconds_up).sum();
        let mut summary = Summary::of(&jobs, up);
        // Traces are separate replays: the makespan is the longest, not the pooled span.
        summary.makespan_s = runs
            .iter()
            .map(|(_, r)| r.summary.makespan_s)
            .fold(0.0, f64::max);
        let max_decide_us = runs
            .iter()
            .flat_map(|(_, r)| r.rounds.iter().map(|x| x.decide_us))
            .max()
            .unwrap_or(0);
        out.push(PolicyResult {
            label: policy.label.clone(),
            runs,
            summary,
            max_decide_us,
        });
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

/// Writes `jobs.{parquet,csv}`, `rounds.{parquet,csv}` and `summary.{parquet,csv}` into `dir`.
pub fn write_outputs(dir: &Path, results: &[PolicyResult]) -> Result<Vec<PathBuf>, BrainError> {
    std::fs::create_dir_all(dir).map_err(|source| datasets::DatasetError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let jobs: Vec<(&str, &str, &optimizer::sim::JobRecord)> = results
        .iter()
        .flat_map(|r| {
            r.runs.iter().flat_map(move |(t, rep)| {
                rep.jobs
                    .iter()
                    .map(move |j| (r.label.as_str(), t.as_str(), j))
            })
        })
        .collect();
    let text = |f: &dyn Fn(&(&str, &str, &optimizer::sim::JobRecord)) -> String| {
        Values::Text(jobs.iter().map(f).collect())
    };
    let num = |f: &dyn Fn(&optimizer::sim::JobRecord) -> Option<f64>| {
        Values::F64(jobs.iter().map(|j| f(j.2)).collect())
    };
    written.extend(write_table(
        &dir.join("jobs"),
        vec![
            ("policy", text(&|j| j.0.to_string())),
            ("trace", text(&|j| j.1.to_string())),
            ("job", text(&|j| j.2.name.clone())),
            ("application", text(&|j| j.2.application.clone())),
            ("submit_s", num(&|j| Some(j.submit_s))),
            ("start_s", num(&|j| j.start_s)),
            ("finish_s", num(&|j| j.finish_s)),
            ("jct_s", num(&|j| j.jct_s())),
            ("queueing_s", num(&|j| j.queueing_s())),
            ("gpu_seconds", num(&|j| Some(j.gpu_seconds))),
            ("restart_gpu_seconds", num(&|j| Some(j.restart_gpu_seconds))),
            ("rho", num(&|j| j.rho)),
            (
                "unfinished",
                text(&|j| j.2.unfinished.map_or("", |w| w.as_str()).to_string()),
            ),
            (
                "restarts",
                Values::U64(jobs.iter().map(|j| j.2.restarts as u64).collect()),
            ),
            (
                "requested_gpus",
                Values::U64(jobs.iter().map(|j| j.2.requested_replicas as u64).collect()),
            ),
            (
                "peak_gpus",
                Values::U64(jobs.iter().map(|j| j.2.peak_replicas as u64).collect()),
            ),
        ],
    )?);
    let rounds: Vec<(&str, &str, &optimizer::sim::RoundRecord)> = results
        .iter()
        .flat_map(|r| {
            r.runs.iter().flat_map(move |(t, rep)| {
                rep.rounds
                    .iter()
                    .map(move |x| (r.label.as_str(), t.as_str(), x))
            })
        })
        .collect();
    let count = |f: &dyn Fn(&optimizer::sim::RoundRecord) -> u64| {
        Values::U64(rounds.iter().map(|r| f(r.2)).collect())
    };
    written.extend(write_table(
        &dir.join("rounds"),
        vec![
            (
                "policy",
                Values::Text(rounds.iter().map(|r| r.0.to_string()).collect()),
            ),
            (
                "trace",
                Values::Text(rounds.iter().map(|r| r.1.to_string()).collect()),
            ),
            (
                "time_s",
                Values::F64(rounds.iter().map(|r| Some(r.2.time_s)).collect()),
            ),
            ("active_jobs", count(&|r| r.active_jobs as u64)),
            ("queued_jobs", count(&|r| r.queued_jobs as u64)),
            ("gpus_used", count(&|r| r.gpus_used as u64)),
            ("gpus_up", count(&|r| r.gpus_up as u64)),
            ("changed_jobs", count(&|r| r.changed_jobs as u64)),
            ("decide_us", count(&|r| r.decide_us)),
        ],
    )?);
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
