//! Fuzzing the brain's RPC handlers on stable Rust (proptest): random bytes decoded as each
//! RPC's request (what decodes is sent; half the time with the job id set to a real job, so the
//! handler gets past the authorization) go to a real brain process, with the operator token for
//! an operator's call and the job's secret for a job's. Every answer is a success or a clear
//! refusal: never UNKNOWN or INTERNAL (what a panicking handler produces), never an empty
//! message, and the brain still answers afterwards. CI runs 300 calls; the long run is
//! `PROPTEST_CASES=100000 cargo test -p brain --test fuzz_rpc`.

mod common;

use std::process::Stdio;

use common::{Client, client_with, operator_client};
use proptest::prelude::any;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use prost::Message;
use proto::service::v1 as pb;
use tonic::Code;

/// Decodes `bytes` as request `$t`, sets its job id where it has one, and calls `$m`.
macro_rules! send {
    ($c:expr, $m:ident, $t:ty, $bytes:expr, $job:expr) => {{
        let Ok(mut req) = <$t>::decode($bytes) else {
            return None;
        };
        if let Some(job) = $job {
            set_job(&mut req, job);
        }
        Some($c.$m(req).await.map(drop))
    }};
}

trait JobIdOf {
    fn job_id(&mut self) -> Option<&mut u64>;
}
macro_rules! with_job {
    ($($t:ty),*) => {$(impl JobIdOf for $t { fn job_id(&mut self) -> Option<&mut u64> { Some(&mut self.job_id) } })*};
}
macro_rules! without_job {
    ($($t:ty),*) => {$(impl JobIdOf for $t { fn job_id(&mut self) -> Option<&mut u64> { None } })*};
}
with_job!(
    pb::MetricsBatch,
    pb::GetPlanRequest,
    pb::PlanAck,
    pb::ProposePlanRequest,
    pb::GetJobRequest,
    pb::JobOutcome,
    pb::CancelJobRequest,
    pb::DiagnoseRequest,
    pb::JobEventsRequest,
    pb::JobLogsRequest
);
without_job!(
    pb::RegisterJobRequest,
    pb::ListJobsRequest,
    pb::SubmitJobRequest,
    pb::DryRunRequest,
    pb::GetPolicyRequest,
    pb::PolicyText,
    pb::ListNodesRequest,
    pb::CordonNodeRequest,
    pb::UncordonNodeRequest
);

fn set_job<T: JobIdOf>(req: &mut T, job: u64) {
    if let Some(id) = req.job_id() {
        *id = job;
    }
}

/// RPC number `rpc` (of 19) with `bytes` as its request; `None` when they do not decode.
async fn call(
    op: &mut Client,
    job: &mut Client,
    rpc: u8,
    bytes: &[u8],
    real: Option<u64>,
) -> Option<Result<(), tonic::Status>> {
    match rpc % 19 {
        0 => send!(job, register_job, pb::RegisterJobRequest, bytes, real),
        1 => send!(job, report_metrics, pb::MetricsBatch, bytes, real),
        2 => send!(job, get_plan, pb::GetPlanRequest, bytes, real),
        3 => send!(job, ack_plan, pb::PlanAck, bytes, real),
        4 => send!(job, report_outcome, pb::JobOutcome, bytes, real),
        5 => send!(op, propose_plan, pb::ProposePlanRequest, bytes, real),
        6 => send!(op, get_job, pb::GetJobRequest, bytes, real),
        7 => send!(op, list_jobs, pb::ListJobsRequest, bytes, real),
        8 => send!(op, submit_job, pb::SubmitJobRequest, bytes, real),
        9 => send!(op, dry_run, pb::DryRunRequest, bytes, real),
        10 => send!(op, get_policy, pb::GetPolicyRequest, bytes, real),
        11 => send!(op, set_policy, pb::PolicyText, bytes, real),
        12 => send!(op, cancel_job, pb::CancelJobRequest, bytes, real),
        13 => send!(op, list_nodes, pb::ListNodesRequest, bytes, real),
        14 => send!(op, cordon_node, pb::CordonNodeRequest, bytes, real),
        15 => send!(op, uncordon_node, pb::UncordonNodeRequest, bytes, real),
        16 => send!(op, diagnose, pb::DiagnoseRequest, bytes, real),
        17 => send!(op, job_events, pb::JobEventsRequest, bytes, real),
        _ => send!(op, job_logs, pb::JobLogsRequest, bytes, real),
    }
}

#[test]
fn random_requests_get_answers_or_clear_refusals_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("policy.toml"), "[live]\ninterval_s = 3600\n").unwrap();
    let (mut brain, addr) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--cpus", "2", "--database"])
            .arg(d.join("brain.db"))
            .arg("--runs-dir")
            .arg(d.join("runs"))
            .arg("--policy")
            .arg(d.join("policy.toml"))
            .stderr(Stdio::null());
    });
    let url = format!("http://{addr}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut op, job, id) = rt.block_on(async {
        let mut op = operator_client(&url).await;
        let r = op
            .register_job(pb::RegisterJobRequest {
                job_name: "fuzzed".into(),
                master_address: "127.0.0.1:1".into(),
                shape: None,
            })
            .await
            .unwrap()
            .into_inner();
        let job = client_with(&url, auth::Token::parse(&r.job_token)).await;
        (op, job, r.job_id)
    });
    let mut runner = TestRunner::new(Config::with_cases(test_support::fuzz::cases(300)));
    let sent = std::sync::atomic::AtomicU32::new(0);
    let strategy = (any::<u8>(), test_support::fuzz::message(), any::<bool>());
    runner
        .run(&strategy, |(rpc, bytes, real)| {
            let (mut op, mut job) = (op.clone(), job.clone());
            let answer = rt.block_on(call(&mut op, &mut job, rpc, &bytes, real.then_some(id)));
            if let Some(Err(e)) = &answer
                && (matches!(e.code(), Code::Unknown | Code::Internal) || e.message().is_empty())
            {
                return Err(TestCaseError::fail(format!(
                    "rpc {} with {bytes:?}: {e:?}",
                    rpc % 19
                )));
            }
            if answer.is_some() {
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap();
    // Still answering.
    rt.block_on(async {
        op.list_jobs(pb::ListJobsRequest {}).await.unwrap();
    });
    let sent = sent.into_inner();
    assert!(sent > 0, "no request decoded");
    eprintln!("{sent} random requests sent");
    brain.kill();
}
