//! Round-based schedulers for elastic GPU jobs: each round a [`Scheduler`] sees a [`Snapshot`]
//! of the nodes and the jobs waiting or running, and returns where each job runs next, as whole
//! GPUs on nodes. The live brain and the what-if simulator ([`crate::sim`]) drive the same
//! trait; nothing in a snapshot says which one asked.
//!
//! One policy per file, chosen with the serde enum [`SchedulerKind`]:
//! * [`fifo`]: the trace's requested size, first come first served, never preempted.
//! * [`dlrover`]: DLRover's job-level heuristics: admission at the requested size, growth while
//!   it speeds the job up, pending shrink.
//! * [`tiresias`]: Tiresias' discretised two-queue least-attained-service, requested sizes.
//! * [`optimus`]: Optimus' greedy marginal gain in remaining time, one GPU at a time.
//! * [`pollux`]: Pollux-style goodput: fair-share-normalised speedups combined in a power mean
//!   (p = −1), with a restart penalty, maximised greedily.
//! * [`gavel`]: Gavel: shares of time per worker type from an allocation policy (the LP
//!   policies of [`crate::policy`]), carried out round by round, requested sizes.
//! * [`elastic_lp`]: Brain's own: sizes and types from an LP that maximises the rate at which
//!   jobs complete, restarts priced in.
//!
//! Schedulers are pure: the same snapshot gives the same assignment. Whatever a policy needs to
//! remember between rounds (attained service, time running, restarts) is in the snapshot.

pub mod dlrover;
pub mod elastic_lp;
pub mod fifo;
pub mod gavel;
pub mod optimus;
pub mod pollux;
pub mod tiresias;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::units::{JobId, WorkerType};

pub use dlrover::DlRover;
pub use elastic_lp::ElasticLp;
pub use fifo::Fifo;
pub use gavel::Gavel;
pub use optimus::Optimus;
pub use pollux::Pollux;
pub use tiresias::Tiresias;

/// A node as a scheduler sees it: its GPU type and the GPUs it can give (0 while it is down).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// Index into [`Snapshot::worker_types`].
    pub worker_type: usize,
    pub gpus: u32,
}

/// Where a job runs: (node index, GPUs on it), by node index, all nodes of one type.
pub type Slots = Vec<(usize, u32)>;

/// A job waiting or running, as a scheduler sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    pub id: JobId,
    pub submitted_s: f64,
    /// The size the user asked for (GPUs).
    pub requested_replicas: u32,
    /// The most GPUs the job can use now.
    pub max_replicas: u32,
    /// GPU-seconds the job has held so far.
    pub attained_gpu_s: f64,
    /// Seconds the job has held any GPU.
    pub running_s: f64,
    /// Times the job was restarted on a new allocation.
    pub restarts: u32,
    /// The most GPUs the job has ever held.
    pub peak_replicas: u32,
    /// When its allocation last changed (started, resized, moved or stopped); `None` if never.
    #[serde(default)]
    pub last_change_s: Option<f64>,
    /// Where the job runs now (empty when it waits).
    pub current: Slots,
    /// Goodput (progress per second) on each worker type with `r` GPUs packed on as few nodes
    /// as possible, for `r` in `0..=max_replicas` (`goodput[t][0] = 0`). Shared: a caller
    /// that keeps it between rounds hands it out without copying.
    #[serde(with = "shared_table")]
    pub goodput: Arc<[Vec<f64>]>,
    /// Progress left, in the unit of `goodput`: `remaining / goodput[t][r]` is seconds.
    pub remaining: f64,
}

/// An `Arc<[T]>` as the sequence it holds (serde's own impl needs its `rc` feature, which would
/// change serde for the whole dependency graph).
mod shared_table {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(table: &Arc<[Vec<f64>]>, s: S) -> Result<S::Ok, S::Error> {
        table.as_ref().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[Vec<f64>]>, D::Error> {
        Vec::<Vec<f64>>::deserialize(d).map(Arc::from)
    }
}

impl JobView {
    pub fn current_replicas(&self) -> u32 {
        self.current.iter().map(|s| s.1).sum()
    }

    /// Goodput with `r` GPUs on worker type `t` (0 beyond what is known).
    pub fn goodput_at(&self, t: usize, r: u32) -> f64 {
        self.goodput
            .get(t)
            .and_then(|g| g.get(r as usize))
            .copied()
            .unwrap_or(0.0)
    }

