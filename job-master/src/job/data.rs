//! Data and progress: shard leases, metrics, completion and the timer (the rendezvous a
//! process joins is `join.rs`).

use super::*;

impl JobContext {
    #[cfg(test)]
    pub fn lease(&mut self, key: SlotKey, incarnation: u64) -> Result<LeaseView, Error> {
        self.lease_with(key, incarnation, None, None, 0)
            .map(|(v, _)| v)
    }

    /// A lease request; a ps worker says which PS-set version it uses (`ps_version`), an
    /// allreduce member may say which rendezvous round it trains in (`round`).
    pub fn lease_with(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        ps_version: Option<u64>,
        round: Option<u64>,
        now_ms: u64,
    ) -> Result<(LeaseView, Vec<Effect>), Error> {
        self.training(key, incarnation)?;
        self.check_round(key, round)?;
        self.leased_any = true;
        let holder = Self::holder(key, incarnation);
        let mut effects = Vec::new();
        let layout = self.group.cluster().map_or(0, |c| c.ps_version);
        let phase = self.roles.slot(key).unwrap().phase;
        let ps_worker = self.spec.kind == JobKind::Ps && key.role == self.trainer();
        // An allreduce member being removed stays in the ring until the group re-forms.
        if phase == SlotPhase::Removed || (ps_worker && phase == SlotPhase::Removing) {
            // A removed ps worker hands back what it holds and leaves.
            if ps_worker {
                self.ledger.release(&key.role.to_string(), key.index);
                effects.extend(self.remove_slot(key, now_ms));
            }
            let mut v = LeaseView::of(LeaseOutcome::Wait);
            v.removed = true;
            return Ok((v, effects));
        }
        if let Some(v) = ps_version {
            self.roles.slot_mut(key).expect("checked").ps_version = v;
        }
        let step = self.transition.as_ref().map(|t| t.step);
        if ps_worker {
            let switching = matches!(step, Some(Step::Reshard))
                || (step == Some(Step::Switch) && !self.ps_layout_running());
            if switching || ps_version.is_some_and(|v| v != layout) {
                effects.extend(self.advance(now_ms));
                let mut v = LeaseView::of(LeaseOutcome::Wait);
                v.ps_version = layout;
                return Ok((v, effects));
            }
        }
        if self.checkpoint_pending {
            // Drain for a consistent cut: a holder retrying gets its shard again, nobody a new one.
            let mut v = match self.ledger.held_by(&holder) {
                Some(s) => LeaseView::of(LeaseOutcome::Granted(s)),
                None => {
                    let mut v = LeaseView::of(LeaseOutcome::Wait);
                    // A cut held in memory that the job waits to see written out is taken.
                    v.checkpoint_due =
                        self.spec.kind == JobKind::Allreduce && !self.checkpoint_saving;
                    v
                }
            };
            v.ps_version = layout;
            return Ok((v, effects));
        }
        if step == Some(Step::Reform) || self.late_reform_reforming() {
            let mut v = LeaseView::of(LeaseOutcome::Wait);
            v.reform = true;
            return Ok((v, effects));
        }
        let outcome = self.ledger.lease(&holder);
        let mut v = LeaseView::of(outcome);
        if v.outcome == LeaseOutcome::EndOfData {
            let evaluator = *self.evaluator.get_or_insert(key);
            v.evaluate = evaluator == key;
        }
        v.ps_version = layout;
        effects.extend(self.advance(now_ms));
        Ok((v, effects))
    }

    /// An allreduce member that names its round must be in the current one: a process left
    /// behind by a re-formation must not take data the new group trains on.
    fn check_round(&self, key: SlotKey, round: Option<u64>) -> Result<(), Error> {
        let current = self.group.rendezvous().and_then(|r| r.current());
        match (round, current) {
            (Some(got), Some(c)) if got != c.number => Err(Error::StaleRound {
                role: key.role.to_string(),
                index: key.index,
                got,
                current: c.number,
            }),
            _ => Ok(()),
        }
    }

    /// `key` applied every sample of shard `shard` to the model.
    pub fn shard_done(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        shard: u64,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        self.training(key, incarnation)?;
        let holder = Self::holder(key, incarnation);
        self.ledger.complete(&holder, shard).map_err(|e| match e {
            crate::ledger::LedgerError::UnknownShard(id) => Error::UnknownShard(id),
            _ => Error::NotLeased {
                shard,
                holder: holder.to_string(),
            },
        })?;
        self.shards_since_checkpoint += 1;
        let every = self.spec.checkpoint.every_shards as u64;
        if every > 0
            && self.shards_since_checkpoint >= every
            && !self.ledger.is_complete()
            && !self.checkpoint_pending
            && !self.routine_cut_waits_for_write(now_ms)
        {
            self.checkpoint_pending = true;
            self.log(
                now_ms,
                format!(
                    "checkpoint due after {} shards: draining leases",
                    self.shards_since_checkpoint
                ),
            );
        }
        let mut effects = self.ps_checkpoint_if_drained(now_ms);
        effects.extend(self.check_done(now_ms));
        Ok(effects)
    }

