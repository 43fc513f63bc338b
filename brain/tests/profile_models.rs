//! Job-profile models on Alibaba's traces, scored as `brainctl train --evaluate` scores them:
//! on the DLRM trace of 2025 (CPU-node and GPU-node roles of each service) ours provisions
//! less CPU and memory than DLRover's rule and than the global median while leaving at most
//! 5 % of instances short of anything. On the pods of 2023 no predictor that tells pods apart
//! by what the trace publishes before a pod exists can meet that target; the test shows why.

use std::path::Path;

fn data() -> std::path::PathBuf {
    datasets::bundled()
}

#[test]
fn ours_provisions_less_than_the_baselines_on_alibaba_2025_and_rarely_too_little() {
    let samples =
        brain::train::alibaba_2025(&data().join("alibaba_gpu_v2025/disaggregated_DLRM_trace.csv"))
            .unwrap();
    let s = brain::train::score("2025", samples, 0.7, 0.95).unwrap();
    eprintln!("{}", brain::train::render(&s));
    let find = |name: &str| {
        s.results
            .iter()
            .find(|e| e.predictor.starts_with(name))
            .unwrap()
    };
    // Limits equal requests throughout this trace: the user's request is not a baseline here.
    assert!(s.results.iter().all(|e| e.predictor != "user request"));
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    let ours = find("ours");
    assert!(ours.under_any <= 0.05, "{ours:?}");
    assert_eq!(ours.predicted, ours.evaluated);
    for base in ["DLRover", "global median"] {
        let b = find(base);
        assert!(
            ours.over[0] < b.over[0] && ours.over[1] < b.over[1] && ours.over[2] <= b.over[2],
            "{ours:?}\n{b:?}"
        );
    }
}

