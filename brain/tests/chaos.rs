//! Chaos soak (issue 42, item 7): three jobs (two all-reduce, one parameter-server) run through
//! the brain while a seeded random schedule injects faults, one every 3 to 6 seconds: kill -9
//! of a training process (the built-in workload runs inside its worker agent, so the agent dies
//! with it), of a job master (the brain starts it again with `--resume`), of the brain itself
//! (started again on the same database and address), a training process slowed for 8 s
//! (duty-cycled with SIGSTOP/SIGCONT, with its sandbox), and one frozen for good (SIGSTOP: a
//! hang the job master must find). At the end every job succeeded, every sample was trained
//! once per epoch (a ps job's parameter servers applied each once), the brain's store lost
//! nothing across its restarts (report counts and plan versions never go back) and holds each
//! job once. One job replaces its stragglers, another shrinks them out.
//!
//! It runs twice: on 4 CPUs of local processes, and on the three-node Ray cluster of
//! `.ci/ray-cluster` (job masters as Ray jobs on the worker nodes, over mutual TLS), where
//! whole worker nodes are also killed (every process of the node SIGKILLed; started again 12 s
//! later) and slowed (capped at a quarter of one CPU for 8 s). Without `BRAIN_RAY_CLUSTER` the
//! second says so and passes, unless `BRAIN_REQUIRE_RAY_CLUSTER=1`.
//!
//! CI runs the short form (10 faults locally, 14 on Ray: two of each kind, in shuffled order);
//! by hand, `BRAIN_CHAOS_FAULTS=100 BRAIN_CHAOS_SAMPLES=400000 BRAIN_CHAOS_SEED=7 cargo test -p
//! brain --test chaos -- --nocapture` runs longer. It prints what it injected.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::ray::{Revive, brain_on, masters_on_ray, wait_alive};
use common::{Brain, brainctl, jobs, master_status, start_brain};
use proto::service::v1 as pb;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use test_support::{RayClusterDir, SlowNode, tail};

const CPUS: u32 = 4;
const EPOCHS: u64 = 2;
/// How long a killed node stays down, and a slowed one slow.
const NODE_DOWN: Duration = Duration::from_secs(12);
const NODE_SLOW: Duration = Duration::from_secs(8);

/// The two soaks share this machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillProcess,
    KillMaster,
    KillBrain,
    SlowProcess,
    FreezeProcess,
    /// A worker node of the Ray cluster lost: every process of it SIGKILLed.
    KillNode,
    /// A worker node of the Ray cluster capped at a quarter of one CPU.
    SlowNode,
}

const FAULTS: [Fault; 5] = [
    Fault::KillProcess,
    Fault::KillMaster,
    Fault::KillBrain,
    Fault::SlowProcess,
    Fault::FreezeProcess,
];

/// Where the soak runs.
enum Place<'a> {
    /// Local processes, the brain on 127.0.0.1 with 4 CPUs.
    Local,
    /// The three-node Ray cluster: the brain on the bridge with `flags`; the worker nodes (1
    /// and 2) may be killed and slowed.
    Ray {
        cluster: &'a RayClusterDir,
        flags: Vec<String>,
        nodes: Revive<'a>,
        /// A node killed, and when it is started again.
        down: Option<(usize, Instant)>,
        /// A node slowed, until then.
        slow: Option<(SlowNode<'a>, Instant)>,
    },
}

