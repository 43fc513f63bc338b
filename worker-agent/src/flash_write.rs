//! How the agent writes a flash copy out (`flash.rs` decides which copy and when): on a thread
//! of its own at the lowest CPU priority, so that the node's training comes first (a copy that
//! runs past [`HURRY_AFTER`], starved by training that never leaves a core idle, goes on on a
//! second thread at nice [`HURRY_NICE`]), and around the page cache where the file system
//! allows, so that the write costs the node a transfer from memory rather than a copy into the
//! page cache and its write-back. The part is written under a temporary name, synced and
//! renamed: a reader sees the whole part or none.

use std::cell::RefCell;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use sha2::{Digest, Sha256};
use vocab::beneath::{Beneath, Owner};

use crate::error::Error;
use crate::flash::io;

/// Work for the background thread.
pub type Job = Box<dyn FnOnce() + Send>;

/// How long a write-out runs at the lowest priority before the rest of it goes on at
/// [`HURRY_NICE`]: on a node whose training never leaves a core idle, a `SCHED_IDLE` thread
/// gets about 0.3 % of a core, and a copy would take many minutes (the job master sends the
/// next cuts to disk once one has waited 10 minutes to be written out).
pub const HURRY_AFTER: Duration = Duration::from_secs(20);

/// The nice value the rest of a write-out runs at once it has run [`HURRY_AFTER`]: about a
/// tenth of a core beside a training thread at nice 0, where it gets no idle time.
pub const HURRY_NICE: i32 = 10;

/// Where the write-out thread hands the rest of a copy that got too little CPU (the second
/// thread's jobs), and after how long.
struct Hurry {
    jobs: Sender<Job>,
    after: Duration,
}

thread_local! {
    /// The write-out thread's way to hurry a copy (none on other threads: a copy made there,
    /// a test's, goes on where it is).
    static HURRY: RefCell<Option<Hurry>> = const { RefCell::new(None) };
}

/// The thread that writes a process's copies out: it runs at the lowest CPU priority
/// (`SCHED_IDLE`), so that the node's training processes come first and the write-out takes
/// the CPU time they leave (a longer write-out, not slower steps, where every core trains). A
/// copy that runs `hurry_after` ([`HURRY_AFTER`] in the agent) goes on on a second thread at
/// [`HURRY_NICE`] (a thread cannot leave `SCHED_IDLE` without privileges; the second one never
/// entered it). Both end when the sender is dropped (the [`crate::flash::Writer`] stopped),
/// after the job in hand. Call it from a thread at normal priority: the threads inherit it.
pub fn background_thread(hurry_after: Duration) -> Sender<Job> {
    let hurry = spawn_thread("flash-write-hurry", || nice_to(HURRY_NICE));
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name("flash-write-out".into())
        .spawn(move || {
            lowest_cpu_priority();
            HURRY.with(|h| {
                *h.borrow_mut() = Some(Hurry {
                    jobs: hurry,
                    after: hurry_after,
                })
            });
            for job in rx {
                job();
            }
        });
    if let Err(e) = spawned {
        // The sender's next send fails, and the writer says so.
        tracing::warn!("the flash write-out thread did not start: {e}");
    }
    tx
}

/// A thread named `name` that runs `first`, then the jobs sent to it until the sender is
/// dropped; where it cannot start, the jobs run on the thread that sends them (see
/// [`hurried_on`]).
fn spawn_thread(name: &str, first: fn()) -> Sender<Job> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            first();
            for job in rx {
                job();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("the {name} thread did not start: {e}");
    }
    tx
}

/// Puts the calling thread in the `SCHED_IDLE` class: it runs on what the node's other
/// threads leave (a thread may always lower its own priority; where that fails anyway, it
/// stays as it was, and says so).
fn lowest_cpu_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread, and `param` is a valid sched_param for SCHED_IDLE
    // (whose priority must be 0); the call reads it and changes nothing else.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        tracing::warn!(
            "the flash write-out runs at normal CPU priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Sets the calling thread's nice value to `nice` (a thread may always lower its priority).
