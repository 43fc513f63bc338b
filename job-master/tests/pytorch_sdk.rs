//! A real PyTorch DDP script that trains through the Python SDK (`python/`, torch from PyPI,
//! gloo on the CPU): `examples/pytorch-ddp/train.py` as an allreduce job with
//! `rescale: in_place`.
//!
//! Rescaled 2 → 4 → 2 while it trains, then a rank killed with kill -9: the group re-forms in
//! place (the two original ranks keep their pid through both plans; the new ranks load the cut
//! checkpoint), the kill restarts the group from the latest cut, and the job succeeds with the
//! ledger's exactly-once verdict and the model's own count of samples applied (every sample
//! once per epoch, and the sum of their indices).
//!
//! Needs a Python with torch (`BRAIN_TORCH_PYTHON`) and the SDK's build requirements; without
//! them the test prints SKIPPED, and fails when `BRAIN_REQUIRE_TORCH` is set.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use proto::jobmaster::v1 as pb;

// Enough to train on while new processes start on a busy 2-core machine (over 10 s under CI's
// load, the group of 2 training meanwhile) and through both plans and a restart.
const SAMPLES: u64 = 24_000;
const EPOCHS: u64 = 3;

fn spec(python: &str, sdk: &Path, ckpt: &Path, events: &Path) -> job_master::spec::JobSpec {
    let argv = vec![
        python.to_string(),
        example_script("pytorch-ddp/train.py").display().to_string(),
        "--samples".into(),
        SAMPLES.to_string(),
        "--batch-size".into(),
        "96".into(),
        "--step-sleep".into(),
        "0.03".into(),
        "--events".into(),
        events.display().to_string(),
    ];
    let yaml = format!(
        r#"
name: ddp-sdk
kind: allreduce
roles:
  worker: {{ replicas: 2, min: 1, max: 4, max_restarts: 3 }}
workload:
  command: {argv:?}
  rescale: in_place
  env: {{ OMP_NUM_THREADS: "1", PYTHONPATH: {sdk:?} }}
data: {{ num_samples: {SAMPLES}, shard_size: 400 }}
epochs: {EPOCHS}
checkpoint: {{ dir: {ckpt:?}, every_shards: 8 }}
"#
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    spec
}

#[derive(Debug, serde::Deserialize)]
struct Event {
    event: String,
    pid: u32,
    world: u32,
}

fn events(path: &Path) -> Vec<Event> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn worker_pids(s: &pb::JobStatus) -> Vec<(u32, u32)> {
    s.processes
        .iter()
        .filter(|p| p.role == "worker" && p.state != "removed")
        .map(|p| (p.index, p.pid))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_script_rescaled_2_4_2_in_place_and_killed_trains_every_sample_once() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, log) = (dir.path().join("ckpt"), dir.path().join("events.jsonl"));
    let mut run = start(spec(&python, &sdk, &ckpt, &log), dir.path()).await;
    let addr = run.addr;

    // Training, and one checkpoint taken at a cut.
    let s = wait_for(addr, Duration::from_secs(120), "a checkpoint", |s| {
        s.checkpoints >= 1 && worker_pids(s).iter().all(|&(_, pid)| pid > 0)
    })
    .await;
    let first = worker_pids(&s);
    assert_eq!(first.len(), 2);

    // 2 -> 4 in place: the two ranks keep their processes; two new ones join from the cut.
    send(addr, plan(1, Some(4), None)).await;
    let s = reached(addr, 1).await;
    assert_eq!(live_workers(&s), 4);
    let after_up = worker_pids(&s);
    assert_eq!(
        &after_up[..2],
        &first[..],
        "survivors keep their pid: {after_up:?}"
    );

    // 4 -> 2: the new ranks leave at the re-formation; the original two stay.
    shards_at_least(addr, s.shards_done + 4).await;
    send(addr, plan(2, Some(2), None)).await;
    let s = reached(addr, 2).await;
    assert_eq!(
        worker_pids(&s),
        first,
        "the original ranks kept their pid through both plans"
    );

    // Every original process re-formed twice, in worlds of 4 then 2, without restarting (the
    // plan is reached when the round forms; each process logs once its group is built).
    let reforms = |ev: &[Event], pid: u32| -> Vec<u32> {
        ev.iter()
            .filter(|e| e.pid == pid && e.event == "reform")
            .map(|e| e.world)
            .collect()
    };
    let mut ev = events(&log);
    for _ in 0..600 {
        if first.iter().all(|&(_, pid)| reforms(&ev, pid).len() >= 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        ev = events(&log);
    }
    for &(_, pid) in &first {
        assert_eq!(reforms(&ev, pid), vec![4, 2], "pid {pid}: {ev:?}");
    }
    let started: BTreeSet<u32> = ev
        .iter()
        .filter(|e| e.event == "start")
        .map(|e| e.pid)
        .collect();
    assert_eq!(
        started.len(),
        4,
        "two processes started with the job, two for plan 1: {ev:?}"
    );

    // kill -9 of a rank mid-epoch: the group restarts from the latest cut.
    shards_at_least(addr, s.shards_done + 4).await;
    kill9(pid_of(addr, "worker", 1).await);

    let report = run.report().await;
    assert!(report.data_tracked);
    assert_each_sample_once(&report, SAMPLES, EPOCHS);
    assert!(report.restarts.values().sum::<u32>() >= 1, "{report:?}");
    assert_eq!(report.transitions.len(), 2);
    assert!(
        report.transitions.iter().all(|t| t.resumed_ms.is_some()),
        "every rank stepped again after each plan: {:?}",
        report.transitions
    );
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("every process restarts from checkpoint")),
        "{:#?}",
        report.events
    );
}

