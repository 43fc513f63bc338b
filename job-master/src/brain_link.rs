//! The job master's side of the brain: register (with the job's shape), report metrics in
//! batches every `report_interval_ms`, poll for a plan above the version the job accepted,
//! carry it out like any plan and acknowledge it, and at the end report how the job ended.
//!
//! The brain may be down or restarting at any time: the job keeps running at its size, the
//! reports wait in a bounded queue (the oldest are dropped past [`MAX_QUEUED`], with a
//! warning) and go in the next batches the brain takes (at most
//! [`proto::MAX_REPORTS_PER_BATCH`] each; a batch over the brain's rate limit waits for a
//! later tick), and registering again finds the same job id (the brain keys jobs by name).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::scale::ScalePlan;
use crate::shared::Shared;
use crate::spec::{JobKind, Role};
use vocab::JobReport;

type Client = pb::brain_client::BrainClient<
    tonic::service::interceptor::InterceptedService<Channel, auth::WithToken>,
>;

/// Reports kept while the brain cannot be reached.
pub const MAX_QUEUED: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrainLink {
    /// The brain's URL, e.g. `http://127.0.0.1:50070`.
    pub url: String,
    /// How often metrics are reported and plans polled.
    #[serde(default = "default_interval")]
    pub report_interval_ms: u64,
    /// How long the job master keeps trying to tell the brain how the job ended.
    #[serde(default = "default_outcome_timeout")]
    pub outcome_timeout_ms: u64,
    /// What authenticates the calls: the job's secret (a master the brain started), or the
    /// operator token until registering returns the job's own (a master started by hand).
    #[serde(skip)]
    pub token: auth::WithToken,
    /// TLS to the brain: the CA its certificate chains to (and this master's certificate, for
    /// mutual TLS).
    #[serde(default)]
    pub tls: Option<auth::tls::ClientTls>,
    /// The nodes the brain had cordoned when it started this master: no process goes there
    /// (later cordons come with its plans).
    #[serde(default)]
    pub cordoned: Vec<String>,
    /// The GPU shares the brain's other jobs held when it started this master, device by
    /// device (later ones come with its plans): counted with the job's own where a process is
    /// placed on Ray.
    #[serde(skip)]
    pub others_devices: vocab::devices::DeviceUse,
    /// Where the brain's round placed the job's processes when it started this master, by
    /// role, each role's from index 0 ([`crate::job::JobContext::start_on`]).
    #[serde(skip)]
    pub start_nodes: std::collections::BTreeMap<vocab::Role, Vec<String>>,
}

fn default_interval() -> u64 {
    1000
}
fn default_outcome_timeout() -> u64 {
    60_000
}

impl BrainLink {
    pub fn new(url: String) -> BrainLink {
        BrainLink {
            url,
            report_interval_ms: default_interval(),
            outcome_timeout_ms: default_outcome_timeout(),
            token: auth::WithToken::default(),
            tls: None,
            cordoned: Vec::new(),
            others_devices: Default::default(),
            start_nodes: Default::default(),
        }
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn connect(link: &BrainLink) -> Option<Client> {
    let tls = match link
        .tls
        .as_ref()
        .map(auth::tls::ClientTls::config)
        .transpose()
    {
        Ok(tls) => tls,
        Err(e) => {
            tracing::warn!("cannot reach the brain at {}: {e}", link.url);
            return None;
        }
    };
    let endpoint = auth::endpoint(link.url.clone(), tls)
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(10));
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("cannot reach the brain at {}: {e:?}", link.url);
            return None;
        }
    };
    Some(pb::brain_client::BrainClient::with_interceptor(
        channel,
        link.token.clone(),
    ))
}

/// Takes the job's own secret the brain returned on registering (a master started by hand
/// registered with the operator token).
fn keep_job_token(link: &BrainLink, r: &pb::RegisterJobResponse) {
    if let Some(t) = auth::Token::parse(&r.job_token) {
        link.token.replace(t);
    }
}

