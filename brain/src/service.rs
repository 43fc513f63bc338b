//! The `brain.service.v1.Brain` gRPC API: a thin adapter that turns wire messages into store
//! calls (run on the blocking pool: SQLite does file I/O) and errors into `tonic::Status`.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use tonic::{Request, Response, Status};

use crate::BrainError;
use crate::store::{JobId, JobRow, Metric, Store};

pub struct BrainService {
    store: Arc<Mutex<Store>>,
}

impl BrainService {
    pub fn new(store: Arc<Mutex<Store>>) -> Self {
        BrainService { store }
    }

    /// Runs `f` on the store off the async threads.
    async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, BrainError> + Send + 'static,
    ) -> Result<T, Status> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let mut store = store.lock().expect("no panic while the store is held");
            f(&mut store)
        })
        .await
        .map_err(|e| Status::internal(format!("store task: {e}")))?
        .map_err(Status::from)
    }
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn record(row: JobRow) -> pb::JobRecord {
    pb::JobRecord {
        job_id: row.id.0,
        job_name: row.name,
        master_address: row.master_address,
        registered_unix_ms: row.registered_unix_ms,
        reports: row.reports,
        last_global_step: row.last_global_step,
        mean_samples_per_second: row.mean_samples_per_second,
        peak_memory_bytes: row.peak_memory_bytes,
        plan_version: row.plan_version,
        acked_version: row.acked_version,
        reached_version: row.reached_version,
    }
}

#[tonic::async_trait]
impl pb::brain_server::Brain for BrainService {
    async fn register_job(
        &self,
        request: Request<pb::RegisterJobRequest>,
    ) -> Result<Response<pb::RegisterJobResponse>, Status> {
        let r = request.into_inner();
        let (id, plan_version) = self
            .with_store(move |s| s.register(&r.job_name, &r.master_address, now_unix_ms()))
            .await?;
        Ok(Response::new(pb::RegisterJobResponse {
            job_id: id.0,
            plan_version,
        }))
    }

    async fn report_metrics(
        &self,
        request: Request<pb::MetricsBatch>,
    ) -> Result<Response<pb::MetricsAck>, Status> {
        let batch = request.into_inner();
        let reports: Vec<Metric> = batch
            .reports
            .into_iter()
            .map(|m| Metric {
                at_unix_ms: m.at_unix_ms,
                global_step: m.global_step,
                samples_per_second: m.samples_per_second,
                workers: m.workers,
                ps: m.ps,
                cpu_millicores: m.cpu_millicores,
                memory_bytes: m.memory_bytes,
                gpu_utilisation_pct: m.gpu_utilisation_pct,
            })
            .collect();
        let stored = self
            .with_store(move |s| s.add_metrics(JobId(batch.job_id), &reports))
            .await?;
        Ok(Response::new(pb::MetricsAck {
            stored: stored as u32,
        }))
    }

    async fn get_plan(
        &self,
        request: Request<pb::GetPlanRequest>,
    ) -> Result<Response<pb::GetPlanResponse>, Status> {
        let r = request.into_inner();
        let plan = self
            .with_store(move |s| s.plan_after(JobId(r.job_id), r.after_version))
            .await?;
        let plan = plan
            .map(|p| jm::ScalePlan::decode(p.body.as_slice()))
            .transpose()
            .map_err(|e| Status::internal(format!("stored plan does not decode: {e}")))?;
        Ok(Response::new(pb::GetPlanResponse { plan }))
    }

    async fn ack_plan(
        &self,
        request: Request<pb::PlanAck>,
    ) -> Result<Response<pb::PlanAckResponse>, Status> {
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
        let r = request.into_inner();
        if r.roles.is_empty() && r.migrations.is_empty() {
            return Err(Status::invalid_argument(
                "a plan needs a role count or a migration",
            ));
        }
        let version = self
            .with_store(move |s| {
                let body = |version: u64| {
                    jm::ScalePlan {
                        version,
                        roles: r.roles.clone(),
                        migrations: r.migrations.clone(),
                    }
                    .encode_to_vec()
                };
                s.propose_plan(JobId(r.job_id), &body, &r.reason, now_unix_ms())
            })
            .await?;
        Ok(Response::new(pb::ProposePlanResponse { version }))
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobRecord>, Status> {
        let id = JobId(request.into_inner().job_id);
        let row = self.with_store(move |s| s.job(id)).await?;
        Ok(Response::new(record(row)))
    }

    async fn list_jobs(
        &self,
        _request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let rows = self.with_store(|s| s.jobs()).await?;
        Ok(Response::new(pb::ListJobsResponse {
            jobs: rows.into_iter().map(record).collect(),
        }))
    }
}
