//! The brain on the three-node Ray cluster `.ci/ray-cluster` makes (see
//! `job-master/tests/ray_cluster.rs`): node 0 has no GPU, node 1 two logical V100s, node 2 four
//! logical A100s. The brain reads each node's GPUs and model from Ray, refuses at submission a
//! job that no node can hold (naming the cluster's models and sizes), starts GPU jobs on a model
//! (the one they asked for, or the one its round picks), and each worker lands on a node of that
//! model with GPUs of its own (Ray's `CUDA_VISIBLE_DEVICES`, reported by the agent). Without
//! `BRAIN_RAY_CLUSTER` the test says so and passes, unless `BRAIN_REQUIRE_RAY_CLUSTER=1`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use common::{bin_dir, brainctl};

fn spec(dir: &Path, name: &str, resources: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, min: 2, max: 2, \
             resources: {{ {resources} }} }}\n\
             workload:\n  builtin: {{ batch_size: 128, step_delay_us: 100 }}\n\
             data: {{ num_samples: 20000, shard_size: 500, eval_samples: 2000 }}\n\
             checkpoint: {{ dir: checkpoints, every_shards: 10 }}\n"
        ),
    )
    .unwrap();
    path
}

/// `worker-N` → (host, GPUs) from a job master's report events ("worker-0 has GPUs 1 on
/// 10.213.7.12").
fn devices(events: &[&str]) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for e in events {
        if let Some((head, tail)) = e.split_once(" has GPUs ")
            && let Some(key) = head.split_whitespace().last()
            && let Some((gpus, host)) = tail.split_once(" on ")
        {
            out.insert(key.to_string(), (host.trim().to_string(), gpus.to_string()));
        }
    }
    out
}

#[test]
fn gpu_jobs_run_on_their_model_each_worker_with_gpus_of_its_own() {
    let Some(c) = test_support::ray_cluster() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policy.toml"),
        "[live]\ninterval_s = 1\ncooldown_s = 600\n",
    )
    .unwrap();
    let (child, addr) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--max-processes", "12"])
            .args(["--ray-address", &c.dashboard])
            .arg("--database")
            .arg(dir.path().join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.path().join("runs"))
            .arg("--policy")
            .arg(dir.path().join("policy.toml"))
            .arg("--job-master-bin")
            .arg(bin_dir().join("job-master"))
            // The job masters run on this machine; agents on the nodes reach them on the bridge.
            .arg(format!("--job-master-arg=--listen={}:0", c.host))
            .args([
                "--job-master-arg=--brain-interval-ms",
                "--job-master-arg=300",
            ])
            .stderr(std::fs::File::create(dir.path().join("brain.log")).unwrap());
    });
    let _brain = child;
    let url = format!("http://{addr}");
    let log = || std::fs::read_to_string(dir.path().join("brain.log")).unwrap_or_default();
    let pid = std::process::id();

    // What no node holds is refused at once, with the cluster's models and sizes.
    for (name, resources, says) in [
        (
            "h100",
            "cpu: 1, gpu: 1, gpu_type: H100",
            "GPU model \"H100\", which no node has",
        ),
        (
            "v100x3",
            "cpu: 1, gpu: 3, gpu_type: V100",
            "3 V100 GPUs per worker, more than any node holds",
        ),
    ] {
        let path = spec(dir.path(), &format!("{name}-{pid}"), resources);
        let (ok, out) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
        assert!(!ok, "{name} was accepted: {out}");
        assert!(out.contains(says), "{out}");
        assert!(
            out.contains("A100: 4 GPUs, at most 4 on a node; V100: 2 GPUs, at most 2 on a node"),
            "{out}"
        );
    }

    let a100 = format!("a100-{pid}");
    let any = format!("any-{pid}");
    for (name, resources) in [
        (&a100, "cpu: 1, gpu: 1, gpu_type: A100"),
        (&any, "cpu: 1, gpu: 1"),
    ] {
        let path = spec(dir.path(), name, resources);
        let (ok, out) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
        assert!(ok, "{out}\n{}", log());
    }
    let start = Instant::now();
    for name in [&a100, &any] {
        loop {
            let (ok, status) = brainctl(&["status", name, "--brain", &url]);
            assert!(ok, "{status}");
            if status.contains("succeeded") {
                break;
            }
            assert!(
                !status.contains("failed") && start.elapsed() < Duration::from_secs(300),
                "{status}\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    // The model each ran on, its nodes, and each worker's GPUs.
    let node_of_model: BTreeMap<&str, &str> =
        [("V100", c.nodes[1].as_str()), ("A100", c.nodes[2].as_str())].into();
    for name in [&a100, &any] {
        let run = dir.path().join("runs").join(name);
        let written = std::fs::read_to_string(run.join("spec.yaml")).unwrap();
        let model = ["A100", "V100"]
            .into_iter()
            .find(|m| written.contains(&format!("gpu_type: {m}")))
            .unwrap_or_else(|| panic!("the brain named no GPU model: {written}"));
        if name == &a100 {
            assert_eq!(model, "A100");
        }
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("master/report.json")).unwrap())
                .unwrap();
        assert_eq!(report["exactly_once"], "ok", "{report:#}");
        let events: Vec<&str> = report["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e.as_str())
            .collect();
        let given = devices(&events);
        let workers: BTreeSet<&String> = given.keys().collect();
        assert_eq!(
            workers,
            ["worker-0".to_string(), "worker-1".to_string()]
                .iter()
                .collect(),
            "every worker reports its GPUs: {events:#?}"
        );
        for (host, _) in given.values() {
            assert_eq!(host, node_of_model[model], "{name} on {model}: {events:#?}");
        }
        let gpus: BTreeSet<&String> = given.values().map(|(_, g)| g).collect();
        assert_eq!(
            gpus.len(),
            2,
            "two workers on one node share no GPU: {given:?}"
        );
    }
}
