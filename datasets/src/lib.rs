//! Data for Brain: parsers for the public trace and profile formats the what-if simulator
//! replays, and the deterministic training-data generator of the reference workload.
//!
//! * `table` (private): delimited tables read with polars, typed cells, errors that name the
//!   file, line and column of a bad value ([`DatasetError`]).
//! * [`export`]: result tables written as Parquet and CSV.
//! * [`pollux`]: Pollux's and Sia's workloads and application profiles.
//! * [`philly`]: Microsoft's Philly job list (rigid jobs: GPUs and duration).
//! * [`gavel`]: Gavel's job traces (both `.trace` formats).
//! * [`alibaba`]: Alibaba's 2023 GPU cluster trace (openb pod and node lists).
//! * [`ctr`]: the click-through-rate data generator: every sample is a pure function of
//!   `(seed, index)`, so any process can produce any shard without a file, and the generator
//!   knows the ground-truth model, so the log-loss a training run reaches can be judged against
//!   the best one possible.

pub mod alibaba;
pub mod ctr;
mod error;
pub mod export;
pub mod gavel;
pub mod philly;
pub mod pollux;
mod table;

pub use ctr::{CtrGenerator, CtrSpec, CtrSpecError, Sample, log_loss, sigmoid};
pub use error::DatasetError;
