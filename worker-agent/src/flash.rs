//! Flash checkpoints, the agent's half. The training process copies its state into one of two
//! slots in shared memory that this agent holds (`python/brain_sdk/flash.py` has the format)
//! and goes on training; the agent writes the newest copy that is ready out to the checkpoint
//! directory behind it, with its SHA-256, and tells the job master, which commits the step once
//! every part of it is written. The slots outlive the training process (a process restarted
//! here restores from them) and an agent killed -9 (the next agent of the same process adopts
//! them); the agent removes them when the job ends, and an agent starting on the node removes
//! what no agent has held for a while (`flash_leftovers.rs`).
//!
//! A slot is changed only under an exclusive `flock` on its file: the process while it copies
//! in, the agent while it writes out. The agent never touches a slot being copied into and the
//! process never one being written out, so a written-out file is one whole step.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use proto::jobmaster::v1 as pb;

use crate::agent::MasterClient;
use crate::error::Error;
use crate::flash_write::{Copied, HURRY_AFTER, Job, background_thread, copy_hashed};
use vocab::beneath::{Beneath, Owner};

/// Slots per process: the copy being written out and the next one.
pub const SLOTS: u32 = 2;
/// The environment variables the process finds its slots and their budget in.
pub const DIR_ENV: &str = "BRAIN_FLASH_DIR";
pub const BUDGET_ENV: &str = "BRAIN_FLASH_BUDGET";
/// How often the agent looks for a copy to write out.
const WRITE_OUT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A slot's state, `slot-N.json` beside its file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotStatus {
    /// `writing` (the process copies in), `ready` (whole, to be written out), `persisting`
    /// (the agent writes it out), `persisted` (on disk: `path`, `digest`), `committed` (the
    /// job master committed it: the process keeps it), `kept` (a copy kept in memory only:
    /// another rank writes the step out).
    pub state: String,
    pub save: u64,
    pub step: u64,
    pub rank: u32,
    pub world: u32,
    /// The incarnation of the process that made the copy.
    #[serde(default)]
    pub incarnation: u64,
    /// Whether this copy is written out (a replicated state is written by rank 0 only).
    #[serde(default)]
    pub persist: bool,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
}

/// A part written out: what the job master is told.
#[derive(Clone, Debug, PartialEq)]
pub struct Written {
    pub step: u64,
    pub rank: u32,
    pub world: u32,
    pub save: u64,
    pub incarnation: u64,
    /// The slot it was written out of.
    pub slot: u32,
    pub path: PathBuf,
    pub digest: String,
    pub bytes: u64,
    pub took: std::time::Duration,
    /// Its rest went on at a higher priority after it ran `flash_write::HURRY_AFTER`.
    pub hurried: bool,
}

