//! Chaos soak (issue 42, item 7): three jobs (two all-reduce, one parameter-server) run through
//! the brain on 4 CPUs of local processes while a seeded random schedule injects faults, one
//! every 3 to 6 seconds: kill -9 of a training process (the built-in workload runs inside its
//! worker agent, so the agent dies with it), of a job master (the brain starts it again with
//! `--resume`), of the brain itself (started again on the same database and address), a
//! training process slowed for 8 s (duty-cycled with SIGSTOP/SIGCONT, with its sandbox: a slow
//! node), and one frozen for good (SIGSTOP: a hang the job master must find). At the end every job succeeded,
//! every sample was trained once per epoch (a ps job's parameter servers applied each once),
//! the brain's store lost nothing across its restarts (report counts and plan versions never go
//! back) and holds each job once.
//!
//! CI runs the short form (10 faults, two of each kind, in shuffled order); by hand,
//! `BRAIN_CHAOS_FAULTS=100 BRAIN_CHAOS_SAMPLES=400000 BRAIN_CHAOS_SEED=7 cargo test -p brain
//! --test chaos -- --nocapture` runs longer. It prints what it injected.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Brain, brainctl, jobs, master_status, start_brain};
use proto::service::v1 as pb;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

const CPUS: u32 = 4;
const EPOCHS: u64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillProcess,
    KillMaster,
    KillBrain,
    SlowProcess,
    FreezeProcess,
}

