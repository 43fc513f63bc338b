//! A job's shape as the brain keeps it: its role groups by name, each with its size, its
//! bounds and what each of its processes asks for, the training group (the one the brain sizes
//! by its speed) named among them. A role is data here as in the spec: a ps job's `ps`, an
//! all-reduce group called `actor`, a `rollout` service are entries of one map, planned,
//! resized and stored alike (`$.roles."<role>".count` in the stored JSON).
//!
//! Rows written before the shape was kept by role group (worker and PS fields beside a map of
//! the other roles) are rewritten once when the store opens ([`legacy`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vocab::spec::{PlacementGroup, Topology};
use vocab::{Gpus, JobKind, Role};

use super::records::{MAX_MILLICORES, MAX_PROCESSES};

/// What the brain plans with: a job's kind, its role groups and its data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    pub kind: JobKind,
    /// Samples over all epochs.
    pub total_samples: u64,
    /// The role group the brain sizes by its speed: `worker`, or the all-reduce group the
    /// spec names (`actor`). It is one of `roles`.
    pub training: Role,
    /// Every role group of the job by name: the training group, a ps job's `ps`, its service,
    /// single and further all-reduce groups.
    pub roles: BTreeMap<Role, RoleShape>,
    /// Its placement groups (`placement:`), by its roles' names: the round lays out a start's
    /// or a growth's processes of a group by its strategy, as the job master does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<PlacementGroup>,
}

/// One role group of a job as the brain keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleShape {
    pub topology: Topology,
    /// Its processes: for the training group the count it was submitted (or registered) with
    /// (the count in force is the job row's `workers`), for the others the count in force.
    pub count: u32,
    pub min: u32,
    pub max: u32,
    /// The step its count moves by (the training group's `node_unit`; 1 for the others).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub node_unit: u32,
    pub millicores: u64,
    /// Memory per process (0: no limit).
    pub memory_bytes: u64,
    /// GPUs per process (a share of one device, or whole ones).
    pub gpus: Gpus,
    /// The GPU model its processes run on: the one asked for, or (training group) the one a
    /// round started the job on; none: the training group's, or any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// What one device holds per process when other roles share its devices (`placement:`
    /// with `share_devices`): the round places the training group's processes by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_gpus: Option<Gpus>,
    /// Its processes share the training group's devices: its GPUs are counted in theirs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shares_worker_devices: bool,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Default for RoleShape {
    /// A service role of no processes asking for nothing.
    fn default() -> Self {
        RoleShape::empty(Topology::Service)
    }
}

/// What a shape without its training group answers for it (only a shape [`Shape::validate`]
/// refuses can lack one).
static NO_GROUP: RoleShape = RoleShape::empty(Topology::Allreduce);

impl Default for Shape {
    /// An allreduce job of one `worker` of one core (tests start from it).
    fn default() -> Self {
        let worker = RoleShape {
            topology: Topology::Allreduce,
            count: 1,
            min: 1,
            max: 1,
            millicores: 1000,
            ..RoleShape::default()
        };
        Shape {
            kind: JobKind::Allreduce,
            total_samples: 1,
            training: Role::WORKER,
            roles: [(Role::WORKER, worker)].into(),
            placement: Vec::new(),
        }
    }
}

impl RoleShape {
    /// A group of `topology` of no processes asking for nothing.
    pub const fn empty(topology: Topology) -> Self {
        RoleShape {
            topology,
            count: 0,
            min: 0,
            max: 0,
            node_unit: 1,
            millicores: 0,
            memory_bytes: 0,
            gpus: Gpus::ZERO,
            gpu_type: None,
            bundle_gpus: None,
            shares_worker_devices: false,
        }
    }

    /// `count` processes of `topology` within `[min, max]`, each of `millicores`, nothing
    /// else asked for.
    pub fn sized(topology: Topology, count: u32, (min, max): (u32, u32), millicores: u64) -> Self {
        RoleShape {
            topology,
            count,
            min,
            max,
            millicores,
            ..RoleShape::default()
        }
    }

    /// The GPUs one of its processes takes on its device: its bundle's where other roles share
    /// the device, else its own.
    pub fn device_gpus(&self) -> Gpus {
        self.bundle_gpus.unwrap_or(self.gpus)
    }
}

