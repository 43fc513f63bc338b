//! The agent: registers with the job master, joins the rendezvous, launches the training process
//! with the torchrun environment (and TF_CONFIG for ps jobs), supervises it, sends heartbeats
//! with resource samples, and follows the master's instructions (restart, shut down).

use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use proto::CHECKPOINT_NOT_SHARED;
use proto::checkpoint::SHARED_MARKER;
use proto::jobmaster::v1 as pb;
use tokio::process::Child;

use crate::error::Error;
use crate::launch::{child_env, exit_parts, spawn, stop};
use crate::output::Output;
use crate::sampler::{GpuProbe, ProcSampler, sample};

pub type MasterClient = pb::job_master_client::JobMasterClient<auth::Channel>;

#[derive(Clone, Debug)]
pub struct AgentArgs {
    pub master: String,
    pub role: vocab::Role,
    pub index: u32,
    pub incarnation: u64,
    /// Give up when the master has not answered for this long.
    pub master_timeout: Duration,
    /// The address the process serves on and other nodes reach it by [default:
    /// [`node_address`]].
    pub advertise: Option<IpAddr>,
    /// The job's secret file, which the agent and its process read (its path goes to the
    /// process in [`auth::JOB_TOKEN_ENV`]).
    pub token_file: std::path::PathBuf,
    /// The job's TLS directory when the job runs with TLS (its path goes to the process in
    /// [`auth::tls::JOB_TLS_ENV`]).
    pub tls_dir: Option<std::path::PathBuf>,
    /// How the job's processes are confined ([`crate::sandbox`]); none: as this agent's user.
    pub sandbox: Option<vocab::sandbox::Sandbox>,
}

/// How long each call to the job master may take. The master answers every one at once (it
/// waits on nothing of a caller's: a rendezvous not formed is polled) once the change it makes
/// is on disk, so a call that takes longer found a master stopped, hung or cut off: it fails
/// with DEADLINE_EXCEEDED, and its caller retries or gives up as it does when the master is
/// gone (the agent at `--master-timeout-secs`). The default outlasts the job master's own
/// give-up on a failing disk (`--persist-give-up-ms`, 60 s), which then fails the job itself.
pub const MASTER_CALLS: auth::Deadlines = auth::Deadlines {
    default: Duration::from_secs(120),
    by_method: &[
        // Several fit in the agent's --master-timeout-secs (15 s by default).
        ("Heartbeat", Duration::from_secs(5)),
        ("ReportProcessExit", Duration::from_secs(5)),
    ],
};

