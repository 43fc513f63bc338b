//! The brain's durable state in an embedded SQLite database (WAL): jobs, per-job metric
//! summaries, scale plans and their acknowledgements, cordoned nodes, each job's timeline (its
//! size and speed every few seconds). Every change is one transaction, so a
//! brain killed at any instant reopens with each change either wholly there or not at all.
//!
//! Raw metric time series are not kept here (they belong in the InfluxDB sink); each accepted
//! batch updates the job's summary: reports seen, last global step, mean samples/s, peak memory.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

use crate::BrainError;

pub use vocab::JobId;

mod cordons;
mod jobs;
mod policy;
mod processes;
mod records;
mod reports;
mod shape;
#[cfg(test)]
mod tests;
mod timeline;
mod tokens;

pub use cordons::Cordon;
pub use jobs::{PsSpeedsByJob, SpeedsByJob};
pub use processes::{
    CPU_SAMPLES, DeviceUse, GpuUse, JobGpuUse, JobSnapshot, JobStability, PendingProcess,
    ProcessSample, SPEED_WINDOW_MS,
};
pub use records::{JobRow, JobState, Metric, SlowNode, StoredPlan, StragglerNote};
pub use reports::{PlanCounts, PlanEntry};
pub use shape::{RoleShape, Shape};
pub use timeline::{TIMELINE_STEP_MS, TimelinePoint};

pub struct Store {
    conn: Connection,
    /// Per-process observations and the brain's corrections, in memory.
    processes: processes::Processes,
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
        Ok(Store {
            conn,
            processes: Default::default(),
        })
    }

    pub(super) fn known(&self, job: JobId) -> Result<i64, BrainError> {
        let id = i64::try_from(job.0).map_err(|_| BrainError::UnknownJob(job.0))?;
        let found: Option<i64> = self
            .conn
            .query_row("SELECT id FROM jobs WHERE id = ?1", [id], |r| r.get(0))
            .optional()?;
        found.ok_or(BrainError::UnknownJob(job.0))
    }
}

/// A JSON column decoded as `T`; a value that does not decode is an error naming the column,
/// never a default.
pub(super) fn json_column<T: serde::de::DeserializeOwned>(
    r: &rusqlite::Row<'_>,
    column: &str,
) -> rusqlite::Result<T> {
    let text: String = r.get(column)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            r.as_ref().column_index(column).unwrap_or(0),
            rusqlite::types::Type::Text,
            format!("column {column}: {e}").into(),
        )
    })
}

/// A job's name is a DNS-1123 label (`vocab::spec::limits::dns_label`): it becomes a
/// directory under the runs directory, so `.`, `..`, `/` never get there.
pub(crate) fn check_name(name: &str) -> Result<(), BrainError> {
    vocab::spec::limits::dns_label(name)
        .map_err(|e| BrainError::InvalidArgument(format!("job name {e}")))
}

