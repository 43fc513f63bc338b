//! Data for Brain: parsers for the public trace and profile formats the what-if simulator
//! replays, and the public data the repository carries ([`bundled`]). (The reference workload's
//! training-data generator lives with that workload, in `worker-agent`, so the worker agent
//! builds without polars or the solvers.)
//!
//! * `table` (private): delimited tables read with polars, or row by row with the csv crate for
//!   files too large to hold; typed cells, errors that name the file, line and column of a bad
//!   value ([`DatasetError`]).
//! * [`export`]: result tables written as Parquet and CSV, or as CSV one row at a time.
//! * [`limits`]: what a replay can honour ([`limits::TraceLimits`]); the trace readers check a
//!   file against them and name the file, line and column of the first value it cannot.
//! * [`pollux`]: Pollux's and Sia's workloads and application profiles.
//! * [`philly`]: Microsoft's Philly job list (rigid jobs: GPUs and duration), read whole or
//!   row by row ([`philly::JobStream`]).
//! * [`synth`]: larger traces drawn from a real one's distribution (whole days of a Philly
//!   job list resampled).
//! * [`faults`]: fault traces (crashes, hangs and slowdowns at set times on set nodes).
//! * [`gavel`]: Gavel's job traces (both `.trace` formats).
//! * [`alibaba`]: Alibaba's 2023 GPU cluster trace (openb pod and node lists).

pub mod alibaba;
mod error;
pub mod export;
pub mod faults;
pub mod gavel;
pub mod limits;
pub mod philly;
pub mod pollux;
pub mod synth;
mod table;

/// The public data this repository carries (`datasets/data/`: profiles, workloads, LP
/// instances and trace samples, each folder with its SOURCE.md), for tests, benches and
/// examples. The path is this crate's source folder at build time.
pub fn bundled() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
}

pub use error::DatasetError;
