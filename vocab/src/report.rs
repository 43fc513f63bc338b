//! What a job master says of its job: the phase it is in and, when it ends, the report it
//! writes to `RUN_DIR/report.json` (read back by the brain and by tests), with the records of
//! the plans it carried out and the PS reshards.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::role::{JobKind, Role, SlotKey};

/// Where a job is, without the reason of a failure: written lowercase (`"succeeded"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Running,
    Finishing,
    Succeeded,
    Failed,
    /// Stopped on request (`brainctl cancel`), after a last checkpoint where one could be taken.
    Cancelled,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Finishing => "finishing",
            Phase::Succeeded => "succeeded",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Cancelled)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "running" => Ok(Phase::Running),
            "finishing" => Ok(Phase::Finishing),
            "succeeded" => Ok(Phase::Succeeded),
            "failed" => Ok(Phase::Failed),
            "cancelled" => Ok(Phase::Cancelled),
            other => Err(format!("unknown job phase {other:?}")),
        }
    }
}

impl PartialEq<&str> for Phase {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Where a job is, with the reason when it failed (the job master's own record).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum JobPhase {
    Running,
    /// All work is done; the shell collects final statistics before declaring success.
    Finishing,
    Succeeded,
    Failed {
        reason: String,
    },
    Cancelled {
        reason: String,
    },
}

impl JobPhase {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            JobPhase::Succeeded | JobPhase::Failed { .. } | JobPhase::Cancelled { .. }
        )
    }

    /// The phase without its reason, as reports and status answers name it.
    pub fn phase(&self) -> Phase {
        match self {
            JobPhase::Running => Phase::Running,
            JobPhase::Finishing => Phase::Finishing,
            JobPhase::Succeeded => Phase::Succeeded,
            JobPhase::Failed { .. } => Phase::Failed,
            JobPhase::Cancelled { .. } => Phase::Cancelled,
        }
    }

    pub fn name(&self) -> &'static str {
        self.phase().as_str()
    }

    /// Why it failed or was cancelled.
    pub fn reason(&self) -> Option<&str> {
        match self {
            JobPhase::Failed { reason } | JobPhase::Cancelled { reason } => Some(reason),
            _ => None,
        }
    }
}

/// Final statistics of one parameter server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsStats {
    pub index: u32,
    pub keys: u64,
    pub applied_batches: u64,
    pub applied_samples: u64,
    pub applied_index_sum: u64,
    pub duplicate_pushes: u64,
}

/// What `run` returns and writes to `RUN_DIR/report.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobReport {
    pub job: String,
    pub kind: JobKind,
    pub phase: Phase,
    pub reason: Option<String>,
    pub elapsed_ms: u64,
    pub first_step_after_ms: Option<u64>,
    pub final_eval_loss: Option<f64>,
    pub final_model_digest: Option<String>,
    /// `ok` when the ledger proves each sample was consumed exactly once per epoch; `not
    /// tracked` when the job's processes read their data without the master.
    pub exactly_once: String,
    /// Whether the master saw the data at all (shards leased): false for a command that reads
    /// its own, whose shard counts and samples per epoch then say nothing.
    #[serde(default = "tracked")]
    pub data_tracked: bool,
    pub samples_per_epoch: BTreeMap<u32, u64>,
    pub shards_done: u64,
    pub shards_total: u64,
    pub restarts: BTreeMap<Role, u32>,
    pub checkpoints: usize,
    pub ps_stats: Vec<PsStats>,
    /// Samples applied and the sum of their indices, as the allreduce model state counts them.
    pub applied_samples: u64,
    pub applied_index_sum: u64,
    /// Scale plans carried out, in order.
    pub transitions: Vec<TransitionRecord>,
    pub reshards: Vec<ReshardRecord>,
    pub events: Vec<String>,
    /// The hangs the master found, each with the stacks captured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hangs: Vec<HangRecord>,
    /// How much of its wall time the job trained (none from a master before this field).
    #[serde(default)]
    pub effective_training: Option<EffectiveTraining>,
    /// The pre-run check, when the job ran one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precheck: Option<PrecheckRecord>,
}

