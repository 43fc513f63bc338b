//! The nodes the brain plans on, as an operator sees and cordons them (`brainctl nodes`): the
//! capacity's nodes as last read, each with its cordon if it has one. A cordon is kept in the
//! store (it survives a restart) and taken out of every round's capacity
//! ([`crate::capacity::without`]); the round after a change comes at once.

use super::{Control, now_unix_ms};
use crate::BrainError;
use crate::capacity::NodeInfo;
use crate::store::Cordon;

/// The longest a cordon's reason may be, and the longest a cordon may last.
const MAX_REASON: usize = 512;
const MAX_FOR_S: u64 = 366 * 24 * 3600;

/// One node and its cordon, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub node: NodeInfo,
    pub cordon: Option<Cordon>,
}

impl Control {
    /// Every node, with its cordon.
    pub async fn node_states(&self) -> Result<Vec<NodeState>, BrainError> {
        let now = now_unix_ms();
        let cordons = self.with_store(move |s| s.cordons(now)).await?;
        Ok(self
            .nodes()
            .into_iter()
            .map(|node| NodeState {
                cordon: cordons.iter().find(|c| c.node == node.name).cloned(),
                node,
            })
            .collect())
    }

    /// Cordons `node` for `for_s` seconds (0: until uncordoned), with `reason`.
    pub async fn cordon(
        &self,
        node: &str,
        reason: &str,
        for_s: u64,
    ) -> Result<NodeState, BrainError> {
        let info = self.known_node(node)?;
        let reason = reason.trim();
        if reason.is_empty() || reason.len() > MAX_REASON {
            return Err(BrainError::InvalidArgument(format!(
                "a cordon needs a reason of 1 to {MAX_REASON} bytes"
            )));
        }
        if for_s > MAX_FOR_S {
            return Err(BrainError::InvalidArgument(format!(
                "a cordon lasts at most {MAX_FOR_S} s (a year); 0 is until uncordoned"
            )));
        }
        let now = now_unix_ms();
        let cordon = Cordon {
            node: info.name.clone(),
            reason: reason.to_string(),
            since_unix_ms: now,
            until_unix_ms: (for_s > 0).then(|| now + (for_s * 1000) as i64),
        };
        let stored = cordon.clone();
        self.with_store(move |s| s.cordon(&stored)).await?;
        tracing::warn!(node = %info.name, reason, for_s, "node cordoned");
        self.wake();
        Ok(NodeState {
            node: info,
            cordon: Some(cordon),
        })
    }

    /// Lifts `node`'s cordon; refused when it has none.
    pub async fn uncordon(&self, node: &str) -> Result<NodeState, BrainError> {
        let info = self.known_node(node)?;
        let name = info.name.clone();
        if !self.with_store(move |s| s.uncordon(&name)).await? {
            return Err(BrainError::FailedPrecondition(format!(
                "node {node} is not cordoned"
            )));
        }
        tracing::info!(node = %info.name, "node uncordoned");
        self.wake();
        Ok(NodeState {
            node: info,
            cordon: None,
        })
    }

    fn known_node(&self, node: &str) -> Result<NodeInfo, BrainError> {
        let nodes = self.nodes();
        nodes
            .iter()
            .find(|n| n.name == node)
            .cloned()
            .ok_or_else(|| {
                BrainError::NotFound(format!(
                    "no node {node:?}: the brain's nodes are {}",
                    nodes
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }
}
