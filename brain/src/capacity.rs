//! What the brain may hand out: from its config (`[cluster] cpus`, `memory` and
//! `[[cluster.gpu_nodes]]`), or, with `[cluster] ray_address`, read from a Ray cluster's state
//! API before every round (alive nodes' CPUs and memory, and each node's GPUs with their
//! model), in the form the optimizer's live
//! snapshot takes ([`LiveCluster`]), with the nodes it is made of ([`NodeInfo`]). A cordoned
//! node ([`crate::store::Cordon`]) is taken out of what a round plans on ([`without`]).

use optimizer::live::{ANY_MODEL, LiveCluster, LiveNode, NodeRoom};
use ray_client::{RayApi, RayCluster};

use crate::BrainError;
use crate::store::Cordon;

/// The node of the CPU pool without Ray: the brain's own machine, where its jobs run.
pub const LOCAL_NODE: &str = "local";

/// A node the brain plans on: a Ray node by its address; without Ray, the CPU pool
/// ([`LOCAL_NODE`]) and each configured GPU node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub cpu_millicores: u64,
    /// The memory its processes may reserve (Ray's `memory` resource; the pool's
    /// `[cluster] memory`, or this machine's, without Ray); 0: not known.
    pub memory_bytes: u64,
    pub gpus: u32,
    pub gpu_type: String,
}

/// The nodes a Ray cluster's alive nodes make.
pub fn nodes_of_ray(ray: &RayCluster) -> Vec<NodeInfo> {
    ray.nodes
        .iter()
        .map(|n| NodeInfo {
            name: n.ip.clone(),
            cpu_millicores: (n.total.cpus * 1000.0).round() as u64,
            memory_bytes: n.total.memory_bytes,
            gpus: n.total.gpus.floor() as u32,
            gpu_type: n.total.gpu_type().unwrap_or(ANY_MODEL).to_string(),
        })
        .collect()
}

/// The nodes of a fixed capacity: the CPU pool (with `pool_memory` bytes, 0: not known) and
/// the GPU nodes.
pub fn fixed_nodes(cluster: &LiveCluster, pool_memory: u64) -> Vec<NodeInfo> {
    let pool = NodeInfo {
        name: LOCAL_NODE.into(),
        cpu_millicores: cluster.cpu_millicores,
        memory_bytes: pool_memory,
        gpus: 0,
        gpu_type: String::new(),
    };
    std::iter::once(pool)
        .chain(cluster.nodes.iter().map(|n| NodeInfo {
            name: n.name.clone(),
            cpu_millicores: 0,
            memory_bytes: 0,
            gpus: n.gpus,
            gpu_type: n.gpu_type.clone(),
        }))
        .collect()
}

/// `cluster` (made of `nodes`) without the cordoned nodes: their CPU and memory out of the
/// pool, their GPUs out of the GPU nodes.
pub fn without(cluster: &LiveCluster, nodes: &[NodeInfo], cordons: &[Cordon]) -> LiveCluster {
    let out = |name: &str| cordons.iter().any(|c| c.node == name);
    let (cpu, memory) = nodes
        .iter()
        .filter(|n| out(&n.name))
        .fold((0, 0), |(c, m), n| {
            (c + n.cpu_millicores, m + n.memory_bytes)
        });
    // A pool whose memory is counted keeps at least a byte of it: 0 would mean "not counted".
    let memory_bytes = match cluster.memory_bytes {
        0 => 0,
        m => m.saturating_sub(memory).max(1),
    };
    LiveCluster {
        cpu_millicores: cluster.cpu_millicores.saturating_sub(cpu),
        memory_bytes,
        nodes: cluster
            .nodes
            .iter()
            .filter(|n| !out(&n.name))
            .cloned()
            .collect(),
        free: cluster
            .free
            .iter()
            .filter(|n| !out(&n.name))
            .cloned()
            .collect(),
        ..cluster.clone()
    }
}

/// The live cluster a Ray cluster's nodes make: every alive node's CPUs (Ray's logical CPUs),
/// in slots of `slot_millicores`, for at most `max_processes` processes, and their memory
/// (Ray's `memory` resource, what its tasks may reserve); each node with GPUs
/// by its address, with their model (its `accelerator_type:MODEL` resource, else
/// [`ANY_MODEL`]); and each node's CPU, memory and GPUs free now (Ray's available resources),
/// which the round places new processes on.
pub fn from_ray(ray: &RayCluster, slot_millicores: u64, max_processes: u32) -> LiveCluster {
    let total = ray.sum(|n| &n.total);
    LiveCluster {
        cpu_millicores: (total.cpus * 1000.0).round() as u64,
        slot_millicores,
        max_processes,
        memory_bytes: total.memory_bytes,
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
        free: ray
            .nodes
            .iter()
            .map(|n| NodeRoom {
                name: n.ip.clone(),
                cpu_millicores: (n.available.cpus * 1000.0).round() as u64,
                memory_bytes: n.available.memory_bytes,
                gpus: vocab::Gpus::from_milli((n.available.gpus * 1000.0).round() as u32),
                devices: Vec::new(),
            })
            .collect(),
    }
}

