//! Moving a training process to a new one elsewhere: a straggler replaced
//! (`straggler_action: replace`) or shrunk out (`shrink`), or a process on a node the brain
//! cordoned. A ps worker moves alone at once; an all-reduce group (or a ps job's parameter
//! server) first takes a checkpoint at a consistent cut and restarts from it, so nothing
//! trained is lost. The platform places the new process off the nodes the job avoids and the
//! brain cordoned.
//!
//! A shrink keeps the group's indices contiguous (a plan adds and removes at the end): the
//! straggler's index moves as a replacement does, unless it is the last, and the last index
//! leaves the job, so the group goes on one smaller and off the straggler's node.

use super::*;
use crate::spec::StragglerAction;

impl JobContext {
    /// Acts on straggler `key` as the job's `straggler_action` says, `replace` or `shrink`
    /// (see the module's doc); its node is avoided by the job from then on.
    pub(super) fn act_on_straggler(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let action = self.spec.stability.straggler_action;
        if self.group_busy() {
            let what = match action {
                StragglerAction::Shrink => "shrunk out",
                _ => "replaced",
            };
            self.log_as(
                EventKind::Straggler,
                now_ms,
                format!(
                    "{key} is not {what} now: the group is busy (a plan, a hang or a replacement)"
                ),
            );
            return Vec::new();
        }
        self.stability.shrinking =
            action == StragglerAction::Shrink && self.may_shrink(key, now_ms);
        let host = self.roles.slot(key).unwrap().host.clone();
        if let Some(s) = self.stability.stragglers.get_mut(&key) {
            s.replaced = true;
        }
        let mut effects = Vec::new();
        if !host.is_empty() {
            self.stability
                .avoided
                .insert(host.clone(), format!("{key} was a straggler there"));
            effects.push(Effect::AvoidNodes(
                self.stability.avoided.keys().cloned().collect(),
            ));
        }
        effects.extend(self.move_off(key, now_ms));
        effects
    }

    /// A shrink leaves the role at least its `min` (and one process): else the straggler is
    /// replaced, and an event says why.
    fn may_shrink(&mut self, key: SlotKey, now_ms: u64) -> bool {
        let live = self.role_counts().get(&key.role).copied().unwrap_or(0);
        let min = self.spec.role_plan(key.role).map_or(live, |p| p.min).max(1);
        if key.role == self.trainer() && live > min {
            return true;
        }
        self.log_as(
            EventKind::Straggler,
            now_ms,
            format!(
                "{key} is replaced, not shrunk out: its group has {live} {}(s), its min is {min}",
                key.role
            ),
        );
        false
    }

    /// The highest index of `role` still in the job: the one a shrink takes out.
    fn last_live(&self, role: Role) -> Option<SlotKey> {
        self.roles
            .slots()
            .filter(|s| s.key.role == role && s.phase.is_live())
            .map(|s| s.key)
            .max_by_key(|k| k.index)
    }

    /// The shrink under way takes the last index out of the job (see the module's doc); the
    /// straggler's own flag goes with it when it is that last one.
    fn take_last_out(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        self.stability.shrinking = false;
        let Some(last) = self.last_live(key.role) else {
            return Vec::new();
        };
        let effects = self.remove_slot(last, now_ms);
        self.stability.stragglers.remove(&last);
        let left = self.role_counts().get(&key.role).copied().unwrap_or(0);
        if let Some(r) = self.group.rendezvous_mut() {
            r.expected = left;
        }
        effects
    }

    /// A plan, a cancel, a replacement or a hang's capture under way: the group is not moved.
    fn group_busy(&self) -> bool {
        self.transition.is_some()
            || self.cancelling.is_some()
            || self.stability.replace_at_cut.is_some()
            || self.stability.capturing.is_some()
    }

