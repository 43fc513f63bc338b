//! The scheduler that replays an offline plan.

use super::Plan;
use crate::error::PolicyError;
use crate::schedule::{Assignment, BatchSizing, Scheduler, Snapshot, keep_current};
use crate::units::JobId;

/// The scheduler that carries out a [`Plan`] in the replay: each job at its configuration from
/// its planned round, or the first round after where its GPUs are free; never resized.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// (start, job, worker type, GPUs), in order of start.
    starts: Vec<(f64, JobId, usize, u32)>,
}

impl Planned {
    pub fn new(plan: &Plan) -> Self {
        let mut starts: Vec<(f64, JobId, usize, u32)> = plan
            .jobs
            .iter()
            .enumerate()
            .map(|(i, p)| (p.start_s, JobId(i as u64), p.worker_type, p.replicas))
            .collect();
        starts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        Planned { starts }
    }
}

impl Scheduler for Planned {
    fn name(&self) -> &'static str {
        "offline plan"
    }

    fn batch_sizing(&self) -> BatchSizing {
        BatchSizing::Adaptive
    }

    fn elastic(&self) -> bool {
        true
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        let (mut out, mut free) = keep_current(snapshot, |_| true);
        let waiting: std::collections::BTreeSet<JobId> = snapshot
            .jobs
            .iter()
            .filter(|j| j.current.is_empty())
            .map(|j| j.id)
            .collect();
        for &(start, id, t, r) in &self.starts {
            if start > snapshot.now_s + 1e-6 {
                break;
            }
            if waiting.contains(&id)
                && let Some(slots) = free.take(t, r)
            {
                out.insert(id, slots);
            }
        }
        Ok(out)
    }
}
