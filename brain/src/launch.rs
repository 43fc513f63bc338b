//! Starting a submitted job's master: the spec the brain filled in is written to the job's run
//! directory with the worker count the round decided, and `job-master run` is started on it
//! with `--brain` pointing back here, as a child process of the brain ([`JobMasters::Local`],
//! the default) or as a Ray job on the brain's Ray cluster ([`JobMasters::Ray`]: Ray places it
//! on a node, and a node lost takes only that node's masters). Either way a task follows the
//! master to its end (the child's exit, or the Ray job's terminal status polled from the
//! dashboard) and reports it; a job master outlives a brain that is killed (it keeps training
//! and reconnects), and a restarted brain follows it again (a local one by the pid recorded
//! in its run directory: `master_process`). A job master
//! that dies before its job ended is started again on the same run directory with `--resume`
//! (see `Control::exited`); on Ray, on whichever node Ray picks then. `exposure` refuses
//! to start beside a Ray dashboard open to the jobs' processes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ray_client::{RayApi, RuntimeEnv, SubmitRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use vocab::JobSpec;

use crate::BrainError;
use crate::master_process::MasterProcess;
use crate::store::JobId;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LauncherConfig {
    /// The `job-master` binary [default: next to the running binary]; on Ray, at this path on
    /// the nodes.
    #[serde(default)]
    pub job_master_bin: Option<PathBuf>,
    /// The `worker-agent` binary job masters start [default: next to `job-master`].
    #[serde(default)]
    pub agent_bin: Option<PathBuf>,
    /// Extra arguments for `job-master run` (e.g. timing flags).
    #[serde(default)]
    pub job_master_args: Vec<String>,
    /// Where job masters run [default: local].
    #[serde(default)]
    pub job_masters: JobMasters,
    /// How the job masters the brain starts reach it over TLS (`[launcher.tls]` ca_file: the
    /// CA that signed the brain's certificate; cert_file and key_file: theirs, for mutual
    /// TLS). Needed when the brain has `[tls]`.
    #[serde(default)]
    pub tls: Option<auth::tls::ClientTls>,
    /// Mutual TLS inside each job the brain starts (`job-master run --job-tls`: master,
    /// agents, training processes, parameter servers, the allreduce ring) [default: on when
    /// the job masters reach the brain over TLS].
    #[serde(default)]
    pub job_tls: Option<bool>,
    /// How the jobs' processes are confined (`[launcher.sandbox]` run_as: the
    /// unprivileged user they run as, required when the brain runs as root; isolation:
    /// "bwrap" (the default) or "none"; read_only: their code and interpreters beyond the
    /// system and the working directory). The brain's data and runs directories are hidden
    /// from them whatever this says.
    #[serde(default)]
    pub sandbox: vocab::sandbox::Sandbox,
    /// Start beside a Ray dashboard that answers without a credential on loopback (Ray's
    /// default address, or the brain's own Ray cluster's), through which a job's process,
    /// confined but on this host's network, could run code outside its sandbox [default:
    /// false: the brain refuses to start, saying so].
    #[serde(default)]
    pub allow_open_ray_dashboard: bool,
}

/// Where the brain runs the job masters it starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum JobMasters {
    /// Child processes of the brain, on its machine (`job_masters = "local"`).
    #[default]
    Local,
    /// Ray jobs on the brain's Ray cluster (`cluster.ray_address`), using no CPU of the jobs':
    /// Ray places each on a node that has `resources` (custom resources the nodes that may
    /// hold job masters declare, e.g. `ray start --resources '{"brain_job_master": 8}'`;
    /// none: wherever Ray's scheduler puts a job driver, the head usually). A master whose
    /// node is lost is resumed on a node left. The brain's address must be one the nodes reach
    /// (`advertise`), and `runs_dir` a directory every node shares, at the same path
    /// (`[launcher.job_masters.ray] resources = { brain_job_master = 1 }`).
    Ray {
        #[serde(default)]
        resources: BTreeMap<String, f64>,
    },
}

