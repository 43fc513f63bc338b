//! The job's state and every decision the master takes about it (pure: no I/O, no clock).
//!
//! [`JobContext`] is what is persisted: slots (one per process), the shard ledger, rendezvous,
//! checkpoints, restart counts and the event log. Each method takes the time as `now_ms` and
//! returns [`Effect`]s that the async shell ([`crate::master`]) carries out: launch or stop an
//! agent through the platform, save a PS checkpoint, finish the job.
//!
//! Recovery rules:
//! * ps job, a worker fails: only that worker restarts; its leased shard returns to the queue
//!   (the PS apply each batch once, so a shard half-pushed before the crash is not applied twice).
//! * ps job, a PS fails, or allreduce job, a worker fails: the model state is lost or the ring is
//!   broken, so every process restarts from the latest checkpoint and the ledger rolls back to
//!   the data position that checkpoint recorded.
//! * A slot that fails more than its role's `max_restarts` fails the job.
//!
//! Scale plans (see [`crate::scale`]) are carried out one at a time by a [`Transition`]:
//! * ps job, workers only: new workers start and join at once; a removed worker finishes its
//!   shard and is told at its next lease to exit. Nobody else stops.
//! * allreduce job: a consistent cut (leases drain, rank 0 checkpoints at the step boundary),
//!   then every member leaves the ring at the same step and joins a new rendezvous round of the
//!   target size. Survivors keep their model in memory; newcomers load the cut checkpoint.
//! * ps job, parameter servers: a consistent cut (no shard in flight, so no push), a checkpoint,
//!   then the PS move the keys whose owner changes under jump consistent hashing straight to
//!   their new owners; a new cluster-spec version is published, every worker switches before it
//!   gets another shard, and only then do the old PS drop moved keys and the removed PS stop.
//! * Migrations replace a process by one with other resources: a ps worker at once; a PS or an
//!   allreduce worker at the cut, restoring from the cut checkpoint.
//! * A failure during a transition restarts the group from the latest checkpoint directly in the
//!   target layout (a PS restores the keys it owns in the new layout from every partition).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::ledger::{Holder, LeaseOutcome, LedgerSnapshot, ShardLedger};
use crate::rendezvous::{JoinOutcome, Member, PsCluster, RoundRendezvous};
use crate::scale::{Capacity, PlanBook, ScalePlan};
use crate::spec::{JobKind, JobSpec, Resources, RoleName};

/// A process slot: role and index. Its incarnation changes with every (re)start. Written as
/// `worker-3` (also as a JSON map key).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
pub struct SlotKey {
    pub role: RoleName,
    pub index: u32,
}

impl std::str::FromStr for SlotKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (role, index) = s
            .rsplit_once('-')
            .ok_or_else(|| format!("{s:?} is not <role>-<index>"))?;
        let role = match role {
            "ps" => RoleName::Ps,
            "worker" => RoleName::Worker,
            other => return Err(format!("unknown role {other:?}")),
        };
        let index = index.parse().map_err(|e| format!("index of {s:?}: {e}"))?;
        Ok(SlotKey { role, index })
    }
}

impl std::fmt::Display for SlotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.role, self.index)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotPhase {
    /// The platform was asked to start the agent; it has not registered yet.
    Launching,
    Running,
    /// The agent must restart the training process with the slot's new incarnation.
    Restarting,
    /// The training process finished its work and exited 0.
    Succeeded,
    /// A scale plan removes this slot: it leaves at its next lease (ps worker) or rendezvous
    /// (allreduce worker), or once every worker has switched away from it (PS).
    Removing,
    /// Not part of the job any more (until a plan adds the index again).
    Removed,
}

impl SlotPhase {
    /// Whether the slot counts as a member of the job.
    pub fn is_live(self) -> bool {
        !matches!(self, SlotPhase::Removing | SlotPhase::Removed)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub cpu_millicores: u64,
    pub rss_bytes: u64,
    pub gpu_present: bool,
    pub gpu_utilization_percent: u32,
    pub gpu_memory_used_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    pub key: SlotKey,
    pub incarnation: u64,
    /// Restarts of the training process this slot has seen (TORCHELASTIC_RESTART_COUNT).
    pub restart_count: u64,
    pub phase: SlotPhase,
    pub agent_id: u64,
    pub last_heartbeat_ms: u64,
    pub service_addr: Option<String>,
    pub host: String,
    pub sample: Option<Sample>,
    /// pid of the training process as the agent last reported it.
    #[serde(default)]
    pub process_pid: u32,
    /// Resources this slot's agent is launched with; `None`: the role's.
    #[serde(default)]
    pub resources: Option<Resources>,
    /// ps workers: the PS-set version this worker last leased with.
    #[serde(default)]
    pub ps_version: u64,
    /// A PS added by a reshard: it starts empty and receives its keys from the others.
    #[serde(default)]
    pub fresh: bool,
    /// A migration waiting for the cut: relaunch with these resources.
    #[serde(default)]
    pub migrate_to: Option<Resources>,
}

impl Slot {
    fn new(key: SlotKey, incarnation: u64, now_ms: u64) -> Self {
        Slot {
            key,
            incarnation,
            restart_count: 0,
            phase: SlotPhase::Launching,
            agent_id: 0,
            last_heartbeat_ms: now_ms,
            service_addr: None,
            host: String::new(),
            sample: None,
            process_pid: 0,
            resources: None,
            ps_version: 0,
            fresh: false,
            migrate_to: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum JobPhase {
    Running,
    /// All work is done; the shell collects final statistics before declaring success.
    Finishing,
    Succeeded,
    Failed {
        reason: String,
    },
}

impl JobPhase {
    pub fn is_terminal(&self) -> bool {
        matches!(self, JobPhase::Succeeded | JobPhase::Failed { .. })
    }

    pub fn name(&self) -> &'static str {
        match self {
            JobPhase::Running => "running",
            JobPhase::Finishing => "finishing",
            JobPhase::Succeeded => "succeeded",
            JobPhase::Failed { .. } => "failed",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub id: u64,
    pub manifest: PathBuf,
    pub ledger: LedgerSnapshot,
    pub taken_at_ms: u64,
    pub step: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    pub global_step: u64,
    pub samples_per_second: f64,
    pub loss: f64,
    pub samples_total: u64,
    pub applied_samples: u64,
    pub applied_index_sum: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at_ms: u64,
    pub text: String,
}

/// What the shell must do after a decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    LaunchAgent {
        key: SlotKey,
        incarnation: u64,
    },
    /// Stop the slot's agent; a lost agent gets no grace period.
    StopAgent {
        key: SlotKey,
        graceful: bool,
    },
    /// Save every PS at `dir`; `generation` guards against a restart in between.
    SavePsCheckpoint {
        id: u64,
        dir: PathBuf,
        ps: Vec<String>,
        generation: u64,
    },
    /// All work is done: collect final statistics, then call [`JobContext::finish`].
    Finish,
    /// Move keys from the PS at `from` (the old layout) to their owners among `to`, then call
    /// [`JobContext::reshard_done`] (or [`JobContext::reshard_failed`]).
    ReshardPs {
        version: u64,
        from: Vec<String>,
        to: Vec<String>,
        generation: u64,
    },
    /// Every worker uses the new PS set: the PS at these addresses delete the keys they lent.
    DropPs {
        ps: Vec<String>,
    },
}

/// Where a transition is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// Leases drain to a consistent cut and a checkpoint is taken there.
    Cut,
    /// ps: parameter servers move keys to their new owners.
    Reshard,
    /// allreduce: members leave the ring and a round of the target size forms.
    Reform,
    /// ps: the new PS set is published; workers switch before their next shard.
    Switch,
    /// New processes start, removed ones leave.
    Settle,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Cut => "cut",
            Step::Reshard => "reshard",
            Step::Reform => "reform",
            Step::Switch => "switch",
            Step::Settle => "settle",
        }
    }
}

/// A plan being carried out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub plan: ScalePlan,
    pub started_ms: u64,
    pub step: Step,
    pub step_started_ms: u64,
    pub from: BTreeMap<RoleName, u32>,
    pub to: BTreeMap<RoleName, u32>,
    /// allreduce: the first round number that counts as the re-formed group.
    pub round_after: u64,
    /// A reshard effect is out and has not come back.
    pub resharding: bool,
}

/// One carried-out plan, for the report and the benchmarks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransitionRecord {
    pub version: u64,
    pub from: BTreeMap<RoleName, u32>,
    pub to: BTreeMap<RoleName, u32>,
    pub accepted_ms: u64,
    pub reached_ms: u64,
    /// When every worker of the new layout had reported a training step after the plan.
    pub resumed_ms: Option<u64>,
    /// Workers whose first step after the plan has not been reported yet.
    pub awaiting: Vec<SlotKey>,
    /// Steps each worker had reported when the plan was reached; a higher one is a new step.
    #[serde(default)]
    pub steps_at_reach: BTreeMap<SlotKey, u64>,
}

/// One PS reshard: what moved, how long it took, and the parameter digests around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReshardRecord {
    pub version: u64,
    pub from_ps: u32,
    pub to_ps: u32,
    pub moved_keys: u64,
    pub moved_bytes: u64,
    pub total_keys: u64,
    pub digest_before: u64,
    pub digest_after: u64,
    pub took_ms: u64,
}

/// Timing knobs the master runs with (from its config, not the user's spec).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    pub last_call_ms: u64,
    pub grace_period_ms: u64,
    /// A launched agent that has not registered after this long is declared lost.
    #[serde(default = "default_register_timeout")]
    pub register_timeout_ms: u64,
}

fn default_register_timeout() -> u64 {
    30_000
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 500,
            heartbeat_timeout_ms: 10_000,
            last_call_ms: 2_000,
            grace_period_ms: 5_000,
            register_timeout_ms: default_register_timeout(),
        }
    }
}

