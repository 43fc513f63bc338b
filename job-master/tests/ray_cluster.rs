//! Jobs across the nodes of a real multi-node Ray cluster: `.ci/ray-cluster start DIR` runs three
//! Ray nodes on this machine, each in a network namespace of its own with its own address on a
//! bridge (10.213.X.10-12; the job master listens on the bridge's 10.213.X.1), 4 CPUs each.
//! `.ci/run` starts it, exports `BRAIN_RAY_CLUSTER=DIR` and stops it afterwards. Without it the
//! tests say so and pass, unless `BRAIN_REQUIRE_RAY_CLUSTER=1`.
//!
//! What they show: agents, parameter servers and ring members on different nodes reach each
//! other and the master by their nodes' addresses; a node SIGKILLed under a running job costs
//! the job nothing (its processes come back on the nodes left, every sample once per epoch), and
//! a node that comes back is used again.
//!
//! The tests share the one cluster, so they take turns.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use job_master::JobReport;
use job_master::job::Timing;
use job_master::platform::PlatformConfig;
use job_master::spec::JobSpec;
use proto::jobmaster::v1 as pb;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The harness's cluster, with what the tests do to it.
struct Cluster(test_support::RayClusterDir);

impl std::ops::Deref for Cluster {
    type Target = test_support::RayClusterDir;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Cluster {
    fn from_env() -> Option<Cluster> {
        test_support::ray_cluster().map(Cluster)
    }

    /// Alive nodes by Ray's state API.
    async fn alive(&self) -> usize {
        let api = job_master::platform::ray::api::RayApi::new(&self.dashboard).unwrap();
        api.cluster().await.map_or(0, |c| c.nodes.len())
    }

    async fn wait_alive(&self, want: usize, within: Duration) {
        let start = std::time::Instant::now();
        while self.alive().await != want {
            assert!(
                start.elapsed() < within,
                "Ray does not show {want} alive nodes after {within:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn platform(&self) -> PlatformConfig {
        self.platform_within(120_000)
    }

    /// The Ray platform, a process given up as not placed after `place_timeout_ms`.
    fn platform_within(&self, place_timeout_ms: u64) -> PlatformConfig {
        PlatformConfig::Ray {
            address: self.dashboard.clone(),
            agent_bin: Some(agent_bin()),
            max_processes: None,
            place_timeout_ms: Some(place_timeout_ms),
            env: Default::default(),
        }
    }

    /// Starts `spec` with its master on the bridge, where every node reaches it.
    async fn start(&self, spec: JobSpec, dir: &Path) -> Running {
        self.start_on(spec, dir, self.platform()).await
    }

    /// [`Self::start`] on `platform`.
    async fn start_on(&self, spec: JobSpec, dir: &Path, platform: PlatformConfig) -> Running {
        let timing = Timing {
            heartbeat_timeout_ms: 6_000,
            ..test_timing()
        };
        start_at(&self.host, spec, dir, timing, platform).await
    }
}

/// A rank slowed on its node (a SIGSTOP/SIGCONT duty cycle) is flagged as a straggler and,
/// with `straggler_action: replace`, replaced on another node: after a checkpoint at a cut the
/// group restarts with the rank on the one node left free, the job avoids the slow node from
/// then on, and every sample is trained once (issue 42, items 3 and 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_is_replaced_on_another_node() {
    // Two workers of 3 CPUs on nodes of 4: the replacement can only go to the third node.
    let moved = |slow: &str, s: &pb::JobStatus| {
        s.processes.iter().any(|p| {
            p.role == "worker"
                && p.index == 1
                && p.state == "running"
                && !p.host.is_empty()
                && p.host != slow
        })
    };
    slow_rank_1(
        job_master::spec::StragglerAction::Replace,
        2,
        &moved,
        &[
            "found them slow or faulty): {slow}",
            "straggler worker-1 replaced: every process restarts from checkpoint",
        ],
    )
    .await;
}

/// `straggler_action: shrink` where no node is spare: three ranks of 3 CPUs fill the three
/// nodes of 4; rank 1 is slowed, shrunk out, and the job goes on with two ranks on the two
/// other nodes (worker-1's index gets a new process where worker-2 freed room, worker-2
/// leaves); every sample once (issue 42, item 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_is_shrunk_out_where_no_node_is_spare() {
    let two_left = |slow: &str, s: &pb::JobStatus| {
        let h = hosts(s, "worker");
        h.len() == 2
            && !h.iter().any(|x| x == slow)
            && s.processes
                .iter()
                .all(|p| p.role != "worker" || p.index < 2 || p.state != "running")
    };
    slow_rank_1(
        job_master::spec::StragglerAction::Shrink,
        3,
        &two_left,
        &[
            "shrinking straggler worker-1 out (worker-1 gets a new process, worker-2 leaves)",
            "straggler worker-1 shrunk out: the worker group goes on with 2: every process \
         restarts from checkpoint",
        ],
    )
    .await;
}

/// An all-reduce job of `workers` ranks of 3 CPUs with `action` on stragglers; rank 1 is
/// duty-cycled once training, until `after(slow host, status)` holds; then no worker runs on
/// the slow node, the job trains every sample once and logs each of `events` (`{slow}`: the
/// slow node).
async fn slow_rank_1(
    action: job_master::spec::StragglerAction,
    workers: u32,
    after: &dyn Fn(&str, &pb::JobStatus) -> bool,
    events: &[&str],
) {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(60))
        .await;
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 60_000;
    let mut spec = spec(dir.path(), "allreduce", 0, workers, N, 1, 300);
    spec.stability.straggler_action = action;
    let mut run = cluster.start(spec, dir.path()).await;
    let s = all_running(run.addr, workers as usize).await;
    let (slow_host, _) = host_of(&s, "worker", 1);
    shards_at_least(run.addr, 4).await;
    let slowed = duty_cycle(
        pid_of(run.addr, "worker", 1).await,
        Duration::from_millis(100),
        Duration::from_millis(200),
    );
    let s = wait_for(
        run.addr,
        Duration::from_secs(120),
        &format!("the straggler's action ({action}) carried out"),
        |s| after(&slow_host, s),
    )
    .await;
    drop(slowed);
    assert!(!hosts(&s, "worker").contains(&slow_host), "{s:#?}");
    let report = run.report().await;
    assert_every_sample_once(&report, N, 1);
    assert_recovered(
        &report,
        &format!("straggler: worker-1 on {slow_host} computes a step in"),
    );
    for event in events {
        assert_recovered(&report, &event.replace("{slow}", &slow_host));
    }
}

