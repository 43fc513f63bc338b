//! The job's state and every decision the master takes about it (pure: no I/O, no clock).
//!
//! [`JobContext`] is what is persisted: its role groups ([`Roles`]: the training group's and
//! the others', each with what it should be and its processes' slots), the shard ledger,
//! rendezvous, checkpoints and the event log. Each method takes the time as `now_ms` and returns [`Effect`]s that the async shell
//! ([`crate::master`]) carries out: launch or stop an agent through the platform, save a PS
//! checkpoint, finish the job.
//!
//! Recovery rules:
//! * ps job, a worker fails: only that worker restarts; its leased shard returns to the queue
//!   (the PS apply each batch once, so a shard half-pushed before the crash is not applied twice).
//! * ps job, a PS fails, or allreduce job, a worker fails: the model state is lost or the ring is
//!   broken, so every process restarts from the latest checkpoint and the ledger rolls back to
//!   the data position that checkpoint recorded.
//! * A slot that fails more than its role's `max_restarts` fails the job.
//! * Service and single roles (the spec's roles outside the training group) are role groups
//!   beside the training group's (`services`): a failure restarts the process, its group or the whole job as
//!   the role's failover level says; a plan resizes them at once, touching no other role.
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
//!
//! A plan's acceptance and its transition's start are in `transition`, each step's handler in
//! `advance`, its end (reached, abandoned) in `transition_end`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::ledger::{Holder, LeaseOutcome, LedgerSnapshot, ShardLedger};
use crate::rendezvous::{JoinOutcome, Member, PsCluster, RoundRendezvous};
use crate::scale::{Capacity, PlanBook, ScalePlan};
use crate::spec::{JobKind, JobSpec, Resources, Role};

pub use calls::{CallRates, CallTotals, RoleRate, WINDOW_MS as CALLS_WINDOW_MS};
pub use cancel::Cancelling;
pub use effective::{TrainingTime, WorkLost};
pub use roles::Roles;
pub use services::RoleGroup;
pub use stability::{HangRecord, Stability, Straggler};
pub use vocab::SlotKey;
pub use vocab::report::{JobPhase, ReshardRecord, TransitionRecord};

