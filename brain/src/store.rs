//! The brain's durable state in an embedded SQLite database (WAL): jobs, per-job metric
//! summaries, scale plans and their acknowledgements. Every change is one transaction, so a
//! brain killed at any instant reopens with each change either wholly there or not at all.
//!
//! Raw metric time series are not kept here (they belong in the InfluxDB sink); each accepted
//! batch updates the job's summary: reports seen, last global step, mean samples/s, peak memory.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::BrainError;

/// A job's id in the brain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u64);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {}", self.0)
    }
}

/// One metric report of a job master, as checked by [`Metric::validate`].
#[derive(Clone, Debug, PartialEq)]
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
}

/// Values no real job reports: beyond them a report is a bug or an attack, not a measurement.
const MAX_SAMPLES_PER_SECOND: f64 = 1e9;
const MAX_PROCESSES: u32 = 100_000;
const MAX_MILLICORES: u64 = 1 << 40; // ~1e12 millicores
const MAX_MEMORY_BYTES: u64 = 1 << 60; // 1 EiB
const MAX_STEP: u64 = 1 << 53;

impl Metric {
    /// Rejects NaN, negative and absurdly large values, naming the field and the value.
    pub fn validate(&self) -> Result<(), String> {
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
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> JobState {
        match s {
            "queued" => JobState::Queued,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            _ => JobState::Running,
        }
    }

    pub fn finished(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed)
    }
}

/// What the brain plans with: a job's kind, roles, bounds, process sizes and data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// `ps` or `allreduce`.
    pub kind: String,
    pub workers: u32,
    pub min_workers: u32,
    pub max_workers: u32,
    pub node_unit: u32,
    pub ps: u32,
    pub worker_millicores: u64,
    pub worker_memory_bytes: u64,
    pub worker_gpus: u32,
    pub ps_millicores: u64,
    pub ps_memory_bytes: u64,
    /// Samples over all epochs.
    pub total_samples: u64,
}

impl Shape {
    /// Rejects shapes no job can have, naming the field and its value.
    pub fn validate(&self) -> Result<(), String> {
        match self.kind.as_str() {
            "ps" if self.ps == 0 => return Err("a ps job with 0 parameter servers".into()),
            "allreduce" if self.ps > 0 => {
                return Err(format!(
                    "an allreduce job with {} parameter servers",
                    self.ps
                ));
            }
            "ps" | "allreduce" => {}
            other => return Err(format!("kind {other:?}: expected \"ps\" or \"allreduce\"")),
        }
        if self.min_workers == 0 || self.min_workers > self.max_workers {
            return Err(format!(
                "min_workers {} and max_workers {}: expected 1 <= min <= max",
                self.min_workers, self.max_workers
            ));
        }
        if self.max_workers > MAX_PROCESSES || self.ps > MAX_PROCESSES {
            return Err(format!("{} workers, {} ps", self.max_workers, self.ps));
        }
        if !(self.min_workers..=self.max_workers).contains(&self.workers) {
            return Err(format!(
                "workers {} outside [{}, {}]",
                self.workers, self.min_workers, self.max_workers
            ));
        }
        if self.node_unit == 0 {
            return Err("node_unit 0".into());
        }
        if self.worker_millicores == 0 || (self.ps > 0 && self.ps_millicores == 0) {
            return Err("a process with 0 millicores of CPU".into());
        }
        if self.worker_millicores > MAX_MILLICORES || self.ps_millicores > MAX_MILLICORES {
            return Err(format!(
                "worker_millicores {}, ps_millicores {}",
                self.worker_millicores, self.ps_millicores
            ));
        }
        if self.total_samples == 0 {
            return Err("total_samples 0".into());
        }
        Ok(())
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
}

/// A stored plan: its version and its encoded body (the wire `ScalePlan`).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredPlan {
    pub version: u64,
    pub body: Vec<u8>,
}