/// A node capped at a sliver of one CPU (a cgroup quota on every process of it, those it
/// starts later too) is found by the pre-run check (`precheck:`): its torch matmul is timed at
/// several times the other nodes' median, so it is a straggler; the job avoids it from its
/// first launch, runs on the two healthy nodes and trains every sample once (issue 42, items 1
/// and 6). Prints the check's time (docs/faults.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_run_check_finds_a_throttled_node_and_the_job_runs_without_it() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(60))
        .await;
    let slow_ip = cluster.nodes[1].clone();
    // 15 % of one CPU: over the check's half second of matmuls about 6x slower; a node of
    // this busy 2-core machine is seen up to 3x slower at times, so the test's ratio is 4.
    let _slowed = cluster.slow(1, 15);
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 20_000;
    let mut spec = spec(dir.path(), "allreduce", 0, 2, N, 1, 100);
    spec.precheck.enabled = Some(true);
    spec.precheck.python = Some(python);
    spec.precheck.matmul_size = Some(512);
    spec.precheck.allreduce_mb = Some(4);
    // Generous: the throttled node starts Python and imports torch at 15 % of a CPU before it
    // times anything (over 60 s on a loaded 2-core CI run, which then called it faulty).
    spec.precheck.step_timeout_s = Some(180);
    spec.precheck.straggler_ratio = Some(4.0);
    spec.workload
        .env
        .insert("PYTHONPATH".into(), sdk.display().to_string());
    spec.workload
        .env
        .insert("OMP_NUM_THREADS".into(), "1".into());
    let mut run = cluster.start(spec, dir.path()).await;
    // The job master answers once the check is over (at most its three steps' timeouts).
    wait_for(run.addr, Duration::from_secs(600), "the check over", |_| {
        true
    })
    .await;
    let s = all_running(run.addr, 2).await;
    assert!(
        !hosts(&s, "worker").contains(&slow_ip),
        "{s:#?}\n{}",
        run.last_events(20)
    );
    let report = run.report().await;
    assert_every_sample_once(&report, N, 1);
    let check = report.precheck.as_ref().expect("a pre-run check");
    eprintln!("pre-run check of 3 nodes: {check:#?}");
    assert_eq!(check.nodes.len(), 3, "{check:#?}");
    for n in &check.nodes {
        let want = if n.node == slow_ip {
            vocab::report::NodeHealth::Straggler
        } else {
            vocab::report::NodeHealth::Healthy
        };
        assert_eq!(n.health, want, "{check:#?}");
        assert!(!n.rounds.is_empty(), "every node is in a round: {check:#?}");
    }
    assert_recovered(
        &report,
        &format!("node {slow_ip} avoided: the pre-run check found it a straggler"),
    );
}

