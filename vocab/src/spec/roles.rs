//! Role groups: what each named role of a job is (its topology), what happens when one of its
//! processes fails (its failover level), and what a role outside the training group runs.
//!
//! A job is a set of named role groups. Its **training group** is what `kind` names: `ps` +
//! `worker` (topology `ps`) or one all-reduce group (topology `allreduce`), named freely: the
//! role that says `topology: allreduce` without a program of its own (an `actor`, a
//! `trainer`), else `worker` ([`JobSpec::training_role`]); it runs the job's `workload` and
//! reads its `data`. Any other role runs its own `command`, with its own `env`, resources and
//! bounds, and is started, restarted and resized on its own (growing or shrinking it never
//! touches another role): a **service** (independent replicas: a rollout engine, a reward
//! model), a **single** process (a driver), or a **further all-reduce group** (`topology:
//! allreduce` with a `command`: a critic trained by a collective group of its own, which forms
//! through the SDK's `brain_sdk.roles.collective()` and restarts whole when one of its
//! processes fails or it is resized).
//!
//! `kind: ps` and `kind: allreduce` specs without other roles read exactly as before.

use serde::{Deserialize, Serialize};

use super::{JobSpec, env, limits};
use crate::error::SpecError;
use crate::role::{JobKind, Role};

/// How the processes of one role relate to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// One collective group: the training group of an allreduce job (rendezvous rounds,
    /// consistent cuts), or a further group with a program of its own, outside the training
    /// group, that forms at its size and restarts whole.
    Allreduce,
    /// Parameter servers and the workers that read them (both roles of a ps job).
    Ps,
    /// Independent replicas (rollout engines, reward models): each starts, fails and leaves
    /// on its own; the role grows or shrinks without pausing anyone.
    Service,
    /// Exactly one process (a driver).
    Single,
}

impl Topology {
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Allreduce => "allreduce",
            Topology::Ps => "ps",
            Topology::Service => "service",
            Topology::Single => "single",
        }
    }
}

impl std::str::FromStr for Topology {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allreduce" => Ok(Topology::Allreduce),
            "ps" => Ok(Topology::Ps),
            "service" => Ok(Topology::Service),
            "single" => Ok(Topology::Single),
            other => Err(format!(
                "topology {other:?}: expected allreduce, ps, service or single"
            )),
        }
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What restarts when a process of a role fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failover {
    /// Only the failed process restarts (a rollout engine; a ps job's worker).
    Process,
    /// Its whole role group restarts (an all-reduce group from its latest cut).
    Role,
    /// Every process of the job restarts.
    Job,
}

impl Failover {
    pub fn as_str(self) -> &'static str {
        match self {
            Failover::Process => "process",
            Failover::Role => "role",
            Failover::Job => "job",
        }
    }
}

impl std::fmt::Display for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl JobSpec {
    /// The role whose processes train: a ps job's `worker`s; an allreduce job's all-reduce
    /// group, the role that says `topology: allreduce` and runs the workload (no `command` of
    /// its own), else `worker`. Plans, reports and the brain's rounds size the training group
    /// under this name.
    pub fn training_role(&self) -> Role {
        match self.kind {
            JobKind::Ps => Role::WORKER,
            JobKind::Allreduce => self
                .roles
                .iter()
                .find(|(_, r)| r.topology == Some(Topology::Allreduce) && r.command.is_none())
                .map_or(Role::WORKER, |(&role, _)| role),
        }
    }

    /// The topology of `role`: the spec's, else what the job's kind makes of the training
    /// roles (`worker` and `ps`, or the all-reduce group), else `service`.
    pub fn topology(&self, role: Role) -> Topology {
        if let Some(t) = self.roles.get(&role).and_then(|r| r.topology) {
            return t;
        }
        match (self.kind, role) {
            (JobKind::Ps, Role::PS | Role::WORKER) => Topology::Ps,
            (JobKind::Allreduce, _) if role == self.training_role() => Topology::Allreduce,
            _ => Topology::Service,
        }
    }

    /// Whether `role` belongs to the training group (runs the workload, reads the data): a
    /// further all-reduce group with a program of its own does not.
    pub fn is_training(&self, role: Role) -> bool {
        match self.kind {
            JobKind::Ps => role == Role::PS || role == Role::WORKER,
            JobKind::Allreduce => role == self.training_role(),
        }
    }