/// The job's shape as the brain plans with it.
fn shape(ctx: &crate::job::JobContext) -> pb::JobShape {
    let spec = &ctx.spec;
    let counts = ctx.role_counts();
    let plan = |role| spec.role_plan(role).ok();
    let res = |role| {
        let r = spec
            .roles
            .get(&role)
            .and_then(|r| r.resources.clone())
            .unwrap_or_default();
        jm::Resources {
            cpu_millicores: r.cpu.map_or(1000, |c| c.0),
            memory_bytes: r.memory.map_or(0, |m| m.0),
            gpu_milli: r.gpu.map_or(0, vocab::Gpus::milli),
            gpu_type: r.gpu_type.unwrap_or_default(),
        }
    };
    let trainer = spec.training_role();
    let w = plan(trainer);
    let count = |role: Role, planned: Option<u32>, none: u32| {
        counts
            .get(&role)
            .copied()
            .filter(|n| *n > 0)
            .or(planned)
            .unwrap_or(none)
    };
    let mut roles = vec![pb::RoleShape {
        role: trainer.to_string(),
        topology: spec.topology(trainer).to_string(),
        count: count(trainer, w.as_ref().map(|p| p.replicas), 1),
        min: w.as_ref().map_or(1, |p| p.min),
        max: w.as_ref().map_or(1, |p| p.max),
        resources: Some(res(trainer)),
        training: true,
        node_unit: w.as_ref().map_or(1, |p| p.node_unit),
        bundle_gpu_milli: spec.worker_bundle().map_or(0, vocab::Gpus::milli),
        ..Default::default()
    }];
    if spec.kind == JobKind::Ps {
        let p = plan(Role::PS);
        roles.push(pb::RoleShape {
            role: Role::PS.to_string(),
            topology: spec.topology(Role::PS).to_string(),
            count: count(Role::PS, p.as_ref().map(|p| p.replicas), 1),
            min: p.as_ref().map_or(0, |p| p.min),
            max: p.as_ref().map_or(0, |p| p.max),
            resources: Some(res(Role::PS)),
            ..Default::default()
        });
    }
    roles.extend(ctx.roles.services().filter_map(|(role, g)| {
        let p = plan(role)?;
        Some(pb::RoleShape {
            role: role.to_string(),
            topology: spec.topology(role).to_string(),
            count: g.live(),
            min: p.min,
            max: p.max,
            resources: Some(res(role)),
            shares_worker_devices: spec.shares_worker_devices(role),
            ..Default::default()
        })
    }));
    pb::JobShape {
        kind: spec.kind.to_string(),
        total_samples: spec.data.num_samples as u64 * spec.epochs as u64,
        roles,
        placement: spec
            .placement
            .iter()
            .map(pb::PlacementShape::from)
            .collect(),
    }
}

/// One report of the job as it is now.
fn report(ctx: &crate::job::JobContext, now_ms: u64) -> pb::MetricReport {
    let (global_step, samples_per_second, _) = ctx.progress();
    let counts = ctx.role_counts();
    let live = || ctx.all_slots().filter(|s| s.phase.is_live());
    let total = ctx.spec.data.num_samples as u64 * ctx.spec.epochs as u64;
    let effective = ctx.effective_training(now_ms);
    pb::MetricReport {
        at_unix_ms: unix_ms(),
        global_step,
        samples_per_second: if samples_per_second.is_finite() {
            samples_per_second.max(0.0)
        } else {
            0.0
        },
        roles: counts
            .iter()
            .map(|(&role, &count)| pb::RoleCount {
                role: role.to_string(),
                count,
                training: role == ctx.trainer(),
            })
            .collect(),
        cpu_millicores: live()
            .filter_map(|s| s.sample.as_ref())
            .map(|x| x.cpu_millicores)
            .sum(),
        memory_bytes: live()
            .filter_map(|s| s.sample.as_ref())
            .map(|x| x.rss_bytes)
            .sum(),
        gpu_utilisation_pct: gpu_utilisation(ctx),
        samples_done: (ctx.ledger.done_shards() * ctx.spec.data.shard_size as u64).min(total),
        processes: processes(ctx, now_ms),
        role_rates: crate::service::role_rates(ctx, now_ms),
        rates_cover_ms: ctx.calls.cover_ms(now_ms),
        rates_window_ms: crate::job::CALLS_WINDOW_MS,
        training_ms: effective.training_ms,
        lost_training_ms: effective.lost_ms,
        wall_ms: effective.wall_ms,
        stragglers: ctx
            .stability
            .stragglers
            .iter()
            .map(|(k, s)| pb::StragglerReport {
                role: k.role.to_string(),
                index: k.index,
                host: s.host.clone(),
                ratio: s.ratio(),
            })
            .collect(),
        faulty_nodes: ctx
            .stability
            .precheck
            .iter()
            .flat_map(|r| r.unhealthy())
            .filter_map(|n| {
                let straggler = match n.health {
                    vocab::report::NodeHealth::Faulty => false,
                    vocab::report::NodeHealth::Straggler => true,
                    _ => return None,
                };
                Some(pb::NodeFault {
                    host: n.node.clone(),
                    why: n.why.clone(),
                    straggler,
                })
            })
            .collect(),
        // The master's own count, not the context's: set where the report is sent.
        state_write_failures: 0,
    }
}