/// A node whose GPUs another Ray user holds has no room for its check process: the pre-run
/// check gives it up after half a step's time and says the node is unchecked, neither faulty
/// nor a straggler (nothing is known against it, so nothing is avoided or cordoned); the other
/// nodes are checked, and the job runs (issue 42, item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_its_gpus_taken_is_left_unchecked_not_called_faulty() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(60))
        .await;
    // Node 1's two GPUs, held by someone else's Ray job.
    let api = job_master::platform::ray::api::RayApi::new(&cluster.dashboard).unwrap();
    let busy_ip = cluster.nodes[1].clone();
    let holder = format!("gpu-holder-{}", std::process::id());
    api.submit(&job_master::platform::ray::api::SubmitRequest {
        entrypoint: "exec sleep 600".into(),
        submission_id: holder.clone(),
        entrypoint_num_cpus: 0.0,
        entrypoint_num_gpus: 2.0,
        entrypoint_memory: None,
        entrypoint_resources: [(format!("node:{busy_ip}"), 0.001)].into(),
        runtime_env: Default::default(),
        metadata: Default::default(),
    })
    .await
    .unwrap();
    struct Stop<'a>(&'a job_master::platform::ray::api::RayApi, String);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let (api, id) = (self.0.clone(), self.1.clone());
            let _ = std::thread::spawn(move || {
                tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(async { api.stop(&id).await })
            })
            .join();
        }
    }
    let _holder = Stop(&api, holder.clone());
    let start = std::time::Instant::now();
    while api.job(&holder).await.unwrap().map(|j| j.status)
        != Some(job_master::platform::ray::api::RayJobStatus::Running)
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the holder never ran"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 10_000;
    let mut spec = spec(dir.path(), "allreduce", 0, 2, N, 1, 100);
    let worker = spec.roles.get_mut(&vocab::Role::WORKER).unwrap();
    worker.resources = Some(job_master::spec::Resources {
        cpu: Some(vocab::Millicores(1000)),
        gpu: Some(vocab::Gpus::whole(1)),
        ..Default::default()
    });
    spec.precheck.enabled = Some(true);
    spec.precheck.python = Some(python);
    spec.precheck.matmul_size = Some(256);
    spec.precheck.allreduce_mb = Some(1);
    // Generous: each checked node starts Python and imports torch before it answers (over
    // 20 s on a loaded 2-core CI run of a fresh machine, which then called both healthy nodes
    // faulty). The node left unchecked is told by Ray's start timeout, not this one.
    spec.precheck.step_timeout_s = Some(120);
    // The nodes share this machine's CPUs with whatever else runs: a checked node's matmul
    // may take 2.8 times another's (seen in CI: 0.9 against 0.3 ms). What is tested here is
    // the node left unchecked, so no timing makes a straggler.
    spec.precheck.straggler_ratio = Some(100.0);
    spec.workload
        .env
        .insert("PYTHONPATH".into(), sdk.display().to_string());
    spec.workload
        .env
        .insert("OMP_NUM_THREADS".into(), "1".into());
    let mut run = cluster.start(spec, dir.path()).await;
    let report = run.report().await;
    assert_every_sample_once(&report, N, 1);
    let check = report.precheck.as_ref().expect("a pre-run check");
    for n in &check.nodes {
        let want = if n.node == busy_ip {
            vocab::report::NodeHealth::Unchecked
        } else {
            vocab::report::NodeHealth::Healthy
        };
        assert_eq!(n.health, want, "{check:#?}");
    }
    assert_recovered(
        &report,
        &format!("node {busy_ip} not checked (the job may use it): Ray did not start"),
    );
    assert!(
        !report.events.iter().any(|e| e.contains("avoided")),
        "{:#?}",
        report.events
    );
}

/// A rank frozen on its node (SIGSTOP) stops the whole ring: the job master finds the group
/// hung, the agents on every node send the stacks (the frozen rank's threads all stopped), and
/// the group restarts from its latest checkpoint; every sample is trained once (issue 42,
/// items 4 and 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_frozen_on_its_node_is_found_hung_and_the_group_recovers() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(60))
        .await;
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 30_000;
    let mut spec = spec(dir.path(), "allreduce", 0, 3, N, 1, 300);
    spec.stability.hang_min_s = 3.0;
    spec.stability.hang_after_steps = 20.0;
    let mut run = cluster.start(spec, dir.path()).await;
    all_running(run.addr, 3).await;
    wait_for(
        run.addr,
        Duration::from_secs(120),
        "a checkpoint and more shards",
        |s| s.checkpoints >= 1 && s.shards_done >= 12,
    )
    .await;
    let frozen = pid_of(run.addr, "worker", 1).await;
    freeze(frozen);
    let report = run.report().await;
    assert_every_sample_once(&report, N, 1);
    assert_eq!(report.hangs.len(), 1, "{:#?}", report.events);
    let stacks = &report.hangs[0].stacks;
    assert_eq!(stacks.len(), 3, "every node's rank: {stacks:#?}");
    assert!(
        stacks["worker-1"].contains(&format!("process {frozen} (")),
        "{stacks:#?}"
    );
    assert!(
        stacks["worker-1"].contains("is stopped (SIGSTOP)"),
        "{stacks:#?}"
    );
    assert_recovered(&report, "every process restarts from checkpoint");
}

/// A job's spec: `ps` parameter servers of 1 CPU and `workers` workers of 3 CPUs (a node has 4:
/// no two workers share a node).
fn spec(
    dir: &Path,
    kind: &str,
    ps: u32,
    workers: u32,
    samples: u64,
    epochs: u32,
    // Sleep per sample trained: a 1,000-sample shard takes a worker 1,000 × this.
    delay_us: u64,
) -> JobSpec {
    let ps_role = if ps > 0 {
        format!("  ps: {{ replicas: {ps}, resources: {{ cpu: 1, memory: 256Mi }} }}\n")
    } else {
        String::new()
    };
    let yaml = format!(
        r#"
name: mn-{kind}-{pid}
kind: {kind}
roles:
{ps_role}  worker: {{ replicas: {workers}, min: 1, max: 3, resources: {{ cpu: 3, memory: 256Mi }} }}
workload:
  builtin: {{ seed: 5, num_fields: 8, vocab_per_field: 500, hash_buckets: 16384, batch_size: 128, learning_rate: 0.1, step_delay_us: {delay_us} }}
data: {{ num_samples: {samples}, shard_size: 1000, eval_samples: 5000 }}
epochs: {epochs}
checkpoint: {{ dir: {ckpt}, every_shards: 10 }}
"#,
        ckpt = dir.join("ckpt").display(),
        pid = std::process::id()
    );
    let spec = JobSpec::from_yaml(&yaml).expect("test spec parses");
    spec.validate().expect("test spec is valid");
    spec
}