    /// The fewest GPUs the job makes progress on, on some worker type (a rigid job runs only
    /// on what it asked for); `None` if it runs on nothing.
    pub fn min_replicas(&self) -> Option<u32> {
        (1..=self.max_replicas)
            .find(|&r| (0..self.goodput.len()).any(|t| self.goodput_at(t, r) > 0.0))
    }

    /// The most GPUs the job may grow to when it may grow to `max_growth` × the most it has
    /// held (`0` lifts that), but always to `least`, the fewest it runs on.
    pub fn growth_limit(&self, max_growth: f64, least: u32) -> u32 {
        if max_growth > 0.0 {
            let grow = (max_growth * self.peak_replicas as f64).floor() as u32;
            self.max_replicas.min(grow.max(least))
        } else {
            self.max_replicas
        }
    }

    /// The worker type the job runs on now, if it runs.
    pub fn current_type(&self, nodes: &[NodeView]) -> Option<usize> {
        self.current.first().map(|(n, _)| nodes[*n].worker_type)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub now_s: f64,
    pub worker_types: Vec<WorkerType>,
    pub nodes: Vec<NodeView>,
    /// Jobs in order of submission (ties by id).
    pub jobs: Vec<JobView>,
}

/// Where each job runs until the next round; a job not named waits.
pub type Assignment = BTreeMap<JobId, Slots>;

/// How a job chooses its batch size under a scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchSizing {
    /// The batch size the trace gives, whatever the allocation.
    Fixed,
    /// The batch size with the most goodput on the allocation (Pollux's co-adaptation).
    Adaptive,
}

pub trait Scheduler {
    fn name(&self) -> &'static str;

    /// How jobs pick their batch size under this scheduler.
    fn batch_sizing(&self) -> BatchSizing {
        BatchSizing::Fixed
    }

    /// Whether jobs may run at sizes other than the one they asked for.
    fn elastic(&self) -> bool;

    /// Checks the scheduler's settings, as loading a policy file does; `schedule` checks
    /// them again.
    fn validate(&self) -> Result<(), PolicyError> {
        Ok(())
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError>;
}

/// The scheduler an operator names in TOML, e.g. `kind = "tiresias"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SchedulerKind {
    Fifo(Fifo),
    Tiresias(Tiresias),
    Optimus(Optimus),
    Pollux(Pollux),
    ElasticLp(ElasticLp),
    Gavel(Gavel),
    Dlrover(DlRover),
}

impl SchedulerKind {
    pub fn scheduler(&self) -> &dyn Scheduler {
        match self {
            SchedulerKind::Fifo(s) => s,
            SchedulerKind::Tiresias(s) => s,
            SchedulerKind::Optimus(s) => s,
            SchedulerKind::Pollux(s) => s,
            SchedulerKind::ElasticLp(s) => s,
            SchedulerKind::Gavel(s) => s,
            SchedulerKind::Dlrover(s) => s,
        }
    }
}

impl Scheduler for SchedulerKind {
    fn name(&self) -> &'static str {
        self.scheduler().name()
    }
    fn batch_sizing(&self) -> BatchSizing {
        self.scheduler().batch_sizing()
    }
    fn elastic(&self) -> bool {
        self.scheduler().elastic()
    }
    fn validate(&self) -> Result<(), PolicyError> {
        self.scheduler().validate()
    }
    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        self.scheduler().schedule(snapshot)
    }
}

/// Free GPUs per node while a scheduler hands them out.
#[derive(Clone, Debug)]
pub struct FreeGpus {
    free: Vec<u32>,
    types: Vec<usize>,
}

impl FreeGpus {
    pub fn new(nodes: &[NodeView]) -> Self {
        FreeGpus {
            free: nodes.iter().map(|n| n.gpus).collect(),
            types: nodes.iter().map(|n| n.worker_type).collect(),
        }
    }

    pub fn on_type(&self, t: usize) -> u32 {
        self.free
            .iter()
            .zip(&self.types)
            .filter(|(_, ty)| **ty == t)
            .map(|(f, _)| f)
            .sum()
    }

    pub fn total(&self) -> u32 {
        self.free.iter().sum()
    }

    /// Takes `slots` if every node still has them.
    pub fn take_exact(&mut self, slots: &[(usize, u32)]) -> bool {
        if slots
            .iter()
            .any(|&(n, k)| self.free.get(n).is_none_or(|f| *f < k))
        {
            return false;
        }
        for &(n, k) in slots {
            self.free[n] -= k;
        }
        true
    }

