//! Optimus' greedy marginal gain (EuroSys 2018), with the job's true speed as Pollux's artifact
//! gives it ("Optimus+Oracle"): every job first gets the fewest GPUs it runs on (one, unless it
//! is rigid), in order of submission while GPUs last; then GPUs go one at a time to the job
//! whose remaining time drops the most by one more, `remaining · (1 / goodput(r) − 1 /
//! goodput(r + 1))`, until no job gains. Jobs whose size does
//! not change keep their GPUs; the others are placed on the nodes with the most free GPUs.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::{Assignment, FreeGpus, JobView, Packing, Scheduler, Snapshot, carry_out};
use crate::error::PolicyError;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Optimus {}

/// Seconds left for `job` with `r` GPUs on type `t` (infinite with none).
fn remaining_time(job: &JobView, t: usize, r: u32) -> f64 {
    let g = job.goodput_at(t, r);
    if g > 0.0 {
        job.remaining / g
    } else {
        f64::INFINITY
    }
}

/// A job's gain from one more GPU and its index: the heap's greatest is the largest gain, the
/// smallest index among equal gains.
struct Next(f64, Reverse<usize>);

impl PartialEq for Next {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Next {}

impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Next {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

impl Scheduler for Optimus {
    fn name(&self) -> &'static str {
        "optimus"
    }

    fn elastic(&self) -> bool {
        true
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        let mut budget = FreeGpus::new(&snapshot.nodes);
        // (job, worker type, GPUs)
        let mut sizes: Vec<(&JobView, usize, u32)> = Vec::new();
        for job in &snapshot.jobs {
            let Some(least) = job.min_replicas() else {
                continue;
            };
            let t = job
                .current_type(&snapshot.nodes)
                .filter(|&t| budget.on_type(t) >= least && job.goodput_at(t, least) > 0.0)
                .or_else(|| budget.fastest_type(job, least));
            if let Some(t) = t
                && budget.take(t, least).is_some()
            {
                sizes.push((job, t, least));
            }
        }
        let gain = |job: &JobView, t: usize, r: u32| {
            if r + 1 > job.max_replicas {
                return 0.0;
            }
            let (now, next) = (remaining_time(job, t, r), remaining_time(job, t, r + 1));
            if now.is_finite() && next.is_finite() {
                now - next
            } else {
                0.0
            }
        };
        // The job that gains the most next (the first in order on a tie), from a heap: a
        // round with 10,000 jobs and 30,000 slots would scan every job for every slot. A
        // job whose type has no GPU left never gets one again (the budget only shrinks).
        let mut next: BinaryHeap<Next> = sizes
            .iter()
            .enumerate()
            .map(|(i, &(j, t, r))| Next(gain(j, t, r), Reverse(i)))
            .filter(|n| n.0 > 0.0)
            .collect();
        while let Some(Next(_, Reverse(i))) = next.pop() {
            let (job, t, r) = sizes[i];
            if budget.on_type(t) < 1 {
                continue;
            }
            budget.take(t, 1);
            sizes[i].2 = r + 1;
            let g = gain(job, t, r + 1);
            if g > 0.0 {
                next.push(Next(g, Reverse(i)));
            }
        }
        sizes.sort_by_key(|&(j, _, r)| (std::cmp::Reverse(r), j.submitted_s.to_bits(), j.id));
        let sizes = sizes.into_iter().map(|(j, t, r)| (j.id, t, r)).collect();
        carry_out(snapshot, sizes, Packing::Spread)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tests::snapshot;
    use crate::units::JobId;

    #[test]
    fn gpus_go_where_they_cut_the_most_remaining_time() {
        // 8 GPUs, two jobs with the same speed curve; job 1 has twice the work left, so it
        // gains twice as much from each GPU and ends up with more.
        let s = snapshot(2, &[(1, 8, 0.0), (1, 8, 0.0)]);
        let a = Optimus::default().schedule(&s).unwrap();
        let n = |id| a[&JobId(id)].iter().map(|x| x.1).sum::<u32>();
        assert_eq!(n(0) + n(1), 8);
        assert!(n(1) > n(0), "{a:?}");
        crate::schedule::check(&s, &a).unwrap();
    }

    #[test]
    fn every_job_gets_one_gpu_before_any_gets_two() {
        let s = snapshot(
            1,
            &[
                (1, 4, 0.0),
                (1, 4, 0.0),
                (1, 4, 0.0),
                (1, 4, 0.0),
                (1, 4, 0.0),
            ],
        );
        let a = Optimus::default().schedule(&s).unwrap();
        assert_eq!(a.len(), 4);
        assert!(a.values().all(|s| s.iter().map(|x| x.1).sum::<u32>() == 1));
        assert!(!a.contains_key(&JobId(4)), "the last to arrive waits");
    }
}
