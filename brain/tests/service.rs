//! The brain service as a job master and an operator meet it: a real `brain` process on
//! loopback with a real SQLite file, killed with SIGKILL in the middle of a stream of metric
//! reports and started again on the same file.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::{Client, client_with, operator_client};
use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use tonic::Code;

/// Starts `brain` on port 0; returns the process and its address.
fn start(db: &Path) -> (common::Brain, String) {
    let (child, addr) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--database"])
            .arg(db)
            .arg("--runs-dir")
            .arg(db.with_file_name("runs"))
            .stderr(Stdio::null());
    });
    (child, format!("http://{addr}"))
}

fn report(step: u64, sps: f64) -> pb::MetricReport {
    pb::MetricReport {
        role_rates: Vec::new(),
        at_unix_ms: 1_700_000_000_000 + step as i64,
        global_step: step,
        samples_per_second: sps,
        roles: common::counts(2, 1),
        cpu_millicores: 3000,
        memory_bytes: 2 << 30,
        gpu_utilisation_pct: 0.0,
        samples_done: step * 100,
        processes: Vec::new(),
        ..Default::default()
    }
}

#[tokio::test]
async fn jobs_reports_and_plans_survive_a_kill_9_of_the_brain() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("brain.db");
    let (mut brain, addr) = start(&db);
    // The operator registers the jobs (as a job master started by hand does), and each job
    // master goes on with its job's own secret.
    let mut c = operator_client(&addr).await;
    let a = c
        .register_job(pb::RegisterJobRequest {
            job_name: "ctr-a".into(),
            master_address: "127.0.0.1:7001".into(),
            shape: None,
        })
        .await
        .unwrap()
        .into_inner();
    let b = c
        .register_job(pb::RegisterJobRequest {
            job_name: "ctr-b".into(),
            master_address: "127.0.0.1:7002".into(),
            shape: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(a.job_id, b.job_id);
    assert_eq!(a.plan_version, 0);
    assert_ne!(a.job_token, b.job_token);
    let a_token = auth::Token::parse(&a.job_token).expect("a job secret");
    let mut ja = client_with(&addr, Some(a_token.clone())).await;

    // Bad reports: clear errors, nothing stored.
    let bad = [
        (a.job_id, report(1, f64::NAN), Code::InvalidArgument, "NaN"),
        (a.job_id, report(1, -1.0), Code::InvalidArgument, "-1"),
        (
            a.job_id,
            pb::MetricReport {
                memory_bytes: u64::MAX,
                ..report(1, 1.0)
            },
            Code::InvalidArgument,
            "memory_bytes",
        ),
        (
            999,
            report(1, 1.0),
            Code::PermissionDenied,
            "cannot act on job 999",
        ),
    ];
    for (job, r, code, says) in bad {
        let e = ja
            .report_metrics(pb::MetricsBatch {
                job_id: job,
                reports: vec![report(1, 1.0), r],
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(says), "{}", e.message());
    }
    let job = |c: &mut Client, id| {
        let mut c = c.clone();
        async move {
            c.get_job(pb::GetJobRequest { job_id: id })
                .await
                .unwrap()
                .into_inner()
        }
    };
    assert_eq!(job(&mut c, a.job_id).await.reports, 0);

    // An operator's plan, picked up by the job master by version and acknowledged.
    let proposed = c
        .propose_plan(pb::ProposePlanRequest {
            job_id: a.job_id,
            roles: vec![jm::RoleTarget {
                nodes: Vec::new(),
                role: "worker".into(),
                count: 4,
                resources: None,
            }],
            migrations: vec![],
            reason: "grow".into(),
            force: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(proposed.version, 1);
    let plan = ja
        .get_plan(pb::GetPlanRequest {
            job_id: a.job_id,
            after_version: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .plan
        .unwrap();
    assert_eq!((plan.version, plan.roles[0].count), (1, 4));
    ja.ack_plan(pb::PlanAck {
        job_id: a.job_id,
        version: 1,
        accepted: true,
        reason: String::new(),
        reached_version: 0,
    })
    .await
    .unwrap();

    // A stream of batches; SIGKILL the brain in the middle of it.
    let mut acked = 0u64;
    let stream = {
        let mut c = ja.clone();
        let id = a.job_id;
        tokio::spawn(async move {
            let mut acked = 0u64;
            let mut i = 0u64;
            while i < 100_000 {
                let reports = (0..10).map(|k| report(i * 10 + k, 100.0)).collect();
                match c
                    .report_metrics(pb::MetricsBatch {
                        job_id: id,
                        reports,
                    })
                    .await
                {
                    Ok(r) => {
                        acked += r.into_inner().stored as u64;
                        i += 1;
                    }
                    // Over the brain's rate limit: this batch again, a little later.
                    Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    Err(_) => break,
                }
            }
            acked
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while acked == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no metric batch was stored within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        acked = job(&mut c, a.job_id).await.reports;
    }
    brain.kill();
    let acked = stream.await.unwrap();
    assert!(acked > 0);

    let (mut brain, addr) = start(&db);
    let mut c = operator_client(&addr).await;
    // The job's secret outlives the brain: its master registers again with it.
    let mut ja = client_with(&addr, Some(a_token)).await;
    let again = ja
        .register_job(pb::RegisterJobRequest {
            job_name: "ctr-a".into(),
            master_address: "127.0.0.1:7003".into(),
            shape: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.job_id, again.plan_version), (a.job_id, 1));
    assert_eq!(again.job_token, "", "a job's secret is not minted again");
    let row = job(&mut c, a.job_id).await;
    // Every acknowledged batch is there; the one in flight is wholly there or not at all.
    assert!(
        row.reports == acked || row.reports == acked + 10,
        "{} stored, {acked} acknowledged",
        row.reports
    );
    assert_eq!(row.reports % 10, 0);
    assert_eq!(row.mean_samples_per_second, 100.0);
    assert_eq!((row.plan_version, row.acked_version), (1, 1));
    assert_eq!(row.master_address, "127.0.0.1:7003");
    let all = c
        .list_jobs(pb::ListJobsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.jobs.len(), 2);

    // What an operator sees with brainctl.
    let brainctl = common::brainctl;
    let (ok, text) = brainctl(&["jobs", "--brain", &addr]);
    assert!(ok, "{text}");
    assert!(text.contains("ctr-a") && text.contains("ctr-b"), "{text}");
    assert!(text.contains(&format!("{}  ", row.reports)), "{text}");
    let (ok, text) = brainctl(&["status", &a.job_id.to_string(), "--brain", &addr]);
    assert!(ok && text.contains("master: 127.0.0.1:7003"), "{text}");
    let (ok, text) = brainctl(&["status", "999", "--brain", &addr]);
    assert!(!ok && text.contains("unknown job 999"), "{text}");
    brain.kill();
}

/// A job whose GPUs the cluster's GPU nodes can never hold is refused at submission with the
/// reason, whole roles and placement groups alike (issue 41, item 3), and nothing is stored;
/// so is one whose processes or packed group ask for more CPU, or memory, than the cluster
/// has (`[cluster] memory`, the pool's without Ray); shares of a device that fit are
/// accepted, with their share in the job's shape.
#[tokio::test]
async fn placements_no_gpu_node_can_hold_are_refused_at_submission() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "[submissions]\ncommands = [\"/bin/sleep 600\"]\n",
    )
    .unwrap();
    let (_brain, url) = common::configured_brain(
        d,
        "[cluster]\ncpus = 16\nmemory = \"8Gi\"\n\
         [[cluster.gpu_nodes]]\nname = \"v\"\ngpus = 2\ngpu_type = \"V100\"\n\
         [[cluster.gpu_nodes]]\nname = \"a\"\ngpus = 4\ngpu_type = \"A100\"\n",
        |cmd| {
            cmd.arg("--policy").arg(d.join("policy.toml"));
        },
    );
    let mut op = operator_client(&url).await;
    let spec = |name: &str, rollouts: u32, group: &str| {
        format!(
            "name: {name}\nkind: allreduce\nroles:\n  \
             worker: {{ replicas: 2, min: 2, max: 2, resources: {{ cpu: 1, gpu: 0.5 }} }}\n  \
             rollout: {{ replicas: {rollouts}, command: [/bin/sleep, \"600\"], \
             resources: {{ cpu: 0.5, gpu: 0.5 }} }}\n\
             workload:\n  builtin: {{}}\ndata: {{ num_samples: 1000, shard_size: 100 }}\n\
             checkpoint: {{ dir: checkpoints }}\nplacement:\n  - {group}\n"
        )
    };
    let shared = "{ roles: [worker, rollout], strategy: strict_spread, share_devices: true }";
    for (name, text, says) in [
        (
            "three-pairs",
            spec("three-pairs", 3, shared),
            "placement[0] (worker+rollout): strict_spread needs 3 nodes each with 1 GPUs or \
             more, and 2 node(s) have that",
        ),
        (
            "packed",
            spec(
                "packed",
                4,
                "{ roles: [worker, rollout], strategy: strict_pack }",
            )
            .replace("cpu: 1, gpu: 0.5", "cpu: 1, gpu: 2"),
            "strict_pack needs 6 GPUs on one node",
        ),
        // Engines of 24 CPUs on a cluster of 16, or a pack of 17: never, whatever the GPUs.
        (
            "wide",
            spec("wide", 2, shared).replace("cpu: 0.5, gpu: 0.5", "cpu: 24, gpu: 0.5"),
            "role rollout: each process asks for 24 CPUs, and the cluster's 1 node(s) have at \
             most 16 CPUs",
        ),
        (
            "big-pack",
            spec(
                "big-pack",
                2,
                "{ roles: [worker, rollout], strategy: strict_pack }",
            )
            .replace("cpu: 1, gpu: 0.5", "cpu: 8, gpu: 0.5"),
            "placement[0] (worker+rollout): strict_pack needs 17 CPUs on one node",
        ),
        // Engines of 12 GiB on a pool of 8 GiB (no Ray: `[cluster] memory`).
        (
            "heavy",
            spec("heavy", 2, shared)
                .replace("cpu: 0.5, gpu: 0.5", "cpu: 0.5, memory: 12Gi, gpu: 0.5"),
            "role rollout: each process asks for 12 GiB, and the cluster's 1 node(s) have at \
             most 8 GiB",
        ),
    ] {
        let e = op
            .submit_job(pb::SubmitJobRequest {
                spec_yaml: text,
                origin: name.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e:?}");
        assert!(e.message().contains(says), "{name}: {e:?}");
        // A GPU refusal lists the cluster's GPUs.
        assert!(
            says.contains("CPUs")
                || says.contains("GiB")
                || e.message().contains(
                    "A100: 4 GPUs, at most 4 on a node; V100: 2 GPUs, at most 2 on a node"
                ),
            "{name}: {e:?}"
        );
    }
    let listed = op
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.jobs.is_empty(), "{listed:?}");
    // Two pairs fit (one per GPU node); the shape keeps the shares.
    let ok = op
        .submit_job(pb::SubmitJobRequest {
            spec_yaml: spec("two-pairs", 2, shared),
            origin: "two-pairs".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let shape = ok.shape.unwrap();
    let gpus = |i: usize| shape.roles[i].resources.clone().unwrap().gpu_milli;
    assert!(shape.roles[0].training, "{shape:?}");
    assert_eq!((gpus(0), gpus(1)), (500, 500), "{shape:?}");
}

/// Cordoned nodes (issue 42, item 2): `brainctl nodes` lists the brain's nodes (the CPU pool
/// `local` and the configured GPU nodes); a cordon carries its reason, since and until when,
/// takes the node out of what rounds plan on, survives a kill -9 of the brain, expires, and is
/// lifted by `uncordon`. Unknown nodes and empty reasons are refused, changing nothing.
#[test]
fn nodes_are_cordoned_with_a_reason_until_lifted_or_expired() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let toml = "[cluster]\ncpus = 16\n\
                [[cluster.gpu_nodes]]\nname = \"v\"\ngpus = 2\ngpu_type = \"V100\"\n\
                [[cluster.gpu_nodes]]\nname = \"a\"\ngpus = 4\ngpu_type = \"A100\"\n";
    let (mut brain, url) = common::configured_brain(d, toml, |_| {});
    let ctl = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--brain", url.as_str()]);
        common::brainctl(&all)
    };
    let line = |out: &str, node: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(node))
            .unwrap_or_else(|| panic!("no {node} in {out}"))
            .to_string()
    };
    let (ok, out) = ctl(&["nodes"]);
    assert!(ok, "{out}");
    assert!(
        line(&out, "local").contains("16.0") && line(&out, "local").contains(" ok"),
        "{out}"
    );
    assert!(line(&out, "a").contains("4 A100"), "{out}");

    let (ok, out) = ctl(&[
        "nodes",
        "cordon",
        "a",
        "--reason",
        "ECC errors",
        "--for",
        "1h",
    ]);
    assert!(ok, "{out}");
    let a = line(&out, "a");
    assert!(
        a.contains("cordoned") && a.contains("ECC errors (since ") && a.contains(", until "),
        "{out}"
    );
    // The CPU pool cordoned too: a round plans on no CPU.
    let (ok, out) = ctl(&["nodes", "cordon", "local", "--reason", "maintenance"]);
    assert!(ok && out.contains("until uncordoned"), "{out}");
    let (ok, plan) = ctl(&["plan", "--dry-run"]);
    assert!(ok && plan.contains("of 0.0 CPUs"), "{plan}");

    // Refused, changing nothing.
    let (ok, out) = ctl(&["nodes", "cordon", "zz", "--reason", "x"]);
    assert!(
        !ok && out.contains("no node \"zz\": the brain's nodes are local, v, a"),
        "{out}"
    );
    let (ok, out) = ctl(&["nodes", "cordon", "v", "--reason", " "]);
    assert!(!ok && out.contains("a cordon needs a reason"), "{out}");
    let (ok, out) = ctl(&["nodes", "uncordon", "v"]);
    assert!(!ok && out.contains("node v is not cordoned"), "{out}");

    // kill -9: the cordons are in the store.
    brain.kill();
    let (_brain, url2) = common::configured_brain(d, toml, |_| {});
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url2]);
    assert!(ok, "{out}");
    assert!(line(&out, "a").contains("ECC errors"), "{out}");
    assert!(line(&out, "v").contains(" ok"), "{out}");
    let (ok, out) = common::brainctl(&["nodes", "uncordon", "local", "--brain", &url2]);
    assert!(ok && line(&out, "local").contains(" ok"), "{out}");
    let (ok, plan) = common::brainctl(&["plan", "--dry-run", "--brain", &url2]);
    assert!(ok && plan.contains("of 16.0 CPUs"), "{plan}");
    // A short cordon expires by itself.
    let (ok, out) = common::brainctl(&[
        "nodes", "cordon", "v", "--reason", "slow", "--for", "1s", "--brain", &url2,
    ]);
    assert!(ok, "{out}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url2]);
    assert!(ok && line(&out, "v").contains(" ok"), "{out}");
}

/// A running job's stragglers and effective training time, as its job master reports them
/// (issue 42, items 2 and 5): `brainctl nodes` shows the node holding a straggler (the local
/// pool, without Ray) with the job and the process, `/metrics` has the job's effective
/// training time, the training its restarts threw away and its stragglers; a report with an
/// impossible ratio is refused with the field, changing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_stragglers_and_effective_training_reach_nodes_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(dir.path(), "[cluster]\ncpus = 8\n", |_| {});
    let (r, mut job) = registered(&url, "slowpoke").await;
    let straggler = |ratio: f64| pb::StragglerReport {
        role: "worker".into(),
        index: 2,
        host: "127.0.0.1".into(),
        ratio,
    };
    let with = |ratio: f64| pb::MetricReport {
        training_ms: 45_000,
        lost_training_ms: 3_000,
        wall_ms: 50_000,
        stragglers: vec![straggler(ratio)],
        ..report(10, 100.0)
    };
    let e = job
        .report_metrics(pb::MetricsBatch {
            job_id: r.job_id,
            reports: vec![with(f64::NAN)],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("straggler worker-2"), "{e:?}");
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url]);
    assert!(ok && out.contains(" ok"), "{out}");

    job.report_metrics(pb::MetricsBatch {
        job_id: r.job_id,
        reports: vec![with(1.92)],
    })
    .await
    .unwrap();
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url]);
    assert!(ok, "{out}");
    let local = out.lines().find(|l| l.starts_with("local")).unwrap();
    assert!(
        local.contains("straggler") && local.contains("stragglers: slowpoke worker-2 (1.92x)"),
        "{out}"
    );
    let metrics = common::scrape(&url);
    for want in [
        "brain_job_effective_training_ratio{job=\"slowpoke\"} 0.9",
        "brain_job_lost_training_seconds{job=\"slowpoke\"} 3.0",
        "brain_job_stragglers{job=\"slowpoke\"} 1",
    ] {
        assert!(metrics.contains(want), "no {want} in\n{metrics}");
    }
    // The straggler recovers: the node is ok again.
    job.report_metrics(pb::MetricsBatch {
        job_id: r.job_id,
        reports: vec![pb::MetricReport {
            stragglers: Vec::new(),
            ..with(1.0)
        }],
    })
    .await
    .unwrap();
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url]);
    assert!(ok, "{out}");
    let local = out.lines().find(|l| l.starts_with("local")).unwrap();
    assert!(local.contains(" ok"), "{out}");
}

