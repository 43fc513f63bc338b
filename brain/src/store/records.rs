//! The records the store keeps and hands out: metric reports with their checks, job states,
//! shapes, job rows and stored plans.

use serde::{Deserialize, Serialize};

use super::{JobId, Shape};

/// One metric report of a job master, as checked by [`Metric::validate`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metric {
    pub at_unix_ms: i64,
    pub global_step: u64,
    pub samples_per_second: f64,
    pub workers: u32,
    pub ps: u32,
    pub cpu_millicores: u64,
    pub memory_bytes: u64,
    pub gpu_utilisation_pct: f64,
    pub samples_done: u64,
    /// Each process of the job (empty from job masters that do not report them).
    pub processes: Vec<super::ProcessSample>,
    /// Each called role's rates over its master's window (calls between roles).
    pub role_rates: Vec<(vocab::Role, optimizer::live::RoleRate)>,
    /// How much of its master's window (`rates_window_ms`; 0: it does not say) the rates cover.
    pub rates_cover_ms: u64,
    pub rates_window_ms: u64,
    /// The job's effective training time so far (none: not measured).
    pub effective: Option<vocab::report::EffectiveTraining>,
    /// Its training processes flagged as stragglers now.
    pub stragglers: Vec<StragglerNote>,
    /// The nodes its pre-run check found slow (the job avoids them).
    pub slow_nodes: Vec<SlowNode>,
    /// Writes of the job's state its master failed since it started (a failing disk).
    pub state_write_failures: u64,
}

/// A node a job's pre-run check found slow: its address and why, with the figures.
#[derive(Clone, Debug, PartialEq)]
pub struct SlowNode {
    pub host: String,
    pub why: String,
}

/// A straggler a job master reported: which process, on which node, how much slower.
#[derive(Clone, Debug, PartialEq)]
pub struct StragglerNote {
    pub process: vocab::SlotKey,
    pub host: String,
    pub ratio: f64,
}

/// Values no real job reports: beyond them a report is a bug or an attack, not a measurement.
const MAX_SAMPLES_PER_SECOND: f64 = 1e9;
pub(super) const MAX_PROCESSES: u32 = 100_000;
pub(super) const MAX_MILLICORES: u64 = 1 << 40; // ~1e12 millicores
const MAX_MEMORY_BYTES: u64 = 1 << 60; // 1 EiB
/// The longest reason a pending process may carry (job masters send a few lines at most).
const MAX_PENDING_REASON_BYTES: usize = 4096;
const MAX_STEP: u64 = 1 << 53;
/// The longest window of role rates a job master may measure over (an hour).
const MAX_RATES_WINDOW_MS: u64 = 3_600_000;

impl Metric {
    /// Rejects NaN, negative and absurdly large values, naming the field and the value.
    pub fn validate(&self) -> Result<(), String> {
        for (role, r) in &self.role_rates {
            let share = |x: f64| x.is_finite() && (0.0..=1.0).contains(&x);
            if !(share(r.busy_share)
                && share(r.callers_wait_share)
                && share(r.training_wait_share)
                && r.served_per_s.is_finite()
                && (0.0..=MAX_SAMPLES_PER_SECOND).contains(&r.served_per_s))
            {
                return Err(format!(
                    "role rate of {role} is {r:?}: shares from 0 to 1 and a finite rate expected"
                ));
            }
        }
        if self.rates_cover_ms > self.rates_window_ms || self.rates_window_ms > MAX_RATES_WINDOW_MS
        {
            return Err(format!(
                "role rates cover {} ms of a window of {} ms: at most the window, of at most {} ms",
                self.rates_cover_ms, self.rates_window_ms, MAX_RATES_WINDOW_MS
            ));
        }
        let sps = self.samples_per_second;
        if !(sps.is_finite() && (0.0..=MAX_SAMPLES_PER_SECOND).contains(&sps)) {
            return Err(format!(
                "samples_per_second is {sps}, expected 0 to {MAX_SAMPLES_PER_SECOND}"
            ));
        }
        let gpu = self.gpu_utilisation_pct;
        if !(gpu.is_finite() && (0.0..=100.0).contains(&gpu)) {
            return Err(format!("gpu_utilisation_pct is {gpu}, expected 0 to 100"));
        }
        if self.at_unix_ms <= 0 {
            return Err(format!("at_unix_ms is {}", self.at_unix_ms));
        }
        if self.global_step > MAX_STEP {
            return Err(format!("global_step is {}", self.global_step));
        }
        if self.workers > MAX_PROCESSES || self.ps > MAX_PROCESSES {
            return Err(format!("{} workers, {} ps", self.workers, self.ps));
        }
        if self.cpu_millicores > MAX_MILLICORES {
            return Err(format!("cpu_millicores is {}", self.cpu_millicores));
        }
        if self.memory_bytes > MAX_MEMORY_BYTES {
            return Err(format!("memory_bytes is {}", self.memory_bytes));
        }
        if let Some(e) = &self.effective
            && (e.training_ms > e.wall_ms || !(0.0..=1.0).contains(&e.share))
        {
            return Err(format!(
                "effective training {e:?}: more training than wall time"
            ));
        }
        if self.stragglers.len() > MAX_PROCESSES as usize {
            return Err(format!("{} stragglers", self.stragglers.len()));
        }
        for s in &self.stragglers {
            if !(s.ratio.is_finite() && (1.0..=1e6).contains(&s.ratio)) || s.host.len() > 255 {
                return Err(format!(
                    "straggler {}: ratio {} (1 to a million) on a host of {} bytes (at most 255)",
                    s.process,
                    s.ratio,
                    s.host.len()
                ));
            }
        }
        if self.slow_nodes.len() > MAX_PROCESSES as usize {
            return Err(format!("{} slow nodes", self.slow_nodes.len()));
        }
        if let Some(n) = self
            .slow_nodes
            .iter()
            .find(|n| n.host.len() > 255 || n.why.len() > 4096)
        {
            return Err(format!(
                "a slow node of {} bytes (at most 255), why of {} bytes (at most 4,096)",
                n.host.len(),
                n.why.len()
            ));
        }
        if self.processes.len() > MAX_PROCESSES as usize {
            return Err(format!("{} processes", self.processes.len()));
        }
        for p in &self.processes {
            let name = format!("{}-{}", p.role, p.index);
            if p.index >= MAX_PROCESSES {
                return Err(format!("process {name}: index out of range"));
            }
            if p.cpu_limit > MAX_MILLICORES || p.cpu_millicores > MAX_MILLICORES {
                return Err(format!(
                    "process {name}: cpu {}m of a limit of {}m",
                    p.cpu_millicores, p.cpu_limit
                ));
            }
            let gpu = p.gpu_utilisation_pct;
            if !(gpu.is_finite() && (0.0..=100.0).contains(&gpu)) {
                return Err(format!(
                    "process {name}: gpu_utilisation_pct is {gpu}, expected 0 to 100"
                ));
            }
            if [
                p.memory_limit,
                p.memory_bytes,
                p.memory_peak_bytes,
                p.gpu_memory_bytes,
            ]
            .iter()
            .any(|m| *m > MAX_MEMORY_BYTES)
            {
                return Err(format!("process {name}: memory out of range"));
            }
            if p.pending_ms > (1 << 40) {
                return Err(format!("process {name}: pending for {} ms", p.pending_ms));
            }
            if p.pending_reason.len() > MAX_PENDING_REASON_BYTES {
                return Err(format!(
                    "process {name}: a pending reason of {} bytes (at most {MAX_PENDING_REASON_BYTES})",
                    p.pending_reason.len()
                ));
            }
        }
        Ok(())
    }
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Submitted to the brain; its job master starts when a round gives it room.
    Queued,
    Running,
    Succeeded,
    Failed,
    /// Cancelled by an operator (`brainctl cancel`).
    Cancelled,
}