fn nice_to(nice: i32) {
    // SAFETY: on Linux, PRIO_PROCESS with who 0 is the calling thread; the call changes only
    // its nice value.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc != 0 {
        tracing::warn!(
            "the flash write-out's second thread runs at normal CPU priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The name a part is written under before it is renamed into place: `part-R.bin.tmp-HOST-PID`
/// (the host too: a checkpoint directory may be shared by nodes).
pub(crate) fn tmp_prefix(name: &str) -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}.tmp-{host}-")
}

/// Removes what an agent of this node killed while writing `name` out left of it in `dir`: its
/// temporary file, named with a process that no longer runs here (a link there is removed,
/// never followed).
fn remove_stale_tmp(dir: &Beneath, name: &str) {
    let prefix = tmp_prefix(name);
    let Ok(entries) = dir.names() else {
        return;
    };
    // Said once for all of them, with the first of each: the directory is the job's, and a
    // job may plant millions of such names (the agent's log stays bounded).
    let (mut removed, mut failed) = ((0usize, None), (0usize, None));
    for entry in entries {
        let Some(pid) = entry
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            match dir.remove_file(&entry) {
                Ok(()) => {
                    removed.0 += 1;
                    removed.1.get_or_insert(entry);
                }
                Err(err) => {
                    failed.0 += 1;
                    failed.1.get_or_insert(format!("{entry}: {err}"));
                }
            }
        }
    }
    if let (n, Some(first)) = removed {
        let more = if n > 1 { ", ..." } else { "" };
        tracing::info!(
            "removed {n} temporary file(s) left by agents killed mid-write ({first}{more})"
        );
    }
    if let (n, Some(first)) = failed {
        tracing::warn!("cannot remove {n} temporary file(s): {first}");
    }
}

/// The bytes read, hashed and written at a time.
const CHUNK: usize = 8 << 20;
/// What a write around the page cache must be aligned to (memory, length and offset): 4 KiB,
/// the logical block of every disk we write to, and a multiple of the smaller ones.
const BLOCK: usize = 4096;

/// A part written out: its SHA-256 (hex), its length, and whether it was hurried (its rest
/// written at [`HURRY_NICE`] after [`HURRY_AFTER`]).
pub struct Copied {
    pub digest: String,
    pub bytes: u64,
    pub hurried: bool,
}

/// Copies `from` to `name` in `dir` by a temporary name (made new, given to `owner`, synced,
/// renamed, the directory synced): a reader sees the whole file or none, and nothing is
/// written through a link a job planted in `dir`. On the write-out thread, a copy that runs
/// past its hurry time goes on on the hurry thread, this one waiting for it.
pub fn copy_hashed(from: &File, dir: &Beneath, name: &str, owner: Owner) -> Result<Copied, Error> {
    remove_stale_tmp(dir, name);
    let tmp_name = format!("{}{}", tmp_prefix(name), std::process::id());
    let (to, tmp) = (dir.join(name), dir.join(&tmp_name));
    let out = PartFile::create(dir, &tmp_name, owner).map_err(io(&tmp))?;
    let from = from.try_clone().map_err(io(&to))?;
    let mut copy = Copying::new(from, out, &to, &tmp);
    let started = Instant::now();
    let mut hurried = false;
    while !copy.done {
        let due = HURRY.with(|h| {
            h.borrow()
                .as_ref()
                .filter(|h| started.elapsed() >= h.after)
                .map(|h| h.jobs.clone())
        });
        if let Some(jobs) = due {
            tracing::info!(
                part = %to.display(),
                written = copy.bytes,
                "the write-out got too little CPU in {:?}: the rest goes on at nice {HURRY_NICE}",
                started.elapsed()
            );
            copy = hurried_on(copy, &jobs)?;
            hurried = true;
            break;
        }
        copy.chunk()?;
    }
    let Copying {
        out, sha, bytes, ..
    } = copy;
    out.sync().map_err(io(&tmp))?;
    dir.rename(&tmp_name, name).map_err(io(&to))?;
    dir.sync().map_err(io(dir.path()))?;
    Ok(Copied {
        digest: hex::encode(sha.finalize()),
        bytes,
        hurried,
    })
}

