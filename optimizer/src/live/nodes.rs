//! Each node's free CPU, memory and GPUs, where the platform reports them
//! ([`LiveCluster::free`]: a Ray cluster's available resources by node, each node's GPUs of
//! the model [`LiveCluster::nodes`] names). The round counts CPU and memory in one pool and
//! GPUs by model; this gate then lets new processes through only where they fit on the nodes
//! as they are, each process whole on one node with its GPUs, CPU and memory: room the pool
//! counts but that is split across nodes (or a GPU node's GPUs without the CPU beside them)
//! is not handed out. In order:
//!
//! 1. the processes the platform has not placed yet ([`LiveJob::not_placed`]: a start's or a
//!    plan's not launched by their job master yet, or launched and waiting for the platform,
//!    with their GPUs), which it does not count, take their room first ([`reserve_not_placed`],
//!    before the GPU round);
//! 2. the GPU jobs' new processes (`gpu.rs`: a start's PS, workers and roles; a growth's
//!    workers), by the same rule as in 4, on nodes of their model; a start's worker whose
//!    device other roles share with the processes of its index as one bundle
//!    ([`with_partners`]), as the job master lays them out;
//! 3. the room a role that holds up its job's training group would grow by is set aside
//!    ([`roles::Holdup`]), as the pool keeps it;
//! 4. the growth of running CPU jobs (their added workers and PS), then the starts of queued
//!    CPU jobs (PS, workers and their service and single roles, those with GPUs of their own
//!    with them), each in submission order. A job's processes are placed largest first (those
//!    with GPUs first), each on the node with the most CPU left that holds it (the first among
//!    equals; a process without GPUs on a node without GPUs while one holds it): the rule by
//!    which the job master places and pins them on Ray; the processes of a placement group
//!    first, together, by its strategy (`groups.rs`). A job that does
//!    not fit gets fewer workers, by node units, down to its minimum (a start) or its size (a
//!    growth); below that, a start waits and a growth is not made, with the reason;
//! 5. what is set aside in 3 is given back, and the room left ([`Free`]) is what the service
//!    roles grow into (`roles.rs`), those with GPUs too.
//!
//! A node's GPUs are counted device by device where the snapshot gives each device's free
//! share ([`NodeRoom::devices`]), as Ray's raylet hands them out (`room.rs`): a process of
//! whole GPUs takes that many devices with nothing used on them, a share of one device goes to
//! the device it fits best (the least left after it, the first among equals), so 0.3 free on each of two
//! devices holds no 0.5 share and half of each of two holds no whole GPU. Where the snapshot
//! gives only the node's amount, shares add up whichever device they are on (the platform
//! may then find that amount split too finely, and the process waits). A process launched
//! after its job master's last report may be counted twice for a round (room held back, never
//! handed out twice). The job master still places each process and waits for a node that
//! holds it.

use vocab::Gpus;

use super::room::{Process, Room};
use super::*;

mod groups;
mod layout;
pub(super) use groups::Groups;
pub use groups::LiveGroup;
pub(super) use layout::{
    partner_node, roles_of, roles_of_laid, start_nodes, with_partners, with_partners_laid,
    worker_nodes,
};

/// A node's CPU, memory and GPUs free for new processes, as the platform last reported them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRoom {
    /// How the platform names it (a Ray node: its address).
    pub name: String,
    pub cpu_millicores: u64,
    /// Free memory, bytes (read only where the cluster's memory is counted).
    #[serde(default)]
    pub memory_bytes: u64,
    /// Free GPUs (a share of a device counts as its share), of the model
    /// [`LiveCluster::nodes`] names for the node.
    #[serde(default, skip_serializing_if = "no_gpus")]
    pub gpus: vocab::Gpus,
    /// Each of its devices' free share, where it is known (empty: only the amount `gpus`
    /// is): what a whole GPU or a share must find on one device. Where given, the node's
    /// free GPUs are their sum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<vocab::Gpus>,
}

fn no_gpus(g: &Gpus) -> bool {
    g.is_zero()
}

/// Processes of one role of a job that the platform has not placed yet (not launched by its
/// job master, or launched and waiting): the platform does not count their room, so the round
/// takes it off the nodes' free room before it places new ones: on the nodes their plan named
/// for them where it named some (and they fit there), else on the freest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotPlaced {
    pub count: u32,
    /// CPU of each.
    pub millicores: u64,
    /// Memory of each, bytes (0: none asked).
    #[serde(default)]
    pub memory_bytes: u64,
    /// GPUs of each, of the job's GPU model (none: a process without GPUs).
    #[serde(default, skip_serializing_if = "no_gpus")]
    pub gpus: vocab::Gpus,
    /// The node the plan named for some of them (as the platform names nodes), one per
    /// process, at most `count`; the others, and one whose node is gone or full, are held on
    /// the freest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// The nodes' room left as the round places processes on it, in the order of
/// [`LiveCluster::free`].
#[derive(Clone, Debug, PartialEq)]
pub struct Free {
    room: Vec<Room>,
    names: Vec<String>,
    /// The GPU models of the nodes, as [`Model`] numbers them.
    models: Vec<String>,
}

impl Free {
    /// The room `cluster` reports (memory unbounded where the cluster does not count it),
    /// each node's GPUs of the model [`LiveCluster::nodes`] names for it; none when it reports
    /// no nodes.
    pub(super) fn of(cluster: &LiveCluster) -> Option<Free> {
        if cluster.free.is_empty() {
            return None;
        }
        let count_memory = cluster.memory_bytes != 0;
        let mut models: Vec<String> = Vec::new();
        let room = cluster
            .free
            .iter()
            .map(|n| {
                let model = cluster
                    .nodes
                    .iter()
                    .find(|g| g.name == n.name && g.gpus > 0)
                    .map(|g| match models.iter().position(|m| *m == g.gpu_type) {
                        Some(i) => i as u16,
                        None => {
                            models.push(g.gpu_type.clone());
                            (models.len() - 1) as u16
                        }
                    });
                let devices: Vec<u32> = match model {
                    Some(_) => n.devices.iter().map(|d| d.milli().min(1000)).collect(),
                    None => Vec::new(),
                };
                Room {
                    cpu: n.cpu_millicores,
                    memory: match count_memory {
                        true => n.memory_bytes,
                        false => u64::MAX,
                    },
                    gpus: match (model, devices.is_empty()) {
                        (None, _) => 0,
                        (Some(_), true) => n.gpus.milli(),
                        (Some(_), false) => devices.iter().sum(),
                    },
                    model,
                    devices,
                }
            })
            .collect();
        Some(Free {
            room,
            names: cluster.free.iter().map(|n| n.name.clone()).collect(),
            models,
        })
    }

