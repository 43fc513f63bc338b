//! Integerisation: from the LP's fractional shares to whole placements on nodes for one round.
//!
//! Each job runs on at most one worker type, with `scale_factor` workers, on nodes of that type
//! that have free slots; no node is ever given more than it has. Jobs are taken in order of the
//! largest share the LP gave them (ties by id), each on the type of that largest share; a job
//! that held a placement in the previous round keeps its nodes when they still fit, so rounds do
//! not reshuffle running jobs. A job goes on one node when one has room (best fit: the fullest
//! node that fits), and is spread over several only when none has. What rounding costs is
//! reported against the LP: the throughput of the placed jobs this round against the LP's
//! time-averaged throughput.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::problem::{Allocation, Problem};
use crate::units::JobId;

/// A machine with `slots` workers (GPUs) of one worker type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    /// Index into `problem.cluster.worker_types`.
    pub worker_type: usize,
    pub slots: u32,
}

/// Where one job runs this round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobPlacement {
    pub worker_type: usize,
    /// (node index, workers on it), by node index.
    pub nodes: Vec<(usize, u32)>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub jobs: BTreeMap<JobId, JobPlacement>,
    /// Σ throughput of the placed jobs on their types.
    pub throughput: f64,
    /// Σ_m Σ_j T\[m\]\[j\] · x\[m\]\[j\] of the allocation placed.
    pub lp_throughput: f64,
}

impl Placement {
    /// 1 − placed / LP throughput: what whole placements cost this round.
    pub fn rounding_cost(&self) -> f64 {
        if self.lp_throughput > 0.0 {
            1.0 - self.throughput / self.lp_throughput
        } else {
            0.0
        }
    }

    /// Workers used on each node.
    pub fn node_usage(&self, nodes: usize) -> Vec<u32> {
        let mut used = vec![0; nodes];
        for p in self.jobs.values() {
            for &(n, k) in &p.nodes {
                used[n] += k;
            }
        }
        used
    }
}

/// Places `allocation` on `nodes` for one round.
pub fn place(
    problem: &Problem,
    allocation: &Allocation,
    nodes: &[Node],
    previous: Option<&Placement>,
) -> Result<Placement, PolicyError> {
    problem.validate()?;
    let k = problem.cluster.worker_types.len();
    if let Some((i, n)) = nodes.iter().enumerate().find(|(_, n)| n.worker_type >= k) {
        return Err(PolicyError::InvalidProblem(format!(
            "node {i} ({}) has worker type {} of {k}",
            n.name, n.worker_type
        )));
    }
    let mut free: Vec<u32> = nodes.iter().map(|n| n.slots).collect();
    let mut out = Placement {
        lp_throughput: allocation.throughput(problem),
        ..Placement::default()
    };
    // (largest share, its type, job ordinal) for every job the LP gave time.
    let mut order: Vec<(f64, usize, usize)> = problem
        .jobs
        .iter()
        .enumerate()
        .filter_map(|(m, job)| {
            let x = allocation.shares.get(&job.id)?;
            let (j, &s) = x
                .iter()
                .enumerate()
                .filter(|(j, _)| job.throughput[*j] > 0.0)
                .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))?;
            (s > 1e-9).then_some((s, j, m))
        })
        .collect();
    order.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(problem.jobs[a.2].id.cmp(&problem.jobs[b.2].id))
    });

    // Keep last round's placements that still fit and still match the LP's choice of type.
    let mut placed = vec![false; problem.jobs.len()];
    if let Some(prev) = previous {
        for &(_, j, m) in &order {
            let job = &problem.jobs[m];
            let Some(p) = prev.jobs.get(&job.id) else {
                continue;
            };
            let fits = p.worker_type == j
                && p.nodes.iter().map(|(_, c)| c).sum::<u32>() == job.scale_factor
                && p.nodes
                    .iter()
                    .all(|&(n, c)| n < nodes.len() && nodes[n].worker_type == j && free[n] >= c);
            if fits {
                for &(n, c) in &p.nodes {
                    free[n] -= c;
                }
                out.jobs.insert(job.id, p.clone());
                placed[m] = true;
            }
        }
    }
    for &(_, j, m) in &order {
        if placed[m] {
            continue;
        }
        let job = &problem.jobs[m];
        if let Some(nodes_for_job) = fit(&free, nodes, j, job.scale_factor) {
            for &(n, c) in &nodes_for_job {
                free[n] -= c;
            }
            out.jobs.insert(
                job.id,
                JobPlacement {
                    worker_type: j,
                    nodes: nodes_for_job,
                },
            );
        }
    }
    out.throughput = problem
        .jobs
        .iter()
        .filter_map(|job| out.jobs.get(&job.id).map(|p| job.throughput[p.worker_type]))
        .sum();
    Ok(out)
}

