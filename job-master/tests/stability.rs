//! Slow and frozen training processes, for real: a rank duty-cycled with SIGSTOP/SIGCONT is
//! flagged as a straggler and replaced, or shrunk out (the group goes on one smaller); a rank frozen with SIGSTOP is found hung, the stacks
//! of the group are captured and the group restarts from its latest checkpoint. Every sample
//! is trained once throughout.

mod common;

use std::time::Duration;

use common::*;
use job_master::spec::{Role, StragglerAction};

const N: u64 = 40_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_slowed_mid_run_is_flagged_and_replaced_and_no_sample_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "straggler", "allreduce", 0, 3, N, 1, 300, 8);
    spec.stability.straggler_action = StragglerAction::Replace;
    let mut run = start(spec, dir.path()).await;
    shards_at_least(run.addr, 4).await;
    let slow = pid_of(run.addr, "worker", 2).await;
    // Half of every 200 ms stopped: about half its speed.
    let slowed = duty_cycle(slow, Duration::from_millis(100), Duration::from_millis(200));
    let report = run.report().await;
    drop(slowed);
    assert_each_sample_once(&report, N, 1);
    assert_recovered(
        &report,
        "straggler: worker-2 on 127.0.0.1 computes a step in",
    );
    assert_recovered(&report, "action: replace");
    assert_recovered(
        &report,
        "straggler worker-2 replaced: every process restarts from checkpoint",
    );
    for healthy in ["straggler: worker-0", "straggler: worker-1"] {
        assert!(
            !report.events.iter().any(|e| e.contains(healthy)),
            "a healthy rank was flagged: {:#?}",
            report.events
        );
    }
    assert!(report.hangs.is_empty(), "a slow rank is not a hang");
    assert_no_process_left(run.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_slowed_mid_run_is_shrunk_out_and_the_group_goes_on_smaller() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "shrink", "allreduce", 0, 3, N, 1, 300, 8);
    spec.roles.get_mut(&Role::WORKER).unwrap().min = Some(2);
    spec.stability.straggler_action = StragglerAction::Shrink;
    spec.validate().unwrap();
    let mut run = start(spec, dir.path()).await;
    shards_at_least(run.addr, 4).await;
    // Rank 1, not the last: its index gets a new process and worker-2 leaves.
    let slow = pid_of(run.addr, "worker", 1).await;
    let slowed = duty_cycle(slow, Duration::from_millis(100), Duration::from_millis(200));
    let report = run.report().await;
    drop(slowed);
    assert_each_sample_once(&report, N, 1);
    assert_recovered(
        &report,
        "straggler: worker-1 on 127.0.0.1 computes a step in",
    );
    assert_recovered(&report, "action: shrink");
    assert_recovered(
        &report,
        "shrinking straggler worker-1 out (worker-1 gets a new process, worker-2 leaves)",
    );
    assert_recovered(&report, "worker-2 left the job");
    assert_recovered(
        &report,
        "straggler worker-1 shrunk out: the worker group goes on with 2: every process \
         restarts from checkpoint",
    );
    assert!(
        !report
            .events
            .iter()
            .any(|e| e.contains("straggler: worker-0")),
        "a healthy rank was flagged: {:#?}",
        report.events
    );
    assert_no_process_left(run.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_ps_worker_of_the_last_index_is_shrunk_out_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "shrink-ps", "ps", 1, 3, N, 1, 300, 8);
    spec.roles.get_mut(&Role::WORKER).unwrap().min = Some(1);
    spec.stability.straggler_action = StragglerAction::Shrink;
    spec.validate().unwrap();
    let mut run = start(spec, dir.path()).await;
    shards_at_least(run.addr, 4).await;
    let slow = pid_of(run.addr, "worker", 2).await;
    let slowed = duty_cycle(slow, Duration::from_millis(100), Duration::from_millis(200));
    let report = run.report().await;
    drop(slowed);
    assert_ps_applied_each_sample_once(&report, N, 1);
    assert_recovered(
        &report,
        "straggler worker-2 shrunk out: the worker group goes on with 2; its process stops",
    );
    assert_recovered(&report, "worker-2 left the job");
    assert!(
        !report.events.iter().any(|e| e.contains("restarts from")),
        "a ps worker leaves alone: {:#?}",
        report.events
    );
    assert_eq!(
        report.restarts.get(&Role::WORKER),
        None,
        "{:?}",
        report.restarts
    );
    assert_no_process_left(run.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_rank_is_found_hung_its_stacks_captured_and_the_group_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "frozen", "allreduce", 0, 3, N, 1, 150, 8);
    spec.stability.hang_min_s = 2.0;
    spec.stability.hang_after_steps = 20.0;
    let mut run = start(spec, dir.path()).await;
    wait_for(
        run.addr,
        Duration::from_secs(60),
        "a checkpoint and more shards",
        |s| s.checkpoints >= 1 && s.shards_done >= 10,
    )
    .await;
    let frozen = pid_of(run.addr, "worker", 1).await;
    freeze(frozen);
    let report = run.report().await;
    assert_each_sample_once(&report, N, 1);
    assert_recovered(&report, "hang: the worker group reported no step for");
    assert_recovered(&report, "failed (hung: the worker group");
    assert_recovered(&report, "every process restarts from checkpoint");
    assert_eq!(report.restarts.get(&Role::WORKER), Some(&1));
    assert_eq!(report.hangs.len(), 1, "{:#?}", report.hangs);
    let hang = &report.hangs[0];
    assert!(hang.why.contains("reported no step for"), "{}", hang.why);
    assert_eq!(
        hang.stacks.len(),
        3,
        "every rank's stacks: {:#?}",
        hang.stacks
    );
    let stacks = &hang.stacks["worker-1"];
    assert!(
        stacks.contains(&format!("process {frozen} (")) && stacks.contains("is stopped (SIGSTOP)"),
        "{stacks}"
    );
    assert!(
        hang.stacks["worker-0"].contains("thread"),
        "{:#?}",
        hang.stacks
    );
    let e = report.effective_training.clone().unwrap();
    assert!(e.share > 0.0 && e.share < 1.0, "{e:?}");
    assert!(
        e.training_ms + 2_000 < e.wall_ms,
        "the hang is not training: {e:?}"
    );
    assert_no_process_left(run.addr).await;

    // The diagnosis, from the run directory.
    let out = std::process::Command::new(job_master_bin())
        .arg("diagnose")
        .arg(&run.run_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    for want in [
        "job frozen (allreduce): succeeded",
        "effective training time: ",
        "work lost to restarts: 1 restart(s), ",
        "of training since checkpoint 1 (step ",
        "relaunches: worker 1",
        "hang        hang: the worker group reported no step",
        "fault       worker-",
        "restart     ",
        "checkpoint  checkpoint 1 committed",
        "hangs: 1",
        "is stopped (SIGSTOP)",
        "stragglers now: none",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
}