/// The mean utilisation of the devices of the job's live processes (of every role) that use a
/// GPU (given one, or holding memory on one); 0 when none does. A process given no GPU on a
/// node whose GPUs NVML samples all reports their utilisation too: it counts only once it
/// holds memory there.
fn gpu_utilisation(ctx: &crate::job::JobContext) -> f64 {
    let using: Vec<f64> = ctx
        .all_slots()
        .filter(|s| s.phase.is_live())
        .filter_map(|s| {
            let x = s.sample.as_ref().filter(|x| x.gpu_present)?;
            let given = ctx
                .launch_resources(s.key)
                .and_then(|r| r.gpu)
                .is_some_and(|g| g.milli() > 0);
            (given || x.gpu_memory_used_bytes > 0)
                .then_some(f64::from(x.gpu_utilization_percent.min(100)))
        })
        .collect();
    if using.is_empty() {
        0.0
    } else {
        using.iter().sum::<f64>() / using.len() as f64
    }
}

/// The longest list of GPUs a report carries for one process (the brain refuses longer).
const MAX_DEVICES_CHARS: usize = 256;

/// Each process that is or will be running, of every role group (the training group's and
/// the others'), with what it was given, what it used and where it runs.
fn processes(ctx: &crate::job::JobContext, now_ms: u64) -> Vec<pb::ProcessReport> {
    use crate::job::SlotPhase;
    ctx.all_slots()
        .filter(|s| !matches!(s.phase, SlotPhase::Removed | SlotPhase::Succeeded))
        .map(|s| {
            let given = ctx.launch_resources(s.key).unwrap_or_default();
            let used = s.sample.clone().unwrap_or_default();
            pb::ProcessReport {
                role: s.key.role.to_string(),
                index: s.key.index,
                resources: Some(jm::Resources {
                    cpu_millicores: given.cpu.map_or(0, |c| c.0),
                    memory_bytes: given.memory.map_or(0, |m| m.0),
                    gpu_milli: given.gpu.map_or(0, vocab::Gpus::milli),
                    gpu_type: given.gpu_type.unwrap_or_default(),
                }),
                cpu_millicores: used.cpu_millicores,
                memory_bytes: used.rss_bytes,
                memory_peak_bytes: s.memory_peak,
                oom_kills: s.oom_kills,
                pending_ms: if s.phase == SlotPhase::Launching && !s.placed {
                    now_ms.saturating_sub(s.last_heartbeat_ms)
                } else {
                    0
                },
                // The brain takes a reason of a few lines (4 KiB at most).
                pending_reason: if s.phase == SlotPhase::Launching && !s.placed {
                    s.pending_reason.chars().take(1000).collect()
                } else {
                    String::new()
                },
                gpu_utilisation_pct: if used.gpu_present {
                    f64::from(used.gpu_utilization_percent.min(100))
                } else {
                    0.0
                },
                gpu_memory_bytes: used.gpu_memory_used_bytes,
                host: match s.placed || s.phase != SlotPhase::Launching {
                    true => s.host.clone(),
                    false => String::new(),
                },
                devices: s.devices.chars().take(MAX_DEVICES_CHARS).collect(),
            }
        })
        .collect()
}

