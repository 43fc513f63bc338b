//! The job masters' ends: a master that ended is recorded from its report, or resumed with
//! `--resume` when it died before its job ended; after a restart, the brain follows again the
//! masters an earlier run of it started.

use std::path::{Path, PathBuf};

use super::{Control, now_unix_ms};
use crate::BrainError;
use crate::launch::{Exited, Launcher};
use crate::store::{JobId, JobState};

impl Control {
    /// A job master process ended: if its job never said how it ended, its report (or the
    /// exit) says.
    pub async fn exited(&self, e: Exited) {
        let (job, status, success) = (e.job, e.status, e.success);
        if !success && self.resume_if_unfinished(job, &status).await {
            self.wake();
            return;
        }
        let said = status.clone();
        let r = self
            .with_store(move |s| {
                let row = s.job(job)?;
                if row.state.finished() {
                    return Ok(());
                }
                let report = Some(PathBuf::from(&row.run_dir))
                    .filter(|d| !d.as_os_str().is_empty())
                    .map(|d| d.join("master").join(vocab::run_dir::REPORT_FILE))
                    .and_then(|p| std::fs::read(&p).ok().map(|b| (p, b)))
                    .and_then(|(p, b)| {
                        // A report that does not decode is said, then the exit status speaks.
                        serde_json::from_slice::<vocab::JobReport>(&b)
                            .inspect_err(|e| tracing::warn!("{}: {e}", p.display()))
                            .ok()
                    });
                match report {
                    Some(r) => s.finish(
                        job,
                        JobState::ended(r.phase).unwrap_or(JobState::Failed),
                        &format!(
                            "{}{} (read from its report; exactly-once: {})",
                            r.phase,
                            r.reason.map(|x| format!(": {x}")).unwrap_or_default(),
                            r.exactly_once
                        ),
                        row.samples_done,
                        now_unix_ms(),
                    ),
                    None if row.cancel_requested.is_some() => s.finish(
                        job,
                        JobState::Cancelled,
                        &format!(
                            "cancelled: {} (its job master exited ({said}) before reporting)",
                            row.cancel_requested.unwrap_or_default()
                        ),
                        row.samples_done,
                        now_unix_ms(),
                    ),
                    None => s.finish(
                        job,
                        JobState::Failed,
                        &format!("its job master exited ({said}) before reporting"),
                        row.samples_done,
                        now_unix_ms(),
                    ),
                }
            })
            .await;
        if let Err(err) = r {
            tracing::warn!("recording the end of {job}: {err}");
        }
        if !success {
            tracing::warn!("job master of {job} exited: {status}");
        }
        self.wake();
    }

    /// After a restart: follows again the masters an earlier run of the brain started for the
    /// jobs still running (local masters, no longer the brain's children, by the pid each
    /// recorded; on Ray, by their Ray jobs), so that one that died is resumed.
    pub async fn follow_masters(&self) -> Result<(), BrainError> {
        let running = self
            .with_store(|s| s.active())
            .await?
            .into_iter()
            .filter(|r| r.state == JobState::Running && !r.run_dir.is_empty());
        for row in running {
            if let Some(how) = self.launcher.follow_again(row.id, Path::new(&row.run_dir)) {
                tracing::info!(job = %row.id, "following its job master {how} again");
            }
        }
        Ok(())
    }

    /// A master that died before its job ended (killed, out of memory) leaves the job's
    /// context in its run directory: a new master is started on it with `--resume`, which
    /// launches every process anew from the latest checkpoint. At most the policy's
    /// `[live] max_resumes` times per job; then the job is recorded as failed.
    async fn resume_if_unfinished(&self, job: JobId, status: &str) -> bool {
        let Ok(row) = self.with_store(move |s| s.job(job)).await else {
            return false;
        };
        let run_dir = PathBuf::from(&row.run_dir);
        if row.state.finished()
            || row.cancel_requested.is_some()
            || row.run_dir.is_empty()
            || !Launcher::left_unfinished(&run_dir)
        {
            return false;
        }
        let attempt = {
            let mut r = self.resumes.lock().expect("no panic under the lock");
            let n = r.entry(job).or_insert(0);
            *n += 1;
            *n
        };
        let max_resumes = self.policy().0.config.live.max_resumes;
        if attempt > max_resumes {
            return false;
        }
        if let Err(e) = self.launcher.resume(job, &run_dir).await {
            tracing::warn!("cannot start the master of {job} again: {e}");
            return false;
        }
        let reason = format!(
            "its job master exited ({status}) before the job ended; started again with --resume \
             from the latest checkpoint (attempt {attempt} of {max_resumes})"
        );
        tracing::warn!(%job, "{reason}");
        if let Err(e) = self.with_store(move |s| s.add_reason(job, &reason)).await {
            tracing::warn!("recording the resume of {job}: {e}");
        }
        true
    }
}
