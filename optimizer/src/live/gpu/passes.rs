//! The GPU round's passes: the scheduler counts GPUs only, so where the nodes' free room cuts
//! a job below what it gave (its GPUs without the CPU beside them), the round schedules again
//! with that job held at what fits, and the GPUs it could not use go to the jobs behind it.

use std::collections::BTreeMap;

use vocab::JobId;

use super::super::nodes::Free;
use super::super::{Caps, LiveCluster, LiveConfig, LiveJob};
use super::{GpuRound, plan_pass};
use crate::error::PolicyError;
use crate::schedule::Scheduler;

/// A GPU job that the nodes' free room cut below what the scheduler gave it (its GPUs lack
/// the CPU or memory beside them): in the next pass the scheduler gives it at most `workers`,
/// so the GPUs it cannot use go to other jobs; `reason` is the cut's, kept for its decision.
pub(super) struct NodeCap {
    pub(super) workers: u32,
    pub(super) reason: String,
}

/// Passes of the scheduler in one round at most: the first, and two more with the jobs the
/// nodes' room cut held at what it holds.
const MAX_PASSES: usize = 3;

/// Sizes the GPU jobs (`gpu_jobs`: index in the snapshot, job). `caps` are what the whole
/// cluster has; the CPU jobs get what these leave. Where the cluster reports its nodes'
/// `free` room, the jobs' new processes must fit on it too, each whole on one node with its
/// GPUs and CPU. The scheduler counts GPUs only: where the nodes' room cuts a job below what
/// it gave (its GPUs without the CPU beside them), it schedules again with that job held at
/// what fits, so the GPUs it could not use go to the jobs behind it ([`MAX_PASSES`]).
#[allow(clippy::too_many_arguments)]
pub(in crate::live) fn plan_gpu_jobs(
    gpu_jobs: &[(usize, &LiveJob)],
    cluster: &LiveCluster,
    scheduler: &dyn Scheduler,
    config: &LiveConfig,
    now: f64,
    prior: f64,
    caps: Caps,
    free: Option<Free>,
    notes: &mut Vec<String>,
) -> Result<GpuRound, PolicyError> {
    let mut capped: BTreeMap<JobId, NodeCap> = BTreeMap::new();
    let mut pass = 1;
    loop {
        let mut pass_notes = Vec::new();
        let (round, cuts) = plan_pass(
            gpu_jobs,
            cluster,
            (scheduler, config),
            (now, prior),
            caps,
            free.clone(),
            &mut pass_notes,
            &capped,
        )?;
        let new: Vec<(JobId, NodeCap)> = cuts
            .into_iter()
            .filter(|(id, _)| !capped.contains_key(id))
            .collect();
        if new.is_empty() || pass == MAX_PASSES {
            notes.extend(pass_notes);
            if !capped.is_empty() {
                let held: Vec<String> = capped
                    .iter()
                    .map(|(id, c)| format!("{id} at {} workers", c.workers))
                    .collect();
                notes.push(format!(
                    "GPU jobs scheduled again with {} held at what the nodes' free room holds: \
                     the GPUs they could not use went to the jobs behind them",
                    held.join(", ")
                ));
            }
            return Ok(round);
        }
        capped.extend(new);
        pass += 1;
    }
}
