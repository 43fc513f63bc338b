//! Starting a submitted job's master as a local process: the spec the brain filled in is
//! written to the job's run directory with the worker count the round decided, and
//! `job-master run` is started on it with `--brain` pointing back here. The child is reaped by
//! a task that reports its exit; a job master outlives a brain that is killed (it keeps
//! training and reconnects), so a restarted brain learns of it when it registers again. A job
//! master that dies before its job ended is started again on the same run directory with
//! `--resume` (see `Control::exited`).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use vocab::{JobSpec, Role};

use crate::BrainError;
use crate::store::JobId;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LauncherConfig {
    /// The `job-master` binary [default: next to the running binary].
    #[serde(default)]
    pub job_master_bin: Option<PathBuf>,
    /// The `worker-agent` binary job masters start [default: next to `job-master`].
    #[serde(default)]
    pub agent_bin: Option<PathBuf>,
    /// Extra arguments for `job-master run` (e.g. timing flags).
    #[serde(default)]
    pub job_master_args: Vec<String>,
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
    runs_dir: PathBuf,
    brain_url: String,
    max_processes: u32,
    /// Run the jobs' processes on this Ray cluster.
    ray_address: Option<String>,
    exited: mpsc::UnboundedSender<Exited>,
}

impl Launcher {
    pub fn new(
        config: LauncherConfig,
        runs_dir: PathBuf,
        brain_url: String,
        max_processes: u32,
        ray_address: Option<String>,
        exited: mpsc::UnboundedSender<Exited>,
    ) -> Launcher {
        Launcher {
            config,
            runs_dir,
            brain_url,
            max_processes,
            ray_address,
            exited,
        }
    }

    fn job_master_bin(&self) -> PathBuf {
        self.config.job_master_bin.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("job-master")))
                .unwrap_or_else(|| PathBuf::from("job-master"))
        })
    }

    /// The run directory of a job.
    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.runs_dir.join(name)
    }

    /// Writes the job's spec with `workers` workers and starts its master. Returns the run
    /// directory.
    pub fn start(&self, job: JobId, spec: &JobSpec, workers: u32) -> Result<PathBuf, BrainError> {
        let run_dir = self.run_dir(&spec.name);
        std::fs::create_dir_all(&run_dir)?;
        let mut spec = spec.clone();
        if let Some(w) = spec.roles.get_mut(&Role::Worker) {
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
        std::fs::write(run_dir.join("spec.yaml"), text)?;
        self.spawn(job, &run_dir, false)?;
        Ok(run_dir)
    }

    /// Starts a new master on the unfinished job in `run_dir` after its master died
    /// (`job-master run --resume`: every process anew from the latest checkpoint).
    pub fn resume(&self, job: JobId, run_dir: &Path) -> Result<(), BrainError> {
        self.spawn(job, run_dir, true)
    }

    /// Whether the master of the job in `run_dir` left it unfinished: its persisted context
    /// says so and there is no report.
    pub fn left_unfinished(run_dir: &Path) -> bool {
        vocab::run_dir::left_unfinished(&run_dir.join("master"))
    }

    fn spawn(&self, job: JobId, run_dir: &Path, resume: bool) -> Result<(), BrainError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run_dir.join("job-master.log"))?;
        let bin = self.job_master_bin();
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.arg("run")
            .arg(run_dir.join("spec.yaml"))
            .arg("--run-dir")
            .arg(run_dir.join("master"))
            .arg("--brain")
            .arg(&self.brain_url)
            .arg("--max-processes")
            .arg(self.max_processes.to_string())
            .args(&self.config.job_master_args)
            // The platform is the spec's, as the brain wrote it: not one the brain's own
            // environment names for `job-master run --ray-address`.
            .env_remove("BRAIN_RAY_ADDRESS")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(agent) = &self.config.agent_bin {
            cmd.arg("--agent-bin").arg(agent);
        }
        if resume {
            cmd.arg("--resume");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| BrainError::Internal(format!("cannot start {}: {e}", bin.display())))?;
        let exited = self.exited.clone();
        tokio::spawn(async move {
            let (status, success) = match child.wait().await {
                Ok(s) => (s.to_string(), s.success()),
                Err(e) => (format!("cannot wait: {e}"), false),
            };
            let _ = exited.send(Exited {
                job,
                status,
                success,
            });
        });
        Ok(())
    }
}

/// Resolves a relative checkpoint directory of a submitted spec into the job's run directory.
pub fn place_checkpoints(spec: &mut JobSpec, run_dir: &Path) {
    if spec.checkpoint.dir.is_relative() {
        spec.checkpoint.dir = run_dir.join(&spec.checkpoint.dir);
    }
}