/// Reports and polls until the task is aborted (the job master aborts it when the job ends).
pub(crate) async fn run(
    shared: Arc<Shared>,
    link: BrainLink,
    master_addr: SocketAddr,
    platform: Arc<dyn crate::platform::Platform>,
) {
    let mut client: Option<Client> = None;
    let mut job_id: Option<u64> = None;
    let mut queued: VecDeque<pb::MetricReport> = VecDeque::new();
    let mut dropped = 0u64;
    let mut acked_reached = 0u64;
    let mut acked_abandoned = 0u64;
    let mut last_brain_version = 0u64;
    let mut refused: Option<String> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(link.report_interval_ms.max(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (sample, shape_now, desired, reached, in_transition, abandoned) = {
            let ctx = shared.job.lock().await;
            (
                pb::MetricReport {
                    state_write_failures: shared.persister.failures(),
                    ..report(&ctx, shared.now_ms())
                },
                shape(&ctx),
                ctx.plans.desired,
                ctx.plans.reached,
                ctx.transition.is_some(),
                ctx.plans.abandoned.clone(),
            )
        };
        // Speeds measured mid-transition belong to no one worker count.
        let training = sample.roles.iter().any(|r| r.training && r.count > 0);
        if !in_transition && training {
            queued.push_back(sample);
        }
        while queued.len() > MAX_QUEUED {
            queued.pop_front();
            dropped += 1;
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    "the brain is unreachable: oldest metric reports dropped"
                );
            }
        }
        let Some(c) = client.as_mut() else {
            client = connect(&link).await;
            continue;
        };
        let id = match job_id {
            Some(id) => id,
            None => {
                // The name read first: a guard in the request would hold the job's lock (every
                // RPC, every durable write) through the call, up to its timeout.
                let job_name = shared.job.lock().await.spec.name.clone();
                let r = c
                    .register_job(pb::RegisterJobRequest {
                        job_name,
                        master_address: master_addr.to_string(),
                        shape: Some(shape_now),
                    })
                    .await;
                match r {
                    Ok(r) => {
                        let r = r.into_inner();
                        keep_job_token(&link, &r);
                        let id = r.job_id;
                        tracing::info!(job_id = id, url = %link.url, "registered with the brain");
                        job_id = Some(id);
                        id
                    }
                    Err(e)
                        if matches!(
                            e.code(),
                            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                        ) =>
                    {
                        // Said once per refusal; asked again, the token may be fixed meanwhile.
                        if refused.as_deref() != Some(e.message()) {
                            tracing::warn!(url = %link.url, "the brain refuses this job master: {}", e.message());
                            refused = Some(e.message().to_string());
                        }
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!("brain register: {e}");
                        client = None;
                        continue;
                    }
                }
            }
        };
        if !queued.is_empty() {
            // At most a batch's worth per tick: a backlog drains over the next ticks.
            let n = queued.len().min(proto::MAX_REPORTS_PER_BATCH);
            let batch = pb::MetricsBatch {
                job_id: id,
                reports: queued.iter().take(n).cloned().collect(),
            };
            match c.report_metrics(batch).await {
                Ok(_) => {
                    queued.drain(..n);
                }
                Err(e) if e.code() == tonic::Code::NotFound => {
                    job_id = None;
                    continue;
                }
                Err(e) if e.code() == tonic::Code::InvalidArgument => {
                    tracing::warn!("the brain refused a metrics batch: {}", e.message());
                    queued.clear();
                }
                // Over the brain's rate limit: the batch stays queued for a later tick.
                Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                    tracing::debug!("brain report: {}", e.message());
                }
                Err(e) => {
                    tracing::debug!("brain report: {e}");
                    client = None;
                    continue;
                }
            }
        }
        let plan = match c
            .get_plan(pb::GetPlanRequest {
                job_id: id,
                after_version: desired,
            })
            .await
        {
            Ok(r) => {
                let mut r = r.into_inner();
                platform.cordon(&r.cordoned_nodes);
                platform.others_devices(std::mem::take(&mut r.other_jobs_devices).into());
                if !r.cordoned_nodes.is_empty() {
                    // A process already on a node the brain cordoned moves off it.
                    let nodes = r.cordoned_nodes.clone();
                    shared
                        .apply_logged("moving off cordoned nodes", move |ctx, now| {
                            let moved = ctx.nodes_cordoned(&nodes, now);
                            let acted = moved.is_some();
                            Ok(((), moved.unwrap_or_default(), acted))
                        })
                        .await;
                }
                if !r.cancel.is_empty() {
                    let why = format!("asked through the brain: {}", r.cancel);
                    shared
                        .apply_logged("cancel", |ctx, now| {
                            // The brain says it at every poll until the job ends: only the
                            // first changes (and persists) anything.
                            let first = ctx.cancelling.is_none() && !ctx.phase.is_terminal();
                            Ok(((), ctx.cancel(why, now), first))
                        })
                        .await;
                }
                r.plan
            }
            Err(e) => {
                tracing::debug!("brain plan poll: {e}");
                client = None;
                continue;
            }
        };
        if let Some(plan) = plan {
            let version = plan.version;
            let answer = match ScalePlan::try_from(plan) {
                Ok(p) => shared.apply_scale_plan(p).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let (accepted, reason, reached) = match answer {
                Ok(a) => (a.accepted, a.reason, a.reached_version),
                Err(e) => (false, e, reached),
            };
            tracing::info!(version, accepted, %reason, "plan from the brain");
            last_brain_version = version;
            if c.ack_plan(pb::PlanAck {
                job_id: id,
                version,
                accepted,
                reason,
                reached_version: reached.min(version),
            })
            .await
            .is_ok()
            {
                acked_reached = reached;
            }
        } else if let Some(a) = abandoned.filter(|a| {
            a.version > acked_abandoned && a.version <= last_brain_version && a.version > reached
        }) {
            // An accepted plan given up later: the brain must stop counting it as in flight.
            let r = c
                .ack_plan(pb::PlanAck {
                    job_id: id,
                    version: a.version,
                    accepted: false,
                    reason: a.reason.clone(),
                    reached_version: reached.min(a.version),
                })
                .await;
            if r.is_ok() {
                acked_abandoned = a.version;
            }
        } else if reached > acked_reached && last_brain_version > 0 {
            // A plan carried out since the last acknowledgement.
            let r = c
                .ack_plan(pb::PlanAck {
                    job_id: id,
                    version: last_brain_version,
                    accepted: true,
                    reason: String::new(),
                    reached_version: reached.min(last_brain_version),
                })
                .await;
            if r.is_ok() {
                acked_reached = reached;
            }
        }
    }
}

