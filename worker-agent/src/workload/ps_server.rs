//! The built-in parameter server: one partition of the model behind the `ParameterServer` gRPC
//! service. It owns the keys `k` with `k % num_ps == index`, applies each batch once, saves its
//! partition when the job master coordinates a checkpoint, and restores from the checkpoint the
//! master names at start.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use proto::jobmaster::v1 as pb;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use super::model::SparseTable;
use super::{MasterLink, ProcessEnv};
use crate::error::Error;

pub struct PsService {
    index: u32,
    num_ps: u32,
    lr: f32,
    table: Arc<Mutex<SparseTable>>,
}

impl PsService {
    pub fn new(index: u32, num_ps: u32, lr: f32, table: SparseTable) -> Self {
        Self {
            index,
            num_ps: num_ps.max(1),
            lr,
            table: Arc::new(Mutex::new(table)),
        }
    }

    fn check_owned(&self, keys: &[u64]) -> Result<(), Status> {
        if let Some(k) = keys
            .iter()
            .find(|&&k| k % self.num_ps as u64 != self.index as u64)
        {
            return Err(Error::InvalidRequest(format!(
                "key {k} belongs to ps {}, not ps {}",
                k % self.num_ps as u64,
                self.index
            ))
            .into());
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::parameter_server_server::ParameterServer for PsService {
    async fn pull(
        &self,
        req: Request<pb::PullRequest>,
    ) -> Result<Response<pb::PullResponse>, Status> {
        let keys = req.into_inner().keys;
        self.check_owned(&keys)?;
        let t = self.table.lock().await;
        Ok(Response::new(pb::PullResponse {
            values: keys.iter().map(|&k| t.weight(k)).collect(),
            generation: t.applied.len() as u64,
        }))
    }

    async fn push(
        &self,
        req: Request<pb::PushRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        let r = req.into_inner();
        if r.keys.len() != r.grads.len() {
            return Err(Error::InvalidRequest(format!(
                "{} keys but {} gradients",
                r.keys.len(),
                r.grads.len()
            ))
            .into());
        }
        if let Some(g) = r.grads.iter().find(|g| !g.is_finite()) {
            return Err(Error::InvalidRequest(format!("gradient {g} is not finite")).into());
        }
        self.check_owned(&r.keys)?;
        let applied = self.table.lock().await.push(
            &r.keys,
            &r.grads,
            r.epoch,
            r.batch_start,
            r.batch_samples,
            self.lr,
        );
        Ok(Response::new(pb::PushResponse {
            duplicate: !applied,
        }))
    }

    async fn save(
        &self,
        req: Request<pb::SaveRequest>,
    ) -> Result<Response<pb::SaveResponse>, Status> {
        let r = req.into_inner();
        let path = PathBuf::from(&r.dir).join(format!("ps-{:03}.bin", self.index));
        let t = self.table.lock().await.clone();
        let p = path.clone();
        let digest = tokio::task::spawn_blocking(move || t.save(&p))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        let keys = self.table.lock().await.params.len() as u64;
        tracing::info!(checkpoint = r.checkpoint_id, path = %path.display(), keys, "partition saved");
        Ok(Response::new(pb::SaveResponse {
            path: path.display().to_string(),
            digest,
            keys,
        }))
    }

    async fn stats(
        &self,
        _req: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let t = self.table.lock().await;
        Ok(Response::new(pb::StatsResponse {
            keys: t.params.len() as u64,
            applied_batches: t.applied.len() as u64,
            applied_samples: t.applied_samples,
            applied_index_sum: t.applied_index_sum,
            duplicate_pushes: t.duplicate_pushes,
        }))
    }
}

/// Runs the PS of this process's environment until `shutdown`.
pub async fn run(
    env: ProcessEnv,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut master = MasterLink::connect(&env).await?;
    let cfg = master.workload().await?;
    let table = match env.manifest()? {
        Some(m) => {
            let part =
                m.ps.iter()
                    .find(|p| p.index == env.index)
                    .ok_or_else(|| Error::Checkpoint {
                        path: env.resume_from.clone().unwrap_or_default(),
                        problem: format!("has no partition for ps {}", env.index),
                    })?;
            let path = PathBuf::from(&part.path);
            let t = tokio::task::spawn_blocking({
                let digest = part.digest.clone();
                move || SparseTable::load(&path, Some(&digest))
            })
            .await
            .map_err(|e| Error::InvalidRequest(e.to_string()))??;
            tracing::info!(
                checkpoint = m.id,
                keys = t.params.len(),
                "partition restored"
            );
            t
        }
        None => SparseTable::default(),
    };
    let svc = PsService::new(env.index, cfg.ps_replicas, cfg.learning_rate, table);
    let listener = bind_retry(&env.service_addr).await?;
    tracing::info!(addr = %env.service_addr, "parameter server ready");
    tonic::transport::Server::builder()
        .add_service(pb::parameter_server_server::ParameterServerServer::new(svc))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await?;
    Ok(())
}

/// Binds `addr`, retrying briefly: the previous incarnation's socket may still be closing.
pub async fn bind_retry(addr: &str) -> Result<tokio::net::TcpListener, Error> {
    let mut last = None;
    for _ in 0..50 {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(Error::Io {
        path: addr.into(),
        source: last.expect("tried"),
    })
}
