//! Allocation policies: one file per policy behind [`Policy`], chosen with [`PolicyKind`].

pub mod max_min_fairness;
pub mod max_sum_throughput;
pub mod min_makespan;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::problem::{Allocation, Problem};

pub use max_min_fairness::MaxMinFairness;
pub use max_sum_throughput::MaxSumThroughput;
pub use min_makespan::MinMakespan;

/// A pure decision: the same problem and previous allocation always give the same answer.
pub trait Policy {
    fn name(&self) -> &'static str;
    fn allocate(
        &self,
        problem: &Problem,
        previous: Option<&Allocation>,
    ) -> Result<Allocation, PolicyError>;
}

/// The policy an operator names in TOML, e.g. `policy = "max_min_fairness"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyKind {
    MaxSumThroughput(MaxSumThroughput),
    MaxMinFairness(MaxMinFairness),
    MinMakespan(MinMakespan),
}

impl PolicyKind {
    pub fn policy(&self) -> &dyn Policy {
        match self {
            PolicyKind::MaxSumThroughput(p) => p,
            PolicyKind::MaxMinFairness(p) => p,
            PolicyKind::MinMakespan(p) => p,
        }
    }
}

impl Policy for PolicyKind {
    fn name(&self) -> &'static str {
        self.policy().name()
    }

    fn allocate(
        &self,
        problem: &Problem,
        previous: Option<&Allocation>,
    ) -> Result<Allocation, PolicyError> {
        self.policy().allocate(problem, previous)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::problem::{Cluster, JobDemand};
    use crate::units::{JobId, WorkerType};

    fn problem(caps: Vec<f64>, jobs: Vec<(u32, Vec<f64>, f64)>) -> Problem {
        Problem {
            cluster: Cluster {
                worker_types: (0..caps.len())
                    .map(|i| WorkerType(format!("t{i}")))
                    .collect(),
                capacity: caps,
            },
            jobs: jobs
                .into_iter()
                .enumerate()
                .map(|(i, (s, t, w))| JobDemand {
                    id: JobId(i as u64 * 7),
                    scale_factor: s,
                    throughput: t,
                    weight: w,
                    remaining_steps: Some(100.0 * (i as f64 + 1.0)),
                    min_share: None,
                    max_share: None,
                    tenant: None,
                })
                .collect(),
            quotas: Default::default(),
        }
    }

    fn all() -> Vec<PolicyKind> {
        vec![
            PolicyKind::MaxSumThroughput(MaxSumThroughput::default()),
            PolicyKind::MaxSumThroughput(MaxSumThroughput {
                normalize: true,
                ..Default::default()
            }),
            PolicyKind::MaxMinFairness(MaxMinFairness::default()),
            PolicyKind::MinMakespan(MinMakespan::default()),
        ]
    }

    #[test]
    fn max_sum_fills_the_fastest_type_first() {
        // One GPU of each type; job 0 is 10x faster on t1, job 1 equally fast on both.
        let p = problem(
            vec![1.0, 1.0],
            vec![(1, vec![1.0, 10.0], 1.0), (1, vec![2.0, 2.0], 1.0)],
        );
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        assert!((a.objective - 12.0).abs() < 1e-6, "{a:?}");
        assert!((a.shares[&JobId(0)][1] - 1.0).abs() < 1e-6);
        assert!((a.shares[&JobId(7)][0] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn max_min_gives_equal_normalised_shares_to_identical_jobs() {
        let p = problem(vec![1.0], vec![(1, vec![3.0], 1.0), (1, vec![3.0], 1.0)]);
        let a = MaxMinFairness::default().allocate(&p, None).unwrap();
        assert!(
            (a.shares[&JobId(0)][0] - 0.5).abs() < 1e-6
                && (a.shares[&JobId(7)][0] - 0.5).abs() < 1e-6,
            "{a:?}"
        );
        // Twice the weight, twice the share.
        let p = problem(vec![1.0], vec![(1, vec![3.0], 2.0), (1, vec![3.0], 1.0)]);
        let a = MaxMinFairness::default().allocate(&p, None).unwrap();
        assert!((a.shares[&JobId(0)][0] - 2.0 / 3.0).abs() < 1e-5, "{a:?}");
    }

    #[test]
    fn invalid_problems_are_typed_errors() {
        let cases = [
            (problem(vec![], vec![]), "no worker types"),
            (
                problem(vec![1.0], vec![(1, vec![1.0, 2.0], 1.0)]),
                "2 throughputs for 1 worker types",
            ),
            (problem(vec![-1.0], vec![]), "capacity of t0 is -1"),
            (
                problem(vec![1.0], vec![(1, vec![f64::NAN], 1.0)]),
                "throughput NaN",
            ),
            (
                problem(vec![1.0], vec![(0, vec![1.0], 1.0)]),
                "scale factor 0",
            ),
            (problem(vec![1.0], vec![(1, vec![1.0], 0.0)]), "weight 0"),
        ];
        for (p, expected) in cases {
            for policy in all() {
                match policy.allocate(&p, None) {
                    Err(PolicyError::InvalidProblem(m)) => assert!(m.contains(expected), "{m}"),
                    other => panic!("{expected}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn operators_name_the_policy_in_toml_and_typos_are_rejected() {
        let p: PolicyKind =
            toml::from_str("policy = \"max_sum_throughput\"\nnormalize = true\n").unwrap();
        assert_eq!(
            p,
            PolicyKind::MaxSumThroughput(MaxSumThroughput {
                normalize: true,
                ..Default::default()
            })
        );
        let p: PolicyKind = toml::from_str("policy = \"max_min_fairness\"\n").unwrap();
        assert_eq!(p.name(), "max_min_fairness");
        let e = toml::from_str::<PolicyKind>("policy = \"max_sum_throughput\"\nnormalise = true\n")
            .unwrap_err();
        assert!(e.to_string().contains("normalise"), "{e}");
        assert!(toml::from_str::<PolicyKind>("policy = \"fastest\"\n").is_err());
    }

    fn arb_problem() -> impl Strategy<Value = Problem> {
        (1usize..4).prop_flat_map(|k| {
            (
                proptest::collection::vec(0.0f64..8.0, k),
                proptest::collection::vec(
                    (
                        1u32..5,
                        proptest::collection::vec(0.0f64..10.0, k),
                        0.5f64..3.0,
                    ),
                    0..12,
                ),
            )
                .prop_map(|(caps, jobs)| problem(caps, jobs))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Capacity is never exceeded, each job runs at most full time, the answer is
        /// deterministic, and re-planning an unchanged snapshot with the previous plan changes
        /// nothing.
        #[test]
        fn allocations_respect_capacity_and_are_stable(p in arb_problem()) {
            for policy in all() {
                let a = match policy.allocate(&p, None) {
                    // A job with no capacity it can use never finishes: that is the typed answer.
                    Err(PolicyError::Infeasible(_)) if policy.name() == "min_makespan" => continue,
                    other => other.unwrap(),
                };
                for (used, cap) in a.usage(&p).iter().zip(&p.cluster.capacity) {
                    prop_assert!(used <= cap, "{}: {used} > {cap}", policy.name());
                }
                for x in a.shares.values() {
                    prop_assert!(x.iter().all(|s| (0.0..=1.0).contains(s)));
                    prop_assert!(x.iter().sum::<f64>() <= 1.0);
                }
                prop_assert_eq!(a.shares.len(), p.jobs.len());
                let again = policy.allocate(&p, Some(&a)).unwrap();
                prop_assert_eq!(&again, &a);
                prop_assert_eq!(&policy.allocate(&p, None).unwrap(), &a, "deterministic");
            }
        }
    }

    /// Random problems with every base row: minimum and maximum shares, tenants with quotas,
    /// weights, types some jobs cannot use, identical jobs.
    fn arb_rich_problem() -> impl Strategy<Value = Problem> {
        (
            arb_problem(),
            proptest::collection::vec((0u8..4, 0u8..3, 0u8..3), 12),
            0.0f64..6.0,
        )
            .prop_map(|(mut p, extra, quota)| {
                let k = p.cluster.capacity.len();
                for (j, (share, tenant, twin)) in p.jobs.iter_mut().zip(extra) {
                    match share {
                        1 => j.min_share = Some(0.1),
                        2 => j.max_share = Some(0.6),
                        3 => (j.min_share, j.max_share) = (Some(0.05), Some(0.5)),
                        _ => {}
                    }
                    j.tenant = Some(format!("tenant{tenant}"));
                    if twin == 0 {
                        j.throughput = vec![2.5; k];
                    }
                }
                p.quotas.insert("tenant0".into(), vec![quota; k]);
                p
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The structured method and the general solver reach the same optimum (relative 1e-6),
        /// or the same kind of error; both answers respect capacity.
        #[test]
        fn structured_and_general_solvers_agree(p in arb_rich_problem()) {
            use crate::lp::LpSolver;
            let pairs = [
                (
                    PolicyKind::MaxSumThroughput(MaxSumThroughput::default()),
                    PolicyKind::MaxSumThroughput(MaxSumThroughput { solver: LpSolver::General, ..Default::default() }),
                ),
                (
                    PolicyKind::MaxSumThroughput(MaxSumThroughput { normalize: true, ..Default::default() }),
                    PolicyKind::MaxSumThroughput(MaxSumThroughput { normalize: true, solver: LpSolver::General }),
                ),
                (
                    PolicyKind::MaxMinFairness(MaxMinFairness::default()),
                    PolicyKind::MaxMinFairness(MaxMinFairness { solver: LpSolver::General }),
                ),
                (
                    PolicyKind::MinMakespan(MinMakespan::default()),
                    PolicyKind::MinMakespan(MinMakespan { solver: LpSolver::General }),
                ),
            ];
            for (structured, general) in pairs {
                match (structured.allocate(&p, None), general.allocate(&p, None)) {
                    (Ok(a), Ok(b)) => {
                        // Never worse than the general solver (relative 1e-6); where it is
                        // better, by no more than the general solver's own inaccuracy (on
                        // near-degenerate problems, e.g. a makespan of 1/t for tiny t).
                        let scale = a.objective.abs().max(b.objective.abs());
                        let better = if structured.name() == "min_makespan" {
                            b.objective - a.objective
                        } else {
                            a.objective - b.objective
                        };
                        prop_assert!(
                            better >= -(1e-6 * scale + 1e-9) && better <= 1e-4 * scale + 1e-9,
                            "{}: structured {} vs general {}", structured.name(), a.objective, b.objective
                        );
                        for x in [&a, &b] {
                            for (used, cap) in x.usage(&p).iter().zip(&p.cluster.capacity) {
                                prop_assert!(used <= cap);
                            }
                        }
                    }
                    (Err(a), Err(b)) => prop_assert_eq!(
                        std::mem::discriminant(&a), std::mem::discriminant(&b), "{} vs {}", a, b
                    ),
                    // Min-makespan with a job that can get no time: the general solver's
                    // interior point leaves it ~1e-13 of a share, a makespan of ~1e17 s.
                    (Err(PolicyError::Infeasible(_)), Ok(b)) | (Ok(b), Err(PolicyError::Infeasible(_)))
                        if structured.name() == "min_makespan" && b.objective > 1e12 => {}
                    (a, b) => prop_assert!(false, "{}: {:?} vs {:?}", structured.name(), a, b),
                }
            }
        }
    }
}