    /// The brain cordoned `nodes` (it says so at every plan poll): a training process running
    /// on one of them moves off it as a straggler replaced does (the platform places no new
    /// process on a cordoned node): a ps worker alone at once, an all-reduce group (or a ps
    /// job's parameter server) restarting from a checkpoint at a cut, which moves every
    /// process off at once. One move at a time; the next poll finds what is left. `None` when
    /// nothing moves now.
    pub fn nodes_cordoned(&mut self, nodes: &[String], now_ms: u64) -> Option<Vec<Effect>> {
        if nodes.is_empty()
            || self.phase != JobPhase::Running
            || self.group_busy()
            || self.ledger.is_complete()
        {
            return None;
        }
        // Workers first: a ps worker moves alone; a parameter server takes a cut.
        let (key, host) = [self.trainer(), Role::PS].iter().find_map(|role| {
            self.roles
                .slots()
                .find(|s| {
                    s.key.role == *role && s.phase == SlotPhase::Running && nodes.contains(&s.host)
                })
                .map(|s| (s.key, s.host.clone()))
        })?;
        self.log_as(
            EventKind::Node,
            now_ms,
            format!("{key} runs on {host}, which the brain cordoned: it moves off"),
        );
        self.stability.moving_off = Some(host);
        Some(self.move_off(key, now_ms))
    }

    /// What a move is, for the events: a straggler replaced, or a process moved off the
    /// cordoned node in `stability.moving_off`.
    fn moving(&self, key: SlotKey) -> (String, String) {
        match &self.stability.moving_off {
            Some(node) => (
                format!("moving {key} off cordoned node {node}"),
                format!("{key} moved off cordoned node {node}"),
            ),
            None if self.stability.shrinking => {
                let live = self.role_counts().get(&key.role).copied().unwrap_or(0);
                let last = self.last_live(key.role).map_or(key.index, |k| k.index);
                let how = if last == key.index {
                    String::new()
                } else {
                    let last = SlotKey {
                        role: key.role,
                        index: last,
                    };
                    format!(" ({key} gets a new process, {last} leaves)")
                };
                (
                    format!("shrinking straggler {key} out{how}"),
                    format!(
                        "straggler {key} shrunk out: the {} group goes on with {}",
                        key.role,
                        live.saturating_sub(1)
                    ),
                )
            }
            None => (
                format!("replacing straggler {key}"),
                format!("straggler {key} replaced"),
            ),
        }
    }

    /// Gives `key` a new process, which the platform places off the nodes avoided and
    /// cordoned (see the module's doc).
    fn move_off(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let host = self.roles.slot(key).unwrap().host.clone();
        let (doing, _) = self.moving(key);
        let mut effects = Vec::new();
        let alone = self.spec.kind == JobKind::Ps
            && key.role == self.trainer()
            && !self.restarts_to_rescale();
        if alone {
            let shrink = self.stability.shrinking;
            let (doing, done) = self.moving(key);
            let last = self.last_live(key.role) == Some(key);
            let what = if shrink && last {
                format!("{done}; its process stops")
            } else {
                format!("{doing}: a new process off {host}")
            };
            self.log_as(EventKind::Straggler, now_ms, what);
            self.stability.moving_off = None;
            if shrink {
                effects.extend(self.take_last_out(key, now_ms));
            }
            if !(shrink && last) {
                self.next_ps_worker_incarnation(key);
                effects.extend(self.relaunch_agent(key, now_ms));
            }
            // The leases released were perhaps the last a checkpoint's drain waited for.
            effects.extend(self.ps_checkpoint_if_drained(now_ms));
        } else if self.data_tracked() && !self.restarts_to_rescale() {
            // The built-in workload or a script on the SDK: it checkpoints at the master's cuts.
            self.log_as(
                EventKind::Straggler,
                now_ms,
                format!(
                    "{doing}: checkpoint at a consistent cut, then the group restarts from it \
                     with a new process off {host}"
                ),
            );
            self.stability.replace_at_cut = Some(key);
            self.checkpoint_pending = true;
            effects.extend(self.ps_checkpoint_if_drained(now_ms));
        } else {
            effects.extend(self.restart_replacing(key, now_ms));
        }
        effects
    }

    /// The group restarts (from the checkpoint just taken) with `key` on a new agent.
    fn restart_replacing(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let (_, done) = self.moving(key);
        self.stability.moving_off = None;
        let mut effects = Vec::new();
        if self.stability.shrinking {
            effects.extend(self.take_last_out(key, now_ms));
        }
        effects.extend(self.group_restart(now_ms, &done));
        if self.roles.slot(key).is_some_and(|s| s.phase.is_live()) {
            effects.extend(self.relaunch_agent(key, now_ms));
        }
        effects
    }

    /// After a checkpoint committed at a cut: the straggler waiting for it is replaced.
    pub(super) fn replace_after_cut(&mut self, now_ms: u64) -> Option<Vec<Effect>> {
        let key = self.stability.replace_at_cut.take()?;
        Some(self.restart_replacing(key, now_ms))
    }
}
