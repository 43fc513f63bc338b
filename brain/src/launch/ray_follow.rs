//! Following a job master that runs as a Ray job: to its end, its log copied into the run
//! directory, a dashboard that does not answer asked again.

use std::path::Path;

use ray_client::{RayApi, RayJobStatus};

use super::{Launcher, RAY_POLL, append};
use crate::store::JobId;

impl Launcher {
    /// A task that follows the master's Ray job `id` to its end, copies its log into the run
    /// directory's `job-master.log` and reports the end.
    pub(super) fn follow_ray_job(&self, api: &RayApi, job: JobId, run_dir: &Path, id: String) {
        let log = run_dir.join("job-master.log");
        let api = api.clone();
        self.reap(job, async move {
            let ended = follow(&api, &id).await;
            match api.logs(&id).await {
                Ok(out) => append(&log, &format!("--- Ray's log of {id} ---\n{out}")),
                Err(e) => append(&log, &format!("Ray's log of {id} could not be read: {e}\n")),
            }
            ended
        });
    }
}

/// Follows a job master's Ray job to its end: how it ended, and whether it succeeded. A
/// dashboard that does not answer is said once and asked again: it is not the master ending.
pub(super) async fn follow(api: &RayApi, id: &str) -> (String, bool) {
    let mut unanswered = false;
    loop {
        tokio::time::sleep(RAY_POLL).await;
        match api.job(id).await {
            Ok(Some(info)) if info.status.is_terminal() => {
                let mut said = info.headline(id);
                // Ray's message may go on with the entrypoint's last output: why it ended.
                let lines: Vec<&str> = info
                    .message
                    .as_deref()
                    .unwrap_or_default()
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect();
                if lines.len() > 1 {
                    let tail = &lines[lines.len().saturating_sub(5).max(1)..];
                    said += &format!(" ... {}", tail.join(" | "));
                }
                return (said, info.status == RayJobStatus::Succeeded);
            }
            Ok(Some(_)) => unanswered = false,
            Ok(None) => return (format!("Ray job {id} is gone from Ray"), false),
            Err(e) => {
                if !unanswered {
                    tracing::warn!(id, "reading a job master's Ray job: {e}; asking again");
                }
                unanswered = true;
            }
        }
    }
}