    /// The failover level of `role`: the spec's, else the default of its place: a ps job's
    /// worker and a service or single process restart alone; parameter servers and an
    /// all-reduce group restart as a group.
    pub fn failover(&self, role: Role) -> Failover {
        if let Some(f) = self.roles.get(&role).and_then(|r| r.failover) {
            return f;
        }
        match (self.topology(role), role) {
            (Topology::Ps, Role::WORKER) | (Topology::Service | Topology::Single, _) => {
                Failover::Process
            }
            _ => Failover::Role,
        }
    }

    /// Every program the job runs, with its field path: the workload's command and each
    /// service or single role's (what an allow-list and the host check must see).
    pub fn commands(&self) -> Vec<(String, &[String])> {
        let mut out = Vec::new();
        if let Some(c) = &self.workload.command {
            out.push(("workload.command".to_string(), c.as_slice()));
        }
        for (role, r) in &self.roles {
            if let Some(c) = &r.command {
                out.push((format!("roles.{role}.command"), c.as_slice()));
            }
        }
        out
    }

    /// Every extra environment the job sets, with its field path.
    pub fn envs(&self) -> Vec<(String, &std::collections::BTreeMap<String, String>)> {
        let mut out = vec![("workload.env".to_string(), &self.workload.env)];
        for (role, r) in &self.roles {
            if !r.env.is_empty() {
                out.push((format!("roles.{role}.env"), &r.env));
            }
        }
        out
    }