/// Per-job, per-role and per-node series in `/metrics` (issue 44, item 3): a running job's
/// size, processes running and waiting by role, its speed over the last 30 s (not since its
/// start), CPU, memory and plan; each node's CPU and GPUs by model, cordoned or not, and the
/// cluster's GPUs by model without the cordoned node's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_series_per_job_role_and_node() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(
        dir.path(),
        "[cluster]\ncpus = 8\n[[cluster.gpu_nodes]]\nname = \"a\"\ngpus = 4\ngpu_type = \"A100\"\n\
         [[cluster.gpu_nodes]]\nname = \"b\"\ngpus = 2\ngpu_type = \"A100\"\n",
        |_| {},
    );
    let (r, mut job) = registered(&url, "watched").await;
    let process = |role: &str, index: u32, pending_ms: u64| pb::ProcessReport {
        role: role.into(),
        index,
        pending_ms,
        ..Default::default()
    };
    // Its start (torch imported, nothing trained), then 60 s at 1,000 samples/s.
    let at = |s: i64, sps: f64| pb::MetricReport {
        at_unix_ms: 1_700_000_000_000 + s * 1000,
        processes: vec![
            process("worker", 0, 0),
            process("worker", 1, 0),
            process("worker", 2, 4000),
            process("ps", 0, 0),
        ],
        ..report(s as u64, sps)
    };
    let mut reports = vec![at(0, 10.0)];
    reports.extend((1..=6).map(|i| at(i * 10, 1000.0)));
    // Its master could not write the job's state 7 times (a failing disk).
    reports.last_mut().unwrap().state_write_failures = 7;
    job.report_metrics(pb::MetricsBatch {
        job_id: r.job_id,
        reports,
    })
    .await
    .unwrap();
    on_gpus(&url).await;
    let (ok, out) =
        common::brainctl(&["nodes", "cordon", "b", "--reason", "test", "--brain", &url]);
    assert!(ok, "{out}");
    let metrics = common::scrape(&url);
    for want in [
        "brain_job_samples_per_second{job=\"watched\"} 1000.0",
        "brain_job_processes{job=\"watched\",role=\"worker\"} 2",
        "brain_job_waiting_processes{job=\"watched\",role=\"worker\"} 1",
        "brain_job_processes{job=\"watched\",role=\"ps\"} 1",
        "brain_job_cpu_cores{job=\"watched\"} 3.0",
        "brain_job_memory_bytes{job=\"watched\"} 2147483648",
        "brain_job_plan_version{job=\"watched\"} 0",
        "brain_job_state_write_failures{job=\"watched\"} 7",
        "brain_node_cpu_cores{node=\"local\"} 8.0",
        "brain_node_gpus{node=\"a\",gpu_type=\"A100\"} 4",
        "brain_node_gpus{node=\"b\",gpu_type=\"A100\"} 2",
        "brain_node_cordoned{node=\"b\"} 1",
        "brain_node_cordoned{node=\"a\"} 0",
        "brain_cluster_gpus{gpu_type=\"A100\"} 4",
        "brain_cluster_gpus_held{gpu_type=\"A100\"} 1.0",
    ] {
        assert!(metrics.contains(want), "no {want} in\n{metrics}");
    }
}