pub struct Store {
    conn: Connection,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    master_address TEXT NOT NULL,
    registered_unix_ms INTEGER NOT NULL,
    reports INTEGER NOT NULL DEFAULT 0,
    last_global_step INTEGER NOT NULL DEFAULT 0,
    sum_samples_per_second REAL NOT NULL DEFAULT 0,
    peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
    acked_version INTEGER NOT NULL DEFAULT 0,
    reached_version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS speeds (
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    workers INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    sum_samples_per_second REAL NOT NULL,
    PRIMARY KEY (job_id, workers)
);
CREATE TABLE IF NOT EXISTS plans (
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    version INTEGER NOT NULL,
    body BLOB NOT NULL,
    reason TEXT NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    accepted INTEGER,
    answer TEXT,
    PRIMARY KEY (job_id, version)
);
";

impl Store {
    /// Opens (or creates) the database at `path` in WAL mode.
    pub fn open(path: &Path) -> Result<Store, BrainError> {
        let conn = Connection::open(path)?;
        // WAL: readers never block the writer; NORMAL sync loses nothing on a process crash.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(SCHEMA)?;
        migrate(&conn)?;
        Ok(Store { conn })
    }

    /// Registers `name`, or finds it registered (a restarted job master keeps its id and gets
    /// its address updated). Returns the id and the newest plan version.
    /// A job master that was not started by the brain brings its `shape`; one the brain
    /// started keeps the shape the brain gave it.
    pub fn register(
        &mut self,
        name: &str,
        master_address: &str,
        shape: Option<&Shape>,
        now_unix_ms: i64,
    ) -> Result<(JobId, u64), BrainError> {
        check_name(name)?;
        if let Some(shape) = shape {
            shape
                .validate()
                .map_err(|e| BrainError::InvalidArgument(format!("job {name:?}: shape: {e}")))?;
        }
        let shape_json = shape.map(|s| serde_json::to_string(s).expect("plain struct"));
        let workers = shape.map_or(0, |s| s.workers);
        let tx = self.conn.transaction()?;
        // Update first: an upsert would use up an id on every registration again.
        let updated = tx.execute(
            "UPDATE jobs SET master_address = ?2,
                 workers = CASE WHEN shape IS NULL AND ?3 IS NOT NULL THEN ?4 ELSE workers END,
                 peak_workers = MAX(peak_workers,
                     CASE WHEN shape IS NULL AND ?3 IS NOT NULL THEN ?4 ELSE workers END),
                 shape = COALESCE(shape, ?3),
                 state = CASE WHEN state = 'queued' THEN 'running' ELSE state END
             WHERE name = ?1",
            params![name, master_address, shape_json, workers],
        )?;
        if updated == 0 {
            tx.execute(
                "INSERT INTO jobs (name, master_address, registered_unix_ms, shape, workers,
                                   peak_workers, last_change_unix_ms, started_unix_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?3, ?3)",
                params![name, master_address, now_unix_ms, shape_json, workers],
            )?;
        }
        let id: i64 = tx.query_row("SELECT id FROM jobs WHERE name = ?1", [name], |r| r.get(0))?;
        let version = newest_version(&tx, id)?;
        tx.commit()?;
        Ok((JobId(id as u64), version))
    }