/// The SDK's `restore()` onto a damaged newest checkpoint (its state file spoiled on disk,
/// then a rank killed -9): the ranks report it, the job master restarts the group from the
/// checkpoint before it, saying which and why, and the job goes on to commit again and
/// trains every sample once per epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_script_s_damaged_newest_checkpoint_falls_back_to_the_one_before_it() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, log) = (dir.path().join("ckpt"), dir.path().join("events.jsonl"));
    let mut run = start(spec(&python, &sdk, &ckpt, &log), dir.path()).await;
    let s = wait_for(run.addr, Duration::from_secs(180), "two checkpoints", |s| {
        s.checkpoints >= 2 && worker_pids(s).iter().all(|&(_, pid)| pid > 0)
    })
    .await;
    let pids: Vec<u32> = worker_pids(&s).iter().map(|&(_, pid)| pid).collect();
    let (id, step) = spoil_the_newest_checkpoint(&run, &pids).await;
    kill9(pids[1]);
    signal_all(&pids[..1], nix::sys::signal::Signal::SIGCONT);
    let report = run.report().await;
    assert_recovered(
        &report,
        &format!("checkpoint {id} (step {step}) is damaged (worker-"),
    );
    assert_recovered(&report, "is damaged: its SHA-256 is");
    assert_recovered(&report, &format!("falls back to checkpoint {}", id - 1));
    assert_each_sample_once(&report, SAMPLES, EPOCHS);
    let ctx = context(&run.run_dir);
    let newest = ctx["checkpoints"].as_array().unwrap().last().unwrap()["id"].as_u64();
    assert!(
        newest > Some(id),
        "the job commits again after the fallback: {ctx}"
    );
}

/// A rank frozen with SIGSTOP: its peer blocks in a collective, the job master finds the
/// group hung (no step for far longer than a step takes), the agents capture the stacks (the
/// frozen one's thread states, its peer's Python stack through the SDK's faulthandler), and
/// the group restarts from its latest cut: every sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_rank_is_found_hung_with_its_peer_s_python_stack() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, log) = (dir.path().join("ckpt"), dir.path().join("events.jsonl"));
    let mut spec = spec(&python, &sdk, &ckpt, &log);
    spec.epochs = 1;
    spec.stability.hang_min_s = 5.0;
    spec.stability.hang_after_steps = 20.0;
    let mut run = start(spec, dir.path()).await;
    let s = wait_for(run.addr, Duration::from_secs(120), "a checkpoint", |s| {
        s.checkpoints >= 1 && worker_pids(s).iter().all(|&(_, pid)| pid > 0)
    })
    .await;
    shards_at_least(run.addr, s.shards_done + 2).await;
    let frozen = pid_of(run.addr, "worker", 1).await;
    freeze(frozen);
    let report = run.report().await;
    assert_each_sample_once(&report, SAMPLES, 1);
    assert_eq!(report.hangs.len(), 1, "{:#?}", report.events);
    let stacks = &report.hangs[0].stacks;
    assert!(
        stacks["worker-1"].contains("is stopped (SIGSTOP)"),
        "{stacks:#?}"
    );
    // Its peer's own Python stack, as faulthandler writes it, from the script down to where
    // it waits for the frozen rank: the SDK's step all_gather, or DDP's gradient all-reduce
    // under the script's backward(), depending on the instant the rank froze.
    let peer = &stacks["worker-0"];
    assert!(peer.contains("most recent call first"), "{peer}");
    assert!(peer.contains("pytorch-ddp/train.py"), "{peer}");
    assert!(
        peer.contains("brain_sdk") || peer.contains("backward"),
        "{peer}"
    );
    assert_recovered(&report, "every process restarts from checkpoint");
}