mod advance;
mod agents;
mod calls;
mod cancel;
mod checkpoint;
#[cfg(test)]
mod command_tests;
#[cfg(test)]
mod cut_memory_tests;
pub mod damaged;
mod data;
mod effective;
pub mod flash;
mod join;
pub mod late;
mod moves;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod ps_flash_tests;
mod reshard;
pub mod role_checkpoint;
pub mod roles;
mod services;
#[cfg(test)]
mod services_tests;
mod stability;
#[cfg(test)]
mod stability_tests;
#[cfg(test)]
mod tests;
mod transition;
mod transition_end;
#[cfg(test)]
mod transition_tests;

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
    /// Restarts of the training process this slot has seen: group restarts (shared by every
    /// member) and its own relaunches (TORCHELASTIC_RESTART_COUNT).
    pub restart_count: u64,
    pub phase: SlotPhase,
    pub agent_id: u64,
    pub last_heartbeat_ms: u64,
    pub service_addr: Option<String>,
    pub host: String,
    /// The GPUs its process is given (CUDA_VISIBLE_DEVICES), empty: none.
    #[serde(default)]
    pub devices: String,
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
    /// allreduce: its moved process has left the old group at the re-formation (told at its
    /// rejoin, as a removed member is): its successor is launched next.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub left_to_move: bool,
    /// The incarnation that last asked to join the rendezvous (a command's TF cluster starts
    /// when every member's current incarnation has).
    #[serde(default)]
    pub joined: u64,
    /// allreduce: the last round this slot was told it is a member of (a plan starts only once
    /// every member of the newest round has heard so: one removed before that would leave the
    /// others waiting for it to form the group).
    #[serde(default)]
    pub told_round: u64,
    /// allreduce: the incarnation and the first round it was told it is a member of, for
    /// telling a round of processes that all start there ([`JoinView::restore_together`]).
    /// State written before this field reads as [`FIRST_ROUND_UNKNOWN`].
    #[serde(default = "first_round_unknown")]
    pub first_round: Option<(u64, u64)>,
    /// Times its process was ended for going over its memory limit, and the highest resident
    /// memory sampled, since its resources last changed (what the brain's `oom_growth` reads).
    #[serde(default)]
    pub oom_kills: u32,
    #[serde(default)]
    pub memory_peak: u64,
    /// A launching agent the platform has placed (its process started): its register
    /// timeout runs from then. Until then it is pending: waiting for room is not a failure,
    /// and the brain is told since when (`last_heartbeat_ms`, the launch).
    #[serde(default = "placed_before_this_field")]
    pub placed: bool,
    /// Why the platform last found no room for it while pending (empty: it did not say, or
    /// it is placed): what the brain shows as the job's waiting reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pending_reason: String,
    /// The incarnation that serves calls from other roles (0: none does), and where.
    #[serde(default)]
    pub serving: u64,
    #[serde(default)]
    pub serve_addr: Option<String>,
    /// Where the serving incarnation's collective store would listen (a further all-reduce
    /// group's process; empty otherwise).
    #[serde(default)]
    pub collective_addr: String,
    /// The incarnation its agent was last launched for (the platform stops the agent of an
    /// earlier launch): an agent of an earlier incarnation is not adopted (0: state written
    /// before this was kept; any is).
    #[serde(default)]
    pub launched: u64,
    /// The node the plan that added it placed it on (the brain's round, as the platform names
    /// nodes), for the launch that plan makes: the platform starts it there while that node
    /// holds it. A relaunch leaves it to the platform. `None`: the platform places it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// State written before slots said whether they were placed: every launch counted as placed.
fn placed_before_this_field() -> bool {
    true
}

/// A slot's first round as state written before slots kept it reads: unknown, so that its
/// process may be one already training (never a round that restores together).
pub const FIRST_ROUND_UNKNOWN: (u64, u64) = (u64::MAX, u64::MAX);

fn first_round_unknown() -> Option<(u64, u64)> {
    Some(FIRST_ROUND_UNKNOWN)
}

impl Slot {
    /// The slot starts over: an agent is to be launched for its next incarnation.
    fn relaunched(&mut self, now_ms: u64) {
        self.incarnation += 1;
        self.launched = self.incarnation;
        self.phase = SlotPhase::Launching;
        self.left_to_move = false;
        self.placed = false;
        self.pending_reason.clear();
        self.agent_id = 0;
        self.process_pid = 0;
        self.sample = None;
        self.node = None;
        // The new agent gets a full timeout to register.
        self.last_heartbeat_ms = now_ms;
    }

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
            devices: String::new(),
            sample: None,
            process_pid: 0,
            resources: None,
            ps_version: 0,
            fresh: false,
            migrate_to: None,
            left_to_move: false,
            oom_kills: 0,
            memory_peak: 0,
            joined: 0,
            told_round: 0,
            first_round: None,
            placed: false,
            pending_reason: String::new(),
            serving: 0,
            serve_addr: None,
            collective_addr: String::new(),
            launched: incarnation,
            node: None,
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
    /// The job's effective training time when it was taken (`effective`).
    #[serde(default)]
    pub training_ms: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    pub global_step: u64,
    pub samples_per_second: f64,
    pub loss: f64,
    pub samples_total: u64,
    pub applied_samples: u64,
    pub applied_index_sum: u64,
    /// Steps since its previous report and the seconds of its own work in them.
    #[serde(default)]
    pub steps: u32,
    #[serde(default)]
    pub compute_seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at_ms: u64,
    pub text: String,
    /// What it is about, for a diagnosis' timeline; most events are plain progress.
    #[serde(default, skip_serializing_if = "EventKind::is_info")]
    pub kind: EventKind,
}

