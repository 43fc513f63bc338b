//! Allocation LP build + solve time for max-sum throughput and max-min fairness on Gavel's
//! instances (256 to 8,192 jobs, identical jobs merged into classes) and on the same instances
//! with every job distinct (2,048 and 8,192 jobs, nothing to merge), side by side in one run:
//! ours with the structured interior-point method (the default), ours with the general solver
//! (clarabel on the whole LP), and the reference (`benches/lp_reference.py`: cvxpy + ECOS; needs
//! `pip install numpy cvxpy ecos`, run with `python3` or the interpreter in
//! `LP_REFERENCE_PYTHON`). Prints a table with every objective, so equal optima are visible
//! next to the times.
//!
//! cargo bench -p benches --bench lp_policies

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use optimizer::instance::GavelInstance;
use optimizer::lp::LpSolver;
use optimizer::policy::{MaxMinFairness, MaxSumThroughput};
use optimizer::{Policy, PolicyKind, Problem};

const INSTANCES: [&str; 6] = [
    "gavel_n256",
    "gavel_n1024",
    "gavel_n2048",
    "gavel_n8192",
    "gavel_n2048_distinct",
    "gavel_n8192_distinct",
];
const RUNS: usize = 5;

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn instance_path(name: &str) -> PathBuf {
    here().join(format!("../datasets/data/lp_instances/{name}.json"))
}

/// (policy, instance) -> (objective, median wall seconds) from the reference script.
type ReferenceTimes = BTreeMap<(String, String), (f64, f64)>;

fn reference() -> Result<ReferenceTimes, String> {
    let python = std::env::var("LP_REFERENCE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut out = BTreeMap::new();
    for _ in 0..RUNS {
        let o = Command::new(&python)
            .arg(here().join("lp_reference.py"))
            .args(INSTANCES.map(instance_path))
            .output()
            .map_err(|e| format!("{python}: {e}"))?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("failed")
                .to_string());
        }
        for line in String::from_utf8_lossy(&o.stdout).lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let (obj, wall): (f64, f64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
            out.entry((f[0].to_string(), f[1].to_string()))
                .or_insert_with(|| (obj, Vec::new()))
                .1
                .push(wall);
        }
    }
    Ok(out
        .into_iter()
        .map(|(k, (obj, w))| (k, (obj, median(w))))
        .collect())
}

fn median(mut w: Vec<f64>) -> f64 {
    w.sort_by(f64::total_cmp);
    w[w.len() / 2]
}

/// (objective, median wall seconds) of `RUNS` solves.
fn time(policy: &PolicyKind, problem: &Problem) -> (f64, f64) {
    let mut walls = Vec::new();
    let mut objective = 0.0;
    for _ in 0..RUNS {
        let start = Instant::now();
        objective = policy.allocate(problem, None).unwrap().objective;
        walls.push(start.elapsed().as_secs_f64());
    }
    (objective, median(walls))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("lp_policies: bench");
        return;
    }
    let policies = |solver| {
        [
            PolicyKind::MaxSumThroughput(MaxSumThroughput {
                normalize: false,
                solver,
            }),
            PolicyKind::MaxMinFairness(MaxMinFairness { solver }),
        ]
    };
    let reference = reference();
    if let Err(e) = &reference {
        eprintln!(
            "reference solver unavailable ({e}); install it with `pip install numpy cvxpy ecos`"
        );
    }
    println!(
        "| policy | instance | ours, structured: objective | ours, structured: ms | ours, general (clarabel): objective | ours, general: ms | cvxpy+ECOS: objective | cvxpy+ECOS: ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for name in INSTANCES {
        let text = std::fs::read_to_string(instance_path(name)).unwrap();
        let problem: Problem = serde_json::from_str::<GavelInstance>(&text).unwrap().into();
        for (structured, general) in policies(LpSolver::Structured)
            .into_iter()
            .zip(policies(LpSolver::General))
        {
            let (s_obj, s_wall) = time(&structured, &problem);
            let (g_obj, g_wall) = time(&general, &problem);
            let (ref_obj, ref_wall) = match &reference {
                Ok(r) => r
                    .get(&(structured.name().to_string(), name.to_string()))
                    .map(|(o, w)| (format!("{o:.6}"), format!("{:.1}", w * 1000.0)))
                    .unwrap_or_default(),
                Err(_) => ("-".into(), "-".into()),
            };
            println!(
                "| {} | {name} | {s_obj:.6} | {:.1} | {g_obj:.6} | {:.1} | {ref_obj} | {ref_wall} |",
                structured.name(),
                s_wall * 1000.0,
                g_wall * 1000.0,
            );
        }
    }
}
