//! Brain's decisions as a pure, synchronous library: no tokio, no I/O, no clock reads. It takes
//! plain snapshots and returns plain plans, so the live brain and the what-if simulator drive the
//! very same code.
//!
//! * [`units`]: newtypes for ids and resource units (the [`vocab`] crate's, named here).
//! * [`problem`]: the snapshot a policy sees (cluster capacity per worker type, jobs with their
//!   throughput on each type) and the [`problem::Allocation`] it returns.
//! * [`lp`]: the LP scaffolding every LP policy shares: variables `x[m][j]` (share of time job
//!   `m` runs on worker type `j`), the base constraints, two methods that solve it (a structured
//!   interior-point method, `lp::block_ipm`, with clarabel on the whole LP as checked fallback,
//!   `lp::general`), and clean-up of the answer so capacity is never exceeded.
//! * [`policy`]: the [`policy::Policy`] trait and one file per policy, chosen with the serde enum
//!   [`policy::PolicyKind`] that an operator's TOML names.
//! * [`throughput`]: throughput models behind one trait, fitted from step-time samples:
//!   Pollux's, Optimus' (NNLS) and a measured table.
//! * [`plan`]: per-job vocabulary: process resources, job configurations, scale plans.
//! * [`profile`]: job-profile models (what a new job needs, from the jobs before it; ours with
//!   linfa) beside DLRover's rule, the user's request and the global median, and their
//!   time-ordered evaluation.
//! * [`heuristics`]: runtime corrections (hot PS, OOM growth, pending shrink, speed-up), one per
//!   file behind [`heuristics::Heuristic`], merged into one [`plan::ScalePlan`] per job.
//! * [`config`]: the operator's TOML policy file (allocation policy and heuristics).
//! * [`instance`]: the Gavel-style allocation LP instance format of `datasets/data/lp_instances`.
//! * [`schedule`]: round-based schedulers for GPU jobs (FIFO, Tiresias, Optimus, Pollux-style
//!   goodput, DLRover's heuristics, Gavel over the [`policy`] LPs, and Brain's own
//!   `elastic_lp`) behind [`schedule::Scheduler`], chosen with [`schedule::SchedulerKind`]: whole
//!   GPUs on nodes each round.
//! * [`sim`]: the what-if simulator that replays a trace under a scheduler on a virtual clock.
//! * [`live`]: the live brain's round: running and queued jobs, their fitted speeds and the CPU
//!   the brain may hand out go through the same [`schedule::Scheduler`], with cool-downs and
//!   capacity kept.
//! * [`sizing`]: a submitted job's initial counts and resources from the finished jobs like it.
//! * [`placement`]: integerisation of a fractional allocation into whole placements on nodes,
//!   with what rounding cost against the LP.

pub mod config;
pub mod error;
pub mod heuristics;
pub mod instance;
pub mod live;
pub mod lp;
pub mod placement;
pub mod plan;
pub mod policy;
pub mod problem;
pub mod profile;
pub mod schedule;
pub mod sim;
pub mod sizing;
pub mod throughput;
pub mod units;

pub use error::PolicyError;
pub use policy::{Policy, PolicyKind};
pub use problem::{Allocation, Cluster, JobDemand, Problem};
