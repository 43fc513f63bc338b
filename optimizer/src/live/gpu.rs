//! GPU jobs in the live round: jobs whose workers ask for GPUs are planned on the cluster's GPU
//! nodes, by GPU model, with the same [`Scheduler`] the what-if simulator runs on GPU types.
//!
//! A scheduling unit is one GPU and a worker type is a GPU model: each node with GPUs is a
//! [`NodeView`] of its model, and a job of `g` GPUs per worker has goodput
//! `speed(⌊r/g⌋ workers)` on `r` GPUs of a model it may run on (the one it asked for, the one it
//! runs on, or any when it named none) and 0 on the others. A worker asking for a share of a
//! device (`g` < 1) packs `⌊1/g⌋` of the job's workers onto each GPU the job is given: a GPU
//! is shared by one job's processes, never by two jobs, so a job's speed never depends on
//! another's load on its devices. A running job stays on its model
//! (changing it would move every worker); a queued one starts on the model the scheduler picks.
//!
//! What the scheduler returns is then made to hold on the real nodes: every worker's `g` GPUs
//! on one node (best fit, running jobs first), every job's CPU (its PS and workers, in slots)
//! out of the CPU pool the CPU jobs share, and the process cap. What does not fit is withdrawn
//! as in the CPU jobs' repair: admissions newest first, then growth, then running jobs
//! above their minimum (a job on a node that was lost shrinks to what the nodes left hold).
//! Where the platform reports each node's free room (`nodes.rs`), the jobs' new processes
//! must also fit on it, each whole on one node with its GPUs and its CPU and memory, placed as
//! the job master places them; a start that does not fit starts smaller or waits, a growth
//! is cut, with the reason and the nodes' room (`gpu/on_nodes.rs`), and the scheduler runs
//! again with the jobs cut held there, so the GPUs they could not use go to other jobs.
//! The heuristics (PS count, resources) correct CPU jobs only.

mod models;
mod on_nodes;
mod passes;

pub(super) use models::cluster_gpus;
pub use models::{ANY_MODEL, LiveNode, gpu_models, unplaceable};
use passes::NodeCap;
pub(super) use passes::plan_gpu_jobs;

use super::nodes::Free;
use super::*;
use crate::schedule::Slots;
use on_nodes::{elsewhere, on_nodes};
use vocab::Gpus;

/// One GPU job while the round sizes it.
struct Gpu<'a> {
    job: &'a LiveJob,
    model: AmdahlModel,
    /// Held at what the nodes' free room held in an earlier pass, if it was cut there.
    cap: Option<&'a NodeCap>,
    /// GPUs per worker (whole, or a share of one device).
    g: Gpus,
    /// Per GPU model (index into the round's models): whether the job may run on it.
    allowed: Vec<bool>,
    /// The model it runs on (running) or was given (starting).
    on: Option<usize>,
    to: u32,
    pinned: bool,
    /// Its workers no longer all fit on its model's nodes (a node was lost): it is counted at
    /// its new size at once, since what it held there is gone.
    lost: bool,
    ps_slots: u64,
    worker_slots: u64,
    reasons: Vec<String>,
    placement: Vec<(usize, u32)>,
}

impl Gpu<'_> {
    fn running(&self) -> bool {
        self.job.state == LiveState::Running
    }
    /// Workers counted against capacity at size `to`: a running job keeps what it holds until
    /// a shrink is carried out.
    fn counted(&self, to: u32) -> u32 {
        if self.running() && !self.lost {
            to.max(self.job.workers.held)
        } else {
            to
        }
    }
    fn active(&self) -> bool {
        self.running() || self.to > 0
    }
    fn cpu_slots(&self) -> u64 {
        if self.active() {
            self.ps_slots + self.counted(self.to) as u64 * self.worker_slots
        } else {
            0
        }
    }
    fn processes(&self) -> u32 {
        if self.active() {
            self.job.ps.count + self.counted(self.to)
        } else {
            0
        }
    }
    /// Memory its processes ask for (as their roles ask).
    fn memory(&self) -> u64 {
        if self.active() {
            self.job.ps.count as u64 * self.job.ps.memory_bytes
                + self.counted(self.to) as u64 * self.job.workers.memory_bytes
        } else {
            0
        }
    }
    /// The most workers the scheduler may give it: its maximum, or what the nodes' room held.
    fn max_workers(&self) -> u32 {
        self.cap.map_or(self.job.workers.max, |c| {
            c.workers.min(self.job.workers.max)
        })
    }
    fn workers_in(&self, gpus: u32) -> u32 {
        let unit = self.job.workers.node_unit.max(1);
        let w = (self.g.fit_in(gpus) / unit * unit).min(self.max_workers());
        if w < self.job.workers.min.max(1) {
            0
        } else {
            w
        }
    }
    fn shrink(&self) -> u32 {
        self.to.saturating_sub(self.job.workers.node_unit.max(1))
    }
}

/// The GPU jobs' decisions, by their index in the snapshot, and what they use of the CPU pool
/// (slots), of the process cap and of the memory.
pub(super) struct GpuRound {
    pub decisions: Vec<(usize, Decision)>,
    pub cpu_slots: u64,
    pub processes: u32,
    pub memory: u64,
    /// The nodes' free room once the GPU jobs' new processes are placed on it (none: the
    /// cluster reports no nodes).
    pub free: Option<Free>,
}

