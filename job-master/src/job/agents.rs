//! Processes: registration, heartbeats, exits and losses, relaunch and group restart.

use super::*;

impl JobContext {
    /// An agent started by the platform for `incarnation` of `key` announces itself.
    pub fn register_agent(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        host: String,
        service_addr: String,
        now_ms: u64,
    ) -> Result<(u64, u64), Error> {
        // An agent launched for an incarnation that a group restart has since replaced is adopted
        // with the current one, as long as no agent holds the slot. One of a launch since
        // replaced (a relaunch, a move to other resources) is not: its platform stops it.
        let slot = self.slot(key)?;
        if slot.phase == SlotPhase::Removed {
            // A plan took it out of the job; its agent (started again by its platform after
            // its node was lost, say) must not bring it back: a group that has one member
            // more than the plan's size never forms as planned.
            return Err(Error::InvalidRequest(format!(
                "{key} was removed from the job (incarnation {}): its agent stops",
                slot.incarnation
            )));
        }
        let adoptable = slot.phase == SlotPhase::Launching
            && incarnation <= slot.incarnation
            && incarnation >= slot.launched;
        if !adoptable {
            self.current(key, incarnation)?;
        }
        let incarnation = slot.incarnation;
        if self.phase.is_terminal() {
            return Err(Error::InvalidRequest(format!(
                "job is {}",
                self.phase.name()
            )));
        }
        let agent_id = self.next_agent_id;
        self.next_agent_id += 1;
        let slot = self.any_slot_mut(key).expect("checked");
        slot.agent_id = agent_id;
        slot.phase = SlotPhase::Running;
        slot.last_heartbeat_ms = now_ms;
        slot.host = host;
        slot.service_addr = Some(service_addr.clone());
        // A PS added by a reshard enters the published cluster when the reshard is done.
        let fresh = self.any_slot(key).is_some_and(|s| s.fresh);
        if key.role == Role::PS
            && !fresh
            && let Some(c) = self.group.cluster_mut()
        {
            c.set_ps(key.index, service_addr);
        }
        let host = &self.any_slot(key).expect("checked").host;
        self.log(
            now_ms,
            format!("{key} registered on {host} (incarnation {incarnation}, agent {agent_id})"),
        );
        Ok((agent_id, incarnation))
    }

    /// The GPUs the platform gave `key`'s process (CUDA_VISIBLE_DEVICES), as its agent
    /// registered them; said in the events when there are any.
    pub fn set_devices(&mut self, key: SlotKey, devices: String, now_ms: u64) {
        let Some(slot) = self.any_slot_mut(key) else {
            return;
        };
        if devices.is_empty() && slot.devices.is_empty() {
            return;
        }
        let host = slot.host.clone();
        slot.devices = devices.clone();
        if !devices.is_empty() {
            self.log(now_ms, format!("{key} has GPUs {devices} on {host}"));
        }
    }

    /// The GPUs the job's processes hold now, device by device on their nodes: each alive
    /// process (registered, not gone) whose agent registered its devices, with the GPUs it
    /// was launched with. What the Ray platform rebuilds its nodes' devices from
    /// ([`crate::platform::Platform::devices_held`]).
    pub fn device_use(&self) -> vocab::devices::DeviceUse {
        let mut used = vocab::devices::DeviceUse::default();
        for s in self.all_slots().filter(|s| {
            matches!(
                s.phase,
                SlotPhase::Running | SlotPhase::Restarting | SlotPhase::Removing
            )
        }) {
            if let Some(gpus) = self.launch_resources(s.key).and_then(|r| r.gpu) {
                used.add(&s.host, &s.devices, gpus);
            }
        }
        used
    }

