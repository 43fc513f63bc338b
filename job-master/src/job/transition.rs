//! Scale plans: acceptance and the transition that carries one out (its end: `transition_end`).

use std::collections::BTreeMap;

use super::*;
use crate::scale::PlanRejection;

impl JobContext {
    /// Live slots of each role.
    pub fn role_counts(&self) -> BTreeMap<Role, u32> {
        let mut counts: BTreeMap<Role, u32> = self.spec.roles.keys().map(|&r| (r, 0)).collect();
        for s in self.all_slots().filter(|s| s.phase.is_live()) {
            *counts.entry(s.key.role).or_default() += 1;
        }
        counts
    }

    /// What the transition in progress is doing, for the status output; empty when idle.
    pub fn transition_status(&self, now_ms: u64) -> String {
        match &self.transition {
            None => match &self.plans.abandoned {
                // Said until a newer plan is reached.
                Some(a) if a.version > self.plans.reached => a.reason.clone(),
                _ => String::new(),
            },
            Some(t) => format!(
                "plan {}: {} for {} ms ({} ms in all){}",
                t.plan.version,
                t.step.name(),
                now_ms.saturating_sub(t.step_started_ms),
                now_ms.saturating_sub(t.started_ms),
                self.plans
                    .queued
                    .as_ref()
                    .map(|q| format!("; plan {} queued", q.version))
                    .unwrap_or_default()
            ),
        }
    }

    /// A scale plan arrives. Rejected (with the reason, nothing changed) or accepted: carried
    /// out now, or queued behind the transition in progress, replacing an older queued plan.
    pub fn apply_plan(
        &mut self,
        mut plan: ScalePlan,
        cap: &Capacity,
        now_ms: u64,
    ) -> Result<Vec<Effect>, PlanRejection> {
        if self.phase != JobPhase::Running {
            return Err(PlanRejection::NotRunning(self.phase.name()));
        }
        if self.cancelling.is_some() {
            return Err(PlanRejection::NotRunning("being cancelled"));
        }
        if self.ledger.is_complete() {
            return Err(PlanRejection::NoDataLeft);
        }
        self.plans.check_version(plan.version)?;
        let live: Vec<SlotKey> = self.keys_where(|s| s.phase.is_live());
        crate::scale::validate(&plan, &self.spec, &self.role_counts(), &live, cap)?;
        self.plans.desired = plan.version;
        // Service and single roles resize now, whatever the training group is doing.
        let mut effects = self.apply_service_targets(&mut plan, now_ms);
        if self.transition.is_none()
            && let Some(q) = self.plans.queued.take()
        {
            // Queued while no transition runs (waiting for a round to be heard, or left by a
            // group restart): the newer plan replaces it, never to be carried out after it.
            self.log_as(
                EventKind::Plan,
                now_ms,
                format!("plan {} replaces queued plan {}", plan.version, q.version),
            );
        }
        if plan.is_empty() && self.transition.is_none() {
            self.plans.reached = plan.version;
            self.log_as(
                EventKind::Plan,
                now_ms,
                format!(
                    "plan {} reached: {}",
                    plan.version,
                    Self::describe(&self.role_counts())
                ),
            );
            return Ok(effects);
        }
        if let Some(t) = &self.transition {
            let replaced = self.plans.queued.replace(plan.clone());
            self.log_as(
                EventKind::Plan,
                now_ms,
                format!(
                    "plan {} queued behind plan {}{}",
                    plan.version,
                    t.plan.version,
                    replaced
                        .map(|r| format!(" (replaces queued plan {})", r.version))
                        .unwrap_or_default()
                ),
            );
            return Ok(effects);
        }
        if self.round_unheard() {
            let version = plan.version;
            self.plans.queued = Some(plan);
            self.log_as(
                EventKind::Plan,
                now_ms,
                format!(
                    "plan {version} waits until every member of the group's newest round has \
                     heard of it"
                ),
            );
            return Ok(effects);
        }
        effects.extend(self.start_transition(plan, now_ms));
        Ok(effects)
    }

