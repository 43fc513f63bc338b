//! Throughput-model fit time and prediction latency on Pollux's real T4 profiles
//! (`datasets/data/pollux/traces/<model>/placements.csv`), for the Pollux, Optimus (NNLS) and
//! measured-table models, and the time the runtime heuristics take to plan one job.
//!
//! cargo bench -p benches --bench throughput_models

use std::path::{Path, PathBuf};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use optimizer::heuristics::{Heuristics, JobRuntime, ProcessRuntime, SpeedPoint};
use optimizer::plan::{JobConfig, ProcessResources};
use optimizer::throughput::optimus::OptimusModel;
use optimizer::throughput::pollux::PolluxModel;
use optimizer::throughput::table::MeasuredTable;
use optimizer::throughput::{Placement, StepSample, ThroughputModel};
use optimizer::units::{Bytes, Millicores};

fn profile(model: &str) -> Vec<StepSample> {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../datasets/data/pollux/traces")
        .join(model)
        .join("placements.csv");
    let mut r = csv::Reader::from_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            let digits: Vec<u32> = rec[0].chars().filter_map(|c| c.to_digit(10)).collect();
            StepSample {
                placement: Placement {
                    ps: 0,
                    nodes: digits.len() as u32,
                    replicas: digits.iter().sum(),
                    local_bsz: rec[1].parse().unwrap(),
                },
                step_time: rec[2].parse().unwrap(),
                sync_time: Some(rec[3].parse().unwrap()),
            }
        })
        .collect()
}

fn models(c: &mut Criterion) {
    for name in ["bert", "cifar10", "ncf"] {
        let samples = profile(name);
        let mut fit = c.benchmark_group(format!("fit/{name} ({} samples)", samples.len()));
        fit.sample_size(20);
        fit.bench_function("pollux", |b| b.iter(|| PolluxModel::fit(&samples).unwrap()));
        fit.bench_function("optimus", |b| {
            b.iter(|| OptimusModel::fit(&samples).unwrap())
        });
        fit.bench_function("table", |b| {
            b.iter(|| MeasuredTable::fit(&samples).unwrap())
        });
        fit.finish();

        let query = Placement {
            ps: 0,
            nodes: 4,
            replicas: 16,
            local_bsz: 64.0,
        };
        let fitted: Vec<(&str, Box<dyn ThroughputModel>)> = vec![
            ("pollux", Box::new(PolluxModel::fit(&samples).unwrap())),
            ("optimus", Box::new(OptimusModel::fit(&samples).unwrap())),
            ("table", Box::new(MeasuredTable::fit(&samples).unwrap())),
        ];
        let mut predict = c.benchmark_group(format!("predict/{name}"));
        for (m, model) in &fitted {
            predict.bench_with_input(BenchmarkId::from_parameter(m), &query, |b, q| {
                b.iter(|| model.step_time(std::hint::black_box(q)))
            });
        }
        predict.finish();
    }
}

fn heuristics(c: &mut Criterion) {
    let res = ProcessResources {
        cpu: Millicores(1000),
        memory: Bytes(1 << 30),
        gpus: Default::default(),
    };
    let process = |index| ProcessRuntime {
        index,
        resources: res.clone(),
        cpu_samples: vec![Millicores(950); 10],
        memory_peak: Bytes(900 << 20),
        ..Default::default()
    };
    let job = JobRuntime {
        now_s: 10_000.0,
        config: JobConfig {
            ps: 4,
            workers: 16,
            ps_resources: res.clone(),
            worker_resources: res.clone(),
        },
        min_workers: 1,
        max_workers: 32,
        ps: (0..4).map(process).collect(),
        workers: (0..16).map(process).collect(),
        speed: (1..=16)
            .map(|w| SpeedPoint {
                workers: w,
                samples_per_s: 100.0 * (w as f64).sqrt(),
            })
            .collect(),
        ..Default::default()
    };
    let h = Heuristics::default();
    c.bench_function("heuristics/plan one job (4 ps, 16 workers)", |b| {
        b.iter(|| h.plan(std::hint::black_box(&job), 1).unwrap())
    });
}

criterion_group!(benches, models, heuristics);
criterion_main!(benches);
