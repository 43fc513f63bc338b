//! The transition's steps (`Step`), each moved on by its own handler once what it waits for
//! has happened: new processes launched, the consistent cut, the PS reshard, the group
//! re-formed, the workers switched to the new PS layout, the plan settled.

use super::*;

/// What a step's handler found: wait for the next event, or look again (the step moved on,
/// or the transition ended).
enum Next {
    Wait,
    Again,
}

impl JobContext {
    /// Moves the transition on when what its step waits for has happened. Called after every
    /// event that can matter; returns what the shell must do next.
    pub fn advance(&mut self, now_ms: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.phase != JobPhase::Running {
            return effects;
        }
        for key in self.keys_where(|s| s.left_to_move) {
            effects.push(self.launch_slot(key, false, now_ms));
        }
        while let Some(step) = self.transition.as_ref().map(|t| t.step) {
            let next = match step {
                Step::Launch => self.launched(now_ms, &mut effects),
                Step::Cut => self.cut_overdue(now_ms, &mut effects),
                Step::Reshard => self.reshard_ps(&mut effects),
                Step::Reform => self.reformed(now_ms, &mut effects),
                Step::Switch => self.switched(now_ms, &mut effects),
                Step::Settle => self.settled(now_ms, &mut effects),
            };
            if let Next::Wait = next {
                break;
            }
        }
        effects
    }

    /// The transition whose step is being advanced.
    fn in_hand(&self) -> &Transition {
        self.transition.as_ref().expect("a step of a transition")
    }

    /// Launch: the new workers have joined (or the register timeout passed): cut next.
    fn launched(&mut self, now_ms: u64, effects: &mut Vec<Effect>) -> Next {
        if self.ledger.is_complete() {
            // The group trained through the rest of the data while the new processes
            // started: nothing is left to train at the new size.
            let why = "every shard was done before the new processes joined".to_string();
            self.plans.queued = None;
            effects.extend(self.abandon_transition(why, now_ms));
            effects.extend(self.check_done(now_ms));
            return Next::Again;
        }
        let t = self.in_hand();
        let waited = now_ms.saturating_sub(t.step_started_ms);
        let (from, to) = (t.from[&self.trainer()], t.to[&self.trainer()]);
        let version = t.plan.version;
        let rdzv = self.group.rendezvous().expect("allreduce jobs have one");
        let late: Vec<u32> = (from..to).filter(|&i| !rdzv.has_joined(i)).collect();
        if !late.is_empty() {
            if waited <= self.timing.register_timeout_ms {
                return Next::Wait;
            }
            self.log(
                now_ms,
                format!(
                    "plan {version}: worker(s) {late:?} have not joined after {waited} ms; \
                     cutting without waiting for them"
                ),
            );
        }
        self.checkpoint_pending = true;
        self.set_step(Step::Cut, now_ms);
        Next::Again
    }

    /// Cut: the cut itself ends the step (`on_cut`); here only its timeout, which gives the
    /// plan up when nothing has moved yet, else restarts the group in the plan's layout.
    fn cut_overdue(&mut self, now_ms: u64, effects: &mut Vec<Effect>) -> Next {
        let t = self.in_hand();
        let waited = now_ms.saturating_sub(t.step_started_ms);
        if waited <= self.timing.cut_timeout_ms {
            return Next::Wait;
        }
        let (nothing_moved, version) = (t.round_after == 0 && !t.resharding, t.plan.version);
        let mut why = format!(
            "its consistent cut was not reached in {waited} ms (every shard lease returned and \
             a checkpoint at the step boundary)"
        );
        if !self.is_builtin() && !self.leased_any {
            why.push_str(
                "; no process of this in_place job ever leased a shard: does the script train \
                 through the Python SDK?",
            );
        }
        if nothing_moved {
            // Nothing has moved yet: give the plan up, keep the old size.
            effects.extend(self.abandon_transition(why, now_ms));
        } else {
            // A second cut after the group already re-formed: restart it from the latest
            // checkpoint, straight in the plan's layout.
            effects.extend(self.group_restart(now_ms, &format!("plan {version}: {why}")));
        }
        Next::Again
    }

    /// Reshard: once every PS of the old and the new layout serves, the keys move (the shell
    /// answers with `reshard_done`).
    fn reshard_ps(&mut self, effects: &mut Vec<Effect>) -> Next {
        let t = self.in_hand();
        if t.resharding {
            return Next::Wait;
        }
        let (from, to, version) = (t.from[&Role::PS], t.to[&Role::PS], t.plan.version);
        let addr = |i: u32| {
            self.roles
                .slot(SlotKey {
                    role: Role::PS,
                    index: i,
                })
                // A PS being removed still serves until every worker switched.
                .filter(|s| matches!(s.phase, SlotPhase::Running | SlotPhase::Removing))
                .and_then(|s| s.service_addr.clone())
        };
        let (Some(old), Some(new)) = (
            (0..from).map(addr).collect::<Option<Vec<_>>>(),
            (0..to).map(addr).collect::<Option<Vec<_>>>(),
        ) else {
            return Next::Wait;
        };
        self.transition.as_mut().expect("checked").resharding = true;
        effects.push(Effect::ReshardPs {
            version,
            from: old,
            to: new,
            generation: self.generation,
        });
        Next::Wait
    }

