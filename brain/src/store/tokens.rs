//! The jobs' secrets, as their SHA-256 only (see `crate::auth`).

use rusqlite::params;

use super::{JobId, Store};
use crate::BrainError;

impl Store {
    /// Keeps the digest of a secret minted for `job`.
    pub fn add_job_token(
        &mut self,
        job: JobId,
        digest: [u8; 32],
        now_ms: i64,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        self.conn.execute(
            "INSERT OR IGNORE INTO job_tokens (digest, job_id, created_unix_ms) VALUES (?1, ?2, ?3)",
            params![digest.as_slice(), id, now_ms],
        )?;
        Ok(())
    }

    /// Every secret's digest, with its job.
    pub fn job_tokens(&self) -> Result<Vec<([u8; 32], JobId)>, BrainError> {
        let mut stmt = self
            .conn
            .prepare("SELECT digest, job_id FROM job_tokens ORDER BY job_id")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (digest, job) = row?;
            let digest: [u8; 32] = digest.try_into().map_err(|_| BrainError::Stored {
                what: format!("token digest of job {job}"),
                problem: "not 32 bytes".into(),
            })?;
            out.push((digest, JobId(job as u64)));
        }
        Ok(out)
    }
}
