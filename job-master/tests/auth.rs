//! Only the job's own processes may call its job master and its parameter servers: every RPC
//! of both, called with no token, a made-up token and another job's secret, is refused with
//! UNAUTHENTICATED and changes nothing; with the job's secret it is answered. (The ring
//! all-reduce's handshake is tested beside it, in worker-agent's `ring.rs`; a whole job whose
//! agents, processes and parameter servers pass the secret on is every other test here.)

mod common;

use std::time::Duration;

use common::*;
use job_master::platform::PlatformConfig;
use proto::jobmaster::v1 as pb;
use tonic::Code;

/// The RPCs `service` declares in the job master's `.proto`, by name: what the lists of calls
/// below must cover, so an RPC added later without its check here fails the tests.
fn rpcs_of(service: &str) -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../proto/proto/brain/jobmaster/v1/jobmaster.proto"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let body = text
        .split(&format!("service {service} {{"))
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .unwrap_or_else(|| panic!("service {service} in {path}"));
    let mut names: Vec<String> = body
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rpc "))
        .map(|l| l.split('(').next().unwrap().trim().to_string())
        .collect();
    names.sort();
    names
}

/// The names of `answers`, sorted.
fn names(answers: &[(&str, Code)]) -> Vec<String> {
    let mut names: Vec<String> = answers.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    names
}

