//! The snapshot a policy allocates and the allocation it returns.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::units::{JobId, WorkerType};

/// Worker types and how many workers (GPUs) of each the cluster has.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub worker_types: Vec<WorkerType>,
    pub capacity: Vec<f64>,
}

/// One job as a policy sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobDemand {
    pub id: JobId,
    /// Workers the job occupies while it runs (Gavel's scale factor).
    pub scale_factor: u32,
    /// Throughput (steps/s) on each worker type; 0 where it cannot run.
    pub throughput: Vec<f64>,
    /// Priority weight (1 by default).
    #[serde(default = "one")]
    pub weight: f64,
    /// Steps left to run (needed by the makespan policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_steps: Option<f64>,
    /// Least share of time the job must get (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_share: Option<f64>,
    /// Most share of time the job may get (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_share: Option<f64>,
    /// The tenant the job belongs to, for quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

fn one() -> f64 {
    1.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    pub cluster: Cluster,
    pub jobs: Vec<JobDemand>,
    /// Per tenant, the most workers of each type its jobs may use at once.
    #[serde(default)]
    pub quotas: BTreeMap<String, Vec<f64>>,
}

impl Problem {
    /// Rejects shapes and numbers no policy can work with; names the offending value.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let k = self.cluster.worker_types.len();
        let bad = |m: String| Err(PolicyError::InvalidProblem(m));
        if k == 0 {
            return bad("the cluster has no worker types".into());
        }
        if self.cluster.capacity.len() != k {
            return bad(format!(
                "{} capacities for {k} worker types",
                self.cluster.capacity.len()
            ));
        }
        for (t, c) in self.cluster.worker_types.iter().zip(&self.cluster.capacity) {
            if !c.is_finite() || *c < 0.0 {
                return bad(format!("capacity of {t} is {c}"));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for j in &self.jobs {
            if !seen.insert(j.id) {
                return bad(format!("{} appears twice", j.id));
            }
            if j.throughput.len() != k {
                return bad(format!(
                    "{} has {} throughputs for {k} worker types",
                    j.id,
                    j.throughput.len()
                ));
            }
            if let Some(t) = j.throughput.iter().find(|t| !t.is_finite() || **t < 0.0) {
                return bad(format!("{} has throughput {t}", j.id));
            }
            if j.scale_factor == 0 {
                return bad(format!("{} has scale factor 0", j.id));
            }
            if !j.weight.is_finite() || j.weight <= 0.0 {
                return bad(format!("{} has weight {}", j.id, j.weight));
            }
            if let Some(r) = j.remaining_steps
                && !(r.is_finite() && r > 0.0)
            {
                return bad(format!("{} has remaining_steps {r}", j.id));
            }
            for (name, v) in [("min_share", j.min_share), ("max_share", j.max_share)] {
                if let Some(v) = v
                    && !(0.0..=1.0).contains(&v)
                {
                    return bad(format!("{} has {name} {v}, outside [0, 1]", j.id));
                }
            }
            if let (Some(lo), Some(hi)) = (j.min_share, j.max_share)
                && lo > hi
            {
                return bad(format!("{} has min_share {lo} above max_share {hi}", j.id));
            }
        }
        for (tenant, q) in &self.quotas {
            if q.len() != k {
                return bad(format!(
                    "quota of tenant {tenant:?} has {} values for {k} worker types",
                    q.len()
                ));
            }
            if let Some(v) = q.iter().find(|v| !v.is_finite() || **v < 0.0) {
                return bad(format!("quota of tenant {tenant:?} is {v}"));
            }
        }
        Ok(())
    }
}

/// Share of time each job runs on each worker type (rows sum to at most 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub shares: BTreeMap<JobId, Vec<f64>>,
    /// The policy's objective value for these shares.
    pub objective: f64,
}

impl Allocation {
    /// Workers of each type in use (Σ_m scale_factor × share).
    pub fn usage(&self, problem: &Problem) -> Vec<f64> {
        let mut used = vec![0.0; problem.cluster.worker_types.len()];
        for j in &problem.jobs {
            if let Some(x) = self.shares.get(&j.id) {
                for (u, s) in used.iter_mut().zip(x) {
                    *u += j.scale_factor as f64 * s;
                }
            }
        }
        used
    }

    /// Total throughput Σ_m Σ_j T\[m\]\[j\] × share.
    pub fn throughput(&self, problem: &Problem) -> f64 {
        problem
            .jobs
            .iter()
            .filter_map(|j| {
                self.shares
                    .get(&j.id)
                    .map(|x| j.throughput.iter().zip(x).map(|(t, s)| t * s).sum::<f64>())
            })
            .sum()
    }
}
