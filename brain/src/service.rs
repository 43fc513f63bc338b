//! The `brain.service.v1.Brain` gRPC API: a thin adapter that turns wire messages into store
//! calls (run on the blocking pool: SQLite does file I/O) and errors into `tonic::Status`.

use std::sync::Arc;

use prost::Message;
use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use tonic::{Request, Response, Status};

use crate::BrainError;
use crate::auth::{self, Caller};
use crate::control::{Control, now_unix_ms};
use crate::store::{JobId, JobState, Metric, PlanCounts, Store};
use crate::throttle::Throttle;

pub struct BrainService {
    control: Arc<Control>,
    limits: crate::limits::Limits,
    throttle: Arc<Throttle>,
}

impl BrainService {
    pub fn new(
        control: Arc<Control>,
        limits: crate::limits::Limits,
        throttle: Arc<Throttle>,
    ) -> Self {
        BrainService {
            control,
            limits,
            throttle,
        }
    }

    /// Runs `f` on the store off the async threads.
    async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, BrainError> + Send + 'static,
    ) -> Result<T, Status> {
        let store = self.control.store.clone();
        tokio::task::spawn_blocking(move || {
            let mut store = store.lock().expect("no panic while the store is held");
            f(&mut store)
        })
        .await
        .map_err(|e| Status::internal(format!("store task: {e}")))?
        .map_err(Status::from)
    }
}

mod records;
mod reports;
mod shapes;
use records::{Extras, PLANS_SHOWN, record};
use shapes::{node_state, role_changes, shape_from, shape_to};

#[tonic::async_trait]
impl pb::brain_server::Brain for BrainService {
    async fn register_job(
        &self,
        request: Request<pb::RegisterJobRequest>,
    ) -> Result<Response<pb::RegisterJobResponse>, Status> {
        let caller = auth::caller(&request)?;
        if let Caller::Owner(job) = caller {
            return Err(Status::permission_denied(format!(
                "the owner's token of {job} cannot register a job master: a job master \
                 registers with its job's secret (or, started by hand, the operator's token)"
            )));
        }
        let r = request.into_inner();
        let shape = r.shape.map(shape_from).transpose()?;
        let name = r.job_name.clone();
        let (id, plan_version) = self
            .with_store(move |s| {
                // A job's secret registers its own job only (a name it would take over, or a
                // new one, is refused before anything changes).
                if let Caller::Job(job) = caller {
                    let own = s.name(job)?;
                    if own != name {
                        return Err(BrainError::PermissionDenied(format!(
                            "the secret of {job} ({own}) cannot register job {name:?}"
                        )));
                    }
                }
                s.register(
                    &r.job_name,
                    &r.master_address,
                    shape.as_ref(),
                    now_unix_ms(),
                )
            })
            .await?;
        // A master started by hand registered with the operator token: its job's own secret.
        let job_token = match caller {
            Caller::Operator | Caller::Anyone => self
                .control
                .mint(id, auth::Holder::Master)
                .await?
                .expose()
                .to_string(),
            Caller::Job(_) | Caller::Owner(_) => String::new(),
        };
        self.control.wake();
        Ok(Response::new(pb::RegisterJobResponse {
            job_id: id.0,
            plan_version,
            job_token,
        }))
    }