impl Shape {
    /// A job of `kind` over `total_samples` whose training group is `training`, sized by
    /// `group`; its other role groups are added with [`Shape::with`].
    pub fn new(kind: JobKind, training: Role, group: RoleShape, total_samples: u64) -> Shape {
        Shape {
            kind,
            total_samples,
            training,
            roles: [(training, group)].into(),
            placement: Vec::new(),
        }
    }

    /// This shape with role group `role` set to `group`.
    pub fn with(mut self, role: Role, group: RoleShape) -> Shape {
        self.roles.insert(role, group);
        self
    }

    /// The training group (the one the brain sizes by its speed).
    pub fn training_group(&self) -> &RoleShape {
        self.roles.get(&self.training).unwrap_or(&NO_GROUP)
    }

    /// The training group, to change it (a shape that lacks one gets a default to change).
    pub fn training_group_mut(&mut self) -> &mut RoleShape {
        self.roles.entry(self.training).or_default()
    }

    /// A ps job's parameter servers.
    pub fn ps_group(&self) -> Option<&RoleShape> {
        match self.kind {
            JobKind::Ps => self.roles.get(&Role::PS),
            JobKind::Allreduce => None,
        }
    }

    /// Its parameter servers (0: an allreduce job).
    pub fn ps(&self) -> u32 {
        self.ps_group().map_or(0, |p| p.count)
    }

    /// Whether `role` is its training group or a ps job's parameter servers.
    pub fn is_training(&self, role: Role) -> bool {
        role == self.training || (self.kind == JobKind::Ps && role == Role::PS)
    }

