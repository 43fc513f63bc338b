//! What every round must hold: the repair step that withdraws what does not fit, and the
//! post-conditions checked before a round's plan is used.

use std::collections::BTreeMap;

use ordered_float::OrderedFloat;

use super::*;

/// What every round must hold, whatever the scheduler said: a job that changes size lands
/// within its bounds on a whole node unit, and the jobs at their decided sizes fit the
/// cluster, unless the running jobs alone already held more and the round only shrank or
/// kept them (then it started nothing and grew nothing). A violation is a bug in a scheduler
/// or in the repair step, returned as [`PolicyError::InvalidAssignment`] rather than sent.
pub fn check_postconditions(snapshot: &LiveSnapshot, plan: &RoundPlan) -> Result<(), PolicyError> {
    let jobs: BTreeMap<JobId, &LiveJob> = snapshot.jobs.iter().map(|j| (j.id, j)).collect();
    let mut added = false;
    for d in &plan.decisions {
        let job = jobs.get(&d.job).ok_or_else(|| {
            PolicyError::InvalidAssignment(format!("a decision for unknown {}", d.job))
        })?;
        if d.to_workers() > d.from_workers() || d.to_ps() > d.ps() {
            added = true;
        }
        if let Some(m) = d.migrations.iter().find(|m| match m.key.role {
            Role::PS => m.key.index >= d.to_ps(),
            Role::WORKER => m.key.index >= d.to_workers(),
            // The brain sizes a job's ps and worker roles; it migrates no other.
            _ => true,
        }) {
            return Err(PolicyError::InvalidAssignment(format!(
                "{} ({}) migrates {}, which the decision does not keep",
                d.job, d.name, m.key
            )));
        }
        if d.to_workers() == d.from_workers() || d.to_workers() == 0 {
            continue;
        }
        let unit = job.workers.node_unit.max(1);
        if d.to_workers() < job.workers.min
            || d.to_workers() > job.workers.max
            || d.to_workers() % unit != 0
        {
            return Err(PolicyError::InvalidAssignment(format!(
                "{} ({}) sized to {} workers, outside [min {}, max {}] or not a multiple of \
                 node_unit {unit}",
                d.job,
                d.name,
                d.to_workers(),
                job.workers.min,
                job.workers.max
            )));
        }
    }
    let cluster = &snapshot.cluster;
    let models = gpu_models(&cluster.nodes);
    let mut gpus: BTreeMap<&str, u32> = BTreeMap::new();
    for d in plan.decisions.iter().filter(|d| d.to_workers() > 0) {
        let job = jobs[&d.job];
        if job.workers.gpus.is_zero() {
            continue;
        }
        let Some(model) = d.gpu_type.as_deref().filter(|m| models.contains_key(*m)) else {
            if d.starts() || d.to_workers() > d.from_workers() {
                return Err(PolicyError::InvalidAssignment(format!(
                    "{} ({}) starts or grows on GPU model {:?}, which no node has",
                    d.job, d.name, d.gpu_type
                )));
            }
            continue;
        };
        let held = if d.state == LiveState::Running {
            d.to_workers().max(job.workers.held)
        } else {
            d.to_workers()
        };
        *gpus.entry(model).or_default() += job.workers.gpus.devices_for(held);
    }
    if let Some((m, n)) = gpus.iter().find(|(m, n)| added && **n > models[**m].1) {
        return Err(PolicyError::InvalidAssignment(format!(
            "the round uses {n} {m} GPUs of {} while starting or growing a job",
            models[*m].1
        )));
    }
    let over = plan.cpu_millicores > cluster.cpu_millicores
        || plan.processes > cluster.max_processes
        || plan.memory_bytes > Caps::memory_of(cluster);
    if over && added {
        return Err(PolicyError::InvalidAssignment(format!(
            "the round uses {}m of {}m, {} of {} processes and {} bytes of memory of {} while \
             starting or growing a job",
            plan.cpu_millicores,
            cluster.cpu_millicores,
            plan.processes,
            cluster.max_processes,
            plan.memory_bytes,
            cluster.memory_bytes
        )));
    }
    Ok(())
}

/// What the sizes must fit in: CPU slots, processes, memory (`u64::MAX`: not counted).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Caps {
    pub slots: u64,
    pub processes: u32,
    pub memory: u64,
}

impl Caps {
    /// Memory `cluster` counts (all of it: not known).
    pub(super) fn memory_of(cluster: &LiveCluster) -> u64 {
        match cluster.memory_bytes {
            0 => u64::MAX,
            m => m,
        }
    }

    /// What is asked of these caps, as the reasons say it (memory only where counted).
    pub(super) fn asked(&self, slots: u64, processes: u32, memory: u64) -> String {
        let mut said = format!(
            "{slots} slots of {} and {processes} processes of {}",
            self.slots, self.processes
        );
        if self.memory != u64::MAX {
            said.push_str(&format!(
                " and {} of memory of {}",
                super::hold::memory_shown(memory),
                super::hold::memory_shown(self.memory)
            ));
        }
        said
    }
}

