//! The Ray platform against a real Ray cluster. `.ci/run` installs Ray from PyPI, starts a head
//! on 127.0.0.1 with 8 logical CPUs and 4 of a custom resource `brain_slot`
//! (`ray start --head --num-cpus 8 --resources '{"brain_slot": 4}'`), exports
//! `BRAIN_RAY_ADDRESS` (its dashboard) and stops it afterwards. Without `BRAIN_RAY_ADDRESS` the
//! tests say so and pass, unless `BRAIN_REQUIRE_RAY=1`.
//!
//! The tests share the one cluster, so they take turns.

mod common;

use std::time::{Duration, Instant};

use common::*;
use job_master::platform::ray::api::{RayApi, RayError, RayJobStatus, SubmitRequest};
use job_master::platform::ray::{RayPlatform, RaySettings};
use job_master::platform::{AgentLaunch, Platform, PlatformConfig, PlatformEvent};
use job_master::spec::{Millicores, Role};
use tokio::sync::MutexGuard;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The Ray dashboard to test against.
fn ray_address() -> Option<String> {
    match std::env::var("BRAIN_RAY_ADDRESS") {
        Ok(a) if !a.is_empty() => Some(a),
        _ => {
            test_support::optional_server(
                "BRAIN_REQUIRE_RAY",
                "a Ray cluster",
                "set BRAIN_RAY_ADDRESS to its dashboard, as .ci/run does with .ci/ray-head",
            );
            None
        }
    }
}

/// The Ray dashboard and this test's turn on it.
async fn ray() -> Option<(String, MutexGuard<'static, ()>)> {
    let address = ray_address()?;
    Some((address, ONE_AT_A_TIME.lock().await))
}

fn on_ray(address: &str) -> PlatformConfig {
    PlatformConfig::Ray {
        address: address.into(),
        agent_bin: Some(agent_bin()),
        max_processes: None,
        place_timeout_ms: None,
        env: [("BRAIN_TEST".to_string(), "ray".to_string())].into(),
    }
}

