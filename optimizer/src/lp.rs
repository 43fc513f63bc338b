//! LP scaffolding shared by every allocation policy.
//!
//! Jobs that are identical to the policy (same throughput row, scale factor and weight) form a
//! [`Class`]; the LP has one variable `y[c][j] ∈ [0, n_c]` per class and worker type: the total
//! share of time the class's `n_c` jobs run on type `j`, fixed at 0 where they cannot run. This
//! is exact, not an approximation: any class solution splits evenly into `x[m][j] = y[c][j] / n_c`
//! with the same objective, and because the allocation LPs are convex and symmetric in identical
//! jobs, averaging an optimal per-job solution over a class is again optimal. Real traces repeat
//! job types heavily (Gavel's 8,192-job instance has a few dozen classes), so the LP shrinks by
//! orders of magnitude; with all jobs distinct it is the per-job LP.
//!
//! Base rows: each class's shares sum to at most `n_c · max_share` (each job at most full time)
//! and at least `n_c · min_share`; on each type the workers in use (Σ_c s_c · y\[c\]\[j\]) stay
//! within capacity, and each tenant's within its quota. A policy adds its own
//! variables, objective and rows; [`AllocationLp::solve`] runs clarabel and cleans the answer:
//! interior-point solutions sit within ~1e-9 of the constraints, so shares are clamped to [0, 1]
//! and any row or column that overshoots is scaled back, which makes "capacity is never exceeded"
//! hold exactly.

use std::collections::HashMap;

use good_lp::{
    Constraint, Expression, ProblemVariables, Solution, SolverModel, Variable, clarabel, variable,
};

use crate::error::PolicyError;
use crate::problem::{Allocation, Problem};

/// Jobs the policy cannot tell apart.
#[derive(Clone, Debug)]
pub struct Class {
    pub throughput: Vec<f64>,
    pub scale_factor: u32,
    pub weight: f64,
    pub remaining_steps: Option<f64>,
    pub min_share: Option<f64>,
    pub max_share: Option<f64>,
    pub tenant: Option<String>,
    /// Ordinals of the member jobs in `problem.jobs`, in order.
    pub members: Vec<usize>,
}

impl Class {
    pub fn size(&self) -> f64 {
        self.members.len() as f64
    }
}

/// Groups identical jobs, classes in order of their first member (deterministic).
pub fn classes(problem: &Problem) -> Vec<Class> {
    // Everything a policy or a base row reads of a job is in the key.
    type Key = (Vec<u64>, u32, [Option<u64>; 4], Option<String>);
    let mut index: HashMap<Key, usize> = HashMap::new();
    let mut out: Vec<Class> = Vec::new();
    for (m, job) in problem.jobs.iter().enumerate() {
        let numbers = [
            Some(job.weight.to_bits()),
            job.remaining_steps.map(f64::to_bits),
            job.min_share.map(f64::to_bits),
            job.max_share.map(f64::to_bits),
        ];
        let key = (
            job.throughput.iter().map(|t| t.to_bits()).collect(),
            job.scale_factor,
            numbers,
            job.tenant.clone(),
        );
        match index.get(&key) {
            Some(&c) => out[c].members.push(m),
            None => {
                index.insert(key, out.len());
                out.push(Class {
                    throughput: job.throughput.clone(),
                    scale_factor: job.scale_factor,
                    weight: job.weight,
                    remaining_steps: job.remaining_steps,
                    min_share: job.min_share,
                    max_share: job.max_share,
                    tenant: job.tenant.clone(),
                    members: vec![m],
                });
            }
        }
    }
    out
}

pub struct AllocationLp<'p> {
    problem: &'p Problem,
    pub classes: Vec<Class>,
    pub vars: ProblemVariables,
    /// `y[c][j]`, `None` where class `c` cannot run on type `j`.
    pub y: Vec<Vec<Option<Variable>>>,
}

impl<'p> AllocationLp<'p> {
    pub fn new(problem: &'p Problem) -> Result<Self, PolicyError> {
        problem.validate()?;
        let classes = classes(problem);
        let mut vars = ProblemVariables::new();
        let y = classes
            .iter()
            .map(|c| {
                c.throughput
                    .iter()
                    .map(|&t| (t > 0.0).then(|| vars.add(variable().min(0.0).max(c.size()))))
                    .collect()
            })
            .collect();
        Ok(Self {
            problem,
            classes,
            vars,
            y,
        })
    }

