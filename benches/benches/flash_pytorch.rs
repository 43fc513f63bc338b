//! Flash checkpoints in a real job (issue 43, items 4 and 5): `job-master run` (release build)
//! trains `benches/flash_train.py` (an MLP with Adam on the CPU, its state about 1 GiB; one rank,
//! or `BRAIN_BENCH_RANKS` ranks of one DDP group on this node, each holding the whole state; the
//! job master's data, a consistent cut every 2 shards of 10 steps), side by side in one run:
//!
//! * **the cut's pause**: the time each cut held the rank (`job.last_cut`; in a group, the
//!   longest any rank was held at that cut), flash memory (`checkpoint.flash`: a copy into the
//!   agent's memory) against the synchronous save to disk;
//! * **the background write's cost to the step rate**: rank 0's step time while its agent
//!   writes a copy out (in a group, rank 0's copy is the one written out), against the steps
//!   of the synchronous run (no write behind them) and the flash run's other steps;
//! * **restore after kill -9** (of one rank: its group restarts whole): the time `job.restore()`
//!   took in each restarted process, from the agent's memory; in a group, with the killed
//!   rank's copies removed (as on a new node), that rank's state sent by a rank holding it
//!   (`restore(peers=True)`); then (every copy removed and the page cache dropped) from disk;
//! * **a grow's pause** (`rescale: in_place`, through `ElasticDDP`): the group grown 1 → 2 by a
//!   plan, `BRAIN_BENCH_GROWS` times (default 2, shrunk back in between): rank 0's gap between
//!   its last step in the group of 1 and its first in the group of 2, and how the new rank got
//!   the state (flash: rank 0 sends the cut held in memory over the group, `peer`; synchronous:
//!   the cut is written to disk and read back, `disk`).
//!
//! The state's size is `BRAIN_BENCH_GIB` (default 1), the cuts measured per run
//! `BRAIN_BENCH_CUTS` (default 5, after one warm-up cut), the shards between cuts
//! `BRAIN_BENCH_EVERY_SHARDS` (default 2; on a GPU, steps take milliseconds: a cut due before
//! the previous copy is written out is saved to disk instead, so give it at least the write's
//! time), where it lives `BRAIN_BENCH_DEVICE`
//! (`cpu`, or `cuda`: a GPU; the cut copies it off the device, the restore puts it back). Needs
//! a Python with torch (`BRAIN_TORCH_PYTHON`, else `python3`); the SDK is built from `python/`
//! unless `BRAIN_SDK_DIR` names one built already (a machine without its build tools).
//! `BRAIN_BENCH_PARTS` picks what runs: `cuts` (the pause, step-rate and restore figures),
//! `grow`, or both (default `cuts,grow`).
//!
//! cargo build --release -p job-master -p worker-agent && cargo bench -p benches --bench flash_pytorch

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{start_master, stop_master};
use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("flash_train.py")
}

fn lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn of<'a>(all: &'a [Value], event: &str) -> Vec<&'a Value> {
    all.iter().filter(|v| v["event"] == event).collect()
}

