//! The what-if simulator: a trace of jobs replayed on a simulated cluster under a
//! [`Scheduler`](crate::schedule::Scheduler), on a virtual clock.
//!
//! * [`app`]: the ground truth of an application (measured step times, training curves), from
//!   which a job's progress per second follows for any placement and batch size.
//! * [`engine`]: the event loop: arrivals, a scheduling round every `round_s`, a restart penalty
//!   whenever a job's allocation changes, progress and completions between rounds, optional
//!   faults drawn from a seed. [`replay`] takes the jobs as they arrive and hands each
//!   record to a [`ReplaySink`] as it is made, holding only the jobs in the system;
//!   [`simulate`] runs it over a trace in memory and collects the whole [`Report`].
//! * [`faults`]: nodes that fail (their jobs' processes exit or hang) or slow down, and how
//!   the system under test notices and handles them (detect and isolate, or wait for the crash).
//! * [`checkpoints`]: how often jobs save and what a save costs them; a failure takes a job
//!   back to its last save, and the training lost is counted.
//! * [`bound`]: a lower bound on mean JCT, p99 JCT and makespan no scheduler beats on a trace
//!   (with `rate_bound`, private: the rate-capped LP on the mean); [`account`]: each job's JCT
//!   in parts, measured as the replay runs, that start from its alone bound and say where a
//!   policy's distance to the bound goes;
//!   [`offline`]: on small traces, the best plan that never resizes a job, from a time-indexed
//!   model solved with every arrival known, and the scheduler that replays it.
//! * `setup` (private): what a replay derives before its first round, and each job of the
//!   trace checked and made ready as it arrives.
//! * [`report`]: what a run produces: one record per job and per round, and the summary an
//!   operator compares policies by (JCT mean, median and p99, makespan, GPU utilisation,
//!   queueing delay, restarts): exact from the records, or built job by job in bounded memory
//!   ([`SummaryBuilder`], quantiles from a sketch).
//!
//! Nothing here reads a file or the clock: traces and profiles come in as values (the
//! `datasets` crate parses them) and the same inputs and seed always give the same report.

pub mod account;
pub mod app;
pub mod bound;
pub mod checkpoints;
pub mod engine;
#[cfg(test)]
mod fault_replay_tests;
pub mod faults;
pub mod offline;
mod rate_bound;
pub mod report;
mod setup;
mod world;

use serde::{Deserialize, Serialize};

pub use account::JctAccount;
pub use app::{App, AppLimits, AppProfile, CurveRow, StepRow};
pub use bound::{LowerBound, lower_bound};
pub use checkpoints::{CheckpointModel, young_interval_s};
pub use engine::{ReplayEnd, ReplaySink, SimConfig, replay, simulate};
pub use report::{
    JobRecord, Report, RoundRecord, SKETCH_ACCURACY, Summary, SummaryBuilder, Unfinished,
};

/// One job of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceJob {
    pub name: String,
    /// Seconds from the start of the trace.
    pub submit_s: f64,
    /// GPUs the user asked for.
    pub requested_replicas: u32,
    pub work: Work,
}

/// What a job does, and so how it progresses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Work {
    /// Trains an application (an [`AppProfile`] by name) to its target epochs, starting from
    /// the total batch size the user asked for: progress follows the profile for any size,
    /// placement and batch size.
    Train {
        application: String,
        batch_size: u32,
    },
    /// Runs for `duration_s` on exactly the GPUs it asked for, of any type, and cannot run on
    /// fewer or more: all a job list like Philly's records is how long a job ran on how many
    /// GPUs. `label` groups jobs in the results (Philly: the virtual cluster).
    Rigid { duration_s: f64, label: String },
}

impl TraceJob {
    /// The application a job trains, or the label of a rigid job.
    pub fn label(&self) -> &str {
        match &self.work {
            Work::Train { application, .. } => application,
            Work::Rigid { label, .. } => label,
        }
    }
}

/// A node of the simulated cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub worker_type: String,
    pub gpus: u32,
}

/// The simulated cluster, e.g. 16 nodes × 4 T4 for Pollux's workloads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub nodes: Vec<NodeSpec>,
}

impl ClusterSpec {
    /// `nodes` nodes of `gpus` GPUs of `worker_type`.
    pub fn uniform(nodes: usize, gpus: u32, worker_type: &str) -> Self {
        ClusterSpec {
            nodes: vec![
                NodeSpec {
                    worker_type: worker_type.to_string(),
                    gpus,
                };
                nodes
            ],
        }
    }

    /// Parses `16x4:t4` or `8x8:rtx,4x8:dgx` (nodes × GPUs per node : GPU type).
    pub fn parse(text: &str) -> Result<Self, crate::PolicyError> {
        let bad = |m: String| crate::PolicyError::InvalidConfig(format!("cluster `{text}`: {m}"));
        let mut nodes = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (shape, ty) = part
                .split_once(':')
                .ok_or_else(|| bad(format!("`{part}` is not NODESxGPUS:TYPE")))?;
            let (n, g) = shape
                .split_once(['x', 'X'])
                .ok_or_else(|| bad(format!("`{shape}` is not NODESxGPUS")))?;
            let n: usize = n
                .trim()
                .parse()
                .map_err(|_| bad(format!("node count `{n}`")))?;
            let g: u32 = g
                .trim()
                .parse()
                .map_err(|_| bad(format!("GPU count `{g}`")))?;
            if n == 0 || g == 0 || ty.trim().is_empty() {
                return Err(bad(format!("`{part}` has no GPUs")));
            }
            nodes.extend(ClusterSpec::uniform(n, g, ty.trim()).nodes);
        }
        if nodes.is_empty() {
            return Err(bad("no nodes".into()));
        }
        Ok(ClusterSpec { nodes })
    }

    /// Worker types in order of first appearance.
    pub fn worker_types(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for n in &self.nodes {
            if !out.contains(&n.worker_type) {
                out.push(n.worker_type.clone());
            }
        }
        out
    }

    pub fn gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.gpus).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_are_written_as_nodes_by_gpus_and_type() {
        let c = ClusterSpec::parse("16x4:t4").unwrap();
        assert_eq!(c, ClusterSpec::uniform(16, 4, "t4"));
        let c = ClusterSpec::parse("2x8:rtx, 1x8:dgx").unwrap();
        assert_eq!(c.worker_types(), vec!["rtx", "dgx"]);
        assert_eq!(c.gpus(), 24);
        for bad in ["", "16x4", "0x4:t4", "ax4:t4", "4x:t4"] {
            assert!(ClusterSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
