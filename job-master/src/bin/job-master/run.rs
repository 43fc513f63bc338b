//! `job-master run`: the job on local processes or a Ray cluster, to its end.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use job_master::job::Timing;
use job_master::platform::PlatformConfig;
use job_master::{MasterConfig, run as run_job};

use crate::status::show_progress;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The job spec (YAML); see examples/.
    spec: PathBuf,
    /// Where the job context, agent logs and report.json go [default: runs/<job name>].
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Continue the unfinished job in the run directory after its job master died (kill -9,
    /// a lost machine): every process is launched anew and the job goes on from its latest
    /// checkpoint, nothing lost or counted twice. Without it, a run directory that holds an
    /// unfinished job is refused.
    #[arg(long)]
    resume: bool,
    /// Address the master serves agents on. On a cluster of several machines, an address the
    /// other nodes reach (this machine's on their network), or 0.0.0.0:PORT with --advertise.
    #[arg(long, default_value = "127.0.0.1:0", env = "BRAIN_JOB_MASTER_LISTEN")]
    listen: String,
    /// The address agents on other nodes reach this machine by, when --listen is 0.0.0.0: an
    /// IP, or `auto` for this machine's address on its route to the brain (--brain), else to
    /// the Ray dashboard (how the brain starts job masters on Ray's nodes).
    #[arg(long, env = "BRAIN_JOB_MASTER_ADVERTISE", value_parser = parse_advertise)]
    advertise: Option<Advertise>,
    /// The worker-agent binary [default: next to this binary].
    #[arg(long, env = "BRAIN_WORKER_AGENT_BIN")]
    agent_bin: Option<PathBuf>,
    /// How often agents send heartbeats, milliseconds.
    #[arg(long, default_value_t = 500)]
    heartbeat_interval_ms: u64,
    /// An agent silent for this long is declared lost and relaunched, milliseconds.
    #[arg(long, default_value_t = 10_000)]
    heartbeat_timeout_ms: u64,
    /// Rendezvous last-call window once `min` workers joined, milliseconds.
    #[arg(long, default_value_t = 2_000)]
    last_call_ms: u64,
    /// Time a training process gets between SIGTERM and SIGKILL, milliseconds (a spec's
    /// `workload.grace_period_ms` overrides it for its job).
    #[arg(long, default_value_t = 5_000)]
    grace_period_ms: u64,
    /// A launched agent that has not registered after this long is relaunched, milliseconds.
    #[arg(long, default_value_t = 30_000)]
    register_timeout_ms: u64,
    /// A scale plan whose consistent cut (every shard lease drained, a checkpoint at the step
    /// boundary) is not reached after this long is abandoned with its reason, and the job
    /// goes on at its old size, milliseconds.
    #[arg(long, default_value_t = 120_000)]
    cut_timeout_ms: u64,
    /// How long writes of the job's state to the run directory may fail (a removed run
    /// directory, a full or failing disk), retried with backoff meanwhile, before the job
    /// fails with the reason and its processes are stopped, milliseconds (a master the brain
    /// starts gets its policy's `[live] state_write_give_up_s`).
    #[arg(long, default_value_t = 60_000)]
    persist_give_up_ms: u64,
    /// How long a parameter server may take to save its part of a checkpoint to disk before
    /// the checkpoint fails with the reason (the job goes on, and checkpoints at its next
    /// cut), milliseconds.
    #[arg(long, default_value_t = 300_000)]
    ps_save_timeout_ms: u64,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 2)]
    progress_secs: u64,
    /// Processes of the job the platform may run at once; scale plans above it are
    /// rejected [default: 32 on local processes, the cluster's whole CPUs on Ray].
    #[arg(long)]
    max_processes: Option<u32>,
    /// Where the job's processes run: local processes, or Ray jobs on an existing Ray
    /// cluster [default: the spec's `platform`, else local].
    #[arg(long, value_enum)]
    platform: Option<PlatformKind>,
    /// The Ray cluster's dashboard (Job Submission API) for `--platform ray`, e.g.
    /// http://127.0.0.1:8265. The master's `--listen` address must be reachable from
    /// Ray's nodes, and the worker-agent binary must exist at `--agent-bin` on them.
    #[arg(long, env = "BRAIN_RAY_ADDRESS")]
    ray_address: Option<String>,
    /// The brain to register with (e.g. http://127.0.0.1:50070): the job reports its
    /// metrics there and carries out the brain's scale plans. Without it the job runs
    /// alone at its spec's size.
    #[arg(long, env = "BRAIN_URL")]
    brain: Option<String>,
    /// How often metrics go to the brain and plans are polled, milliseconds.
    #[arg(long, default_value_t = 1000)]
    brain_interval_ms: u64,
    /// The token the job master authenticates to the brain with: the job's secret file the
    /// brain wrote for a master it started, or, started by hand, the operator token (the brain
    /// then returns the job's own secret when it registers) [default:
    /// brain-data/operator.token where it exists].
    #[arg(long, env = "BRAIN_TOKEN_FILE")]
    brain_token_file: Option<PathBuf>,
    /// TLS to the brain: the CA that signed its certificate, checked before any token is sent
    /// [default: brain-data/tls/ca.pem, the CA a brain makes at its first start, where it
    /// exists].
    #[arg(long)]
    brain_ca: Option<PathBuf>,
    /// Talk to a brain started with --insecure: plain text, the brain not checked.
    #[arg(long, conflicts_with = "brain_ca")]
    brain_insecure: bool,
    /// A node the brain cordoned (its address on Ray; repeatable): no process of the job goes
    /// there. The brain passes its cordons when it starts a master; later ones come with its
    /// plans.
    #[arg(long = "cordoned", value_name = "NODE", requires = "brain")]
    cordoned: Vec<String>,
    /// A GPU share the brain's other jobs hold (repeatable), NODE:DEVICE=THOUSANDTHS
    /// (`10.213.0.11:1=700`: 0.7 of device 1 there): counted with the job's own processes'
    /// devices where a process is placed on Ray. The brain passes them when it starts a
    /// master; later ones come with its plans.
    #[arg(
        long = "gpus-held",
        value_name = "NODE:DEVICE=THOUSANDTHS",
        requires = "brain"
    )]
    gpus_held: Vec<String>,
    /// Where the brain's round placed the job's processes (repeatable, one per role),
    /// ROLE=NODE[,NODE...]: process k of ROLE is launched first on the k-th node while that
    /// node holds it (a relaunch is placed by room). The brain passes them when it starts a
    /// master.
    #[arg(
        long = "start-nodes",
        value_name = "ROLE=NODE,...",
        requires = "brain",
        conflicts_with = "resume",
        value_parser = parse_start_nodes
    )]
    start_nodes: Vec<(vocab::Role, Vec<String>)>,
    /// Mutual TLS to the brain: this master's certificate (with --brain-key).
    #[arg(long, requires = "brain_key", requires = "brain_ca")]
    brain_cert: Option<PathBuf>,
    /// Mutual TLS to the brain: this master's private key (owner-only).
    #[arg(long, requires = "brain_cert")]
    brain_key: Option<PathBuf>,
    /// The job's secret, which the job's agents, processes and parameter servers present and
    /// this master expects (owner-only) [default: job.token in the run directory, created at
    /// the first start].
    #[arg(long)]
    job_token_file: Option<PathBuf>,
    /// Mutual TLS inside the job, the default: every link between this master and the job's
    /// agents, training processes and parameter servers, and between those (the allreduce
    /// ring too), with a CA and a certificate of the job's own, made at the first start in
    /// tls/ of the run directory (which Ray's nodes must share, as the secret beside it).
    /// Kept for the command lines that name it.
    #[arg(long, hide = true, conflicts_with = "job_insecure")]
    job_tls: bool,
    /// Plain text inside the job: no process can tell its master or its peers from an
    /// impostor on their port, and the job's secret goes to whoever listens there. On a
    /// machine and network you trust only.
    #[arg(long)]
    job_insecure: bool,
}