/// Every job master RPC once, with default arguments: the codes they were answered with.
async fn every_master_rpc(c: &mut Client) -> Vec<(&'static str, Code)> {
    let process = pb::ProcessRef {
        role: "worker".into(),
        index: 0,
        incarnation: 1,
    };
    let me = Some(process.clone());
    let code = |r: Result<(), tonic::Status>| r.err().map_or(Code::Ok, |s| s.code());
    vec![
        (
            "RegisterAgent",
            code(
                c.register_agent(pb::RegisterAgentRequest {
                    role: "worker".into(),
                    index: 0,
                    incarnation: 1,
                    host: "127.0.0.1".into(),
                    service_addr: "127.0.0.1:1".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "Heartbeat",
            code(
                c.heartbeat(pb::HeartbeatRequest {
                    process: me.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ReportProcessExit",
            code(
                c.report_process_exit(pb::ProcessExit {
                    process: me.clone(),
                    exit_code: 1,
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "JoinRendezvous",
            code(
                c.join_rendezvous(pb::JoinRendezvousRequest {
                    process: me.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "GetWorkload",
            code(c.get_workload(process.clone()).await.map(drop)),
        ),
        (
            "LeaseShard",
            code(
                c.lease_shard(pb::LeaseShardRequest {
                    process: me.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ReportShardDone",
            code(
                c.report_shard_done(pb::ShardDone {
                    process: me.clone(),
                    shard_id: 0,
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ReportMetrics",
            code(
                c.report_metrics(pb::TrainingMetrics {
                    process: me.clone(),
                    global_step: 1_000_000,
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ServeRole",
            code(
                c.serve_role(pb::ServeRoleRequest {
                    process: me.clone(),
                    address: "127.0.0.1:1".into(),
                    collective_addr: String::new(),
                })
                .await
                .map(drop),
            ),
        ),
        (
            "GetRoleGroup",
            code(
                c.get_role_group(pb::RoleGroupRequest {
                    role: "worker".into(),
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ReportCalls",
            code(
                c.report_calls(pb::CallReport {
                    process: me.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ReportStacks",
            code(
                c.report_stacks(pb::ProcessStacks {
                    process: me.clone(),
                    text: "forged".into(),
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ReportCheckpointPart",
            code(
                c.report_checkpoint_part(pb::CheckpointPart {
                    process: me.clone(),
                    step: 1,
                    parts: 1,
                    path: "/etc/passwd".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "GetCommittedStep",
            code(c.get_committed_step(process.clone()).await.map(drop)),
        ),
        (
            "ReportCheckpointDamaged",
            code(
                c.report_checkpoint_damaged(pb::CheckpointDamaged {
                    process: me.clone(),
                    manifest: "/etc/passwd".into(),
                    problem: "forged".into(),
                })
                .await
                .map(drop),
            ),
        ),
        (
            "CommitCheckpoint",
            code(
                c.commit_checkpoint(pb::CheckpointCommit {
                    process: me.clone(),
                    step: 1,
                    path: "/etc/passwd".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "GetStatus",
            code(c.get_status(pb::StatusRequest {}).await.map(drop)),
        ),
        (
            "ApplyScalePlan",
            code(c.apply_scale_plan(plan(1, Some(1), None)).await.map(drop)),
        ),
    ]
}

/// What the calls above could have changed.
fn visible(s: &pb::JobStatus) -> String {
    format!(
        "{} v{} r{} shards {} step {} checkpoints {} processes {:?}",
        s.phase,
        s.desired_plan_version,
        s.reached_plan_version,
        s.shards_done,
        s.global_step,
        s.checkpoints,
        s.processes
            .iter()
            .map(|p| (p.role.clone(), p.index, p.incarnation, p.state.clone()))
            .collect::<Vec<_>>()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_master_rpc_needs_the_jobs_own_secret() {
    let dir = tempfile::tempdir().unwrap();
    // Agents started by someone else (none here): the job waits for them, nothing moves.
    let ours = start_on(
        builtin_spec(dir.path(), "ours", "allreduce", 0, 2, 8_000, 1, 0, 0),
        &dir.path().join("ours"),
        job_master::job::Timing::default(),
        PlatformConfig::External,
    )
    .await;
    let theirs = start_on(
        builtin_spec(dir.path(), "theirs", "allreduce", 0, 1, 8_000, 1, 0, 0),
        &dir.path().join("theirs"),
        job_master::job::Timing::default(),
        PlatformConfig::External,
    )
    .await;
    let before = loop {
        if let Some(s) = status(ours.addr).await {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let their_secret = wait_secret(theirs.addr).await;
    // The secret is the owner's alone, on disk and in the master's run directory.
    let file = ours.run_dir.join(auth::JOB_TOKEN_FILE);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", file.display());

    for (who, token) in [
        ("no token", None),
        ("a made-up token", Some(auth::Token::generate())),
        ("another job's secret", Some(their_secret)),
    ] {
        let mut c = client_with(ours.addr, token).await.unwrap();
        let answers = every_master_rpc(&mut c).await;
        assert_eq!(
            names(&answers),
            rpcs_of("JobMaster"),
            "every RPC of the service"
        );
        for (rpc, code) in answers {
            assert_eq!(code, Code::Unauthenticated, "{rpc} with {who}");
        }
    }
    let after = status(ours.addr).await.unwrap();
    assert_eq!(visible(&before), visible(&after));

    // The job's own secret is answered (each call on its merits: an agent the master never
    // launched is refused for what it is, not for who it is).
    let answers = every_master_rpc(&mut client(ours.addr).await).await;
    for (rpc, code) in answers {
        assert_ne!(code, Code::Unauthenticated, "{rpc} with the job's secret");
    }
    ours.handle.abort();
}

/// Every parameter server RPC once: the codes they were answered with.
async fn every_ps_rpc(c: &mut Ps, dir: &std::path::Path) -> Vec<(&'static str, Code)> {
    let code = |r: Result<(), tonic::Status>| r.err().map_or(Code::Ok, |s| s.code());
    vec![
        (
            "Pull",
            code(c.pull(pb::PullRequest { keys: vec![0] }).await.map(drop)),
        ),
        (
            "Push",
            code(
                c.push(pb::PushRequest {
                    keys: vec![0],
                    grads: vec![100.0],
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "Save",
            code(
                c.save(pb::SaveRequest {
                    dir: dir.display().to_string(),
                    checkpoint_id: 1,
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        ("Stats", code(c.stats(pb::StatsRequest {}).await.map(drop))),
        (
            "Reshard",
            code(
                c.reshard(pb::ReshardRequest {
                    num_ps: 2,
                    ps: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "Absorb",
            code(
                c.absorb(tokio_stream::iter(vec![pb::AbsorbChunk {
                    keys: vec![7],
                    weights: vec![1.0],
                    accumulators: vec![1.0],
                    num_ps: 1,
                    applied: None,
                }]))
                .await
                .map(drop),
            ),
        ),
        ("Drop", code(c.drop(pb::DropRequest {}).await.map(drop))),
    ]
}

#[tokio::test]
async fn every_parameter_server_rpc_needs_the_jobs_own_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (auth::Token::generate(), auth::Token::generate());
    let addr = start_ps(&ours).await;
    let mut good = ps_with(&addr, Some(ours)).await;
    let before = good.stats(pb::StatsRequest {}).await.unwrap().into_inner();
    for (who, token) in [
        ("no token", None),
        ("a made-up token", Some(auth::Token::generate())),
        ("another job's secret", Some(theirs)),
    ] {
        let mut c = ps_with(&addr, token).await;
        let answers = every_ps_rpc(&mut c, dir.path()).await;
        assert_eq!(
            names(&answers),
            rpcs_of("ParameterServer"),
            "every RPC of the service"
        );
        for (rpc, code) in answers {
            assert_eq!(code, Code::Unauthenticated, "{rpc} with {who}");
        }
    }
    let after = good.stats(pb::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(before, after, "nothing pulled, pushed, absorbed or dropped");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing saved"
    );
    // The job's secret is answered.
    let pulled = good
        .pull(pb::PullRequest { keys: vec![0] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pulled.values, vec![0.5]);
}
