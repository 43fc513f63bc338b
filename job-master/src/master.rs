//! The async shell around [`JobContext`]: it serves gRPC, carries out effects (launch and stop
//! agents, save PS checkpoints, finish), runs the timers, persists every change before it is
//! acknowledged, and returns a [`JobReport`] when the job ends.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::checkpoint::{MANIFEST_FILE, Manifest, Part};
use proto::jobmaster::v1 as pb;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc, watch};

use crate::error::Error;
use crate::job::{Effect, JobContext, JobPhase, ReshardRecord, Timing, TransitionRecord};
use crate::persist::{Persister, write_atomic};
use crate::platform::local::LocalPlatform;
use crate::platform::{AgentLaunch, Platform, PlatformConfig, PlatformEvent};
use crate::scale::Capacity;
use crate::service::MasterService;
use crate::spec::{JobKind, JobSpec, RoleName};

/// Everything `run` needs. Built from CLI flags by `main.rs`, or directly by tests.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MasterConfig {
    pub spec: JobSpec,
    /// Where the job context, agent logs and the report go.
    pub run_dir: PathBuf,
    #[serde(default)]
    pub timing: Timing,
    #[serde(default)]
    pub platform: PlatformConfig,
    /// The brain to register with, report to and take plans from; `None` runs alone.
    #[serde(default)]
    pub brain: Option<crate::brain_link::BrainLink>,
    /// Continue the unfinished job whose context is in `run_dir` (its master died) instead of
    /// starting `spec` afresh; the spec must name the same job.
    #[serde(default)]
    pub resume: bool,
}

/// Final statistics of one parameter server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsStats {
    pub index: u32,
    pub keys: u64,
    pub applied_batches: u64,
    pub applied_samples: u64,
    pub applied_index_sum: u64,
    pub duplicate_pushes: u64,
}

/// What `run` returns and writes to `RUN_DIR/report.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobReport {
    pub job: String,
    pub kind: JobKind,
    pub phase: String,
    pub reason: Option<String>,
    pub elapsed_ms: u64,
    pub first_step_after_ms: Option<u64>,
    pub final_eval_loss: Option<f64>,
    pub final_model_digest: Option<String>,
    /// `ok` when the ledger proves each sample was consumed exactly once per epoch.
    pub exactly_once: String,
    pub samples_per_epoch: BTreeMap<u32, u64>,
    pub shards_done: u64,
    pub shards_total: u64,
    pub restarts: BTreeMap<RoleName, u32>,
    pub checkpoints: usize,
    pub ps_stats: Vec<PsStats>,
    /// Samples applied and the sum of their indices, as the allreduce model state counts them.
    pub applied_samples: u64,
    pub applied_index_sum: u64,
    /// Scale plans carried out, in order.
    pub transitions: Vec<TransitionRecord>,
    pub reshards: Vec<ReshardRecord>,
    pub events: Vec<String>,
}

impl JobReport {
    pub fn succeeded(&self) -> bool {
        self.phase == "succeeded"
    }
}

/// State shared by the gRPC handlers and the background tasks.
pub(crate) struct Shared {
    pub job: Arc<Mutex<JobContext>>,
    pub persister: Arc<Persister>,
    pub effects: mpsc::UnboundedSender<Effect>,
    pub started: Instant,
    /// Where this master's clock starts: 0 for a new job, where the last master's clock
    /// stopped for a resumed one.
    pub clock_offset_ms: u64,
    pub phase: watch::Sender<String>,
    pub ps_stats: Mutex<Vec<PsStats>>,
    /// What the platform can place, for checking scale plans.
    pub capacity: Capacity,
}

impl Shared {
    pub fn now_ms(&self) -> u64 {
        self.clock_offset_ms + self.started.elapsed().as_millis() as u64
    }

    /// Runs a decision, hands its effects to the executor and waits until the change is durable.
    pub async fn apply<T>(
        &self,
        f: impl FnOnce(&mut JobContext, u64) -> Result<(T, Vec<Effect>), Error>,
    ) -> Result<T, Error> {
        self.apply_if(|ctx, now| f(ctx, now).map(|(v, e)| (v, e, true)))
            .await
    }