/// Waits until `done(lines)`, for at most `limit`; stops the bench at once if the job master
/// exits first (the job failed: nothing more will come).
fn wait(
    master: &mut std::process::Child,
    log: &Path,
    limit: Duration,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let all = lines(log);
        if done(&all) {
            return all;
        }
        if let Ok(Some(status)) = master.try_wait() {
            panic!(
                "the job master exited ({status}) before {what}; the job's events: {}",
                log.display()
            );
        }
        assert!(start.elapsed() < limit, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[derive(Default)]
struct Run {
    /// Seconds each measured cut held the rank.
    cuts: Vec<f64>,
    held: Vec<String>,
    /// Step times while a copy was being written out, and the others.
    writing: Vec<f64>,
    quiet: Vec<f64>,
    /// restore() after each kill -9, one entry a restarted rank: (rank, from, seconds).
    restores: Vec<Vec<(u64, String, f64)>>,
}

/// The rank an event came from (0 where a log of one rank left it out).
fn rank(v: &Value) -> u64 {
    v["rank"].as_u64().unwrap_or(0)
}

/// Each cut rank 0 logged, in order: (step, where it was held, the longest time it held any
/// rank of the group that logged it).
fn group_cuts(all: &[Value]) -> Vec<(u64, String, f64)> {
    let cuts = of(all, "cut");
    cuts.iter()
        .filter(|c| rank(c) == 0)
        .map(|c| {
            let step = c["step"].as_u64().unwrap();
            let held = cuts
                .iter()
                .filter(|o| o["step"] == c["step"])
                .map(|o| o["blocked_s"].as_f64().unwrap())
                .fold(0.0, f64::max);
            (step, c["held"].as_str().unwrap_or("?").to_string(), held)
        })
        .collect()
}

fn drop_caches() -> bool {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn kill9(pid: u64) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// What the job is: its state's size and device, the shards between its cuts, the ranks of
/// its group in the cuts' runs.
struct Setup<'a> {
    python: &'a str,
    sdk: &'a Path,
    gib: f64,
    device: &'a str,
    every_shards: u32,
    ranks: u32,
}

/// Waits until the newest cut held in memory is committed (its manifest written), so that a
/// process killed now has a copy in memory to restore from.
fn wait_committed(master: &mut std::process::Child, log: &Path, ckpt: &Path, limit: Duration) {
    let all = wait(master, log, limit, "a cut held in memory", |l| {
        of(l, "cut").iter().any(|c| c["held"] == "memory")
    });
    let cut = of(&all, "cut")
        .into_iter()
        .rfind(|c| c["held"] == "memory")
        .expect("waited for");
    let step = cut["step"].as_u64().unwrap();
    let manifest = ckpt
        .join("flash")
        .join(format!("step-{step:010}"))
        .join("manifest.json");
    let start = Instant::now();
    while !manifest.exists() {
        assert!(
            start.elapsed() < limit,
            "step {step} not committed in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The bench's job: `ranks` ranks of `flash_train.py` logging to `log`, its checkpoints under
/// `dir`, through flash memory or synchronously; with `grow`, one rank through `ElasticDDP` and
/// `rescale: in_place`, up to 2 ranks.
fn job_yaml(setup: &Setup, flash: bool, log: &Path, dir: &Path, grow: bool) -> String {
    let Setup {
        python,
        sdk,
        gib,
        device,
        every_shards,
        ranks,
    } = *setup;
    let (replicas, max) = if grow { (1, 2) } else { (ranks, ranks) };
    let mut argv = vec![
        python.to_string(),
        script().display().to_string(),
        "--gib".into(),
        gib.to_string(),
        "--log".into(),
        log.display().to_string(),
        "--device".into(),
        device.to_string(),
    ];
    let mut rescale = "";
    if grow || ranks > 1 {
        argv.push("--ddp".into());
    }
    if grow {
        rescale = "\n  rescale: in_place";
    }
    let memory = if flash {
        format!(
            ", flash: {{ memory: {}Mi }}",
            (2.0 * gib * 1024.0) as u64 + 512
        )
    } else {
        String::new()
    };
    format!(
        "name: bench-flash\nkind: allreduce\nroles:\n  worker: {{ replicas: {replicas}, max: {max} }}\n\
         workload:\n  command: {argv:?}\n  \
         env: {{ OMP_NUM_THREADS: \"1\", PYTHONPATH: {sdk:?} }}{rescale}\n\
         data: {{ num_samples: 10000000, shard_size: 80 }}\n\
         checkpoint: {{ dir: {:?}, every_shards: {every_shards}{memory} }}\n",
        dir.join("ckpt")
    )
}

/// The job's run: `cuts` cuts after a warm-up, then (flash) two kill -9s of one rank, the group
/// restored from memory, then from disk.
fn run(setup: &Setup, flash: bool, cuts: usize) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("events.jsonl");
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, job_yaml(setup, flash, &log, dir.path(), false)).unwrap();
    let (mut master, _addr) = start_master(&spec, &dir.path().join("run"), None);
    let limit = Duration::from_secs(600);
    // One cut more than measured: the other ranks have logged the last measured one by then.
    let all = wait(&mut master.child, &log, limit, "cuts", |l| {
        group_cuts(l).len() > cuts + 1
    });
    let mut out = Run::default();
    for (_, held, s) in &group_cuts(&all)[1..=cuts] {
        out.cuts.push(*s);
        out.held.push(held.clone());
    }
    for s in of(&all, "step").into_iter().filter(|s| rank(s) == 0) {
        let v = s["s"].as_f64().unwrap();
        if s["writing"] == true {
            out.writing.push(v);
        } else {
            out.quiet.push(v);
        }
    }
    if flash {
        let mut lost = vec![Lost::None];
        if setup.ranks > 1 {
            lost.push(Lost::Killed);
        }
        lost.push(Lost::All);
        for lost in lost {
            out.restores.push(kill_and_restore(
                setup,
                &mut master.child,
                &log,
                dir.path(),
                lost,
            ));
        }
    }
    stop_master(&mut master.child);
    out
}

/// Which copies in memory are gone when a rank is killed.
#[derive(Clone, Copy, PartialEq)]
enum Lost {
    /// None: every rank restores from its node's memory.
    None,
    /// The killed rank's (as on a new node): a rank holding the copy sends it.
    Killed,
    /// Every rank's, and the page cache dropped: the disk.
    All,
}

/// Kills one rank with SIGKILL once a cut held in memory is committed, its copies or every
/// rank's removed first as `lost` says, and returns each restarted rank's restore; waits for
/// a cut after the restart, so that the next kill has a committed copy to go to.
fn kill_and_restore(
    setup: &Setup,
    master: &mut std::process::Child,
    log: &Path,
    dir: &Path,
    lost: Lost,
) -> Vec<(u64, String, f64)> {
    let limit = Duration::from_secs(600);
    let ranks = setup.ranks as usize;
    if lost != Lost::All {
        wait_committed(master, log, &dir.join("ckpt"), limit);
    }
    let all = lines(log);
    let starts = of(&all, "start");
    let n = starts.len();
    let group = &starts[n - ranks..];
    let removed = match lost {
        Lost::None => &group[..0],
        Lost::Killed => &group[ranks - 1..],
        Lost::All => group,
    };
    for start in removed {
        let slots = PathBuf::from(start["flash_dir"].as_str().unwrap());
        for e in std::fs::read_dir(&slots).unwrap() {
            let _ = std::fs::remove_file(e.unwrap().path());
        }
    }
    if lost == Lost::All && !drop_caches() {
        eprintln!("the page cache could not be dropped (not root)");
    }
    kill9(group[ranks - 1]["pid"].as_u64().unwrap());
    let all = wait(master, log, limit, "the group's restart", |l| {
        of(l, "start").len() >= n + ranks
    });
    let restored = of(&all, "start")[n..n + ranks]
        .iter()
        .map(|s| {
            (
                rank(s),
                s["restored_from"].as_str().unwrap_or("none").to_string(),
                s["restore_s"].as_f64().unwrap(),
            )
        })
        .collect();
    let cuts_now = group_cuts(&all).len();
    wait(master, log, limit, "a cut after the restart", |l| {
        group_cuts(l).len() > cuts_now + 1
    });
    restored
}

/// One grow 1 → 2 of the group.
struct Grow {
    /// Rank 0's gap between its last step at 1 and its first at 2 (seconds).
    gap: f64,
    /// Median step time of rank 0 just before the plan, and in the group of 2.
    step_before: f64,
    step_after: f64,
    /// Where the cut the new rank started from was held, how it got it, and how long its
    /// `restore()` took.
    held: String,
    restored_from: String,
    restore_s: f64,
}

/// `job-master scale` to `workers`, waiting until the plan is carried out.
fn scale(addr: &str, run_dir: &Path, workers: u32) {
    let out = std::process::Command::new(common::release_bin("job-master"))
        .args([
            "scale",
            "--job",
            addr,
            "--workers",
            &workers.to_string(),
            "--wait",
        ])
        .arg("--token-file")
        .arg(run_dir.join(auth::JOB_TOKEN_FILE))
        .arg("--insecure")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scale to {workers}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rank 0's steps, as (the time it ended, its own time, the group's size).
fn rank0_steps(all: &[Value]) -> Vec<(f64, f64, u64)> {
    of(all, "step")
        .into_iter()
        .filter(|s| s["rank"] == 0)
        .map(|s| {
            (
                s["t"].as_f64().unwrap(),
                s["s"].as_f64().unwrap(),
                s["world"].as_u64().unwrap_or(1),
            )
        })
        .collect()
}

/// The job trained through `ElasticDDP`, grown 1 → 2 in place `grows` times (shrunk back in
/// between), after two cuts (the first pays for the copy's pages).
fn grow(setup: &Setup, flash: bool, grows: usize) -> Vec<Grow> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("events.jsonl");
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, job_yaml(setup, flash, &log, dir.path(), true)).unwrap();
    let run_dir = dir.path().join("run");
    let (mut master, addr) = start_master(&spec, &run_dir, None);
    let limit = Duration::from_secs(900);
    wait(&mut master.child, &log, limit, "two cuts", |l| {
        of(l, "cut").len() >= 2
    });
    let mut out = Vec::new();
    for _ in 0..grows {
        let starts = of(&lines(&log), "start").len();
        let before = rank0_steps(&lines(&log)).len();
        scale(&addr, &run_dir, 2);
        // Four steps of rank 0 in the group of 2, and the new rank's start.
        let all = wait(
            &mut master.child,
            &log,
            limit,
            "steps in the group of 2",
            |l| {
                of(l, "start").len() > starts
                    && rank0_steps(l)[before..].iter().filter(|s| s.2 == 2).count() >= 4
            },
        );
        let steps = rank0_steps(&all);
        let first2 = (before..steps.len()).find(|&i| steps[i].2 == 2).unwrap();
        let at1: Vec<f64> = steps[first2.saturating_sub(6)..first2 - 1]
            .iter()
            .map(|s| s.1)
            .collect();
        let at2: Vec<f64> = steps[first2 + 1..].iter().map(|s| s.1).collect();
        let start = of(&all, "start")[starts];
        let cut = of(&all, "cut")
            .into_iter()
            .rfind(|c| c["t"].as_f64().unwrap() <= steps[first2].0)
            .map_or("?".to_string(), |c| {
                c["held"].as_str().unwrap_or("?").into()
            });
        out.push(Grow {
            gap: steps[first2].0 - steps[first2 - 1].0,
            step_before: median(&at1),
            step_after: median(&at2),
            held: cut,
            restored_from: start["restored_from"].as_str().unwrap_or("none").into(),
            restore_s: start["restore_s"].as_f64().unwrap(),
        });
        scale(&addr, &run_dir, 1);
        let n = rank0_steps(&lines(&log)).len();
        wait(
            &mut master.child,
            &log,
            limit,
            "steps in the group of 1 again",
            |l| rank0_steps(l)[n..].iter().filter(|s| s.2 == 1).count() >= 3,
        );
    }
    stop_master(&mut master.child);
    out
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.3} s (min {lo:.3}, max {hi:.3}, n {})",
        median(v),
        v.len()
    )
}

