//! A damaged checkpoint: a training process found the checkpoint it was told to resume from
//! unreadable (a part missing or short, its SHA-256 not the manifest's, the manifest itself
//! unreadable) and said so (`ReportCheckpointDamaged`). The checkpoint leaves the job's record
//! (its directory stays on disk, for the owner to look at) and the whole training group
//! restarts from the newest checkpoint kept before it, the ledger rolled back to that one's
//! data position, so that no sample is lost or trained twice. Where the job keeps no older
//! checkpoint the job fails, saying so: starting again from nothing would silently throw away
//! all its training.
//!
//! The report is the job's own process speaking about the job's own files: the worst a false
//! one can do is roll its own job back, once per kept checkpoint. It is refused from a stale
//! incarnation (the group restarted since: another rank reported first) and for a manifest
//! the job does not hold.

use super::*;

/// A checkpoint a process found damaged, kept in the job's record so that its id is never
/// given to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DamagedCheckpoint {
    pub id: u64,
    pub step: u64,
    pub manifest: PathBuf,
    /// Who found it, and what it found.
    pub found_by: SlotKey,
    pub problem: String,
    pub at_ms: u64,
}

/// Where the group goes on from after a damaged checkpoint: the checkpoint it restarts from,
/// or none (the job failed: it keeps none older).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub to: Option<(u64, PathBuf)>,
}

/// The longest problem text kept from a process's report.
const MAX_PROBLEM: usize = 1_000;