    /// Reform: the group's round after the cut has formed.
    fn reformed(&mut self, now_ms: u64, effects: &mut Vec<Effect>) -> Next {
        let (round_after, waited) = {
            let t = self.in_hand();
            (t.round_after, now_ms.saturating_sub(t.step_started_ms))
        };
        // A moved process that has not left the old group within the register timeout (stuck,
        // or never asking to join again) is stopped, and its successor launched.
        if waited > self.timing.register_timeout_ms {
            let stuck = self.keys_where(|s| s.migrate_to.is_some() && s.phase.is_live());
            for key in stuck {
                self.log(
                    now_ms,
                    format!(
                        "{key} has not left the old group {waited} ms after the cut: stopped \
                         and launched anew"
                    ),
                );
                effects.push(self.launch_slot(key, false, now_ms));
            }
        }
        let formed = self
            .group
            .rendezvous()
            .and_then(|r| r.current())
            .is_some_and(|r| r.number >= round_after);
        if !formed {
            return Next::Wait;
        }
        self.set_step(Step::Settle, now_ms);
        Next::Again
    }

    /// Switch: every worker uses the new PS layout; lent keys and retired PS go.
    fn switched(&mut self, now_ms: u64, effects: &mut Vec<Effect>) -> Next {
        let layout = self.group.cluster().map_or(0, |c| c.ps_version);
        let trainer = self.trainer();
        let switched = self
            .roles
            .slots()
            .filter(|s| s.key.role == trainer && s.phase == SlotPhase::Running)
            .all(|s| s.ps_version == layout);
        if !(self.ps_layout_running() && switched) {
            return Next::Wait;
        }
        let t = self.in_hand();
        let ps_change = t.from.get(&Role::PS) != t.to.get(&Role::PS);
        if ps_change && let Some(c) = self.group.cluster() {
            effects.push(Effect::DropPs { ps: c.ps_addrs() });
        }
        let retiring: Vec<SlotKey> =
            self.keys_where(|s| s.key.role == Role::PS && s.phase == SlotPhase::Removing);
        for key in retiring {
            effects.extend(self.remove_slot(key, now_ms));
        }
        self.set_step(Step::Settle, now_ms);
        Next::Again
    }

    /// Settle: every process of the plan runs (or has waited out the register timeout
    /// unplaced) and the group has formed at its size: the plan is reached. Workers of the plan
    /// that joined too late for the round re-form the group once more.
    fn settled(&mut self, now_ms: u64, effects: &mut Vec<Effect>) -> Next {
        let t = self.in_hand();
        let (version, round_after) = (t.plan.version, t.round_after);
        let waited = now_ms.saturating_sub(t.step_started_ms);
        let planned = t.to.get(&self.trainer()).copied().unwrap_or(0);
        // A process the platform has found no room for within the register timeout does not
        // hold the plan: it is reached without it (the brain sees it pending and may give it
        // up). Waiting on would keep the plan in Settle, where every routine checkpoint
        // re-forms the group (seen in the Ray chaos soak: a worker unplaceable after its node
        // was lost, the group re-formed every 8 shards with a 30 s wait each).
        let wait = self.timing.register_timeout_ms;
        let unplaced: Vec<SlotKey> = self.keys_where(|s| {
            s.phase == SlotPhase::Launching
                && !s.placed
                && now_ms.saturating_sub(s.last_heartbeat_ms) >= wait
        });
        let trainer = self.trainer();
        let unplaced_workers = unplaced.iter().filter(|k| k.role == trainer).count() as u32;
        if let Some(r) = self.rendezvous_now() {
            // Only the plan's own workers are worth re-forming for: one past its size is told
            // at the next round that it was removed.
            let late = r
                .late_joiners()
                .map(|(closed, late)| (closed, late.into_iter().filter(|&i| i < planned).collect()))
                .filter(|(_, late): &(u64, Vec<u32>)| !late.is_empty());
            if let Some((closed, late)) = late {
                return self.reform_for_late(version, closed, &late, now_ms, effects);
            }
            // A worker on its way that has not joined yet gets as long as last call would have
            // given it; not one unplaced past the register timeout, which last call waited
            // for already: a routine checkpoint committed meanwhile would re-form the group
            // for it again, and again at the next (seen in the Ray chaos soak in CI: a plan
            // re-formed at every checkpoint for 6 minutes, 30 s each, for a worker Ray had
            // no room for).
            if r.launching > unplaced_workers && waited < r.launch_wait_ms {
                return Next::Wait;
            }
        }
        let settled = self.roles.slots().all(|s| {
            unplaced.contains(&s.key)
                || !matches!(
                    s.phase,
                    SlotPhase::Removing | SlotPhase::Launching | SlotPhase::Restarting
                ) && s.migrate_to.is_none()
        });
        let formed = self.spec.kind == JobKind::Ps
            || self
                .group
                .rendezvous()
                .and_then(|r| r.current())
                .is_some_and(|r| r.number >= round_after);
        if !(settled && formed) {
            return Next::Wait;
        }
        if !unplaced.is_empty() {
            self.log_as(
                EventKind::Plan,
                now_ms,
                format!(
                    "plan {version}: reached without {}, still waiting for room after {} s",
                    listed(&unplaced),
                    wait / 1000
                ),
            );
        }
        effects.extend(self.finish_transition(now_ms));
        Next::Again
    }

    /// Workers of plan `version` joined after round `closed` closed without them (their
    /// platform was slow): re-form once more with them, after a cut, or (a command) by
    /// restarting the group again.
    fn reform_for_late(
        &mut self,
        version: u64,
        closed: u64,
        late: &[u32],
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Next {
        let why = format!(
            "plan {version}: worker(s) {late:?} joined after round {closed} closed without them"
        );
        if self.restarts_to_rescale() {
            effects.extend(self.group_restart(now_ms, &why));
            return Next::Again;
        }
        self.log_as(EventKind::Plan, now_ms, format!("{why}; re-forming"));
        self.checkpoint_pending = true;
        self.set_step(Step::Cut, now_ms);
        Next::Wait
    }
}

/// `keys` as `worker-1, worker-2`.
fn listed(keys: &[SlotKey]) -> String {
    keys.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
