//! Sizing the roles of a running job against each other: after the round has sized the
//! training groups, the CPU and processes it leaves go to the service roles that bound their
//! job, and a role that idles gives some back.
//!
//! What bounds a job is read from the calls between its roles (the job master's rates over the
//! last window): a role whose callers spend at least `grow_wait_share` of their time waiting
//! for it while its processes are busy at least `grow_busy_share` of theirs is the bottleneck
//! (a trainer waiting for rollouts). It grows to `⌈n / (1 − wait)⌉` processes (what would let
//! its callers stop waiting if the rate grew with the count), at least one more, within its
//! `max` and the room left; the roles whose callers wait most go first. A role whose callers
//! wait at most `shrink_wait_share` and whose processes are busy at most `shrink_busy_share`
//! shrinks to what would keep them busy at `grow_busy_share` (at least its `min`); what it
//! gives up is handed out at a later round, once carried out. Each role moves one step a
//! round, in one plan for the job. A job changed less than `cooldown_s` ago, or with a plan
//! on its way, keeps its roles. Roles without rates (no calls in the window) keep their
//! size.
//!
//! A bottleneck the job's own training group waits for ([`Holdup`]) comes before the training
//! groups: the round does not grow that group (more workers would wait as well) and keeps what
//! the role would grow by free before it sizes them. With no room at all, the group gives a
//! node unit of its workers to the role when its wait says that many of them idle anyway
//! (`training_gives`); the role grows into that room once it is free.
//!
//! A queued job the round starts brings its service and single roles with it ([`admit`]):
//! it starts only if they fit, beside its training group, in what the round leaves (jobs in
//! submission order); otherwise its start is withdrawn with the figures and it waits.

use serde::{Deserialize, Serialize};

use super::{Decision, LiveJob, LiveState};
use crate::plan::Role;

mod grow;
pub use grow::Places;
use grow::grow_one;

impl LiveRole {
    /// The GPU model its processes' GPUs are of: its own, else `job`'s (none: any).
    pub fn model<'a>(&'a self, job: &'a LiveJob) -> Option<&'a str> {
        self.gpu_type.as_deref().or(job.workers.gpu_type.as_deref())
    }
}

/// One service role of a running job, as the round sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveRole {
    pub role: Role,
    pub count: u32,
    pub min: u32,
    pub max: u32,
    /// CPU of each of its processes.
    pub millicores: u64,
    /// Memory of each of its processes, bytes (0: none asked).
    #[serde(default)]
    pub memory_bytes: u64,
    /// GPUs of each of its processes on devices of their own (none: it has none, or it shares
    /// the workers' devices), of its GPU model: what a start must find room for too.
    #[serde(default)]
    pub gpus: vocab::Gpus,
    /// The GPU model its processes ask for (`gpu_type` of its resources); none: the job's
    /// ([`LiveRole::model`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Its processes share the training group's devices (a `placement:` group with
    /// `share_devices`): its process `k` runs beside worker `k`, on its node, the two laid out
    /// as one bundle; its GPUs are the worker's ([`super::LiveWorkers::gpus`], the whole bundle).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub beside_workers: bool,
    /// Where its processes run, by index, as the platform names the nodes (empty: not known),
    /// for a role beside the workers (a worker added beside process `k` goes to its node, and
    /// a process `k` added beside worker `k` to the worker's) or in a placement group (a
    /// start's or growth's processes of the group are laid out beside them by its strategy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// How rounds resize it: by its callers' rates (a service role), growing only (a further
    /// all-reduce group, which a resize restarts whole), or never (a `single` role).
    #[serde(default, skip_serializing_if = "RoleSizing::is_rates")]
    pub sizing: RoleSizing,
    /// Its rates over the last window; none: nobody called it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RoleRate>,
}

/// How rounds resize a role ([`LiveRole::sizing`]), by its topology.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleSizing {
    /// Grown where it bounds its job and shrunk where it idles, by its callers' rates, one
    /// step a round (a `service` role: its other processes go on).
    #[default]
    Rates,
    /// Grown where it bounds its job, as a service role is, but never shrunk by the rates (a
    /// further all-reduce group: its processes' own collective work is not in the calls'
    /// rates, and each resize restarts the whole group, which forms again at its new size),
    /// unless `[live.roles] allreduce_groups` is off.
    Grows,
    /// Never resized by the rounds, only counted (a `single` role: one driver).
    Fixed,
}

impl RoleSizing {
    fn is_rates(&self) -> bool {
        *self == RoleSizing::Rates
    }
}

/// A role's rates as its job master measured them over its window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleRate {
    pub served_per_s: f64,
    /// Share of its processes' time spent serving (0 to 1).
    pub busy_share: f64,
    /// Share of its callers' time spent waiting for it (0 to 1).
    pub callers_wait_share: f64,
    /// Share of the job's training group's time spent waiting for it (0 to 1; 0 when the
    /// training group does not call it): whether it is the training that the role holds up.
    #[serde(default)]
    pub training_wait_share: f64,
}

