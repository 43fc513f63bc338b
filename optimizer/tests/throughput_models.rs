//! Step-time models on the real profiles in `datasets/data/pollux/traces` (T4) and
//! `datasets/data/sia/traces` (several GPU types): error in sample, and when fitted on at most 4
//! replicas and asked about more (placements with more replicas and the scalability runs).
//! Three models side by side: Pollux's, Optimus' (NNLS) and a measured table.
//! `cargo test -p optimizer --test throughput_models -- --nocapture` prints the table.

use std::path::{Path, PathBuf};

use optimizer::throughput::optimus::OptimusModel;
use optimizer::throughput::pollux::PolluxModel;
use optimizer::throughput::table::MeasuredTable;
use optimizer::throughput::{Placement, StepSample, ThroughputModel, mean_relative_error};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/data")
}

/// Rows of a placements file (`placement` = one digit per node, GPUs on that node) or of a
/// scalability file (`num_nodes`, `num_replicas`).
fn read(path: &Path) -> Vec<StepSample> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let headers = r.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let (bsz, step, sync) = (
        col("local_bsz").unwrap(),
        col("step_time").unwrap(),
        col("sync_time").unwrap(),
    );
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            let (nodes, replicas) = match col("placement") {
                Some(i) => {
                    let digits: Vec<u32> = rec[i]
                        .chars()
                        .map(|c| c.to_digit(10).expect("placement digits"))
                        .collect();
                    (digits.len() as u32, digits.iter().sum())
                }
                None => (
                    rec[col("num_nodes").unwrap()].parse().unwrap(),
                    rec[col("num_replicas").unwrap()].parse().unwrap(),
                ),
            };
            StepSample {
                placement: Placement {
                    ps: 0,
                    nodes,
                    replicas,
                    local_bsz: rec[bsz].parse().unwrap(),
                },
                step_time: rec[step].parse().unwrap(),
                sync_time: Some(rec[sync].parse().unwrap()),
            }
        })
        .collect()
}