/// How a job master is launched: the job's start, with where the brain's round placed its
/// processes (by role as the job names them, each role's from index 0; a role left out is
/// placed by the master), or a resume after its master died (its processes placed anew).
#[derive(Clone, Debug, PartialEq)]
enum Launch {
    Start(BTreeMap<vocab::Role, Vec<String>>),
    Resume,
}

/// A job master process that ended, as the reaper saw it.
#[derive(Debug)]
pub struct Exited {
    pub job: JobId,
    pub status: String,
    pub success: bool,
}

pub struct Launcher {
    config: LauncherConfig,
    /// `config.sandbox` with the brain's own directories hidden, as the job masters get it.
    sandbox: vocab::sandbox::Sandbox,
    runs_dir: PathBuf,
    brain_url: String,
    max_processes: u32,
    /// Run the jobs' processes on this Ray cluster.
    ray_address: Option<String>,
    /// With [`JobMasters::Ray`]: the cluster the masters are submitted to.
    ray_masters: Option<RayApi>,
    exited: mpsc::Sender<Exited>,
    /// The nodes cordoned as the brain last read them: the masters it starts are told
    /// (`--cordoned`), so that no process of theirs starts there.
    cordoned: std::sync::RwLock<Vec<String>>,
    /// The GPU shares each job's processes hold, device by device, as the brain last read
    /// them: a master it starts is told those of the other jobs (`--gpus-held`), to count
    /// with its own (a resumed master's own are its processes').
    devices: std::sync::RwLock<BTreeMap<JobId, vocab::devices::DeviceUse>>,
    /// How long a master's writes of its job's state may fail before its job fails, as the
    /// policy last said (`[live] state_write_give_up_s`), seconds.
    state_write_give_up_s: std::sync::atomic::AtomicU64,
}

/// How often the status of a job master running as a Ray job is read.
const RAY_POLL: Duration = Duration::from_secs(1);

impl Launcher {
    /// Fails when job masters are to run on Ray and the brain has no Ray cluster.
    pub fn new(
        config: LauncherConfig,
        runs_dir: PathBuf,
        data_dir: Option<PathBuf>,
        brain_url: String,
        max_processes: u32,
        ray_address: Option<String>,
        exited: mpsc::Sender<Exited>,
    ) -> Result<Launcher, BrainError> {
        let ray_masters = match (&config.job_masters, &ray_address) {
            (JobMasters::Local, _) => None,
            (JobMasters::Ray { .. }, Some(a)) => Some(
                RayApi::new(a)
                    .map_err(|e| BrainError::Config(format!("cluster.ray_address: {e}")))?,
            ),
            (JobMasters::Ray { .. }, None) => {
                return Err(BrainError::Config(
                    "launcher.job_masters is ray, but the brain has no Ray cluster: set \
                     cluster.ray_address (--ray-address)"
                        .into(),
                ));
            }
        };
        let mut sandbox = config.sandbox.clone();
        sandbox.hide.push(runs_dir.clone());
        sandbox.hide.extend(data_dir);
        Ok(Launcher {
            sandbox,
            config,
            runs_dir,
            brain_url,
            max_processes,
            ray_address,
            ray_masters,
            exited,
            cordoned: std::sync::RwLock::default(),
            devices: std::sync::RwLock::default(),
            state_write_give_up_s: optimizer::live::LiveConfig::default()
                .state_write_give_up_s
                .into(),
        })
    }

    /// The policy's `[live] state_write_give_up_s`, for the masters started from now on (the
    /// brain's control sets it with each policy it puts in force).
    pub fn set_state_write_give_up(&self, seconds: u64) {
        self.state_write_give_up_s
            .store(seconds, std::sync::atomic::Ordering::Relaxed);
    }

