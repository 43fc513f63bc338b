//! What the job master's status and reports show of the job: its status as `GetStatus`
//! answers it, and the wire forms of its processes' samples and its roles' rates.

use proto::jobmaster::v1 as pb;

use crate::job::{JobContext, Sample, SlotPhase};

impl From<&Sample> for pb::ResourceSample {
    fn from(x: &Sample) -> pb::ResourceSample {
        pb::ResourceSample {
            cpu_millicores: x.cpu_millicores,
            rss_bytes: x.rss_bytes,
            gpu_present: x.gpu_present,
            gpu_utilization_percent: x.gpu_utilization_percent,
            gpu_memory_used_bytes: x.gpu_memory_used_bytes,
        }
    }
}

impl From<&crate::job::RoleRate> for pb::RoleRate {
    fn from(r: &crate::job::RoleRate) -> pb::RoleRate {
        pb::RoleRate {
            role: r.role.to_string(),
            processes: r.processes,
            served_per_s: r.served_per_s,
            busy_share: r.busy_share,
            callers_wait_share: r.callers_wait_share,
            callers: r.callers,
            caller_waits: r
                .by_caller
                .iter()
                .map(|(role, wait_share, callers)| pb::CallerWait {
                    role: role.to_string(),
                    wait_share: *wait_share,
                    callers: *callers,
                })
                .collect(),
            training_wait_share: 0.0,
        }
    }
}

/// The job's role rates now, as the wire carries them, each with its training group's wait.
pub(crate) fn role_rates(ctx: &JobContext, now_ms: u64) -> Vec<pb::RoleRate> {
    let trainer = ctx.trainer();
    ctx.calls
        .rates(now_ms)
        .iter()
        .map(|r| pb::RoleRate {
            training_wait_share: r
                .by_caller
                .iter()
                .filter(|(role, _, _)| *role == trainer)
                .map(|(_, share, _)| *share)
                .fold(0.0, f64::max),
            ..pb::RoleRate::from(r)
        })
        .collect()
}

/// The job's status now (`GetStatus`); `prechecking`: how long the pre-run check has run,
/// while it does.
pub(super) fn job_status(
    ctx: &JobContext,
    now_ms: u64,
    prechecking: Option<std::time::Duration>,
) -> pb::JobStatus {
    let (global_step, samples_per_second, loss) = ctx.progress();
    let effective = ctx.effective_training(now_ms);
    pb::JobStatus {
        phase: ctx.phase.name().to_string(),
        reason: ctx.phase.reason().unwrap_or_default().to_string(),
        global_step,
        samples_per_second,
        loss,
        epoch: ctx.ledger.current_epoch(),
        shards_done: ctx.ledger.done_shards(),
        shards_total: ctx.ledger.total_shards(),
        processes: ctx
            .all_slots()
            .map(|s| pb::ProcessStatus {
                role: s.key.role.to_string(),
                index: s.key.index,
                incarnation: s.incarnation,
                // Launching: "pending" until the platform has placed it.
                state: if s.phase == SlotPhase::Launching && !s.placed {
                    "pending".to_string()
                } else {
                    format!("{:?}", s.phase).to_lowercase()
                },
                restarts: s.restart_count as u32,
                sample: s.sample.as_ref().map(pb::ResourceSample::from),
                pid: s.process_pid,
                host: s.host.clone(),
                devices: s.devices.clone(),
                resources: ctx
                    .launch_resources(s.key)
                    .as_ref()
                    .map(pb::Resources::from),
                step_compute_ms: ctx.step_compute_ms(s.key, s.incarnation).unwrap_or(0.0),
                straggler_ratio: ctx
                    .stability
                    .stragglers
                    .get(&s.key)
                    .map_or(0.0, |x| x.ratio()),
            })
            .collect(),
        rendezvous_round: ctx
            .group
            .rendezvous()
            .map(|r| r.next_round_number())
            .unwrap_or(0),
        final_eval_loss: ctx.final_eval_loss,
        checkpoints: ctx.committed_checkpoints() as u32,
        desired_plan_version: ctx.plans.desired,
        reached_plan_version: ctx.plans.reached,
        transition: match prechecking {
            Some(took) => format!(
                "pre-run check under way for {} s: nothing is launched until it ends",
                took.as_secs()
            ),
            None => ctx.transition_status(now_ms),
        },
        role_rates: role_rates(ctx, now_ms),
        hangs: ctx.stability.hangs.len() as u32,
        training_ms: effective.training_ms,
        lost_training_ms: effective.lost_ms,
        wall_ms: effective.wall_ms,
        role_checkpoints: ctx
            .roles
            .services()
            .filter_map(|(role, g)| {
                let c = g.checkpoint.as_ref()?;
                Some(pb::RoleCheckpointStatus {
                    role: role.to_string(),
                    step: c.step,
                    path: c.path.display().to_string(),
                    at_ms: c.at_ms,
                    index: c.index,
                })
            })
            .collect(),
        role_groups: role_groups(ctx),
    }
}

/// Each role group's desired and observed size, the training group's roles first.
fn role_groups(ctx: &JobContext) -> Vec<pb::RoleGroupStatus> {
    ctx.roles
        .training()
        .chain(ctx.roles.services())
        .map(|(role, g)| pb::RoleGroupStatus {
            role: role.to_string(),
            topology: ctx.spec.topology(role).to_string(),
            training: g.training,
            desired: g.desired,
            live: g.live(),
            running: g
                .slots
                .values()
                .filter(|s| s.phase == SlotPhase::Running)
                .count() as u32,
            restarts: g.restarts,
        })
        .collect()
}