/// A running job whose processes wait to run says which, for how long and why (the platform's
/// reason its job master passed on), in `brainctl status` (issue 41: a placement that cannot
/// be met is left pending with the reason); a process starting for a few seconds is not waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_says_which_processes_wait_to_run_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(dir.path(), "[cluster]\ncpus = 8\n", |_| {});
    let (r, mut job) = registered(&url, "held").await;
    let send = |pending_ms: u64, reason: &str| pb::MetricsBatch {
        job_id: r.job_id,
        reports: vec![pb::MetricReport {
            processes: vec![
                pb::ProcessReport {
                    role: "worker".into(),
                    index: 0,
                    ..Default::default()
                },
                pb::ProcessReport {
                    role: "worker".into(),
                    index: 2,
                    pending_ms,
                    pending_reason: reason.into(),
                    ..Default::default()
                },
            ],
            ..report(pending_ms, 10.0)
        }],
    };
    job.report_metrics(send(4_000, "")).await.unwrap();
    let (ok, out) = common::brainctl(&["status", "held", "--brain", &url]);
    assert!(ok && !out.contains("waiting:"), "{out}");
    let why = "no node has room for 1 CPU, 512 MiB (most free: 0.5 CPU on 10.0.0.2)";
    job.report_metrics(send(312_000, why)).await.unwrap();
    let (ok, out) = common::brainctl(&["status", "held", "--brain", &url]);
    assert!(
        ok && out.contains(&format!(
            "waiting: 1 process waits to run: worker-2 for 312 s ({why})"
        )),
        "{out}"
    );
    // A reason longer than a few lines is refused with the batch, and changes nothing.
    let err = job
        .report_metrics(send(313_000, &"x".repeat(5000)))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("pending reason of 5000 bytes"),
        "{err}"
    );
}