    /// The nodes cordoned now, for the masters started from now on.
    pub fn set_cordoned(&self, nodes: Vec<String>) {
        *self.cordoned.write().expect("not poisoned") = nodes;
    }

    /// The GPU shares each job holds now, for the masters started from now on.
    pub fn set_devices(&self, held: BTreeMap<JobId, vocab::devices::DeviceUse>) {
        *self.devices.write().expect("not poisoned") = held;
    }

    /// The GPU shares the jobs but `job` hold, as the brain last read them.
    fn others_devices(&self, job: JobId) -> vocab::devices::DeviceUse {
        let mut others = vocab::devices::DeviceUse::default();
        for (_, held) in self
            .devices
            .read()
            .expect("not poisoned")
            .iter()
            .filter(|(id, _)| **id != job)
        {
            others.merge(held);
        }
        others
    }

    fn job_master_bin(&self) -> PathBuf {
        self.config.job_master_bin.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("job-master")))
                .unwrap_or_else(|| PathBuf::from("job-master"))
        })
    }

    /// The sandbox the job masters hand their agents, as [`vocab::sandbox::SANDBOX_ENV`] says it.
    fn sandbox_json(&self) -> Result<String, BrainError> {
        serde_json::to_string(&self.sandbox)
            .map_err(|e| BrainError::Internal(format!("the sandbox: {e}")))
    }

    /// Why jobs cannot run here now, if they cannot: their sandbox is not available
    /// (bubblewrap missing) or their user unknown. Every job's processes run in it, the
    /// built-in workload's as a `command:`'s.
    pub fn jobs_refused(&self) -> Option<String> {
        let s = &self.config.sandbox;
        if let Some(name) = &s.run_as
            && let Err(e) = run_as_user(name)
        {
            return Some(e);
        }
        if let Some(name) = &s.run_as
            && s.isolation == vocab::sandbox::Isolation::None
        {
            // Without the sandbox's bind mounts the job's user would have to traverse the
            // brain's own directories (mode 0700) to reach its secrets and checkpoints.
            return Some(format!(
                "jobs run as {name} with isolation = \"none\" could not reach their secrets \
                 and checkpoint directories, which lie in the brain's private runs directory: \
                 use bubblewrap (isolation = \"bwrap\", the default), or run the brain as the \
                 user its jobs should run as, without run_as"
            ));
        }
        (s.isolation == vocab::sandbox::Isolation::Bwrap
            && vocab::spec::host::resolve_program("bwrap").is_none())
        .then(|| {
            "jobs run in a sandbox (bubblewrap), which is not installed on the brain's \
             machine: install it (Debian: apt-get install bubblewrap), or set \
             [launcher.sandbox] isolation = \"none\" on a cluster you trust"
                .to_string()
        })
    }

    /// The run directory of a job.
    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.runs_dir.join(name)
    }

    /// Writes the job's spec with `workers` workers and starts its master, told the `nodes`
    /// the round placed its processes on (by role as the job names them, each role's from
    /// index 0). Returns the run directory.
    pub async fn start(
        &self,
        job: JobId,
        spec: &JobSpec,
        (workers, nodes): (u32, BTreeMap<vocab::Role, Vec<String>>),
        token: &auth::Token,
    ) -> Result<PathBuf, BrainError> {
        let run_dir = self.run_dir(&spec.name);
        // Made at submission; a link planted at either path is refused, never followed.
        vocab::paths::make_dir(&run_dir)?;
        vocab::paths::make_dir(&run_dir.join("master"))?;
        // The master's credential with the brain: an owner-only file beside (not in) the
        // master's run directory, whose path goes in argv. The job's own processes never get
        // it: they hold the job's secret, which the master makes for them, and which the brain
        // does not take.
        auth::write_secret(&credential_file(&run_dir), token)
            .map_err(|e| BrainError::Internal(e.to_string()))?;
        let mut spec = spec.clone();
        let trainer = spec.training_role();
        if let Some(w) = spec.roles.get_mut(&trainer) {
            w.replicas = Some(workers as i64);
        }
        // On the brain's Ray cluster unless the job names a platform of its own.
        if let (Some(address), None) = (&self.ray_address, &spec.platform) {
            spec.platform = Some(vocab::spec::PlatformConfig::Ray {
                address: address.clone(),
                agent_bin: self.config.agent_bin.clone(),
                max_processes: Some(self.max_processes),
                place_timeout_ms: None,
                env: Default::default(),
            });
        }
        let text = serde_norway::to_string(&spec)
            .map_err(|e| BrainError::Internal(format!("writing the spec of {job}: {e}")))?;
        vocab::paths::write_new(&run_dir.join("spec.yaml"), text.as_bytes())?;
        self.spawn(job, &run_dir, &Launch::Start(nodes)).await?;
        Ok(run_dir)
    }

    /// Starts a new master on the unfinished job in `run_dir` after its master died
    /// (`job-master run --resume`: every process anew from the latest checkpoint).
    pub async fn resume(&self, job: JobId, run_dir: &Path) -> Result<(), BrainError> {
        self.spawn(job, run_dir, &Launch::Resume).await
    }

    /// Whether the master of the job in `run_dir` left it unfinished: its persisted context
    /// says so and there is no report.
    pub fn left_unfinished(run_dir: &Path) -> bool {
        vocab::run_dir::left_unfinished(&run_dir.join("master"))
    }

    /// `job-master run` on the job in `run_dir`, binary first.
    fn command(&self, job: JobId, run_dir: &Path, how: &Launch) -> Vec<std::ffi::OsString> {
        let mut cmd: Vec<std::ffi::OsString> = vec![
            self.job_master_bin().into(),
            "run".into(),
            run_dir.join("spec.yaml").into(),
            "--run-dir".into(),
            run_dir.join("master").into(),
            "--brain".into(),
            self.brain_url.clone().into(),
            "--max-processes".into(),
            self.max_processes.to_string().into(),
            "--brain-token-file".into(),
            credential_file(run_dir).into(),
        ];
        if self.config.tls.is_none() {
            cmd.push("--brain-insecure".into());
        }
        if let Some(tls) = &self.config.tls {
            cmd.extend(["--brain-ca".into(), tls.ca_file.clone().into()]);
            if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
                cmd.extend([
                    "--brain-cert".into(),
                    cert.into(),
                    "--brain-key".into(),
                    key.into(),
                ]);
            }
        }
        cmd.push(
            if self.config.job_tls.unwrap_or(self.config.tls.is_some()) {
                "--job-tls"
            } else {
                "--job-insecure"
            }
            .into(),
        );
        let give_up_s = self
            .state_write_give_up_s
            .load(std::sync::atomic::Ordering::Relaxed);
        cmd.extend([
            "--persist-give-up-ms".into(),
            (give_up_s * 1000).to_string().into(),
        ]);
        cmd.extend(self.config.job_master_args.iter().map(Into::into));
        if let Some(agent) = &self.config.agent_bin {
            cmd.extend(["--agent-bin".into(), agent.into()]);
        }
        match how {
            Launch::Resume => cmd.push("--resume".into()),
            Launch::Start(nodes) => {
                for (role, on) in nodes.iter().filter(|(_, on)| !on.is_empty()) {
                    cmd.extend([
                        "--start-nodes".into(),
                        format!("{role}={}", on.join(",")).into(),
                    ]);
                }
            }
        }
        for node in self.cordoned.read().expect("not poisoned").iter() {
            cmd.extend(["--cordoned".into(), node.into()]);
        }
        // Those of the other jobs: a job resumed counts its own from its processes.
        for held in self.others_devices(job).named() {
            cmd.extend(["--gpus-held".into(), held.into()]);
        }
        cmd
    }

    async fn spawn(&self, job: JobId, run_dir: &Path, how: &Launch) -> Result<(), BrainError> {
        match (&self.config.job_masters, &self.ray_masters) {
            (JobMasters::Ray { resources }, Some(api)) => {
                self.submit(api, resources, job, run_dir, how).await
            }
            _ => self.spawn_local(job, run_dir, how),
        }
    }

    fn spawn_local(&self, job: JobId, run_dir: &Path, how: &Launch) -> Result<(), BrainError> {
        let log = vocab::paths::create(&run_dir.join("job-master.log"), true)?;
        let command = self.command(job, run_dir, how);
        let bin = PathBuf::from(&command[0]);
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.args(&command[1..])
            // The platform is the spec's, as the brain wrote it: not one the brain's own
            // environment names for `job-master run --ray-address`.
            .env_remove("BRAIN_RAY_ADDRESS")
            .env(vocab::sandbox::SANDBOX_ENV, self.sandbox_json()?)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut child = cmd
            .spawn()
            .map_err(|e| BrainError::Internal(format!("cannot start {}: {e}", bin.display())))?;
        // For a brain started again after this one: which process to follow.
        match child.id().and_then(MasterProcess::of) {
            Some(p) => {
                if let Err(e) = p.write(run_dir) {
                    tracing::warn!(%job, "cannot record its job master's pid: {e}");
                }
            }
            None => tracing::warn!(%job, "its job master ended as it started"),
        }
        self.reap(job, async move {
            match child.wait().await {
                Ok(s) => (s.to_string(), s.success()),
                Err(e) => (format!("cannot wait: {e}"), false),
            }
        });
        Ok(())
    }

    /// A task that waits for a master's end (`ended`: how it ended, whether it succeeded) and
    /// reports it.
    fn reap(&self, job: JobId, ended: impl Future<Output = (String, bool)> + Send + 'static) {
        let exited = self.exited.clone();
        tokio::spawn(async move {
            let (status, success) = ended.await;
            let _ = exited
                .send(Exited {
                    job,
                    status,
                    success,
                })
                .await;
        });
    }

    /// Submits the master as a Ray job (its entrypoint `exec`s `job-master run`, listening on
    /// every interface of the node Ray picks and advertising the node's address on its route
    /// to the brain) and follows it to its end. Its output is Ray's job log, copied into the
    /// run directory's `job-master.log` when it ends.
    async fn submit(
        &self,
        api: &RayApi,
        resources: &BTreeMap<String, f64>,
        job: JobId,
        run_dir: &Path,
        how: &Launch,
    ) -> Result<(), BrainError> {
        // A master no node can take would wait in Ray unseen: refused here, with the nodes.
        if !resources.is_empty()
            && let Ok(cluster) = api.cluster().await
            && !cluster.nodes.iter().any(|n| {
                resources
                    .iter()
                    .all(|(k, v)| n.total.custom.get(k).is_some_and(|have| have >= v))
            })
        {
            return Err(BrainError::Config(format!(
                "launcher.job_masters: no alive node of the Ray cluster at {} declares {} \
                 (declare it with `ray start --resources` on the nodes job masters may use)",
                api.address(),
                resources
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let words: Vec<String> = self
            .command(job, run_dir, how)
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        let command = shlex::try_join(words.iter().map(String::as_str))
            .map_err(|e| BrainError::Internal(format!("quoting the master of {job}: {e}")))?;
        let started_ms = crate::now_unix_ms();
        let id = format!("brain-master-{}-{started_ms}", job.0);
        let mut env: BTreeMap<String, String> = [
            ("BRAIN_JOB_MASTER_LISTEN", "0.0.0.0:0"),
            ("BRAIN_JOB_MASTER_ADVERTISE", "auto"),
            ("NO_COLOR", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        env.insert(vocab::sandbox::SANDBOX_ENV.into(), self.sandbox_json()?);
        for var in ["RUST_LOG", "RUST_BACKTRACE"] {
            if let Ok(v) = std::env::var(var) {
                env.insert(var.into(), v);
            }
        }
        let req = SubmitRequest {
            // The platform is the spec's, as the brain wrote it: not one the environment Ray's
            // node was started in names (`job-master run` reads BRAIN_RAY_ADDRESS).
            entrypoint: format!("unset BRAIN_RAY_ADDRESS; exec {command}"),
            submission_id: id.clone(),
            entrypoint_num_cpus: 0.0,
            entrypoint_num_gpus: 0.0,
            entrypoint_memory: None,
            entrypoint_resources: resources.clone(),
            runtime_env: RuntimeEnv { env_vars: env },
            metadata: [
                ("brain_job".to_string(), job.0.to_string()),
                ("brain_role".to_string(), "job-master".to_string()),
            ]
            .into(),
        };
        // Where a restarted brain finds the master to follow again: recorded before the
        // submission, so that a brain killed right after submitting never leaves a master
        // running that nobody follows (a restarted brain would start a second one on the same
        // run directory). A submission that never happened is "gone from Ray" to the brain
        // that reads it: the master is started again.
        vocab::paths::write_new(&run_dir.join(RAY_SUBMISSION_FILE), id.as_bytes())?;
        // A busy dashboard ("try again later") is asked again for a while.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match api.submit(&req).await {
                Ok(()) => break,
                Err(e) if e.is_transient() && std::time::Instant::now() < deadline => {
                    tracing::warn!(id, "submitting a job master to Ray: {e}; trying again");
                    tokio::time::sleep(RAY_POLL).await;
                }
                Err(e) => {
                    return Err(BrainError::Internal(format!(
                        "submitting the master of {job} to Ray: {e}"
                    )));
                }
            }
        }
        append(
            &run_dir.join("job-master.log"),
            &format!(
                "job master submitted to Ray at {} as {id}{}\n",
                api.address(),
                match how {
                    Launch::Resume => " (resume)",
                    Launch::Start(_) => "",
                }
            ),
        );
        self.follow_ray_job(api, job, run_dir, id);
        Ok(())
    }

    /// After a restart of the brain: follows again the master that an earlier run of the brain
    /// started for the job in `run_dir` (a local process by its recorded pid, or a Ray job), so
    /// that its end is seen and a master that died is resumed: also one that died while no
    /// brain ran, whose end is reported at once. How it is followed (`on Ray`, `by its pid`),
    /// or `None` when there was none to follow.
    pub fn follow_again(&self, job: JobId, run_dir: &Path) -> Option<&'static str> {
        let Some(api) = &self.ray_masters else {
            let master = MasterProcess::read(run_dir)?;
            self.reap(job, async move {
                master.ended(Duration::from_millis(500)).await;
                (
                    format!(
                        "process {} ended, not the brain's child (started by an earlier run \
                         of the brain): its exit status is unknown",
                        master.pid
                    ),
                    false,
                )
            });
            return Some("by its pid");
        };
        match std::fs::read_to_string(run_dir.join(RAY_SUBMISSION_FILE)) {
            Ok(id) if !id.trim().is_empty() => {
                self.follow_ray_job(api, job, run_dir, id.trim().to_string());
                Some("on Ray")
            }
            _ => None,
        }
    }
}

/// The unprivileged user `name` (its uid), or why it cannot be one.
pub fn run_as_user(name: &str) -> Result<u32, String> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) if !u.uid.is_root() => Ok(u.uid.as_raw()),
        Ok(Some(_)) => Err(format!(
            "[launcher.sandbox] run_as: {name:?} is root: jobs run as an unprivileged user"
        )),
        Ok(None) => Err(format!(
            "[launcher.sandbox] run_as: no user named {name:?} on this machine (make one: \
             useradd --system --no-create-home {name})"
        )),
        Err(e) => Err(format!(
            "[launcher.sandbox] run_as: looking up {name:?}: {e}"
        )),
    }
}