/// `spec` with a service role `rollout` of `replicas` engines (1 CPU each, up to 3) that
/// only sleep.
fn with_engines(mut spec: JobSpec, replicas: u32) -> JobSpec {
    let yaml = format!(
        "{{ replicas: {replicas}, min: 1, max: 3, resources: {{ cpu: 1, memory: 64Mi }}, \
         command: [/bin/sh, -c, exec sleep 600] }}"
    );
    spec.roles.insert(
        job_master::spec::Role::new("rollout").unwrap(),
        serde_norway::from_str(&yaml).unwrap(),
    );
    spec.validate().unwrap();
    spec
}

/// The hosts the job's live processes of `role` registered from.
fn hosts(s: &pb::JobStatus, role: &str) -> Vec<String> {
    s.processes
        .iter()
        .filter(|p| p.role == role && p.state == "running")
        .map(|p| p.host.clone())
        .collect()
}

fn host_of(s: &pb::JobStatus, role: &str, index: u32) -> (String, u64) {
    let p = s
        .processes
        .iter()
        .find(|p| p.role == role && p.index == index)
        .unwrap();
    (p.host.clone(), p.incarnation)
}

async fn all_running(addr: SocketAddr, workers: usize) -> pb::JobStatus {
    wait_for(
        addr,
        Duration::from_secs(120),
        "every process running",
        |s| {
            hosts(s, "worker").len() == workers
                && s.processes
                    .iter()
                    .all(|p| p.state == "running" || p.state == "removed")
                && s.processes.iter().all(|p| !p.host.is_empty())
        },
    )
    .await
}

fn assert_every_sample_once(report: &JobReport, samples: u64, epochs: u64) {
    assert!(
        report.succeeded(),
        "{:?}: {:#?}",
        report.reason,
        report.events
    );
    assert_eq!(report.exactly_once, "ok", "{:#?}", report.events);
    assert_eq!(report.samples_per_epoch.len() as u64, epochs);
    assert!(
        report.samples_per_epoch.values().all(|&n| n == samples),
        "{:?}",
        report.samples_per_epoch
    );
}

/// An allreduce ring of three workers, one per node: each member connects to its neighbour on
/// another node by the address it registered, and the job trains every sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_spans_three_nodes_by_their_addresses() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 30_000;
    let mut run = cluster
        .start(spec(dir.path(), "allreduce", 0, 3, N, 2, 0), dir.path())
        .await;
    let s = all_running(run.addr, 3).await;
    let workers: BTreeSet<String> = hosts(&s, "worker").into_iter().collect();
    let nodes: BTreeSet<String> = cluster.nodes.iter().cloned().collect();
    assert_eq!(workers, nodes, "one worker per node, by its node's address");
    let report = run.report().await;
    assert_every_sample_once(&report, N, 2);
    assert!(report.restarts.is_empty(), "{:#?}", report.events);
}

/// A ps job's worker loses its node (every process on it SIGKILLed, Ray marks it dead): the
/// worker comes back on a node left and the job goes on, nothing lost or applied twice. When the
/// node is back, a third worker (3 CPUs: only that node has them free) is placed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lost_under_a_ps_job_costs_nothing_and_is_used_again_when_back() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(60))
        .await;
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 60_000;
    const EPOCHS: u64 = 3;
    let mut run = cluster
        .start(
            spec(dir.path(), "ps", 1, 2, N, EPOCHS as u32, 1_000),
            dir.path(),
        )
        .await;
    let addr = run.addr;
    let s = all_running(addr, 2).await;
    // A worker on a node other than the head's (two workers never share a node).
    let (victim, (lost_host, before)) = (0..2)
        .map(|i| (i, host_of(&s, "worker", i)))
        .find(|(_, (h, _))| *h != cluster.nodes[0])
        .expect("a worker on a non-head node");
    let node = cluster.nodes.iter().position(|n| *n == lost_host).unwrap();
    shards_at_least(addr, 4).await;
    cluster.node("kill", node);

    // The worker comes back elsewhere (a new incarnation on a node left).
    let s = wait_for(
        addr,
        Duration::from_secs(150),
        "the lost worker back elsewhere",
        |s| {
            let (h, inc) = host_of(s, "worker", victim);
            inc > before && h != lost_host && hosts(s, "worker").len() == 2
        },
    )
    .await;
    assert!(
        s.processes
            .iter()
            .all(|p| p.state != "running" || p.host != lost_host),
        "a process still counted on the lost node: {s:#?}"
    );
    cluster
        .wait_alive(cluster.nodes.len() - 1, Duration::from_secs(90))
        .await;

    cluster.node("revive", node);
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(90))
        .await;
    rescale_workers(addr, 1, 3).await;
    let s = all_running(addr, 3).await;
    assert_eq!(
        host_of(&s, "worker", 2).0,
        lost_host,
        "the third worker fits only on the node that came back"
    );

    let report = run.report().await;
    assert_every_sample_once(&report, N, EPOCHS);
    assert_ps_applied_each_sample_once(&report, N, EPOCHS);
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains(&format!("worker-{victim} failed"))),
        "{:#?}",
        report.events
    );
}