    /// A process of `millicores`, `memory_bytes` and `gpus` of GPU model `model` (none: any).
    pub fn process(
        &self,
        millicores: u64,
        memory_bytes: u64,
        gpus: Gpus,
        model: Option<&str>,
    ) -> Process {
        Process {
            gpus: gpus.milli(),
            cpu: millicores,
            memory: memory_bytes,
            // A model no node has: one no node matches.
            model: model.filter(|_| !gpus.is_zero()).map(|m| {
                self.models
                    .iter()
                    .position(|x| x == m)
                    .map_or(u16::MAX, |i| i as u16)
            }),
        }
    }

    /// Places all of `procs` (see [`placed`]), or none of them (`None`); the node each went
    /// to, in their order.
    /// How the platform names node `i`.
    pub(super) fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The node the platform names `name`, as this room numbers it.
    pub(super) fn node(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Places each of `pinned` on its node and all of `rest` (see [`placed`]), or none of
    /// them (`None`); the node each of `rest` went to, in their order.
    /// Takes the room of `pinned` (each on its node) and of `rest` ([`groups::placed`], the
    /// processes of a placement group together by its strategy); the node each of `rest` went
    /// to. `Err`: the group of `groups` that could not be laid out (`None`: another process
    /// found no node); nothing is taken then.
    pub(super) fn take_pinned(
        &mut self,
        pinned: Vec<(Process, usize)>,
        rest: Vec<Process>,
        groups: &Groups,
    ) -> Result<Vec<usize>, Option<usize>> {
        let mut left = self.room.clone();
        for (p, i) in pinned {
            if !p.fits_in(&left[i]) {
                return Err(None);
            }
            p.take_from(&mut left[i]);
        }
        let (left, went) = groups::placed(left, &rest, groups)?;
        self.room = left;
        Ok(went)
    }

    /// How many nodes it counts.
    pub(super) fn node_count(&self) -> usize {
        self.room.len()
    }

    /// Places processes of `p` one at a time, in order, each on the node `on(k)` names for
    /// the `k`-th where it names one, else on the freest (see [`freest`]), up to `n` and up
    /// to the first that does not fit; the nodes they went to (one entry per process placed).
    fn take_on(&mut self, n: u32, p: Process, on: impl Fn(u32) -> Option<usize>) -> Vec<usize> {
        let mut went = Vec::new();
        for k in 0..n {
            let at = match on(k) {
                Some(i) => Some(i).filter(|&i| p.fits_in(&self.room[i])),
                None => freest(&self.room, p),
            };
            let Some(i) = at else {
                break;
            };
            p.take_from(&mut self.room[i]);
            went.push(i);
        }
        went
    }

    /// [`Free::take_on`], the nodes by name.
    pub(super) fn take_in_order(
        &mut self,
        n: u32,
        p: Process,
        on: impl Fn(u32) -> Option<usize>,
    ) -> Vec<String> {
        let went = self.take_on(n, p, on);
        self.names_of(&went)
    }

    /// How the platform names nodes `on`.
    pub(super) fn names_of(&self, on: &[usize]) -> Vec<String> {
        on.iter().map(|&i| self.names[i].clone()).collect()
    }

    /// Places up to `n` processes of `p`, each on the freest node; the nodes they went to.
    fn take_each(&mut self, n: u32, p: Process) -> Vec<usize> {
        self.take_on(n, p, |_| None)
    }

    /// How many of `n` processes `p` fit, taken from the room.
    pub fn take_up_to(&mut self, n: u32, p: Process) -> u32 {
        self.take_each(n, p).len() as u32
    }

    /// How many of `n` processes `p` fit, taken from the room: one on each node `named`
    /// (by name) where it fits there, the others on the freest (unlike [`Free::take_on`], a
    /// process that does not fit on its node looks for room on the others).
    fn take_named_up_to(&mut self, n: u32, p: Process, named: &[String]) -> u32 {
        let mut held = 0;
        for name in named.iter().take(n as usize) {
            let at = self
                .node(name)
                .filter(|&i| p.fits_in(&self.room[i]))
                .or_else(|| freest(&self.room, p));
            if let Some(i) = at {
                p.take_from(&mut self.room[i]);
                held += 1;
            }
        }
        held + self.take_up_to(n.saturating_sub(named.len() as u32), p)
    }

    /// Gives back what [`Free::take_each`] took for processes of `p` on the nodes `on`.
    fn give_back(&mut self, on: &[usize], p: Process) {
        for &i in on {
            p.give_to(&mut self.room[i]);
        }
    }

    /// `V100 GPUs `; `GPUs ` for GPUs of no declared model.
    fn model_shown(&self, m: u16) -> String {
        match self.models.get(m as usize).map(String::as_str) {
            Some(ANY_MODEL) | None => "GPUs ".into(),
            Some(model) => format!("{model} GPUs "),
        }
    }

    /// The freest nodes' room, as the reasons name it: `10.0.0.2 1.5 CPU free, 10.0.0.3 1
    /// CPU, 2 V100 GPUs free` (three at most).
    pub(super) fn freest_shown(&self) -> String {
        // The three with the most CPU free (the first by name among equals), in one pass: a
        // round of thousands of jobs on a thousand nodes names them in many reasons.
        use std::cmp::Reverse;
        let mut top: Vec<(&Room, &str)> = Vec::with_capacity(4);
        for x in self.room.iter().zip(self.names.iter().map(String::as_str)) {
            let at = top.partition_point(|y| (Reverse(y.0.cpu), y.1) <= (Reverse(x.0.cpu), x.1));
            if at < 3 {
                top.insert(at, x);
                top.truncate(3);
            }
        }
        let shown: Vec<String> = top
            .iter()
            .map(|(r, n)| match r.model {
                Some(m) => format!(
                    "{n} {} CPU, {} {}free{}",
                    millicores_shown(r.cpu),
                    Gpus::from_milli(r.gpus),
                    self.model_shown(m),
                    r.devices_shown()
                        .map_or(String::new(), |d| format!(" ({d} by device)"))
                ),
                None => format!("{n} {} CPU free", millicores_shown(r.cpu)),
            })
            .collect();
        let more = self.room.len().saturating_sub(3);
        match more {
            0 => shown.join(", "),
            _ => format!("{} and {more} more", shown.join(", ")),
        }
    }
}

/// Takes the room of the processes the platform has not placed yet off `free`; one that fits
/// on no node is left out (the platform may count it already: a report older than its
/// launch).
pub(super) fn reserve_not_placed(free: &mut Free, jobs: &[LiveJob], notes: &mut Vec<String>) {
    let (mut held, mut wanted) = (0, 0);
    for j in jobs {
        for u in &j.not_placed {
            wanted += u.count;
            let p = free.process(
                u.millicores,
                u.memory_bytes,
                u.gpus,
                j.workers.gpu_type.as_deref(),
            );
            held += free.take_named_up_to(u.count, p, &u.nodes);
        }
    }
    if wanted > 0 {
        notes.push(format!(
            "nodes: room held for {held} of {wanted} processes not placed yet (planned, or \
             waiting for the platform){}",
            match held < wanted {
                true => "; the rest fit on no node, and are taken as counted already",
                false => "",
            }
        ));
    }
}

/// Lets the CPU jobs' new processes (`jobs`, sized by the round) through only where they fit
/// on the nodes' `free` room (after the processes not placed yet and the GPU jobs' new ones),
/// after what the holdups keep (see the module's documentation); the room left, for the
/// service roles. Nothing changes, and none is returned, when the cluster reports no nodes.
pub(super) fn gate(
    jobs: &mut [Sized],
    snapshot: &LiveSnapshot,
    holdups: &BTreeMap<usize, roles::Holdup>,
    free: Option<Free>,
) -> Option<Free> {
    let mut free = free?;
    // Set aside for the roles that hold up their jobs, given back below for them to grow.
    let kept: Vec<(Vec<usize>, Process)> = holdups
        .iter()
        .map(|(&at, h)| {
            let memory = snapshot.jobs[at]
                .roles
                .iter()
                .find(|r| r.role == h.role)
                .map_or(0, |r| r.memory_bytes);
            let p = free.process(h.millicores, memory, Gpus::ZERO, None);
            (free.take_each(h.more, p), p)
        })
        .collect();
    let mut order: Vec<usize> = (0..jobs.len()).filter(|&i| adds(&jobs[i]) > 0).collect();
    sort_for_placing(&mut order, |i| jobs[i].job);
    for i in order {
        gate_one(&mut jobs[i], &mut free);
    }
    for (on, p) in &kept {
        free.give_back(on, *p);
    }
    Some(free)
}

/// Sorts `order` (jobs by index, `job(i)` each) as their new processes are placed: the
/// growth of running jobs first, then the starts, each in submission order.
pub(super) fn sort_for_placing<'a>(order: &mut [usize], job: impl Fn(usize) -> &'a LiveJob) {
    order.sort_by(|&a, &b| {
        let (x, y) = (job(a), job(b));
        (x.state == LiveState::Queued)
            .cmp(&(y.state == LiveState::Queued))
            .then(x.submitted_s.total_cmp(&y.submitted_s))
            .then(x.id.cmp(&y.id))
    });
}

