//! The operator's heuristics in the live brain, end to end on local processes: the brain reads
//! each process from its job master's reports and corrects it through versioned plans.
//!
//! * A parameter server that uses far more CPU than it was given makes its job PS-bound: the
//!   brain adds a PS, the job master reshards the parameters with their digest unchanged, and
//!   every sample is applied exactly once.
//! * A worker over its memory limit is ended as out of memory; the brain's next plan migrates
//!   it with more memory, and the job finishes, every sample once.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Brain, brainctl, jobs, start_brain};
use proto::service::v1 as pb;

/// A brain on 4 CPUs running Pollux-style rounds every second with only `heuristics` (TOML
/// `[[heuristics]]` tables), with `spec` submitted to it.
fn brain_with(d: &Path, heuristics: &str, spec: &str) -> (Brain, String) {
    std::fs::write(
        d.join("policy.toml"),
        format!(
            "{heuristics}\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n\
             cooldown_s = 600\n"
        ),
    )
    .unwrap();
    let (brain, addr) = start_brain(d, "127.0.0.1:0", 4);
    let url = format!("http://{addr}");
    let path = d.join("job.yaml");
    std::fs::write(&path, spec).unwrap();
    let (ok, text) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{text}");
    (brain, url)
}

/// Waits for the brain's only job to end; its record and its master's report.
async fn ended(url: &str) -> (pb::JobRecord, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let job = loop {
        let all = jobs(url).await.unwrap_or_default();
        if let Some(j) = all
            .iter()
            .find(|j| j.state == "succeeded" || j.state == "failed")
        {
            break j.clone();
        }
        assert!(Instant::now() < deadline, "the job did not end: {all:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let report = Path::new(&job.run_dir).join("master/report.json");
    let report = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    (job, report)
}

fn events(report: &serde_json::Value) -> Vec<String> {
    report["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_starved_ps_gets_a_second_ps_from_the_brain_with_the_parameters_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The PS is given 100m and uses several times that serving two workers.
    let spec = "name: ps-bound\nkind: ps\nroles:\n  ps: { replicas: 1, max: 2, resources: { cpu: 100m } }\n  \
         worker: { replicas: 2, min: 1, max: 2 }\nworkload:\n  builtin: { batch_size: 256 }\n\
         data: { num_samples: 3000000, shard_size: 20000, eval_samples: 2000 }\n\
         checkpoint: { dir: checkpoints, every_shards: 20 }\n"
        .to_string();
    let heuristics = "[[heuristics]]\nkind = \"hot_ps\"\nmax_ps = 2\ncooldown_s = 600\n";
    let (mut brain, url) = brain_with(d, heuristics, &spec);
    let (job, report) = ended(&url).await;
    assert_eq!(job.state, "succeeded", "{job:#?}");
    assert!(job.plan_version >= 1, "the brain sent no plan: {job:#?}");
    // One reshard, 1 -> 2 PS, with the parameters' digest the same on both sides.
    let reshards = report["reshards"].as_array().unwrap();
    assert_eq!(reshards.len(), 1, "{report:#}");
    let r = &reshards[0];
    assert_eq!(
        (r["from_ps"].as_u64(), r["to_ps"].as_u64()),
        (Some(1), Some(2)),
        "{r}"
    );
    assert_eq!(r["digest_before"], r["digest_after"], "{r}");
    // Every batch touches keys of both PS: each applied every sample once, before and after
    // the reshard (the sum of the sample indices is that of 0..3,000,000).
    assert_eq!(report["exactly_once"], "ok", "{report:#}");
    let stats = report["ps_stats"].as_array().unwrap();
    assert_eq!(stats.len(), 2, "{stats:?}");
    for p in stats {
        assert_eq!(p["applied_samples"].as_u64(), Some(3_000_000), "{p}");
        assert_eq!(
            p["applied_index_sum"].as_u64(),
            Some(2_999_999 * 3_000_000 / 2),
            "{p}"
        );
        assert_eq!(p["duplicate_pushes"].as_u64(), Some(0), "{p}");
    }
    brain.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_over_its_memory_limit_comes_back_with_more_memory_and_the_job_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The built-in worker is resident in about 7 MiB: 4 MiB cannot hold it.
    let spec = "name: too-small\nkind: ps\nroles:\n  ps: { replicas: 1 }\n  \
         worker: { replicas: 2, min: 1, max: 2, max_restarts: 40, \
         resources: { cpu: 1000m, memory: 4Mi } }\n\
         workload:\n  builtin: { batch_size: 256, step_delay_us: 2 }\n\
         data: { num_samples: 400000, shard_size: 4000, eval_samples: 2000 }\n\
         checkpoint: { dir: checkpoints, every_shards: 20 }\n"
        .to_string();
    let (mut brain, url) = brain_with(d, "[[heuristics]]\nkind = \"oom_growth\"\n", &spec);
    let (job, report) = ended(&url).await;
    assert_eq!(job.state, "succeeded", "{job:#?}\n{report:#}");
    let events = events(&report);
    assert!(
        events.iter().any(|e| e.contains("out of memory")),
        "no process was ended for memory: {events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.contains("migrating worker-") && e.contains("(out of memory)")),
        "the brain migrated no worker: {events:#?}"
    );
    assert_eq!(report["exactly_once"], "ok", "{report:#}");
    let stats = &report["ps_stats"][0];
    assert_eq!(stats["applied_samples"].as_u64(), Some(400_000), "{stats}");
    // Pushes a killed worker sent again were recognised and dropped: the sum of the sample
    // indices applied is that of 0..400,000, each once.
    assert_eq!(
        stats["applied_index_sum"].as_u64(),
        Some(399_999 * 400_000 / 2),
        "{stats}"
    );
    brain.kill();
}