/// A job of roles on the cluster: an allreduce ring of two workers (3 CPUs each, one per node)
/// beside a service role of rollout engines (1 CPU each, their own command) that lands on the
/// CPUs left. A killed engine restarts alone; the role resized 2 → 3 starts one more engine
/// while the ring trains on untouched; the job trains every sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_roles_run_beside_the_training_group_across_nodes() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 40_000;
    let spec = with_engines(spec(dir.path(), "allreduce", 0, 2, N, 1, 500), 2);
    let mut run = cluster.start(spec, dir.path()).await;
    let engines = |s: &pb::JobStatus| {
        s.processes
            .iter()
            .filter(|p| p.role == "rollout" && p.state == "running" && !p.host.is_empty())
            .map(|p| (p.index, p.incarnation, p.host.clone()))
            .collect::<Vec<_>>()
    };
    let s = wait_for(
        run.addr,
        Duration::from_secs(120),
        "2 engines and 2 workers",
        |s| engines(s).len() == 2 && hosts(s, "worker").len() == 2,
    )
    .await;
    let workers = host_of(&s, "worker", 0);
    let nodes: BTreeSet<String> = cluster.nodes.iter().cloned().collect();
    assert!(
        engines(&s).iter().all(|(_, _, h)| nodes.contains(h)),
        "{s:#?}"
    );

    kill9(pid_of(run.addr, "rollout", 1).await);
    wait_for(run.addr, Duration::from_secs(120), "rollout-1 back", |s| {
        engines(s).iter().any(|(i, inc, _)| *i == 1 && *inc == 2)
    })
    .await;
    let mut p = plan(1, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "rollout".into(),
        count: 3,
        resources: None,
    });
    send(run.addr, p).await;
    let s = wait_for(run.addr, Duration::from_secs(120), "3 engines", |s| {
        engines(s).len() == 3
    })
    .await;
    assert_eq!(host_of(&s, "worker", 0), workers, "the ring did not move");
    let report = run.report().await;
    assert_every_sample_once(&report, N, 1);
    // The engine's relaunch is the only one: the training group never restarted.
    assert_eq!(
        report.restarts,
        BTreeMap::from([(vocab::Role::new("rollout").unwrap(), 1)]),
        "{:#?}",
        report.events
    );
}

/// A plan that names the nodes of the processes it adds (as the brain's round does): the
/// first goes to the node it names while that node holds it, though the job master's own rule
/// (a node without GPUs first, then the most CPU left) picks another; the second names a node
/// the job is not offered and goes where there is room, with the reason in the job's events.
/// The training group runs on untouched and trains every sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_new_processes_go_to_the_nodes_it_names_while_they_hold_them() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 40_000;
    // One worker of 3 CPUs, one engine of 1 CPU: 8 of the 12 CPUs left, on two nodes at least.
    let spec = with_engines(spec(dir.path(), "allreduce", 0, 1, N, 1, 1000), 1);
    let mut run = cluster.start(spec, dir.path()).await;
    let engines = |s: &pb::JobStatus| {
        s.processes
            .iter()
            .filter(|p| p.role == "rollout" && p.state == "running" && !p.host.is_empty())
            .map(|p| (p.index, p.host.clone()))
            .collect::<BTreeMap<u32, String>>()
    };
    let s = wait_for(
        run.addr,
        Duration::from_secs(120),
        "the worker and the engine",
        |s| engines(s).len() == 1 && hosts(s, "worker").len() == 1,
    )
    .await;
    let worker = host_of(&s, "worker", 0);
    // Past Ray's usage report's lag: where the rule would put an engine, and another node
    // with room for one.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let api = job_master::platform::ray::api::RayApi::new(&cluster.dashboard).unwrap();
    let nodes = api.cluster().await.unwrap().nodes;
    let has_room = |n: &&job_master::platform::ray::api::RayNode| n.available.cpus >= 1.0;
    let by_rule = nodes
        .iter()
        .filter(has_room)
        .map(|n| ((n.total.gpus <= 0.0, n.available.cpus), n))
        .reduce(|best, x| if x.0 > best.0 { x } else { best })
        .map(|(_, n)| n.ip.clone())
        .unwrap();
    let named = nodes
        .iter()
        .filter(has_room)
        .find(|n| n.ip != by_rule)
        .map(|n| n.ip.clone())
        .unwrap_or_else(|| panic!("one node with room besides {by_rule}: {nodes:#?}"));
    let events = || {
        let ctx = std::fs::read(run.run_dir.join("job-context.json")).unwrap_or_default();
        serde_json::from_slice::<serde_json::Value>(&ctx)
            .map_or(String::new(), |c| format!("{:#}", c["events"]))
    };
    let grow = |version, count, node: &str| {
        let mut p = plan(version, None, None);
        p.roles.push(pb::RoleTarget {
            role: "rollout".into(),
            count,
            resources: None,
            nodes: vec![node.to_string()],
        });
        p
    };
    send(run.addr, grow(1, 2, &named)).await;
    let s = wait_for(run.addr, Duration::from_secs(120), "2 engines", |s| {
        engines(s).len() == 2
    })
    .await;
    assert_eq!(
        engines(&s)[&1],
        named,
        "engine 1 on the node named, not {by_rule}: {}",
        events()
    );
    const GONE: &str = "10.213.0.250";
    send(run.addr, grow(2, 3, GONE)).await;
    let s = wait_for(run.addr, Duration::from_secs(120), "3 engines", |s| {
        engines(s).len() == 3
    })
    .await;
    until_event(&run.run_dir, Duration::from_secs(30), |t| {
        t.starts_with(&format!(
            "rollout-2: the plan placed it on {GONE}, which is not among the nodes offered to \
             the job (gone, cordoned or avoided); placed on "
        ))
    })
    .await;
    assert_eq!(host_of(&s, "worker", 0), worker, "the worker did not move");
    let report = run.report().await;
    assert_every_sample_once(&report, N, 1);
    assert!(report.restarts.is_empty(), "{:#?}", report.events);
}

