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
use crate::flash_write::{Copied, HURRY_AFTER, background_thread, copy_hashed};

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

/// One training process's slots.
#[derive(Clone, Debug)]
pub struct FlashDir {
    pub dir: PathBuf,
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

impl FlashDir {
    /// The slots of process `role`-`index` of run `run` under `root` (on tmpfs: `/dev/shm`),
    /// created owner-only, or adopted from an earlier agent of the same process: a slot it
    /// left `persisting` (it died writing it out) is `ready` again, and so is a replicated
    /// state's copy it wrote out without hearing the job master's answer (`persisted`): it is
    /// written out and reported again, and settled by the answer.
    pub fn open(
        root: &Path,
        run: &str,
        role: &str,
        index: u32,
        budget: u64,
    ) -> Result<Self, Error> {
        let dir = vocab::flash::process_dir(root, run, role, index);
        let held = crate::flash_leftovers::hold(&dir).map(std::sync::Arc::new);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&dir))?;
        let me = Self {
            dir,
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
    pub fn of_process(dir: PathBuf, budget: u64) -> Self {
        Self {
            dir,
            budget,
            _held: None,
        }
    }

    pub fn slot_file(&self, slot: u32) -> PathBuf {
        self.dir.join(format!("slot-{slot}"))
    }

    fn status_file(&self, slot: u32) -> PathBuf {
        self.dir.join(format!("slot-{slot}.json"))
    }

    pub fn status(&self, slot: u32) -> Option<SlotStatus> {
        let text = std::fs::read(self.status_file(slot)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    pub(crate) fn set_status(&self, slot: u32, s: &SlotStatus) -> Result<(), Error> {
        let path = self.status_file(slot);
        let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
        let json = serde_json::to_vec(s).map_err(|e| Error::InvalidRequest(e.to_string()))?;
        std::fs::write(&tmp, json).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
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
        let file = File::open(&path).map_err(io(&path))?;
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
        let dir = checkpoint_dir
            .join("flash")
            .join(format!("step-{:010}", status.step));
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let out = dir.join(format!("part-{}.bin", status.rank));
        let Copied {
            digest,
            bytes,
            hurried,
        } = copy_hashed(&file, &out)?;
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
        let path = self.slot_file(slot);
        let file = File::open(&path).map_err(io(&path))?;
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
            let path = self.slot_file(slot);
            let file = File::open(&path).map_err(io(&path))?;
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

    /// The job is over: its copies go.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The task that writes the copies out and tells the job master (see the module's doc);
/// stopped when dropped.
pub struct Writer(tokio::task::JoinHandle<()>);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Writer {
    /// Starts writing `dir`'s copies of process `role`-`index` out to `checkpoint_dir`.
    pub fn start(
        dir: FlashDir,
        checkpoint_dir: PathBuf,
        mut client: MasterClient,
        role: String,
        index: u32,
    ) -> Writer {
        let background = background_thread(HURRY_AFTER);
        Writer(tokio::spawn(async move {
            loop {
                tokio::time::sleep(WRITE_OUT_EVERY).await;
                let (d, c) = (dir.clone(), checkpoint_dir.clone());
                let (done, written) = tokio::sync::oneshot::channel();
                let job = Box::new(move || {
                    let _ = done.send(d.write_out(&c));
                });
                if background.send(job).is_err() {
                    tracing::warn!("the flash write-out thread is gone: copies stay unwritten");
                    return;
                }
                let w = match written.await {
                    Ok(Ok(Some(w))) => w,
                    Ok(Ok(None)) | Err(_) => continue,
                    Ok(Err(e)) => {
                        tracing::warn!("flash checkpoint not written out: {e}");
                        continue;
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
                let part = pb::CheckpointPart {
                    process: Some(pb::ProcessRef {
                        role: role.clone(),
                        index,
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
                for _ in 0..10 {
                    match client.report_checkpoint_part(part.clone()).await {
                        Ok(_) => {
                            // One part is the whole step: the master has committed it.
                            if part.parts == 1 {
                                settle(&dir, &w, true).await;
                            }
                            break;
                        }
                        Err(s) if s.code() == tonic::Code::Unavailable => {
                            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        }
                        Err(s) => {
                            tracing::warn!(
                                step = part.step,
                                "the job master refused the part: {s}"
                            );
                            if part.parts == 1 {
                                settle(&dir, &w, false).await;
                            }
                            break;
                        }
                    }
                }
            }
        }))
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
        let dir = FlashDir::open(shm.path(), "run/1", "worker", 1, 1 << 20).unwrap();
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
        let dir = FlashDir::open(shm.path(), "r", "worker", 1, 1 << 20).unwrap();
        let step = ckpt.path().join("flash/step-0000000020");
        std::fs::create_dir_all(&step).unwrap();
        let prefix = tmp_prefix(&step.join("part-1.bin"));
        // A process that ran here and is gone, one that runs (pid 1), another node's agent.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let left = [
            format!("{prefix}{}", gone.id()),
            format!("{prefix}1"),
            format!("part-1.bin.tmp-elsewhere-{}", gone.id()),
            format!("{}{}", tmp_prefix(&step.join("part-0.bin")), gone.id()),
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
        let dir = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20).unwrap();
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
        let dir = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20).unwrap();
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
        let again = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20).unwrap();
        assert_eq!(again.status(1).unwrap().state, "ready");
        assert_eq!(again.status(0).unwrap().state, "refused");
        // A shard's part written out stays so: its step is committed with the other parts.
        let shard = FlashDir::open(shm.path(), "r", "worker", 2, 1 << 20).unwrap();
        ready(&shard, 0, 1, 10, b"shard");
        shard.write_out(ckpt.path()).unwrap().unwrap();
        let again = FlashDir::open(shm.path(), "r", "worker", 2, 1 << 20).unwrap();
        assert_eq!(again.status(0).unwrap().state, "persisted");
    }

    #[test]
    fn an_agent_that_died_writing_out_leaves_the_copy_to_the_next_one() {
        let shm = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20).unwrap();
        ready(&dir, 0, 1, 10, b"state");
        let mut s = dir.status(0).unwrap();
        s.state = "persisting".into();
        dir.set_status(0, &s).unwrap();
        let again = FlashDir::open(shm.path(), "r", "worker", 0, 1 << 20).unwrap();
        assert_eq!(again.status(0).unwrap().state, "ready");
    }

    #[test]
    fn a_copy_kept_in_memory_only_is_not_written_out() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let dir = FlashDir::open(shm.path(), "r", "worker", 1, 1 << 20).unwrap();
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
        let dir = FlashDir::open(shm.path(), "r", "worker", 1, 1 << 20).unwrap();
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
}