    /// The worker type where `job` is fastest with `r` GPUs among those with `r` free (ties
    /// to the lower index).
    pub fn fastest_type(&self, job: &JobView, r: u32) -> Option<usize> {
        let types = self.types.iter().copied().max().map_or(0, |m| m + 1);
        (0..types)
            .filter(|&t| self.on_type(t) >= r && job.goodput_at(t, r) > 0.0)
            .max_by(|&a, &b| {
                job.goodput_at(a, r)
                    .total_cmp(&job.goodput_at(b, r))
                    .then(b.cmp(&a))
            })
    }

    /// `r` GPUs on worker type `t`, each time from the node with the most free GPUs (ties by
    /// index), as Tiresias and Optimus place; `None` (nothing taken) when too few are free.
    pub fn take_spread(&mut self, t: usize, r: u32) -> Option<Slots> {
        if r == 0 || self.on_type(t) < r {
            return None;
        }
        let mut got: BTreeMap<usize, u32> = BTreeMap::new();
        let mut left = r;
        while left > 0 {
            let n = (0..self.free.len())
                .filter(|&n| self.types[n] == t && self.free[n] > 0)
                .max_by_key(|&n| (self.free[n], std::cmp::Reverse(n)))?;
            let k = left.min(self.free[n]);
            self.free[n] -= k;
            *got.entry(n).or_default() += k;
            left -= k;
        }
        Some(got.into_iter().collect())
    }

    /// `r` GPUs on worker type `t`: on one node when one has room (the fullest that fits),
    /// else on the nodes with the most free GPUs first. `None` (and nothing taken) when the
    /// type has fewer than `r` free.
    pub fn take(&mut self, t: usize, r: u32) -> Option<Slots> {
        if r == 0 || self.on_type(t) < r {
            return None;
        }
        let of_type = || (0..self.free.len()).filter(|&n| self.types[n] == t && self.free[n] > 0);
        let single = of_type()
            .filter(|&n| self.free[n] >= r)
            .min_by_key(|&n| (self.free[n], n));
        let mut slots = Vec::new();
        if let Some(n) = single {
            slots.push((n, r));
        } else {
            let mut order: Vec<usize> = of_type().collect();
            order.sort_by_key(|&n| (std::cmp::Reverse(self.free[n]), n));
            let mut left = r;
            for n in order {
                let k = left.min(self.free[n]);
                slots.push((n, k));
                left -= k;
                if left == 0 {
                    break;
                }
            }
            slots.sort_unstable();
        }
        self.take_exact(&slots);
        Some(slots)
    }
}

/// Keeps the current slots of the jobs `keep` says keep them (in snapshot order) while they
/// are still free; returns the assignment so far and the GPUs left.
pub fn keep_current(
    snapshot: &Snapshot,
    keep: impl Fn(&JobView) -> bool,
) -> (Assignment, FreeGpus) {
    let mut free = FreeGpus::new(&snapshot.nodes);
    let mut out = Assignment::new();
    for job in &snapshot.jobs {
        if !job.current.is_empty() && keep(job) && free.take_exact(&job.current) {
            out.insert(job.id, job.current.clone());
        }
    }
    (out, free)
}

/// Carries out a scheduler's decision of (job, worker type, GPUs): a job decided at the size and
/// type it runs at keeps its GPUs; the others are placed in the order given.
pub fn carry_out(
    snapshot: &Snapshot,
    sizes: Vec<(JobId, usize, u32)>,
    packing: Packing,
) -> Result<Assignment, PolicyError> {
    // A set: 10,000 jobs each looked up in a list of 10,000 sizes took most of a round. (A
    // job may be named more than once; it keeps its GPUs when any of its sizes is the one it
    // runs at.)
    let decided: std::collections::HashSet<(JobId, usize, u32)> = sizes.iter().copied().collect();
    let (mut out, mut free) = keep_current(snapshot, |job| {
        job.current_type(&snapshot.nodes)
            .is_some_and(|t| decided.contains(&(job.id, t, job.current_replicas())))
    });
    place_rest(&mut out, &mut free, sizes, packing)?;
    Ok(out)
}

/// How [`place_rest`] lays out a job's GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// [`FreeGpus::take`]: one node when one has room, else the emptiest nodes first.
    Tight,
    /// [`FreeGpus::take_spread`]: each GPU from the node with the most free.
    Spread,
}