/// The workers a job adds in this round (a start: all of them).
fn adds(s: &Sized) -> u32 {
    match s.job.state {
        LiveState::Queued => s.to,
        LiveState::Running => s.to.saturating_sub(s.counted(s.job.workers.count)),
    }
}

/// Places `s`'s new processes on `free` at the most workers that fit (see [`gate`]).
fn gate_one(s: &mut Sized, free: &mut Free) {
    let job = s.job;
    let start = job.state == LiveState::Queued;
    let (base, lowest) = match start {
        true => (0, job.workers.min.max(1)),
        false => {
            let base = s.counted(job.workers.count);
            (base, base + 1)
        }
    };
    let new_ps = if start {
        s.ps
    } else {
        s.ps.saturating_sub(job.ps.count)
    };
    // A start brings its roles' processes.
    let roles = match start {
        true => roles_of(job, job.workers.gpu_type.as_deref(), free),
        false => Vec::new(),
    };
    let ps = free.process(job.ps.millicores, job.ps.memory_bytes, Gpus::ZERO, None);
    let worker = free.process(
        job.workers.millicores,
        job.workers.memory_bytes,
        Gpus::ZERO,
        None,
    );
    let unit = job.workers.node_unit.max(1);
    let wanted = s.to;
    let mut w = wanted;
    let mut unfit = None;
    while w >= lowest {
        let mut procs = vec![ps; new_ps as usize];
        procs.extend(std::iter::repeat_n(worker, (w - base) as usize));
        procs.extend_from_slice(&roles);
        let mut laid = vec![vec![Role::PS]; new_ps as usize];
        laid.extend(std::iter::repeat_n(vec![Role::WORKER], (w - base) as usize));
        if start {
            laid.extend(roles_of_laid(job));
        }
        let groups = Groups::of_job(job, &laid, free);
        match free.take_pinned(Vec::new(), procs, &groups) {
            Ok(went) => {
                // A start's job master is told where they went, a growth's plan names them;
                // not where the workers it counts are more than it has (a shrink not carried
                // out yet), whose new indexes are not these.
                if start {
                    s.nodes = start_nodes(&laid, &went, free);
                } else if base == job.workers.count {
                    let (ps_on, workers_on) = went.split_at(new_ps as usize);
                    for (role, on) in [(Role::PS, ps_on), (Role::WORKER, workers_on)] {
                        if !on.is_empty() {
                            s.nodes.insert(role, free.names_of(on));
                        }
                    }
                }
                if w < wanted {
                    s.to = w;
                    s.reasons.push(format!(
                        "{w} workers, not {wanted}: no more fit on the nodes' free room ({})",
                        free.freest_shown()
                    ));
                }
                return;
            }
            Err(g) => unfit = g.map(|g| &job.groups[g]),
        }
        if w < unit {
            break;
        }
        w -= unit;
    }
    not_gated(s, (start, lowest), unfit, (&worker, roles.len()), free);
}

/// The reason `s` waits (a start) or keeps its workers (a growth): no node has room for its
/// processes (`lowest` workers of `worker`, with `roles` processes of its roles for a start),
/// or the nodes cannot hold its placement group `unfit` so.
fn not_gated(
    s: &mut Sized,
    (start, lowest): (bool, u32),
    unfit: Option<&LiveGroup>,
    (worker, roles): (&Process, usize),
    free: &Free,
) {
    let job = s.job;
    let what = format!(
        "{} of {}{}",
        if start {
            "its processes"
        } else {
            "another worker"
        },
        shown(worker, free),
        match roles {
            0 => String::new(),
            n => format!(" with its roles' {n}"),
        }
    );
    let why = match unfit {
        Some(g) => group_unfit(&g.shown(), &free.freest_shown()),
        None => format!("no node has room for {what} ({})", free.freest_shown()),
    };
    if start {
        s.to = 0;
        s.reasons.push(match unfit {
            Some(_) => format!("waits at its minimum of {lowest} workers: {why}"),
            None => format!(
                "waits: no node has room for {what} at its minimum of {lowest} workers ({})",
                free.freest_shown()
            ),
        });
    } else {
        s.to = job.workers.count;
        // No change of workers is made: none is recorded for the heuristics' cool-downs.
        s.corrections
            .retain(|c| c.kind != crate::heuristics::ChangeKind::Workers);
        s.reasons
            .push(format!("kept at {} workers: {why}", job.workers.count));
    }
}

/// Why a start waits or a growth is not made when the nodes' free room (`room`, as
/// [`Free::freest_shown`] shows it) cannot lay its placement group (`group`, as
/// [`LiveGroup::shown`] names it) out by its strategy.
pub(super) fn group_unfit(group: &str, room: &str) -> String {
    format!("the nodes' free room cannot hold its placement group {group} so ({room})")
}

