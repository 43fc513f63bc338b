//! An operator's plan tried on the next round before it is proposed ([`Control::preview`]):
//! refused when the round would undo it at once, else the cool-down it starts, said.

use super::Control;
use super::snapshot::solve;
use crate::store::{JobId, PlanCounts};

impl Control {
    /// What the next round would make of running job `job` once `counts` are carried out (an
    /// operator's plan): `Err` with the round's reasons when it would change the job again
    /// at once (beyond the cluster's capacity, outside the job's bounds); else notes for the
    /// operator (the cool-down the plan starts, or one it cuts short). Dispatches nothing.
    pub async fn preview(&self, job: JobId, counts: &PlanCounts) -> Result<Vec<String>, String> {
        let policy = self.policy.read().expect("no panic under the lock").clone();
        let cooldown_s = policy.config.live.cooldown_s;
        let (mut snap, _, _) = self.snapshot().await.map_err(|e| e.to_string())?;
        let now_s = snap.now_s;
        let Some(j) = snap.jobs.iter_mut().find(|j| j.id.0 == job.0) else {
            return Ok(Vec::new());
        };
        let mut notes = Vec::new();
        if let Some(at) = j.last_change_s.filter(|at| now_s - at < cooldown_s) {
            notes.push(format!(
                "{} started or changed size {:.0} s ago, inside the policy's cool-down of {cooldown_s:.0} s \
                 (live.cooldown_s): this plan replaces that change",
                j.name,
                (now_s - at).max(0.0)
            ));
        }
        if let Some(w) = counts.training() {
            j.workers.count = w;
            j.workers.held = w;
            j.workers.peak = j.workers.peak.max(w);
        }
        // The round's snapshot keeps a ps job's PS apart from its other role groups.
        for (role, n) in counts.others() {
            if let Some(r) = j.roles.iter_mut().find(|r| r.role == role) {
                r.count = n;
            } else if role == vocab::Role::PS {
                j.ps.count = n;
            }
        }
        j.last_change_s = Some(now_s);
        j.plan_in_flight = false;
        let name = j.name.clone();
        let (plan, _) = solve(snap, policy).await.map_err(|e| e.to_string())?;
        if let Some(d) = plan
            .decisions
            .iter()
            .find(|d| d.job.0 == job.0 && d.changes())
        {
            return Err(format!(
                "the brain's next round would change {name} again at once, to {} workers{}: {}",
                d.to_workers(),
                if d.to_ps() != d.ps() {
                    format!(" and {} parameter servers", d.to_ps())
                } else {
                    String::new()
                },
                {
                    let mut said: Vec<&str> = Vec::new();
                    for r in &d.reasons {
                        if !said.contains(&r.as_str()) {
                            said.push(r);
                        }
                    }
                    said.join("; ")
                }
            ));
        }
        notes.push(format!(
            "the brain's rounds keep this size for the policy's cool-down of {cooldown_s:.0} s \
             (live.cooldown_s); after it the policy may resize {name} again"
        ));
        Ok(notes)
    }
}
