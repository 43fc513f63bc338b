//! The max-sum and max-min optima on `datasets/data/lp_instances` match the reference values in its
//! SOURCE.md (cvxpy + ECOS) within a relative 1e-6, and the allocations respect every constraint.

use optimizer::instance::GavelInstance;
use optimizer::policy::{MaxMinFairness, MaxSumThroughput};
use optimizer::{Policy, Problem};

fn instance(n: usize) -> Problem {
    load(&format!("gavel_n{n}.json"))
}

fn load(name: &str) -> Problem {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../datasets/data/lp_instances/{name}"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<GavelInstance>(&text).unwrap().into()
}

/// (jobs, max-sum optimum, max-min optimum) from datasets/data/lp_instances/SOURCE.md.
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

/// Every job distinct (no classes to merge): both methods, each against the reference optimum.
#[test]
fn distinct_jobs_match_the_reference_optimum_with_either_method() {
    use optimizer::lp::LpSolver;
    // (file, max-sum optimum, max-min optimum) from SOURCE.md.
    let reference = [("gavel_n2048_distinct.json", 56574.218985, 0.921930)];
    for (name, max_sum, max_min) in reference {
        let p = load(name);
        for solver in [LpSolver::Structured, LpSolver::General] {
            let a = MaxSumThroughput {
                normalize: false,
                solver,
            }
            .allocate(&p, None)
            .unwrap();
            check_feasible(&p, &a);
            let gap = (a.objective - max_sum).abs() / max_sum;
            assert!(
                gap <= 1e-6,
                "{name} {solver:?}: {} vs {max_sum}",
                a.objective
            );
            let a = MaxMinFairness { solver }.allocate(&p, None).unwrap();
            check_feasible(&p, &a);
            let gap = (a.objective - max_min).abs() / max_min;
            assert!(
                gap <= 1e-6,
                "{name} {solver:?}: {} vs {max_min}",
                a.objective
            );
        }
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

/// One LP against Gavel's bisection over the makespan (a feasibility LP per step) on the
/// 256-job instance with remaining steps 1,000 × (1 + m mod 7): within 1 %.
#[test]
fn min_makespan_in_one_lp_matches_gavels_bisection() {
    use optimizer::policy::MinMakespan;

    let mut p = instance(256);
    for (m, j) in p.jobs.iter_mut().enumerate() {
        j.remaining_steps = Some(1000.0 * (1 + m % 7) as f64);
    }
    let ours = MinMakespan::default().allocate(&p, None).unwrap().objective;
    // Gavel's feasibility LP, one variable per job and type: can every job finish within
    // `makespan`?
    let feasible = |makespan: f64| {
        use good_lp::{Expression, ProblemVariables, SolverModel, clarabel, variable};
        let mut vars = ProblemVariables::new();
        let k = p.cluster.capacity.len();
        let x: Vec<Vec<_>> = p
            .jobs
            .iter()
            .map(|_| {
                (0..k)
                    .map(|_| vars.add(variable().min(0.0).max(1.0)))
                    .collect()
            })
            .collect();
        let mut rows = Vec::new();
        for (job, xs) in p.jobs.iter().zip(&x) {
            let total: Expression = xs.iter().sum();
            rows.push(total.leq(1.0));
            let rate: Expression = xs.iter().zip(&job.throughput).map(|(v, t)| *t * *v).sum();
            rows.push(rate.geq(job.remaining_steps.unwrap() / makespan));
        }
        for j in 0..k {
            let used: Expression = p
                .jobs
                .iter()
                .zip(&x)
                .map(|(job, xs)| job.scale_factor as f64 * xs[j])
                .sum();
            rows.push(used.leq(p.cluster.capacity[j]));
        }
        match vars
            .maximise(Expression::default())
            .using(clarabel)
            .with_all(rows)
            .solve()
        {
            Ok(_) => true,
            Err(good_lp::ResolutionError::Infeasible) => false,
            Err(e) => panic!("{e}"),
        }
    };
    let (mut lo, mut hi) = (1.0, 1e9);
    assert!(feasible(hi) && !feasible(lo));
    let mut steps = 0;
    while (hi - lo) / hi > 1e-3 {
        let mid = (lo * hi).sqrt();
        if feasible(mid) {
            hi = mid
        } else {
            lo = mid
        }
        steps += 1;
    }
    let gap = (ours - hi).abs() / hi;
    println!(
        "min makespan: one LP {ours:.3} s; bisection {hi:.3} s after {steps} feasibility LPs; gap {gap:.2e}"
    );
    assert!(
        gap < 0.01,
        "one LP {ours} vs bisection {hi} after {steps} LPs (gap {gap:e})"
    );
    assert!(
        ours <= hi * (1.0 + 1e-6),
        "the single LP is never worse than bisection"
    );
}

/// Whole placements of the max-sum allocation on 4-GPU nodes: no node is over-committed, and
/// the rounding cost against the LP is reported.
#[test]
fn max_sum_allocations_place_on_4_gpu_nodes() {
    use optimizer::placement::{Node, place};
    for n in [256, 2048] {
        let p = instance(n);
        let nodes: Vec<Node> = p
            .cluster
            .capacity
            .iter()
            .enumerate()
            .flat_map(|(j, &c)| {
                (0..(c as u32).div_ceil(4)).map(move |i| Node {
                    name: format!("{j}-{i}"),
                    worker_type: j,
                    slots: 4,
                })
            })
            .collect();
        let a = MaxSumThroughput::default().allocate(&p, None).unwrap();
        let pl = place(&p, &a, &nodes, None).unwrap();
        for (used, node) in pl.node_usage(nodes.len()).iter().zip(&nodes) {
            assert!(*used <= node.slots);
        }
        println!(
            "n={n}: {} of {} jobs placed; throughput {:.1} vs LP {:.1}; rounding cost {:.2} %",
            pl.jobs.len(),
            p.jobs.len(),
            pl.throughput,
            pl.lp_throughput,
            100.0 * pl.rounding_cost()
        );
        assert!(
            pl.rounding_cost() < 0.10,
            "rounding cost {}",
            pl.rounding_cost()
        );
    }
}
