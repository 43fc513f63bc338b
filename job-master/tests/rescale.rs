//! Scale plans carried out on live jobs of real processes: allreduce groups re-formed at new
//! sizes, ps workers added and removed, parameter servers resharded while training, with kill -9
//! in the middle of transitions. Every job must finish with each sample consumed exactly once
//! per epoch, the parameter set unchanged by every reshard, and a loss within 2 % of a static
//! run.

mod common;

use common::*;
use proto::jobmaster::v1 as pb;
use worker_agent::workload::reference;

/// The rescaled job's held-out loss is within 2 % of the static single-process run's.
fn assert_close(loss: f64, reference: f64) {
    let gap = (loss - reference).abs() / reference;
    assert!(gap < 0.02, "rescaled job {loss} vs static {reference}");
}

const N: u64 = 60_000;

/// allreduce workers 2 → 4 → 1 → 3, with a worker killed during the 4 → 1 transition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allreduce_job_rescaled_2_4_1_3_with_a_kill_finishes_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "ar-rescale", "allreduce", 0, 2, N, 2, 60, 10);
    let cfg = workload_of(&spec);
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 6).await;
    let s = rescale_workers(addr, 1, 4).await;

    let done = s.shards_done;
    shards_at_least(addr, done + 6).await;
    send(addr, plan(2, Some(1), None)).await;
    // Mid-transition: kill the survivor's training process.
    let victim = pid_of(addr, "worker", 0).await;
    kill9(victim);
    let s = reached(addr, 2).await;
    assert_eq!(live_workers(&s), 1);

    let done = s.shards_done;
    shards_at_least(addr, done + 6).await;
    rescale_workers(addr, 3, 3).await;

    let report = run.report().await;
    // The model itself counted each sample once per epoch, through every re-formation.
    assert_each_sample_once(&report, N, 2);
    let versions: Vec<u64> = report.transitions.iter().map(|t| t.version).collect();
    assert_eq!(versions, vec![1, 2, 3], "plans reached in order");
    // The kill during plan 2 restarted the group.
    assert_recovered(&report, "every process restarts");
    let (reference, _) = reference::train_dense(&cfg, 1000).unwrap();
    assert_close(report.final_eval_loss.unwrap(), reference);
    assert_no_process_left(addr).await;
}

/// ps job: PS 1 → 3 → 2 resharded live while workers change (3 → 2, then 2 → 4), a worker
/// killed during the first reshard; then workers 4 → 3 with a PS killed during that transition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ps_job_resharded_1_3_2_with_workers_changing_and_kills_finishes_exactly_once() {
    ps_resharded_1_3_2_with_kills(false).await;
}

/// The same with flash checkpoints: the routine cuts are copies in the PS' memory, the plans'
/// cuts (which reshard) go to disk, and after the PS killed in the last transition both PS
/// restore their partitions from memory: a routine cut of the 2-PS layout is committed before
/// that plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ps_job_with_flash_cuts_resharded_1_3_2_with_kills_finishes_exactly_once() {
    let report = ps_resharded_1_3_2_with_kills(true).await;
    let from_memory = report
        .events
        .iter()
        .filter(|e| e.contains(" ps-") && e.contains(") restored step") && e.ends_with("memory"))
        .count();
    assert_eq!(from_memory, 2, "{:#?}", report.events);
}

async fn ps_resharded_1_3_2_with_kills(flash: bool) -> job_master::JobReport {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "ps-rescale", "ps", 1, 3, N, 2, 60, 10);
    if flash {
        spec.checkpoint.flash = Some(vocab::spec::FlashSpec {
            memory: Some(vocab::Bytes(4 << 20)),
        });
    }
    let ps = spec.roles.get_mut(&job_master::spec::Role::PS).unwrap();
    (ps.min, ps.max) = (Some(1), Some(4));
    let cfg = workload_of(&spec);
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 8).await;

    send(addr, plan(1, Some(2), Some(3))).await;
    let victim = pid_of(addr, "worker", 0).await;
    kill9(victim);
    let s = reached(addr, 1).await;
    assert_eq!(live_workers(&s), 2);

    let done = s.shards_done;
    shards_at_least(addr, done + 8).await;
    send(addr, plan(2, Some(4), Some(2))).await;
    let s = reached(addr, 2).await;
    assert_eq!(live_workers(&s), 4);

    let done = s.shards_done;
    shards_at_least(addr, done + 8).await;
    if flash {
        // A routine cut (every 10 shards) of the 2-PS layout, held in memory, committed.
        let taken = s.checkpoints;
        wait_for(
            addr,
            std::time::Duration::from_secs(60),
            "a routine flash cut after plan 2",
            |s| s.checkpoints > taken,
        )
        .await;
    }
    send(addr, plan(3, Some(3), None)).await;
    let victim = pid_of(addr, "ps", 1).await;
    kill9(victim);
    let s = reached(addr, 3).await;
    assert_eq!(live_workers(&s), 3);

    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert!(report.samples_per_epoch.values().all(|&s| s == N));
    assert_eq!(report.ps_stats.len(), 2, "{:?}", report.ps_stats);
    assert_ps_applied_each_sample_once(&report, N, 2);
    for r in &report.reshards {
        assert_eq!(
            r.digest_before, r.digest_after,
            "reshard changed the parameters: {r:?}"
        );
    }
    let moves: Vec<(u32, u32)> = report
        .reshards
        .iter()
        .map(|r| (r.from_ps, r.to_ps))
        .collect();
    assert_eq!(
        moves,
        vec![(1, 3), (3, 2)],
        "live reshards: {:#?}",
        report.events
    );
    assert_recovered(&report, "ps-1 failed (killed by signal 9)");
    let (reference, _) = reference::train_sparse(&cfg, 1000).unwrap();
    assert_close(report.final_eval_loss.unwrap(), reference);
    assert_no_process_left(addr).await;
    report
}