    /// Queues a submitted job with the shape the brain predicted and why. A name is used once:
    /// the runs of the past are the history the brain learns from.
    pub fn submit(
        &mut self,
        name: &str,
        spec: &str,
        shape: &Shape,
        reasons: &[String],
        now_unix_ms: i64,
    ) -> Result<JobId, BrainError> {
        check_name(name)?;
        shape
            .validate()
            .map_err(|e| BrainError::InvalidArgument(format!("job {name:?}: {e}")))?;
        let tx = self.conn.transaction()?;
        let taken: Option<(i64, String)> = tx
            .query_row("SELECT id, state FROM jobs WHERE name = ?1", [name], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        if let Some((id, state)) = taken {
            return Err(BrainError::InvalidArgument(format!(
                "the name {name:?} is taken by job {id} ({state}); give the job another name"
            )));
        }
        tx.execute(
            "INSERT INTO jobs (name, master_address, registered_unix_ms, state, shape, spec,
                               reasons, workers)
             VALUES (?1, '', ?2, 'queued', ?3, ?4, ?5, ?6)",
            params![
                name,
                now_unix_ms,
                serde_json::to_string(shape).expect("plain struct"),
                spec,
                serde_json::to_string(reasons).expect("strings"),
                shape.workers
            ],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(JobId(id as u64))
    }

    /// Records that the brain started a queued job's master with `workers` workers.
    pub fn started(
        &mut self,
        job: JobId,
        workers: u32,
        run_dir: &str,
        now_unix_ms: i64,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        self.conn.execute(
            "UPDATE jobs SET state = 'running', workers = ?2, peak_workers = MAX(peak_workers, ?2),
                 run_dir = ?3, last_change_unix_ms = ?4, started_unix_ms = ?4
             WHERE id = ?1 AND state = 'queued'",
            params![id, workers, run_dir, now_unix_ms],
        )?;
        Ok(())
    }

    /// Adds a line to what the brain says about a job (`brainctl status` shows them).
    pub fn add_reason(&mut self, job: JobId, reason: &str) -> Result<(), BrainError> {
        let mut row = self.job(job)?;
        row.reasons.push(reason.to_string());
        self.conn.execute(
            "UPDATE jobs SET reasons = ?2 WHERE id = ?1",
            params![
                self.known(job)?,
                serde_json::to_string(&row.reasons).expect("strings")
            ],
        )?;
        Ok(())
    }

    /// Records how a job ended. A second report of the same end changes nothing.
    pub fn finish(
        &mut self,
        job: JobId,
        succeeded: bool,
        outcome: &str,
        samples_done: u64,
        now_unix_ms: i64,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        self.conn.execute(
            "UPDATE jobs SET state = ?2, outcome = ?3, samples_done = MAX(samples_done, ?4),
                 finished_unix_ms = COALESCE(finished_unix_ms, ?5)
             WHERE id = ?1",
            params![
                id,
                if succeeded { "succeeded" } else { "failed" },
                outcome,
                samples_done as i64,
                now_unix_ms
            ],
        )?;
        Ok(())
    }

    /// Stores a trained model under `name` (replacing the previous one).
    pub fn save_model(
        &mut self,
        name: &str,
        body: &str,
        now_unix_ms: i64,
    ) -> Result<(), BrainError> {
        self.conn.execute(
            "INSERT INTO models (name, body, trained_unix_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT(name) DO UPDATE SET body = excluded.body,
                 trained_unix_ms = excluded.trained_unix_ms",
            params![name, body, now_unix_ms],
        )?;
        Ok(())
    }

    /// A stored model and when it was trained.
    pub fn model(&self, name: &str) -> Result<Option<(String, i64)>, BrainError> {
        Ok(self
            .conn
            .query_row(
                "SELECT body, trained_unix_ms FROM models WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// The job's name.
    pub fn name(&self, job: JobId) -> Result<String, BrainError> {
        let id = self.known(job)?;
        Ok(self
            .conn
            .query_row("SELECT name FROM jobs WHERE id = ?1", [id], |r| r.get(0))?)
    }

    /// Mean samples/s the job reported at each worker count, by count.
    pub fn speeds(&self, job: JobId) -> Result<Vec<(u32, f64)>, BrainError> {
        let id = self.known(job)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT workers, sum_samples_per_second / reports FROM speeds
             WHERE job_id = ?1 ORDER BY workers",
        )?;
        let rows = stmt.query_map([id], |r| Ok((r.get::<_, i64>(0)? as u32, r.get(1)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Jobs queued or running, by id.
    pub fn active(&self) -> Result<Vec<JobRow>, BrainError> {
        Ok(self
            .rows(None)?
            .into_iter()
            .filter(|r| !r.state.finished())
            .collect())
    }

    fn known(&self, job: JobId) -> Result<i64, BrainError> {
        let id = i64::try_from(job.0).map_err(|_| BrainError::UnknownJob(job.0))?;
        let found: Option<i64> = self
            .conn
            .query_row("SELECT id FROM jobs WHERE id = ?1", [id], |r| r.get(0))
            .optional()?;
        found.ok_or(BrainError::UnknownJob(job.0))
    }

    /// Checks every report, then folds them all into the job's summary in one transaction:
    /// a batch with one bad report changes nothing.
    pub fn add_metrics(&mut self, job: JobId, reports: &[Metric]) -> Result<usize, BrainError> {
        let id = self.known(job)?;
        for (i, m) in reports.iter().enumerate() {
            m.validate()
                .map_err(|e| BrainError::InvalidArgument(format!("report {i} of {job}: {e}")))?;
        }
        if reports.is_empty() {
            return Ok(0);
        }
        let last = reports
            .iter()
            .max_by_key(|m| (m.at_unix_ms, m.global_step))
            .expect("not empty");
        let sum: f64 = reports.iter().map(|m| m.samples_per_second).sum();
        let peak = reports.iter().map(|m| m.memory_bytes).max().unwrap_or(0);
        let samples_done = reports.iter().map(|m| m.samples_done).max().unwrap_or(0);
        // What one process used at most (reports carry sums over the job's processes).
        let per = |v: u64, m: &Metric| v / (m.workers + m.ps).max(1) as u64;
        let peak_cpu = reports
            .iter()
            .map(|m| per(m.cpu_millicores, m))
            .max()
            .unwrap_or(0);
        let peak_mem = reports
            .iter()
            .map(|m| per(m.memory_bytes, m))
            .max()
            .unwrap_or(0);
        let tx = self.conn.transaction()?;
        {
            let mut speed = tx.prepare_cached(
                "INSERT INTO speeds (job_id, workers, reports, sum_samples_per_second)
                 VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT(job_id, workers) DO UPDATE SET reports = reports + 1,
                     sum_samples_per_second = sum_samples_per_second + excluded.sum_samples_per_second",
            )?;
            for m in reports
                .iter()
                .filter(|m| m.workers > 0 && m.samples_per_second > 0.0)
            {
                speed.execute(params![id, m.workers, m.samples_per_second])?;
            }
        }
        tx.execute(
            "UPDATE jobs SET samples_done = MAX(samples_done, ?2), reported_workers = ?3,
                 peak_process_millicores = MAX(peak_process_millicores, ?4),
                 peak_process_memory_bytes = MAX(peak_process_memory_bytes, ?5)
             WHERE id = ?1",
            params![
                id,
                samples_done as i64,
                last.workers,
                peak_cpu as i64,
                peak_mem as i64
            ],
        )?;
        tx.execute(
            "UPDATE jobs SET reports = reports + ?2,
                 last_global_step = MAX(last_global_step, ?3),
                 sum_samples_per_second = sum_samples_per_second + ?4,
                 peak_memory_bytes = MAX(peak_memory_bytes, ?5)
             WHERE id = ?1",
            params![
                id,
                reports.len() as i64,
                last.global_step as i64,
                sum,
                peak as i64
            ],
        )?;
        tx.commit()?;
        Ok(reports.len())
    }

    /// Stores `body` as the job's next plan version.
    /// `workers`, when the plan sets the worker count, becomes the count in force.
    pub fn propose_plan(
        &mut self,
        job: JobId,
        body: &dyn Fn(u64) -> Vec<u8>,
        reason: &str,
        workers: Option<u32>,
        now_unix_ms: i64,
    ) -> Result<u64, BrainError> {
        let id = self.known(job)?;
        let tx = self.conn.transaction()?;
        let version = newest_version(&tx, id)? + 1;
        tx.execute(
            "INSERT INTO plans (job_id, version, body, reason, created_unix_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, version as i64, body(version), reason, now_unix_ms],
        )?;
        if let Some(w) = workers {
            tx.execute(
                "UPDATE jobs SET workers = ?2, peak_workers = MAX(peak_workers, ?2),
                     last_change_unix_ms = ?3
                 WHERE id = ?1",
                params![id, w, now_unix_ms],
            )?;
        }
        tx.commit()?;
        Ok(version)
    }

    /// The newest plan above `after`, if any.
    pub fn plan_after(&self, job: JobId, after: u64) -> Result<Option<StoredPlan>, BrainError> {
        let id = self.known(job)?;
        Ok(self
            .conn
            .query_row(
                "SELECT version, body FROM plans WHERE job_id = ?1 AND version > ?2
                 ORDER BY version DESC LIMIT 1",
                params![id, after as i64],
                |r| {
                    Ok(StoredPlan {
                        version: r.get::<_, i64>(0)? as u64,
                        body: r.get(1)?,
                    })
                },
            )
            .optional()?)
    }

    /// Records the job master's answer to plan `version` and how far it has got.
    pub fn ack_plan(
        &mut self,
        job: JobId,
        version: u64,
        accepted: bool,
        answer: &str,
        reached: u64,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        let newest = newest_version(&self.conn, id)?;
        if version == 0 || version > newest || reached > newest {
            return Err(BrainError::InvalidArgument(format!(
                "{job} acknowledges version {version} (reached {reached}), the newest plan is \
                 {newest}"
            )));
        }
        let tx = self.conn.transaction()?;
        tx.execute(
            "UPDATE plans SET accepted = ?3, answer = ?4 WHERE job_id = ?1 AND version = ?2",
            params![id, version as i64, accepted, answer],
        )?;
        if accepted {
            tx.execute(
                "UPDATE jobs SET acked_version = MAX(acked_version, ?2) WHERE id = ?1",
                params![id, version as i64],
            )?;
        } else {
            // The count in force is what the job last reported running with.
            tx.execute(
                "UPDATE jobs SET workers = reported_workers WHERE id = ?1 AND reported_workers > 0",
                [id],
            )?;
        }
        tx.execute(
            "UPDATE jobs SET reached_version = MAX(reached_version, ?2) WHERE id = ?1",
            params![id, reached as i64],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub fn job(&self, job: JobId) -> Result<JobRow, BrainError> {
        let id = self.known(job)?;
        self.rows(Some(id))?
            .pop()
            .ok_or(BrainError::UnknownJob(job.0))
    }

    /// Every job, by id.
    pub fn jobs(&self) -> Result<Vec<JobRow>, BrainError> {
        self.rows(None)
    }

    fn rows(&self, only: Option<i64>) -> Result<Vec<JobRow>, BrainError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, name, master_address, registered_unix_ms, reports, last_global_step,
                    sum_samples_per_second, peak_memory_bytes, acked_version, reached_version,
                    (SELECT COALESCE(MAX(version), 0) FROM plans WHERE job_id = jobs.id),
                    state, shape, spec, reasons, run_dir, workers, peak_workers,
                    last_change_unix_ms, started_unix_ms, finished_unix_ms, samples_done, outcome,
                    (SELECT COALESCE(MAX(version), 0) FROM plans
                     WHERE job_id = jobs.id AND accepted = 0),
                    reported_workers, peak_process_millicores, peak_process_memory_bytes
             FROM jobs WHERE ?1 IS NULL OR id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([only], |r| {
            let reports = r.get::<_, i64>(4)? as u64;
            let sum: f64 = r.get(6)?;
            Ok(JobRow {
                id: JobId(r.get::<_, i64>(0)? as u64),
                name: r.get(1)?,
                master_address: r.get(2)?,
                registered_unix_ms: r.get(3)?,
                reports,
                last_global_step: r.get::<_, i64>(5)? as u64,
                mean_samples_per_second: if reports > 0 {
                    sum / reports as f64
                } else {
                    0.0
                },
                peak_memory_bytes: r.get::<_, i64>(7)? as u64,
                acked_version: r.get::<_, i64>(8)? as u64,
                reached_version: r.get::<_, i64>(9)? as u64,
                plan_version: r.get::<_, i64>(10)? as u64,
                state: JobState::parse(&r.get::<_, String>(11)?),
                shape: r
                    .get::<_, Option<String>>(12)?
                    .and_then(|j| serde_json::from_str(&j).ok()),
                spec: r.get(13)?,
                reasons: serde_json::from_str(&r.get::<_, String>(14)?).unwrap_or_default(),
                run_dir: r.get(15)?,
                workers: r.get::<_, i64>(16)? as u32,
                peak_workers: r.get::<_, i64>(17)? as u32,
                last_change_unix_ms: r.get(18)?,
                started_unix_ms: r.get(19)?,
                finished_unix_ms: r.get(20)?,
                samples_done: r.get::<_, i64>(21)? as u64,
                outcome: r.get(22)?,
                rejected_version: r.get::<_, i64>(23)? as u64,
                reported_workers: r.get::<_, i64>(24)? as u32,
                peak_process_millicores: r.get::<_, i64>(25)? as u64,
                peak_process_memory_bytes: r.get::<_, i64>(26)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

fn check_name(name: &str) -> Result<(), BrainError> {
    let ok = !name.trim().is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(BrainError::InvalidArgument(format!(
            "job name {name:?}: expected 1 to 128 letters, digits, '-', '_' or '.'"
        )))
    }
}

/// Columns added after the first release of the schema, in order; `user_version` counts how
/// many a database has.
const MIGRATIONS: &[&str] = &[
    "ALTER TABLE jobs ADD COLUMN state TEXT NOT NULL DEFAULT 'running'",
    "ALTER TABLE jobs ADD COLUMN shape TEXT",
    "ALTER TABLE jobs ADD COLUMN spec TEXT",
    "ALTER TABLE jobs ADD COLUMN reasons TEXT NOT NULL DEFAULT '[]'",
    "ALTER TABLE jobs ADD COLUMN run_dir TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE jobs ADD COLUMN workers INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN peak_workers INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN last_change_unix_ms INTEGER",
    "ALTER TABLE jobs ADD COLUMN samples_done INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN outcome TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE jobs ADD COLUMN started_unix_ms INTEGER",
    "ALTER TABLE jobs ADD COLUMN finished_unix_ms INTEGER",
    "ALTER TABLE jobs ADD COLUMN reported_workers INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN peak_process_millicores INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN peak_process_memory_bytes INTEGER NOT NULL DEFAULT 0",
    "CREATE TABLE models (name TEXT PRIMARY KEY, body TEXT NOT NULL, trained_unix_ms INTEGER NOT NULL)",
];

fn migrate(conn: &Connection) -> Result<(), BrainError> {
    let have: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if have as usize > MIGRATIONS.len() {
        return Err(BrainError::Invalid(format!(
            "the database has schema version {have}, newer than this brain's {}",
            MIGRATIONS.len()
        )));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(have as usize) {
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(m)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

fn newest_version(conn: &Connection, job: i64) -> Result<u64, BrainError> {
    let v: i64 = conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM plans WHERE job_id = ?1",
        [job],
        |r| r.get(0),
    )?;
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(step: u64, sps: f64) -> Metric {
        Metric {
            at_unix_ms: 1_700_000_000_000 + step as i64,
            global_step: step,
            samples_per_second: sps,
            workers: 2,
            ps: 1,
            cpu_millicores: 4000,
            memory_bytes: 1 << 30,
            gpu_utilisation_pct: 50.0,
            samples_done: step * 10,
        }
    }

    #[test]
    fn jobs_plans_and_summaries_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("brain.db");
        let mut s = Store::open(&path).unwrap();
        let (a, v) = s.register("a", "127.0.0.1:1", None, 10).unwrap();
        assert_eq!(v, 0);
        assert_eq!(s.register("a", "127.0.0.1:2", None, 20).unwrap(), (a, 0));
        assert_eq!(
            s.add_metrics(a, &[metric(10, 100.0), metric(20, 300.0)])
                .unwrap(),
            2
        );
        let v1 = s
            .propose_plan(a, &|v| vec![v as u8], "grow", Some(4), 30)
            .unwrap();
        let v2 = s
            .propose_plan(a, &|v| vec![v as u8], "grow more", None, 40)
            .unwrap();
        assert_eq!((v1, v2), (1, 2));
        assert_eq!(
            s.plan_after(a, 0).unwrap(),
            Some(StoredPlan {
                version: 2,
                body: vec![2]
            })
        );
        assert_eq!(s.plan_after(a, 2).unwrap(), None);
        s.ack_plan(a, 2, true, "", 1).unwrap();
        drop(s);
        let s = Store::open(&path).unwrap();
        let row = s.job(a).unwrap();
        assert_eq!(row.master_address, "127.0.0.1:2");
        assert_eq!(row.registered_unix_ms, 10);
        assert_eq!((row.reports, row.last_global_step), (2, 20));
        assert_eq!(row.mean_samples_per_second, 200.0);
        assert_eq!(
            (row.plan_version, row.acked_version, row.reached_version),
            (2, 2, 1)
        );
        assert_eq!(s.jobs().unwrap().len(), 1);
    }

    #[test]
    fn bad_reports_change_nothing_and_say_what_was_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("brain.db")).unwrap();
        let (a, _) = s.register("a", "x", None, 1).unwrap();
        let huge = Metric {
            memory_bytes: u64::MAX,
            ..metric(1, 1.0)
        };
        for (bad, says) in [
            (metric(1, f64::NAN), "samples_per_second is NaN"),
            (metric(1, -5.0), "samples_per_second is -5"),
            (metric(1, f64::INFINITY), "samples_per_second is inf"),
            (huge, "memory_bytes is 18446744073709551615"),
        ] {
            let e = s.add_metrics(a, &[metric(1, 1.0), bad]).unwrap_err();
            assert!(
                matches!(&e, BrainError::InvalidArgument(m) if m.contains("report 1 of job 1") && m.contains(says)),
                "{e}"
            );
        }
        assert_eq!(s.job(a).unwrap().reports, 0);
        assert!(matches!(
            s.add_metrics(JobId(99), &[metric(1, 1.0)]),
            Err(BrainError::UnknownJob(99))
        ));
        assert!(matches!(
            s.ack_plan(a, 1, true, "", 0),
            Err(BrainError::InvalidArgument(_))
        ));
        assert!(s.register("", "x", None, 1).is_err());
    }
}
