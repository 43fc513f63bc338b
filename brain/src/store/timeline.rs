//! A job's size and speed over time, for the console's timeline chart: at most one point per
//! job every [`TIMELINE_STEP_MS`], from the reports its job master sends.

use rusqlite::params;

use super::{JobId, Metric, Store};
use crate::BrainError;

/// The least time between two points of one job's timeline.
pub const TIMELINE_STEP_MS: i64 = 5_000;

/// The job at one instant: its size as its master reported it and its speed then.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelinePoint {
    pub at_unix_ms: i64,
    pub workers: u32,
    pub ps: u32,
    pub samples_per_second: f64,
}

impl Store {
    /// Adds a point for `reports` (their newest size, their mean speed) unless the job has one
    /// less than [`TIMELINE_STEP_MS`] older.
    pub(super) fn add_timeline(
        tx: &rusqlite::Transaction<'_>,
        id: i64,
        reports: &[Metric],
    ) -> Result<(), BrainError> {
        let Some(last) = reports.iter().max_by_key(|m| (m.at_unix_ms, m.global_step)) else {
            return Ok(());
        };
        let speed =
            reports.iter().map(|m| m.samples_per_second).sum::<f64>() / reports.len() as f64;
        tx.prepare_cached(
            "INSERT OR IGNORE INTO timeline (job_id, at_unix_ms, workers, ps, samples_per_second)
             SELECT ?1, ?2, ?3, ?4, ?5 WHERE NOT EXISTS (
                 SELECT 1 FROM timeline WHERE job_id = ?1 AND at_unix_ms > ?2 - ?6)",
        )?
        .execute(params![
            id,
            last.at_unix_ms,
            last.workers,
            last.ps,
            speed,
            TIMELINE_STEP_MS
        ])?;
        Ok(())
    }

    /// The job's timeline, oldest first: its newest `limit` points.
    pub fn timeline(&self, job: JobId, limit: usize) -> Result<Vec<TimelinePoint>, BrainError> {
        let id = self.known(job)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT at_unix_ms, workers, ps, samples_per_second FROM timeline
             WHERE job_id = ?1 ORDER BY at_unix_ms DESC LIMIT ?2",
        )?;
        let mut points = stmt
            .query_map(params![id, limit as i64], |r| {
                Ok(TimelinePoint {
                    at_unix_ms: r.get(0)?,
                    workers: r.get(1)?,
                    ps: r.get(2)?,
                    samples_per_second: r.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        points.reverse();
        Ok(points)
    }
}
