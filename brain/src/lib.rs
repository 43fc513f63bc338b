//! The cluster-wide brain: the service job masters report to, and what `brainctl` runs offline:
//!
//! * [`whatif`]: the what-if simulator front end: loads traces, application profiles and
//!   operators' policy files, replays every trace under every policy with
//!   [`optimizer::sim::simulate`] (in parallel, one simulation per core), prints the side-by-side
//!   table and writes per-job and per-round results as Parquet and CSV; or, for job lists too
//!   large to hold, replays them row by row with [`optimizer::sim::replay`] and writes the
//!   records as they are made.
//! * [`plots`]: the comparison as SVG charts (JCT CDF, GPU utilisation over time).
//! * [`store`]: the durable state (SQLite, WAL): jobs, metric summaries, plans and their
//!   acknowledgements.
//! * [`admission`]: what a submitted job may run (the policy's `[submissions]`, env, paths).
//! * [`auth`]: who may call: the operator token, each job's secret, checked by one interceptor.
//! * [`throttle`]: rate limits per client (calls, reports, submissions), so that a flooding
//!   client cannot starve the others' ingest; [`limits`]: the sizes and rates configured.
//! * [`service`]: the thin tonic adapter of the `brain.service.v1.Brain` API over the store;
//!   [`server`]: `run(config, listener, shutdown)`, which the `brain` binary and the tests start.
//! * [`BrainError`]: the crate's one error type, mapped once to `tonic::Status`.
//!
//! * [`predict`]: sizes a job submitted without replicas or resources from the brain's history.
//! * [`control`]: the live optimisation loop (timer and events, snapshot, the operator's
//!   scheduler through [`optimizer::live`], plans dispatched, cool-downs, policy reload);
//!   [`launch`] starts the job masters of submitted jobs and follows them to their end, also
//!   after a restart of the brain ([`master_process`]: a local master by its recorded pid);
//!   [`metrics`] is `GET /metrics`; [`console`] the web console under `/console` (pages
//!   rendered here over the same handlers as the API);
//!   [`capacity`] is what the brain may hand out (its config, or a Ray cluster's CPUs and its
//!   nodes' GPUs by model).
//!
//! * [`sink`]: raw metric time series to InfluxDB (1.x HTTP API or 2.x through influxdb2).
//! * [`train`]: `brainctl train`: job-profile models ([`optimizer::profile`]) fitted on the
//!   brain's history and scored against DLRover's rule, the user's request and the global
//!   median on it and on Alibaba's traces.
//!
//! Algorithms stay in `optimizer`, file formats in `datasets`.

/// Milliseconds since the Unix epoch, as this machine's clock reads them (0 before 1970).
pub fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub mod admission;
pub mod auth;
pub mod capacity;
pub mod console;
pub mod control;
pub mod launch;
pub mod limits;
pub mod master_process;
pub mod metrics;
pub mod plots;
pub mod predict;
pub mod server;
pub mod service;
pub mod sink;
pub mod store;
pub mod throttle;
pub mod train;
pub mod whatif;

pub use server::{BrainConfig, run};

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
    /// The brain's own settings (config file, flags, a what-if run's inputs) are not valid.
    #[error("{0}")]
    Config(String),
    /// Something failed inside the brain: not the caller's fault.
    #[error("{0}")]
    Internal(String),
    /// A value the store holds does not decode: the database was damaged or written by
    /// something else. Never replaced by a default.
    #[error("the job store holds a bad {what}: {problem}")]
    Stored { what: String, problem: String },
    /// (Not a `source`: the message says it, and a chain would say it twice.)
    #[error("simulating {trace} under {policy}: {error}")]
    Simulation {
        trace: String,
        policy: String,
        error: optimizer::PolicyError,
    },
    #[error("unknown job {0}")]
    UnknownJob(u64),
    /// A name (a node) the brain does not know; the message names those it does.
    #[error("{0}")]
    NotFound(String),
    /// The caller's request is wrong whatever the brain's state.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is well formed but the brain's state does not allow it now.
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The caller is known but may not do this (another job's id, an operator call made with a
    /// job's secret).
    #[error("{0}")]
    PermissionDenied(String),
    /// The metrics sink (InfluxDB) refused or could not be reached; ingest never waits for it.
    #[error("metrics sink: {0}")]
    Sink(String),
    #[error("job store: {0}")]
    Store(#[from] rusqlite::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The longest message a refusal carries: it travels in a header (`grpc-message`), which
/// clients cap (tonic at 16 KiB of headers), so a refusal that quotes a long input would reach
/// the client as RESOURCE_EXHAUSTED instead of its reason.
pub const MAX_STATUS_MESSAGE: usize = 2048;

/// `message`, cut at [`MAX_STATUS_MESSAGE`] bytes (on a character boundary) with "…".
fn bounded(mut message: String) -> String {
    if message.len() > MAX_STATUS_MESSAGE {
        let mut end = MAX_STATUS_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

impl From<BrainError> for tonic::Status {
    fn from(e: BrainError) -> Self {
        let message = bounded(e.to_string());
        match e {
            BrainError::UnknownJob(_) | BrainError::NotFound(_) => {
                tonic::Status::not_found(message)
            }
            BrainError::InvalidArgument(_) | BrainError::Config(_) | BrainError::Policy { .. } => {
                tonic::Status::invalid_argument(message)
            }
            BrainError::FailedPrecondition(_) => tonic::Status::failed_precondition(message),
            BrainError::AlreadyExists(_) => tonic::Status::already_exists(message),
            BrainError::PermissionDenied(_) => tonic::Status::permission_denied(message),
            BrainError::Internal(_)
            | BrainError::Stored { .. }
            | BrainError::Data(_)
            | BrainError::Simulation { .. }
            | BrainError::Store(_)
            | BrainError::Sink(_)
            | BrainError::Io(_) => tonic::Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BrainError;
    use tonic::Code;

    #[test]
    fn a_refusal_quoting_a_long_input_keeps_its_reason_within_the_header_limit() {
        let long = format!(
            "workload.command: {:?} is not allowed",
            "x".repeat(10 << 10)
        );
        let s = tonic::Status::from(BrainError::InvalidArgument(long));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().len() <= super::MAX_STATUS_MESSAGE + 3);
        assert!(s.message().starts_with("workload.command: \"xxx"));
    }

    #[test]
    fn each_error_reaches_clients_with_its_own_code() {
        let code = |e: BrainError| tonic::Status::from(e).code();
        assert_eq!(
            code(BrainError::InvalidArgument("x".into())),
            Code::InvalidArgument
        );
        assert_eq!(code(BrainError::Config("x".into())), Code::InvalidArgument);
        assert_eq!(
            code(BrainError::FailedPrecondition("x".into())),
            Code::FailedPrecondition
        );
        assert_eq!(
            code(BrainError::AlreadyExists("x".into())),
            Code::AlreadyExists
        );
        assert_eq!(code(BrainError::UnknownJob(3)), Code::NotFound);
        assert_eq!(
            code(BrainError::PermissionDenied("x".into())),
            Code::PermissionDenied
        );
        assert_eq!(code(BrainError::Internal("x".into())), Code::Internal);
        let stored = BrainError::Stored {
            what: "spec of job 1".into(),
            problem: "bad".into(),
        };
        assert_eq!(
            stored.to_string(),
            "the job store holds a bad spec of job 1: bad"
        );
        assert_eq!(code(stored), Code::Internal);
        assert_eq!(code(std::io::Error::other("disk").into()), Code::Internal);
    }
}
