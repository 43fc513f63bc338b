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

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use job_master::spec::{JobSpec, Role};
use proto::jobmaster::v1 as pb;

const UPDATES: usize = 40;
/// Seconds the actor waits after each update, so that the resize lands while it trains (new
/// engines import torch first: seconds on a busy 2-core machine).
const UPDATE_SLEEP: &str = "0.75";

/// `examples/rl-ppo/job.yaml` as a user runs it, with this test's Python, SDK and files.
pub fn rl_spec(python: &str, sdk: &Path, dir: &Path, log: &Path) -> JobSpec {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut spec = JobSpec::from_file(&root.join("examples/rl-ppo/job.yaml")).unwrap();
    let script = root.join("examples/rl-ppo/rl.py").display().to_string();
    let fix = |argv: &mut Vec<String>| {
        for w in argv.iter_mut() {
            *w = w
                .replace("python3", python)
                .replace("examples/rl-ppo/rl.py", &script)
                .replace("runs/rl-ppo/returns.jsonl", &log.display().to_string());
            if w == "40" {
                *w = UPDATES.to_string();
            }
        }
    };
    let path = sdk.display().to_string();
    let actor = spec.workload.command.as_mut().unwrap();
    fix(actor);
    actor.extend(["--update-sleep".to_string(), UPDATE_SLEEP.to_string()]);
    spec.workload.env.insert("PYTHONPATH".into(), path.clone());
    for r in spec.roles.values_mut() {
        if let Some(argv) = r.command.as_mut() {
            fix(argv);
            r.env.insert("PYTHONPATH".into(), path.clone());
        }
    }
    spec.checkpoint.dir = dir.join("checkpoints");
    spec.validate().unwrap();
    spec
}

#[derive(Debug, serde::Deserialize)]
pub struct Update {
    pub update: usize,
    #[serde(rename = "return")]
    pub ret: f64,
    pub engines: usize,
    pub seconds: f64,
    pub pid: u32,
}

pub fn updates(log: &PathBuf) -> Vec<Update> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

async fn until_updates(run: &Running, log: &PathBuf, why: &str, f: impl Fn(&[Update]) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        if f(&updates(log)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline && !run.handle.is_finished(),
            "{why}: {:?}\n{}",
            updates(log),
            run.last_events(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn workers(s: &pb::JobStatus) -> Vec<(u32, u64, u32)> {
    s.processes
        .iter()
        .filter(|p| p.role == "worker")
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
    assert_eq!(report.restarts.get(&Role::WORKER), None);
    let u = updates(&log);
    let numbers: Vec<usize> = u.iter().map(|x| x.update).collect();
    assert_eq!(
        numbers,
        (1..=UPDATES).collect::<Vec<_>>(),
        "each update once"
    );
    let mean = |xs: &[Update]| xs.iter().map(|x| x.ret).sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&u[..3]), mean(&u[UPDATES - 5..]));
    assert!(
        last >= 0.6 && last - first >= 0.4,
        "it did not learn: first 3 updates {first:.3}, last 5 {last:.3}: {u:?}"
    );
    assert_no_process_left(addr).await;
}