    /// Σ_j coef(j) · y\[c\]\[j\] for class `c`.
    pub fn row(&self, c: usize, coef: impl Fn(usize) -> f64) -> Expression {
        let mut e = Expression::with_capacity(self.y[c].len());
        for (j, v) in self.y[c].iter().enumerate() {
            if let Some(v) = v {
                e.add_mul(coef(j), *v);
            }
        }
        e
    }

    fn base_constraints(&self) -> Vec<Constraint> {
        let mut rows = Vec::with_capacity(self.y.len() + self.problem.cluster.capacity.len());
        for (c, class) in self.classes.iter().enumerate() {
            let runnable = self.y[c].iter().any(Option::is_some);
            let most = class.max_share.unwrap_or(1.0) * class.size();
            if runnable {
                rows.push(self.row(c, |_| 1.0).leq(most));
            }
            if let Some(least) = class.min_share.filter(|l| *l > 0.0) {
                // A job that must run but can run nowhere makes the problem infeasible.
                rows.push(self.row(c, |_| 1.0).geq(least * class.size()));
            }
        }
        for (tenant, quota) in &self.problem.quotas {
            for (j, &q) in quota.iter().enumerate() {
                let mut e = Expression::with_capacity(self.y.len());
                for (c, class) in self.classes.iter().enumerate() {
                    if class.tenant.as_ref() == Some(tenant)
                        && let Some(v) = self.y[c][j]
                    {
                        e.add_mul(class.scale_factor as f64, v);
                    }
                }
                rows.push(e.leq(q));
            }
        }
        for (j, &cap) in self.problem.cluster.capacity.iter().enumerate() {
            let mut e = Expression::with_capacity(self.y.len());
            for (c, class) in self.classes.iter().enumerate() {
                if let Some(v) = self.y[c][j] {
                    e.add_mul(class.scale_factor as f64, v);
                }
            }
            rows.push(e.leq(cap));
        }
        rows
    }

    /// Maximises the smallest Σ_j coef(class, j) · y\[c\]\[j\] / n_c over classes (every member of a
    /// class gets y / n_c): one extra variable `t` and one row per class. With no jobs, nothing
    /// to share.
    pub fn solve_max_min(
        mut self,
        coef: impl Fn(&Class, usize) -> f64,
    ) -> Result<Allocation, PolicyError> {
        if self.classes.is_empty() {
            return self.solve(Expression::default(), Vec::new());
        }
        let t = self.vars.add(variable().min(0.0));
        let rows = (0..self.classes.len())
            .map(|c| {
                let class = &self.classes[c];
                self.row(c, |j| coef(class, j) / class.size()).geq(t)
            })
            .collect();
        self.solve(t.into(), rows)
    }

    /// Maximises `objective` under the base rows and `extra` rows; returns cleaned per-job shares.
    pub fn solve(
        self,
        objective: Expression,
        extra: Vec<Constraint>,
    ) -> Result<Allocation, PolicyError> {
        let base = self.base_constraints();
        let mut model = self.vars.maximise(objective).using(clarabel);
        model
            .settings()
            .tol_gap_rel(1e-10)
            .tol_gap_abs(1e-10)
            .tol_feas(1e-10);
        let model = model.with_all(base).with_all(extra);
        let solution = model.solve().map_err(|e| match e {
            good_lp::ResolutionError::Infeasible => {
                PolicyError::Infeasible("no allocation satisfies every constraint".into())
            }
            other => PolicyError::Solver(other.to_string()),
        })?;
        let k = self.problem.cluster.capacity.len();
        let mut shares = vec![vec![0.0; k]; self.problem.jobs.len()];
        for (class, y) in self.classes.iter().zip(&self.y) {
            let each: Vec<f64> = y
                .iter()
                .map(|v| v.map_or(0.0, |v| (solution.value(v) / class.size()).clamp(0.0, 1.0)))
                .collect();
            for &m in &class.members {
                shares[m].clone_from(&each);
            }
        }
        clean(self.problem, &mut shares);
        Ok(Allocation {
            shares: self.problem.jobs.iter().map(|j| j.id).zip(shares).collect(),
            objective: 0.0,
        })
    }
}

