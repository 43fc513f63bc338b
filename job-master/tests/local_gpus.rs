//! GPUs on the local platform: each process that asks for `gpu: N` gets N of the machine's GPUs
//! that no other live process of the job holds, as its `CUDA_VISIBLE_DEVICES`; its agent reports
//! them. The machine's GPUs are named in the platform (`gpus: ["0", "1"]`): `CUDA_VISIBLE_DEVICES`
//! is only an environment variable, so no GPU is needed. A process for which too few are free
//! fails the job with the count.

mod common;

use std::collections::BTreeSet;

use common::*;
use job_master::platform::PlatformConfig;
use job_master::spec::JobSpec;

fn spec(dir: &std::path::Path, workers: u32) -> JobSpec {
    let yaml = format!(
        "name: gpus-{workers}-{pid}\nkind: allreduce\nroles:\n  worker: {{ replicas: {workers}, \
         resources: {{ cpu: 1, gpu: 1 }} }}\n\
         workload:\n  builtin: {{ batch_size: 128 }}\n\
         data: {{ num_samples: 4000, shard_size: 500, eval_samples: 500 }}\n\
         checkpoint: {{ dir: {ckpt} }}\n",
        pid = std::process::id(),
        ckpt = dir.join("ckpt").display()
    );
    JobSpec::from_yaml(&yaml).unwrap()
}

fn platform() -> PlatformConfig {
    PlatformConfig::Local {
        agent_bin: Some(agent_bin()),
        max_processes: None,
        gpus: Some(vec!["0".into(), "1".into()]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_process_gets_gpus_of_its_own_and_too_few_fail_the_job_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_on(spec(dir.path(), 2), dir.path(), test_timing(), platform()).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:#?}", report.events);
    let given: BTreeSet<&str> = report
        .events
        .iter()
        .filter_map(|e| e.split_once(" has GPUs ").map(|(_, t)| t))
        .filter_map(|t| t.split_once(" on ").map(|(g, _)| g))
        .collect();
    assert_eq!(given, ["0", "1"].into(), "{:#?}", report.events);

    let dir = tempfile::tempdir().unwrap();
    let mut run = start_on(spec(dir.path(), 3), dir.path(), test_timing(), platform()).await;
    let report = run.report().await;
    assert!(!report.succeeded(), "{:#?}", report.events);
    assert!(
        report
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("it needs 1 GPU(s); 0 of this machine's 2 (0,1) are free")),
        "{:?}",
        report.reason
    );
}