const FAULTS: [Fault; 5] = [
    Fault::KillProcess,
    Fault::KillMaster,
    Fault::KillBrain,
    Fault::SlowProcess,
    Fault::FreezeProcess,
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A job of `samples` samples, two epochs, that finds a hang within seconds and replaces a
/// straggler, and whose roles may be relaunched as often as the soak kills them.
fn spec(dir: &Path, name: &str, kind: &str, samples: u64) -> std::path::PathBuf {
    let ps = if kind == "ps" {
        "  ps:\n    max_restarts: 1000\n"
    } else {
        ""
    };
    let text = format!(
        "name: {name}\nkind: {kind}\nroles:\n{ps}  worker:\n    min: 1\n    max: 3\n    \
         max_restarts: 1000\nworkload:\n  builtin:\n    batch_size: 128\n    step_delay_us: 600\n\
         data:\n  num_samples: {samples}\n  shard_size: 500\n  eval_samples: 2000\n\
         epochs: {EPOCHS}\ncheckpoint:\n  dir: checkpoints\n  every_shards: 8\n\
         stability:\n  hang_min_s: 3\n  hang_after_steps: 20\n  straggler_action: replace\n"
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The running training processes of the running jobs: (job, role, pid).
async fn training_processes(url: &str) -> Vec<(String, String, u32)> {
    let mut out = Vec::new();
    for j in jobs(url).await.unwrap_or_default() {
        if j.state != "running" || j.master_address.is_empty() {
            continue;
        }
        let Some(s) = master_status(&j.master_address, &j.run_dir).await else {
            continue;
        };
        for p in s.processes {
            if p.state == "running" && p.pid != 0 && test_support::alive(p.pid) {
                out.push((j.job_name.clone(), p.role, p.pid));
            }
        }
    }
    out
}

/// The soak's state: the brain (replaced when killed), what it has injected.
struct Soak {
    dir: std::path::PathBuf,
    brain: Brain,
    addr: String,
    url: String,
    rng: Pcg64,
    injected: BTreeMap<Fault, u32>,
    log: Vec<String>,
    slowed: Vec<(Instant, test_support::DutyCycle)>,
    /// Pids frozen, never unfrozen (the job master must kill them).
    frozen: Vec<u32>,
}

impl Soak {
    /// Injects `fault` on a target drawn at random; false when there was none to strike.
    async fn inject(&mut self, fault: Fault, t0: Instant) -> bool {
        let what = match fault {
            Fault::KillBrain => {
                self.kill_brain().await;
                "the brain".to_string()
            }
            Fault::KillMaster => {
                let running: Vec<pb::JobRecord> = jobs(&self.url)
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|j| j.state == "running" && !j.run_dir.is_empty())
                    .collect();
                let Some(j) = running.get(self.rng.random_range(0..running.len().max(1))) else {
                    return false;
                };
                let Some(pid) = common::master_pid(&j.run_dir) else {
                    return false;
                };
                test_support::kill9(pid);
                format!("job master of {} ({pid})", j.job_name)
            }
            Fault::KillProcess | Fault::SlowProcess | Fault::FreezeProcess => {
                let mut procs = training_processes(&self.url).await;
                // A frozen parameter server is no hang of its own; slow or freeze workers.
                if fault != Fault::KillProcess {
                    procs.retain(|p| p.1 == "worker" && !self.frozen.contains(&p.2));
                }
                let Some((job, role, pid)) = procs.choose(&mut self.rng).cloned() else {
                    return false;
                };
                // The process the job master knows is the sandbox's (bwrap) around the agent:
                // a kill takes the whole tree down, a stop must reach each of its processes.
                let tree: Vec<u32> = std::iter::once(pid)
                    .chain(test_support::descendants(pid))
                    .collect();
                match fault {
                    Fault::KillProcess => test_support::kill9(pid),
                    Fault::SlowProcess => {
                        for &p in &tree {
                            self.slowed.push((
                                Instant::now() + Duration::from_secs(8),
                                test_support::duty_cycle(
                                    p,
                                    Duration::from_millis(100),
                                    Duration::from_millis(200),
                                ),
                            ));
                        }
                    }
                    _ => {
                        for &p in &tree {
                            // One that has just ended needs no stopping.
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(p as i32),
                                nix::sys::signal::Signal::SIGSTOP,
                            );
                        }
                        self.frozen.extend(tree);
                    }
                }
                format!("{role} of {job} ({pid})")
            }
        };
        *self.injected.entry(fault).or_default() += 1;
        self.log.push(format!(
            "{:>6.1} s  {fault:?}: {what}",
            t0.elapsed().as_secs_f64()
        ));
        true
    }

    /// kill -9 of the brain, started again on the same database and address; what it had
    /// stored must be there after.
    async fn kill_brain(&mut self) {
        let before = jobs(&self.url).await.unwrap_or_default();
        self.brain.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (brain, addr) = start_brain(&self.dir, &self.addr, CPUS);
        assert_eq!(addr, self.addr);
        self.brain = brain;
        let after = jobs(&self.url).await.unwrap();
        assert_eq!(after.len(), before.len().max(after.len()), "{after:#?}");
        for b in &before {
            let a = after.iter().find(|a| a.job_id == b.job_id).unwrap();
            assert!(a.reports >= b.reports, "{b:?} -> {a:?}");
            assert!(a.plan_version >= b.plan_version, "{b:?} -> {a:?}");
        }
    }

    async fn all_ended(&self) -> Option<Vec<pb::JobRecord>> {
        let all = jobs(&self.url).await?;
        (all.len() == 3
            && all
                .iter()
                .all(|j| matches!(j.state.as_str(), "succeeded" | "failed" | "cancelled")))
        .then_some(all)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chaos_soak_through_the_brain_loses_and_repeats_nothing() {
    let faults: u32 = env_or("BRAIN_CHAOS_FAULTS", 10);
    let samples: u64 = env_or("BRAIN_CHAOS_SAMPLES", 80_000);
    let seed: u64 = env_or("BRAIN_CHAOS_SEED", 1);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\nrestart_delay_s = 3\nmax_growth = 2\n\
         [live]\ninterval_s = 1\ncooldown_s = 3\nmax_resumes = 1000\n",
    )
    .unwrap();
    let (brain, addr) = start_brain(d, "127.0.0.1:0", CPUS);
    let url = format!("http://{addr}");
    for (name, kind) in [
        ("chaos-a", "allreduce"),
        ("chaos-b", "ps"),
        ("chaos-c", "allreduce"),
    ] {
        let path = spec(d, name, kind, samples);
        let (ok, text) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
        assert!(ok, "{text}");
    }
    let mut soak = Soak {
        dir: d.to_path_buf(),
        brain,
        addr,
        url: url.clone(),
        rng: Pcg64::seed_from_u64(seed),
        injected: BTreeMap::new(),
        log: Vec::new(),
        slowed: Vec::new(),
        frozen: Vec::new(),
    };
    let t0 = Instant::now();
    // Each kind once per cycle of five, in an order drawn anew each cycle.
    let mut order: Vec<Fault> = Vec::new();
    let mut done = 0;
    tokio::time::sleep(Duration::from_secs(5)).await;
    while done < faults && soak.all_ended().await.is_none() {
        if order.is_empty() {
            order = FAULTS.to_vec();
            order.shuffle(&mut soak.rng);
        }
        soak.slowed.retain(|(until, _)| Instant::now() < *until);
        if soak.inject(order[0], t0).await {
            order.remove(0);
            done += 1;
            let wait = soak.rng.random_range(3_000..=6_000);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    soak.slowed.clear();
    eprintln!(
        "chaos (seed {seed}, {samples} samples x {EPOCHS} epochs a job): {:?}\n{}",
        soak.injected,
        soak.log.join("\n")
    );

    let deadline = Instant::now() + Duration::from_secs(600);
    let ended = loop {
        if let Some(all) = soak.all_ended().await {
            break all;
        }
        assert!(
            Instant::now() < deadline,
            "jobs did not end: {:#?}\n{}",
            jobs(&url).await,
            soak.log.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("chaos over in {:.0} s", t0.elapsed().as_secs_f64());
    let log = soak.log.join("\n");
    // The short form strikes with every kind of fault.
    if faults >= FAULTS.len() as u32 {
        for f in FAULTS {
            assert!(
                soak.injected.get(&f).is_some_and(|n| *n > 0),
                "{f:?}: {log}"
            );
        }
    }
    // The store holds each job once, under its own name.
    let mut names: Vec<&str> = ended.iter().map(|j| j.job_name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["chaos-a", "chaos-b", "chaos-c"], "{ended:#?}");
    // Each job master killed was started again once, and said so.
    let resumed = ended
        .iter()
        .flat_map(|j| &j.reasons)
        .filter(|r| r.contains("started again with --resume"))
        .count();
    let masters_killed = soak.injected.get(&Fault::KillMaster).copied().unwrap_or(0);
    assert_eq!(resumed as u32, masters_killed, "{ended:#?}\n{log}");
    let mut hangs = 0;
    for j in &ended {
        assert_eq!(j.state, "succeeded", "{j:#?}\n{log}");
        let report: serde_json::Value = serde_json::from_slice(
            &std::fs::read(Path::new(&j.run_dir).join("master/report.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            report["exactly_once"], "ok",
            "{}: {report}\n{log}",
            j.job_name
        );
        let epochs = report["samples_per_epoch"].as_object().unwrap();
        assert_eq!(epochs.len() as u64, EPOCHS, "{report}");
        for (_, n) in epochs {
            assert_eq!(n.as_u64(), Some(samples), "{}: {report}", j.job_name);
        }
        hangs += report["hangs"].as_array().map_or(0, Vec::len);
        if let Some(ps) = report["ps_stats"].as_array() {
            for p in ps {
                assert_eq!(p["applied_samples"].as_u64(), Some(EPOCHS * samples), "{p}");
            }
        }
    }
    // A frozen worker is found hung (unless another fault restarted its group first).
    if soak.injected.contains_key(&Fault::FreezeProcess) {
        assert!(hangs > 0, "no hang found: {log}");
    }
    eprintln!(
        "survived: every job succeeded, every sample once; {hangs} hangs found, {resumed} masters resumed"
    );
    // No frozen process outlived its job.
    for pid in &soak.frozen {
        assert!(!test_support::alive(*pid), "frozen {pid} is still there");
    }
    soak.brain.kill();
}
