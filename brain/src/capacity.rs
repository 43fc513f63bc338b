//! What the brain may hand out: from its config (`[cluster] cpus` and `[[cluster.gpu_nodes]]`),
//! or, with `[cluster] ray_address`, read from a Ray cluster's state API before every round
//! (alive nodes' CPUs, and each node's GPUs with their model), in the form the optimizer's live
//! snapshot takes ([`LiveCluster`]).

use optimizer::live::{ANY_MODEL, LiveCluster, LiveNode};
use ray_client::{RayApi, RayCluster};

use crate::BrainError;

/// The live cluster a Ray cluster's nodes make: every alive node's CPUs (Ray's logical CPUs),
/// in slots of `slot_millicores`, for at most `max_processes` processes; each node with GPUs
/// by its address, with their model (its `accelerator_type:MODEL` resource, else
/// [`ANY_MODEL`]).
pub fn from_ray(ray: &RayCluster, slot_millicores: u64, max_processes: u32) -> LiveCluster {
    let cpus = ray.sum(|n| &n.total).cpus;
    LiveCluster {
        cpu_millicores: (cpus * 1000.0).round() as u64,
        slot_millicores,
        max_processes,
        nodes: ray
            .nodes
            .iter()
            .filter(|n| n.total.gpus >= 1.0)
            .map(|n| LiveNode {
                name: n.ip.clone(),
                gpus: n.total.gpus.floor() as u32,
                gpu_type: n.total.gpu_type().unwrap_or(ANY_MODEL).to_string(),
            })
            .collect(),
    }
}

/// Where the capacity comes from.
pub enum Source {
    Fixed,
    Ray(RayApi),
}

impl Source {
    pub fn new(ray_address: Option<&str>) -> Result<Source, BrainError> {
        Ok(match ray_address {
            Some(a) => Source::Ray(
                RayApi::new(a)
                    .map_err(|e| BrainError::Config(format!("cluster.ray_address: {e}")))?,
            ),
            None => Source::Fixed,
        })
    }

    /// The capacity now: `last` when it is fixed, or when Ray does not answer (said once per
    /// failure in the log).
    pub async fn read(&self, last: &LiveCluster) -> LiveCluster {
        match self {
            Source::Fixed => last.clone(),
            Source::Ray(api) => match api.cluster().await {
                Ok(c) => from_ray(&c, last.slot_millicores, last.max_processes),
                Err(e) => {
                    tracing::warn!(
                        "cannot read the cluster from Ray, planning with the last capacity: {e}"
                    );
                    last.clone()
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ray_client::{RayNode, RayResources};

    #[test]
    fn every_alive_nodes_cpus_count_and_its_gpus_by_model() {
        let node = |cpus: f64, free: f64| RayNode {
            node_id: format!("n{cpus}"),
            ip: "127.0.0.1".into(),
            is_head: false,
            total: RayResources {
                cpus,
                gpus: if cpus > 5.0 { 2.0 } else { 0.0 },
                custom: if cpus > 5.0 {
                    [("accelerator_type:V100".to_string(), 1.0)].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            },
            available: RayResources {
                cpus: free,
                ..Default::default()
            },
        };
        let ray = RayCluster {
            nodes: vec![node(8.0, 1.0), node(4.5, 4.5)],
        };
        assert_eq!(
            from_ray(&ray, 500, 40),
            LiveCluster {
                cpu_millicores: 12_500,
                slot_millicores: 500,
                max_processes: 40,
                nodes: vec![LiveNode {
                    name: "127.0.0.1".into(),
                    gpus: 2,
                    gpu_type: "V100".into()
                }]
            }
        );
    }
}
