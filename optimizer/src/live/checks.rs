//! What every round must hold: the repair step that withdraws what does not fit, and the
//! post-conditions checked before a round's plan is used.

use std::collections::BTreeMap;

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
        if d.to_workers > d.from_workers || d.to_ps > d.ps {
            added = true;
        }
        if let Some(m) = d.migrations.iter().find(|m| match m.key.role {
            Role::PS => m.key.index >= d.to_ps,
            Role::WORKER => m.key.index >= d.to_workers,
            // The brain sizes a job's ps and worker roles; it migrates no other.
            _ => true,
        }) {
            return Err(PolicyError::InvalidAssignment(format!(
                "{} ({}) migrates {}, which the decision does not keep",
                d.job, d.name, m.key
            )));
        }
        if d.to_workers == d.from_workers || d.to_workers == 0 {
            continue;
        }
        let unit = job.node_unit.max(1);
        if d.to_workers < job.min_workers
            || d.to_workers > job.max_workers
            || d.to_workers % unit != 0
        {
            return Err(PolicyError::InvalidAssignment(format!(
                "{} ({}) sized to {} workers, outside [min {}, max {}] or not a multiple of \
                 node_unit {unit}",
                d.job, d.name, d.to_workers, job.min_workers, job.max_workers
            )));
        }
    }
    let cluster = &snapshot.cluster;
    let models = gpu_models(&cluster.nodes);
    let mut gpus: BTreeMap<&str, u32> = BTreeMap::new();
    for d in plan.decisions.iter().filter(|d| d.to_workers > 0) {
        let job = jobs[&d.job];
        if job.worker_gpus.is_zero() {
            continue;
        }
        let Some(model) = d.gpu_type.as_deref().filter(|m| models.contains_key(*m)) else {
            if d.starts() || d.to_workers > d.from_workers {
                return Err(PolicyError::InvalidAssignment(format!(
                    "{} ({}) starts or grows on GPU model {:?}, which no node has",
                    d.job, d.name, d.gpu_type
                )));
            }
            continue;
        };
        let held = if d.state == LiveState::Running {
            d.to_workers.max(job.held_workers)
        } else {
            d.to_workers
        };
        *gpus.entry(model).or_default() += job.worker_gpus.devices_for(held);
    }
    if let Some((m, n)) = gpus.iter().find(|(m, n)| added && **n > models[**m].1) {
        return Err(PolicyError::InvalidAssignment(format!(
            "the round uses {n} {m} GPUs of {} while starting or growing a job",
            models[*m].1
        )));
    }
    let over =
        plan.cpu_millicores > cluster.cpu_millicores || plan.processes > cluster.max_processes;
    if over && added {
        return Err(PolicyError::InvalidAssignment(format!(
            "the round uses {}m of {}m and {} of {} processes while starting or growing a job",
            plan.cpu_millicores, cluster.cpu_millicores, plan.processes, cluster.max_processes
        )));
    }
    Ok(())
}

/// Withdraws what does not fit: admissions (newest first, made smaller down to their minimum,
/// then put off), then growth (largest first), then sizes above the minimum (largest first),
/// one node unit at a time, until the sizes fit once the processes leaving are gone.
pub(super) fn repair(jobs: &mut [Sized], slots: u64, max_processes: u32, notes: &mut Vec<String>) {
    let shrink = |s: &Sized| s.to.saturating_sub(s.job.node_unit.max(1));
    loop {
        let used: u64 = jobs.iter().map(|s| s.slots(s.counted(s.to))).sum();
        let procs: u32 = jobs.iter().map(|s| s.processes(s.counted(s.to))).sum();
        if used <= slots && procs <= max_processes {
            return;
        }
        let why = format!(
            "withdrawn: {used} slots of {slots} and {procs} processes of {max_processes} asked"
        );
        if let Some(s) = jobs
            .iter_mut()
            .filter(|s| !s.running() && s.to > 0)
            .max_by(|a, b| {
                a.job
                    .submitted_s
                    .total_cmp(&b.job.submitted_s)
                    .then(a.job.id.cmp(&b.job.id))
            })
        {
            let smaller = shrink(s);
            if smaller >= s.job.min_workers.max(1) {
                s.to = smaller;
                s.reasons.push(format!("starts smaller: {why}"));
            } else {
                s.to = 0;
                s.reasons.push(format!("start {why}"));
            }
            continue;
        }
        if let Some(s) = jobs
            .iter_mut()
            .filter(|s| s.running() && !s.pinned && s.to > s.job.workers)
            .max_by_key(|s| (s.to - s.job.workers, std::cmp::Reverse(s.job.id)))
        {
            s.to = shrink(s).max(s.job.workers);
            s.reasons.push(format!("growth {why}"));
            continue;
        }
        // Once every shrink is carried out: what is over beyond that is processes still
        // leaving (a shrink on its way, workers on a node lost not yet seen gone), which a
        // smaller size would not free.
        let settled: u64 = jobs.iter().map(|s| s.slots(s.to)).sum();
        let settled_procs: u32 = jobs.iter().map(|s| s.processes(s.to)).sum();
        if settled <= slots && settled_procs <= max_processes {
            notes.push(format!(
                "{used} slots of {slots} and {procs} processes of {max_processes} held until the \
                 processes leaving exit; the sizes decided fit"
            ));
            return;
        }
        if let Some(s) = jobs
            .iter_mut()
            .filter(|s| s.running() && shrink(s) >= s.job.min_workers.max(1))
            .max_by_key(|s| (s.to, std::cmp::Reverse(s.job.id)))
        {
            s.to = shrink(s);
            s.reasons.push(format!("shrunk toward its minimum: {why}"));
            continue;
        }
        notes.push(format!(
            "over capacity even with every job at its minimum: {used} slots of {slots}, {procs} \
             processes of {max_processes}"
        ));
        return;
    }
}