/// `[live.roles]`: when a role counts as the one that bounds its job, or as idle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolesConfig {
    /// Whether rounds resize service roles at all.
    #[serde(default = "default_on")]
    pub enabled: bool,
    /// Whether rounds grow a further all-reduce group that bounds its job (each growth
    /// restarts the group, [`RoleSizing::Grows`]); off: only operators' plans resize it.
    #[serde(default = "default_on")]
    pub allreduce_groups: bool,
    #[serde(default = "default_grow_wait")]
    pub grow_wait_share: f64,
    #[serde(default = "default_grow_busy")]
    pub grow_busy_share: f64,
    #[serde(default = "default_shrink_wait")]
    pub shrink_wait_share: f64,
    #[serde(default = "default_shrink_busy")]
    pub shrink_busy_share: f64,
    /// The longest a running job with a service role that may grow keeps its training group
    /// at its size while its roles' rates cover less than a window (`unmeasured`), from
    /// its start, seconds. Bounds the wait for a job whose roles nobody calls.
    #[serde(default = "default_measure_s")]
    pub measure_s: f64,
}

fn default_on() -> bool {
    true
}
fn default_grow_wait() -> f64 {
    0.25
}
fn default_grow_busy() -> f64 {
    0.6
}
fn default_shrink_wait() -> f64 {
    0.05
}
fn default_shrink_busy() -> f64 {
    0.2
}
fn default_measure_s() -> f64 {
    120.0
}

impl Default for RolesConfig {
    fn default() -> Self {
        RolesConfig {
            enabled: true,
            allreduce_groups: true,
            grow_wait_share: default_grow_wait(),
            grow_busy_share: default_grow_busy(),
            shrink_wait_share: default_shrink_wait(),
            shrink_busy_share: default_shrink_busy(),
            measure_s: default_measure_s(),
        }
    }
}

impl RolesConfig {
    /// Whether rounds may grow `role` (a service role, or a further all-reduce group where
    /// they grow those).
    pub fn grows(&self, role: &LiveRole) -> bool {
        match role.sizing {
            RoleSizing::Rates => true,
            RoleSizing::Grows => self.allreduce_groups,
            RoleSizing::Fixed => false,
        }
    }

    /// Why the shares make no sense; `None` when they do.
    pub fn problem(&self) -> Option<String> {
        let shares = [
            ("grow_wait_share", self.grow_wait_share),
            ("grow_busy_share", self.grow_busy_share),
            ("shrink_wait_share", self.shrink_wait_share),
            ("shrink_busy_share", self.shrink_busy_share),
        ];
        if let Some((name, v)) = shares
            .iter()
            .find(|(_, v)| !v.is_finite() || !(0.0..=1.0).contains(v))
        {
            return Some(format!("live.roles.{name} = {v}: a share from 0 to 1"));
        }
        if !(self.measure_s.is_finite() && (0.0..=86_400.0).contains(&self.measure_s)) {
            return Some(format!(
                "live.roles.measure_s = {}: seconds from 0 to 86400",
                self.measure_s
            ));
        }
        (self.shrink_wait_share >= self.grow_wait_share
            || self.shrink_busy_share >= self.grow_busy_share)
            .then(|| {
                "live.roles: the shrink shares must be below the grow shares, or a role would \
                 grow and shrink on the same figures"
                    .to_string()
            })
    }
}

/// Room: CPU, processes and memory (`u64::MAX`: memory not counted), of the cluster, used,
/// or left.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    pub cpu_millicores: u64,
    pub processes: u32,
    pub memory_bytes: u64,
}

impl Room {
    const NONE: Room = Room {
        cpu_millicores: 0,
        processes: 0,
        memory_bytes: 0,
    };

    /// What this room leaves once `used` is taken.
    pub fn less(self, used: Room) -> Room {
        Room {
            cpu_millicores: self.cpu_millicores.saturating_sub(used.cpu_millicores),
            processes: self.processes.saturating_sub(used.processes),
            memory_bytes: self.memory_bytes.saturating_sub(used.memory_bytes),
        }
    }
}