/// What an event of the job is about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Progress: registrations, the first step, the end.
    #[default]
    Info,
    /// A process failed or the job did.
    Fault,
    /// Processes restarted as a group (from a checkpoint).
    Restart,
    /// A scale plan: accepted, its steps, reached, abandoned.
    Plan,
    Checkpoint,
    Straggler,
    Hang,
    /// Where processes may go: cordoned or avoided nodes, placement (the platform's notes).
    Node,
}

impl EventKind {
    pub fn is_info(&self) -> bool {
        *self == EventKind::Info
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Info => "info",
            EventKind::Fault => "fault",
            EventKind::Restart => "restart",
            EventKind::Plan => "plan",
            EventKind::Checkpoint => "checkpoint",
            EventKind::Straggler => "straggler",
            EventKind::Hang => "hang",
            EventKind::Node => "node",
        }
    }
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
    /// Save every PS at `dir` as the checkpoint of `step`; `generation` guards against a
    /// restart in between.
    SavePsCheckpoint {
        id: u64,
        dir: PathBuf,
        ps: Vec<String>,
        step: u64,
        generation: u64,
    },
    /// A flash cut (held as [`flash::HeldCut`]): every PS copies its partition of `step` into
    /// its agent's memory, then [`JobContext::ps_cut_in_memory`]; where one cannot, the cut
    /// goes to disk as [`Effect::SavePsCheckpoint`] of `id` at `dir` would.
    CopyPsCut {
        id: u64,
        dir: PathBuf,
        ps: Vec<String>,
        step: u64,
        generation: u64,
        /// The newest committed step: each PS keeps its copy of it (see `SaveRequest`).
        committed: Option<u64>,
    },
    /// All work is done: collect final statistics, then call [`JobContext::finish`].
    Finish,
    /// New processes of the job go to none of these nodes (a straggler ran there), besides
    /// the nodes the brain cordoned.
    AvoidNodes(Vec<String>),
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
    /// Delete these checkpoints' directories (beyond `checkpoint.keep`) once the context
    /// that no longer lists them is durable.
    RemoveCheckpoints {
        dirs: Vec<PathBuf>,
    },
}

/// Where a transition is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// allreduce, a script that joins the rendezvous itself: the group trains on while the
    /// processes a plan adds start (import their framework) and join; then the cut.
    Launch,
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
            Step::Launch => "launch",
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
    pub from: BTreeMap<Role, u32>,
    pub to: BTreeMap<Role, u32>,
    /// allreduce: the first round number that counts as the re-formed group.
    pub round_after: u64,
    /// A reshard effect is out and has not come back.
    pub resharding: bool,
    /// The role resources in force before the plan, put back if it is abandoned.
    #[serde(default)]
    pub prior_resources: BTreeMap<Role, Resources>,
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
    /// A plan whose consistent cut has not been reached after this long is abandoned: the
    /// job goes on at its old size.
    #[serde(default = "default_cut_timeout")]
    pub cut_timeout_ms: u64,
    /// How long writes of the job's state may fail (retried with backoff meanwhile) before
    /// the job fails with the reason.
    #[serde(default = "default_persist_give_up")]
    pub persist_give_up_ms: u64,
    /// How long a parameter server may take to save its part of a checkpoint to disk: past
    /// it the checkpoint fails with the reason and the job goes on to its next cut.
    #[serde(default = "default_ps_save_timeout")]
    pub ps_save_timeout_ms: u64,
}

fn default_ps_save_timeout() -> u64 {
    300_000
}

fn default_persist_give_up() -> u64 {
    60_000
}

fn default_register_timeout() -> u64 {
    30_000
}

fn default_cut_timeout() -> u64 {
    120_000
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 500,
            heartbeat_timeout_ms: 10_000,
            last_call_ms: 2_000,
            grace_period_ms: 5_000,
            register_timeout_ms: default_register_timeout(),
            cut_timeout_ms: default_cut_timeout(),
            persist_give_up_ms: default_persist_give_up(),
            ps_save_timeout_ms: default_ps_save_timeout(),
        }
    }
}

