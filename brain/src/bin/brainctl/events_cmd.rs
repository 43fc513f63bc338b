//! `brainctl events JOB`: every event of a job, one a line (seconds since its start, kind,
//! text), as its master recorded them.

use proto::service::v1 as pb;

use crate::link::{ask_brain, job_id};

pub fn events(job: &str, brain: &str) -> anyhow::Result<()> {
    let text = ask_brain(brain, async |mut c| {
        let job_id = job_id(&mut c, job).await?;
        Ok(c.job_events(pb::JobEventsRequest { job_id })
            .await?
            .into_inner()
            .text)
    })?;
    print!("{}", vocab::text::printable(&text));
    Ok(())
}
