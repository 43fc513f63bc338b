//! The vocabulary of per-job decisions: process resources, a job's configuration, and the scale
//! plan the brain sends to a job master (the same shape as the job master's wire plan).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::units::{Bytes, JobId, Millicores, WorkerType};

/// A process's role in a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Ps,
    Worker,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Ps => "ps",
            Role::Worker => "worker",
        })
    }
}

/// What one process is given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessResources {
    pub cpu: Millicores,
    pub memory: Bytes,
    /// GPUs by type; empty for CPU-only processes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpus: BTreeMap<WorkerType, u32>,
}

/// A candidate (or the current) configuration of a job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    pub ps: u32,
    pub workers: u32,
    pub ps_resources: ProcessResources,
    pub worker_resources: ProcessResources,
}

impl JobConfig {
    /// Processes of `role`.
    pub fn count(&self, role: Role) -> u32 {
        match role {
            Role::Ps => self.ps,
            Role::Worker => self.workers,
        }
    }
}

/// Replace one process by one with other resources, its state handed over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    pub role: Role,
    pub index: u32,
    pub resources: ProcessResources,
    pub reason: String,
}

/// What a job master is asked to carry out; versions increase per job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScalePlan {
    pub job: Option<JobId>,
    pub version: u64,
    /// Target count per role; a role left out keeps its count.
    pub counts: BTreeMap<Role, u32>,
    pub migrations: Vec<Migration>,
    /// Why, one line per decision, for `brainctl plan --dry-run` and the logs.
    pub reasons: Vec<String>,
}

impl ScalePlan {
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty() && self.migrations.is_empty()
    }
}
