//! The gRPC adapter: converts wire messages to domain calls on [`crate::job::JobContext`] and
//! back. No decisions are taken here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use proto::jobmaster::v1 as pb;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::job::{AgentAction, MetricsRecord, Sample, SlotKey};
use crate::ledger::LeaseOutcome;
use crate::scale::ScalePlan;
use crate::shared::{Shared, commit_allreduce_checkpoint, commit_role_checkpoint};
use crate::spec::Role;

mod status;

pub(crate) use status::role_rates;

/// How many of a failed process's last output lines its event shows.
const OUTPUT_LINES: usize = 12;

pub struct MasterService {
    shared: Arc<Shared>,
}

impl MasterService {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn role(r: &str) -> Result<Role, Error> {
    vocab::wire::role(r).map_err(|e| Error::InvalidRequest(e.0))
}

fn process(p: Option<pb::ProcessRef>) -> Result<(SlotKey, u64), Error> {
    let p = p.ok_or_else(|| Error::InvalidRequest("process is missing".into()))?;
    Ok((
        SlotKey {
            role: role(&p.role)?,
            index: p.index,
        },
        p.incarnation,
    ))
}

impl From<pb::ResourceSample> for Sample {
    fn from(s: pb::ResourceSample) -> Sample {
        Sample {
            cpu_millicores: s.cpu_millicores,
            rss_bytes: s.rss_bytes,
            gpu_present: s.gpu_present,
            gpu_utilization_percent: s.gpu_utilization_percent,
            gpu_memory_used_bytes: s.gpu_memory_used_bytes,
        }
    }
}

#[tonic::async_trait]
impl pb::job_master_server::JobMaster for MasterService {
    async fn register_agent(
        &self,
        req: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        let r = req.into_inner();
        let key = SlotKey {
            role: role(&r.role)?,
            index: r.index,
        };
        let (agent_id, incarnation) = self
            .shared
            .apply(|ctx, now| {
                let v = ctx.register_agent(key, r.incarnation, r.host, r.service_addr, now)?;
                ctx.set_devices(key, r.devices, now);
                Ok((v, ctx.advance(now)))
            })
            .await?;
        let ctx = self.shared.job.lock().await;
        // A service or single role runs its own program with its own environment.
        let (command, env) = match ctx.spec.roles.get(&key.role) {
            Some(r) if ctx.is_service(key.role) => {
                (r.command.clone().unwrap_or_default(), r.env.clone())
            }
            _ => (
                ctx.spec.workload.command.clone().unwrap_or_default(),
                ctx.spec.workload.env.clone(),
            ),
        };
        Ok(Response::new(pb::RegisterAgentResponse {
            job_name: ctx.spec.name.clone(),
            job_kind: ctx.spec.kind.to_string(),
            heartbeat_interval_ms: ctx.timing.heartbeat_interval_ms as u32,
            grace_period_ms: ctx.grace_period_ms() as u32,
            command,
            env: env.into_iter().collect(),
            checkpoint_dir: ctx.spec.checkpoint.dir.display().to_string(),
            run_id: ctx.run_id.clone(),
            agent_id,
            incarnation,
            resources: ctx.launch_resources(key).as_ref().map(pb::Resources::from),
            process_joins: ctx.process_joins() && !ctx.is_service(key.role),
            checkpoint_token: self.shared.checkpoint_token.clone(),
            topology: ctx.spec.topology(key.role).to_string(),
            own_group: ctx.is_service(key.role),
            flash_budget_bytes: ctx
                .spec
                .checkpoint
                .flash
                .as_ref()
                .map_or(0, vocab::spec::FlashSpec::budget),
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        // Liveness and samples need no durable write: after a restart, agents heartbeat again.
        let ((action, incarnation, restart_count), capture_stacks, (committed_step, persist_step)) =
            self.shared
                .apply_if(|ctx, now| {
                    let v = ctx.heartbeat(
                        key,
                        r.agent_id,
                        incarnation,
                        r.sample.map(Sample::from),
                        r.process_pid,
                        now,
                    )?;
                    let capture = ctx.stacks_wanted(key, incarnation);
                    let steps = (ctx.committed_step(), ctx.persist_step_for(key));
                    Ok(((v, capture, steps), vec![], false))
                })
                .await?;
        Ok(Response::new(pb::HeartbeatResponse {
            action: match action {
                AgentAction::Continue => pb::AgentAction::Continue,
                AgentAction::Restart => pb::AgentAction::Restart,
                AgentAction::Shutdown => pb::AgentAction::Shutdown,
            } as i32,
            restart_count,
            incarnation,
            capture_stacks,
            committed_step,
            persist_step,
        }))
    }

    async fn report_process_exit(
        &self,
        req: Request<pb::ProcessExit>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        let output = match (&self.shared.output_dir, r.exit_code != 0 || r.signal != 0) {
            (Some(dir), true) => {
                // The agent's file: it holds each process incarnation the agent started.
                let (dir, process) = (dir.clone(), key.to_string());
                tokio::task::spawn_blocking(move || {
                    let log = vocab::run_dir::newest_log(&dir, &process).ok()?;
                    let lines = vocab::run_dir::last_output(&log.path, OUTPUT_LINES).ok()?;
                    Some((log.path.display().to_string(), lines))
                })
                .await
                .ok()
                .flatten()
            }
            _ => None,
        };
        self.shared
            .apply(|ctx, now| {
                let why = (!r.agent_reason.is_empty()).then_some(r.agent_reason.as_str());
                // An older incarnation's end was expected: its output is not news.
                let output = output
                    .filter(|_| ctx.current(key, incarnation).is_ok() && !ctx.phase.is_terminal());
                let effects =
                    ctx.process_exited(key, incarnation, r.exit_code, r.signal, why, now)?;
                if let Some((log, lines)) = &output {
                    ctx.note_output(key, log, lines, now);
                }
                Ok(((), effects))
            })
            .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn join_rendezvous(
        &self,
        req: Request<pb::JoinRendezvousRequest>,
    ) -> Result<Response<pb::JoinRendezvousResponse>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        let addr = (!r.service_addr.is_empty()).then_some(r.service_addr);
        // A member polling while its round forms changes nothing worth a durable write (a
        // restarted master makes every member join again anyway).
        let v = self
            .shared
            .apply_if(|ctx, now| {
                let v = ctx.join_rendezvous_at(key, incarnation, addr, now)?;
                let durable = v.ready || v.removed;
                Ok((v, ctx.advance(now), durable))
            })
            .await?;
        let (master_addr, master_port) = v
            .peers
            .first()
            .and_then(|p| p.rsplit_once(':'))
            .map(|(h, p)| (h.to_string(), p.parse().unwrap_or(0)))
            .unwrap_or_default();
        Ok(Response::new(pb::JoinRendezvousResponse {
            ready: v.ready,
            round: v.round,
            rank: v.rank,
            world_size: v.world_size,
            master_addr,
            master_port,
            peers: v.peers,
            cluster: v.cluster.map(|c| pb::PsClusterSpec {
                version: c.version,
                ps: c.ps_addrs(),
                worker: c.worker_addrs(),
                ps_version: c.ps_version,
            }),
            waiting_reason: v.waiting_reason,
            restart_count: v.restart_count,
            resume_from: v
                .resume_from
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            removed: v.removed,
            state_from_rank0: v.state_from_rank0.unwrap_or(0),
            restore_together: v.restore_together,
        }))
    }

    async fn serve_role(
        &self,
        req: Request<pb::ServeRoleRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        self.shared
            .apply(|ctx, now| {
                ctx.serve_role(key, incarnation, r.address, r.collective_addr, now)?;
                Ok(((), Vec::new()))
            })
            .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_stacks(
        &self,
        req: Request<pb::ProcessStacks>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        // The agent cuts at 64 KiB; the rest is room for its own line of notes.
        if r.text.len() > 80 * 1024 {
            return Err(Status::invalid_argument(format!(
                "stacks of {} bytes: at most 80 KiB",
                r.text.len()
            )));
        }
        self.shared
            .apply(|ctx, now| Ok(((), ctx.stacks_reported(key, incarnation, r.text, now))))
            .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_calls(
        &self,
        req: Request<pb::CallReport>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        let mut calls = BTreeMap::new();
        for c in r.calls {
            if calls
                .insert(role(&c.role)?, (c.calls, c.waited_s))
                .is_some()
            {
                return Err(Status::invalid_argument(format!(
                    "role {} is named twice",
                    c.role
                )));
            }
        }
        let totals = crate::job::CallTotals {
            calls,
            served: r.served,
            busy_s: r.busy_s,
        };
        self.shared
            .apply(|ctx, now| {
                ctx.report_calls(key, incarnation, totals, now)?;
                Ok(((), Vec::new()))
            })
            .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn get_role_group(
        &self,
        req: Request<pb::RoleGroupRequest>,
    ) -> Result<Response<pb::RoleGroupResponse>, Status> {
        let role = role(&req.into_inner().role)?;
        let ctx = self.shared.job.lock().await;
        let view = ctx.role_group(role)?;
        Ok(Response::new(pb::RoleGroupResponse {
            role: role.to_string(),
            topology: view.topology.to_string(),
            members: view
                .members
                .into_iter()
                .map(|m| pb::RoleMember {
                    index: m.index,
                    incarnation: m.incarnation,
                    address: m.address,
                    collective_addr: m.collective_addr,
                })
                .collect(),
            desired: view.desired,
        }))
    }

    async fn get_workload(
        &self,
        req: Request<pb::ProcessRef>,
    ) -> Result<Response<pb::WorkloadConfig>, Status> {
        let (key, _) = process(Some(req.into_inner()))?;
        let ctx = self.shared.job.lock().await;
        let b = ctx.spec.workload.builtin.clone().ok_or_else(|| {
            Status::failed_precondition(format!(
                "{key}: this job runs a command, not the built-in workload"
            ))
        })?;
        let ps_replicas = ctx
            .spec
            .role_plan(Role::PS)
            .map(|p| p.replicas)
            .unwrap_or(0);
        Ok(Response::new(pb::WorkloadConfig {
            kind: ctx.spec.kind.to_string(),
            seed: b.seed,
            num_samples: ctx.spec.data.num_samples as u64,
            eval_samples: ctx.spec.data.eval_samples as u64,
            num_fields: b.num_fields as u32,
            vocab_per_field: b.vocab_per_field as u64,
            hash_buckets: b.hash_buckets as u64,
            batch_size: b.batch_size as u32,
            learning_rate: b.learning_rate as f32,
            epochs: ctx.spec.epochs as u32,
            checkpoint_dir: ctx.spec.checkpoint.dir.display().to_string(),
            ps_replicas,
            step_delay_us: b.step_delay_us as u32,
            batch_scaling: b.batch_scaling.to_string(),
        }))
    }

    async fn lease_shard(
        &self,
        req: Request<pb::LeaseShardRequest>,
    ) -> Result<Response<pb::LeaseShardResponse>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        let ps_version =
            (key.role == Role::WORKER && r.cluster_version > 0).then_some(r.cluster_version);
        // A "wait" changes nothing worth a durable write; grants and removals do.
        let v = self
            .shared
            .apply_if(|ctx, now| {
                let round = (r.round > 0).then_some(r.round);
                let (v, effects) = ctx.lease_with(key, incarnation, ps_version, round, now)?;
                let durable = v.removed || !matches!(v.outcome, LeaseOutcome::Wait);
                Ok((v, effects, durable))
            })
            .await?;
        let (status, shard) = match v.outcome {
            LeaseOutcome::Granted(s) => (
                pb::LeaseStatus::Granted,
                Some(pb::Shard {
                    id: s.id,
                    epoch: s.epoch,
                    start: s.start,
                    end: s.end,
                }),
            ),
            _ if v.removed => (pb::LeaseStatus::Removed, None),
            LeaseOutcome::Wait => (pb::LeaseStatus::Wait, None),
            LeaseOutcome::EndOfData => (pb::LeaseStatus::EndOfData, None),
        };
        Ok(Response::new(pb::LeaseShardResponse {
            status: status as i32,
            shard,
            checkpoint_due: v.checkpoint_due,
            evaluate: v.evaluate,
            reform: v.reform,
            cluster_version: v.ps_version,
        }))
    }

    async fn report_shard_done(
        &self,
        req: Request<pb::ShardDone>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        self.shared
            .apply(|ctx, now| {
                ctx.shard_done(key, incarnation, r.shard_id, now)
                    .map(|e| ((), e))
            })
            .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_metrics(
        &self,
        req: Request<pb::TrainingMetrics>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        let m = MetricsRecord {
            global_step: r.global_step,
            samples_per_second: r.samples_per_second,
            loss: r.loss,
            samples_total: r.samples_total,
            applied_samples: r.applied_samples,
            applied_index_sum: r.applied_index_sum,
            steps: r.steps,
            compute_seconds: r.compute_seconds,
        };
        let (from, step) = (r.restored_from, r.restored_step);
        self.shared
            .apply(|ctx, now| {
                let effects = match ctx.reports_training(key) {
                    true => ctx.report_metrics(
                        key,
                        incarnation,
                        m,
                        r.final_eval_loss,
                        r.final_model_digest,
                        now,
                    )?,
                    false => Vec::new(),
                };
                if !from.is_empty() {
                    ctx.restored(key, incarnation, &from, step, now)?;
                }
                Ok(((), effects))
            })
            .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn commit_checkpoint(
        &self,
        req: Request<pb::CheckpointCommit>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process.clone())?;
        if self.shared.job.lock().await.is_collective_group(key.role) {
            commit_role_checkpoint(&self.shared, key, incarnation, &r).await?;
            return Ok(Response::new(pb::Ack {}));
        }
        if r.in_memory {
            let step = r.step;
            self.shared
                .apply(|ctx, now| {
                    ctx.cut_in_memory(key, incarnation, step, now)
                        .map(|e| ((), e))
                })
                .await?;
            return Ok(Response::new(pb::Ack {}));
        }
        commit_allreduce_checkpoint(&self.shared, key, incarnation, r.step, r.path, r.digest)
            .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_checkpoint_part(
        &self,
        req: Request<pb::CheckpointPart>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        let written = crate::job::flash::PartWritten {
            step: r.step,
            rank: r.rank,
            parts: r.parts,
            part: crate::job::flash::FlashPart {
                path: r.path.into(),
                digest: r.digest,
                bytes: r.bytes,
            },
            hurried: r.hurried,
        };
        crate::shared::flash_part_written(&self.shared, key, incarnation, written).await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn get_committed_step(
        &self,
        req: Request<pb::ProcessRef>,
    ) -> Result<Response<pb::CommittedStep>, Status> {
        let (key, _) = process(Some(req.into_inner()))?;
        let ctx = self.shared.job.lock().await;
        if ctx.is_collective_group(key.role) {
            let kept = ctx.role_checkpoints_for(key)?;
            let (c, p) = (kept.first(), kept.get(1));
            return Ok(Response::new(pb::CommittedStep {
                step: c.map(|c| c.step),
                path: c.map(|c| c.path.display().to_string()).unwrap_or_default(),
                digest: c.map(|c| c.digest.clone()).unwrap_or_default(),
                previous_step: p.map(|p| p.step),
                previous_path: p.map(|p| p.path.display().to_string()).unwrap_or_default(),
                previous_digest: p.map(|p| p.digest.clone()).unwrap_or_default(),
            }));
        }
        let step = ctx.committed_step_for(key)?;
        Ok(Response::new(pb::CommittedStep {
            step,
            ..Default::default()
        }))
    }

    async fn report_checkpoint_damaged(
        &self,
        req: Request<pb::CheckpointDamaged>,
    ) -> Result<Response<pb::CheckpointFallback>, Status> {
        let r = req.into_inner();
        let (key, incarnation) = process(r.process)?;
        let manifest = PathBuf::from(r.manifest);
        let fallback = self
            .shared
            .apply(|ctx, now| ctx.checkpoint_damaged(key, incarnation, &manifest, &r.problem, now))
            .await?;
        let (step, manifest) = match fallback.to {
            Some((step, path)) => (Some(step), path.display().to_string()),
            None => (None, String::new()),
        };
        Ok(Response::new(pb::CheckpointFallback { step, manifest }))
    }

    async fn get_status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let ctx = self.shared.job.lock().await;
        let now_ms = self.shared.now_ms();
        Ok(Response::new(status::job_status(
            &ctx,
            now_ms,
            self.shared.prechecking(),
        )))
    }

    async fn apply_scale_plan(
        &self,
        req: Request<pb::ScalePlan>,
    ) -> Result<Response<pb::ScalePlanAnswer>, Status> {
        let plan = scale_plan(req.into_inner())?;
        if let Some(brain) = &self.shared.managed_by {
            // The brain's own plans arrive through its link, not here.
            let ctx = self.shared.job.lock().await;
            return Ok(Response::new(pb::ScalePlanAnswer {
                accepted: false,
                reason: format!(
                    "job {} is managed by the brain at {brain}: scale it there \
                     (`brainctl scale {} --brain {brain}`), whose plans would otherwise collide \
                     with this one",
                    ctx.spec.name, ctx.spec.name
                ),
                desired_version: ctx.plans.desired,
                reached_version: ctx.plans.reached,
            }));
        }
        Ok(Response::new(self.shared.apply_scale_plan(plan).await?))
    }
}

/// The wire plan as a domain plan; a malformed one is an invalid argument.
pub(crate) fn scale_plan(p: pb::ScalePlan) -> Result<ScalePlan, Error> {
    ScalePlan::try_from(p).map_err(|e| Error::InvalidRequest(e.0))
}