/// One training process's slots. The agent, root where jobs run as another user, reaches
/// everything in the process's directory through the open directory ([`Beneath`]): the
/// process writes there, and may plant links.
#[derive(Clone, Debug)]
pub struct FlashDir {
    pub dir: PathBuf,
    open: std::sync::Arc<Beneath>,
    pub budget: u64,
    /// This agent's hold on the directory, for as long as it runs (`flash_leftovers.rs`).
    _held: Option<std::sync::Arc<crate::flash_leftovers::Held>>,
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The most a slot's status file may hold (it is a few hundred bytes of JSON).
const STATUS_LIMIT: u64 = 64 * 1024;

/// The flash root under `root` for this agent: made by it, its user's alone (mode 0711: a
/// process reaches its own directory in it by name, nobody lists or adds to it), refused when
/// somebody else made it first.
pub fn open_root(root: &Path) -> Result<Beneath, Error> {
    Beneath::private(root, 0o711).map_err(io(root))
}

impl FlashDir {
    /// The slots of process `role`-`index` of run `run` under `root` (on tmpfs: `/dev/shm`),
    /// created owner-only and given to `owner` (the job's user), or adopted from an earlier
    /// agent of the same process: a slot it left `persisting` (it died writing it out) is
    /// `ready` again, and so is a replicated state's copy it wrote out without hearing the job
    /// master's answer (`persisted`): it is written out and reported again, and settled by the
    /// answer. The root must be this agent's user's alone ([`open_root`]); the run's directory
    /// in it is the agent's too, so that the process's own directory cannot be swapped.
    pub fn open(
        root: &Path,
        run: &str,
        role: &str,
        index: u32,
        budget: u64,
        owner: Owner,
    ) -> Result<Self, Error> {
        let dir = vocab::flash::process_dir(root, run, role, index);
        let root = open_root(root)?;
        let run_name = vocab::flash::run_name(run);
        let name = vocab::flash::process_name(role, index);
        // Held first (a sweep may move a directory away until then), then opened.
        let (run_dir, held) = crate::flash_leftovers::make_and_hold(&root, &run_name, &name)
            .map_err(io(&root.join(&run_name)))?;
        let held = held.map(std::sync::Arc::new);
        let (open, _) = run_dir.make_dir(&name, 0o700, None).map_err(io(&dir))?;
        if let Some((uid, gid)) = owner {
            open.chown(uid, gid).map_err(io(&dir))?;
        }
        let me = Self {
            dir,
            open: std::sync::Arc::new(open),
            budget,
            _held: held,
        };
        for slot in 0..SLOTS {
            if let Some(mut s) = me.status(slot)
                && (s.state == "persisting" || (s.state == "persisted" && s.world == 1))
            {
                s.state = "ready".into();
                me.set_status(slot, &s)?;
            }
        }
        Ok(me)
    }

    /// The slots at `dir` as the training process sees them (`flash_copy.rs`): the agent holds
    /// the directory, not the process.
    pub fn of_process(dir: PathBuf, budget: u64) -> Result<Self, Error> {
        let open = Beneath::open(&dir).map_err(io(&dir))?;
        Ok(Self {
            dir,
            open: std::sync::Arc::new(open),
            budget,
            _held: None,
        })
    }

    fn slot_name(slot: u32) -> String {
        format!("slot-{slot}")
    }

    fn status_name(slot: u32) -> String {
        format!("slot-{slot}.json")
    }

    pub fn slot_file(&self, slot: u32) -> PathBuf {
        self.dir.join(Self::slot_name(slot))
    }

    /// Who what the agent writes here is given to: the directory's owner (the job's user), so
    /// that the process reads it.
    fn owner(&self) -> Owner {
        owner_of(&self.open)
    }

    pub fn status(&self, slot: u32) -> Option<SlotStatus> {
        let text = self
            .open
            .read(&Self::status_name(slot), STATUS_LIMIT)
            .ok()?;
        serde_json::from_slice(&text).ok()
    }

    pub(crate) fn set_status(&self, slot: u32, s: &SlotStatus) -> Result<(), Error> {
        let name = Self::status_name(slot);
        let json = serde_json::to_vec(s).map_err(|e| Error::InvalidRequest(e.to_string()))?;
        self.open
            .replace(&name, &json, 0o600, self.owner())
            .map_err(io(&self.dir.join(&name)))
    }

    /// Slot `slot`'s file, opened for reading through the open directory (a link, a FIFO or a
    /// second name of another file there is refused).
    fn open_slot(&self, slot: u32) -> Result<File, Error> {
        let name = Self::slot_name(slot);
        self.open
            .open_read(&name)
            .map_err(io(&self.dir.join(&name)))
    }