    async fn report_metrics(
        &self,
        request: Request<pb::MetricsBatch>,
    ) -> Result<Response<pb::MetricsAck>, Status> {
        auth::job_itself(&request, JobId(request.get_ref().job_id))?;
        let batch = request.into_inner();
        if batch.reports.len() > proto::MAX_REPORTS_PER_BATCH {
            return Err(Status::invalid_argument(format!(
                "a batch holds at most {} reports, this one {}: send them in several",
                proto::MAX_REPORTS_PER_BATCH,
                batch.reports.len()
            )));
        }
        self.throttle
            .reports(JobId(batch.job_id), batch.reports.len())?;
        let faulty: Vec<(String, String)> = batch
            .reports
            .iter()
            .flat_map(|r| &r.faulty_nodes)
            .filter(|f| !f.straggler)
            .map(|f| (f.host.clone(), f.why.clone()))
            .collect();
        let reports: Vec<Metric> = batch
            .reports
            .into_iter()
            .map(reports::metric)
            .collect::<Result<_, _>>()?;
        let want_lines = self.control.sink.is_some();
        let job = JobId(batch.job_id);
        let (stored, lines) = self
            .with_store(move |s| {
                let stored = s.add_metrics(job, &reports)?;
                // Raw points only for what the store accepted.
                let lines = if want_lines {
                    let name = s.name(job)?;
                    reports
                        .iter()
                        .filter_map(|m| match crate::sink::line(&name, job, m) {
                            Ok(l) => Some(l),
                            Err(e) => {
                                tracing::warn!("{e}: not sent to the sink");
                                None
                            }
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                Ok((stored, lines))
            })
            .await?;
        if let Some(sink) = &self.control.sink {
            sink.send(lines);
        }
        self.control.metrics.reports.inc_by(stored as u64);
        self.control.cordon_faulty(job, faulty).await?;
        Ok(Response::new(pb::MetricsAck {
            stored: stored as u32,
        }))
    }

    async fn get_plan(
        &self,
        request: Request<pb::GetPlanRequest>,
    ) -> Result<Response<pb::GetPlanResponse>, Status> {
        auth::job_itself(&request, JobId(request.get_ref().job_id))?;
        let r = request.into_inner();
        let (plan, cancel, cordoned_nodes, others) = self
            .with_store(move |s| {
                let job = JobId(r.job_id);
                Ok((
                    s.plan_after(job, r.after_version)?,
                    s.job(job)?.cancel_requested.unwrap_or_default(),
                    s.cordons(now_unix_ms())?
                        .into_iter()
                        .map(|c| c.node)
                        .collect(),
                    s.device_use_besides(job),
                ))
            })
            .await?;
        let plan = plan
            .map(|p| jm::ScalePlan::decode(p.body.as_slice()))
            .transpose()
            .map_err(|e| Status::internal(format!("stored plan does not decode: {e}")))?;
        Ok(Response::new(pb::GetPlanResponse {
            plan,
            cancel,
            cordoned_nodes,
            other_jobs_devices: (&others).into(),
        }))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        auth::operator(&request)?;
        let nodes = self.control.node_states().await?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: nodes.iter().map(node_state).collect(),
        }))
    }

    async fn cordon_node(
        &self,
        request: Request<pb::CordonNodeRequest>,
    ) -> Result<Response<pb::NodeState>, Status> {
        auth::operator(&request)?;
        let r = request.into_inner();
        let n = self.control.cordon(&r.node, &r.reason, r.for_s).await?;
        Ok(Response::new(node_state(&n)))
    }

    async fn uncordon_node(
        &self,
        request: Request<pb::UncordonNodeRequest>,
    ) -> Result<Response<pb::NodeState>, Status> {
        auth::operator(&request)?;
        let n = self.control.uncordon(&request.into_inner().node).await?;
        Ok(Response::new(node_state(&n)))
    }

    async fn diagnose(
        &self,
        request: Request<pb::DiagnoseRequest>,
    ) -> Result<Response<pb::DiagnoseResponse>, Status> {
        auth::operator_or_owner(&request, JobId(request.get_ref().job_id))?;
        let r = request.into_inner();
        let text = self.control.diagnose(JobId(r.job_id), r.all).await?;
        Ok(Response::new(pb::DiagnoseResponse { text }))
    }

    async fn job_events(
        &self,
        request: Request<pb::JobEventsRequest>,
    ) -> Result<Response<pb::JobEventsResponse>, Status> {
        // The operator, the job's master, or its owner.
        auth::may_read(&request, JobId(request.get_ref().job_id))?;
        let text = self.control.events(JobId(request.get_ref().job_id)).await?;
        Ok(Response::new(pb::JobEventsResponse { text }))
    }

    async fn job_logs(
        &self,
        request: Request<pb::JobLogsRequest>,
    ) -> Result<Response<pb::JobLogsResponse>, Status> {
        auth::may_read(&request, JobId(request.get_ref().job_id))?;
        let r = request.into_inner();
        if r.process.len() > 128 {
            return Err(Status::invalid_argument(format!(
                "a process name of {} bytes: at most 128 (e.g. worker-0)",
                r.process.len()
            )));
        }
        let (log, text, next_offset, ended) = self
            .control
            .logs(
                JobId(r.job_id),
                r.process,
                r.incarnation,
                crate::launch::LogFrom::new(r.offset, r.tail),
            )
            .await?;
        Ok(Response::new(pb::JobLogsResponse {
            path: log.path.display().to_string(),
            incarnation: log.incarnation,
            text,
            next_offset,
            ended,
        }))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        auth::operator_or_owner(&request, JobId(request.get_ref().job_id))?;
        let by = match auth::caller(&request)? {
            Caller::Owner(_) => "its owner",
            _ => "an operator",
        };
        let r = request.into_inner();
        let reason = if r.reason.trim().is_empty() {
            format!("cancelled by {by}")
        } else {
            r.reason
        };
        let state = self
            .with_store(move |s| {
                let job = JobId(r.job_id);
                let row = s.job(job)?;
                match row.state {
                    JobState::Queued => {
                        s.finish(
                            job,
                            JobState::Cancelled,
                            &format!("cancelled before it started: {reason}"),
                            0,
                            now_unix_ms(),
                        )?;
                        Ok("cancelled")
                    }
                    JobState::Running => {
                        s.request_cancel(job, &reason)?;
                        Ok("cancelling")
                    }
                    ended => Err(BrainError::FailedPrecondition(format!(
                        "job {} already {}: nothing to cancel",
                        row.name,
                        ended.as_str()
                    ))),
                }
            })
            .await?;
        self.control.wake();
        Ok(Response::new(pb::CancelJobResponse {
            state: state.into(),
        }))
    }

