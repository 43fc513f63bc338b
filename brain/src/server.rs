//! The brain service in mini-redis shape: [`run`] serves the API on a listener the caller bound
//! (tests bind port 0) until `shutdown` resolves.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use proto::service::v1::brain_server::BrainServer;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::BrainError;
use crate::service::BrainService;
use crate::store::Store;

/// The brain's configuration (TOML; unknown fields are errors).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrainConfig {
    /// The SQLite database (created if missing; WAL mode).
    pub database: PathBuf,
}

impl BrainConfig {
    pub fn validate(&self) -> Result<(), BrainError> {
        if self.database.as_os_str().is_empty() {
            return Err(BrainError::Invalid("database: an empty path".into()));
        }
        Ok(())
    }
}

/// Opens the store and serves until `shutdown`.
pub async fn run(
    config: BrainConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BrainError> {
    config.validate()?;
    if let Some(dir) = config
        .database
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)?;
    }
    let path = config.database.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&path))
        .await
        .map_err(|e| BrainError::Invalid(format!("opening the store: {e}")))??;
    let service = BrainService::new(Arc::new(Mutex::new(store)));
    tracing::info!(address = %listener.local_addr()?, database = %config.database.display(), "brain serving");
    tonic::transport::Server::builder()
        .add_service(BrainServer::new(service))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
        .map_err(|e| BrainError::Invalid(format!("serving: {e}")))
}
