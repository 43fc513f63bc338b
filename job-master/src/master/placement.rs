//! A job's `placement:` as the platforms take it: refused where one machine cannot hold it
//! (local processes), and as the Ray platform lays its groups out, where the brain's round
//! placed a start's processes first.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::spec::JobSpec;

/// Refuses a placement one machine cannot hold: local processes all share it, so `pack`,
/// `strict_pack` and `spread` hold trivially, and `strict_spread` of two or more (at the
/// roles' `max`) does not.
pub(super) fn local_placement(spec: &JobSpec) -> Result<(), Error> {
    for g in &spec.placement {
        let n: u32 = g
            .roles
            .iter()
            .map(|r| spec.role_plan(*r).map_or(0, |p| p.max))
            .sum();
        if g.strategy == vocab::spec::Strategy::StrictSpread && n > 1 {
            return Err(Error::InvalidRequest(format!(
                "placement group {} is strict_spread over up to {n} processes, but local \
                 processes all run on this one machine: run the job on a cluster (--platform \
                 ray), or use spread",
                g.name()
            )));
        }
    }
    Ok(())
}

/// The job's placement groups as the Ray platform reserves them: each process's bundle asks
/// for what its role's spec gives it; their first processes go where the brain's round placed
/// them (`named`, a start's nodes by role, each role's from index 0) where they hold there.
pub(super) fn placement_plans(
    spec: &JobSpec,
    named: &BTreeMap<vocab::Role, Vec<String>>,
) -> Vec<crate::platform::ray::GroupPlan> {
    spec.placement
        .iter()
        .map(|g| crate::platform::ray::GroupPlan {
            name: g.name(),
            strategy: g.strategy,
            share_devices: g.share_devices,
            roles: g
                .roles
                .iter()
                .map(|role| {
                    let r = spec.roles.get(role).and_then(|r| r.resources.as_ref());
                    (*role, crate::platform::ray::request_of(r))
                })
                .collect(),
            initial: spec
                .bundles(g)
                .into_iter()
                .map(|(role, index)| vocab::SlotKey { role, index })
                .collect(),
            named: g
                .roles
                .iter()
                .filter_map(|role| Some((*role, named.get(role)?)))
                .flat_map(|(role, on)| {
                    (0..)
                        .zip(on)
                        .map(move |(index, ip)| (vocab::SlotKey { role, index }, ip.clone()))
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(strategy: &str, rollouts: u32) -> JobSpec {
        JobSpec::from_yaml(&format!(
            "name: p\nkind: allreduce\nroles:\n  worker: {{ replicas: 1 }}\n  \
             rollout: {{ replicas: {rollouts}, topology: service, command: [/bin/true], \
             resources: {{ cpu: 2 }} }}\nworkload: {{ builtin: {{}} }}\n\
             data: {{ num_samples: 10, shard_size: 1 }}\ncheckpoint: {{ dir: /tmp/p }}\n\
             placement:\n  - {{ roles: [rollout], strategy: {strategy} }}\n"
        ))
        .unwrap()
    }

    #[test]
    fn one_machine_holds_every_placement_but_a_strict_spread_of_several() {
        for s in ["strict_pack", "pack", "spread"] {
            assert!(local_placement(&placed(s, 3)).is_ok(), "{s}");
        }
        assert!(local_placement(&placed("strict_spread", 1)).is_ok());
        let e = local_placement(&placed("strict_spread", 2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("strict_spread over up to 2 processes") && e.contains("--platform ray"),
            "{e}"
        );
        // The Ray platform's bundles: each process asks for its role's resources.
        let rollout: vocab::Role = "rollout".parse().unwrap();
        let named = [(rollout, vec!["10.0.0.2".to_string(), "10.0.0.3".into()])].into();
        let plans = placement_plans(&placed("strict_spread", 2), &named);
        assert_eq!(plans.len(), 1);
        // Where the brain's round placed them, by process.
        assert_eq!(
            plans[0]
                .named
                .iter()
                .map(|(k, ip)| format!("{k} {ip}"))
                .collect::<Vec<_>>(),
            vec!["rollout-0 10.0.0.2", "rollout-1 10.0.0.3"]
        );
        assert_eq!(plans[0].name, "rollout");
        assert_eq!(plans[0].roles[&rollout].cpus, 2.0);
        assert_eq!(
            plans[0]
                .initial
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>(),
            vec!["rollout-0", "rollout-1"]
        );
    }
}
