//! A user command as the workload: it gets the torchrun environment and TF_CONFIG, a PS that
//! never exits gets SIGTERM and its grace period when the job ends, and SIGTERM to `job-master
//! run` stops the whole job; a process over its memory limit is ended as out of memory.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn read_env(path: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_gets_the_torchrun_environment_tf_config_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Workers record their environment and finish; the PS records it and serves until SIGTERM,
    // which it traps to prove it got the signal and time to act on it.
    let script = format!(
        r#"env > {out}/$BRAIN_ROLE-$BRAIN_INDEX.env
if [ "$BRAIN_ROLE" = ps ]; then
  trap 'echo graceful > {out}/ps-$BRAIN_INDEX.term; exit 0' TERM
  while true; do sleep 0.05; done
fi"#,
        out = out.display()
    );
    let yaml = format!(
        r#"
name: cmd
kind: ps
roles:
  ps: {{ replicas: 1 }}
  worker: {{ replicas: 2 }}
workload:
  command: [sh, -c, {script:?}]
  env: {{ USER_SETTING: "42" }}
data: {{ num_samples: 100, shard_size: 10 }}
checkpoint: {{ dir: {ckpt} }}
"#,
        ckpt = dir.path().join("ckpt").display()
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let mut run = start(spec, dir.path()).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);

    let w1 = read_env(&out.join("worker-1.env"));
    for (k, v) in [
        ("RANK", "1"),
        ("GROUP_RANK", "1"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("TORCHELASTIC_RESTART_COUNT", "0"),
        ("USER_SETTING", "42"),
        ("BRAIN_ROLE", "worker"),
        ("BRAIN_INCARNATION", "1"),
    ] {
        assert_eq!(w1.get(k).map(String::as_str), Some(v), "{k} in {w1:?}");
    }
    assert!(w1["TORCHELASTIC_RUN_ID"].starts_with("cmd-"));
    assert!(w1["BRAIN_CHECKPOINT_DIR"].ends_with("ckpt"));
    let tf: serde_json::Value = serde_json::from_str(&w1["TF_CONFIG"]).unwrap();
    // TF2's ParameterServerStrategy needs a chief: worker 0 is it, so worker 1 is TF's
    // worker 0.
    assert_eq!(tf["task"]["type"], "worker");
    assert_eq!(tf["task"]["index"], 0);
    let w0 = read_env(&out.join("worker-0.env"));
    let chief: serde_json::Value = serde_json::from_str(&w0["TF_CONFIG"]).unwrap();
    assert_eq!(chief["task"]["type"], "chief");
    assert_eq!(chief["task"]["index"], 0);
    assert_eq!(
        tf["cluster"]["chief"][0].as_str().unwrap(),
        w0["BRAIN_SERVICE_ADDR"],
        "{tf}"
    );
    let ps_env = read_env(&out.join("ps-0.env"));
    assert_eq!(
        tf["cluster"]["ps"][0].as_str().unwrap(),
        ps_env["BRAIN_SERVICE_ADDR"]
    );
    assert!(
        tf["cluster"]["worker"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str() == Some(&w1["BRAIN_SERVICE_ADDR"]))
    );
    let ps_tf: serde_json::Value = serde_json::from_str(&ps_env["TF_CONFIG"]).unwrap();
    assert_eq!(ps_tf["task"]["type"], "ps");
    // The PS never exits by itself: the job's end reached it as SIGTERM, with time to act.
    assert_eq!(
        std::fs::read_to_string(out.join("ps-0.term"))
            .unwrap()
            .trim(),
        "graceful"
    );
    assert_no_process_left(run.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_job_master_stops_every_process() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "name: long\nkind: allreduce\nroles:\n  worker: {{ replicas: 2 }}\nworkload:\n  command: [sleep, '600']\n\
         data: {{ num_samples: 100, shard_size: 10 }}\ncheckpoint: {{ dir: {} }}\n",
        dir.path().join("ckpt").display()
    );
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, yaml).unwrap();
    let run_dir = dir.path().join("run");
    let (mut child, addr) = spawn_run(
        &spec,
        &[
            "--run-dir".as_ref(),
            run_dir.as_os_str(),
            "--grace-period-ms".as_ref(),
            "1000".as_ref(),
        ],
    );
    wait_for(addr, Duration::from_secs(30), "both sleeps running", |s| {
        s.processes.iter().filter(|p| p.pid != 0).count() == 2
    })
    .await;
    assert!(
        processes_of(addr).len() >= 4,
        "2 agents and 2 training processes"
    );
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "a job stopped before its end did not succeed"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_no_process_left(addr).await;
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("run/report.json")).unwrap())
            .unwrap();
    assert_eq!(report["phase"], "failed");
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("asked to shut down")
    );
}

/// The agent hands the process its resources and ends it, as a cgroup would, when its resident
/// memory passes the limit; the failure says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_over_its_memory_limit_is_ended_as_out_of_memory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // The shell keeps 200 MB of command output in memory, far over its 32 MiB.
    let script = format!(
        r#"echo "$BRAIN_CPU_MILLICORES $BRAIN_MEMORY_BYTES $BRAIN_GPUS" > {out}/given
x=$(head -c 200000000 /dev/zero | tr '\0' a)
sleep 60"#,
        out = out.display()
    );
    let yaml = format!(
        r#"
name: hog
kind: allreduce
roles:
  worker: {{ replicas: 1, max_restarts: 0, resources: {{ cpu: 500m, memory: 32Mi }} }}
workload:
  command: [sh, -c, {script:?}]
data: {{ num_samples: 100, shard_size: 10 }}
checkpoint: {{ dir: {ckpt} }}
"#,
        ckpt = dir.path().join("ckpt").display()
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let mut run = start(spec, dir.path()).await;
    let report = run.report().await;
    assert!(!report.succeeded());
    let reason = report.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("out of memory") && reason.contains("limit of 32.0 MiB"),
        "{reason}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("given")).unwrap().trim(),
        format!("500 {} 0", 32 << 20)
    );
    assert_no_process_left(run.addr).await;
}
