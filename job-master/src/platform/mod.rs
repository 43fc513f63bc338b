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
    /// Stops the slot's agent: SIGTERM (or the platform's equivalent), then a kill after `grace`.
    async fn stop(&self, key: SlotKey, grace: Duration);
    /// Stops every agent this platform started.
    async fn stop_all(&self, grace: Duration);
    /// Agents still running.
    async fn running(&self) -> usize;
    /// What this platform can place for the job; scale plans beyond it are rejected.
    fn capacity(&self) -> Capacity;
}

pub use vocab::spec::PlatformConfig;
