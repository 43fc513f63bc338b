//! First come, first served at the size the user asked for: a job starts when it is first in
//! line and its size fits, runs to the end and is never resized or preempted. The baseline every
//! cluster without a scheduler has.

use serde::{Deserialize, Serialize};

use super::{Assignment, Scheduler, Snapshot, keep_current};
use crate::error::PolicyError;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fifo {
    /// Let a later job start when the first in line does not fit yet (no reservation).
    #[serde(default)]
    pub backfill: bool,
}

impl Scheduler for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn elastic(&self) -> bool {
        false
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        let (mut out, mut free) = keep_current(snapshot, |_| true);
        for job in &snapshot.jobs {
            if out.contains_key(&job.id) {
                continue;
            }
            let r = job.requested_replicas.min(job.max_replicas).max(1);
            // The worker type where the job is fastest among those with room.
            let best = free.fastest_type(job, r);
            match best.and_then(|t| free.take(t, r)) {
                Some(slots) => {
                    out.insert(job.id, slots);
                }
                None if self.backfill => continue,
                None => break,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tests::snapshot;
    use crate::units::JobId;

    #[test]
    fn jobs_start_in_order_and_the_head_of_the_line_blocks() {
        // 8 GPUs: job 0 takes 4, job 1 wants 6 and blocks job 2 (1 GPU).
        let s = snapshot(2, &[(4, 8, 0.0), (6, 8, 0.0), (1, 8, 0.0)]);
        let a = Fifo::default().schedule(&s).unwrap();
        assert_eq!(a.keys().copied().collect::<Vec<_>>(), vec![JobId(0)]);
        let a = Fifo { backfill: true }.schedule(&s).unwrap();
        assert_eq!(
            a.keys().copied().collect::<Vec<_>>(),
            vec![JobId(0), JobId(2)]
        );
    }

    #[test]
    fn running_jobs_keep_their_gpus() {
        let mut s = snapshot(2, &[(2, 8, 0.0), (2, 8, 0.0)]);
        s.jobs[1].current = vec![(1, 2)];
        let a = Fifo::default().schedule(&s).unwrap();
        assert_eq!(a[&JobId(1)], vec![(1, 2)]);
        assert_eq!(a[&JobId(0)], vec![(1, 2)], "best fit: the fuller node");
    }
}