/// Tells the brain how the job ended, trying for `outcome_timeout_ms`.
pub async fn report_outcome(link: &BrainLink, report: &JobReport, master_addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_millis(link.outcome_timeout_ms);
    let total: u64 = report.samples_per_epoch.values().sum();
    loop {
        if let Some(mut c) = connect(link).await {
            let id = c
                .register_job(pb::RegisterJobRequest {
                    job_name: report.job.clone(),
                    master_address: master_addr.to_string(),
                    shape: None,
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    keep_job_token(link, &r);
                    r.job_id
                });
            if let Ok(id) = id {
                let r = c
                    .report_outcome(pb::JobOutcome {
                        job_id: id,
                        phase: report.phase.to_string(),
                        reason: report.reason.clone().unwrap_or_default(),
                        elapsed_ms: report.elapsed_ms,
                        samples_done: total,
                        exactly_once: report.exactly_once.clone(),
                    })
                    .await;
                match r {
                    Ok(_) => {
                        tracing::info!("outcome reported to the brain");
                        return;
                    }
                    Err(e) if e.code() == tonic::Code::InvalidArgument => {
                        tracing::warn!("the brain refused the outcome: {}", e.message());
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                "could not tell the brain at {} how the job ended; it is in report.json",
                link.url
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobContext, Sample, Timing};
    use vocab::SlotKey;

    #[test]
    fn gpu_use_reaches_the_report_per_process_and_as_the_mean_of_those_using_one() {
        let spec = vocab::spec::JobSpec::from_yaml(
            "name: g\nkind: allreduce\nroles:\n  worker: { replicas: 3, resources: { gpu: 0.5 } }\n\
             workload:\n  builtin: {}\ndata: { num_samples: 100, shard_size: 10 }\n\
             checkpoint: { dir: /tmp/brain-gpu-test, every_shards: 0 }\n",
        )
        .unwrap();
        let (mut ctx, _) = JobContext::new(spec, "g-1".into(), Timing::default(), 0);
        let gpu = |util, mem| Sample {
            cpu_millicores: 100,
            rss_bytes: 1 << 20,
            gpu_present: true,
            gpu_utilization_percent: util,
            gpu_memory_used_bytes: mem,
        };
        let w = |index| SlotKey {
            role: Role::WORKER,
            index,
        };
        ctx.roles.slot_mut(w(0)).unwrap().sample = Some(gpu(90, 3 << 30));
        ctx.roles.slot_mut(w(1)).unwrap().sample = Some(gpu(70, 0));
        // Worker 2 has not sampled yet: it counts in neither figure.
        let r = report(&ctx, 0);
        assert_eq!(r.gpu_utilisation_pct, 80.0);
        let by_index: Vec<(u32, f64, u64)> = r
            .processes
            .iter()
            .map(|p| (p.index, p.gpu_utilisation_pct, p.gpu_memory_bytes))
            .collect();
        assert_eq!(
            by_index,
            vec![(0, 90.0, 3 << 30), (1, 70.0, 0), (2, 0.0, 0)]
        );
        // A machine without NVML reports no GPU use.
        for s in ctx.roles.slots_mut() {
            s.sample = Some(Sample {
                gpu_present: false,
                ..gpu(0, 0)
            });
        }
        assert_eq!(report(&ctx, 0).gpu_utilisation_pct, 0.0);
    }

    #[test]
    fn a_process_given_no_gpu_counts_only_once_it_holds_gpu_memory() {
        let spec = vocab::spec::JobSpec::from_yaml(
            "name: g\nkind: allreduce\nroles:\n  worker: { replicas: 2 }\n\
             workload:\n  builtin: {}\ndata: { num_samples: 100, shard_size: 10 }\n\
             checkpoint: { dir: /tmp/brain-gpu-test, every_shards: 0 }\n",
        )
        .unwrap();
        let (mut ctx, _) = JobContext::new(spec, "g-1".into(), Timing::default(), 0);
        let sample = |util, mem| Sample {
            gpu_present: true,
            gpu_utilization_percent: util,
            gpu_memory_used_bytes: mem,
            ..Sample::default()
        };
        let mut slots = ctx.roles.slots_mut();
        slots.next().unwrap().sample = Some(sample(40, 0));
        slots.next().unwrap().sample = Some(sample(60, 1 << 20));
        drop(slots);
        assert_eq!(report(&ctx, 0).gpu_utilisation_pct, 60.0);
    }

    #[test]
    fn every_role_groups_processes_reach_the_report_with_their_node_and_devices() {
        let spec = vocab::spec::JobSpec::from_yaml(
            "name: r\nkind: allreduce\nroles:\n  worker: { replicas: 1, resources: { gpu: 1 } }\n\
             \x20 rollout: { topology: service, replicas: 2, resources: { gpu: 0.5 } }\n\
             workload:\n  builtin: {}\ndata: { num_samples: 100, shard_size: 10 }\n\
             checkpoint: { dir: /tmp/brain-roles-report-test, every_shards: 0 }\n",
        )
        .unwrap();
        let (mut ctx, _) = JobContext::new(spec, "r-1".into(), Timing::default(), 0);
        let rollout: Role = "rollout".parse().unwrap();
        for (i, s) in ctx
            .roles
            .service_mut(rollout)
            .unwrap()
            .slots
            .values_mut()
            .enumerate()
        {
            s.phase = crate::job::SlotPhase::Running;
            s.host = "10.0.0.2".into();
            s.devices = "1".into();
            s.sample = Some(Sample {
                cpu_millicores: 200,
                gpu_present: true,
                gpu_utilization_percent: 50 + 10 * i as u32,
                gpu_memory_used_bytes: 1 << 30,
                ..Sample::default()
            });
        }
        let w = ctx.roles.slots_mut().next().unwrap();
        (w.phase, w.host, w.devices) = (
            crate::job::SlotPhase::Running,
            "10.0.0.2".into(),
            "0".into(),
        );
        w.sample = Some(Sample {
            cpu_millicores: 1000,
            gpu_present: true,
            gpu_utilization_percent: 90,
            ..Sample::default()
        });
        let r = report(&ctx, 0);
        let seen: Vec<(String, u32, String, String, u32)> = r
            .processes
            .iter()
            .map(|p| {
                let gpu = p.resources.as_ref().map_or(0, |x| x.gpu_milli);
                (
                    p.role.clone(),
                    p.index,
                    p.host.clone(),
                    p.devices.clone(),
                    gpu,
                )
            })
            .collect();
        let row = |role: &str, index, devices: &str, gpu| {
            (
                role.to_string(),
                index,
                "10.0.0.2".to_string(),
                devices.to_string(),
                gpu,
            )
        };
        assert_eq!(
            seen,
            vec![
                row("worker", 0, "0", 1000),
                row("rollout", 0, "1", 500),
                row("rollout", 1, "1", 500)
            ]
        );
        // The job's figures count every role's processes.
        assert_eq!(r.cpu_millicores, 1400);
        assert_eq!(r.gpu_utilisation_pct, (90.0 + 50.0 + 60.0) / 3.0);
        // What the platform is told they hold, device by device: the two shares add up on
        // device 1; a process gone holds nothing.
        let held = |ctx: &JobContext| ctx.device_use().on("10.0.0.2").cloned();
        let want =
            |pairs: &[(&str, u32)]| Some(pairs.iter().map(|&(d, h)| (d.to_string(), h)).collect());
        assert_eq!(held(&ctx), want(&[("0", 1000), ("1", 1000)]));
        let gone = ctx
            .roles
            .service_mut(rollout)
            .unwrap()
            .slots
            .get_mut(&1)
            .unwrap();
        gone.phase = crate::job::SlotPhase::Launching;
        assert_eq!(held(&ctx), want(&[("0", 1000), ("1", 500)]));
    }
}