/// Lets the queued jobs the round starts (`decisions[j].starts()`) start only where their
/// service and single roles fit too, in submission order, within `capacity` less what the
/// round uses (`used`, updated: the roles of a start added, the training group of a withdrawn
/// start taken off; `slot` is the round's slot size). A CPU job's roles with GPUs
/// of their own must fit on the GPUs the round leaves (`gpus_left`, taken from); a GPU job's
/// were placed with its workers by the GPU round.
pub fn admit(
    jobs: &[&LiveJob],
    decisions: &mut [&mut Decision],
    slot: u64,
    capacity: Room,
    used: &mut Room,
    gpus_left: &mut [super::LiveNode],
) {
    let mut order: Vec<usize> = (0..jobs.len())
        .filter(|&j| decisions[j].starts() && !jobs[j].roles.is_empty())
        .collect();
    order.sort_by(|a, b| {
        jobs[*a]
            .submitted_s
            .total_cmp(&jobs[*b].submitted_s)
            .then(jobs[*a].id.cmp(&jobs[*b].id))
    });
    for j in order {
        let (job, d) = (jobs[j], &mut decisions[j]);
        let need_cpu: u64 = job
            .roles
            .iter()
            .map(|r| r.count as u64 * r.millicores)
            .sum();
        let need: u32 = job.roles.iter().map(|r| r.count).sum();
        let need_memory: u64 = job
            .roles
            .iter()
            .map(|r| r.count as u64 * r.memory_bytes)
            .sum();
        let left = capacity.less(*used);
        let names: Vec<String> = job
            .roles
            .iter()
            .map(|r| format!("{} ×{}", r.role, r.count))
            .collect();
        let fits = need_cpu <= left.cpu_millicores
            && need <= left.processes
            && need_memory <= left.memory_bytes;
        let gpus_fit =
            !fits || !job.workers.gpus.is_zero() || super::gpu_place::place_roles(job, gpus_left);
        if fits && gpus_fit {
            used.cpu_millicores += need_cpu;
            used.processes += need;
            used.memory_bytes += need_memory;
            d.reasons.push(format!(
                "its roles {} start with it ({need_cpu} m, {need} processes)",
                names.join(", ")
            ));
            continue;
        }
        let slots_of = |m: u64| m.div_ceil(slot.max(1)).max(1);
        let own = (d.to_ps() as u64 * slots_of(job.ps.millicores)
            + d.to_workers() as u64 * slots_of(job.workers.millicores))
            * slot;
        let own_memory = d.to_ps() as u64 * job.ps.memory_bytes
            + d.to_workers() as u64 * job.workers.memory_bytes;
        used.cpu_millicores = used.cpu_millicores.saturating_sub(own);
        used.processes = used.processes.saturating_sub(d.to_ps() + d.to_workers());
        used.memory_bytes = used.memory_bytes.saturating_sub(own_memory);
        d.reasons.push(if fits {
            format!(
                "waits: its roles' GPUs{} do not fit on the GPUs the round leaves",
                super::gpu_place::roles_with_gpus(job).trim_start_matches(" and its roles'")
            )
        } else {
            let mut said = format!(
                "waits: its roles {} need {need_cpu} m and {need} processes beside its {} \
                 workers; the round leaves {} m and {} processes",
                names.join(", "),
                d.to_workers(),
                left.cpu_millicores,
                left.processes
            );
            if need_memory > left.memory_bytes {
                said.push_str(&format!(
                    "; they ask {} of memory, {} is left",
                    super::hold::memory_shown(need_memory),
                    super::hold::memory_shown(left.memory_bytes)
                ));
            }
            said
        });
        d.set_workers(0);
        d.gpu_placement.clear();
    }
}

/// Resizes the service roles of the running `jobs` (their decisions alongside) within
/// `room` (`slot`: the round's CPU slot) and, where the platform reports nodes, the nodes'
/// `free` room (each new process whole on one node), or has a training group give workers to
/// the role that holds it up; returns what the changes take of `room` (growth; a shrink frees
/// its room only once carried out, at a later round).
pub fn balance(
    jobs: &[&LiveJob],
    decisions: &mut [&mut Decision],
    live: &super::LiveConfig,
    now_s: f64,
    slot: u64,
    mut room: Room,
    mut places: Places,
) -> Room {
    let (config, cooldown_s) = (&live.roles, live.cooldown_s);
    let start = room;
    if !config.enabled {
        return Room::NONE;
    }
    // (job, role, wait): the bottlenecks, those whose callers wait most first.
    let mut grow: Vec<(usize, usize, f64)> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let d = &mut decisions[j];
        let resting = job.state != LiveState::Running
            || job.plan_in_flight
            || d.changes()
            || job.last_change_s.is_some_and(|t| now_s - t < cooldown_s);
        if resting {
            continue;
        }
        for (r, role) in job.roles.iter().enumerate() {
            if !config.grows(role) {
                continue;
            }
            let Some(rate) = role.rate else { continue };
            if rate.callers_wait_share >= config.grow_wait_share
                && rate.busy_share >= config.grow_busy_share
            {
                grow.push((j, r, rate.callers_wait_share));
            } else if rate.callers_wait_share <= config.shrink_wait_share
                && rate.busy_share <= config.shrink_busy_share
                && role.count > role.min
                && role.sizing == RoleSizing::Rates
            {
                shrink(role, &rate, config, d);
            }
        }
    }
    grow.sort_by(|a, b| b.2.total_cmp(&a.2));
    for (j, r, wait) in grow {
        let role = &jobs[j].roles[r];
        let model = role.model(jobs[j]);
        if !grow_one(
            (jobs[j], role),
            model,
            wait,
            &mut room,
            &mut places,
            decisions[j],
        ) {
            training_gives(jobs[j], role, config, slot, decisions[j]);
        }
    }
    start.less(room)
}

/// What a role its callers wait for (`wait` of their time) would grow to with room enough:
/// `⌈n / (1 − wait)⌉` processes, at least one more, at most its max.
fn target(role: &LiveRole, wait: f64) -> u32 {
    ((role.count as f64 / (1.0 - wait).max(0.05)).ceil() as u32)
        .max(role.count + 1)
        .min(role.max)
}

/// A service role that holds up its job's training group: the group spends at least
/// `grow_wait_share` of its time waiting for it while its processes are busy at least
/// `grow_busy_share` of theirs, and it may grow.
#[derive(Clone, Debug, PartialEq)]
pub struct Holdup {
    pub role: Role,
    /// Share of the training group's time spent waiting for it.
    pub training_wait: f64,
    /// Processes it would grow by with room enough, and the CPU of each: what rounds keep
    /// free for it, also while its job rests (a plan on its way, its cool-down), so that room
    /// its own workers gave up for it is not taken by other jobs meanwhile.
    pub more: u32,
    pub millicores: u64,
}

impl Holdup {
    /// What a round keeps free for it before it sizes the training groups.
    pub fn millicores_wanted(&self) -> u64 {
        self.more as u64 * self.millicores
    }

