//! Solve one allocation LP instance and print the objective and the build + solve wall time.
//!
//! cargo run --release -p optimizer --example solve -- INSTANCE.json --policy max_sum_throughput|max_min_fairness

use std::time::Instant;

use optimizer::instance::GavelInstance;
use optimizer::policy::{MaxMinFairness, MaxSumThroughput};
use optimizer::{Policy, PolicyKind, Problem};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: solve INSTANCE.json [--policy max_sum_throughput|max_min_fairness]";
    let path = args.first().filter(|a| !a.starts_with("--")).ok_or(usage)?;
    let policy = match args
        .iter()
        .position(|a| a == "--policy")
        .map(|i| args.get(i + 1))
    {
        None => PolicyKind::MaxSumThroughput(MaxSumThroughput::default()),
        Some(Some(p)) if p == "max_sum_throughput" => {
            PolicyKind::MaxSumThroughput(MaxSumThroughput::default())
        }
        Some(Some(p)) if p == "max_min_fairness" => {
            PolicyKind::MaxMinFairness(MaxMinFairness::default())
        }
        Some(other) => return Err(format!("unknown policy {other:?}; {usage}").into()),
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let instance: GavelInstance =
        serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let problem: Problem = instance.into();
    let start = Instant::now();
    let allocation = policy.allocate(&problem, None)?;
    let wall = start.elapsed();
    println!(
        "{},{},{:.6},{:.4}",
        policy.name(),
        problem.jobs.len(),
        allocation.objective,
        wall.as_secs_f64()
    );
    Ok(())
}
