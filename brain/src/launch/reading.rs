//! What the brain reads of a job's run directory for its operator: the diagnosis and the events
//! (`job-master diagnose|events` of it, so that the job master's own formatting is the one
//! shown) and a piece of one process's output.

use super::Launcher;
use crate::BrainError;

impl Launcher {
    /// `job-master diagnose` of the job `name`'s master run directory (every event with
    /// `all`), as it prints it.
    pub async fn diagnose(&self, name: &str, all: bool) -> Result<String, BrainError> {
        let all = if all { &["--all"][..] } else { &[] };
        self.read_run_dir(name, "diagnose", "to diagnose", all)
            .await
    }

    /// `job-master events` of the job `name`'s master run directory: every event, one a line.
    pub async fn events(&self, name: &str) -> Result<String, BrainError> {
        self.read_run_dir(name, "events", "to show", &[]).await
    }

    /// What `job-master TOOL MASTER_DIR ARGS` prints of job `name` (the brain's own run
    /// directory of it, never a path a caller names); `nothing` says what there is not yet.
    async fn read_run_dir(
        &self,
        name: &str,
        tool: &str,
        nothing: &str,
        args: &[&str],
    ) -> Result<String, BrainError> {
        let dir = self.run_dir(name).join("master");
        if !dir.join(vocab::run_dir::CONTEXT_FILE).is_file() {
            return Err(BrainError::FailedPrecondition(format!(
                "job {name} has nothing {nothing} yet: its master has not written {}",
                dir.join(vocab::run_dir::CONTEXT_FILE).display()
            )));
        }
        let mut cmd = tokio::process::Command::new(self.job_master_bin());
        cmd.arg(tool).arg(&dir).args(args).kill_on_drop(true);
        let out = tokio::time::timeout(std::time::Duration::from_secs(60), cmd.output())
            .await
            .map_err(|_| {
                BrainError::Internal(format!(
                    "job-master {tool} {} took over 60 s",
                    dir.display()
                ))
            })?
            .map_err(|e| BrainError::Internal(format!("job-master {tool}: {e}")))?;
        if !out.status.success() {
            return Err(BrainError::Internal(format!(
                "job-master {tool} {} failed ({}): {}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Up to `max` bytes of `process`'s output in job `name`, from where `from` says into
    /// incarnation `incarnation` (0: the newest; when a newer one exists, it is read from its
    /// start): the file, its incarnation, the text and the next offset.
    pub fn logs(
        &self,
        name: &str,
        process: &str,
        incarnation: u64,
        from: LogFrom,
        max: u64,
    ) -> Result<(vocab::run_dir::ProcessLog, String, u64), BrainError> {
        let dir = self.run_dir(name).join("master");
        let log = vocab::run_dir::newest_log(&dir, process)
            .map_err(|e| BrainError::NotFound(format!("job {name}: {e}")))?;
        let offset = match from {
            LogFrom::Tail(bytes) => {
                let len = std::fs::metadata(&log.path)?.len();
                len.saturating_sub(bytes.min(max))
            }
            LogFrom::Offset(offset) if log.incarnation == incarnation => offset,
            LogFrom::Offset(_) => 0,
        };
        let (text, next) = vocab::run_dir::read_log(&log.path, offset, max)?;
        Ok((log, text, next))
    }
}

/// Where a read of a process's output starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFrom {
    /// This byte of the incarnation asked for.
    Offset(u64),
    /// The newest incarnation's last this many bytes.
    Tail(u64),
}

impl LogFrom {
    /// From a request's `offset` and `tail` (which wins when not 0).
    pub fn new(offset: u64, tail: u64) -> LogFrom {
        if tail > 0 {
            LogFrom::Tail(tail)
        } else {
            LogFrom::Offset(offset)
        }
    }
}