/// One change to the schema or the rows after its first release.
enum Migration {
    Sql(&'static str),
    /// A rewrite of stored values that SQL alone cannot do.
    Rows(fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>),
}
use Migration::{Rows, Sql};

/// Changes made after the first release of the schema, in order; `user_version` counts how
/// many a database has.
const MIGRATIONS: &[Migration] = &[
    Sql("ALTER TABLE jobs ADD COLUMN state TEXT NOT NULL DEFAULT 'running'"),
    Sql("ALTER TABLE jobs ADD COLUMN shape TEXT"),
    Sql("ALTER TABLE jobs ADD COLUMN spec TEXT"),
    Sql("ALTER TABLE jobs ADD COLUMN reasons TEXT NOT NULL DEFAULT '[]'"),
    Sql("ALTER TABLE jobs ADD COLUMN run_dir TEXT NOT NULL DEFAULT ''"),
    Sql("ALTER TABLE jobs ADD COLUMN workers INTEGER NOT NULL DEFAULT 0"),
    Sql("ALTER TABLE jobs ADD COLUMN peak_workers INTEGER NOT NULL DEFAULT 0"),
    Sql("ALTER TABLE jobs ADD COLUMN last_change_unix_ms INTEGER"),
    Sql("ALTER TABLE jobs ADD COLUMN samples_done INTEGER NOT NULL DEFAULT 0"),
    Sql("ALTER TABLE jobs ADD COLUMN outcome TEXT NOT NULL DEFAULT ''"),
    Sql("ALTER TABLE jobs ADD COLUMN started_unix_ms INTEGER"),
    Sql("ALTER TABLE jobs ADD COLUMN finished_unix_ms INTEGER"),
    Sql("ALTER TABLE jobs ADD COLUMN reported_workers INTEGER NOT NULL DEFAULT 0"),
    Sql("ALTER TABLE jobs ADD COLUMN peak_process_millicores INTEGER NOT NULL DEFAULT 0"),
    Sql("ALTER TABLE jobs ADD COLUMN peak_process_memory_bytes INTEGER NOT NULL DEFAULT 0"),
    Sql("CREATE TABLE models (name TEXT PRIMARY KEY, body TEXT NOT NULL, trained_unix_ms INTEGER NOT NULL)"),
    Sql("ALTER TABLE jobs ADD COLUMN cancel_requested TEXT"),
    Sql("CREATE TABLE ps_speeds (job_id INTEGER NOT NULL REFERENCES jobs(id), workers INTEGER NOT NULL,
         ps INTEGER NOT NULL, reports INTEGER NOT NULL, sum_samples_per_second REAL NOT NULL,
         PRIMARY KEY (job_id, workers, ps))"),
    Sql("ALTER TABLE jobs ADD COLUMN peak_ps_millicores INTEGER NOT NULL DEFAULT 0"),
    Sql("CREATE TABLE job_tokens (digest BLOB PRIMARY KEY, job_id INTEGER NOT NULL REFERENCES jobs(id),
         created_unix_ms INTEGER NOT NULL)"),
    // A round reads the queued and running jobs only, however many have finished.
    Sql("CREATE INDEX jobs_by_state ON jobs(state)"),
    Sql("CREATE TABLE cordons (node TEXT PRIMARY KEY, reason TEXT NOT NULL,
         since_unix_ms INTEGER NOT NULL, until_unix_ms INTEGER)"),
    Sql("CREATE TABLE policy_set (id INTEGER PRIMARY KEY CHECK (id = 1), toml TEXT NOT NULL,
         set_unix_ms INTEGER NOT NULL)"),
    // A job's size and speed over time (the console's timeline), a point per TIMELINE_STEP_MS.
    Sql("CREATE TABLE timeline (job_id INTEGER NOT NULL REFERENCES jobs(id), at_unix_ms INTEGER NOT NULL,
         workers INTEGER NOT NULL, ps INTEGER NOT NULL, samples_per_second REAL NOT NULL,
         PRIMARY KEY (job_id, at_unix_ms))"),
    Sql("ALTER TABLE jobs ADD COLUMN start_nodes TEXT NOT NULL DEFAULT '{}'"),
    // The shape kept by role group (`shape::Shape`), rewritten from the worker and PS fields.
    Rows(shape::legacy::rewrite),
    // Whose a job's token is: its master's secret, or its owner's token (a person's).
    Sql("ALTER TABLE job_tokens ADD COLUMN holder TEXT NOT NULL DEFAULT 'master'"),
];

fn migrate(conn: &Connection) -> Result<(), BrainError> {
    let have: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if have as usize > MIGRATIONS.len() {
        return Err(BrainError::FailedPrecondition(format!(
            "the database has schema version {have}, newer than this brain's {}",
            MIGRATIONS.len()
        )));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(have as usize) {
        let tx = conn.unchecked_transaction()?;
        match m {
            Sql(sql) => tx.execute_batch(sql)?,
            Rows(rewrite) => rewrite(&tx)?,
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

pub(super) fn newest_version(conn: &Connection, job: i64) -> Result<u64, BrainError> {
    let v: i64 = conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM plans WHERE job_id = ?1",
        [job],
        |r| r.get(0),
    )?;
    Ok(v as u64)
}