/// What a process asks, as the reasons name it: `1 GPU and 3 CPU and 512 MiB`, `2 CPU`.
pub(super) fn shown(p: &Process, free: &Free) -> String {
    let mut s = String::new();
    if p.gpus > 0 {
        let model = p.model.map_or("GPUs ".into(), |m| free.model_shown(m));
        s = format!("{} {model}and ", Gpus::from_milli(p.gpus));
    }
    s += &format!("{} CPU", millicores_shown(p.cpu));
    if p.memory > 0 {
        s += &format!(" and {}", hold::memory_shown(p.memory));
    }
    s
}

/// The node of `room` that `p` goes to: of those that hold it (for a process without GPUs,
/// those without GPUs first: the GPU nodes' CPU is kept for the processes with GPUs), the
/// one with the most CPU left, the first among equals. The job master's Ray platform places
/// each process by the same rule (and pins it there), so what the round counts is where the
/// processes go.
fn freest(room: &[Room], p: Process) -> Option<usize> {
    let spares_gpus = |r: &Room| p.gpus > 0 || r.model.is_none();
    room.iter()
        .enumerate()
        .filter(|(_, r)| p.fits_in(r))
        .map(|(i, r)| (i, (spares_gpus(r), r.cpu)))
        .reduce(|best, x| if x.1 > best.1 { x } else { best })
        .map(|(i, _)| i)
}