    /// [`Self::apply`] for decisions that say whether they changed anything worth a durable
    /// write (heartbeats and most timer ticks do not); unchanged state is not written.
    pub async fn apply_if<T>(
        &self,
        f: impl FnOnce(&mut JobContext, u64) -> Result<(T, Vec<Effect>, bool), Error>,
    ) -> Result<T, Error> {
        let (value, generation) = {
            let mut ctx = self.job.lock().await;
            let now = self.now_ms();
            let (value, effects, durable) = f(&mut ctx, now)?;
            let durable = durable || !effects.is_empty();
            for e in effects {
                let _ = self.effects.send(e);
            }
            self.phase.send_if_modified(|p| {
                let new = ctx.phase.name();
                if p != new {
                    *p = new.to_string();
                    true
                } else {
                    false
                }
            });
            (value, durable.then(|| self.persister.changed()))
        };
        if let Some(g) = generation {
            self.persister.durable(g).await?;
        }
        Ok(value)
    }
}

impl Shared {
    /// Checks a scale plan and, if the job can carry it out, starts it; the answer says which.
    pub async fn apply_scale_plan(
        &self,
        plan: crate::scale::ScalePlan,
    ) -> Result<pb::ScalePlanAnswer, Error> {
        let capacity = self.capacity.clone();
        let answer = self
            .apply(|ctx, now| {
                let (accepted, reason, effects) = match ctx.apply_plan(plan, &capacity, now) {
                    Ok(e) => (true, String::new(), e),
                    Err(why) => (false, why, Vec::new()),
                };
                Ok((
                    pb::ScalePlanAnswer {
                        accepted,
                        reason,
                        desired_version: ctx.plans.desired,
                        reached_version: ctx.plans.reached,
                    },
                    effects,
                ))
            })
            .await?;
        if !answer.accepted {
            tracing::warn!("scale plan rejected: {}", answer.reason);
        }
        Ok(answer)
    }
}

/// The job to run and the agents to launch first: `spec` afresh, or, with `resume`, the
/// unfinished job persisted in `run_dir` (see [`JobContext::resume`]), with the clock it stopped
/// at. A fresh start never overwrites an unfinished job's context.
fn start_or_resume(
    spec: JobSpec,
    run_dir: &Path,
    timing: &Timing,
    resume: bool,
) -> Result<(JobContext, Vec<Effect>, u64), Error> {
    let path = run_dir.join(crate::persist::CONTEXT_FILE);
    if resume {
        let mut ctx = crate::persist::load(&path)?;
        if ctx.spec.name != spec.name {
            return Err(Error::InvalidRequest(format!(
                "{} holds job {:?}, not {:?}: resume it with its own spec",
                path.display(),
                ctx.spec.name,
                spec.name
            )));
        }
        // The timing given now applies from here on (a slow platform may need longer).
        ctx.timing = timing.clone();
        let clock_ms = ctx.clock_ms() + 1;
        let launches = ctx.resume(clock_ms)?;
        return Ok((ctx, launches, clock_ms));
    }
    if path.exists()
        && let Ok(old) = crate::persist::load(&path)
        && !old.phase.is_terminal()
    {
        return Err(Error::InvalidRequest(format!(
            "{} holds job {:?}, which has not finished ({}): pass --resume to continue it, or \
             choose another run directory",
            path.display(),
            old.spec.name,
            old.phase.name()
        )));
    }
    let run_id = format!("{}-{}", spec.name, std::process::id());
    let (ctx, launches) = JobContext::new(spec, run_id, timing.clone(), 0);
    Ok((ctx, launches, 0))
}