    pub fn report_metrics(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        m: MetricsRecord,
        final_eval_loss: Option<f64>,
        final_model_digest: Option<String>,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        self.training(key, incarnation)?;
        for (name, v) in [
            ("loss", m.loss),
            ("samples_per_second", m.samples_per_second),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::InvalidRequest(format!(
                    "metric {name} is {v}: it must be finite and non-negative"
                )));
            }
        }
        if m.global_step > 0 && self.first_step_at_ms.is_none() {
            self.first_step_at_ms = Some(now_ms);
            self.log(
                now_ms,
                format!(
                    "first training step after {} ms",
                    now_ms - self.started_at_ms
                ),
            );
        }
        if let Some(r) = self.transitions.last_mut()
            && r.resumed_ms.is_none()
            && m.global_step > r.steps_at_reach.get(&key).copied().unwrap_or(0)
        {
            r.awaiting.retain(|k| *k != key);
            if r.awaiting.is_empty() {
                r.resumed_ms = Some(now_ms);
                let (v, ms) = (r.version, now_ms.saturating_sub(r.accepted_ms));
                self.log_as(
                    EventKind::Plan,
                    now_ms,
                    format!("plan {v}: every worker is training again, {ms} ms after the plan"),
                );
            }
        }
        self.step_reported(m.global_step);
        let mut effects = self.observe_steps(
            key,
            incarnation,
            m.global_step,
            m.steps,
            m.compute_seconds,
            now_ms,
        );
        self.metrics.insert(key, m);
        if let Some(loss) = final_eval_loss {
            if !loss.is_finite() {
                return Err(Error::InvalidRequest(format!("final_eval_loss is {loss}")));
            }
            if self.evaluator == Some(key) {
                self.final_eval_loss = Some(loss);
                self.final_model_digest = final_model_digest;
                self.log(
                    now_ms,
                    format!("final held-out log-loss {loss:.5} (evaluated by {key})"),
                );
                effects.extend(self.check_done(now_ms));
            }
        }
        Ok(effects)
    }

    /// The job's work is over when every worker exited 0 and, for the built-in workload, every
    /// shard is done and the final model was evaluated; for a script that leased shards (the
    /// SDK), every shard is done (else the job fails, saying so).
    pub(super) fn check_done(&mut self, now_ms: u64) -> Vec<Effect> {
        if self.phase != JobPhase::Running {
            return Vec::new();
        }
        let trainer = self.trainer();
        let chief = SlotKey {
            role: trainer,
            index: 0,
        };
        // A ps command runs TF's ParameterServerStrategy: worker 0 is the chief and the only
        // task that ends on its own (TFJob's success policy); the other servers are stopped.
        let chief_done = self.spec.kind == JobKind::Ps
            && self.restarts_to_rescale()
            && self
                .roles
                .slot(chief)
                .is_some_and(|s| s.phase == SlotPhase::Succeeded);
        let data_done = if self.is_builtin() {
            self.ledger.is_complete() && self.final_eval_loss.is_some()
        } else {
            // A script that leases its shards through the SDK is done when they all are.
            !self.leased_any || self.ledger.is_complete()
        };
        // Once the data says the work is over (every shard done, and evaluated for the
        // built-in workload), a worker still waiting to be started (its node lost, no room
        // anywhere) has nothing left to do: it must not hold the job open for ever. A script
        // that leases nothing has only its workers' exits to say it is over.
        let data_accounted = data_done && (self.is_builtin() || self.leased_any);
        let trainers: Vec<&Slot> = self
            .roles
            .slots()
            .filter(|s| s.key.role == trainer && s.phase.is_live())
            .collect();
        // So must an all-reduce worker that registered after the group that did the work
        // formed without it, and waits to join a round that never comes: its process not
        // started (seen in CI's Ray chaos soak, a worker placed 40 s late), or, for a script
        // that joins itself, started and waiting at the rendezvous (one that started late).
        let round = self.group.rendezvous().and_then(|r| r.current());
        let joins = self.process_joins();
        let outside = |s: &Slot| {
            matches!(s.phase, SlotPhase::Running | SlotPhase::Restarting)
                && (s.process_pid == 0 || joins)
                && round.is_some_and(|r| {
                    !r.members
                        .iter()
                        .any(|m| m.index == s.key.index && m.incarnation == s.incarnation)
                })
        };
        let unstarted: Vec<SlotKey> = trainers
            .iter()
            .filter(|s| data_accounted && (s.phase == SlotPhase::Launching || outside(s)))
            .map(|s| s.key)
            .collect();
        let workers_done = chief_done
            || ((unstarted.is_empty() || trainers.iter().any(|s| s.phase == SlotPhase::Succeeded))
                && trainers
                    .iter()
                    .all(|s| s.phase == SlotPhase::Succeeded || unstarted.contains(&s.key)));
        if workers_done && data_done {
            for key in unstarted {
                let how = match self.roles.slot(key).map(|s| (s.phase, s.process_pid)) {
                    Some((SlotPhase::Launching, _)) => "was never started (still pending)",
                    Some((_, 0)) => {
                        "never joined the group that did the work (its process not started)"
                    }
                    _ => "never joined the group that did the work (its process waits to join)",
                };
                self.log(
                    now_ms,
                    format!(
                        "{key} {how} and the data is all done: it is not needed, and is \
                         stopped with the job"
                    ),
                );
            }
            self.phase = JobPhase::Finishing;
            return vec![Effect::Finish];
        }
        if workers_done && !self.is_builtin() {
            let reason = format!(
                "every worker exited 0 with {} of {} shards done: the script stopped leasing \
                 before the end of its data",
                self.ledger.done_shards(),
                self.ledger.total_shards()
            );
            self.fail(reason, now_ms);
        }
        Vec::new()
    }

    /// The shell collected what it needed: the job succeeded.
    pub fn finish(&mut self, now_ms: u64) {
        if self.phase == JobPhase::Finishing {
            self.phase = JobPhase::Succeeded;
            self.log(now_ms, "job succeeded".into());
        }
    }

    pub fn fail(&mut self, reason: String, now_ms: u64) {
        if !self.phase.is_terminal() {
            self.log_as(EventKind::Fault, now_ms, format!("job failed: {reason}"));
            self.phase = JobPhase::Failed { reason };
        }
    }

    /// Timers: heartbeat timeouts and the rendezvous last call.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Effect> {
        self.tick_changed(now_ms).0
    }

    /// [`Self::tick`], also saying whether anything that must survive a restart changed (a
    /// round closed, an agent was declared lost); most ticks change nothing.
    pub fn tick_changed(&mut self, now_ms: u64) -> (Vec<Effect>, bool) {
        if self.phase.is_terminal() {
            return (Vec::new(), false);
        }
        if self.cancel_if_overdue(now_ms) {
            return (Vec::new(), true);
        }
        let closed = self.rendezvous_now().is_some_and(|r| r.try_close(now_ms));
        let (heartbeat, register, grace) = (
            self.timing.heartbeat_timeout_ms,
            self.timing.register_timeout_ms,
            self.grace_period_ms(),
        );
        let late: Vec<(SlotKey, u64, u64)> = self
            .all_slots()
            .filter(|s| s.phase != SlotPhase::Removed)
            // Waiting for room is not a failure: the platform says when it gives up placing.
            .filter(|s| s.phase != SlotPhase::Launching || s.placed)
            .filter(|s| {
                let limit = match s.phase {
                    SlotPhase::Launching => register,
                    // The agent may be waiting out its process's grace period.
                    SlotPhase::Restarting => heartbeat + grace,
                    _ => heartbeat,
                };
                now_ms.saturating_sub(s.last_heartbeat_ms) > limit
            })
            .map(|s| (s.key, s.incarnation, now_ms - s.last_heartbeat_ms))
            .collect();
        let marker = (
            self.transition.as_ref().map(|t| t.step),
            self.plans.reached,
            self.late_reform,
        );
        let mut effects = self.advance(now_ms);
        effects.extend(self.start_queued(now_ms));
        effects.extend(self.take_in_late_joiners(now_ms));
        let moved = marker
            != (
                self.transition.as_ref().map(|t| t.step),
                self.plans.reached,
                self.late_reform,
            );
        let capturing = self.stability.capturing.is_some();
        effects.extend(self.check_hangs(now_ms));
        let hang = capturing != self.stability.capturing.is_some();
        let changed = closed || moved || hang || !late.is_empty() || !effects.is_empty();
        for (key, inc, silent) in late {
            effects.extend(self.agent_lost(
                key,
                inc,
                format!("no heartbeat for {silent} ms"),
                now_ms,
            ));
        }
        (effects, changed)
    }

    /// The workers' progress: step (the highest for allreduce, the sum for ps), summed
    /// throughput of the workers that are running, and their mean training loss.
    pub fn progress(&self) -> (u64, f64, f64) {
        let trainer = self.trainer();
        let workers: Vec<(&SlotKey, &MetricsRecord)> = self
            .metrics
            .iter()
            .filter(|(k, _)| k.role == trainer)
            .collect();
        let step = match self.spec.kind {
            JobKind::Allreduce => workers
                .iter()
                .map(|(_, m)| m.global_step)
                .max()
                .unwrap_or(0),
            JobKind::Ps => workers.iter().map(|(_, m)| m.global_step).sum(),
        };
        let sps = workers
            .iter()
            .filter(|(k, _)| {
                self.roles
                    .slot(**k)
                    .is_some_and(|s| s.phase == SlotPhase::Running)
            })
            .map(|(_, m)| m.samples_per_second)
            .sum();
        let loss = if workers.is_empty() {
            0.0
        } else {
            workers.iter().map(|(_, m)| m.loss).sum::<f64>() / workers.len() as f64
        };
        (step, sps, loss)
    }
}