/// The pre-run check (`precheck:`) on the one node of the local platform: its check process
/// times a torch matmul before the first launch, the time is in the report, and the job
/// trains as usual after it. A Python the check cannot run in fails the job before anything
/// starts, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_run_check_times_the_node_before_training_and_refuses_a_broken_one() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, log) = (dir.path().join("ckpt"), dir.path().join("events.jsonl"));
    let mut spec = spec(&python, &sdk, &ckpt, &log);
    spec.epochs = 1;
    spec.precheck.enabled = Some(true);
    spec.precheck.matmul_size = Some(256);
    let mut run = start(spec.clone(), dir.path()).await;
    // The master answers while the check runs (torch's import alone takes seconds): its
    // status says so, nothing is launched, and a plan is refused with the reason.
    let during = wait_for(
        run.addr,
        Duration::from_secs(30),
        "the check's status",
        |s| !s.transition.is_empty(),
    )
    .await;
    assert!(
        during.transition.contains("pre-run check under way for"),
        "{during:#?}"
    );
    assert!(during.processes.iter().all(|p| p.pid == 0), "{during:#?}");
    let answer = client(run.addr)
        .await
        .apply_scale_plan(plan(1, Some(1), None))
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.accepted, "{answer:?}");
    assert!(
        answer.reason.contains("the pre-run check is under way"),
        "{answer:?}"
    );
    let report = run.report().await;
    assert_each_sample_once(&report, SAMPLES, 1);
    let check = report.precheck.as_ref().expect("a pre-run check");
    assert_eq!(check.nodes.len(), 1, "{check:#?}");
    let node = &check.nodes[0];
    assert_eq!(node.health, vocab::report::NodeHealth::Healthy, "{node:#?}");
    assert!(node.matmul_ms.is_some_and(|ms| ms > 0.0), "{node:#?}");
    assert!(check.elapsed_ms > 0);
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("pre-run check of 1 node(s) took")),
        "{:#?}",
        report.events
    );
    let ctx =
        job_master::persist::load(&run.run_dir.join(job_master::persist::CONTEXT_FILE)).unwrap();
    let text = job_master::diagnose::diagnosis(&ctx, Some(&report), false);
    assert!(text.contains("pre-run check: 1 node(s) in"), "{text}");
    assert!(
        text.contains("127.0.0.1        healthy    matmul"),
        "{text}"
    );

    // A Python without torch: the node is faulty, and there is no other.
    let dir = tempfile::tempdir().unwrap();
    spec.precheck.python = Some("/nonexistent/python3".into());
    spec.checkpoint.dir = dir.path().join("ckpt");
    let run = start(spec, dir.path()).await;
    let err = tokio::time::timeout(Duration::from_secs(120), run.handle)
        .await
        .expect("the job master gave up in time")
        .unwrap()
        .expect_err("no healthy node");
    let text = err.to_string();
    assert!(
        text.contains("no healthy node: 127.0.0.1 is faulty"),
        "{text}"
    );
    assert!(text.contains("/nonexistent/python3"), "{text}");
    assert!(processes_of(run.addr).is_empty());
}

/// The SDK's own unit tests (`python/tests`: step slicing, environment, checkpoint files).
#[test]
fn the_sdk_unit_tests_pass() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/tests");
    let out = std::process::Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(&tests)
        .env("PYTHONPATH", &sdk)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(!log.contains("Ran 0 tests"), "{log}");
}

/// A script that reads its own data and uses the SDK only for its checkpoints
/// (`tests/scripts/sdk_sigterm.py`): rescaled the restart way, rank 0 saves on SIGTERM, the job
/// master records that checkpoint (from the process it just asked to stop), and the relaunched
/// group resumes from it rather than from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_saved_on_sigterm_is_where_the_restarted_group_resumes() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/sdk_sigterm.py");
    let argv = [
        python.clone(),
        script.display().to_string(),
        "--target".into(),
        "1500".into(),
        "--starts".into(),
        starts.display().to_string(),
    ];
    let yaml = format!(
        r#"
name: sigterm
kind: allreduce
roles:
  worker: {{ replicas: 1, min: 1, max: 2 }}
workload:
  command: {argv:?}
  grace_period_ms: 15000
  env: {{ OMP_NUM_THREADS: "1", PYTHONPATH: {sdk:?} }}
data: {{ num_samples: 100, shard_size: 10 }}
checkpoint: {{ dir: {:?} }}
"#,
        dir.path().join("ckpt")
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    let mut run = start(spec, dir.path()).await;
    let lines = |n: usize| {
        let starts = starts.clone();
        async move {
            for _ in 0..1200 {
                let l: Vec<serde_json::Value> = std::fs::read_to_string(&starts)
                    .unwrap_or_default()
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                if l.len() >= n {
                    return l;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("fewer than {n} starts");
        }
    };
    lines(1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    send(run.addr, plan(1, Some(2), None)).await;
    let l = lines(3).await;
    let rank0 = l[1..]
        .iter()
        .find(|s| s["rank"] == 0)
        .expect("rank 0 restarted");
    assert_eq!(rank0["world"], 2);
    assert_eq!(rank0["restart"], 1);
    assert!(
        rank0["resumed"].as_u64().unwrap() > 0,
        "the restarted group resumed from the SIGTERM checkpoint: {l:?}"
    );
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "not tracked");
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("committed by the script")),
        "{:#?}",
        report.events
    );
}