    /// What its job's decision says of it.
    pub fn reason(&self, workers: u32) -> String {
        format!(
            "its workers wait {:.0}% of their time for {}, which holds the job up: they are held \
             at {workers}, and room goes to {} first",
            self.training_wait * 100.0,
            self.role,
            self.role
        )
    }
}

/// The role that holds up running `job`'s training group the most, if one does (see
/// [`Holdup`]). Its training group is then not grown: more workers would wait as well.
pub fn holdup(job: &LiveJob, config: &RolesConfig) -> Option<Holdup> {
    if !config.enabled || job.state != LiveState::Running {
        return None;
    }
    let (role, rate) = job
        .roles
        .iter()
        .filter(|r| config.grows(r) && r.count < r.max)
        .filter_map(|r| r.rate.map(|rate| (r, rate)))
        .filter(|(_, x)| {
            x.training_wait_share >= config.grow_wait_share
                && x.callers_wait_share >= config.grow_wait_share
                && x.busy_share >= config.grow_busy_share
        })
        .max_by(|a, b| a.1.training_wait_share.total_cmp(&b.1.training_wait_share))?;
    Some(Holdup {
        role: role.role,
        training_wait: rate.training_wait_share,
        more: target(role, rate.callers_wait_share) - role.count,
        millicores: role.millicores,
    })
}

/// Whether running `job`'s training group is kept at its size because its roles' rates do not
/// cover its master's window yet: it has a service role that may grow, so its training may
/// turn out to wait for it ([`Holdup`]), and a wait measured over a few seconds (a worker
/// still importing its framework) or not measured at all is no sign that it does not. Within
/// `measure_s` of the job's start only; shrinking is not held.
pub fn unmeasured(job: &LiveJob, config: &RolesConfig) -> bool {
    config.enabled
        && job.state == LiveState::Running
        && job.rates_unmeasured_s > 0.0
        && job.running_s < config.measure_s
        && job.roles.iter().any(|r| config.grows(r) && r.count < r.max)
}

/// What the decision of a job held by [`unmeasured`] says of it.
pub fn unmeasured_reason(job: &LiveJob, workers: u32) -> String {
    format!(
        "the rates of the calls to its roles lack {:.0} s of a window: its workers are held at \
         {workers} until it shows whether they wait for a role",
        job.rates_unmeasured_s
    )
}

/// An idle role down to what would keep its processes busy at `grow_busy_share`, not below
/// its min.
fn shrink(role: &LiveRole, rate: &RoleRate, config: &RolesConfig, d: &mut Decision) {
    let keep = (role.count as f64 * rate.busy_share / config.grow_busy_share).ceil() as u32;
    let to = keep.clamp(role.min.max(1), role.count - 1);
    d.resize(role.role, role.count, to);
    d.reasons.push(format!(
        "{}: {} -> {to}: busy {:.0}% of its time, its callers wait {:.0}% for it ({:.1} calls/s)",
        role.role,
        role.count,
        rate.busy_share * 100.0,
        rate.callers_wait_share * 100.0,
        rate.served_per_s
    ));
}