fn migration(role: &str, index: u32, cpu: u64, memory: u64, reason: &str) -> pb::Migration {
    pb::Migration {
        role: role.into(),
        index,
        resources: Some(pb::Resources {
            cpu_millicores: cpu,
            memory_bytes: memory,
            ..Default::default()
        }),
        reason: reason.into(),
    }
}

fn process(s: &pb::JobStatus, role: &str, index: u32) -> pb::ProcessStatus {
    s.processes
        .iter()
        .find(|p| p.role == role && p.index == index)
        .cloned()
        .unwrap_or_else(|| panic!("no {role:?} {index} in {:?}", s.processes))
}

const GI: u64 = 1 << 30;

/// A hot PS gets more CPU and a worker more memory, each by a new process with the state handed
/// over: the PS restores its keys from the cut, and the job still applies each sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_replace_a_ps_and_a_worker_with_new_resources_and_keep_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "ps-migrate", "ps", 2, 2, N, 2, 60, 10);
    let ps_res: job_master::spec::Resources =
        serde_norway::from_str("{ cpu: 1, memory: 1Gi }").unwrap();
    let ps = spec.roles.get_mut(&job_master::spec::Role::PS).unwrap();
    ps.resources = Some(ps_res);
    let cfg = workload_of(&spec);
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 8).await;
    let before = status(addr).await.unwrap();
    let (ps1, w0) = (process(&before, "ps", 1), process(&before, "worker", 0));
    assert_eq!(ps1.resources.as_ref().unwrap().memory_bytes, GI);

    let mut p = plan(1, None, None);
    p.migrations = vec![
        migration("ps", 1, 2000, 2 * GI, "hot ps"),
        migration("worker", 0, 500, 3 * GI / 2, "out of memory"),
    ];
    send(addr, p).await;
    let s = reached(addr, 1).await;
    for (old, want) in [(&ps1, (2000, 2 * GI)), (&w0, (500, 3 * GI / 2))] {
        let now = process(&s, &old.role, old.index);
        assert!(now.incarnation > old.incarnation, "{now:?} after {old:?}");
        let r = now.resources.clone().unwrap();
        assert_eq!((r.cpu_millicores, r.memory_bytes), want, "{now:?}");
    }
    // The PS that stayed kept its process and its resources.
    let ps0 = process(&s, "ps", 0);
    assert_eq!(ps0.incarnation, process(&before, "ps", 0).incarnation);
    assert_eq!(ps0.resources.unwrap().memory_bytes, GI);

    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert!(report.samples_per_epoch.values().all(|&s| s == N));
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("plan 1: migrating ps-1 (hot ps)")),
        "{:#?}",
        report.events
    );
    let (reference, _) = reference::train_sparse(&cfg, 1000).unwrap();
    assert_close(report.final_eval_loss.unwrap(), reference);
    assert_no_process_left(addr).await;
}

/// An allreduce member migrates at a re-formation: the ring keeps its size and the new process
/// loads the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allreduce_worker_migrates_at_a_reformation() {
    let dir = tempfile::tempdir().unwrap();
    let n = 30_000;
    let spec = builtin_spec(dir.path(), "ar-migrate", "allreduce", 0, 2, n, 1, 60, 10);
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 5).await;
    let old = process(&status(addr).await.unwrap(), "worker", 1);
    let mut p = plan(1, None, None);
    p.migrations = vec![migration("worker", 1, 1500, GI, "more cpu")];
    send(addr, p).await;
    let s = reached(addr, 1).await;
    let now = process(&s, "worker", 1);
    assert!(now.incarnation > old.incarnation);
    assert_eq!(now.resources.unwrap().cpu_millicores, 1500);
    assert_eq!(live_workers(&s), 2);
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert_eq!(report.applied_samples, n);
    assert_eq!(report.applied_index_sum, n * (n - 1) / 2);
    assert_no_process_left(addr).await;
}