impl JobContext {
    /// `key` (incarnation `incarnation`) found `manifest`, the checkpoint it resumes from,
    /// damaged: drop it and restart the group from the newest kept before it, or fail the job.
    pub fn checkpoint_damaged(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        manifest: &std::path::Path,
        problem: &str,
        now_ms: u64,
    ) -> Result<(Fallback, Vec<Effect>), Error> {
        self.training(key, incarnation)?;
        if self.phase.is_terminal() {
            return Err(Error::InvalidRequest("the job is over".into()));
        }
        let Some(at) = self.checkpoints.iter().position(|c| c.manifest == manifest) else {
            return Err(Error::InvalidRequest(format!(
                "{} is not a checkpoint this job keeps",
                manifest.display()
            )));
        };
        let problem: String = problem.chars().take(MAX_PROBLEM).collect();
        let bad = self.checkpoints.remove(at);
        self.damaged_checkpoints.push(DamagedCheckpoint {
            id: bad.id,
            step: bad.step,
            manifest: bad.manifest.clone(),
            found_by: key,
            problem: problem.clone(),
            at_ms: now_ms,
        });
        let what = format!(
            "checkpoint {} (step {}) is damaged ({key}: {problem}); it leaves the record and \
             its files stay in {}",
            bad.id,
            bad.step,
            bad.manifest.parent().unwrap_or(&bad.manifest).display()
        );
        let Some(to) = self
            .latest_checkpoint()
            .map(|c| (c.id, c.step, c.manifest.clone()))
        else {
            let keep = self
                .spec
                .checkpoint
                .keep
                .map_or_else(|| "unset".to_string(), |k| k.to_string());
            let reason = format!(
                "{what}; the job keeps no checkpoint before it (checkpoint.keep is {keep}, \
                 {} committed): it fails rather than start again from nothing",
                self.committed_checkpoints()
            );
            self.log_as(EventKind::Fault, now_ms, reason.clone());
            self.phase = JobPhase::Failed { reason };
            return Ok((Fallback { to: None }, Vec::new()));
        };
        let (id, step, path) = to;
        self.log_as(
            EventKind::Fault,
            now_ms,
            format!(
                "{what}; the group falls back to checkpoint {id} (step {step}), the newest \
                 kept before it"
            ),
        );
        let effects = self.group_restart(
            now_ms,
            &format!("checkpoint {} (step {}) is damaged", bad.id, bad.step),
        );
        Ok((
            Fallback {
                to: Some((step, path)),
            },
            effects,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::tests::{PS0, W0, lease, running};

    /// A ps job (a checkpoint every shard) with checkpoints at shards 1 and 2 and a third
    /// shard done since; their manifests.
    fn two_checkpoints() -> (JobContext, PathBuf, PathBuf) {
        let mut ctx = running("ps", 1, 1, 1);
        let mut manifests = Vec::new();
        for id in 1..=3u64 {
            let s = lease(&mut ctx, W0, 1).unwrap();
            ctx.shard_done(W0, 1, s, id * 10).unwrap();
            if id < 3 {
                let m = PathBuf::from(format!("/c/ckpt-{id:06}/manifest.json"));
                ctx.checkpoint_committed(id, m.clone(), id, 0, id * 10 + 1)
                    .unwrap();
                manifests.push(m);
            }
        }
        let second = manifests.pop().unwrap();
        (ctx, manifests.pop().unwrap(), second)
    }

    #[test]
    fn a_damaged_newest_checkpoint_restarts_the_group_from_the_one_before_it() {
        let (mut ctx, first, second) = two_checkpoints();
        assert_eq!(ctx.ledger.done_shards(), 3);
        let generation = ctx.generation;
        let (fallback, _) = ctx
            .checkpoint_damaged(PS0, 1, &second, "part 0 does not match its digest", 40)
            .unwrap();
        assert_eq!(fallback.to, Some((1, first.clone())));
        assert_eq!(ctx.generation, generation + 1, "the group restarted");
        assert_eq!(
            ctx.ledger.done_shards(),
            1,
            "rolled back to the older checkpoint's data position"
        );
        assert_eq!(ctx.latest_checkpoint().unwrap().manifest, first);
        assert_eq!(ctx.damaged_checkpoints.len(), 1);
        let said: Vec<&str> = ctx.events.iter().map(|e| e.text.as_str()).collect();
        assert!(
            said.iter().any(|t| t
                .contains("checkpoint 2 (step 2) is damaged (ps-0: part 0 does not match")
                && t.contains("falls back to checkpoint 1 (step 1)")),
            "{said:#?}"
        );
        // The next checkpoint never takes the damaged one's id (and so its directory).
        assert_eq!(ctx.next_checkpoint_dir().0, 3);
        assert_eq!(ctx.committed_checkpoints(), 2);
        // Another process's report of the same, from before the restart, is stale.
        assert!(matches!(
            ctx.checkpoint_damaged(W0, 1, &second, "same", 41),
            Err(Error::StaleIncarnation { .. })
        ));
        // The group resumes from the older checkpoint, and trains the rest once.
        let view = ctx.join_rendezvous(PS0, 2, 42).unwrap();
        assert_eq!(view.resume_from, Some(first));
        ctx.ledger.verify_exactly_once(false).unwrap();
    }

    #[test]
    fn with_no_older_checkpoint_kept_the_job_fails_saying_why() {
        let (mut ctx, first, second) = two_checkpoints();
        ctx.checkpoint_damaged(PS0, 1, &second, "gone", 40).unwrap();
        let (fallback, _) = ctx
            .checkpoint_damaged(PS0, 2, &first, "manifest.json: unexpected end of file", 50)
            .unwrap();
        assert_eq!(fallback.to, None);
        match &ctx.phase {
            JobPhase::Failed { reason } => assert!(
                reason.contains("checkpoint 1 (step 1) is damaged")
                    && reason.contains("keeps no checkpoint before it"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_manifest_the_job_does_not_keep_changes_nothing() {
        let (mut ctx, _, _) = two_checkpoints();
        let before = ctx.clone();
        let e = ctx
            .checkpoint_damaged(PS0, 1, "/etc/passwd".as_ref(), "x", 40)
            .unwrap_err();
        assert!(
            e.to_string().contains("not a checkpoint this job keeps"),
            "{e}"
        );
        assert_eq!(ctx, before);
    }
}