/// With no room left for a role that holds up its job's training group, the group gives up a
/// node unit of workers for it: when the share of their time they wait says that many of them
/// idle anyway (`wait ≥ unit / workers`), they stay within their min, the round changes
/// nothing else of the job, and what they free takes at least one process of the role. The
/// role grows into that room at a later round, once it is free (kept for it: [`Holdup`]).
/// CPU jobs only (the round does not place roles' GPUs).
fn training_gives(
    job: &LiveJob,
    role: &LiveRole,
    config: &RolesConfig,
    slot: u64,
    d: &mut Decision,
) {
    let Some(rate) = role.rate else { return };
    let (unit, workers) = (job.workers.node_unit.max(1), job.workers.count);
    let wait = rate.training_wait_share;
    let freed = unit as u64 * job.workers.millicores.div_ceil(slot.max(1)) * slot;
    if wait < config.grow_wait_share
        || !job.workers.gpus.is_zero()
        || d.changes()
        || workers < job.workers.min + unit
        || wait < unit as f64 / workers as f64
        || freed < role.millicores
    {
        return;
    }
    d.set_workers(workers - unit);
    d.reasons.push(format!(
        "{unit} of its {workers} workers give their CPU ({freed} m) to {}: they wait {:.0}% of \
         their time for it, as if {:.1} of them idled; it grows into that room once it is free",
        role.role,
        wait * 100.0,
        wait * workers as f64
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::tests::{cluster, config, decision, elastic, job, none, rollout};
    use crate::live::{LiveSnapshot, plan_round};
    use crate::schedule::{Fifo, SchedulerKind};

    /// One round of `snap` under FIFO, the test config and no heuristics.
    fn fifo_round(snap: &LiveSnapshot) -> crate::live::RoundPlan {
        plan_round(
            snap,
            SchedulerKind::Fifo(Fifo::default()).scheduler(),
            &config(),
            &none(),
        )
        .unwrap()
    }

    /// A running job of 2 workers at their max (so the round leaves them), its rollout role
    /// as given, on a cluster of `cpus`.
    fn round_with(role: LiveRole, cpus: u64, last_change_s: f64) -> Decision {
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        j.workers.max = 2;
        j.workers.min = 2;
        j.last_change_s = Some(last_change_s);
        j.roles = vec![role];
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(cpus),
            jobs: vec![j],
        };
        let plan = fifo_round(&snap);
        assert!(plan.cpu_millicores <= cpus * 1000, "{plan:?}");
        decision(&plan, 1).clone()
    }

    #[test]
    fn the_role_its_callers_wait_for_grows_within_its_max_and_the_room() {
        let r: Role = "rollout".parse().unwrap();
        // Callers wait 80%: 1 engine → ⌈1 / 0.2⌉ = 5, at most its max of 4.
        let d = round_with(rollout(1, 0.9, 0.8), 16, 0.0);
        assert_eq!(d.resized_roles(), vec![(r, 1, 4)], "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|x| x.contains("rollout: 1 -> 4: it bounds the job: its callers wait 80%")),
            "{d:?}"
        );
        assert_eq!(d.scale_plan(7, Role::WORKER).count_of(r), Some(4));
        // 2 workers take 2 of 3 cores: room for 2 engines of 0.5 more.
        let d = round_with(rollout(1, 0.9, 0.8), 3, 0.0);
        assert_eq!(d.resized_roles(), vec![(r, 1, 3)], "{d:?}");
        // No room at all: it stays, saying why.
        let d = round_with(rollout(1, 0.9, 0.8), 2, 0.0);
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains("no room left")),
            "{d:?}"
        );
        // Room for 3 more engines by CPU, for one more of 512 MiB by memory (the workers ask
        // none; the engines running are outside the pool, as the brain counts them).
        let mut job = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        (job.workers.max, job.workers.min) = (2, 2);
        let mut engine = rollout(1, 0.9, 0.8);
        engine.memory_bytes = 512 << 20;
        job.roles = vec![engine];
        let snap = |memory_bytes: u64| LiveSnapshot {
            now_s: 100.0,
            cluster: crate::live::LiveCluster {
                memory_bytes,
                ..cluster(16)
            },
            jobs: vec![job.clone()],
        };
        let plan = fifo_round(&snap(700 << 20));
        let d = decision(&plan, 1);
        assert_eq!(d.resized_roles(), vec![(r, 1, 2)], "{d:?}");
        assert_eq!(plan.memory_bytes, 512 << 20);
        let plan = fifo_round(&snap(100 << 20));
        let d = decision(&plan, 1);
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains(
                "no room left for another process of 500 m and 512 MiB of memory (100 MiB left)"
            )),
            "{d:?}"
        );
        // Engines of 1 GPU each: as many more as the GPUs the round leaves hold (those of
        // the running engines are off the nodes already, as the brain counts them).
        let mut engine = rollout(1, 0.9, 0.8);
        engine.gpus = vocab::Gpus::ONE;
        job.roles = vec![engine];
        let snap = |gpus_left: u32| LiveSnapshot {
            now_s: 100.0,
            cluster: crate::live::LiveCluster {
                nodes: vec![crate::live::LiveNode {
                    name: "g".into(),
                    gpus: gpus_left,
                    gpu_type: "A100".into(),
                }],
                ..cluster(16)
            },
            jobs: vec![job.clone()],
        };
        let d = decision(&fifo_round(&snap(2)), 1).clone();
        assert_eq!(d.resized_roles(), vec![(r, 1, 3)], "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|x| x.ends_with("as many as the free GPUs hold")),
            "{d:?}"
        );
        let d = decision(&fifo_round(&snap(0)), 1).clone();
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|x| x.ends_with("no GPUs left for another process of 1 GPUs")),
            "{d:?}"
        );
        // At its max: it stays, saying so.
        let d = round_with(rollout(4, 0.9, 0.8), 16, 0.0);
        assert!(
            d.reasons.iter().any(|x| x.contains("at its max of 4")),
            "{d:?}"
        );
        // Waiting callers but idle engines (the wait is elsewhere): no growth.
        let d = round_with(rollout(1, 0.3, 0.8), 16, 0.0);
        assert!(d.resized_roles().is_empty(), "{d:?}");
        // Within the cool-down: nothing.
        let d = round_with(rollout(1, 0.9, 0.8), 16, 95.0);
        assert!(d.resized_roles().is_empty(), "{d:?}");
    }

    #[test]
    fn an_idle_role_gives_back_what_it_does_not_use_down_to_its_min() {
        let r: Role = "rollout".parse().unwrap();
        // 4 engines busy 10%, nobody waits: ⌈4 × 0.1 / 0.6⌉ = 1.
        let d = round_with(rollout(4, 0.1, 0.0), 16, 0.0);
        assert_eq!(d.resized_roles(), vec![(r, 4, 1)], "{d:?}");
        // Busy enough, or its callers waiting a little: it keeps its size.
        assert!(
            round_with(rollout(4, 0.5, 0.0), 16, 0.0)
                .resized_roles()
                .is_empty()
        );
        assert!(
            round_with(rollout(4, 0.1, 0.1), 16, 0.0)
                .resized_roles()
                .is_empty()
        );
        // No rate (nobody called it in the window): it keeps its size.
        let mut quiet = rollout(4, 0.0, 0.0);
        quiet.rate = None;
        assert!(round_with(quiet, 16, 0.0).resized_roles().is_empty());
    }

    #[test]
    fn a_further_all_reduce_group_grows_where_it_bounds_the_job_and_is_never_shrunk_by_rates() {
        let r: Role = "rollout".parse().unwrap();
        let group = |count, busy, wait| LiveRole {
            sizing: RoleSizing::Grows,
            ..rollout(count, busy, wait)
        };
        // Its callers wait 80%: it grows as a service role would, in one step (each resize
        // restarts it), and the reason says it restarts.
        let d = round_with(group(1, 0.9, 0.8), 16, 0.0);
        assert_eq!(d.resized_roles(), vec![(r, 1, 4)], "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains(
                "rollout: 1 -> 4: it bounds the job: its callers wait 80% of their time for it, \
                 busy 90% (10.0 calls/s) (an all-reduce group: its processes restart to form \
                 it at its new size)"
            )),
            "{d:?}"
        );
        // Idle by its calls (its own collective work is not in them): it keeps its size,
        // where a service role would shrink.
        let d = round_with(group(4, 0.1, 0.0), 16, 0.0);
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert_eq!(
            round_with(rollout(4, 0.1, 0.0), 16, 0.0).resized_roles(),
            vec![(r, 4, 1)]
        );
        // A single role, or a group with `allreduce_groups` off, is never resized.
        let fixed = LiveRole {
            sizing: RoleSizing::Fixed,
            ..rollout(1, 0.9, 0.8)
        };
        assert!(round_with(fixed, 16, 0.0).resized_roles().is_empty());
        let mut c = config();
        c.roles.allreduce_groups = false;
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        (j.workers.min, j.workers.max, j.last_change_s) = (2, 2, Some(0.0));
        j.roles = vec![group(1, 0.9, 0.8)];
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(16),
            jobs: vec![j],
        };
        let fifo = SchedulerKind::Fifo(Fifo::default());
        let plan = plan_round(&snap, fifo.scheduler(), &c, &none()).unwrap();
        assert!(decision(&plan, 1).resized_roles().is_empty(), "{plan:?}");
        // Nor does it hold up the training group then.
        let mut held = group(1, 0.9, 0.8);
        held.rate.as_mut().unwrap().training_wait_share = 0.8;
        let mut j = snap.jobs[0].clone();
        j.roles = vec![held];
        assert!(holdup(&j, &c.roles).is_none());
        assert!(holdup(&j, &RolesConfig::default()).is_some());
    }

    #[test]
    fn a_queued_job_starts_only_where_its_roles_fit_beside_it() {
        // Two queued jobs of 2 workers (1 core each) with 3 engines of 1 core: on 8 cores the
        // first starts with its engines (5 cores), the second's 5 do not fit in the 3 left.
        let queued = |id: u64| {
            let mut j = job(id, LiveState::Queued, 2, &[]);
            j.workers.max = 2;
            j.workers.min = 2;
            let mut r = rollout(3, 0.0, 0.0);
            r.millicores = 1000;
            r.rate = None;
            j.roles = vec![r];
            j
        };
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(8),
            jobs: vec![queued(1), queued(2)],
        };
        let plan = fifo_round(&snap);
        let (a, b) = (decision(&plan, 1), decision(&plan, 2));
        assert_eq!(a.to_workers(), 2, "{a:?}");
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("its roles rollout ×3 start with it")),
            "{a:?}"
        );
        assert_eq!(b.to_workers(), 0, "{b:?}");
        assert!(
            b.reasons.iter().any(|r| r.contains(
                "waits: its roles rollout ×3 need 3000 m and 3 processes beside its 2 workers"
            )),
            "{b:?}"
        );
        // What the round uses: the first job and its engines, nothing of the second.
        assert_eq!(plan.cpu_millicores, 5000, "{plan:?}");
        assert_eq!(plan.processes, 5, "{plan:?}");
    }

    #[test]
    fn a_busy_role_grows_and_an_idle_one_shrinks_in_one_plan() {
        let mut reward = rollout(3, 0.05, 0.0);
        reward.role = "reward".parse().unwrap();
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        (j.workers.min, j.workers.max, j.last_change_s) = (2, 2, Some(0.0));
        j.roles = vec![rollout(1, 0.9, 0.5), reward];
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(16),
            jobs: vec![j],
        };
        let plan = fifo_round(&snap);
        let d = decision(&plan, 1);
        let (ro, re): (Role, Role) = ("rollout".parse().unwrap(), "reward".parse().unwrap());
        assert_eq!(d.resized_roles(), vec![(re, 3, 1), (ro, 1, 2)], "{d:?}");
        let p = d.scale_plan(3, Role::WORKER);
        assert_eq!((p.count_of(ro), p.count_of(re)), (Some(2), Some(1)));
    }

    /// A running job of 2 workers (up to 8) whose workers wait `training_wait` of their time
    /// for its one busy rollout engine (callers wait 80%), beside `others`, on `cpus` cores.
    fn held_round(training_wait: f64, cpus: u64, others: Vec<LiveJob>) -> RoundPlanOf {
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        let mut r = rollout(1, 0.9, 0.8);
        r.rate.as_mut().unwrap().training_wait_share = training_wait;
        j.roles = vec![r];
        let mut jobs = vec![j];
        jobs.extend(others);
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(cpus),
            jobs,
        };
        let plan = plan_round(&snap, elastic().scheduler(), &config(), &none()).unwrap();
        assert!(plan.cpu_millicores <= cpus * 1000, "{plan:?}");
        RoundPlanOf(plan)
    }

    struct RoundPlanOf(crate::live::RoundPlan);

    #[test]
    fn a_role_that_holds_up_the_training_gets_the_room_not_more_workers() {
        let r: Role = "rollout".parse().unwrap();
        // The workers do not call the engine (a driver does): the round grows them as
        // before, into the room, and the engine gets what is left.
        let plan = held_round(0.0, 8, vec![]).0;
        let d = decision(&plan, 1);
        assert!(d.to_workers() > 2, "{d:?}");
        assert!(
            !d.reasons.iter().any(|x| x.contains("holds the job up")),
            "{d:?}"
        );
        // The workers wait 70% of their time for it: more workers would wait as well. They
        // are held at 2 and the engine grows to its max of 4.
        let plan = held_round(0.7, 8, vec![]).0;
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 2, "{d:?}");
        assert_eq!(d.resized_roles(), vec![(r, 1, 4)], "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains(
                "its workers wait 70% of their time for rollout, which holds the job up: they \
                 are held at 2"
            )),
            "{d:?}"
        );
        // A queued job that would take every core: the engine's growth is kept free for it
        // first (3 × 0.5 cores: 2 slots), the queued job starts in the rest.
        let queued = job(2, LiveState::Queued, 8, &[]);
        let plan = held_round(0.7, 8, vec![queued.clone()]).0;
        let (a, b) = (decision(&plan, 1), decision(&plan, 2));
        assert_eq!(a.resized_roles(), vec![(r, 1, 4)], "{a:?}");
        assert_eq!(b.to_workers(), 4, "{b:?}");
        // Without the wait, the workers and the queued job take every core, the engine none.
        let plan = held_round(0.0, 8, vec![queued]).0;
        let (a, b) = (decision(&plan, 1), decision(&plan, 2));
        assert!(a.resized_roles().is_empty(), "{a:?}");
        assert_eq!((a.to_workers(), b.to_workers()), (4, 4), "{a:?} {b:?}");
    }

    /// A running job of 2 workers (at their max) on nodes a and b, whose rollout engines
    /// share the workers' devices (engine 0 beside worker 0 on a) and are waited for; node b
    /// has `b_millicores` free, c 4 CPUs. The decision.
    fn beside_round(b_millicores: u64, known: bool) -> Decision {
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        (j.workers.max, j.workers.min) = (2, 2);
        j.workers.processes = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, n)| crate::heuristics::ProcessRuntime {
                index: i as u32,
                node: if known { n.to_string() } else { String::new() },
                ..Default::default()
            })
            .collect();
        let mut r = rollout(1, 0.9, 0.8);
        r.beside_workers = true;
        r.nodes = vec!["a".into()];
        j.roles = vec![r];
        let room = |name: &str, millicores: u64| crate::live::NodeRoom {
            name: name.into(),
            cpu_millicores: millicores,
            memory_bytes: 0,
            gpus: vocab::Gpus::ZERO,
            devices: Vec::new(),
        };
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: crate::live::LiveCluster {
                free: vec![room("a", 0), room("b", b_millicores), room("c", 4000)],
                ..cluster(16)
            },
            jobs: vec![j],
        };
        decision(&fifo_round(&snap), 1).clone()
    }

    #[test]
    fn a_process_added_beside_a_running_worker_goes_to_its_node() {
        let r: Role = "rollout".parse().unwrap();
        // Engine 1 goes beside worker 1, on b: b's 0.2 CPU does not hold it, and c, which
        // has the room, is not where its worker is.
        let d = beside_round(200, true);
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|x| x.contains("no node has room for another process")),
            "{d:?}"
        );
        // With 0.5 CPU free on b, engine 1 goes there, and engines 2 and 3, with no worker
        // of their index, to c (target ⌈1 / 0.2⌉ = 5, at most its max of 4).
        let d = beside_round(500, true);
        assert_eq!(d.resized_roles(), vec![(r, 1, 4)], "{d:?}");
        // Where the workers' nodes are not known, the engines are placed by their own room.
        let d = beside_round(200, false);
        assert_eq!(d.resized_roles(), vec![(r, 1, 4)], "{d:?}");
    }

    /// A running job of 2 workers (up to 8) on 8 cores, `running_s` in, whose rollout role
    /// (`count`, up to 4) has no rates yet and whose master's rates lack `unmeasured_s` of a
    /// window.
    fn unmeasured_round(count: u32, unmeasured_s: f64, running_s: f64) -> Decision {
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        let mut r = rollout(count, 0.0, 0.0);
        r.rate = None;
        j.roles = vec![r];
        j.rates_unmeasured_s = unmeasured_s;
        j.running_s = running_s;
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(8),
            jobs: vec![j],
        };
        let plan = plan_round(&snap, elastic().scheduler(), &config(), &none()).unwrap();
        decision(&plan, 1).clone()
    }

    #[test]
    fn a_training_group_is_not_grown_before_its_roles_rates_cover_a_window() {
        // 20 s of the window unmeasured, 10 s in: whether the workers wait for the engine
        // is not known, so they stay at 2 though the room would take more.
        let d = unmeasured_round(1, 20.0, 10.0);
        assert_eq!(d.to_workers(), 2, "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains(
                "the rates of the calls to its roles lack 20 s of a window: its workers are \
                 held at 2"
            )),
            "{d:?}"
        );
        // A whole window measured (and nobody waits): they grow into the room.
        let d = unmeasured_round(1, 0.0, 10.0);
        assert!(d.to_workers() > 2, "{d:?}");
        assert!(!d.reasons.iter().any(|x| x.contains("lack")), "{d:?}");
        // Past `measure_s` (nobody calls its roles): no longer held.
        let d = unmeasured_round(1, 20.0, 121.0);
        assert!(d.to_workers() > 2, "{d:?}");
        // A role at its max cannot hold anything up: nothing to wait for.
        let d = unmeasured_round(4, 20.0, 10.0);
        assert!(d.to_workers() > 2, "{d:?}");
        // Roles not resized at all: nor held.
        let off = RolesConfig {
            enabled: false,
            ..RolesConfig::default()
        };
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        j.roles = vec![rollout(1, 0.0, 0.0)];
        j.rates_unmeasured_s = 20.0;
        assert!(!unmeasured(&j, &off));
        assert!(unmeasured(&j, &RolesConfig::default()));
    }

    #[test]
    fn with_no_room_the_waiting_workers_give_one_of_theirs_to_the_role() {
        let r: Role = "rollout".parse().unwrap();
        // 2 workers on 2 cores, waiting 70% of their time for the engine: as if 1.4 of them
        // idled. One gives its core; the engine does not grow in the same round.
        let plan = held_round(0.7, 2, vec![]).0;
        let d = decision(&plan, 1);
        assert_eq!((d.from_workers(), d.to_workers()), (2, 1), "{d:?}");
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains(
                "1 of its 2 workers give their CPU (1000 m) to rollout: they wait 70% of their \
                 time for it, as if 1.4 of them idled"
            )),
            "{d:?}"
        );
        // Once it is free, a later round keeps it for the engine, which grows into it (two
        // processes of 0.5), though a queued job would take every core.
        let mut j = job(1, LiveState::Running, 1, &[(2, 100.0)]);
        let mut role = rollout(1, 0.9, 0.8);
        role.rate.as_mut().unwrap().training_wait_share = 0.7;
        j.roles = vec![role];
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(2),
            jobs: vec![j, job(2, LiveState::Queued, 8, &[])],
        };
        let plan = plan_round(&snap, elastic().scheduler(), &config(), &none()).unwrap();
        let (a, b) = (decision(&plan, 1), decision(&plan, 2));
        assert_eq!(a.resized_roles(), vec![(r, 1, 3)], "{a:?}");
        assert_eq!((a.to_workers(), b.to_workers()), (1, 0), "{a:?} {b:?}");
        // Waiting less than one worker's share (40% of 2), or at their min: nobody gives.
        let d = decision(&held_round(0.4, 2, vec![]).0, 1).clone();
        assert_eq!(d.to_workers(), 2, "{d:?}");
        let d = decision(&held_round_min(0.7, 2, 2).0, 1).clone();
        assert_eq!(d.to_workers(), 2, "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains("no room left")),
            "{d:?}"
        );
    }

    /// [`held_round`] with the workers' min at `min`.
    fn held_round_min(training_wait: f64, cpus: u64, min: u32) -> RoundPlanOf {
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        j.workers.min = min;
        let mut r = rollout(1, 0.9, 0.8);
        r.rate.as_mut().unwrap().training_wait_share = training_wait;
        j.roles = vec![r];
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: cluster(cpus),
            jobs: vec![j],
        };
        RoundPlanOf(plan_round(&snap, elastic().scheduler(), &config(), &none()).unwrap())
    }

    #[test]
    fn a_role_at_its_max_or_idle_holds_nothing_up() {
        let config = RolesConfig::default();
        let mut j = job(1, LiveState::Running, 2, &[(2, 100.0)]);
        let mut r = rollout(4, 0.9, 0.8);
        r.rate.as_mut().unwrap().training_wait_share = 0.8;
        j.roles = vec![r.clone()];
        // At its max: growing it is not possible, so the workers are not held.
        assert_eq!(holdup(&j, &config), None);
        // Idle engines: the wait is elsewhere.
        r.count = 1;
        r.rate.as_mut().unwrap().busy_share = 0.3;
        j.roles = vec![r.clone()];
        assert_eq!(holdup(&j, &config), None);
        // Busy: held, and what it would grow by is kept for it.
        r.rate.as_mut().unwrap().busy_share = 0.9;
        j.roles = vec![r];
        let h = holdup(&j, &config).unwrap();
        assert_eq!((h.more, h.millicores_wanted()), (3, 1500), "{h:?}");
        // Turned off: nothing.
        let off = RolesConfig {
            enabled: false,
            ..RolesConfig::default()
        };
        assert_eq!(holdup(&j, &off), None);
    }

    #[test]
    fn shares_that_make_no_sense_are_refused() {
        let bad = RolesConfig {
            measure_s: f64::NAN,
            ..RolesConfig::default()
        };
        assert!(
            bad.problem()
                .unwrap()
                .contains("live.roles.measure_s = NaN")
        );
        let mut c = RolesConfig::default();
        assert_eq!(c.problem(), None);
        c.grow_wait_share = 1.5;
        assert!(
            c.problem()
                .unwrap()
                .contains("live.roles.grow_wait_share = 1.5")
        );
        let c = RolesConfig {
            shrink_busy_share: 0.7,
            ..RolesConfig::default()
        };
        assert!(c.problem().unwrap().contains("below the grow shares"));
    }
}