    /// Its role groups outside the training group and the PS (service, single and further
    /// all-reduce groups), by name.
    pub fn others(&self) -> impl Iterator<Item = (Role, &RoleShape)> + '_ {
        self.roles
            .iter()
            .filter(|(r, _)| !self.is_training(**r))
            .map(|(r, s)| (*r, s))
    }

    /// The GPU model of its training group (none: any, until it starts).
    pub fn gpu_type(&self) -> Option<&str> {
        self.training_group().gpu_type.as_deref()
    }

    /// The GPU model `group`'s processes run on: its own, else the training group's (none:
    /// any).
    pub fn model_of<'a>(&'a self, group: &'a RoleShape) -> Option<&'a str> {
        group.gpu_type.as_deref().or(self.gpu_type())
    }

    /// Whether the counts `plan` sets for any role fit this job: its training group's and
    /// PS's as [`Shape::check_counts`], the other roles' within their bounds; a role the job
    /// does not have is refused by name.
    pub fn check_plan(&self, plan: &vocab::ScalePlan) -> Result<(), String> {
        for (&role, t) in &plan.roles {
            // A PS asked of an allreduce job is refused by `check_counts`.
            if self.is_training(role) || role == Role::PS {
                continue;
            }
            let Some(s) = self.roles.get(&role) else {
                if role == Role::WORKER {
                    return Err(format!(
                        "the job has no worker role: its training group is {} (`--role {}=N`, \
                         not `--workers`)",
                        self.training, self.training
                    ));
                }
                return Err(format!("the job has no {role} role"));
            };
            if !(s.min..=s.max).contains(&t.count) {
                return Err(format!(
                    "{} {role} is outside the role's bounds [{}, {}]",
                    t.count, s.min, s.max
                ));
            }
        }
        self.check_counts(plan.count_of(self.training), plan.count_of(Role::PS))
    }

    /// Whether an operator's plan to `workers` processes of the training group and `ps`
    /// parameter servers fits this job (its bounds and node unit, its kind); the reason when
    /// not.
    pub fn check_counts(&self, workers: Option<u32>, ps: Option<u32>) -> Result<(), String> {
        let t = self.training_group();
        if let Some(w) = workers {
            if !(t.min..=t.max).contains(&w) {
                return Err(format!(
                    "{w} workers is outside the job's bounds [{}, {}]",
                    t.min, t.max
                ));
            }
            if w % t.node_unit.max(1) != 0 {
                return Err(format!(
                    "{w} workers is not a multiple of the job's node_unit {}",
                    t.node_unit
                ));
            }
        }
        match (ps, self.kind) {
            (Some(_), JobKind::Allreduce) => {
                Err("an allreduce job has no parameter servers to scale".into())
            }
            (Some(0), JobKind::Ps) => Err("a ps job needs at least 1 parameter server".into()),
            (Some(p), JobKind::Ps) => {
                let (lo, hi) = self.ps_bounds();
                if (lo..=hi).contains(&p) {
                    Ok(())
                } else {
                    Err(format!(
                        "{p} parameter servers is outside the job's bounds [{lo}, {hi}]"
                    ))
                }
            }
            _ => Ok(()),
        }
    }

    /// The PS counts the job may have: its spec's `roles.ps` min and max (a bound of 0, as
    /// rows stored before they were kept have, is its count).
    pub fn ps_bounds(&self) -> (u32, u32) {
        let Some(p) = self.ps_group() else {
            return (0, 0);
        };
        let lo = if p.min == 0 { p.count } else { p.min };
        let hi = if p.max == 0 { p.count } else { p.max };
        (lo.min(p.count), hi.max(p.count))
    }

    /// Rejects shapes no job can have, naming the role, the field and its value.
    pub fn validate(&self) -> Result<(), String> {
        if self.roles.len() > vocab::spec::limits::MAX_ROLES + 2 {
            return Err(format!("{} role groups", self.roles.len()));
        }
        let Some(t) = self.roles.get(&self.training) else {
            return Err(format!(
                "no training group: the job has no role {}",
                self.training
            ));
        };
        match (self.kind, t.topology, self.roles.get(&Role::PS)) {
            (JobKind::Ps, _, _) if self.training != Role::WORKER => {
                return Err(format!(
                    "training group {}: a ps job's training group is its `worker` role",
                    self.training
                ));
            }
            (JobKind::Ps, Topology::Ps, Some(p)) if p.topology == Topology::Ps => {
                if p.count == 0 {
                    return Err("a ps job with 0 parameter servers".into());
                }
            }
            (JobKind::Ps, _, _) => {
                return Err("a ps job needs its `ps` and `worker` roles of topology ps".into());
            }
            (JobKind::Allreduce, Topology::Allreduce, _) => {}
            (JobKind::Allreduce, other, _) => {
                return Err(format!(
                    "training group {} of topology {other} in an allreduce job",
                    self.training
                ));
            }
        }
        if let Some((role, _)) = self.others().find(|(_, s)| s.topology == Topology::Ps) {
            return Err(format!(
                "role {role} of topology ps: only a ps job's `ps` and `worker` roles are"
            ));
        }
        if t.min == 0 || t.min > t.max {
            return Err(format!(
                "role {}: min {} and max {}: expected 1 <= min <= max",
                self.training, t.min, t.max
            ));
        }
        if !(t.min..=t.max).contains(&t.count) {
            return Err(format!(
                "role {}: count {} outside [{}, {}]",
                self.training, t.count, t.min, t.max
            ));
        }
        if t.node_unit == 0 {
            return Err(format!("role {}: node_unit 0", self.training));
        }
        for (&role, s) in &self.roles {
            Self::check_role(role, s, self.is_training(role))?;
        }
        if self.total_samples == 0 {
            return Err("total_samples 0".into());
        }
        self.check_placement()
    }

    /// One role group's sizes: within what any job has; the training group's and the PS's
    /// processes ask for some CPU.
    fn check_role(role: Role, s: &RoleShape, training: bool) -> Result<(), String> {
        if s.min > s.max || s.max > MAX_PROCESSES || s.count > MAX_PROCESSES {
            return Err(format!(
                "role {role}: count {}, min {}, max {}",
                s.count, s.min, s.max
            ));
        }
        if training && s.millicores == 0 {
            return Err(format!("role {role}: a process with 0 millicores of CPU"));
        }
        if s.millicores > MAX_MILLICORES {
            return Err(format!("role {role}: millicores {}", s.millicores));
        }
        Ok(())
    }

    /// Whether each placement group names roles of the job, each role in one group at most.
    fn check_placement(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for g in &self.placement {
            if g.roles.is_empty() {
                return Err("a placement group of no roles".into());
            }
            for &role in &g.roles {
                if !self.roles.contains_key(&role) {
                    return Err(format!(
                        "placement group {}: the job has no role {role}",
                        g.name()
                    ));
                }
                if !seen.insert(role) {
                    return Err(format!("role {role} is in two placement groups"));
                }
            }
        }
        Ok(())
    }
}

