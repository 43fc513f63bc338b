//! The CPU jobs' part of a round: each job sized in slots ([`Sized`]), the scheduler run on
//! the one node of slots the GPU jobs leave (less what roles that hold up their jobs are kept),
//! and each job's worker count read from the slots it was given, within its cool-down and
//! minimum.

use super::*;

/// What the GPU jobs leave to the CPU jobs: slots, processes and memory (`u64::MAX`: not
/// counted).
pub(super) struct Left {
    slots: u32,
    processes: u32,
    memory: u64,
}

impl Left {
    /// What is left of `caps` (the whole cluster's) once `gpu` is taken off.
    pub(super) fn after(gpu: &gpu::GpuRound, caps: Caps) -> Left {
        Left {
            slots: (caps.slots as u32).saturating_sub(gpu.cpu_slots as u32),
            processes: caps.processes.saturating_sub(gpu.processes),
            memory: match caps.memory {
                u64::MAX => u64::MAX,
                m => m.saturating_sub(gpu.memory),
            },
        }
    }
}

/// The CPU jobs sized by the scheduler: `jobs[k]` is the snapshot's job `at[k]`; `caps` are
/// what the corrections and the repair must keep them within.
pub(super) struct CpuRound<'a> {
    pub at: Vec<usize>,
    pub jobs: Vec<Sized<'a>>,
    pub caps: Caps,
}

/// Sizes the snapshot's CPU jobs (those whose workers ask for no GPU) in `left`. `fits` are
/// every job's speed models (by index in the snapshot), `prior` the per-worker speed of a job
/// without one.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_cpu_jobs<'a>(
    snapshot: &'a LiveSnapshot,
    fits: Vec<Option<AmdahlModel>>,
    prior: f64,
    left: Left,
    holdups: &BTreeMap<usize, roles::Holdup>,
    scheduler: &dyn Scheduler,
    config: &LiveConfig,
    notes: &mut Vec<String>,
) -> Result<CpuRound<'a>, PolicyError> {
    let now = snapshot.now_s;
    let cluster = &snapshot.cluster;
    let at: Vec<usize> = (0..snapshot.jobs.len())
        .filter(|&i| snapshot.jobs[i].workers.gpus.is_zero())
        .collect();
    let mut jobs: Vec<Sized> = snapshot
        .jobs
        .iter()
        .zip(fits)
        .filter(|(job, _)| job.workers.gpus.is_zero())
        .map(|(job, fit)| sized(job, fit, prior, cluster.slot_millicores, config, now))
        .collect();

    let current: u64 = jobs
        .iter()
        .filter(|s| s.running())
        .map(|s| s.slots(s.counted(s.job.workers.count)))
        .sum();
    let (total_slots, max_processes) =
        keep_room_for_holdups(holdups, &jobs, current, left.slots, left.processes, cluster);
    let assignment = if current <= total_slots as u64 {
        scheduler.schedule(&view_of(&jobs, total_slots, now))?
    } else {
        notes.push(format!(
            "running jobs hold {current} slots of {total_slots}: the scheduler is skipped and \
             jobs shrink toward their minimum"
        ));
        BTreeMap::new()
    };
    for s in &mut jobs {
        let given: u32 = assignment
            .get(&s.job.id)
            .map_or(0, |slots| slots.iter().map(|x| x.1).sum());
        size_in(s, given, total_slots, scheduler.name(), config, now);
    }
    Ok(CpuRound {
        at,
        jobs,
        caps: Caps {
            slots: total_slots as u64,
            processes: max_processes,
            memory: left.memory,
        },
    })
}

/// One CPU job as the round starts sizing it: its slots, the PS slots it holds, its models.
fn sized<'a>(
    job: &'a LiveJob,
    fit: Option<AmdahlModel>,
    prior: f64,
    slot: u64,
    config: &LiveConfig,
    now: f64,
) -> Sized<'a> {
    let mut reasons = Vec::new();
    let model = speed_model(fit, prior, &mut reasons);
    let ps_slot_each = slots_of(job.ps.millicores, slot);
    // What the job holds for its PS: each as reported (a migration may have given one more
    // CPU), else the role's.
    let ps_slots = if job.ps.processes.len() == job.ps.count as usize {
        job.ps
            .processes
            .iter()
            .map(|p| slots_of(p.resources.cpu.0, slot))
            .sum()
    } else {
        job.ps.count * ps_slot_each
    };
    Sized {
        job,
        model,
        ps: job.ps.count,
        ps_slots,
        ps_slot_each,
        worker_slots: slots_of(job.workers.millicores, slot),
        migrations: Vec::new(),
        corrections: Vec::new(),
        to: 0,
        traded: 0,
        ps_model: correct::ps_model(job, config.cooldown_s, now),
        joint: None,
        pinned: false,
        reasons,
        nodes: BTreeMap::new(),
    }
}

