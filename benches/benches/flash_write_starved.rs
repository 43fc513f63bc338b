//! The agent's write-out of a flash copy on a node whose training never leaves a core idle
//! (issue 43): every core runs a busy thread at normal priority (a CPU job with as many
//! threads as cores, none waiting), while the agent's write-out thread
//! (`worker_agent::flash_write`, `SCHED_IDLE`) copies a part from shared memory to the
//! checkpoint directory, hashing it. At `SCHED_IDLE` it gets what the busy threads leave,
//! almost nothing; after its hurry time the rest goes on at nice 10. Printed side by side in
//! one run: the write-out's time and the busy threads' rate beside their rate with no write,
//! for hurry times of 60 s, 20 s (the agent's, `HURRY_AFTER`) and 2 s, and with no busy
//! threads. Run with `cargo bench -p benches --bench flash_write_starved`
//! (`BRAIN_BENCH_MIB`, 128 by default: the part's size; `BRAIN_BENCH_DIR`: where it is
//! written, the system's temporary directory by default).

use std::fs::File;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vocab::beneath::Beneath;
use worker_agent::flash_write::{HURRY_AFTER, Job, background_thread, copy_hashed};

/// Busy threads, one a core, counting until told to stop.
struct Busy {
    stop: Arc<AtomicBool>,
    counts: Vec<Arc<AtomicU64>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(n: usize) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let mut counts = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..n {
            let (stop, count) = (stop.clone(), Arc::new(AtomicU64::new(0)));
            counts.push(count.clone());
            threads.push(std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..10_000u64 {
                        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        Busy {
            stop,
            counts,
            threads,
        }
    }

    fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// One write-out of `from` to `to` on a write-out thread hurried after `after`: its time and
/// whether it was hurried.
fn write_out(from: &Path, to: &Path, after: Duration) -> (Duration, bool) {
    let thread = background_thread(after);
    let (tx, rx) = std::sync::mpsc::channel();
    let f = from.to_path_buf();
    let dir = Beneath::open(to.parent().expect("the part's directory")).expect("opened");
    let name = to
        .file_name()
        .and_then(|n| n.to_str())
        .expect("the part's name")
        .to_string();
    let began = Instant::now();
    let job: Job = Box::new(move || {
        let from = File::open(&f).expect("the slot");
        let c = copy_hashed(&from, &dir, &name, None).expect("written out");
        let _ = tx.send(c.hurried);
    });
    thread.send(job).expect("the write-out thread");
    let hurried = rx.recv().expect("an answer");
    let took = began.elapsed();
    std::fs::remove_file(to).expect("the part");
    (took, hurried)
}

fn main() {
    let mib: usize = std::env::var("BRAIN_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let out_dir =
        std::env::var("BRAIN_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), PathBuf::from);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shm = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    let out = tempfile::tempdir_in(&out_dir).expect("a directory to write to");
    let from = shm.path().join("slot");
    let body: Vec<u8> = (0..mib << 20).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&from, &body).expect("the slot written");
    drop(body);
    let to = out.path().join("part-0.bin");
    println!(
        "flash write-out of {mib} MiB from /dev/shm to {}, {cores} busy threads at normal priority",
        out_dir.display()
    );

    // The busy threads' rate with nothing else to run.
    let busy = Busy::start(cores);
    std::thread::sleep(Duration::from_secs(1));
    let (c0, t0) = (busy.total(), Instant::now());
    std::thread::sleep(Duration::from_secs(5));
    let alone = (busy.total() - c0) as f64 / t0.elapsed().as_secs_f64();
    busy.stop();

    let (idle_time, _) = write_out(&from, &to, Duration::from_secs(3600));
    println!();
    println!("| case | write-out | hurried | busy threads' rate vs alone |");
    println!("|---|---|---|---|");
    println!(
        "| no busy threads, SCHED_IDLE | {:.2} s | no | — |",
        idle_time.as_secs_f64()
    );
    for after in [Duration::from_secs(60), HURRY_AFTER, Duration::from_secs(2)] {
        let busy = Busy::start(cores);
        std::thread::sleep(Duration::from_millis(500));
        let (c0, t0) = (busy.total(), Instant::now());
        let (took, hurried) = write_out(&from, &to, after);
        let rate = (busy.total() - c0) as f64 / t0.elapsed().as_secs_f64();
        busy.stop();
        println!(
            "| busy, hurried after {} s | {:.2} s | {} | {:+.1} % |",
            after.as_secs(),
            took.as_secs_f64(),
            if hurried { "yes" } else { "no" },
            (rate / alone - 1.0) * 100.0
        );
    }
}
