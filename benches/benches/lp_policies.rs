//! Allocation LP build + solve time at 256, 1,024, 2,048 and 8,192 jobs for max-sum throughput
//! and max-min fairness, side by side in one run with the reference solver
//! (`benches/lp_reference.py`: cvxpy + ECOS; needs `pip install numpy cvxpy ecos`).
//! Prints a table with both objectives, so equal optima are visible next to the times.
//!
//! cargo bench -p benches --bench lp_policies

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use optimizer::instance::GavelInstance;
use optimizer::policy::{MaxMinFairness, MaxSumThroughput};
use optimizer::{Policy, PolicyKind, Problem};

const SIZES: [usize; 4] = [256, 1024, 2048, 8192];
const RUNS: usize = 5;

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn instance_path(n: usize) -> PathBuf {
    here().join(format!("../datasets/data/lp_instances/gavel_n{n}.json"))
}

/// (policy, jobs) -> (objective, median wall seconds) from the reference script.
type ReferenceTimes = BTreeMap<(String, usize), (f64, f64)>;

fn reference() -> Result<ReferenceTimes, String> {
    let mut out = BTreeMap::new();
    for _ in 0..RUNS {
        let o = Command::new("python3")
            .arg(here().join("lp_reference.py"))
            .args(SIZES.map(instance_path))
            .output()
            .map_err(|e| format!("python3: {e}"))?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("failed")
                .to_string());
        }
        for line in String::from_utf8_lossy(&o.stdout).lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let (n, obj, wall): (usize, f64, f64) = (
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            );
            out.entry((f[0].to_string(), n))
                .or_insert_with(|| (obj, Vec::new()))
                .1
                .push(wall);
        }
    }
    Ok(out
        .into_iter()
        .map(|(k, (obj, mut w))| {
            w.sort_by(f64::total_cmp);
            (k, (obj, w[w.len() / 2]))
        })
        .collect())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("lp_policies: bench");
        return;
    }
    let policies = [
        PolicyKind::MaxSumThroughput(MaxSumThroughput::default()),
        PolicyKind::MaxMinFairness(MaxMinFairness::default()),
    ];
    let reference = reference();
    if let Err(e) = &reference {
        eprintln!(
            "reference solver unavailable ({e}); install it with `pip install numpy cvxpy ecos`"
        );
    }
    println!(
        "| policy | jobs | ours: objective | ours: build+solve (median of {RUNS}) | cvxpy+ECOS: objective | cvxpy+ECOS: build+solve (median of {RUNS}) |"
    );
    println!("|---|---|---|---|---|---|");
    for n in SIZES {
        let text = std::fs::read_to_string(instance_path(n)).unwrap();
        let problem: Problem = serde_json::from_str::<GavelInstance>(&text).unwrap().into();
        for p in &policies {
            let mut walls = Vec::new();
            let mut objective = 0.0;
            for _ in 0..RUNS {
                let start = Instant::now();
                objective = p.allocate(&problem, None).unwrap().objective;
                walls.push(start.elapsed().as_secs_f64());
            }
            walls.sort_by(f64::total_cmp);
            let (ref_obj, ref_wall) = match &reference {
                Ok(r) => r
                    .get(&(p.name().to_string(), n))
                    .map(|(o, w)| (format!("{o:.6}"), format!("{:.1} ms", w * 1000.0)))
                    .unwrap_or_default(),
                Err(_) => ("-".into(), "-".into()),
            };
            println!(
                "| {} | {n} | {objective:.6} | {:.1} ms | {ref_obj} | {ref_wall} |",
                p.name(),
                walls[RUNS / 2] * 1000.0
            );
        }
    }
    // Worst case for the class aggregation: every job distinct (throughputs perturbed by a
    // relative 1e-9 per job), so the LP keeps one variable per job and type.
    for n in [2048, 8192] {
        let text = std::fs::read_to_string(instance_path(n)).unwrap();
        let mut problem: Problem = serde_json::from_str::<GavelInstance>(&text).unwrap().into();
        for (m, job) in problem.jobs.iter_mut().enumerate() {
            job.throughput
                .iter_mut()
                .for_each(|t| *t *= 1.0 + 1e-9 * m as f64);
        }
        for p in &policies {
            let mut walls = Vec::new();
            let mut objective = 0.0;
            for _ in 0..3 {
                let start = Instant::now();
                objective = p.allocate(&problem, None).unwrap().objective;
                walls.push(start.elapsed().as_secs_f64());
            }
            walls.sort_by(f64::total_cmp);
            println!(
                "| {} | {n}, every job distinct | {objective:.6} | {:.1} ms | (as above) | |",
                p.name(),
                walls[1] * 1000.0
            );
        }
    }
}
