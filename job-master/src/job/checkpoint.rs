//! Checkpoints: the PS save at a drained cut, commits from training processes (at a cut, or
//! from a script whose data the master does not track), and where the next one goes.

use super::*;
use std::path::Path;

impl JobContext {
    /// For ps jobs: once every lease is back, ask the PS to save: into their agents' memory
    /// when the job has flash checkpoints and nothing after the cut needs it on disk (see
    /// [`Self::ps_cut_to_disk`]), else to disk.
    pub(super) fn ps_checkpoint_if_drained(&mut self, now_ms: u64) -> Vec<Effect> {
        if !(self.checkpoint_pending
            && !self.checkpoint_saving
            && self.spec.kind == JobKind::Ps
            && self.ledger.in_flight() == 0)
        {
            return Vec::new();
        }
        let Some(ps) = self.group.cluster().map(PsCluster::ps_addrs) else {
            return Vec::new();
        };
        self.checkpoint_saving = true;
        let (id, dir) = self.next_checkpoint_dir();
        let step = self.ledger.done_shards();
        let generation = self.generation;
        if self.spec.checkpoint.flash.is_some() && self.ps_cut_to_disk(step, now_ms).is_none() {
            // Held before the copies are taken: the agents may write a part out before the
            // last PS has answered, and a part is taken only for a cut the master holds.
            self.hold_cut(step, None, now_ms);
            return vec![Effect::CopyPsCut {
                id,
                dir,
                ps,
                step,
                generation,
                committed: self.committed_step(),
            }];
        }
        vec![Effect::SavePsCheckpoint {
            id,
            dir,
            ps,
            step,
            generation,
        }]
    }

    /// Why the pending cut of a ps job at `step` goes to disk rather than into memory, if it
    /// does: what comes after the cut restarts or stops processes (which restore from disk),
    /// the step is not newer than the latest checkpoint (the parts of a step are taken only
    /// once), or an earlier cut held in memory was never written out.
    fn ps_cut_to_disk(&self, step: u64, now_ms: u64) -> Option<String> {
        if self.cancelling.is_some() {
            return Some("the job is cancelled after it".into());
        }
        if self.stability.replace_at_cut.is_some() {
            return Some("a process is replaced after it".into());
        }
        if self.transition.is_some() {
            return Some("a plan goes on after it".into());
        }
        let no_shard = self
            .committed_step()
            .filter(|&l| step <= l)
            .map(|l| format!("no shard was done since the checkpoint of step {l}"));
        no_shard.or_else(|| self.stale_held_cut_reason(now_ms))
    }

