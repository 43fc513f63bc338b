//! Durable, atomic persistence of the job context with group commit.
//!
//! A change bumps a generation number and wakes the writer task; the writer serialises the
//! newest state, writes it to a temporary file in the same directory, fsyncs it and renames it
//! over `job-context.json`, so a reader sees the old or the new context, never half of one.
//! Callers wait until their generation is on disk before they answer, so an acknowledged change
//! survives a crash; concurrent changes share one write.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{Mutex, Notify, watch};

use crate::error::Error;
use crate::job::JobContext;

pub use vocab::run_dir::CONTEXT_FILE;

pub struct Persister {
    path: PathBuf,
    wanted: std::sync::atomic::AtomicU64,
    wake: Notify,
    written: watch::Sender<(u64, Option<String>)>,
}

impl Persister {
    pub fn new(run_dir: &Path) -> Arc<Self> {
        Arc::new(Self {
            path: run_dir.join(CONTEXT_FILE),
            wanted: 0.into(),
            wake: Notify::new(),
            written: watch::channel((0, None)).0,
        })
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
        loop {
            let target = self.wanted.load(std::sync::atomic::Ordering::SeqCst);
            if target > self.written.borrow().0 {
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
                        self.written.send_replace((target, None));
                    }
                    Err(e) => {
                        tracing::error!(path = %self.path.display(), "cannot persist job context: {e}");
                        // Read first: holding a borrow while sending would deadlock on the watch's lock.
                        let done = self.written.borrow().0;
                        self.written.send_replace((done, Some(e.to_string())));
                    }
                }
                continue;
            }
            self.wake.notified().await;
        }
    }
}

/// The owner a master running as root gives what it makes in `dir` to: `dir`'s, when that is
/// not root (a checkpoint directory belongs to the user the job's processes run as,
/// `[launcher.sandbox] run_as`). None: keep the master's own.
fn owner_for(dir: &Path) -> std::io::Result<Option<(nix::unistd::Uid, nix::unistd::Gid)>> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let m = std::fs::metadata(dir)?;
    Ok((m.uid() != 0).then(|| {
        (
            nix::unistd::Uid::from_raw(m.uid()),
            nix::unistd::Gid::from_raw(m.gid()),
        )
    }))
}

/// Gives the checkpoint directory `dir` to the user the job's processes run as
/// ([`vocab::sandbox::Sandbox::run_as`] of `sandbox`, the JSON the brain hands the master in
/// [`vocab::sandbox::SANDBOX_ENV`]) when the master runs as root, as each agent does before it
/// starts a process: what the master writes there before any process started (a cut while
/// every process still waits for room) is then the processes' to read, not root's alone.
/// Nothing changes without a sandbox user; a user this machine does not have is left to the
/// agents to refuse, with the reason.
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
        Some(u) if !u.uid.is_root() => {
            nix::unistd::chown(dir, Some(u.uid), Some(u.gid)).map_err(std::io::Error::from)
        }
        _ => {
            tracing::warn!(
                "run_as: no unprivileged user named {name:?} here; {} stays the master's",
                dir.display()
            );
            Ok(())
        }
    }
}

/// Makes the directory `dir` inside an existing one for the job's processes to write in (a
/// parameter server's checkpoint part): a master running as root gives it to the owner of the
/// directory above, as [`write_atomic`] gives files.
pub fn create_dir_for_processes(dir: &Path) -> std::io::Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some((uid, gid)) = owner_for(parent)? {
        nix::unistd::chown(dir, Some(uid), Some(gid)).map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically and durably (temp file, fsync, rename, fsync dir). A
/// master running as root gives the file to the directory's owner: a checkpoint directory
/// belongs to the user the job's processes run as (`[launcher.sandbox] run_as`), who must read
/// the manifests written there.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    if let Some((uid, gid)) = owner_for(dir)? {
        nix::unistd::fchown(tmp.as_file(), Some(uid), Some(gid)).map_err(std::io::Error::from)?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
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
        let persister = Persister::new(dir.path());
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