/// Where a rendezvous round's members resume from ([`JobContext::resume_told`]): `from` is
/// the checkpoint's manifest, None for the start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeTold {
    pub round: u64,
    pub from: Option<PathBuf>,
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
    /// The step of a cut held in memory whose state rank 0 sends this round's ranks as it
    /// forms ([`flash::PeerRound`]).
    pub state_from_rank0: Option<u64>,
    /// Every member of this round is a process that starts in it from the same checkpoint
    /// (none trained in an earlier round): they may share the state as they restore.
    pub restore_together: bool,
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
    /// Every role group by name: the training group's roles (their processes, relaunches and
    /// the resources plans set) and the others' ([`Roles`]).
    pub roles: Roles,
    pub ledger: ShardLedger,
    /// How the processes form a group: rendezvous rounds (allreduce) or a PS cluster.
    pub group: Group,
    /// The committed checkpoints kept (all of them, unless `checkpoint.keep` says fewer).
    pub checkpoints: Vec<CheckpointRecord>,
    /// Committed checkpoints dropped beyond `checkpoint.keep`.
    #[serde(default)]
    pub checkpoints_deleted: usize,
    /// Committed checkpoints a process found damaged, dropped from `checkpoints` ([`damaged`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub damaged_checkpoints: Vec<damaged::DamagedCheckpoint>,
    pub checkpoint_pending: bool,
    /// A ps checkpoint save is under way (the effect was emitted).
    pub checkpoint_saving: bool,
    /// A cancel waiting for its last checkpoint: the job ends cancelled once it commits.
    #[serde(default)]
    pub cancelling: Option<Cancelling>,
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
    /// A process leased a shard: the ledger's verdict on the data means something. A command
    /// that reads its own data never does.
    #[serde(default)]
    pub leased_any: bool,
    /// Stragglers, hangs and the nodes the job avoids (`stability`).
    #[serde(default)]
    pub stability: Stability,
    /// Time spent training, kept and lost (`effective`).
    #[serde(default)]
    pub training_time: TrainingTime,
    /// Flash checkpoint parts written out, per step, until the step is committed ([`flash`]).
    #[serde(default)]
    pub flash: flash::FlashParts,
    /// The checkpoint the members of the latest rendezvous round were told to resume from:
    /// every member of a round is told the same, even where a checkpoint is committed between
    /// their answers. None since the last group restart until a round tells one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_told: Option<ResumeTold>,
    /// Checkpoints (by step) saved by processes the group has since restarted (a save on
    /// SIGTERM, a flash copy written out late), their manifests being written: committed only
    /// if no round since has been told where to resume.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub late_commits: BTreeSet<u64>,
    /// A re-formation to take in workers that joined after their round closed, while no
    /// plan was on its way ([`late`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_reform: Option<late::LateReform>,
    /// Rates of the calls between its roles (`calls`); not persisted.
    #[serde(skip)]
    pub calls: CallRates,
}

/// How a job's processes form a group: an allreduce job's workers meet in rendezvous rounds; a
/// ps job's workers find the parameter servers through the cluster spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    Allreduce(RoundRendezvous),
    Ps(PsCluster),
}

impl Group {
    pub fn rendezvous(&self) -> Option<&RoundRendezvous> {
        match self {
            Group::Allreduce(r) => Some(r),
            Group::Ps(_) => None,
        }
    }

    pub fn rendezvous_mut(&mut self) -> Option<&mut RoundRendezvous> {
        match self {
            Group::Allreduce(r) => Some(r),
            Group::Ps(_) => None,
        }
    }

    pub fn cluster(&self) -> Option<&PsCluster> {
        match self {
            Group::Ps(c) => Some(c),
            Group::Allreduce(_) => None,
        }
    }

