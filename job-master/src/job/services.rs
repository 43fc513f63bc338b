//! Role groups outside the training group: `service` roles (independent replicas: rollout
//! engines, reward models), `single` roles (one driver) and further `allreduce` groups (a
//! critic trained by a collective group of its own). Each is a [`RoleGroup`] with its desired
//! size apart from the processes observed; it is started with the job, restarted at its
//! failover level and resized on its own, without pausing or restarting another role:
//!
//! * failover `process`: only the failed process restarts;
//! * failover `role`: every process of its group restarts;
//! * failover `job`: the training group restarts from its latest checkpoint and every service
//!   group restarts.
//!
//! A service process has no rendezvous, no data shards and no checkpoint of the master's: its
//! agent starts it at once. A further all-reduce group commits checkpoints of its own, the
//! role group's ([`role_checkpoint`]). A further all-reduce group forms through the SDK: each process
//! tells the master where it serves and where its collective store would listen
//! ([`JobContext::serve_role`]), and once every process of the group's size is there (the
//! group's [`RoleView`]) they form it, rank by index, at the store of the lowest index. Resizing
//! such a group restarts every process of it (each must learn the new world size); it
//! restarts whole when one of its processes fails (failover `role`, or `job`). The job ends
//! when its training group does; the other groups are then told to shut down.

use super::*;
use crate::spec::{Failover, Topology};

/// One role group: what it should be and what runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleGroup {
    /// One of the training group's roles (rendezvous or PS cluster, data shards,
    /// transitions), or a group of its own (service, single, a further all-reduce group).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub training: bool,
    /// The processes it should have: the spec's replicas, then what plans ask (the training
    /// group's: the plan being carried out's, once it starts).
    pub desired: u32,
    /// Its processes by index, as observed (removed ones stay, for their index).
    pub slots: BTreeMap<u32, Slot>,
    /// Relaunches so far (against the role's `max_restarts`).
    pub restarts: u32,
    /// Resources a plan set for the processes launched from then on; none: the role's.
    pub resources: Option<Resources>,
    /// The newest checkpoint a further all-reduce group committed ([`role_checkpoint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<role_checkpoint::RoleCheckpoint>,
    /// The one it committed before, kept for a restore that finds the newest file missing
    /// or damaged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_checkpoint: Option<role_checkpoint::RoleCheckpoint>,
}

/// A role group as its callers see it ([`JobContext::role_group`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RoleView {
    pub topology: Topology,
    /// The processes that serve calls, in index order.
    pub members: Vec<Member>,
    /// The processes the role should have.
    pub desired: u32,
}

/// One process of a role that serves calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub index: u32,
    pub incarnation: u64,
    pub address: String,
    /// Where its collective store would listen (host:port), for a member of a further
    /// all-reduce group; empty otherwise.
    pub collective_addr: String,
}

impl RoleGroup {
    /// Processes that count as members (not removed).
    pub fn live(&self) -> u32 {
        self.slots.values().filter(|s| s.phase.is_live()).count() as u32
    }
}

impl JobContext {
    /// The spec's service and single roles at their starting size; the agents to launch.
    pub(super) fn start_services(&mut self, now_ms: u64) -> Vec<Effect> {
        let roles: Vec<Role> = self.spec.service_roles().collect();
        let mut effects = Vec::new();
        for role in roles {
            let replicas = self.spec.role_plan(role).expect("validated spec").replicas;
            self.roles.add(role, false, 0);
            effects.extend(self.resize_service(role, replicas, None, &[], now_ms));
        }
        effects
    }

    /// Whether `role` is a service or single role of this job.
    pub fn is_service(&self, role: Role) -> bool {
        self.roles.service(role).is_some()
    }

    /// The current incarnation of a training process: a service or single role has no
    /// rendezvous, data shards or metrics of the training group.
    pub(super) fn training(&self, key: SlotKey, incarnation: u64) -> Result<&Slot, Error> {
        if self.is_service(key.role) {
            return Err(Error::InvalidRequest(format!(
                "{key} is a {} role: it has no rendezvous, data shards or training metrics",
                self.spec.topology(key.role)
            )));
        }
        self.current(key, incarnation)
    }