/// What `flash_restart` saw: the script's log and the newest flash manifest (its parts in
/// `_dir`, kept while this lives).
struct FlashRestart {
    log: Vec<serde_json::Value>,
    manifest: serde_json::Value,
    _dir: tempfile::TempDir,
}

impl FlashRestart {
    /// The second start of `rank` (after the group restart).
    fn again(&self, rank: u64) -> &serde_json::Value {
        let starts: Vec<&serde_json::Value> = self
            .log
            .iter()
            .filter(|e| e.get("from").is_some())
            .collect();
        assert_eq!(starts.len(), 4, "two starts of two ranks: {:#?}", self.log);
        starts[2..]
            .iter()
            .find(|s| s["rank"] == rank)
            .unwrap_or_else(|| panic!("rank {rank} restarted: {:#?}", self.log))
    }

    /// Rank 1 restored from disk (its copies gone), both at the same committed step (past the
    /// first), each state whole.
    fn restored_alike(&self) {
        let all = &self.log;
        assert_eq!(self.again(1)["from"], "disk", "{all:#?}");
        for r in [0, 1] {
            assert!(self.again(r)["resumed"].as_u64().unwrap() >= 10, "{all:#?}");
            assert_eq!(self.again(r)["whole"], true, "{all:#?}");
        }
        assert_eq!(
            self.again(0)["resumed"],
            self.again(1)["resumed"],
            "the same committed step: {all:#?}"
        );
    }
}

/// A job named `name` whose workers (`worker`: their role's fields, `replicas: 2`) run
/// `tests/scripts/sdk_flash.py` with `args` (logging to `log`) on `python` with the SDK at
/// `sdk`, with `memory` of flash memory and its checkpoints under `dir/ckpt`.
fn sdk_flash_job(
    (python, sdk): (&str, &Path),
    dir: &Path,
    name: &str,
    worker: &str,
    memory: &str,
    log: &Path,
    args: &[String],
) -> job_master::spec::JobSpec {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/sdk_flash.py");
    let mut argv = vec![python.to_string(), script.display().to_string()];
    argv.extend(args.iter().cloned());
    argv.extend(["--log".to_string(), log.display().to_string()]);
    let yaml = format!(
        r#"
name: {name}
kind: allreduce
roles:
  worker: {{ {worker} }}
workload:
  command: {argv:?}
  env: {{ OMP_NUM_THREADS: "1", PYTHONPATH: {sdk:?} }}
data: {{ num_samples: 100, shard_size: 10 }}
checkpoint: {{ dir: {:?}, flash: {{ memory: {memory} }} }}
"#,
        dir.join("ckpt")
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    spec
}

/// `tests/scripts/sdk_flash.py` on two ranks saving with `job.save_async` (`--sharded`: each
/// rank its own shard) until the master has committed two steps; then rank 1's copies are
/// taken out of its node's memory and its process is killed -9, so the group restarts and
/// rank 1 must restore from disk, and a process's slots that no agent will remove are planted
/// beside them. Runs the job to its end; asserts it succeeded, that every save was a memory
/// copy, and that no copy is left on the node.
async fn flash_restart(python: &str, sdk: &Path, sharded: bool) -> FlashRestart {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("flash.jsonl");
    let mut args = vec!["--target".to_string(), "1200".into()];
    if sharded {
        args.push("--sharded".into());
    }
    // The two tests run in one process: their runs (named by job and process) must differ.
    let name = if sharded { "flash-sharded" } else { "flash" };
    let spec = sdk_flash_job(
        (python, sdk),
        dir.path(),
        name,
        "replicas: 2",
        "64Mi",
        &log,
        &args,
    );
    let mut run = start(spec, dir.path()).await;
    wait_for(
        run.addr,
        Duration::from_secs(120),
        "a flash checkpoint",
        |s| s.checkpoints >= 2,
    )
    .await;
    // Rank 1's copies leave its node's memory: it must read the committed step from disk.
    // (A replicated state is committed by rank 0 alone, which may be ahead of rank 1's first
    // copy on a busy machine.)
    let slots = flash_run_dir(name).join("worker-1");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !slots.join("slot-0.json").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "rank 1 made no copy: {}",
            slots.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = pid_of(run.addr, "worker", 1).await;
    for e in std::fs::read_dir(&slots).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    // What an agent killed -9 and never started again leaves: its process's slots.
    let orphan = slots.with_file_name("worker-9");
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("slot-0"), b"left behind").unwrap();
    test_support::kill9(victim);
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    let log: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Every save was a memory copy; the steps committed are flash manifests beside the parts.
    let saves = log.iter().filter(|e| e.get("blocked_s").is_some()).count();
    assert!(saves >= 100, "{saves}");
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("committed by the script")),
        "{:#?}",
        report.events
    );
    let manifest = dir
        .path()
        .join("ckpt/flash")
        .read_dir()
        .unwrap()
        .filter_map(|e| {
            let m = e.unwrap().path().join("manifest.json");
            m.exists().then_some(m)
        })
        .max()
        .expect("a flash manifest");
    let manifest = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    // The job over, its agents let the copies go, and the job master what was left.
    assert!(
        !slots.parent().unwrap().exists(),
        "{:?}",
        std::fs::read_dir(slots.parent().unwrap()).map(|d| d.count())
    );
    FlashRestart {
        log,
        manifest,
        _dir: dir,
    }
}

