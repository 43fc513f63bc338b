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
//! within capacity, and each tenant's within its quota. A policy chooses the [`Objective`]:
//! a weighted sum of shares, or the smallest weighted share (max-min, one more variable).
//!
//! Two methods solve it ([`LpSolver`]). [`block_ipm`] uses the LP's shape: only the capacity and
//! quota rows join jobs, so each Newton step reduces to a dense system the size of those rows;
//! it is the default (at 2,048 distinct jobs ~5 ms where clarabel takes ~100 ms and cvxpy + ECOS
//! ~70 ms; `cargo bench -p benches --bench lp_policies` measures all three in one run). It does
//! not detect infeasibility, so when it does not converge [`general`] (clarabel on the whole LP)
//! solves the problem and says why there is no answer; tests check both give the same optimum.
//! [`AllocationLp::solve`] cleans the answer: interior-point solutions sit within ~1e-9 of the
//! constraints, so shares are clamped to [0, 1] and any row or column that overshoots is scaled
//! back, which makes "capacity is never exceeded" hold exactly.

pub mod block_ipm;
pub mod general;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

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

/// Which method solves the allocation LP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LpSolver {
    /// The block-structured interior-point method ([`block_ipm`]); when it does not converge
    /// (an infeasible problem, numerical trouble) the general solver takes over and decides.
    #[default]
    Structured,
    /// clarabel on the whole LP through good_lp ([`general`]).
    General,
}

impl LpSolver {
    pub fn is_default(&self) -> bool {
        *self == LpSolver::default()
    }
}

/// What the policy maximises, from a coefficient per class and worker type.
pub enum Objective<F: Fn(&Class, usize) -> f64> {
    /// Σ_c Σ_j coef(c, j) · y\[c\]\[j\]: each member's shares weighted by `coef`, summed.
    Linear(F),
    /// The smallest Σ_j coef(c, j) · y\[c\]\[j\] / n_c over classes (every member of a class
    /// gets y / n_c).
    MaxMin(F),
}

pub struct AllocationLp<'p> {
    problem: &'p Problem,
    solver: LpSolver,
    pub classes: Vec<Class>,
}

impl<'p> AllocationLp<'p> {
    pub fn new(problem: &'p Problem, solver: LpSolver) -> Result<Self, PolicyError> {
        problem.validate()?;
        Ok(Self {
            problem,
            solver,
            classes: classes(problem),
        })
    }

