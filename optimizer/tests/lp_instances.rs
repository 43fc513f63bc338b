//! The max-sum and max-min optima on `shared/data/lp_instances` match the reference values in its
//! SOURCE.md (cvxpy + ECOS) within a relative 1e-6, and the allocations respect every constraint.

use optimizer::instance::GavelInstance;
use optimizer::policy::{MaxMinFairness, MaxSumThroughput};
use optimizer::{Policy, Problem};

fn instance(n: usize) -> Problem {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../shared/data/lp_instances/gavel_n{n}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<GavelInstance>(&text).unwrap().into()
}

/// (jobs, max-sum optimum, max-min optimum) from shared/data/lp_instances/SOURCE.md.
const REFERENCE: [(usize, f64, f64); 4] = [
    (256, 7400.037346, 0.899122),
    (1024, 28206.610171, 0.913106),
    (2048, 56071.920289, 0.918300),
    (8192, 224943.504623, 0.921783),
];

fn check_feasible(p: &Problem, a: &optimizer::Allocation) {
    for (used, cap) in a.usage(p).iter().zip(&p.cluster.capacity) {
        assert!(used <= cap, "{used} workers used of {cap}");
    }
    for x in a.shares.values() {
        assert!(x.iter().all(|s| (0.0..=1.0).contains(s)));
        assert!(x.iter().sum::<f64>() <= 1.0);
    }
}

#[test]
fn max_sum_throughput_matches_the_reference_optimum() {
    for (n, max_sum, _) in REFERENCE {
        let p = instance(n);
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        check_feasible(&p, &a);
        let gap = (a.objective - max_sum).abs() / max_sum;
        // The reference prints 6 decimals: allow for that rounding too.
        assert!(
            gap <= 1e-6 + 5e-7 / max_sum,
            "n={n}: {} vs {max_sum} (gap {gap:e})",
            a.objective
        );
        assert!((a.throughput(&p) - a.objective).abs() <= 1e-9 * max_sum);
    }
}

#[test]
fn max_min_fairness_matches_the_reference_optimum() {
    for (n, _, max_min) in REFERENCE {
        let p = instance(n);
        let a = MaxMinFairness::default().allocate(&p, None).unwrap();
        check_feasible(&p, &a);
        let gap = (a.objective - max_min).abs() / max_min;
        assert!(
            gap <= 1e-6 + 5e-7 / max_min,
            "n={n}: {} vs {max_min} (gap {gap:e})",
            a.objective
        );
    }
}
