//! Heterogeneity-aware max-min fairness (Gavel): maximise the smallest weighted, normalised
//! throughput min_m (Σ_j W\[m\]\[j\] · x\[m\]\[j\]) / w_m, where W\[m\]\[j\] = s_m · T\[m\]\[j\] / T̄_m and T̄_m
//! is the job's throughput on an equal share of every worker type
//! (Σ_j T\[m\]\[j\] · cap_j / Σ cap). One extra variable `t` and one row per class of identical
//! jobs.

use serde::{Deserialize, Serialize};

use super::Policy;
use crate::error::PolicyError;
use crate::lp::{AllocationLp, LpSolver, Objective};
use crate::problem::{Allocation, Problem};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxMinFairness {
    /// The LP method; the default is right for every problem (see `crate::lp`).
    #[serde(default, skip_serializing_if = "LpSolver::is_default")]
    pub solver: LpSolver,
}

/// W[m][·] for one job.
fn normalised(throughput: &[f64], scale_factor: u32, capacity: &[f64]) -> Vec<f64> {
    let total: f64 = capacity.iter().sum();
    let equal_share: f64 = if total > 0.0 {
        throughput
            .iter()
            .zip(capacity)
            .map(|(t, c)| t * c / total)
            .sum()
    } else {
        0.0
    };
    throughput
        .iter()
        .map(|t| {
            if equal_share > 0.0 {
                scale_factor as f64 * t / equal_share
            } else {
                0.0
            }
        })
        .collect()
}

impl Policy for MaxMinFairness {
    fn name(&self) -> &'static str {
        "max_min_fairness"
    }

    fn allocate(
        &self,
        problem: &Problem,
        _previous: Option<&Allocation>,
    ) -> Result<Allocation, PolicyError> {
        let lp = AllocationLp::new(problem, self.solver)?;
        let cap = &problem.cluster.capacity;
        let mut a = lp.solve(Objective::MaxMin(|class: &crate::lp::Class, j| {
            normalised(&class.throughput, class.scale_factor, cap)[j] / class.weight
        }))?;
        let weights: Vec<Vec<f64>> = problem
            .jobs
            .iter()
            .map(|j| {
                normalised(&j.throughput, j.scale_factor, cap)
                    .into_iter()
                    .map(|w| w / j.weight)
                    .collect()
            })
            .collect();
        a.objective = problem
            .jobs
            .iter()
            .zip(&weights)
            .map(|(job, w)| {
                a.shares[&job.id]
                    .iter()
                    .zip(w)
                    .map(|(s, w)| s * w)
                    .sum::<f64>()
            })
            .fold(f64::INFINITY, f64::min);
        if problem.jobs.is_empty() {
            a.objective = 0.0;
        }
        Ok(a)
    }
}