/// Places each (job, worker type, GPUs) not yet in `out`, in the order given. The sizes were
/// counted against the same free GPUs, so a job that no longer fits is a scheduler bug.
pub fn place_rest(
    out: &mut Assignment,
    free: &mut FreeGpus,
    sizes: impl IntoIterator<Item = (JobId, usize, u32)>,
    packing: Packing,
) -> Result<(), PolicyError> {
    for (id, t, r) in sizes {
        if let std::collections::btree_map::Entry::Vacant(e) = out.entry(id) {
            let slots = match packing {
                Packing::Tight => free.take(t, r),
                Packing::Spread => free.take_spread(t, r),
            };
            let slots = slots
                .ok_or_else(|| PolicyError::InvalidAssignment(format!("{id} no longer fits")))?;
            e.insert(slots);
        }
    }
    Ok(())
}

/// Checks an assignment against the snapshot: known jobs, nodes never over capacity, one worker
/// type per job, at most `max_replicas` GPUs each.
pub fn check(snapshot: &Snapshot, assignment: &Assignment) -> Result<(), PolicyError> {
    let bad = |m: String| Err(PolicyError::InvalidAssignment(m));
    let mut used = vec![0u32; snapshot.nodes.len()];
    let jobs: BTreeMap<JobId, &JobView> = snapshot.jobs.iter().map(|j| (j.id, j)).collect();
    for (id, slots) in assignment {
        let Some(job) = jobs.get(id) else {
            return bad(format!("{id} is not in the snapshot"));
        };
        let mut types = std::collections::BTreeSet::new();
        let mut total = 0;
        for &(n, k) in slots {
            let Some(node) = snapshot.nodes.get(n) else {
                return bad(format!("{id} is given node {n}, which does not exist"));
            };
            types.insert(node.worker_type);
            used[n] += k;
            total += k;
        }
        if types.len() > 1 {
            return bad(format!("{id} spans {} worker types", types.len()));
        }
        if total > job.max_replicas {
            return bad(format!(
                "{id} is given {total} GPUs, more than its {}",
                job.max_replicas
            ));
        }
    }
    for (n, (u, node)) in used.iter().zip(&snapshot.nodes).enumerate() {
        if *u > node.gpus {
            return bad(format!("node {n} is given {u} GPUs of its {}", node.gpus));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `nodes` nodes of 4 GPUs of one type and jobs with linear goodput up to `max` GPUs.
    pub fn snapshot(nodes: usize, jobs: &[(u32, u32, f64)]) -> Snapshot {
        Snapshot {
            now_s: 1000.0,
            worker_types: vec![WorkerType("t4".into())],
            nodes: vec![
                NodeView {
                    worker_type: 0,
                    gpus: 4
                };
                nodes
            ],
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(i, &(requested, max, attained))| JobView {
                    id: JobId(i as u64),
                    submitted_s: i as f64,
                    requested_replicas: requested,
                    max_replicas: max,
                    attained_gpu_s: attained,
                    running_s: attained / requested.max(1) as f64,
                    restarts: 0,
                    peak_replicas: 0,
                    last_change_s: None,
                    current: vec![],
                    goodput: vec![(0..=max).map(|r| (r as f64).powf(0.8)).collect()].into(),
                    remaining: 1000.0 * (i + 1) as f64,
                })
                .collect(),
        }
    }

    #[test]
    fn free_gpus_prefer_one_node_and_never_overcommit() {
        let s = snapshot(3, &[]);
        let mut free = FreeGpus::new(&s.nodes);
        assert_eq!(free.take(0, 3), Some(vec![(0, 3)]));
        // Best fit: node 0 has 1 left and is the fullest that fits 1.
        assert_eq!(free.take(0, 1), Some(vec![(0, 1)]));
        assert_eq!(free.take(0, 6), Some(vec![(1, 4), (2, 2)]));
        assert_eq!(free.take(0, 3), None);
        assert_eq!(free.total(), 2);
    }

    #[test]
    fn broken_assignments_are_rejected_with_the_reason() {
        let s = snapshot(2, &[(2, 4, 0.0)]);
        let over = Assignment::from([(JobId(0), vec![(0, 4), (1, 1)])]);
        assert!(
            check(&s, &over)
                .unwrap_err()
                .to_string()
                .contains("more than its 4")
        );
        let unknown = Assignment::from([(JobId(9), vec![(0, 1)])]);
        assert!(
            check(&s, &unknown)
                .unwrap_err()
                .to_string()
                .contains("not in the snapshot")
        );
        let ok = Assignment::from([(JobId(0), vec![(0, 2), (1, 2)])]);
        check(&s, &ok).unwrap();
    }
}
