//! `brainctl cancel JOB`: a queued job never starts; a running one takes a last checkpoint and
//! stops.

use proto::service::v1 as pb;

use crate::link::{ask_brain, job_id};

pub fn cancel(job: &str, reason: String, brain: &str) -> anyhow::Result<()> {
    let state = ask_brain(brain, async |mut c| {
        let id = job_id(&mut c, job).await?;
        Ok(c.cancel_job(pb::CancelJobRequest { job_id: id, reason })
            .await?
            .into_inner()
            .state)
    })?;
    if state == "cancelled" {
        say!("{job} cancelled before it started");
    } else {
        say!(
            "{job} is being cancelled: its job master takes a last checkpoint and stops \
             every process at its next poll (`brainctl status {job}` shows it end)"
        );
    }
    Ok(())
}