    /// The newest ready copy, written out to `checkpoint_dir` (`flash/step-S/part-R.bin`, by a
    /// temporary name, synced, renamed), its slot marked `persisted`; a copy kept in memory
    /// only is marked `kept`. `None` when nothing is ready, or the process holds the slot.
    pub fn write_out(&self, checkpoint_dir: &Path) -> Result<Option<Written>, Error> {
        let newest = (0..SLOTS)
            .filter_map(|s| self.status(s).map(|st| (s, st)))
            .filter(|(_, st)| st.state == "ready")
            .max_by_key(|(_, st)| st.save);
        let Some((slot, _)) = newest else {
            return Ok(None);
        };
        let path = self.slot_file(slot);
        let file = self.open_slot(slot)?;
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(f) => f,
            // The process is copying into it: next time.
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(io(&path)(e.into())),
        };
        // Under the lock, it is what it was (or the process replaced it: next time).
        let Some(mut status) = self.status(slot).filter(|s| s.state == "ready") else {
            return Ok(None);
        };
        if !status.persist {
            status.state = "kept".into();
            self.set_status(slot, &status)?;
            return Ok(None);
        }
        status.state = "persisting".into();
        self.set_status(slot, &status)?;
        let started = std::time::Instant::now();
        let (dir, owner) = step_dir(checkpoint_dir, status.step)?;
        let name = format!("part-{}.bin", status.rank);
        let out = dir.join(&name);
        let Copied {
            digest,
            bytes,
            hurried,
        } = copy_hashed(&file, &dir, &name, owner)?;
        status.state = "persisted".into();
        status.digest = digest.clone();
        status.path = out.to_string_lossy().into_owned();
        self.set_status(slot, &status)?;
        drop(file);
        Ok(Some(Written {
            step: status.step,
            rank: status.rank,
            world: status.world,
            save: status.save,
            incarnation: status.incarnation,
            slot,
            path: out,
            digest,
            bytes,
            took: started.elapsed(),
            hurried,
        }))
    }

