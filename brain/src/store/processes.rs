//! What the heuristics read, kept in memory beside the database: each running job's processes
//! as its latest reports described them (resources, the last [`CPU_SAMPLES`] CPU samples, peak
//! memory, OOM kills, time pending) and the corrections the brain made to it (for their
//! cool-downs). Nothing here needs to survive the brain: a restarted brain hears every process
//! again within one report interval, and its corrections start cooled down.

use std::collections::{BTreeMap, HashMap};

use optimizer::heuristics::{Change, ProcessRuntime};
use optimizer::plan::ProcessResources;
use vocab::{Bytes, Millicores, Role};

use super::{JobId, Metric};

/// CPU samples kept per process.
pub const CPU_SAMPLES: usize = 16;

/// Corrections kept per job (the oldest go first).
const CHANGES: usize = 64;

/// One process as one report saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessSample {
    pub role: Role,
    pub index: u32,
    /// What it is launched with (0: no limit).
    pub cpu_limit: u64,
    pub memory_limit: u64,
    pub gpus: vocab::Gpus,
    pub cpu_millicores: u64,
    pub memory_bytes: u64,
    pub memory_peak_bytes: u64,
    pub oom_kills: u32,
    pub pending_ms: u64,
    /// Why the platform last found no room for it while pending (empty: it did not say).
    pub pending_reason: String,
    /// Its GPUs at the last sample (NVML on its node): the utilisation of the devices it was
    /// given (0 to 100) and its own memory on them; 0 without NVML or GPUs.
    pub gpu_utilisation_pct: f64,
    pub gpu_memory_bytes: u64,
    /// The node it runs on, as the platform names it (empty: not placed, or not said).
    pub host: String,
    /// The GPUs it was given there (CUDA_VISIBLE_DEVICES: `0`, `1,2`; empty: none, or not
    /// said).
    pub devices: String,
}

pub use vocab::devices::DeviceUse;

/// One process's GPU use, as the job's newest report gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuUse {
    pub process: vocab::SlotKey,
    pub utilisation_pct: f64,
    pub memory_bytes: u64,
}

/// A job's GPU use, as its newest report gave it: the mean utilisation of its processes'
/// devices (those that use one), and each process given a GPU or holding memory on one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobGpuUse {
    pub utilisation_pct: f64,
    pub processes: Vec<GpuUse>,
}

impl JobGpuUse {
    /// The GPU memory its processes hold in all.
    pub fn memory_bytes(&self) -> u64 {
        self.processes.iter().map(|p| p.memory_bytes).sum()
    }
}

/// How far back [`JobSnapshot::samples_per_second`] looks: a recent speed, not the mean
/// since the job started (which counts its start-up).
pub const SPEED_WINDOW_MS: i64 = 30_000;

/// A running job as its newest reports saw it: for `/metrics` and `brainctl`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobSnapshot {
    pub at_unix_ms: i64,
    /// The mean of its reports' speeds over the last [`SPEED_WINDOW_MS`] before its newest.
    pub samples_per_second: f64,
    pub cpu_millicores: u64,
    pub memory_bytes: u64,
    /// Its processes by role: (role, running, waiting to run).
    pub roles: Vec<(Role, u32, u32)>,
    /// The processes waiting to run, longest first: how long, and why when the platform said.
    pub pending: Vec<PendingProcess>,
    /// Writes of the job's state its master failed since it started.
    pub state_write_failures: u64,
}

/// A process of a running job that waits to run (launched, not yet started by its platform).
#[derive(Clone, Debug, PartialEq)]
pub struct PendingProcess {
    pub process: vocab::SlotKey,
    pub pending_ms: u64,
    pub reason: String,
}

/// A job's processes and corrections.
#[derive(Clone, Debug, Default)]
pub(super) struct JobProcesses {
    at_unix_ms: i64,
    processes: BTreeMap<(Role, u32), ProcessRuntime>,
    changes: Vec<Change>,
    /// The called roles' rates, as the newest report gave them, and how much of its master's
    /// window they still lack, ms.
    rates: Vec<(Role, optimizer::live::RoleRate)>,
    rates_unmeasured_ms: u64,
    /// Its effective training time and stragglers, as the newest report gave them.
    effective: Option<vocab::report::EffectiveTraining>,
    stragglers: Vec<super::StragglerNote>,
    slow_nodes: Vec<super::SlowNode>,
    gpu: JobGpuUse,
    /// (node, devices, GPUs) of each of its placed processes given GPUs, by its newest
    /// report.
    devices: Vec<(String, String, vocab::Gpus)>,
    /// (at, samples/s) of its reports over the speed window, oldest first.
    speeds: std::collections::VecDeque<(i64, f64)>,
    snapshot: JobSnapshot,
}