/// The rest of `copy` written on the thread `jobs` goes to (here, where it is gone).
fn hurried_on(copy: Copying, jobs: &Sender<Job>) -> Result<Copying, Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(copy.finished());
    });
    if let Err(std::sync::mpsc::SendError(job)) = jobs.send(job) {
        job();
    }
    rx.recv()
        .map_err(|_| Error::InvalidRequest("the flash write-out's second thread ended".into()))?
}

/// A copy under way: read chunk by chunk into a buffer aligned for `O_DIRECT`, hashed and
/// written at the same offset.
struct Copying {
    from: File,
    out: PartFile,
    sha: Sha256,
    storage: Vec<u8>,
    bytes: u64,
    done: bool,
    to: PathBuf,
    tmp: PathBuf,
}

impl Copying {
    fn new(from: File, out: PartFile, to: &Path, tmp: &Path) -> Self {
        Self {
            from,
            out,
            sha: Sha256::new(),
            // A chunk whose start is aligned to a block, inside a buffer one block longer.
            storage: vec![0u8; CHUNK + BLOCK],
            bytes: 0,
            done: false,
            to: to.to_path_buf(),
            tmp: tmp.to_path_buf(),
        }
    }

    /// The copy with every chunk copied.
    fn finished(mut self) -> Result<Self, Error> {
        while !self.done {
            self.chunk()?;
        }
        Ok(self)
    }

    /// Copies the next chunk; `done` once `from` has ended.
    fn chunk(&mut self) -> Result<(), Error> {
        let start = self.storage.as_ptr().align_offset(BLOCK);
        let buf = &mut self.storage[start..start + CHUNK];
        let n = fill(&mut self.from, buf).map_err(io(&self.to))?;
        if n == 0 {
            self.done = true;
            return Ok(());
        }
        self.sha.update(&buf[..n]);
        self.out
            .write_at(&buf[..n], self.bytes)
            .map_err(io(&self.tmp))?;
        self.bytes += n as u64;
        Ok(())
    }
}

