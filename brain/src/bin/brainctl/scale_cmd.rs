//! `brainctl scale JOB --workers N --ps M --role NAME=N`: a versioned plan proposed through
//! the brain, which the job's master carries out.

use anyhow::bail;
use proto::service::v1 as pb;

use crate::link::{ask_brain, job_id};

pub fn scale(
    job: &str,
    workers: Option<u32>,
    ps: Option<u32>,
    roles: &[vocab::role::RoleCount],
    reason: String,
    brain: &str,
) -> anyhow::Result<()> {
    let targets = vocab::role::role_targets(workers, ps, roles).map_err(anyhow::Error::msg)?;
    if targets.is_empty() {
        bail!("say what to change: --workers N, --ps M and/or --role NAME=N");
    }
    let roles: Vec<_> = targets
        .into_iter()
        .map(|(role, count)| proto::jobmaster::v1::RoleTarget {
            role: role.to_string(),
            count,
            resources: None,
        })
        .collect();
    let version = ask_brain(brain, async |mut c| {
        let id = job_id(&mut c, job).await?;
        Ok(c.propose_plan(pb::ProposePlanRequest {
            job_id: id,
            roles,
            migrations: Vec::new(),
            reason,
        })
        .await?
        .into_inner()
        .version)
    })?;
    println!(
        "plan {version} proposed for {job}; its job master takes it at its next poll \
         (`brainctl status {job}` shows the plan reached)"
    );
    Ok(())
}