impl JobProcesses {
    fn add_devices(&self, used: &mut DeviceUse) {
        for (host, devices, gpus) in &self.devices {
            used.add(host, devices, *gpus);
        }
    }
}

/// A job's effective training time, its stragglers and the nodes its pre-run check found
/// slow, as its newest report gave them.
#[derive(Clone, Debug, Default)]
pub struct JobStability {
    pub effective: Option<vocab::report::EffectiveTraining>,
    pub stragglers: Vec<super::StragglerNote>,
    pub slow_nodes: Vec<super::SlowNode>,
}

#[derive(Debug, Default)]
pub(super) struct Processes {
    jobs: HashMap<JobId, JobProcesses>,
}

impl Processes {
    /// Folds reports (any order) into the job's view: each report lists every process, so a
    /// process it leaves out has left the job. Only the newest [`CPU_SAMPLES`] reports of a
    /// batch can matter (peaks and kills are running counts in each report).
    pub(super) fn fold(&mut self, job: JobId, reports: &[Metric]) {
        let mut ordered: Vec<&Metric> = reports.iter().collect();
        ordered.sort_by_key(|m| m.at_unix_ms);
        let entry = self.jobs.entry(job).or_default();
        let newest = ordered.len().saturating_sub(CPU_SAMPLES);
        for m in ordered.into_iter().skip(newest) {
            if m.at_unix_ms < entry.at_unix_ms {
                continue; // older than what is known
            }
            entry.at_unix_ms = m.at_unix_ms;
            let mut next = BTreeMap::new();
            for p in &m.processes {
                let resources = ProcessResources {
                    cpu: Millicores(p.cpu_limit),
                    memory: Bytes(p.memory_limit),
                    gpus: Default::default(),
                };
                let mut r = entry
                    .processes
                    .remove(&(p.role, p.index))
                    .filter(|r| r.resources == resources)
                    .unwrap_or_default();
                r.index = p.index;
                r.resources = resources;
                if p.pending_ms == 0 {
                    r.cpu_samples.push(Millicores(p.cpu_millicores));
                    let extra = r.cpu_samples.len().saturating_sub(CPU_SAMPLES);
                    r.cpu_samples.drain(..extra);
                    r.pending_since_s = None;
                } else {
                    r.pending_since_s = Some((m.at_unix_ms - p.pending_ms as i64) as f64 / 1000.0);
                }
                r.memory_peak = Bytes(p.memory_peak_bytes.max(p.memory_bytes));
                r.node = p.host.clone();
                r.oom_kills = p.oom_kills;
                next.insert((p.role, p.index), r);
            }
            entry.processes = next;
            entry.rates = m.role_rates.clone();
            entry.rates_unmeasured_ms = m.rates_window_ms.saturating_sub(m.rates_cover_ms);
            entry.effective = m.effective.clone().or(entry.effective.take());
            entry.stragglers = m.stragglers.clone();
            entry.slow_nodes = m.slow_nodes.clone();
            entry.gpu = gpu_use(m);
            entry.devices = m
                .processes
                .iter()
                .filter(|p| !p.devices.is_empty() && !p.gpus.is_zero() && p.pending_ms == 0)
                .map(|p| (p.host.clone(), p.devices.clone(), p.gpus))
                .collect();
            entry.speeds.push_back((m.at_unix_ms, m.samples_per_second));
            while entry
                .speeds
                .front()
                .is_some_and(|&(at, _)| at < m.at_unix_ms - SPEED_WINDOW_MS)
            {
                entry.speeds.pop_front();
            }
            entry.snapshot = snapshot(m, &entry.speeds);
        }
    }

    /// The job as its newest reports saw it.
    pub(super) fn snapshot(&self, job: JobId) -> JobSnapshot {
        self.jobs
            .get(&job)
            .map(|j| j.snapshot.clone())
            .unwrap_or_default()
    }