/// The Grafana dashboard in the repository queries only series the brain exports: every
/// `brain_...` name in its expressions is a metric family of `/metrics` (issue 44, item 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_series_the_brain_exports() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/grafana/brain-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(
        dir.path(),
        "[cluster]\ncpus = 8\n[[cluster.gpu_nodes]]\nname = \"a\"\ngpus = 4\ngpu_type = \"A100\"\n",
        |_| {},
    );
    // A running job that reports everything a series is made of (a series appears with its
    // first sample).
    let (r, mut job) = registered(&url, "shown").await;
    job.report_metrics(pb::MetricsBatch {
        job_id: r.job_id,
        reports: vec![pb::MetricReport {
            training_ms: 45_000,
            lost_training_ms: 3_000,
            wall_ms: 50_000,
            gpu_utilisation_pct: 50.0,
            processes: vec![pb::ProcessReport {
                role: "worker".into(),
                resources: Some(proto::jobmaster::v1::Resources {
                    gpu_milli: 1000,
                    ..Default::default()
                }),
                gpu_utilisation_pct: 50.0,
                gpu_memory_bytes: 1 << 30,
                ..Default::default()
            }],
            ..report(10, 100.0)
        }],
    })
    .await
    .unwrap();
    on_gpus(&url).await;
    let metrics = common::scrape(&url);
    let mut names = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(at) = rest.find("brain_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                names.push(name);
            }
        }
    }
    assert!(names.len() >= 20, "{names:?}");
    for name in names {
        let family = ["_bucket", "_total", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        assert!(
            metrics.contains(&format!("# TYPE {family} ")),
            "the dashboard queries {name}, which /metrics does not export:\n{metrics}"
        );
    }
}