    pub(super) fn describe(counts: &BTreeMap<Role, u32>) -> String {
        counts
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// (Re)starts a slot's agent with a new incarnation.
    pub(super) fn launch_slot(&mut self, key: SlotKey, fresh: bool, now_ms: u64) -> Effect {
        let resources = self.roles.group(key.role).and_then(|g| g.resources.clone());
        let slot = self.roles.slot_or_new(key, now_ms);
        slot.relaunched(now_ms);
        slot.service_addr = None;
        slot.ps_version = 0;
        slot.fresh = fresh;
        if let Some(r) = slot.migrate_to.take() {
            slot.resources = Some(r);
            slot.oom_kills = 0;
            slot.memory_peak = 0;
        } else if resources.is_some() {
            slot.resources = resources;
        }
        Effect::LaunchAgent {
            key,
            incarnation: slot.incarnation,
        }
    }

    /// allreduce: `slot`'s process is moved by the plan whose cut is done, and asks to join
    /// the re-formed group: it leaves instead (its successor joins).
    pub(super) fn moves_out(&self, slot: &Slot) -> bool {
        slot.migrate_to.is_some()
            && self.spec.kind == JobKind::Allreduce
            && slot.key.role == self.trainer()
            && self
                .transition
                .as_ref()
                .is_some_and(|t| t.step == Step::Reform)
    }

    /// The slot leaves the job: its agent is told to shut down (and stopped).
    pub(super) fn remove_slot(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let Some(slot) = self.roles.slot_mut(key) else {
            return Vec::new();
        };
        if slot.phase == SlotPhase::Removed {
            return Vec::new();
        }
        slot.phase = SlotPhase::Removed;
        slot.fresh = false;
        slot.migrate_to = None;
        self.ledger.release(&key.role.to_string(), key.index);
        if let Some(c) = self.group.cluster_mut() {
            if key.role == Role::PS {
                c.remove_ps(key.index);
            } else if key.role == Role::WORKER {
                c.remove_worker(key.index);
            }
        }
        if self.evaluator == Some(key) {
            self.evaluator = None;
        }
        self.log(now_ms, format!("{key} left the job"));
        vec![Effect::StopAgent {
            key,
            graceful: true,
        }]
    }

    pub(super) fn start_transition(&mut self, plan: ScalePlan, now_ms: u64) -> Vec<Effect> {
        let from = self.role_counts();
        let prior_resources = self.roles.training_resources();
        let mut to = from.clone();
        for (&role, t) in &plan.roles {
            to.insert(role, t.count);
            if let Some(g) = self.roles.group_mut(role).filter(|g| g.training) {
                g.desired = t.count;
                if let Some(r) = &t.resources {
                    g.resources = Some(r.clone());
                }
            }
        }
        let ps_change = from.get(&Role::PS) != to.get(&Role::PS);
        let trainer = self.trainer();
        let mut effects = Vec::new();
        for (&role, &n) in &to {
            let now = from[&role];
            let nodes = plan.roles.get(&role).map_or(&[][..], |t| &t.nodes[..]);
            for index in now..n {
                let fresh = role == Role::PS;
                let key = SlotKey { role, index };
                effects.push(self.launch_slot(key, fresh, now_ms));
                self.roles.slot_mut(key).expect("just launched").node =
                    nodes.get((index - now) as usize).cloned();
            }
            for index in n..now {
                let key = SlotKey { role, index };
                let slot = self.roles.slot_mut(key).expect("live slot");
                if matches!(slot.phase, SlotPhase::Launching | SlotPhase::Restarting)
                    && role == trainer
                {
                    effects.extend(self.remove_slot(key, now_ms));
                } else {
                    slot.phase = SlotPhase::Removing;
                }
            }
        }
        let restart = self.restarts_to_rescale() && (from != to || !plan.migrations.is_empty());
        let mut state_moves = false;
        for m in &plan.migrations {
            let stateless =
                self.spec.kind == JobKind::Ps && m.key.role == self.trainer() && !restart;
            self.roles.slot_mut(m.key).expect("validated").migrate_to = Some(m.resources.clone());
            self.log(
                now_ms,
                format!("plan {}: migrating {} ({})", plan.version, m.key, m.reason),
            );
            if stateless {
                self.ledger.release(&m.key.role.to_string(), m.key.index);
                if let Some(c) = self.group.cluster_mut() {
                    c.remove_worker(m.key.index);
                }
                effects.push(self.launch_slot(m.key, false, now_ms));
            } else {
                state_moves = true;
            }
        }
        let needs_cut = match self.spec.kind {
            JobKind::Allreduce => {
                (from != to || state_moves)
                    && self
                        .group
                        .rendezvous()
                        .is_some_and(|r| r.current().is_some())
            }
            JobKind::Ps => ps_change || state_moves,
        };
        let rdzv_changes = self.spec.kind == JobKind::Allreduce && (from != to || state_moves);
        // A command that does not re-form in place is rescaled TorchElastic's way: every
        // process gets SIGTERM (its grace period to checkpoint and exit), then the group starts
        // again at the target size with a new rank layout, port and restart count.
        // A script that joins the rendezvous itself is started at once: the group trains on
        // until the processes a plan adds have imported their framework and joined.
        let warm_up = needs_cut
            && self.process_joins()
            && to.get(&self.trainer()) > from.get(&self.trainer());
        let (step, how) = if restart {
            (
                Step::Settle,
                "; the command's processes restart at the new size",
            )
        } else if warm_up {
            (
                Step::Launch,
                "; the group trains on while its new processes start",
            )
        } else if needs_cut {
            (Step::Cut, "; draining to a consistent cut")
        } else {
            (Step::Settle, "")
        };
        let version = plan.version;
        self.log_as(
            EventKind::Plan,
            now_ms,
            format!(
                "plan {version} accepted: {} -> {}{how}",
                Self::describe(&from),
                Self::describe(&to),
            ),
        );
        self.transition = Some(Transition {
            plan,
            started_ms: now_ms,
            step,
            step_started_ms: now_ms,
            from,
            to,
            round_after: 0,
            resharding: false,
            prior_resources,
        });
        if restart {
            effects.extend(self.group_restart(now_ms, &format!("plan {version}")));
            effects.extend(self.advance(now_ms));
            return effects;
        }
        if needs_cut && !warm_up {
            self.checkpoint_pending = true;
            effects.extend(self.ps_checkpoint_if_drained(now_ms));
        } else if rdzv_changes {
            // No round is formed yet: the next one simply has the new size.
            effects.extend(self.on_cut(now_ms));
        }
        effects.extend(self.advance(now_ms));
        effects
    }

    pub(super) fn set_step(&mut self, step: Step, now_ms: u64) {
        if let Some(t) = self.transition.as_mut() {
            let took = now_ms.saturating_sub(t.step_started_ms);
            let (v, old) = (t.plan.version, t.step);
            if old == step {
                return;
            }
            t.step = step;
            t.step_started_ms = now_ms;
            self.log_as(
                EventKind::Plan,
                now_ms,
                format!(
                    "plan {v}: {} done in {took} ms; {}",
                    old.name(),
                    step.name()
                ),
            );
        }
    }

    /// The cut checkpoint is committed (or there was nothing to cut): the part of the plan that
    /// moves state starts.
    pub(super) fn on_cut(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(t) = &self.transition else {
            return Vec::new();
        };
        if !matches!(t.step, Step::Cut | Step::Settle) {
            return Vec::new();
        }
        let to = t.to.clone();
        let ps_change = t.from.get(&Role::PS) != t.to.get(&Role::PS);
        let trainer = self.trainer();
        let migrating: Vec<SlotKey> = self.keys_where(|s| s.migrate_to.is_some());
        let mut effects = Vec::new();
        match self.spec.kind {
            JobKind::Allreduce => {
                let rdzv = self
                    .group
                    .rendezvous_mut()
                    .expect("allreduce jobs have one");
                rdzv.invalidate();
                rdzv.expected = to[&trainer];
                let round_after = rdzv.next_round_number();
                // A moved process still in the old group leaves it at the re-formation, told
                // at its rejoin as a removed member is, and its successor is launched then
                // (`advance`): stopped now, it would break the old group's last collectives
                // (the step rows that tell every rank to re-form). One not running yet is
                // launched anew now.
                for key in migrating {
                    if self.roles.slot(key).unwrap().phase != SlotPhase::Running {
                        effects.push(self.launch_slot(key, false, now_ms));
                    }
                }
                if let Some(t) = self.transition.as_mut() {
                    t.round_after = round_after;
                }
                self.set_step(Step::Reform, now_ms);
            }
            JobKind::Ps => {
                for key in migrating {
                    if let Some(c) = self.group.cluster_mut() {
                        c.remove_ps(key.index);
                    }
                    effects.push(self.launch_slot(key, false, now_ms));
                }
                self.set_step(
                    if ps_change {
                        Step::Reshard
                    } else {
                        Step::Switch
                    },
                    now_ms,
                );
            }
        }
        effects.extend(self.advance(now_ms));
        effects
    }

    /// Every PS of the layout in force has registered (its agent runs it).
    pub(super) fn ps_layout_running(&self) -> bool {
        self.roles
            .slots()
            .filter(|s| s.key.role == Role::PS && s.phase.is_live())
            .all(|s| s.phase == SlotPhase::Running && s.service_addr.is_some())
            && self.group.cluster().is_some_and(PsCluster::ps_complete)
    }
}
