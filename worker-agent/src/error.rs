//! The worker agent's one error type, mapped once to `tonic::Status`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the job master at {addr}: {problem}")]
    Master { addr: String, problem: String },
    #[error("the job master refused {call}: {status}")]
    Refused {
        call: &'static str,
        status: tonic::Status,
    },
    #[error("environment variable {name}: {problem}")]
    Env { name: &'static str, problem: String },
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path}: {problem}")]
    Checkpoint { path: PathBuf, problem: String },
    #[error("parameter server {addr}: {problem}")]
    Ps { addr: String, problem: String },
    #[error("ring all-reduce with rank {peer}: {source}")]
    Ring {
        peer: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the job's secret: {0}")]
    Secret(String),
}

impl Error {
    /// The master said this process is an old incarnation: it must stop at once.
    pub fn is_stale(&self) -> bool {
        matches!(self, Error::Refused { status, .. } if status.code() == tonic::Code::FailedPrecondition)
    }

    /// A checkpoint's files are damaged (gone, cut short, not what their manifest says), as
    /// opposed to unreadable for a reason of this node's (a permission, a disk error): another
    /// checkpoint is then worth falling back to.
    pub fn is_damaged_checkpoint(&self) -> bool {
        use std::io::ErrorKind::{InvalidData, NotFound, UnexpectedEof};
        match self {
            Error::Checkpoint { .. } => true,
            Error::Io { source, .. } => {
                matches!(source.kind(), NotFound | UnexpectedEof | InvalidData)
            }
            _ => false,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidRequest(m) => tonic::Status::invalid_argument(m),
            other => tonic::Status::internal(other.to_string()),
        }
    }
}
