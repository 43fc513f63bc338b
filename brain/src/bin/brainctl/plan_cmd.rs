//! `brainctl plan --dry-run`: what the brain's next round would decide for every queued and
//! running job, and why, dispatching nothing.

use anyhow::bail;
use proto::service::v1 as pb;

use crate::link::ask_brain;

pub fn plan(dry_run: bool, brain: &str) -> anyhow::Result<()> {
    if !dry_run {
        bail!(
            "the brain dispatches plans itself every round; `brainctl plan --dry-run` \
             shows what the next one would decide"
        );
    }
    let r = ask_brain(brain, async |mut c| {
        Ok(c.dry_run(pb::DryRunRequest {}).await?.into_inner())
    })?;
    say!(
        "scheduler {}: {:.1} of {:.1} CPUs, {} of {} processes after the round (solved in {:.2} ms)",
        r.scheduler,
        r.cpu_millicores as f64 / 1000.0,
        r.capacity_millicores as f64 / 1000.0,
        r.processes,
        r.max_processes,
        r.solve_ms
    );
    for note in &r.notes {
        say!("note: {note}");
    }
    for d in &r.decisions {
        let training = d.roles.iter().find(|c| c.training);
        let (from, to) = training.map_or((0, 0), |c| (c.from, c.to));
        let others_change = d.roles.iter().any(|c| !c.training && c.from != c.to);
        let change = match (d.state == "queued", from == to) {
            (true, _) if to > 0 => "starts",
            (true, _) => "waits",
            (false, true) if others_change || !d.migrations.is_empty() => "corrects",
            (false, true) => "keeps",
            (false, false) => "resizes",
        };
        say!(
            "{:>4} {:<24} {:<8} {change} {} (predicted {:.0} samples/s)",
            d.job_id,
            d.job_name,
            d.state,
            roles_shown(&d.roles),
            d.predicted_samples_per_second
        );
        for m in &d.migrations {
            let r = m.resources.clone().unwrap_or_default();
            say!(
                "       migrates {}-{} to {}m CPU, {} MiB ({})",
                m.role,
                m.index,
                r.cpu_millicores,
                r.memory_bytes >> 20,
                m.reason
            );
        }
        for why in &d.reasons {
            say!("       - {why}");
        }
    }
    Ok(())
}

/// Each role group's count now and after the round: `trainer 2 -> 4, rollout 1 -> 3`, a
/// count that stays shown once (`ps 1`), and the nodes the plan names for the processes it
/// adds (`rollout 1 -> 3 (new on 10.0.0.2, 10.0.0.3)`).
pub fn roles_shown(roles: &[pb::RoleChange]) -> String {
    roles
        .iter()
        .map(|c| {
            let mut s = match c.from == c.to {
                true => format!("{} {}", c.role, c.to),
                false => format!("{} {} -> {}", c.role, c.from, c.to),
            };
            if !c.nodes.is_empty() {
                s += &format!(" (new on {})", c.nodes.join(", "));
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decisions_roles_show_what_changes_and_what_stays() {
        let c = |role: &str, from, to, training| pb::RoleChange {
            role: role.into(),
            from,
            to,
            training,
            nodes: Vec::new(),
        };
        assert_eq!(
            roles_shown(&[
                c("trainer", 2, 4, true),
                c("ps", 1, 1, false),
                c("rollout", 1, 3, false)
            ]),
            "trainer 2 -> 4, ps 1, rollout 1 -> 3"
        );
        assert_eq!(roles_shown(&[]), "");
        // Where the round placed what a growth adds.
        let mut grown = c("rollout", 1, 3, false);
        grown.nodes = vec!["10.0.0.2".into(), "10.0.0.3".into()];
        assert_eq!(
            roles_shown(&[c("trainer", 2, 2, true), grown]),
            "trainer 2, rollout 1 -> 3 (new on 10.0.0.2, 10.0.0.3)"
        );
    }
}
