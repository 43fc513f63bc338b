//! Flash checkpoints, the job master's half: the parts that the agents wrote out of their
//! processes' shared memory (`worker-agent/src/flash.rs`), gathered per step. A step is
//! committed once every part of it is in (the caller writes its manifest, then records it as
//! the checkpoint to restore from); never with a part missing. A partly written step is dropped,
//! with the ranks missing in the job's events, when a newer step is complete or the group
//! restarts (its processes are gone).
//!
//! For a job whose data the master leases, flash saves are taken at its consistent cuts only:
//! the ranks copy the state into memory at the drained step boundary and rank 0 says so
//! (`cut_in_memory`); the cut ends there, without waiting for a disk, and its step is committed
//! with the ledger as it was at the cut once the copy is written out. A cut that the job
//! restarts or stops after (a cancel, a straggler moved or shrunk out, a plan that launches
//! processes, which load it from disk) waits for that commit, as a synchronous save would.

use super::*;

/// How long a routine checkpoint waits for the cut held in memory before it to be written out.
/// A cut taken while the previous copy is still being written finds no free slot and is saved
/// to disk instead, holding the group for the whole write (seen on a GPU, where steps take
/// milliseconds). Past this, a copy that is not coming (its write-out failing) no longer holds
/// the job's checkpoints back.
pub const HELD_CUT_DEFERS_MS: u64 = 10 * 60 * 1000;

/// The steps whose parts are coming in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlashParts {
    pub steps: BTreeMap<u64, FlashStep>,
    /// Consistent cuts held in memory and not yet written out, by step.
    #[serde(default)]
    pub cuts: BTreeMap<u64, HeldCut>,
    /// The round after a plan's cut held in memory that grew the group or moved processes of
    /// it: its ranks take the cut's state from rank 0 as the group forms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_round: Option<PeerRound>,
}

/// A round whose rank 0 (a process that took part in the cut: nothing was trained since)
/// sends the state of the cut at `step` to every rank over the new group, rather than the
/// ranks a plan added waiting for the copy on disk. Kept apart from the plan (which may be
/// reached before every member has polled its answer): every member of the round is told
/// the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRound {
    pub round: u64,
    pub step: u64,
    /// The training group's size before the plan: slots below it took part in the cut...
    pub survivors: u32,
    /// ...but those the plan moved, whose new processes hold nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<u32>,
}

/// A consistent cut whose state the processes hold in shared memory: what its checkpoint
/// record gets once the copy is written out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldCut {
    pub ledger: LedgerSnapshot,
    pub taken_at_ms: u64,
    pub training_ms: u64,
    /// The process (and its incarnation) whose copy is written out: rank 0 of the cut. Its
    /// part is taken even after a plan moved it (its successor got the cut's state from the
    /// round's new rank 0), since the cut is still the state the job goes on from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<(SlotKey, u64)>,
    /// Where a plan moved rank 0 of the cut: the process that leads the round after in its
    /// place, which writes its own copy out too ([`JobContext::persist_step_for`]), so the cut
    /// is committed whether or not the moved one's agent wrote its copy out before it went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead: Option<SlotKey>,
}

/// One step's parts so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlashStep {
    /// How many parts make the step (the group's size for a state each rank holds a shard of;
    /// one for a replicated state, which rank 0 writes out).
    pub parts: u32,
    pub written: BTreeMap<u32, FlashPart>,
    pub first_ms: u64,
    /// Its parts were copied by processes the group has since restarted (a save on SIGTERM):
    /// never mixed with parts of the same step from their successors.
    #[serde(default)]
    pub before_restart: bool,
}

/// A part on disk: the copy of rank `rank` of the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlashPart {
    pub path: PathBuf,
    pub digest: String,
    pub bytes: u64,
}

/// What an agent says it wrote out.
#[derive(Clone, Debug, PartialEq)]
pub struct PartWritten {
    pub step: u64,
    pub rank: u32,
    pub parts: u32,
    pub part: FlashPart,
    /// Its agent's write-out was hurried: the node's training left it no idle CPU.
    pub hurried: bool,
}

impl FlashStep {
    fn missing(&self) -> Vec<u32> {
        (0..self.parts)
            .filter(|r| !self.written.contains_key(r))
            .collect()
    }
}