/// `brainctl policy set` puts a policy in force without rewriting the file the brain was
/// started with (its comments stay); the brain keeps it across a restart; an edit of the file
/// afterwards is read again and put in force (issue 44, items 7 and 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_set_through_the_brain_is_kept_by_it_and_an_edited_file_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    let original = "# the operator's own notes\n[live]\ninterval_s = 1\n";
    std::fs::write(&file, original).unwrap();
    let start = || {
        common::configured_brain(dir.path(), "[cluster]\ncpus = 8\n", |cmd| {
            cmd.arg("--policy").arg(&file);
        })
    };
    let show = |url: &str| {
        let (ok, out) = common::brainctl(&["policy", "show", "--brain", url]);
        assert!(ok, "{out}");
        out
    };
    let (brain, url) = start();
    let out = show(&url);
    assert!(
        out.contains("interval_s = 1") && out.contains(&file.display().to_string()),
        "{out}"
    );
    let new = dir.path().join("new.toml");
    std::fs::write(&new, "[live]\ninterval_s = 3\n").unwrap();
    let (ok, out) = common::brainctl(&["policy", "set", new.to_str().unwrap(), "--brain", &url]);
    assert!(ok && out.contains("kept in the brain's database"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), original);
    assert!(show(&url).contains("interval_s = 3"));

    // A restarted brain keeps the operator's last word, not the older file.
    drop(brain);
    let (_brain, url) = start();
    let out = show(&url);
    assert!(
        out.contains("interval_s = 3") && out.contains("kept in the brain's database"),
        "{out}"
    );
    // The file edited afterwards is read again at the next round, and is in force.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&file, "[live]\ninterval_s = 2\n").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = show(&url);
        if out.contains("interval_s = 2") {
            assert!(!out.contains("kept in the brain's database"), "{out}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the edit was not read: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "[live]\ninterval_s = 2\n"
    );
}