/// Flash checkpoints (issue 43): two ranks save a replicated tensor state; their agents write
/// rank 0's copy out and the master commits each step. After rank 1's kill -9 (its copies gone
/// first), rank 0 restores from the copy its agent holds in memory and rank 1 from disk. Both
/// resume at the committed step with the state whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_checkpoint_is_restored_from_memory_on_its_node_and_from_disk_elsewhere() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let run = flash_restart(&python, &sdk, false).await;
    run.restored_alike();
    assert_eq!(run.again(0)["from"], "memory", "{:#?}", run.log);
    let m = &run.manifest;
    assert_eq!(m["kind"], "flash", "{m}");
    assert!(
        m["model"]["path"].as_str().unwrap().ends_with("part-0.bin"),
        "{m}"
    );
}

/// The copy a process makes right before it ends is still written out and committed: its
/// agent stays until the job master lets it go, writing out meanwhile. `sdk_flash.py` saves
/// once, 32 MiB, at its last count, and exits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_copy_made_just_before_its_process_ends_is_written_out_and_committed() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("flash.jsonl");
    let args = [
        "--target", "50", "--every", "50", "--mib", "32", "--sleep", "0",
    ]
    .map(String::from);
    let spec = sdk_flash_job(
        (&python, &sdk),
        dir.path(),
        "flash-last",
        "replicas: 1",
        "128Mi",
        &log,
        &args,
    );
    let report = start(spec, dir.path()).await.report().await;
    let text = report.events.join("\n");
    assert!(report.succeeded(), "{:?}\n{text}", report.reason);
    let manifest = dir.path().join("ckpt/flash/step-0000000050/manifest.json");
    assert!(manifest.exists(), "{}\n{text}", manifest.display());
    assert!(text.contains("committed by the script"), "{text}");
}

/// Sharded flash checkpoints end to end (issue 43): each rank saves its own shard
/// (`save_async(sharded=True)`); a step is committed only once both shards are written out, in
/// one manifest naming both parts. After rank 1's kill -9 (its copies gone first), each rank
/// restores its own shard (rank 1 from disk), at the same step, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_flash_checkpoints_commit_every_shard_and_each_rank_restores_its_own() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let run = flash_restart(&python, &sdk, true).await;
    run.restored_alike();
    // Rank 0 restores from memory when its node still holds its copy of the committed step.
    // Before replacing a shard's copy its agent has not marked committed, a save asks the job
    // master, but this script's ranks run free of each other: rank 0 may save again before
    // rank 1's part of the step lands, and two slots cannot hold that step, the one before it
    // (still the committed one) and the new copy.
    assert!(
        ["memory", "disk"].contains(&run.again(0)["from"].as_str().unwrap_or_default()),
        "{:#?}",
        run.log
    );
    for r in [0, 1] {
        assert_eq!(run.again(r)["shard"], r, "its own shard: {:#?}", run.log);
    }
    let m = &run.manifest;
    assert_eq!(m["kind"], "flash", "{m}");
    let parts: Vec<&str> = m["shards"]
        .as_array()
        .unwrap_or_else(|| panic!("shards in {m}"))
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert_eq!(parts.len(), 2, "{m}");
    assert!(
        parts[0].ends_with("part-0.bin") && parts[1].ends_with("part-1.bin"),
        "{m}"
    );
    assert_ne!(
        std::fs::read(parts[0]).unwrap(),
        std::fs::read(parts[1]).unwrap(),
        "two shards, not one state twice"
    );
}

/// Asserts the DDP example's job ran in `dir` succeeded (else shows its events and logs) and
/// trained each sample once in each of `epochs`; its events, one a line.
fn trained_each_sample_once(report: &job_master::JobReport, dir: &Path, epochs: u64) -> String {
    let text = report.events.join("\n");
    assert!(
        report.succeeded(),
        "{:?}\n{text}\n{}",
        report.reason,
        logs_of(&dir.join("run/logs"))
    );
    assert_each_sample_once(report, SAMPLES, epochs);
    text
}