/// The scheduler's view: one node of `total_slots` slots, the jobs in submission order.
fn view_of(jobs: &[Sized], total_slots: u32, now: f64) -> Snapshot {
    let mut views: Vec<JobView> = jobs.iter().map(|s| view(s, total_slots)).collect();
    views.sort_by(|a, b| {
        a.submitted_s
            .total_cmp(&b.submitted_s)
            .then(a.id.cmp(&b.id))
    });
    Snapshot {
        now_s: now,
        worker_types: vec![WorkerType("cpu".into())],
        nodes: vec![NodeView {
            worker_type: 0,
            gpus: total_slots,
        }],
        jobs: views,
    }
}

/// Sets `s.to` from the `given` slots the scheduler gave it (of `total_slots`), with the
/// reason: a running job in its cool-down or given less than its minimum keeps its size
/// (pinned); a queued job given less than its minimum waits.
fn size_in(
    s: &mut Sized,
    given: u32,
    total_slots: u32,
    scheduler: &str,
    config: &LiveConfig,
    now: f64,
) {
    let fit = match &s.ps_model {
        Some(m) => {
            let (w, p) = s.split(m, given);
            s.joint = (w > 0).then_some((w, p));
            w
        }
        None => s.workers_in(given),
    };
    let cooling = s
        .job
        .last_change_s
        .map(|t| t + config.cooldown_s - now)
        .filter(|left| *left > 0.0);
    let workers = s.job.workers.count;
    let reason = match s.job.state {
        LiveState::Running => {
            if let Some(left) = cooling.filter(|_| fit != workers) {
                s.to = workers;
                s.pinned = true;
                format!(
                    "{scheduler} would give {fit} workers; kept at {workers} for {left:.0} s \
                     more of cool-down"
                )
            } else if fit == 0 {
                s.to = workers;
                s.pinned = true;
                format!(
                    "{scheduler} gives it {given} slots, below its minimum; a running job keeps \
                     its size"
                )
            } else {
                s.to = fit;
                let ps = s.joint.map_or(String::new(), |(_, p)| {
                    format!(" beside {p} ps (their split from its PS speed model)")
                });
                format!("{scheduler} gives it {given} of {total_slots} slots: {fit} workers{ps}")
            }
        }
        LiveState::Queued => {
            s.to = fit;
            if fit > 0 {
                format!(
                    "{scheduler} starts it with {given} of {total_slots} slots: {fit} workers \
                     (predicted {workers})"
                )
            } else {
                format!(
                    "waits: {scheduler} gives it {given} slots, fewer than its minimum of {} \
                     workers and {} ps need",
                    s.job.workers.min, s.job.ps.count
                )
            }
        }
    };
    s.reasons.push(reason);
}

/// The CPU slots and processes the training groups may be sized in, once what the roles that
/// hold up their jobs would grow by is kept free (out of what the running jobs leave free,
/// never making them give up any).
fn keep_room_for_holdups(
    holdups: &BTreeMap<usize, roles::Holdup>,
    jobs: &[Sized],
    current: u64,
    total_slots: u32,
    max_processes: u32,
    cluster: &LiveCluster,
) -> (u32, u32) {
    if holdups.is_empty() {
        return (total_slots, max_processes);
    }
    let wanted: u64 = holdups.values().map(roles::Holdup::millicores_wanted).sum();
    let processes: u32 = holdups.values().map(|h| h.more).sum();
    let running: u32 = jobs
        .iter()
        .filter(|s| s.running())
        .map(|s| s.processes(s.counted(s.job.workers.count)))
        .sum();
    let slots = wanted
        .div_ceil(cluster.slot_millicores)
        .min((total_slots as u64).saturating_sub(current)) as u32;
    let processes = processes.min(max_processes.saturating_sub(running));
    (total_slots - slots, max_processes - processes)
}

/// The scheduler's view of one job, in slots.
fn view(s: &Sized, total_slots: u32) -> JobView {
    let job = s.job;
    let max_slots = match &s.ps_model {
        Some(_) => {
            let (_, hi) = correct::ps_range(job);
            (s.ps_slots_at(hi) + job.workers.max * s.worker_slots) as u64
        }
        None => s.slots(job.workers.max),
    }
    .min(total_slots as u64) as u32;
    let goodput: Vec<f64> = (0..=max_slots).map(|r| s.goodput(r)).collect();
    let running = job.state == LiveState::Running;
    let held = if running {
        s.slots(s.counted(job.workers.count)) as u32
    } else {
        0
    };
    let peak_workers = if running {
        job.workers.peak.max(job.workers.count)
    } else {
        job.workers.count
    };
    JobView {
        id: job.id,
        submitted_s: job.submitted_s,
        requested_replicas: (s.ps_slots + job.workers.count.max(job.workers.min) * s.worker_slots)
            .min(max_slots),
        max_replicas: max_slots,
        attained_gpu_s: job.running_s * held as f64,
        running_s: job.running_s,
        restarts: job.restarts,
        peak_replicas: s.ps_slots + peak_workers * s.worker_slots,
        last_change_s: job.last_change_s,
        current: if held > 0 { vec![(0, held)] } else { vec![] },
        goodput: Arc::from(vec![goodput]),
        remaining: job.samples_left.max(0.0),
    }
}
