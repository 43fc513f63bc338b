//! `brainctl scale JOB --workers N --ps M --role NAME=N`: a versioned plan proposed through
//! the brain, which the job's master carries out. The brain first runs its next round on the
//! new size: a plan that round would undo at once (beyond capacity, outside the job's bounds)
//! is refused with the round's reasons unless `--force`; the cool-down it starts is said.

use anyhow::bail;
use proto::service::v1 as pb;

use crate::link::{ask_brain, job_id};

pub fn scale(
    job: &str,
    (workers, ps, roles): (Option<u32>, Option<u32>, &[vocab::role::RoleCount]),
    reason: String,
    force: bool,
    brain: &str,
) -> anyhow::Result<()> {
    let targets = vocab::role::role_targets(workers, ps, roles).map_err(anyhow::Error::msg)?;
    if targets.is_empty() {
        bail!("say what to change: --workers N, --ps M and/or --role NAME=N");
    }
    let roles: Vec<_> = targets
        .into_iter()
        .map(|(role, count)| proto::jobmaster::v1::RoleTarget {
            nodes: Vec::new(),
            role: role.to_string(),
            count,
            resources: None,
        })
        .collect();
    let answer = ask_brain(brain, async |mut c| {
        let id = job_id(&mut c, job).await?;
        Ok(c.propose_plan(pb::ProposePlanRequest {
            job_id: id,
            roles,
            migrations: Vec::new(),
            reason,
            force,
        })
        .await?
        .into_inner())
    })?;
    say!(
        "plan {} proposed for {job}; its job master takes it at its next poll \
         (`brainctl status {job}` shows the plan reached)",
        answer.version
    );
    for note in &answer.notes {
        say!("note: {note}");
    }
    Ok(())
}