/// Runs one job to its end on `listener` (use port 0 in tests). Resolves when the job succeeded,
/// failed, or `shutdown` fired; every agent is stopped before it returns.
pub async fn run(
    config: MasterConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<JobReport, Error> {
    let MasterConfig {
        spec,
        run_dir,
        timing,
        platform,
        brain,
        resume,
    } = config;
    spec.validate().map_err(Error::Spec)?;
    std::fs::create_dir_all(&run_dir).map_err(|e| Error::Io {
        path: run_dir.clone(),
        source: e,
    })?;
    std::fs::create_dir_all(&spec.checkpoint.dir).map_err(|e| Error::Io {
        path: spec.checkpoint.dir.clone(),
        source: e,
    })?;
    let addr = listener.local_addr().map_err(|e| Error::Io {
        path: run_dir.clone(),
        source: e,
    })?;
    let (ctx, initial, clock_ms) = start_or_resume(spec, &run_dir, &timing, resume)?;
    let job = Arc::new(Mutex::new(ctx));
    let persister = Persister::new(&run_dir);
    tokio::spawn(persister.clone().run(job.clone()));
    persister.durable(persister.changed()).await?;

    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let platform: Arc<dyn Platform> = match platform {
        PlatformConfig::Local {
            agent_bin,
            max_processes,
        } => Arc::new(LocalPlatform::new(
            agent_bin.unwrap_or_else(LocalPlatform::default_agent_bin),
            run_dir.join("logs"),
            ev_tx,
            max_processes,
        )?),
        PlatformConfig::External => {
            drop(ev_tx);
            Arc::new(crate::platform::external::ExternalPlatform)
        }
        PlatformConfig::Ray {
            address,
            agent_bin,
            max_processes,
            place_timeout_ms,
            env,
        } => {
            let mut s = crate::platform::ray::RaySettings::new(
                &address,
                agent_bin.unwrap_or_else(LocalPlatform::default_agent_bin),
                &job.lock().await.spec.name,
            );
            s.max_processes = max_processes;
            if let Some(ms) = place_timeout_ms {
                s.place_timeout = Duration::from_millis(ms);
            }
            s.env = env;
            Arc::new(crate::platform::ray::RayPlatform::connect(s, ev_tx).await?)
        }
    };
    let (eff_tx, mut eff_rx) = mpsc::unbounded_channel();
    let (phase_tx, mut phase_rx) = watch::channel("running".to_string());
    let shared = Arc::new(Shared {
        job: job.clone(),
        persister,
        effects: eff_tx.clone(),
        started: Instant::now(),
        clock_offset_ms: clock_ms,
        phase: phase_tx,
        ps_stats: Mutex::default(),
        capacity: platform.capacity(),
    });

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(pb::job_master_server::JobMasterServer::new(
            MasterService::new(shared.clone()),
        ))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = stop_rx.await;
            },
        );
    let server = tokio::spawn(server);
    tracing::info!(%addr, "job master listening");

    // Effects executor.
    let exec = {
        let shared = shared.clone();
        let platform = platform.clone();
        tokio::spawn(async move {
            while let Some(effect) = eff_rx.recv().await {
                execute(&shared, &platform, addr, effect).await;
            }
        })
    };
    for e in initial {
        let _ = eff_tx.send(e);
    }

    // Timers and platform events.
    let monitor = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let _ = shared
                            .apply_if(|ctx, now| {
                                let (effects, changed) = ctx.tick_changed(now);
                                Ok(((), effects, changed))
                            })
                            .await;
                    }
                    Some(ev) = ev_rx.recv() => {
                        let PlatformEvent::AgentExited { key, incarnation, description } = ev;
                        let _ = shared
                            .apply(|ctx, now| Ok(((), ctx.agent_lost(key, incarnation, format!("agent process {description}"), now))))
                            .await;
                    }
                }
            }
        })
    };

    let link = brain
        .clone()
        .map(|link| tokio::spawn(crate::brain_link::run(shared.clone(), link, addr)));

    tokio::pin!(shutdown);
    loop {
        if matches!(phase_rx.borrow().as_str(), "succeeded" | "failed") {
            break;
        }
        tokio::select! {
            changed = phase_rx.changed() => if changed.is_err() { break },
            _ = &mut shutdown => {
                let _ = shared.apply(|ctx, now| { ctx.fail("the job master was asked to shut down".into(), now); Ok(((), vec![])) }).await;
                break;
            }
        }
    }

    // Agents learn the job is over from their next heartbeat and exit; stop the stragglers.
    let deadline = Instant::now()
        + Duration::from_millis(timing.grace_period_ms + 3 * timing.heartbeat_interval_ms);
    while platform.running().await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    platform
        .stop_all(Duration::from_millis(timing.grace_period_ms))
        .await;
    monitor.abort();
    exec.abort();
    if let Some(link) = link {
        link.abort();
    }
    let _ = stop_tx.send(());
    // Graceful shutdown waits for open connections; a hung peer must not hold the master.
    let abort = server.abort_handle();
    if tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .is_err()
    {
        abort.abort();
    }

    let ctx = job.lock().await.clone();
    let report = build_report(&ctx, shared.ps_stats.lock().await.clone(), shared.now_ms());
    if let Ok(json) = serde_json::to_vec_pretty(&report) {
        let path = run_dir.join("report.json");
        write_atomic(&path, &json).map_err(|e| Error::Io { path, source: e })?;
    }
    if let Some(link) = &brain {
        crate::brain_link::report_outcome(link, &report, addr).await;
    }
    Ok(report)
}

