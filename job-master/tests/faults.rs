//! kill -9 in the middle of work: the job finishes and nothing is lost or done twice.

mod common;

use std::time::{Duration, Instant};

use common::*;
use job_master::job::Timing;
use job_master::spec::Role;

const N: u64 = 40_000;

/// Sum of the indices of the training samples, once per epoch.
fn index_sum_per_epoch() -> u64 {
    N * (N - 1) / 2
}

/// The all-reduce group restarted once from its checkpoint, and the final model counted each
/// sample exactly once per epoch (two epochs of `N`), through the rollback.
fn assert_one_group_restart_and_each_sample_once(report: &job_master::JobReport) {
    assert_eq!(
        report.restarts.get(&Role::WORKER),
        Some(&1),
        "{:#?}",
        report.events
    );
    assert_eq!(report.applied_samples, 2 * N);
    assert_eq!(report.applied_index_sum, 2 * index_sum_per_epoch());
    assert_recovered(report, "every process restarts from checkpoint");
}

/// A ps job's worker dies mid-epoch: only it is relaunched; its shard goes back to the queue;
/// the PS ignore the batches of that shard it had already pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_ps_worker_mid_epoch_relaunches_it_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "kill-worker", "ps", 2, 3, N, 2, 150, 10);
    let mut run = start(spec, dir.path()).await;
    shards_at_least(run.addr, 8).await;
    let victim = pid_of(run.addr, "worker", 1).await;
    kill9(victim);
    let report = run.report().await;
    assert_eq!(report.restarts.get(&Role::WORKER), Some(&1));
    assert!(report.samples_per_epoch.values().all(|&s| s == N));
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert_recovered(&report, "worker-1 failed (killed by signal 9)");
    assert_no_process_left(run.addr).await;
}

/// An allreduce job's worker dies mid-epoch: the ring is broken, so the group re-forms in a new
/// rendezvous round from the latest checkpoint and the ledger rolls back to its data position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_allreduce_worker_restarts_the_group_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "kill-ring", "allreduce", 0, 3, N, 2, 150, 8);
    let mut run = start(spec, dir.path()).await;
    wait_for(
        run.addr,
        Duration::from_secs(60),
        "a checkpoint and more shards",
        |s| s.checkpoints >= 1 && s.shards_done >= 12,
    )
    .await;
    let victim = pid_of(run.addr, "worker", 2).await;
    let before = status(run.addr).await.unwrap();
    kill9(victim);
    let report = run.report().await;
    // (Once in CI, 2026-11-27, two restarts were counted here; the events say why.)
    assert_one_group_restart_and_each_sample_once(&report);
    let from_disk = report
        .events
        .iter()
        .filter(|e| e.contains("(incarnation 2) restored step") && e.ends_with("from disk"))
        .count();
    assert_eq!(from_disk, 3, "{:#?}", report.events);
    let ctx = context(&run.run_dir);
    let rolled_back = ctx["ledger"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c[4] == true)
        .count();
    // Shards done after the last checkpoint were undone and done again.
    if before.shards_done > 8 * before.checkpoints as u64 {
        assert!(
            rolled_back > 0,
            "completions after the checkpoint must have been rolled back"
        );
    }
    assert_no_process_left(run.addr).await;
}

/// Flash checkpoints in the built-in workload (issue 43): the cuts are copies into the agents'
/// memory, written out behind the training. After kill -9 of a worker the group restarts from
/// the latest committed step, and every rank reads it from its node's memory: the parts on
/// disk are overwritten with garbage from the kill on, so a restore from disk would fail its
/// digest (and the job with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_workload_s_flash_cuts_restore_from_memory_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, flash) = flash_job_past_a_cut(dir.path(), "flash-ring", "allreduce", 0, 3).await;
    kill9(pid_of(run.addr, "worker", 2).await);
    let spoil = spoil_from_now_on(flash, b"BRAR");
    let report = run.report().await;
    spoil.abort();
    assert_one_group_restart_and_each_sample_once(&report);
    assert!(
        report.events.iter().any(|e| e.contains("held in memory")),
        "{:#?}",
        report.events
    );
    // Each of the three ranks says where it restored from (`worker-0 (incarnation 2)
    // restored step 40 from memory`).
    let from = |what: &str| {
        report
            .events
            .iter()
            .filter(|e| e.contains("(incarnation 2) restored step") && e.ends_with(what))
            .count()
    };
    assert_eq!(
        (from("from memory"), from("from disk")),
        (3, 0),
        "{:#?}",
        report.events
    );
    assert_no_process_left(run.addr).await;
}