    async fn ack_plan(
        &self,
        request: Request<pb::PlanAck>,
    ) -> Result<Response<pb::PlanAckResponse>, Status> {
        auth::job_itself(&request, JobId(request.get_ref().job_id))?;
        let a = request.into_inner();
        self.with_store(move |s| {
            s.ack_plan(
                JobId(a.job_id),
                a.version,
                a.accepted,
                &a.reason,
                a.reached_version,
            )
        })
        .await?;
        Ok(Response::new(pb::PlanAckResponse {}))
    }

    async fn propose_plan(
        &self,
        request: Request<pb::ProposePlanRequest>,
    ) -> Result<Response<pb::ProposePlanResponse>, Status> {
        auth::operator_or_owner(&request, JobId(request.get_ref().job_id))?;
        let r = request.into_inner();
        if r.roles.is_empty() && r.migrations.is_empty() {
            return Err(Status::invalid_argument(
                "a plan needs a role count or a migration",
            ));
        }
        let plan = vocab::ScalePlan::try_from(jm::ScalePlan {
            version: 0,
            roles: r.roles,
            migrations: r.migrations,
        })
        .map_err(|e| Status::invalid_argument(e.0))?;
        let id = JobId(r.job_id);
        let row = self.with_store(move |s| s.job(id)).await?;
        let trainer = row
            .shape
            .as_ref()
            .map_or(vocab::Role::WORKER, |s| s.training);
        let counts = PlanCounts::of(&plan, trainer);
        if row.state != JobState::Running {
            return Err(Status::failed_precondition(format!(
                "job {} is {}: only a running job can be scaled",
                row.name,
                row.state.as_str()
            )));
        }
        if let Some(shape) = &row.shape {
            shape.check_plan(&plan).map_err(|why| {
                Status::invalid_argument(format!("job {}: {why}; nothing changed", row.name))
            })?;
        }
        let notes = match self.control.preview(id, &counts).await {
            Ok(notes) => notes,
            Err(why) if r.force => vec![format!("proposed anyway (--force): {why}")],
            Err(why) => {
                return Err(Status::failed_precondition(format!(
                    "{why}; nothing changed (`brainctl scale --force` proposes it anyway)"
                )));
            }
        };
        let version = self
            .with_store(move |s| {
                let body = |version: u64| {
                    jm::ScalePlan::from(&vocab::ScalePlan {
                        version,
                        ..plan.clone()
                    })
                    .encode_to_vec()
                };
                s.propose_plan(
                    JobId(r.job_id),
                    &body,
                    &r.reason,
                    counts,
                    &[],
                    now_unix_ms(),
                )
            })
            .await?;
        self.control.metrics.plans.inc();
        Ok(Response::new(pb::ProposePlanResponse { version, notes }))
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobRecord>, Status> {
        let id = JobId(request.get_ref().job_id);
        auth::may_read(&request, id)?;
        let (row, mut extras) = self
            .with_store(move |s| {
                let extras = Extras {
                    gpu: s.gpu_use(id),
                    snapshot: s.snapshot(id),
                    plans: s.plan_history(id, PLANS_SHOWN)?,
                    ..Default::default()
                };
                Ok((s.job(id)?, extras))
            })
            .await?;
        extras.waiting = self.control.waiting_reason(id);
        Ok(Response::new(record((row, extras))))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        // An owner sees its own job only (brainctl finds it by name this way).
        let only = match auth::caller(&request)? {
            Caller::Owner(job) => Some(job),
            _ => {
                auth::operator(&request)?;
                None
            }
        };
        let rows = self
            .with_store(move |s| {
                let rows = s.jobs()?;
                Ok(rows
                    .into_iter()
                    .filter(|r| only.is_none_or(|j| r.id == j))
                    .map(|r| {
                        let extras = Extras {
                            gpu: s.gpu_use(r.id),
                            snapshot: s.snapshot(r.id),
                            ..Default::default()
                        };
                        (r, extras)
                    })
                    .collect::<Vec<_>>())
            })
            .await?;
        let control = &self.control;
        Ok(Response::new(pb::ListJobsResponse {
            jobs: rows
                .into_iter()
                .map(|(row, mut extras)| {
                    extras.waiting = control.waiting_reason(row.id);
                    record((row, extras))
                })
                .collect(),
        }))
    }

    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        auth::operator(&request)?;
        self.throttle.submission(&request)?;
        let r = request.into_inner();
        if r.spec_yaml.len() > self.limits.max_spec_bytes {
            return Err(Status::invalid_argument(format!(
                "the spec is {} bytes, more than the {} a submission may carry \
                 (limits.max_spec_bytes)",
                r.spec_yaml.len(),
                self.limits.max_spec_bytes
            )));
        }
        let max = self.limits.max_active_jobs;
        let active = self.with_store(|s| Ok(s.active()?.len())).await?;
        if active >= max {
            return Err(Status::resource_exhausted(format!(
                "{active} jobs are queued or running, the most this brain takes \
                 (limits.max_active_jobs): submit again when one has ended"
            )));
        }
        let (id, shape, reasons) = self.control.submit(&r.spec_yaml, &r.origin).await?;
        // The person who submitted it gets a token of their own for it (none where no token
        // is checked).
        let owner_token = if self.control.keys.checked() {
            let t = self.control.mint(id, auth::Holder::Owner).await?;
            t.expose().to_string()
        } else {
            String::new()
        };
        Ok(Response::new(pb::SubmitJobResponse {
            job_id: id.0,
            shape: Some(shape_to(shape)),
            reasons,
            state: "queued".into(),
            owner_token,
        }))
    }