/// The shape as rows stored it before it was kept by role group, and its rewrite.
pub(super) mod legacy {
    use super::*;

    /// A stored shape of before: the training group's and the PS's fields, the other roles
    /// in a map of their own.
    #[derive(Clone, Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Shape {
        kind: JobKind,
        workers: u32,
        min_workers: u32,
        max_workers: u32,
        node_unit: u32,
        ps: u32,
        #[serde(default)]
        min_ps: u32,
        #[serde(default)]
        max_ps: u32,
        worker_millicores: u64,
        worker_memory_bytes: u64,
        worker_gpus: Gpus,
        #[serde(default)]
        gpu_type: Option<String>,
        ps_millicores: u64,
        ps_memory_bytes: u64,
        total_samples: u64,
        #[serde(default)]
        services: BTreeMap<Role, Service>,
        #[serde(default)]
        worker_bundle_gpus: Option<Gpus>,
        #[serde(default)]
        training_role: Option<Role>,
        #[serde(default)]
        placement: Vec<PlacementGroup>,
    }

    /// A service or single role (or further all-reduce group) as it was kept.
    #[derive(Clone, Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Service {
        topology: Topology,
        count: u32,
        min: u32,
        max: u32,
        millicores: u64,
        memory_bytes: u64,
        gpus: Gpus,
        #[serde(default)]
        gpu_type: Option<String>,
        #[serde(default)]
        shares_worker_devices: bool,
    }

    impl From<Shape> for super::Shape {
        fn from(s: Shape) -> Self {
            let training = s.training_role.unwrap_or(Role::WORKER);
            let topology = match s.kind {
                JobKind::Ps => Topology::Ps,
                JobKind::Allreduce => Topology::Allreduce,
            };
            let mut roles = BTreeMap::new();
            roles.insert(
                training,
                RoleShape {
                    topology,
                    count: s.workers,
                    min: s.min_workers,
                    max: s.max_workers,
                    node_unit: s.node_unit,
                    millicores: s.worker_millicores,
                    memory_bytes: s.worker_memory_bytes,
                    gpus: s.worker_gpus,
                    gpu_type: s.gpu_type,
                    bundle_gpus: s.worker_bundle_gpus,
                    shares_worker_devices: false,
                },
            );
            if s.kind == JobKind::Ps {
                roles.insert(
                    Role::PS,
                    RoleShape {
                        topology: Topology::Ps,
                        count: s.ps,
                        min: s.min_ps,
                        max: s.max_ps,
                        millicores: s.ps_millicores,
                        memory_bytes: s.ps_memory_bytes,
                        ..RoleShape::default()
                    },
                );
            }
            for (role, r) in s.services {
                roles.insert(
                    role,
                    RoleShape {
                        topology: r.topology,
                        count: r.count,
                        min: r.min,
                        max: r.max,
                        millicores: r.millicores,
                        memory_bytes: r.memory_bytes,
                        gpus: r.gpus,
                        gpu_type: r.gpu_type,
                        shares_worker_devices: r.shares_worker_devices,
                        ..RoleShape::default()
                    },
                );
            }
            super::Shape {
                kind: s.kind,
                total_samples: s.total_samples,
                training,
                roles,
                placement: s.placement,
            }
        }
    }

    /// Rewrites every stored shape of before by role group, in the migration's transaction.
    /// A row whose shape reads as neither form stops the migration, naming the job: nothing
    /// is rewritten then.
    pub(in crate::store) fn rewrite(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        let rows: Vec<(i64, String)> = {
            let mut stmt = tx.prepare("SELECT id, shape FROM jobs WHERE shape IS NOT NULL")?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?
        };
        let mut update = tx.prepare("UPDATE jobs SET shape = ?2 WHERE id = ?1")?;
        for (id, text) in rows {
            if serde_json::from_str::<super::Shape>(&text).is_ok() {
                continue;
            }
            let old: Shape = serde_json::from_str(&text).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    0,
                    rusqlite::types::Type::Text,
                    format!("job {id}'s stored shape reads as neither form: {e}").into(),
                )
            })?;
            let new = super::Shape::from(old);
            update.execute(rusqlite::params![
                id,
                serde_json::to_string(&new).expect("plain struct")
            ])?;
        }
        Ok(())
    }
}