    /// Every PS copied its partition of the cut at `step` into its agent's memory: the cut
    /// ends and training goes on while the agents write the parts out (the step is committed
    /// once every part is in, [`Self::flash_part_written`]). When something came to need the
    /// cut on disk meanwhile (a cancel, a plan, a replacement), the job waits for the commit.
    pub fn ps_cut_in_memory(&mut self, step: u64, generation: u64, now_ms: u64) -> Vec<Effect> {
        let pending = self.checkpoint_pending && self.checkpoint_saving;
        if generation != self.generation || !pending || !self.flash.cuts.contains_key(&step) {
            // Committed already (the parts were written out before the last answer), or
            // dropped with a restart.
            return Vec::new();
        }
        let shards = format!(
            "{} of {} shards done",
            self.ledger.done_shards(),
            self.ledger.total_shards()
        );
        if let Some(why) = self.ps_cut_to_disk(step, now_ms) {
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "cut at step {step} held in the parameter servers' memory ({shards}); {why}, \
                     so the job waits for it to be written out"
                ),
            );
            return Vec::new();
        }
        self.log_as(
            EventKind::Checkpoint,
            now_ms,
            format!(
                "cut at step {step} held in the parameter servers' memory ({shards}): training \
                 goes on while it is written out"
            ),
        );
        self.checkpoint_pending = false;
        self.checkpoint_saving = false;
        self.shards_since_checkpoint = 0;
        self.on_cut(now_ms)
    }

    /// A PS could not copy its partition of the cut at `step` into memory (`why`): the cut
    /// is no longer held there, and the PS save it to disk instead (the caller does that;
    /// the copies already taken are refused when written out).
    pub fn ps_cut_not_in_memory(&mut self, step: u64, generation: u64, why: &str, now_ms: u64) {
        if generation != self.generation || self.flash.cuts.remove(&step).is_none() {
            return;
        }
        self.log_as(
            EventKind::Checkpoint,
            now_ms,
            format!("cut at step {step} saved to disk: {why}"),
        );
    }

    /// Whether `key`'s metrics reports carry training metrics: a parameter server's carry
    /// only where it restored its partition from ([`Self::restored`]).
    pub fn reports_training(&self, key: SlotKey) -> bool {
        !(self.spec.kind == JobKind::Ps && key.role == Role::PS)
    }

    /// `key`'s `incarnation` restored the checkpoint of `step` from `from` (`memory`, `disk`
    /// or `peer`): an event says so.
    pub fn restored(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        from: &str,
        step: u64,
        now_ms: u64,
    ) -> Result<(), Error> {
        self.current(key, incarnation)?;
        if !matches!(from, "memory" | "disk" | "peer") {
            return Err(Error::InvalidRequest(format!(
                "restored_from is {:?}: memory, disk or peer",
                from.chars().take(40).collect::<String>()
            )));
        }
        self.log_as(
            EventKind::Checkpoint,
            now_ms,
            format!("{key} (incarnation {incarnation}) restored step {step} from {from}"),
        );
        Ok(())
    }

    /// Whether `key`'s `incarnation` may commit a checkpoint: the current one, or, for a
    /// script whose data the master does not track, the one just asked to stop (it saves on
    /// SIGTERM within its grace period; its agent starts the next one only after it exited).
    pub fn may_commit(&self, key: SlotKey, incarnation: u64) -> Result<(), Error> {
        let stale = match self.current(key, incarnation) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let slot = self.slot(key)?;
        let stopping = incarnation + 1 == slot.incarnation && slot.phase == SlotPhase::Restarting;
        if stopping && !self.data_tracked() {
            Ok(())
        } else {
            Err(stale)
        }
    }

    /// [`Self::may_commit`] for a checkpoint of `step` whose manifest is about to be written:
    /// one saved by a process the group has since restarted is marked late.
    pub fn begin_commit(&mut self, key: SlotKey, incarnation: u64, step: u64) -> Result<(), Error> {
        self.may_commit(key, incarnation)?;
        if self.current(key, incarnation).is_err() {
            self.late_commits.insert(step);
        }
        Ok(())
    }

    /// A checkpoint saved by processes the group has since restarted, its manifest written
    /// after the new round told its members where to resume: not committed (they resume from
    /// an older checkpoint, or the start, and a checkpoint of the processes they replaced
    /// would stand newer than what they train). True when refused, said in an event.
    fn late_commit_refused(&mut self, step: u64, manifest: &Path, now_ms: u64) -> bool {
        if !self.late_commits.remove(&step) {
            return false;
        }
        let Some(told) = &self.resume_told else {
            return false;
        };
        let from = match &told.from {
            Some(m) => m.display().to_string(),
            None => "the start".into(),
        };
        self.log_as(
            EventKind::Checkpoint,
            now_ms,
            format!(
                "checkpoint of step {step} is not committed: it was saved by processes the group \
                 has since restarted, and round {} already resumes from {from} ({} left unused)",
                told.round,
                manifest.display()
            ),
        );
        true
    }

    /// A checkpoint whose files are written and whose manifest is at `manifest` becomes the one
    /// to restore from. `generation` is the one the save was started in.
    pub fn checkpoint_committed(
        &mut self,
        id: u64,
        manifest: PathBuf,
        step: u64,
        generation: u64,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        if generation != self.generation {
            return Err(Error::Checkpoint {
                path: manifest,
                problem: format!(
                    "started in generation {generation}, the job is in {}",
                    self.generation
                ),
            });
        }
        if self.late_commit_refused(step, &manifest, now_ms) {
            return Ok(Vec::new());
        }
        if let Some(cut) = self.flash.cuts.remove(&step) {
            return Ok(self.held_cut_committed(id, manifest, step, cut, now_ms));
        }
        let drained = self.checkpoint_pending && self.ledger.in_flight() == 0;
        if !drained && self.data_tracked() {
            return Err(Error::Checkpoint {
                path: manifest,
                problem: "no drained checkpoint is pending: the master tracks this job's data, \
                          so a checkpoint must be taken at a consistent cut (every lease back)"
                    .into(),
            });
        }
        self.checkpoints.push(CheckpointRecord {
            id,
            manifest: manifest.clone(),
            ledger: self.ledger.snapshot(),
            taken_at_ms: now_ms,
            step,
            training_ms: self.training_time.training_ms,
        });
        self.flash_cuts_superseded(step, now_ms);
        if !drained {
            // A command that reads its own data saved when it chose (on SIGTERM, say): the
            // next launch resumes from it.
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "checkpoint {id} committed by the script at step {step}: {}",
                    manifest.display()
                ),
            );
            return Ok(self.prune_checkpoints(now_ms));
        }
        self.log_as(
            EventKind::Checkpoint,
            now_ms,
            format!(
                "checkpoint {id} committed at step {step} ({} of {} shards done): {}",
                self.ledger.done_shards(),
                self.ledger.total_shards(),
                manifest.display()
            ),
        );
        let mut effects = self.prune_checkpoints(now_ms);
        effects.extend(self.cut_committed(id, now_ms));
        Ok(effects)
    }

    /// The committed checkpoints beyond the spec's `checkpoint.keep` (the oldest) are dropped
    /// from the record, each said in an event; their directories to delete. A directory that
    /// a kept checkpoint also lives in, or the checkpoint root itself, is never deleted.
    pub(super) fn prune_checkpoints(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(keep) = self.spec.checkpoint.keep else {
            return Vec::new();
        };
        let over = self.checkpoints.len().saturating_sub(keep.max(1) as usize);
        if over == 0 {
            return Vec::new();
        }
        let gone: Vec<CheckpointRecord> = self.checkpoints.drain(..over).collect();
        self.checkpoints_deleted += over;
        let kept: Vec<PathBuf> = self
            .checkpoints
            .iter()
            .filter_map(|c| c.manifest.parent().map(std::path::Path::to_path_buf))
            .collect();
        let root = self.spec.checkpoint.dir.clone();
        let mut dirs = Vec::new();
        for c in gone {
            let dir = c.manifest.parent().map(std::path::Path::to_path_buf);
            let removable = dir
                .as_ref()
                .filter(|d| !kept.iter().any(|k| k.starts_with(d)) && **d != root);
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                match removable {
                    Some(d) => format!(
                        "checkpoint {} (step {}) deleted: checkpoint.keep is {keep}: {}",
                        c.id,
                        c.step,
                        d.display()
                    ),
                    None => format!(
                        "checkpoint {} (step {}) dropped from the record (checkpoint.keep is \
                         {keep}); its directory holds a kept one too and stays",
                        c.id, c.step
                    ),
                },
            );
            dirs.extend(removable.cloned());
        }
        if dirs.is_empty() {
            return Vec::new();
        }
        vec![Effect::RemoveCheckpoints { dirs }]
    }

    /// The pending cut's checkpoint `id` is committed: training goes on, or what waited for
    /// the cut (a cancel, a straggler's restart, the rest of a plan) starts.
    pub(super) fn cut_committed(&mut self, id: u64, now_ms: u64) -> Vec<Effect> {
        self.checkpoint_pending = false;
        self.checkpoint_saving = false;
        self.shards_since_checkpoint = 0;
        if self.cancel_after_checkpoint(Some(id), now_ms) {
            return Vec::new();
        }
        if let Some(effects) = self.replace_after_cut(now_ms) {
            return effects;
        }
        if self.late_reform_at_cut(now_ms) {
            return Vec::new();
        }
        self.on_cut(now_ms)
    }

    /// A checkpoint could not be written: training goes on without it.
    pub fn checkpoint_failed(&mut self, generation: u64, problem: String, now_ms: u64) {
        if generation == self.generation && self.checkpoint_pending {
            self.checkpoint_pending = false;
            self.checkpoint_saving = false;
            // Late joiners wait for the next try (the next tick sees them still waiting).
            if self.late_reform == Some(super::late::LateReform::AtCut) {
                self.late_reform = None;
            }
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!("checkpoint failed, training goes on without it: {problem}"),
            );
            if let Some(key) = self.stability.replace_at_cut.take() {
                let shrinking = std::mem::take(&mut self.stability.shrinking);
                let what = match self.stability.moving_off.take() {
                    Some(node) => format!("{key} is not moved off cordoned node {node}"),
                    None if shrinking => format!("straggler {key} is not shrunk out"),
                    None => format!("straggler {key} is not replaced"),
                };
                self.log_as(
                    EventKind::Straggler,
                    now_ms,
                    format!("{what}: no checkpoint to restart from"),
                );
            }
            self.cancel_after_checkpoint(None, now_ms);
        }
    }

    /// The id the next checkpoint gets, and the directory a ps checkpoint of that id is saved in.
    pub fn next_checkpoint_dir(&self) -> (u64, PathBuf) {
        // Never a damaged checkpoint's id: its files stay where they were.
        let last = self.checkpoints.last().map(|c| c.id);
        let damaged = self.damaged_checkpoints.iter().map(|d| d.id).max();
        let id = last.max(damaged).map_or(1, |i| i + 1);
        (id, self.spec.checkpoint.dir.join(format!("ckpt-{id:06}")))
    }
}
