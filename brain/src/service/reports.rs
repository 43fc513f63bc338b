//! A job master's metric reports on the wire, to the store's [`Metric`]: a report naming no
//! role, or a role that is not a role name, or counting one twice, is refused with the field.

use proto::service::v1 as pb;
use tonic::Status;

use crate::store::{Metric, ProcessSample, SlowNode, StragglerNote};

/// The longest node name a report may give (an address, a host name).
const MAX_HOST_CHARS: usize = 255;
/// The longest list of GPUs kept for one process (a node's device ids, comma-separated).
const MAX_DEVICES_CHARS: usize = 256;

/// The store's metric of report `m`: its `workers` are its training group's count, its `ps`
/// the `ps` role's.
pub(super) fn metric(m: pb::MetricReport) -> Result<Metric, Status> {
    let mut seen = std::collections::BTreeSet::new();
    let (mut workers, mut ps) = (None, 0);
    for c in &m.roles {
        let role = vocab::wire::role(&c.role)
            .map_err(|e| Status::invalid_argument(format!("role count: {}", e.0)))?;
        if !seen.insert(role) {
            return Err(Status::invalid_argument(format!(
                "role count: role {role} is counted twice"
            )));
        }
        if c.training && workers.replace(c.count).is_some() {
            return Err(Status::invalid_argument(
                "role count: two roles are marked the training group".to_string(),
            ));
        }
        if role == vocab::Role::PS && !c.training {
            ps = c.count;
        }
    }
    let processes = m
        .processes
        .iter()
        .map(process_sample)
        .collect::<Result<_, _>>()?;
    let role_rates = m
        .role_rates
        .iter()
        .map(|r| {
            let role = vocab::wire::role(&r.role)
                .map_err(|e| Status::invalid_argument(format!("role rate: {}", e.0)))?;
            Ok::<_, Status>((
                role,
                optimizer::live::RoleRate {
                    served_per_s: r.served_per_s,
                    busy_share: r.busy_share,
                    callers_wait_share: r.callers_wait_share,
                    training_wait_share: r.training_wait_share,
                },
            ))
        })
        .collect::<Result<_, _>>()?;
    let stragglers = m
        .stragglers
        .iter()
        .map(|s| {
            let role = vocab::wire::role(&s.role)
                .map_err(|e| Status::invalid_argument(format!("straggler: {}", e.0)))?;
            Ok::<_, Status>(StragglerNote {
                process: vocab::SlotKey {
                    role,
                    index: s.index,
                },
                host: s.host.clone(),
                ratio: s.ratio,
            })
        })
        .collect::<Result<_, _>>()?;
    let effective = (m.wall_ms > 0).then(|| vocab::report::EffectiveTraining {
        wall_ms: m.wall_ms,
        training_ms: m.training_ms,
        lost_ms: m.lost_training_ms,
        share: m.training_ms as f64 / m.wall_ms as f64,
    });
    let slow_nodes = m
        .faulty_nodes
        .iter()
        .filter(|f| f.straggler)
        .map(|f| SlowNode {
            host: f.host.clone(),
            why: f.why.clone(),
        })
        .collect();
    Ok(Metric {
        at_unix_ms: m.at_unix_ms,
        global_step: m.global_step,
        samples_per_second: m.samples_per_second,
        workers: workers.unwrap_or(0),
        ps,
        cpu_millicores: m.cpu_millicores,
        memory_bytes: m.memory_bytes,
        gpu_utilisation_pct: m.gpu_utilisation_pct,
        samples_done: m.samples_done,
        processes,
        role_rates,
        rates_cover_ms: m.rates_cover_ms,
        rates_window_ms: m.rates_window_ms,
        effective,
        stragglers,
        slow_nodes,
        state_write_failures: m.state_write_failures,
    })
}

/// A process report as the store keeps it; a report without a role is refused.
fn process_sample(p: &pb::ProcessReport) -> Result<ProcessSample, Status> {
    let role = vocab::wire::role(&p.role)
        .map_err(|e| Status::invalid_argument(format!("process {}: {}", p.index, e.0)))?;
    let limits = p.resources.clone().unwrap_or_default();
    Ok(ProcessSample {
        role,
        index: p.index,
        cpu_limit: limits.cpu_millicores,
        memory_limit: limits.memory_bytes,
        gpus: vocab::Gpus::from_milli(limits.gpu_milli),
        cpu_millicores: p.cpu_millicores,
        memory_bytes: p.memory_bytes,
        memory_peak_bytes: p.memory_peak_bytes,
        oom_kills: p.oom_kills,
        pending_ms: p.pending_ms,
        pending_reason: p.pending_reason.clone(),
        gpu_utilisation_pct: p.gpu_utilisation_pct,
        gpu_memory_bytes: p.gpu_memory_bytes,
        host: p.host.chars().take(MAX_HOST_CHARS).collect(),
        devices: p.devices.chars().take(MAX_DEVICES_CHARS).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(role: &str, count: u32, training: bool) -> pb::RoleCount {
        pb::RoleCount {
            role: role.into(),
            count,
            training,
        }
    }

    #[test]
    fn a_reports_role_counts_give_its_training_group_and_ps_or_are_refused_with_why() {
        let with = |roles: Vec<pb::RoleCount>| {
            metric(pb::MetricReport {
                roles,
                ..Default::default()
            })
        };
        let m = with(vec![
            count("worker", 3, true),
            count("ps", 2, false),
            count("rollout", 4, false),
        ])
        .unwrap();
        assert_eq!((m.workers, m.ps), (3, 2));
        // A training group named otherwise.
        let m = with(vec![count("actor", 2, true), count("critic", 1, false)]).unwrap();
        assert_eq!((m.workers, m.ps), (2, 0));
        for (roles, why) in [
            (
                vec![count("worker", 1, true), count("worker", 2, false)],
                "role worker is counted twice",
            ),
            (
                vec![count("worker", 1, true), count("actor", 2, true)],
                "two roles are marked the training group",
            ),
            (vec![count("", 1, true)], "role count"),
        ] {
            let e = with(roles).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(why), "{e:?}");
        }
    }
}