impl rusqlite::types::FromSql for JobState {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        JobState::parse(v.as_str()?).map_err(|e| rusqlite::types::FromSqlError::Other(e.into()))
    }
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Result<JobState, String> {
        match s {
            "queued" => Ok(JobState::Queued),
            "running" => Ok(JobState::Running),
            "succeeded" => Ok(JobState::Succeeded),
            "failed" => Ok(JobState::Failed),
            "cancelled" => Ok(JobState::Cancelled),
            other => Err(format!("unknown job state {other:?}")),
        }
    }

    /// The final state a job master's final phase records.
    pub fn ended(phase: vocab::Phase) -> Option<JobState> {
        match phase {
            vocab::Phase::Succeeded => Some(JobState::Succeeded),
            vocab::Phase::Failed => Some(JobState::Failed),
            vocab::Phase::Cancelled => Some(JobState::Cancelled),
            vocab::Phase::Running | vocab::Phase::Finishing => None,
        }
    }

    pub fn finished(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// What the brain knows of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    pub id: JobId,
    pub name: String,
    pub master_address: String,
    pub registered_unix_ms: i64,
    pub reports: u64,
    pub last_global_step: u64,
    pub mean_samples_per_second: f64,
    pub peak_memory_bytes: u64,
    /// The newest plan version, 0 if none.
    pub plan_version: u64,
    /// The newest version the job master accepted, and the newest it carried out.
    pub acked_version: u64,
    pub reached_version: u64,
    pub state: JobState,
    pub shape: Option<Shape>,
    /// The spec a user submitted (YAML), for jobs the brain starts.
    pub spec: Option<String>,
    /// Why the brain sized the job as it did.
    pub reasons: Vec<String>,
    pub run_dir: String,
    /// Workers in force: started with, or the newest plan's.
    pub workers: u32,
    pub peak_workers: u32,
    pub last_change_unix_ms: Option<i64>,
    pub started_unix_ms: Option<i64>,
    pub finished_unix_ms: Option<i64>,
    pub samples_done: u64,
    pub outcome: String,
    /// The newest plan version the job master refused (0: none).
    pub rejected_version: u64,
    /// Workers the job master last reported running with.
    pub reported_workers: u32,
    /// The most CPU and memory one of its processes used (from the reports' sums).
    pub peak_process_millicores: u64,
    pub peak_process_memory_bytes: u64,
    /// The most CPU one of its parameter servers used (from the per-process reports).
    pub peak_ps_millicores: u64,
    /// Why an operator asked to cancel it, while its job master has not yet ended it.
    pub cancel_requested: Option<String>,
}

/// A stored plan: its version and its encoded body (the wire `ScalePlan`).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredPlan {
    pub version: u64,
    pub body: Vec<u8>,
}