/// The built-in all-reduce workers' grows and moves at a cut held in memory (issue 43): the
/// group does not wait for the cut to be written out; rank 0 of the round after (a process
/// that took part in the cut) sends its model over the ring to the process the plan adds,
/// then to the one that replaces the moved rank 0. From the first plan on every part on disk
/// is overwritten with garbage, so a process that read the disk would fail its digest (and
/// the job with it): the job ends with each sample applied once per epoch, and each new
/// process says it restored from a peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_workload_s_grow_and_move_take_the_cut_from_rank_0_not_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, flash) = flash_job_past_a_cut(dir.path(), "flash-grow", "allreduce", 0, 2).await;
    let spoil = spoil_from_now_on(flash, b"BRAR");
    rescale_workers(run.addr, 1, 3).await;
    // Once the grow's cut is committed, kill -9 of the added worker: the group restarts from
    // the latest committed step, which every rank holds in memory (the added one the copy it
    // kept of what rank 0 sent, or a later cut's).
    let grown_at = events_until(&run, "the grow's cut sent by rank 0", |ev| {
        ev.iter()
            .filter(|t| t.contains("get it from rank 0 over the new group"))
            .find_map(|t| {
                t.strip_prefix("cut at step ")?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
    })
    .await;
    events_until(&run, "the grow's cut committed", |ev| {
        ev.iter()
            .filter_map(|t| {
                let (_, rest) = t.split_once(" committed at step ")?;
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .any(|step| step >= grown_at)
            .then_some(())
    })
    .await;
    kill9(pid_of(run.addr, "worker", 2).await);
    let restored = |ev: &[&str]| {
        let n = ev
            .iter()
            .filter(|t| t.contains("(incarnation 2) restored step"))
            .count();
        (n == 3).then_some(())
    };
    events_until(&run, "the three ranks restored", restored).await;
    let mut p = plan(2, None, None);
    p.migrations = vec![proto::jobmaster::v1::Migration {
        role: "worker".into(),
        index: 0,
        resources: None,
        reason: "a slow node".into(),
    }];
    send(run.addr, p).await;
    reached(run.addr, 2).await;
    let report = run.report().await;
    spoil.abort();
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.applied_samples, 2 * N);
    assert_eq!(report.applied_index_sum, 2 * index_sum_per_epoch());
    let said = |what: &str| report.events.iter().filter(|e| e.contains(what)).count();
    // The grow's cut, then the move's: neither waited for its write-out.
    assert_eq!(
        (
            said("get it from rank 0 over the new group"),
            said("waits for it to be written out")
        ),
        (2, 0),
        "{:#?}",
        report.events
    );
    // Worker 2 (added) and worker 0's third process (moved after the restart) restored from a
    // peer; after the kill every rank from memory.
    let from_peer: Vec<&String> = report
        .events
        .iter()
        .filter(|e| e.contains("restored step") && e.ends_with("from peer"))
        .collect();
    assert!(
        from_peer
            .iter()
            .any(|e| e.contains("worker-2 (incarnation 1)"))
            && from_peer
                .iter()
                .any(|e| e.contains("worker-0 (incarnation 3)")),
        "{:#?}",
        report.events
    );
    assert_eq!(said("from disk"), 0, "{:#?}", report.events);
    assert_eq!(
        report
            .events
            .iter()
            .filter(|e| e.contains("(incarnation 2) restored step") && e.ends_with("from memory"))
            .count(),
        3,
        "{:#?}",
        report.events
    );
    assert_eq!(report.restarts.get(&Role::WORKER), Some(&1));
    assert_no_process_left(run.addr).await;
}

/// What `found` finds in the job's persisted events (their texts), once it finds it.
async fn events_until<T>(run: &Running, what: &str, found: impl Fn(&[&str]) -> Option<T>) -> T {
    for _ in 0..600 {
        let ctx = context(&run.run_dir);
        let events = ctx["events"].as_array().cloned().unwrap_or_default();
        let texts: Vec<&str> = events.iter().filter_map(|e| e["text"].as_str()).collect();
        if let Some(t) = found(&texts) {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not seen: {what}\n{}", run.last_events(30));
}

/// A built-in job (`kind`, `ps` PS, `workers` workers, 2 epochs of `N`) with flash checkpoints
/// every 8 shards, started in `dir` and run until a checkpoint is committed, 12 shards are
/// done and a flash part is written out; where its parts go.
async fn flash_job_past_a_cut(
    dir: &std::path::Path,
    name: &str,
    kind: &str,
    ps: u32,
    workers: u32,
) -> (Running, std::path::PathBuf) {
    let yaml = builtin_yaml(dir, name, kind, ps, workers, N, 2, 150, 8).replace(
        "every_shards: 8 }",
        "every_shards: 8, flash: { memory: 4Mi } }",
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let run = start(spec, dir).await;
    let flash = dir.join("checkpoints").join("flash");
    wait_for(
        run.addr,
        Duration::from_secs(60),
        "a flash checkpoint and more shards",
        |s| s.checkpoints >= 1 && s.shards_done >= 12,
    )
    .await;
    assert!(!flash_parts(&flash).is_empty(), "no flash part written out");
    (run, flash)
}

/// The parts of flash checkpoints written out under `flash` (`step-S/part-R.bin`).
fn flash_parts(flash: &std::path::Path) -> Vec<std::path::PathBuf> {
    let steps = std::fs::read_dir(flash).into_iter().flatten().flatten();
    steps
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect()
}

/// Overwrites every flash part under `flash` with garbage (after the format's `magic`) every
/// 20 ms until aborted: a restore from disk fails its digest from now on.
fn spoil_from_now_on(
    flash: std::path::PathBuf,
    magic: &'static [u8; 4],
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for p in flash_parts(&flash) {
                let len = std::fs::metadata(&p).map_or(0, |m| m.len()) as usize;
                let mut junk = magic.to_vec();
                junk.resize(len.max(4), 0xAB);
                let _ = std::fs::write(&p, junk);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// A ps job with flash checkpoints: at each cut the parameter servers copy their partitions
/// into their agents' memory and training goes on while the agents write them out. After kill
/// -9 of a PS every process restarts from the latest committed step, and both PS read their
/// partitions from their node's memory: the parts on disk are overwritten with garbage from
/// the kill on, so a restore from disk would fail its digest (and the job with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ps_job_s_flash_cuts_restore_its_servers_from_memory_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, flash) = flash_job_past_a_cut(dir.path(), "flash-ps", "ps", 2, 3).await;
    kill9(pid_of(run.addr, "ps", 1).await);
    let spoil = spoil_from_now_on(flash, b"BRPS");
    let report = run.report().await;
    spoil.abort();
    assert_eq!(
        report.restarts.get(&Role::PS),
        Some(&1),
        "{:#?}",
        report.events
    );
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert_recovered(&report, "every process restarts from checkpoint");
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("held in the parameter servers' memory")),
        "{:#?}",
        report.events
    );
    // Each PS says where its partition came from after the restart (`ps-1 (incarnation 2)
    // restored step 16 from memory`), in its log and in the job's events.
    let restored = |from: &str| -> Vec<&String> {
        let events = report.events.iter();
        events
            .filter(|e| e.contains(" ps-") && e.contains(") restored step") && e.ends_with(from))
            .collect()
    };
    assert_eq!(
        (restored("from memory").len(), restored("from disk").len()),
        (2, 0),
        "{:#?}",
        report.events
    );
    let log = std::fs::read_to_string(run.run_dir.join("logs/ps-0.1.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("partition restored") && l.contains("from=\"memory\"")),
        "{log}"
    );
    assert_no_process_left(run.addr).await;
}

/// A PS dies: its partition is restored from the latest checkpoint (digest-checked), every
/// process restarts from that checkpoint, and the ledger rolls back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_ps_restores_it_from_the_latest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "kill-ps", "ps", 2, 3, N, 2, 150, 10);
    let mut run = start(spec, dir.path()).await;
    wait_for(
        run.addr,
        Duration::from_secs(60),
        "a committed checkpoint",
        |s| s.checkpoints >= 1 && s.shards_done >= 15,
    )
    .await;
    let victim = pid_of(run.addr, "ps", 1).await;
    kill9(victim);
    let report = run.report().await;
    assert_eq!(report.restarts.get(&Role::PS), Some(&1));
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert_recovered(&report, "ps-1 failed (killed by signal 9)");
    assert_recovered(&report, "every process restarts from checkpoint");
    let log = std::fs::read_to_string(run.run_dir.join("logs/ps-1.1.log")).unwrap();
    assert!(
        log.contains("partition restored"),
        "the relaunched PS must load its checkpoint:\n{log}"
    );
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("ps-1 (incarnation 2) restored step") && e.ends_with("from disk")),
        "{:#?}",
        report.events
    );
    assert_no_process_left(run.addr).await;
}

