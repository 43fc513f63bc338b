//! The jobs' tokens (their masters' secrets and their owners' tokens), as their SHA-256 only
//! (see `crate::auth`).

use rusqlite::params;

use super::{JobId, Store};
use crate::BrainError;
use crate::auth::Holder;

impl Store {
    /// Keeps the digest of a token minted for `job`'s `holder`.
    pub fn add_job_token(
        &mut self,
        job: JobId,
        digest: [u8; 32],
        holder: Holder,
        now_ms: i64,
    ) -> Result<(), BrainError> {
        let id = self.known(job)?;
        self.conn.execute(
            "INSERT OR IGNORE INTO job_tokens (digest, job_id, created_unix_ms, holder) \
             VALUES (?1, ?2, ?3, ?4)",
            params![digest.as_slice(), id, now_ms, holder.as_str()],
        )?;
        Ok(())
    }

    /// Every token's digest, with its job and whose it is.
    pub fn job_tokens(&self) -> Result<Vec<([u8; 32], JobId, Holder)>, BrainError> {
        let mut stmt = self
            .conn
            .prepare("SELECT digest, job_id, holder FROM job_tokens ORDER BY job_id")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (digest, job, holder) = row?;
            let holder = Holder::parse(&holder).ok_or_else(|| BrainError::Stored {
                what: format!("token holder of job {job}"),
                problem: format!("{holder:?}: neither master nor owner"),
            })?;
            let digest: [u8; 32] = digest.try_into().map_err(|_| BrainError::Stored {
                what: format!("token digest of job {job}"),
                problem: "not 32 bytes".into(),
            })?;
            out.push((digest, JobId(job as u64), holder));
        }
        Ok(out)
    }
}
