//! Durable, atomic persistence of the job context with group commit.
//!
//! A change bumps a generation number and wakes the writer task; the writer serialises the
//! newest state, writes it to a temporary file in the same directory, fsyncs it and renames it
//! over `job-context.json`, so a reader sees the old or the new context, never half of one.
//! Callers wait until their generation is on disk before they answer, so an acknowledged change
//! survives a crash; concurrent changes share one write.
//!
//! A write that fails (the run directory removed, a full or failing disk) is retried with
//! backoff ([`RETRY_FIRST`] doubling to [`RETRY_MOST`]), said in the log at most every
//! [`SAID_EVERY`] and once in the job's events ([`Persister::news`]), and counted
//! ([`Persister::failures`], in the master's reports to the brain: its `/metrics`); callers
//! wait meanwhile.
//! Once writes have failed for the master's `persist_give_up_ms`, callers are told, and the
//! job fails with the reason (its processes stopped): a job that cannot keep its record could
//! lose or repeat work.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, Notify, watch};

use vocab::beneath::{Beneath, Owner};

use crate::error::Error;
use crate::job::JobContext;

pub use vocab::run_dir::CONTEXT_FILE;

/// The first wait before a failed write is tried again.
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between tries.
pub const RETRY_MOST: Duration = Duration::from_secs(5);
/// How often a write that goes on failing is said in the log.
pub const SAID_EVERY: Duration = Duration::from_secs(10);

pub struct Persister {
    path: PathBuf,
    wanted: std::sync::atomic::AtomicU64,
    wake: Notify,
    written: watch::Sender<(u64, Option<String>)>,
    /// How long writes may fail before callers are told (and the job fails).
    give_up_after: Duration,
    /// What the job's events should say and have not yet: writes began failing, or work again.
    news: std::sync::Mutex<Option<String>>,
    /// Writes that failed since this master started (what its reports to the brain count).
    failures: std::sync::atomic::AtomicU64,
}

/// Writes failing since `since`.
struct Failing {
    since: Instant,
    tries: u32,
    said: Instant,
    gave_up: bool,
}

impl Persister {
    pub fn new(run_dir: &Path, give_up_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            path: run_dir.join(CONTEXT_FILE),
            wanted: 0.into(),
            wake: Notify::new(),
            written: watch::channel((0, None)).0,
            give_up_after,
            news: std::sync::Mutex::default(),
            failures: 0.into(),
        })
    }

    /// How many writes failed since this master started.
    pub fn failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What the job's events should say about its writes since last asked, if anything.
    pub fn news(&self) -> Option<String> {
        self.news.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn tell(&self, text: String) {
        *self.news.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Marks the state changed; returns the generation to wait for.
    pub fn changed(&self) -> u64 {
        let g = self
            .wanted
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        self.wake.notify_one();
        g
    }

    /// Waits until generation `g` (or a later one) is on disk.
    pub async fn durable(&self, g: u64) -> Result<(), Error> {
        let mut rx = self.written.subscribe();
        loop {
            {
                let (done, err) = &*rx.borrow_and_update();
                if let Some(e) = err {
                    return Err(Error::Persist {
                        path: self.path.clone(),
                        source: std::io::Error::other(e.clone()),
                    });
                }
                if *done >= g {
                    return Ok(());
                }
            }
            if rx.changed().await.is_err() {
                return Err(Error::Persist {
                    path: self.path.clone(),
                    source: std::io::Error::other("the context writer stopped"),
                });
            }
        }
    }

    /// The writer loop; runs until the process ends.
    pub async fn run(self: Arc<Self>, job: Arc<Mutex<JobContext>>) {
        let mut failing: Option<Failing> = None;
        loop {
            let target = self.wanted.load(std::sync::atomic::Ordering::SeqCst);
            if target <= self.written.borrow().0 {
                self.wake.notified().await;
                continue;
            }
            let json = {
                let ctx = job.lock().await;
                serde_json::to_vec(&*ctx)
            };
            let path = self.path.clone();
            let res = match json {
                Ok(bytes) => tokio::task::spawn_blocking(move || write_atomic(&path, &bytes))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e))),
                Err(e) => Err(std::io::Error::other(e)),
            };
            match res {
                Ok(()) => {
                    if let Some(f) = failing.take() {
                        let text = format!(
                            "the job's state is written again ({}), after {} s and {} failed \
                             tries",
                            self.path.display(),
                            f.since.elapsed().as_secs(),
                            f.tries
                        );
                        tracing::info!("{text}");
                        self.tell(text);
                    }
                    self.written.send_replace((target, None));
                }
                Err(e) => {
                    let delay = self.failed(&mut failing, &e);
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Counts a failed write: said (the first, then every [`SAID_EVERY`]), callers told once
    /// writes have failed for `give_up_after`. The wait before the next try.
    fn failed(&self, failing: &mut Option<Failing>, e: &std::io::Error) -> Duration {
        let now = Instant::now();
        let first = failing.is_none();
        let f = failing.get_or_insert(Failing {
            since: now,
            tries: 0,
            said: now,
            gave_up: false,
        });
        f.tries += 1;
        self.failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let for_s = f.since.elapsed().as_secs();
        let delay = RETRY_FIRST
            .saturating_mul(1 << (f.tries - 1).min(16))
            .min(RETRY_MOST);
        if first || f.said.elapsed() >= SAID_EVERY {
            f.said = now;
            tracing::error!(
                path = %self.path.display(),
                tries = f.tries,
                for_s,
                "cannot persist job context: {e}; trying again in {} ms",
                delay.as_millis()
            );
        }
        if first {
            self.tell(format!(
                "cannot write the job's state to {} ({e}): trying again with backoff; the job \
                 fails if this lasts {} s",
                self.path.display(),
                self.give_up_after.as_secs()
            ));
        }
        if !f.gave_up && f.since.elapsed() >= self.give_up_after {
            f.gave_up = true;
            let done = self.written.borrow().0;
            self.written.send_replace((
                done,
                Some(format!(
                    "{e} (writes failing for {for_s} s, {} tries)",
                    f.tries
                )),
            ));
        }
        delay
    }
}

/// The owner a master running as root gives what it makes in `dir` to: `dir`'s, when that is
/// not root (a checkpoint directory belongs to the user the job's processes run as,
/// `[launcher.sandbox] run_as`). None: keep the master's own.
fn owner_for(dir: &Beneath) -> std::io::Result<Owner> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let st = dir.stat()?;
    Ok((st.st_uid != 0).then(|| {
        (
            nix::unistd::Uid::from_raw(st.st_uid),
            nix::unistd::Gid::from_raw(st.st_gid),
        )
    }))
}

/// Gives the checkpoint directory `dir` to the user the job's processes run as
/// ([`vocab::sandbox::Sandbox::run_as`] of `sandbox`, the JSON the brain hands the master in
/// [`vocab::sandbox::SANDBOX_ENV`]) when the master runs as root, as each agent does before it
/// starts a process: what the master writes there before any process started (a cut while
/// every process still waits for room) is then the processes' to read, not root's alone. It
/// is given through the open directory (a link at its name is refused). Nothing changes
/// without a sandbox user; a user this machine does not have is left to the agents to
/// refuse, with the reason.
pub fn give_to_job_user(dir: &Path, sandbox: Option<&str>) -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let Some(json) = sandbox else {
        return Ok(());
    };
    let sandbox: vocab::sandbox::Sandbox = serde_json::from_str(json)
        .map_err(|e| std::io::Error::other(format!("{}: {e}", vocab::sandbox::SANDBOX_ENV)))?;
    let Some(name) = sandbox.run_as else {
        return Ok(());
    };
    match nix::unistd::User::from_name(&name).map_err(std::io::Error::from)? {
        Some(u) if !u.uid.is_root() => Beneath::open(dir)?.chown(u.uid, u.gid),
        _ => {
            tracing::warn!(
                "run_as: no unprivileged user named {name:?} here; {} stays the master's",
                dir.display()
            );
            Ok(())
        }
    }
}