/// A damaged newest checkpoint does not fail the group: the processes restarted onto it (after
/// kill -9 of a worker) find its model file damaged and say so, the job master drops it and
/// restarts the group from the checkpoint before it, says which and why, and the job commits
/// again from there with every sample trained once per epoch. The damaged one's id is never
/// given again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_checkpoint_falls_back_to_the_one_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "damaged", "allreduce", 0, 3, N, 2, 150, 8);
    let mut run = start(spec, dir.path()).await;
    wait_for(run.addr, Duration::from_secs(90), "two checkpoints", |s| {
        s.checkpoints >= 2
    })
    .await;
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(pid_of(run.addr, "worker", i).await);
    }
    let (id, step) = spoil_the_newest_checkpoint(&run, &workers).await;
    kill9(workers[2]);
    signal_all(&workers[..2], nix::sys::signal::Signal::SIGCONT);
    let report = run.report().await;
    let fallen_back = [
        format!("checkpoint {id} (step {step}) is damaged (worker-"),
        format!("falls back to checkpoint {}", id - 1),
        format!(
            "checkpoint {id} (step {step}) is damaged: every process restarts from checkpoint {}",
            id - 1
        ),
    ];
    for event in &fallen_back {
        assert_recovered(&report, event);
    }
    // The kill is the one relaunch counted; the fallback is the group's, not a failure.
    assert_one_group_restart_and_each_sample_once(&report);
    let ctx = context(&run.run_dir);
    assert_eq!(
        ctx["damaged_checkpoints"][0]["id"], id,
        "{}",
        ctx["damaged_checkpoints"]
    );
    let ids: Vec<u64> = ctx["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert!(!ids.contains(&id), "{ids:?}");
    assert!(
        ids.iter().any(|&i| i > id),
        "the job commits again after the fallback: {ids:?}"
    );
    assert_no_process_left(run.addr).await;
}

