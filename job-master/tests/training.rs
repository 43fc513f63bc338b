//! Real jobs on local processes over loopback: they finish, consume every sample exactly once per
//! epoch, and reach the log-loss of a single-process run of the same workload and data.

mod common;

use std::time::Duration;

use common::*;
use job_master::spec::JobKind;
use worker_agent::workload::reference;

/// Relative gap of the job's held-out log-loss to the single-process reference's.
fn gap(job: f64, reference: f64) -> f64 {
    (job - reference).abs() / reference
}

/// 2 PS, 3 workers, asynchronous SGD. The reference is the same model, data, batches and
/// optimiser trained in one process (no staleness). Asynchrony only delays each gradient by the
/// batches the other two workers push meanwhile (at most a few of 128 samples each against an
/// Adagrad step that shrinks as 1/sqrt of the accumulated squares), so after two epochs the
/// models are near the same optimum: the same 2 % bound holds, and in practice the gap is
/// under 0.5 %.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_job_with_2_ps_and_3_workers_matches_a_single_process_run() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "ps-train", "ps", 2, 3, 60_000, 2, 0, 20);
    let cfg = workload_of(&spec);
    let mut run = start(spec, dir.path()).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.kind, JobKind::Ps);
    assert_eq!(report.exactly_once, "ok");
    assert_eq!(
        report
            .samples_per_epoch
            .values()
            .copied()
            .collect::<Vec<_>>(),
        vec![60_000, 60_000]
    );
    assert!(report.checkpoints >= 1);
    // Model-level proof: every PS applied every batch of both epochs exactly once.
    assert_eq!(report.ps_stats.len(), 2);
    assert_ps_applied_each_sample_once(&report, 60_000, 2);
    let (reference, _) = reference::train_sparse(&cfg, 1000).unwrap();
    let loss = report.final_eval_loss.unwrap();
    assert!(
        gap(loss, reference) < 0.02,
        "job {loss} vs single process {reference}"
    );
    assert_no_process_left(run.addr).await;
}

/// 4 workers, synchronous SGD with a ring all-reduce: the same global batch as the reference,
/// so only the order of samples differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allreduce_job_with_4_workers_matches_a_single_process_run() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "ar-train", "allreduce", 0, 4, 60_000, 2, 0, 20);
    let cfg = workload_of(&spec);
    let mut run = start(spec, dir.path()).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert!(report.checkpoints >= 1);
    // The final model's own counters: each sample applied exactly once per epoch.
    assert_eq!(report.applied_samples, 120_000);
    assert_eq!(report.applied_index_sum, 2 * (60_000 * 59_999 / 2));
    let (reference, _) = reference::train_dense(&cfg, 1000).unwrap();
    let loss = report.final_eval_loss.unwrap();
    assert!(
        gap(loss, reference) < 0.02,
        "job {loss} vs single process {reference}"
    );
    assert_no_process_left(run.addr).await;
}

/// On this machine NVML does not load: agents report CPU and RSS of their process and "no GPU",
/// and the job runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_report_cpu_and_rss_and_no_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "sampling", "ps", 1, 1, 40_000, 1, 200, 0);
    let mut run = start(spec, dir.path()).await;
    let s = wait_for(
        run.addr,
        Duration::from_secs(60),
        "resource samples of both processes",
        |s| {
            s.processes
                .iter()
                .all(|p| p.sample.as_ref().is_some_and(|x| x.rss_bytes > 1 << 20))
        },
    )
    .await;
    let nvml = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists();
    for p in &s.processes {
        let sample = p.sample.as_ref().unwrap();
        assert!(sample.rss_bytes > 1 << 20, "{p:?}");
        if !nvml {
            assert!(!sample.gpu_present, "{p:?}");
            assert_eq!(sample.gpu_memory_used_bytes, 0);
        }
    }
    wait_for(run.addr, Duration::from_secs(60), "some CPU use", |s| {
        s.processes
            .iter()
            .any(|p| p.sample.as_ref().is_some_and(|x| x.cpu_millicores > 0))
    })
    .await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    let agent_log = std::fs::read_to_string(run.run_dir.join("logs/worker-0.1.log")).unwrap();
    if !nvml {
        assert_eq!(agent_log.matches("no GPU").count(), 1, "{agent_log}");
        assert!(!agent_log.contains("ERROR"), "{agent_log}");
    }
}

/// `checkpoint.keep: 2`: the job checkpoints often, but only the newest two committed
/// checkpoints stay on disk (and in the record), and the job still ends exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_newest_checkpoints_the_spec_keeps_stay_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "kept", "ps", 1, 2, 20_000, 1, 0, 4);
    spec.checkpoint.keep = Some(2);
    let ckpt_dir = spec.checkpoint.dir.clone();
    let mut run = start(spec, dir.path()).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert!(
        report.checkpoints >= 3,
        "{} checkpoints",
        report.checkpoints
    );
    // The deletions follow the durable record; give the last one a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let on_disk: Vec<_> = std::fs::read_dir(&ckpt_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().join("manifest.json").exists())
            .map(|e| e.file_name())
            .collect();
        if on_disk.len() == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{on_disk:?} of {} committed",
            report.checkpoints
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_no_process_left(run.addr).await;
}
