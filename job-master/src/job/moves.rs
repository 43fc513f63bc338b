//! Moving a training process to a new one elsewhere: a straggler replaced
//! (`straggler_action: replace`), or a process on a node the brain cordoned. A ps worker moves
//! alone at once; an all-reduce group (or a ps job's parameter server) first takes a checkpoint
//! at a consistent cut and restarts from it, so nothing trained is lost. The platform places
//! the new process off the nodes the job avoids and the brain cordoned.

use super::*;

impl JobContext {
    /// Replaces straggler `key` on another node (see the module's doc).
    pub(super) fn replace_straggler(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        if self.group_busy() {
            self.log_as(
                EventKind::Straggler,
                now_ms,
                format!(
                    "{key} is not replaced now: the group is busy (a plan, a hang or a replacement)"
                ),
            );
            return Vec::new();
        }
        let host = self.slots[&key].host.clone();
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
        let (key, host) = [Role::WORKER, Role::PS].iter().find_map(|role| {
            self.slots
                .values()
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
            None => (
                format!("replacing straggler {key}"),
                format!("straggler {key} replaced"),
            ),
        }
    }

    /// Gives `key` a new process, which the platform places off the nodes avoided and
    /// cordoned (see the module's doc).
    fn move_off(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let host = self.slots[&key].host.clone();
        let (doing, _) = self.moving(key);
        let mut effects = Vec::new();
        let alone = self.spec.kind == JobKind::Ps
            && key.role == Role::WORKER
            && !self.restarts_to_rescale();
        if alone {
            self.log_as(
                EventKind::Straggler,
                now_ms,
                format!("{doing}: a new process off {host}"),
            );
            self.stability.moving_off = None;
            self.ledger.release(&key.role.to_string(), key.index);
            if let Some(c) = self.group.cluster_mut() {
                c.remove_worker(key.index);
            }
            let slot = self.slots.get_mut(&key).expect("live");
            slot.incarnation += 1;
            slot.restart_count += 1;
            effects.extend(self.relaunch_agent(key, now_ms));
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
            effects.extend(self.ps_checkpoint_if_drained());
        } else {
            effects.extend(self.restart_replacing(key, now_ms));
        }
        effects
    }

    /// The group restarts (from the checkpoint just taken) with `key` on a new agent.
    fn restart_replacing(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let (_, done) = self.moving(key);
        self.stability.moving_off = None;
        let mut effects = self.group_restart(now_ms, &done);
        if self.slots.get(&key).is_some_and(|s| s.phase.is_live()) {
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