/// A ps job's newest checkpoint damaged (both servers' partitions spoiled): after kill -9 of a
/// PS the servers restoring from it find it damaged, and the group falls back to the one
/// before it; each sample is applied once per epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ps_job_s_damaged_newest_checkpoint_falls_back_to_the_one_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "damaged-ps", "ps", 2, 3, N, 2, 150, 6);
    let mut run = start(spec, dir.path()).await;
    wait_for(run.addr, Duration::from_secs(90), "two checkpoints", |s| {
        s.checkpoints >= 2
    })
    .await;
    let mut frozen = Vec::new();
    for (role, n) in [("ps", 2), ("worker", 3)] {
        for i in 0..n {
            frozen.push(pid_of(run.addr, role, i).await);
        }
    }
    let (id, step) = spoil_the_newest_checkpoint(&run, &frozen).await;
    kill9(frozen[1]);
    frozen.remove(1);
    signal_all(&frozen, nix::sys::signal::Signal::SIGCONT);
    let report = run.report().await;
    assert_recovered(
        &report,
        &format!("checkpoint {id} (step {step}) is damaged (ps-"),
    );
    assert_recovered(&report, &format!("falls back to checkpoint {}", id - 1));
    assert_eq!(report.restarts.get(&Role::PS), Some(&1));
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert_no_process_left(run.addr).await;
}