    /// The GPU shares every job's processes hold, device by device, by their newest reports.
    /// What every job's processes but those of `besides` hold, device by device.
    pub(super) fn device_use(&self, besides: Option<JobId>) -> DeviceUse {
        let mut used = DeviceUse::default();
        for (_, j) in self.jobs.iter().filter(|(id, _)| Some(**id) != besides) {
            j.add_devices(&mut used);
        }
        used
    }

    /// What each job's processes hold, device by device, job by job (jobs holding none left
    /// out).
    pub(super) fn device_use_by_job(&self) -> BTreeMap<JobId, DeviceUse> {
        self.jobs
            .iter()
            .filter(|(_, j)| !j.devices.is_empty())
            .map(|(id, j)| {
                let mut used = DeviceUse::default();
                j.add_devices(&mut used);
                (*id, used)
            })
            .collect()
    }

    /// The job's GPU use of its newest report.
    pub(super) fn gpu(&self, job: JobId) -> JobGpuUse {
        self.jobs
            .get(&job)
            .map(|j| j.gpu.clone())
            .unwrap_or_default()
    }

    /// The called roles' rates of the job's newest report.
    pub(super) fn rates(&self, job: JobId) -> Vec<(Role, optimizer::live::RoleRate)> {
        self.jobs
            .get(&job)
            .map(|j| j.rates.clone())
            .unwrap_or_default()
    }

    /// Seconds of its master's window the job's rates still lack, by its newest report.
    pub(super) fn rates_unmeasured_s(&self, job: JobId) -> f64 {
        self.jobs
            .get(&job)
            .map_or(0.0, |j| j.rates_unmeasured_ms as f64 / 1000.0)
    }

    /// The job's effective training time, stragglers and slow nodes of its newest report.
    pub(super) fn stability(&self, job: JobId) -> JobStability {
        self.jobs
            .get(&job)
            .map(|j| JobStability {
                effective: j.effective.clone(),
                stragglers: j.stragglers.clone(),
                slow_nodes: j.slow_nodes.clone(),
            })
            .unwrap_or_default()
    }

    /// The job's parameter servers and workers (its `trainer` role's processes), by index.
    pub(super) fn of(
        &self,
        job: JobId,
        trainer: Role,
    ) -> (Vec<ProcessRuntime>, Vec<ProcessRuntime>) {
        let Some(j) = self.jobs.get(&job) else {
            return Default::default();
        };
        let role = |want: Role| {
            j.processes
                .iter()
                .filter(|((r, _), _)| *r == want)
                .map(|(_, p)| p.clone())
                .collect()
        };
        (role(Role::PS), role(trainer))
    }

    /// The node each process of `role` runs on, by index (empty: not known), as the job's
    /// newest report gave them.
    pub(super) fn nodes(&self, job: JobId, role: Role) -> Vec<String> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        let of_role: Vec<(u32, &str)> = j
            .processes
            .iter()
            .filter(|((r, _), _)| *r == role)
            .map(|((_, i), p)| (*i, p.node.as_str()))
            .collect();
        let n = of_role.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
        let mut out = vec![String::new(); n as usize];
        for (i, node) in of_role {
            out[i as usize] = node.to_string();
        }
        out
    }

    pub(super) fn changes(&self, job: JobId) -> Vec<Change> {
        self.jobs
            .get(&job)
            .map(|j| j.changes.clone())
            .unwrap_or_default()
    }

    /// Remembers corrections sent to the job. The samples of a process whose resources change
    /// start over (they were measured against the old limits).
    pub(super) fn corrected(&mut self, job: JobId, changes: &[Change]) {
        let j = self.jobs.entry(job).or_default();
        j.changes.extend_from_slice(changes);
        let extra = j.changes.len().saturating_sub(CHANGES);
        j.changes.drain(..extra);
    }

    pub(super) fn forget(&mut self, job: JobId) {
        self.jobs.remove(&job);
    }
}

