//! The external platform: agents are started by someone else (an operator, a batch system's own
//! launcher, a benchmark), with `worker-agent agent --master ... --role ... --index ...`. The
//! master launches and stops nothing; a lost agent's slot waits for a new agent with the next
//! incarnation, which the job context names.

use crate::scale::Capacity;
use std::time::Duration;

use super::{AgentLaunch, Platform};
use crate::error::Error;
use vocab::SlotKey;

#[derive(Default)]
pub struct ExternalPlatform;

#[async_trait::async_trait]
impl Platform for ExternalPlatform {
    fn name(&self) -> &'static str {
        "external"
    }

    async fn launch(&self, l: AgentLaunch) -> Result<(), Error> {
        let tls = l.tls_dir.as_ref().map_or(String::new(), |d| {
            format!("{}={} ", auth::tls::JOB_TLS_ENV, d.display())
        });
        tracing::info!(
            "waiting for an external agent: {tls}{}={} worker-agent agent --master http://{} --role {} --index {} --incarnation {}",
            auth::JOB_TOKEN_ENV,
            l.token_file.display(),
            l.master_addr,
            l.key.role,
            l.key.index,
            l.incarnation
        );
        Ok(())
    }

    async fn stop(&self, key: SlotKey, _grace: Duration) {
        tracing::info!(%key, "the external platform cannot stop agents; the job master fences it instead");
    }

    async fn stop_all(&self, _grace: Duration) {}

    fn capacity(&self) -> Capacity {
        // Whoever starts the agents decides what fits.
        Capacity::default()
    }

    async fn running(&self) -> usize {
        0
    }
}