/// One pass of [`plan_gpu_jobs`], the jobs in `capped` given at most their workers there;
/// the round, and the jobs the nodes' free room cut in this pass.
#[allow(clippy::too_many_arguments)]
fn plan_pass(
    gpu_jobs: &[(usize, &LiveJob)],
    cluster: &LiveCluster,
    (scheduler, config): (&dyn Scheduler, &LiveConfig),
    (now, prior): (f64, f64),
    caps: super::Caps,
    mut free: Option<Free>,
    notes: &mut Vec<String>,
    capped: &BTreeMap<JobId, NodeCap>,
) -> Result<(GpuRound, Vec<(JobId, NodeCap)>), PolicyError> {
    let mut cuts = Vec::new();
    if gpu_jobs.is_empty() {
        return Ok((
            GpuRound {
                decisions: Vec::new(),
                cpu_slots: 0,
                processes: 0,
                memory: 0,
                free,
            },
            cuts,
        ));
    }
    let nodes: Vec<LiveNode> = cluster
        .nodes
        .iter()
        .filter(|n| n.gpus > 0)
        .cloned()
        .collect();
    let models: Vec<String> = gpu_models(&nodes).into_keys().collect();
    let model_of: Vec<usize> = nodes
        .iter()
        .map(|n| {
            models
                .iter()
                .position(|m| *m == n.gpu_type)
                .expect("listed")
        })
        .collect();
    let index_of = |t: &str| models.iter().position(|m| m == t);
    let slot = cluster.slot_millicores;

    let mut jobs: Vec<Gpu> = gpu_jobs
        .iter()
        .map(|&(_, job)| {
            let mut reasons = Vec::new();
            let model = speed_model(AmdahlModel::fit(&job.speed).ok(), prior, &mut reasons);
            let wanted = job.workers.gpu_type.as_deref();
            let allowed = models
                .iter()
                .map(|m| wanted.is_none_or(|w| w == m))
                .collect();
            let on = match (job.state, wanted) {
                (LiveState::Running, Some(w)) => index_of(w),
                (LiveState::Running, None) => (models.len() == 1).then_some(0),
                (LiveState::Queued, _) => None,
            };
            Gpu {
                job,
                model,
                cap: capped.get(&job.id),
                g: job.workers.gpus.max(Gpus::from_milli(1)),
                allowed,
                on,
                to: 0,
                pinned: false,
                lost: false,
                ps_slots: job.ps.count as u64 * slots_of(job.ps.millicores, slot) as u64,
                worker_slots: slots_of(job.workers.millicores, slot) as u64,
                reasons,
                placement: Vec::new(),
            }
        })
        .collect();

    // Where the running jobs are now, as the round would place them at their sizes.
    for j in jobs.iter_mut().filter(|j| j.running()) {
        j.to = j.job.workers.count;
    }
    let (current, short) = pack(&nodes, &model_of, &jobs);
    for (i, placed) in short {
        let j = &jobs[i];
        notes.push(format!(
            "{} ({}): {placed} of its {} workers fit on the {} nodes now",
            j.job.id,
            j.job.name,
            j.counted(j.to),
            model_name_of(&models, j.on)
        ));
    }
    for j in &mut jobs {
        j.to = 0;
    }

    let total_gpus: u32 = nodes.iter().map(|n| n.gpus).sum();
    let views: Vec<JobView> = jobs
        .iter()
        .zip(&current)
        .map(|(j, here)| {
            let job = j.job;
            let max = j.g.devices_for(j.max_workers()).min(total_gpus);
            let goodput: Vec<Vec<f64>> = j
                .allowed
                .iter()
                .map(|&ok| {
                    (0..=max)
                        .map(|r| match j.workers_in(r) {
                            w if ok && w > 0 => j.model.samples_per_s(w),
                            _ => 0.0,
                        })
                        .collect()
                })
                .collect();
            let held: u32 = here.iter().map(|x| x.1).sum();
            JobView {
                id: job.id,
                submitted_s: job.submitted_s,
                requested_replicas: j
                    .g
                    .devices_for(job.workers.count.max(job.workers.min))
                    .min(max),
                max_replicas: max,
                attained_gpu_s: job.running_s * held as f64,
                running_s: job.running_s,
                restarts: job.restarts,
                peak_replicas: j.g.devices_for(job.workers.peak.max(job.workers.count)),
                last_change_s: job.last_change_s,
                current: here.clone(),
                goodput: Arc::from(goodput),
                remaining: job.samples_left.max(0.0),
            }
        })
        .collect();
    let assignment = if nodes.is_empty() {
        notes.push("the cluster has no GPUs: GPU jobs wait, running ones keep their size".into());
        BTreeMap::new()
    } else {
        let mut sorted = views;
        sorted.sort_by(|a, b| {
            a.submitted_s
                .total_cmp(&b.submitted_s)
                .then(a.id.cmp(&b.id))
        });
        scheduler.schedule(&Snapshot {
            now_s: now,
            worker_types: models.iter().cloned().map(WorkerType).collect(),
            nodes: nodes
                .iter()
                .zip(&model_of)
                .map(|(n, &t)| NodeView {
                    worker_type: t,
                    gpus: n.gpus,
                })
                .collect(),
            jobs: sorted,
        })?
    };

    for j in &mut jobs {
        let slots = assignment.get(&j.job.id).cloned().unwrap_or_default();
        let given: u32 = slots.iter().map(|x| x.1).sum();
        let given_on = slots.first().and_then(|(n, _)| model_of.get(*n).copied());
        let fit = match given_on {
            Some(t) if j.allowed[t] && j.on.is_none_or(|on| on == t) => j.workers_in(given),
            _ => 0,
        };
        let cooling = j
            .job
            .last_change_s
            .map(|t| t + config.cooldown_s - now)
            .filter(|left| *left > 0.0);
        let name = scheduler.name();
        match j.job.state {
            LiveState::Running => {
                j.to = j.job.workers.count;
                if let Some(left) = cooling.filter(|_| fit != j.job.workers.count) {
                    j.pinned = true;
                    j.reasons.push(format!(
                        "{name} would give {fit} workers; kept at {} for {left:.0} s more of \
                         cool-down",
                        j.job.workers.count
                    ));
                } else if fit == 0 {
                    j.pinned = true;
                    j.reasons.push(format!(
                        "{name} gives it {given} GPUs, below its minimum; a running job keeps \
                         its size"
                    ));
                } else {
                    j.to = fit;
                    j.reasons.push(format!(
                        "{name} gives it {given} {} GPUs: {fit} workers of {} GPUs",
                        model_name_of(&models, j.on),
                        j.g
                    ));
                }
            }
            LiveState::Queued => {
                j.to = fit;
                if fit > 0 {
                    j.on = given_on;
                    j.reasons.push(format!(
                        "{name} starts it on {given} {} GPUs: {fit} workers of {} GPUs \
                         (predicted {})",
                        model_name_of(&models, given_on),
                        j.g,
                        j.job.workers.count
                    ));
                } else if j.cap.is_none_or(|c| c.workers > 0) {
                    // (Held at none by the nodes' room: that reason, kept, says why.)
                    j.reasons.push(format!(
                        "waits: {name} gives it {given} GPUs, fewer than its minimum of {} \
                         workers of {} GPUs need",
                        j.job.workers.min, j.g
                    ));
                }
            }
        }
    }

    // Make it hold on the nodes, the CPU pool and the process cap.
    // Set only where the nodes' room holds it all, right before the loop ends.
    let mut named = BTreeMap::new();
    loop {
        let (placed, short) = pack(&nodes, &model_of, &jobs);
        let cpu: u64 = jobs.iter().map(Gpu::cpu_slots).sum();
        let procs: u32 = jobs.iter().map(Gpu::processes).sum();
        let memory: u64 = jobs.iter().map(Gpu::memory).sum();
        if short.is_empty() && cpu <= caps.slots && procs <= caps.processes && memory <= caps.memory
        {
            if let Some(room) = &free {
                match on_nodes(&jobs, &models, room) {
                    Ok((left, on)) => (free, named) = (Some(left), on),
                    Err(cut) => {
                        if cut.fits > 0
                            || !elsewhere(&mut jobs, cut.job, &nodes, &model_of, &models, room)
                        {
                            let j = &mut jobs[cut.job];
                            cut.apply(j);
                            let reason = j.reasons.last().cloned().unwrap_or_default();
                            let cap = NodeCap {
                                workers: j.to,
                                reason,
                            };
                            cuts.push((j.job.id, cap));
                        }
                        continue;
                    }
                }
            }
            for (j, here) in jobs.iter_mut().zip(placed) {
                j.placement = here;
            }
            break;
        }
        let stuck = short.first().map(|s| s.0);
        let why = match stuck {
            Some(i) => format!(
                "withdrawn: the workers of {} GPUs each{} do not all fit on the {} nodes",
                jobs[i].g,
                super::gpu_place::roles_with_gpus(jobs[i].job),
                model_name_of(&models, jobs[i].on)
            ),
            None => format!("withdrawn: {} asked", caps.asked(cpu, procs, memory)),
        };
        let same_model = |j: &Gpu| stuck.is_none_or(|i| j.on == jobs[i].on);
        let pick = jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| !j.running() && j.to > 0 && same_model(j))
            .max_by(|a, b| {
                a.1.job
                    .submitted_s
                    .total_cmp(&b.1.job.submitted_s)
                    .then(a.1.job.id.cmp(&b.1.job.id))
            })
            .map(|(i, _)| (i, "start"))
            .or_else(|| {
                jobs.iter()
                    .enumerate()
                    .filter(|(_, j)| j.running() && j.to > j.job.workers.count && same_model(j))
                    .max_by_key(|(_, j)| (j.to - j.job.workers.count, std::cmp::Reverse(j.job.id)))
                    .map(|(i, _)| (i, "growth"))
            })
            .or_else(|| {
                // A running job whose workers no longer fit: down to what its nodes hold.
                let (i, placed) = *short.first()?;
                let j = &jobs[i];
                let unit = j.job.workers.node_unit.max(1);
                let fits = (placed / unit * unit).max(j.job.workers.min.max(1));
                (j.running() && (!j.lost || fits < j.to)).then_some((i, "lost"))
            })
            .or_else(|| {
                jobs.iter()
                    .enumerate()
                    .filter(|(_, j)| {
                        j.running() && j.shrink() >= j.job.workers.min.max(1) && same_model(j)
                    })
                    .max_by_key(|(_, j)| (j.to, std::cmp::Reverse(j.job.id)))
                    .map(|(i, _)| (i, "size"))
            });
        let Some((i, what)) = pick else {
            notes.push(format!(
                "GPU jobs over capacity even at their minimum sizes ({why}); they keep them"
            ));
            for (j, here) in jobs.iter_mut().zip(placed) {
                j.placement = here;
            }
            break;
        };
        if what == "lost" {
            let placed = short.first().map_or(0, |s| s.1);
            let j = &mut jobs[i];
            let unit = j.job.workers.node_unit.max(1);
            j.lost = true;
            j.to = (placed / unit * unit).max(j.job.workers.min.max(1));
            j.reasons.push(format!(
                "{placed} of its workers fit on the {} nodes left: shrunk to {}",
                model_name_of(&models, j.on),
                j.to
            ));
            continue;
        }
        let j = &mut jobs[i];
        let smaller = j.shrink();
        if what == "start" && smaller < j.job.workers.min.max(1) {
            j.to = 0;
            j.on = None;
            j.reasons.push(format!("start {why}"));
        } else {
            j.to = if what == "growth" {
                smaller.max(j.job.workers.count)
            } else {
                smaller
            };
            // A running job that shrinks no longer holds what it gives up.
            j.reasons.push(format!(
                "{} {why}",
                match what {
                    "start" => "starts smaller:",
                    "growth" => "growth",
                    _ => "shrunk toward its minimum:",
                }
            ));
        }
    }

    let mut cpu = 0;
    let mut processes = 0;
    let mut memory = 0;
    let decisions = jobs
        .into_iter()
        .zip(gpu_jobs)
        .enumerate()
        .map(|(i, (j, &(at, job)))| {
            cpu += j.cpu_slots();
            processes += j.processes();
            memory += j.memory();
            let from = match job.state {
                LiveState::Running => job.workers.count,
                LiveState::Queued => 0,
            };
            let predicted = j.model.samples_per_s(j.to);
            let mut reasons = j.reasons;
            if let Some(cap) = j.cap {
                reasons.push(cap.reason.clone());
            }
            if !j.placement.is_empty() {
                let list: Vec<String> = j
                    .placement
                    .iter()
                    .map(|(n, k)| format!("{} ×{k}", nodes[*n].name))
                    .collect();
                reasons.push(format!("its GPUs fit on {}", list.join(", ")));
            }
            if from != j.to && from > 0 {
                reasons.push(format!(
                    "predicted {:.0} -> {predicted:.0} samples/s",
                    j.model.samples_per_s(from)
                ));
            }
            let decision = Decision {
                predicted_samples_per_s: predicted,
                reasons,
                gpu_type: j
                    .on
                    .map(|t| models[t].clone())
                    .or(job.workers.gpu_type.clone()),
                gpu_placement: j
                    .placement
                    .iter()
                    .map(|(n, k)| (nodes[*n].name.clone(), *k))
                    .collect(),
                // Where the nodes' room placed a growth's workers, or a start's processes.
                nodes: named.remove(&i).unwrap_or_default(),
                ..Decision::sizing(
                    job.id,
                    &job.name,
                    job.state,
                    (from, j.to),
                    (job.ps.count, job.ps.count),
                )
            };
            (at, decision)
        })
        .collect();
    Ok((
        GpuRound {
            decisions,
            cpu_slots: cpu,
            processes,
            memory,
            free,
        },
        cuts,
    ))
}

