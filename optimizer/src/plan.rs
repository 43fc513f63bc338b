//! The vocabulary of per-job decisions: process resources and a job's configuration as the
//! optimizer sees them; the scale plan it builds is the vocabulary's ([`ScalePlan`],
//! [`Migration`]), the same one a job master carries out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::units::{Bytes, Millicores, WorkerType};

pub use vocab::plan::{Migration, RoleTarget, ScalePlan};

pub use vocab::Role;

/// What one process is given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessResources {
    pub cpu: Millicores,
    pub memory: Bytes,
    /// GPUs by type; empty for CPU-only processes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpus: BTreeMap<WorkerType, vocab::Gpus>,
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
            Role::PS => self.ps,
            Role::WORKER => self.workers,
            _ => 0,
        }
    }
}

impl From<&ProcessResources> for vocab::Resources {
    /// What a plan asks for: the CPU, the memory and the GPUs (of their type when they are of
    /// one).
    fn from(r: &ProcessResources) -> Self {
        let gpus: vocab::Gpus = r.gpus.values().copied().sum();
        let mut types = r.gpus.iter().filter(|(_, n)| !n.is_zero()).map(|(t, _)| t);
        let gpu_type = match (types.next(), types.next()) {
            (Some(t), None) => Some(t.0.clone()),
            _ => None,
        };
        vocab::Resources {
            cpu: Some(r.cpu),
            memory: Some(r.memory),
            gpu: (!gpus.is_zero()).then_some(gpus),
            gpu_type,
            custom: Default::default(),
        }
    }
}
