//! The policy an operator set through the brain (`brainctl policy set`): kept in the database,
//! so that the file the brain was started with is never rewritten and a restarted brain keeps
//! the operator's last word.

use rusqlite::{OptionalExtension, params};

use super::Store;
use crate::BrainError;

impl Store {
    /// Keeps `toml` as the policy set through the brain at `now_unix_ms` (replacing any).
    pub fn set_policy(&mut self, toml: &str, now_unix_ms: i64) -> Result<(), BrainError> {
        self.conn.execute(
            "INSERT INTO policy_set (id, toml, set_unix_ms) VALUES (1, ?1, ?2)
             ON CONFLICT(id) DO UPDATE SET toml = ?1, set_unix_ms = ?2",
            params![toml, now_unix_ms],
        )?;
        Ok(())
    }

    /// The policy last set through the brain, with when: none if it never was.
    pub fn stored_policy(&self) -> Result<Option<(String, i64)>, BrainError> {
        Ok(self
            .conn
            .query_row(
                "SELECT toml, set_unix_ms FROM policy_set WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }
}
