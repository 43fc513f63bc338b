//! The Ray platform's pre-run check processes (`Platform::run_check`): each a Ray job pinned
//! to its node, given up as not placed only when Ray lists the node without room for it.

use std::time::Instant;

use super::api::{self, RayJobStatus, SubmitRequest};
use super::{Inner, group};
use crate::error::Error;
use crate::platform::{CheckEnd, CheckLaunch, CheckNode};

impl Inner {
    /// The alive nodes neither the brain cordoned nor the job avoids.
    pub(super) async fn check_nodes(&self) -> Result<Vec<CheckNode>, Error> {
        let cluster = self.api.cluster().await?;
        Ok(self
            .offered(cluster)
            .nodes
            .iter()
            .map(|n| CheckNode {
                name: n.ip.clone(),
                gpus: n.total.gpus as u32,
            })
            .collect())
    }

    /// A Ray job pinned to the node (`node:<ip>`), asking for no CPU (a check must run on a
    /// busy node too) and for the GPUs it checks. One Ray has not started within the launch's
    /// `place_within` (the GPUs are taken) is stopped and reported not placed.
    pub(super) async fn run_check(&self, node: &CheckNode, c: CheckLaunch) -> Result<(), CheckEnd> {
        use CheckEnd::{Failed, NotPlaced};
        let inner = self;
        let id = format!("brain-{}-{}-{}", inner.job_part(), c.id, inner.run);
        let command = shlex::try_join(c.argv.iter().map(String::as_str))
            .map_err(|e| Failed(format!("cannot quote its command line: {e}")))?;
        let mut env = inner.settings.env.clone();
        env.extend(c.env);
        env.entry("NO_COLOR".into()).or_insert_with(|| "1".into());
        let req = SubmitRequest {
            entrypoint: format!("exec {command}"),
            submission_id: id.clone(),
            entrypoint_num_cpus: 0.0,
            entrypoint_num_gpus: f64::from(c.gpus.min(node.gpus)),
            entrypoint_memory: None,
            entrypoint_resources: [group::pin(&node.name)].into(),
            runtime_env: api::RuntimeEnv { env_vars: env },
            metadata: [
                ("brain_job".to_string(), inner.settings.job_name.clone()),
                ("brain_check".to_string(), c.id.clone()),
            ]
            .into(),
        };
        inner
            .api
            .submit(&req)
            .await
            .map_err(|e| Failed(format!("Ray refused it: {e}")))?;
        let start = Instant::now();
        let (mut failures, mut started) = (0u32, false);
        loop {
            tokio::time::sleep(inner.settings.poll).await;
            match inner.api.job(&id).await {
                Ok(Some(info)) if info.status == RayJobStatus::Succeeded => return Ok(()),
                Ok(Some(info)) if info.status.is_terminal() => {
                    return Err(Failed(inner.ending(&id, &info).await));
                }
                Ok(Some(info)) => started |= info.status != RayJobStatus::Pending,
                Ok(None) => return Err(Failed(format!("Ray job {id} is gone from Ray"))),
                Err(e) => {
                    failures += 1;
                    if failures as u128 * inner.settings.poll.as_millis() > 30_000 {
                        return Err(Failed(format!(
                            "lost contact with Ray while watching {id}: {e}"
                        )));
                    }
                }
            }
            // Not started yet: given up only when the node has no room for it (a slow node
            // is slow to start it too, and that is for the check to find).
            if !started && start.elapsed() > c.place_within && !self.room_on(node, c.gpus).await {
                let _ = inner.api.stop(&id).await;
                return Err(NotPlaced(format!(
                    "Ray did not start its check process on the node within {} s (no room \
                     there for it: {} GPU(s))",
                    c.place_within.as_secs(),
                    c.gpus.min(node.gpus)
                )));
            }
            if start.elapsed() > c.timeout {
                let _ = inner.api.stop(&id).await;
                return Err(Failed(format!(
                    "Ray job {id} still running after {} s: stopped",
                    c.timeout.as_secs()
                )));
            }
        }
    }

    /// Whether `node` may have `gpus` GPUs free now: false only when Ray lists it with fewer
    /// available. A node Ray does not list as alive now (a busy raylet may miss its
    /// heartbeats), or a Ray that does not answer, is taken to have them: its check goes on,
    /// and a node that never answers is for the check to judge.
    async fn room_on(&self, node: &CheckNode, gpus: u32) -> bool {
        let want = f64::from(gpus.min(node.gpus));
        match self.api.cluster().await {
            Ok(c) => c
                .nodes
                .iter()
                .find(|n| n.ip == node.name)
                .is_none_or(|n| n.available.gpus >= want),
            Err(_) => true,
        }
    }
}