/// Reads into `buf` until it is full or `from` ends: every chunk but the last is whole, so
/// that every write but the last starts and ends on a block.
fn fill(from: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match from.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(r) => n += r,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A part's file being written. Whole blocks go around the page cache (`O_DIRECT`) where the
/// file system takes that; the tail under a block, and everything where `O_DIRECT` is refused
/// (at the open, or at the first write), through it.
struct PartFile {
    direct: Option<File>,
    buffered: File,
}

impl PartFile {
    /// Makes `name` in `dir`, which must not be there (an earlier file of this process' own
    /// name goes first; a link there is removed, never followed).
    fn create(dir: &Beneath, name: &str, owner: Owner) -> std::io::Result<Self> {
        match dir.remove_file(name) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let buffered = dir.create_new(name, 0o600, owner)?;
        let direct = dir.open_file(name, OFlag::O_WRONLY | OFlag::O_DIRECT).ok();
        Ok(Self { direct, buffered })
    }

    /// Writes `chunk`, which starts on a block in memory, at `offset`, a multiple of a block.
    fn write_at(&mut self, chunk: &[u8], offset: u64) -> std::io::Result<()> {
        let mut whole = 0;
        if let Some(direct) = &self.direct {
            whole = chunk.len() / BLOCK * BLOCK;
            if whole > 0
                && let Err(e) = direct.write_all_at(&chunk[..whole], offset)
            {
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
                // Not taken here after all: the page cache from now on, this chunk again.
                tracing::debug!("O_DIRECT refused at the first write: {e}");
                self.direct = None;
                whole = 0;
            }
        }
        self.buffered
            .write_all_at(&chunk[whole..], offset + whole as u64)
    }

    /// Syncs what went through the page cache and the file's size (the direct writes are on
    /// the disk already).
    fn sync(self) -> std::io::Result<()> {
        self.buffered.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part of more than one chunk and not a whole number of blocks, written out where the
    /// tests' temporary files live and in shared memory: the same bytes, its SHA-256.
    #[test]
    fn a_part_of_any_length_is_written_whole_around_the_page_cache_or_through_it() {
        let body: Vec<u8> = (0..CHUNK + 3 * BLOCK + 123)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        for root in [std::env::temp_dir(), "/dev/shm".into()] {
            let dir = tempfile::tempdir_in(&root).unwrap();
            let (from, to) = (dir.path().join("slot"), dir.path().join("part-0.bin"));
            std::fs::write(&from, &body).unwrap();
            let open = Beneath::open(dir.path()).unwrap();
            let c = copy_hashed(&File::open(&from).unwrap(), &open, "part-0.bin", None).unwrap();
            assert_eq!(c.bytes, body.len() as u64, "{}", root.display());
            assert_eq!(std::fs::read(&to).unwrap(), body, "{}", root.display());
            assert_eq!(c.digest, hex::encode(Sha256::digest(&body)));
            assert!(!c.hurried, "no hurry outside the write-out thread");
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(left.len(), 2, "the temporary file is renamed into place");
        }
    }

    /// On the write-out thread, a copy past its hurry time goes on on the second thread, at
    /// nice 10: the same bytes and digest, said hurried; one within it is not.
    #[test]
    fn a_copy_past_its_hurry_time_goes_on_on_the_second_thread_whole() {
        let body: Vec<u8> = (0..2 * CHUNK + 77).map(|i| (i * 13 % 251) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("slot");
        std::fs::write(&from, &body).unwrap();
        for (after, hurried) in [(Duration::ZERO, true), (Duration::from_secs(3600), false)] {
            let name = format!("part-{hurried}.bin");
            let to = dir.path().join(&name);
            let thread = background_thread(after);
            let (tx, rx) = std::sync::mpsc::channel();
            let (f, d) = (from.clone(), dir.path().to_path_buf());
            let job: Job = Box::new(move || {
                let open = Beneath::open(&d).unwrap();
                let c = copy_hashed(&File::open(&f).unwrap(), &open, &name, None);
                // Where it ran, at the end: the write-out thread, in SCHED_IDLE.
                #[allow(unsafe_code)]
                // SAFETY: pid 0 is the calling thread; the call only reads its policy.
                let policy = unsafe { libc::sched_getscheduler(0) };
                let _ = tx.send((c, policy));
            });
            thread.send(job).unwrap();
            let (c, policy) = rx.recv().unwrap();
            let c = c.unwrap();
            assert_eq!(policy, libc::SCHED_IDLE);
            assert_eq!(c.hurried, hurried);
            assert_eq!(c.bytes, body.len() as u64);
            assert_eq!(c.digest, hex::encode(Sha256::digest(&body)));
            assert_eq!(std::fs::read(&to).unwrap(), body);
        }
    }

    /// The second thread lowers itself to nice 10; the write-out thread is in SCHED_IDLE.
    #[test]
    fn the_threads_run_at_their_priorities() {
        let (tx, rx) = std::sync::mpsc::channel();
        let hurry = spawn_thread("test-hurry", || nice_to(HURRY_NICE));
        hurry
            .send(Box::new(move || {
                #[allow(unsafe_code)]
                // SAFETY: PRIO_PROCESS with who 0 is the calling thread; the call only reads.
                let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
                let _ = tx.send(nice);
            }))
            .unwrap();
        assert_eq!(rx.recv().unwrap(), HURRY_NICE);
    }
}