/// Registers job `name` as a job master started by hand would: its registration, and a
/// client holding the job's secret.
/// Registers `on-gpus`, a running job whose two workers hold half an A100 each.
async fn on_gpus(url: &str) {
    operator_client(url)
        .await
        .register_job(pb::RegisterJobRequest {
            job_name: "on-gpus".into(),
            master_address: "127.0.0.1:7002".into(),
            shape: Some(pb::JobShape {
                kind: "allreduce".into(),
                roles: vec![pb::RoleShape {
                    role: "worker".into(),
                    topology: "allreduce".into(),
                    training: true,
                    count: 2,
                    min: 1,
                    max: 4,
                    node_unit: 1,
                    resources: Some(jm::Resources {
                        cpu_millicores: 1000,
                        memory_bytes: 1 << 30,
                        gpu_milli: 500,
                        gpu_type: "A100".into(),
                    }),
                    ..Default::default()
                }],
                total_samples: 1000,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
}

async fn registered(url: &str, name: &str) -> (pb::RegisterJobResponse, Client) {
    let r = operator_client(url)
        .await
        .register_job(pb::RegisterJobRequest {
            job_name: name.into(),
            master_address: "127.0.0.1:7001".into(),
            shape: None,
        })
        .await
        .unwrap()
        .into_inner();
    let job = client_with(url, Some(auth::Token::parse(&r.job_token).unwrap())).await;
    (r, job)
}

/// A user's error is one plain line (its causes after colons), never a backtrace, even with
/// `RUST_BACKTRACE=1`; an unreachable brain says what to check (issue 44, item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brainctl_errors_say_what_to_check_without_a_backtrace() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_brainctl"))
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Nothing listens on port 1.
    let err = run(&["jobs", "--insecure", "--brain", "http://127.0.0.1:1"]);
    assert!(
        err.contains("cannot reach the brain at http://127.0.0.1:1")
            && err.contains("refused")
            && err.contains("is the brain running"),
        "{err}"
    );
    assert!(
        !err.contains("acktrace") && !err.contains("ConnectError"),
        "{err}"
    );
    // A refusal by a running brain.
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(dir.path(), "[cluster]\ncpus = 8\n", |_| {});
    let (ok, out) = common::brainctl(&["status", "no-such-job", "--brain", &url]);
    assert!(!ok && out.contains("no job named \"no-such-job\""), "{out}");
    let token = common::token_file(&url);
    let ca = common::own_ca(&url).expect("the brain's own CA");
    let err = run(&[
        "status",
        "no-such-job",
        "--brain",
        &url,
        "--token-file",
        token.to_str().unwrap(),
        "--ca",
        ca.to_str().unwrap(),
    ]);
    assert!(
        err.starts_with("error: the brain answered NotFound: no job named"),
        "{err}"
    );
    assert!(!err.contains("acktrace"), "{err}");
}

/// A job's GPU use as its master reports it (NVML per process, on the agents' nodes) reaches
/// `brainctl jobs` (the job's mean utilisation and memory, and each process's) and
/// `/metrics` (per job, and per process by role and index); a process without a GPU is left
/// out; an impossible utilisation is refused with the process and the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_gpu_use_per_process_reaches_brainctl_jobs_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(dir.path(), "[cluster]\ncpus = 8\n", |_| {});
    let (r, mut job) = registered(&url, "gpujob").await;
    let process = |index: u32, gpu_milli: u32, util: f64, mem: u64| pb::ProcessReport {
        role: "worker".into(),
        index,
        resources: Some(proto::jobmaster::v1::Resources {
            cpu_millicores: 1000,
            gpu_milli,
            ..Default::default()
        }),
        cpu_millicores: 900,
        memory_bytes: 1 << 30,
        gpu_utilisation_pct: util,
        gpu_memory_bytes: mem,
        ..Default::default()
    };
    let with = |util: f64| pb::MetricReport {
        gpu_utilisation_pct: 75.0,
        processes: vec![
            process(0, 500, util, 3 << 30),
            process(1, 500, 70.0, 1 << 30),
            // Given no GPU and holding none: not a GPU user.
            process(2, 0, 0.0, 0),
        ],
        ..report(10, 100.0)
    };
    let e = job
        .report_metrics(pb::MetricsBatch {
            job_id: r.job_id,
            reports: vec![with(140.0)],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("worker-0") && e.message().contains("gpu_utilisation_pct"),
        "{e:?}"
    );
    let (ok, out) = common::brainctl(&["jobs", "--brain", &url]);
    assert!(ok && !out.contains("gpu: worker"), "{out}");

    job.report_metrics(pb::MetricsBatch {
        job_id: r.job_id,
        reports: vec![with(80.0)],
    })
    .await
    .unwrap();
    let (ok, out) = common::brainctl(&["jobs", "--brain", &url]);
    assert!(ok, "{out}");
    let row = out.lines().find(|l| l.contains("gpujob")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[8..10], ["75", "4096"], "{out}");
    assert!(
        out.contains("gpu: worker-0 80% 3072 MiB, worker-1 70% 1024 MiB\n"),
        "{out}"
    );
    let metrics = common::scrape(&url);
    for want in [
        "brain_job_gpu_utilisation_pct{job=\"gpujob\"} 75.0",
        "brain_process_gpu_utilisation_pct{job=\"gpujob\",role=\"worker\",index=\"0\"} 80.0",
        "brain_process_gpu_memory_bytes{job=\"gpujob\",role=\"worker\",index=\"1\"} 1073741824",
    ] {
        assert!(metrics.contains(want), "no {want} in\n{metrics}");
    }
    assert!(!metrics.contains("index=\"2\""), "{metrics}");
}

/// A node a job's pre-run check found faulty is cordoned by the brain, with the check's
/// reason and an expiry (the policy's `live.faulty_node_cordon_s`); an address the brain does
/// not plan on is left alone, and an operator's uncordon lifts it; a node it found slow is
/// shown as a straggler with the check's figures, not cordoned (issue 42, item 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_a_pre_run_check_found_faulty_is_cordoned_with_its_reason_until_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(
        dir.path(),
        "[cluster]\ncpus = 8\n[[cluster.gpu_nodes]]\nname = \"gpu-1\"\ngpus = 4\ngpu_type = \"A100\"\n",
        |_| {},
    );
    let (r, mut job) = registered(&url, "checked").await;
    let fault = |host: &str| pb::NodeFault {
        host: host.into(),
        why: "every all-reduce failed (with 10.0.0.2: connection refused)".into(),
        straggler: false,
    };
    // Slow, not broken: shown as a straggler, not cordoned.
    let slow = pb::NodeFault {
        host: "local".into(),
        why: "its matmul took 22.8 ms, 7.30x the median of the others (3.1 ms)".into(),
        straggler: true,
    };
    let with = pb::MetricReport {
        faulty_nodes: vec![fault("gpu-1"), fault("10.9.9.9"), fault("gpu-1"), slow],
        ..report(10, 100.0)
    };
    job.report_metrics(pb::MetricsBatch {
        job_id: r.job_id,
        reports: vec![with.clone(), with],
    })
    .await
    .unwrap();
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url]);
    assert!(ok, "{out}");
    let gpu = out.lines().find(|l| l.starts_with("gpu-1")).unwrap();
    assert!(gpu.contains("cordoned"), "{out}");
    assert!(
        out.contains("the pre-run check of job checked found it faulty: every all-reduce failed"),
        "{out}"
    );
    assert!(out.contains("until"), "an expiry: {out}");
    assert!(!out.contains("10.9.9.9"), "{out}");
    let local = out.lines().find(|l| l.starts_with("local")).unwrap();
    assert!(
        local.contains("straggler")
            && local.contains("checked pre-run check: its matmul took 22.8 ms, 7.30x")
            && !local.contains("cordoned"),
        "{out}"
    );
    let (ok, out) = common::brainctl(&["nodes", "uncordon", "gpu-1", "--brain", &url]);
    assert!(ok, "{out}");
    let (_, out) = common::brainctl(&["nodes", "--brain", &url]);
    let gpu = out.lines().find(|l| l.starts_with("gpu-1")).unwrap();
    assert!(gpu.contains(" ok"), "{out}");
}