/// Refuses a brain that runs as root and would run its jobs as root: `[launcher.sandbox]
/// run_as` must name an unprivileged user who exists.
pub fn check_run_as(config: &LauncherConfig) -> Result<(), BrainError> {
    match &config.sandbox.run_as {
        Some(name) => run_as_user(name).map(drop).map_err(BrainError::Config),
        None if nix::unistd::geteuid().is_root() => Err(BrainError::Config(
            "the brain runs as root and would run its jobs as root: name an unprivileged user \
             for them ([launcher.sandbox] run_as, --run-as USER; make one with `useradd \
             --system --no-create-home brain-job`)"
                .into(),
        )),
        None => Ok(()),
    }
}

/// The file that holds a job master's credential with the brain (mode 0600): `brain.token` in
/// the job's run directory, outside the master's own, and never named to the job's processes.
pub fn credential_file(run_dir: &Path) -> PathBuf {
    run_dir.join("brain.token")
}

/// The job's secret, which its master makes at its first start and its processes hold:
/// `job.token` in the master's run directory. The brain does not take it.
pub fn job_secret_file(run_dir: &Path) -> PathBuf {
    run_dir.join("master").join(auth::JOB_TOKEN_FILE)
}

/// The file in a job's run directory that names its master's latest Ray submission.
pub const RAY_SUBMISSION_FILE: &str = "job-master.ray";

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let r = vocab::paths::create(path, true).and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = r {
        tracing::warn!("{}: {e}", path.display());
    }
}

