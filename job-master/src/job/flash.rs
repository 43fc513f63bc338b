//! Flash checkpoints, the job master's half: the parts that the agents wrote out of their
//! processes' shared memory (`worker-agent/src/flash.rs`), gathered per step. A step is
//! committed once every part of it is in (the caller writes its manifest, then records it as
//! the checkpoint to restore from); never with a part missing. A partly written step is dropped,
//! with the ranks missing in the job's events, when a newer step is complete or the group
//! restarts (its processes are gone).

use super::*;

/// The steps whose parts are coming in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlashParts {
    pub steps: BTreeMap<u64, FlashStep>,
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
        self.may_commit(key, incarnation)?;
        if self.data_tracked() {
            return Err(Error::InvalidRequest(format!(
                "flash checkpoint of step {}: this job's data is leased by the job master, so \
                 its checkpoints are taken at the master's consistent cuts (the SDK saves there \
                 itself); a flash save anywhere else would not match the shards done",
                w.step
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
        let before_restart = self.current(key, incarnation).is_err();
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

    /// The group restarts: the steps partly written are dropped (the processes that were to
    /// write the rest are gone), each with the ranks missing.
    pub(super) fn flash_dropped_on_restart(&mut self, now_ms: u64) {
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
            ctx.slots
                .values()
                .map(|s| s.incarnation)
                .collect::<Vec<_>>()
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
}
