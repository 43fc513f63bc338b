//! Cancelling a job on request (`brainctl cancel` through the brain). A job whose data the
//! master tracks first drains to a consistent cut and takes one last checkpoint, so its work is
//! kept, then ends `cancelled`; the master then stops every process (SIGTERM, SIGKILL after the
//! grace period) as at any end. A job the master cannot checkpoint (a script that reads its own
//! data saves on SIGTERM instead, e.g. with `brain_sdk`'s `save_on_sigterm`), one in the middle
//! of a rescale, or one whose checkpoint does not come within the cut timeout, ends cancelled
//! without one, saying so.

use super::*;

/// A cancel waiting for its last checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cancelling {
    pub reason: String,
    pub since_ms: u64,
}

impl JobContext {
    /// Asks the job to end cancelled for `reason`. A second request changes nothing.
    pub fn cancel(&mut self, reason: String, now_ms: u64) -> Vec<Effect> {
        if self.phase.is_terminal() || self.cancelling.is_some() {
            return Vec::new();
        }
        let why_not = if !self.data_tracked() {
            Some("the master does not track its data; its processes save on SIGTERM")
        } else if self.transition.is_some() {
            Some("a rescale is under way")
        } else if self.ledger.is_complete() {
            Some("every shard is done")
        } else {
            None
        };
        if let Some(why) = why_not {
            self.end_cancelled(format!("{reason} (no last checkpoint: {why})"), now_ms);
            return Vec::new();
        }
        self.log(
            now_ms,
            format!("cancel requested ({reason}): draining leases for a last checkpoint"),
        );
        self.cancelling = Some(Cancelling {
            reason,
            since_ms: now_ms,
        });
        self.checkpoint_pending = true;
        self.ps_checkpoint_if_drained(now_ms)
    }

    /// A checkpoint committed (`Some(id)`) or failed (`None`) while a cancel waited for it.
    pub(super) fn cancel_after_checkpoint(&mut self, id: Option<u64>, now_ms: u64) -> bool {
        let Some(c) = self.cancelling.take() else {
            return false;
        };
        let how = match id {
            Some(id) => format!("after checkpoint {id}"),
            None => "its last checkpoint failed".into(),
        };
        self.end_cancelled(format!("{} ({how})", c.reason), now_ms);
        true
    }

    /// Ends a cancel whose checkpoint did not come within the cut timeout.
    pub(super) fn cancel_if_overdue(&mut self, now_ms: u64) -> bool {
        let limit = self.timing.cut_timeout_ms;
        match &self.cancelling {
            Some(c) if now_ms.saturating_sub(c.since_ms) > limit => {
                let reason = format!("{} (no checkpoint within {limit} ms)", c.reason);
                self.cancelling = None;
                self.end_cancelled(reason, now_ms);
                true
            }
            _ => false,
        }
    }

    fn end_cancelled(&mut self, reason: String, now_ms: u64) {
        self.log(now_ms, format!("job cancelled: {reason}"));
        self.checkpoint_pending = false;
        self.checkpoint_saving = false;
        self.phase = JobPhase::Cancelled { reason };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::tests::{W0, lease, running};
    use crate::scale::{PlanRejection, ScalePlan};

    #[test]
    fn a_cancel_checkpoints_first_then_ends_cancelled_and_takes_no_plan() {
        let mut ctx = running("ps", 1, 1, 0);
        let s = lease(&mut ctx, W0, 1).unwrap();
        ctx.shard_done(W0, 1, s, 3).unwrap();
        let effects = ctx.cancel("operator asked".into(), 4);
        assert!(
            matches!(effects.as_slice(), [Effect::SavePsCheckpoint { id: 1, .. }]),
            "{effects:?}"
        );
        assert_eq!(ctx.phase, JobPhase::Running);
        assert!(
            ctx.cancel("again".into(), 5).is_empty(),
            "a second changes nothing"
        );
        assert!(matches!(
            ctx.apply_plan(ScalePlan::count(1, Role::WORKER, 2), &Default::default(), 5),
            Err(PlanRejection::NotRunning("being cancelled"))
        ));
        ctx.checkpoint_committed(1, "/tmp/m.json".into(), 1, 0, 6)
            .unwrap();
        assert_eq!(
            ctx.phase,
            JobPhase::Cancelled {
                reason: "operator asked (after checkpoint 1)".into()
            }
        );
        assert_eq!(ctx.checkpoints.len(), 1);
        assert!(ctx.cancel("late".into(), 7).is_empty());
    }

    #[test]
    fn a_cancel_whose_checkpoint_never_comes_ends_at_the_cut_timeout() {
        let mut ctx = running("allreduce", 0, 2, 0);
        ctx.cancel("operator asked".into(), 10);
        let limit = ctx.timing.cut_timeout_ms;
        ctx.tick(10 + limit);
        assert_eq!(ctx.phase, JobPhase::Running);
        ctx.tick(11 + limit);
        assert_eq!(
            ctx.phase.reason(),
            Some(format!("operator asked (no checkpoint within {limit} ms)").as_str())
        );
    }
}