impl JobContext {
    /// `key`'s agent wrote out a part its process copied as `incarnation`. `Some` once every
    /// part of the step is in: the step and its parts, by rank, to commit. Refused: a part of
    /// a stale process, of a step not newer than the latest checkpoint, or of a job whose data
    /// the master tracks (its checkpoints are taken at its cuts).
    pub fn flash_part_written(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        w: PartWritten,
        now_ms: u64,
    ) -> Result<Option<(u64, FlashStep)>, Error> {
        // Rank 0 of a cut still held, though a plan has moved it since: its copy is the cut's.
        let held_by_it = self
            .flash
            .cuts
            .get(&w.step)
            .is_some_and(|c| c.by == Some((key, incarnation)));
        if !held_by_it {
            self.may_commit(key, incarnation)?;
        }
        if self.data_tracked() && !self.flash.cuts.contains_key(&w.step) {
            return Err(Error::InvalidRequest(format!(
                "flash checkpoint of step {}: this job's data is leased by the job master, so \
                 its checkpoints are taken at the master's consistent cuts (the SDK saves there \
                 itself), and step {} is not a cut held in memory; a flash save anywhere else \
                 would not match the shards done",
                w.step, w.step
            )));
        }
        if w.parts == 0 || w.rank >= w.parts {
            return Err(Error::InvalidRequest(format!(
                "flash checkpoint of step {}: part {} of {} parts",
                w.step, w.rank, w.parts
            )));
        }
        if let Some(last) = self.checkpoints.last()
            && w.step <= last.step
        {
            return Err(Error::InvalidRequest(format!(
                "flash checkpoint of step {}: the latest committed checkpoint is at step {}",
                w.step, last.step
            )));
        }
        let before_restart = !held_by_it && self.current(key, incarnation).is_err();
        if let Some(old) = self.flash.steps.get(&w.step)
            && old.before_restart != before_restart
        {
            let old = self.flash.steps.remove(&w.step).expect("just seen");
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "flash checkpoint of step {}: the part(s) of rank(s) {:?} were copied before \
                     the group restarted, and rank {}'s after: never mixed, the earlier are \
                     dropped",
                    w.step,
                    old.written.keys().collect::<Vec<_>>(),
                    w.rank
                ),
            );
        }
        if w.hurried {
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "{key}'s part {} of step {} was written out slowly: its node's training left \
                     the agent's write-out too little CPU at the lowest priority, and it \
                     finished at a higher one",
                    w.rank, w.step
                ),
            );
        }
        let step = self.flash.steps.entry(w.step).or_insert_with(|| FlashStep {
            parts: w.parts,
            written: BTreeMap::new(),
            first_ms: now_ms,
            before_restart,
        });
        if step.parts != w.parts {
            return Err(Error::InvalidRequest(format!(
                "flash checkpoint of step {}: rank {} says {} parts, an earlier part said {}",
                w.step, w.rank, w.parts, step.parts
            )));
        }
        step.written.insert(w.rank, w.part);
        if !step.missing().is_empty() {
            return Ok(None);
        }
        let done = self.flash.steps.remove(&w.step).expect("just filled");
        if done.before_restart {
            self.late_commits.insert(w.step);
        }
        let older: Vec<u64> = self.flash.steps.range(..w.step).map(|(s, _)| *s).collect();
        for s in older {
            let dropped = self.flash.steps.remove(&s).expect("listed");
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "flash checkpoint of step {s} is not committed: rank(s) {:?} of {} never \
                     wrote their part (step {} is complete and newer)",
                    dropped.missing(),
                    dropped.parts,
                    w.step
                ),
            );
        }
        Ok(Some((w.step, done)))
    }

    /// Rank `key` (rank 0 of the group) holds the pending cut's state at `step` in memory,
    /// as every rank does. The cut ends now, and training goes on while the copy is written
    /// out; unless the job restarts or stops after the cut, which then waits for the commit.
    pub fn cut_in_memory(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        step: u64,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        self.current(key, incarnation)?;
        let drained = self.checkpoint_pending && self.ledger.in_flight() == 0;
        if !(drained && !self.checkpoint_saving && self.spec.kind == JobKind::Allreduce) {
            return Err(Error::InvalidRequest(format!(
                "a cut held in memory at step {step}: no drained cut is pending (every lease \
                 back and no checkpoint of it under way)"
            )));
        }
        if let Some(last) = self.checkpoints.last()
            && step <= last.step
        {
            return Err(Error::InvalidRequest(format!(
                "a cut held in memory at step {step}: the latest committed checkpoint is at \
                 step {}",
                last.step
            )));
        }
        if let Some(why) = self.stale_held_cut_reason(now_ms) {
            return Err(Error::InvalidRequest(format!(
                "a cut held in memory at step {step}: {why}, so this one goes to disk"
            )));
        }
        self.hold_cut(step, Some((key, incarnation)), now_ms);
        let shards = format!(
            "{} of {} shards done",
            self.ledger.done_shards(),
            self.ledger.total_shards()
        );
        if let Some(why) = self.cut_waits_for_disk(key) {
            self.checkpoint_saving = true;
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "cut at step {step} held in memory ({shards}); {why}, so the job waits for \
                     it to be written out"
                ),
            );
            return Ok(Vec::new());
        }
        self.checkpoint_pending = false;
        self.shards_since_checkpoint = 0;
        let peers_get = self.peers_get_cut();
        let new_ranks = peers_get.map_or(String::new(), |(who, _)| {
            format!("; {who} get it from rank 0 over the new group")
        });
        self.log_as(
            EventKind::Checkpoint,
            now_ms,
            format!(
                "cut at step {step} held in memory ({shards}): training goes on while it is \
                 written out{new_ranks}"
            ),
        );
        // (Before the cut ends the round the leader is chosen from.)
        let lead = self.cut_leader(key);
        if let (Some(c), Some(index)) = (self.flash.cuts.get_mut(&step), lead)
            && index != key.index
        {
            c.lead = Some(SlotKey {
                role: key.role,
                index,
            });
        }
        let moved = self.moved_trainers();
        let effects = self.on_cut(now_ms);
        // The round after: a plan's (`on_cut` numbered it), or the late joiners' re-formation
        // (which starts now, the cut's state coming from rank 0 rather than from disk).
        // (A plan that came meanwhile re-forms the group itself: `late_reform_at_cut` says no.)
        let late = self.late_reform == Some(super::late::LateReform::AtCut);
        let round_after = match (late && self.late_reform_at_cut(now_ms), self.late_reform) {
            (true, Some(super::late::LateReform::ToRound(n))) => Some(n),
            _ => self.transition.as_ref().map(|t| t.round_after),
        };
        if let (Some((_, survivors)), Some(lead), Some(round)) = (peers_get, lead, round_after) {
            // It holds the cut's state: it sends it as rank 0 of the round after, wherever
            // the plan put the others (a moved lowest index does not displace it).
            if let Some(r) = self.group.rendezvous_mut() {
                r.lead_next(lead);
            }
            self.flash.peer_round = Some(PeerRound {
                round,
                step,
                survivors,
                moved,
            });
        }
        Ok(effects)
    }

    /// Who gets the pending cut's state from rank 0 over the group as the round after forms,
    /// and how many processes took part in the cut: the ranks a plan adds or moves at its own
    /// cut (not a periodic one while its processes start), or the workers that joined late
    /// for whom the group re-forms (a script on the SDK or the built-in all-reduce workers;
    /// elsewhere they load it from disk).
    fn peers_get_cut(&self) -> Option<(&'static str, u32)> {
        let trainer = self.trainer();
        let Some(t) = self.transition.as_ref() else {
            let late = self.late_reform == Some(super::late::LateReform::AtCut);
            let size = self.role_counts().get(&trainer).copied().unwrap_or(0);
            return late.then_some(("the workers that joined late", size));
        };
        let grows = t.to.get(&trainer) > t.from.get(&trainer);
        let who = match (grows, self.moved_trainers().is_empty()) {
            (true, true) => "the ranks the plan adds",
            (false, false) => "the processes the plan moves",
            (true, false) => "the ranks the plan adds or moves",
            (false, true) => return None,
        };
        (t.step == Step::Cut).then(|| (who, t.from.get(&trainer).copied().unwrap_or(0)))
    }

    /// The drained cut at `step` is held in memory: what its checkpoint record gets once the
    /// copy is written out (the ledger as it is now); `by`: rank 0 of the cut, whose copy is
    /// written out (none for a ps job's, whose servers each write a part).
    pub(super) fn hold_cut(&mut self, step: u64, by: Option<(SlotKey, u64)>, now_ms: u64) {
        self.flash.cuts.insert(
            step,
            HeldCut {
                ledger: self.ledger.snapshot(),
                taken_at_ms: now_ms,
                training_ms: self.training_time.training_ms,
                by,
                lead: None,
            },
        );
    }

    /// Whether a routine checkpoint, due by its count of shards, waits: a cut held in memory
    /// (taken less than [`HELD_CUT_DEFERS_MS`] ago) is still being written out.
    pub(super) fn routine_cut_waits_for_write(&self, now_ms: u64) -> bool {
        self.flash
            .cuts
            .values()
            .any(|c| now_ms.saturating_sub(c.taken_at_ms) < HELD_CUT_DEFERS_MS)
    }

    /// A cut held in memory that was not written out within [`HELD_CUT_DEFERS_MS`] (its
    /// write-out failing): the next cut goes to disk instead, so the job gets a checkpoint on
    /// disk rather than more copies that are not written out either. Its step.
    pub(super) fn stale_held_cut(&self, now_ms: u64) -> Option<u64> {
        let stale = |c: &&HeldCut| now_ms.saturating_sub(c.taken_at_ms) >= HELD_CUT_DEFERS_MS;
        self.flash
            .cuts
            .iter()
            .find(|(_, c)| stale(c))
            .map(|(step, _)| *step)
    }

    /// Why the next cut goes to disk rather than into memory because of a stale held cut.
    pub(super) fn stale_held_cut_reason(&self, now_ms: u64) -> Option<String> {
        self.stale_held_cut(now_ms).map(|s| {
            format!(
                "the cut held in memory at step {s} was not written out within {} min",
                HELD_CUT_DEFERS_MS / 60_000
            )
        })
    }

    /// Why the pending cut (held in memory by `rank0` and the others) must be on disk before
    /// the job moves on, if it must.
    fn cut_waits_for_disk(&self, rank0: SlotKey) -> Option<&'static str> {
        if self.cancelling.is_some() {
            return Some("the job is cancelled after it");
        }
        if self.stability.replace_at_cut.is_some() {
            return Some("the group restarts from it");
        }
        if self.late_reform == Some(super::late::LateReform::AtCut) && !self.ranks_send_cut() {
            return Some("the workers that joined late load it from disk");
        }
        let t = self.transition.as_ref()?;
        let trainer = self.trainer();
        let grows = t.to.get(&trainer) > t.from.get(&trainer);
        // A script on the SDK, or the built-in all-reduce workers, get it from rank 0 over
        // the new group instead, when rank 0 is a process that took part in the cut.
        let moving = self.roles.slots().any(|s| s.migrate_to.is_some());
        if moving {
            let only_trainers = self
                .roles
                .slots()
                .all(|s| s.migrate_to.is_none() || s.key.role == trainer);
            if !self.ranks_send_cut() || !only_trainers {
                return Some("the plan's moved processes load it from disk");
            }
            // Rank 0 of the cut, or where the plan moves it another process of the cut that
            // the plan keeps, leads the round after and sends the state.
            if self.cut_leader(rank0).is_none() {
                return Some(
                    "the plan moves every process of the cut it keeps: the moved processes \
                     load it from disk",
                );
            }
        }
        (grows && !self.ranks_send_cut()).then_some("the plan's new processes load it from disk")
    }

    /// Who leads the round after the cut held by `rank0` and sends the cut's state (by
    /// index): `rank0` itself, or where the plan moves it, the lowest index of the cut's
    /// members that the plan neither moves nor removes. None: no such process.
    fn cut_leader(&self, rank0: SlotKey) -> Option<u32> {
        let moved = |index: u32| {
            self.roles
                .slot(SlotKey {
                    role: rank0.role,
                    index,
                })
                .is_some_and(|s| s.migrate_to.is_some())
        };
        if !moved(rank0.index) {
            return Some(rank0.index);
        }
        let kept = self.transition.as_ref().map_or(u32::MAX, |t| {
            t.to.get(&rank0.role).copied().unwrap_or(u32::MAX)
        });
        let round = self.group.rendezvous()?.current()?;
        round
            .members
            .iter()
            .map(|m| m.index)
            .filter(|&i| i < kept && !moved(i))
            .min()
    }

    /// The step of a cut held in memory whose copy process `key` writes out too: it leads the
    /// round after a plan that moved rank 0 of the cut (see [`HeldCut::lead`]). Said in its
    /// agent's heartbeats until the step is committed (or the cut dropped).
    pub fn persist_step_for(&self, key: SlotKey) -> Option<u64> {
        self.flash
            .cuts
            .iter()
            .find(|(_, c)| c.lead == Some(key))
            .map(|(step, _)| *step)
    }

    /// The training group's processes the transition moves (by index).
    fn moved_trainers(&self) -> Vec<u32> {
        let trainer = self.trainer();
        self.roles
            .slots()
            .filter(|s| s.key.role == trainer && s.migrate_to.is_some())
            .map(|s| s.key.index)
            .collect()
    }

    /// Whether every member of the current round `round` is a process that starts in it: its
    /// incarnation was told no earlier round, it is no process a reshard added empty, and none
    /// was sent state from rank 0 (then survivors are in the round). Such a round's processes
    /// all restore from the checkpoint they are told, and may share its state as they do: a
    /// rank whose node holds the copy in memory sends it to the ranks whose node does not.
    /// A round with one survivor in it never does (the survivor trains, and would meet the
    /// others' exchange with its own collectives).
    pub(super) fn restores_together(&self, round: u64) -> bool {
        let trainer = self.trainer();
        let Some(r) = self
            .group
            .rendezvous()
            .and_then(|r| r.current())
            .filter(|r| r.number == round)
        else {
            return false;
        };
        r.members.len() > 1
            && r.members.iter().all(|m| {
                self.roles
                    .slot(SlotKey {
                        role: trainer,
                        index: m.index,
                    })
                    .is_some_and(|s| {
                        let new_here = match s.first_round {
                            None => true,
                            Some(super::FIRST_ROUND_UNKNOWN) => false,
                            Some((incarnation, first)) => {
                                incarnation != m.incarnation || first == round
                            }
                        };
                        s.incarnation == m.incarnation && !s.fresh && new_here
                    })
            })
            && self
                .flash
                .peer_round
                .as_ref()
                .is_none_or(|p| p.round != round)
    }

    /// What a member of `round` (its members' addresses by rank, `peers`) is told about
    /// state sent from rank 0: the cut's step when the round is the one after a plan's cut
    /// held in memory that grew the group or moved processes of it, and its rank 0 took part
    /// in that cut. A later round (one that did not form in time), or one led by a new or
    /// moved process, restores as any other.
    pub(super) fn peer_state_for(&self, round: u64, peers: &[String]) -> Option<u64> {
        let p = self.flash.peer_round.as_ref()?;
        if round != p.round {
            return None;
        }
        let (trainer, first) = (self.trainer(), peers.first()?);
        self.roles
            .slots()
            .any(|s| {
                s.key.role == trainer
                    && s.key.index < p.survivors
                    && !p.moved.contains(&s.key.index)
                    && s.service_addr.as_ref() == Some(first)
            })
            .then_some(p.step)
    }

    /// The copy of the cut held in memory at `step` is written out and committed as `id`: it
    /// is the checkpoint to restore from, with the ledger as it was at the cut.
    pub(super) fn held_cut_committed(
        &mut self,
        id: u64,
        manifest: PathBuf,
        step: u64,
        cut: HeldCut,
        now_ms: u64,
    ) -> Vec<Effect> {
        let behind = now_ms.saturating_sub(cut.taken_at_ms);
        self.checkpoints.push(CheckpointRecord {
            id,
            manifest: manifest.clone(),
            ledger: cut.ledger,
            taken_at_ms: cut.taken_at_ms,
            step,
            training_ms: cut.training_ms,
        });
        self.flash_cuts_superseded(step, now_ms);
        self.log_as(
            EventKind::Checkpoint,
            now_ms,
            format!(
                "checkpoint {id} committed at step {step}, the cut held in memory written out \
                 {behind} ms after it: {}",
                manifest.display()
            ),
        );
        let mut effects = self.prune_checkpoints(now_ms);
        if self.checkpoint_pending && self.checkpoint_saving {
            // The job waited for it on disk.
            effects.extend(self.cut_committed(id, now_ms));
        }
        effects
    }

    /// A checkpoint at `step` is committed: the cuts held in memory before it are dropped.
    pub(super) fn flash_cuts_superseded(&mut self, step: u64, now_ms: u64) {
        let older: Vec<u64> = self.flash.cuts.range(..step).map(|(s, _)| *s).collect();
        for s in older {
            self.flash.cuts.remove(&s);
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "the cut held in memory at step {s} is not committed: it was not written \
                     out before the checkpoint of step {step}"
                ),
            );
        }
    }

    /// The group restarts: the steps partly written are dropped (the processes that were to
    /// write the rest are gone), each with the ranks missing.
    pub(super) fn flash_dropped_on_restart(&mut self, now_ms: u64) {
        // Every process restarts: no rank holds a cut's state to send.
        self.flash.peer_round = None;
        for (s, _) in std::mem::take(&mut self.flash.cuts) {
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "the cut held in memory at step {s} is not committed: the group restarted \
                     before it was written out"
                ),
            );
        }
        for (s, dropped) in std::mem::take(&mut self.flash.steps) {
            self.log_as(
                EventKind::Checkpoint,
                now_ms,
                format!(
                    "flash checkpoint of step {s} is not committed: the group restarted with \
                     rank(s) {:?} of {} not written",
                    dropped.missing(),
                    dropped.parts
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command job (its data its own) of `workers` ranks, every agent registered.
    fn job(workers: u32) -> JobContext {
        let spec = JobSpec::from_yaml(&format!(
            "name: t\nkind: allreduce\nroles:\n  worker: {{ replicas: {workers} }}\n\
             workload:\n  command: [train]\ndata: {{ num_samples: 100, shard_size: 10 }}\n\
             checkpoint: {{ dir: /tmp/brain-flash-test }}\n"
        ))
        .unwrap();
        let (mut ctx, _) = JobContext::new(spec, "t-1".into(), Timing::default(), 0);
        for index in 0..workers {
            let key = SlotKey {
                role: Role::WORKER,
                index,
            };
            ctx.register_agent(key, 1, "h".into(), format!("127.0.0.1:{}", 9000 + index), 1)
                .unwrap();
        }
        ctx
    }

    fn w(index: u32) -> SlotKey {
        SlotKey {
            role: Role::WORKER,
            index,
        }
    }

    fn part(step: u64, rank: u32, parts: u32) -> PartWritten {
        PartWritten {
            step,
            rank,
            parts,
            part: FlashPart {
                path: format!("/c/flash/step-{step}/part-{rank}.bin").into(),
                digest: format!("d{rank}"),
                bytes: 10,
            },
            hurried: false,
        }
    }

    fn events(ctx: &JobContext) -> String {
        ctx.events
            .iter()
            .map(|e| e.text.clone())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_step_is_committed_once_every_part_is_in_and_never_before() {
        let mut ctx = job(3);
        assert_eq!(
            ctx.flash_part_written(w(0), 1, part(7, 0, 3), 5).unwrap(),
            None
        );
        assert_eq!(
            ctx.flash_part_written(w(2), 1, part(7, 2, 3), 6).unwrap(),
            None
        );
        let (step, done) = ctx
            .flash_part_written(w(1), 1, part(7, 1, 3), 7)
            .unwrap()
            .expect("all three in");
        assert_eq!(step, 7);
        assert_eq!(done.written.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
        assert!(ctx.flash.steps.is_empty());
        // A replicated state is one part.
        assert!(
            ctx.flash_part_written(w(0), 1, part(9, 0, 1), 8)
                .unwrap()
                .is_some()
        );
    }

    /// A part whose write-out was hurried (its node's training left it no idle CPU) is said
    /// in the job's events, once; one that was not, never.
    #[test]
    fn a_hurried_write_out_is_said_in_the_events() {
        let mut ctx = job(2);
        ctx.flash_part_written(w(0), 1, part(7, 0, 2), 5).unwrap();
        assert!(!events(&ctx).contains("written out slowly"));
        let hurried = PartWritten {
            hurried: true,
            ..part(7, 1, 2)
        };
        assert!(
            ctx.flash_part_written(w(1), 1, hurried, 6)
                .unwrap()
                .is_some()
        );
        let said = events(&ctx);
        assert_eq!(
            said.matches(
                "worker-1's part 1 of step 7 was written out slowly: its node's \
                          training left the agent's write-out too little CPU"
            )
            .count(),
            1,
            "{said}"
        );
    }

    #[test]
    fn a_step_with_a_part_missing_is_dropped_with_the_ranks_when_a_newer_one_is_complete() {
        let mut ctx = job(2);
        ctx.flash_part_written(w(0), 1, part(4, 0, 2), 1).unwrap();
        ctx.flash_part_written(w(0), 1, part(6, 0, 2), 2).unwrap();
        assert!(
            ctx.flash_part_written(w(1), 1, part(6, 1, 2), 3)
                .unwrap()
                .is_some()
        );
        assert!(
            events(&ctx).contains(
                "flash checkpoint of step 4 is not committed: rank(s) [1] of 2 never wrote \
                 their part (step 6 is complete and newer)"
            ),
            "{}",
            events(&ctx)
        );
        assert!(ctx.flash.steps.is_empty());
    }

    #[test]
    fn a_group_restart_drops_the_steps_partly_written() {
        let mut ctx = job(2);
        ctx.flash_part_written(w(1), 1, part(4, 1, 2), 1).unwrap();
        ctx.group_restart(2, "for the test");
        assert!(ctx.flash.steps.is_empty());
        assert!(events(&ctx).contains(
            "flash checkpoint of step 4 is not committed: the group restarted with rank(s) [0] \
             of 2 not written"
        ));
        // A part the stopped incarnation copied (a save on SIGTERM) comes late: kept apart
        // from the same step's parts of the processes after the restart, never mixed.
        ctx.flash_part_written(w(0), 1, part(4, 0, 2), 3).unwrap();
        assert!(ctx.flash.steps[&4].before_restart);
        assert!(
            ctx.flash_part_written(w(1), 2, part(4, 1, 2), 4)
                .unwrap()
                .is_none()
        );
        assert!(
            events(&ctx).contains("never mixed, the earlier are dropped"),
            "{} {:?}",
            events(&ctx),
            ctx.roles.slots().map(|s| s.incarnation).collect::<Vec<_>>()
        );
        assert_eq!(
            ctx.flash.steps[&4]
                .written
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            [1]
        );
        // Two restarts back: refused.
        ctx.group_restart(5, "again");
        assert!(ctx.flash_part_written(w(0), 1, part(8, 0, 2), 6).is_err());
    }

    /// The ready answers of ranks 0 and 1 (incarnation `inc`) to one rendezvous round.
    fn both_told(ctx: &mut JobContext, inc: u64, now: u64) -> [JoinView; 2] {
        for _ in 0..3 {
            let views = [0, 1].map(|r| ctx.join_rendezvous(w(r), inc, now).unwrap());
            if views.iter().all(|v| v.ready) {
                return views;
            }
        }
        panic!("the round never formed: {:?}", ctx.group)
    }

    /// Seen in CI: a part copied before a group restart is accepted while the new processes
    /// join, and its manifest is written (the lock let go) while rank 0 is told to resume
    /// from the step before; rank 1, told after the commit, resumed from the newer step.
    #[test]
    fn every_member_of_a_round_resumes_from_one_checkpoint_and_a_late_part_never_splits_them() {
        let mut ctx = job(2);
        let g = ctx.generation;
        ctx.flash_part_written(w(0), 1, part(20, 0, 1), 1)
            .unwrap()
            .unwrap();
        ctx.checkpoint_committed(1, "/c/flash/step-20/manifest.json".into(), 20, g, 2)
            .unwrap();
        ctx.group_restart(3, "rank 1 was killed");
        // Old rank 0's copy of step 40 is written out as its successor joins.
        let (step, _) = ctx
            .flash_part_written(w(0), 1, part(40, 0, 1), 4)
            .unwrap()
            .unwrap();
        let first = ctx.join_rendezvous(w(0), 2, 5).unwrap();
        assert!(!first.ready);
        let rank1 = ctx.join_rendezvous(w(1), 2, 6).unwrap();
        assert!(rank1.ready, "{rank1:?}");
        let step20: Option<PathBuf> = Some("/c/flash/step-20/manifest.json".into());
        assert_eq!(rank1.resume_from, step20);
        // The commit lands between the two answers: not committed, and rank 0 is told the same.
        let g = ctx.generation;
        ctx.checkpoint_committed(2, "/c/flash/step-40/manifest.json".into(), step, g, 7)
            .unwrap();
        assert_eq!(ctx.latest_checkpoint().unwrap().step, 20);
        assert!(
            events(&ctx).contains(
                "checkpoint of step 40 is not committed: it was saved by processes the group \
                 has since restarted, and round"
            ),
            "{}",
            events(&ctx)
        );
        let rank0 = ctx.join_rendezvous(w(0), 2, 8).unwrap();
        assert!(rank0.ready);
        assert_eq!(rank0.resume_from, step20);
        // The new group's own saves commit as ever.
        let (step, _) = ctx
            .flash_part_written(w(0), 2, part(30, 0, 1), 9)
            .unwrap()
            .unwrap();
        ctx.checkpoint_committed(3, "/c/flash/step-30/manifest.json".into(), step, g, 10)
            .unwrap();
        assert_eq!(ctx.latest_checkpoint().unwrap().step, 30);

        // So with a synchronous save on SIGTERM by the process a restart stopped.
        ctx.group_restart(11, "again");
        ctx.begin_commit(w(0), 2, 35).unwrap();
        let step30: Option<PathBuf> = Some("/c/flash/step-30/manifest.json".into());
        for v in both_told(&mut ctx, 3, 12) {
            assert_eq!(v.resume_from, step30);
        }
        let g = ctx.generation;
        ctx.checkpoint_committed(4, "/c/sync-35/manifest.json".into(), 35, g, 13)
            .unwrap();
        assert_eq!(ctx.latest_checkpoint().unwrap().step, 30);

        // A late part committed before any member is told: the round resumes from it, all alike.
        ctx.group_restart(14, "once more");
        let (step, _) = ctx
            .flash_part_written(w(0), 3, part(50, 0, 1), 15)
            .unwrap()
            .unwrap();
        let g = ctx.generation;
        ctx.checkpoint_committed(5, "/c/flash/step-50/manifest.json".into(), step, g, 16)
            .unwrap();
        let step50: Option<PathBuf> = Some("/c/flash/step-50/manifest.json".into());
        for v in both_told(&mut ctx, 4, 17) {
            assert_eq!(v.resume_from, step50);
        }
    }

    #[test]
    fn parts_that_cannot_belong_are_refused_with_the_reason() {
        let mut ctx = job(2);
        let e = ctx
            .flash_part_written(w(0), 1, part(3, 2, 2), 1)
            .unwrap_err();
        assert!(e.to_string().contains("part 2 of 2 parts"), "{e}");
        ctx.flash_part_written(w(0), 1, part(3, 0, 2), 1).unwrap();
        let e = ctx
            .flash_part_written(w(1), 1, part(3, 1, 3), 1)
            .unwrap_err();
        assert!(e.to_string().contains("an earlier part said 2"), "{e}");
        // The built-in workload's data is the master's: its checkpoints are at its cuts.
        let mut builtin = super::super::tests::running("allreduce", 0, 2, 1000);
        let e = builtin
            .flash_part_written(w(0), 1, part(3, 0, 1), 1)
            .unwrap_err();
        assert!(e.to_string().contains("consistent cuts"), "{e}");
    }

    /// The built-in allreduce workload of two ranks, a checkpoint due every 2 shards, and
    /// both ranks drained at the cut (2 shards done).
    fn drained_at_a_cut() -> JobContext {
        let mut ctx = super::super::tests::running("allreduce", 0, 2, 2);
        for r in [0, 1] {
            let s = super::super::tests::lease(&mut ctx, w(r), 1).unwrap();
            ctx.shard_done(w(r), 1, s, 2).unwrap();
        }
        assert!(ctx.checkpoint_pending && ctx.ledger.in_flight() == 0);
        assert!(ctx.lease(w(0), 1).unwrap().checkpoint_due);
        ctx
    }

    #[test]
    fn a_cut_held_in_memory_ends_at_once_and_commits_later_with_the_ledger_at_the_cut() {
        let mut ctx = drained_at_a_cut();
        ctx.cut_in_memory(w(0), 1, 5, 10).unwrap();
        assert!(!ctx.checkpoint_pending, "the cut is over");
        assert!(events(&ctx).contains("cut at step 5 held in memory (2 of 10 shards done)"));
        // Training goes on while the copy is written out.
        let s = super::super::tests::lease(&mut ctx, w(0), 1).expect("a lease after the cut");
        ctx.shard_done(w(0), 1, s, 12).unwrap();
        // A part of a step that is no cut is refused; the cut's commits it.
        let e = ctx
            .flash_part_written(w(0), 1, part(6, 0, 1), 13)
            .unwrap_err();
        assert!(e.to_string().contains("not a cut held in memory"), "{e}");
        let (step, _) = ctx
            .flash_part_written(w(0), 1, part(5, 0, 1), 14)
            .unwrap()
            .unwrap();
        let g = ctx.generation;
        let effects = ctx
            .checkpoint_committed(1, "/c/flash/step-5/manifest.json".into(), step, g, 20)
            .unwrap();
        assert!(effects.is_empty(), "{effects:?}");
        let c = ctx.latest_checkpoint().unwrap();
        assert_eq!((c.step, c.taken_at_ms), (5, 10));
        assert!(ctx.flash.cuts.is_empty());
        assert!(
            events(&ctx).contains("the cut held in memory written out 10 ms after it"),
            "{}",
            events(&ctx)
        );
        // A restart rolls the ledger back to the cut, not to the commit: the shard done
        // after the cut is trained again.
        assert_eq!(ctx.ledger.done_shards(), 3);
        ctx.process_exited(w(1), 1, 1, 0, None, 30).unwrap();
        assert_eq!(ctx.ledger.done_shards(), 2);
        assert_eq!(
            ctx.join_rendezvous(w(0), 2, 31).unwrap().resume_from,
            Some("/c/flash/step-5/manifest.json".into())
        );
    }

    #[test]
    fn a_cut_the_job_stops_after_waits_for_its_copy_on_disk() {
        let mut ctx = super::super::tests::running("allreduce", 0, 2, 0);
        let s = super::super::tests::lease(&mut ctx, w(0), 1).unwrap();
        ctx.shard_done(w(0), 1, s, 2).unwrap();
        assert!(ctx.cancel("asked".into(), 3).is_empty());
        ctx.cut_in_memory(w(0), 1, 4, 5).unwrap();
        assert!(ctx.checkpoint_pending && ctx.checkpoint_saving);
        assert!(
            events(&ctx).contains("the job is cancelled after it, so the job waits for it"),
            "{}",
            events(&ctx)
        );
        // Nobody saves it again, nobody trains on.
        let v = ctx.lease(w(1), 1).unwrap();
        assert_eq!((v.outcome, v.checkpoint_due), (LeaseOutcome::Wait, false));
        assert!(ctx.cut_in_memory(w(0), 1, 4, 6).is_err());
        ctx.flash_part_written(w(0), 1, part(4, 0, 1), 7)
            .unwrap()
            .unwrap();
        let g = ctx.generation;
        ctx.checkpoint_committed(1, "/c/m.json".into(), 4, g, 8)
            .unwrap();
        assert!(
            matches!(&ctx.phase, JobPhase::Cancelled { reason } if reason.contains("after checkpoint 1")),
            "{:?}",
            ctx.phase
        );
    }

    #[test]
    fn a_cut_not_written_out_before_a_restart_or_a_newer_checkpoint_is_never_committed() {
        let mut ctx = drained_at_a_cut();
        // Not pending any more: a second word of the same cut is refused.
        ctx.cut_in_memory(w(0), 1, 5, 10).unwrap();
        let e = ctx.cut_in_memory(w(0), 1, 5, 11).unwrap_err();
        assert!(e.to_string().contains("no drained cut is pending"), "{e}");
        ctx.process_exited(w(1), 1, 1, 0, None, 12).unwrap();
        assert!(ctx.flash.cuts.is_empty());
        assert!(
            events(&ctx)
                .contains("the cut held in memory at step 5 is not committed: the group restarted"),
            "{}",
            events(&ctx)
        );
        // The stopped process's agent writes its copy out late: refused.
        assert!(ctx.flash_part_written(w(0), 1, part(5, 0, 1), 13).is_err());
        assert!(ctx.checkpoints.is_empty());

        // Held at step 5, its copy not written out for longer than a routine checkpoint waits
        // for it; then a synchronous save at step 9 commits first: step 5 never is.
        let mut ctx = drained_at_a_cut();
        ctx.cut_in_memory(w(0), 1, 5, 10).unwrap();
        let late = 10 + HELD_CUT_DEFERS_MS;
        for r in [0, 1] {
            let s = super::super::tests::lease(&mut ctx, w(r), 1).unwrap();
            ctx.shard_done(w(r), 1, s, late).unwrap();
        }
        assert!(ctx.checkpoint_pending);
        let g = ctx.generation;
        ctx.checkpoint_committed(1, "/c/sync.json".into(), 9, g, late + 2)
            .unwrap();
        assert!(ctx.flash.cuts.is_empty());
        assert!(events(&ctx).contains(
            "the cut held in memory at step 5 is not committed: it was not written out before \
             the checkpoint of step 9"
        ));
        assert!(
            ctx.flash_part_written(w(0), 1, part(5, 0, 1), late + 3)
                .is_err()
        );
    }

    #[test]
    fn a_routine_checkpoint_waits_for_the_cut_held_in_memory_before_it_to_be_written_out() {
        let both_done = |ctx: &mut JobContext, at| {
            for r in [0, 1] {
                let s = super::super::tests::lease(ctx, w(r), 1).unwrap();
                ctx.shard_done(w(r), 1, s, at).unwrap();
            }
        };
        let mut ctx = drained_at_a_cut();
        ctx.cut_in_memory(w(0), 1, 5, 10).unwrap();
        // Due by its count of shards, but the copy of step 5 is still being written out: a cut
        // now would find no free slot and hold the group for a write to disk.
        both_done(&mut ctx, 12);
        assert!(!ctx.checkpoint_pending);
        let training_goes_on = ctx.lease(w(0), 1).unwrap().outcome;
        assert!(matches!(training_goes_on, LeaseOutcome::Granted(_)));
        // Written out and committed: the next shard done makes it due.
        let (step, _) = ctx
            .flash_part_written(w(0), 1, part(5, 0, 1), 13)
            .unwrap()
            .unwrap();
        let g = ctx.generation;
        ctx.checkpoint_committed(1, "/c/flash/step-5/manifest.json".into(), step, g, 14)
            .unwrap();
        let s = super::super::tests::lease(&mut ctx, w(1), 1).unwrap();
        ctx.shard_done(w(1), 1, s, 15).unwrap();
        assert!(ctx.checkpoint_pending);

        // A copy that is not coming holds the checkpoints back for a while only.
        let mut ctx = drained_at_a_cut();
        ctx.cut_in_memory(w(0), 1, 5, 10).unwrap();
        both_done(&mut ctx, 10 + HELD_CUT_DEFERS_MS - 1);
        assert!(!ctx.checkpoint_pending);
        let s = super::super::tests::lease(&mut ctx, w(0), 1).unwrap();
        ctx.shard_done(w(0), 1, s, 10 + HELD_CUT_DEFERS_MS).unwrap();
        assert!(ctx.checkpoint_pending);
        // ... and that cut goes to disk: rank 0 is refused a copy in memory, saves to disk,
        // and the commit drops the stale copy.
        let late = 10 + HELD_CUT_DEFERS_MS + 1;
        let e = ctx.cut_in_memory(w(0), 1, 9, late).unwrap_err().to_string();
        assert!(
            e.contains(
                "the cut held in memory at step 5 was not written out within 10 min, so \
                 this one goes to disk"
            ),
            "{e}"
        );
        let g = ctx.generation;
        ctx.checkpoint_committed(1, "/c/sync.json".into(), 9, g, late + 1)
            .unwrap();
        assert!(ctx.flash.cuts.is_empty() && !ctx.checkpoint_pending);
    }
}
