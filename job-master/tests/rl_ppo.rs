//! The reinforcement-learning example (`examples/rl-ppo`), real PyTorch on the CPU: an actor
//! (the all-reduce training group, 2 ranks, DDP over gloo), rollout engines (a service role),
//! a reward model and a critic, calling each other through the SDK. It learns: the average
//! episode return of the last 5 of 40 updates is at least 0.6 (the best policy's is 0.86) and
//! at least 0.4 above that of the first 3 (a random policy's is about 0). The rollout role is
//! resized 2 → 4 while the actor trains, then one engine is killed with kill -9: the actor's
//! processes keep their pid and incarnation throughout and every update is logged once, in
//! order.
//!
//! Needs a Python with torch (`BRAIN_TORCH_PYTHON`) and the SDK's build requirements; without
//! them the test prints SKIPPED, and fails when `BRAIN_REQUIRE_TORCH` is set.

mod common;

use common::rl::*;
use common::*;
use job_master::spec::Role;
use proto::jobmaster::v1 as pb;

fn workers(s: &pb::JobStatus) -> Vec<(u32, u64, u32)> {
    s.processes
        .iter()
        .filter(|p| p.role == "actor")
        .map(|p| (p.index, p.incarnation, p.pid))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rl_example_learns_while_its_rollout_role_is_resized() {
    let Some((python, sdk)) = torch_with_sdk() else {
        eprintln!("SKIPPED: no Python with torch and the SDK's build requirements");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("returns.jsonl");
    let mut run = start(rl_spec(&python, &sdk, dir.path(), &log), dir.path()).await;
    let addr = run.addr;
    until_updates(&run, &log, "three updates", |u| u.len() >= 3).await;
    let before = workers(&status(addr).await.unwrap());
    assert_eq!(before.len(), 2);

    let mut p = plan(1, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "rollout".into(),
        count: 4,
        resources: None,
    });
    send(addr, p).await;
    until_updates(&run, &log, "an update with 4 engines", |u| {
        u.iter().any(|x| x.engines == 4)
    })
    .await;
    assert_eq!(
        workers(&status(addr).await.unwrap()),
        before,
        "the actor's processes must not move"
    );
    // A rollout engine killed: it restarts alone; the actor trains on.
    let seen = updates(&log).len();
    kill9(pid_of(addr, "rollout", 1).await);
    until_updates(&run, &log, "updates after the kill", |u| {
        u.len() >= seen + 3
    })
    .await;
    assert_eq!(workers(&status(addr).await.unwrap()), before);

    let report = run.report().await;
    assert!(
        report.succeeded(),
        "{:?}\n{}",
        report.reason,
        run.last_events(30)
    );
    assert_eq!(report.restarts.get(&Role::new("actor").unwrap()), None);
    assert_learned_once_each(&updates(&log));
    assert_no_process_left(addr).await;
}