/// Millicores as CPUs: `1.5`, `2`.
fn millicores_shown(m: u64) -> String {
    match m % 1000 {
        0 => format!("{}", m / 1000),
        _ => format!("{}", m as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::job;
    use super::*;
    use crate::live::room::Model;
    use crate::schedule::Fifo;

    fn node(name: &str, cpus: u64) -> NodeRoom {
        NodeRoom {
            name: name.into(),
            cpu_millicores: cpus * 1000,
            memory_bytes: 0,
            gpus: Gpus::ZERO,
            devices: Vec::new(),
        }
    }

    /// Nodes' room of the CPU, memory and GPUs of `ps`, their devices not known.
    fn rooms(ps: &[Process]) -> Vec<Room> {
        ps.iter()
            .map(|p| Room {
                cpu: p.cpu,
                memory: p.memory,
                gpus: p.gpus,
                model: p.model,
                devices: Vec::new(),
            })
            .collect()
    }

    fn cpu_job(id: u64, state: LiveState, workers: u32, cpu: u64) -> LiveJob {
        let mut job = job(id, state, workers, &[(1, 10.0), (2, 19.0), (4, 36.0)]);
        job.workers.millicores = cpu * 1000;
        job.workers.min = workers;
        job.workers.max = workers;
        job
    }

    /// A pool of `cpus` whose nodes have `free` room.
    fn round_cluster(free: Vec<NodeRoom>, cpus: u64) -> LiveCluster {
        LiveCluster {
            cpu_millicores: cpus * 1000,
            slot_millicores: 1000,
            max_processes: 100,
            memory_bytes: 0,
            nodes: Vec::new(),
            free,
        }
    }

    fn round(jobs: Vec<LiveJob>, free: Vec<NodeRoom>, cpus: u64) -> RoundPlan {
        fifo_round(&LiveSnapshot {
            now_s: 100.0,
            cluster: round_cluster(free, cpus),
            jobs,
        })
    }

    /// A round of `snapshot` under FIFO, the default config and heuristics.
    fn fifo_round(snapshot: &LiveSnapshot) -> RoundPlan {
        plan_round(
            snapshot,
            &Fifo::default(),
            &LiveConfig::default(),
            &Heuristics::default(),
        )
        .unwrap()
    }

    /// A round of `snapshot` under FIFO, the tests' config and no heuristics.
    fn bare_round(snapshot: &LiveSnapshot) -> RoundPlan {
        plan_round(
            snapshot,
            &Fifo::default(),
            &super::super::tests::config(),
            &super::super::tests::none(),
        )
        .unwrap()
    }

    #[test]
    fn a_start_whose_processes_fit_the_pool_but_no_node_waits_with_the_nodes_room() {
        // Two nodes of 4 CPUs: one job of two 3-CPU workers fits, one per node; a second of
        // one 2-CPU worker fits the pool (2 CPUs left) but neither node (1 CPU each).
        let nodes = vec![node("10.0.0.2", 4), node("10.0.0.3", 4)];
        let jobs = vec![
            cpu_job(1, LiveState::Queued, 2, 3),
            cpu_job(2, LiveState::Queued, 1, 2),
        ];
        let plan = round(jobs.clone(), nodes.clone(), 8);
        assert_eq!(plan.decisions[0].to_workers(), 2, "{:?}", plan.decisions[0]);
        let second = &plan.decisions[1];
        assert_eq!(second.to_workers(), 0, "{second:?}");
        let why = second.reasons.last().unwrap();
        assert!(
            why.contains("no node has room for its processes of 2 CPU")
                && why.contains("10.0.0.2 1 CPU free, 10.0.0.3 1 CPU free"),
            "{why}"
        );
        // The same pool in one node: both start (what the round did before for every cluster,
        // and still does when the platform reports no nodes).
        let plan = round(jobs.clone(), vec![node("big", 8)], 8);
        assert_eq!(plan.decisions[1].to_workers(), 1);
        let plan = round(jobs, Vec::new(), 8);
        assert_eq!(plan.decisions[1].to_workers(), 1);
    }

    #[test]
    fn a_growth_is_cut_to_what_the_nodes_hold_and_goes_before_starts() {
        // A running job of 2 workers (2 CPUs each) grows to 4; the nodes have 3 and 1 CPUs
        // free besides it: one more worker fits, not two. The queued job behind it (one
        // 2-CPU worker, which the pool of 10 holds) then waits.
        let mut running = cpu_job(1, LiveState::Running, 2, 2);
        running.workers.min = 1;
        running.workers.max = 4;
        let queued = cpu_job(2, LiveState::Queued, 1, 2);
        let snapshot = LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                cpu_millicores: 10_000,
                slot_millicores: 1000,
                max_processes: 100,
                memory_bytes: 0,
                nodes: Vec::new(),
                free: vec![node("a", 3), node("b", 1)],
            },
            jobs: vec![running, queued],
        };
        let scheduler = super::super::tests::elastic();
        let run = |s: &LiveSnapshot| {
            let heuristics = super::super::tests::none();
            plan_round(s, &scheduler, &super::super::tests::config(), &heuristics).unwrap()
        };
        let mut pooled = snapshot.clone();
        pooled.cluster.free.clear();
        let before = run(&pooled);
        assert_eq!(
            (
                before.decisions[0].to_workers(),
                before.decisions[1].to_workers()
            ),
            (4, 1),
            "the pool alone: {before:?}"
        );
        let plan = run(&snapshot);
        let grown = &plan.decisions[0];
        assert_eq!(
            (grown.from_workers(), grown.to_workers()),
            (2, 3),
            "{grown:?}"
        );
        assert!(
            grown
                .reasons
                .iter()
                .any(|r| r.starts_with("3 workers, not 4: no more fit on the nodes' free room")),
            "{:?}",
            grown.reasons
        );
        assert_eq!(plan.decisions[1].to_workers(), 0, "{:?}", plan.decisions[1]);
        // No node with 2 CPUs free: it keeps its size.
        let mut full = snapshot.clone();
        full.cluster.free = vec![node("a", 1), node("b", 1)];
        let plan = run(&full);
        let kept = &plan.decisions[0];
        assert_eq!(kept.to_workers(), 2, "{kept:?}");
        let why = kept.reasons.last().unwrap();
        assert!(
            why.starts_with("kept at 2 workers: no node has room for another worker of 2 CPU"),
            "{why}"
        );
        assert!(kept.corrections.is_empty(), "{kept:?}");
        // The speed-up heuristic's growth the nodes cannot hold leaves no change behind
        // either (it would hold the next try back by its cool-down).
        let plan = plan_round(
            &full,
            &scheduler,
            &super::super::tests::config(),
            &Heuristics::default(),
        )
        .unwrap();
        assert_eq!(plan.decisions[0].to_workers(), 2, "{:?}", plan.decisions[0]);
        assert!(
            !plan.decisions[0]
                .corrections
                .iter()
                .any(|c| c.kind == crate::heuristics::ChangeKind::Workers),
            "{:?}",
            plan.decisions[0]
        );
    }

    #[test]
    fn memory_is_placed_with_the_cpu_where_the_cluster_counts_it() {
        let mut j = cpu_job(1, LiveState::Queued, 2, 1);
        j.workers.memory_bytes = 3 << 30;
        let mut nodes = vec![node("a", 8), node("b", 8)];
        nodes[0].memory_bytes = 4 << 30;
        nodes[1].memory_bytes = 2 << 30;
        let snapshot = |nodes: Vec<NodeRoom>, memory: u64| LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                cpu_millicores: 16_000,
                slot_millicores: 1000,
                max_processes: 100,
                memory_bytes: memory,
                nodes: Vec::new(),
                free: nodes,
            },
            jobs: vec![j.clone()],
        };
        let plan = |s: &LiveSnapshot| {
            plan_round(
                s,
                &Fifo::default(),
                &LiveConfig::default(),
                &Heuristics::default(),
            )
            .unwrap()
        };
        // 6 GiB in the pool of 8 fits; two 3-GiB workers on nodes of 4 and 2 GiB do not.
        let waits = plan(&snapshot(nodes.clone(), 8 << 30));
        assert_eq!(
            waits.decisions[0].to_workers(),
            0,
            "{:?}",
            waits.decisions[0]
        );
        assert!(
            waits.decisions[0]
                .reasons
                .last()
                .unwrap()
                .contains("and 3 GiB"),
            "{:?}",
            waits.decisions[0].reasons
        );
        // Memory not counted: the nodes' memory is not read.
        assert_eq!(plan(&snapshot(nodes, 0)).decisions[0].to_workers(), 2);
    }

    #[test]
    fn processes_go_largest_first_each_to_the_freest_node_that_holds_it() {
        let p = |cpu: u64, memory: u64| Process {
            gpus: 0,
            cpu,
            memory,
            model: None,
        };
        let placed = |room: &[Room], procs: &[Process]| {
            groups::placed(room.to_vec(), procs, &Groups::none()).ok()
        };
        let room = vec![p(4000, u64::MAX), p(2000, u64::MAX)];
        // 2 then 2 then 1: the first 2 goes to a (4 free), the second to a again (the first of
        // two with 2 free), the 1 to b.
        let (left, went) = placed(&rooms(&room), &[p(1000, 0), p(2000, 0), p(2000, 0)]).unwrap();
        assert_eq!(left, rooms(&[p(0, u64::MAX), p(1000, u64::MAX)]));
        // Where each went, in the order given.
        assert_eq!(went, [1, 0, 0]);
        assert_eq!(placed(&rooms(&room), &[p(3000, 0), p(3000, 0)]), None);
        // A 3 then a 1: the 3 to a, the 1 to b (2 free against a's 1).
        let left = placed(&rooms(&room), &[p(1000, 0), p(3000, 0)]).unwrap().0;
        assert_eq!(left, rooms(&[p(1000, u64::MAX), p(1000, u64::MAX)]));
        // Memory too: a node without the memory is passed over.
        let room = vec![p(4000, 1 << 30), p(2000, 4 << 30)];
        let left = placed(&rooms(&room), &[p(1000, 2 << 30)]).unwrap().0;
        assert_eq!(left, rooms(&[p(4000, 1 << 30), p(1000, 2 << 30)]));
        // GPUs: a process with GPUs goes first, to a node with its model and GPUs left (b,
        // though a has more CPU free); a process of another model fits nowhere.
        let gpus = |cpu: u64, gpus: u32, model: Model| Process {
            gpus,
            cpu,
            memory: u64::MAX,
            model,
        };
        let room = vec![
            gpus(4000, 0, None),
            gpus(3000, 2000, Some(0)),
            gpus(3000, 1000, Some(1)),
        ];
        let want = |cpu, g, m: Model| Process {
            memory: 0,
            ..gpus(cpu, g, m)
        };
        let left = placed(
            &rooms(&room),
            &[want(2000, 0, None), want(2000, 2000, Some(0))],
        )
        .unwrap()
        .0;
        assert_eq!(
            left,
            rooms(&[
                gpus(2000, 0, None),
                gpus(1000, 0, Some(0)),
                gpus(3000, 1000, Some(1))
            ])
        );
        assert_eq!(placed(&rooms(&room), &[want(1000, 1000, Some(7))]), None);
        // A process without GPUs goes to a node without them while one holds it.
        let room = vec![gpus(2000, 0, None), gpus(8000, 2000, Some(0))];
        let left = placed(&rooms(&room), &[want(1000, 0, None)]).unwrap().0;
        assert_eq!(left[0], rooms(&[gpus(1000, 0, None)])[0]);
        let left = placed(&rooms(&room), &[want(3000, 0, None)]).unwrap().0;
        assert_eq!(left[1], rooms(&[gpus(5000, 2000, Some(0))])[0]);
        let room = vec![
            gpus(4000, 0, None),
            gpus(3000, 2000, Some(0)),
            gpus(3000, 1000, Some(1)),
        ];
        // Any model: the freest node with the GPUs.
        let left = placed(&rooms(&room), &[want(1000, 1000, None)]).unwrap().0;
        assert_eq!(left[1], rooms(&[gpus(2000, 1000, Some(0))])[0]);
    }

    /// Nodes of these CPUs free (fractions allowed), named a, b, c, ...
    fn free(cpus: &[f64]) -> Vec<NodeRoom> {
        cpus.iter()
            .enumerate()
            .map(|(i, c)| NodeRoom {
                name: ((b'a' + i as u8) as char).to_string(),
                cpu_millicores: (c * 1000.0) as u64,
                memory_bytes: 0,
                gpus: Gpus::ZERO,
                devices: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn processes_of_plans_on_their_way_take_their_room_before_new_ones() {
        // Nodes a (4 CPUs free) and b (2). A running job's plan adds two 2-CPU workers its job
        // master has not launched: both go to a (the freest, then the first of two equals). A
        // queued job of one 3-CPU worker, which a alone would hold, then waits.
        let mut running = cpu_job(1, LiveState::Running, 4, 2);
        running.plan_in_flight = true;
        running.not_placed = vec![NotPlaced {
            count: 2,
            millicores: 2000,
            memory_bytes: 0,
            gpus: Gpus::ZERO,
            nodes: Vec::new(),
        }];
        let queued = cpu_job(2, LiveState::Queued, 1, 3);
        let plan = round(vec![running.clone(), queued.clone()], free(&[4.0, 2.0]), 16);
        let d = &plan.decisions[1];
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons
                .last()
                .unwrap()
                .contains("b 2 CPU free, a 0 CPU free"),
            "{d:?}"
        );
        assert!(
            plan.notes.iter().any(|n| n
                == "nodes: room held for 2 of 2 processes not placed yet (planned, or \
                            waiting for the platform)"),
            "{:?}",
            plan.notes
        );
        // Launched (none listed): the queued job starts.
        running.not_placed.clear();
        let plan = round(vec![running.clone(), queued.clone()], free(&[4.0, 2.0]), 16);
        assert_eq!(plan.decisions[1].to_workers(), 1, "{:?}", plan.decisions[1]);
        // More listed than fits on any node: those are taken as counted by the platform
        // already (a report older than their launch), not held twice.
        running.not_placed = vec![NotPlaced {
            count: 8,
            millicores: 1000,
            memory_bytes: 0,
            gpus: Gpus::ZERO,
            nodes: Vec::new(),
        }];
        let plan = round(vec![running, queued], free(&[4.0, 2.0]), 16);
        assert!(
            plan.notes.iter().any(|n| n.starts_with(
                "nodes: room held for 6 of 8 processes not placed yet (planned, or waiting \
                 for the platform); the rest fit on no node"
            )),
            "{:?}",
            plan.notes
        );
        assert_eq!(plan.decisions[1].to_workers(), 0, "{:?}", plan.decisions[1]);
    }

    #[test]
    fn processes_not_placed_hold_room_on_the_nodes_their_plan_named() {
        // Nodes a (4 CPUs free) and b (2). A running job's plan added one 2-CPU worker on b,
        // not launched yet: its room is held on b, so a queued job of one 3-CPU worker starts
        // on a. Held on the freest (a, as where no node is named), the queued job would wait.
        let mut running = cpu_job(1, LiveState::Running, 4, 2);
        running.plan_in_flight = true;
        let on = |nodes: &[&str]| NotPlaced {
            count: 1,
            millicores: 2000,
            memory_bytes: 0,
            gpus: Gpus::ZERO,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        };
        let queued = cpu_job(2, LiveState::Queued, 1, 3);
        let starts = |not_placed: NotPlaced, free_cpus: &[f64]| {
            let mut running = running.clone();
            running.not_placed = vec![not_placed];
            let plan = round(vec![running, queued.clone()], free(free_cpus), 16);
            assert!(
                plan.notes
                    .iter()
                    .any(|n| n.starts_with("nodes: room held for 1 of 1 ")),
                "{:?}",
                plan.notes
            );
            plan.decisions[1].to_workers()
        };
        assert_eq!(starts(on(&["b"]), &[4.0, 2.0]), 1);
        assert_eq!(starts(on(&[]), &[4.0, 2.0]), 0);
        // A node gone, or one it no longer fits on: held on the freest, not dropped.
        assert_eq!(starts(on(&["z"]), &[4.0, 2.0]), 0);
        assert_eq!(starts(on(&["b"]), &[4.0, 1.0]), 0);
        // Two named, one on each: a 2 left, b 0, and a 3-CPU worker fits nowhere; one of
        // them named and one not, the other goes to the freest (a) too.
        let mut two = on(&["a", "b"]);
        two.count = 2;
        let waits_on_what_they_leave = |not_placed: NotPlaced| {
            let mut running = running.clone();
            running.not_placed = vec![not_placed];
            let plan = round(vec![running, queued.clone()], free(&[4.0, 2.0]), 16);
            let d = &plan.decisions[1];
            assert_eq!(d.to_workers(), 0, "{d:?}");
            let why = d.reasons.last().unwrap();
            assert!(why.contains("a 2 CPU free, b 0 CPU free"), "{d:?}");
        };
        waits_on_what_they_leave(two.clone());
        two.nodes = vec!["b".into()];
        waits_on_what_they_leave(two);
    }

    #[test]
    fn a_starts_processes_are_named_where_the_nodes_room_placed_them() {
        // Nodes a (4 CPUs free) and b (3). A start of two 2-CPU workers, a 1-CPU PS and two
        // 1-CPU rollout engines, placed largest first, each on the node with the most CPU
        // left (the first of equals): the workers on a and b, the PS on a, the engines on a
        // and b. Its job master is told so, under the job's names.
        let mut j = cpu_job(1, LiveState::Queued, 2, 2);
        (j.ps.count, j.ps.millicores) = (1, 1000);
        let mut engine = super::super::tests::rollout(2, 0.0, 0.0);
        engine.millicores = 1000;
        engine.rate = None;
        let rollout = engine.role;
        j.roles = vec![engine];
        let plan = round(vec![j], free(&[4.0, 3.0]), 16);
        let d = &plan.decisions[0];
        assert_eq!(d.to_workers(), 2, "{d:?}");
        use crate::live::tests::names;
        let trainer = Role::new("trainer").unwrap();
        assert_eq!(
            d.start_nodes(trainer),
            BTreeMap::from([
                (trainer, names(&["a", "b"])),
                (Role::PS, names(&["a"])),
                (rollout, names(&["a", "b"])),
            ]),
            "{d:?}"
        );
    }

    #[test]
    fn a_start_places_its_roles_processes_with_its_own() {
        // One 2-CPU worker and two rollout engines of 2 CPUs: 6 CPUs, which the nodes (4, 1,
        // 1) hold in all but not whole: the start waits and says so. On nodes of 6, 1, 1 it
        // starts.
        let mut j = cpu_job(1, LiveState::Queued, 1, 2);
        let mut engine = super::super::tests::rollout(2, 0.0, 0.0);
        engine.millicores = 2000;
        engine.rate = None;
        j.roles = vec![engine];
        let plan = round(vec![j.clone()], free(&[4.0, 1.0, 1.0]), 16);
        let d = &plan.decisions[0];
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r.starts_with(
                "waits: no node has room for its processes of 2 CPU with its roles' 2 at its \
                 minimum of 1 workers"
            )),
            "{d:?}"
        );
        let plan = round(vec![j.clone()], free(&[6.0, 1.0, 1.0]), 16);
        assert_eq!(plan.decisions[0].to_workers(), 1, "{:?}", plan.decisions[0]);
        // A role with GPUs of its own goes where its GPUs are free: node b, whose CPU holds
        // the worker and both engines (2 + 2 × 1 CPU), though a has more CPU free.
        j.roles[0].gpus = vocab::Gpus::whole(1);
        j.roles[0].millicores = 1000;
        let with_gpus = |free_gpus: u32| {
            let mut nodes = free(&[5.0, 4.0]);
            nodes[1].gpus = vocab::Gpus::whole(free_gpus);
            let snapshot = LiveSnapshot {
                now_s: 100.0,
                cluster: LiveCluster {
                    nodes: vec![LiveNode {
                        name: "b".into(),
                        gpus: 2,
                        gpu_type: "V100".into(),
                    }],
                    ..round_cluster(nodes, 16)
                },
                jobs: vec![j.clone()],
            };
            fifo_round(&snapshot)
        };
        assert_eq!(with_gpus(2).decisions[0].to_workers(), 1);
        // One GPU free on b (the other held by a process the round does not know of): the
        // start waits, naming the nodes' GPUs.
        let d = &with_gpus(1).decisions[0];
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|r| r.starts_with("waits: no node has room")
                    && r.ends_with("(a 5 CPU free, b 4 CPU, 1 V100 GPUs free)")),
            "{d:?}"
        );
    }

    #[test]
    fn a_growths_plan_names_the_node_of_each_process_it_adds() {
        // Two running jobs of one 2-CPU worker each grow to two in one round; nodes a (3 CPUs
        // free) and b (2). Each job master reading Ray's free room would pick a, the freest;
        // the round places job 1's on a, leaving it 1, and job 2's on b, and the plans say so.
        let grows = |id| {
            let mut j = cpu_job(id, LiveState::Running, 1, 2);
            j.workers.max = 2;
            j.workers.min = 1;
            j
        };
        let snapshot = LiveSnapshot {
            now_s: 100.0,
            cluster: round_cluster(free(&[3.0, 2.0]), 16),
            jobs: vec![grows(1), grows(2)],
        };
        let heuristics = super::super::tests::none();
        let config = super::super::tests::config();
        let scheduler = super::super::tests::elastic();
        let plan = plan_round(&snapshot, &scheduler, &config, &heuristics).unwrap();
        let one = super::super::tests::decision(&plan, 1);
        let two = super::super::tests::decision(&plan, 2);
        assert_eq!((one.to_workers(), two.to_workers()), (2, 2), "{plan:?}");
        let named = |d: &Decision| {
            d.scale_plan(2, Role::WORKER).roles[&Role::WORKER]
                .nodes
                .clone()
        };
        assert_eq!(named(one), ["a"]);
        assert_eq!(named(two), ["b"]);
        // Under the job's own name for its training group.
        let trainer: Role = "trainer".parse().unwrap();
        assert_eq!(two.scale_plan(2, trainer).roles[&trainer].nodes, ["b"]);
        // Where the platform reports no nodes, none are named.
        let mut pooled = snapshot.clone();
        pooled.cluster.free.clear();
        let plan = plan_round(&pooled, &scheduler, &config, &heuristics).unwrap();
        assert!(
            plan.decisions.iter().all(|d| d.nodes.is_empty()),
            "{plan:?}"
        );
        // A start's are named from index 0, for its job master (not in a plan).
        let mut start = snapshot.clone();
        start.jobs[1].state = LiveState::Queued;
        start.jobs[1].workers.count = 0;
        let plan = plan_round(&start, &scheduler, &config, &heuristics).unwrap();
        let started = super::super::tests::decision(&plan, 2);
        assert!(
            started.to_workers() > 0
                && started.nodes.get(&Role::WORKER).map(Vec::len)
                    == Some(started.to_workers() as usize),
            "{started:?}"
        );
    }

    #[test]
    fn a_starts_placement_groups_are_laid_out_by_their_strategy_and_named_so() {
        // Nodes a (4 CPUs free), b (3), c (2). One 1-CPU worker and three 1-CPU rollout
        // engines. On their own the engines go a, b, a (each to the freest); strictly spread,
        // one a node: a, b, c, the worker then on a. Strictly packed with the worker, all four
        // on a.
        use crate::live::tests::names;
        use vocab::spec::Strategy;
        let mut j = cpu_job(1, LiveState::Queued, 1, 1);
        let mut engine = super::super::tests::rollout(3, 0.0, 0.0);
        engine.millicores = 1000;
        engine.rate = None;
        let rollout = engine.role;
        j.roles = vec![engine];
        let named = |j: &LiveJob, nodes: &[f64]| {
            let plan = round(vec![j.clone()], free(nodes), 16);
            let d = plan.decisions[0].clone();
            (d.to_workers(), d.start_nodes(Role::WORKER), d.reasons)
        };
        let (to, on, _) = named(&j, &[4.0, 3.0, 2.0]);
        assert_eq!((to, &on[&rollout]), (1, &names(&["a", "b", "a"])));
        let group = |roles: Vec<Role>, strategy| LiveGroup {
            roles,
            strategy,
            share_devices: false,
        };
        j.groups = vec![group(vec![rollout], Strategy::StrictSpread)];
        let (to, on, _) = named(&j, &[4.0, 3.0, 2.0]);
        assert_eq!(to, 1);
        assert_eq!(on[&rollout], names(&["a", "b", "c"]));
        assert_eq!(on[&Role::WORKER], names(&["a"]));
        j.groups = vec![group(vec![Role::WORKER, rollout], Strategy::StrictPack)];
        let (_, on, _) = named(&j, &[4.0, 3.0, 2.0]);
        assert_eq!(on[&rollout], names(&["a", "a", "a"]));
        assert_eq!(on[&Role::WORKER], names(&["a"]));
        // Four strictly spread over three nodes: the start waits, naming the group.
        j.groups = vec![group(vec![rollout], Strategy::StrictSpread)];
        j.roles[0].count = 4;
        let (to, on, reasons) = named(&j, &[4.0, 3.0, 2.0]);
        assert_eq!((to, on.len()), (0, 0));
        assert!(
            reasons.iter().any(|r| r.starts_with(
                "waits at its minimum of 1 workers: the nodes' free room cannot hold its \
                 placement group rollout (strict_spread) so (a 4 CPU free"
            )),
            "{reasons:?}"
        );
        // The same four packed strictly with the worker need a node of 5 CPUs.
        j.groups = vec![group(vec![Role::WORKER, rollout], Strategy::StrictPack)];
        assert_eq!(named(&j, &[4.0, 3.0, 2.0]).0, 0);
        assert_eq!(named(&j, &[5.0, 1.0]).1[&rollout], names(&["a"; 4]));
    }

    /// A running job of 2 workers (with a reported speed) and its two engines of 0.5 CPU
    /// running on `nodes`, busy 90%, whose callers wait 80% of their time for them.
    fn waited_on(nodes: &[&str]) -> (LiveJob, LiveRole) {
        let mut j = cpu_job(1, LiveState::Running, 2, 1);
        j.speed = vec![SpeedPoint {
            workers: 2,
            samples_per_s: 100.0,
        }];
        let mut engine = super::super::tests::rollout(2, 0.9, 0.8);
        engine.nodes = nodes.iter().map(|n| n.to_string()).collect();
        (j, engine)
    }

    #[test]
    fn a_grouped_roles_growth_goes_beside_its_group_by_the_strategy() {
        // A running job whose callers wait 80% for its two engines (0.5 CPU), strictly spread
        // and running on a and b: of nodes a (3 CPUs free), b (3), c (1), only c may take
        // another, though a has more room; the plan names c. With c full, none grows.
        use vocab::spec::Strategy;
        let (mut j, engine) = waited_on(&["a", "b"]);
        let r = engine.role;
        j.roles = vec![engine];
        j.groups = vec![LiveGroup {
            share_devices: false,
            roles: vec![r],
            strategy: Strategy::StrictSpread,
        }];
        let run = |nodes: Vec<NodeRoom>| {
            bare_round(&LiveSnapshot {
                now_s: 100.0,
                cluster: round_cluster(nodes, 16),
                jobs: vec![j.clone()],
            })
        };
        let plan = run(free(&[3.0, 3.0, 1.0]));
        let d = &plan.decisions[0];
        assert_eq!(d.resized_roles(), vec![(r, 2, 3)], "{d:?}");
        assert_eq!(d.scale_plan(2, Role::WORKER).roles[&r].nodes, ["c"]);
        let plan = run(free(&[3.0, 3.0, 0.2]));
        let d = &plan.decisions[0];
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.contains(
                "no node has room for another process in its placement group rollout \
                 (strict_spread)"
            )),
            "{d:?}"
        );
    }

    #[test]
    fn a_role_that_shares_devices_grows_beside_its_indexs_partners() {
        // Engines (2, on a and b) whose callers wait 80% share devices with the reward role's
        // four processes (on a, b, c, b): the two added, rollout-2 and rollout-3, go beside
        // reward-2 and reward-3 (c, b), not where the group has fewest (a, c).
        use vocab::spec::Strategy;
        let (mut j, engine) = waited_on(&["a", "b"]);
        let mut reward = super::super::tests::rollout(4, 0.0, 0.0);
        (reward.role, reward.rate) = ("reward".parse().unwrap(), None);
        reward.nodes = ["a", "b", "c", "b"].map(String::from).to_vec();
        let (r, w) = (engine.role, reward.role);
        j.roles = vec![engine, reward];
        let mut group = LiveGroup {
            share_devices: true,
            roles: vec![r, w],
            strategy: Strategy::Spread,
        };
        let grown = |group: &LiveGroup| {
            let mut j = j.clone();
            j.groups = vec![group.clone()];
            let plan = bare_round(&LiveSnapshot {
                now_s: 100.0,
                cluster: round_cluster(free(&[3.0, 3.0, 1.0]), 16),
                jobs: vec![j],
            });
            let d = plan.decisions[0].clone();
            assert_eq!(d.resized_roles(), vec![(r, 2, 4)], "{d:?}");
            d.scale_plan(2, Role::WORKER).roles[&r].nodes.clone()
        };
        assert_eq!(grown(&group), ["c", "b"]);
        // Not sharing devices: by the strategy, where the group has the fewest.
        group.share_devices = false;
        assert_eq!(grown(&group), ["c", "a"]);
    }

    #[test]
    fn a_role_grows_only_by_the_processes_a_node_holds() {
        // A running job at its size whose callers wait 80% for its one engine of 0.5 CPU: the
        // pool holds 3 more, the nodes (0.7, 0.4, 0.3 free) one.
        let r: vocab::Role = "rollout".parse().unwrap();
        let mut j = cpu_job(1, LiveState::Running, 2, 1);
        j.speed = vec![SpeedPoint {
            workers: 2,
            samples_per_s: 100.0,
        }];
        j.roles = vec![super::super::tests::rollout(1, 0.9, 0.8)];
        let run = |nodes: Vec<NodeRoom>| {
            bare_round(&LiveSnapshot {
                now_s: 100.0,
                cluster: round_cluster(nodes, 16),
                jobs: vec![j.clone()],
            })
        };
        let plan = run(Vec::new());
        assert_eq!(plan.decisions[0].resized_roles(), vec![(r, 1, 4)]);
        let plan = run(free(&[0.7, 0.4, 0.3]));
        let d = &plan.decisions[0];
        assert_eq!(d.resized_roles(), vec![(r, 1, 2)], "{d:?}");
        // On a, the one node that holds it; the plan names it.
        assert_eq!(d.scale_plan(2, Role::WORKER).roles[&r].nodes, ["a"]);
        assert!(
            d.reasons
                .iter()
                .any(|x| x.ends_with("as many as the nodes' free room holds")),
            "{d:?}"
        );
        let plan = run(free(&[0.4, 0.4]));
        let d = &plan.decisions[0];
        assert!(d.resized_roles().is_empty(), "{d:?}");
        assert!(
            d.reasons.iter().any(|x| x.ends_with(
                "no node has room for another process of 0.5 CPU (a 0.4 CPU free, b 0.4 CPU \
                     free)"
            )),
            "{d:?}"
        );
    }

    #[test]
    fn the_room_a_holdup_grows_by_is_kept_on_the_nodes_against_a_start() {
        // A running job's workers wait 70% for its engine (0.5 CPU, growing by 3); a queued
        // job of 1-CPU workers would take both nodes' 2 CPUs. The engine's 1.5 CPUs are kept
        // on one node: the queued job starts on the other, the engine grows to its max.
        let r: vocab::Role = "rollout".parse().unwrap();
        let mut held = cpu_job(1, LiveState::Running, 2, 1);
        held.speed = vec![SpeedPoint {
            workers: 2,
            samples_per_s: 100.0,
        }];
        held.workers.max = 8;
        let mut engine = super::super::tests::rollout(1, 0.9, 0.8);
        engine.rate.as_mut().unwrap().training_wait_share = 0.7;
        held.roles = vec![engine];
        let mut queued = cpu_job(2, LiveState::Queued, 4, 1);
        queued.workers.min = 1;
        let snapshot = LiveSnapshot {
            now_s: 100.0,
            cluster: round_cluster(free(&[2.0, 2.0]), 8),
            jobs: vec![held, queued],
        };
        let plan = plan_round(
            &snapshot,
            super::super::tests::elastic().scheduler(),
            &super::super::tests::config(),
            &super::super::tests::none(),
        )
        .unwrap();
        let (a, b) = (&plan.decisions[0], &plan.decisions[1]);
        assert_eq!(a.resized_roles(), vec![(r, 1, 4)], "{a:?}");
        assert_eq!(b.to_workers(), 2, "{b:?}");
    }
}
