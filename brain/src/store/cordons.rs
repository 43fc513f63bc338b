//! Cordoned nodes: a node the operator (or a check) found faulty is taken out of the capacity
//! the brain plans on, with its reason, since when and, optionally, until when. An expired
//! cordon no longer counts; it is dropped the next time the cordons are read.

use rusqlite::params;

use super::Store;
use crate::BrainError;

/// One cordoned node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cordon {
    /// The node as the capacity names it (a Ray node's address, a GPU node's name).
    pub node: String,
    pub reason: String,
    pub since_unix_ms: i64,
    /// None: until uncordoned.
    pub until_unix_ms: Option<i64>,
}

impl Store {
    /// Cordons `c.node` (again: the new reason and times replace the old).
    pub fn cordon(&mut self, c: &Cordon) -> Result<(), BrainError> {
        self.conn.execute(
            "INSERT INTO cordons (node, reason, since_unix_ms, until_unix_ms)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(node) DO UPDATE SET reason = ?2, since_unix_ms = ?3, until_unix_ms = ?4",
            params![c.node, c.reason, c.since_unix_ms, c.until_unix_ms],
        )?;
        Ok(())
    }

    /// Lifts `node`'s cordon; whether it had one.
    pub fn uncordon(&mut self, node: &str) -> Result<bool, BrainError> {
        Ok(self
            .conn
            .execute("DELETE FROM cordons WHERE node = ?1", [node])?
            > 0)
    }

    /// The cordons in force at `now_unix_ms`, by node; expired ones are dropped.
    pub fn cordons(&mut self, now_unix_ms: i64) -> Result<Vec<Cordon>, BrainError> {
        self.conn.execute(
            "DELETE FROM cordons WHERE until_unix_ms IS NOT NULL AND until_unix_ms <= ?1",
            [now_unix_ms],
        )?;
        let mut stmt = self.conn.prepare(
            "SELECT node, reason, since_unix_ms, until_unix_ms FROM cordons ORDER BY node",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(Cordon {
                node: r.get(0)?,
                reason: r.get(1)?,
                since_unix_ms: r.get(2)?,
                until_unix_ms: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