#[test]
fn alibaba_2023_pods_are_scored_against_every_baseline_that_applies() {
    let samples =
        brain::train::alibaba_2023(&data().join("alibaba_gpu_v2023/openb_pod_list_default.csv"))
            .unwrap();
    assert_eq!(samples.len(), 8152);
    let s = brain::train::score("2023", samples, 0.7, 0.95).unwrap();
    eprintln!("{}", brain::train::render(&s));
    // Only requests are published: the user's request would be the answer, so it is left out.
    let names: Vec<&str> = s.results.iter().map(|e| e.predictor.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    assert!(names[3].starts_with("bound"), "{names:?}");
    let (ours, dlrover, bound) = (&s.results[0], &s.results[1], &s.results[3]);
    // The margin is calibrated for 5 % per resource on held-out jobs.
    for t in 0..3 {
        assert!(ours.under[t] <= 0.08, "{ours:?}");
    }
    // Why the target (less over-provisioning than DLRover's rule with at most 5 %
    // under) is out of reach on this trace: even a predictor that knew each QoS class's 95th
    // percentile of the very pods it sizes over-provisions CPU and memory more than DLRover's
    // median, which in exchange leaves about a third of the pods short.
    assert!(bound.under_any <= 0.05, "{bound:?}");
    assert!(dlrover.under_any > 0.25, "{dlrover:?}");
    for t in 0..2 {
        assert!(bound.over[t] > dlrover.over[t], "{bound:?}\n{dlrover:?}");
    }
}

/// A brain database holding `n` finished allreduce jobs of three workloads (batch sizes), each
/// with the shape it was given and the metrics it reported; per process a job of batch `b`
/// used about `b` × 2 MiB of memory and `b` × 4 millicores, ±10 %.
fn history_db(path: &Path, n: usize) {
    use brain::store::{Metric, RoleShape, Shape, Store};
    use vocab::spec::Topology;
    let mut store = Store::open(path).unwrap();
    let t0 = 1_700_000_000_000i64;
    for i in 0..n {
        let batch = [64u64, 128, 256][i % 3];
        let noise = 1.0 + ((i * 37) % 21) as f64 / 100.0 - 0.1;
        let at = t0 + i as i64 * 3_600_000;
        let spec = format!(
            "name: hist-{i}\nkind: allreduce\nroles:\n  worker: {{ min: 1, max: 4 }}\n\
             workload:\n  builtin: {{ batch_size: {batch} }}\n\
             data: {{ num_samples: 6000, shard_size: 100 }}\n\
             checkpoint: {{ dir: checkpoints, every_shards: 10 }}\n"
        );
        // The spec is valid: its workload is the scenario the brain learns by.
        let _: vocab::JobSpec = serde_norway::from_str(&spec).unwrap();
        let shape = Shape::new(
            vocab::JobKind::Allreduce,
            vocab::Role::WORKER,
            RoleShape {
                memory_bytes: 2 << 30,
                ..RoleShape::sized(Topology::Allreduce, 2, (1, 4), 2000)
            },
            6000,
        );
        let job = store
            .submit(&format!("hist-{i}"), &spec, &shape, &[], at)
            .unwrap();
        store.started(job, 2, None, "/nowhere", at + 1000).unwrap();
        let per_cpu = (batch as f64 * 4.0 * noise) as u64;
        let per_mem = (batch as f64 * 2.0 * noise * 1048576.0) as u64;
        store
            .add_metrics(
                job,
                &[Metric {
                    at_unix_ms: at + 2000,
                    global_step: 10,
                    samples_per_second: 100.0,
                    workers: 2,
                    ps: 0,
                    cpu_millicores: 2 * per_cpu,
                    memory_bytes: 2 * per_mem,
                    gpu_utilisation_pct: 0.0,
                    samples_done: 6000,
                    processes: Vec::new(),
                    role_rates: Vec::new(),
                    ..Default::default()
                }],
            )
            .unwrap();
        store
            .finish(
                job,
                brain::store::JobState::Succeeded,
                "ok",
                6000,
                at + 60_000,
            )
            .unwrap();
    }
}

fn brainctl(args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brainctl"))
        .args(args)
        .output()
        .unwrap();
    eprintln!(
        "brainctl {args:?}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn brainctl_train_fits_on_the_brains_own_history_stores_the_model_and_scores_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("brain.db");
    let db_arg = db.to_str().unwrap();

    let evaluate_own =
        |db: &str| brainctl(&["train", "--evaluate", "--history", "own", "--database", db]);
    // Too little history: a clear error and no model.
    history_db(&db, 10);
    let out = brainctl(&["train", "--database", db_arg]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 20"));
    let store = brain::store::Store::open(&db).unwrap();
    assert!(store.model(brain::train::MODEL_NAME).unwrap().is_none());
    drop(store);
    let out = evaluate_own(db_arg);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("too few to score"));

    let db = dir.path().join("brain60.db");
    let db_arg = db.to_str().unwrap();
    history_db(&db, 60);
    let out = brainctl(&["train", "--database", db_arg]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("fitted on 60 finished jobs"));
    let store = brain::store::Store::open(&db).unwrap();
    let (body, _) = store.model(brain::train::MODEL_NAME).unwrap().unwrap();
    let model: optimizer::profile::LearnedModel = serde_json::from_str(&body).unwrap();
    assert_eq!(model.trained_on, 60);
    // The stored model sizes a new job of a known workload near what its like needed.
    let history = brain::train::from_store(&store.jobs().unwrap());
    let mut h = optimizer::profile::History::default();
    for s in &history {
        h.push(s);
    }
    let mut next = history[history.len() - 3].clone();
    next.at_s += 3.0 * 3600.0;
    let p = optimizer::profile::Predictor::predict(&model, &h, &next).unwrap();
    // Batch 64 used 2 × 64 MiB ± 10 % per process: enough for all, far less than the 2 GiB given.
    let mem_mib = p.0[1];
    assert!((141.0..400.0).contains(&mem_mib), "{p:?} for {next:?}");
    // Submission sizes a new job's workers from it: CPU in whole slots (batch 256 used about
    // 1,024m per process, batch 64 about 256m), memory, each with its reason.
    let cluster = optimizer::live::LiveCluster {
        free: Vec::new(),
        cpu_millicores: 8_000,
        slot_millicores: 500,
        max_processes: 64,
        memory_bytes: 0,
        nodes: Vec::new(),
    };
    let jobs = store.jobs().unwrap();
    let now_s = 1_700_000_000.0 + 61.0 * 3600.0;
    let sized = |batch: u32| {
        let spec: vocab::JobSpec = serde_norway::from_str(&format!(
            "name: next\nkind: allreduce\nroles:\n  worker: {{ min: 1, max: 4 }}\n\
             workload:\n  builtin: {{ batch_size: {batch} }}\n\
             data: {{ num_samples: 6000, shard_size: 100 }}\n\
             checkpoint: {{ dir: checkpoints, every_shards: 10 }}\n"
        ))
        .unwrap();
        brain::predict::predict(
            &spec,
            &jobs,
            &Default::default(),
            &cluster,
            &Default::default(),
            Some(&model),
            now_s,
        )
        .unwrap()
    };
    let big = sized(256);
    assert!(
        big.shape.training_group().millicores >= 1_500
            && big.shape.training_group().millicores % 500 == 0,
        "{:?}",
        big.reasons
    );
    assert!(
        big.reasons
            .iter()
            .any(|r| r.starts_with("worker cpu: ") && r.contains("from the job-profile model")),
        "{:?}",
        big.reasons
    );
    assert_eq!(sized(64).shape.training_group().millicores, 500);

    let out = evaluate_own(db_arg);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("60 jobs, fitted on the first 42"), "{text}");
    for row in [
        "ours",
        "DLRover rule",
        "global median",
        "user request",
        "bound",
    ] {
        assert!(text.lines().any(|l| l.starts_with(row)), "{row}: {text}");
    }
    assert!(!text.contains("Alibaba"), "{text}");
    // Jobs are told apart by workload: knowing each one's 95th percentile costs ~10 %, not the
    // ~90 % of lumping the three batch sizes together.
    let over_mem = |row: &str| -> f64 {
        let l = text.lines().find(|l| l.starts_with(row)).unwrap();
        let cols: Vec<&str> = l.split_whitespace().collect();
        cols[cols.len() - 7].trim_end_matches('%').parse().unwrap()
    };
    assert!(over_mem("bound") < 25.0, "{text}");
    for base in ["DLRover rule", "global median", "user request"] {
        assert!(over_mem("ours") < over_mem(base), "{base}: {text}");
    }
}