/// The agent itself (not its training process) is killed: the platform sees it end, launches a
/// new agent, and the training process of the old one does not outlive it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_agent_relaunches_it_and_leaves_no_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "kill-agent", "ps", 1, 2, N, 1, 150, 0);
    let mut run = start(spec, dir.path()).await;
    shards_at_least(run.addr, 5).await;
    let trainer = pid_of(run.addr, "worker", 0).await;
    kill9(parent_of(trainer));
    let report = run.report().await;
    assert_recovered(
        &report,
        "worker-0 failed (agent lost: agent process signal: 9",
    );
    assert_ps_applied_each_sample_once(&report, N, 1);
    assert_eq!(report.restarts.get(&Role::WORKER), Some(&1));
    assert!(
        !std::path::Path::new(&format!("/proc/{trainer}")).exists() || {
            let s = std::fs::read_to_string(format!("/proc/{trainer}/stat")).unwrap_or_default();
            s.contains(") Z ")
        },
        "the old training process outlived its agent"
    );
    assert_no_process_left(run.addr).await;
}

/// An agent that stops answering (SIGSTOP: alive but silent) is declared lost after the
/// heartbeat timeout: its slot is fenced, its shard re-queued, the agent killed and relaunched.
/// The old training process keeps running for a moment, but its calls are refused as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_is_declared_lost_after_the_heartbeat_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "silent-agent", "ps", 1, 2, N, 1, 150, 0);
    let mut timing = test_timing();
    timing.heartbeat_timeout_ms = 1_500;
    let mut run = start_with(spec, dir.path(), timing).await;
    shards_at_least(run.addr, 5).await;
    let trainer = pid_of(run.addr, "worker", 1).await;
    let agent = parent_of(trainer);
    freeze(agent);
    let report = run.report().await;
    assert_eq!(report.restarts.get(&Role::WORKER), Some(&1));
    assert_recovered(&report, "worker-1 failed (agent lost: no heartbeat for");
    assert_ps_applied_each_sample_once(&report, N, 1);
    assert_no_process_left(run.addr).await;
}

/// `job-master run` as a process on a free loopback port, for the kill -9 test below.
fn spawn_master(
    spec: &std::path::Path,
    run_dir: &std::path::Path,
    resume: bool,
) -> (test_support::Spawned, std::net::SocketAddr) {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--run-dir".as_ref(),
        run_dir.as_os_str(),
        "--heartbeat-interval-ms".as_ref(),
        "200".as_ref(),
        "--progress-secs".as_ref(),
        "60".as_ref(),
    ];
    if resume {
        args.push("--resume".as_ref());
    }
    spawn_run(spec, &args)
}