fn model_name_of(models: &[String], t: Option<usize>) -> &str {
    t.map_or(ANY_MODEL, |t| models[t].as_str())
}

/// Places every active job's counted workers on the nodes of its model, running jobs first,
/// each worker (or each GPU of workers sharing one) on the node with the fewest free GPUs that
/// hold it. Per job its placement (node, GPUs), and the jobs some of whose workers fit nowhere
/// (job, workers placed).
fn pack(nodes: &[LiveNode], model_of: &[usize], jobs: &[Gpu]) -> (Vec<Slots>, Vec<(usize, u32)>) {
    let mut free: Vec<u32> = nodes.iter().map(|n| n.gpus).collect();
    let mut out = vec![Vec::new(); jobs.len()];
    let mut short = Vec::new();
    let mut order: Vec<usize> = (0..jobs.len()).filter(|&i| jobs[i].active()).collect();
    order.sort_by_key(|&i| (!jobs[i].running(), jobs[i].job.id));
    for i in order {
        let j = &jobs[i];
        let Some(m) = j.on else { continue };
        let mut here: BTreeMap<usize, u32> = BTreeMap::new();
        let want = j.counted(j.to);
        let placed = super::gpu_place::place(&mut free, &mut here, nodes, model_of, m, j.g, want);
        if placed < want {
            short.push((i, placed));
        } else if !j.running() {
            // A start: its roles' processes with GPUs of their own must find them too (a
            // running job's roles hold theirs already, outside the round).
            for r in j.job.roles.iter().filter(|r| !r.gpus.is_zero()) {
                if super::gpu_place::place(
                    &mut free, &mut here, nodes, model_of, m, r.gpus, r.count,
                ) < r.count
                {
                    short.push((i, placed));
                    break;
                }
            }
        }
        out[i] = here.into_iter().collect();
    }
    (out, short)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::tests::{cluster, config, decision, elastic, job, none};

    fn node(name: &str, gpus: u32, model: &str) -> LiveNode {
        LiveNode {
            name: name.into(),
            gpus,
            gpu_type: model.into(),
        }
    }

    /// 16 CPUs and the CI harness's GPU nodes: a V100 node of 2, an A100 node of 4.
    fn two_models() -> LiveCluster {
        LiveCluster {
            nodes: vec![
                node("cpu", 0, ""),
                node("v", 2, "V100"),
                node("a", 4, "A100"),
            ],
            ..cluster(16)
        }
    }

    fn gpu_job(id: u64, state: LiveState, workers: u32, gpus: u32, model: Option<&str>) -> LiveJob {
        share_job(id, state, workers, Gpus::whole(gpus), model)
    }

    fn share_job(
        id: u64,
        state: LiveState,
        workers: u32,
        gpus: Gpus,
        model: Option<&str>,
    ) -> LiveJob {
        let mut job = job(
            id,
            state,
            workers,
            &[(workers.max(1), 100.0 * workers.max(1) as f64)],
        );
        job.workers.gpus = gpus;
        job.workers.gpu_type = model.map(str::to_string);
        job.workers.max = 4;
        job
    }

    fn round(snap: &LiveSnapshot) -> RoundPlan {
        plan_round(snap, elastic().scheduler(), &config(), &none()).unwrap()
    }

    #[test]
    fn a_start_finds_gpus_for_its_roles_too_or_waits() {
        // One node of 4 A100s. Job 1: 2 workers of 1 GPU and 2 rollout engines of 1 GPU each;
        // job 2, later: 2 workers of 1 GPU. Job 1 takes all 4 GPUs; job 2 waits.
        let with_roles = |gpus: Gpus| {
            let mut j = gpu_job(1, LiveState::Queued, 2, 1, Some("A100"));
            j.workers.max = 2;
            let mut r = crate::live::tests::rollout(2, 0.0, 0.0);
            (r.gpus, r.rate) = (gpus, None);
            j.roles = vec![r];
            j
        };
        let snap = |gpus: Gpus| {
            let mut later = gpu_job(2, LiveState::Queued, 2, 1, Some("A100"));
            later.workers.max = 2;
            LiveSnapshot {
                now_s: 100.0,
                cluster: LiveCluster {
                    nodes: vec![node("a", 4, "A100")],
                    ..cluster(16)
                },
                jobs: vec![with_roles(gpus), later],
            }
        };
        let plan = round(&snap(Gpus::ONE));
        let (a, b) = (decision(&plan, 1), decision(&plan, 2));
        assert_eq!(a.to_workers(), 2, "{a:?}");
        assert_eq!(a.gpu_placement, vec![("a".to_string(), 4)], "{a:?}");
        assert_eq!(b.to_workers(), 0, "{b:?}");
        assert!(
            b.reasons.iter().any(|r| r.contains("start withdrawn")),
            "{b:?}"
        );
        // Engines that share a device (0.5 each) take one GPU between them: on 5, both start.
        let mut s = snap(Gpus::from_milli(500));
        s.cluster.nodes = vec![node("a", 5, "A100")];
        let plan = round(&s);
        assert_eq!(decision(&plan, 1).to_workers(), 2, "{plan:?}");
        assert_eq!(decision(&plan, 2).to_workers(), 2, "{plan:?}");
        // Roles without GPUs of their own: both start on 4.
        let plan = round(&snap(Gpus::ZERO));
        assert_eq!(decision(&plan, 1).to_workers(), 2, "{plan:?}");
        assert_eq!(decision(&plan, 2).to_workers(), 2, "{plan:?}");
        // One engine too many for the node: job 1 starts smaller, or not at all, never
        // without its engines' GPUs.
        let mut big = snap(Gpus::whole(2));
        big.jobs.truncate(1);
        let plan = round(&big);
        let a = decision(&plan, 1);
        assert_eq!(a.to_workers(), 0, "{a:?}");
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("and its roles' (rollout ×2 of 2 GPUs) do not all fit")),
            "{a:?}"
        );
    }

    #[test]
    fn a_cpu_job_starts_only_where_its_roles_gpus_are_left() {
        // A running GPU job holds `held` of the node's 4 A100s; a queued CPU job (2 workers)
        // has a reward role of 2 processes with 1 GPU each.
        let snap = |held: u32| {
            let mut running = gpu_job(1, LiveState::Running, held, 1, Some("A100"));
            (running.workers.min, running.workers.max) = (held, held);
            let mut cpu_job = job(2, LiveState::Queued, 2, &[]);
            cpu_job.workers.max = 2;
            let mut reward = crate::live::tests::rollout(2, 0.0, 0.0);
            reward.role = "reward".parse().unwrap();
            (reward.gpus, reward.rate) = (Gpus::ONE, None);
            cpu_job.roles = vec![reward];
            LiveSnapshot {
                now_s: 100.0,
                cluster: LiveCluster {
                    nodes: vec![node("a", 4, "A100")],
                    ..cluster(16)
                },
                jobs: vec![running, cpu_job],
            }
        };
        let plan = round(&snap(2));
        assert_eq!(decision(&plan, 2).to_workers(), 2, "{plan:?}");
        let plan = round(&snap(3));
        let d = decision(&plan, 2);
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r
                == "waits: its roles' GPUs (reward ×2 of 1 GPUs) do not fit on the GPUs the round leaves"),
            "{d:?}"
        );
        // What it would have used of the CPU pool is not counted.
        assert_eq!(plan.processes, 3, "{plan:?}");
    }

    #[test]
    fn gpu_jobs_start_on_the_model_they_ask_for_and_fit_its_nodes() {
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: two_models(),
            jobs: vec![
                gpu_job(1, LiveState::Queued, 4, 1, Some("A100")),
                gpu_job(2, LiveState::Queued, 2, 1, Some("V100")),
                gpu_job(3, LiveState::Queued, 2, 1, Some("H100")),
            ],
        };
        let plan = round(&snap);
        let a = decision(&plan, 1);
        assert_eq!(
            (a.to_workers(), a.gpu_type.as_deref()),
            (4, Some("A100")),
            "{a:?}"
        );
        assert_eq!(a.gpu_placement, vec![("a".to_string(), 4)]);
        let v = decision(&plan, 2);
        assert_eq!(
            (v.to_workers(), v.gpu_type.as_deref()),
            (2, Some("V100")),
            "{v:?}"
        );
        assert_eq!(v.gpu_placement, vec![("v".to_string(), 2)]);
        let h = decision(&plan, 3);
        assert_eq!(h.to_workers(), 0, "no H100 node: it waits: {h:?}");
        assert!(h.gpu_placement.is_empty());
        // Their workers' CPU comes out of the pool: 6 workers of one slot.
        assert_eq!(plan.cpu_millicores, 6000);
    }

    #[test]
    fn a_job_of_any_model_takes_what_is_free_and_a_running_one_stays_on_its_model() {
        let mut running = gpu_job(1, LiveState::Running, 2, 1, Some("V100"));
        running.workers.max = 8;
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: two_models(),
            jobs: vec![running, gpu_job(2, LiveState::Queued, 2, 1, None)],
        };
        let plan = round(&snap);
        let r = decision(&plan, 1);
        assert_eq!(r.gpu_type.as_deref(), Some("V100"));
        assert!(r.to_workers() <= 2, "only 2 V100s exist: {r:?}");
        let q = decision(&plan, 2);
        assert_eq!(q.gpu_type.as_deref(), Some("A100"), "{q:?}");
        assert!(q.to_workers() >= 2, "{q:?}");
    }

    #[test]
    fn workers_of_several_gpus_are_whole_on_one_node() {
        // Two nodes of 3 GPUs: 6 GPUs in all, but a worker of 2 fits once per node.
        let c = LiveCluster {
            nodes: vec![node("x", 3, "A100"), node("y", 3, "A100")],
            ..cluster(16)
        };
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: c,
            jobs: vec![gpu_job(1, LiveState::Queued, 3, 2, None)],
        };
        let plan = round(&snap);
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 2, "{d:?}");
        assert_eq!(
            d.gpu_placement,
            vec![("x".to_string(), 2), ("y".to_string(), 2)]
        );
    }

    #[test]
    fn a_running_job_whose_node_was_lost_shrinks_to_what_is_left() {
        let mut j = gpu_job(1, LiveState::Running, 4, 1, Some("A100"));
        j.workers.held = 4;
        j.last_change_s = Some(99.0); // in cool-down: kept unless it cannot be
        let c = LiveCluster {
            nodes: vec![node("a1", 2, "A100")], // a second node of 2 was lost
            ..cluster(16)
        };
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: c,
            jobs: vec![j],
        };
        let plan = round(&snap);
        let d = decision(&plan, 1);
        assert_eq!((d.from_workers(), d.to_workers()), (4, 2), "{d:?}");
        assert!(d.reasons.iter().any(|r| r.contains("nodes left")), "{d:?}");
    }

    #[test]
    fn workers_with_a_share_of_a_gpu_pack_onto_the_devices_their_job_is_given() {
        // 0.5 GPU per worker: the V100 node's 2 GPUs hold 4 workers; a 0.4 job gets 2 a GPU.
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                nodes: vec![node("v", 2, "V100")],
                ..cluster(16)
            },
            jobs: vec![share_job(
                1,
                LiveState::Queued,
                4,
                Gpus::from_milli(500),
                Some("V100"),
            )],
        };
        let plan = round(&snap);
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 4, "{d:?}");
        assert_eq!(d.gpu_placement, vec![("v".to_string(), 2)], "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|r| r.contains("4 workers of 0.5 GPUs")),
            "{d:?}"
        );
        // Two such jobs: a GPU is never shared between jobs, so they get one node's 2 each.
        let mut two = snap.clone();
        two.cluster.nodes = vec![node("v", 2, "V100"), node("w", 2, "V100")];
        two.jobs.push(share_job(
            2,
            LiveState::Queued,
            3,
            Gpus::from_milli(400),
            None,
        ));
        let plan = round(&two);
        let (a, b) = (decision(&plan, 1), decision(&plan, 2));
        let used: u32 = [a, b]
            .iter()
            .flat_map(|d| d.gpu_placement.iter().map(|p| p.1))
            .sum();
        assert!(used <= 4, "{plan:?}");
        // 3 or 4 workers of 0.4 (the round may grow it to its max): 2 to a GPU.
        assert!(b.to_workers() >= 3, "{b:?}");
        assert_eq!(b.gpu_placement.iter().map(|p| p.1).sum::<u32>(), 2, "{b:?}");
    }

    #[test]
    fn cpu_jobs_get_the_cpu_gpu_jobs_leave() {
        let mut cpu_job = job(2, LiveState::Queued, 8, &[]);
        cpu_job.workers.max = 16;
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                nodes: vec![node("a", 4, "A100")],
                ..cluster(6)
            },
            jobs: vec![gpu_job(1, LiveState::Queued, 4, 1, None), cpu_job],
        };
        let mut with_memory = snap.clone();
        let plan = round(&snap);
        assert_eq!(decision(&plan, 1).to_workers(), 4);
        assert!(decision(&plan, 2).to_workers() <= 2, "{plan:?}");
        assert!(plan.cpu_millicores <= 6000, "{plan:?}");
        // Memory not counted stays so for the CPU jobs (their reasons do not name it).
        let said = |plan: &RoundPlan| {
            plan.decisions
                .iter()
                .flat_map(|d| d.reasons.iter())
                .any(|r| r.contains("of memory"))
        };
        assert!(!said(&plan), "{plan:?}");
        // Counted: the GPU job's 4 workers of 1 GiB take 4 of 5 GiB, and the CPU job's of
        // 1 GiB start with one.
        with_memory.cluster.memory_bytes = 5 << 30;
        for j in &mut with_memory.jobs {
            j.workers.memory_bytes = 1 << 30;
            j.workers.min = 1;
        }
        let plan = round(&with_memory);
        assert_eq!(decision(&plan, 1).to_workers(), 4);
        assert_eq!(decision(&plan, 2).to_workers(), 1, "{plan:?}");
        assert!(said(&plan), "{plan:?}");
        assert_eq!(plan.memory_bytes, 5 << 30);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever the scheduler: no node gives more GPUs than it has, every worker's GPUs
        /// are on one node of the job's model, and what a job starts on is a model it may.
        #[test]
        fn no_node_is_oversubscribed_and_workers_are_whole(
            sizes in proptest::collection::vec((0u32..5, 0usize..2), 1..5),
            specs in proptest::collection::vec((1u32..4, 0usize..4, proptest::option::of(0usize..2)), 1..6),
            which in 0usize..3,
        ) {
            use crate::schedule::{Fifo, SchedulerKind};
            let models = ["V100", "A100"];
            let nodes: Vec<LiveNode> = sizes.iter().enumerate()
                .map(|(i, &(g, m))| node(&format!("n{i}"), g, models[m]))
                .collect();
            let jobs: Vec<LiveJob> = specs.iter().enumerate()
                .map(|(i, &(w, g, m))| {
                    let g = [Gpus::from_milli(300), Gpus::from_milli(500), Gpus::ONE, Gpus::whole(2)][g];
                    share_job(i as u64 + 1, LiveState::Queued, w, g, m.map(|m| models[m]))
                })
                .collect();
            let scheduler = [elastic(), SchedulerKind::Fifo(Fifo::default()), SchedulerKind::Pollux(Default::default())][which].clone();
            let snap = LiveSnapshot {
                now_s: 100.0,
                cluster: LiveCluster { nodes: nodes.clone(), ..cluster(64) },
                jobs: jobs.clone(),
            };
            let plan = plan_round(&snap, scheduler.scheduler(), &config(), &none()).unwrap();
            let mut used: BTreeMap<String, u32> = BTreeMap::new();
            for (d, j) in plan.decisions.iter().zip(&jobs) {
                let gpus: u32 = d.gpu_placement.iter().map(|p| p.1).sum();
                // Shares pack onto whole devices: no more than the workers need.
                proptest::prop_assert_eq!(gpus, j.workers.gpus.devices_for(d.to_workers()), "{:?}", d);
                for (n, k) in &d.gpu_placement {
                    proptest::prop_assert_eq!(k % j.workers.gpus.devices(), 0);
                    let at = nodes.iter().find(|x| &x.name == n).unwrap();
                    proptest::prop_assert_eq!(Some(&at.gpu_type), d.gpu_type.as_ref());
                    *used.entry(n.clone()).or_default() += k;
                }
                if let (Some(want), true) = (&j.workers.gpu_type, d.to_workers() > 0) {
                    proptest::prop_assert_eq!(Some(want), d.gpu_type.as_ref());
                }
            }
            for n in &nodes {
                proptest::prop_assert!(used.get(&n.name).copied().unwrap_or(0) <= n.gpus, "{:?} {:?}", used, plan);
            }
        }
    }

    #[test]
    fn a_model_no_node_has_or_a_worker_larger_than_any_node_is_named_with_the_cluster() {
        let nodes = two_models().nodes;
        let g = Gpus::whole;
        assert_eq!(unplaceable(&nodes, g(2), Some("V100")), None);
        assert_eq!(unplaceable(&nodes, g(4), None), None);
        assert_eq!(unplaceable(&nodes, g(0), Some("H100")), None);
        assert_eq!(
            unplaceable(&nodes, Gpus::from_milli(500), Some("V100")),
            None
        );
        let e = unplaceable(&nodes, g(1), Some("H100")).unwrap();
        assert!(e.contains("\"H100\", which no node has"), "{e}");
        assert!(
            e.contains("A100: 4 GPUs, at most 4 on a node; V100: 2 GPUs, at most 2 on a node"),
            "{e}"
        );
        let e = unplaceable(&nodes, g(3), Some("V100")).unwrap();
        assert!(
            e.contains("3 V100 GPUs per worker, more than any node holds"),
            "{e}"
        );
        let e = unplaceable(&[], Gpus::from_milli(100), None).unwrap();
        assert!(e.contains("the cluster has no GPUs"), "{e}");
    }

    /// The CI harness's three nodes of 4 CPUs (none, 2 V100s, 4 A100s) as the platform
    /// reports their free room: the V100 node with `v_cpus` CPUs and `v_gpus` GPUs free.
    fn with_room(v_cpus: u64, v_gpus: u32) -> LiveCluster {
        let room = |name: &str, cpus: u64, gpus: u32| crate::live::NodeRoom {
            name: name.into(),
            cpu_millicores: cpus * 1000,
            memory_bytes: 0,
            gpus: Gpus::whole(gpus),
            devices: Vec::new(),
        };
        LiveCluster {
            free: vec![room("c", 4, 0), room("v", v_cpus, v_gpus), room("a", 4, 4)],
            ..three_nodes()
        }
    }

    fn three_nodes() -> LiveCluster {
        LiveCluster {
            nodes: vec![node("v", 2, "V100"), node("a", 4, "A100")],
            ..cluster(12)
        }
    }

    /// A V100 job of `workers` workers (1 GPU and 3 CPUs each), at least `min`.
    fn v100_job(id: u64, state: LiveState, workers: u32, min: u32) -> LiveJob {
        let mut job = gpu_job(id, state, workers, 1, Some("V100"));
        job.workers.millicores = 3000;
        job.workers.min = min;
        job.workers.max = workers;
        job
    }

    #[test]
    fn a_share_or_a_whole_gpu_must_find_its_room_on_one_device() {
        // The V100 node's two devices with `free` left each (the others' as in `with_room`):
        // the node's free GPUs are their sum.
        let on_devices = |free: [u32; 2]| {
            let mut c = with_room(4, 0);
            c.free[1].devices = free.iter().map(|&m| Gpus::from_milli(m)).collect();
            c.free[1].gpus = Gpus::from_milli(free.iter().sum());
            c
        };
        let one = |gpus: Gpus| {
            let mut j = share_job(1, LiveState::Queued, 1, gpus, Some("V100"));
            (j.workers.min, j.workers.max, j.workers.millicores) = (1, 1, 1000);
            LiveSnapshot {
                now_s: 100.0,
                cluster: on_devices([0, 0]),
                jobs: vec![j],
            }
        };
        let half = Gpus::from_milli(500);
        let starts = |snap: &LiveSnapshot| decision(&round(snap), 1).to_workers();
        // 0.6 free on the node, 0.3 on each device: no device holds a 0.5 share.
        let snap = LiveSnapshot {
            cluster: on_devices([300, 300]),
            ..one(half)
        };
        let plan = round(&snap);
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|r| r.contains("v 4 CPU, 0.6 V100 GPUs free (0.3 + 0.3 by device)")),
            "{d:?}"
        );
        // The same 0.6 as 0.5 on one device and 0.1 on the other: it starts.
        let snap = LiveSnapshot {
            cluster: on_devices([100, 500]),
            ..one(half)
        };
        assert_eq!(starts(&snap), 1);
        // The devices not known: the node's 0.6 is taken to hold it (as Ray's count does).
        let mut snap = LiveSnapshot {
            cluster: on_devices([300, 300]),
            ..one(half)
        };
        snap.cluster.free[1].devices.clear();
        assert_eq!(starts(&snap), 1);
        // A whole GPU: a device with nothing used, not half of each of two.
        let snap = LiveSnapshot {
            cluster: on_devices([500, 500]),
            ..one(Gpus::ONE)
        };
        assert_eq!(starts(&snap), 0);
        let snap = LiveSnapshot {
            cluster: on_devices([1000, 0]),
            ..one(Gpus::ONE)
        };
        assert_eq!(starts(&snap), 1);
        // 0.3 shares on 0.5 and 0.4 free: one on each device, so two fit and a third does
        // not, though the node's 0.9 would count three.
        let mut snap = LiveSnapshot {
            cluster: on_devices([500, 400]),
            ..one(Gpus::from_milli(300))
        };
        (snap.jobs[0].workers.min, snap.jobs[0].workers.max) = (2, 2);
        snap.jobs[0].workers.count = 2;
        assert_eq!(starts(&snap), 2, "{:?}", round(&snap));
        (snap.jobs[0].workers.min, snap.jobs[0].workers.max) = (3, 3);
        snap.jobs[0].workers.count = 3;
        let mut counted = snap.clone();
        counted.cluster.free[1].devices.clear();
        assert_eq!(starts(&counted), 3, "{:?}", round(&counted));
        assert_eq!(starts(&snap), 0, "{:?}", round(&snap));
    }

    #[test]
    fn a_gpu_start_whose_cpu_its_gpu_node_lacks_waits_with_the_nodes_room() {
        // Two V100 jobs of one worker (1 GPU, 3 CPUs): the pool (12 CPUs, 2 V100s) holds
        // both; the V100 node's 4 CPUs hold one.
        let jobs = vec![
            v100_job(1, LiveState::Queued, 1, 1),
            v100_job(2, LiveState::Queued, 1, 1),
        ];
        let pooled = LiveSnapshot {
            now_s: 100.0,
            cluster: three_nodes(),
            jobs: jobs.clone(),
        };
        let plan = round(&pooled);
        assert_eq!(
            (
                decision(&plan, 1).to_workers(),
                decision(&plan, 2).to_workers()
            ),
            (1, 1)
        );
        let plan = round(&LiveSnapshot {
            cluster: with_room(4, 2),
            ..pooled.clone()
        });
        assert_eq!(decision(&plan, 1).to_workers(), 1, "{plan:?}");
        let d = decision(&plan, 2);
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r
                == "waits: no node has room for its processes of 1 V100 GPUs and 3 CPU at its \
                    minimum of 1 workers (a 4 CPU, 4 A100 GPUs free, c 4 CPU free, v 1 CPU, 1 \
                    V100 GPUs free)"),
            "{d:?}"
        );
        // Held at none by the nodes' room in the pass after: no reason blames the scheduler.
        assert!(
            !d.reasons.iter().any(|r| r.contains("gives it 0 GPUs")),
            "{d:?}"
        );
        assert!(d.gpu_placement.is_empty(), "{d:?}");
        // The CPU jobs get the room the GPU jobs leave on the nodes: a CPU job of one 4-CPU
        // worker, which c or a hold, starts; one of two waits (v has 1 CPU left).
        let cpu_job = |id, workers| {
            let mut j = job(id, LiveState::Queued, workers, &[(1, 10.0)]);
            j.workers.millicores = 4000;
            j.workers.min = workers;
            j.workers.max = workers;
            j
        };
        for (workers, starts) in [(2, 2), (3, 0)] {
            let mut snap = LiveSnapshot {
                cluster: with_room(4, 2),
                ..pooled.clone()
            };
            snap.jobs.truncate(1);
            snap.jobs.push(cpu_job(3, workers));
            let plan = round(&snap);
            assert_eq!(decision(&plan, 3).to_workers(), starts, "{plan:?}");
        }
    }

    #[test]
    fn gpus_a_job_cannot_use_for_want_of_cpu_beside_them_go_to_another_job() {
        // The V100 node: 2 GPUs and 4 CPUs free. Job 1 (first): 2 workers of 1 V100 and 3
        // CPUs, at least 1; job 2: 1 worker of 1 V100 and 1 CPU. FIFO gives both GPUs to job
        // 1, whose second worker the node's CPU does not hold: that V100 goes to job 2.
        let mut small = v100_job(2, LiveState::Queued, 1, 1);
        small.workers.millicores = 1000;
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: with_room(4, 2),
            jobs: vec![v100_job(1, LiveState::Queued, 2, 1), small],
        };
        let fifo = crate::schedule::SchedulerKind::Fifo(Default::default());
        let plan = plan_round(&snap, fifo.scheduler(), &config(), &none()).unwrap();
        let (one, two) = (decision(&plan, 1), decision(&plan, 2));
        assert_eq!((one.to_workers(), two.to_workers()), (1, 1), "{plan:?}");
        assert!(
            one.reasons.iter().any(|r| r
                .starts_with("starts with 1 workers, not 2: no more fit on the nodes' free room")),
            "{one:?}"
        );
        assert_eq!(two.gpu_placement, vec![("v".to_string(), 1)], "{two:?}");
        assert!(
            plan.notes.iter().any(|n| n.starts_with(
                "GPU jobs scheduled again with job 1 at 1 workers held at what the nodes' free \
                 room holds: the GPUs they could not use went to the jobs behind them"
            )),
            "{:?}",
            plan.notes
        );
    }

    #[test]
    fn a_gpu_start_its_placement_group_does_not_fit_waits_naming_the_group() {
        // A V100 job of 1 worker (3 CPUs) and two 1-CPU rollout engines, strictly packed with
        // the worker: the V100 node must hold all three (5 CPUs).
        use vocab::spec::Strategy;
        let mut j = v100_job(1, LiveState::Queued, 1, 1);
        let mut engine = crate::live::tests::rollout(2, 0.0, 0.0);
        (engine.millicores, engine.rate) = (1000, None);
        let rollout = engine.role;
        j.roles = vec![engine];
        let snap = |j: &LiveJob, v_cpus| LiveSnapshot {
            now_s: 100.0,
            cluster: with_room(v_cpus, 2),
            jobs: vec![j.clone()],
        };
        // On their own, the engines go to other nodes and the job starts on 4 CPUs.
        assert_eq!(decision(&round(&snap(&j, 4)), 1).to_workers(), 1);
        j.groups = vec![LiveGroup {
            share_devices: false,
            roles: vec![Role::WORKER, rollout],
            strategy: Strategy::StrictPack,
        }];
        let plan = round(&snap(&j, 4));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r.starts_with(
                "waits at its minimum of 1 workers: the nodes' free room cannot hold its \
                 placement group worker+rollout (strict_pack) so (a 4 CPU, 4 A100 GPUs free, c \
                 4 CPU free, v 4 CPU, 2 V100 GPUs free)"
            )),
            "{d:?}"
        );
        // On 5 CPUs, all three start on the V100 node.
        let plan = round(&snap(&j, 5));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 1, "{d:?}");
        assert_eq!(d.start_nodes(Role::WORKER)[&rollout], ["v", "v"]);
    }

    #[test]
    fn a_roles_own_gpu_model_is_where_its_processes_go() {
        // A CPU job of one worker with a reward process of half a GPU. The V100 node has no
        // GPU free, the A100 node four: of any model, it starts there; of V100, it waits.
        let mut j = job(1, LiveState::Queued, 1, &[]);
        j.workers.max = 1;
        let mut reward = crate::live::tests::rollout(1, 0.0, 0.0);
        reward.role = "reward".parse().unwrap();
        (reward.gpus, reward.rate) = (Gpus::from_milli(500), None);
        j.roles = vec![reward];
        let snap = |j: &LiveJob| LiveSnapshot {
            now_s: 100.0,
            cluster: with_room(4, 0),
            jobs: vec![j.clone()],
        };
        let plan = round(&snap(&j));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 1, "{d:?}");
        assert_eq!(d.start_nodes(Role::WORKER)[&j.roles[0].role], ["a"]);
        j.roles[0].gpu_type = Some("V100".into());
        let plan = round(&snap(&j));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 0, "{d:?}");
    }

    #[test]
    fn roles_that_share_devices_start_as_one_bundle_on_one_device() {
        // A CPU job of one worker with a reward and a reference process of 0.5 GPU each. The
        // V100 node's two devices have 0.5 free each: apart, one goes on each; sharing a
        // device, the two need a whole one.
        use vocab::spec::Strategy;
        let on_devices = |free: [u32; 2]| {
            let mut c = with_room(4, 0);
            c.free.truncate(2);
            c.free[1].devices = free.iter().map(|&m| Gpus::from_milli(m)).collect();
            c.free[1].gpus = Gpus::from_milli(free.iter().sum());
            c
        };
        let mut j = job(1, LiveState::Queued, 1, &[]);
        j.workers.max = 1;
        let role = |name: &str| {
            let mut r = crate::live::tests::rollout(1, 0.0, 0.0);
            r.role = name.parse().unwrap();
            (r.gpus, r.rate) = (Gpus::from_milli(500), None);
            r
        };
        j.roles = vec![role("reward"), role("reference")];
        let (reward, reference) = (j.roles[0].role, j.roles[1].role);
        let snap = |j: &LiveJob, free| LiveSnapshot {
            now_s: 100.0,
            cluster: on_devices(free),
            jobs: vec![j.clone()],
        };
        assert_eq!(decision(&round(&snap(&j, [500, 500])), 1).to_workers(), 1);
        j.groups = vec![LiveGroup {
            share_devices: true,
            roles: vec![reward, reference],
            strategy: Strategy::Pack,
        }];
        let plan = round(&snap(&j, [500, 500]));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r.contains(
                "the nodes' free room cannot hold its placement group reward+reference (pack, \
                 sharing devices) so"
            )),
            "{d:?}"
        );
        // A whole device free: both on it.
        let plan = round(&snap(&j, [1000, 0]));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 1, "{d:?}");
        let on = d.start_nodes(Role::WORKER);
        assert_eq!(
            (&on[&reward], &on[&reference]),
            (&vec!["v".to_string()], &vec!["v".to_string()])
        );
    }

    #[test]
    fn a_gpu_start_or_growth_is_cut_to_the_workers_its_gpu_node_holds() {
        // A job of 2 V100 workers (at least 1) on a V100 node of 4 CPUs: one starts.
        let snap = |jobs: Vec<LiveJob>, v_cpus, v_gpus| LiveSnapshot {
            now_s: 100.0,
            cluster: with_room(v_cpus, v_gpus),
            jobs,
        };
        let plan = round(&snap(vec![v100_job(1, LiveState::Queued, 2, 1)], 4, 2));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 1, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r
                .starts_with("starts with 1 workers, not 2: no more fit on the nodes' free room")),
            "{d:?}"
        );
        // Running at 1 worker, it may grow to 2 (both V100s), but its node has 2 CPUs free.
        let mut running = v100_job(1, LiveState::Running, 1, 1);
        running.workers.max = 2;
        running.speed = vec![
            SpeedPoint {
                workers: 1,
                samples_per_s: 100.0,
            },
            SpeedPoint {
                workers: 2,
                samples_per_s: 195.0,
            },
        ];
        let plan = round(&snap(vec![running.clone()], 3, 1));
        assert_eq!(decision(&plan, 1).to_workers(), 2, "{plan:?}");
        // On the A100s, from 2 to 4 workers: the node's 4 CPUs free hold one more.
        let mut a100 = running.clone();
        (a100.workers.gpu_type, a100.workers.max, a100.workers.count) = (Some("A100".into()), 4, 2);
        a100.speed.push(SpeedPoint {
            workers: 4,
            samples_per_s: 380.0,
        });
        let mut cluster = with_room(4, 2);
        (cluster.free[2].cpu_millicores, cluster.free[2].gpus) = (4000, Gpus::whole(2));
        let plan = round(&LiveSnapshot {
            now_s: 100.0,
            cluster,
            jobs: vec![a100],
        });
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 3, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r.starts_with(
                "3 workers, not 4: no more fit on the nodes' free room (a 4 CPU, 2 A100 GPUs \
                 free"
            )),
            "{d:?}"
        );
        let plan = round(&snap(vec![running], 2, 1));
        let d = decision(&plan, 1);
        assert_eq!(d.to_workers(), 1, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r.starts_with(
                "kept at 1 workers: no node has room for another worker of 1 V100 GPUs and 3 CPU"
            )),
            "{d:?}"
        );
    }

    #[test]
    fn a_start_places_each_worker_with_the_processes_that_share_its_device() {
        // Two V100 workers of 1 CPU, each sharing its device with a rollout engine of 2
        // CPUs (the worker holds the device's whole bundle). The V100 node has 4 CPUs and both
        // GPUs free, the CPU node c 4 CPUs. Placed apart, the engines would go to c and both
        // workers to v; the job master lays each worker and its engine out as one bundle on
        // one node: v holds one bundle of 3 CPUs, so the start is cut to one worker (its
        // second engine, without a worker, goes to c alone).
        let mut job = gpu_job(1, LiveState::Queued, 2, 1, Some("V100"));
        job.workers.millicores = 1000;
        job.workers.min = 1;
        job.workers.max = 2;
        let mut engine = crate::live::tests::rollout(2, 0.5, 0.0);
        (engine.millicores, engine.beside_workers) = (2000, true);
        job.roles = vec![engine];
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: with_room(4, 2),
            jobs: vec![job],
        };
        let d = decision(&round(&snap), 1).clone();
        assert_eq!(d.to_workers(), 1, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r.starts_with(
                "starts with 1 workers, not 2: no more fit on the nodes' free room (a 4 CPU, 4 \
                 A100 GPUs free, c 4 CPU free, v 4 CPU, 2 V100 GPUs free)"
            )),
            "{d:?}"
        );
        // With 6 CPUs on the V100 node both bundles fit there.
        let wide = LiveSnapshot {
            cluster: with_room(6, 2),
            ..snap.clone()
        };
        assert_eq!(decision(&round(&wide), 1).to_workers(), 2);
        // Engines placed on their own (not beside the workers) would have fit the narrow one.
        let mut apart = snap;
        apart.jobs[0].roles[0].beside_workers = false;
        assert_eq!(decision(&round(&apart), 1).to_workers(), 2);
    }

    /// A running V100 job of one worker (1 GPU, 1 CPU) whose rollout engines share the
    /// workers' devices: engine 0 runs on v1 beside worker 0, engine 1 on v2 (its worker not
    /// yet there). Three V100 nodes of one device each; v1's is taken, v2 has `v2_cpus` CPUs
    /// free, v3 4. The decision of growing it to 2.
    fn grown_beside(v2_cpus: u64, known: bool) -> Decision {
        grown_beside_to(2, v2_cpus, known)
    }

    /// [`grown_beside`], growing to at most `max`.
    fn grown_beside_to(max: u32, v2_cpus: u64, known: bool) -> Decision {
        let mut job = gpu_job(1, LiveState::Running, 1, 1, Some("V100"));
        (job.workers.millicores, job.workers.min, job.workers.max) = (1000, 1, max);
        // It once ran on 2 (the policy grows a job to at most twice its peak).
        job.workers.peak = 2;
        let mut engine = crate::live::tests::rollout(2, 0.5, 0.0);
        (engine.millicores, engine.beside_workers, engine.rate) = (500, true, None);
        if known {
            engine.nodes = vec!["v1".into(), "v2".into()];
        }
        job.roles = vec![engine];
        let room = |name: &str, millicores: u64, gpus: u32| crate::live::NodeRoom {
            name: name.into(),
            cpu_millicores: millicores,
            memory_bytes: 0,
            gpus: Gpus::whole(gpus),
            devices: Vec::new(),
        };
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                nodes: ["v1", "v2", "v3"].map(|n| node(n, 1, "V100")).to_vec(),
                free: vec![
                    room("v1", 4000, 0),
                    room("v2", v2_cpus, 1),
                    room("v3", 4000, 1),
                ],
                ..cluster(12)
            },
            jobs: vec![job],
        };
        decision(&round(&snap), 1).clone()
    }

    #[test]
    fn a_worker_added_beside_a_running_partner_goes_to_its_node() {
        // v2, where engine 1 runs, has half a CPU: worker 1 does not fit beside it, and it
        // may go nowhere else (the job master lays the two out as one bundle).
        let d = grown_beside(500, true);
        assert_eq!(d.to_workers(), 1, "{d:?}");
        assert!(
            d.reasons.iter().any(|r| r.starts_with(
                "kept at 1 workers: no node has room for another worker of 1 V100 GPUs and 1 CPU \
                 on v2, beside the process of its index that shares its device ("
            )),
            "{d:?}"
        );
        // With the CPU there, it grows beside its engine.
        assert_eq!(grown_beside(2000, true).to_workers(), 2);
        // Where the engine's node is not known, the worker is placed by its own room (v3).
        assert_eq!(grown_beside(500, false).to_workers(), 2);
    }

    #[test]
    fn a_gpu_growths_plan_names_the_node_of_each_worker_it_adds() {
        let workers_on = |d: &Decision| d.nodes.get(&Role::WORKER).cloned();
        // Beside its engine on v2; without its engine's node known, on v3 by its room.
        let d = grown_beside(2000, true);
        assert_eq!(workers_on(&d), Some(vec!["v2".to_string()]), "{d:?}");
        assert_eq!(
            workers_on(&grown_beside(500, false)),
            Some(vec!["v3".into()])
        );
        // Two added: worker 1 beside engine 1 on v2, worker 2 (no engine of its index) by its
        // room on v3, the one node with a device left; the plan lists them by index.
        let d = grown_beside_to(3, 2000, true);
        assert_eq!(d.to_workers(), 3, "{d:?}");
        assert_eq!(
            workers_on(&d),
            Some(vec!["v2".into(), "v3".into()]),
            "{d:?}"
        );
        let trainer = Role::new("trainer").unwrap();
        let plan = d.scale_plan(1, trainer);
        let nodes = plan.roles.get(&trainer).map(|t| t.nodes.clone());
        assert_eq!(nodes, Some(vec!["v2".into(), "v3".into()]));
        // Kept at its size: nothing named.
        assert_eq!(workers_on(&grown_beside(500, true)), None);
    }

    #[test]
    fn a_gpu_starts_processes_are_named_where_the_gpu_nodes_room_placed_them() {
        // Two V100 workers (1 CPU each) whose devices three engines share (0.5 CPU each):
        // worker k and engine k as one bundle on one node, the most CPU free first (v1, then
        // v2, whose device is the one left); engine 2, past the last worker, alone on the
        // node without GPUs (c).
        let mut job = gpu_job(1, LiveState::Queued, 2, 1, Some("V100"));
        job.workers.millicores = 1000;
        job.workers.min = 2;
        job.workers.max = 2;
        let mut engine = crate::live::tests::rollout(3, 0.5, 0.0);
        (engine.millicores, engine.beside_workers, engine.rate) = (500, true, None);
        let rollout = engine.role;
        job.roles = vec![engine];
        let room = |name: &str, millicores: u64, gpus: u32| crate::live::NodeRoom {
            name: name.into(),
            cpu_millicores: millicores,
            memory_bytes: 0,
            gpus: Gpus::whole(gpus),
            devices: Vec::new(),
        };
        let snap = LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                nodes: ["v1", "v2"].map(|n| node(n, 1, "V100")).to_vec(),
                free: vec![room("v1", 4000, 1), room("v2", 3000, 1), room("c", 2000, 0)],
                ..cluster(12)
            },
            jobs: vec![job],
        };
        let d = decision(&round(&snap), 1).clone();
        assert_eq!(d.to_workers(), 2, "{d:?}");
        use crate::live::tests::names;
        let trainer = Role::new("trainer").unwrap();
        assert_eq!(
            d.start_nodes(trainer),
            BTreeMap::from([
                (trainer, names(&["v1", "v2"])),
                (rollout, names(&["v1", "v2", "c"])),
            ]),
            "{d:?}"
        );
    }

    #[test]
    fn gpu_processes_not_placed_yet_hold_their_gpu_nodes_room() {
        // A running V100 job's worker (1 GPU, 3 CPUs) is planned, not launched: the V100
        // node's free room (4 CPUs, 2 GPUs) does not show it. A queued V100 job of one such
        // worker fits the pool and the GPUs the round counts, but not beside it on the node.
        let mut running = v100_job(1, LiveState::Running, 1, 1);
        running.not_placed = vec![crate::live::NotPlaced {
            count: 1,
            millicores: 3000,
            memory_bytes: 0,
            gpus: Gpus::ONE,
            nodes: Vec::new(),
        }];
        let mut snap = LiveSnapshot {
            now_s: 100.0,
            cluster: with_room(4, 2),
            jobs: vec![running, v100_job(2, LiveState::Queued, 1, 1)],
        };
        let plan = round(&snap);
        let d = decision(&plan, 2);
        assert_eq!(d.to_workers(), 0, "{d:?}");
        assert!(
            plan.notes
                .iter()
                .any(|n| n.starts_with("nodes: room held for 1 of 1 processes")),
            "{plan:?}"
        );
        snap.jobs[0].not_placed.clear();
        assert_eq!(decision(&round(&snap), 2).to_workers(), 1);
    }

    #[test]
    fn a_start_of_any_model_whose_nodes_lack_the_cpu_moves_to_another_model() {
        // A job of one worker of 1 GPU and 3 CPUs, of any model. The scheduler gives it the
        // model it gives it; that model's node has 1 CPU free, the other's 4.
        let mut j = v100_job(1, LiveState::Queued, 1, 1);
        j.workers.gpu_type = None;
        let snap_of = |j: &LiveJob, cluster: LiveCluster| LiveSnapshot {
            now_s: 100.0,
            cluster,
            jobs: vec![j.clone()],
        };
        let snap = |cluster| snap_of(&j, cluster);
        let given = decision(&round(&snap(with_room(4, 2))), 1)
            .gpu_type
            .clone()
            .unwrap();
        let starved = |model: &str| {
            let mut c = with_room(4, 2);
            let at = if model == "V100" { 1 } else { 2 };
            c.free[at].cpu_millicores = 1000;
            c
        };
        let plan = round(&snap(starved(&given)));
        let d = decision(&plan, 1);
        let other = if given == "V100" { "A100" } else { "V100" };
        assert_eq!(
            (d.to_workers(), d.gpu_type.as_deref()),
            (1, Some(other)),
            "{d:?}"
        );
        assert!(
            d.reasons.iter().any(|r| r.starts_with(&format!(
                "moved to {other} GPUs: the {given} nodes have no room for its processes"
            ))),
            "{d:?}"
        );
        assert_eq!(d.gpu_placement.len(), 1, "{d:?}");
        // Both models' nodes short: it waits.
        let mut c = starved(&given);
        c.free[1].cpu_millicores = 1000;
        c.free[2].cpu_millicores = 1000;
        let d = decision(&round(&snap(c)), 1).clone();
        assert_eq!(d.to_workers(), 0, "{d:?}");
        // A job that asked for its model stays on it.
        let mut asked = j.clone();
        asked.workers.gpu_type = Some(given.clone());
        let d = decision(&round(&snap_of(&asked, starved(&given))), 1).clone();
        assert_eq!(d.to_workers(), 0, "{d:?}");
    }
}
