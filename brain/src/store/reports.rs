//! What job masters send (metric batches, per-worker-count speeds) and the plans they are sent.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};

use super::*;

/// The role groups' counts a plan sets, under the names the job gives its roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanCounts {
    /// The role the job calls its training group (`worker`, or an all-reduce group's name).
    pub trainer: vocab::Role,
    /// Each role group the plan sizes and its count from now on; a role left out keeps its
    /// count.
    pub roles: BTreeMap<vocab::Role, u32>,
}

impl Default for PlanCounts {
    fn default() -> Self {
        Self::of(&vocab::ScalePlan::default(), vocab::Role::WORKER)
    }
}

impl PlanCounts {
    /// The counts `plan` sets, for a job whose training group is `trainer`.
    pub fn of(plan: &vocab::ScalePlan, trainer: vocab::Role) -> Self {
        Self {
            trainer,
            roles: plan.roles.iter().map(|(r, t)| (*r, t.count)).collect(),
        }
    }

    /// These counts with `role`'s set to `n`.
    pub fn with(mut self, role: vocab::Role, n: u32) -> Self {
        self.roles.insert(role, n);
        self
    }

    /// The training group's count, where the plan sets it.
    pub fn training(&self) -> Option<u32> {
        self.roles.get(&self.trainer).copied()
    }

    /// The other role groups the plan sizes (a ps job's PS, service and further all-reduce
    /// groups), with their counts.
    pub fn others(&self) -> impl Iterator<Item = (vocab::Role, u32)> + '_ {
        self.roles
            .iter()
            .filter(|(r, _)| **r != self.trainer)
            .map(|(r, n)| (*r, *n))
    }
}

/// One plan of a job, as `brainctl status` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanEntry {
    pub version: u64,
    pub reason: String,
    pub created_unix_ms: i64,
    /// Its job master's answer: accepted or refused; none yet.
    pub accepted: Option<bool>,
    pub answer: String,
}