/// The reinforcement-learning example (`examples/rl-ppo`: an actor all-reduce group, rollout
/// engines, a reward model and a critic, real PyTorch) on the three nodes: its roles' processes
/// spread over the nodes call each other by their nodes' addresses, and it learns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rl_example_learns_across_nodes() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let Some((python, sdk)) = torch_with_sdk() else {
        eprintln!("SKIPPED: no Python with torch and the SDK's build requirements");
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("returns.jsonl");
    let mut spec = common::rl::rl_spec(&python, &sdk, dir.path(), &log);
    // A whole node's CPUs per actor rank: the ranks land on two nodes, the other roles where
    // there is room.
    let actor = job_master::spec::Role::new("actor").unwrap();
    spec.roles.get_mut(&actor).unwrap().resources =
        Some(serde_norway::from_str("{ cpu: 3, memory: 1Gi }").unwrap());
    spec.validate().unwrap();
    let mut run = cluster.start(spec, dir.path()).await;
    let s = wait_for(
        run.addr,
        Duration::from_secs(180),
        "every role running",
        |s| s.processes.len() == 6 && s.processes.iter().all(|p| p.state == "running"),
    )
    .await;
    let nodes: BTreeSet<String> = s.processes.iter().map(|p| p.host.clone()).collect();
    assert!(nodes.len() >= 2, "the roles span nodes: {nodes:?}");
    let actor: BTreeSet<String> = hosts(&s, "actor").into_iter().collect();
    assert_eq!(actor.len(), 2, "one actor rank per node: {actor:?}");
    let report = run.report().await;
    assert!(
        report.succeeded(),
        "{:?}\n{}\n{}",
        report.reason,
        run.last_events(30),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    common::rl::assert_learned_once_each(&common::rl::updates(&log));
}

/// A job whose processes are placed by `placement` (YAML list items, indented two spaces):
/// two workers of 1 CPU (fixed), a critic of 1 CPU and `rollouts` engines of half a CPU (1-4).
fn placed_spec(dir: &Path, name: &str, rollouts: u32, placement: &str) -> JobSpec {
    let yaml = format!(
        r#"
name: {name}-{pid}
kind: allreduce
roles:
  worker: {{ replicas: 2, min: 2, max: 2, resources: {{ cpu: 1, memory: 256Mi }} }}
  critic: {{ replicas: 1, topology: single, resources: {{ cpu: 1, memory: 64Mi }}, command: [/bin/sh, -c, exec sleep 600] }}
  rollout: {{ replicas: {rollouts}, min: 1, max: 4, resources: {{ cpu: "500m", memory: 64Mi }}, command: [/bin/sh, -c, exec sleep 600] }}
workload:
  builtin: {{ seed: 5, num_fields: 8, vocab_per_field: 500, hash_buckets: 16384, batch_size: 128, learning_rate: 0.1, step_delay_us: 2000 }}
data: {{ num_samples: 60000, shard_size: 1000, eval_samples: 2000 }}
checkpoint: {{ dir: {ckpt}, every_shards: 10 }}
placement:
{placement}"#,
        ckpt = dir.join("ckpt").display(),
        pid = std::process::id()
    );
    let spec = JobSpec::from_yaml(&yaml).expect("test spec parses");
    spec.validate().expect("test spec is valid");
    spec
}