/// A job's report never cordons the last healthy node (one job's word would stop every
/// job): it is flagged for the operator, with what the report said; and what a report says
/// reaches the operator's terminal without its escape sequences (a title set, a screen
/// cleared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_report_never_cordons_the_last_healthy_node_and_its_text_is_shown_inert() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(dir.path(), "[cluster]\ncpus = 8\n", |_| {});
    let (r, mut job) = registered(&url, "accuser").await;
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url]);
    assert!(ok, "{out}");
    let only = out
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let with = pb::MetricReport {
        faulty_nodes: vec![pb::NodeFault {
            host: only.clone(),
            why: "it is bad\x1b]0;pwned\x07\x1b[2J\x1b[H".into(),
            straggler: false,
        }],
        ..report(10, 100.0)
    };
    job.report_metrics(pb::MetricsBatch {
        job_id: r.job_id,
        reports: vec![with],
    })
    .await
    .unwrap();
    let (ok, out) = common::brainctl(&["nodes", "--brain", &url]);
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with(&only)).unwrap();
    assert!(!line.contains("cordoned "), "{out}");
    assert!(
        line.contains("found it faulty: it is bad")
            && line.contains("not cordoned: the last healthy node"),
        "{out}"
    );
    assert!(!out.contains('\x1b') && !out.contains('\x07'), "{out:?}");
    assert!(out.contains("\\x1b]0;pwned\\x07"), "{out}");
}