/// What one report says of the job, with the speed over the window `speeds` holds.
fn snapshot(m: &Metric, speeds: &std::collections::VecDeque<(i64, f64)>) -> JobSnapshot {
    let mut roles: BTreeMap<Role, (u32, u32)> = BTreeMap::new();
    for p in &m.processes {
        let (running, waiting) = roles.entry(p.role).or_default();
        if p.pending_ms > 0 {
            *waiting += 1;
        } else {
            *running += 1;
        }
    }
    let mut pending: Vec<PendingProcess> = m
        .processes
        .iter()
        .filter(|p| p.pending_ms > 0)
        .map(|p| PendingProcess {
            process: vocab::SlotKey {
                role: p.role,
                index: p.index,
            },
            pending_ms: p.pending_ms,
            reason: p.pending_reason.clone(),
        })
        .collect();
    pending.sort_by_key(|p| std::cmp::Reverse(p.pending_ms));
    JobSnapshot {
        pending,
        at_unix_ms: m.at_unix_ms,
        samples_per_second: speeds.iter().map(|s| s.1).sum::<f64>() / speeds.len().max(1) as f64,
        cpu_millicores: m.cpu_millicores,
        memory_bytes: m.memory_bytes,
        roles: roles.into_iter().map(|(r, (a, b))| (r, a, b)).collect(),
        state_write_failures: m.state_write_failures,
    }
}

/// The GPU use one report gives: the processes given a GPU or holding memory on one.
fn gpu_use(m: &Metric) -> JobGpuUse {
    JobGpuUse {
        utilisation_pct: m.gpu_utilisation_pct,
        processes: m
            .processes
            .iter()
            .filter(|p| p.gpus.milli() > 0 || p.gpu_memory_bytes > 0)
            .map(|p| GpuUse {
                process: vocab::SlotKey {
                    role: p.role,
                    index: p.index,
                },
                utilisation_pct: p.gpu_utilisation_pct,
                memory_bytes: p.gpu_memory_bytes,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(at: i64, cpu: &[u64], pending_ms: u64) -> Metric {
        Metric {
            at_unix_ms: at,
            processes: cpu
                .iter()
                .enumerate()
                .map(|(i, &c)| ProcessSample {
                    role: Role::PS,
                    index: i as u32,
                    cpu_limit: 1000,
                    memory_limit: 1 << 30,
                    cpu_millicores: c,
                    memory_bytes: 100,
                    memory_peak_bytes: 200,
                    pending_ms,
                    pending_reason: String::new(),
                    gpus: vocab::Gpus::ZERO,
                    oom_kills: 0,
                    gpu_utilisation_pct: 0.0,
                    gpu_memory_bytes: 0,
                    host: String::new(),
                    devices: String::new(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_speed_is_the_mean_of_the_last_window_and_processes_are_counted_by_role() {
        let mut p = Processes::default();
        let job = JobId(1);
        let at = |t: i64, sps: f64, pending: u64| Metric {
            samples_per_second: sps,
            ..report(t, &[100, 100], pending)
        };
        // A slow start, then 40 s at 100, then 200: the window holds the last 30 s only.
        p.fold(job, &[at(0, 5.0, 0)]);
        for t in 1..=4 {
            p.fold(job, &[at(t * 10_000, 100.0, 0)]);
        }
        p.fold(job, &[at(50_000, 200.0, 0)]);
        let s = p.snapshot(job);
        // 20, 30, 40, 50 s: (100 + 100 + 100 + 200) / 4.
        assert_eq!(s.samples_per_second, 125.0);
        assert_eq!(s.roles, vec![(Role::PS, 2, 0)]);
        p.fold(job, &[at(60_000, 200.0, 500)]);
        assert_eq!(p.snapshot(job).roles, vec![(Role::PS, 0, 2)]);
    }

    #[test]
    fn reports_fold_in_time_order_and_processes_that_left_are_dropped() {
        let mut p = Processes::default();
        let job = JobId(1);
        p.fold(job, &[report(3000, &[30], 0), report(1000, &[10, 11], 0)]);
        p.fold(job, &[report(2000, &[20, 21], 0)]); // older than what is known: ignored
        let (ps, workers) = p.of(job, Role::WORKER);
        assert!(workers.is_empty());
        assert_eq!(ps.len(), 1, "ps-1 left in the 3000 report: {ps:?}");
        assert_eq!(
            ps[0].cpu_samples,
            vec![Millicores(10), Millicores(30)],
            "{ps:?}"
        );
        assert_eq!(ps[0].memory_peak, Bytes(200));
        for t in 0..40 {
            p.fold(job, &[report(4000 + t, &[t as u64], 0)]);
        }
        assert_eq!(p.of(job, Role::WORKER).0[0].cpu_samples.len(), CPU_SAMPLES);
        p.fold(job, &[report(10_000, &[0], 1500)]);
        assert_eq!(p.of(job, Role::WORKER).0[0].pending_since_s, Some(8.5));
        p.forget(job);
        assert!(p.of(job, Role::WORKER).0.is_empty());
    }
}