/// Plans outside the spec's bounds, with stale versions or naming roles the job lacks are
/// rejected with the reason, and the job runs on untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_plans_leave_the_job_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "reject", "allreduce", 0, 2, 20_000, 1, 30, 0);
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 2).await;
    let before = status(addr).await.unwrap();
    let mut c = client(addr).await;
    for (p, why) in [
        (plan(1, Some(9), None), "outside [min 1, max 8]"),
        (plan(1, None, Some(2)), "has no parameter servers"),
        (plan(1, Some(0), None), "outside [min 1, max 8]"),
    ] {
        let a = c.apply_scale_plan(p).await.unwrap().into_inner();
        assert!(!a.accepted);
        assert!(a.reason.contains(why), "{}", a.reason);
    }
    send(addr, plan(5, Some(3), None)).await;
    let a = c
        .apply_scale_plan(plan(4, Some(2), None))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !a.accepted && a.reason.contains("not newer"),
        "{}",
        a.reason
    );
    reached(addr, 5).await;
    let after = status(addr).await.unwrap();
    assert!(after.global_step >= before.global_step);
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert_eq!(report.transitions.len(), 1);
}

/// An all-reduce group named freely (`actor`, `topology: allreduce`) is the job's training
/// group under that name: its processes are `actor-N`, a plan resizes it by name (one naming
/// `worker` is refused with the group's name), a killed rank restarts the group, and every
/// sample is consumed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_reduce_group_named_actor_is_resized_by_its_name_and_finishes_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = builtin_yaml(dir.path(), "actor", "allreduce", 0, 2, N, 1, 60, 10)
        .replace("  worker: {", "  actor: { topology: allreduce,");
    let spec = vocab::spec::JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let cfg = workload_of(&spec);
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 4).await;
    let actors = |s: &pb::JobStatus| {
        s.processes
            .iter()
            .filter(|p| p.state != "removed")
            .map(|p| p.role.clone())
            .collect::<Vec<_>>()
    };
    let s = status(addr).await.unwrap();
    assert_eq!(actors(&s), ["actor", "actor"], "{:?}", s.processes);
    let mut c = client(addr).await;
    let a = c
        .apply_scale_plan(plan(1, Some(3), None))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !a.accepted
            && a.reason
                .contains("its training group is actor (`--role actor=N`"),
        "{}",
        a.reason
    );
    let by_name = |version, count| pb::ScalePlan {
        version,
        roles: vec![pb::RoleTarget {
            role: "actor".into(),
            count,
            resources: None,
            nodes: Vec::new(),
        }],
        ..Default::default()
    };
    send(addr, by_name(1, 3)).await;
    let s = reached(addr, 1).await;
    assert_eq!(actors(&s), ["actor"; 3], "{:?}", s.processes);
    // A rank killed: the group restarts from its checkpoint (failover: role).
    let done = s.shards_done;
    shards_at_least(addr, done + 4).await;
    kill9(pid_of(addr, "actor", 1).await);
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_each_sample_once(&report, N, 1);
    assert_eq!(report.transitions.len(), 1);
    let actor = vocab::Role::new("actor").unwrap();
    assert!(
        report.restarts.get(&actor).copied().unwrap_or(0) >= 1,
        "{:?}",
        report.restarts
    );
    assert!(!report.restarts.contains_key(&vocab::Role::WORKER));
    // `job-master logs` without --role reads the training group's rank 0: actor-0.
    let out = std::process::Command::new(job_master_bin())
        .arg("logs")
        .arg(&run.run_dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("actor-0"), "{said}");
    let (reference, _) = reference::train_dense(&cfg, 1000).unwrap();
    assert_close(report.final_eval_loss.unwrap(), reference);
    assert_no_process_left(addr).await;
}

/// `job-master scale` sends a plan by hand and follows it, finding the master, the job's
/// secret and its TLS from the run directory alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scale_command_sends_a_plan_and_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "cli-scale", "ps", 1, 2, 30_000, 1, 60, 0);
    let mut run = start_tls(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 2).await;
    // Without the job's secret: refused before anything is sent.
    let out = tokio::process::Command::new(job_master_bin())
        .args(["scale", "--job", &addr.to_string(), "--workers", "3"])
        .env_remove(auth::JOB_TOKEN_ENV)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token-file"));
    // Plain text to a master of a job with TLS: no answer, nothing sent in the clear.
    let out = scale_cli(addr, &run.run_dir, &["--workers", "3"]).await;
    assert_eq!(out.status.code(), Some(2));
    let out = tokio::process::Command::new(job_master_bin())
        .args(["scale", "--workers", "3", "--wait", "--run-dir"])
        .arg(&run.run_dir)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("plan 1 accepted") && stdout.contains("plan 1 reached"),
        "{stdout}"
    );
    let secret = run.run_dir.join(auth::JOB_TOKEN_FILE);
    let bad = tokio::process::Command::new(job_master_bin())
        .args(["scale", "--job", &addr.to_string(), "--workers", "99"])
        .arg("--token-file")
        .arg(&secret)
        .output()
        .await
        .unwrap();
    assert_eq!(bad.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("outside [min 1, max 8]"));
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert_ps_applied_each_sample_once(&report, 30_000, 1);
}