async fn execute(
    shared: &Arc<Shared>,
    platform: &Arc<dyn Platform>,
    addr: std::net::SocketAddr,
    effect: Effect,
) {
    match effect {
        Effect::LaunchAgent { key, incarnation } => {
            let resources = shared.job.lock().await.launch_resources(key);
            let launch = AgentLaunch {
                key,
                incarnation,
                master_addr: addr,
                resources,
            };
            if let Err(e) = platform.launch(launch).await {
                let _ = shared
                    .apply(|ctx, now| {
                        ctx.fail(e.to_string(), now);
                        Ok(((), vec![]))
                    })
                    .await;
            }
        }
        Effect::StopAgent { key, graceful } => {
            let grace = if graceful {
                Duration::from_secs(2)
            } else {
                Duration::ZERO
            };
            platform.stop(key, grace).await
        }
        Effect::SavePsCheckpoint {
            id,
            dir,
            ps,
            generation,
        } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                let (step, kind) = {
                    let ctx = shared.job.lock().await;
                    (ctx.ledger.done_shards(), ctx.spec.kind.to_string())
                };
                match save_ps(id, &dir, &ps, step, kind).await {
                    Ok(manifest) => {
                        let r = shared
                            .apply(|ctx, now| {
                                ctx.checkpoint_committed(id, manifest, step, generation, now)
                                    .map(|e| ((), e))
                            })
                            .await;
                        if let Err(e) = r {
                            tracing::warn!("checkpoint {id} dropped: {e}");
                        }
                    }
                    Err(problem) => {
                        let _ = shared
                            .apply(|ctx, now| {
                                ctx.checkpoint_failed(generation, problem, now);
                                Ok(((), vec![]))
                            })
                            .await;
                    }
                }
            });
        }
        Effect::ReshardPs {
            version,
            from,
            to,
            generation,
        } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                match reshard_ps(version, &from, &to).await {
                    Ok(record) => {
                        let r = shared
                            .apply(|ctx, now| {
                                ctx.reshard_done(generation, record, now).map(|e| ((), e))
                            })
                            .await;
                        if let Err(e) = r {
                            tracing::warn!("reshard for plan {version} dropped: {e}");
                        }
                    }
                    Err(problem) => {
                        let _ = shared
                            .apply(|ctx, now| {
                                Ok(((), ctx.reshard_failed(generation, problem, now)))
                            })
                            .await;
                    }
                }
            });
        }
        Effect::DropPs { ps } => {
            for addr in ps {
                let r = match ps_client(&addr).await {
                    Ok(mut c) => c
                        .drop(pb::DropRequest {})
                        .await
                        .map(|r| r.into_inner().dropped)
                        .map_err(|e| e.message().to_string()),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(n) => tracing::info!(%addr, dropped = n, "ps dropped the keys it lent"),
                    // Keys it no longer owns only cost memory; the PS refuses requests for them.
                    Err(e) => tracing::warn!(%addr, "ps could not drop lent keys: {e}"),
                }
            }
        }
        Effect::Finish => {
            let ps = {
                let ctx = shared.job.lock().await;
                ctx.cluster
                    .as_ref()
                    .map(|c| c.ps.clone())
                    .unwrap_or_default()
            };
            let mut stats = Vec::new();
            for (index, addr) in ps {
                match ps_stats(&addr).await {
                    Ok(s) => stats.push(PsStats { index, ..s }),
                    Err(e) => tracing::warn!("cannot read statistics of ps {index}: {e}"),
                }
            }
            *shared.ps_stats.lock().await = stats;
            let _ = shared
                .apply(|ctx, now| {
                    ctx.finish(now);
                    Ok(((), vec![]))
                })
                .await;
        }
    }
}

