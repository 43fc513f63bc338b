//! How a transition ends: reached (recorded, the next queued plan started) or abandoned
//! before anything moved (what it launched leaves, what it would have removed stays).

use super::*;

impl JobContext {
    pub(super) fn finish_transition(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(t) = self.transition.take() else {
            return Vec::new();
        };
        self.plans.reached = t.plan.version;
        let trainer = self.trainer();
        let awaiting: Vec<SlotKey> =
            self.keys_where(|s| s.key.role == trainer && s.phase == SlotPhase::Running);
        let steps_at_reach = awaiting
            .iter()
            .map(|k| (*k, self.metrics.get(k).map_or(0, |m| m.global_step)))
            .collect();
        self.transitions.push(TransitionRecord {
            version: t.plan.version,
            from: t.from.clone(),
            to: t.to.clone(),
            accepted_ms: t.started_ms,
            reached_ms: now_ms,
            resumed_ms: None,
            awaiting,
            steps_at_reach,
        });
        self.log_as(
            EventKind::Plan,
            now_ms,
            format!(
                "plan {} reached in {} ms: {}",
                t.plan.version,
                now_ms.saturating_sub(t.started_ms),
                Self::describe(&t.to)
            ),
        );
        self.start_queued(now_ms)
    }

    /// The queued plan starts, unless a member of the group's newest round has not heard of
    /// it yet ([`JobContext::round_unheard`]): then it waits, and a tick starts it.
    pub(super) fn start_queued(&mut self, now_ms: u64) -> Vec<Effect> {
        if self.transition.is_some()
            || self.round_unheard()
            || self.phase != JobPhase::Running
            || self.cancelling.is_some()
        {
            return Vec::new();
        }
        match self.plans.queued.take() {
            // Never one older than a plan already reached.
            Some(next) if next.version > self.plans.reached => self.start_transition(next, now_ms),
            _ => Vec::new(),
        }
    }

    /// allreduce: a member of the group's newest round (its process as the round has it) has
    /// not polled its answer yet. A plan that removed it now would tell it "removed" while the
    /// members that heard wait for it in their group's forming (until the collective's
    /// timeout): a plan waits for every member to have heard.
    pub(super) fn round_unheard(&self) -> bool {
        let trainer = self.trainer();
        self.group
            .rendezvous()
            .and_then(|r| r.current())
            .is_some_and(|r| {
                r.members.iter().any(|m| {
                    self.roles
                        .slot(SlotKey {
                            role: trainer,
                            index: m.index,
                        })
                        .is_some_and(|s| {
                            s.phase.is_live()
                                && s.incarnation == m.incarnation
                                && s.told_round < r.number
                        })
                })
            })
    }

    /// Gives up the plan in progress before anything moved: the processes it launched leave,
    /// the ones it would have removed stay, resources are as before. The next queued plan (if
    /// any) starts.
    pub(super) fn abandon_transition(&mut self, why: String, now_ms: u64) -> Vec<Effect> {
        let Some(t) = self.transition.take() else {
            return Vec::new();
        };
        let mut effects = Vec::new();
        let added: Vec<SlotKey> = self.keys_where(|s| {
            s.phase.is_live() && s.key.index >= t.from.get(&s.key.role).copied().unwrap_or(0)
        });
        for key in added {
            effects.extend(self.remove_slot(key, now_ms));
        }
        for s in self.roles.slots_mut() {
            s.migrate_to = None;
            if s.phase == SlotPhase::Removing {
                s.phase = SlotPhase::Running;
            }
        }
        self.roles.set_training_resources(&t.prior_resources);
        for (&role, &n) in &t.from {
            if let Some(g) = self.roles.group_mut(role).filter(|g| g.training) {
                g.desired = n;
            }
        }
        self.checkpoint_pending = false;
        let reason = format!("plan {} abandoned: {why}", t.plan.version);
        self.log_as(
            EventKind::Plan,
            now_ms,
            format!("{reason}; the job goes on with {}", Self::describe(&t.from)),
        );
        self.plans.abandoned = Some(crate::scale::AbandonedPlan {
            version: t.plan.version,
            reason,
        });
        effects.extend(self.start_queued(now_ms));
        effects
    }
}