/// (model, gpu, placements, scalability) for every profile in the data.
fn profiles() -> Vec<(String, String, Vec<StepSample>, Vec<StepSample>)> {
    let mut out = Vec::new();
    for (dir, gpu_files) in [("pollux/traces", false), ("sia/traces", true)] {
        let mut models: Vec<_> = std::fs::read_dir(data().join(dir))
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .collect();
        models.sort_by_key(|e| e.file_name());
        for m in models {
            let mut files: Vec<_> = std::fs::read_dir(m.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect();
            files.sort();
            for f in files
                .iter()
                .filter(|f| f.starts_with("placements") && f.ends_with(".csv"))
            {
                let gpu = f
                    .trim_start_matches("placements")
                    .trim_start_matches('-')
                    .trim_end_matches(".csv");
                if gpu_files && gpu.is_empty() {
                    continue; // Sia's copy of the Pollux T4 file
                }
                let gpu = if gpu.is_empty() {
                    "t4".to_string()
                } else {
                    gpu.to_string()
                };
                let scal = m.path().join(f.replace("placements", "scalability"));
                let scal = if scal.exists() {
                    read(&scal)
                } else {
                    Vec::new()
                };
                out.push((
                    m.file_name().to_string_lossy().to_string(),
                    gpu,
                    read(&m.path().join(f)),
                    scal,
                ));
            }
        }
    }
    out
}

type Fit = fn(&[StepSample]) -> Box<dyn ThroughputModel>;

/// The models compared, each fitted the same way from the same samples.
fn models() -> Vec<(&'static str, Fit)> {
    vec![
        ("pollux", |s| Box::new(PolluxModel::fit(s).unwrap())),
        ("optimus", |s| Box::new(OptimusModel::fit(s).unwrap())),
        ("table", |s| Box::new(MeasuredTable::fit(s).unwrap())),
    ]
}

/// (in-sample error, extrapolation error when fitted on ≤ 4 replicas) of one model on one
/// profile.
fn errors(fit: Fit, placements: &[StepSample], scalability: &[StepSample]) -> (f64, Option<f64>) {
    let in_sample = mean_relative_error(fit(placements).as_ref(), placements);
    let small: Vec<StepSample> = placements
        .iter()
        .copied()
        .filter(|s| s.placement.replicas <= 4)
        .collect();
    let large: Vec<StepSample> = placements
        .iter()
        .chain(scalability)
        .copied()
        .filter(|s| s.placement.replicas > 4)
        .collect();
    let extrapolated = (!large.is_empty() && !small.is_empty())
        .then(|| mean_relative_error(fit(&small).as_ref(), &large));
    (in_sample, extrapolated)
}

#[test]
fn every_model_in_sample_and_extrapolated_errors() {
    let models = models();
    let mut rows = Vec::new();
    for (name, gpu, placements, scalability) in profiles() {
        let errs: Vec<(f64, Option<f64>)> = models
            .iter()
            .map(|(_, fit)| errors(*fit, &placements, &scalability))
            .collect();
        rows.push((name, gpu, placements.len(), errs));
    }
    let pct = |e: f64| format!("{:.1} %", 100.0 * e);
    let header: Vec<String> = models
        .iter()
        .map(|(m, _)| format!("{m} in-sample | {m} > 4 replicas"))
        .collect();
    println!("| model | gpu | samples | {} |", header.join(" | "));
    println!("|---|---|---|{}", "---|---|".repeat(models.len()));
    for (m, g, n, errs) in &rows {
        let cells: Vec<String> = errs
            .iter()
            .map(|(i, e)| format!("{} | {}", pct(*i), e.map(pct).unwrap_or("-".into())))
            .collect();
        println!("| {m} | {g} | {n} | {} |", cells.join(" | "));
    }
    for (k, (model, _)) in models.iter().enumerate() {
        for subset in ["t4", "all"] {
            let chosen: Vec<&(f64, Option<f64>)> = rows
                .iter()
                .filter(|r| subset == "all" || r.1 == subset)
                .map(|r| &r.3[k])
                .collect();
            let mean_in = chosen.iter().map(|e| e.0).sum::<f64>() / chosen.len() as f64;
            let ex: Vec<f64> = chosen.iter().filter_map(|e| e.1).collect();
            println!(
                "{model} on {subset} profiles ({}): in-sample {}, extrapolated {} ({} profiles)",
                chosen.len(),
                pct(mean_in),
                pct(ex.iter().sum::<f64>() / ex.len().max(1) as f64),
                ex.len()
            );
        }
    }
    assert!(rows.len() >= 6, "profiles found: {}", rows.len());
    // Regression guards: on Pollux's own T4 profiles the Pollux fit stays within the in-sample
    // error Pollux reports for its fit (6.5–12 %), plus one point; the table reproduces the
    // measurements up to their noise, and on average meets the targets (≤ 10 % in sample,
    // ≤ 20 % fitted on ≤ 4 replicas and asked about more) on T4 and over every profile.
    let t4: Vec<_> = rows.iter().filter(|r| r.1 == "t4").collect();
    for (m, g, _, errs) in &t4 {
        assert!(errs[0].0 <= 0.13, "pollux on {m}/{g}: {}", pct(errs[0].0));
        assert!(errs[2].0 <= 0.10, "table on {m}/{g}: {}", pct(errs[2].0));
    }
    for (subset, chosen) in [("t4", t4), ("all", rows.iter().collect())] {
        let ex: Vec<f64> = chosen.iter().filter_map(|r| r.3[2].1).collect();
        let mean = ex.iter().sum::<f64>() / ex.len() as f64;
        assert!(
            mean <= 0.20,
            "table extrapolated on {subset}: {}",
            pct(mean)
        );
    }
}

/// Gavel's measured throughputs load as one table per (worker type, job type); a measured
/// point comes back exactly and unmeasured scale factors lie between their neighbours.
#[test]
fn gavel_throughputs_load_as_tables() {
    let json = std::fs::read_to_string(data().join("gavel/simulation_throughputs.json")).unwrap();
    let tables = MeasuredTable::from_gavel_json(&json).unwrap();
    let types: std::collections::BTreeSet<&str> =
        tables.keys().map(|(w, _)| w.0.as_str()).collect();
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        vec!["k80", "p100", "v100"]
    );
    assert!(tables.len() >= 3 * 20, "{} tables", tables.len());
    let t = &tables[&(
        optimizer::units::WorkerType("v100".into()),
        "ResNet-18 (batch size 16)".to_string(),
    )];
    let at = |nodes, replicas| Placement {
        ps: 0,
        nodes,
        replicas,
        local_bsz: 16.0,
    };
    assert!((1.0 / t.step_time(&at(1, 1)) - 32.353384328946916).abs() < 1e-9);
    let (two, four, three) = (
        t.step_time(&at(1, 2)),
        t.step_time(&at(1, 4)),
        t.step_time(&at(1, 3)),
    );
    assert!(three >= two.min(four) && three <= two.max(four));
    // Spread over nodes (Gavel's "unconsolidated") is measured separately.
    assert!(t.step_time(&at(4, 4)).is_finite());
}