    /// The slot of `key`, in the training group or a service group.
    pub(super) fn any_slot(&self, key: SlotKey) -> Option<&Slot> {
        self.roles.any(key)
    }

    pub(super) fn any_slot_mut(&mut self, key: SlotKey) -> Option<&mut Slot> {
        self.roles.any_mut(key)
    }

    /// Where the brain's round placed a start's processes (`nodes`, by role, each role's from
    /// index 0): each first launch goes there while that node holds it, as a plan's processes
    /// do ([`Slot::node`]). A role the job does not have, or a process past its count, is
    /// said in the job's events and left out. Only processes not launched yet move.
    pub fn start_on(&mut self, nodes: &BTreeMap<Role, Vec<String>>, now_ms: u64) {
        for (&role, on) in nodes {
            let mut placed = Vec::new();
            for (index, node) in (0..).zip(on) {
                let key = SlotKey { role, index };
                match self.any_slot_mut(key) {
                    Some(slot) if slot.incarnation == 1 && slot.phase == SlotPhase::Launching => {
                        slot.node = Some(node.clone());
                        placed.push(format!("{key} on {node}"));
                    }
                    Some(_) => {}
                    None => self.log(
                        now_ms,
                        format!(
                            "the brain placed {key} on {node}, but the job has no such \
                             process: left out"
                        ),
                    ),
                }
            }
            if !placed.is_empty() {
                self.log(
                    now_ms,
                    format!("placed by the brain's round: {}", placed.join(", ")),
                );
            }
        }
    }

    /// Every slot of the job: the training group's, then each service group's.
    pub fn all_slots(&self) -> impl Iterator<Item = &Slot> {
        self.roles.all()
    }

    /// Sets `role`'s size to `count`: new processes start (a removed index comes back with a
    /// new incarnation), the highest indexes leave (SIGTERM, their grace period, gone). No
    /// other process is touched, except in a further all-reduce group, whose staying
    /// processes restart to form the group at its new size.
    pub(super) fn resize_service(
        &mut self,
        role: Role,
        count: u32,
        resources: Option<Resources>,
        nodes: &[String],
        now_ms: u64,
    ) -> Vec<Effect> {
        let group = self.roles.service_mut(role).expect("a service role");
        let from = group.live();
        group.desired = count;
        if resources.is_some() {
            group.resources = resources;
        }
        let launch_with = group.resources.clone();
        let mut effects = Vec::new();
        let mut staying = Vec::new();
        for index in 0..count {
            let key = SlotKey { role, index };
            let slot = group
                .slots
                .entry(index)
                .or_insert_with(|| Slot::new(key, 0, now_ms));
            if slot.phase.is_live() && slot.incarnation > 0 {
                staying.push(key);
                continue;
            }
            slot.relaunched(now_ms);
            slot.resources = launch_with.clone();
            // The plan's nodes, in order, for the processes it adds.
            slot.node = index
                .checked_sub(from)
                .and_then(|k| nodes.get(k as usize))
                .cloned();
            effects.push(Effect::LaunchAgent {
                key,
                incarnation: slot.incarnation,
            });
        }
        for (&index, slot) in group.slots.range_mut(count..) {
            if slot.phase == SlotPhase::Removed {
                continue;
            }
            slot.phase = SlotPhase::Removed;
            effects.push(Effect::StopAgent {
                key: SlotKey { role, index },
                graceful: true,
            });
        }
        if from != count {
            let regroup = self.spec.topology(role) == Topology::Allreduce && !staying.is_empty();
            for key in staying.into_iter().filter(|_| regroup) {
                self.restart_service_slot(key);
            }
            self.log_as(
                EventKind::Plan,
                now_ms,
                format!(
                    "{role} resized: {from} -> {count}{}",
                    if regroup {
                        " (an all-reduce group: its processes restart to form it at its new size)"
                    } else {
                        ""
                    }
                ),
            );
        }
        effects
    }