/// The GPUs each job's processes were given (`ProcessReport.devices`, on their nodes) reach
/// the other jobs' masters when they poll for a plan (`GetPlanResponse.other_jobs_devices`),
/// device by device, so a job master on Ray counts them with its own where it places a
/// process; a job is told nothing of itself, and a process waiting to be placed holds
/// nothing (issue 41, item 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_master_is_told_the_devices_the_other_jobs_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (_brain, url) = common::configured_brain(dir.path(), "[cluster]\ncpus = 8\n", |_| {});
    let (a, mut job_a) = registered(&url, "holder").await;
    let (b, mut job_b) = registered(&url, "prober").await;
    let on = |index: u32, gpu_milli: u32, devices: &str, pending_ms: u64| pb::ProcessReport {
        role: "worker".into(),
        index,
        resources: Some(proto::jobmaster::v1::Resources {
            cpu_millicores: 500,
            gpu_milli,
            ..Default::default()
        }),
        host: "10.0.0.2".into(),
        devices: devices.into(),
        pending_ms,
        ..Default::default()
    };
    job_a
        .report_metrics(pb::MetricsBatch {
            job_id: a.job_id,
            reports: vec![pb::MetricReport {
                processes: vec![on(0, 700, "0", 0), on(1, 700, "1", 0), on(2, 700, "1", 900)],
                ..report(10, 100.0)
            }],
        })
        .await
        .unwrap();
    let told = |r: pb::GetPlanResponse| {
        r.other_jobs_devices
            .into_iter()
            .map(|n| {
                let by_device: std::collections::BTreeMap<_, _> =
                    n.held_milli.into_iter().collect();
                (n.node, by_device.into_iter().collect::<Vec<_>>())
            })
            .collect::<Vec<_>>()
    };
    let poll = |job_id| pb::GetPlanRequest {
        job_id,
        after_version: 0,
    };
    let to_b = job_b.get_plan(poll(b.job_id)).await.unwrap().into_inner();
    assert_eq!(
        told(to_b),
        vec![(
            "10.0.0.2".to_string(),
            vec![("0".to_string(), 700), ("1".to_string(), 700)]
        )]
    );
    let to_a = job_a.get_plan(poll(a.job_id)).await.unwrap().into_inner();
    assert!(to_a.other_jobs_devices.is_empty(), "{to_a:?}");
}