/// Waits until the job's persisted events hold one `pred` accepts.
async fn until_event(run_dir: &Path, within: Duration, pred: impl Fn(&str) -> bool) {
    let start = std::time::Instant::now();
    loop {
        let ctx = std::fs::read(run_dir.join("job-context.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let events = ctx.map_or(serde_json::Value::Null, |c| c["events"].clone());
        if events
            .as_array()
            .is_some_and(|ev| ev.iter().any(|e| pred(e["text"].as_str().unwrap_or(""))))
        {
            return;
        }
        assert!(start.elapsed() < within, "no such event in {events:#}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Placement groups on the three nodes (issue 41, item 3). The training group and a critic
/// share one node (`strict_pack`); three rollout engines take one node each
/// (`strict_spread`): each group is laid out whole before its processes are submitted, and
/// each process is pinned to its bundle's node. An engine killed comes back on its node. The
/// engines grown to four: the fourth waits with the reason (no node free of the group), the
/// others run on, and the job ends untouched once they are three again. A group the cluster
/// cannot hold from the start (four engines strictly spread over three nodes) leaves its
/// processes pending with the reason, and starts none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_groups_pack_and_spread_processes_over_the_nodes() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(90))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let groups = "  - { roles: [worker, critic], strategy: strict_pack }\n  \
                  - { roles: [rollout], strategy: strict_spread }\n";
    let spec = placed_spec(dir.path(), "placed", 3, groups);
    // Waiting processes say why within 5 s.
    let mut run = cluster
        .start_on(spec, dir.path(), cluster.platform_within(5_000))
        .await;
    let running = |s: &pb::JobStatus, role: &str| {
        s.processes
            .iter()
            .filter(|p| p.role == role && p.state == "running" && !p.host.is_empty())
            .map(|p| (p.index, p.incarnation, p.host.clone()))
            .collect::<Vec<_>>()
    };
    let s = wait_for(
        run.addr,
        Duration::from_secs(120),
        "2 workers, the critic and 3 engines running",
        |s| {
            running(s, "worker").len() == 2
                && running(s, "critic").len() == 1
                && running(s, "rollout").len() == 3
        },
    )
    .await;
    let packed: BTreeSet<String> = ["worker", "critic"]
        .iter()
        .flat_map(|r| running(&s, r))
        .map(|(_, _, h)| h)
        .collect();
    assert_eq!(packed.len(), 1, "worker+critic on one node: {s:#?}");
    let spread: BTreeSet<String> = running(&s, "rollout")
        .into_iter()
        .map(|(_, _, h)| h)
        .collect();
    assert_eq!(
        spread,
        cluster.nodes.iter().cloned().collect::<BTreeSet<_>>(),
        "one engine on each node: {s:#?}"
    );

    // An engine killed: back in its bundle, on its node.
    let (_, _, host) = running(&s, "rollout")
        .into_iter()
        .find(|(i, _, _)| *i == 1)
        .unwrap();
    kill9(pid_of(run.addr, "rollout", 1).await);
    let s = wait_for(run.addr, Duration::from_secs(120), "rollout-1 back", |s| {
        running(s, "rollout")
            .iter()
            .any(|(i, inc, _)| *i == 1 && *inc == 2)
    })
    .await;
    assert!(
        running(&s, "rollout").contains(&(1, 2, host.clone())),
        "rollout-1 left its node {host}: {s:#?}"
    );

    // Grown to 4: a fourth node free of the group there is not, so rollout-3 waits, with the
    // reason, while the others run on; back to 3, the job goes on untouched.
    let mut p = plan(1, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "rollout".into(),
        count: 4,
        resources: None,
    });
    send(run.addr, p).await;
    until_event(&run.run_dir, Duration::from_secs(60), |t| {
        t.contains("rollout-3 still pending") && t.contains("it needs 4 nodes")
    })
    .await;
    let s = status(run.addr).await.unwrap();
    assert_eq!(running(&s, "rollout").len(), 3, "{s:#?}");
    let mut p = plan(2, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "rollout".into(),
        count: 3,
        resources: None,
    });
    send(run.addr, p).await;
    let report = run.report().await;
    assert_every_sample_once(&report, 60_000, 1);
    // The killed engine's relaunch is the only one: the training group never restarted.
    assert_eq!(
        report.restarts,
        BTreeMap::from([(vocab::Role::new("rollout").unwrap(), 1)]),
        "{:#?}",
        report.events
    );
    assert!(
        report.events.iter().any(|e| e
            .contains("placement group rollout (strict_spread) laid out: rollout-0")
            && e.contains("rollout-2")),
        "{:#?}",
        report.events
    );
    // Four engines strictly spread over three nodes: pending, with the reason, none started.
    let dir = tempfile::tempdir().unwrap();
    let spec = placed_spec(
        dir.path(),
        "unplaceable",
        4,
        "  - { roles: [rollout], strategy: strict_spread }\n",
    );
    let run = cluster
        .start_on(spec, dir.path(), cluster.platform_within(5_000))
        .await;
    until_event(&run.run_dir, Duration::from_secs(90), |t| {
        t.contains("placement group rollout (strict_spread)") && t.contains("it needs 4 nodes")
    })
    .await;
    let s = status(run.addr).await.unwrap();
    assert!(running(&s, "rollout").is_empty(), "{s:#?}");
    run.handle.abort();
}

/// Device colocation on the three nodes (issue 41, item 3): two workers and two rollout
/// engines each ask for half a GPU, in a group that shares devices and spreads: worker-i and
/// rollout-i are laid out as one bundle, so they run on one node and Ray hands them their
/// halves of one GPU (the same `CUDA_VISIBLE_DEVICES`, as their agents report it), while the
/// two indices go to two GPU nodes. The job trains each sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_sharing_devices_get_halves_of_one_gpu_on_one_node() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(90))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"
name: shared-{pid}
kind: allreduce
roles:
  worker: {{ replicas: 2, min: 2, max: 2, resources: {{ cpu: 1, memory: 256Mi, gpu: 0.5 }} }}
  rollout: {{ replicas: 2, resources: {{ cpu: "500m", memory: 64Mi, gpu: 0.5 }}, command: [/bin/sh, -c, exec sleep 600] }}
workload:
  builtin: {{ seed: 5, num_fields: 8, vocab_per_field: 500, hash_buckets: 16384, batch_size: 128, learning_rate: 0.1, step_delay_us: 2000 }}
data: {{ num_samples: 30000, shard_size: 1000, eval_samples: 2000 }}
checkpoint: {{ dir: {ckpt}, every_shards: 10 }}
placement:
  - {{ roles: [worker, rollout], strategy: strict_spread, share_devices: true }}
"#,
        ckpt = dir.path().join("ckpt").display(),
        pid = std::process::id()
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let mut run = cluster
        .start_on(spec, dir.path(), cluster.platform_within(5_000))
        .await;
    let placed = |s: &pb::JobStatus, role: &str, i: u32| {
        s.processes
            .iter()
            .find(|p| p.role == role && p.index == i && p.state == "running")
            .filter(|p| !p.host.is_empty() && !p.devices.is_empty())
            .map(|p| (p.host.clone(), p.devices.clone()))
    };
    let s = wait_for(
        run.addr,
        Duration::from_secs(120),
        "2 workers and 2 engines running with their devices",
        |s| {
            ["worker", "rollout"]
                .iter()
                .all(|r| (0..2).all(|i| placed(s, r, i).is_some()))
        },
    )
    .await;
    for i in 0..2 {
        let (w, r) = (placed(&s, "worker", i), placed(&s, "rollout", i));
        assert_eq!(w, r, "worker-{i} and rollout-{i} share a GPU: {s:#?}");
        assert!(
            !w.as_ref().unwrap().1.contains(','),
            "one device each: {s:#?}"
        );
    }
    assert_ne!(
        placed(&s, "worker", 0).unwrap().0,
        placed(&s, "worker", 1).unwrap().0,
        "the two pairs strictly spread: {s:#?}"
    );
    let report = run.report().await;
    assert_every_sample_once(&report, 30_000, 1);
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("laid out: worker-0+rollout-0 (1.5 CPU, 1 GPU")),
        "{:#?}",
        report.events
    );
}