    /// A process of a service group failed (`how`); `relaunch_agent` when its agent is gone.
    /// What restarts follows the role's failover level.
    pub(super) fn fail_service(
        &mut self,
        key: SlotKey,
        how: String,
        relaunch_agent: bool,
        now_ms: u64,
    ) -> Vec<Effect> {
        let group = self.roles.service_mut(key.role).expect("a service role");
        group.restarts += 1;
        let count = group.restarts;
        let Some(limit) = self.restart_allowed(key, count, &how, now_ms) else {
            return Vec::new();
        };
        let failover = self.spec.failover(key.role);
        self.log_as(
            EventKind::Fault,
            now_ms,
            format!(
                "{key} failed ({how}); relaunch {count} of {limit} for {} (failover: {failover})",
                key.role
            ),
        );
        let mut effects = Vec::new();
        match failover {
            Failover::Process => self.restart_service_slot(key),
            Failover::Role => self.restart_service_group(key.role),
            Failover::Job => {
                effects.extend(self.group_restart(now_ms, &format!("{key} failed")));
                self.restart_every_service();
            }
        }
        if relaunch_agent {
            effects.extend(self.relaunch_service_agent(key, now_ms));
        }
        effects
    }

    /// The process of `key` restarts with a new incarnation (its agent is told at its next
    /// heartbeat). One that finished (exit 0) stays finished.
    fn restart_service_slot(&mut self, key: SlotKey) {
        if let Some(slot) = self.any_slot_mut(key)
            && slot.phase.is_live()
            && slot.phase != SlotPhase::Succeeded
        {
            slot.incarnation += 1;
            slot.restart_count += 1;
            if slot.phase != SlotPhase::Launching {
                slot.phase = SlotPhase::Restarting;
            }
        }
    }

    /// Every live process of `role`'s group restarts.
    fn restart_service_group(&mut self, role: Role) {
        let keys: Vec<SlotKey> = self
            .roles
            .service(role)
            .expect("a service role")
            .slots
            .values()
            .filter(|s| s.phase.is_live())
            .map(|s| s.key)
            .collect();
        for key in keys {
            self.restart_service_slot(key);
        }
    }

    /// Every service group restarts (a failure with failover `job`).
    pub(super) fn restart_every_service(&mut self) {
        let roles: Vec<Role> = self.roles.services().map(|(r, _)| r).collect();
        for role in roles {
            self.restart_service_group(role);
        }
    }

    /// The agent of `key` is gone: a new one is launched for the slot's current incarnation.
    fn relaunch_service_agent(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        if !self.any_slot(key).is_some_and(|s| s.phase.is_live()) {
            return Vec::new();
        }
        self.relaunch_agent(key, now_ms)
    }

    /// After the master restarted: every service process is launched anew.
    pub(super) fn resume_services(&mut self, now_ms: u64) -> Vec<Effect> {
        let keys: Vec<SlotKey> = self
            .roles
            .services()
            .flat_map(|(_, g)| g.slots.values())
            .filter(|s| s.phase.is_live() && s.phase != SlotPhase::Succeeded)
            .map(|s| s.key)
            .collect();
        let mut effects = Vec::new();
        for key in keys {
            self.restart_service_slot(key);
            effects.extend(
                self.relaunch_service_agent(key, now_ms)
                    .into_iter()
                    .filter(|e| matches!(e, Effect::LaunchAgent { .. })),
            );
        }
        effects
    }

    /// The current incarnation of `key` serves calls from other roles at `address`; a process
    /// of a further all-reduce group also says where its collective store would listen
    /// (`collective`, host:port), which makes it a member the group forms with.
    pub fn serve_role(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        address: String,
        collective: String,
        now_ms: u64,
    ) -> Result<(), Error> {
        self.current(key, incarnation)?;
        let host_port = |what: &str, a: &str| {
            if a.len() > 256 || a.rsplit_once(':').is_none() {
                return Err(Error::InvalidRequest(format!(
                    "{key} {what} {:?}: not host:port",
                    a.chars().take(64).collect::<String>()
                )));
            }
            Ok(())
        };
        host_port("serves at", &address)?;
        // A further all-reduce group: outside the training group (whose processes may serve
        // calls too, and form their group through the master's rounds).
        match (collective.is_empty(), self.is_collective_group(key.role)) {
            (false, true) => host_port("has its collective store at", &collective)?,
            (true, false) => {}
            (false, false) => {
                return Err(Error::InvalidRequest(format!(
                    "{key} gives a collective store address, but {} is not a further all-reduce \
                     group (a role with `topology: allreduce` and a command of its own): only \
                     such a group forms its collective through role calls",
                    key.role
                )));
            }
            (true, true) => {
                return Err(Error::InvalidRequest(format!(
                    "{key} is a member of the all-reduce group {}: it joins with the address \
                     of its collective store (brain_sdk.roles.collective())",
                    key.role
                )));
            }
        }
        let slot = self.any_slot_mut(key).expect("current");
        let changed = slot.serving != incarnation
            || slot.serve_addr.as_deref() != Some(&address)
            || slot.collective_addr != collective;
        slot.serving = incarnation;
        slot.serve_addr = Some(address.clone());
        slot.collective_addr = collective.clone();
        if changed {
            let store = if collective.is_empty() {
                String::new()
            } else {
                format!(" (its collective store at {collective})")
            };
            self.log(now_ms, format!("{key} serves calls at {address}{store}"));
        }
        Ok(())
    }