async fn ps_client(
    addr: &str,
) -> Result<pb::parameter_server_client::ParameterServerClient<tonic::transport::Channel>, String> {
    pb::parameter_server_client::ParameterServerClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| format!("cannot reach ps at {addr}: {e}"))
}

async fn save_ps(
    id: u64,
    dir: &std::path::Path,
    ps: &[String],
    step: u64,
    kind: String,
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut parts = Vec::new();
    for (index, addr) in ps.iter().enumerate() {
        let resp = ps_client(addr)
            .await?
            .save(pb::SaveRequest {
                dir: dir.display().to_string(),
                checkpoint_id: id,
            })
            .await
            .map_err(|e| format!("ps {index} at {addr} could not save: {}", e.message()))?
            .into_inner();
        parts.push(Part {
            index: index as u32,
            path: resp.path,
            digest: resp.digest,
            keys: resp.keys,
        });
    }
    let manifest = Manifest {
        id,
        kind,
        step,
        ps: parts,
        model: None,
    };
    let path = dir.join(MANIFEST_FILE);
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?;
    write_atomic(&path, &json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// Sum of the PS' order-independent parameter digests (of the keys each owns) and their keys.
async fn ps_digest(addrs: &[String]) -> Result<(u64, u64), String> {
    let mut digest = 0u64;
    let mut keys = 0;
    for addr in addrs {
        let s = ps_client(addr)
            .await?
            .stats(pb::StatsRequest {})
            .await
            .map_err(|e| format!("ps at {addr}: {}", e.message()))?
            .into_inner();
        digest = digest.wrapping_add(s.param_digest);
        keys += s.keys;
    }
    Ok((digest, keys))
}

/// Moves keys from the PS set `from` to the layout `to`: each old PS streams the keys whose
/// owner changes to their new owner. The digest of the whole parameter set is taken before and
/// after (nobody pushes meanwhile: the job is at a consistent cut).
pub async fn reshard_ps(
    version: u64,
    from: &[String],
    to: &[String],
) -> Result<ReshardRecord, String> {
    let started = Instant::now();
    let (digest_before, total_keys) = ps_digest(from).await?;
    let mut moved_keys = 0;
    let mut moved_bytes = 0;
    let calls: Vec<_> = from
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let to = to.to_vec();
            let addr = addr.clone();
            let old = from.len() as u32;
            tokio::spawn(async move {
                let mut c = ps_client(&addr).await?;
                c.reshard(pb::ReshardRequest {
                    num_ps: to.len() as u32,
                    ps: to,
                    donor: i == 0,
                    old_num_ps: old,
                })
                .await
                .map(|r| r.into_inner())
                .map_err(|e| format!("ps {i} at {addr} could not reshard: {}", e.message()))
            })
        })
        .collect();
    for call in calls {
        let r = call.await.map_err(|e| format!("reshard task: {e}"))??;
        moved_keys += r.moved_keys;
        moved_bytes += r.moved_bytes;
    }
    let (digest_after, _) = ps_digest(to).await?;
    Ok(ReshardRecord {
        version,
        from_ps: from.len() as u32,
        to_ps: to.len() as u32,
        moved_keys,
        moved_bytes,
        total_keys,
        digest_before,
        digest_after,
        took_ms: started.elapsed().as_millis() as u64,
    })
}

