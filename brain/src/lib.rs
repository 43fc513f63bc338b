//! The cluster-wide brain. For now it holds what `brainctl` runs offline:
//!
//! * [`whatif`]: the what-if simulator front end: loads traces, application profiles and
//!   operators' policy files, replays every trace under every policy with
//!   [`optimizer::sim::simulate`] (in parallel, one simulation per core), prints the side-by-side
//!   table and writes per-job and per-round results as Parquet and CSV.
//! * [`plots`]: the comparison as SVG charts (JCT CDF, GPU utilisation over time).
//! * [`BrainError`]: the crate's one error type.
//!
//! The brain service (job store, metrics, the live optimisation loop) joins it in a later issue;
//! algorithms stay in `optimizer`, file formats in `datasets`.

pub mod plots;
pub mod whatif;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BrainError {
    #[error(transparent)]
    Data(#[from] datasets::DatasetError),
    #[error("{path}: {source}")]
    Policy {
        path: PathBuf,
        source: optimizer::PolicyError,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("simulating {trace} under {policy}: {source}")]
    Simulation {
        trace: String,
        policy: String,
        source: optimizer::PolicyError,
    },
}
