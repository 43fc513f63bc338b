//! The reinforcement-learning example (`examples/rl-ppo`) as the tests run it: its spec with the
//! test's Python, SDK and files, and the actor's log of updates.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use job_master::spec::JobSpec;

use super::Running;

pub const UPDATES: usize = 40;
/// Seconds the actor waits after each update, so that the resize lands while it trains (new
/// engines import torch first: seconds on a busy 2-core machine).
pub const UPDATE_SLEEP: &str = "0.75";

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

pub async fn until_updates(run: &Running, log: &PathBuf, why: &str, f: impl Fn(&[Update]) -> bool) {
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

/// Every update logged once, in order, and the policy learned: the last 5 updates' average
/// return at least 0.6 (the best policy's is 0.86) and 0.4 above the first 3's.
pub fn assert_learned_once_each(u: &[Update]) {
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
}
