//! Where the job's processes run. A [`Platform`] starts and stops worker agents and reports when
//! one ends; everything else (what to launch, when, how to recover) is the master's. The local
//! platform, processes on this machine, is the embedded default; [`ray`] runs each agent as a
//! Ray job on an existing Ray cluster; [`external`] leaves starting them to someone else. The
//! platform is chosen with [`PlatformConfig`] (the spec's `platform`, or `job-master run
//! --platform`).

pub mod external;
pub mod local;
pub mod ray;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;
use crate::scale::Capacity;
use crate::spec::Resources;
use vocab::SlotKey;

/// One agent to start: for slot `key`, carrying `incarnation`.
#[derive(Clone, Debug)]
pub struct AgentLaunch {
    pub key: SlotKey,
    pub incarnation: u64,
    pub master_addr: SocketAddr,
    pub resources: Option<Resources>,
    /// The job's secret file (absolute), which the agent and its process read: its path goes
    /// to the agent in [`auth::JOB_TOKEN_ENV`], never the secret.
    pub token_file: PathBuf,
    /// The job's TLS directory (absolute) when the job runs with TLS: it goes to the agent in
    /// [`auth::tls::JOB_TLS_ENV`].
    pub tls_dir: Option<PathBuf>,
    /// The processes it shares its GPU with (a `placement:` group with `share_devices`).
    pub device_share: Option<vocab::spec::DeviceShare>,
    /// The node the plan that added it placed it on (the brain's round): a platform of
    /// several nodes starts it there while that node holds it, else where it finds room.
    pub node: Option<String>,
}

/// Something the platform saw happen to an agent.
#[derive(Clone, Debug, PartialEq)]
pub enum PlatformEvent {
    /// The agent's process was placed and started (platforms that place later than they
    /// launch, see [`Platform::reports_placement`]); it has the register timeout from now on.
    Placed { key: SlotKey, incarnation: u64 },
    /// The platform found no room for the agent in its own time limit and submitted nothing: the
    /// process is still pending, not lost, and is asked for again without counting a relaunch.
    NotPlaced {
        key: SlotKey,
        incarnation: u64,
        description: String,
    },
    AgentExited {
        key: SlotKey,
        incarnation: u64,
        description: String,
    },
    /// Something the platform did for the job as a whole (a placement group reserved), for
    /// the job's events.
    Note(String),
}

/// A node a pre-run check covers: where the job's processes may go.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckNode {
    /// Its address (what `avoid` and the brain's cordons name it by).
    pub name: String,
    /// The GPUs it has (0: the check runs on its CPU).
    pub gpus: u32,
}

/// One check process to run on a node until it ends.
#[derive(Clone, Debug)]
pub struct CheckLaunch {
    /// Unique in the job (part of its log's name and its platform id).
    pub id: String,
    pub argv: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    /// Whole GPUs it is given (the node's device for the check).
    pub gpus: u32,
    /// Stopped after this long.
    pub timeout: Duration,
    /// Given up after this long when the platform has not started it (no room on the node).
    pub place_within: Duration,
}

/// Why a check process did not end well.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckEnd {
    /// The platform found no room for it on its node in time: the node stays unchecked.
    NotPlaced(String),
    /// It failed, or ran past its timeout (with the end of its output).
    Failed(String),
}

#[async_trait::async_trait]
pub trait Platform: Send + Sync {
    fn name(&self) -> &'static str;
    /// Starts an agent. An agent still running for the same slot is stopped first.
    async fn launch(&self, launch: AgentLaunch) -> Result<(), Error>;
    /// Whether this platform says when a launched agent is placed ([`PlatformEvent::Placed`]);
    /// otherwise a launch is placed once `launch` returns. Until then the process is pending:
    /// no register timeout runs, and the brain is told how long it has waited.
    fn reports_placement(&self) -> bool {
        false
    }
    /// The nodes its brain cordoned (by the names the brain lists them by): no new process
    /// is placed there. Platforms of one machine ignore it.
    fn cordon(&self, _nodes: &[String]) {}
    /// The nodes this job avoids (by their addresses: a straggler of the job ran there), as
    /// `cordon` but the job's own choice. Platforms of one machine ignore it.
    fn avoid(&self, _nodes: &[String]) {}
    /// The GPUs the job's alive processes hold, device by device on their nodes (as their
    /// agents registered them), told after every timer tick: a platform that counts a node's
    /// free GPUs as one amount (Ray) rebuilds how they are split from it, so a share is not
    /// pinned to a node whose free GPUs are split too finely to hold it. Others ignore it.
    fn devices_held(&self, _held: vocab::devices::DeviceUse) {}
    /// Whether this platform rebuilds how a node's free GPUs are split
    /// ([`Platform::devices_held`]): where not, the job's device use is not gathered for it.
    fn counts_devices(&self) -> bool {
        false
    }
    /// The GPUs the other jobs' processes hold, device by device, as the brain last told them
    /// (`GetPlanResponse.other_jobs_devices`): counted with the job's own where a node's free
    /// GPUs are rebuilt. Others ignore it.
    fn others_devices(&self, _held: vocab::devices::DeviceUse) {}
    /// Stops the slot's agent: SIGTERM (or the platform's equivalent), then a kill after `grace`.
    async fn stop(&self, key: SlotKey, grace: Duration);
    /// Stops every agent this platform started.
    async fn stop_all(&self, grace: Duration);
    /// Agents still running.
    async fn running(&self) -> usize;
    /// What this platform can place for the job; scale plans beyond it are rejected.
    fn capacity(&self) -> Capacity;
    /// The nodes where the job's processes may go now (neither cordoned nor avoided): what a
    /// pre-run check covers.
    async fn check_nodes(&self) -> Result<Vec<CheckNode>, Error> {
        Err(Error::InvalidRequest(format!(
            "the {} platform runs no pre-run check: turn `precheck:` off",
            self.name()
        )))
    }
    /// Runs one check process on `node` and waits for it: `Ok` when it exited 0, else why not
    /// (with the end of its output).
    async fn run_check(&self, node: &CheckNode, check: CheckLaunch) -> Result<(), CheckEnd> {
        let _ = (node, check);
        Err(CheckEnd::Failed(format!(
            "the {} platform runs no check process",
            self.name()
        )))
    }
}

pub use vocab::spec::PlatformConfig;

/// The last `n` lines of a process's output, for an error that says why it failed.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(n)..].join("\n");
    if tail.is_empty() {
        "no output".into()
    } else {
        format!("last output:\n{tail}")
    }
}
