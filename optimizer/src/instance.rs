//! The allocation LP instance format of `datasets/data/lp_instances` (built from Gavel's measured
//! throughputs): `{"worker_types": [..], "capacity": [..], "jobs": [{"job_type",
//! "scale_factor", "throughput": [..]}]}`. Parsing is the caller's (this crate reads no files).

use serde::{Deserialize, Serialize};

use crate::problem::{Cluster, JobDemand, Problem};
use crate::units::{JobId, WorkerType};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GavelInstance {
    pub worker_types: Vec<String>,
    pub capacity: Vec<f64>,
    pub jobs: Vec<GavelJob>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GavelJob {
    pub job_type: String,
    pub scale_factor: u32,
    pub throughput: Vec<f64>,
}

impl From<GavelInstance> for Problem {
    /// Jobs are numbered in file order.
    fn from(i: GavelInstance) -> Problem {
        Problem {
            cluster: Cluster {
                worker_types: i.worker_types.into_iter().map(WorkerType).collect(),
                capacity: i.capacity,
            },
            jobs: i
                .jobs
                .into_iter()
                .enumerate()
                .map(|(n, j)| JobDemand {
                    id: JobId(n as u64),
                    scale_factor: j.scale_factor,
                    throughput: j.throughput,
                    weight: 1.0,
                    remaining_steps: None,
                    min_share: None,
                    max_share: None,
                    tenant: None,
                })
                .collect(),
            quotas: Default::default(),
        }
    }
}
