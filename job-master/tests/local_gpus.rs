//! GPUs on the local platform: each process that asks for `gpu: N` gets N of the machine's GPUs
//! that no other live process of the job holds, as its `CUDA_VISIBLE_DEVICES`; its agent reports
//! them. The machine's GPUs are named in the platform (`gpus: ["0", "1"]`): `CUDA_VISIBLE_DEVICES`
//! is only an environment variable, so no GPU is needed. A process for which too few are free
//! fails the job with the count. Processes asking for a share of a device (`gpu: 0.5`) share
//! GPUs; a placement group with `share_devices` puts process `i` of its roles on one GPU.

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

/// Every process's devices, from the job's events (`worker-0 has GPUs 1 on host`).
fn devices(events: &[String]) -> std::collections::BTreeMap<String, String> {
    events
        .iter()
        .filter_map(|e| e.split_once(" has GPUs "))
        .filter_map(|(who, t)| {
            let who = who.rsplit(' ').next()?;
            Some((who.to_string(), t.split_once(" on ")?.0.to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_of_a_gpu_run_side_by_side_and_partners_share_their_device() {
    let dir = tempfile::tempdir().unwrap();
    // Two workers of 0.5 and two rollout engines of 0.5 on two GPUs: worker-i and rollout-i
    // share a device, and the two indices do not (each device holds one pair).
    let yaml = format!(
        "name: shared-gpus-{pid}\nkind: allreduce\nroles:\n  \
         worker: {{ replicas: 2, resources: {{ cpu: 1, gpu: 0.5 }} }}\n  \
         rollout: {{ replicas: 2, topology: service, command: [/bin/sh, -c, exec sleep 600], \
         resources: {{ cpu: 0.2, gpu: 0.5 }} }}\n\
         placement:\n  - {{ roles: [worker, rollout], strategy: strict_pack, share_devices: true }}\n\
         workload:\n  builtin: {{ batch_size: 128 }}\n\
         data: {{ num_samples: 4000, shard_size: 500, eval_samples: 500 }}\n\
         checkpoint: {{ dir: {ckpt} }}\n",
        pid = std::process::id(),
        ckpt = dir.path().join("ckpt").display()
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap();
    let mut run = start_on(spec, dir.path(), test_timing(), platform()).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:#?}", report.events);
    let on = devices(&report.events);
    assert_eq!(on.len(), 4, "{on:?}");
    for i in 0..2 {
        assert_eq!(
            on.get(&format!("worker-{i}")),
            on.get(&format!("rollout-{i}")),
            "{on:?}"
        );
    }
    assert_ne!(on.get("worker-0"), on.get("worker-1"), "{on:?}");
    assert!(on.values().all(|d| d == "0" || d == "1"), "{on:?}");

    // Three shares of 0.4 without a group: two fit on a device, the third takes the other.
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::from_yaml(&format!(
        "name: shares-{pid}\nkind: allreduce\nroles:\n  \
         worker: {{ replicas: 3, resources: {{ cpu: 0.5, gpu: 0.4 }} }}\n\
         workload:\n  builtin: {{ batch_size: 128 }}\n\
         data: {{ num_samples: 4000, shard_size: 500, eval_samples: 500 }}\n\
         checkpoint: {{ dir: {ckpt} }}\n",
        pid = std::process::id(),
        ckpt = dir.path().join("ckpt").display()
    ))
    .unwrap();
    let mut run = start_on(spec, dir.path(), test_timing(), platform()).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:#?}", report.events);
    let on = devices(&report.events);
    assert_eq!(on.len(), 3, "{on:?}");
    let mut per: std::collections::BTreeMap<&str, usize> = Default::default();
    for d in on.values() {
        *per.entry(d).or_default() += 1;
    }
    assert_eq!(
        per.values().copied().collect::<BTreeSet<_>>(),
        [1, 2].into(),
        "{on:?}"
    );
}
