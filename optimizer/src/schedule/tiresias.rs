//! Tiresias' discretised two-dimensional least-attained-service (NSDI 2019), as Pollux's
//! artifact runs it: jobs run at the size they asked for; a job moves from the high-priority
//! queue to the low one once it has run `queue_threshold_gpu_s` GPU-seconds (time running ×
//! requested GPUs); each queue is first come first served; every round the queues are walked in
//! order and each job that still fits runs (later, smaller jobs may fill in), and running jobs
//! that no longer make the cut are preempted.

use serde::{Deserialize, Serialize};

use super::{Assignment, FreeGpus, Packing, Scheduler, Snapshot, keep_current, place_rest};
use crate::error::PolicyError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tiresias {
    /// GPU-seconds of service after which a job is demoted (Tiresias: 16 GPU-hours).
    #[serde(default = "default_threshold")]
    pub queue_threshold_gpu_s: f64,
}

fn default_threshold() -> f64 {
    16.0 * 3600.0
}

impl Default for Tiresias {
    fn default() -> Self {
        Tiresias {
            queue_threshold_gpu_s: default_threshold(),
        }
    }
}

impl Scheduler for Tiresias {
    fn name(&self) -> &'static str {
        "tiresias"
    }

    fn elastic(&self) -> bool {
        false
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        if !(self.queue_threshold_gpu_s.is_finite() && self.queue_threshold_gpu_s >= 0.0) {
            return Err(PolicyError::InvalidConfig(format!(
                "queue_threshold_gpu_s is {}",
                self.queue_threshold_gpu_s
            )));
        }
        let size = |j: &super::JobView| j.requested_replicas.min(j.max_replicas).max(1);
        let mut order: Vec<&super::JobView> = snapshot.jobs.iter().collect();
        order.sort_by_key(|j| {
            let service = j.running_s * size(j) as f64;
            (service >= self.queue_threshold_gpu_s) as u8
        });
        // Which jobs run: walk the queues, counting GPUs per worker type.
        let mut budget = FreeGpus::new(&snapshot.nodes);
        let mut running = Vec::new();
        for job in order {
            let r = size(job);
            let t = job
                .current_type(&snapshot.nodes)
                .or_else(|| budget.fastest_type(job, r));
            if let Some(t) = t
                && budget.on_type(t) >= r
            {
                budget.take(t, r);
                running.push((job, t, r));
            }
        }
        // Where: running jobs keep their GPUs, the others get the nodes with the most free.
        let (mut out, mut free) = keep_current(snapshot, |job| {
            running.iter().any(|(j, _, _)| j.id == job.id)
        });
        place_rest(
            &mut out,
            &mut free,
            running.iter().map(|&(j, t, r)| (j.id, t, r)),
            Packing::Spread,
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tests::snapshot;
    use crate::units::JobId;

    #[test]
    fn a_job_past_the_threshold_yields_to_newer_ones() {
        // 4 GPUs. Job 0 has run 20 GPU-hours and holds the node; jobs 1 and 2 are new.
        let mut s = snapshot(1, &[(4, 4, 20.0 * 3600.0), (2, 4, 0.0), (2, 4, 0.0)]);
        s.jobs[0].current = vec![(0, 4)];
        let a = Tiresias::default().schedule(&s).unwrap();
        assert_eq!(
            a.keys().copied().collect::<Vec<_>>(),
            vec![JobId(1), JobId(2)]
        );
        // Below the threshold it keeps running.
        s.jobs[0].running_s = 1000.0;
        let a = Tiresias::default().schedule(&s).unwrap();
        assert_eq!(a.keys().copied().collect::<Vec<_>>(), vec![JobId(0)]);
        assert_eq!(a[&JobId(0)], vec![(0, 4)]);
    }

    #[test]
    fn smaller_jobs_fill_in_behind_one_that_does_not_fit() {
        let s = snapshot(2, &[(6, 8, 0.0), (4, 8, 0.0), (2, 8, 0.0)]);
        let a = Tiresias::default().schedule(&s).unwrap();
        assert_eq!(
            a.keys().copied().collect::<Vec<_>>(),
            vec![JobId(0), JobId(2)]
        );
        crate::schedule::check(&s, &a).unwrap();
    }
}