    /// The job master answered for the copy of save `save` in `slot` (a replicated state: its
    /// one part): `committed` (the process keeps it from then on: a restart here restores
    /// from it) or refused (`refused`: the process may reuse the slot). Left as it is when the
    /// process holds the slot or has replaced the copy.
    pub fn settled(&self, slot: u32, save: u64, committed: bool) -> Result<(), Error> {
        let file = self.open_slot(slot)?;
        let Ok(_held) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            return Ok(());
        };
        match self.status(slot) {
            Some(mut s) if s.save == save && s.state == "persisted" => {
                s.state = if committed { "committed" } else { "refused" }.into();
                self.set_status(slot, &s)
            }
            _ => Ok(()),
        }
    }

    /// The job master committed `step` (its heartbeat says so): a copy of it this agent wrote
    /// out is committed, whichever rank's part completed the step. A sharded step's other
    /// parts' agents hear it only so; without it they would keep their newest copy written
    /// out, and a process saving again before the last part lands would give up the copy of
    /// the step a restart here restores from. A slot being copied into or written out is left
    /// (the next heartbeat says it again).
    pub fn mark_committed(&self, step: u64) -> Result<(), Error> {
        for slot in 0..SLOTS {
            let Some(s) = self.status(slot) else {
                continue;
            };
            if s.step != step || s.state != "persisted" {
                continue;
            }
            self.settled(slot, s.save, true)?;
        }
        Ok(())
    }

    /// The job master asks this process's copy of `step` kept in memory (a replicated state,
    /// written out by rank 0) to be written out too: a plan moved rank 0 of that cut, and this
    /// process leads the round after. The copy becomes part 0 of the step, ready for
    /// [`Self::write_out`]. Left as it is when the process holds the slot (the next heartbeat
    /// says it again), or when no such copy is here. Whether one was made ready.
    pub fn persist_kept(&self, step: u64) -> Result<bool, Error> {
        for slot in 0..SLOTS {
            let kept = |s: &SlotStatus| s.step == step && s.state == "kept" && s.world == 1;
            if !self.status(slot).is_some_and(|s| kept(&s)) {
                continue;
            }
            let file = self.open_slot(slot)?;
            let Ok(_held) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                return Ok(false);
            };
            let Some(mut s) = self.status(slot).filter(kept) else {
                return Ok(false);
            };
            (s.state, s.persist, s.rank) = ("ready".into(), true, 0);
            self.set_status(slot, &s)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// The job is over: its copies go (`remove_dir_all` removes links, never follows them).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory step `step`'s parts go in, `flash/step-S` in the job's checkpoint directory,
/// made when missing, and who what is made there is given to (the checkpoint directory's
/// owner, the job's user, when this agent is root: the job's processes restore from it, and
/// nobody else reads it). Every directory on the way is reached by name through the one above
/// it, a link refused; the checkpoint directory itself is opened with a link at its own name
/// refused (the directory above it is the brain's, not the job's).
fn step_dir(checkpoint_dir: &Path, step: u64) -> Result<(Beneath, Owner), Error> {
    let root = Beneath::open(checkpoint_dir).map_err(io(checkpoint_dir))?;
    let owner = owner_of(&root);
    let (flash, _) = root
        .make_dir("flash", 0o700, owner)
        .map_err(io(&root.join("flash")))?;
    let name = format!("step-{step:010}");
    let (dir, _) = flash
        .make_dir(&name, 0o700, owner)
        .map_err(io(&flash.join(&name)))?;
    Ok((dir, owner))
}

/// Who what a root agent makes in `dir` is given to: `dir`'s owner when that is not root.
fn owner_of(dir: &Beneath) -> Owner {
    let st = dir.stat().ok()?;
    (nix::unistd::geteuid().is_root() && st.st_uid != 0).then(|| {
        (
            nix::unistd::Uid::from_raw(st.st_uid),
            nix::unistd::Gid::from_raw(st.st_gid),
        )
    })
}

/// The task that writes the copies out and tells the job master (see the module's doc);
/// stopped when dropped.
pub struct Writer {
    task: tokio::task::JoinHandle<()>,
    flush: tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one pass of the write-out did.
enum Pass {
    /// A copy was written out (and reported): there may be another.
    Wrote,
    /// Nothing was ready (or the write-out failed, said in the log).
    Nothing,
    /// The write-out thread is gone.
    Gone,
}

impl Writer {
    /// Starts writing `dir`'s copies of process `role`-`index` out to `checkpoint_dir`.
    pub fn start(
        dir: FlashDir,
        checkpoint_dir: PathBuf,
        client: MasterClient,
        role: String,
        index: u32,
    ) -> Writer {
        let (flush, mut asked) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>(4);
        let task = tokio::spawn(async move {
            let out = WriteOut {
                dir,
                checkpoint_dir,
                client,
                role,
                index,
                background: background_thread(HURRY_AFTER),
            };
            let mut waiting = Vec::new();
            loop {
                if waiting.is_empty() {
                    tokio::select! {
                        _ = tokio::time::sleep(WRITE_OUT_EVERY) => {}
                        Some(w) = asked.recv() => waiting.push(w),
                    }
                }
                match out.pass().await {
                    Pass::Wrote => {}
                    Pass::Nothing => {
                        for w in waiting.drain(..) {
                            let _ = w.send(());
                        }
                    }
                    Pass::Gone => return,
                }
            }
        });
        Writer { task, flush }
    }

    /// Returns once every copy that is ready is written out and reported to the job master
    /// (or its write-out failed, or the writer is gone): what the agent waits for before it
    /// reports its process's exit, so that a copy made just before the end is committed while
    /// the job is still running.
    pub async fn flush(&self) {
        let (done, flushed) = tokio::sync::oneshot::channel();
        if self.flush.send(done).await.is_ok() {
            let _ = flushed.await;
        }
    }
}

/// The writer task's parts.
struct WriteOut {
    dir: FlashDir,
    checkpoint_dir: PathBuf,
    client: MasterClient,
    role: String,
    index: u32,
    background: std::sync::mpsc::Sender<Job>,
}

impl WriteOut {
    /// The newest ready copy written out on the write-out thread and reported.
    async fn pass(&self) -> Pass {
        let (d, c) = (self.dir.clone(), self.checkpoint_dir.clone());
        let (done, written) = tokio::sync::oneshot::channel();
        let job = Box::new(move || {
            let _ = done.send(d.write_out(&c));
        });
        if self.background.send(job).is_err() {
            tracing::warn!("the flash write-out thread is gone: copies stay unwritten");
            return Pass::Gone;
        }
        let w = match written.await {
            Ok(Ok(Some(w))) => w,
            Ok(Ok(None)) | Err(_) => return Pass::Nothing,
            Ok(Err(e)) => {
                tracing::warn!("flash checkpoint not written out: {e}");
                return Pass::Nothing;
            }
        };
        tracing::info!(
            step = w.step,
            rank = w.rank,
            bytes = w.bytes,
            ms = w.took.as_millis() as u64,
            hurried = w.hurried,
            path = %w.path.display(),
            "flash checkpoint part written out"
        );
        self.report(&w).await;
        Pass::Wrote
    }

    /// Tells the job master of the part `w` (retrying while it is unavailable), and marks
    /// its slot with the answer where the part is the whole step.
    async fn report(&self, w: &Written) {
        let part = pb::CheckpointPart {
            process: Some(pb::ProcessRef {
                role: self.role.clone(),
                index: self.index,
                incarnation: w.incarnation,
            }),
            step: w.step,
            rank: w.rank,
            parts: w.world,
            path: w.path.to_string_lossy().into_owned(),
            digest: w.digest.clone(),
            bytes: w.bytes,
            hurried: w.hurried,
        };
        let mut client = self.client.clone();
        for _ in 0..10 {
            match client.report_checkpoint_part(part.clone()).await {
                Ok(_) => {
                    // One part is the whole step: the master has committed it.
                    if part.parts == 1 {
                        settle(&self.dir, w, true).await;
                    }
                    return;
                }
                Err(s) if s.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(s) => {
                    tracing::warn!(step = part.step, "the job master refused the part: {s}");
                    if part.parts == 1 {
                        settle(&self.dir, w, false).await;
                    }
                    return;
                }
            }
        }
    }
}

/// Marks the slot of `w` with the job master's answer (see [`FlashDir::settled`]).
async fn settle(dir: &FlashDir, w: &Written, committed: bool) {
    let (d, slot, save) = (dir.clone(), w.slot, w.save);
    let _ = tokio::task::spawn_blocking(move || d.settled(slot, save, committed)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash_write::tmp_prefix;
    use sha2::{Digest, Sha256};

    fn ready(dir: &FlashDir, slot: u32, save: u64, step: u64, body: &[u8]) {
        std::fs::write(dir.slot_file(slot), body).unwrap();
        dir.set_status(
            slot,
            &SlotStatus {
                state: "ready".into(),
                save,
                step,
                rank: 1,
                world: 2,
                persist: true,
                bytes: body.len() as u64,
                ..Default::default()
            },
        )
        .unwrap();
    }

    #[test]
    fn the_newest_ready_copy_is_written_out_whole_with_its_digest() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "run/1", "worker", 1, 1 << 20, None).unwrap();
        assert!(
            dir.write_out(ckpt.path()).unwrap().is_none(),
            "nothing ready"
        );
        ready(&dir, 0, 1, 10, b"older");
        ready(&dir, 1, 2, 20, b"newer");
        let w = dir.write_out(ckpt.path()).unwrap().unwrap();
        assert_eq!((w.step, w.rank, w.world, w.save, w.bytes), (20, 1, 2, 2, 5));
        assert_eq!(std::fs::read(&w.path).unwrap(), b"newer");
        assert!(
            w.path.ends_with("flash/step-0000000020/part-1.bin"),
            "{:?}",
            w.path
        );
        let sha = hex::encode(Sha256::digest(b"newer"));
        assert_eq!(w.digest, sha);
        let s = dir.status(1).unwrap();
        assert_eq!(
            (s.state.as_str(), s.digest.as_str()),
            ("persisted", sha.as_str())
        );
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(w.path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn what_an_agent_killed_mid_write_left_here_is_removed_and_nothing_else() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 1, 1 << 20, None).unwrap();
        let step = ckpt.path().join("flash/step-0000000020");
        std::fs::create_dir_all(&step).unwrap();
        let prefix = tmp_prefix("part-1.bin");
        // A process that ran here and is gone, one that runs (pid 1), another node's agent.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let left = [
            format!("{prefix}{}", gone.id()),
            format!("{prefix}1"),
            format!("part-1.bin.tmp-elsewhere-{}", gone.id()),
            format!("{}{}", tmp_prefix("part-0.bin"), gone.id()),
        ];
        for name in &left {
            std::fs::write(step.join(name), b"half").unwrap();
        }
        ready(&dir, 0, 1, 20, b"whole");
        let w = dir.write_out(ckpt.path()).unwrap().unwrap();
        assert_eq!(std::fs::read(&w.path).unwrap(), b"whole");
        let mut names: Vec<String> = std::fs::read_dir(&step)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut kept = vec![
            "part-1.bin".to_string(),
            left[1].clone(),
            left[2].clone(),
            left[3].clone(),
        ];
        kept.sort();
        // Only this part's own leftover from a dead agent of this node goes.
        assert_eq!(names, kept);
    }

    #[test]
    fn a_slot_the_process_holds_is_left_for_later() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20, None).unwrap();
        ready(&dir, 0, 1, 10, b"state");
        let held = Flock::lock(
            File::open(dir.slot_file(0)).unwrap(),
            FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        assert!(dir.write_out(ckpt.path()).unwrap().is_none());
        assert_eq!(dir.status(0).unwrap().state, "ready");
        drop(held);
        let w = dir.write_out(ckpt.path()).unwrap().unwrap();
        dir.settled(w.slot, w.save + 1, true).unwrap();
        assert_eq!(
            dir.status(0).unwrap().state,
            "persisted",
            "another save's commit"
        );
        dir.settled(w.slot, w.save, true).unwrap();
        assert_eq!(dir.status(0).unwrap().state, "committed");
    }

    #[test]
    fn a_refused_copy_is_marked_so_and_one_never_answered_is_reported_again() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20, None).unwrap();
        ready(&dir, 0, 1, 10, b"state");
        let w = dir.write_out(ckpt.path()).unwrap().unwrap();
        dir.settled(w.slot, w.save, false).unwrap();
        assert_eq!(dir.status(0).unwrap().state, "refused");
        // An agent that died before the master's answer: its successor writes the copy out
        // and reports it again.
        ready(&dir, 1, 2, 20, b"later");
        let mut s = dir.status(1).unwrap();
        (s.rank, s.world) = (0, 1);
        dir.set_status(1, &s).unwrap();
        dir.write_out(ckpt.path()).unwrap().unwrap();
        assert_eq!(dir.status(1).unwrap().state, "persisted");
        let again = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20, None).unwrap();
        assert_eq!(again.status(1).unwrap().state, "ready");
        assert_eq!(again.status(0).unwrap().state, "refused");
        // A shard's part written out stays so: its step is committed with the other parts.
        let shard = FlashDir::open(shm.path(), "r", "worker", 2, 1 << 20, None).unwrap();
        ready(&shard, 0, 1, 10, b"shard");
        shard.write_out(ckpt.path()).unwrap().unwrap();
        let again = FlashDir::open(shm.path(), "r", "worker", 2, 1 << 20, None).unwrap();
        assert_eq!(again.status(0).unwrap().state, "persisted");
    }

    #[test]
    fn an_agent_that_died_writing_out_leaves_the_copy_to_the_next_one() {
        let shm = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20, None).unwrap();
        ready(&dir, 0, 1, 10, b"state");
        let mut s = dir.status(0).unwrap();
        s.state = "persisting".into();
        dir.set_status(0, &s).unwrap();
        let again = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20, None).unwrap();
        assert_eq!(again.status(0).unwrap().state, "ready");
    }

    #[test]
    fn a_copy_kept_in_memory_only_is_not_written_out() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 1, 1 << 20, None).unwrap();
        ready(&dir, 0, 1, 10, b"state");
        let mut s = dir.status(0).unwrap();
        s.persist = false;
        dir.set_status(0, &s).unwrap();
        assert!(dir.write_out(ckpt.path()).unwrap().is_none());
        assert_eq!(dir.status(0).unwrap().state, "kept");
        assert!(!ckpt.path().join("flash").exists());
    }

    #[test]
    fn a_kept_copy_the_master_asks_for_is_written_out_as_the_step_s_part_0() {
        // Rank 1's copy of a replicated state at step 10, kept in memory; rank 0 was moved.
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 1, 1 << 20, None).unwrap();
        ready(&dir, 0, 1, 10, b"state at 10");
        let mut s = dir.status(0).unwrap();
        (s.persist, s.world) = (false, 1);
        dir.set_status(0, &s).unwrap();
        assert!(dir.write_out(ckpt.path()).unwrap().is_none());
        // Another step, or the process copying into the slot: nothing happens.
        assert!(!dir.persist_kept(9).unwrap());
        let file = File::open(dir.slot_file(0)).unwrap();
        let held = Flock::lock(file, FlockArg::LockExclusive).unwrap();
        assert!(!dir.persist_kept(10).unwrap());
        drop(held);
        assert_eq!(dir.status(0).unwrap().state, "kept");
        assert!(dir.persist_kept(10).unwrap());
        let w = dir.write_out(ckpt.path()).unwrap().unwrap();
        assert_eq!((w.step, w.rank, w.world), (10, 0, 1));
        assert!(w.path.ends_with("flash/step-0000000010/part-0.bin"));
        assert_eq!(std::fs::read(&w.path).unwrap(), b"state at 10");
        assert!(!dir.persist_kept(10).unwrap(), "once");
    }

    /// A secret of root's outside the job's directories, and the directories' listing after.
    fn planted_target(d: &Path) -> (PathBuf, PathBuf) {
        let outside = d.join("brain-data");
        std::fs::create_dir(&outside).unwrap();
        let secret = outside.join("operator.token");
        std::fs::write(&secret, b"the operator's token").unwrap();
        (outside, secret)
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Attack 1a: the job links its slot to a secret and marks it ready; the agent refuses
    /// it, and nothing of the secret is written out.
    #[test]
    fn a_slot_linked_to_a_secret_is_refused_and_nothing_of_it_is_written_out() {
        let d = tempfile::tempdir().unwrap();
        let (outside, secret) = planted_target(d.path());
        let (shm, ckpt) = (d.path().join("shm"), d.path().join("ckpt"));
        std::fs::create_dir_all(&ckpt).unwrap();
        let dir = FlashDir::open(&shm, "r", "worker", 0, 1 << 20, None).unwrap();
        ready(&dir, 0, 1, 10, b"state");
        std::fs::remove_file(dir.slot_file(0)).unwrap();
        std::os::unix::fs::symlink(&secret, dir.slot_file(0)).unwrap();
        let e = dir.write_out(&ckpt).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // A second name of the secret (a hard link, where the file system allows it) too.
        std::fs::remove_file(dir.slot_file(0)).unwrap();
        if std::fs::hard_link(&secret, dir.slot_file(0)).is_ok() {
            let e = dir.write_out(&ckpt).unwrap_err().to_string();
            assert!(e.contains("links"), "{e}");
        }
        // The status file linked to the secret: not read as a status.
        std::fs::remove_file(dir.dir.join("slot-1.json")).ok();
        std::os::unix::fs::symlink(&secret, dir.dir.join("slot-1.json")).unwrap();
        assert_eq!(dir.status(1), None);
        assert!(!ckpt.join("flash/step-0000000010/part-1.bin").exists());
        assert_eq!(std::fs::read(&secret).unwrap(), b"the operator's token");
        assert_eq!(listing(&outside), ["operator.token"]);
    }

    /// Attack 1b: the job plants links where the agent makes the step's directory, the
    /// part's temporary name and the status' temporary name; nothing outside is written,
    /// the planted names are refused or replaced, and the job's own directory gets the part.
    #[test]
    fn links_planted_where_the_agent_writes_lead_nowhere() {
        let d = tempfile::tempdir().unwrap();
        let (outside, secret) = planted_target(d.path());
        let (shm, ckpt) = (d.path().join("shm"), d.path().join("ckpt"));
        std::fs::create_dir_all(&ckpt).unwrap();
        let dir = FlashDir::open(&shm, "r", "worker", 0, 1 << 20, None).unwrap();
        // `flash` itself a link to the brain's directory.
        std::os::unix::fs::symlink(&outside, ckpt.join("flash")).unwrap();
        ready(&dir, 0, 1, 10, b"job bytes");
        let e = dir.write_out(&ckpt).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // The step's directory a link.
        std::fs::remove_file(ckpt.join("flash")).unwrap();
        std::fs::create_dir(ckpt.join("flash")).unwrap();
        let step = ckpt.join("flash/step-0000000010");
        std::os::unix::fs::symlink(&outside, &step).unwrap();
        ready(&dir, 0, 2, 10, b"job bytes");
        let e = dir.write_out(&ckpt).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // Every temporary name the agent could use a link to the secret (for this pid and
        // for pids around it), and the part's own name too.
        std::fs::remove_file(&step).unwrap();
        std::fs::create_dir(&step).unwrap();
        let prefix = tmp_prefix("part-1.bin");
        let me = std::process::id();
        for pid in me.saturating_sub(5)..me + 5 {
            std::os::unix::fs::symlink(&secret, step.join(format!("{prefix}{pid}"))).unwrap();
            for n in 0..20 {
                let status_tmp = dir.dir.join(format!(".slot-0.json.tmp-{pid}-{n}"));
                std::os::unix::fs::symlink(&secret, status_tmp).unwrap();
            }
        }
        std::os::unix::fs::symlink(&secret, step.join("part-1.bin")).unwrap();
        ready(&dir, 0, 3, 10, b"job bytes");
        let w = dir.write_out(&ckpt).unwrap().unwrap();
        assert_eq!(std::fs::read(&w.path).unwrap(), b"job bytes");
        assert!(!std::fs::symlink_metadata(&w.path).unwrap().is_symlink());
        assert_eq!(dir.status(0).unwrap().state, "persisted");
        assert_eq!(std::fs::read(&secret).unwrap(), b"the operator's token");
        assert_eq!(listing(&outside), ["operator.token"]);
    }

    /// Attack 3: a local user makes the flash root before any agent does; the agent refuses
    /// it (it would write its slots' status where that user steers it) and says why.
    #[test]
    fn a_flash_root_somebody_else_made_first_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let shm = d.path().join("brain-flash");
        std::fs::create_dir(&shm).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = FlashDir::open(&shm, "r", "worker", 0, 1 << 20, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("somebody else may have made it first"), "{e}");
        assert_eq!(
            std::fs::read_dir(&shm).unwrap().count(),
            0,
            "nothing made in it"
        );
        if nix::unistd::geteuid().is_root()
            && let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody")
        {
            std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o700)).unwrap();
            nix::unistd::chown(&shm, Some(nobody.uid), Some(nobody.gid)).unwrap();
            let e = FlashDir::open(&shm, "r", "worker", 0, 1 << 20, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("owned by uid"), "{e}");
        }
        // The agent's own root is taken, mode 0711.
        std::fs::remove_dir(&shm).unwrap();
        FlashDir::open(&shm, "r", "worker", 0, 1 << 20, None).unwrap();
        let mode = std::fs::metadata(&shm).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o711);
    }

    /// Flash through a sandbox: as root with a job's user, the process's directory, the
    /// status files, the step's directory and its parts are that user's, and nobody else's
    /// to read.
    #[test]
    fn what_a_root_agent_makes_for_a_job_is_the_job_user_s_alone() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
            return;
        };
        let d = tempfile::tempdir().unwrap();
        let (shm, ckpt) = (d.path().join("shm"), d.path().join("ckpt"));
        std::fs::create_dir_all(&ckpt).unwrap();
        nix::unistd::chown(&ckpt, Some(nobody.uid), Some(nobody.gid)).unwrap();
        let owner = Some((nobody.uid, nobody.gid));
        let dir = FlashDir::open(&shm, "r", "worker", 0, 1 << 20, owner).unwrap();
        ready(&dir, 0, 1, 10, b"state");
        nix::unistd::chown(&dir.slot_file(0), Some(nobody.uid), Some(nobody.gid)).unwrap();
        let w = dir.write_out(&ckpt).unwrap().unwrap();
        for p in [
            dir.dir.clone(),
            dir.dir.join("slot-0.json"),
            ckpt.join("flash"),
            w.path.parent().unwrap().to_path_buf(),
            w.path.clone(),
        ] {
            let m = std::fs::metadata(&p).unwrap();
            assert_eq!(m.uid(), nobody.uid.as_raw(), "{}", p.display());
            assert_eq!(m.mode() & 0o077, 0, "{}: {:o}", p.display(), m.mode());
        }
    }
}