/// kill -9 of the job master in the middle of a ps job: its agents and training processes go
/// with it; a fresh run directory would be refused while the job is unfinished, and
/// `job-master run --resume` launches every process anew from the latest checkpoint: the job
/// ends with every sample applied by every PS exactly once per epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_job_master_and_resuming_its_run_directory_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.yaml");
    std::fs::write(
        &spec,
        builtin_yaml(dir.path(), "kill-master", "ps", 2, 3, N, 2, 150, 5),
    )
    .unwrap();
    let run_dir = dir.path().join("run");
    let (mut first, addr) = spawn_master(&spec, &run_dir, false);
    shards_at_least(addr, 12).await;
    let before = processes_of(addr);
    kill9(first.pid());
    first.wait(Duration::from_secs(30));
    let ctx = context(&run_dir);
    assert_eq!(ctx["phase"], "Running", "the context was left mid-job");
    assert!(
        !ctx["checkpoints"].as_array().unwrap().is_empty(),
        "a checkpoint to go on from"
    );
    // Every process of the dead master is gone (agents die with it, training processes with
    // their agent).
    assert!(
        before.len() >= 10,
        "5 agents and their processes: {before:?}"
    );
    assert_no_process_left(addr).await;
    // Starting afresh over the unfinished job is refused and changes nothing.
    let out = std::process::Command::new(job_master_bin())
        .arg("run")
        .arg(&spec)
        .arg("--run-dir")
        .arg(&run_dir)
        .env("BRAIN_WORKER_AGENT_BIN", agent_bin())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has not finished") && err.contains("--resume"),
        "{err}"
    );
    assert_eq!(context(&run_dir), ctx);

    let (second, addr) = spawn_master(&spec, &run_dir, true);
    let report = finished_run(second, &run_dir).await;
    assert!(report.samples_per_epoch.values().all(|&s| s == N));
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert_recovered(
        &report,
        "the job master restarted: every process restarts from checkpoint",
    );
    assert_no_process_left(addr).await;
}