/// The brain token: the file named, or the operator token in its default place where it exists.
fn brain_token(file: Option<PathBuf>) -> anyhow::Result<Option<auth::Token>> {
    let path = match file {
        Some(p) => p,
        None => {
            let default = PathBuf::from("brain-data/operator.token");
            if !default.exists() {
                return Ok(None);
            }
            default
        }
    };
    auth::read_secret(&path)
        .map(Some)
        .context("--brain-token-file: the token for the brain")
}

/// `--advertise`: an address, or the one on the route to the brain or Ray.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Advertise {
    Ip(std::net::IpAddr),
    Auto,
}

fn parse_advertise(s: &str) -> Result<Advertise, String> {
    if s == "auto" {
        return Ok(Advertise::Auto);
    }
    s.parse()
        .map(Advertise::Ip)
        .map_err(|e| format!("{e}: expected an IP address or `auto`"))
}

/// `--start-nodes ROLE=NODE[,NODE...]`: the role, and its processes' nodes by index.
fn parse_start_nodes(s: &str) -> Result<(vocab::Role, Vec<String>), String> {
    let (role, nodes) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected ROLE=NODE[,NODE...]"))?;
    let role = vocab::Role::new(role.trim())?;
    let nodes: Vec<String> = nodes.split(',').map(|n| n.trim().to_string()).collect();
    if nodes.iter().any(String::is_empty) {
        return Err(format!("{s:?}: a node without a name"));
    }
    Ok((role, nodes))
}

