//! The training process an agent runs: its environment (the torchrun variables, TF_CONFIG,
//! the `BRAIN_*` ones), starting it (confined in a sandbox when one is set, as the job's user)
//! and stopping it (SIGTERM, its grace period, SIGKILL).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use proto::jobmaster::v1 as pb;
use tokio::process::{Child, Command};

use crate::agent::{AgentArgs, own_role};
use crate::error::Error;

/// Stops a training process: SIGTERM, up to `grace`, then SIGKILL. Says why when it had to
/// be killed.
pub(crate) async fn stop(child: &mut Child, grace: Duration, confined: bool) -> Option<String> {
    if let Some(pid) = child.id() {
        // A confined command is bubblewrap's descendant: the signal goes to it (bubblewrap
        // would die at once and take it along).
        let targets = if confined {
            crate::sandbox::signal_targets(pid)
        } else {
            vec![pid as i32]
        };
        for p in targets {
            let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
            // A stopped (frozen) process handles SIGTERM only once it runs again.
            let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
        }
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return None;
        }
    }
    let _ = child.kill().await;
    Some(format!(
        "did not exit within its grace period of {} ms after SIGTERM and was killed: a \
         checkpoint it meant to save on SIGTERM is missing",
        grace.as_millis()
    ))
}

/// TensorFlow's cluster description. A ps job is TF2's ParameterServerStrategy, which needs a
/// `chief` (the coordinator that runs the training loop): worker 0 is the chief, the other
/// workers are `worker` 0.. in index order. An allreduce job is MultiWorkerMirroredStrategy:
/// the ring members are `worker`s in rank order.
fn tf_config(
    role: &str,
    service_addr: &str,
    join: &pb::JoinRendezvousResponse,
) -> Option<serde_json::Value> {
    match &join.cluster {
        Some(c) => {
            let (chief, workers) = match c.worker.split_first() {
                Some((chief, rest)) => (vec![chief.clone()], rest.to_vec()),
                None => (Vec::new(), Vec::new()),
            };
            let task = if role == "ps" {
                serde_json::json!({ "type": "ps", "index": join.rank })
            } else if chief.first().map(String::as_str) == Some(service_addr) {
                serde_json::json!({ "type": "chief", "index": 0 })
            } else {
                let index = workers.iter().position(|w| w == service_addr)?;
                serde_json::json!({ "type": "worker", "index": index })
            };
            // TF refuses a job with no tasks: only non-empty ones are named.
            let mut cluster = serde_json::Map::new();
            for (name, tasks) in [("chief", chief), ("worker", workers), ("ps", c.ps.clone())] {
                if !tasks.is_empty() {
                    cluster.insert(name.into(), serde_json::json!(tasks));
                }
            }
            Some(serde_json::json!({ "cluster": cluster, "task": task }))
        }
        None if !join.peers.is_empty() => Some(serde_json::json!({
            "cluster": { "worker": join.peers },
            "task": { "type": "worker", "index": join.rank },
        })),
        None => None,
    }
}

/// The environment of the training process. `join` is the rendezvous it starts in; `None`
/// for a process that joins it itself (`process_joins`): it gets no rank or world size.
pub(crate) fn child_env(
    args: &AgentArgs,
    reg: &pb::RegisterAgentResponse,
    join: Option<&pb::JoinRendezvousResponse>,
    incarnation: u64,
    service_addr: &str,
) -> BTreeMap<String, String> {
    // The job's own variables first: what the runtime sets below replaces any of the same
    // name (the spec's validation refuses them; this holds for a master that did not check).
    let mut env: BTreeMap<String, String> = reg
        .env
        .iter()
        .filter(|(k, _)| !vocab::spec::env::runtime_owned(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let role = args.role;
    // What torchrun gives a process: this agent is a "node" running one process.
    env.insert("LOCAL_RANK".into(), "0".into());
    env.insert("LOCAL_WORLD_SIZE".into(), "1".into());
    env.insert("TORCHELASTIC_RUN_ID".into(), reg.run_id.clone());
    match join {
        Some(join) => {
            env.insert("RANK".into(), join.rank.to_string());
            env.insert("GROUP_RANK".into(), join.rank.to_string());
            env.insert("WORLD_SIZE".into(), join.world_size.to_string());
            env.insert("MASTER_ADDR".into(), join.master_addr.clone());
            env.insert("MASTER_PORT".into(), join.master_port.to_string());
            env.insert(
                "TORCHELASTIC_RESTART_COUNT".into(),
                join.restart_count.to_string(),
            );
            if let Some(tf) = tf_config(role.as_str(), service_addr, join) {
                env.insert("TF_CONFIG".into(), tf.to_string());
            }
            if let Some(c) = &join.cluster {
                env.insert("BRAIN_PS_ADDRS".into(), c.ps.join(","));
                env.insert("BRAIN_PS_VERSION".into(), c.ps_version.to_string());
            }
            env.insert("BRAIN_RESUME_FROM".into(), join.resume_from.clone());
            env.insert("BRAIN_RING_PEERS".into(), join.peers.join(","));
            env.insert("BRAIN_RENDEZVOUS_ROUND".into(), join.round.to_string());
            if join.state_from_rank0 != 0 {
                env.insert(
                    crate::workload::STATE_FROM_RANK0_ENV.into(),
                    join.state_from_rank0.to_string(),
                );
            }
            if join.restore_together {
                env.insert("BRAIN_RESTORE_TOGETHER".into(), "1".into());
            }
        }
        // A process outside the training group has no group of the master's to join (a
        // further all-reduce group forms through the SDK).
        None if own_role(reg) => {
            env.insert("BRAIN_OWN_GROUP".into(), "1".into());
        }
        None => {
            env.insert("BRAIN_PROCESS_JOINS".into(), "1".into());
        }
    }
    env.insert("BRAIN_TOPOLOGY".into(), reg.topology.clone());
    env.insert("BRAIN_MASTER_ADDR".into(), args.master.clone());
    env.insert(
        auth::JOB_TOKEN_ENV.into(),
        args.token_file.to_string_lossy().into_owned(),
    );
    if let Some(dir) = &args.tls_dir {
        env.insert(
            auth::tls::JOB_TLS_ENV.into(),
            dir.to_string_lossy().into_owned(),
        );
    }
    env.insert("BRAIN_ROLE".into(), role.to_string());
    env.insert("BRAIN_INDEX".into(), args.index.to_string());
    env.insert("BRAIN_INCARNATION".into(), incarnation.to_string());
    env.insert("BRAIN_SERVICE_ADDR".into(), service_addr.into());
    env.insert("BRAIN_CHECKPOINT_DIR".into(), reg.checkpoint_dir.clone());
    let stacks = crate::stacks::stacks_file(&reg.checkpoint_dir, role.as_str(), args.index);
    env.insert(
        crate::stacks::STACKS_FILE_ENV.into(),
        stacks.to_string_lossy().into_owned(),
    );
    // What the process was given, as the Kubernetes downward API would tell it.
    let r = reg.resources.clone().unwrap_or_default();
    env.insert("BRAIN_CPU_MILLICORES".into(), r.cpu_millicores.to_string());
    env.insert("BRAIN_MEMORY_BYTES".into(), r.memory_bytes.to_string());
    env.insert(
        "BRAIN_GPUS".into(),
        vocab::Gpus::from_milli(r.gpu_milli).to_string(),
    );
    env
}

/// What a job's process takes from its agent's own environment: where programs and
/// libraries are, the locale and time zone, a home and a temporary directory, the devices a
/// GPU node's container runtime names, and the log settings of Brain's own built-in workload.
/// Nothing else of the agent's environment (and so of the job master's or the brain's) reaches
/// a job: the agent sets the job's own variables, then the spec's.
pub const INHERITED: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "RUST_LOG",
    "RUST_BACKTRACE",
];

/// The agent's variables a job's process gets: [`INHERITED`], the locale's `LC_*`, and those
/// [`vocab::sandbox::PASS_ENV`] names (what the spec had its platform set for the agents).
fn inherited() -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
    let passed: Vec<String> = std::env::var(vocab::sandbox::PASS_ENV)
        .unwrap_or_default()
        .split(',')
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    std::env::vars_os().filter(move |(k, _)| {
        k.to_str().is_some_and(|k| {
            INHERITED.contains(&k) || k.starts_with("LC_") || passed.iter().any(|p| p == k)
        })
    })
}

