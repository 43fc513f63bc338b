//! Alibaba's GPU cluster trace of 2023 ("openb", Alibaba ClusterData `cluster-trace-gpu-v2023`):
//!
//! * pod list: `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
//!   creation_time,deletion_time,scheduled_time` (times in seconds; `gpu_spec` lists the GPU
//!   models a pod accepts, `|`-separated, empty for any);
//! * node list: `sn,cpu_milli,memory_mib,gpu,model` (`model` empty on CPU-only nodes).
//!
//! And its GPU-disaggregated DLRM serving trace of 2025 (`cluster-trace-gpu-v2025`,
//! [`read_dlrm`]): per instance its role (CPU node or GPU node), service, CPU, GPU and memory
//! requests and limits, and creation time.

use std::path::Path;

use crate::DatasetError;
use crate::table::{Layout, Table};

#[derive(Clone, Debug, PartialEq)]
pub struct Pod {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Thousandths of each GPU used (GPU sharing).
    pub gpu_milli: u32,
    pub gpu_models: Vec<String>,
    pub qos: String,
    pub phase: String,
    pub creation_s: u64,
    pub deletion_s: Option<u64>,
    pub scheduled_s: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u32,
    pub model: Option<String>,
}

pub fn read_pods(path: &Path) -> Result<Vec<Pod>, DatasetError> {
    let t = Table::read(
        path,
        Layout::csv(&[
            "name",
            "cpu_milli",
            "memory_mib",
            "num_gpu",
            "gpu_milli",
            "gpu_spec",
            "qos",
            "pod_phase",
            "creation_time",
            "deletion_time",
            "scheduled_time",
        ]),
    )?;
    let optional = |i: usize, c: usize| -> Result<Option<u64>, DatasetError> {
        match t.optional_text(i, c) {
            None => Ok(None),
            Some(_) => t.count(i, c, 0).map(Some),
        }
    };
    (0..t.rows())
        .map(|i| {
            Ok(Pod {
                name: t.text(i, 0)?.to_string(),
                cpu_milli: t.count(i, 1, 0)?,
                memory_mib: t.count(i, 2, 0)?,
                num_gpu: t.count(i, 3, 0)? as u32,
                gpu_milli: t.count(i, 4, 0)? as u32,
                gpu_models: t
                    .optional_text(i, 5)
                    .map(|s| s.split('|').map(str::to_string).collect())
                    .unwrap_or_default(),
                qos: t.text(i, 6)?.to_string(),
                phase: t.text(i, 7)?.to_string(),
                creation_s: t.count(i, 8, 0)?,
                deletion_s: optional(i, 9)?,
                scheduled_s: optional(i, 10)?,
            })
        })
        .collect()
}

pub fn read_nodes(path: &Path) -> Result<Vec<Node>, DatasetError> {
    let t = Table::read(
        path,
        Layout::csv(&["sn", "cpu_milli", "memory_mib", "gpu", "model"]),
    )?;
    (0..t.rows())
        .map(|i| {
            Ok(Node {
                name: t.text(i, 0)?.to_string(),
                cpu_milli: t.count(i, 1, 0)?,
                memory_mib: t.count(i, 2, 0)?,
                gpus: t.count(i, 3, 0)? as u32,
                model: t.optional_text(i, 4).map(str::to_string),
            })
        })
        .collect()
}

/// One instance of Alibaba's GPU-disaggregated DLRM serving trace (2025): a CPU node (`CN`)
/// or GPU node (`HN`) of a service.
#[derive(Clone, Debug, PartialEq)]
pub struct DlrmInstance {
    pub name: String,
    /// `CN` or `HN`.
    pub role: String,
    pub app: String,
    pub cpu_request: f64,
    pub cpu_limit: f64,
    pub gpu_request: f64,
    pub memory_request_gib: f64,
    pub memory_limit_gib: f64,
    /// Seconds from the trace's start; `None` for instances created before it.
    pub creation_s: Option<f64>,
}

pub fn read_dlrm(path: &Path) -> Result<Vec<DlrmInstance>, DatasetError> {
    let t = Table::read(
        path,
        Layout::csv(&[
            "instance_sn",
            "role",
            "app_name",
            "cpu_request",
            "cpu_limit",
            "gpu_request",
            "gpu_limit",
            "rdma_request",
            "rdma_limit",
            "memory_request",
            "memory_limit",
            "disk_request",
            "disk_limit",
            "max_instance_per_node",
            "creation_time",
            "scheduled_time",
            "deletion_time",
        ]),
    )?;
    (0..t.rows())
        .map(|i| {
            let role = t.text(i, 1)?.to_string();
            if role != "CN" && role != "HN" {
                return Err(t.error(i, 1, format!("role {role:?}: expected CN or HN")));
            }
            Ok(DlrmInstance {
                name: t.text(i, 0)?.to_string(),
                role,
                app: t.text(i, 2)?.to_string(),
                cpu_request: t.number(i, 3, 0.0)?,
                cpu_limit: t.number(i, 4, 0.0)?,
                gpu_request: t.number(i, 5, 0.0)?,
                memory_request_gib: t.number(i, 9, 0.0)?,
                memory_limit_gib: t.number(i, 10, 0.0)?,
                creation_s: match t.optional_text(i, 14) {
                    None | Some("NaN") | Some("nan") => None,
                    Some(_) => Some(t.number(i, 14, f64::NEG_INFINITY)?),
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> std::path::PathBuf {
        crate::bundled().join("alibaba_gpu_v2023")
    }

    #[test]
    fn dlrm_instances_read_with_their_roles() {
        let path = crate::bundled().join("alibaba_gpu_v2025/disaggregated_DLRM_trace.csv");
        let all = read_dlrm(&path).unwrap();
        assert_eq!(all.len(), 23_871);
        assert_eq!(all.iter().filter(|x| x.role == "CN").count(), 16_485);
        assert_eq!(
            (
                all[0].role.as_str(),
                all[0].app.as_str(),
                all[0].cpu_request
            ),
            ("HN", "app_0", 12.0)
        );
        assert_eq!(all[0].creation_s, None);
        assert!(all.iter().any(|x| x.creation_s.is_some()));
    }

    #[test]
    fn openb_pods_and_nodes_read() {
        let pods = read_pods(&data().join("openb_pod_list_default.csv")).unwrap();
        assert_eq!(pods.len(), 8152);
        assert_eq!(pods[0].name, "openb-pod-0000");
        assert_eq!(
            (pods[0].cpu_milli, pods[0].memory_mib, pods[0].num_gpu),
            (12000, 16384, 1)
        );
        let specs = read_pods(&data().join("openb_pod_list_gpuspec33.csv")).unwrap();
        assert!(specs.iter().any(|p| p.gpu_models == ["V100M16", "V100M32"]));
        let nodes = read_nodes(&data().join("openb_node_list_gpu_node.csv")).unwrap();
        assert_eq!(nodes[0].model.as_deref(), Some("P100"));
        let all = read_nodes(&data().join("openb_node_list_all_node.csv")).unwrap();
        assert_eq!(all.len(), 1523);
        assert!(all.iter().any(|n| n.model.is_none() && n.gpus == 0));
    }
}
