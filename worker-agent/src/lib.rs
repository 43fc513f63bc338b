//! Brain's worker agent and the built-in reference workload.
//!
//! * [`agent`] is the supervisor a platform starts for one process slot: it registers with the
//!   job master, joins the rendezvous, launches the training process with the torchrun
//!   environment (and TF_CONFIG for ps jobs), forwards SIGTERM with a grace period, reports
//!   exits and sends heartbeats carrying [`sampler`] readings (procfs; NVML when it loads).
//!   When the master thinks its process hung, [`stacks`] captures what its threads are doing.
//!   [`flash`] holds the process's flash checkpoint copies in shared memory and writes them
//!   out to the checkpoint directory behind its training ([`flash_write`]: on a thread at the
//!   lowest CPU priority, hurried after a while, around the page cache); [`flash_leftovers`] removes the
//!   copies on the node that no agent holds any more; [`flash_copy`] is the process's half,
//!   for the built-in workload.
//!   `launch` builds the training process's environment, starts it and stops it; [`output`]
//!   caps what the process writes, and [`own_log`] what the agent itself does.
//!   A process of a service or single role (a role of the job's own beside its training
//!   group) runs its role's command and env, started at once without a rendezvous.
//! * [`workload`] is the training the agent launches when a job names no command: a
//!   parameter server, a ps worker and a ring all-reduce worker, all real training of a sparse
//!   CTR model on the generated data of `workload::ctr`.

pub mod agent;
pub mod error;
pub mod flash;
pub mod flash_copy;
pub mod flash_leftovers;
pub mod flash_write;
mod launch;
pub mod output;
pub mod own_log;
pub mod sampler;
pub mod sandbox;
pub mod stacks;
pub mod workload;

pub use error::Error;
