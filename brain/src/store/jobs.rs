//! Jobs: registration, submission, start, reasons, outcome, models, and the rows read back.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};

use super::*;

/// Per job, the mean samples/s at each worker count: `(workers, samples_per_s)`.
pub type SpeedsByJob = std::collections::BTreeMap<JobId, Vec<(u32, f64)>>;
/// Per job, the mean samples/s at each (workers, PS) pair: `(workers, ps, samples_per_s)`.
pub type PsSpeedsByJob = std::collections::BTreeMap<JobId, Vec<(u32, u32, f64)>>;

impl Store {
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
        let workers = shape.map_or(0, |s| s.training_group().count);
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
            return Err(BrainError::AlreadyExists(format!(
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
                shape.training_group().count
            ],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(JobId(id as u64))
    }

    /// Records that the brain started a queued job's master with `workers` processes of its
    /// training group (of GPU model `gpu_type`, for a GPU job: kept in its shape as the
    /// training group's).
    pub fn started(
        &mut self,
        job: JobId,
        workers: u32,
        gpu_type: Option<&str>,
        run_dir: &str,
        now_unix_ms: i64,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        self.conn.execute(
            "UPDATE jobs SET state = 'running', workers = ?2, peak_workers = MAX(peak_workers, ?2),
                 run_dir = ?3, last_change_unix_ms = ?4, started_unix_ms = ?4,
                 shape = CASE WHEN ?5 IS NULL THEN shape ELSE json_set(shape,
                     '$.roles.\"' || json_extract(shape, '$.training') || '\".gpu_type', ?5) END
             WHERE id = ?1 AND state = 'queued'",
            params![id, workers, run_dir, now_unix_ms, gpu_type],
        )?;
        Ok(())
    }

    /// Remembers where the round placed the job's processes when it started it, by role as
    /// the job names them, until its next start (stored: a restarted brain holds their room
    /// there too until they run).
    pub fn started_on(
        &mut self,
        job: JobId,
        nodes: &BTreeMap<vocab::Role, Vec<String>>,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        self.conn.execute(
            "UPDATE jobs SET start_nodes = ?2 WHERE id = ?1",
            params![id, serde_json::to_string(nodes).expect("names")],
        )?;
        Ok(())
    }

    /// Where the round placed the job's processes when it started it ([`Self::started_on`];
    /// none where it named none).
    pub fn start_nodes(
        &self,
        job: JobId,
    ) -> Result<BTreeMap<vocab::Role, Vec<String>>, BrainError> {
        let id = self.known(job)?;
        Ok(self
            .conn
            .query_row("SELECT start_nodes FROM jobs WHERE id = ?1", [id], |r| {
                json_column(r, "start_nodes")
            })?)
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

    /// Records that an operator asked to cancel a running job (its job master learns it from
    /// its next plan poll and ends it).
    pub fn request_cancel(&mut self, job: JobId, reason: &str) -> Result<(), BrainError> {
        let id = self.known(job)?;
        self.conn.execute(
            "UPDATE jobs SET cancel_requested = ?2 WHERE id = ?1",
            params![id, reason],
        )?;
        Ok(())
    }

    /// Records how a job ended (`state` is one of the final states). A second report of the
    /// same end changes nothing.
    pub fn finish(
        &mut self,
        job: JobId,
        state: JobState,
        outcome: &str,
        samples_done: u64,
        now_unix_ms: i64,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        if !state.finished() {
            return Err(BrainError::Internal(format!(
                "{job} cannot end {}",
                state.as_str()
            )));
        }
        self.conn.execute(
            "UPDATE jobs SET state = ?2, outcome = ?3, samples_done = MAX(samples_done, ?4),
                 finished_unix_ms = COALESCE(finished_unix_ms, ?5)
             WHERE id = ?1",
            params![
                id,
                state.as_str(),
                outcome,
                samples_done as i64,
                now_unix_ms
            ],
        )?;
        self.processes.forget(job);
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

    /// Every job's mean samples/s per (workers, PS) pair, in one query (sizing a submission
    /// from the PS jobs before it).
    pub fn all_ps_speeds(&self) -> Result<PsSpeedsByJob, BrainError> {
        self.ps_speeds_by_job(false)
    }

    /// Mean samples/s per (workers, PS) pair of every job, or of the queued and running ones.
    fn ps_speeds_by_job(&self, active: bool) -> Result<PsSpeedsByJob, BrainError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT job_id, workers, ps, sum_samples_per_second / reports FROM ps_speeds
             WHERE ?1 = 0 OR job_id IN (SELECT id FROM jobs WHERE state IN ('queued', 'running'))
             ORDER BY job_id, workers, ps",
        )?;
        let mut out = PsSpeedsByJob::new();
        let rows = stmt.query_map([active], |r| {
            Ok((
                JobId(r.get::<_, i64>(0)? as u64),
                r.get::<_, i64>(1)? as u32,
                r.get::<_, i64>(2)? as u32,
                r.get(3)?,
            ))
        })?;
        for row in rows {
            let (job, w, p, sps) = row?;
            out.entry(job).or_default().push((w, p, sps));
        }
        Ok(out)
    }

    /// Mean samples/s the job reported at each (workers, PS) pair.
    pub fn ps_speeds(&self, job: JobId) -> Result<Vec<(u32, u32, f64)>, BrainError> {
        let id = self.known(job)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT workers, ps, sum_samples_per_second / reports FROM ps_speeds
             WHERE job_id = ?1 ORDER BY workers, ps",
        )?;
        let rows = stmt.query_map([id], |r| {
            Ok((
                r.get::<_, i64>(0)? as u32,
                r.get::<_, i64>(1)? as u32,
                r.get(2)?,
            ))
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Jobs queued or running, by id (the finished ones are not even read).
    pub fn active(&self) -> Result<Vec<JobRow>, BrainError> {
        Ok(self
            .rows(None, true)?
            .into_iter()
            .filter(|r| !r.state.finished())
            .collect())
    }

    /// The queued and running jobs' mean samples/s per worker count and per (workers, PS)
    /// pair, in two queries (what a round reads for every job).
    pub fn active_speeds(&self) -> Result<(SpeedsByJob, PsSpeedsByJob), BrainError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT job_id, workers, sum_samples_per_second / reports FROM speeds
             WHERE job_id IN (SELECT id FROM jobs WHERE state IN ('queued', 'running'))
             ORDER BY job_id, workers",
        )?;
        let mut speeds = SpeedsByJob::new();
        let rows = stmt.query_map([], |r| {
            Ok((
                JobId(r.get::<_, i64>(0)? as u64),
                r.get::<_, i64>(1)? as u32,
                r.get(2)?,
            ))
        })?;
        for row in rows {
            let (job, w, sps) = row?;
            speeds.entry(job).or_default().push((w, sps));
        }
        let ps_speeds = self.ps_speeds_by_job(true)?;
        Ok((speeds, ps_speeds))
    }

    /// The role each queued or running job calls its training group, where it names one of its
    /// own (the others' is `worker`): what a round's decisions speak, read in one query.
    pub fn trainers(&self) -> Result<std::collections::HashMap<JobId, vocab::Role>, BrainError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, json_extract(shape, '$.training') AS role FROM jobs
             WHERE state IN ('queued', 'running') AND role IS NOT NULL AND role != 'worker'",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((JobId(r.get::<_, i64>(0)? as u64), r.get::<_, String>(1)?))
        })?;
        let mut trainers = std::collections::HashMap::new();
        for row in rows {
            let (job, role) = row?;
            let role = vocab::Role::new(&role).map_err(|e| {
                BrainError::Internal(format!("job {}'s stored training role: {e}", job.0))
            })?;
            trainers.insert(job, role);
        }
        Ok(trainers)
    }

    pub fn job(&self, job: JobId) -> Result<JobRow, BrainError> {
        let id = self.known(job)?;
        self.rows(Some(id), false)?
            .pop()
            .ok_or(BrainError::UnknownJob(job.0))
    }

    /// The job named `name`, if any (names are never reused).
    pub fn job_by_name(&self, name: &str) -> Result<Option<JobRow>, BrainError> {
        let id: Option<i64> = self
            .conn
            .query_row("SELECT id FROM jobs WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        match id {
            Some(id) => Ok(self.rows(Some(id), false)?.pop()),
            None => Ok(None),
        }
    }

    /// Every job, by id.
    pub fn jobs(&self) -> Result<Vec<JobRow>, BrainError> {
        self.rows(None, false)
    }

    /// Jobs by id: one (`only`), the queued and running ones (`active`), or all.
    pub(super) fn rows(&self, only: Option<i64>, active: bool) -> Result<Vec<JobRow>, BrainError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, name, master_address, registered_unix_ms, reports, last_global_step,
                    sum_samples_per_second, peak_memory_bytes, acked_version, reached_version,
                    (SELECT COALESCE(MAX(version), 0) FROM plans WHERE job_id = jobs.id)
                        AS plan_version,
                    state, shape, spec, reasons, run_dir, workers, peak_workers,
                    last_change_unix_ms, started_unix_ms, finished_unix_ms, samples_done, outcome,
                    (SELECT COALESCE(MAX(version), 0) FROM plans
                     WHERE job_id = jobs.id AND accepted = 0) AS rejected_version,
                    reported_workers, peak_process_millicores, peak_process_memory_bytes,
                    cancel_requested, peak_ps_millicores
             FROM jobs WHERE (?1 IS NULL OR id = ?1)
                 AND (?2 = 0 OR state IN ('queued', 'running'))
             ORDER BY id",
        )?;
        let rows = stmt.query_map(rusqlite::params![only, active], |r| {
            let count = |c: &str| r.get::<_, i64>(c).map(|v| v as u64);
            let reports = count("reports")?;
            let sum: f64 = r.get("sum_samples_per_second")?;
            let shape = match r.get::<_, Option<String>>("shape")? {
                Some(_) => Some(json_column(r, "shape")?),
                None => None,
            };
            Ok(JobRow {
                id: JobId(count("id")?),
                name: r.get("name")?,
                master_address: r.get("master_address")?,
                registered_unix_ms: r.get("registered_unix_ms")?,
                reports,
                last_global_step: count("last_global_step")?,
                mean_samples_per_second: if reports > 0 {
                    sum / reports as f64
                } else {
                    0.0
                },
                peak_memory_bytes: count("peak_memory_bytes")?,
                acked_version: count("acked_version")?,
                reached_version: count("reached_version")?,
                plan_version: count("plan_version")?,
                state: r.get("state")?,
                shape,
                spec: r.get("spec")?,
                reasons: json_column(r, "reasons")?,
                run_dir: r.get("run_dir")?,
                workers: count("workers")? as u32,
                peak_workers: count("peak_workers")? as u32,
                last_change_unix_ms: r.get("last_change_unix_ms")?,
                started_unix_ms: r.get("started_unix_ms")?,
                finished_unix_ms: r.get("finished_unix_ms")?,
                samples_done: count("samples_done")?,
                outcome: r.get("outcome")?,
                rejected_version: count("rejected_version")?,
                reported_workers: count("reported_workers")? as u32,
                peak_process_millicores: count("peak_process_millicores")?,
                peak_process_memory_bytes: count("peak_process_memory_bytes")?,
                peak_ps_millicores: count("peak_ps_millicores")?,
                cancel_requested: r.get("cancel_requested")?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