/// The answer to a rendezvous join.
#[derive(Clone, Debug, PartialEq)]
pub struct JoinView {
    pub ready: bool,
    pub round: u64,
    pub rank: u32,
    pub world_size: u32,
    pub peers: Vec<String>,
    pub cluster: Option<PsCluster>,
    pub waiting_reason: String,
    pub restart_count: u64,
    pub resume_from: Option<PathBuf>,
    /// A scale plan removed this process: it must exit 0.
    pub removed: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LeaseView {
    pub outcome: LeaseOutcome,
    pub checkpoint_due: bool,
    pub evaluate: bool,
    /// allreduce: leave the ring at the next step boundary and rejoin the rendezvous.
    pub reform: bool,
    /// A scale plan removed this process.
    pub removed: bool,
    /// ps: the PS-set version in force.
    pub ps_version: u64,
}

impl LeaseView {
    fn of(outcome: LeaseOutcome) -> Self {
        Self {
            outcome,
            checkpoint_due: false,
            evaluate: false,
            reform: false,
            removed: false,
            ps_version: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobContext {
    pub spec: JobSpec,
    pub run_id: String,
    pub timing: Timing,
    pub phase: JobPhase,
    pub started_at_ms: u64,
    pub first_step_at_ms: Option<u64>,
    pub slots: BTreeMap<SlotKey, Slot>,
    pub restarts: BTreeMap<RoleName, u32>,
    pub ledger: ShardLedger,
    pub rendezvous: Option<RoundRendezvous>,
    pub cluster: Option<PsCluster>,
    pub checkpoints: Vec<CheckpointRecord>,
    pub checkpoint_pending: bool,
    /// A ps checkpoint save is under way (the effect was emitted).
    pub checkpoint_saving: bool,
    pub shards_since_checkpoint: u64,
    /// Bumped by every group restart; effects from an older generation are dropped.
    pub generation: u64,
    pub next_agent_id: u64,
    pub evaluator: Option<SlotKey>,
    pub final_eval_loss: Option<f64>,
    pub final_model_digest: Option<String>,
    pub metrics: BTreeMap<SlotKey, MetricsRecord>,
    pub events: Vec<Event>,
    #[serde(default)]
    pub plans: PlanBook,
    #[serde(default)]
    pub transition: Option<Transition>,
    #[serde(default)]
    pub transitions: Vec<TransitionRecord>,
    #[serde(default)]
    pub reshards: Vec<ReshardRecord>,
    /// Resources plans set for a role's future launches.
    #[serde(default)]
    pub role_resources: BTreeMap<RoleName, Resources>,
}

const MAX_EVENTS: usize = 1_000;

impl JobContext {
    /// A fresh job from a validated spec. Returns the agents to launch.
    pub fn new(spec: JobSpec, run_id: String, timing: Timing, now_ms: u64) -> (Self, Vec<Effect>) {
        let mut slots = BTreeMap::new();
        let mut effects = Vec::new();
        let mut rendezvous = None;
        let mut cluster = None;
        for (&role, _) in spec.roles.iter() {
            let plan = spec.role_plan(role).expect("validated spec");
            for index in 0..plan.replicas {
                let key = SlotKey { role, index };
                slots.insert(key, Slot::new(key, 1, now_ms));
                effects.push(Effect::LaunchAgent {
                    key,
                    incarnation: 1,
                });
            }
            match (spec.kind, role) {
                (JobKind::Allreduce, RoleName::Worker) => {
                    let mut r = RoundRendezvous::new(
                        plan.min,
                        plan.max,
                        plan.node_unit,
                        timing.last_call_ms,
                        plan.replicas,
                    );
                    // A worker on its way gets as long to arrive as it gets to register.
                    r.launch_wait_ms = timing.register_timeout_ms;
                    rendezvous = Some(r);
                }
                (JobKind::Ps, RoleName::Ps) => cluster = Some(PsCluster::new(plan.replicas)),
                _ => {}
            }
        }
        let ledger = ShardLedger::new(
            spec.data.num_samples as u64,
            spec.data.shard_size as u64,
            spec.epochs as u32,
        );
        let mut ctx = Self {
            spec,
            run_id,
            timing,
            phase: JobPhase::Running,
            started_at_ms: now_ms,
            first_step_at_ms: None,
            slots,
            restarts: BTreeMap::new(),
            ledger,
            rendezvous,
            cluster,
            checkpoints: Vec::new(),
            checkpoint_pending: false,
            checkpoint_saving: false,
            shards_since_checkpoint: 0,
            generation: 0,
            next_agent_id: 1,
            evaluator: None,
            final_eval_loss: None,
            final_model_digest: None,
            metrics: BTreeMap::new(),
            events: Vec::new(),
            plans: PlanBook::default(),
            transition: None,
            transitions: Vec::new(),
            reshards: Vec::new(),
            role_resources: BTreeMap::new(),
        };
        ctx.log(
            now_ms,
            format!(
                "job {} ({}) started with {} processes",
                ctx.spec.name,
                ctx.spec.kind,
                ctx.slots.len()
            ),
        );
        (ctx, effects)
    }

    /// The latest time this context has recorded (the master's clock, ms since it started the
    /// job): a master that continues the context runs its clock on from here.
    pub fn clock_ms(&self) -> u64 {
        let events = self.events.last().map_or(0, |e| e.at_ms);
        let slots = self
            .slots
            .values()
            .map(|s| s.last_heartbeat_ms)
            .max()
            .unwrap_or(0);
        let transition = self.transition.as_ref().map_or(0, |t| t.step_started_ms);
        events.max(slots).max(transition).max(self.started_at_ms)
    }

    /// A new job master continues this persisted context after the last one died (kill -9, a
    /// lost machine). Its agents went with it (local agents die with their master, those on
    /// other platforms exit once it stops answering), so every process is launched anew and
    /// the job rolls back to its latest checkpoint exactly as after a group failure: what was
    /// trained after that checkpoint is trained again and counted once. A plan in flight lands
    /// in its target layout. Returns the agents to launch.
    pub fn resume(&mut self, now_ms: u64) -> Result<Vec<Effect>, Error> {
        if self.phase.is_terminal() {
            return Err(Error::InvalidRequest(format!(
                "job {} has already {}: there is nothing to resume",
                self.spec.name,
                self.phase.name()
            )));
        }
        // Nobody is left to stop or to tell: only the launches below matter.
        let _ = self.group_restart(now_ms, "the job master restarted");
        let keys: Vec<SlotKey> = self
            .slots
            .values()
            .filter(|s| s.phase != SlotPhase::Removed)
            .map(|s| s.key)
            .collect();
        Ok(keys
            .into_iter()
            .map(|k| self.launch_slot(k, false, now_ms))
            .collect())
    }

    fn log(&mut self, at_ms: u64, text: String) {
        tracing::info!(job = %self.spec.name, "{text}");
        self.events.push(Event { at_ms, text });
        if self.events.len() > MAX_EVENTS {
            self.events.drain(..self.events.len() - MAX_EVENTS);
        }
    }

    fn is_builtin(&self) -> bool {
        self.spec.workload.builtin.is_some()
    }

    fn slot(&self, key: SlotKey) -> Result<&Slot, Error> {
        self.slots.get(&key).ok_or(Error::UnknownProcess {
            role: key.role.to_string(),
            index: key.index,
        })
    }

    /// The slot, if `incarnation` is its current one.
    fn current(&self, key: SlotKey, incarnation: u64) -> Result<&Slot, Error> {
        let slot = self.slot(key)?;
        if slot.incarnation != incarnation {
            return Err(Error::StaleIncarnation {
                role: key.role.to_string(),
                index: key.index,
                got: incarnation,
                current: slot.incarnation,
            });
        }
        Ok(slot)
    }

    fn holder(key: SlotKey, incarnation: u64) -> Holder {
        Holder {
            role: key.role.to_string(),
            index: key.index,
            incarnation,
        }
    }

    pub fn latest_checkpoint(&self) -> Option<&CheckpointRecord> {
        self.checkpoints.last()
    }

    /// What `key`'s current incarnation is launched with: its own resources (from a plan or a
    /// migration), else its role's in the spec.
    pub fn launch_resources(&self, key: SlotKey) -> Option<Resources> {
        let role = self
            .spec
            .roles
            .get(&key.role)
            .and_then(|r| r.resources.clone());
        match self.slots.get(&key).and_then(|s| s.resources.clone()) {
            // A migrated process gets new CPU and memory; plans do not carry custom
            // resources, so it keeps its role's.
            Some(mut r) => {
                if r.custom.is_empty() {
                    r.custom = role.map(|x| x.custom).unwrap_or_default();
                }
                Some(r)
            }
            None => role,
        }
    }

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
        // with the current one, as long as no agent holds the slot.
        let slot = self.slot(key)?;
        let adoptable = slot.phase == SlotPhase::Launching && incarnation <= slot.incarnation;
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
        let slot = self.slots.get_mut(&key).expect("checked");
        slot.agent_id = agent_id;
        slot.phase = SlotPhase::Running;
        slot.last_heartbeat_ms = now_ms;
        slot.host = host;
        slot.service_addr = Some(service_addr.clone());
        // A PS added by a reshard enters the published cluster when the reshard is done.
        let fresh = self.slots[&key].fresh;
        if key.role == RoleName::Ps
            && !fresh
            && let Some(c) = self.cluster.as_mut()
        {
            c.set_ps(key.index, service_addr);
        }
        self.log(
            now_ms,
            format!("{key} registered (incarnation {incarnation}, agent {agent_id})"),
        );
        Ok((agent_id, incarnation))
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
        let slot = self.slots.get_mut(&key).ok_or(Error::UnknownProcess {
            role: key.role.to_string(),
            index: key.index,
        })?;
        if slot.agent_id != agent_id || terminal || slot.phase == SlotPhase::Removed {
            return Ok((AgentAction::Shutdown, slot.incarnation, slot.restart_count));
        }
        slot.last_heartbeat_ms = now_ms;
        slot.process_pid = process_pid;
        if sample.is_some() {
            slot.sample = sample;
        }
        if incarnation < slot.incarnation {
            return Ok((AgentAction::Restart, slot.incarnation, slot.restart_count));
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
            // An older incarnation, already replaced: its exit is expected.
            return Ok(Vec::new());
        }
        let phase = self.slots[&key].phase;
        if phase == SlotPhase::Removed {
            return Ok(Vec::new());
        }
        if phase == SlotPhase::Removing && exit_code == 0 && signal == 0 {
            return Ok(self.remove_slot(key, now_ms));
        }
        if exit_code == 0 && signal == 0 && key.role == RoleName::Worker {
            self.slots.get_mut(&key).expect("checked").phase = SlotPhase::Succeeded;
            self.log(now_ms, format!("{key} finished"));
            return Ok(self.check_done());
        }
        let how = match agent_reason {
            Some(why) => why.to_string(),
            None if signal != 0 => format!("killed by signal {signal}"),
            None => format!("exited with code {exit_code}"),
        };
        Ok(self.fail_slot(key, how, false, now_ms))
    }

    /// The agent of `key` is gone (its process ended, or heartbeats stopped).
    pub fn agent_lost(
        &mut self,
        key: SlotKey,
        agent_incarnation: u64,
        why: String,
        now_ms: u64,
    ) -> Vec<Effect> {
        match self.slots.get(&key) {
            Some(s)
                if s.incarnation == agent_incarnation
                    && !self.phase.is_terminal()
                    && s.phase != SlotPhase::Removed => {}
            _ => return Vec::new(),
        }
        self.fail_slot(key, format!("agent lost: {why}"), true, now_ms)
    }

    fn fail_slot(
        &mut self,
        key: SlotKey,
        how: String,
        relaunch_agent: bool,
        now_ms: u64,
    ) -> Vec<Effect> {
        // Only a ps job's worker holds no model state; anything else loses state or the ring.
        let group = !(self.spec.kind == JobKind::Ps && key.role == RoleName::Worker);
        if !group && self.slots[&key].phase == SlotPhase::Removing {
            self.log(now_ms, format!("{key} failed ({how}) while leaving"));
            return self.remove_slot(key, now_ms);
        }
        let count = self.restarts.entry(key.role).or_insert(0);
        *count += 1;
        let count = *count;
        let limit = self
            .spec
            .role_plan(key.role)
            .expect("validated")
            .max_restarts;
        if count > limit {
            let reason = format!(
                "{key} failed ({how}); {} relaunches exceed the limit of {limit}",
                key.role
            );
            self.log(now_ms, reason.clone());
            self.phase = JobPhase::Failed { reason };
            return Vec::new();
        }
        self.log(
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
        } else {
            self.ledger.release(&key.role.to_string(), key.index);
            if let Some(c) = self.cluster.as_mut() {
                c.remove_worker(key.index);
            }
            let slot = self.slots.get_mut(&key).expect("exists");
            slot.incarnation += 1;
            slot.restart_count += 1;
            slot.phase = SlotPhase::Restarting;
            effects.extend(self.ps_checkpoint_if_drained());
        }
        if relaunch_agent {
            let slot = self.slots.get_mut(&key).expect("exists");
            slot.phase = SlotPhase::Launching;
            slot.agent_id = 0;
            slot.process_pid = 0;
            // The new agent gets a full timeout to register.
            slot.last_heartbeat_ms = now_ms;
            effects.push(Effect::StopAgent {
                key,
                graceful: false,
            });
            effects.push(Effect::LaunchAgent {
                key,
                incarnation: slot.incarnation,
            });
        }
        effects
    }

    /// Every process restarts from the latest checkpoint; the ledger rolls back to it. During a
    /// transition the restart lands directly in the plan's target layout.
    fn group_restart(&mut self, now_ms: u64, why: &str) -> Vec<Effect> {
        self.generation += 1;
        let mut effects = Vec::new();
        if self.transition.is_some() {
            effects = self.collapse_transition(now_ms);
        }
        for slot in self.slots.values_mut() {
            if slot.phase == SlotPhase::Removed {
                continue;
            }
            slot.incarnation += 1;
            slot.restart_count += 1;
            if slot.phase != SlotPhase::Launching {
                slot.phase = SlotPhase::Restarting;
            }
        }
        if let Some(r) = self.rendezvous.as_mut() {
            r.invalidate();
        }
        if let Some(c) = self.cluster.as_mut() {
            c.workers.clear();
            c.version += 1;
        }
        let snap = self
            .latest_checkpoint()
            .map(|c| c.ledger.clone())
            .unwrap_or_default();
        let from = self
            .latest_checkpoint()
            .map(|c| format!("checkpoint {}", c.id))
            .unwrap_or_else(|| "the start".into());
        self.ledger.restore(&snap);
        self.checkpoint_pending = false;
        self.checkpoint_saving = false;
        self.shards_since_checkpoint = 0;
        self.final_eval_loss = None;
        self.final_model_digest = None;
        self.log(
            now_ms,
            format!(
                "{why}: every process restarts from {from} (generation {})",
                self.generation
            ),
        );
        effects
    }

    pub fn join_rendezvous(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        now_ms: u64,
    ) -> Result<JoinView, Error> {
        let slot = self.current(key, incarnation)?.clone();
        let addr = slot.service_addr.clone().unwrap_or_default();
        let resume_from = if slot.fresh {
            None
        } else {
            self.latest_checkpoint().map(|c| c.manifest.clone())
        };
        let mut view = JoinView {
            ready: false,
            round: 0,
            rank: 0,
            world_size: 0,
            peers: Vec::new(),
            cluster: None,
            waiting_reason: String::new(),
            restart_count: slot.restart_count,
            resume_from,
            removed: false,
        };
        if !slot.phase.is_live() {
            // A removed allreduce member learns it here, at the step boundary where the group
            // re-forms; it leaves without holding anything.
            if self.spec.kind == JobKind::Allreduce && key.role == RoleName::Worker {
                // Its agent learns from its next heartbeat that it is done; no stop needed.
                let _ = self.remove_slot(key, now_ms);
            }
            view.removed = slot.phase == SlotPhase::Removed
                || (self.spec.kind == JobKind::Allreduce && key.role == RoleName::Worker);
            if view.removed {
                return Ok(view);
            }
        }
        match self.spec.kind {
            JobKind::Allreduce => {
                let rdzv = self.rendezvous_now().expect("allreduce jobs have one");
                match rdzv.join(
                    Member {
                        index: key.index,
                        incarnation,
                        addr,
                    },
                    now_ms,
                ) {
                    JoinOutcome::Ready {
                        round,
                        rank,
                        world_size,
                        peers,
                    } => {
                        view.ready = true;
                        view.round = round;
                        view.rank = rank;
                        view.world_size = world_size;
                        view.peers = peers;
                    }
                    JoinOutcome::Waiting { reason } => view.waiting_reason = reason,
                }
            }
            JobKind::Ps => {
                let ps_to = self
                    .transition
                    .as_ref()
                    .and_then(|t| t.to.get(&RoleName::Ps).copied());
                // Workers start only once every PS of the layout runs its current incarnation:
                // an old PS process about to restart must never receive a push.
                let layout_running = self.ps_layout_running();
                let cluster = self.cluster.as_mut().expect("ps jobs have one");
                if key.role == RoleName::Worker {
                    cluster.set_worker(key.index, addr);
                }
                if key.role == RoleName::Ps {
                    // A PS needs nothing from the others to start. One added by a reshard serves
                    // the new layout and starts empty.
                    view.ready = true;
                    view.round = cluster.version;
                    view.rank = key.index;
                    view.world_size = if slot.fresh {
                        ps_to.unwrap_or(cluster.expected_ps)
                    } else {
                        cluster.expected_ps
                    };
                } else if layout_running {
                    view.ready = true;
                    view.round = cluster.version;
                    view.rank = key.index;
                    view.world_size = cluster.workers.len() as u32;
                } else {
                    view.waiting_reason = format!(
                        "waiting for the {} parameter servers to run ({} have addresses)",
                        cluster.expected_ps,
                        cluster.ps.len()
                    );
                }
                view.cluster = Some(cluster.clone());
            }
        }
        if view.ready {
            let s = self.slots.get_mut(&key).expect("checked");
            if s.phase == SlotPhase::Restarting {
                s.phase = SlotPhase::Running;
            }
            if key.role == RoleName::Worker
                && let Some(c) = &self.cluster
            {
                s.ps_version = c.ps_version;
            }
        }
        Ok(view)
    }

    #[cfg(test)]
    pub fn lease(&mut self, key: SlotKey, incarnation: u64) -> Result<LeaseView, Error> {
        self.lease_with(key, incarnation, None, 0).map(|(v, _)| v)
    }

    /// A lease request; a ps worker says which PS-set version it uses (`ps_version`).
    pub fn lease_with(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        ps_version: Option<u64>,
        now_ms: u64,
    ) -> Result<(LeaseView, Vec<Effect>), Error> {
        self.current(key, incarnation)?;
        let holder = Self::holder(key, incarnation);
        let mut effects = Vec::new();
        let layout = self.cluster.as_ref().map_or(0, |c| c.ps_version);
        let phase = self.slots[&key].phase;
        let ps_worker = self.spec.kind == JobKind::Ps && key.role == RoleName::Worker;
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
            self.slots.get_mut(&key).expect("checked").ps_version = v;
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
                    v.checkpoint_due = self.spec.kind == JobKind::Allreduce;
                    v
                }
            };
            v.ps_version = layout;
            return Ok((v, effects));
        }
        if step == Some(Step::Reform) {
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

    /// `key` applied every sample of shard `shard` to the model.
    pub fn shard_done(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        shard: u64,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        self.current(key, incarnation)?;
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
        let mut effects = self.ps_checkpoint_if_drained();
        effects.extend(self.check_done());
        Ok(effects)
    }

    /// For ps jobs: once every lease is back, ask the PS to save.
    fn ps_checkpoint_if_drained(&mut self) -> Vec<Effect> {
        if !(self.checkpoint_pending
            && !self.checkpoint_saving
            && self.spec.kind == JobKind::Ps
            && self.ledger.in_flight() == 0)
        {
            return Vec::new();
        }
        let Some(ps) = self.cluster.as_ref().map(PsCluster::ps_addrs) else {
            return Vec::new();
        };
        self.checkpoint_saving = true;
        let (id, dir) = self.next_checkpoint_dir();
        vec![Effect::SavePsCheckpoint {
            id,
            dir,
            ps,
            generation: self.generation,
        }]
    }

    /// A checkpoint whose files are written and whose manifest is at `manifest` becomes the one
    /// to restore from. `generation` is the one the save was started in.
    pub fn checkpoint_committed(
        &mut self,
        id: u64,
        manifest: PathBuf,
        step: u64,
        generation: u64,
        now_ms: u64,
    ) -> Result<Vec<Effect>, Error> {
        if generation != self.generation {
            return Err(Error::Checkpoint {
                path: manifest,
                problem: format!(
                    "started in generation {generation}, the job is in {}",
                    self.generation
                ),
            });
        }
        if !self.checkpoint_pending || self.ledger.in_flight() != 0 {
            return Err(Error::Checkpoint {
                path: manifest,
                problem: "no drained checkpoint is pending".into(),
            });
        }
        self.checkpoints.push(CheckpointRecord {
            id,
            manifest: manifest.clone(),
            ledger: self.ledger.snapshot(),
            taken_at_ms: now_ms,
            step,
        });
        self.checkpoint_pending = false;
        self.checkpoint_saving = false;
        self.shards_since_checkpoint = 0;
        self.log(
            now_ms,
            format!(
                "checkpoint {id} committed at step {step} ({} of {} shards done): {}",
                self.ledger.done_shards(),
                self.ledger.total_shards(),
                manifest.display()
            ),
        );
        Ok(self.on_cut(now_ms))
    }

    /// A checkpoint could not be written: training goes on without it.
    pub fn checkpoint_failed(&mut self, generation: u64, problem: String, now_ms: u64) {
        if generation == self.generation && self.checkpoint_pending {
            self.checkpoint_pending = false;
            self.checkpoint_saving = false;
            self.log(
                now_ms,
                format!("checkpoint failed, training goes on without it: {problem}"),
            );
        }
    }

    /// The id the next checkpoint gets, and the directory a ps checkpoint of that id is saved in.
    pub fn next_checkpoint_dir(&self) -> (u64, PathBuf) {
        let id = self.checkpoints.last().map(|c| c.id + 1).unwrap_or(1);
        (id, self.spec.checkpoint.dir.join(format!("ckpt-{id:06}")))
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
        self.current(key, incarnation)?;
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
                self.log(
                    now_ms,
                    format!("plan {v}: every worker is training again, {ms} ms after the plan"),
                );
            }
        }
        self.metrics.insert(key, m);
        let mut effects = Vec::new();
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
                effects = self.check_done();
            }
        }
        Ok(effects)
    }

    /// The job's work is over when every worker exited 0 and, for the built-in workload, every
    /// shard is done and the final model was evaluated.
    fn check_done(&mut self) -> Vec<Effect> {
        if self.phase != JobPhase::Running {
            return Vec::new();
        }
        let workers_done = self
            .slots
            .values()
            .filter(|s| s.key.role == RoleName::Worker && s.phase.is_live())
            .all(|s| s.phase == SlotPhase::Succeeded);
        let data_done =
            !self.is_builtin() || (self.ledger.is_complete() && self.final_eval_loss.is_some());
        if workers_done && data_done {
            self.phase = JobPhase::Finishing;
            return vec![Effect::Finish];
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
            self.log(now_ms, format!("job failed: {reason}"));
            self.phase = JobPhase::Failed { reason };
        }
    }

    /// The rendezvous, told how many live workers have not joined it yet (starting, registering
    /// or about to join): last call waits for them, up to the register timeout.
    fn rendezvous_now(&mut self) -> Option<&mut RoundRendezvous> {
        let live: Vec<u32> = self
            .slots
            .values()
            .filter(|s| {
                s.key.role == RoleName::Worker
                    && matches!(
                        s.phase,
                        SlotPhase::Launching | SlotPhase::Running | SlotPhase::Restarting
                    )
            })
            .map(|s| s.key.index)
            .collect();
        let r = self.rendezvous.as_mut()?;
        r.launching = live.iter().filter(|&&i| !r.has_joined(i)).count() as u32;
        Some(r)
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
        let closed = self.rendezvous_now().is_some_and(|r| r.try_close(now_ms));
        let (heartbeat, register) = (
            self.timing.heartbeat_timeout_ms,
            self.timing.register_timeout_ms,
        );
        let late: Vec<(SlotKey, u64, u64)> = self
            .slots
            .values()
            .filter(|s| s.phase != SlotPhase::Removed)
            .filter(|s| {
                let limit = if s.phase == SlotPhase::Launching {
                    register
                } else {
                    heartbeat
                };
                now_ms.saturating_sub(s.last_heartbeat_ms) > limit
            })
            .map(|s| (s.key, s.incarnation, now_ms - s.last_heartbeat_ms))
            .collect();
        let marker = (self.transition.as_ref().map(|t| t.step), self.plans.reached);
        let mut effects = self.advance(now_ms);
        let moved = marker != (self.transition.as_ref().map(|t| t.step), self.plans.reached);
        let changed = closed || moved || !late.is_empty() || !effects.is_empty();
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
        let workers: Vec<(&SlotKey, &MetricsRecord)> = self
            .metrics
            .iter()
            .filter(|(k, _)| k.role == RoleName::Worker)
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
                self.slots
                    .get(k)
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

/// Scale plans: acceptance, the transition that carries one out, and its end.
impl JobContext {
    /// Live slots of each role.
    pub fn role_counts(&self) -> BTreeMap<RoleName, u32> {
        let mut counts: BTreeMap<RoleName, u32> = self.spec.roles.keys().map(|&r| (r, 0)).collect();
        for s in self.slots.values().filter(|s| s.phase.is_live()) {
            *counts.entry(s.key.role).or_default() += 1;
        }
        counts
    }

    /// What the transition in progress is doing, for the status output; empty when idle.
    pub fn transition_status(&self, now_ms: u64) -> String {
        match &self.transition {
            None => String::new(),
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
        plan: ScalePlan,
        cap: &Capacity,
        now_ms: u64,
    ) -> Result<Vec<Effect>, String> {
        if self.phase != JobPhase::Running {
            return Err(format!("the job is {}", self.phase.name()));
        }
        if self.ledger.is_complete() {
            return Err("the job has no data left to train on".into());
        }
        self.plans.check_version(plan.version)?;
        let live: Vec<SlotKey> = self
            .slots
            .values()
            .filter(|s| s.phase.is_live())
            .map(|s| s.key)
            .collect();
        crate::scale::validate(&plan, &self.spec, &self.role_counts(), &live, cap)?;
        self.plans.desired = plan.version;
        if let Some(t) = &self.transition {
            let replaced = self.plans.queued.replace(plan.clone());
            self.log(
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
            return Ok(Vec::new());
        }
        Ok(self.start_transition(plan, now_ms))
    }

    fn describe(counts: &BTreeMap<RoleName, u32>) -> String {
        counts
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// (Re)starts a slot's agent with a new incarnation.
    fn launch_slot(&mut self, key: SlotKey, fresh: bool, now_ms: u64) -> Effect {
        let resources = self.role_resources.get(&key.role).cloned();
        let slot = self
            .slots
            .entry(key)
            .or_insert_with(|| Slot::new(key, 0, now_ms));
        slot.incarnation += 1;
        slot.phase = SlotPhase::Launching;
        slot.agent_id = 0;
        slot.process_pid = 0;
        slot.last_heartbeat_ms = now_ms;
        slot.service_addr = None;
        slot.sample = None;
        slot.ps_version = 0;
        slot.fresh = fresh;
        if let Some(r) = slot.migrate_to.take() {
            slot.resources = Some(r);
        } else if resources.is_some() {
            slot.resources = resources;
        }
        Effect::LaunchAgent {
            key,
            incarnation: slot.incarnation,
        }
    }

    /// The slot leaves the job: its agent is told to shut down (and stopped).
    fn remove_slot(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let Some(slot) = self.slots.get_mut(&key) else {
            return Vec::new();
        };
        if slot.phase == SlotPhase::Removed {
            return Vec::new();
        }
        slot.phase = SlotPhase::Removed;
        slot.fresh = false;
        slot.migrate_to = None;
        self.ledger.release(&key.role.to_string(), key.index);
        if let Some(c) = self.cluster.as_mut() {
            match key.role {
                RoleName::Worker => c.remove_worker(key.index),
                RoleName::Ps => c.remove_ps(key.index),
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

    fn start_transition(&mut self, plan: ScalePlan, now_ms: u64) -> Vec<Effect> {
        let from = self.role_counts();
        let mut to = from.clone();
        for (&role, t) in &plan.roles {
            to.insert(role, t.count);
            if let Some(r) = &t.resources {
                self.role_resources.insert(role, r.clone());
            }
        }
        let ps_change = from.get(&RoleName::Ps) != to.get(&RoleName::Ps);
        let mut effects = Vec::new();
        for (&role, &n) in &to {
            let now = from[&role];
            for index in now..n {
                let fresh = role == RoleName::Ps;
                effects.push(self.launch_slot(SlotKey { role, index }, fresh, now_ms));
            }
            for index in n..now {
                let key = SlotKey { role, index };
                let slot = self.slots.get_mut(&key).expect("live slot");
                if matches!(slot.phase, SlotPhase::Launching | SlotPhase::Restarting)
                    && role == RoleName::Worker
                {
                    effects.extend(self.remove_slot(key, now_ms));
                } else {
                    slot.phase = SlotPhase::Removing;
                }
            }
        }
        let mut state_moves = false;
        for m in &plan.migrations {
            let stateless = self.spec.kind == JobKind::Ps && m.key.role == RoleName::Worker;
            self.slots.get_mut(&m.key).expect("validated").migrate_to = Some(m.resources.clone());
            self.log(
                now_ms,
                format!("plan {}: migrating {} ({})", plan.version, m.key, m.reason),
            );
            if stateless {
                self.ledger.release(&m.key.role.to_string(), m.key.index);
                if let Some(c) = self.cluster.as_mut() {
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
                        .rendezvous
                        .as_ref()
                        .is_some_and(|r| r.current().is_some())
            }
            JobKind::Ps => ps_change || state_moves,
        };
        let rdzv_changes = self.spec.kind == JobKind::Allreduce && (from != to || state_moves);
        self.log(
            now_ms,
            format!(
                "plan {} accepted: {} -> {}{}",
                plan.version,
                Self::describe(&from),
                Self::describe(&to),
                if needs_cut {
                    "; draining to a consistent cut"
                } else {
                    ""
                }
            ),
        );
        self.transition = Some(Transition {
            plan,
            started_ms: now_ms,
            step: if needs_cut { Step::Cut } else { Step::Settle },
            step_started_ms: now_ms,
            from,
            to,
            round_after: 0,
            resharding: false,
        });
        if needs_cut {
            self.checkpoint_pending = true;
            effects.extend(self.ps_checkpoint_if_drained());
        } else if rdzv_changes {
            // No round is formed yet: the next one simply has the new size.
            effects.extend(self.on_cut(now_ms));
        }
        effects.extend(self.advance(now_ms));
        effects
    }

    fn set_step(&mut self, step: Step, now_ms: u64) {
        if let Some(t) = self.transition.as_mut() {
            let took = now_ms.saturating_sub(t.step_started_ms);
            let (v, old) = (t.plan.version, t.step);
            if old == step {
                return;
            }
            t.step = step;
            t.step_started_ms = now_ms;
            self.log(
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
    fn on_cut(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(t) = &self.transition else {
            return Vec::new();
        };
        if !matches!(t.step, Step::Cut | Step::Settle) {
            return Vec::new();
        }
        let to = t.to.clone();
        let ps_change = t.from.get(&RoleName::Ps) != t.to.get(&RoleName::Ps);
        let migrating: Vec<SlotKey> = self
            .slots
            .values()
            .filter(|s| s.migrate_to.is_some())
            .map(|s| s.key)
            .collect();
        let mut effects = Vec::new();
        match self.spec.kind {
            JobKind::Allreduce => {
                let rdzv = self.rendezvous.as_mut().expect("allreduce jobs have one");
                rdzv.invalidate();
                rdzv.expected = to[&RoleName::Worker];
                let round_after = rdzv.next_round_number();
                for key in migrating {
                    effects.push(self.launch_slot(key, false, now_ms));
                }
                if let Some(t) = self.transition.as_mut() {
                    t.round_after = round_after;
                }
                self.set_step(Step::Reform, now_ms);
            }
            JobKind::Ps => {
                for key in migrating {
                    if let Some(c) = self.cluster.as_mut() {
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
    fn ps_layout_running(&self) -> bool {
        self.slots
            .values()
            .filter(|s| s.key.role == RoleName::Ps && s.phase.is_live())
            .all(|s| s.phase == SlotPhase::Running && s.service_addr.is_some())
            && self.cluster.as_ref().is_some_and(PsCluster::ps_complete)
    }

    /// Moves the transition on when what its step waits for has happened. Called after every
    /// event that can matter; returns what the shell must do next.
    pub fn advance(&mut self, now_ms: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.phase != JobPhase::Running {
            return effects;
        }
        loop {
            let Some(t) = &self.transition else {
                return effects;
            };
            match t.step {
                Step::Cut => return effects,
                Step::Reshard => {
                    if t.resharding {
                        return effects;
                    }
                    let (from, to) = (t.from[&RoleName::Ps], t.to[&RoleName::Ps]);
                    let addr = |i: u32| {
                        self.slots
                            .get(&SlotKey {
                                role: RoleName::Ps,
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
                        return effects;
                    };
                    let version = t.plan.version;
                    self.transition.as_mut().expect("checked").resharding = true;
                    effects.push(Effect::ReshardPs {
                        version,
                        from: old,
                        to: new,
                        generation: self.generation,
                    });
                    return effects;
                }
                Step::Reform => {
                    let formed = self
                        .rendezvous
                        .as_ref()
                        .and_then(|r| r.current())
                        .is_some_and(|r| r.number >= t.round_after);
                    if !formed {
                        return effects;
                    }
                    self.set_step(Step::Settle, now_ms);
                }
                Step::Switch => {
                    let layout = self.cluster.as_ref().map_or(0, |c| c.ps_version);
                    let switched = self
                        .slots
                        .values()
                        .filter(|s| s.key.role == RoleName::Worker && s.phase == SlotPhase::Running)
                        .all(|s| s.ps_version == layout);
                    if !(self.ps_layout_running() && switched) {
                        return effects;
                    }
                    // Every worker uses the new layout: lent keys can go, old PS can stop.
                    let ps_change = t.from.get(&RoleName::Ps) != t.to.get(&RoleName::Ps);
                    if ps_change && let Some(c) = &self.cluster {
                        effects.push(Effect::DropPs { ps: c.ps_addrs() });
                    }
                    let retiring: Vec<SlotKey> = self
                        .slots
                        .values()
                        .filter(|s| s.key.role == RoleName::Ps && s.phase == SlotPhase::Removing)
                        .map(|s| s.key)
                        .collect();
                    for key in retiring {
                        effects.extend(self.remove_slot(key, now_ms));
                    }
                    self.set_step(Step::Settle, now_ms);
                }
                Step::Settle => {
                    let (version, round_after, waited) = (
                        t.plan.version,
                        t.round_after,
                        now_ms.saturating_sub(t.step_started_ms),
                    );
                    if let Some(r) = self.rendezvous_now() {
                        if let Some((closed, late)) = r.late_joiners() {
                            // Workers of this plan joined after the round closed without them
                            // (their platform was slow): drain and re-form once more with them.
                            self.log(
                                now_ms,
                                format!(
                                    "plan {version}: worker(s) {late:?} joined after round {closed} closed without them; re-forming"
                                ),
                            );
                            self.checkpoint_pending = true;
                            self.set_step(Step::Cut, now_ms);
                            return effects;
                        }
                        // A worker that registered but has not joined yet gets as long as
                        // last call would have given it.
                        if r.launching > 0 && waited < r.launch_wait_ms {
                            return effects;
                        }
                    }
                    let settled = self.slots.values().all(|s| {
                        !matches!(
                            s.phase,
                            SlotPhase::Removing | SlotPhase::Launching | SlotPhase::Restarting
                        ) && s.migrate_to.is_none()
                    });
                    let formed = self.spec.kind == JobKind::Ps
                        || self
                            .rendezvous
                            .as_ref()
                            .and_then(|r| r.current())
                            .is_some_and(|r| r.number >= round_after);
                    if !(settled && formed) {
                        return effects;
                    }
                    effects.extend(self.finish_transition(now_ms));
                }
            }
        }
    }

    fn finish_transition(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(t) = self.transition.take() else {
            return Vec::new();
        };
        self.plans.reached = t.plan.version;
        let awaiting: Vec<SlotKey> = self
            .slots
            .values()
            .filter(|s| s.key.role == RoleName::Worker && s.phase == SlotPhase::Running)
            .map(|s| s.key)
            .collect();
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
        self.log(
            now_ms,
            format!(
                "plan {} reached in {} ms: {}",
                t.plan.version,
                now_ms.saturating_sub(t.started_ms),
                Self::describe(&t.to)
            ),
        );
        match self.plans.queued.take() {
            Some(next) => self.start_transition(next, now_ms),
            None => Vec::new(),
        }
    }

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
        if let Some(c) = self.cluster.as_mut() {
            c.expected_ps = to;
            c.ps.retain(|&i, _| i < to);
            c.ps_version += 1;
            c.version += 1;
        }
        let mut new_ps = Vec::new();
        for s in self.slots.values_mut() {
            if s.fresh {
                s.fresh = false;
                new_ps.push((s.key.index, s.service_addr.clone().unwrap_or_default()));
            }
        }
        for (i, addr) in new_ps {
            if let Some(c) = self.cluster.as_mut() {
                c.ps.insert(i, addr);
            }
        }
        self.log(
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
    fn collapse_transition(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(t) = self.transition.as_mut() else {
            return Vec::new();
        };
        t.resharding = false;
        let to = t.to.clone();
        let mut effects = Vec::new();
        let leaving: Vec<SlotKey> = self
            .slots
            .values()
            .filter(|s| s.phase == SlotPhase::Removing)
            .map(|s| s.key)
            .collect();
        for key in leaving {
            effects.extend(self.remove_slot(key, now_ms));
        }
        let migrating: Vec<SlotKey> = self
            .slots
            .values()
            .filter(|s| s.migrate_to.is_some())
            .map(|s| s.key)
            .collect();
        for key in migrating {
            effects.push(Effect::StopAgent {
                key,
                graceful: false,
            });
            effects.push(self.launch_slot(key, false, now_ms));
        }
        for s in self.slots.values_mut() {
            s.fresh = false;
        }
        if let Some(c) = self.cluster.as_mut() {
            let n = to[&RoleName::Ps];
            c.expected_ps = n;
            c.ps.retain(|&i, _| i < n);
            c.ps_version += 1;
        }
        if let Some(r) = self.rendezvous.as_mut() {
            r.expected = to[&RoleName::Worker];
        }
        let round_after = self
            .rendezvous
            .as_ref()
            .map_or(0, RoundRendezvous::next_round_number);
        if let Some(t) = self.transition.as_mut() {
            t.round_after = round_after;
        }
        self.set_step(Step::Settle, now_ms);
        effects
    }
}

/// Actions an agent is told to take (mirrors the wire enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentAction {
    Continue,
    Restart,
    Shutdown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::Capacity;

    fn spec(kind: &str, ps: u32, workers: u32, every_shards: u32) -> JobSpec {
        let ps_role = if ps > 0 {
            format!("  ps: {{ replicas: {ps}, max_restarts: 1 }}\n")
        } else {
            String::new()
        };
        JobSpec::from_yaml(&format!(
            "name: t\nkind: {kind}\nroles:\n{ps_role}  worker: {{ replicas: {workers}, max_restarts: 2 }}\n\
             workload:\n  builtin: {{}}\ndata: {{ num_samples: 100, shard_size: 10 }}\n\
             checkpoint: {{ dir: /tmp/brain-job-test, every_shards: {every_shards} }}\n"
        ))
        .unwrap()
    }

    const W0: SlotKey = SlotKey {
        role: RoleName::Worker,
        index: 0,
    };
    const W1: SlotKey = SlotKey {
        role: RoleName::Worker,
        index: 1,
    };
    const PS0: SlotKey = SlotKey {
        role: RoleName::Ps,
        index: 0,
    };

    /// A job whose agents all registered and joined.
    fn running(kind: &str, ps: u32, workers: u32, every: u32) -> JobContext {
        let (mut ctx, effects) = JobContext::new(
            spec(kind, ps, workers, every),
            "t-1".into(),
            Timing::default(),
            0,
        );
        assert_eq!(effects.len(), (ps + workers) as usize);
        for key in ctx.slots.keys().copied().collect::<Vec<_>>() {
            ctx.register_agent(
                key,
                1,
                "127.0.0.1".into(),
                format!("127.0.0.1:{}", 9000 + key.index),
                1,
            )
            .unwrap();
        }
        // Everyone joins; then everyone sees the closed round (or the complete cluster spec).
        for key in ctx.slots.keys().copied().collect::<Vec<_>>() {
            ctx.join_rendezvous(key, 1, 2).unwrap();
        }
        for key in ctx.slots.keys().copied().collect::<Vec<_>>() {
            assert!(ctx.join_rendezvous(key, 1, 2).unwrap().ready, "{key}");
        }
        ctx
    }

    fn lease(ctx: &mut JobContext, key: SlotKey, inc: u64) -> Option<u64> {
        match ctx.lease(key, inc).unwrap().outcome {
            LeaseOutcome::Granted(s) => Some(s.id),
            _ => None,
        }
    }

    #[test]
    fn a_resumed_context_launches_every_process_anew_from_the_latest_checkpoint() {
        let mut ctx = running("ps", 1, 2, 1);
        let a = lease(&mut ctx, W0, 1).unwrap();
        let effects = ctx.shard_done(W0, 1, a, 10).unwrap();
        assert!(matches!(
            effects.as_slice(),
            [Effect::SavePsCheckpoint { id: 1, .. }]
        ));
        let generation = ctx.generation;
        ctx.checkpoint_committed(1, "/tmp/c1".into(), 5, generation, 20)
            .unwrap();
        // After the checkpoint: one more shard done, one held, a save under way; then the
        // master dies. What it persisted is all the next one has.
        let b = lease(&mut ctx, W1, 1).unwrap();
        lease(&mut ctx, W0, 1).unwrap();
        ctx.shard_done(W1, 1, b, 30).unwrap();
        let mut back: JobContext =
            serde_json::from_str(&serde_json::to_string(&ctx).unwrap()).unwrap();
        assert_eq!(back.ledger.done_shards(), 2);
        let clock = back.clock_ms();
        assert!(clock >= 30, "{clock}");
        let launches = back.resume(clock + 1).unwrap();
        // Every process, each with a new incarnation, as a fresh launch.
        assert_eq!(launches.len(), 3);
        for e in &launches {
            let Effect::LaunchAgent { key, incarnation } = e else {
                panic!("{e:?}");
            };
            assert!(*incarnation > 1, "{key}");
            assert_eq!(back.slots[key].phase, SlotPhase::Launching);
        }
        // The data rolls back to the checkpoint: the shard done after it is done again.
        assert_eq!(back.ledger.done_shards(), 1);
        assert_eq!(back.ledger.in_flight(), 0);
        assert!(!back.checkpoint_pending && !back.checkpoint_saving);
        assert!(back.generation > generation);
        back.ledger.verify_exactly_once(false).unwrap();
        // A finished job has nothing to resume.
        back.fail("for the test".into(), clock + 2);
        assert!(matches!(
            back.resume(clock + 3),
            Err(Error::InvalidRequest(_))
        ));
    }

    #[test]
    fn a_ps_worker_failure_requeues_only_its_shard_and_restarts_only_it() {
        let mut ctx = running("ps", 1, 2, 0);
        let a = lease(&mut ctx, W0, 1).unwrap();
        let b = lease(&mut ctx, W1, 1).unwrap();
        ctx.shard_done(W1, 1, b, 3).unwrap();
        let effects = ctx.process_exited(W0, 1, 0, 9, None, 4).unwrap();
        assert!(effects.is_empty());
        assert_eq!(ctx.slots[&W0].incarnation, 2);
        assert_eq!(ctx.slots[&W1].incarnation, 1);
        assert_eq!(ctx.slots[&PS0].incarnation, 1);
        // The dead incarnation is fenced; the new one gets the shard back first.
        assert!(matches!(
            ctx.lease(W0, 1),
            Err(Error::StaleIncarnation { .. })
        ));
        assert_eq!(
            ctx.heartbeat(W0, ctx.slots[&W0].agent_id, 1, None, 0, 5)
                .unwrap()
                .0,
            AgentAction::Restart
        );
        assert_eq!(lease(&mut ctx, W0, 2), Some(a));
        assert_eq!(ctx.ledger.done_shards(), 1);
    }

    #[test]
    fn a_ps_failure_restarts_everyone_from_the_checkpoint_and_rolls_the_ledger_back() {
        let mut ctx = running("ps", 1, 1, 2);
        for _ in 0..2 {
            let s = lease(&mut ctx, W0, 1).unwrap();
            let effects = ctx.shard_done(W0, 1, s, 3).unwrap();
            if ctx.checkpoint_pending {
                assert!(
                    matches!(effects.as_slice(), [Effect::SavePsCheckpoint { id: 1, .. }]),
                    "{effects:?}"
                );
            }
        }
        // Draining: no new leases until the checkpoint commits.
        assert_eq!(ctx.lease(W0, 1).unwrap().outcome, LeaseOutcome::Wait);
        ctx.checkpoint_committed(1, "/tmp/m.json".into(), 2, 0, 4)
            .unwrap();
        let s = lease(&mut ctx, W0, 1).unwrap();
        ctx.shard_done(W0, 1, s, 5).unwrap();
        assert_eq!(ctx.ledger.done_shards(), 3);
        ctx.process_exited(PS0, 1, 0, 9, None, 6).unwrap();
        assert_eq!(
            ctx.ledger.done_shards(),
            2,
            "rolled back to the checkpoint's data position"
        );
        assert!(
            ctx.slots
                .values()
                .all(|s| s.incarnation == 2 && s.phase == SlotPhase::Restarting)
        );
        let view = ctx.join_rendezvous(PS0, 2, 7).unwrap();
        assert_eq!(view.resume_from, Some("/tmp/m.json".into()));
        ctx.ledger.verify_exactly_once(false).unwrap();
    }

    #[test]
    fn a_checkpoint_from_before_a_restart_is_refused() {
        let mut ctx = running("ps", 1, 1, 1);
        let s = lease(&mut ctx, W0, 1).unwrap();
        ctx.shard_done(W0, 1, s, 3).unwrap();
        ctx.process_exited(PS0, 1, 1, 0, None, 4).unwrap();
        assert!(
            ctx.checkpoint_committed(1, "/tmp/m.json".into(), 1, 0, 5)
                .is_err()
        );
        assert!(ctx.checkpoints.is_empty());
    }

    #[test]
    fn an_allreduce_worker_failure_opens_a_new_round_for_everyone() {
        let mut ctx = running("allreduce", 0, 2, 0);
        let round = ctx.rendezvous.as_ref().unwrap().current().unwrap().number;
        ctx.process_exited(W1, 1, 1, 0, None, 3).unwrap();
        assert!(ctx.rendezvous.as_ref().unwrap().current().is_none());
        // The neighbour's ring error arrives with the old incarnation: ignored, not counted.
        ctx.process_exited(W0, 1, 1, 0, None, 3).unwrap();
        assert_eq!(ctx.restarts[&RoleName::Worker], 1);
        assert!(!ctx.join_rendezvous(W0, 2, 4).unwrap().ready);
        let v = ctx.join_rendezvous(W1, 2, 4).unwrap();
        assert!(v.ready);
        assert_eq!(v.round, round + 1);
    }

    #[test]
    fn exceeding_the_relaunch_limit_fails_the_job_with_the_reason() {
        let mut ctx = running("ps", 1, 1, 0);
        for inc in 1..=2 {
            ctx.process_exited(W0, inc, 3, 0, None, inc).unwrap();
            assert_eq!(ctx.phase, JobPhase::Running);
        }
        ctx.process_exited(W0, 3, 3, 0, None, 9).unwrap();
        let JobPhase::Failed { reason } = &ctx.phase else {
            panic!("{:?}", ctx.phase)
        };
        assert!(
            reason.contains("worker-0 failed (exited with code 3)"),
            "{reason}"
        );
        assert!(reason.contains("limit of 2"), "{reason}");
        let ps_agent = ctx.slots[&PS0].agent_id;
        assert_eq!(
            ctx.heartbeat(PS0, ps_agent, 1, None, 0, 10).unwrap().0,
            AgentAction::Shutdown
        );
    }

    #[test]
    fn a_lost_agent_is_replaced_and_its_late_registration_adopted() {
        let (mut ctx, _) = JobContext::new(spec("ps", 1, 1, 0), "t".into(), Timing::default(), 0);
        let (agent, _) = ctx
            .register_agent(PS0, 1, "h".into(), "a".into(), 1)
            .unwrap();
        let t = Timing::default().register_timeout_ms + 1;
        ctx.heartbeat(PS0, agent, 1, None, 0, t - 1).unwrap();
        // The worker's agent never registers: after the registration timeout it is relaunched.
        let effects = ctx.tick(t);
        assert_eq!(
            effects,
            vec![
                Effect::StopAgent {
                    key: W0,
                    graceful: false
                },
                Effect::LaunchAgent {
                    key: W0,
                    incarnation: 2
                }
            ]
        );
        // An agent started for the older incarnation is adopted with the current one.
        let (_, inc) = ctx
            .register_agent(W0, 1, "h".into(), "b".into(), 40_000)
            .unwrap();
        assert_eq!(inc, ctx.slots[&W0].incarnation);
        // A registered slot does not adopt stale agents.
        assert!(
            ctx.register_agent(W0, 1, "h".into(), "c".into(), 40_001)
                .is_err()
        );
    }

    #[test]
    fn the_job_succeeds_once_all_data_is_done_evaluated_and_workers_exited() {
        let mut ctx = running("allreduce", 0, 2, 0);
        while let Some(s) = lease(&mut ctx, W0, 1) {
            ctx.shard_done(W0, 1, s, 3).unwrap();
        }
        let v0 = ctx.lease(W0, 1).unwrap();
        let v1 = ctx.lease(W1, 1).unwrap();
        assert_eq!(v0.outcome, LeaseOutcome::EndOfData);
        assert!(v0.evaluate && !v1.evaluate, "exactly one evaluator");
        assert!(ctx.process_exited(W1, 1, 0, 0, None, 4).unwrap().is_empty());
        let m = MetricsRecord::default();
        assert!(
            ctx.report_metrics(W0, 1, m.clone(), Some(f64::NAN), None, 5)
                .is_err()
        );
        ctx.report_metrics(W0, 1, m, Some(0.45), Some("d".into()), 5)
            .unwrap();
        assert_eq!(
            ctx.process_exited(W0, 1, 0, 0, None, 6).unwrap(),
            vec![Effect::Finish]
        );
        ctx.finish(7);
        assert_eq!(ctx.phase, JobPhase::Succeeded);
        ctx.ledger.verify_exactly_once(true).unwrap();
    }

    /// Makes the workers of `ctx` elastic between 1 and 4.
    fn elastic(ctx: &mut JobContext) {
        let w = ctx.spec.roles.get_mut(&RoleName::Worker).unwrap();
        (w.min, w.max) = (Some(1), Some(4));
        if let Some(r) = ctx.rendezvous.as_mut() {
            (r.min, r.max) = (1, 4);
        }
    }

    fn workers(version: u64, n: u32) -> ScalePlan {
        let mut p = ScalePlan {
            version,
            ..Default::default()
        };
        p.roles.insert(
            RoleName::Worker,
            crate::scale::RoleTarget {
                count: n,
                resources: None,
            },
        );
        p
    }

    #[test]
    fn an_allreduce_plan_drains_checkpoints_and_re_forms_the_group_with_survivors() {
        let mut ctx = running("allreduce", 0, 2, 0);
        let cap = Capacity::default();
        elastic(&mut ctx);
        let s = lease(&mut ctx, W0, 1).unwrap();
        let effects = ctx.apply_plan(workers(1, 3), &cap, 5).unwrap();
        let w2 = SlotKey {
            role: RoleName::Worker,
            index: 2,
        };
        assert!(effects.contains(&Effect::LaunchAgent {
            key: w2,
            incarnation: 1
        }));
        // Draining: the holder keeps its shard, the idle rank is asked to checkpoint.
        assert!(ctx.lease(W1, 1).unwrap().checkpoint_due);
        ctx.shard_done(W0, 1, s, 6).unwrap();
        ctx.checkpoint_committed(1, "/tmp/m.json".into(), 3, 0, 7)
            .unwrap();
        // Every rank is told to re-form; survivors keep their incarnation (and their model).
        assert!(ctx.lease(W0, 1).unwrap().reform);
        ctx.register_agent(w2, 1, "h".into(), "a2".into(), 8)
            .unwrap();
        let v2 = ctx.join_rendezvous(w2, 1, 8).unwrap();
        assert_eq!(v2.resume_from, Some("/tmp/m.json".into()));
        ctx.join_rendezvous(W0, 1, 9).unwrap();
        let v = ctx.join_rendezvous(W1, 1, 9).unwrap();
        assert!(v.ready && v.world_size == 3, "{v:?}");
        ctx.advance(10);
        assert_eq!(ctx.plans.reached, 1);
        assert_eq!(ctx.slots[&W0].incarnation, 1);
        // Back to 1: worker 1 and 2 are removed at the re-formation and told so.
        ctx.apply_plan(workers(2, 1), &cap, 11).unwrap();
        ctx.checkpoint_committed(2, "/tmp/m2.json".into(), 4, 0, 12)
            .unwrap();
        assert!(ctx.join_rendezvous(W1, 1, 13).unwrap().removed);
        assert!(ctx.join_rendezvous(w2, 1, 13).unwrap().removed);
        assert!(ctx.join_rendezvous(W0, 1, 13).unwrap().ready);
        ctx.advance(14);
        assert_eq!(ctx.plans.reached, 2);
        assert_eq!(ctx.role_counts()[&RoleName::Worker], 1);
        ctx.ledger.verify_exactly_once(false).unwrap();
    }

    #[test]
    fn a_worker_that_joins_after_its_round_closed_is_taken_in_by_one_more_re_formation() {
        let mut ctx = running("allreduce", 0, 2, 0);
        let cap = Capacity::default();
        elastic(&mut ctx);
        ctx.rendezvous.as_mut().unwrap().launch_wait_ms = 3_000;
        let w2 = SlotKey {
            role: RoleName::Worker,
            index: 2,
        };
        ctx.apply_plan(workers(1, 3), &cap, 10).unwrap();
        assert!(ctx.lease(W1, 1).unwrap().checkpoint_due);
        ctx.checkpoint_committed(1, "/tmp/m.json".into(), 0, 0, 20)
            .unwrap();
        // The survivors rejoin at once; worker 2 registers but is slow to join.
        ctx.join_rendezvous(W0, 1, 30).unwrap();
        ctx.join_rendezvous(W1, 1, 30).unwrap();
        ctx.register_agent(w2, 1, "h".into(), "a2".into(), 40)
            .unwrap();
        // Last call waits for it while it is on its way ...
        ctx.tick(30 + 2_500);
        assert!(ctx.rendezvous.as_ref().unwrap().current().is_none());
        // ... up to launch_wait_ms; then the round closes with the two.
        ctx.tick(30 + 3_000);
        assert_eq!(
            ctx.rendezvous
                .as_ref()
                .unwrap()
                .current()
                .unwrap()
                .members
                .len(),
            2
        );
        assert!(ctx.join_rendezvous(W0, 1, 3_040).unwrap().ready);
        // The plan is not reached while worker 2 has still not joined ...
        ctx.tick(3_100);
        assert_eq!(ctx.plans.reached, 0);
        // ... and once it joins, outside the round, the group is drained and re-formed.
        let v = ctx.join_rendezvous(w2, 1, 3_200).unwrap();
        assert!(!v.ready, "{v:?}");
        ctx.tick(3_300);
        assert_eq!(ctx.plans.reached, 0);
        assert!(ctx.lease(W0, 1).unwrap().checkpoint_due);
        ctx.checkpoint_committed(2, "/tmp/m2.json".into(), 0, 0, 3_400)
            .unwrap();
        assert!(ctx.lease(W0, 1).unwrap().reform);
        for k in [W0, W1, w2] {
            ctx.join_rendezvous(k, 1, 3_500).unwrap();
        }
        let v = ctx.join_rendezvous(w2, 1, 3_500).unwrap();
        assert!(v.ready && v.world_size == 3, "{v:?}");
        ctx.advance(3_600);
        assert_eq!(ctx.plans.reached, 1);
        ctx.ledger.verify_exactly_once(false).unwrap();
    }

    #[test]
    fn a_removed_ps_worker_hands_back_its_shard_and_a_queued_plan_replaces_an_older_one() {
        let mut ctx = running("ps", 1, 2, 0);
        let cap = Capacity::default();
        elastic(&mut ctx);
        let held = lease(&mut ctx, W1, 1).unwrap();
        ctx.apply_plan(workers(1, 1), &cap, 5).unwrap();
        // Plans arriving meanwhile wait; the newer replaces the older.
        ctx.apply_plan(workers(2, 2), &cap, 6).unwrap();
        ctx.apply_plan(workers(3, 2), &cap, 7).unwrap();
        assert_eq!(ctx.plans.queued.as_ref().map(|p| p.version), Some(3));
        assert!(ctx.apply_plan(workers(3, 2), &cap, 7).is_err());
        let (v, _) = ctx.lease_with(W1, 1, None, 8).unwrap();
        assert!(v.removed);
        assert_eq!(ctx.slots[&W1].phase, SlotPhase::Removed);
        // Its shard went back to the queue; worker 0 gets it.
        assert_eq!(lease(&mut ctx, W0, 1), Some(held));
        // Plan 1 is reached, plan 3 starts and brings worker 1 back with a new incarnation.
        assert_eq!(ctx.plans.reached, 1);
        assert_eq!(ctx.transition.as_ref().map(|t| t.plan.version), Some(3));
        assert_eq!(ctx.slots[&W1].incarnation, 2);
        assert_eq!(ctx.slots[&W1].phase, SlotPhase::Launching);
        ctx.ledger.verify_exactly_once(false).unwrap();
    }

    #[test]
    fn the_context_round_trips_through_json() {
        let mut ctx = running("ps", 1, 2, 3);
        let s = lease(&mut ctx, W0, 1).unwrap();
        ctx.shard_done(W0, 1, s, 3).unwrap();
        lease(&mut ctx, W1, 1).unwrap();
        let json = serde_json::to_string(&ctx).unwrap();
        let back: JobContext = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ctx);
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::scale::{Capacity, ScalePlan};

    #[derive(Clone, Debug)]
    enum Ev {
        Lease(u32),
        Done(u32),
        /// The training process of worker `i` (or the PS when `i` = 9) exits with this code.
        Exit(u32, i32),
        AgentLost(u32),
        Checkpoint,
        Tick(u64),
    }

    fn ev(workers: u32) -> impl Strategy<Value = Ev> {
        prop_oneof![
            5 => (0..workers).prop_map(Ev::Lease),
            5 => (0..workers).prop_map(Ev::Done),
            1 => (prop_oneof![0..workers, Just(9)], prop_oneof![Just(1), Just(137)]).prop_map(|(i, c)| Ev::Exit(i, c)),
            1 => (0..workers).prop_map(Ev::AgentLost),
            1 => Just(Ev::Checkpoint),
            1 => (0u64..20_000).prop_map(Ev::Tick),
        ]
    }

    fn key(i: u32) -> SlotKey {
        if i == 9 {
            SlotKey {
                role: RoleName::Ps,
                index: 0,
            }
        } else {
            SlotKey {
                role: RoleName::Worker,
                index: i,
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Pe {
        Plan {
            workers: u32,
            ps: u32,
        },
        /// Process `i` (workers 0..6, PS 10..13) registers, joins and leases as it can.
        Act(u32),
        Done(u32),
        Exit(u32),
        Commit,
        ReshardDone,
        Tick,
    }

    fn pkey(i: u32) -> SlotKey {
        if i >= 10 {
            SlotKey {
                role: RoleName::Ps,
                index: i - 10,
            }
        } else {
            SlotKey {
                role: RoleName::Worker,
                index: i,
            }
        }
    }

    fn pe() -> impl Strategy<Value = Pe> {
        prop_oneof![
            1 => (1u32..7, 1u32..4).prop_map(|(workers, ps)| Pe::Plan { workers, ps }),
            8 => prop_oneof![0u32..6, 10u32..13].prop_map(Pe::Act),
            5 => (0u32..6).prop_map(Pe::Done),
            1 => prop_oneof![0u32..6, 10u32..13].prop_map(Pe::Exit),
            2 => Just(Pe::Commit),
            2 => Just(Pe::ReshardDone),
            2 => Just(Pe::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Random scale plans interleaved with work and failures: no sample is lost or counted
        /// twice, plans are reached in version order, live processes never exceed the
        /// platform's capacity, a rejected plan changes nothing, and the context survives a
        /// JSON round trip.
        #[test]
        fn random_plan_sequences_keep_the_invariants(kind in prop_oneof![Just("ps"), Just("allreduce")],
                                                     events in proptest::collection::vec(pe(), 1..160)) {
            let ps_role = if kind == "ps" { "  ps: { replicas: 1, min: 1, max: 3, max_restarts: 50 }\n" } else { "" };
            let spec = JobSpec::from_yaml(&format!(
                "name: p\nkind: {kind}\nroles:\n{ps_role}  worker: {{ replicas: 2, min: 1, max: 6, max_restarts: 50 }}\n\
                 workload:\n  builtin: {{}}\ndata: {{ num_samples: 400, shard_size: 10 }}\nepochs: 2\n\
                 checkpoint: {{ dir: /tmp/brain-prop, every_shards: 5 }}\n"
            )).unwrap();
            let (mut ctx, _) = JobContext::new(spec, "p".into(), Timing::default(), 0);
            let cap = Capacity { max_processes: 7, ..Capacity::default() };
            let mut now = 1;
            let mut version = 0;
            let mut held: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            let mut ckpt = 0;
            for e in events {
                now += 10;
                match e {
                    Pe::Plan { workers, ps } => {
                        version += 1;
                        let mut plan = ScalePlan { version, ..Default::default() };
                        plan.roles.insert(RoleName::Worker, crate::scale::RoleTarget { count: workers, resources: None });
                        if kind == "ps" {
                            plan.roles.insert(RoleName::Ps, crate::scale::RoleTarget { count: ps, resources: None });
                        }
                        let before = ctx.clone();
                        if ctx.apply_plan(plan, &cap, now).is_err() {
                            prop_assert_eq!(&before, &ctx, "a rejected plan changed the job");
                        }
                    }
                    Pe::Act(i) => {
                        let k = pkey(i);
                        let Some(slot) = ctx.slots.get(&k).cloned() else { continue };
                        if slot.phase == SlotPhase::Launching {
                            let _ = ctx.register_agent(k, slot.incarnation, "h".into(), format!("a{k}"), now);
                            let _ = ctx.advance(now);
                        }
                        let inc = ctx.slots[&k].incarnation;
                        let _ = ctx.join_rendezvous(k, inc, now);
                        let _ = ctx.advance(now);
                        if k.role == RoleName::Worker && !held.contains_key(&i) {
                            let layout = ctx.cluster.as_ref().map(|c| c.ps_version);
                            if let Ok((LeaseView { outcome: LeaseOutcome::Granted(s), .. }, _)) = ctx.lease_with(k, inc, layout, now) {
                                held.insert(i, (s.id, inc));
                            }
                        }
                    }
                    Pe::Done(i) => {
                        if let Some((shard, inc)) = held.remove(&i) {
                            let _ = ctx.shard_done(pkey(i), inc, shard, now);
                        }
                    }
                    Pe::Exit(i) => {
                        let k = pkey(i);
                        if let Some(inc) = ctx.slots.get(&k).map(|s| s.incarnation) {
                            let _ = ctx.process_exited(k, inc, 137, 0, None, now);
                        }
                    }
                    Pe::Commit => {
                        if ctx.checkpoint_pending && ctx.ledger.in_flight() == 0 {
                            ckpt += 1;
                            let _ = ctx.checkpoint_committed(ckpt, format!("/tmp/c{ckpt}").into(), 0, ctx.generation, now);
                        }
                    }
                    Pe::ReshardDone => {
                        if let Some(t) = ctx.transition.clone().filter(|t| t.resharding) {
                            let record = ReshardRecord {
                                version: t.plan.version,
                                from_ps: t.from[&RoleName::Ps],
                                to_ps: t.to[&RoleName::Ps],
                                moved_keys: 1,
                                moved_bytes: 16,
                                total_keys: 2,
                                digest_before: 7,
                                digest_after: 7,
                                took_ms: 1,
                            };
                            let _ = ctx.reshard_done(ctx.generation, record, now);
                        }
                    }
                    Pe::Tick => {
                        for k in ctx.slots.keys().copied().collect::<Vec<_>>() {
                            let s = &ctx.slots[&k];
                            let (agent, inc) = (s.agent_id, s.incarnation);
                            let _ = ctx.heartbeat(k, agent, inc, None, 0, now);
                        }
                        let _ = ctx.tick(now);
                    }
                }
                prop_assert!(ctx.ledger.verify_exactly_once(false).is_ok());
                let live = ctx.slots.values().filter(|s| s.phase.is_live()).count();
                prop_assert!(live <= cap.max_processes as usize, "{} live processes", live);
                let reached: Vec<u64> = ctx.transitions.iter().map(|t| t.version).collect();
                prop_assert!(reached.windows(2).all(|w| w[0] < w[1]), "plans reached out of order: {:?}", reached);
                prop_assert!(ctx.plans.reached <= ctx.plans.desired);
                held.retain(|i, (_, inc)| ctx.slots.get(&pkey(*i)).is_some_and(|s| s.incarnation == *inc && s.phase.is_live()));
            }
            let json = serde_json::to_string(&ctx).unwrap();
            let back: JobContext = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back, ctx);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Whatever happens, in whatever order: the ledger never counts a sample twice, only
        /// current incarnations hold shards, incarnations never go back, a failed job stays
        /// failed, and the context survives a JSON round trip.
        #[test]
        fn the_job_state_machine_keeps_its_invariants(kind in prop_oneof![Just("ps"), Just("allreduce")],
                                                      events in proptest::collection::vec(ev(3), 1..120)) {
            let ps = if kind == "ps" { 1 } else { 0 };
            let spec = JobSpec::from_yaml(&format!(
                "name: p\nkind: {kind}\nroles:\n{}  worker: {{ replicas: 3, max_restarts: 6 }}\n\
                 workload:\n  builtin: {{}}\ndata: {{ num_samples: 200, shard_size: 10 }}\nepochs: 2\n\
                 checkpoint: {{ dir: /tmp/brain-prop, every_shards: 4 }}\n",
                if ps == 1 { "  ps: { replicas: 1, max_restarts: 6 }\n" } else { "" }
            )).unwrap();
            let (mut ctx, _) = JobContext::new(spec, "p".into(), Timing::default(), 0);
            let mut now = 1;
            for k in ctx.slots.keys().copied().collect::<Vec<_>>() {
                ctx.register_agent(k, 1, "h".into(), format!("a{k}"), now).unwrap();
            }
            let mut held: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            let mut incarnations: BTreeMap<SlotKey, u64> = ctx.slots.iter().map(|(k, s)| (*k, s.incarnation)).collect();
            let mut ckpt = 0;
            for e in events {
                now += 10;
                let failed_before = matches!(ctx.phase, JobPhase::Failed { .. });
                match e {
                    Ev::Lease(i) => {
                        let inc = ctx.slots[&key(i)].incarnation;
                        let _ = ctx.join_rendezvous(key(i), inc, now);
                        if let Ok(LeaseView { outcome: LeaseOutcome::Granted(s), .. }) = ctx.lease(key(i), inc) {
                            held.insert(i, (s.id, inc));
                        }
                    }
                    Ev::Done(i) => {
                        if let Some((shard, inc)) = held.remove(&i) {
                            let _ = ctx.shard_done(key(i), inc, shard, now);
                        }
                    }
                    Ev::Exit(i, _) if !ctx.slots.contains_key(&key(i)) => {}
                    Ev::Exit(i, code) => {
                        let inc = ctx.slots[&key(i)].incarnation;
                        let _ = ctx.process_exited(key(i), inc, code, 0, None, now);
                    }
                    Ev::AgentLost(i) => {
                        let inc = ctx.slots[&key(i)].incarnation;
                        let _ = ctx.agent_lost(key(i), inc, "test".into(), now);
                        // The platform relaunches it and the new agent registers.
                        let inc = ctx.slots[&key(i)].incarnation;
                        let _ = ctx.register_agent(key(i), inc, "h".into(), format!("a{i}"), now);
                    }
                    Ev::Checkpoint => {
                        if ctx.checkpoint_pending && ctx.ledger.in_flight() == 0 {
                            ckpt += 1;
                            let _ = ctx.checkpoint_committed(ckpt, format!("/tmp/c{ckpt}").into(), 0, ctx.generation, now);
                        }
                    }
                    Ev::Tick(dt) => {
                        now += dt;
                        // Live agents keep heartbeating; only the tick's timing is under test.
                        for k in ctx.slots.keys().copied().collect::<Vec<_>>() {
                            let s = &ctx.slots[&k];
                            let (agent, inc) = (s.agent_id, s.incarnation);
                            let _ = ctx.heartbeat(k, agent, inc, None, 0, now);
                        }
                        let _ = ctx.tick(now);
                    }
                }
                prop_assert!(ctx.ledger.verify_exactly_once(false).is_ok());
                let failed_now = matches!(ctx.phase, JobPhase::Failed { .. });
                prop_assert!(!failed_before || failed_now, "a failed job came back");
                for (k, s) in &ctx.slots {
                    prop_assert!(s.incarnation >= incarnations[k], "{k} went back");
                    incarnations.insert(*k, s.incarnation);
                }
                // Shards the test still thinks it holds under an old incarnation are no longer
                // that holder's: completing them must fail.
                held.retain(|i, (_, inc)| *inc == ctx.slots[&key(*i)].incarnation);
            }
            let json = serde_json::to_string(&ctx).unwrap();
            let back: JobContext = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back, ctx);
        }
    }
}