/// Connects to the master, sending the job's secret, retrying until `timeout`; each call then
/// has its deadline in [`MASTER_CALLS`].
pub async fn connect(
    addr: &str,
    timeout: Duration,
    creds: &auth::JobCreds,
) -> Result<MasterClient, Error> {
    let start = Instant::now();
    loop {
        match creds.connect(addr.to_string(), MASTER_CALLS).await {
            Ok(c) => return Ok(MasterClient::new(c)),
            Err(e) if start.elapsed() >= timeout => {
                return Err(Error::Master {
                    addr: addr.to_string(),
                    problem: e.to_string(),
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Reserves a port on `host` for the training process's service (PS endpoint, ring endpoint or
/// torch store), as torchrun does for MASTER_PORT: bind port 0, note the port, release it.
fn reserve_port(host: IpAddr) -> Result<String, Error> {
    let io = |e| Error::Io {
        path: format!("{host}:0").into(),
        source: e,
    };
    let l = std::net::TcpListener::bind((host, 0)).map_err(io)?;
    Ok(l.local_addr().map_err(io)?.to_string())
}

/// The address this node is reached by: the one it reaches the master from (the local end of a
/// UDP socket "connected" to the master: a route lookup, no packet is sent). On one machine that
/// is 127.0.0.1; on a cluster, the node's address on the network the master is on.
pub async fn node_address(master: &str) -> Result<IpAddr, Error> {
    let peer = master.to_string();
    tokio::task::spawn_blocking(move || vocab::net::route_source(&peer))
        .await
        .map_err(|e| Error::Master {
            addr: master.into(),
            problem: format!("looking up the route: {e}"),
        })?
        .map_err(|e| Error::Io {
            path: format!("the route to the job master at {master}").into(),
            source: e,
        })
}

/// Why a process resident in `rss` bytes must end under a limit of `limit` bytes (0: none).
fn over_memory(rss: u64, limit: u64) -> Option<String> {
    const MIB: f64 = 1024.0 * 1024.0;
    (limit > 0 && rss > limit).then(|| {
        format!(
            "{}: resident {:.1} MiB over the limit of {:.1} MiB",
            proto::OUT_OF_MEMORY,
            rss as f64 / MIB,
            limit as f64 / MIB
        )
    })
}

/// Whether the process belongs to a role outside the training group (a service, a single
/// process, a further all-reduce group): it runs its role's own program, started at once,
/// outside the training group's rendezvous.
pub(crate) fn own_role(reg: &pb::RegisterAgentResponse) -> bool {
    reg.own_group || matches!(reg.topology.as_str(), "service" | "single")
}

/// The user the job's processes run as, when this agent is root and its sandbox names one:
/// what the agent makes for them is given to it.
fn job_user(args: &AgentArgs) -> Result<vocab::beneath::Owner, Error> {
    let name = args.sandbox.as_ref().and_then(|s| s.run_as.as_deref());
    match name {
        Some(name) if nix::unistd::geteuid().is_root() => crate::sandbox::user(name)
            .map(Some)
            .map_err(|source| Error::Io {
                path: "run_as".into(),
                source,
            }),
        _ => Ok(None),
    }
}

/// Whether the training process runs confined: every process does where a sandbox is set
/// (a `command:` and the built-in workload alike).
fn confined(args: &AgentArgs) -> bool {
    args.sandbox.is_some()
}

/// Captures the stacks of the training process `pid` (the process under bubblewrap for a
/// confined command) and sends them to the master, off the heartbeat loop.
fn send_stacks(
    args: &AgentArgs,
    reg: &pb::RegisterAgentResponse,
    mut client: MasterClient,
    me: pb::ProcessRef,
    pid: u32,
) {
    let pid = if confined(args) {
        crate::sandbox::signal_targets(pid)
            .first()
            .map_or(pid, |&p| p as u32)
    } else {
        pid
    };
    let file = crate::stacks::stacks_file(&reg.checkpoint_dir, args.role.as_str(), args.index);
    tokio::spawn(async move {
        let text = crate::stacks::capture(pid, &file).await;
        tracing::info!(pid, "stacks captured for the job master");
        if let Err(status) = client
            .report_stacks(pb::ProcessStacks {
                process: Some(me),
                text,
            })
            .await
        {
            tracing::warn!("the master refused the stacks: {status}");
        }
    });
}

/// Reports an exit (with why, when the agent ended the process itself), retrying until the
/// master answers: a lost report would leave the master waiting for a process that is gone.
/// Gives up (and so ends the agent) after `timeout`, and at once on `shutdown`, which is what
/// the agents of a master that died get: `Ok(false)` then.
async fn report_exit<F: Future<Output = ()>>(
    client: &mut MasterClient,
    exit: pb::ProcessExit,
    timeout: Duration,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> Result<bool, Error> {
    let start = Instant::now();
    loop {
        match client.report_process_exit(exit.clone()).await {
            Ok(_) => return Ok(true),
            Err(status) if start.elapsed() >= timeout => {
                return Err(Error::Refused {
                    call: "ReportProcessExit",
                    status,
                });
            }
            Err(status) => {
                tracing::warn!("cannot report the exit yet: {status}");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = shutdown.as_mut() => return Ok(false),
                }
            }
        }
    }
}

/// Waits until the copies the exited process left ready are written out and reported, so
/// that the job master commits a copy made just before the end while the job still runs (it
/// ends the job, and lets this agent go, once it hears of the exit). Heartbeats go on
/// meanwhile: the write-out of a large copy at low priority can outlast the master's
/// heartbeat timeout. False when told to shut down.
async fn write_out_first<F: Future<Output = ()>>(
    writer: &crate::flash::Writer,
    client: &mut MasterClient,
    beat: pb::HeartbeatRequest,
    heartbeat: &mut tokio::time::Interval,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> bool {
    let flushed = writer.flush();
    tokio::pin!(flushed);
    loop {
        tokio::select! {
            _ = &mut flushed => return true,
            _ = heartbeat.tick() => {
                if let Err(s) = client.heartbeat(beat.clone()).await {
                    tracing::warn!("heartbeat failed while writing the last copies out: {s}");
                }
            }
            _ = shutdown.as_mut() => return false,
        }
    }
}

/// Why this node cannot take part: it does not see in the checkpoint directory the token the
/// master wrote there (another node's directory of the same path, or none). `None` when it
/// does, or when the master asks for no check.
fn checkpoint_not_shared(
    reg: &pb::RegisterAgentResponse,
    host: IpAddr,
    master: &str,
) -> Option<String> {
    if reg.checkpoint_token.is_empty() {
        return None;
    }
    let path = std::path::Path::new(&reg.checkpoint_dir).join(SHARED_MARKER);
    let seen = match std::fs::read_to_string(&path) {
        Ok(s) if s == reg.checkpoint_token => return None,
        Ok(s) => format!("holds {:?}", s.chars().take(40).collect::<String>()),
        Err(e) => format!("cannot be read ({e})"),
    };
    Some(format!(
        "{CHECKPOINT_NOT_SHARED}: on this node ({host}) {} {seen} instead of the token the job \
         master at {master} wrote there: every node must see the job's checkpoint directory \
         (a shared filesystem mounted at the same path)",
        path.display()
    ))
}

/// What [`report_exit`] sends.
fn exit_of(process: pb::ProcessRef, exit_code: i32, signal: i32, why: String) -> pb::ProcessExit {
    pb::ProcessExit {
        process: Some(process),
        exit_code,
        signal,
        agent_reason: why,
    }
}

/// Runs the agent until the master says the job is over, the master is lost, or `shutdown`.
/// Returns the exit code the agent process should end with.
pub async fn run(args: AgentArgs, shutdown: impl Future<Output = ()>) -> Result<i32, Error> {
    let secret = |e: auth::AuthError| Error::Secret(e.to_string());
    let creds = auth::JobCreds {
        token: auth::read_secret(&args.token_file).map_err(secret)?,
        tls: args
            .tls_dir
            .as_deref()
            .map(auth::tls::JobTls::load)
            .transpose()
            .map_err(secret)?,
    };
    let mut client = connect(&args.master, args.master_timeout, &creds).await?;
    let host = match args.advertise {
        Some(ip) => ip,
        None => node_address(&args.master).await?,
    };
    let mut service_addr = reserve_port(host)?;
    let reg = client
        .register_agent(pb::RegisterAgentRequest {
            role: args.role.to_string(),
            index: args.index,
            incarnation: args.incarnation,
            host: host.to_string(),
            agent_pid: std::process::id(),
            service_addr: service_addr.clone(),
            devices: std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default(),
        })
        .await
        .map_err(|status| Error::Refused {
            call: "RegisterAgent",
            status,
        })?
        .into_inner();
    let gpu = GpuProbe::new();
    let memory_limit = reg.resources.as_ref().map_or(0, |r| r.memory_bytes);
    let grace = Duration::from_millis(reg.grace_period_ms as u64);
    let mut incarnation = reg.incarnation;
    let me = |inc: u64| pb::ProcessRef {
        role: args.role.to_string(),
        index: args.index,
        incarnation: inc,
    };
    tracing::info!(
        role = args.role.as_str(),
        index = args.index,
        incarnation,
        agent = reg.agent_id,
        "registered"
    );

    tokio::pin!(shutdown);
    if let Some(why) = checkpoint_not_shared(&reg, host, &args.master) {
        tracing::error!("{why}");
        let exit = exit_of(me(incarnation), 1, 0, why);
        report_exit(&mut client, exit, args.master_timeout, &mut shutdown).await?;
        return Ok(1);
    }

    // Flash checkpoints: the process's slots in shared memory, written out behind it.
    let flash = match reg.flash_budget_bytes {
        0 => None,
        budget => Some(crate::flash::FlashDir::open(
            &vocab::flash::root(),
            &reg.run_id,
            args.role.as_str(),
            args.index,
            budget,
            job_user(&args)?,
        )?),
    };
    if flash.is_some() {
        tokio::task::spawn_blocking(|| {
            use crate::flash_leftovers::{LEFTOVER_AFTER, sweep};
            let Ok(root) = crate::flash::open_root(&vocab::flash::root()) else {
                return;
            };
            for dir in sweep(&root, LEFTOVER_AFTER) {
                tracing::info!(
                    "removed flash copies no agent has held for {} min: {}",
                    LEFTOVER_AFTER.as_secs() / 60,
                    dir.display()
                );
            }
        });
    }
    let writer = flash.clone().map(|f| {
        crate::flash::Writer::start(
            f,
            reg.checkpoint_dir.clone().into(),
            client.clone(),
            args.role.to_string(),
            args.index,
        )
    });

    let mut child: Option<(Child, ProcSampler)> = None;
    // The running process's output, copied to this agent's log up to its cap.
    let mut output: Option<Output> = None;
    let mut need_join = true;
    let mut last_ok = Instant::now();
    // The incarnation whose stacks were captured (the master asks until they arrive).
    let mut captured = 0;
    let mut heartbeat = tokio::time::interval(Duration::from_millis(
        reg.heartbeat_interval_ms.max(10) as u64,
    ));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if need_join && child.is_none() {
            // The rendezvous the process starts in (None: it joins itself), once ready.
            let ready = if reg.process_joins || own_role(&reg) {
                Some(None)
            } else {
                match client
                    .join_rendezvous(pb::JoinRendezvousRequest {
                        process: Some(me(incarnation)),
                        service_addr: service_addr.clone(),
                    })
                    .await
                {
                    Ok(r) => {
                        last_ok = Instant::now();
                        let r = r.into_inner();
                        if r.removed {
                            // A scale plan removed this slot; the next heartbeat says shut down.
                            need_join = false;
                        }
                        r.ready.then_some(Some(r))
                    }
                    Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                        // Our incarnation is old: the next heartbeat tells us the new one.
                        None
                    }
                    Err(status) => {
                        tracing::warn!("rendezvous: {status}");
                        None
                    }
                }
            };
            if let Some(join) = ready {
                let mut env = child_env(&args, &reg, join.as_ref(), incarnation, &service_addr);
                if let Some(f) = &flash {
                    env.insert(
                        crate::flash::DIR_ENV.into(),
                        f.dir.to_string_lossy().into_owned(),
                    );
                    env.insert(crate::flash::BUDGET_ENV.into(), f.budget.to_string());
                }
                match spawn(&args, &reg, env, &reg.job_kind) {
                    Ok(mut c) => {
                        let pid = c.id().unwrap_or(0);
                        output = Some(Output::follow(
                            &mut c,
                            output_cap(&args),
                            format!("{}-{} (incarnation {incarnation})", args.role, args.index),
                        ));
                        tracing::info!(
                            incarnation,
                            pid,
                            round = join.as_ref().map(|r| r.round),
                            rank = join.as_ref().map(|r| r.rank),
                            world = join.as_ref().map(|r| r.world_size),
                            "training process started"
                        );
                        let sampler = ProcSampler::new(pid);
                        let sampler = if confined(&args) {
                            sampler.with_descendants()
                        } else {
                            sampler
                        };
                        child = Some((c, sampler));
                    }
                    Err(e) => {
                        // Reported like a shell that cannot run the program (127), so the
                        // master's relaunch limits and reasons apply as to any exit.
                        tracing::error!("{e}");
                        let exit = exit_of(me(incarnation), 127, 0, String::new());
                        if !report_exit(&mut client, exit, args.master_timeout, &mut shutdown)
                            .await?
                        {
                            return Ok(0);
                        }
                    }
                }
                need_join = false;
            }
        }
        let wait_child = async {
            match child.as_mut() {
                Some((c, _)) => c.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = wait_child => {
                let (exit_code, signal) = status.map(exit_parts).unwrap_or((-1, 0));
                tracing::info!(incarnation, exit_code, signal, "training process exited");
                child = None;
                if let Some(o) = output.take() {
                    o.drained(crate::output::DRAIN_WITHIN).await;
                }
                if let Some(w) = &writer {
                    let beat = pb::HeartbeatRequest {
                        process: Some(me(incarnation)),
                        agent_id: reg.agent_id,
                        ..Default::default()
                    };
                    if !write_out_first(w, &mut client, beat, &mut heartbeat, &mut shutdown).await {
                        return Ok(0);
                    }
                }
                let exit = exit_of(me(incarnation), exit_code, signal, String::new());
                if !report_exit(&mut client, exit, args.master_timeout, &mut shutdown).await? {
                    return Ok(0);
                }
            }
            _ = heartbeat.tick() => {
                let s = child
                    .as_mut()
                    .and_then(|(c, ps)| c.id().and_then(|_| sample(ps, &gpu)));
                if let (Some(rss), Some((c, _))) = (s.as_ref().map(|s| s.rss_bytes), child.as_mut())
                    && let Some(why) = over_memory(rss, memory_limit)
                {
                    // What a cgroup's OOM killer would do, at the sampling interval.
                    tracing::warn!(incarnation, "{why}; killing the training process");
                    let _ = c.kill().await;
                    let (exit_code, signal) = c.wait().await.map(exit_parts).unwrap_or((-1, 9));
                    child = None;
                    let exit = exit_of(me(incarnation), exit_code, signal, why);
                    if !report_exit(&mut client, exit, args.master_timeout, &mut shutdown).await? {
                        return Ok(0);
                    }
                    continue;
                }
                match client.heartbeat(pb::HeartbeatRequest {
                    process: Some(me(incarnation)),
                    agent_id: reg.agent_id,
                    process_running: child.is_some(),
                    sample: s,
                    process_pid: child.as_ref().and_then(|(c, _)| c.id()).unwrap_or(0),
                }).await {
                    Ok(r) => {
                        last_ok = Instant::now();
                        let r = r.into_inner();
                        if let (Some(f), Some(step)) = (&flash, r.committed_step)
                            && let Err(e) = f.mark_committed(step)
                        {
                            tracing::warn!(step, "cannot mark the flash copy committed: {e}");
                        }
                        if let (Some(f), Some(step)) = (&flash, r.persist_step) {
                            match f.persist_kept(step) {
                                Ok(true) => tracing::info!(step, "writing out the copy of a cut whose rank 0 was moved"),
                                Ok(false) => {}
                                Err(e) => tracing::warn!(step, "cannot write out the kept flash copy: {e}"),
                            }
                        }
                        if r.capture_stacks && captured != incarnation
                            && let Some(pid) = child.as_ref().and_then(|(c, _)| c.id())
                        {
                            captured = incarnation;
                            send_stacks(&args, &reg, client.clone(), me(incarnation), pid);
                        }
                        match pb::AgentAction::try_from(r.action).unwrap_or(pb::AgentAction::Continue) {
                            pb::AgentAction::Restart => {
                                if let Some((mut c, _)) = child.take() {
                                    tracing::info!(from = incarnation, to = r.incarnation, "restarting the training process");
                                    if let Some(why) = stop(&mut c, grace, confined(&args)).await {
                                        tracing::warn!(incarnation, "{why}");
                                        // The master records it against the replaced incarnation.
                                        let exit = exit_of(me(incarnation), -1, 9, why);
                                        if !report_exit(&mut client, exit, args.master_timeout, &mut shutdown).await? {
                                            return Ok(0);
                                        }
                                    }
                                }
                                incarnation = r.incarnation;
                                need_join = true;
                                // A new port for the new group (MASTER_PORT when this is rank 0):
                                // the old group's sockets may linger.
                                match reserve_port(host) {
                                    Ok(a) => service_addr = a,
                                    Err(e) => tracing::warn!("keeping {service_addr}: {e}"),
                                }
                            }
                            pb::AgentAction::Shutdown => {
                                if let Some((mut c, _)) = child.take() {
                                    let _ = stop(&mut c, grace, confined(&args)).await;
                                }
                                tracing::info!("the job master says the job is over");
                                if let Some(f) = &flash {
                                    f.remove();
                                }
                                return Ok(0);
                            }
                            _ => {}
                        }
                    }
                    Err(status) => {
                        tracing::warn!("heartbeat failed: {status}");
                        if last_ok.elapsed() > args.master_timeout {
                            if let Some((mut c, _)) = child.take() {
                                stop(&mut c, grace, confined(&args)).await;
                            }
                            return Err(Error::Master { addr: args.master.clone(), problem: format!("no answer for {:?}", args.master_timeout) });
                        }
                    }
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(100)), if need_join => {}
            _ = &mut shutdown => {
                if let Some((mut c, _)) = child.take() {
                    stop(&mut c, grace, confined(&args)).await;
                }
                return Ok(0);
            }
        }
    }
}

/// The most a process's output puts in its log: the operator's `[launcher.sandbox]
/// output_cap`, else [`crate::output::DEFAULT_CAP`].
fn output_cap(args: &AgentArgs) -> u64 {
    args.sandbox
        .as_ref()
        .and_then(|s| s.output_cap)
        .map_or(crate::output::DEFAULT_CAP, |b| b.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[tokio::test]
    async fn the_node_address_is_the_one_that_routes_to_the_master() {
        let local: IpAddr = Ipv4Addr::LOCALHOST.into();
        assert_eq!(node_address("http://127.0.0.1:5000").await.unwrap(), local);
        let err = node_address("http://no-such-host.invalid:5000")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("the route to the job master"), "{err}");
    }

    #[test]
    fn a_checkpoint_directory_not_shared_is_named_with_what_this_node_sees() {
        let dir = tempfile::tempdir().unwrap();
        let reg = pb::RegisterAgentResponse {
            checkpoint_dir: dir.path().display().to_string(),
            checkpoint_token: "token-1".into(),
            ..Default::default()
        };
        let host: IpAddr = Ipv4Addr::new(10, 0, 0, 7).into();
        let master = "http://10.0.0.1:5000";

        let missing = checkpoint_not_shared(&reg, host, master).expect("no marker");
        assert!(missing.starts_with(CHECKPOINT_NOT_SHARED), "{missing}");
        assert!(missing.contains("10.0.0.7") && missing.contains("cannot be read"));

        std::fs::write(dir.path().join(SHARED_MARKER), "token-0").unwrap();
        let other = checkpoint_not_shared(&reg, host, master).expect("another job's marker");
        assert!(other.contains("holds \"token-0\""), "{other}");

        std::fs::write(dir.path().join(SHARED_MARKER), "token-1").unwrap();
        assert_eq!(checkpoint_not_shared(&reg, host, master), None);

        let unchecked = pb::RegisterAgentResponse {
            checkpoint_token: String::new(),
            ..reg
        };
        assert_eq!(
            checkpoint_not_shared(&unchecked, host, "x"),
            None,
            "a master that writes no token asks for no check"
        );
    }

    #[test]
    fn only_a_process_over_a_set_limit_is_out_of_memory() {
        assert_eq!(over_memory(10 << 30, 0), None, "0 means no limit");
        assert_eq!(
            over_memory(32 << 20, 32 << 20),
            None,
            "at the limit is fine"
        );
        assert_eq!(
            over_memory(48 << 20, 32 << 20).as_deref(),
            Some("out of memory: resident 48.0 MiB over the limit of 32.0 MiB")
        );
    }
}