/// Withdraws what does not fit: admissions (newest first, made smaller down to their minimum,
/// then put off), then growth (largest first), then sizes above the minimum (largest first),
/// one node unit at a time, until the sizes fit once the processes leaving are gone.
///
/// The totals are kept as sizes change and each step's job comes from a heap (a round of
/// 10,000 jobs may take thousands of steps; summing and scanning every job at each one took
/// most of Optimus' round).
pub(super) fn repair(jobs: &mut [Sized], caps: Caps, notes: &mut Vec<String>) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let shrink = |s: &Sized| s.to.saturating_sub(s.job.workers.node_unit.max(1));
    // The three steps' candidates and their order (greatest first), as they stand now.
    let admission = |s: &Sized| {
        (!s.running() && s.to > 0).then_some((OrderedFloat(s.job.submitted_s), s.job.id))
    };
    // Growth a heuristic capped (pinned) is growth too: withdrawing it is always safe, and
    // keeping it let a round grow a job while over capacity on processes still leaving.
    let growth = |s: &Sized| {
        (s.running() && s.to > s.job.workers.count)
            .then(|| (s.to - s.job.workers.count, Reverse(s.job.id)))
    };
    let toward_min = |s: &Sized| {
        (s.running() && shrink(s) >= s.job.workers.min.max(1)).then_some((s.to, Reverse(s.job.id)))
    };
    fn heap<K: Ord>(jobs: &[Sized], key: impl Fn(&Sized) -> Option<K>) -> BinaryHeap<(K, usize)> {
        jobs.iter()
            .enumerate()
            .filter_map(|(i, s)| key(s).map(|k| (k, i)))
            .collect()
    }
    let mut firsts = heap(jobs, admission);
    let mut grown = heap(jobs, growth);
    let mut large = heap(jobs, toward_min);
    let amounts = |s: &Sized, n: u32| Amounts {
        slots: s.slots(n),
        procs: s.processes(n),
        memory: s.memory(n),
    };
    let counted = |s: &Sized| amounts(s, s.counted(s.to));
    let settled = |s: &Sized| amounts(s, s.to);
    let mut t = Totals::default();
    for s in jobs.iter() {
        t.add(counted(s), settled(s));
    }
    // Job `i` goes to size `to`, and the totals follow.
    let resize = |jobs: &mut [Sized], t: &mut Totals, i: usize, to: u32, why: String| {
        t.remove(counted(&jobs[i]), settled(&jobs[i]));
        jobs[i].to = to;
        jobs[i].reasons.push(why);
        t.add(counted(&jobs[i]), settled(&jobs[i]));
    };
    loop {
        if t.used.fits(caps) {
            return;
        }
        let asked = caps.asked(t.used.slots, t.used.procs, t.used.memory);
        let why = format!("withdrawn: {asked} asked");
        // A heap's top, if it still is a candidate at the key it was pushed with.
        fn top<K: Ord + Copy>(
            heap: &mut BinaryHeap<(K, usize)>,
            now: impl Fn(usize) -> Option<K>,
        ) -> Option<usize> {
            while let Some((k, i)) = heap.pop() {
                match now(i) {
                    Some(current) if current == k => return Some(i),
                    Some(current) => heap.push((current, i)),
                    None => {}
                }
            }
            None
        }
        if let Some(i) = top(&mut firsts, |i| admission(&jobs[i])) {
            let s = &jobs[i];
            let smaller = shrink(s);
            let (to, said) = if smaller >= s.job.workers.min.max(1) {
                (smaller, format!("starts smaller: {why}"))
            } else {
                (0, format!("start {why}"))
            };
            resize(jobs, &mut t, i, to, said);
            if let Some(k) = admission(&jobs[i]) {
                firsts.push((k, i));
            }
            if let Some(k) = toward_min(&jobs[i]) {
                large.push((k, i));
            }
            continue;
        }
        if let Some(i) = top(&mut grown, |i| growth(&jobs[i])) {
            let to = shrink(&jobs[i]).max(jobs[i].job.workers.count);
            resize(jobs, &mut t, i, to, format!("growth {why}"));
            if let Some(k) = growth(&jobs[i]) {
                grown.push((k, i));
            }
            if let Some(k) = toward_min(&jobs[i]) {
                large.push((k, i));
            }
            continue;
        }
        // Once every shrink is carried out: what is over beyond that is processes still
        // leaving (a shrink on its way, workers on a node lost not yet seen gone), which a
        // smaller size would not free.
        if t.held.fits(caps) {
            notes.push(format!(
                "{asked} held until the processes leaving exit; the sizes decided fit"
            ));
            return;
        }
        if let Some(i) = top(&mut large, |i| toward_min(&jobs[i])) {
            let to = shrink(&jobs[i]);
            resize(
                jobs,
                &mut t,
                i,
                to,
                format!("shrunk toward its minimum: {why}"),
            );
            if let Some(k) = toward_min(&jobs[i]) {
                large.push((k, i));
            }
            continue;
        }
        notes.push(format!(
            "over capacity even with every job at its minimum: {asked}"
        ));
        return;
    }
}

/// Slots, processes and memory of some sizes.
#[derive(Clone, Copy, Default)]
struct Amounts {
    slots: u64,
    procs: u32,
    memory: u64,
}

impl Amounts {
    fn fits(&self, caps: Caps) -> bool {
        self.slots <= caps.slots && self.procs <= caps.processes && self.memory <= caps.memory
    }
}

/// What the sizes take, counted as held (`used`: a running job's shrink not carried out yet
/// still holds its processes) and settled (`held`: once every shrink is).
#[derive(Clone, Copy, Default)]
struct Totals {
    used: Amounts,
    held: Amounts,
}

impl Totals {
    fn add(&mut self, used: Amounts, settled: Amounts) {
        self.used.slots += used.slots;
        self.used.procs += used.procs;
        self.used.memory += used.memory;
        self.held.slots += settled.slots;
        self.held.procs += settled.procs;
        self.held.memory += settled.memory;
    }

    fn remove(&mut self, used: Amounts, settled: Amounts) {
        self.used.slots -= used.slots;
        self.used.procs -= used.procs;
        self.used.memory -= used.memory;
        self.held.slots -= settled.slots;
        self.held.procs -= settled.procs;
        self.held.memory -= settled.memory;
    }
}
