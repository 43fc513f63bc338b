//! The nodes the brain plans on, as an operator sees and cordons them (`brainctl nodes`): the
//! capacity's nodes as last read, each with its cordon if it has one. A cordon is kept in the
//! store (it survives a restart) and taken out of every round's capacity
//! ([`crate::capacity::without`]); the round after a change comes at once. A node where a
//! running job flagged a straggler says so (the job's newest report), cordoned or not. A
//! node a job's report found faulty is cordoned for the policy's `faulty_node_cordon_s`,
//! except the last healthy one: a job's word never leaves every job without a node; that one
//! is flagged for the operator instead.

use super::{Control, now_unix_ms};
use crate::BrainError;
use crate::capacity::NodeInfo;
use crate::store::Cordon;

/// The longest a cordon's reason may be, and the longest a cordon may last.
const MAX_REASON: usize = 512;
const MAX_FOR_S: u64 = 366 * 24 * 3600;

/// One node, its cordon if any, and the running jobs' stragglers on it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub node: NodeInfo,
    pub cordon: Option<Cordon>,
    /// e.g. `ctr-3 worker-2 (1.92x)`.
    pub stragglers: Vec<String>,
}

impl Control {
    /// Every node, with its cordon.
    pub async fn node_states(&self) -> Result<Vec<NodeState>, BrainError> {
        let now = now_unix_ms();
        let (cordons, stragglers) = self
            .with_store(move |s| {
                let mut stragglers = Vec::new();
                for row in s.jobs()? {
                    if row.state == crate::store::JobState::Running {
                        let stability = s.stability(row.id);
                        for n in stability.stragglers {
                            let what = format!("{} {} ({:.2}x)", row.name, n.process, n.ratio);
                            stragglers.push((n.host, what));
                        }
                        for n in stability.slow_nodes {
                            let what = format!("{} pre-run check: {}", row.name, n.why);
                            stragglers.push((n.host, what));
                        }
                    }
                }
                Ok((s.cordons(now)?, stragglers))
            })
            .await?;
        let mut stragglers = stragglers;
        stragglers.extend(self.flags(now));
        let nodes = self.nodes();
        Ok(nodes
            .iter()
            .map(|node| NodeState {
                cordon: cordons.iter().find(|c| c.node == node.name).cloned(),
                stragglers: stragglers
                    .iter()
                    .filter(|(host, _)| on_node(host, &node.name, &nodes))
                    .map(|(_, what)| what.clone())
                    .collect(),
                node: node.clone(),
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
            stragglers: Vec::new(),
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
            stragglers: Vec::new(),
        })
    }

    /// Cordons the nodes `job`'s pre-run check found faulty (`(address, why)`), for the
    /// policy's `live.faulty_node_cordon_s`: each node the brain plans on by that name, not
    /// cordoned already (an operator's cordon stays as it is). Addresses the brain does not
    /// know are left alone: they are not its to plan on.
    pub async fn cordon_faulty(
        &self,
        job: crate::store::JobId,
        faults: Vec<(String, String)>,
    ) -> Result<(), BrainError> {
        let for_s = self.policy().0.config.live.faulty_node_cordon_s;
        if faults.is_empty() || for_s == 0 {
            return Ok(());
        }
        let now = now_unix_ms();
        let (name, cordons) = self
            .with_store(move |s| Ok((s.name(job)?, s.cordons(now)?)))
            .await?;
        let nodes = self.nodes();
        let mut done: Vec<String> = cordons.into_iter().map(|c| c.node).collect();
        for (host, why) in faults {
            if !nodes.iter().any(|n| n.name == host) || done.contains(&host) {
                continue;
            }
            let mut reason = format!("the pre-run check of job {name} found it faulty: {why}");
            if reason.len() > MAX_REASON {
                let mut end = MAX_REASON - 3;
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                reason.truncate(end);
                reason.push_str("...");
            }
            // A job's word never takes the last healthy node away from every job: it is
            // flagged for the operator, who may cordon it by hand.
            let healthy = nodes.iter().filter(|n| !done.contains(&n.name)).count();
            if healthy <= 1 {
                tracing::warn!(
                    node = %host,
                    job = %name,
                    "not cordoned on a job's report: it is the last healthy node ({reason})"
                );
                let until = now + (for_s.min(MAX_FOR_S) * 1000) as i64;
                self.flagged
                    .lock()
                    .expect("no panic under the lock")
                    .insert(host, (reason, until));
                continue;
            }
            self.cordon(&host, &reason, for_s.min(MAX_FOR_S)).await?;
            done.push(host);
        }
        Ok(())
    }

    /// What job reports flagged without a cordon, by node, while it lasts.
    fn flags(&self, now: i64) -> Vec<(String, String)> {
        let mut flagged = self.flagged.lock().expect("no panic under the lock");
        flagged.retain(|_, (_, until)| *until > now);
        flagged
            .iter()
            .map(|(host, (reason, _))| {
                let what = format!("{reason} (not cordoned: the last healthy node)");
                (host.clone(), what)
            })
            .collect()
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

/// Whether a process on `host` runs on node `node`: the node of that address, or, where no
/// node has it (no Ray: the brain's jobs run on its own machine), the local CPU pool.
fn on_node(host: &str, node: &str, nodes: &[NodeInfo]) -> bool {
    host == node || (node == crate::capacity::LOCAL_NODE && !nodes.iter().any(|n| n.name == host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_straggler_is_on_the_node_of_its_address_else_on_the_local_pool() {
        let node = |name: &str| NodeInfo {
            name: name.into(),
            cpu_millicores: 1000,
            memory_bytes: 0,
            gpus: 0,
            gpu_type: String::new(),
        };
        let ray = [node("10.0.0.1"), node("10.0.0.2")];
        assert!(on_node("10.0.0.2", "10.0.0.2", &ray));
        assert!(!on_node("10.0.0.2", "10.0.0.1", &ray));
        let local = [node("local"), node("gpu-a")];
        assert!(on_node("127.0.0.1", "local", &local));
        assert!(!on_node("127.0.0.1", "gpu-a", &local));
    }
}