/// Gives each GPU node's free room device by device ([`NodeRoom::devices`]), which a share or
/// a whole GPU must find on one device: each device its processes were given (`used`, as the
/// jobs' newest reports name them) with what they hold of it left off, each other device of
/// the node whole. Where Ray counts less free than that (other users' processes, or ours
/// that a report does not show yet), the difference is laid out as Ray would lay one process
/// of it out ([`vocab::devices::free_by_device`]). A node none of whose devices a report
/// names keeps its amount only (how it is split is not known), unless Ray counts all its GPUs
/// free or none.
pub fn by_device(cluster: &mut LiveCluster, used: &crate::store::DeviceUse) {
    for room in &mut cluster.free {
        let Some(total) = cluster
            .nodes
            .iter()
            .find(|n| n.name == room.name && n.gpus > 0)
            .map(|n| n.gpus)
        else {
            continue;
        };
        let free = room.gpus.milli();
        let Some(devices) = vocab::devices::free_by_device(total, free, used.on(&room.name)) else {
            continue;
        };
        room.devices = devices.into_iter().map(vocab::Gpus::from_milli).collect();
        room.gpus = room.devices.iter().copied().sum();
    }
}

/// Where the capacity comes from.
pub enum Source {
    /// The config's, with the pool's memory in bytes (0: not known).
    Fixed {
        pool_memory: u64,
    },
    Ray(RayApi),
}

impl Source {
    pub fn new(ray_address: Option<&str>, pool_memory: u64) -> Result<Source, BrainError> {
        Ok(match ray_address {
            Some(a) => Source::Ray(
                RayApi::new(a)
                    .map_err(|e| BrainError::Config(format!("cluster.ray_address: {e}")))?,
            ),
            None => Source::Fixed { pool_memory },
        })
    }

    /// The capacity now and its nodes: `last` when it is fixed, or when Ray does not answer
    /// (said once per failure in the log).
    pub async fn read(&self, last: &(LiveCluster, Vec<NodeInfo>)) -> (LiveCluster, Vec<NodeInfo>) {
        match self {
            Source::Fixed { pool_memory } => (last.0.clone(), fixed_nodes(&last.0, *pool_memory)),
            Source::Ray(api) => match api.cluster().await {
                Ok(c) => (
                    from_ray(&c, last.0.slot_millicores, last.0.max_processes),
                    nodes_of_ray(&c),
                ),
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
                gpus: if cpus > 5.0 { 0.5 } else { 0.0 },
                ..Default::default()
            },
        };
        let mut ray = RayCluster {
            nodes: vec![node(8.0, 1.0), node(4.5, 4.5)],
        };
        ray.nodes[1].ip = "127.0.0.2".into();
        let nodes = nodes_of_ray(&ray);
        assert_eq!(
            nodes
                .iter()
                .map(|n| (n.name.as_str(), n.cpu_millicores, n.gpus))
                .collect::<Vec<_>>(),
            vec![("127.0.0.1", 8000, 2), ("127.0.0.2", 4500, 0)]
        );
        // The GPU node cordoned: its CPUs and GPUs out; the other cordoned: its CPUs out.
        let cordon = |node: &str| Cordon {
            node: node.into(),
            reason: "slow".into(),
            since_unix_ms: 0,
            until_unix_ms: None,
        };
        let all = from_ray(&ray, 500, 40);
        let out = without(&all, &nodes, &[cordon("127.0.0.1")]);
        assert_eq!((out.cpu_millicores, out.nodes.len()), (4500, 0));
        // Its free room is not placed on either.
        let free: Vec<&str> = out.free.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(free, ["127.0.0.2"]);
        let out = without(&all, &nodes, &[cordon("127.0.0.2")]);
        assert_eq!((out.cpu_millicores, out.nodes.len()), (8000, 1));
        // Without Ray: the pool is `local`; a GPU node cordoned leaves the CPU.
        let fixed = fixed_nodes(&all, 8 << 30);
        assert_eq!(
            (fixed[0].name.as_str(), fixed[0].memory_bytes),
            (LOCAL_NODE, 8 << 30)
        );
        let out = without(&all, &fixed, &[cordon("127.0.0.1")]);
        assert_eq!((out.cpu_millicores, out.nodes.len()), (12_500, 0));
        assert_eq!(
            from_ray(&ray, 500, 40),
            LiveCluster {
                free: vec![
                    NodeRoom {
                        name: "127.0.0.1".into(),
                        cpu_millicores: 1000,
                        memory_bytes: 0,
                        gpus: vocab::Gpus::from_milli(500),
                        devices: Vec::new(),
                    },
                    NodeRoom {
                        name: "127.0.0.2".into(),
                        cpu_millicores: 4500,
                        memory_bytes: 0,
                        gpus: vocab::Gpus::ZERO,
                        devices: Vec::new(),
                    }
                ],
                cpu_millicores: 12_500,
                slot_millicores: 500,
                max_processes: 40,
                memory_bytes: 0,
                nodes: vec![LiveNode {
                    name: "127.0.0.1".into(),
                    gpus: 2,
                    gpu_type: "V100".into()
                }]
            }
        );
        // Memory: every alive node's (Ray's `memory`), a cordoned node's taken out with its CPU.
        ray.nodes[0].total.memory_bytes = 6 << 30;
        ray.nodes[1].total.memory_bytes = 2 << 30;
        let all = from_ray(&ray, 500, 40);
        assert_eq!(all.memory_bytes, 8 << 30);
        let nodes = nodes_of_ray(&ray);
        let out = without(&all, &nodes, &[cordon("127.0.0.2")]);
        assert_eq!((out.cpu_millicores, out.memory_bytes), (8000, 6 << 30));
        // Every node cordoned: the memory stays counted (0 would mean "not counted").
        let out = without(&all, &nodes, &[cordon("127.0.0.1"), cordon("127.0.0.2")]);
        assert_eq!((out.cpu_millicores, out.memory_bytes), (0, 1));
    }