/// The DDP example's job with 16 MiB of flash memory for `epochs` epochs, its checkpoints in
/// `dir/ckpt`; and where its script's events go.
fn flash_ddp(
    python: &str,
    sdk: &Path,
    dir: &Path,
    epochs: i64,
) -> (job_master::spec::JobSpec, std::path::PathBuf) {
    let (ckpt, log) = (dir.join("ckpt"), dir.join("events.jsonl"));
    let mut spec = spec(python, sdk, &ckpt, &log);
    spec.epochs = epochs;
    spec.checkpoint.flash = Some(vocab::spec::FlashSpec {
        memory: Some(vocab::Bytes(16 << 20)),
    });
    (spec, log)
}

/// The job of [`flash_ddp`] started, once both workers run, a checkpoint is committed and two
/// more shards are done.
async fn flash_ddp_past_a_checkpoint(
    python: &str,
    sdk: &Path,
    dir: &Path,
    epochs: i64,
) -> (Running, std::path::PathBuf) {
    let (spec, log) = flash_ddp(python, sdk, dir, epochs);
    let run = start(spec, dir).await;
    let s = wait_for(run.addr, Duration::from_secs(120), "a checkpoint", |s| {
        s.checkpoints >= 1 && worker_pids(s).iter().all(|&(_, pid)| pid > 0)
    })
    .await;
    shards_at_least(run.addr, s.shards_done + 2).await;
    (run, log)
}

/// The DDP example with flash memory (`checkpoint.flash.memory`): every consistent cut is a
/// copy in the agents' memory, the cut ends without waiting for a disk and the copy is
/// committed once written out. A rank killed with kill -9 restarts the group, and both ranks
/// restore the committed cut from their node's memory; a grow's cut ends the same way, the
/// rank it adds getting the cut's state from rank 0 over the new group (no disk read), so does
/// a move's (the moved ranks' new processes get it from the round's rank 0, though the move
/// takes rank 0 of the cut), and a shrink's too; every sample is trained once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_held_in_memory_end_without_a_disk_write_and_a_restart_restores_from_memory() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Three epochs: a loaded machine (CI) trains slowly between the plans, and two were seen to end
    // before the cut after the move.
    let (mut run, log) = flash_ddp_past_a_checkpoint(&python, &sdk, dir.path(), 3).await;
    let addr = run.addr;
    kill9(pid_of(addr, "worker", 1).await);
    // The group back at work from the cut, then 2 -> 1 in place.
    let s = wait_for(addr, Duration::from_secs(120), "the restarted group", |s| {
        s.processes.iter().all(|p| p.incarnation >= 2 && p.pid > 0)
    })
    .await;
    let after = s.checkpoints + 1;
    wait_for(
        addr,
        Duration::from_secs(120),
        "a cut after the restart",
        |s| s.checkpoints >= after,
    )
    .await;
    send(addr, plan(1, Some(3), None)).await;
    let s = reached(addr, 1).await;
    // The group of 3 trains to a cut of its own before the shrink (a cut at the step already
    // committed would have nothing new to hold, and is saved to disk).
    let after = s.checkpoints + 2;
    wait_for(addr, Duration::from_secs(120), "a cut at 3", |s| {
        s.checkpoints >= after
    })
    .await;
    // Workers 0 (rank 0 of the cut) and 2 moved (new resources): worker 1 leads the round
    // after and sends their new processes the cut's state; worker 0's copy, written out by
    // its agent after the process left, is the cut's checkpoint (else no cut would follow).
    let moved_from = [
        pid_of(addr, "worker", 0).await,
        pid_of(addr, "worker", 2).await,
    ];
    let mut p = plan(2, None, None);
    for index in [0, 2] {
        p.migrations.push(pb::Migration {
            role: "worker".into(),
            index,
            resources: Some(pb::Resources {
                cpu_millicores: 1000,
                ..Default::default()
            }),
            reason: "test".into(),
        });
    }
    send(addr, p).await;
    let s = reached(addr, 2).await;
    for (index, from) in [0, 2].into_iter().zip(moved_from) {
        assert_ne!(
            pid_of(addr, "worker", index).await,
            from,
            "worker {index} moved"
        );
    }
    let after = s.checkpoints + 2;
    wait_for(
        addr,
        Duration::from_secs(120),
        "a cut after the move",
        |s| s.checkpoints >= after,
    )
    .await;
    send(addr, plan(3, Some(1), None)).await;
    reached(addr, 3).await;

    let report = run.report().await;
    let text = trained_each_sample_once(&report, dir.path(), 3);
    // Every checkpoint committed was a cut held in memory: no rank 0 saved one to disk.
    assert!(
        report
            .events
            .iter()
            .filter(|e| e.contains("committed at step"))
            .all(|e| e.contains("the cut held in memory written out")),
        "{text}"
    );
    let held = report
        .events
        .iter()
        .filter(|e| e.contains("held in memory") && e.contains("training goes on"))
        .count();
    let written = report
        .events
        .iter()
        .filter(|e| e.contains("the cut held in memory written out"))
        .count();
    assert!(held >= 4 && written >= 2, "{text}");
    // Each plan's cut ended without a disk write (the grow's new rank and the moved ones get the
    // state from rank 0, a shrink loads nothing new): the cut held in memory comes between the
    // plan's cut step and its re-formation.
    let at = |what: &str| {
        report
            .events
            .iter()
            .position(|e| e.contains(what))
            .unwrap_or_else(|| panic!("{what:?} in {text}"))
    };
    for (plan, from_rank0) in [(1, true), (2, true), (3, false)] {
        let (cut, reform) = (
            at(&format!("plan {plan} accepted")),
            at(&format!("plan {plan}: cut done")),
        );
        // The plan's own cut is the last one before its re-formation (periodic cuts may come
        // while its processes start).
        let held = report.events[cut..reform]
            .iter()
            .rev()
            .find(|e| e.contains("held in memory") && e.contains("training goes on"))
            .unwrap_or_else(|| panic!("plan {plan}'s cut held in memory: {text}"));
        assert_eq!(
            held.contains("from rank 0 over the new group"),
            from_rank0,
            "{text}"
        );
    }
    // Both ranks of the restarted group read the cut from their node's memory; the rank the
    // grow added and the moved ones' new processes got it from rank 0.
    assert_resumed(&log, (2, 3, 5), &text);
    // The job's events say it too, from each one's first report.
    let said = |how: &str| {
        report
            .events
            .iter()
            .filter(|e| e.contains(") restored step ") && e.ends_with(&format!("from {how}")))
            .count()
    };
    // (A process the shrink removed may leave before its first report.)
    assert_eq!((said("memory"), said("disk")), (2, 0), "{text}");
    assert!(said("peer") >= 1, "{text}");
}