impl Place<'_> {
    /// The brain at `listen` with its data in `dir`, as the place runs it (its `nth` start
    /// logs to `dir/brain-N.log` on Ray).
    fn start_brain(&self, dir: &Path, listen: &str, nth: u32) -> (Brain, String) {
        match self {
            Place::Local => start_brain(dir, listen, CPUS),
            Place::Ray { cluster, flags, .. } => {
                brain_on(cluster, dir, listen, flags, &format!("brain-{nth}.log"))
            }
        }
    }

    /// The Ray dashboard the place's masters run under, if any.
    fn dashboard(&self) -> Option<&str> {
        match self {
            Place::Local => None,
            Place::Ray { cluster, .. } => Some(&cluster.dashboard),
        }
    }

    fn faults(&self) -> Vec<Fault> {
        let mut all = FAULTS.to_vec();
        if matches!(self, Place::Ray { .. }) {
            all.extend([Fault::KillNode, Fault::SlowNode]);
        }
        all
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A job of `samples` samples, two epochs, that finds a hang within seconds and acts on a
/// straggler as `action` says, and whose roles may be relaunched as often as the soak kills them.
fn spec(dir: &Path, name: &str, kind: &str, action: &str, samples: u64) -> std::path::PathBuf {
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
         stability:\n  hang_min_s: 3\n  hang_after_steps: 20\n  straggler_action: {action}\n"
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
struct Soak<'a> {
    place: Place<'a>,
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

impl Soak<'_> {
    /// Injects `fault` on a target drawn at random; false when there was none to strike.
    async fn inject(&mut self, fault: Fault, t0: Instant) -> bool {
        let what = match fault {
            Fault::KillNode | Fault::SlowNode => match self.strike_node(fault).await {
                Some(what) => what,
                None => return false,
            },
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
                    Fault::KillProcess | Fault::KillNode | Fault::SlowNode => {
                        test_support::kill9(pid)
                    }
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

    /// Kills or slows a worker node of the Ray cluster drawn at random: none while another is
    /// down or slow, or while Ray does not yet show every node alive again. What was done,
    /// or `None`.
    async fn strike_node(&mut self, fault: Fault) -> Option<String> {
        let Place::Ray {
            cluster,
            nodes,
            down,
            slow,
            ..
        } = &mut self.place
        else {
            return None;
        };
        if down.is_some() || slow.is_some() {
            return None;
        }
        let api = ray_client::RayApi::new(&cluster.dashboard).unwrap();
        if api.cluster().await.map_or(0, |c| c.nodes.len()) != cluster.nodes.len() {
            return None;
        }
        let n = self.rng.random_range(1..cluster.nodes.len());
        if fault == Fault::KillNode {
            nodes.kill(n);
            *down = Some((n, Instant::now() + NODE_DOWN));
            Some(format!("node {n} ({})", cluster.nodes[n]))
        } else {
            *slow = Some((cluster.slow(n, 25), Instant::now() + NODE_SLOW));
            Some(format!("node {n} ({}) at 25 % of a CPU", cluster.nodes[n]))
        }
    }

    /// A node down or slow long enough is started again or uncapped.
    fn heal_nodes(&mut self, t0: Instant, all: bool) {
        let Place::Ray {
            nodes, down, slow, ..
        } = &mut self.place
        else {
            return;
        };
        if let Some((n, at)) = *down
            && (all || Instant::now() >= at)
        {
            nodes.revive(n);
            *down = None;
            self.log.push(format!(
                "{:>6.1} s  node {n} started again",
                t0.elapsed().as_secs_f64()
            ));
        }
        if slow
            .as_ref()
            .is_some_and(|(_, at)| all || Instant::now() >= *at)
        {
            *slow = None;
        }
    }

    /// The brain started again on the same database and address.
    fn start_brain(&self, listen: &str) -> (Brain, String) {
        let nth = self.injected.get(&Fault::KillBrain).copied().unwrap_or(0) + 1;
        self.place.start_brain(&self.dir, listen, nth)
    }

    /// kill -9 of the brain, started again on the same database and address; what it had
    /// stored must be there after.
    async fn kill_brain(&mut self) {
        let before = jobs(&self.url).await.unwrap_or_default();
        self.brain.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (brain, addr) = self.start_brain(&self.addr.clone());
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
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    soak(Place::Local, dir.path(), 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chaos_soak_on_the_ray_cluster_with_whole_nodes_lost_loses_and_repeats_nothing() {
    let Some(cluster) = test_support::ray_cluster() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    wait_alive(&cluster, cluster.nodes.len(), Duration::from_secs(90)).await;
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Ray {
        cluster: &cluster,
        flags: masters_on_ray(&cluster, dir.path()),
        nodes: Revive::new(&cluster, dir.path()),
        down: None,
        slow: None,
    };
    soak(place, dir.path(), 14).await;
    wait_alive(&cluster, cluster.nodes.len(), Duration::from_secs(90)).await;
}

/// One line per job, with its last reasons: what the brain believed of each when the soak
/// gave up.
fn summary(all: &[pb::JobRecord]) -> String {
    let mut out = Vec::new();
    for j in all {
        out.push(format!(
            "{} ({}): {} at step {}, {} samples, {:.0} samples/s now, plan {}/{}/{} \
             (set/acked/reached), waiting: {:?}",
            j.job_name,
            j.master_address,
            j.state,
            j.last_global_step,
            j.samples_done,
            j.recent_samples_per_second,
            j.plan_version,
            j.acked_version,
            j.reached_version,
            j.waiting_reason,
        ));
        for r in j.reasons.iter().rev().take(3) {
            let r: String = r.chars().take(400).collect();
            out.push(format!("    {r}"));
        }
    }
    out.join("\n")
}

/// The last lines of the job masters' logs and events of the jobs not ended and of the brain's
/// logs: what a soak that did not end needs to be understood (its directory is gone after).
/// On Ray (`dashboard`), a master still running has its output with Ray only: its Ray job's
/// state and the tail of its log come first, since CI keeps the head of a failure's output.
async fn stuck_logs(d: &Path, url: &str, dashboard: Option<&str>, all: &[pb::JobRecord]) -> String {
    let mut out = Vec::new();
    for j in all
        .iter()
        .filter(|j| j.state == "running" || j.state == "queued")
    {
        let run = Path::new(&j.run_dir);
        let log = run.join("job-master.log");
        out.push(master_says(&j.master_address, &j.run_dir).await);
        if let Some(dashboard) = dashboard {
            out.push(ray_master_tail(dashboard, run, 40).await);
        }
        out.push(tail(&log, 60));
        let (_, events) = brainctl(&["events", &j.job_name, "--brain", url]);
        let lines: Vec<&str> = events.lines().collect();
        out.push(format!(
            "--- events of {} (last 25 of {})\n{}",
            j.job_name,
            lines.len(),
            lines[lines.len().saturating_sub(25)..].join("\n")
        ));
    }
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log") {
            out.push(tail(&p, 40));
        }
    }
    out.join("\n")
}

/// What the job master at `addr` says of its job, asked for 10 s at most (a master that does
/// not answer is itself a finding).
async fn master_says(addr: &str, run_dir: &str) -> String {
    let asked = tokio::time::timeout(Duration::from_secs(10), master_status(addr, run_dir));
    match asked.await {
        Err(_) => format!("--- the master at {addr} did not answer within 10 s"),
        Ok(None) => format!("--- the master at {addr} cannot be reached"),
        Ok(Some(s)) => format!(
            "--- the master at {addr}: {} {:?}, step {}, shards {}/{}, final loss {:?}, \
             transition {:?}, plan {}/{}, processes: {}",
            s.phase,
            s.reason,
            s.global_step,
            s.shards_done,
            s.shards_total,
            s.final_eval_loss,
            s.transition,
            s.desired_plan_version,
            s.reached_plan_version,
            s.processes
                .iter()
                .map(|p| format!("{}-{} {}", p.role, p.index, p.state))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The state and last `n` lines of Ray's log of the master's latest Ray submission (the one
/// the brain follows, named in the run directory `run`), read from the dashboard while it runs.
async fn ray_master_tail(dashboard: &str, run: &Path, n: usize) -> String {
    let file = run.join(brain::launch::RAY_SUBMISSION_FILE);
    let Ok(id) = std::fs::read_to_string(&file) else {
        return format!("--- {}: no Ray submission recorded", file.display());
    };
    let id = id.trim();
    let Ok(api) = ray_client::RayApi::new(dashboard) else {
        return format!("--- {dashboard}: not a dashboard address");
    };
    let state = match api.job(id).await {
        Ok(Some(info)) => info.headline(id),
        Ok(None) => format!("Ray job {id} is gone from Ray"),
        Err(e) => format!("Ray job {id}: {e}"),
    };
    let logs = api.logs(id).await.unwrap_or_else(|e| e.to_string());
    let lines: Vec<&str> = logs.lines().collect();
    format!(
        "--- {state}; Ray's log (last {n} of {} lines)\n{}",
        lines.len(),
        lines[lines.len().saturating_sub(n)..].join("\n")
    )
}

/// The soak at `place`, in `d`: `faults` faults unless `BRAIN_CHAOS_FAULTS` says otherwise.
async fn soak(place: Place<'_>, d: &Path, faults: u32) {
    let faults: u32 = env_or("BRAIN_CHAOS_FAULTS", faults);
    let samples: u64 = env_or("BRAIN_CHAOS_SAMPLES", 80_000);
    let seed: u64 = env_or("BRAIN_CHAOS_SEED", 1);
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\nrestart_delay_s = 3\nmax_growth = 2\n\
         [live]\ninterval_s = 1\ncooldown_s = 3\nmax_resumes = 1000\n",
    )
    .unwrap();
    let kinds = place.faults();
    let (scheme, listen) = match &place {
        Place::Local => ("http", "127.0.0.1:0".to_string()),
        Place::Ray { cluster, .. } => ("https", format!("{}:0", cluster.host)),
    };
    let (brain, addr) = place.start_brain(d, &listen, 0);
    let url = format!("{scheme}://{addr}");
    for (name, kind, action) in [
        ("chaos-a", "allreduce", "replace"),
        ("chaos-b", "ps", "replace"),
        ("chaos-c", "allreduce", "shrink"),
    ] {
        let path = spec(d, name, kind, action, samples);
        let (ok, text) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
        assert!(ok, "{text}");
    }
    let mut soak = Soak {
        place,
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
            order = kinds.clone();
            order.shuffle(&mut soak.rng);
        }
        soak.slowed.retain(|(until, _)| Instant::now() < *until);
        soak.heal_nodes(t0, false);
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
    soak.heal_nodes(t0, true);
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
        if Instant::now() >= deadline {
            let all = jobs(&url).await.unwrap_or_default();
            // Compact: CI shows the head of a failure's output, so the logs come before any
            // long dump.
            panic!(
                "jobs did not end:\n{}\n{}\n{}",
                summary(&all),
                soak.log.join("\n"),
                stuck_logs(d, &url, soak.place.dashboard(), &all).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("chaos over in {:.0} s", t0.elapsed().as_secs_f64());
    let log = soak.log.join("\n");
    // The short form strikes with every kind of fault.
    if faults >= kinds.len() as u32 {
        for &f in &kinds {
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
    // Each job master killed was started again once, and said so (on Ray, also those on a
    // node lost).
    let resumed = ended
        .iter()
        .flat_map(|j| &j.reasons)
        .filter(|r| r.contains("started again with --resume"))
        .count();
    let masters_killed = soak.injected.get(&Fault::KillMaster).copied().unwrap_or(0);
    // A node lost takes the masters it runs with it (three jobs: at most three).
    let nodes_killed = soak.injected.get(&Fault::KillNode).copied().unwrap_or(0);
    assert!(
        (masters_killed..=masters_killed + 3 * nodes_killed).contains(&(resumed as u32)),
        "{resumed} masters resumed, {masters_killed} killed, {nodes_killed} nodes lost: \
         {ended:#?}\n{log}"
    );
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
    // A frozen worker is found hung, unless another fault restarted its group first: locally
    // that leaves at least one of the two; on Ray a node lost or a master killed restarts the
    // group too, and both freezes can go that way (seed 1 did), so there it is only printed.
    if soak.injected.contains_key(&Fault::FreezeProcess) && matches!(soak.place, Place::Local) {
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
