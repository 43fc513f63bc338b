//! The built-in parameter server: one partition of the model behind the `ParameterServer` gRPC
//! service. It owns the keys `k` with `ps_owner(k, num_ps) == index` (jump consistent hashing),
//! applies each batch once, saves its partition when the job master coordinates a checkpoint,
//! and restores from the checkpoint the master names at start, taking the keys it owns from
//! every partition (so a checkpoint taken with P servers restores onto P'). On a reshard it
//! streams the keys whose owner changes straight to their new owner (`Reshard` → `Absorb`),
//! keeps them until `Drop`, and serves the new layout from then on.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use proto::jobmaster::v1 as pb;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use std::collections::BTreeMap;
use std::time::Duration;

use proto::checkpoint::Manifest;

use super::model::{SparseTable, ps_owner};
use super::{MasterLink, ProcessEnv};
use crate::error::Error;

/// What one PS holds: its table (with any keys lent during a reshard) and the layout it serves.
struct PsState {
    table: SparseTable,
    num_ps: u32,
}

pub struct PsService {
    index: u32,
    lr: f32,
    state: Arc<Mutex<PsState>>,
    /// The job's secret: what this PS sends to its peers when it hands keys over.
    creds: auth::JobCreds,
}

/// Keys per Absorb message: 64k keys are 1 MiB on the wire.
const CHUNK_KEYS: usize = 1 << 16;

pub type PsClient = pb::parameter_server_client::ParameterServerClient<auth::Channel>;

