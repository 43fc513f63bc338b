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
use super::{MasterLink, ProcessEnv, damaged};
use crate::error::Error;
use crate::flash_copy::{Copy, Slots};

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
    /// Flash checkpoints: this process's slots in its agent's shared memory, and its
    /// incarnation (what its copies are marked with).
    flash: Option<(Arc<std::sync::Mutex<Slots>>, u64)>,
}

/// Keys per Absorb message: 64k keys are 1 MiB on the wire.
const CHUNK_KEYS: usize = 1 << 16;

pub type PsClient = pb::parameter_server_client::ParameterServerClient<auth::Channel>;

/// How long each call to a parameter server may take. A PS answers a pull or a push at once
/// (its table's lock is held only for the keys' copy); a reshard's stream of keys may take as
/// long as the master gives the reshard. Past that the PS is stopped, hung or cut off: the call
/// fails with DEADLINE_EXCEEDED and is retried like one to a PS that cannot be reached.
pub const PS_CALLS: auth::Deadlines = auth::Deadlines {
    default: Duration::from_secs(60),
    by_method: &[("Absorb", Duration::from_secs(600))],
};

/// Connects to a PS with the job's secret, retrying while it starts (a PS added by a reshard
/// may still be binding); each call then has its deadline in [`PS_CALLS`].
pub async fn ps_client(
    addr: &str,
    timeout: Duration,
    creds: &auth::JobCreds,
) -> Result<PsClient, Error> {
    let start = std::time::Instant::now();
    loop {
        match creds.connect(format!("http://{addr}"), PS_CALLS).await {
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
            flash: None,
        }
    }

    /// With flash checkpoints: a `Save` in memory copies the partition into `slots`.
    pub fn with_flash(mut self, slots: Slots, incarnation: u64) -> Self {
        self.flash = Some((Arc::new(std::sync::Mutex::new(slots)), incarnation));
        self
    }

    /// The partition this PS owns (keys lent in a reshard belong to their new owner's part).
    async fn owned(&self) -> (SparseTable, u32) {
        let st = self.state.lock().await;
        let (index, num_ps) = (self.index, st.num_ps);
        let t = SparseTable {
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
        };
        (t, num_ps)
    }

    /// A flash cut: the owned partition copied into this process's slot as part `index` of
    /// `num_ps` of `step`, written out by the agent behind the training, keeping the copy of
    /// the `committed` step. Why not, if not taken.
    async fn copy_in(&self, step: u64, committed: Option<u64>) -> Result<pb::SaveResponse, Status> {
        let Some((slots, incarnation)) = self.flash.clone() else {
            return Ok(pb::SaveResponse {
                not_in_memory: "this process has no flash memory (its agent gave it none)".into(),
                ..Default::default()
            });
        };
        let (t, num_ps) = self.owned().await;
        let keys = t.params.len() as u64;
        let copy = Copy {
            step,
            rank: self.index,
            world: num_ps,
            persist: true,
            incarnation,
            hold: false,
            committed,
        };
        let taken = tokio::task::spawn_blocking(move || {
            let bytes = t.to_bytes();
            let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.copy_in(&bytes, copy)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        let not_in_memory = match taken {
            Ok(slot) => {
                tracing::info!(step, slot, keys, "partition copied into memory");
                String::new()
            }
            Err(why) => {
                tracing::warn!(step, "partition not copied into memory: {why}");
                why.to_string()
            }
        };
        Ok(pb::SaveResponse {
            keys,
            not_in_memory,
            ..Default::default()
        })
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
        if r.in_memory {
            return self
                .copy_in(r.step, r.committed_step)
                .await
                .map(Response::new);
        }
        let path = PathBuf::from(&r.dir).join(format!("ps-{:03}.bin", self.index));
        let (t, _) = self.owned().await;
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
            ..Default::default()
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
/// (every PS sees every batch) and is read from the first. Where from: `memory` when this
/// PS's own part of a flash checkpoint of the same layout is whole in its node's memory
/// (`flash`, its bytes hashing to the manifest's digest), else `disk`.
pub fn restore(
    manifest: &Manifest,
    index: u32,
    num_ps: u32,
    flash: Option<&Slots>,
) -> Result<(SparseTable, &'static str), Error> {
    let flash_kind = manifest.kind == "flash";
    let load = |part: &proto::checkpoint::Part| {
        let path = PathBuf::from(&part.path);
        match flash_kind {
            true => SparseTable::load_part(&path, &part.digest),
            false => SparseTable::load(&path, Some(&part.digest)),
        }
    };
    let own = |t: &mut SparseTable| t.params.retain(|k, _| ps_owner(*k, num_ps) == index);
    if manifest.ps.len() == num_ps as usize
        && let Some(part) = manifest.ps.iter().find(|p| p.index == index)
    {
        let held = flash
            .filter(|_| flash_kind)
            .and_then(|f| f.holding(manifest.step, &part.digest));
        let (mut t, from) = match held {
            Some(bytes) => (
                SparseTable::from_bytes(&bytes, &PathBuf::from(&part.path))?,
                "memory",
            ),
            None => (load(part)?, "disk"),
        };
        own(&mut t);
        return Ok((t, from));
    }
    let mut out: Option<SparseTable> = None;
    for part in &manifest.ps {
        let mut t = load(part)?;
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
    Ok((out.unwrap_or_default(), "disk"))
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
    let flash = Slots::from_env();
    let manifest = match env.manifest() {
        Ok(m) => m,
        Err(e) => return Err(damaged(&mut master, &env, e).await),
    };
    let (table, flash, restored) = match manifest {
        Some(m) => {
            let index = env.index;
            let (step, id) = (m.step, m.id);
            let restored = tokio::task::spawn_blocking(move || {
                restore(&m, index, num_ps, flash.as_ref()).map(|r| (r, flash))
            })
            .await
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
            let ((t, from), flash) = match restored {
                Ok(r) => r,
                Err(e) => return Err(damaged(&mut master, &env, e).await),
            };
            tracing::info!(
                checkpoint = id,
                step,
                from,
                keys = t.params.len(),
                num_ps,
                "partition restored"
            );
            (t, flash, Some((from, step)))
        }
        None => (SparseTable::default(), flash, None),
    };
    if let Some((from, step)) = restored {
        // The job's events say where each process restored from.
        master
            .metrics(pb::TrainingMetrics {
                restored_from: from.into(),
                restored_step: step,
                ..Default::default()
            })
            .await?;
    }
    let mut svc = PsService::new(
        env.index,
        num_ps,
        cfg.learning_rate,
        table,
        env.creds.clone(),
    );
    if let Some(slots) = flash {
        svc = svc.with_flash(slots, env.incarnation);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash::FlashDir;
    use proto::checkpoint::Part;

    /// A partition of `keys` (owned by PS `index` of 2) with one batch applied.
    fn table(keys: &[u64]) -> SparseTable {
        let mut t = SparseTable::default();
        t.push(keys, &vec![0.5; keys.len()], 0, 0, 4, 0.1);
        t
    }

    #[test]
    fn a_flash_part_is_restored_from_this_node_s_memory_else_from_disk_its_digest_checked() {
        let (shm, ckpt) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let owned =
            |index: u32| -> Vec<u64> { (0..64).filter(|k| ps_owner(*k, 2) == index).collect() };
        // PS 0 copies its partition into its slot; its agent writes it out.
        let agent = FlashDir::open(shm.path(), "run/1", "ps", 0, 1 << 20, None).unwrap();
        let mut slots = Slots::at(agent.dir.clone(), 1 << 20).unwrap();
        let t0 = table(&owned(0));
        let copy = Copy {
            step: 8,
            rank: 0,
            world: 2,
            persist: true,
            incarnation: 1,
            hold: false,
            committed: None,
        };
        slots.copy_in(&t0.to_bytes(), copy).unwrap().unwrap();
        let w = agent.write_out(ckpt.path()).unwrap().unwrap();
        // PS 1's part, written out on another node.
        let t1 = table(&owned(1));
        let p1 = ckpt.path().join("part-1.bin");
        std::fs::write(&p1, t1.to_bytes()).unwrap();
        let d1 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(t1.to_bytes()));
        let part = |index, path: &std::path::Path, digest: &str| Part {
            index,
            path: path.display().to_string(),
            digest: digest.into(),
            keys: 0,
        };
        let manifest = Manifest {
            id: 3,
            kind: "flash".into(),
            step: 8,
            ps: vec![part(0, &w.path, &w.digest), part(1, &p1, &d1)],
            model: None,
            shards: Vec::new(),
        };
        // The file on disk is spoiled: from memory it still restores, from disk it is refused.
        std::fs::write(&w.path, b"BRPS-garbage").unwrap();
        let (t, from) = restore(&manifest, 0, 2, Some(&slots)).unwrap();
        assert_eq!((t, from), (t0.clone(), "memory"));
        assert!(restore(&manifest, 0, 2, None).is_err());
        // Another layout reads every part from disk.
        std::fs::write(&w.path, t0.to_bytes()).unwrap();
        let (t, from) = restore(&manifest, 0, 1, Some(&slots)).unwrap();
        assert_eq!(from, "disk");
        assert_eq!(t.params.len(), 64);
        // PS 1's node holds nothing of it: from disk, digest checked.
        let (t, from) = restore(&manifest, 1, 2, None).unwrap();
        assert_eq!((t, from), (t1, "disk"));
    }
}