    /// Liveness and a resource sample; returns the action and the incarnation to run.
    pub fn heartbeat(
        &mut self,
        key: SlotKey,
        agent_id: u64,
        incarnation: u64,
        sample: Option<Sample>,
        process_pid: u32,
        now_ms: u64,
    ) -> Result<(AgentAction, u64, u64), Error> {
        let terminal = self.phase.is_terminal();
        let service = self.is_service(key.role);
        let slot = self.any_slot_mut(key).ok_or(Error::UnknownProcess {
            role: key.role.to_string(),
            index: key.index,
        })?;
        if slot.agent_id != agent_id || terminal || slot.phase == SlotPhase::Removed {
            return Ok((AgentAction::Shutdown, slot.incarnation, slot.restart_count));
        }
        slot.last_heartbeat_ms = now_ms;
        slot.process_pid = process_pid;
        if let Some(x) = &sample {
            slot.memory_peak = slot.memory_peak.max(x.rss_bytes);
        }
        if sample.is_some() {
            slot.sample = sample;
        }
        if incarnation < slot.incarnation {
            return Ok((AgentAction::Restart, slot.incarnation, slot.restart_count));
        }
        // A service process has no rendezvous to join: its agent running the current
        // incarnation is what makes it run again.
        if service && slot.phase == SlotPhase::Restarting && process_pid != 0 {
            slot.phase = SlotPhase::Running;
        }
        Ok((AgentAction::Continue, slot.incarnation, slot.restart_count))
    }

    /// The training process of `key` exited.
    pub fn process_exited(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        exit_code: i32,
        signal: i32,
        agent_reason: Option<&str>,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        if self.current(key, incarnation).is_err() || self.phase.is_terminal() {
            // An older incarnation, already replaced: its exit is expected, but not that it
            // had to be killed.
            if let Some(why) = agent_reason {
                self.log(now_ms, format!("{key} incarnation {incarnation} {why}"));
            }
            return Ok(Vec::new());
        }
        let phase = self.any_slot(key).expect("current").phase;
        if phase == SlotPhase::Removed {
            return Ok(Vec::new());
        }
        if exit_code == 0 && signal == 0 && self.is_service(key.role) {
            // A service that ends on its own is done; it is not relaunched.
            self.any_slot_mut(key).expect("checked").phase = SlotPhase::Succeeded;
            self.log(now_ms, format!("{key} finished"));
            return Ok(Vec::new());
        }
        if phase == SlotPhase::Removing && exit_code == 0 && signal == 0 {
            return Ok(self.remove_slot(key, now_ms));
        }
        if exit_code == 0 && signal == 0 && key.role == self.trainer() {
            self.roles.slot_mut(key).expect("checked").phase = SlotPhase::Succeeded;
            self.log(now_ms, format!("{key} finished"));
            return Ok(self.check_done(now_ms));
        }
        if let Some(why) = agent_reason.filter(|r| r.starts_with(proto::CHECKPOINT_NOT_SHARED)) {
            // Another incarnation would land on a node like this one, or on this one again.
            let reason = format!("{key}: {why}");
            self.log_as(EventKind::Fault, now_ms, reason.clone());
            self.phase = JobPhase::Failed { reason };
            return Ok(Vec::new());
        }
        if agent_reason.is_some_and(|r| r.starts_with(proto::OUT_OF_MEMORY)) {
            self.any_slot_mut(key).expect("checked").oom_kills += 1;
        }
        let how = match agent_reason {
            Some(why) => why.to_string(),
            None if signal != 0 => format!("killed by signal {signal}"),
            None => format!("exited with code {exit_code}"),
        };
        Ok(self.fail_slot(key, how, false, now_ms))
    }

    /// What `key`'s failed process last wrote (`lines`, from its output file `log`, read by the
    /// master): an event with the file and those lines, and the file named in the job's
    /// failure when this process's failure ended the job.
    pub fn note_output(&mut self, key: SlotKey, log: &str, lines: &[String], now_ms: u64) {
        let text = if lines.is_empty() {
            format!("{key} wrote nothing before it ended; its output: {log}")
        } else {
            format!("{key}'s last output ({log}):\n{}", lines.join("\n"))
        };
        self.log_as(EventKind::Fault, now_ms, text);
        if let JobPhase::Failed { reason } = &mut self.phase
            && reason.starts_with(&format!("{key} "))
            && !reason.contains(log)
        {
            reason.push_str(&format!("; its output: {log}"));
        }
    }

    /// The platform placed the agent launched for `incarnation` of `key`: it has the register
    /// timeout from now on. Whether anything changed.
    pub fn agent_placed(&mut self, key: SlotKey, incarnation: u64, now_ms: u64) -> bool {
        match self.any_slot_mut(key) {
            Some(s)
                if s.incarnation == incarnation && s.phase == SlotPhase::Launching && !s.placed =>
            {
                s.placed = true;
                s.pending_reason.clear();
                s.last_heartbeat_ms = now_ms;
                true
            }
            _ => false,
        }
    }