    pub fn cluster_mut(&mut self) -> Option<&mut PsCluster> {
        match self {
            Group::Ps(c) => Some(c),
            Group::Allreduce(_) => None,
        }
    }
}

const MAX_EVENTS: usize = 1_000;

impl JobContext {
    /// A fresh job from a validated spec. Returns the agents to launch.
    pub fn new(spec: JobSpec, run_id: String, timing: Timing, now_ms: u64) -> (Self, Vec<Effect>) {
        let mut roles = Roles::default();
        let mut effects = Vec::new();
        let mut group = None;
        for role in spec.roles.keys().copied().filter(|&r| spec.is_training(r)) {
            let plan = spec.role_plan(role).expect("validated spec");
            roles.add(role, true, plan.replicas);
            for index in 0..plan.replicas {
                let key = SlotKey { role, index };
                roles.insert_slot(Slot::new(key, 1, now_ms));
                effects.push(Effect::LaunchAgent {
                    key,
                    incarnation: 1,
                });
            }
            match (spec.kind, role) {
                (JobKind::Allreduce, _) if role == spec.training_role() => {
                    let mut r = RoundRendezvous::new(
                        plan.min,
                        plan.max,
                        plan.node_unit,
                        timing.last_call_ms,
                        plan.replicas,
                    );
                    // A worker on its way gets as long to arrive as it gets to register.
                    r.launch_wait_ms = timing.register_timeout_ms;
                    group = Some(Group::Allreduce(r));
                }
                (JobKind::Ps, Role::PS) => group = Some(Group::Ps(PsCluster::new(plan.replicas))),
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
            roles,
            ledger,
            group: group.expect("a validated spec has workers, and PS for a ps job"),
            checkpoints: Vec::new(),
            checkpoints_deleted: 0,
            damaged_checkpoints: Vec::new(),
            checkpoint_pending: false,
            checkpoint_saving: false,
            cancelling: None,
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
            leased_any: false,
            stability: Stability::default(),
            training_time: TrainingTime::default(),
            flash: flash::FlashParts::default(),
            resume_told: None,
            late_commits: BTreeSet::new(),
            late_reform: None,
            calls: CallRates::default(),
        };
        effects.extend(ctx.start_services(now_ms));
        ctx.log(
            now_ms,
            format!(
                "job {} ({}) started with {} processes",
                ctx.spec.name,
                ctx.spec.kind,
                ctx.roles.slots().count()
            ),
        );
        (ctx, effects)
    }

    /// The latest time this context has recorded (the master's clock, ms since it started the
    /// job): a master that continues the context runs its clock on from here.
    pub fn clock_ms(&self) -> u64 {
        let events = self.events.last().map_or(0, |e| e.at_ms);
        let slots = self
            .roles
            .slots()
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
        let keys: Vec<SlotKey> = self.keys_where(|s| s.phase != SlotPhase::Removed);
        let mut effects: Vec<Effect> = keys
            .into_iter()
            .map(|k| self.launch_slot(k, false, now_ms))
            .collect();
        effects.extend(self.resume_services(now_ms));
        Ok(effects)
    }

    /// Records what happened outside the job's own decisions (the platform's doing: where
    /// processes may go).
    pub fn note(&mut self, at_ms: u64, text: String) {
        self.log_as(EventKind::Node, at_ms, text);
    }

    fn log(&mut self, at_ms: u64, text: String) {
        self.log_as(EventKind::Info, at_ms, text);
    }

    /// What the master says about writing the job's state (failing, or working again).
    pub fn storage(&mut self, at_ms: u64, text: String) {
        self.log_as(EventKind::Fault, at_ms, text);
    }

    fn log_as(&mut self, kind: EventKind, at_ms: u64, text: String) {
        tracing::info!(job = %self.spec.name, kind = kind.as_str(), "{text}");
        self.events.push(Event { at_ms, text, kind });
        if self.events.len() > MAX_EVENTS {
            self.events.drain(..self.events.len() - MAX_EVENTS);
        }
    }

    pub(crate) fn is_builtin(&self) -> bool {
        self.spec.workload.builtin.is_some()
    }

    /// A user command that does not re-form its group in place (the spec's `rescale` is not
    /// `in_place`): a plan restarts the whole group at the new size, as TorchElastic does.
    pub fn restarts_to_rescale(&self) -> bool {
        !self.is_builtin() && self.spec.workload.rescale != Some(crate::spec::Rescale::InPlace)
    }

    /// The role of the training group's processes: `worker`, or the all-reduce group's own
    /// name (`JobSpec::training_role`).
    pub fn trainer(&self) -> Role {
        self.spec.training_role()
    }

    /// A script on the Python SDK joins the rendezvous itself: its agent starts it at once.
    pub fn process_joins(&self) -> bool {
        !self.is_builtin() && !self.restarts_to_rescale()
    }

    /// Whether the ranks of a round formed after a cut held in memory can send its state from
    /// rank 0 over the group (`state_from_rank0`): a script on the SDK, or the built-in
    /// all-reduce workers (over their ring). Elsewhere new processes load the cut from disk.
    pub fn ranks_send_cut(&self) -> bool {
        self.process_joins() || (self.is_builtin() && self.spec.kind == JobKind::Allreduce)
    }

    /// Whether the master saw the job's data (the built-in workload, or a command leasing its
    /// shards through the SDK), so that the exactly-once verdict is about something.
    pub fn data_tracked(&self) -> bool {
        self.is_builtin() || self.leased_any
    }

    /// Time a training process gets between SIGTERM and SIGKILL: the spec's, else the master's.
    pub fn grace_period_ms(&self) -> u64 {
        self.spec
            .workload
            .grace_period_ms
            .map_or(self.timing.grace_period_ms, |g| g.max(0) as u64)
    }

    /// The step of the newest committed checkpoint, if any.
    pub fn committed_step(&self) -> Option<u64> {
        self.checkpoints.last().map(|c| c.step)
    }

    /// [`Self::committed_step`], asked by process `key` (one of this job's).
    pub fn committed_step_for(&self, key: SlotKey) -> Result<Option<u64>, Error> {
        self.slot(key)?;
        Ok(self.committed_step())
    }

    fn slot(&self, key: SlotKey) -> Result<&Slot, Error> {
        self.any_slot(key).ok_or(Error::UnknownProcess {
            role: key.role.to_string(),
            index: key.index,
        })
    }

    /// Keys of the slots that satisfy `pred`, in key order.
    fn keys_where(&self, pred: impl Fn(&Slot) -> bool) -> Vec<SlotKey> {
        self.roles
            .slots()
            .filter(|s| pred(s))
            .map(|s| s.key)
            .collect()
    }

    /// The slot, if `incarnation` is its current one.
    pub fn current(&self, key: SlotKey, incarnation: u64) -> Result<&Slot, Error> {
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

    /// Checkpoints committed so far, kept or deleted since.
    pub fn committed_checkpoints(&self) -> usize {
        self.checkpoints.len() + self.checkpoints_deleted + self.damaged_checkpoints.len()
    }

    /// The node the plan that added `key` placed it on, for its launch ([`Slot::node`]).
    pub fn launch_node(&self, key: SlotKey) -> Option<String> {
        self.any_slot(key).and_then(|s| s.node.clone())
    }

    /// What `key`'s current incarnation is launched with: its own resources (from a plan or a
    /// migration), else its role's in the spec.
    pub fn launch_resources(&self, key: SlotKey) -> Option<Resources> {
        let role = self
            .spec
            .roles
            .get(&key.role)
            .and_then(|r| r.resources.clone());
        match self.any_slot(key).and_then(|s| s.resources.clone()) {
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
}

/// Actions an agent is told to take (mirrors the wire enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentAction {
    Continue,
    Restart,
    Shutdown,
}
