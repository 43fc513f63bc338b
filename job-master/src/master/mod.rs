//! The async shell around [`JobContext`]: it serves gRPC, carries out effects (launch and stop
//! agents, save PS checkpoints, finish), runs the timers, persists every change before it is
//! acknowledged, and returns a [`JobReport`] when the job ends.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::checkpoint::{MANIFEST_FILE, Manifest, Part, SHARED_MARKER};
use proto::jobmaster::v1 as pb;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc, watch};

use crate::error::Error;
use crate::job::{Effect, JobContext, ReshardRecord, Timing};
use crate::persist::{Persister, write_atomic};
use crate::platform::local::LocalPlatform;
use crate::platform::{AgentLaunch, Platform, PlatformConfig, PlatformEvent};
use crate::service::MasterService;
use crate::spec::JobSpec;
pub use vocab::report::{JobReport, PsStats};

mod effects;
mod placement;
mod ps;
mod report;

use effects::execute;
pub use ps::reshard_ps;

use crate::shared::Shared;
use report::build_report;

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
    /// The address agents on other nodes reach the master by, when the listener's own is not
    /// one (it listens on 0.0.0.0); the listener's port goes with it.
    #[serde(default)]
    pub advertise: Option<IpAddr>,
    /// The job's secret [default: `job.token` in `run_dir`, created at the first start]: every
    /// call to this master and to the job's parameter servers must carry it. The brain writes
    /// it for a master it starts.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Mutual TLS on every link inside the job (agents, training processes and parameter
    /// servers with this master and with each other, the allreduce ring): the job's own CA
    /// and certificate, made at the first start in `tls/` of `run_dir` (which the job's nodes
    /// share, as the secret beside it), reach the processes in [`auth::tls::JOB_TLS_ENV`].
    /// The brain asks for it when it runs with TLS itself.
    #[serde(default)]
    pub job_tls: bool,
    /// How the master's listener treats connections (timeouts, caps: [`auth::listen`]).
    #[serde(default)]
    pub connections: auth::listen::ConnLimits,
}

/// Where a job master keeps the job's TLS files, in its run directory.
pub const JOB_TLS_DIR: &str = auth::tls::JOB_DIR;

/// The file in the run directory that holds the address the master serves on (as agents reach
/// it), written once the job is started or resumed: `job-master status --run-dir` reads it.
pub const ADDRESS_FILE: &str = "master.addr";

/// The address agents reach the master by: the listener's, with its IP replaced by `advertise`.
/// A listener on every interface (0.0.0.0) needs `advertise`: its own address reaches nothing.
fn advertised(listener: &TcpListener, advertise: Option<IpAddr>) -> Result<SocketAddr, Error> {
    let addr = listener.local_addr().map_err(|e| Error::Io {
        path: "the master's listener".into(),
        source: e,
    })?;
    match advertise {
        Some(ip) => Ok(SocketAddr::new(ip, addr.port())),
        None if addr.ip().is_unspecified() => Err(Error::InvalidRequest(format!(
            "the master listens on {addr}, which no agent can connect to: give the address \
             agents reach this machine by (--advertise)"
        ))),
        None => Ok(addr),
    }
}

/// Writes a fresh token to the checkpoint directory's [`SHARED_MARKER`] for every agent to read
/// back: an agent on a node that does not share the directory reads something else (or
/// nothing) and says so before it trains.
fn mark_shared(dir: &Path) -> Result<String, Error> {
    let token = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let path = dir.join(SHARED_MARKER);
    write_atomic(&path, token.as_bytes()).map_err(|e| Error::Io { path, source: e })?;
    Ok(token)
}