/// Scales back any job whose shares sum past 1 and any worker type used past its capacity. The
/// factors keep a 1e-12 relative margin so that recomputing the sums in floating point can never
/// land above the bound.
fn clean(problem: &Problem, shares: &mut [Vec<f64>]) {
    const MARGIN: f64 = 1.0 - 1e-12;
    for row in shares.iter_mut() {
        let sum: f64 = row.iter().sum();
        if sum > 1.0 {
            row.iter_mut().for_each(|s| *s *= MARGIN / sum);
        }
    }
    for (j, &cap) in problem.cluster.capacity.iter().enumerate() {
        let used = |shares: &[Vec<f64>]| -> f64 {
            problem
                .jobs
                .iter()
                .zip(shares.iter())
                .map(|(job, x)| job.scale_factor as f64 * x[j])
                .sum()
        };
        let u = used(shares);
        if u > cap {
            let f = if u > 0.0 { MARGIN * cap / u } else { 0.0 };
            shares.iter_mut().for_each(|x| x[j] *= f);
            debug_assert!(used(shares) <= cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::PolicyError;
    use crate::policy::{MaxSumThroughput, Policy};
    use crate::problem::{Cluster, JobDemand, Problem};
    use crate::units::{JobId, WorkerType};

    fn job(id: u64, t: f64, tenant: &str) -> JobDemand {
        JobDemand {
            id: JobId(id),
            scale_factor: 1,
            throughput: vec![t],
            weight: 1.0,
            remaining_steps: None,
            min_share: None,
            max_share: None,
            tenant: Some(tenant.into()),
        }
    }

    fn cluster(gpus: f64) -> Cluster {
        Cluster {
            worker_types: vec![WorkerType("gpu".into())],
            capacity: vec![gpus],
        }
    }

    #[test]
    fn identical_jobs_form_one_class_and_get_equal_shares() {
        let p = Problem {
            cluster: cluster(3.0),
            jobs: (0..6).map(|i| job(i, 2.0, "a")).collect(),
            quotas: Default::default(),
        };
        assert_eq!(super::classes(&p).len(), 1);
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        assert!(
            a.shares.values().all(|x| (x[0] - 0.5).abs() < 1e-6),
            "{a:?}"
        );
    }

    #[test]
    fn jobs_that_differ_in_any_field_a_policy_reads_are_different_classes() {
        let base = job(0, 2.0, "a");
        let variants = [
            JobDemand {
                remaining_steps: Some(5.0),
                ..base.clone()
            },
            JobDemand {
                min_share: Some(0.1),
                ..base.clone()
            },
            JobDemand {
                max_share: Some(0.9),
                ..base.clone()
            },
            JobDemand {
                tenant: Some("b".into()),
                ..base.clone()
            },
            JobDemand {
                weight: 2.0,
                ..base.clone()
            },
        ];
        for v in variants {
            let p = Problem {
                cluster: cluster(1.0),
                jobs: vec![
                    base.clone(),
                    JobDemand {
                        id: JobId(1),
                        ..v.clone()
                    },
                ],
                quotas: Default::default(),
            };
            assert_eq!(super::classes(&p).len(), 2, "{v:?}");
        }
    }

    #[test]
    fn tenant_quotas_cap_a_tenants_workers() {
        let p = Problem {
            cluster: cluster(4.0),
            jobs: vec![
                job(1, 10.0, "fast"),
                job(2, 10.0, "fast"),
                job(3, 1.0, "slow"),
                job(4, 1.0, "slow"),
            ],
            quotas: [("fast".to_string(), vec![1.0])].into(),
        };
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        let fast: f64 = a.shares[&JobId(1)][0] + a.shares[&JobId(2)][0];
        assert!(fast <= 1.0 + 1e-9 && fast > 0.99, "{a:?}");
        assert!((a.objective - (10.0 + 2.0)).abs() < 1e-5, "{a:?}");
    }

    #[test]
    fn min_and_max_shares_bind_and_impossible_minimums_are_infeasible() {
        let mut slow = job(2, 1.0, "a");
        slow.min_share = Some(0.5);
        let mut fast = job(1, 10.0, "a");
        fast.max_share = Some(0.25);
        let p = Problem {
            cluster: cluster(1.0),
            jobs: vec![fast, slow],
            quotas: Default::default(),
        };
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        assert!((a.shares[&JobId(1)][0] - 0.25).abs() < 1e-6, "{a:?}");
        assert!(a.shares[&JobId(2)][0] >= 0.5 - 1e-6, "{a:?}");
        let mut greedy = p.clone();
        greedy.jobs.iter_mut().for_each(|j| {
            j.min_share = Some(0.75);
            j.max_share = None;
        });
        assert!(matches!(
            MaxSumThroughput::default().allocate(&greedy, None),
            Err(PolicyError::Infeasible(_))
        ));
    }
}