    /// The roles outside the training group, in name order.
    pub fn service_roles(&self) -> impl Iterator<Item = Role> + '_ {
        self.roles.keys().copied().filter(|&r| !self.is_training(r))
    }

    /// Checks each role's topology, failover level and program against the job's kind.
    pub(super) fn validate_roles(&self) -> Result<(), SpecError> {
        if self.roles.len() > limits::MAX_ROLES {
            return Err(SpecError::new(
                "roles",
                format!(
                    "names {} roles, above the limit of {}",
                    self.roles.len(),
                    limits::MAX_ROLES
                ),
            ));
        }
        let trainer = self.training_role();
        // A second training group: an all-reduce group without a program of its own beside
        // the declared one, or beside a `worker` that names no topology (which is the group
        // by default). One with a `command` is a further group of its own.
        let declared = |role: Role| {
            let r = &self.roles[&role];
            r.topology == Some(Topology::Allreduce) && r.command.is_none()
        };
        let default_worker = self
            .roles
            .get(&Role::WORKER)
            .is_some_and(|w| w.topology.is_none());
        if self.kind == JobKind::Allreduce
            && let Some(second) =
                self.roles.keys().copied().find(|&r| {
                    declared(r) && (r != trainer || (default_worker && r != Role::WORKER))
                })
        {
            let group = if second == trainer && default_worker {
                Role::WORKER
            } else {
                trainer
            };
            return Err(SpecError::new(
                format!("roles.{second}.topology"),
                format!(
                    "allreduce: a job has one training group, and {group} is it (a `worker` \
                     role without a topology is the group); give {second} a `command` of its \
                     own to make it a further all-reduce group, make it a service or single \
                     role, or name only one role the training group"
                ),
            ));
        }
        for (&role, r) in &self.roles {
            let p = |field: &str| format!("roles.{role}.{field}");
            let training = self.is_training(role);
            let natural = match self.kind {
                JobKind::Ps if training => Topology::Ps,
                JobKind::Allreduce if training => Topology::Allreduce,
                _ => Topology::Service,
            };
            match r.topology {
                Some(t) if training && t != natural => {
                    return Err(SpecError::new(
                        p("topology"),
                        format!(
                            "{t}: the {role} role of a {} job is the training group's ({natural})",
                            self.kind
                        ),
                    ));
                }
                Some(t @ Topology::Ps) if !training => {
                    return Err(SpecError::new(
                        p("topology"),
                        format!(
                            "{t}: parameter servers need workers that read them; a job's ps \
                             topology is the `ps` and `worker` roles of `kind: ps`"
                        ),
                    ));
                }
                Some(t @ Topology::Allreduce) if !training && r.command.is_none() => {
                    return Err(SpecError::new(
                        p("topology"),
                        format!(
                            "{t}: a ps job's training group is its `ps` and `worker` roles; give \
                             {role} a `command` of its own to make it a further all-reduce \
                             group, make it a service or single role (or the job `kind: \
                             allreduce`)"
                        ),
                    ));
                }
                _ => {}
            }
            let topology = r.topology.unwrap_or(natural);
            self.validate_failover(role, topology, r.failover)?;
            if training {
                let field = if r.command.is_some() {
                    Some("command")
                } else if r.rescale.is_some() {
                    Some("rescale")
                } else {
                    (!r.env.is_empty()).then_some("env")
                };
                if let Some(field) = field {
                    return Err(SpecError::new(
                        p(field),
                        "is for service and single roles: the training roles run the job's \
                         workload (workload.command or workload.builtin, workload.env, \
                         workload.rescale)",
                    ));
                }
                continue;
            }
            match &r.command {
                None => {
                    return Err(SpecError::new(
                        p("command"),
                        format!("is missing: a {topology} role runs its own program (argv)"),
                    ));
                }
                Some(cmd) => check_command(&p("command"), cmd)?,
            }
            check_env(&p("env"), &r.env)?;
            if topology == Topology::Single {
                let plan = self.role_plan(role)?;
                if (plan.replicas, plan.min, plan.max) != (1, 1, 1) {
                    return Err(SpecError::new(
                        p("replicas"),
                        format!(
                            "a single role has exactly one process (replicas {}, min {}, max {})",
                            plan.replicas, plan.min, plan.max
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_failover(
        &self,
        role: Role,
        topology: Topology,
        failover: Option<Failover>,
    ) -> Result<(), SpecError> {
        let Some(f) = failover else { return Ok(()) };
        let refuse = |why: &str| {
            Err(SpecError::new(
                format!("roles.{role}.failover"),
                format!("{f}: {why}"),
            ))
        };
        match (topology, role, f) {
            (Topology::Allreduce, _, Failover::Process) => refuse(
                "one member of an all-reduce group cannot restart alone (the ring breaks); use \
                 role or job",
            ),
            (Topology::Ps, Role::PS, Failover::Process) => refuse(
                "a parameter server holds model state the workers share: its group restarts from \
                 the latest checkpoint; use role or job",
            ),
            (Topology::Ps, Role::WORKER, Failover::Role) => {
                refuse("a ps job's workers restart alone (process) or with the whole job (job)")
            }
            _ => Ok(()),
        }
    }
}

/// A program's argv: not empty, within the limits.
pub(super) fn check_command(path: &str, cmd: &[String]) -> Result<(), SpecError> {
    if cmd.is_empty() {
        return Err(SpecError::new(
            path,
            "is empty: give the program and its arguments",
        ));
    }
    if cmd.len() > limits::MAX_COMMAND_WORDS {
        return Err(SpecError::new(
            path,
            format!(
                "has {} words, above the limit of {}",
                cmd.len(),
                limits::MAX_COMMAND_WORDS
            ),
        ));
    }
    if cmd.iter().any(|w| w.len() > limits::MAX_WORD_BYTES) {
        return Err(SpecError::new(
            path,
            format!("has a word of more than {} bytes", limits::MAX_WORD_BYTES),
        ));
    }
    Ok(())
}

/// Extra environment: within the limits, none of the runtime's own variables.
pub(super) fn check_env(
    path: &str,
    vars: &std::collections::BTreeMap<String, String>,
) -> Result<(), SpecError> {
    if vars.len() > limits::MAX_ENV_VARS {
        return Err(SpecError::new(
            path,
            format!(
                "sets {} variables, above the limit of {}",
                vars.len(),
                limits::MAX_ENV_VARS
            ),
        ));
    }
    for (key, value) in vars {
        if env::runtime_owned(key) {
            return Err(SpecError::new(
                format!("{path}.{key}"),
                "is the runtime's to set (torchrun's variables, TF_CONFIG, the devices a \
                 process was given, BRAIN_*, in any case): a job may not set it",
            ));
        }
        if key.len() > limits::MAX_WORD_BYTES || value.len() > limits::MAX_ENV_VALUE_BYTES {
            return Err(SpecError::new(
                path,
                format!(
                    "a variable's name is above {} bytes or its value above {} bytes",
                    limits::MAX_WORD_BYTES,
                    limits::MAX_ENV_VALUE_BYTES
                ),
            ));
        }
        if key.contains('\0') || value.contains('\0') {
            return Err(SpecError::new(
                format!("{path}.{key}"),
                "holds a NUL byte, which no environment can carry (the process would not \
                 start): remove it",
            ));
        }
    }
    Ok(())
}