/// A new run's id: the job's name, this process's pid, how many runs it started before and 32
/// random bits. Two runs never share their agents' flash directories (each master removes its
/// run's at its end; a process restores what its slots hold) nor a torchelastic run id: not two
/// job masters in one process (a test binary's, a program embedding them), nor two on different
/// machines whose agents share a node (masters in containers often have the same pid). A
/// resumed run keeps the id it had.
fn new_run_id(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    format!(
        "{name}-{}-{n}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
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
    let run_id = new_run_id(&spec.name);
    let (ctx, launches) = JobContext::new(spec, run_id, timing.clone(), 0);
    Ok((ctx, launches, 0))
}

/// The pre-run check, once per job, before the first launch (a resumed job that finished it
/// keeps avoiding what it found): its processes get the workload's environment with the job's
/// secret and TLS directory by path, as the agents do, and one GPU each for a job that uses
/// GPUs. The job then avoids the nodes it found faulty or slow; with no healthy node it stops.
async fn pre_run_check(
    job: &Mutex<JobContext>,
    platform: &Arc<dyn Platform>,
    persister: &Persister,
    (bind, advertise): (std::net::IpAddr, std::net::IpAddr),
    (creds, token_file): (&auth::JobCreds, &Path),
    connections: auth::listen::ConnLimits,
    clock_ms: u64,
) -> Result<(), Error> {
    let check = {
        let ctx = job.lock().await;
        let Some(settings) = ctx
            .spec
            .precheck()
            .filter(|_| ctx.stability.precheck.is_none())
        else {
            return Ok(());
        };
        let mut env = ctx.spec.workload.env.clone();
        env.insert(
            auth::JOB_TOKEN_ENV.into(),
            token_file.to_string_lossy().into_owned(),
        );
        if let Some(tls) = &creds.tls {
            env.insert(
                auth::tls::JOB_TLS_ENV.into(),
                tls.dir().to_string_lossy().into_owned(),
            );
        }
        crate::precheck::CheckRun {
            settings,
            env,
            gpus: u32::from(ctx.spec.uses_gpu()),
            bind,
            advertise,
            creds: creds.clone(),
            connections,
        }
    };
    let record = crate::precheck::run(platform.clone(), check).await?;
    if record.unhealthy().count() == record.nodes.len() {
        // Not kept: the job is run again (`--resume`) once the nodes are mended, and checks
        // them again.
        let why: Vec<String> = record
            .nodes
            .iter()
            .map(|n| format!("{} is {}: {}", n.node, n.health.as_str(), n.why))
            .collect();
        return Err(Error::Precheck(format!(
            "no healthy node: {}",
            why.join("; ")
        )));
    }
    let avoid = job.lock().await.precheck_done(record, clock_ms);
    persister.durable(persister.changed()).await?;
    platform.avoid(&avoid);
    Ok(())
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
        advertise,
        token_file,
        job_tls,
        connections,
    } = config;
    spec.validate().map_err(vocab::Error::from)?;
    vocab::spec::host::check(&spec).map_err(vocab::Error::from)?;
    if matches!(platform, PlatformConfig::Local { .. }) {
        placement::local_placement(&spec)?;
    }
    std::fs::create_dir_all(&run_dir).map_err(|e| Error::Io {
        path: run_dir.clone(),
        source: e,
    })?;
    vocab::paths::clear_of_master(&spec.checkpoint.dir, &run_dir).map_err(Error::InvalidRequest)?;
    std::fs::create_dir_all(&spec.checkpoint.dir)
        .and_then(|()| {
            let sandbox = std::env::var(vocab::sandbox::SANDBOX_ENV).ok();
            crate::persist::give_to_job_user(&spec.checkpoint.dir, sandbox.as_deref())
        })
        .map_err(|e| Error::Io {
            path: spec.checkpoint.dir.clone(),
            source: e,
        })?;
    let addr = advertised(&listener, advertise)?;
    let token_file = token_file.unwrap_or_else(|| run_dir.join(auth::JOB_TOKEN_FILE));
    let token_file = std::path::absolute(&token_file).map_err(|source| Error::Io {
        path: token_file.clone(),
        source,
    })?;
    let (token, _) = auth::read_or_create(&token_file)?;
    let tls = if job_tls {
        let dir = std::path::absolute(run_dir.join(JOB_TLS_DIR)).map_err(|source| Error::Io {
            path: run_dir.join(JOB_TLS_DIR),
            source,
        })?;
        Some(auth::tls::JobTls::make_or_load(&dir)?)
    } else {
        None
    };
    let creds = auth::JobCreds { token, tls };
    let checkpoint_token = mark_shared(&spec.checkpoint.dir)?;
    let (mut ctx, initial, clock_ms) = start_or_resume(spec, &run_dir, &timing, resume)?;
    if let (false, Some(link)) = (resume, &brain) {
        ctx.start_on(&link.start_nodes, clock_ms);
    }
    let addr_file = run_dir.join(ADDRESS_FILE);
    crate::persist::write_atomic(&addr_file, format!("{addr}\n").as_bytes()).map_err(|e| {
        Error::Io {
            path: addr_file,
            source: e,
        }
    })?;
    let job = Arc::new(Mutex::new(ctx));
    let persister = Persister::new(&run_dir, Duration::from_millis(timing.persist_give_up_ms));
    tokio::spawn(persister.clone().run(job.clone()));
    persister.durable(persister.changed()).await?;

    // Agent exits (one per agent that ended); the platform's watchers wait while it is full.
    let (ev_tx, mut ev_rx) = mpsc::channel(1024);
    let output_dir = matches!(platform, PlatformConfig::Local { .. }).then(|| run_dir.clone());
    let platform: Arc<dyn Platform> = match platform {
        PlatformConfig::Local {
            agent_bin,
            max_processes,
            gpus,
        } => Arc::new(LocalPlatform::new(
            agent_bin.unwrap_or_else(LocalPlatform::default_agent_bin),
            run_dir.join(vocab::run_dir::LOGS_DIR),
            ev_tx,
            max_processes,
            gpus.unwrap_or_else(crate::platform::local::machine_gpus),
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
            // A start's processes where the brain's round placed them; a resumed job's anew.
            let named = match (resume, &brain) {
                (false, Some(link)) => link.start_nodes.clone(),
                _ => BTreeMap::new(),
            };
            s.placement = placement::placement_plans(&job.lock().await.spec, &named);
            Arc::new(crate::platform::ray::RayPlatform::connect(s, ev_tx).await?)
        }
    };
    if let Some(link) = &brain {
        // Before the first launch: no process starts on a node the brain cordoned, and the
        // GPUs its other jobs hold are counted.
        platform.cordon(&link.cordoned);
        platform.others_devices(link.others_devices.clone());
    }
    // A continued job keeps avoiding the nodes its stragglers ran on.
    let avoided: Vec<String> = job.lock().await.stability.avoided.keys().cloned().collect();
    if !avoided.is_empty() {
        platform.avoid(&avoided);
    }
    let local = listener.local_addr().map_err(|source| Error::Io {
        path: "the job master's listener".into(),
        source,
    })?;
    let (effects, mut eff_rx) = crate::shared::EffectQueue::new();
    let (phase_tx, mut phase_rx) = watch::channel(vocab::Phase::Running);
    let shared = Arc::new(Shared {
        job: job.clone(),
        persister,
        effects: effects.clone(),
        started: std::sync::Mutex::new(Instant::now()),
        prechecking: std::sync::Mutex::new(Some(Instant::now())),
        clock_offset_ms: clock_ms,
        phase: phase_tx,
        ps_stats: Mutex::default(),
        capacity: platform.capacity(),
        managed_by: brain.as_ref().map(|l| l.url.clone()),
        checkpoint_token,
        creds: creds.clone(),
        token_file,
        output_dir,
    });

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let listening = creds.listening("job master", connections)?;
    let server = tonic::transport::Server::builder()
        .add_service(pb::job_master_server::JobMasterServer::with_interceptor(
            MasterService::new(shared.clone()),
            {
                // The job's secret first, then room in the effect queue.
                let mut require = auth::Require::new(creds.token.clone(), "the job master");
                move |request| {
                    use tonic::service::Interceptor;
                    let request = require.call(request)?;
                    effects.admit()?;
                    Ok(request)
                }
            },
        ))
        .serve_with_incoming_shutdown(auth::listen::incoming(listener, listening), async {
            let _ = stop_rx.await;
        });
    let server = tokio::spawn(server);
    tracing::info!(%addr, "job master listening");

    // The master answers its status during the check (which says so) and refuses plans.
    let checked = pre_run_check(
        &job,
        &platform,
        &shared.persister,
        (local.ip(), addr.ip()),
        (&creds, &shared.token_file),
        connections,
        clock_ms,
    )
    .await;
    shared.precheck_over();
    if let Err(e) = checked {
        let _ = stop_tx.send(());
        let _ = server.await;
        return Err(e);
    }

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
        shared.effects.send(e);
    }

    // Timers and platform events.
    let monitor = {
        let shared = shared.clone();
        let platform = platform.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let news = shared.persister.news();
                        shared
                            .apply_logged("timer tick", |ctx, now| {
                                let said = news.is_some();
                                if let Some(text) = news {
                                    ctx.storage(now, text);
                                }
                                let (effects, changed) = ctx.tick_changed(now);
                                let changed = changed || said;
                                if platform.counts_devices() {
                                    platform.devices_held(ctx.device_use());
                                }
                                Ok(((), effects, changed))
                            })
                            .await;
                    }
                    Some(ev) = ev_rx.recv() => match ev {
                        PlatformEvent::Placed { key, incarnation } => {
                            shared
                                .apply_logged("agent placed", |ctx, now| {
                                    Ok(((), vec![], ctx.agent_placed(key, incarnation, now)))
                                })
                                .await;
                        }
                        PlatformEvent::NotPlaced { key, incarnation, description } => {
                            shared
                                .apply_logged("agent not placed", |ctx, now| {
                                    Ok(((), ctx.agent_not_placed(key, incarnation, description, now), true))
                                })
                                .await;
                        }
                        PlatformEvent::Note(text) => {
                            shared
                                .apply_logged("platform note", |ctx, now| {
                                    ctx.note(now, text);
                                    Ok(((), vec![], true))
                                })
                                .await;
                        }
                        PlatformEvent::AgentExited { key, incarnation, description } => {
                            shared
                                .apply_logged("agent exit", |ctx, now| Ok(((), ctx.agent_lost(key, incarnation, format!("agent process {description}"), now), true)))
                                .await;
                        }
                    },
                }
            }
        })
    };

    let link = brain.clone().map(|link| {
        tokio::spawn(crate::brain_link::run(
            shared.clone(),
            link,
            addr,
            platform.clone(),
        ))
    });

    tokio::pin!(shutdown);
    loop {
        if phase_rx.borrow().is_terminal() {
            break;
        }
        tokio::select! {
            changed = phase_rx.changed() => if changed.is_err() { break },
            _ = &mut shutdown => {
                shared.apply_logged("shutdown", |ctx, now| { ctx.fail("the job master was asked to shut down".into(), now); Ok(((), vec![], true)) }).await;
                break;
            }
        }
    }

    // Agents learn the job is over from their next heartbeat and exit; stop the stragglers.
    let grace_ms = shared.job.lock().await.grace_period_ms();
    let deadline =
        Instant::now() + Duration::from_millis(grace_ms + 3 * timing.heartbeat_interval_ms);
    while platform.running().await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    platform.stop_all(Duration::from_millis(grace_ms)).await;
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
    report::remove_flash_leftovers(&ctx.run_id);
    let report = build_report(&ctx, shared.ps_stats.lock().await.clone(), shared.now_ms());
    if let Ok(json) = serde_json::to_vec_pretty(&report) {
        let path = run_dir.join(vocab::run_dir::REPORT_FILE);
        // The brain hears the outcome whether or not the report could be written.
        if let Err(e) = write_atomic(&path, &json) {
            tracing::error!(path = %path.display(), "cannot write the job's report: {e}");
        }
    }
    if let Some(link) = &brain {
        crate::brain_link::report_outcome(link, &report, addr).await;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two runs of one job in one process get ids of their own (a test binary's job masters
    /// shared `NAME-PID`, and the first to end removed the other's flash copies).
    #[test]
    fn runs_in_one_process_never_share_an_id() {
        let (a, b) = (new_run_id("ddp"), new_run_id("ddp"));
        let prefix = format!("ddp-{}-", std::process::id());
        assert!(a.starts_with(&prefix) && b.starts_with(&prefix), "{a} {b}");
        assert_ne!(a, b);
        // Its random part tells apart runs of the same name, pid and count elsewhere.
        let random = |id: &str| id.rsplit('-').next().unwrap().to_string();
        for id in [&a, &b] {
            let r = random(id);
            assert!(
                r.len() == 8 && r.chars().all(|c| c.is_ascii_hexdigit()),
                "{id}"
            );
        }
        let many: std::collections::BTreeSet<String> =
            (0..64).map(|_| random(&new_run_id("ddp"))).collect();
        assert!(many.len() > 60, "{many:?}");
    }

    #[tokio::test]
    async fn agents_get_the_listeners_address_or_the_advertised_one() {
        let local = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = local.local_addr().unwrap().port();
        assert_eq!(
            advertised(&local, None).unwrap(),
            SocketAddr::from(([127, 0, 0, 1], port))
        );
        let every = TcpListener::bind("0.0.0.0:0").await.unwrap();
        let port = every.local_addr().unwrap().port();
        let err = advertised(&every, None).unwrap_err().to_string();
        assert!(err.contains("--advertise"), "{err}");
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            advertised(&every, Some(ip)).unwrap(),
            SocketAddr::new(ip, port)
        );
    }

    #[test]
    fn each_start_writes_a_fresh_token_to_the_checkpoint_directory() {
        let dir = tempfile::tempdir().unwrap();
        let first = mark_shared(dir.path()).unwrap();
        let second = mark_shared(dir.path()).unwrap();
        assert_ne!(first, second);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(SHARED_MARKER)).unwrap(),
            second
        );
    }
}
