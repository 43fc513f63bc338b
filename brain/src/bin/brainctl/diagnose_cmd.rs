//! `brainctl diagnose JOB`: what went wrong in one job and what it cost, as the brain's
//! `job-master diagnose` of its run directory prints it.

use proto::service::v1 as pb;

use crate::link::{ask_brain, job_id};

pub fn diagnose(job: &str, all: bool, brain: &str) -> anyhow::Result<()> {
    let text = ask_brain(brain, async |mut c| {
        let job_id = job_id(&mut c, job).await?;
        Ok(c.diagnose(pb::DiagnoseRequest { job_id, all })
            .await?
            .into_inner()
            .text)
    })?;
    print!("{}", vocab::text::printable(&text));
    Ok(())
}