async fn ps_stats(addr: &str) -> Result<PsStats, String> {
    let s = ps_client(addr)
        .await?
        .stats(pb::StatsRequest {})
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    Ok(PsStats {
        index: 0,
        keys: s.keys,
        applied_batches: s.applied_batches,
        applied_samples: s.applied_samples,
        applied_index_sum: s.applied_index_sum,
        duplicate_pushes: s.duplicate_pushes,
    })
}

fn build_report(ctx: &JobContext, ps_stats: Vec<PsStats>, now_ms: u64) -> JobReport {
    let applied = ctx
        .metrics
        .get(&crate::job::SlotKey {
            role: RoleName::Worker,
            index: ctx.evaluator.map(|k| k.index).unwrap_or(0),
        })
        .cloned()
        .unwrap_or_default();
    JobReport {
        job: ctx.spec.name.clone(),
        kind: ctx.spec.kind,
        phase: ctx.phase.name().to_string(),
        reason: match &ctx.phase {
            JobPhase::Failed { reason } => Some(reason.clone()),
            _ => None,
        },
        elapsed_ms: now_ms,
        first_step_after_ms: ctx.first_step_at_ms.map(|t| t - ctx.started_at_ms),
        final_eval_loss: ctx.final_eval_loss,
        final_model_digest: ctx.final_model_digest.clone(),
        exactly_once: match ctx.ledger.verify_exactly_once(ctx.ledger.is_complete()) {
            Ok(()) => "ok".into(),
            Err(e) => e.to_string(),
        },
        samples_per_epoch: ctx.ledger.samples_per_epoch(),
        shards_done: ctx.ledger.done_shards(),
        shards_total: ctx.ledger.total_shards(),
        restarts: ctx.restarts.clone(),
        checkpoints: ctx.checkpoints.len(),
        ps_stats,
        applied_samples: applied.applied_samples,
        applied_index_sum: applied.applied_index_sum,
        transitions: ctx.transitions.clone(),
        reshards: ctx.reshards.clone(),
        events: ctx
            .events
            .iter()
            .map(|e| format!("{:>8} ms  {}", e.at_ms, e.text))
            .collect(),
    }
}

/// Writes the allreduce checkpoint manifest beside the model rank 0 saved, and commits it.
pub(crate) async fn commit_allreduce_checkpoint(
    shared: &Shared,
    key: crate::job::SlotKey,
    incarnation: u64,
    step: u64,
    model_path: String,
    digest: String,
) -> Result<(), Error> {
    let (id, dir, generation) = {
        let ctx = shared.job.lock().await;
        let slot = ctx.slots.get(&key).ok_or(Error::UnknownProcess {
            role: key.role.to_string(),
            index: key.index,
        })?;
        if slot.incarnation != incarnation {
            return Err(Error::StaleIncarnation {
                role: key.role.to_string(),
                index: key.index,
                got: incarnation,
                current: slot.incarnation,
            });
        }
        let (id, _) = ctx.next_checkpoint_dir();
        let dir = PathBuf::from(&model_path)
            .parent()
            .map(|p| p.to_path_buf())
            .ok_or_else(|| {
                Error::InvalidRequest(format!("checkpoint path {model_path:?} has no directory"))
            })?;
        (id, dir, ctx.generation)
    };
    let manifest = Manifest {
        id,
        kind: "allreduce".into(),
        step,
        ps: Vec::new(),
        model: Some(Part {
            index: 0,
            path: model_path,
            digest,
            keys: 0,
        }),
    };
    let path = dir.join(MANIFEST_FILE);
    let json =
        serde_json::to_vec_pretty(&manifest).map_err(|e| Error::InvalidRequest(e.to_string()))?;
    write_atomic(&path, &json).map_err(|e| Error::Io {
        path: path.clone(),
        source: e,
    })?;
    shared
        .apply(|ctx, now| {
            ctx.checkpoint_committed(id, path, step, generation, now)
                .map(|e| ((), e))
        })
        .await
}
