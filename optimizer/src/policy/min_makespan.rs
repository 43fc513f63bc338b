//! Minimum makespan in one LP. Gavel bisects over the makespan M, solving a feasibility LP
//! (every job m reaches rate R_m / M) at each of 10–20 steps. But a job running at rate
//! Σ_j T\[m\]\[j\] · x\[m\]\[j\] finishes its R_m remaining steps in R_m / rate, so the smallest makespan
//! is 1 / t* where t* = max_x min_m Σ_j (T\[m\]\[j\] / R_m) · x\[m\]\[j\]: one max-min LP with weights
//! T / R. The shares it returns keep every job going at the rate that finishes them all together.
//! The reported objective is the makespan in the time unit of the throughputs (seconds for
//! steps/s).

use serde::{Deserialize, Serialize};

use super::Policy;
use crate::error::PolicyError;
use crate::lp::{AllocationLp, LpSolver, Objective};
use crate::problem::{Allocation, Problem};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinMakespan {
    /// The LP method; the default is right for every problem (see `crate::lp`).
    #[serde(default, skip_serializing_if = "LpSolver::is_default")]
    pub solver: LpSolver,
}

impl Policy for MinMakespan {
    fn name(&self) -> &'static str {
        "min_makespan"
    }

    fn allocate(
        &self,
        problem: &Problem,
        _previous: Option<&Allocation>,
    ) -> Result<Allocation, PolicyError> {
        let lp = AllocationLp::new(problem, self.solver)?;
        if let Some(job) = problem.jobs.iter().find(|j| j.remaining_steps.is_none()) {
            return Err(PolicyError::InvalidProblem(format!(
                "{} has no remaining_steps, which min_makespan needs",
                job.id
            )));
        }
        if let Some(job) = problem
            .jobs
            .iter()
            .find(|j| j.throughput.iter().all(|t| *t == 0.0))
        {
            return Err(PolicyError::Infeasible(format!(
                "{} cannot run on any worker type, so it never finishes",
                job.id
            )));
        }
        let mut a = lp.solve(Objective::MaxMin(|class: &crate::lp::Class, j| {
            class.throughput[j] / class.remaining_steps.expect("checked above")
        }))?;
        let slowest = problem
            .jobs
            .iter()
            .map(|j| {
                let rate: f64 = a.shares[&j.id]
                    .iter()
                    .zip(&j.throughput)
                    .map(|(s, t)| s * t)
                    .sum();
                if rate > 0.0 {
                    j.remaining_steps.expect("checked") / rate
                } else {
                    f64::INFINITY
                }
            })
            .fold(0.0, f64::max);
        if !slowest.is_finite() {
            return Err(PolicyError::Infeasible(
                "the capacity leaves some job no time at all".into(),
            ));
        }
        a.objective = slowest;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{Cluster, JobDemand};
    use crate::units::{JobId, WorkerType};

    fn job(id: u64, t: Vec<f64>, r: f64) -> JobDemand {
        JobDemand {
            id: JobId(id),
            scale_factor: 1,
            throughput: t,
            weight: 1.0,
            remaining_steps: Some(r),
            min_share: None,
            max_share: None,
            tenant: None,
        }
    }

    #[test]
    fn shares_finish_every_job_together() {
        // One GPU; 100 and 300 steps at 1 step/s: shares 1/4 and 3/4 finish both at 400 s.
        let p = Problem {
            cluster: Cluster {
                worker_types: vec![WorkerType("gpu".into())],
                capacity: vec![1.0],
            },
            jobs: vec![job(1, vec![1.0], 100.0), job(2, vec![1.0], 300.0)],
            quotas: Default::default(),
        };
        let a = MinMakespan::default().allocate(&p, None).unwrap();
        assert!((a.objective - 400.0).abs() < 1e-4, "{a:?}");
        assert!((a.shares[&JobId(1)][0] - 0.25).abs() < 1e-6);
    }

    #[test]
    fn a_job_that_can_run_nowhere_is_infeasible_and_missing_steps_invalid() {
        let mut p = Problem {
            cluster: Cluster {
                worker_types: vec![WorkerType("gpu".into())],
                capacity: vec![1.0],
            },
            jobs: vec![job(1, vec![0.0], 100.0)],
            quotas: Default::default(),
        };
        assert!(matches!(
            MinMakespan::default().allocate(&p, None),
            Err(PolicyError::Infeasible(_))
        ));
        p.jobs[0].throughput = vec![1.0];
        p.jobs[0].remaining_steps = None;
        assert!(matches!(
            MinMakespan::default().allocate(&p, None),
            Err(PolicyError::InvalidProblem(_))
        ));
    }
}