    /// The platform found no room for `key`'s agent in its own time limit: the process is
    /// still pending, so it is asked for again (same incarnation, no relaunch counted) and
    /// its pending time keeps running, for the brain to see and to give it up.
    pub fn agent_not_placed(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        why: String,
        now_ms: u64,
    ) -> Vec<Effect> {
        match self.any_slot(key) {
            Some(s)
                if s.incarnation == incarnation
                    && s.phase == SlotPhase::Launching
                    && !s.placed
                    && !self.phase.is_terminal() =>
            {
                let waited = now_ms.saturating_sub(s.last_heartbeat_ms);
                self.any_slot_mut(key).expect("checked").pending_reason = why.clone();
                self.log(
                    now_ms,
                    format!(
                        "{key} still pending after {} s, asked for again: {why}",
                        waited / 1000
                    ),
                );
                vec![Effect::LaunchAgent { key, incarnation }]
            }
            _ => Vec::new(),
        }
    }

    /// The agent of `key` is gone (its process ended, or heartbeats stopped).
    pub fn agent_lost(
        &mut self,
        key: SlotKey,
        agent_incarnation: u64,
        why: String,
        now_ms: u64,
    ) -> Vec<Effect> {
        match self.any_slot(key) {
            Some(s)
                if s.incarnation == agent_incarnation
                    && !self.phase.is_terminal()
                    && s.phase != SlotPhase::Removed => {}
            _ => return Vec::new(),
        }
        self.fail_slot(key, format!("agent lost: {why}"), true, now_ms)
    }

    pub(super) fn fail_slot(
        &mut self,
        key: SlotKey,
        how: String,
        relaunch_agent: bool,
        now_ms: u64,
    ) -> Vec<Effect> {
        if self.is_service(key.role) {
            return self.fail_service(key, how, relaunch_agent, now_ms);
        }
        // Only a ps job's worker holds no model state; anything else loses state or the ring.
        // A command's cluster spec (TF_CONFIG) names every task's address, so any of its
        // failures restarts the group. A role whose failover is `job` restarts everything.
        let whole_job = self.spec.failover(key.role) == crate::spec::Failover::Job;
        let group = whole_job
            || !(self.spec.kind == JobKind::Ps
                && key.role == self.trainer()
                && !self.restarts_to_rescale());
        if !group && self.roles.slot(key).unwrap().phase == SlotPhase::Removing {
            self.log_as(
                EventKind::Fault,
                now_ms,
                format!("{key} failed ({how}) while leaving"),
            );
            return self.remove_slot(key, now_ms);
        }
        let relaunches = self.roles.group_mut(key.role).expect("a slot's group");
        relaunches.restarts += 1;
        let count = relaunches.restarts;
        let Some(limit) = self.restart_allowed(key, count, &how, now_ms) else {
            return Vec::new();
        };
        self.log_as(
            EventKind::Fault,
            now_ms,
            format!(
                "{key} failed ({how}); relaunch {count} of {limit} for {}",
                key.role
            ),
        );
        if self.evaluator == Some(key) {
            self.evaluator = None;
        }
        let mut effects = Vec::new();
        if group {
            effects.extend(self.group_restart(now_ms, &format!("{key} failed")));
            if whole_job {
                self.restart_every_service();
            }
        } else {
            self.next_ps_worker_incarnation(key);
            self.roles.slot_mut(key).expect("exists").phase = SlotPhase::Restarting;
            effects.extend(self.ps_checkpoint_if_drained(now_ms));
        }
        // A plan's leaving member is gone with the restart (it collapsed the plan): nothing
        // to relaunch. Relaunched, it would come back as a member the plan does not count.
        if relaunch_agent && self.roles.slot(key).unwrap().phase != SlotPhase::Removed {
            effects.extend(self.relaunch_agent(key, now_ms));
        }
        effects
    }

    /// A ps worker `key` that goes on in a new process alone: its shard goes back to the
    /// queue, it leaves the cluster spec until it rejoins, and its slot counts a restart.
    pub(super) fn next_ps_worker_incarnation(&mut self, key: SlotKey) {
        self.ledger.release(&key.role.to_string(), key.index);
        if let Some(c) = self.group.cluster_mut() {
            c.remove_worker(key.index);
        }
        let slot = self.roles.slot_mut(key).expect("exists");
        slot.incarnation += 1;
        slot.restart_count += 1;
    }

