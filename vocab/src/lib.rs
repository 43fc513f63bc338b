//! Brain's vocabulary, at the bottom of the crate graph: every other crate (the optimizer, the
//! job master, the worker agent, the brain) names jobs, units, roles and specs with these types,
//! so each is defined once.
//!
//! * [`ids`]: [`JobId`], [`WorkerType`].
//! * [`units`]: [`Millicores`], [`Bytes`], and the Kubernetes-style quantities a spec writes.
//! * [`role`]: [`JobKind`], [`Role`] (a role group's name: `worker`, `ps`, `rollout`, ...),
//!   [`SlotKey`] (`worker-3`), role counts as command lines write them (`rollout=4`).
//! * [`spec`]: the job spec a user writes ([`JobSpec`]): its role groups (the training group
//!   `kind` names, service and single roles with their topology and failover level), its pure
//!   validation, and apart from it the checks that touch the machine ([`spec::host`]).
//! * [`plan`]: the versioned [`ScalePlan`] (per-role targets, migrations) the brain sends and a
//!   job master carries out.
//! * [`report`]: a job's phase and the report its master writes when it ends.
//! * [`run_dir`]: the files of a job master's run directory.
//! * [`devices`]: a node's GPUs device by device, as Ray hands them out, rebuilt from what
//!   our processes were given and the platform's amount.
//! * [`flash`]: where a node's flash checkpoint copies live (a directory per run and process).
//! * [`sandbox`]: how a job's `command:` processes are confined (user, bubblewrap's view).
//! * [`net`]: this node's address as a peer reaches it (the route's local end).
//! * [`paths`]: paths from user input kept inside their directory; files and directories made
//!   without following planted links.
//! * [`text`]: a job's text made safe to print on a terminal (no escape sequences).
//! * [`beneath`]: file operations of a root component inside a directory a job writes: by one
//!   name at a time relative to the open directory, never through a link.
//!
//! * `wire` (feature `wire`): one `From`/`TryFrom` per job-master wire type.
//!
//! Nothing here does I/O beyond reading a spec or context file and looking up a route on
//! request.

pub mod beneath;
pub mod devices;
pub mod error;
pub mod flash;
pub mod ids;
pub mod net;
pub mod paths;
pub mod plan;
pub mod report;
pub mod role;
pub mod run_dir;
pub mod sandbox;
pub mod spec;
pub mod text;
pub mod units;
#[cfg(feature = "wire")]
pub mod wire;

pub use error::{Error, SpecError};
pub use ids::{JobId, WorkerType};
pub use plan::{Migration, RoleTarget, ScalePlan};
pub use report::{JobPhase, JobReport, Phase};
pub use role::{JobKind, Role, SlotKey};
pub use spec::{JobSpec, Resources};
pub use units::{Bytes, Gpus, Millicores};