pub(crate) fn spawn(
    args: &AgentArgs,
    reg: &pb::RegisterAgentResponse,
    env: BTreeMap<String, String>,
    kind: &str,
) -> Result<Child, Error> {
    let mut user = None;
    let mut umask = None;
    let mut overrides = Vec::new();
    let program = reg
        .command
        .first()
        .cloned()
        .unwrap_or_else(|| "built-in workload".into());
    let spawn_err = |source| Error::Spawn {
        program: program.clone(),
        source,
    };
    // The built-in workload is this program, started again: confined like any command, with
    // the program itself in the sandbox's view.
    let mut sandbox = args.sandbox.clone();
    let command = if reg.command.is_empty() {
        let exe = std::env::current_exe().map_err(spawn_err)?;
        let what = match (kind, args.role) {
            ("ps", vocab::Role::PS) => "ps-server",
            ("ps", _) => "ps-worker",
            _ => "allreduce-worker",
        };
        if let Some(s) = &mut sandbox {
            s.read_only.push(exe.clone());
        }
        vec![
            exe.to_string_lossy().into_owned(),
            "workload".into(),
            what.into(),
        ]
    } else {
        reg.command.clone()
    };
    let mut cmd = if let Some(sandbox) = &sandbox {
        let slot = format!("{}-{}", args.role, args.index);
        let start = crate::sandbox::prepare(
            sandbox,
            &slot,
            &args.token_file,
            args.tls_dir.as_deref(),
            std::path::Path::new(&reg.checkpoint_dir),
            env.get(crate::flash::DIR_ENV).map(std::path::Path::new),
            &command,
        )
        .map_err(spawn_err)?;
        let mut c = Command::new(&start.program);
        c.args(&start.args);
        user = start.user;
        overrides = start.env;
        // bubblewrap makes the sandbox's directories with the umask it inherits: the job's
        // user must traverse them (what it writes stays in its own 0700 directories).
        umask = Some(0o022);
        c
    } else {
        let mut c = Command::new(&command[0]);
        c.args(&command[1..]);
        c
    };
    cmd.env_clear()
        .envs(inherited())
        .envs(env)
        .envs(overrides)
        .stdin(Stdio::null())
        // Copied to the agent's own, capped (`output`).
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: umask, setgroups, setgid, setuid and prctl are async-signal-safe system calls;
    // nothing else runs between fork and exec.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if let Some(mask) = umask {
                nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
            }
            if let Some((uid, gid)) = user {
                nix::unistd::setgroups(&[]).map_err(std::io::Error::from)?;
                nix::unistd::setgid(gid).map_err(std::io::Error::from)?;
                nix::unistd::setuid(uid).map_err(std::io::Error::from)?;
            }
            // After the user switch, which clears it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    cmd.spawn().map_err(spawn_err)
}

pub(crate) fn exit_parts(status: std::process::ExitStatus) -> (i32, i32) {
    use std::os::unix::process::ExitStatusExt;
    (status.code().unwrap_or(-1), status.signal().unwrap_or(0))
}
