//! Cordoned nodes: a node the operator (or a check) found faulty is taken out of the capacity
//! the brain plans on, with its reason, since when and, optionally, until when. An expired
//! cordon no longer counts; each round drops the expired ones ([`Store::prune_cordons`]), so
//! that reading them (every job master's plan poll) never writes.

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

    /// Drops the cordons expired at `now_unix_ms`.
    pub fn prune_cordons(&mut self, now_unix_ms: i64) -> Result<(), BrainError> {
        self.conn.execute(
            "DELETE FROM cordons WHERE until_unix_ms IS NOT NULL AND until_unix_ms <= ?1",
            [now_unix_ms],
        )?;
        Ok(())
    }

    /// The cordons in force at `now_unix_ms`, by node (a read: expired ones are left out).
    pub fn cordons(&self, now_unix_ms: i64) -> Result<Vec<Cordon>, BrainError> {
        let mut stmt = self.conn.prepare(
            "SELECT node, reason, since_unix_ms, until_unix_ms FROM cordons
             WHERE until_unix_ms IS NULL OR until_unix_ms > ?1 ORDER BY node",
        )?;
        let rows = stmt.query_map([now_unix_ms], |r| {
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
