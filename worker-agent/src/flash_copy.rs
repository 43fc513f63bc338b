//! Flash checkpoints, the training process's half for the built-in workload (a script's is
//! `python/brain_sdk/flash.py`, with the same slots and states). The process copies its state
//! into one of the two slots its agent holds in shared memory (`BRAIN_FLASH_DIR`, at most
//! `BRAIN_FLASH_BUDGET` bytes for both) and goes on; the agent writes it out behind it
//! ([`crate::flash`]). A process restarted on the node restores from a slot whose bytes hash to
//! the committed checkpoint's digest, else from disk.
//!
//! Which slot a copy takes: never the one holding the newest copy the job master committed
//! (else the newest written out or kept), which is what a restart here restores from, nor a
//! replicated copy whose answer is still due; of the others a free or older one first, then a
//! copy still waiting to be written out (dropped whole for the newer one). A slot the agent is
//! writing out is locked and passed over; with none left, the copy is not taken. A shard's copy
//! written out counts as committed once the caller says its step is ([`Copy::committed`]): the
//! agent hears of a sharded step's commit only at its next heartbeat.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::flash::{BUDGET_ENV, DIR_ENV, FlashDir, SLOTS, SlotStatus};

/// What a copy into memory is for: its step and part, and whether it is written out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Copy {
    pub step: u64,
    pub rank: u32,
    /// Parts that make the step (1: a replicated state, written out by one rank).
    pub world: u32,
    /// Written out (rank 0 of a replicated state), or kept in memory only.
    pub persist: bool,
    pub incarnation: u64,
    /// Left `held` (not written out) until [`Slots::release`]: a consistent cut's copy, written
    /// out once the job master knows of the cut.
    pub hold: bool,
    /// The newest step the job master committed, as the caller knows it (`None`: unknown). A
    /// copy of it written out is kept as the committed one, even before the agent marks it.
    pub committed: Option<u64>,
}

/// Why a copy was not taken.
#[derive(Debug, PartialEq)]
pub enum NotTaken {
    /// Over half the budget, which holds two copies: the sizes.
    TooLarge { bytes: u64, budget: u64 },
    /// Both slots busy (one being written out, the other the committed copy).
    NoSlot,
}

impl std::fmt::Display for NotTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTaken::TooLarge { bytes, budget } => write!(
                f,
                "the state is {bytes} bytes, and the flash memory budget of {budget} bytes holds \
                 two copies of at most {} bytes each",
                budget / 2
            ),
            NotTaken::NoSlot => write!(
                f,
                "no slot is free: one is being written out, the other holds the committed copy"
            ),
        }
    }
}

