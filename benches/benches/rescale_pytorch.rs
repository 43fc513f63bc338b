//! A real PyTorch DDP script (gloo, CPU) rescaled 2 → 4, side by side in one run:
//! * **in place** (`examples/pytorch-ddp/train.py` on the Python SDK, `rescale: in_place`):
//!   `job-master run` (release build); from the plan being accepted to every rank of the group
//!   of 4 having finished a training step (the new processes start and import torch while the
//!   group of 2 trains on; then the cut, rank 0's checkpoint, the group re-formed in the running
//!   processes). Also the pause: from the last step of the group of 2 to that moment.
//! * **restart-based** (`examples/pytorch-ddp/train_plain.py`, no SDK): `job-master run` with the
//!   script as its command;
//!   from the plan being accepted to every rank of the new group of 4 having finished a training
//!   step (SIGTERM, checkpoint, exit; new ranks launched; the group restarts at 4 and resumes);
//! * **torchrun**: `torch.distributed.run --nnodes=1:4 --nproc-per-node=1 --rdzv-backend=c10d` on
//!   this machine, two agents ("nodes") training, then two more started; from their start to
//!   every rank of the group of 4 having finished a step (torchrun's agents see the waiting nodes
//!   at their monitor interval, stop their workers, re-rendezvous and restart them).
//!
//! Each way runs `BRAIN_BENCH_EVENTS` times (default 3). Needs a Python with torch
//! (`BRAIN_TORCH_PYTHON`, else `python3`).
//!
//! cargo build --release -p job-master -p worker-agent && cargo bench -p benches --bench rescale_pytorch

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{start_master, stop_master};
use job_master::scale::ScalePlan;
use job_master::spec::Role;
use proto::jobmaster::v1 as pb;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pytorch-ddp/train_plain.py")
}

