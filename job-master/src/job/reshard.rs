//! The PS reshard of a transition, and a transition that cannot go on collapsing into a
//! group restart in the target layout.

use super::*;

impl JobContext {
    /// The PS moved their keys (the shell also checked the digests around the move).
    pub fn reshard_done(
        &mut self,
        generation: u64,
        record: ReshardRecord,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        let ok = generation == self.generation
            && self
                .transition
                .as_ref()
                .is_some_and(|t| t.step == Step::Reshard && t.plan.version == record.version);
        if !ok {
            return Err(Error::InvalidRequest(format!(
                "reshard for plan {} is not the one in progress",
                record.version
            )));
        }
        if record.digest_before != record.digest_after {
            let why = format!(
                "reshard for plan {} changed the parameters (digest {:016x} before, {:016x} after)",
                record.version, record.digest_before, record.digest_after
            );
            return Ok(self.group_restart(now_ms, &why));
        }
        let to = record.to_ps;
        if let Some(c) = self.group.cluster_mut() {
            c.expected_ps = to;
            c.ps.retain(|&i, _| i < to);
            c.ps_version += 1;
            c.version += 1;
        }
        let mut new_ps = Vec::new();
        for s in self.roles.slots_mut() {
            if s.fresh {
                s.fresh = false;
                new_ps.push((s.key.index, s.service_addr.clone().unwrap_or_default()));
            }
        }
        for (i, addr) in new_ps {
            if let Some(c) = self.group.cluster_mut() {
                c.ps.insert(i, addr);
            }
        }
        self.log_as(EventKind::Plan,
            now_ms,
            format!(
                "plan {}: ps {} -> {} moved {} of {} keys ({} bytes) in {} ms; parameter digest {:016x} before and after",
                record.version,
                record.from_ps,
                record.to_ps,
                record.moved_keys,
                record.total_keys,
                record.moved_bytes,
                record.took_ms,
                record.digest_after
            ),
        );
        self.reshards.push(record);
        self.set_step(Step::Switch, now_ms);
        Ok(self.advance(now_ms))
    }

    /// The reshard could not finish: PS state may be half moved, so the group restarts from
    /// the cut checkpoint in the target layout.
    pub fn reshard_failed(&mut self, generation: u64, problem: String, now_ms: u64) -> Vec<Effect> {
        if generation != self.generation || self.phase != JobPhase::Running {
            return Vec::new();
        }
        self.group_restart(now_ms, &format!("reshard failed ({problem})"))
    }

    /// A group restart in the middle of a transition: the restart itself carries the plan out.
    /// Removed processes leave now, migrations relaunch, and every process restores from the
    /// latest checkpoint in the target layout.
    pub(super) fn collapse_transition(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(t) = self.transition.as_mut() else {
            return Vec::new();
        };
        t.resharding = false;
        let to = t.to.clone();
        let mut effects = Vec::new();
        let leaving: Vec<SlotKey> = self.keys_where(|s| s.phase == SlotPhase::Removing);
        for key in leaving {
            effects.extend(self.remove_slot(key, now_ms));
        }
        let migrating: Vec<SlotKey> = self.keys_where(|s| s.migrate_to.is_some());
        for key in migrating {
            effects.push(Effect::StopAgent {
                key,
                graceful: false,
            });
            effects.push(self.launch_slot(key, false, now_ms));
        }
        for s in self.roles.slots_mut() {
            s.fresh = false;
        }
        if let Some(c) = self.group.cluster_mut() {
            let n = to[&Role::PS];
            c.expected_ps = n;
            c.ps.retain(|&i, _| i < n);
            c.ps_version += 1;
        }
        let trainer = self.trainer();
        if let Some(r) = self.group.rendezvous_mut() {
            r.expected = to[&trainer];
        }
        let round_after = self
            .group
            .rendezvous()
            .map_or(0, RoundRendezvous::next_round_number);
        if let Some(t) = self.transition.as_mut() {
            t.round_after = round_after;
        }
        self.set_step(Step::Settle, now_ms);
        effects
    }
}