    /// The agent of `key` is gone: a new one is launched for the slot's current incarnation
    /// (the old one stopped at once, in case it is only silent).
    pub(super) fn relaunch_agent(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let slot = self.any_slot_mut(key).expect("exists");
        slot.phase = SlotPhase::Launching;
        // One that ran is placed by room from now on; one still waiting to be placed keeps
        // the node its plan named.
        if slot.placed || slot.agent_id != 0 {
            slot.node = None;
        }
        slot.placed = false;
        slot.pending_reason.clear();
        slot.agent_id = 0;
        slot.process_pid = 0;
        // The new agent gets a full timeout to register.
        slot.last_heartbeat_ms = now_ms;
        slot.launched = slot.incarnation;
        vec![
            Effect::StopAgent {
                key,
                graceful: false,
            },
            Effect::LaunchAgent {
                key,
                incarnation: slot.incarnation,
            },
        ]
    }

    /// The role's `max_restarts` when `count` relaunches of `key`'s role are within it; else
    /// the job fails, saying why, and `None`.
    pub(super) fn restart_allowed(
        &mut self,
        key: SlotKey,
        count: u32,
        how: &str,
        now_ms: u64,
    ) -> Option<u32> {
        let limit = self
            .spec
            .role_plan(key.role)
            .expect("validated")
            .max_restarts;
        if count <= limit {
            return Some(limit);
        }
        let reason = format!(
            "{key} failed ({how}); {} relaunches exceed the limit of {limit}",
            key.role
        );
        self.log_as(EventKind::Fault, now_ms, reason.clone());
        self.phase = JobPhase::Failed { reason };
        None
    }

    /// Every process restarts from the latest checkpoint; the ledger rolls back to it. During a
    /// transition the restart lands directly in the plan's target layout.
    pub(super) fn group_restart(&mut self, now_ms: u64, why: &str) -> Vec<Effect> {
        self.generation += 1;
        self.late_reform = None;
        let mut effects = Vec::new();
        if self.transition.is_some() {
            effects = self.collapse_transition(now_ms);
        }
        // TORCHELASTIC_RESTART_COUNT counts restarts of the whole group: every member, new
        // ones too, gets the same number.
        let restarts = 1 + self
            .roles
            .slots()
            .filter(|s| s.phase != SlotPhase::Removed)
            .map(|s| s.restart_count)
            .max()
            .unwrap_or(0);
        for slot in self.roles.slots_mut() {
            if slot.phase == SlotPhase::Removed {
                continue;
            }
            slot.incarnation += 1;
            slot.restart_count = restarts;
            if slot.phase != SlotPhase::Launching {
                slot.phase = SlotPhase::Restarting;
            }
        }
        if let Some(r) = self.group.rendezvous_mut() {
            r.invalidate();
        }
        if let Some(c) = self.group.cluster_mut() {
            c.workers.clear();
            c.version += 1;
        }
        let snap = self
            .latest_checkpoint()
            .map(|c| c.ledger.clone())
            .unwrap_or_default();
        let from = match self.latest_checkpoint() {
            Some(c) => format!("checkpoint {}", c.id),
            // The master keeps no checkpoint of a command: it resumes from its own.
            None if self.restarts_to_rescale() => {
                "its own latest checkpoint in BRAIN_CHECKPOINT_DIR".into()
            }
            None => "the start".into(),
        };
        self.ledger.restore(&snap);
        let lost = self
            .training_rolled_back(why, now_ms)
            .map(|l| format!("; {} are lost", l.describe()))
            .unwrap_or_default();
        self.flash_dropped_on_restart(now_ms);
        // The next round is told where to resume afresh; a save of the processes stopped now
        // may still be committed before it is.
        self.resume_told = None;
        self.late_commits.clear();
        self.checkpoint_pending = false;
        self.checkpoint_saving = false;
        self.shards_since_checkpoint = 0;
        self.final_eval_loss = None;
        self.final_model_digest = None;
        self.log_as(
            EventKind::Restart,
            now_ms,
            format!(
                "{why}: every process restarts from {from} (generation {}){lost}",
                self.generation
            ),
        );
        effects
    }
}
