//! Who may call a real brain process: every RPC of `brain.service.v1.Brain`, called with no
//! token, with a token the brain never gave, with another job's secret (for a job's calls) and
//! with a job's secret (for an operator's calls), is refused (UNAUTHENTICATED or
//! PERMISSION_DENIED), and the brain's store and policy are the same afterwards. The operator
//! token is an owner-only file beside the database; brainctl sends it, and without it is told
//! where it was looked for.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use common::{Client, brainctl, client_with, operator_client};
use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use tonic::{Code, Status};

/// The brain's RPCs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rpc {
    RegisterJob,
    ReportMetrics,
    GetPlan,
    AckPlan,
    ProposePlan,
    GetJob,
    ListJobs,
    SubmitJob,
    ReportOutcome,
    DryRun,
    GetPolicy,
    SetPolicy,
    CancelJob,
    ListNodes,
    CordonNode,
    UncordonNode,
    Diagnose,
    JobEvents,
    JobLogs,
}

const ALL: [Rpc; 19] = [
    Rpc::RegisterJob,
    Rpc::ReportMetrics,
    Rpc::GetPlan,
    Rpc::AckPlan,
    Rpc::ProposePlan,
    Rpc::GetJob,
    Rpc::ListJobs,
    Rpc::SubmitJob,
    Rpc::ReportOutcome,
    Rpc::DryRun,
    Rpc::GetPolicy,
    Rpc::SetPolicy,
    Rpc::CancelJob,
    Rpc::ListNodes,
    Rpc::CordonNode,
    Rpc::UncordonNode,
    Rpc::Diagnose,
    Rpc::JobEvents,
    Rpc::JobLogs,
];

impl Rpc {
    /// What a job master makes for its own job (the rest are an operator's).
    fn jobs_own(self) -> bool {
        matches!(
            self,
            Rpc::RegisterJob
                | Rpc::ReportMetrics
                | Rpc::GetPlan
                | Rpc::AckPlan
                | Rpc::ReportOutcome
        )
    }

    /// What a job's secret may read of its own job (its owner's view: the console signed in
    /// with it, `brainctl` given it).
    fn reads_own(self) -> bool {
        matches!(self, Rpc::GetJob | Rpc::JobEvents | Rpc::JobLogs)
    }
}