/// Every Ray job whose submission id starts with `prefix`, with its status.
async fn ray_jobs(address: &str, prefix: &str) -> Vec<(String, String)> {
    let body = reqwest::get(format!("{address}/api/jobs/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let all: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    all.iter()
        .filter_map(|j| {
            let id = j["submission_id"].as_str()?;
            id.starts_with(prefix).then(|| {
                (
                    id.to_string(),
                    j["status"].as_str().unwrap_or("").to_string(),
                )
            })
        })
        .collect()
}

const N: u64 = 40_000;

/// `job-master run --platform ray`: a ps job's 2 PS and 3 workers (1 CPU and 1 `brain_slot`
/// each) run as Ray jobs; the job finishes exactly once and every Ray job it made ended.
#[test]
fn a_ps_job_runs_on_ray_from_the_command_line() {
    let Some(address) = ray_address() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("ray-ps.yaml");
    std::fs::write(
        &spec,
        format!(
            r#"
name: ray-ps-{pid}
kind: ps
roles:
  ps: {{ replicas: 2, resources: {{ cpu: 1, memory: 256Mi }} }}
  worker: {{ replicas: 3, min: 1, max: 4, resources: {{ cpu: "1", memory: 256Mi, custom: {{ brain_slot: 1 }} }} }}
workload:
  builtin: {{ seed: 3, num_fields: 8, vocab_per_field: 500, hash_buckets: 16384, batch_size: 128, learning_rate: 0.1, step_delay_us: 100 }}
data: {{ num_samples: {N}, shard_size: 1000, eval_samples: 5000 }}
epochs: 2
checkpoint: {{ dir: {ckpt}, every_shards: 10 }}
"#,
            ckpt = dir.path().join("ckpt").display(),
            pid = std::process::id()
        ),
    )
    .unwrap();
    let run_dir = dir.path().join("run");
    let child = std::process::Command::new(job_master_bin())
        .arg("run")
        .arg(&spec)
        .args(["--platform", "ray", "--ray-address", &address])
        .arg("--agent-bin")
        .arg(agent_bin())
        .arg("--run-dir")
        .arg(&run_dir)
        .args(["--heartbeat-interval-ms", "200"])
        .spawn()
        .unwrap();
    let mut child = child;
    let status = test_support::wait_exit(&mut child, Duration::from_secs(300));
    assert!(status.success(), "job-master exited with {status}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["phase"], "succeeded", "{report:#}");
    assert_eq!(report["exactly_once"], "ok");
    for (_, n) in report["samples_per_epoch"].as_object().unwrap() {
        assert_eq!(n.as_u64(), Some(N));
    }
    for ps in report["ps_stats"].as_array().unwrap() {
        assert_eq!(ps["applied_samples"].as_u64(), Some(2 * N), "{ps}");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mine = rt.block_on(ray_jobs(
        &address,
        &format!("brain-ray-ps-{}-", std::process::id()),
    ));
    assert_eq!(mine.len(), 5, "{mine:?}");
    assert!(
        mine.iter().all(|(_, s)| s == "SUCCEEDED" || s == "STOPPED"),
        "{mine:?}"
    );
}

/// An allreduce job on Ray rescaled 2 → 4 → 2 workers while training: new workers are placed
/// by Ray, retired ones stopped through Ray, and every sample is consumed once per epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allreduce_job_on_ray_rescales_up_and_down() {
    let Some((address, _turn)) = ray().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "ray-ring", "allreduce", 0, 2, N, 2, 150, 8);
    let mut run = start_on(spec, dir.path(), test_timing(), on_ray(&address)).await;
    let addr = run.addr;
    shards_at_least(addr, 6).await;
    let s = rescale_workers(addr, 1, 4).await;
    let done = s.shards_done;
    shards_at_least(addr, done + 6).await;
    rescale_workers(addr, 2, 2).await;

    let report = run.report().await;
    assert_each_sample_once(&report, N, 2);
    let versions: Vec<u64> = report.transitions.iter().map(|t| t.version).collect();
    assert_eq!(versions, vec![1, 2]);
    assert_no_process_left(addr).await;
}

/// kill -9 of a worker's agent, the process Ray runs as the job: Ray reports the job FAILED,
/// the platform passes that on with Ray's message, the master relaunches the worker through
/// Ray, and nothing is lost or applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_worker_inside_ray_relaunches_it_and_loses_nothing() {
    let Some((address, _turn)) = ray().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "ray-kill", "ps", 1, 2, N, 2, 150, 10);
    let mut run = start_on(spec, dir.path(), test_timing(), on_ray(&address)).await;
    shards_at_least(run.addr, 8).await;
    let trainer = pid_of(run.addr, "worker", 1).await;
    let agent = parent_of(trainer);
    // The agent is the Ray job's process: its command line is the entrypoint Ray ran.
    let cmdline = std::fs::read(format!("/proc/{agent}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("agent"),
        "{agent} is not an agent"
    );
    let environ =
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{agent}/environ")).unwrap())
            .to_string();
    assert!(
        environ.contains("BRAIN_RAY_SUBMISSION_ID=brain-ray-kill-worker-1-1-"),
        "not started by Ray"
    );
    assert!(
        environ.contains("BRAIN_TEST=ray"),
        "the agent lacks the runtime env vars"
    );
    kill9(agent);
    let report = run.report().await;
    assert_eq!(report.restarts.get(&Role::WORKER), Some(&1));
    assert!(report.samples_per_epoch.values().all(|&s| s == N));
    assert_ps_applied_each_sample_once(&report, N, 2);
    assert_recovered(
        &report,
        "worker-1 failed (agent lost: agent process Ray job brain-ray-kill-worker-1-1-",
    );
    assert!(
        report
            .events
            .iter()
            .any(|e| e.contains("FAILED (exit code -9)") && e.contains("last output")),
        "{:#?}",
        report.events
    );
    assert_no_process_left(run.addr).await;
}

/// Another Ray user holding `cpus` of the head's CPUs until stopped; returned once Ray's usage
/// shows it.
async fn blocker(api: &RayApi, cpus: f64) -> String {
    let id = format!("blocker-{}-{cpus}", std::process::id());
    api.submit(&SubmitRequest {
        // Bounded: a test that fails before it stops the blocker holds the room no longer.
        entrypoint: "sleep 180".into(),
        submission_id: id.clone(),
        entrypoint_num_cpus: cpus,
        entrypoint_num_gpus: 0.0,
        entrypoint_memory: None,
        entrypoint_resources: Default::default(),
        runtime_env: Default::default(),
        metadata: Default::default(),
    })
    .await
    .unwrap();
    let start = Instant::now();
    loop {
        let c = api.cluster().await.unwrap();
        if c.nodes[0].available.cpus <= c.nodes[0].total.cpus - cpus {
            return id;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "usage never showed the blocker: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker Ray places only after the group's first round closed without it (another Ray
/// user held the room for it, then left), while no plan is on its way: the group drains to a
/// cut and re-forms to take it in, and every sample is trained once per epoch. Before, it
/// waited outside the group until the job ended (seen in CI's Ray chaos soak).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_ray_places_after_its_round_closed_is_taken_into_the_group() {
    let Some((address, _turn)) = ray().await else {
        return;
    };
    let api = RayApi::new(&address).unwrap();
    // 8 CPUs, 6 held: room for two of the three workers (1 CPU each).
    let blocker = blocker(&api, 6.0).await;
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "ray-late", "allreduce", 0, 3, N, 2, 1_000, 8);
    // The round waits as long for a worker still launching: 8 s here.
    let timing = job_master::job::Timing {
        register_timeout_ms: 8_000,
        ..test_timing()
    };
    let mut run = start_on(spec, dir.path(), timing, on_ray(&address)).await;
    shards_at_least(run.addr, 2).await;
    api.stop(&blocker).await.unwrap();
    let report = run.report().await;
    assert_each_sample_once(&report, N, 2);
    // Which worker Ray places last is Ray's choice; it starts from the re-formation's cut.
    for text in [
        "] joined after round 0 closed without them and no plan is on its way",
        "the group re-forms from the cut as round 1, with the late worker(s)",
        "(incarnation 1) restored step",
    ] {
        assert!(
            report.events.iter().any(|e| e.contains(text)),
            "{text}: {:#?}",
            report.events
        );
    }
    assert!(
        !report
            .events
            .iter()
            .any(|e| e.contains("never joined the group")),
        "{:#?}",
        report.events
    );
    assert_no_process_left(run.addr).await;
}

fn settings(address: &str, job: &str) -> RaySettings {
    let mut s = RaySettings::new(address, agent_bin(), job);
    s.poll = Duration::from_millis(100);
    s
}

fn launch(index: u32, cpu_millicores: u64) -> AgentLaunch {
    AgentLaunch {
        key: job_master::job::SlotKey {
            role: Role::WORKER,
            index,
        },
        incarnation: 1,
        // Nothing listens there: these agents never get a job master.
        master_addr: "127.0.0.1:9".parse().unwrap(),
        resources: Some(job_master::spec::Resources {
            cpu: Some(Millicores(cpu_millicores)),
            ..Default::default()
        }),
        token_file: token_file(),
        tls_dir: None,
        device_share: None,
        node: None,
    }
}

/// A job secret for the agents these tests launch (they read it as they start; an agent
/// without one exits at once, which Ray would report as a failed job).
fn token_file() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let file = DIR
        .get_or_init(|| tempfile::tempdir().unwrap())
        .path()
        .join(auth::JOB_TOKEN_FILE);
    auth::read_or_create(&file).unwrap();
    file
}

async fn next_event(
    events: &mut tokio::sync::mpsc::Receiver<PlatformEvent>,
    within: Duration,
) -> PlatformEvent {
    tokio::time::timeout(within, events.recv())
        .await
        .expect("no agent event in time")
        .expect("events open")
}

/// Capacity comes from Ray's state (node totals, and what is free once another Ray job holds
/// 7 of the 8 CPUs); a process that does not fit is never submitted (a PENDING Ray job could
/// not be stopped) but waits and is reported not placed (still pending) after the placement
/// timeout; one bigger than any node is refused at once; once room frees up a process is
/// placed (and the master told), and a stop ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_is_read_from_ray_and_only_what_fits_is_submitted() {
    let Some((address, _turn)) = ray().await else {
        return;
    };
    let api = RayApi::new(&address).unwrap();
    let cluster = api.cluster().await.unwrap();
    assert_eq!(cluster.nodes.len(), 1, "{cluster:?}");
    let node = &cluster.nodes[0];
    assert_eq!(node.ip, "127.0.0.1");
    assert!(node.is_head);
    assert_eq!(node.total.cpus, 8.0, "the head .ci/run starts has 8 CPUs");
    assert_eq!(node.total.custom.get("brain_slot"), Some(&4.0));
    assert!(node.total.memory_bytes > 0);

    // Another Ray user takes 7 CPUs.
    let blocker = blocker(&api, 7.0).await;

    let (tx, mut events) = tokio::sync::mpsc::channel(16);
    let mut s = settings(&address, "ray-cap");
    s.place_timeout = Duration::from_secs(3);
    let platform = RayPlatform::connect(s, tx).await.unwrap();
    let cap = platform.capacity();
    assert_eq!(cap.cpu, Millicores(8000));
    assert_eq!(cap.max_processes, 8);

    // Bigger than the node: refused without waiting.
    let mut huge = launch(0, 1000);
    huge.resources
        .as_mut()
        .unwrap()
        .custom
        .insert("brain_slot".into(), 5.0);
    let e = platform.launch(huge).await.unwrap_err().to_string();
    assert!(e.contains("more than any node"), "{e}");

    // Fits the node but not what is free: waits, never submitted, reported not placed after
    // 3 s (pending, not failed).
    let l = launch(1, 2000);
    let id = platform.submission_id(l.key, l.incarnation);
    platform.launch(l).await.unwrap();
    match next_event(&mut events, Duration::from_secs(20)).await {
        PlatformEvent::NotPlaced { description, .. } => assert!(
            description.contains("could not place 2 CPU within 3 s"),
            "{description}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        api.job(&id).await.unwrap(),
        None,
        "a process that did not fit was submitted"
    );
    assert_eq!(platform.running().await, 0);

    // Room frees up while a process waits: it is placed (after Ray's usage report catches
    // up), and a stop ends it through Ray.
    let (tx, mut events) = tokio::sync::mpsc::channel(16);
    let platform = RayPlatform::connect(settings(&address, "ray-cap2"), tx)
        .await
        .unwrap();
    let l = launch(2, 2000);
    let id = platform.submission_id(l.key, l.incarnation);
    platform.launch(l.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(api.job(&id).await.unwrap(), None);
    assert!(api.stop(&blocker).await.unwrap());
    let start = Instant::now();
    loop {
        if let Some(info) = api.job(&id).await.unwrap()
            && info.status == RayJobStatus::Running
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never placed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        next_event(&mut events, Duration::from_secs(20)).await,
        PlatformEvent::Placed {
            key: l.key,
            incarnation: l.incarnation
        }
    );
    platform.stop(l.key, Duration::from_secs(1)).await;
    match next_event(&mut events, Duration::from_secs(20)).await {
        PlatformEvent::AgentExited { description, .. } => {
            assert!(description.contains("STOPPED"), "{description}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        api.job(&id).await.unwrap().map(|i| i.status),
        Some(RayJobStatus::Stopped)
    );
    assert_eq!(platform.running().await, 0);
}

/// The answers the platform relies on: a duplicate submission id is told apart from other
/// errors (Ray answers HTTP 500 with a traceback), a plain-text error body becomes its one
/// telling line, an unknown job is `None` and stopping it is `false`, a finished job's logs
/// can be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rays_rough_answers_are_read_right() {
    let Some((address, _turn)) = ray().await else {
        return;
    };
    let api = RayApi::new(&address).unwrap();
    let id = format!("dup-{}", std::process::id());
    let req = SubmitRequest {
        entrypoint: "echo hello from ray; sleep 2".into(),
        submission_id: id.clone(),
        entrypoint_num_cpus: 0.5,
        entrypoint_num_gpus: 0.0,
        entrypoint_memory: None,
        entrypoint_resources: Default::default(),
        runtime_env: Default::default(),
        metadata: Default::default(),
    };
    api.submit(&req).await.unwrap();
    assert_eq!(api.submit(&req).await, Err(RayError::Duplicate(id.clone())));
    // Ray refuses to delete a live job, with a traceback as the body: one line remains.
    match api.delete(&id).await {
        Err(RayError::Http { status, text, .. }) => {
            assert_eq!(status, 500);
            assert!(
                text.starts_with("RuntimeError: Attempted to delete job"),
                "{text}"
            );
        }
        other => panic!("a live job was deleted: {other:?}"),
    }

    let start = Instant::now();
    loop {
        let info = api.job(&id).await.unwrap().unwrap();
        if info.status.is_terminal() {
            assert_eq!(info.status, RayJobStatus::Succeeded, "{info:?}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(api.logs(&id).await.unwrap().contains("hello from ray"));
    assert!(api.delete(&id).await.unwrap());
    assert_eq!(api.job("no-such-job").await.unwrap(), None);
    assert!(!api.stop("no-such-job").await.unwrap());
    assert!(api.version().await.unwrap().starts_with("2."));

    let unreachable = RayApi::new("127.0.0.1:9").unwrap();
    assert!(matches!(
        unreachable.cluster().await,
        Err(RayError::Unreachable { .. })
    ));
}