/// Nodes of type `j` for `need` workers: the fullest single node that fits, else the nodes with
/// the most free slots first. None when the type has too few free slots.
fn fit(free: &[u32], nodes: &[Node], j: usize, need: u32) -> Option<Vec<(usize, u32)>> {
    let candidates: Vec<usize> = (0..nodes.len())
        .filter(|&n| nodes[n].worker_type == j && free[n] > 0)
        .collect();
    if let Some(&n) = candidates
        .iter()
        .filter(|&&n| free[n] >= need)
        .min_by_key(|&&n| (free[n], n))
    {
        return Some(vec![(n, need)]);
    }
    if candidates.iter().map(|&n| free[n]).sum::<u32>() < need {
        return None;
    }
    let mut by_free = candidates;
    by_free.sort_by_key(|&n| (std::cmp::Reverse(free[n]), n));
    let mut left = need;
    let mut out = Vec::new();
    for n in by_free {
        if left == 0 {
            break;
        }
        let c = free[n].min(left);
        out.push((n, c));
        left -= c;
    }
    out.sort_unstable();
    Some(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::{MaxSumThroughput, Policy};
    use crate::problem::{Cluster, JobDemand};
    use crate::units::WorkerType;

    fn problem(caps: &[u32], jobs: &[(u32, Vec<f64>)]) -> (Problem, Vec<Node>) {
        let nodes: Vec<Node> = caps
            .iter()
            .enumerate()
            .flat_map(|(j, &c)| {
                (0..c.div_ceil(4)).map(move |i| Node {
                    name: format!("t{j}-n{i}"),
                    worker_type: j,
                    slots: 4.min(c - 4 * i),
                })
            })
            .collect();
        let p = Problem {
            cluster: Cluster {
                worker_types: (0..caps.len())
                    .map(|i| WorkerType(format!("t{i}")))
                    .collect(),
                capacity: caps.iter().map(|&c| c as f64).collect(),
            },
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(i, (s, t))| JobDemand {
                    id: JobId(i as u64),
                    scale_factor: *s,
                    throughput: t.clone(),
                    weight: 1.0,
                    remaining_steps: None,
                    min_share: None,
                    max_share: None,
                    tenant: None,
                })
                .collect(),
            quotas: Default::default(),
        };
        (p, nodes)
    }

    #[test]
    fn an_integral_lp_solution_places_without_loss() {
        // Two 4-GPU nodes of one type; jobs of 4, 2 and 2 GPUs fill them exactly.
        let (p, nodes) = problem(&[8], &[(4, vec![3.0]), (2, vec![2.0]), (2, vec![1.0])]);
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        let pl = place(&p, &a, &nodes, None).unwrap();
        assert_eq!(pl.jobs.len(), 3);
        assert!(pl.rounding_cost().abs() < 1e-6, "{pl:?}");
        // The 4-GPU job sits on one node, and the two 2-GPU jobs share the other.
        assert_eq!(pl.jobs[&JobId(0)].nodes.len(), 1);
        assert_eq!(pl.node_usage(nodes.len()), vec![4, 4]);
    }

    #[test]
    fn a_round_keeps_last_rounds_placements() {
        let (p, nodes) = problem(&[8], &[(2, vec![1.0]), (2, vec![1.0]), (2, vec![1.0])]);
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        let first = place(&p, &a, &nodes, None).unwrap();
        let second = place(&p, &a, &nodes, Some(&first)).unwrap();
        assert_eq!(first, second);
    }

    proptest! {
        /// No node is over-committed, every placed job has its scale factor on nodes of a type it
        /// can run on (one configuration per job: the placement map is keyed by job), the placed
        /// throughput never exceeds what the LP promised, and placing is deterministic and
        /// stable.
        #[test]
        fn placements_never_exceed_a_node(
            caps in proptest::collection::vec(0u32..12, 1..4),
            jobs in proptest::collection::vec((1u32..6, proptest::collection::vec(0.0f64..5.0, 3)), 0..16),
        ) {
            let k = caps.len();
            let jobs: Vec<(u32, Vec<f64>)> = jobs.into_iter().map(|(s, t)| (s, t[..k].to_vec())).collect();
            let (p, nodes) = problem(&caps, &jobs);
            let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
            let pl = place(&p, &a, &nodes, None).unwrap();
            for (n, used) in pl.node_usage(nodes.len()).into_iter().enumerate() {
                prop_assert!(used <= nodes[n].slots);
            }
            for (id, jp) in &pl.jobs {
                let job = &p.jobs[id.0 as usize];
                prop_assert_eq!(jp.nodes.iter().map(|(_, c)| c).sum::<u32>(), job.scale_factor);
                prop_assert!(job.throughput[jp.worker_type] > 0.0);
                prop_assert!(jp.nodes.iter().all(|&(n, _)| nodes[n].worker_type == jp.worker_type));
            }
            prop_assert!(pl.throughput <= pl.lp_throughput * (1.0 + 1e-6) + 1e-9);
            // Deterministic, and an unchanged round with last round's placement keeps it.
            prop_assert_eq!(&place(&p, &a, &nodes, None).unwrap(), &pl);
            prop_assert_eq!(&place(&p, &a, &nodes, Some(&pl)).unwrap(), &pl);
        }
    }
}
