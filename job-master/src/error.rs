//! The job master's one error type, mapped once to `tonic::Status`.

use std::path::PathBuf;

pub use vocab::SpecError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] vocab::Error),
    #[error("unknown process {role} {index}")]
    UnknownProcess { role: String, index: u32 },
    #[error("{role} {index} incarnation {got} is stale: the current one is {current}")]
    StaleIncarnation {
        role: String,
        index: u32,
        got: u64,
        current: u64,
    },
    #[error(
        "{role} {index} asked from rendezvous round {got}, but the group re-formed in round \
         {current}: join the rendezvous again"
    )]
    StaleRound {
        role: String,
        index: u32,
        got: u64,
        current: u64,
    },
    #[error("shard {shard} is not leased to {holder}")]
    NotLeased { shard: u64, holder: String },
    #[error("unknown shard {0}")]
    UnknownShard(u64),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("cannot persist job context to {path}: {source}")]
    Persist {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read job context {path}: {problem}")]
    Context { path: PathBuf, problem: String },
    #[error("platform {platform} cannot launch {what}: {problem}")]
    Launch {
        platform: &'static str,
        what: String,
        problem: String,
    },
    #[error("checkpoint {path}: {problem}")]
    Checkpoint { path: PathBuf, problem: String },
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parameter server {addr}: {problem}")]
    Ps { addr: String, problem: String },
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("server error: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Ray(#[from] ray_client::RayError),
    #[error("the job's credentials: {0}")]
    Auth(#[from] auth::AuthError),
    #[error("this is pre-run check {current}, not {got}: the process belongs to an older check")]
    StaleCheck { got: String, current: String },
    #[error("the pre-run check: {0}")]
    Precheck(String),
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::Spec(_) | Error::InvalidRequest(_) => tonic::Status::invalid_argument(msg),
            Error::UnknownProcess { .. } | Error::UnknownShard(_) => tonic::Status::not_found(msg),
            Error::StaleIncarnation { .. }
            | Error::StaleRound { .. }
            | Error::NotLeased { .. }
            | Error::StaleCheck { .. } => tonic::Status::failed_precondition(msg),
            _ => tonic::Status::internal(msg),
        }
    }
}
