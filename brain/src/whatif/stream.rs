//! `--stream`: Philly job lists replayed row by row, in memory that follows the jobs in the
//! system and not the lists' length: checked in one pass, then replayed with
//! [`optimizer::sim::replay`], each record handed to a sink that builds the summary job by job
//! and writes the tables as it goes.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use datasets::export::{Cell, TableWriter};
use datasets::limits::TraceLimits;
use optimizer::sim::{JobRecord, ReplaySink, Report, RoundRecord, SummaryBuilder, replay};

use super::tables::{JOB_COLUMNS, ROUND_COLUMNS, create_dir, job_row, round_row};
use super::{
    NamedPolicy, Options, PolicyResult, Timed, TraceFormat, each_replay, stem, trace_files,
    with_scheduler,
};
use crate::BrainError;

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
                &policy.sim(&options.sim),
                &mut hooks,
                &mut sink,
            )
        })
        .and_then(|end| sink.write(true).map(|()| end))
        .map_err(|e| match e {
            StreamError::Replay(error) => BrainError::Simulation {
                trace: trace.name.clone(),
                policy: policy.label.clone(),
                error,
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