/// Resolves a relative checkpoint directory of a submitted spec into the job's run directory.
pub fn place_checkpoints(spec: &mut JobSpec, run_dir: &Path) {
    if spec.checkpoint.dir.is_relative() {
        spec.checkpoint.dir = run_dir.join(&spec.checkpoint.dir);
    }
}

mod exposure;
mod ray_follow;
mod reading;
pub use exposure::{RAY_DEFAULT_DASHBOARD, known_dashboards, refuse_open_dashboards};
pub use reading::LogFrom;

#[cfg(test)]
mod tests {
    use super::*;

    /// A job user without the sandbox could not reach its files in the brain's private runs
    /// directory (seen on a GPU machine without bubblewrap): refused, saying what to do.
    #[test]
    fn jobs_run_as_another_user_without_a_sandbox_are_refused_with_the_way_out() {
        let (tx, _rx) = mpsc::channel(1);
        let refused = |run_as: Option<&str>, isolation| {
            let config = LauncherConfig {
                sandbox: vocab::sandbox::Sandbox {
                    run_as: run_as.map(String::from),
                    isolation,
                    ..Default::default()
                },
                ..Default::default()
            };
            Launcher::new(
                config,
                "runs".into(),
                None,
                "http://b:1".into(),
                8,
                None,
                tx.clone(),
            )
            .unwrap()
            .jobs_refused()
        };
        // A user that exists and is not root on every Linux machine.
        let why = refused(Some("nobody"), vocab::sandbox::Isolation::None).unwrap();
        assert!(
            why.contains("nobody") && why.contains("isolation = \"bwrap\""),
            "{why}"
        );
        assert_eq!(refused(None, vocab::sandbox::Isolation::None), None);
    }

