//! Maximum total throughput: maximise Σ_m w_m Σ_j T\[m\]\[j\] · x\[m\]\[j\] (Gavel's max-sum policy;
//! with `normalize`, each job's throughput is divided by its best one, so fast job types do not
//! crowd out slow ones).

use serde::{Deserialize, Serialize};

use super::Policy;
use crate::error::PolicyError;
use crate::lp::{AllocationLp, LpSolver, Objective};
use crate::problem::{Allocation, Problem};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxSumThroughput {
    #[serde(default)]
    pub normalize: bool,
    /// The LP method; the default is right for every problem (see `crate::lp`).
    #[serde(default, skip_serializing_if = "LpSolver::is_default")]
    pub solver: LpSolver,
}

impl MaxSumThroughput {
    fn coef(&self, t: &[f64], weight: f64) -> impl Fn(usize) -> f64 {
        let scale = if self.normalize {
            t.iter().cloned().fold(0.0, f64::max).max(f64::MIN_POSITIVE)
        } else {
            1.0
        };
        let t = t.to_vec();
        move |j| weight * t[j] / scale
    }
}

impl Policy for MaxSumThroughput {
    fn name(&self) -> &'static str {
        "max_sum_throughput"
    }

    fn allocate(
        &self,
        problem: &Problem,
        _previous: Option<&Allocation>,
    ) -> Result<Allocation, PolicyError> {
        let lp = AllocationLp::new(problem, self.solver)?;
        let mut a = lp.solve(Objective::Linear(|class: &crate::lp::Class, j| {
            self.coef(&class.throughput, class.weight)(j)
        }))?;
        a.objective = problem
            .jobs
            .iter()
            .map(|job| {
                let c = self.coef(&job.throughput, job.weight);
                a.shares[&job.id]
                    .iter()
                    .enumerate()
                    .map(|(j, s)| c(j) * s)
                    .sum::<f64>()
            })
            .sum();
        Ok(a)
    }
}
