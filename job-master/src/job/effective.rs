//! Effective training time: the share of the job's wall time its training group spent making
//! progress that was kept (the figure production reports quote: "97 % over three months").
//!
//! Time between two steps of the training group counts as training when the steps are close
//! (two report intervals or three typical steps apart); a longer gap (a restart, a hang, a
//! plan's pause, waiting for room) counts only one typical step, and the first report of a
//! process (re)started counts nothing before it. When the group restarts from a
//! checkpoint, the training time after that checkpoint was thrown away: it moves from
//! `training_ms` to `lost_ms`.

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

    /// The group restarts from the latest checkpoint (or the start): what it trained since is
    /// lost.
    pub(super) fn training_rolled_back(&mut self) {
        if self.restarts_to_rescale() && self.checkpoints.is_empty() {
            // A command resumes from its own checkpoint, which the master does not know.
            return;
        }
        let kept = self
            .latest_checkpoint()
            .map_or(0, |c| c.training_ms)
            .min(self.training_time.training_ms);
        let t = &mut self.training_time;
        t.lost_ms += t.training_ms - kept;
        t.training_ms = kept;
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
        // A hang of a minute, then steps again after the restart.
        ctx.training_rolled_back();
        assert_eq!(ctx.training_time.training_ms, 9_000);
        assert_eq!(ctx.training_time.lost_ms, 2_000);
        ctx.count_training(20.0, 1000.0, 72_000);
        ctx.count_training(20.0, 1000.0, 73_000);
        assert_eq!(ctx.training_time.training_ms, 9_000 + 20 + 1_000);
        let e = ctx.effective_training(80_000);
        assert_eq!(e.wall_ms, 80_000);
        assert!((e.share - 10_020.0 / 80_000.0).abs() < 1e-9, "{e:?}");
    }
}