/// Connects to a PS with the job's secret, retrying while it starts (a PS added by a reshard
/// may still be binding).
pub async fn ps_client(
    addr: &str,
    timeout: Duration,
    creds: &auth::JobCreds,
) -> Result<PsClient, Error> {
    let start = std::time::Instant::now();
    loop {
        match creds.connect(format!("http://{addr}")).await {
            Ok(c) => {
                return Ok(PsClient::new(c)
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20));
            }
            Err(e) if start.elapsed() > timeout => {
                return Err(Error::Ps {
                    addr: addr.to_string(),
                    problem: e.to_string(),
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

impl PsService {
    pub fn new(
        index: u32,
        num_ps: u32,
        lr: f32,
        table: SparseTable,
        creds: auth::JobCreds,
    ) -> Self {
        Self {
            index,
            lr,
            creds,
            state: Arc::new(Mutex::new(PsState {
                table,
                num_ps: num_ps.max(1),
            })),
        }
    }

    fn check_owned(&self, keys: &[u64], num_ps: u32) -> Result<(), Status> {
        if let Some(k) = keys.iter().find(|&&k| ps_owner(k, num_ps) != self.index) {
            return Err(Error::InvalidRequest(format!(
                "key {k} belongs to ps {} of {num_ps}, not ps {}",
                ps_owner(*k, num_ps),
                self.index
            ))
            .into());
        }
        Ok(())
    }

    /// Sends `keys` (with their state) to the PS at `addr` in chunks; the first chunk carries
    /// `applied` when given.
    async fn send(
        addr: &str,
        num_ps: u32,
        moving: Vec<(u64, [f32; 2])>,
        applied: Option<pb::AppliedRecord>,
        creds: &auth::JobCreds,
    ) -> Result<(), Error> {
        let mut client = ps_client(addr, Duration::from_secs(30), creds).await?;
        let mut chunks: Vec<pb::AbsorbChunk> = moving
            .chunks(CHUNK_KEYS)
            .map(|c| pb::AbsorbChunk {
                keys: c.iter().map(|(k, _)| *k).collect(),
                weights: c.iter().map(|(_, p)| p[0]).collect(),
                accumulators: c.iter().map(|(_, p)| p[1]).collect(),
                applied: None,
                num_ps,
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(pb::AbsorbChunk {
                num_ps,
                ..Default::default()
            });
        }
        chunks[0].applied = applied;
        client
            .absorb(tokio_stream::iter(chunks))
            .await
            .map_err(|s| Error::Ps {
                addr: addr.to_string(),
                problem: s.message().to_string(),
            })?;
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
        let st = self.state.lock().await;
        self.check_owned(&keys, st.num_ps)?;
        Ok(Response::new(pb::PullResponse {
            values: keys.iter().map(|&k| st.table.weight(k)).collect(),
            generation: st.table.applied.len() as u64,
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
        let mut st = self.state.lock().await;
        self.check_owned(&r.keys, st.num_ps)?;
        let applied = st.table.push(
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
        // Only the keys this PS owns: keys lent in a reshard belong to their new owner's part.
        let t = {
            let st = self.state.lock().await;
            let (index, num_ps) = (self.index, st.num_ps);
            SparseTable {
                params: st
                    .table
                    .params
                    .iter()
                    .filter(|(k, _)| ps_owner(**k, num_ps) == index)
                    .map(|(k, p)| (*k, *p))
                    .collect(),
                applied: st.table.applied.clone(),
                applied_samples: st.table.applied_samples,
                applied_index_sum: st.table.applied_index_sum,
                duplicate_pushes: st.table.duplicate_pushes,
            }
        };
        let p = path.clone();
        let keys = t.params.len() as u64;
        let digest = tokio::task::spawn_blocking(move || t.save(&p))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
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
        let st = self.state.lock().await;
        let (index, num_ps) = (self.index, st.num_ps);
        let t = &st.table;
        Ok(Response::new(pb::StatsResponse {
            keys: t
                .params
                .keys()
                .filter(|k| ps_owner(**k, num_ps) == index)
                .count() as u64,
            applied_batches: t.applied.len() as u64,
            applied_samples: t.applied_samples,
            applied_index_sum: t.applied_index_sum,
            duplicate_pushes: t.duplicate_pushes,
            param_digest: t.owned_digest(|k| ps_owner(k, num_ps) == index),
            num_ps,
        }))
    }

    async fn reshard(
        &self,
        req: Request<pb::ReshardRequest>,
    ) -> Result<Response<pb::ReshardResponse>, Status> {
        let r = req.into_inner();
        if r.num_ps == 0 || r.ps.len() != r.num_ps as usize {
            return Err(Error::InvalidRequest(format!(
                "a layout of {} parameter servers with {} addresses",
                r.num_ps,
                r.ps.len()
            ))
            .into());
        }
        // From here on this PS serves the new layout; the keys it gives away stay until Drop.
        let (moving, applied) = {
            let mut st = self.state.lock().await;
            st.num_ps = r.num_ps;
            let mut moving: BTreeMap<u32, Vec<(u64, [f32; 2])>> = BTreeMap::new();
            for (&k, &p) in &st.table.params {
                let owner = ps_owner(k, r.num_ps);
                if owner != self.index {
                    moving.entry(owner).or_default().push((k, p));
                }
            }
            let t = &st.table;
            let applied = r.donor.then(|| pb::AppliedRecord {
                epochs: t.applied.iter().map(|(e, _)| *e).collect(),
                starts: t.applied.iter().map(|(_, s)| *s).collect(),
                applied_samples: t.applied_samples,
                applied_index_sum: t.applied_index_sum,
            });
            (moving, applied)
        };
        let moved_keys: usize = moving.values().map(Vec::len).sum();
        let mut sends = Vec::new();
        for dest in 0..r.num_ps {
            let keys = moving.get(&dest).cloned().unwrap_or_default();
            // New PS adopt the donor's record of applied batches (every PS saw every batch).
            let record = applied.clone().filter(|_| dest >= r.old_num_ps);
            if keys.is_empty() && record.is_none() {
                continue;
            }
            let addr = r.ps[dest as usize].clone();
            let num_ps = r.num_ps;
            let creds = self.creds.clone();
            sends.push(tokio::spawn(async move {
                Self::send(&addr, num_ps, keys, record, &creds).await
            }));
        }
        for s in sends {
            s.await.map_err(|e| Status::internal(e.to_string()))??;
        }
        tracing::info!(
            index = self.index,
            num_ps = r.num_ps,
            moved_keys,
            "resharded"
        );
        Ok(Response::new(pb::ReshardResponse {
            moved_keys: moved_keys as u64,
            moved_bytes: moved_keys as u64 * 16,
        }))
    }

    async fn absorb(
        &self,
        req: Request<tonic::Streaming<pb::AbsorbChunk>>,
    ) -> Result<Response<pb::AbsorbResponse>, Status> {
        let mut stream = req.into_inner();
        let mut n = 0u64;
        while let Some(c) = stream.message().await? {
            if c.keys.len() != c.weights.len() || c.keys.len() != c.accumulators.len() {
                return Err(Error::InvalidRequest(
                    "keys, weights and accumulators differ in length".into(),
                )
                .into());
            }
            self.check_owned(&c.keys, c.num_ps)?;
            let mut st = self.state.lock().await;
            if let Some(a) = c.applied {
                st.table.applied = a.epochs.into_iter().zip(a.starts).collect();
                st.table.applied_samples = a.applied_samples;
                st.table.applied_index_sum = a.applied_index_sum;
            }
            for ((k, w), acc) in c.keys.iter().zip(&c.weights).zip(&c.accumulators) {
                st.table.params.insert(*k, [*w, *acc]);
            }
            n += c.keys.len() as u64;
        }
        Ok(Response::new(pb::AbsorbResponse { keys: n }))
    }

    async fn drop(
        &self,
        _req: Request<pb::DropRequest>,
    ) -> Result<Response<pb::DropResponse>, Status> {
        let mut st = self.state.lock().await;
        let (index, num_ps) = (self.index, st.num_ps);
        let before = st.table.params.len();
        st.table.params.retain(|k, _| ps_owner(*k, num_ps) == index);
        Ok(Response::new(pb::DropResponse {
            dropped: (before - st.table.params.len()) as u64,
        }))
    }
}

/// Serves `svc` on `listener` until `shutdown`, to callers with the job's secret only (and,
/// when the job runs with TLS, the job's certificate).
pub async fn serve(
    svc: PsService,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let require = auth::Require::new(svc.creds.token.clone(), "the parameter server");
    let listening = svc
        .creds
        .listening("parameter server", auth::listen::ConnLimits::default())
        .map_err(|e| Error::Secret(e.to_string()))?;
    tonic::transport::Server::builder()
        .add_service(tonic::service::interceptor::InterceptedService::new(
            pb::parameter_server_server::ParameterServerServer::new(svc)
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20),
            require,
        ))
        .serve_with_incoming_shutdown(auth::listen::incoming(listener, listening), shutdown)
        .await?;
    Ok(())
}

/// This PS's partition from a checkpoint taken with any number of PS: the keys it owns among
/// `num_ps` from every partition; the record of applied batches is the same in every partition
/// (every PS sees every batch) and is read from the first.
pub fn restore(manifest: &Manifest, index: u32, num_ps: u32) -> Result<SparseTable, Error> {
    let own = |t: &mut SparseTable| t.params.retain(|k, _| ps_owner(*k, num_ps) == index);
    if manifest.ps.len() == num_ps as usize
        && let Some(part) = manifest.ps.iter().find(|p| p.index == index)
    {
        let mut t = SparseTable::load(&PathBuf::from(&part.path), Some(&part.digest))?;
        own(&mut t);
        return Ok(t);
    }
    let mut out: Option<SparseTable> = None;
    for part in &manifest.ps {
        let mut t = SparseTable::load(&PathBuf::from(&part.path), Some(&part.digest))?;
        own(&mut t);
        match out.as_mut() {
            None => {
                if part.index != index {
                    t.duplicate_pushes = 0;
                }
                out = Some(t);
            }
            Some(o) => {
                if part.index == index {
                    o.duplicate_pushes = t.duplicate_pushes;
                }
                o.params.extend(t.params);
            }
        }
    }
    Ok(out.unwrap_or_default())
}

/// Runs the PS of this process's environment until `shutdown`.
pub async fn run(
    env: ProcessEnv,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut master = MasterLink::connect(&env).await?;
    let cfg = master.workload().await?;
    // The rendezvous tells a PS how many servers its layout has (WORLD_SIZE).
    let num_ps = if env.world_size > 0 {
        env.world_size
    } else {
        cfg.ps_replicas
    };
    let table = match env.manifest()? {
        Some(m) => {
            let index = env.index;
            let t = tokio::task::spawn_blocking(move || restore(&m, index, num_ps))
                .await
                .map_err(|e| Error::InvalidRequest(e.to_string()))??;
            tracing::info!(keys = t.params.len(), num_ps, "partition restored");
            t
        }
        None => SparseTable::default(),
    };
    let svc = PsService::new(
        env.index,
        num_ps,
        cfg.learning_rate,
        table,
        env.creds.clone(),
    );
    let listener = bind_retry(&env.service_addr).await?;
    tracing::info!(addr = %env.service_addr, num_ps, "parameter server ready");
    serve(svc, listener, shutdown).await
}

/// How long [`bind_retry`] waits for its address. The previous incarnation may still hold it:
/// on Ray a relaunched or migrated process is a new Ray job while the old one's stop goes
/// through its supervisor, which took over 5 s on a loaded machine (a PS that gave up after
/// 5 s failed three times running and took its job down: brain/tests/ray.rs in CI).
const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Binds `addr`, retrying for up to 30 s: the previous incarnation's socket may still
/// be closing.
pub async fn bind_retry(addr: &str) -> Result<tokio::net::TcpListener, Error> {
    let mut last = None;
    let start = std::time::Instant::now();
    while start.elapsed() < BIND_WAIT {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => {
                if last.is_none() {
                    tracing::warn!(addr, "cannot listen yet ({e}): retrying for up to 30 s");
                }
                last = Some(e)
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(Error::Io {
        path: addr.into(),
        source: last.expect("tried"),
    })
}