    #[test]
    fn a_gpu_nodes_free_room_by_device_from_the_reports_and_rays_count() {
        let room = |name: &str, free: u32| NodeRoom {
            name: name.into(),
            cpu_millicores: 4000,
            memory_bytes: 0,
            gpus: vocab::Gpus::from_milli(free),
            devices: Vec::new(),
        };
        let node = |name: &str, gpus: u32| LiveNode {
            name: name.into(),
            gpus,
            gpu_type: "V100".into(),
        };
        let cluster = |free: Vec<NodeRoom>| LiveCluster {
            free,
            nodes: vec![node("v", 2), node("a", 4)],
            cpu_millicores: 12_000,
            slot_millicores: 500,
            max_processes: 40,
            memory_bytes: 0,
        };
        let devices = |c: &LiveCluster, i: usize| -> Vec<u32> {
            c.free[i].devices.iter().map(|d| d.milli()).collect()
        };
        let mut used = crate::store::DeviceUse::default();
        // On v: 0.7 of device 0 (a 0.4 and a 0.3 share), nothing of device 1. On a: two
        // whole GPUs, devices 1 and 2. A process not placed counts nothing.
        used.add("v", "0", vocab::Gpus::from_milli(400));
        used.add("v", "0", vocab::Gpus::from_milli(300));
        used.add("a", "1,2", vocab::Gpus::whole(2));
        used.add("", "3", vocab::Gpus::ONE);
        // Ray counts what the reports show: v has 0.3 + 1 free, a has devices 0 and 3.
        let mut c = cluster(vec![room("c", 0), room("v", 1300), room("a", 2000)]);
        by_device(&mut c, &used);
        assert!(c.free[0].devices.is_empty(), "a node without GPUs");
        assert_eq!(devices(&c, 1), [300, 1000]);
        assert_eq!(devices(&c, 2), [0, 0, 1000, 1000]);
        assert_eq!(c.free[1].gpus.milli(), 1300);
        // Ray counts 0.5 less on v than the reports leave: laid out as Ray would one 0.5
        // share, on device 1 (device 0's 0.3 does not hold it); on a, one whole GPU less.
        let mut c = cluster(vec![room("v", 800), room("a", 1000)]);
        by_device(&mut c, &used);
        assert_eq!(devices(&c, 0), [300, 500]);
        assert_eq!(devices(&c, 1), [0, 0, 0, 1000]);
        // 1.2 less on a than its two free devices: a whole one and 0.2 of the other.
        let mut c = cluster(vec![room("a", 800)]);
        by_device(&mut c, &used);
        assert_eq!(devices(&c, 0), [0, 0, 0, 800]);
        // Ray counts more free than the reports leave (a process gone since its report):
        // the reports' view, the smaller.
        let mut c = cluster(vec![room("v", 2000)]);
        by_device(&mut c, &used);
        assert_eq!(
            (devices(&c, 0), c.free[0].gpus.milli()),
            (vec![300, 1000], 1300)
        );
        // No report names a device of a node: its amount only, unless all are free or none.
        let none = crate::store::DeviceUse::default();
        for (free, want) in [(1200, vec![]), (4000, vec![1000; 4]), (0, vec![0; 4])] {
            let mut c = cluster(vec![room("a", free)]);
            by_device(&mut c, &none);
            assert_eq!(devices(&c, 0), want, "{free}");
            assert_eq!(c.free[0].gpus.milli(), free);
        }
    }
}