    /// `key`'s running totals of calls between roles (`super::calls`); refused from a
    /// process that is not current, with figures that are not finite and non-negative, or
    /// naming a role the job has not.
    pub fn report_calls(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        totals: super::CallTotals,
        now_ms: u64,
    ) -> Result<(), Error> {
        self.current(key, incarnation)?;
        let bad = |x: f64| !x.is_finite() || x < 0.0;
        if bad(totals.busy_s) || totals.calls.values().any(|(_, w)| bad(*w)) {
            return Err(Error::InvalidRequest(format!(
                "{key} reports calls with a time that is not a finite, non-negative number of \
                 seconds"
            )));
        }
        if let Some(role) = totals
            .calls
            .keys()
            .find(|r| !self.spec.roles.contains_key(r))
        {
            return Err(Error::InvalidRequest(format!(
                "{key} reports calls to {role}: the job has no {role} role"
            )));
        }
        self.calls.record(key, incarnation, totals, now_ms);
        Ok(())
    }

    /// The serving members of `role` as they are now, its topology and the processes it
    /// should have.
    pub fn role_group(&self, role: Role) -> Result<RoleView, Error> {
        if !self.spec.roles.contains_key(&role) {
            return Err(Error::InvalidRequest(format!("the job has no {role} role")));
        }
        let members = self
            .all_slots()
            .filter(|s| s.key.role == role)
            .filter(|s| s.phase == SlotPhase::Running && s.serving == s.incarnation)
            .filter_map(|s| {
                Some(Member {
                    index: s.key.index,
                    incarnation: s.incarnation,
                    address: s.serve_addr.clone()?,
                    collective_addr: s.collective_addr.clone(),
                })
            })
            .collect();
        let desired = match self.roles.service(role) {
            Some(g) => g.desired,
            None => self.role_counts().get(&role).copied().unwrap_or(0),
        };
        Ok(RoleView {
            topology: self.spec.topology(role),
            members,
            desired,
        })
    }

    /// Takes the service roles' targets out of `plan` and carries them out at once: they need
    /// no cut and touch no other role. Returns the effects; `plan` keeps the training group's
    /// part.
    pub(super) fn apply_service_targets(
        &mut self,
        plan: &mut ScalePlan,
        now_ms: u64,
    ) -> Vec<Effect> {
        let roles: Vec<Role> = plan
            .roles
            .keys()
            .copied()
            .filter(|r| self.is_service(*r))
            .collect();
        let mut effects = Vec::new();
        let mut restart = Vec::new();
        for role in roles {
            let target = plan.roles.remove(&role).expect("listed");
            let from = self.roles.service(role).expect("a service role").live();
            effects.extend(self.resize_service(
                role,
                target.count,
                target.resources,
                &target.nodes,
                now_ms,
            ));
            if from != target.count
                && self.spec.roles[&role].rescale == Some(crate::spec::Rescale::Restart)
            {
                restart.push(role.to_string());
            }
        }
        if !restart.is_empty() {
            // The role's programs cannot take a change of its membership: every process of
            // the job restarts at the new size.
            let why = format!(
                "plan {} resizes {} (rescale: restart)",
                plan.version,
                restart.join(", ")
            );
            effects.extend(self.group_restart(now_ms, &why));
            self.restart_every_service();
        }
        effects
    }
}