/// Calls `rpc` on job `job` (named `name`) with requests that would change the store if let
/// through.
async fn call(c: &mut Client, rpc: Rpc, job: u64, name: &str) -> Result<(), Status> {
    let report = pb::MetricReport {
        at_unix_ms: 1_700_000_000_000,
        global_step: 1,
        samples_per_second: 100.0,
        roles: common::counts(1, 0),
        samples_done: 100,
        ..Default::default()
    };
    match rpc {
        Rpc::RegisterJob => c
            .register_job(pb::RegisterJobRequest {
                job_name: name.into(),
                master_address: "10.9.9.9:1".into(),
                shape: None,
            })
            .await
            .map(drop),
        Rpc::ReportMetrics => c
            .report_metrics(pb::MetricsBatch {
                job_id: job,
                reports: vec![report],
            })
            .await
            .map(drop),
        Rpc::GetPlan => c
            .get_plan(pb::GetPlanRequest {
                job_id: job,
                after_version: 0,
            })
            .await
            .map(drop),
        Rpc::AckPlan => c
            .ack_plan(pb::PlanAck {
                job_id: job,
                version: 1,
                accepted: true,
                reason: String::new(),
                reached_version: 1,
            })
            .await
            .map(drop),
        Rpc::ProposePlan => c
            .propose_plan(pb::ProposePlanRequest {
                job_id: job,
                roles: vec![jm::RoleTarget {
                    nodes: Vec::new(),
                    role: "worker".into(),
                    count: 2,
                    resources: None,
                }],
                migrations: vec![],
                reason: "steal".into(),
                force: false,
            })
            .await
            .map(drop),
        Rpc::GetJob => c
            .get_job(pb::GetJobRequest { job_id: job })
            .await
            .map(drop),
        Rpc::ListJobs => c.list_jobs(pb::ListJobsRequest {}).await.map(drop),
        Rpc::SubmitJob => c
            .submit_job(pb::SubmitJobRequest {
                spec_yaml: "name: intruder\nkind: allreduce\nroles:\n  worker: {}\n\
                            workload:\n  builtin: {}\ndata: { num_samples: 1000, shard_size: 100 }\n"
                    .into(),
                origin: "test".into(),
            })
            .await
            .map(drop),
        Rpc::ReportOutcome => c
            .report_outcome(pb::JobOutcome {
                job_id: job,
                phase: "succeeded".into(),
                reason: String::new(),
                elapsed_ms: 1,
                samples_done: 1,
                exactly_once: "ok".into(),
            })
            .await
            .map(drop),
        Rpc::DryRun => c.dry_run(pb::DryRunRequest {}).await.map(drop),
        Rpc::GetPolicy => c.get_policy(pb::GetPolicyRequest {}).await.map(drop),
        Rpc::SetPolicy => c
            .set_policy(pb::PolicyText {
                toml: "[live]\ninterval_s = 99\n".into(),
                path: String::new(),
            })
            .await
            .map(drop),
        Rpc::CancelJob => c
            .cancel_job(pb::CancelJobRequest {
                job_id: job,
                reason: "steal".into(),
            })
            .await
            .map(drop),
        Rpc::ListNodes => c.list_nodes(pb::ListNodesRequest {}).await.map(drop),
        Rpc::CordonNode => c
            .cordon_node(pb::CordonNodeRequest {
                node: "local".into(),
                reason: "steal the cluster".into(),
                for_s: 0,
            })
            .await
            .map(drop),
        Rpc::UncordonNode => c
            .uncordon_node(pb::UncordonNodeRequest {
                node: "local".into(),
            })
            .await
            .map(drop),
        Rpc::Diagnose => c
            .diagnose(pb::DiagnoseRequest {
                job_id: job,
                all: true,
            })
            .await
            .map(drop),
        Rpc::JobEvents => c
            .job_events(pb::JobEventsRequest { job_id: job })
            .await
            .map(drop),
        Rpc::JobLogs => c
            .job_logs(pb::JobLogsRequest {
                job_id: job,
                process: "worker-0".into(),
                offset: 0,
                incarnation: 0,
                tail: 0,
            })
            .await
            .map(drop),
    }
}

