//! Wire types of Brain. Every `.proto` file lives under `proto/` in a versioned package
//! (`brain.jobmaster.v1`, ...); `build.rs` compiles them with protox, so no `protoc` is
//! needed, and this crate re-exports the generated messages, clients and servers. No logic.

/// The job master's API (agents and training processes) and the built-in parameter server.
pub mod jobmaster {
    pub mod v1 {
        tonic::include_proto!("brain.jobmaster.v1");
    }
}

/// The brain's API (job masters and operators).
pub mod service {
    pub mod v1 {
        tonic::include_proto!("brain.service.v1");
    }
}

/// The most metric reports one `MetricsBatch` may carry: the brain refuses more, and a job
/// master with more queued (after the brain was away) sends them in several batches.
pub const MAX_REPORTS_PER_BATCH: usize = 1_000;

/// How an agent's `ProcessExited.reason` begins when it ended the process for going over its
/// memory limit (what a cgroup's OOM killer would do): the job master counts these as OOM kills.
pub const OUT_OF_MEMORY: &str = "out of memory";

/// How an agent's `ProcessExit.agent_reason` begins when its node does not see the job's
/// checkpoint directory as the job master wrote it: the job fails at once with the reason (every
/// node must share the directory; relaunching cannot help).
pub const CHECKPOINT_NOT_SHARED: &str = "checkpoint directory not shared";

/// The checkpoint manifest (`manifest.json` in a checkpoint directory): the file contract between
/// the job master, which writes it when a checkpoint commits, and the training processes, which
/// resume from it. Paths are absolute.
pub mod checkpoint {
    use serde::{Deserialize, Serialize};

    pub const MANIFEST_FILE: &str = "manifest.json";
    /// The file in a checkpoint directory the job master writes a token to at its start, for
    /// every agent to read back (`RegisterAgentResponse.checkpoint_token`).
    pub const SHARED_MARKER: &str = ".brain-shared";

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Manifest {
        pub id: u64,
        /// `ps`, `allreduce` or `flash` (written out of shared memory: `ps` for the parameter
        /// servers' partitions, `model` for a replicated state, `shards` for a sharded one; a
        /// part's digest is then the SHA-256 of its file).
        pub kind: String,
        /// Training step (allreduce) or shards done (ps) when it was taken.
        pub step: u64,
        /// One partition per parameter server (ps jobs), by PS index.
        #[serde(default)]
        pub ps: Vec<Part>,
        /// The replicated model and optimiser state (allreduce jobs).
        #[serde(default)]
        pub model: Option<Part>,
        /// A flash checkpoint of a sharded state: each rank's part, by rank.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub shards: Vec<Part>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Part {
        pub index: u32,
        pub path: String,
        /// SHA-256 of the part's contents, hex.
        pub digest: String,
        /// The partition's keys (a PS's part on disk); the part's bytes (a flash part).
        pub keys: u64,
    }
}