    async fn report_outcome(
        &self,
        request: Request<pb::JobOutcome>,
    ) -> Result<Response<pb::OutcomeAck>, Status> {
        auth::job_itself(&request, JobId(request.get_ref().job_id))?;
        let o = request.into_inner();
        let Some(state) = o.phase.parse().ok().and_then(JobState::ended) else {
            let other = &o.phase;
            return Err(Status::invalid_argument(format!(
                "phase {other:?}: expected \"succeeded\", \"failed\" or \"cancelled\""
            )));
        };
        let text = format!(
            "{}{} after {:.1} s; exactly-once: {}",
            o.phase,
            if o.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", o.reason)
            },
            o.elapsed_ms as f64 / 1000.0,
            o.exactly_once
        );
        self.with_store(move |s| {
            s.finish(JobId(o.job_id), state, &text, o.samples_done, now_unix_ms())
        })
        .await?;
        self.control.wake();
        Ok(Response::new(pb::OutcomeAck {}))
    }

    async fn dry_run(
        &self,
        request: Request<pb::DryRunRequest>,
    ) -> Result<Response<pb::DryRunResponse>, Status> {
        auth::operator(&request)?;
        let mut out = self.control.round(false).await?;
        // The role each job calls its training group: its decision's roles and migrations
        // speak it (the round keys the group's processes `worker`).
        let named = self.with_store(|s| s.trainers()).await?;
        let trainers: Vec<vocab::Role> = (out.plan.decisions.iter())
            .map(|d| *named.get(&JobId(d.job.0)).unwrap_or(&vocab::Role::WORKER))
            .collect();
        for (d, &trainer) in out.plan.decisions.iter_mut().zip(&trainers) {
            if !d.migrations.is_empty() {
                d.migrations = d.scale_plan(0, trainer).migrations;
            }
        }
        Ok(Response::new(pb::DryRunResponse {
            scheduler: out.plan.scheduler,
            decisions: out
                .plan
                .decisions
                .into_iter()
                .zip(trainers)
                .map(|(d, trainer)| pb::JobDecision {
                    roles: role_changes(&d, trainer),
                    job_id: d.job.0,
                    job_name: d.name,
                    state: match d.state {
                        optimizer::live::LiveState::Queued => "queued",
                        optimizer::live::LiveState::Running => "running",
                    }
                    .into(),
                    migrations: d.migrations.iter().map(jm::Migration::from).collect(),
                    predicted_samples_per_second: d.predicted_samples_per_s,
                    reasons: d.reasons,
                })
                .collect(),
            cpu_millicores: out.plan.cpu_millicores,
            capacity_millicores: out.cluster.cpu_millicores,
            processes: out.plan.processes,
            max_processes: out.cluster.max_processes,
            notes: out.plan.notes,
            solve_ms: out.solve_ms,
        }))
    }

    async fn get_policy(
        &self,
        request: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::PolicyText>, Status> {
        auth::operator(&request)?;
        let (policy, _) = self.control.policy();
        Ok(Response::new(pb::PolicyText {
            toml: policy.text,
            path: self.control.policy_source(),
        }))
    }

    async fn set_policy(
        &self,
        request: Request<pb::PolicyText>,
    ) -> Result<Response<pb::PolicyText>, Status> {
        auth::operator(&request)?;
        let text = request.into_inner().toml;
        let control = self.control.clone();
        let loaded = tokio::task::spawn_blocking(move || control.set_policy(&text))
            .await
            .map_err(|e| Status::internal(format!("policy task: {e}")))??;
        Ok(Response::new(pb::PolicyText {
            toml: loaded.text,
            path: self.control.policy_source(),
        }))
    }
}
