//! Gavel (OSDI 2020): an allocation policy from [`crate::policy`] decides the share of time
//! each job should run on each worker type, and rounds carry it out. Jobs run at the size they
//! asked for. The snapshot becomes a [`Problem`] (each job's scale factor is its request, its
//! throughput on a type its goodput there at that size); the policy (the same [`Policy`] the
//! live brain runs: max-sum throughput, max-min fairness, min makespan) returns shares
//! `x[m][t]`; each round, Gavel's priority `x[m][t] / received[m]` (received: the share of its
//! time in the system the job has run) orders who runs, and jobs are taken in that order while
//! their type has room. A job that stays on its type keeps its GPUs.

use serde::{Deserialize, Serialize};

use super::{Assignment, FreeGpus, Packing, Scheduler, Snapshot, carry_out};
use crate::error::PolicyError;
use crate::policy::{MaxSumThroughput, Policy, PolicyKind};
use crate::problem::{Cluster, JobDemand, Problem};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gavel {
    /// The allocation policy: `[scheduler.allocation]` of a policy file.
    #[serde(default = "default_allocation")]
    pub allocation: PolicyKind,
}

fn default_allocation() -> PolicyKind {
    PolicyKind::MaxSumThroughput(MaxSumThroughput::default())
}

impl Default for Gavel {
    fn default() -> Self {
        Gavel {
            allocation: default_allocation(),
        }
    }
}

impl Scheduler for Gavel {
    fn name(&self) -> &'static str {
        match self.allocation {
            PolicyKind::MaxSumThroughput(_) => "gavel_max_throughput",
            PolicyKind::MaxMinFairness(_) => "gavel_max_min_fairness",
            PolicyKind::MinMakespan(_) => "gavel_min_makespan",
        }
    }

    fn elastic(&self) -> bool {
        false
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        let types = snapshot.worker_types.len();
        let mut capacity = vec![0.0; types];
        for n in &snapshot.nodes {
            capacity[n.worker_type] += n.gpus as f64;
        }
        let jobs: Vec<_> = snapshot
            .jobs
            .iter()
            .filter(|j| (0..types).any(|t| j.goodput_at(t, j.requested_replicas) > 0.0))
            .collect();
        let problem = Problem {
            cluster: Cluster {
                worker_types: snapshot.worker_types.clone(),
                capacity,
            },
            jobs: jobs
                .iter()
                .map(|j| JobDemand {
                    id: j.id,
                    scale_factor: j.requested_replicas,
                    throughput: (0..types)
                        .map(|t| j.goodput_at(t, j.requested_replicas))
                        .collect(),
                    weight: 1.0,
                    remaining_steps: (j.remaining > 0.0).then_some(j.remaining),
                    min_share: None,
                    max_share: None,
                    tenant: None,
                })
                .collect(),
            quotas: Default::default(),
        };
        let allocation = self.allocation.allocate(&problem, None)?;
        // (priority, share, job, type): Gavel's priority is the share it should get over the
        // share it has had; a job that has never run comes first.
        let mut order: Vec<(f64, f64, usize, usize)> = Vec::new();
        for (k, job) in jobs.iter().enumerate() {
            let age = (snapshot.now_s - job.submitted_s).max(0.0);
            let received = if age > 0.0 { job.running_s / age } else { 0.0 };
            for (t, &x) in allocation.shares[&job.id].iter().enumerate() {
                if x > 1e-6 {
                    let priority = if received > 0.0 {
                        x / received
                    } else {
                        f64::INFINITY
                    };
                    order.push((priority, x, k, t));
                }
            }
        }
        order.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(b.1.total_cmp(&a.1))
                .then(a.2.cmp(&b.2))
                .then(a.3.cmp(&b.3))
        });
        let mut budget = FreeGpus::new(&snapshot.nodes);
        let mut chosen: Vec<Option<usize>> = vec![None; jobs.len()];
        for &(_, _, k, t) in &order {
            let r = jobs[k].requested_replicas;
            if chosen[k].is_none() && budget.on_type(t) >= r {
                budget.take(t, r);
                chosen[k] = Some(t);
            }
        }
        let mut sizes: Vec<_> = jobs
            .iter()
            .zip(&chosen)
            .filter_map(|(j, t)| t.map(|t| (j.id, t, j.requested_replicas)))
            .collect();
        sizes.sort_by_key(|&(id, _, r)| (std::cmp::Reverse(r), id));
        carry_out(snapshot, sizes, Packing::Tight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::MaxMinFairness;
    use crate::schedule::tests::snapshot;
    use crate::units::JobId;

    #[test]
    fn jobs_that_got_less_than_their_share_run_first() {
        // 4 GPUs, three 2-GPU jobs: the LP gives each 2/3 of the time; the two that have run
        // least so far run this round.
        let mut s = snapshot(1, &[(2, 2, 0.0), (2, 2, 0.0), (2, 2, 0.0)]);
        s.jobs[0].running_s = 900.0;
        s.jobs[1].running_s = 100.0;
        s.jobs[2].running_s = 500.0;
        for allocation in [
            PolicyKind::MaxSumThroughput(MaxSumThroughput::default()),
            PolicyKind::MaxMinFairness(MaxMinFairness::default()),
        ] {
            let g = Gavel { allocation };
            let a = g.schedule(&s).unwrap();
            crate::schedule::check(&s, &a).unwrap();
            let ids: Vec<u64> = a.keys().map(|id| id.0).collect();
            assert_eq!(ids, vec![1, 2], "{}", g.name());
            assert!(a.values().all(|s| s.iter().map(|x| x.1).sum::<u32>() == 2));
        }
        // A running job that keeps its turn keeps its GPUs.
        s.jobs[2].current = vec![(0, 2)];
        let a = Gavel::default().schedule(&s).unwrap();
        assert_eq!(a[&JobId(2)], vec![(0, 2)]);
    }
}