/// Everything the calls above could change, as the operator reads it.
async fn state(op: &mut Client) -> String {
    let jobs = op
        .list_jobs(pb::ListJobsRequest {})
        .await
        .unwrap()
        .into_inner();
    let policy = op
        .get_policy(pb::GetPolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    let nodes = op
        .list_nodes(pb::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner();
    format!("{jobs:?}\n{policy:?}\n{nodes:?}")
}

#[tokio::test]
async fn every_rpc_refuses_no_token_a_foreign_token_and_another_jobs_secret() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policy.toml"),
        "[live]\ninterval_s = 3600\n",
    )
    .unwrap();
    let (mut brain, addr) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--cpus", "4", "--database"])
            .arg(dir.path().join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.path().join("runs"))
            .arg("--policy")
            .arg(dir.path().join("policy.toml"))
            .stderr(Stdio::null());
    });
    let url = format!("http://{addr}");
    let token_file = dir.path().join("operator.token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "the operator token is its owner's alone"
    );

    // Two jobs registered by the operator (job masters started by hand), each with its secret.
    let mut op = operator_client(&url).await;
    let mut register = async |name: &str| {
        op.register_job(pb::RegisterJobRequest {
            job_name: name.into(),
            master_address: "127.0.0.1:1".into(),
            shape: None,
        })
        .await
        .unwrap()
        .into_inner()
    };
    let a = register("job-a").await;
    let b = register("job-b").await;
    let a_secret = auth::Token::parse(&a.job_token).unwrap();
    let b_secret = auth::Token::parse(&b.job_token).unwrap();
    let mut job_a = client_with(&url, Some(a_secret.clone())).await;
    // The operator's calls go through with its token (a plan for job a to acknowledge) ...
    call(&mut op, Rpc::ProposePlan, a.job_id, "job-a")
        .await
        .unwrap();
    // ... and a job's own with its secret.
    for rpc in ALL
        .into_iter()
        .filter(|r| r.jobs_own() && *r != Rpc::ReportOutcome)
    {
        call(&mut job_a, rpc, a.job_id, "job-a")
            .await
            .unwrap_or_else(|e| panic!("{rpc:?} of job a with its secret: {e:?}"));
    }
    call(&mut job_a, Rpc::GetJob, a.job_id, "job-a")
        .await
        .unwrap();
    // Its events and output: let through (a job registered by hand has no run directory the
    // brain reads, so there is nothing to find).
    for rpc in [Rpc::JobEvents, Rpc::JobLogs] {
        if let Err(e) = call(&mut job_a, rpc, a.job_id, "job-a").await {
            assert!(
                matches!(e.code(), Code::NotFound | Code::FailedPrecondition),
                "{rpc:?} of job a with its secret: {e:?}"
            );
        }
    }

    let before = state(&mut op).await;
    let mut none = client_with(&url, None).await;
    let mut foreign = client_with(&url, Some(auth::Token::generate())).await;
    let mut job_b = client_with(&url, Some(b_secret)).await;
    for rpc in ALL {
        for (who, c, want) in [
            ("no token", &mut none, Code::Unauthenticated),
            (
                "a token the brain never gave",
                &mut foreign,
                Code::Unauthenticated,
            ),
        ] {
            let e = call(c, rpc, a.job_id, "job-a").await.unwrap_err();
            assert_eq!(e.code(), want, "{rpc:?} with {who}: {e:?}");
        }
        // Job b's secret acting on job a (or making an operator's call).
        let e = call(&mut job_b, rpc, a.job_id, "job-a").await.unwrap_err();
        assert_eq!(
            e.code(),
            Code::PermissionDenied,
            "{rpc:?} with b's secret: {e:?}"
        );
        if !rpc.jobs_own() && !rpc.reads_own() {
            // A job's secret makes no operator call, even about its own job.
            let e = call(&mut job_a, rpc, a.job_id, "job-a").await.unwrap_err();
            assert_eq!(
                e.code(),
                Code::PermissionDenied,
                "{rpc:?} with a's secret: {e:?}"
            );
        }
    }
    // Nor does a job's secret register another job's name (or a new one).
    for name in ["job-b", "job-new"] {
        let e = call(&mut job_a, Rpc::RegisterJob, a.job_id, name)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{name}: {e:?}");
    }
    assert_eq!(
        state(&mut op).await,
        before,
        "a refused call changed the store"
    );

    // The secrets outlive the brain (only their digests are stored).
    brain.kill();
    let (mut brain, addr2) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", &addr, "--cpus", "4", "--database"])
            .arg(dir.path().join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.path().join("runs"))
            .arg("--policy")
            .arg(dir.path().join("policy.toml"))
            .stderr(Stdio::null());
    });
    assert_eq!(addr2, addr);
    let mut job_a = client_with(&url, Some(a_secret)).await;
    call(&mut job_a, Rpc::GetPlan, a.job_id, "job-a")
        .await
        .unwrap();
    let db = std::fs::read(dir.path().join("brain.db")).unwrap();
    assert!(
        !db.windows(64).any(|w| w == a.job_token.as_bytes()),
        "the store holds a job's secret"
    );

    // brainctl sends the operator token; without it, it says where it looked.
    let (ok, out) = brainctl(&["jobs", "--brain", &url]);
    assert!(ok && out.contains("job-a"), "{out}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brainctl"))
        .args(["jobs", "--brain", &url, "--token-file"])
        .arg(dir.path().join("missing.token"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("the operator token") && err.contains("missing.token"),
        "{err}"
    );
    brain.kill();
}