/// A rank restarted where its node holds no flash copy (its copies removed, as a process
/// restarted on another node finds none) gets the committed cut from a rank whose node holds
/// it, over the restarted group (`restore(peers=True)`), not from disk; the other rank reads
/// its own node's memory; every sample is trained once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_restarted_where_its_node_holds_no_copy_gets_the_state_from_a_peer() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut run, log) = flash_ddp_past_a_checkpoint(&python, &sdk, dir.path(), 2).await;
    let addr = run.addr;
    let pid = pid_of(addr, "worker", 1).await;
    let started = starts(&log);
    let copies = started
        .iter()
        .rfind(|e| e["pid"] == pid)
        .and_then(|e| e["flash_dir"].as_str())
        .expect("worker 1's start names its flash directory")
        .to_string();
    // Its node loses its copies, then the process goes: its group restarts whole.
    let mut removed = 0;
    for e in std::fs::read_dir(&copies).unwrap() {
        let path = e.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("slot-")
        {
            std::fs::remove_file(path).unwrap();
            removed += 1;
        }
    }
    assert!(removed > 0, "worker 1 held copies in {copies}");
    kill9(pid);
    let report = run.report().await;
    let text = trained_each_sample_once(&report, dir.path(), 2);
    assert_resumed(&log, (1, 1, 2), &text);
}

/// Where the resumed processes restored from, as their `start` events say: (from memory, from
/// a peer, all resumed) is `want`.
fn assert_resumed(log: &Path, want: (usize, usize, usize), text: &str) {
    let resumed: Vec<serde_json::Value> = starts(log)
        .into_iter()
        .filter(|e| e["resumed"] == true)
        .collect();
    let from = |how: &str| resumed.iter().filter(|e| e["restored_from"] == how).count();
    assert_eq!(
        (from("memory"), from("peer"), resumed.len()),
        want,
        "{resumed:#?}\n{text}"
    );
}

/// The example's `start` events.
fn starts(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "start")
        .collect()
}

/// A worker of the DDP example that starts late (its first process sleeps 15 s before Python
/// runs; the round waits 4 s for a process not joined yet), with flash memory: the group's
/// first round closes with the other two, which train;
/// once it asks to join, the group drains to a cut held in memory and re-forms at once (no
/// wait for the disk), rank 0 of the cut sending the late worker the cut's state over the new
/// group; every sample is trained once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_worker_gets_the_cut_from_rank_0_without_waiting_for_the_disk() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Two epochs: the data must last past the late worker's start.
    let (mut spec, _) = flash_ddp(&python, &sdk, dir.path(), 2);
    let late = "[ \"$BRAIN_INDEX.$BRAIN_INCARNATION\" = 2.1 ] && sleep 15; exec \"$@\"";
    let mut command = vec!["sh".to_string(), "-c".into(), late.into(), "sh".into()];
    command.extend(spec.workload.command.take().unwrap());
    spec.workload.command = Some(command);
    let worker = spec.roles.get_mut(&vocab::Role::WORKER).unwrap();
    (worker.replicas, worker.min, worker.max) = (Some(3), Some(2), Some(3));
    spec.validate().unwrap();
    let timing = job_master::job::Timing {
        register_timeout_ms: 4_000,
        ..test_timing()
    };
    let report = start_with(spec, dir.path(), timing).await.report().await;
    let text = trained_each_sample_once(&report, dir.path(), 2);
    for said in [
        "worker(s) [2] joined after round 0 closed without them",
        "training goes on while it is written out; the workers that joined late get it from \
         rank 0 over the new group",
        "worker-2 (incarnation 1) restored step",
    ] {
        assert!(text.contains(said), "{said}: {text}");
    }
    assert!(!text.contains("joined late load it from disk"), "{text}");
    let from_peer = report
        .events
        .iter()
        .any(|e| e.contains("worker-2 (incarnation 1) restored step") && e.ends_with("from peer"));
    assert!(from_peer, "{text}");
}