    /// Solves and returns cleaned per-job shares (`objective` left at 0 for the policy to fill).
    pub fn solve<F: Fn(&Class, usize) -> f64>(
        self,
        objective: Objective<F>,
    ) -> Result<Allocation, PolicyError> {
        let per_class = match self.solver {
            LpSolver::Structured => self.structured(&objective),
            LpSolver::General => None,
        };
        let per_class = match per_class {
            Some(s) => s,
            None => general::solve(self.problem, &self.classes, &objective)?,
        };
        let k = self.problem.cluster.capacity.len();
        let mut shares = vec![vec![0.0; k]; self.problem.jobs.len()];
        for (class, each) in self.classes.iter().zip(per_class) {
            let each: Vec<f64> = each.into_iter().map(|s| s.clamp(0.0, 1.0)).collect();
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

    /// Per class, each member's share per worker type, from [`block_ipm`]; `None` when it did not
    /// converge. Variables in per-member shares: a class of n jobs uses n times a member's share
    /// of each coupling row. Types with no capacity (or no quota left to the class's tenant) pin
    /// their shares at 0 and are left out.
    fn structured<F: Fn(&Class, usize) -> f64>(
        &self,
        objective: &Objective<F>,
    ) -> Option<Vec<Vec<f64>>> {
        let cap = &self.problem.cluster.capacity;
        let k = cap.len();
        let tenants: Vec<&String> = self.problem.quotas.keys().collect();
        let mut coupling_rhs: Vec<f64> = cap
            .iter()
            .map(|c| if *c > 0.0 { *c } else { 1.0 })
            .collect();
        for q in self.problem.quotas.values() {
            coupling_rhs.extend(q.iter().map(|v| if *v > 0.0 { *v } else { 1.0 }));
        }
        let (coef, max_min) = match objective {
            Objective::Linear(f) => (f, false),
            Objective::MaxMin(f) => (f, true),
        };
        let mut types = Vec::with_capacity(self.classes.len());
        let blocks = self
            .classes
            .iter()
            .map(|class| {
                let n = class.size();
                let quota = class
                    .tenant
                    .as_ref()
                    .and_then(|t| tenants.iter().position(|q| *q == t));
                let hi = class.max_share.unwrap_or(1.0);
                let mut mine = Vec::new();
                let mut vars = Vec::new();
                for (j, &capacity) in cap.iter().enumerate() {
                    let quota_left = quota.is_none_or(|q| self.problem.quotas[tenants[q]][j] > 0.0);
                    if class.throughput[j] <= 0.0 || capacity <= 0.0 || !quota_left || hi <= 0.0 {
                        continue;
                    }
                    let c = coef(class, j);
                    let used = class.scale_factor as f64 * n;
                    let mut uses = vec![(j, used)];
                    if let Some(q) = quota {
                        uses.push((k + q * k + j, used));
                    }
                    mine.push(j);
                    vars.push(block_ipm::Var {
                        gain: c * n,
                        fair: c,
                        uses,
                    });
                }
                types.push(mine);
                block_ipm::Block {
                    vars,
                    hi,
                    lo: class.min_share,
                }
            })
            .collect();
        let lp = block_ipm::BlockLp {
            blocks,
            coupling_rhs,
            max_min,
        };
        let solution = lp.solve()?;
        Some(
            solution
                .x
                .iter()
                .zip(&types)
                .map(|(x, types)| {
                    let mut each = vec![0.0; k];
                    for (v, &j) in x.iter().zip(types) {
                        each[j] = *v;
                    }
                    each
                })
                .collect(),
        )
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

    /// `n` distinct jobs on three types (throughputs spread like Gavel's), in one tenant with a
    /// quota; every fifth with a minimum share, every seventh with a maximum.
    fn distinct(n: u64) -> Problem {
        let jobs = (0..n)
            .map(|i| {
                let f = 1.0 + (i as f64 * 0.618).fract();
                JobDemand {
                    scale_factor: [1, 1, 2, 4][i as usize % 4],
                    throughput: vec![f, 2.0 * f + (i % 3) as f64, 3.5 * f],
                    min_share: (i % 5 == 0).then_some(0.05),
                    max_share: (i % 7 == 0).then_some(0.5),
                    ..job(i, 0.0, if i % 2 == 0 { "a" } else { "b" })
                }
            })
            .collect();
        let gpus = n as f64 / 4.0;
        Problem {
            cluster: Cluster {
                worker_types: (0..3).map(|i| WorkerType(format!("t{i}"))).collect(),
                capacity: vec![gpus; 3],
            },
            jobs,
            quotas: [("a".to_string(), vec![gpus / 2.0; 3])].into(),
        }
    }

    /// The structured method itself converges on every objective (no fallback hides a failure),
    /// to the general solver's optimum.
    #[test]
    fn the_structured_method_converges_to_the_general_optimum() {
        use super::{AllocationLp, LpSolver, Objective, general};
        let p = distinct(300);
        let value = |shares: &[Vec<f64>],
                     lp: &AllocationLp,
                     coef: &dyn Fn(&super::Class, usize) -> f64,
                     max_min: bool| {
            let per: Vec<f64> = lp
                .classes
                .iter()
                .zip(shares)
                .map(|(c, x)| (0..3).map(|j| coef(c, j) * x[j]).sum::<f64>())
                .collect();
            if max_min {
                per.iter().cloned().fold(f64::INFINITY, f64::min)
            } else {
                per.iter().sum()
            }
        };
        let lp = AllocationLp::new(&p, LpSolver::Structured).unwrap();
        assert_eq!(lp.classes.len(), 300, "every job distinct");
        let coef = |c: &super::Class, j: usize| c.throughput[j] * c.weight;
        for max_min in [false, true] {
            let (s, g) = if max_min {
                let o = Objective::MaxMin(coef);
                (
                    lp.structured(&o).expect("converges"),
                    general::solve(&p, &lp.classes, &o).unwrap(),
                )
            } else {
                let o = Objective::Linear(coef);
                (
                    lp.structured(&o).expect("converges"),
                    general::solve(&p, &lp.classes, &o).unwrap(),
                )
            };
            let (vs, vg) = (
                value(&s, &lp, &coef, max_min),
                value(&g, &lp, &coef, max_min),
            );
            assert!(
                (vs - vg).abs() <= 1e-7 * vg.abs(),
                "max_min={max_min}: {vs} vs {vg}"
            );
        }
    }

    #[test]
    fn an_impossible_minimum_falls_back_and_is_reported_infeasible() {
        let mut p = distinct(40);
        p.jobs
            .iter_mut()
            .for_each(|j| (j.min_share, j.max_share) = (Some(0.9), None));
        let lp = super::AllocationLp::new(&p, super::LpSolver::Structured).unwrap();
        assert!(
            lp.structured(&super::Objective::Linear(
                |c: &super::Class, j| c.throughput[j]
            ))
            .is_none()
        );
        assert!(matches!(
            MaxSumThroughput::default().allocate(&p, None),
            Err(PolicyError::Infeasible(_))
        ));
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
