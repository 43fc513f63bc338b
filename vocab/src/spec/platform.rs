//! Where a job's processes run, as the spec's `platform` or `job-master run --platform` names it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which platform to run on, as an operator names it in config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum PlatformConfig {
    /// Processes on this machine.
    Local {
        /// The worker-agent binary; default: next to the job-master binary.
        agent_bin: Option<PathBuf>,
        /// Processes of the job this machine may run at once (default 32).
        #[serde(default)]
        max_processes: Option<u32>,
        /// The GPUs processes are given, as `CUDA_VISIBLE_DEVICES` names them (indices or
        /// UUIDs) [default: the job master's own `CUDA_VISIBLE_DEVICES`, else every GPU NVML
        /// sees, else none].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpus: Option<Vec<String>>,
    },
    /// Agents are started by someone else; the master only waits for them to register.
    External,
    /// Each agent is a Ray job on an existing Ray cluster (see `ray`).
    Ray {
        /// The Ray dashboard (Job Submission API), e.g. `http://127.0.0.1:8265`.
        address: String,
        /// The worker-agent binary, at this path on every Ray node; default: next to the
        /// job-master binary.
        #[serde(default)]
        agent_bin: Option<PathBuf>,
        /// Processes of the job at once [default: the cluster's whole CPUs].
        #[serde(default)]
        max_processes: Option<u32>,
        /// How long a process may wait for room before it counts as failed [default 60000].
        #[serde(default)]
        place_timeout_ms: Option<u64>,
        /// Environment variables for every agent.
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
}

impl Default for PlatformConfig {
    fn default() -> Self {
        PlatformConfig::Local {
            agent_bin: None,
            max_processes: None,
            gpus: None,
        }
    }
}