/// A job master that stops answering (SIGSTOP: alive, its connections open, not a byte back)
/// is given up on: every call to it ends at its deadline instead of waiting for good, so each
/// agent stops its process and exits once the master has been silent for its
/// `--master-timeout-secs`, saying why. The master, killed then, resumes its run directory and
/// the job ends with every sample applied once by every PS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_of_a_job_master_that_stops_answering_give_up_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.yaml");
    std::fs::write(
        &spec,
        builtin_yaml(dir.path(), "frozen-master", "ps", 2, 3, N, 2, 150, 5),
    )
    .unwrap();
    let run_dir = dir.path().join("run");
    let (mut first, addr) = spawn_master(&spec, &run_dir, false);
    shards_at_least(addr, 12).await;
    assert!(
        processes_of(addr).len() >= 10,
        "5 agents and their processes"
    );
    freeze(first.pid());
    // The agents' 15 s of silence, a 5 s heartbeat deadline, and room for a slow machine.
    let start = Instant::now();
    while !processes_of(addr).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "processes still waiting on a silent master: {:?}",
            processes_of(addr)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let logs: String = std::fs::read_dir(run_dir.join("logs"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert!(
        logs.contains("no answer for 15s"),
        "no agent said why it gave up"
    );
    kill9(first.pid());
    first.wait(Duration::from_secs(30));

    let (second, addr) = spawn_master(&spec, &run_dir, true);
    let report = finished_run(second, &run_dir).await;
    assert!(report.samples_per_epoch.values().all(|&s| s == N));
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert_no_process_left(addr).await;
}

/// A parameter server that stops answering as a checkpoint's save begins (SIGSTOP on the
/// checkpoint's directory appearing: PS 0 saves first, so PS 1 is stopped before its turn) no
/// longer holds the cut and every lease for good: the save ends at the job's
/// `ps_save_timeout_ms` with the reason in the job's events, training goes on once the PS
/// answers again, a later checkpoint commits, and every sample is applied once by every PS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ps_that_never_answers_a_save_fails_that_checkpoint_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "silent-save", "ps", 2, 2, N, 1, 150, 3);
    let timing = Timing {
        ps_save_timeout_ms: 2_000,
        ..test_timing()
    };
    let mut run = start_with(spec, dir.path(), timing).await;
    shards_at_least(run.addr, 1).await;
    let ps1 = pid_of(run.addr, "ps", 1).await;
    let root = dir.path().join("checkpoints");
    let said = "ps 1 could not save: no answer within 2 s";
    let newest_step = |ctx: &serde_json::Value| {
        ctx["checkpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["step"].as_u64())
            .max()
    };
    // A machine that falls behind may stop PS 1 only after both parts are saved: that
    // checkpoint then commits, and the next one is tried.
    let mut step_then = None;
    for _ in 0..3 {
        let stopped = stop_as_the_next_checkpoint_begins(root.clone(), ps1).await;
        let start = Instant::now();
        let failed = loop {
            let ctx = context(&run.run_dir);
            let events = ctx["events"].as_array().cloned().unwrap_or_default();
            if events.iter().any(|e| {
                let t = e["text"].as_str().unwrap_or("");
                t.contains("checkpoint failed, training goes on without it") && t.contains(said)
            }) {
                break Some(newest_step(&ctx));
            }
            let committed = ctx["checkpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["manifest"]
                        .as_str()
                        .is_some_and(|m| m.contains(&format!("/{stopped}/")))
                });
            if committed {
                break None;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the save into {stopped} to a silent PS never ended: {events:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if let Some(step) = failed {
            step_then = Some(step);
            break;
        }
        signal_all(&[ps1], nix::sys::signal::Signal::SIGCONT);
    }
    let step_then = step_then.expect("PS 1 stopped before its save in one of 3 checkpoints");
    signal_all(&[ps1], nix::sys::signal::Signal::SIGCONT);
    let report = run.report().await;
    assert!(report.succeeded(), "{:#?}", report.events);
    assert_ps_applied_each_sample_once(&report, N, 1);
    let step_now = newest_step(&context(&run.run_dir));
    assert!(
        step_now > step_then,
        "nothing committed after the failed save: newest step {step_then:?} then, {step_now:?} at the end"
    );
    assert_no_process_left(run.addr).await;
}

/// Stops process `pid` (SIGSTOP) the moment a new checkpoint directory appears in `root`,
/// polling every 100 µs; the directory's name.
async fn stop_as_the_next_checkpoint_begins(root: std::path::PathBuf, pid: u32) -> String {
    tokio::task::spawn_blocking(move || {
        let dirs = || -> std::collections::BTreeSet<String> {
            std::fs::read_dir(&root)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with("ckpt-"))
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = dirs();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(120) {
            if let Some(new) = dirs().difference(&before).next().cloned() {
                freeze(pid);
                return Some(new);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        None
    })
    .await
    .unwrap()
    .expect("a checkpoint began")
}

/// Failing storage is a fault, not a loop: with its run directory removed under it, the job
/// master retries writing the job's state with backoff (a handful of tries, not thousands a
/// second), says so in the job's events, and once writes have failed for its
/// `persist_give_up_ms` fails the job with the reason and stops its processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_directory_removed_under_a_running_master_fails_the_job_and_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "no-disk", "allreduce", 0, 2, N, 2, 2_000, 10);
    let timing = Timing {
        persist_give_up_ms: 3_000,
        ..test_timing()
    };
    let mut run = start_with(spec, dir.path(), timing).await;
    shards_at_least(run.addr, 2).await;
    std::fs::remove_dir_all(&run.run_dir).unwrap();
    let report = run.report().await;
    let reason = report.reason.clone().unwrap_or_default();
    assert!(!report.succeeded(), "{:#?}", report.events);
    assert!(reason.contains("cannot persist job context"), "{reason}");
    // Backoff: 100 ms doubling to 5 s gives about 6 tries in 3 s.
    let tries: u32 = reason
        .split(" tries)")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of tries in {reason}"));
    assert!((2..=20).contains(&tries), "{tries} tries: {reason}");
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("cannot write the job's state") && e.contains("backoff")),
        "{:#?}",
        report.events
    );
    assert_no_process_left(run.addr).await;
}
