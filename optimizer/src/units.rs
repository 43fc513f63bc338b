//! Newtypes for ids and units, so a job id is never a count and millicores never bytes: the
//! vocabulary's ([`vocab`]), named here for the optimizer's modules.

pub use vocab::{Bytes, Gpus, JobId, Millicores, WorkerType};
