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
            PolicyKind::MaxSumThroughput(MaxSumThroughput { normalize: true }),
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
            PolicyKind::MaxSumThroughput(MaxSumThroughput { normalize: true })
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
}