/// The flash directory of this test process's run of job `name`: its job master's run id is
/// the name, the pid, a count of the runs the process started and 32 random bits (the one
/// directory so named).
fn flash_run_dir(name: &str) -> std::path::PathBuf {
    let prefix = format!("{name}-{}-", std::process::id());
    let root = std::path::Path::new(vocab::flash::DEFAULT_ROOT);
    let all: Vec<std::path::PathBuf> = std::fs::read_dir(root)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let found: Vec<std::path::PathBuf> = all
        .into_iter()
        .filter(|p| {
            let file = p.file_name().unwrap_or_default().to_string_lossy();
            file.strip_prefix(&prefix)
                .and_then(|rest| rest.split_once('-'))
                .is_some_and(|(n, random)| {
                    !n.is_empty()
                        && n.chars().all(|c| c.is_ascii_digit())
                        && random.len() == 8
                        && random.chars().all(|c| c.is_ascii_hexdigit())
                })
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one run of {name} in {}: {found:?}",
        root.display()
    );
    found.into_iter().next().expect("one")
}

/// Every process log under `dir`, each under its name (for a failure's message).
fn logs_of(dir: &std::path::Path) -> String {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- {}\n{}", p.display(), tail.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The worker agent of `pid` (its parent, or its grandparent under a sandbox).
fn agent_of(pid: u32) -> u32 {
    let mut p = pid;
    for _ in 0..4 {
        p = test_support::parent_of(p);
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        if comm.trim() == "worker-agent" {
            return p;
        }
    }
    panic!("no worker-agent above process {pid}");
}

/// kill -9 of rank 0's worker agent while it writes a flash copy out (its process dies with
/// it): the step being written is never committed half-written, the group restarts, every rank
/// restores a whole state of a committed step (from memory where its node holds it), and the
/// job ends as it would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_while_writing_a_copy_out_leaves_a_whole_committed_checkpoint() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("flash.jsonl");
    let args = ["--target", "600", "--mib", "64", "--sleep", "0.02"].map(String::from);
    let spec = sdk_flash_job(
        (&python, &sdk),
        dir.path(),
        "flash-agent-kill",
        "replicas: 2, max_restarts: 3",
        "256Mi",
        &log,
        &args,
    );
    let mut run = start(spec, dir.path()).await;
    wait_for(
        run.addr,
        Duration::from_secs(120),
        "a flash checkpoint",
        |s| s.checkpoints >= 1,
    )
    .await;
    let slots = flash_run_dir("flash-agent-kill").join("worker-0");
    let agent = agent_of(pid_of(run.addr, "worker", 0).await);
    // Caught writing a copy out (the slot it holds is `persisting`), it is killed.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let writing = loop {
        let found = (0..2).find_map(|s| {
            let text = std::fs::read_to_string(slots.join(format!("slot-{s}.json"))).ok()?;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            (v["state"] == "persisting").then(|| v["step"].as_u64().unwrap())
        });
        if let Some(step) = found {
            test_support::kill9(agent);
            break step;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never caught writing out: {}",
            slots.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    let all: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let restarted: Vec<&serde_json::Value> = all
        .iter()
        .filter(|e| e.get("from").is_some() && e["restart"].as_u64() > Some(0))
        .collect();
    assert!(restarted.len() >= 2, "both ranks restarted: {all:#?}");
    for e in &restarted {
        // A whole state of a committed step, never a half-written one.
        assert_eq!(e["whole"], true, "{all:#?}");
        assert!(e["resumed"].as_u64().unwrap() >= 10, "{all:#?}");
    }
    let resumed = restarted[0]["resumed"].as_u64().unwrap();
    assert!(
        restarted
            .iter()
            .all(|e| e["resumed"].as_u64() == Some(resumed)),
        "the same step on every rank: {all:#?}"
    );
    // The step being written was committed whole by the next agent, or not at all: the step
    // the group resumed from is one whose manifest names a part with the right digest.
    let text = report.events.join("\n");
    assert!(
        text.contains("every process restarts from checkpoint"),
        "{text}"
    );
    eprintln!("killed writing step {writing}; resumed from step {resumed}");
}