/// GPUs counted device by device where the job master places a process (issue 41, item 3):
/// two engines of 0.7 of a V100 each take both of that node's devices (Ray counts 0.6 free
/// there, 0.3 + 0.3); a probe of 3 CPUs and 0.1 of an A100 leaves that node 1 CPU. A second
/// probe, added by a plan that gives it 1 CPU and half a GPU of any model, fits on the V100
/// node by Ray's amounts and has more CPU there, but no device of it holds the half. The
/// master, which knows the devices its engines were given, pins it to the A100 node, where it
/// starts (by Ray's amounts alone it would wait on the V100 node for a device). The job trains
/// each sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_is_placed_where_a_device_holds_it_not_where_rays_amount_does() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    cluster
        .wait_alive(cluster.nodes.len(), Duration::from_secs(90))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let sleep = "command: [/bin/sh, -c, exec sleep 600]";
    let yaml = format!(
        r#"
name: devices-{pid}
kind: allreduce
roles:
  worker: {{ replicas: 1, min: 1, max: 1, resources: {{ cpu: 1, memory: 256Mi }} }}
  hold: {{ topology: service, replicas: 2, resources: {{ cpu: "500m", memory: 64Mi, gpu: 0.7, gpu_type: V100 }}, {sleep} }}
  probe: {{ topology: service, replicas: 1, max: 2, resources: {{ cpu: 3, memory: 64Mi, gpu: 0.1, gpu_type: A100 }}, {sleep} }}
workload:
  builtin: {{ seed: 5, num_fields: 8, vocab_per_field: 500, hash_buckets: 16384, batch_size: 128, learning_rate: 0.1, step_delay_us: 2000 }}
data: {{ num_samples: 25000, shard_size: 1000, eval_samples: 2000 }}
checkpoint: {{ dir: {ckpt}, every_shards: 10 }}
"#,
        ckpt = dir.path().join("ckpt").display(),
        pid = std::process::id()
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let mut run = cluster.start(spec, dir.path()).await;
    let placed = |s: &pb::JobStatus, role: &str| {
        s.processes
            .iter()
            .filter(|p| p.role == role && p.state == "running")
            .filter(|p| !p.host.is_empty() && !p.devices.is_empty())
            .map(|p| (p.host.clone(), p.devices.clone()))
            .collect::<Vec<_>>()
    };
    let (v100, a100) = (&cluster.nodes[1], &cluster.nodes[2]);
    let s = wait_for(
        run.addr,
        Duration::from_secs(120),
        "both engines and the first probe running with their devices",
        |s| placed(s, "hold").len() == 2 && placed(s, "probe").len() == 1,
    )
    .await;
    let holds = placed(&s, "hold");
    assert!(holds.iter().all(|(h, _)| h == v100), "{s:#?}");
    assert_ne!(holds[0].1, holds[1].1, "one V100 device each: {s:#?}");
    assert_eq!(placed(&s, "probe")[0].0, *a100, "{s:#?}");
    // The master counts a process of its own that Ray does not show running yet off its
    // node (room held back): a few of its polls (250 ms) for Ray to show the last engine
    // running, so the V100 node's amount holds the half when the plan comes.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut p = plan(1, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "probe".into(),
        count: 2,
        resources: Some(pb::Resources {
            cpu_millicores: 1000,
            memory_bytes: 64 << 20,
            gpu_milli: 500,
            gpu_type: String::new(),
        }),
    });
    send(run.addr, p).await;
    let s = wait_for(
        run.addr,
        Duration::from_secs(60),
        "the half-GPU probe running with its device",
        |s| placed(s, "probe").len() == 2,
    )
    .await;
    assert!(placed(&s, "probe").iter().all(|(h, _)| h == a100), "{s:#?}");
    let report = run.report().await;
    assert_every_sample_once(&report, 25_000, 1);
}