/// The IP `--advertise` names: `auto` is this machine's end of the route to the brain, or
/// else to the Ray dashboard the platform uses.
fn resolve_advertise(
    advertise: Advertise,
    brain: Option<&str>,
    platform: &PlatformConfig,
) -> anyhow::Result<std::net::IpAddr> {
    let peer = match (advertise, brain, platform) {
        (Advertise::Ip(ip), _, _) => return Ok(ip),
        (Advertise::Auto, Some(brain), _) => brain,
        (Advertise::Auto, None, PlatformConfig::Ray { address, .. }) => address.as_str(),
        (Advertise::Auto, None, _) => anyhow::bail!(
            "--advertise auto finds this machine's address on the route to the brain or the              Ray dashboard: give --brain or a Ray platform, or an IP address"
        ),
    };
    vocab::net::route_source(peer).with_context(|| format!("--advertise auto: the route to {peer}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum PlatformKind {
    /// Child processes of the job master on this machine.
    Local,
    /// Ray jobs on an existing Ray cluster (needs --ray-address or the spec's address).
    Ray,
}

/// The platform from the flags, the spec, or the default (local).
fn choose_platform(
    flag: Option<PlatformKind>,
    ray_address: Option<String>,
    agent_bin: Option<PathBuf>,
    max_processes: Option<u32>,
    spec: Option<PlatformConfig>,
) -> anyhow::Result<PlatformConfig> {
    let local = |agent_bin| PlatformConfig::Local {
        agent_bin,
        max_processes: Some(max_processes.unwrap_or(32)),
        gpus: None,
    };
    Ok(match (flag, spec) {
        (Some(PlatformKind::Local), _) => local(agent_bin),
        (Some(PlatformKind::Ray), spec) => {
            let from_spec = match spec {
                Some(PlatformConfig::Ray {
                    address,
                    place_timeout_ms,
                    env,
                    agent_bin: spec_bin,
                    max_processes: spec_max,
                }) => Some((address, place_timeout_ms, env, spec_bin, spec_max)),
                _ => None,
            };
            let (spec_address, place_timeout_ms, env, spec_bin, spec_max) =
                from_spec.unwrap_or_default();
            let address = ray_address
                .or((!spec_address.is_empty()).then_some(spec_address))
                .context("--platform ray needs --ray-address (e.g. http://127.0.0.1:8265)")?;
            PlatformConfig::Ray {
                address,
                agent_bin: agent_bin.or(spec_bin),
                max_processes: max_processes.or(spec_max),
                place_timeout_ms,
                env,
            }
        }
        (
            None,
            Some(PlatformConfig::Ray {
                address,
                agent_bin: spec_bin,
                max_processes: spec_max,
                place_timeout_ms,
                env,
            }),
        ) => PlatformConfig::Ray {
            address: ray_address.unwrap_or(address),
            agent_bin: agent_bin.or(spec_bin),
            max_processes: max_processes.or(spec_max),
            place_timeout_ms,
            env,
        },
        (
            None,
            Some(PlatformConfig::Local {
                agent_bin: spec_bin,
                max_processes: spec_max,
                gpus,
            }),
        ) => PlatformConfig::Local {
            agent_bin: agent_bin.or(spec_bin),
            max_processes: max_processes.or(spec_max).or(Some(32)),
            gpus,
        },
        (None, Some(PlatformConfig::External)) => PlatformConfig::External,
        (None, None) => local(agent_bin),
    })
}

pub async fn run(args: RunArgs) -> anyhow::Result<std::process::ExitCode> {
    // The job's context (its spec and env values), logs and checkpoints are its user's alone.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let RunArgs {
        spec,
        run_dir,
        resume,
        listen,
        advertise,
        agent_bin,
        heartbeat_interval_ms,
        heartbeat_timeout_ms,
        last_call_ms,
        grace_period_ms,
        register_timeout_ms,
        cut_timeout_ms,
        persist_give_up_ms,
        ps_save_timeout_ms,
        progress_secs,
        max_processes,
        platform,
        ray_address,
        brain,
        brain_interval_ms,
        brain_token_file,
        job_token_file,
        brain_ca,
        brain_insecure,
        cordoned,
        gpus_held,
        start_nodes,
        brain_cert,
        brain_key,
        job_tls: _,
        job_insecure,
    } = args;
    let job_tls = !job_insecure;
    let mut others_devices = vocab::devices::DeviceUse::default();
    for held in &gpus_held {
        others_devices
            .add_named(held)
            .map_err(|e| anyhow::anyhow!("--gpus-held {e}"))?;
    }
    let mut start_on = std::collections::BTreeMap::new();
    for (role, on) in start_nodes {
        if start_on.insert(role, on).is_some() {
            anyhow::bail!("--start-nodes: {role} is given twice");
        }
    }
    let spec = job_master::spec::load(&spec)?;
    // A token goes only to a server that proved it is the brain.
    let brain_ca = match (&brain, brain_ca, brain_insecure) {
        (Some(url), None, false) => {
            let default = PathBuf::from("brain-data/tls/ca.pem");
            if !default.exists() {
                anyhow::bail!(
                    "--brain {url}: no CA to check the brain's certificate with ({} does not \
                     exist): give --brain-ca with the brain's tls/ca.pem, or --brain-insecure \
                     for a brain started with --insecure",
                    default.display()
                );
            }
            Some(default)
        }
        (_, ca, _) => ca,
    };
    let token = match &brain {
        Some(url) => {
            let t = brain_token(brain_token_file)?;
            if t.is_none() {
                say_err!(
                    "warning: no token for the brain at {url}: it will refuse this job master \
                     (give --brain-token-file)"
                );
            }
            t
        }
        None => None,
    };
    let platform = choose_platform(
        platform,
        ray_address,
        agent_bin,
        max_processes,
        spec.platform.clone(),
    )?;
    let advertise = advertise
        .map(|a| resolve_advertise(a, brain.as_deref(), &platform))
        .transpose()?;
    let run_dir = run_dir.unwrap_or_else(|| PathBuf::from("runs").join(&spec.name));
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let mut addr = listener.local_addr()?;
    if let Some(ip) = advertise {
        addr.set_ip(ip);
    }
    let token_file = job_token_file.unwrap_or_else(|| run_dir.join(auth::JOB_TOKEN_FILE));
    let (job_token, _) = auth::read_or_create(&token_file)
        .context("--job-token-file: the job's secret for its processes")?;
    let tls_dir = run_dir.join(job_master::master::JOB_TLS_DIR);
    let creds = auth::JobCreds {
        token: job_token,
        tls: job_tls
            .then(|| auth::tls::JobTls::make_or_load(&tls_dir))
            .transpose()
            .with_context(|| format!("the job's certificates in {}", tls_dir.display()))?,
    };
    let config = MasterConfig {
        spec,
        run_dir: run_dir.clone(),
        timing: Timing {
            heartbeat_interval_ms,
            heartbeat_timeout_ms,
            last_call_ms,
            grace_period_ms,
            register_timeout_ms,
            cut_timeout_ms,
            persist_give_up_ms,
            ps_save_timeout_ms,
        },
        platform,
        brain: brain.map(|url| {
            let url = if url.starts_with("http") {
                url
            } else {
                format!("http://{url}")
            };
            job_master::brain_link::BrainLink {
                report_interval_ms: brain_interval_ms,
                token: auth::WithToken::new(token),
                tls: brain_ca.map(|ca_file| auth::tls::ClientTls {
                    ca_file,
                    cert_file: brain_cert,
                    key_file: brain_key,
                }),
                cordoned,
                others_devices,
                start_nodes: start_on,
                ..job_master::brain_link::BrainLink::new(url)
            }
        }),
        resume,
        advertise,
        token_file: Some(token_file.clone()),
        job_tls,
        connections: Default::default(),
    };
    say!(
        "job master on {addr}, run directory {}, the job's secret in {}{}",
        run_dir.display(),
        token_file.display(),
        creds.tls.as_ref().map_or(String::new(), |t| format!(
            ", the job's TLS in {}",
            t.dir().display()
        ))
    );
    let progress = tokio::spawn(show_progress(
        addr,
        creds,
        Duration::from_secs(progress_secs.max(1)),
    ));
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let report = run_job(config, listener, shutdown).await?;
    progress.abort();
    say!(
        "\n== {} {} in {:.1} s ==",
        report.job,
        report.phase,
        report.elapsed_ms as f64 / 1000.0
    );
    if let Some(r) = &report.reason {
        say!("reason: {r}");
    }
    if let Some(t) = report.first_step_after_ms {
        say!("first training step after {t} ms");
    }
    if let Some(l) = report.final_eval_loss {
        say!("held-out log-loss: {l:.5}");
    }
    if report.data_tracked {
        say!(
            "shards: {}/{}; exactly-once per epoch: {}; samples per epoch: {:?}",
            report.shards_done,
            report.shards_total,
            report.exactly_once,
            report.samples_per_epoch
        );
    } else {
        say!(
            "data: not tracked (the command read its own data without leasing shards, so \
             the job master cannot say whether every sample was read once per epoch)"
        );
    }
    let relaunches: Vec<String> = report
        .restarts
        .iter()
        .map(|(role, n)| format!("{role} {n}"))
        .collect();
    say!(
        "relaunches: {}; checkpoints: {}",
        if relaunches.is_empty() {
            "none".to_string()
        } else {
            relaunches.join(", ")
        },
        report.checkpoints
    );
    for ps in &report.ps_stats {
        say!(
            "ps {}: {} keys, {} batches / {} samples applied, {} duplicate pushes ignored",
            ps.index,
            ps.keys,
            ps.applied_batches,
            ps.applied_samples,
            ps.duplicate_pushes
        );
    }
    for t in &report.transitions {
        say!(
            "plan {}: {:?} -> {:?} reached after {} ms{}",
            t.version,
            t.from,
            t.to,
            t.reached_ms - t.accepted_ms,
            t.resumed_ms
                .map(|r| format!(
                    ", every worker training again after {} ms",
                    r - t.accepted_ms
                ))
                .unwrap_or_default()
        );
    }
    for r in &report.reshards {
        say!(
            "reshard (plan {}): ps {} -> {} moved {} of {} keys in {} ms, parameter digest {:016x} unchanged: {}",
            r.version,
            r.from_ps,
            r.to_ps,
            r.moved_keys,
            r.total_keys,
            r.took_ms,
            r.digest_after,
            r.digest_before == r.digest_after
        );
    }
    say!("report: {}", run_dir.join("report.json").display());
    Ok(if report.succeeded() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ray(address: &str) -> PlatformConfig {
        PlatformConfig::Ray {
            address: address.into(),
            agent_bin: None,
            max_processes: Some(6),
            place_timeout_ms: Some(5000),
            env: Default::default(),
        }
    }

    #[test]
    fn advertise_is_an_address_or_the_route_to_the_brain_or_ray() {
        let local: std::net::IpAddr = [127, 0, 0, 1].into();
        assert_eq!(parse_advertise("127.0.0.1"), Ok(Advertise::Ip(local)));
        assert_eq!(parse_advertise("auto"), Ok(Advertise::Auto));
        let e = parse_advertise("somewhere").unwrap_err();
        assert!(e.contains("an IP address or `auto`"), "{e}");
        let no_ray = choose_platform(None, None, None, None, None).unwrap();
        let ip: std::net::IpAddr = [10, 1, 2, 3].into();
        assert_eq!(
            resolve_advertise(Advertise::Ip(ip), None, &no_ray).unwrap(),
            ip
        );
        assert_eq!(
            resolve_advertise(Advertise::Auto, Some("http://127.0.0.1:50070"), &no_ray).unwrap(),
            local
        );
        assert_eq!(
            resolve_advertise(Advertise::Auto, None, &ray("http://127.0.0.1:8265")).unwrap(),
            local
        );
        let e = resolve_advertise(Advertise::Auto, None, &no_ray).unwrap_err();
        assert!(e.to_string().contains("give --brain"), "{e}");
    }

    #[test]
    fn start_nodes_name_a_role_and_its_processes_nodes() {
        assert_eq!(
            parse_start_nodes("worker=10.0.0.2, 10.0.0.3"),
            Ok((
                vocab::Role::WORKER,
                vec!["10.0.0.2".into(), "10.0.0.3".into()]
            ))
        );
        for (bad, why) in [
            ("worker", "expected ROLE=NODE"),
            ("worker=a,,b", "a node without a name"),
            ("worker=", "a node without a name"),
            ("Bad=a", "role name"),
        ] {
            let e = parse_start_nodes(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn flags_override_the_spec_and_local_is_the_default() {
        let local = choose_platform(None, None, None, None, None).unwrap();
        assert_eq!(
            local,
            PlatformConfig::Local {
                agent_bin: None,
                max_processes: Some(32),
                gpus: None,
            }
        );
        // The spec's Ray platform, its address replaced by the flag.
        let p = choose_platform(None, Some("h:1".into()), None, None, Some(ray("h:2"))).unwrap();
        assert_eq!(p, {
            let mut r = ray("h:1");
            if let PlatformConfig::Ray { max_processes, .. } = &mut r {
                *max_processes = Some(6);
            }
            r
        });
        // --platform local wins over the spec.
        let p = choose_platform(
            Some(PlatformKind::Local),
            None,
            None,
            Some(4),
            Some(ray("h:2")),
        );
        assert_eq!(
            p.unwrap(),
            PlatformConfig::Local {
                agent_bin: None,
                max_processes: Some(4),
                gpus: None,
            }
        );
        // --platform ray takes the spec's settings and the flag's address.
        let p = choose_platform(Some(PlatformKind::Ray), None, None, None, Some(ray("h:2")));
        assert_eq!(p.unwrap(), ray("h:2"));
        let p = choose_platform(
            Some(PlatformKind::Ray),
            Some("h:3".into()),
            None,
            None,
            None,
        );
        assert!(
            matches!(p.unwrap(), PlatformConfig::Ray { address, place_timeout_ms: None, .. } if address == "h:3")
        );
        let e = choose_platform(Some(PlatformKind::Ray), None, None, None, None).unwrap_err();
        assert!(e.to_string().contains("--ray-address"), "{e}");
    }
}