/// The training process's two slots.
pub struct Slots {
    dir: FlashDir,
    save: u64,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Slots {
    /// The slots the agent gave this process, if the job has flash checkpoints.
    /// `None` too when the directory cannot be opened (said in the log): the process then
    /// checkpoints to disk only.
    pub fn from_env() -> Option<Self> {
        let dir = std::env::var_os(DIR_ENV)?;
        let budget = std::env::var(BUDGET_ENV).ok()?.parse().ok()?;
        Self::at(PathBuf::from(dir), budget)
            .inspect_err(|e| tracing::warn!("flash checkpoints off: {e}"))
            .ok()
    }

    pub fn at(dir: PathBuf, budget: u64) -> Result<Self, Error> {
        let dir = FlashDir::of_process(dir, budget)?;
        let save = (0..SLOTS)
            .filter_map(|s| dir.status(s))
            .map(|s| s.save)
            .max()
            .unwrap_or(0);
        Ok(Slots { dir, save })
    }

    /// The slots a copy may go into, best first (see the module's doc); `known` is the step
    /// the caller knows committed.
    fn candidates(&self, known: Option<u64>) -> Vec<u32> {
        let states: Vec<SlotStatus> = (0..SLOTS)
            .map(|s| self.dir.status(s).unwrap_or_default())
            .collect();
        let of = |s: u32| &states[s as usize];
        let committed: Vec<u32> = (0..SLOTS)
            .filter(|&s| match of(s).state.as_str() {
                "committed" => true,
                "persisted" => known == Some(of(s).step),
                _ => false,
            })
            .collect();
        let held = match committed.is_empty() {
            false => committed.clone(),
            true => (0..SLOTS)
                .filter(|&s| matches!(of(s).state.as_str(), "persisted" | "kept"))
                .collect(),
        };
        let keep = held.iter().copied().max_by_key(|&s| of(s).save);
        let answer_due = |s: u32| {
            of(s).state == "persisted"
                && of(s).world == 1
                && keep.is_some_and(|k| committed.contains(&k) && of(s).save > of(k).save)
        };
        let order = |s: u32| match of(s).state.as_str() {
            "held" | "ready" => 1,
            "persisting" => 2,
            _ => 0,
        };
        let mut out: Vec<u32> = (0..SLOTS)
            .filter(|&s| Some(s) != keep && !answer_due(s))
            .collect();
        out.sort_by_key(|&s| (order(s), of(s).save));
        out
    }

    /// Copies `bytes` into the best slot free for it (see the module's doc): the slot, or why
    /// not. Never waits for the agent.
    pub fn copy_in(&mut self, bytes: &[u8], c: Copy) -> Result<Result<u32, NotTaken>, Error> {
        let size = bytes.len() as u64;
        if 2 * size > self.dir.budget {
            return Ok(Err(NotTaken::TooLarge {
                bytes: size,
                budget: self.dir.budget,
            }));
        }
        for slot in self.candidates(c.committed) {
            let path = self.dir.slot_file(slot);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io(&path))?;
            let Ok(mut file) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                continue; // the agent is writing it out
            };
            // The agent may have ended its write-out since the states were read.
            if !self.candidates(c.committed).contains(&slot) {
                continue;
            }
            self.save += 1;
            let mut status = SlotStatus {
                state: "writing".into(),
                save: self.save,
                step: c.step,
                rank: c.rank,
                world: c.world,
                incarnation: c.incarnation,
                persist: c.persist,
                bytes: size,
                ..Default::default()
            };
            self.dir.set_status(slot, &status)?;
            file.set_len(0).map_err(io(&path))?;
            file.write_all(bytes).map_err(io(&path))?;
            status.state = if c.hold { "held" } else { "ready" }.into();
            self.dir.set_status(slot, &status)?;
            return Ok(Ok(slot));
        }
        Ok(Err(NotTaken::NoSlot))
    }

    /// A `held` copy becomes ready to be written out.
    pub fn release(&self, slot: u32) -> Result<(), Error> {
        let path = self.dir.slot_file(slot);
        let file = File::open(&path).map_err(io(&path))?;
        let _locked =
            Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io(&path)(e.into()))?;
        if let Some(mut s) = self.dir.status(slot).filter(|s| s.state == "held") {
            s.state = "ready".into();
            self.dir.set_status(slot, &s)?;
        }
        Ok(())
    }

    /// The bytes of step `step` as committed with `digest` (SHA-256 of the part, hex), if a
    /// slot here holds them whole: a copy written out, or kept in memory only (another rank's
    /// copy of a replicated state hashes the same). Read under the slot's lock.
    pub fn holding(&self, step: u64, digest: &str) -> Option<Vec<u8>> {
        (0..SLOTS).find_map(|slot| {
            let st = self.dir.status(slot)?;
            let whole = matches!(st.state.as_str(), "persisted" | "committed" | "kept");
            if st.step != step || !whole {
                return None;
            }
            let file = File::open(self.dir.slot_file(slot)).ok()?;
            let mut locked = Flock::lock(file, FlockArg::LockShared).ok()?;
            let mut bytes = Vec::new();
            locked.read_to_end(&mut bytes).ok()?;
            (hex::encode(Sha256::digest(&bytes)) == digest).then_some(bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(step: u64, hold: bool) -> Copy {
        Copy {
            step,
            rank: 0,
            world: 1,
            persist: true,
            incarnation: 1,
            hold,
            committed: None,
        }
    }

    #[test]
    fn a_copy_is_written_out_by_the_agent_and_found_again_by_its_digest() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let agent = FlashDir::open(shm.path(), "run/1", "worker", 0, 1 << 20, None).unwrap();
        let mut slots = Slots::at(agent.dir.clone(), 1 << 20).unwrap();
        let slot = slots
            .copy_in(b"state at 10", copy(10, true))
            .unwrap()
            .unwrap();
        // Held: the agent leaves it until released.
        assert!(agent.write_out(ckpt.path()).unwrap().is_none());
        slots.release(slot).unwrap();
        let w = agent.write_out(ckpt.path()).unwrap().unwrap();
        assert_eq!((w.step, w.slot), (10, slot));
        assert_eq!(std::fs::read(&w.path).unwrap(), b"state at 10");
        agent.settled(w.slot, w.save, true).unwrap();
        assert_eq!(slots.holding(10, &w.digest).unwrap(), b"state at 10");
        assert_eq!(slots.holding(10, "00"), None, "another digest");
        assert_eq!(slots.holding(9, &w.digest), None, "another step");
        // The next copies never take the committed one's slot: they take the other, and a
        // newer copy not yet written out replaces the one before it.
        let a = slots
            .copy_in(b"state at 20", copy(20, false))
            .unwrap()
            .unwrap();
        let b = slots
            .copy_in(b"state at 30", copy(30, false))
            .unwrap()
            .unwrap();
        assert_eq!((a, b), (1 - slot, 1 - slot));
        assert_eq!(slots.holding(10, &w.digest).unwrap(), b"state at 10");
        // A process started again counts its saves on from the slots'.
        assert_eq!(
            Slots::at(agent.dir.clone(), 1 << 20).unwrap().save,
            slots.save
        );
    }

    #[test]
    fn a_shard_s_copy_of_the_step_committed_is_kept_once_its_agent_hears_of_the_commit() {
        // Rank 1 of 2: its part of step 10 is written out, and the step is committed when
        // rank 0's part lands, which only rank 0's agent is answered; rank 1's agent hears it
        // from the master's heartbeat.
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let agent = FlashDir::open(shm.path(), "run/1", "worker", 1, 1 << 20, None).unwrap();
        let mut slots = Slots::at(agent.dir.clone(), 1 << 20).unwrap();
        let shard = |step| Copy {
            step,
            rank: 1,
            world: 2,
            ..copy(step, false)
        };
        let s10 = slots.copy_in(b"10", shard(10)).unwrap().unwrap();
        let w10 = agent.write_out(ckpt.path()).unwrap().unwrap();
        agent.mark_committed(9).unwrap();
        assert_eq!(
            agent.status(s10).unwrap().state,
            "persisted",
            "another step"
        );
        agent.mark_committed(10).unwrap();
        assert_eq!(agent.status(s10).unwrap().state, "committed");
        // Saves go on before step 20 is committed: each takes the other slot, never step 10's.
        let s20 = slots.copy_in(b"20", shard(20)).unwrap().unwrap();
        agent.write_out(ckpt.path()).unwrap().unwrap();
        let s30 = slots.copy_in(b"30", shard(30)).unwrap().unwrap();
        assert_eq!((s20, s30), (1 - s10, 1 - s10));
        assert_eq!(slots.holding(10, &w10.digest).unwrap(), b"10");
    }

    #[test]
    fn a_shard_s_copy_of_the_step_committed_is_kept_when_the_caller_knows_before_its_agent() {
        // Rank 1 of 2: step 10 committed and marked; its part of step 20 written out, and step
        // 20 committed at the master, which rank 1's agent has not heard yet.
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let agent = FlashDir::open(shm.path(), "run/1", "worker", 1, 1 << 20, None).unwrap();
        let mut slots = Slots::at(agent.dir.clone(), 1 << 20).unwrap();
        let shard = |step, committed| Copy {
            step,
            rank: 1,
            world: 2,
            committed,
            ..copy(step, false)
        };
        let s10 = slots.copy_in(b"10", shard(10, None)).unwrap().unwrap();
        agent.write_out(ckpt.path()).unwrap().unwrap();
        agent.mark_committed(10).unwrap();
        let s20 = slots.copy_in(b"20", shard(20, Some(10))).unwrap().unwrap();
        let w20 = agent.write_out(ckpt.path()).unwrap().unwrap();
        // Told step 20 is committed, the next copy gives up step 10's slot, not step 20's.
        let s30 = slots.copy_in(b"30", shard(30, Some(20))).unwrap().unwrap();
        assert_eq!((s20, s30), (1 - s10, s10));
        assert_eq!(slots.holding(20, &w20.digest).unwrap(), b"20");
        // Not told (or told an older step), it takes step 20's: step 10's is the committed
        // copy it knows of.
        agent.write_out(ckpt.path()).unwrap().unwrap();
        agent.mark_committed(30).unwrap();
        let w40 = {
            let s40 = slots.copy_in(b"40", shard(40, Some(30))).unwrap().unwrap();
            assert_eq!(s40, s20);
            agent.write_out(ckpt.path()).unwrap().unwrap()
        };
        let s50 = slots.copy_in(b"50", shard(50, Some(30))).unwrap().unwrap();
        assert_eq!(s50, s20, "step 40 not known committed: replaced");
        assert_eq!(slots.holding(40, &w40.digest), None);
    }

    #[test]
    fn a_state_over_half_the_budget_or_with_no_slot_free_is_not_taken() {
        let shm = tempfile::tempdir().unwrap();
        let agent = FlashDir::open(shm.path(), "run/1", "worker", 0, 64, None).unwrap();
        let mut slots = Slots::at(agent.dir.clone(), 64).unwrap();
        let e = slots
            .copy_in(&[0; 33], copy(1, false))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            e,
            NotTaken::TooLarge {
                bytes: 33,
                budget: 64
            }
        );
        assert!(e.to_string().contains("two copies of at most 32 bytes"));
        // One slot committed, the other being written out (the agent holds its lock).
        let s0 = slots.copy_in(b"a", copy(1, false)).unwrap().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let w = agent.write_out(ckpt.path()).unwrap().unwrap();
        agent.settled(w.slot, w.save, true).unwrap();
        let s1 = slots.copy_in(b"b", copy(2, false)).unwrap().unwrap();
        assert_ne!(s0, s1);
        let busy = Flock::lock(
            File::open(agent.slot_file(s1)).unwrap(),
            FlockArg::LockExclusive,
        )
        .unwrap();
        assert_eq!(
            slots.copy_in(b"c", copy(3, false)).unwrap(),
            Err(NotTaken::NoSlot)
        );
        drop(busy);
        assert_eq!(slots.copy_in(b"c", copy(3, false)).unwrap(), Ok(s1));
    }
}
