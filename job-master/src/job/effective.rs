//! Effective training time: the share of the job's wall time its training group spent making
//! progress that was kept (the figure production reports quote: "97 % over three months").
//!
//! Time between two steps of the training group counts as training when the steps are close
//! (two report intervals or three typical steps apart); a longer gap (a restart, a hang, a
//! plan's pause, waiting for room) counts only one typical step, and the first report of a
//! process (re)started counts nothing before it. When the group restarts from a
//! checkpoint, the training time after that checkpoint was thrown away: it moves from
//! `training_ms` to `lost_ms`, and the restart's [`WorkLost`] says how much, in steps too (those
//! the group's processes reported past the checkpoint).

use super::*;

/// Steps this far apart, or closer, are one stretch of training, whatever the reports' pace.
const CONTIGUOUS_MS: u64 = 1_500;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingTime {
    /// When a training process last reported a new step.
    pub last_step_ms: Option<u64>,
    /// Training whose work was kept, ms.
    pub training_ms: u64,
    /// Training thrown away by restarts from an earlier checkpoint, ms.
    pub lost_ms: u64,
    /// The furthest step the processes of this generation reported.
    #[serde(default)]
    pub step: u64,
    /// What each group restart threw away, in order.
    #[serde(default)]
    pub losses: Vec<WorkLost>,
}

/// The work a group restart threw away: the training since the checkpoint it resumed from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkLost {
    pub at_ms: u64,
    /// What restarted the group.
    pub why: String,
    /// The checkpoint it went back to (`None`: the start), and that checkpoint's step.
    pub checkpoint: Option<u64>,
    pub from_step: u64,
    /// Steps reported past it, and training time since it, thrown away.
    pub steps: u64,
    pub ms: u64,
}

impl WorkLost {
    /// "N steps and S s of training since checkpoint C (step K)".
    pub fn describe(&self) -> String {
        let since = match self.checkpoint {
            Some(id) => format!("checkpoint {id} (step {})", self.from_step),
            None => "the start".into(),
        };
        format!(
            "{} steps and {:.1} s of training since {since}",
            self.steps,
            self.ms as f64 / 1000.0
        )
    }
}

impl JobContext {
    /// A training process reported a new step at `now_ms`; a step takes it `typical_ms`, and
    /// it reports every `report_gap_ms`.
    pub(super) fn count_training(&mut self, typical_ms: f64, report_gap_ms: f64, now_ms: u64) {
        let t = &mut self.training_time;
        if let Some(last) = t.last_step_ms {
            let gap = now_ms.saturating_sub(last);
            let close = CONTIGUOUS_MS
                .max((3.0 * typical_ms) as u64)
                .max((2.0 * report_gap_ms) as u64);
            t.training_ms += if gap <= close {
                gap
            } else {
                gap.min(typical_ms as u64)
            };
        }
        t.last_step_ms = Some(now_ms);
    }

    /// A process (re)started reported its first step: the time before it was not training.
    pub(super) fn training_resumed(&mut self, now_ms: u64) {
        self.training_time.last_step_ms = Some(now_ms);
    }

    /// The group restarts (for `why`) from the latest checkpoint (or the start): what it
    /// trained since is lost. `None` for a command that resumes from a checkpoint of its own,
    /// which the master does not know.
    pub(super) fn training_rolled_back(&mut self, why: &str, now_ms: u64) -> Option<WorkLost> {
        if self.restarts_to_rescale() && self.checkpoints.is_empty() {
            return None;
        }
        let (checkpoint, from_step, kept) = match self.latest_checkpoint() {
            Some(c) => (Some(c.id), c.step, c.training_ms),
            None => (None, 0, 0),
        };
        let t = &mut self.training_time;
        let kept = kept.min(t.training_ms);
        let lost = WorkLost {
            at_ms: now_ms,
            why: why.to_string(),
            checkpoint,
            from_step,
            steps: t.step.saturating_sub(from_step),
            ms: t.training_ms - kept,
        };
        t.lost_ms += lost.ms;
        t.training_ms = kept;
        t.step = from_step;
        t.losses.push(lost.clone());
        Some(lost)
    }

    /// A process of the current generation reported reaching `step`.
    pub(super) fn step_reported(&mut self, step: u64) {
        let t = &mut self.training_time;
        t.step = t.step.max(step);
    }

    /// Wall time, effective training time and the time thrown away, at `now_ms`.
    pub fn effective_training(&self, now_ms: u64) -> vocab::report::EffectiveTraining {
        let wall_ms = now_ms.saturating_sub(self.started_at_ms);
        let t = &self.training_time;
        vocab::report::EffectiveTraining {
            wall_ms,
            training_ms: t.training_ms.min(wall_ms),
            lost_ms: t.lost_ms,
            share: if wall_ms == 0 {
                0.0
            } else {
                t.training_ms.min(wall_ms) as f64 / wall_ms as f64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::running;
    use super::*;

    #[test]
    fn steady_steps_count_gaps_do_not_and_a_rollback_loses_what_followed_the_checkpoint() {
        let mut ctx = running("allreduce", 0, 2, 1000);
        for t in (1_000..=10_000).step_by(1_000) {
            ctx.count_training(20.0, 1000.0, t);
        }
        assert_eq!(ctx.training_time.training_ms, 9_000);
        ctx.checkpoints.push(CheckpointRecord {
            id: 1,
            manifest: "/m".into(),
            ledger: ctx.ledger.snapshot(),
            taken_at_ms: 10_000,
            step: 500,
            training_ms: 9_000,
        });
        ctx.count_training(20.0, 1000.0, 11_000);
        ctx.count_training(20.0, 1000.0, 12_000);
        ctx.step_reported(530);
        ctx.step_reported(540);
        // A hang of a minute, then steps again after the restart.
        let lost = ctx.training_rolled_back("hung", 72_000).unwrap();
        assert_eq!(ctx.training_time.training_ms, 9_000);
        assert_eq!(ctx.training_time.lost_ms, 2_000);
        assert_eq!((lost.steps, lost.ms, lost.from_step), (40, 2_000, 500));
        assert_eq!(
            lost.describe(),
            "40 steps and 2.0 s of training since checkpoint 1 (step 500)"
        );
        // A second restart before any new step loses nothing more.
        let again = ctx.training_rolled_back("again", 72_500).unwrap();
        assert_eq!((again.steps, again.ms), (0, 0));
        assert_eq!(ctx.training_time.losses.len(), 2);
        ctx.count_training(20.0, 1000.0, 72_000);
        ctx.count_training(20.0, 1000.0, 73_000);
        assert_eq!(ctx.training_time.training_ms, 9_000 + 20 + 1_000);
        let e = ctx.effective_training(80_000);
        assert_eq!(e.wall_ms, 80_000);
        assert!((e.share - 10_020.0 / 80_000.0).abs() < 1e-9, "{e:?}");
    }
}