impl Store {
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
        // The most CPU one of its parameter servers used (sizes the PS of jobs like it).
        let peak_ps_cpu = reports
            .iter()
            .flat_map(|m| &m.processes)
            .filter(|p| p.role == vocab::Role::PS)
            .map(|p| p.cpu_millicores)
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
            let mut ps_speed = tx.prepare_cached(
                "INSERT INTO ps_speeds (job_id, workers, ps, reports, sum_samples_per_second)
                 VALUES (?1, ?2, ?3, 1, ?4)
                 ON CONFLICT(job_id, workers, ps) DO UPDATE SET reports = reports + 1,
                     sum_samples_per_second = sum_samples_per_second + excluded.sum_samples_per_second",
            )?;
            for m in reports
                .iter()
                .filter(|m| m.workers > 0 && m.samples_per_second > 0.0)
            {
                speed.execute(params![id, m.workers, m.samples_per_second])?;
                if m.ps > 0 {
                    ps_speed.execute(params![id, m.workers, m.ps, m.samples_per_second])?;
                }
            }
        }
        tx.execute(
            "UPDATE jobs SET samples_done = MAX(samples_done, ?2), reported_workers = ?3,
                 peak_process_millicores = MAX(peak_process_millicores, ?4),
                 peak_process_memory_bytes = MAX(peak_process_memory_bytes, ?5),
                 peak_ps_millicores = MAX(peak_ps_millicores, ?6)
             WHERE id = ?1",
            params![
                id,
                samples_done as i64,
                last.workers,
                peak_cpu as i64,
                peak_mem as i64,
                peak_ps_cpu as i64
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
        Store::add_timeline(&tx, id, reports)?;
        tx.commit()?;
        self.processes.fold(job, reports);
        Ok(reports.len())
    }

    /// The job's parameter servers and workers (the processes of its training role,
    /// `trainer`) as its latest reports described them.
    pub fn processes(
        &self,
        job: JobId,
        trainer: vocab::Role,
    ) -> (
        Vec<optimizer::heuristics::ProcessRuntime>,
        Vec<optimizer::heuristics::ProcessRuntime>,
    ) {
        self.processes.of(job, trainer)
    }

    /// The GPU shares the running jobs' processes hold, node by node and device by device, as
    /// their newest reports gave them (kept in memory, as the processes are).
    pub fn device_use(&self) -> super::DeviceUse {
        self.processes.device_use(None)
    }

    /// [`Self::device_use`] job by job: what the launcher tells a job master it starts of
    /// the other jobs' GPU use (a resumed master holds some itself).
    pub fn device_use_by_job(&self) -> std::collections::BTreeMap<JobId, super::DeviceUse> {
        self.processes.device_use_by_job()
    }

    /// [`Self::device_use`] of every job but `job`: what its job master is told of the other
    /// jobs' GPU use (`GetPlanResponse.other_jobs_devices`), to count with its own.
    pub fn device_use_besides(&self, job: JobId) -> super::DeviceUse {
        self.processes.device_use(Some(job))
    }

    /// The node each process of the job's `role` runs on, by index (empty: not known).
    pub fn nodes(&self, job: JobId, role: vocab::Role) -> Vec<String> {
        self.processes.nodes(job, role)
    }

    /// The job's effective training time and stragglers, as its newest report gave them
    /// (kept in memory: a restarted brain hears them again with the next report).
    pub fn stability(&self, job: JobId) -> super::processes::JobStability {
        self.processes.stability(job)
    }

    /// The job as its newest reports saw it: a recent speed, CPU and memory, processes by role
    /// (kept in memory, like its stability).
    pub fn snapshot(&self, job: JobId) -> super::processes::JobSnapshot {
        self.processes.snapshot(job)
    }

    /// The job's GPU use, as its newest report gave it (kept in memory, like its stability).
    pub fn gpu_use(&self, job: JobId) -> super::processes::JobGpuUse {
        self.processes.gpu(job)
    }

    /// The called roles' rates of the job's newest report (calls between roles).
    pub fn role_rates(&self, job: JobId) -> Vec<(vocab::Role, optimizer::live::RoleRate)> {
        self.processes.rates(job)
    }

    /// Seconds of its master's window the job's role rates still lack, as its newest report
    /// gave them (0: a whole window, or a master that does not say).
    pub fn rates_unmeasured_s(&self, job: JobId) -> f64 {
        self.processes.rates_unmeasured_s(job)
    }

    /// The heuristics' corrections sent to the job (this brain's lifetime).
    pub fn corrections(&self, job: JobId) -> Vec<optimizer::heuristics::Change> {
        self.processes.changes(job)
    }

    /// Stores `body` as the job's next plan version.
    /// The counts `counts` sets (the training group's, the PS's, the other role groups') become
    /// the counts in force (a resized role also marks the job changed, for the cool-down); the
    /// heuristics' `corrections` are remembered for their cool-downs.
    pub fn propose_plan(
        &mut self,
        job: JobId,
        body: &dyn Fn(u64) -> Vec<u8>,
        reason: &str,
        counts: PlanCounts,
        corrections: &[optimizer::heuristics::Change],
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
        if let Some(w) = counts.training() {
            tx.execute(
                "UPDATE jobs SET workers = ?2, peak_workers = MAX(peak_workers, ?2),
                     last_change_unix_ms = ?3
                 WHERE id = ?1",
                params![id, w, now_unix_ms],
            )?;
        }
        for (role, n) in counts.others() {
            // Role names are DNS labels: quoted, they make a JSON path as they are. A resized
            // role other than the PS marks the job changed, for the cool-down.
            tx.execute(
                "UPDATE jobs SET shape = json_set(shape, ?3, ?2),
                     last_change_unix_ms = CASE WHEN ?5 THEN ?4 ELSE last_change_unix_ms END
                 WHERE id = ?1 AND shape IS NOT NULL
                   AND json_type(shape, ?3) IS NOT NULL",
                params![
                    id,
                    n,
                    format!("$.roles.\"{role}\".count"),
                    now_unix_ms,
                    role != vocab::Role::PS
                ],
            )?;
        }
        tx.commit()?;
        self.processes.corrected(job, corrections);
        Ok(version)
    }

    /// The job's newest `limit` plans, newest first: each version's reason, when it was made and
    /// its job master's answer (none yet: not acknowledged).
    pub fn plan_history(&self, job: JobId, limit: usize) -> Result<Vec<PlanEntry>, BrainError> {
        let id = self.known(job)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT version, reason, created_unix_ms, accepted, answer FROM plans
             WHERE job_id = ?1 ORDER BY version DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![id, limit as i64], |r| {
            Ok(PlanEntry {
                version: r.get::<_, i64>(0)? as u64,
                reason: r.get(1)?,
                created_unix_ms: r.get(2)?,
                accepted: r.get(3)?,
                answer: r.get::<_, Option<String>>(4)?.unwrap_or_default(),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
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
}