fn main() {
    let Some(python) = common::torch_python("torch") else {
        test_support::skipped("no Python with torch (set BRAIN_TORCH_PYTHON)");
        return;
    };
    let sdk = match std::env::var_os("BRAIN_SDK_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => test_support::python_sdk(&python).expect("the SDK builds"),
    };
    let var = |name: &str, default: f64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let gib = var("BRAIN_BENCH_GIB", 1.0);
    let cuts = var("BRAIN_BENCH_CUTS", 5.0) as usize;
    let device = std::env::var("BRAIN_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    let every_shards = var("BRAIN_BENCH_EVERY_SHARDS", 2.0) as u32;
    let ranks = var("BRAIN_BENCH_RANKS", 1.0) as u32;
    assert!(ranks >= 1, "BRAIN_BENCH_RANKS is at least 1");
    let setup = Setup {
        python: &python,
        sdk: &sdk,
        gib,
        device: &device,
        every_shards,
        ranks,
    };
    let parts = std::env::var("BRAIN_BENCH_PARTS").unwrap_or_else(|_| "cuts,grow".into());
    let parts: Vec<&str> = parts.split(',').map(str::trim).collect();
    if let Some(bad) = parts.iter().find(|p| !["cuts", "grow"].contains(p)) {
        panic!("BRAIN_BENCH_PARTS names {bad:?}: expected cuts, grow or both");
    }
    if parts.contains(&"cuts") {
        let flash = run(&setup, true, cuts);
        // Its figures now, in case the synchronous run does not finish (a lease running out).
        println!(
            "flash run done: pause {}, held in {:?}; step {} while writing, {} otherwise; \
             restores {:?}",
            range(&flash.cuts),
            flash.held,
            range(&flash.writing),
            range(&flash.quiet),
            flash.restores
        );
        let sync = run(&setup, false, cuts);
        print_cuts(&setup, cuts, &flash, &sync);
    }
    if parts.contains(&"grow") {
        let grows = var("BRAIN_BENCH_GROWS", 2.0) as usize;
        let flash = grow(&setup, true, grows);
        let sync = grow(&setup, false, grows);
        print_grows(&setup, &flash, &sync);
    }
}

/// The grows' table: the flash run's against the synchronous run's.
fn print_grows(setup: &Setup, flash: &[Grow], sync: &[Grow]) {
    println!(
        "\nA grow 1 -> 2 in place (ElasticDDP, rescale: in_place): state {} GiB on {}, torch \
         with 1 CPU thread per rank",
        setup.gib, setup.device
    );
    println!("rank 0's gap between its last step at 1 and its first at 2, and the new rank:");
    for (name, runs) in [("flash memory", flash), ("sync to disk", sync)] {
        let gaps: Vec<f64> = runs.iter().map(|g| g.gap).collect();
        println!("  {name:<13} gap {}", range(&gaps));
        for g in runs {
            println!(
                "    gap {:.3} s (steps {:.3} s at 1, {:.3} s at 2); the cut held in {}; the \
                 new rank restored from {} in {:.3} s",
                g.gap, g.step_before, g.step_after, g.held, g.restored_from, g.restore_s
            );
        }
    }
}

/// The cuts' table: pause, step time and restore, the flash run's against the synchronous
/// run's.
fn print_cuts(setup: &Setup, cuts: usize, flash: &Run, sync: &Run) {
    let (gib, device, every_shards) = (setup.gib, setup.device, setup.every_shards);
    let ranks = match setup.ranks {
        1 => "1 rank,".to_string(),
        n => format!("{n} ranks of one DDP group on this node, each holding it,"),
    };
    println!(
        "\nFlash checkpoints in a job: state {gib} GiB on {device}, {ranks} torch with 1 CPU \
         thread a rank, {cuts} cuts per run after a warm-up, a cut every {every_shards} shards \
         of 10 steps"
    );
    println!("the cut's pause (the longest it held a rank), median:");
    println!(
        "  flash memory   {}  held in: {:?}",
        range(&flash.cuts),
        flash.held
    );
    println!(
        "  sync to disk   {}  held in: {:?}",
        range(&sync.cuts),
        sync.held
    );
    println!("step time, median:");
    let base = median(&sync.quiet);
    println!(
        "  sync run (no write behind)          {}",
        range(&sync.quiet)
    );
    println!(
        "  flash run, no copy being written    {}",
        range(&flash.quiet)
    );
    println!(
        "  flash run, a copy being written out {}  ({:+.1} % against the flash run's other \
         steps, {:+.1} % against the sync run's)",
        range(&flash.writing),
        (median(&flash.writing) / median(&flash.quiet) - 1.0) * 100.0,
        (median(&flash.writing) / base - 1.0) * 100.0
    );
    println!(
        "restore after kill -9 of one rank (job.restore() in each restarted process; the \
         group waits for the slowest):"
    );
    for group in &flash.restores {
        let each: Vec<String> = group
            .iter()
            .map(|(rank, from, s)| format!("rank {rank} from {from} {s:.3} s"))
            .collect();
        println!("  slowest {:.3} s: {}", slowest(group), each.join(", "));
    }
    if let (Some(memory), Some(disk)) = (flash.restores.first(), flash.restores.last()) {
        println!(
            "  disk / memory (slowest rank): {:.1}x",
            slowest(disk) / slowest(memory)
        );
    }
    if let [_, peer, disk] = flash.restores.as_slice() {
        println!(
            "  disk / the killed rank's copy lost, sent by a peer (slowest rank): {:.1}x",
            slowest(disk) / slowest(peer)
        );
    }
}

/// The longest restore of a restarted group.
fn slowest(group: &[(u64, String, f64)]) -> f64 {
    group.iter().map(|r| r.2).fold(0.0, f64::max)
}