fn sdk_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pytorch-ddp/train.py")
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Long enough never to end during a measurement (200,000 samples a process generates at its
/// start, 1,000 epochs).
const ARGS: [&str; 8] = [
    "--samples",
    "200000",
    "--epochs",
    "1000",
    "--step-sleep",
    "0.01",
    "--checkpoint-every",
    "50",
];

fn log_lines(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Seconds from `t0` until `world` ranks logged a first step at that world size after `t0`
/// (the plain script logs only those; the SDK script's `stepping` events are those);
/// `None` after `timeout`.
fn try_stepping(log: &Path, world: u32, t0: f64, timeout: Duration) -> Option<f64> {
    let start = Instant::now();
    loop {
        let lines = log_lines(log);
        let mut ranks: Vec<(u64, f64)> = lines
            .iter()
            .filter(|v| v.get("event").is_none_or(|e| e == "stepping"))
            .filter(|v| v["world"] == world && v["t"].as_f64().unwrap() >= t0)
            .map(|v| (v["rank"].as_u64().unwrap(), v["t"].as_f64().unwrap()))
            .collect();
        ranks.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        ranks.dedup_by_key(|r| r.0);
        if ranks.len() as u32 == world {
            return Some(ranks.iter().map(|r| r.1).fold(0.0, f64::max) - t0);
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`try_stepping`] that must succeed.
fn stepping(log: &Path, world: u32, t0: f64, timeout: Duration) -> f64 {
    try_stepping(log, world, t0, timeout)
        .unwrap_or_else(|| panic!("no group of {world} stepping within {timeout:?}"))
}

async fn ours(python: &str, events: usize) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("first-steps.jsonl");
    let mut argv = vec![python.to_string(), script().display().to_string()];
    argv.extend(ARGS.iter().map(|s| s.to_string()));
    argv.extend(["--first-step-log".into(), log.display().to_string()]);
    let yaml = format!(
        "name: bench-ddp\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, min: 1, max: 4 }}\n\
         workload:\n  command: {argv:?}\n  grace_period_ms: 20000\n  env: {{ OMP_NUM_THREADS: \"1\" }}\n\
         data: {{ num_samples: 1000, shard_size: 100 }}\ncheckpoint: {{ dir: {:?} }}\n",
        dir.path().join("ckpt")
    );
    rescale_events(dir.path(), &yaml, &log, events, |_, took| took).await
}

/// Runs a job master on `yaml` in `dir`, waits for its group of 2 to step (as `log` says), then
/// `events` times rescales it 2 → 4, measured (`measure(t0, seconds)`, t0 when the plan was
/// sent), and back to 2.
async fn rescale_events<T>(
    dir: &Path,
    yaml: &str,
    log: &Path,
    events: usize,
    mut measure: impl FnMut(f64, f64) -> T,
) -> Vec<T> {
    let mut out = Vec::new();
    let spec = dir.join("job.yaml");
    std::fs::write(&spec, yaml).unwrap();
    let (mut master, addr) = start_master(&spec, &dir.join("run"), None);
    let mut c = common::master_client(&addr, &dir.join("run")).await;
    stepping(log, 2, 0.0, Duration::from_secs(120));
    let mut version = 0;
    for _ in 0..events {
        for (workers, measured) in [(4u32, true), (2, false)] {
            std::thread::sleep(Duration::from_secs(2));
            version += 1;
            let plan = pb::ScalePlan::from(&ScalePlan::count(version, Role::WORKER, workers));
            let t0 = now_s();
            let a = c.apply_scale_plan(plan).await.unwrap().into_inner();
            assert!(a.accepted, "{}", a.reason);
            let took = stepping(log, workers, t0, Duration::from_secs(120));
            if measured {
                out.push(measure(t0, took));
            }
        }
    }
    stop_master(&mut master.child);
    out
}

/// The SDK script rescaled in place: (plan accepted → every rank of 4 stepping, pause of the
/// group: its last step of 2 → every rank of 4 stepping) per event.
async fn in_place(python: &str, sdk: &Path, events: usize) -> Vec<(f64, f64)> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("events.jsonl");
    let argv = vec![
        python.to_string(),
        sdk_script().display().to_string(),
        "--samples".into(),
        "200000".into(),
        "--step-sleep".into(),
        "0.01".into(),
        "--events".into(),
        log.display().to_string(),
    ];
    let yaml = format!(
        "name: bench-ddp-sdk\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, min: 1, max: 4 }}\n\
         workload:\n  command: {argv:?}\n  rescale: in_place\n  \
         env: {{ OMP_NUM_THREADS: \"1\", PYTHONPATH: {sdk:?} }}\n\
         data: {{ num_samples: 200000, shard_size: 256 }}\nepochs: 10\n\
         checkpoint: {{ dir: {:?} }}\n",
        dir.path().join("ckpt")
    );
    rescale_events(dir.path(), &yaml, &log, events, |t0, took| {
        // The survivors' last step in the group of 2, as they logged it on re-forming.
        let last = log_lines(&log)
            .iter()
            .filter(|v| v["event"] == "reform" && v["t"].as_f64().unwrap() >= t0)
            .filter_map(|v| v["last_step"].as_f64())
            .fold(f64::INFINITY, f64::min);
        (took, t0 + took - last)
    })
    .await
}

/// Where the torchrun agents' output goes (kept: it says why a group did not form).
fn torchrun_logs() -> PathBuf {
    std::env::temp_dir().join("brain-rescale-pytorch-torchrun")
}

fn torchrun_node(
    python: &str,
    port: u16,
    log: &Path,
    ckpt: &Path,
    n: usize,
) -> std::process::Child {
    let out = std::fs::File::create(torchrun_logs().join(format!("node-{n}.log"))).unwrap();
    Command::new(python)
        .args([
            "-m",
            "torch.distributed.run",
            "--nnodes=1:4",
            "--nproc-per-node=1",
        ])
        .args([
            "--rdzv-backend=c10d",
            &format!("--rdzv-endpoint=127.0.0.1:{port}"),
        ])
        // torchrun's defaults otherwise (monitor interval 0.1 s). On one machine every agent
        // would take itself for the store's host: only the first one is.
        .args(["--rdzv-id=bench", "--max-restarts=10"])
        .arg(format!("--rdzv-conf=is_host={}", n == 0))
        .arg(script())
        .args(ARGS)
        .arg("--first-step-log")
        .arg(log)
        .env("BRAIN_CHECKPOINT_DIR", ckpt)
        .env("OMP_NUM_THREADS", "1")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .env("LOGLEVEL", "INFO")
        // torch 2.15's shared rendezvous store never publishes the next round's master address
        // when nodes join a running group (the old rank 0 keeps its first round's), so the
        // scale-up deadlocks; torchrun's own switch turns the sharing off.
        .env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        .process_group(0)
        .spawn()
        .expect("torchrun starts")
}

/// Kills a torchrun agent, its process group and its workers (which run in sessions of their
/// own: left alive they would slow every later measurement down).
fn stop_group(c: &mut std::process::Child) {
    let workers = test_support::descendants(c.id());
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    for pid in workers {
        // Gone already when it was in the agent's group.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = c.wait();
}

/// Like [`ours`]; stops at the first event whose group of 4 does not form within 120 s.
fn torchrun(python: &str, events: usize) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for _ in 0..events {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("first-steps.jsonl");
        let ckpt = dir.path().join("ckpt");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let _ = std::fs::remove_dir_all(torchrun_logs());
        std::fs::create_dir_all(torchrun_logs()).unwrap();
        let mut nodes: Vec<_> = (0..2)
            .map(|n| torchrun_node(python, port, &log, &ckpt, n))
            .collect();
        stepping(&log, 2, 0.0, Duration::from_secs(180));
        std::thread::sleep(Duration::from_secs(2));
        let t0 = now_s();
        nodes.extend((2..4).map(|n| torchrun_node(python, port, &log, &ckpt, n)));
        let took = try_stepping(&log, 4, t0, Duration::from_secs(120));
        for n in &mut nodes {
            stop_group(n);
        }
        out.push(took);
        if took.is_none() {
            break;
        }
    }
    out
}

fn row(name: &str, v: &[f64]) {
    if v.is_empty() {
        println!("{name:<34} {:>8} {:>8} {:>8} {:>8}", "-", "-", "-", "-");
        return;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mean = s.iter().sum::<f64>() / s.len() as f64;
    println!(
        "{name:<34} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
        s[0],
        s[s.len() / 2],
        mean,
        s[s.len() - 1]
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(python) = common::torch_python("torch") else {
        test_support::skipped("no Python with torch (set BRAIN_TORCH_PYTHON)");
        return;
    };
    let events = std::env::var("BRAIN_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let sdk = match test_support::python_sdk(&python) {
        Ok(dir) => Some(dir),
        Err(e) => {
            test_support::skipped(&format!("the in-place column: cannot build python/: {e}"));
            None
        }
    };
    let inplace = match &sdk {
        Some(dir) => in_place(&python, dir, events).await,
        None => Vec::new(),
    };
    let a = ours(&python, events).await;
    let b = torchrun(&python, events);
    let formed: Vec<f64> = b.iter().flatten().copied().collect();
    println!(
        "\nPyTorch DDP rescale 2 -> 4, until every rank of 4 finished a step ({events} events each)"
    );
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>8}",
        "way", "min s", "median s", "mean s", "max s"
    );
    let took: Vec<f64> = inplace.iter().map(|p| p.0).collect();
    row("brain, in place (SDK)", &took);
    row("brain, restart-based (no SDK)", &a);
    row("torchrun --nnodes=1:4 (c10d)", &formed);
    let pause: Vec<f64> = inplace.iter().map(|p| p.1).collect();
    println!("\nin place: the group's pause, from its last step of 2 to every rank of 4 stepping");
    row("brain, in place (SDK)", &pause);
    if b.iter().any(Option::is_none) {
        println!(
            "torchrun: {} of {} events formed no group of 4 within 120 s (its agents' output: {})",
            b.iter().filter(|t| t.is_none()).count(),
            b.len(),
            torchrun_logs().display()
        );
    } else {
        let med = |v: &[f64]| {
            let mut s = v.to_vec();
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        };
        println!(
            "ratio of medians: torchrun / restart-based {:.2}",
            med(&formed) / med(&a)
        );
        if !took.is_empty() {
            println!(
                "ratio of medians: torchrun / in place {:.2}",
                med(&formed) / med(&took)
            );
        }
    }
}
