//! What the brain may hand out: from its config (`[cluster] cpus`), or, with
//! `[cluster] ray_address`, read from a Ray cluster's state API before every round (alive nodes'
//! CPUs), in the form the optimizer's live snapshot takes ([`LiveCluster`]).

use optimizer::live::LiveCluster;
use ray_client::{RayApi, RayCluster};

use crate::BrainError;

/// The live cluster a Ray cluster's nodes make: every alive node's CPUs (Ray's logical CPUs),
/// in slots of `slot_millicores`, for at most `max_processes` processes.
pub fn from_ray(ray: &RayCluster, slot_millicores: u64, max_processes: u32) -> LiveCluster {
    let cpus = ray.sum(|n| &n.total).cpus;
    LiveCluster {
        cpu_millicores: (cpus * 1000.0).round() as u64,
        slot_millicores,
        max_processes,
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
    fn every_alive_nodes_cpus_count() {
        let node = |cpus: f64, free: f64| RayNode {
            node_id: format!("n{cpus}"),
            ip: "127.0.0.1".into(),
            is_head: false,
            total: RayResources {
                cpus,
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
                max_processes: 40
            }
        );
    }
}