/// What a job's pre-run check found (the spec's `precheck:`), node by node, and how long it
/// took.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PrecheckRecord {
    /// From the first check process launched to the verdict.
    pub elapsed_ms: u64,
    pub nodes: Vec<PrecheckNode>,
}

impl PrecheckRecord {
    /// The nodes the job must not use: faulty and stragglers.
    pub fn unhealthy(&self) -> impl Iterator<Item = &PrecheckNode> {
        self.nodes
            .iter()
            .filter(|n| matches!(n.health, NodeHealth::Straggler | NodeHealth::Faulty))
    }
}

/// How a node came out of a pre-run check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeHealth {
    #[default]
    Healthy,
    /// Slower than the check's ratio times the median.
    Straggler,
    /// Failed its matmul, or every all-reduce round it took part in, or never answered.
    Faulty,
    /// Its check process found no room on the node (its resources were taken): nothing is
    /// known against it, and the job may use it.
    Unchecked,
}

impl NodeHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeHealth::Healthy => "healthy",
            NodeHealth::Straggler => "straggler",
            NodeHealth::Faulty => "faulty",
            NodeHealth::Unchecked => "unchecked",
        }
    }

    /// As a sentence says it: "found it a straggler".
    pub fn phrase(self) -> &'static str {
        match self {
            NodeHealth::Straggler => "a straggler",
            other => other.as_str(),
        }
    }
}

/// One node's figures in a pre-run check.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PrecheckNode {
    /// Its address, as the platform names it.
    pub node: String,
    pub health: NodeHealth,
    /// The matmul's time (none: it failed or never reported).
    pub matmul_ms: Option<f64>,
    /// Each all-reduce round it took part in: the round, its peers, and the time (none:
    /// failed).
    pub rounds: Vec<PrecheckRound>,
    /// Why it is not healthy, with the figures.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PrecheckRound {
    pub round: u32,
    pub peers: Vec<String>,
    pub allreduce_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The share of a job's wall time its training group spent making progress that was kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EffectiveTraining {
    pub wall_ms: u64,
    /// Training whose work was kept.
    pub training_ms: u64,
    /// Training thrown away by restarts from an earlier checkpoint.
    pub lost_ms: u64,
    /// `training_ms / wall_ms`.
    pub share: f64,
}

/// A hang the job master found: when (ms since the job started), why, and the stacks its
/// agents captured, by process (`worker-1`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangRecord {
    pub at_ms: u64,
    pub why: String,
    pub stacks: BTreeMap<String, String>,
}

fn tracked() -> bool {
    true
}

impl JobReport {
    pub fn succeeded(&self) -> bool {
        self.phase == Phase::Succeeded
    }
}

/// One carried-out plan, for the report and the benchmarks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransitionRecord {
    pub version: u64,
    pub from: BTreeMap<Role, u32>,
    pub to: BTreeMap<Role, u32>,
    pub accepted_ms: u64,
    pub reached_ms: u64,
    /// When every worker of the new layout had reported a training step after the plan.
    pub resumed_ms: Option<u64>,
    /// Workers whose first step after the plan has not been reported yet.
    pub awaiting: Vec<SlotKey>,
    /// Steps each worker had reported when the plan was reached; a higher one is a new step.
    #[serde(default)]
    pub steps_at_reach: BTreeMap<SlotKey, u64>,
}

/// One PS reshard: what moved, how long it took, and the parameter digests around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReshardRecord {
    pub version: u64,
    pub from_ps: u32,
    pub to_ps: u32,
    pub moved_keys: u64,
    pub moved_bytes: u64,
    pub total_keys: u64,
    pub digest_before: u64,
    pub digest_after: u64,
    pub took_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_written_lowercase_and_unknown_ones_are_refused() {
        for p in [
            Phase::Running,
            Phase::Finishing,
            Phase::Succeeded,
            Phase::Failed,
        ] {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{p}\""));
            assert_eq!(p.as_str().parse::<Phase>(), Ok(p));
        }
        assert!("Succeeded".parse::<Phase>().is_err());
        assert!(serde_json::from_str::<Phase>("\"done\"").is_err());
        let failed = JobPhase::Failed { reason: "x".into() };
        assert_eq!(failed.phase(), Phase::Failed);
        assert!(failed.is_terminal() && !JobPhase::Finishing.is_terminal());
    }
}