/// Makes the directory `dir` below the job's checkpoint directory `checkpoints` for the job's
/// processes to write in (a parameter server's checkpoint part): reached by name through the
/// directories above it, a link refused, and given (by a master running as root) to the owner
/// of the directory above, as [`write_in_checkpoints`] gives files.
pub fn create_dir_for_processes(checkpoints: &Path, dir: &Path) -> std::io::Result<()> {
    let (parent, name) = Beneath::parent_below(checkpoints, dir)?;
    parent.make_dir(&name, 0o700, owner_for(&parent)?)?;
    Ok(())
}

/// Writes `bytes` to `path`, below the job's checkpoint directory `checkpoints` (a manifest),
/// atomically and durably as [`write_atomic`] does, every directory on the way reached by
/// name through the one above it (a link the job's processes planted is refused, never
/// followed). A master running as root gives the file to the directory's owner: a checkpoint
/// directory belongs to the user the job's processes run as, who must read the manifests.
pub fn write_in_checkpoints(checkpoints: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (dir, name) = Beneath::parent_below(checkpoints, path)?;
    dir.replace(&name, bytes, 0o600, owner_for(&dir)?)
}

/// Removes `dir` below the job's checkpoint directory `checkpoints` with everything in it
/// (an old checkpoint), reached as [`write_in_checkpoints`] reaches a file; a link is removed,
/// never followed.
pub fn remove_in_checkpoints(checkpoints: &Path, dir: &Path) -> std::io::Result<()> {
    let (parent, name) = Beneath::parent_below(checkpoints, dir)?;
    parent.remove_tree(&name)
}

/// Writes `bytes` to `path` atomically and durably (a new file beside it, fsync, rename over
/// it, fsync of the directory); a link at `path` is replaced, never written through, and the
/// directory is opened with a link at its own name refused. For the master's own run
/// directory; what goes below the checkpoint directory goes through [`write_in_checkpoints`].
/// A master running as root gives the file to the directory's owner.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::other(format!("{}: names no file", path.display())))?;
    let dir = Beneath::open(parent)?;
    dir.replace(name, bytes, 0o600, owner_for(&dir)?)
}

