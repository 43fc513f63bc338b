//! The cluster's GPU nodes as the live round sees them, their models, and why a job asking
//! for GPUs no node holds can never run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vocab::Gpus;

/// A node's GPUs as the round sees them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveNode {
    /// How the platform names it (a Ray node: its address).
    pub name: String,
    pub gpus: u32,
    /// Its GPU model (`V100`); GPUs of no declared model are of model [`ANY_MODEL`].
    pub gpu_type: String,
}

/// The model of GPUs a node declares without one.
pub const ANY_MODEL: &str = "GPU";

/// The cluster's GPU models (sorted) and, per model, the GPUs of its largest node and all.
pub fn gpu_models(nodes: &[LiveNode]) -> BTreeMap<String, (u32, u32)> {
    let mut out: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.gpus > 0) {
        let e = out.entry(n.gpu_type.clone()).or_default();
        e.0 = e.0.max(n.gpus);
        e.1 += n.gpus;
    }
    out
}

/// Why a job asking for `gpus` GPUs of `model` per worker can never run on `nodes`, naming the
/// cluster's models and sizes; `None` when some node holds a worker.
pub fn unplaceable(nodes: &[LiveNode], gpus: Gpus, model: Option<&str>) -> Option<String> {
    if gpus.is_zero() {
        return None;
    }
    let models = gpu_models(nodes);
    let fits = models
        .iter()
        .any(|(m, (largest, _))| model.is_none_or(|want| want == m) && *largest >= gpus.devices());
    if fits {
        return None;
    }
    let have = cluster_gpus(nodes);
    let want = match model {
        Some(m) if !models.contains_key(m) => format!("GPU model {m:?}, which no node has"),
        Some(m) => format!("{gpus} {m} GPUs per worker, more than any node holds"),
        None => format!("{gpus} GPUs per worker, more than any node holds"),
    };
    Some(format!("the job asks for {want}: {have}"))
}

/// The cluster's GPUs as a refusal names them: `the cluster has A100: 4 GPUs, at most 4 on a
/// node; V100: ...`, or that it has none.
pub(in crate::live) fn cluster_gpus(nodes: &[LiveNode]) -> String {
    let models = gpu_models(nodes);
    if models.is_empty() {
        return "the cluster has no GPUs".to_string();
    }
    let list: Vec<String> = models
        .iter()
        .map(|(m, (largest, total))| format!("{m}: {total} GPUs, at most {largest} on a node"))
        .collect();
    format!("the cluster has {}", list.join("; "))
}
