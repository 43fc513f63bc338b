//! Brain's job master: runs one elastic training job and keeps it alive.
//!
//! * [`spec`] reads and validates the user's job spec (YAML).
//! * [`ledger`] (pure) hands out data shards and proves exactly-once consumption per epoch.
//! * [`rendezvous`] (pure) forms allreduce rounds and the ps cluster spec.
//! * [`job`] (pure) holds the job context and takes every decision: registration, heartbeats,
//!   failures and relaunches, checkpoints, completion. It returns effects instead of doing I/O.
//! * [`persist`] writes the job context atomically and durably after every change.
//! * [`platform`] starts and stops worker agents: local processes by default, or Ray jobs on
//!   a Ray cluster ([`platform::ray`], with its capacity read from Ray's state API).
//! * [`brain_link`]: with a brain configured, registers the job, reports its metrics, polls
//!   for plans and carries them out, and reports how the job ended.
//! * [`shared`] holds the state the tasks share and applies every decision durably;
//!   [`master`] is the async shell: `run(config, listener, shutdown)`; [`service`] is the thin
//!   tonic adapter over [`job`] through [`shared`].
//! * [`precheck`] runs the pre-run check (the spec's `precheck:`) over the nodes the platform
//!   offers before the first launch; the job avoids the faulty nodes and stragglers it finds.
//! * [`diagnose`] turns a persisted context into a diagnosis: the timeline of its troubles,
//!   the hangs with their stacks, its effective training time.

pub mod brain_link;
pub mod diagnose;
pub mod error;
pub mod job;
pub mod ledger;
pub mod master;
pub mod persist;
pub mod platform;
pub mod precheck;
pub mod rendezvous;
pub mod scale;
pub mod service;
pub mod shared;
pub mod spec;

pub use error::Error;
pub use master::{JobReport, MasterConfig, run};