/// Reads a persisted context back; one an older job master wrote is read in today's form
/// ([`crate::job::roles::legacy`]).
pub fn load(path: &Path) -> Result<JobContext, Error> {
    let bad = |problem: String| Error::Context {
        path: path.to_path_buf(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    crate::job::roles::legacy::upgrade(&mut value).map_err(bad)?;
    serde_json::from_value(value).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_master_running_as_root_gives_the_checkpoint_directory_to_the_jobs_user() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let Some(nobody) = nix::unistd::User::from_name("nobody").unwrap() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let owner = || std::fs::metadata(dir.path()).unwrap().uid();
        give_to_job_user(dir.path(), None).unwrap();
        give_to_job_user(dir.path(), Some(r#"{"isolation": "none"}"#)).unwrap();
        give_to_job_user(dir.path(), Some(r#"{"run_as": "no-such-user-here"}"#)).unwrap();
        assert_eq!(owner(), 0);
        assert!(give_to_job_user(dir.path(), Some("{not json")).is_err());
        give_to_job_user(dir.path(), Some(r#"{"run_as": "nobody"}"#)).unwrap();
        assert_eq!(owner(), nobody.uid.as_raw());
        // What the master writes there then is the user's too.
        write_atomic(&dir.path().join("manifest.json"), b"{}").unwrap();
        let file = std::fs::metadata(dir.path().join("manifest.json")).unwrap();
        assert_eq!(file.uid(), nobody.uid.as_raw());
    }

    /// The attack on the PS checkpoint directory and the manifests: the job's processes
    /// plant a link where the master (root) makes a checkpoint's directory or writes its
    /// manifest, or name a directory outside; nothing is made, given away or written outside,
    /// and each is refused with the reason.
    #[test]
    fn nothing_the_master_does_below_the_checkpoint_directory_goes_through_a_link() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("etc");
        std::fs::create_dir(&outside).unwrap();
        let owner_before = std::fs::metadata(&outside).unwrap().uid();
        let ckpt = d.path().join("ckpt");
        std::fs::create_dir(&ckpt).unwrap();
        if nix::unistd::geteuid().is_root()
            && let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody")
        {
            nix::unistd::chown(&ckpt, Some(nobody.uid), Some(nobody.gid)).unwrap();
        }
        let ps_dir = ckpt.join("ckpt-000001");
        std::os::unix::fs::symlink(&outside, &ps_dir).unwrap();
        let e = create_dir_for_processes(&ckpt, &ps_dir)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let manifest = ps_dir.join("manifest.json");
        let e = write_in_checkpoints(&ckpt, &manifest, b"{}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = write_in_checkpoints(&ckpt, &outside.join("manifest.json"), b"{}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not inside"), "{e}");
        std::fs::create_dir(outside.join("step-0000000001")).unwrap();
        std::os::unix::fs::symlink(&outside, ckpt.join("flash")).unwrap();
        let e = remove_in_checkpoints(&ckpt, &ckpt.join("flash/step-0000000001"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(outside.join("step-0000000001").exists());
        assert!(!outside.join("manifest.json").exists());
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), owner_before);
        // Without the links, each works, and what is made is the checkpoint directory
        // owner's.
        std::fs::remove_file(&ps_dir).unwrap();
        create_dir_for_processes(&ckpt, &ps_dir).unwrap();
        write_in_checkpoints(&ckpt, &manifest, b"{}").unwrap();
        let ckpt_owner = std::fs::metadata(&ckpt).unwrap().uid();
        assert_eq!(std::fs::metadata(&ps_dir).unwrap().uid(), ckpt_owner);
        assert_eq!(std::fs::metadata(&manifest).unwrap().uid(), ckpt_owner);
        remove_in_checkpoints(&ckpt, &ps_dir).unwrap();
        assert!(!ps_dir.exists());
    }

    use super::*;
    use crate::job::Timing;
    use crate::spec::JobSpec;

    #[tokio::test]
    async fn an_acknowledged_change_is_on_disk_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let spec = JobSpec::from_yaml(
            "name: p\nkind: allreduce\nroles:\n  worker: { replicas: 2 }\nworkload:\n  builtin: {}\n\
             data: { num_samples: 100, shard_size: 10 }\ncheckpoint: { dir: /tmp/brain-persist-test }\n",
        )
        .unwrap();
        let (ctx, _) = JobContext::new(spec, "p-1".into(), Timing::default(), 0);
        let job = Arc::new(Mutex::new(ctx));
        let persister = Persister::new(dir.path(), Duration::from_secs(60));
        tokio::spawn(persister.clone().run(job.clone()));
        job.lock().await.fail("for the test".into(), 5);
        persister.durable(persister.changed()).await.unwrap();
        let back = load(persister.path()).unwrap();
        assert_eq!(back, *job.lock().await);
        // Nothing but the context file is left in the directory (the temp file was renamed).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // A damaged file is a clear error.
        std::fs::write(persister.path(), b"{").unwrap();
        assert!(matches!(load(persister.path()), Err(Error::Context { .. })));
    }
}