    #[test]
    fn job_masters_on_ray_need_the_brains_ray_cluster() {
        let config = LauncherConfig {
            job_masters: JobMasters::Ray {
                resources: Default::default(),
            },
            ..Default::default()
        };
        let (tx, _rx) = mpsc::channel(1);
        let launcher = |ray: Option<&str>| {
            Launcher::new(
                config.clone(),
                "runs".into(),
                None,
                "http://10.0.0.1:50070".into(),
                8,
                ray.map(String::from),
                tx.clone(),
            )
        };
        let e = launcher(None).err().unwrap().to_string();
        assert!(e.contains("cluster.ray_address"), "{e}");
        let l = launcher(Some("http://10.0.0.2:8265")).unwrap();
        assert!(l.ray_masters.is_some());
        // The command a master runs: the run directory's spec, the brain, the policy's state
        // write give-up, --resume on resume, the cordoned nodes and the GPU shares the other
        // jobs hold (its own, resumed, are its processes': counted twice they would hold its
        // room back).
        l.set_cordoned(vec!["10.0.0.3".into()]);
        l.set_state_write_give_up(90);
        let held = |device: &str, milli: u32| {
            let mut held = vocab::devices::DeviceUse::default();
            held.add("10.0.0.4", device, vocab::Gpus::from_milli(milli));
            held
        };
        l.set_devices([(JobId(7), held("1", 700)), (JobId(8), held("0", 400))].into());
        let words: Vec<String> = l
            .command(JobId(7), Path::new("/runs/j"), &Launch::Resume)
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            words[1..],
            [
                "run",
                "/runs/j/spec.yaml",
                "--run-dir",
                "/runs/j/master",
                "--brain",
                "http://10.0.0.1:50070",
                "--max-processes",
                "8",
                "--brain-token-file",
                "/runs/j/brain.token",
                "--brain-insecure",
                "--job-insecure",
                "--persist-give-up-ms",
                "90000",
                "--resume",
                "--cordoned",
                "10.0.0.3",
                "--gpus-held",
                "10.0.0.4:0=400"
            ]
        );
        // A start: the nodes the round placed its processes on, role by role, no --resume.
        let rollout = vocab::Role::new("rollout").unwrap();
        let nodes = [
            (
                vocab::Role::WORKER,
                vec!["10.0.0.2".into(), "10.0.0.4".into()],
            ),
            (rollout, vec!["10.0.0.2".to_string()]),
            (vocab::Role::PS, Vec::new()),
        ];
        let words: Vec<String> = l
            .command(JobId(7), Path::new("/runs/j"), &Launch::Start(nodes.into()))
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        assert!(!words.iter().any(|w| w == "--resume"), "{words:?}");
        let at = words.iter().position(|w| w == "--start-nodes").unwrap();
        assert_eq!(
            words[at..at + 4],
            [
                "--start-nodes",
                "rollout=10.0.0.2",
                "--start-nodes",
                "worker=10.0.0.2,10.0.0.4"
            ]
        );
        assert_eq!(words.iter().filter(|w| *w == "--start-nodes").count(), 2);
    }

    #[test]
    fn masters_reach_a_brain_over_tls_and_run_their_jobs_with_tls_unless_told_not_to() {
        let (tx, _rx) = mpsc::channel(1);
        let words = |config: LauncherConfig| {
            Launcher::new(
                config,
                "runs".into(),
                None,
                "http://b:1".into(),
                8,
                None,
                tx.clone(),
            )
            .unwrap()
            .command(
                JobId(1),
                Path::new("/runs/j"),
                &Launch::Start(BTreeMap::new()),
            )
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
        };
        let plain = words(LauncherConfig::default());
        assert!(
            !plain
                .iter()
                .any(|w| w.starts_with("--brain-ca") || w == "--job-tls")
        );
        assert!(plain.iter().any(|w| w == "--brain-insecure"));
        assert!(plain.iter().any(|w| w == "--job-insecure"));
        let tls = LauncherConfig {
            tls: Some(auth::tls::ClientTls::in_dir(Path::new("/certs"))),
            ..Default::default()
        };
        let with = words(tls.clone());
        let at = |w: &str| with.iter().position(|x| x == w);
        assert_eq!(with[at("--brain-ca").unwrap() + 1], "/certs/ca.pem");
        assert_eq!(with[at("--brain-cert").unwrap() + 1], "/certs/client.pem");
        assert!(at("--job-tls").is_some());
        let without = words(LauncherConfig {
            job_tls: Some(false),
            ..tls
        });
        assert!(!without.iter().any(|w| w == "--job-tls"));
        assert!(without.iter().any(|w| w == "--job-insecure"));
    }
}
