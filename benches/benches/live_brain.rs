//! The live brain, measured on this machine, printed as tables:
//!
//! 1. Three reference jobs (two allreduce, one PS) submitted 6 s apart to a brain that may hand
//!    out 4 CPUs, side by side in one run: resource-free under the brain (Pollux-style sharing,
//!    resized as jobs arrive and finish) vs the same jobs at a static user request (2 workers,
//!    and 1 PS for the PS job), admitted first come first served and never resized. Aggregate
//!    samples/s = all samples trained / (last end − first submission).
//! 2. Four jobs, one of them PS-bound (its PS given 200m, its workers pushing as fast as they
//!    can), on the same 4 CPUs, side by side: the brain (elastic_lp and the default heuristics,
//!    resource-free specs) vs DLRover's rule (each job at a request of 2 workers, grown while
//!    it speeds up, the same heuristics, no cluster-wide decision) vs static requests (2
//!    workers and 1 PS, FIFO, no heuristics).
//! 3. One optimisation round with 1,000 and with 10,000 registered running jobs (each with
//!    reported speeds):
//!    `DryRun` over gRPC, i.e. the SQLite snapshot plus the scheduler, per scheduler.
//! 4. Ingest while rounds run: 10,000 registered running jobs whose simulated job masters each
//!    report every 10 s for 60 s, side by side without rounds and with the live round every
//!    second: report latency (p50, p99, max), reports stored (nothing lost), rounds run and
//!    their mean times (from the brain's `GET /metrics`): the snapshot under the store's lock,
//!    the solve, and the whole round with its plans stored.
//!
//! cargo build --release -p brain -p job-master -p worker-agent && cargo bench -p benches --bench live_brain
//! (`-- four_jobs`, `-- three_jobs`, `-- round` or `-- ingest` runs one table)

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use std::time::{Duration, Instant};
use test_support::Spawned;

use common::release_bin;
use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;
use proto::service::v1::brain_client::BrainClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const SAMPLES: u64 = 40_000;
const EPOCHS: u64 = 2;

fn start_brain(dir: &Path, cpus: u32) -> (Spawned, String) {
    // No rate limits: the rounds' figures are the brain's own, not a limit's; a round with
    // thousands of jobs registers them as fast as the brain takes them.
    std::fs::write(
        dir.join("brain.toml"),
        format!(
            "database = {:?}\n[limits]\ncalls_per_second = 0\nreports_per_second = 0\n\
             submissions_per_minute = 0\n",
            dir.join("brain.db")
        ),
    )
    .unwrap();
    let mut cmd = Command::new(release_bin("brain"));
    cmd.arg("--config")
        .arg(dir.join("brain.toml"))
        .args(["--listen", "127.0.0.1:0", "--cpus", &cpus.to_string()])
        .args(["--max-processes", "100000"])
        .arg("--database")
        .arg(dir.join("brain.db"))
        .arg("--runs-dir")
        .arg(dir.join("runs"))
        .arg("--policy")
        .arg(dir.join("policy.toml"))
        .arg("--job-master-bin")
        .arg(release_bin("job-master"))
        .args([
            "--job-master-arg=--brain-interval-ms",
            "--job-master-arg=300",
        ])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null());
    test_support::brain_run_as(&mut cmd);
    let (child, addr) =
        test_support::spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(60));
    (child, format!("http://{addr}"))
}

type Client = BrainClient<InterceptedService<Channel, auth::WithToken>>;

/// A client with the operator token of the brain whose database is in `dir`, over the TLS
/// the brain made itself there (its default).
/// The brain at `url` (its data in `dir`) as its clients reach it: over its own TLS.
fn endpoint(url: &str, dir: &Path) -> tonic::transport::Endpoint {
    let tls = auth::tls::ClientTls {
        ca_file: dir.join("tls").join(auth::tls::CA_CERT),
        cert_file: None,
        key_file: None,
    }
    .config()
    .unwrap();
    auth::endpoint(url.to_string(), Some(tls)).unwrap()
}

async fn client(url: &str, dir: &Path) -> Client {
    let token = auth::read_secret(&dir.join("operator.token")).unwrap();
    let endpoint = endpoint(url, dir);
    loop {
        if let Ok(channel) = endpoint.connect().await {
            return BrainClient::with_interceptor(channel, auth::WithToken::new(Some(token)));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn spec(name: &str, kind: &str, fixed: bool) -> String {
    let ps = match (kind, fixed) {
        ("ps", true) => "  ps: { replicas: 1, resources: { cpu: 1, memory: 512Mi } }\n",
        ("ps", false) => "  ps: {}\n",
        _ => "",
    };
    let worker = if fixed {
        "  worker: { replicas: 2, min: 2, max: 2, resources: { cpu: 1, memory: 512Mi } }\n"
    } else {
        "  worker: { min: 1, max: 4 }\n"
    };
    format!(
        "name: {name}\nkind: {kind}\nroles:\n{ps}{worker}\
         workload:\n  builtin: {{ batch_size: 128, step_delay_us: 600 }}\n\
         data: {{ num_samples: {SAMPLES}, shard_size: 500, eval_samples: 2000 }}\n\
         epochs: {EPOCHS}\ncheckpoint: {{ dir: checkpoints, every_shards: 16 }}\n"
    )
}

struct Outcome {
    makespan_s: f64,
    mean_jct_s: f64,
    plans: u64,
    /// Samples over all jobs and epochs.
    samples: f64,
    /// A line per job: JCT, plans, PS reshards.
    per_job: Vec<String>,
}

/// One job of a scenario: its spec and when it is submitted.
struct Submit {
    name: String,
    spec: String,
    at_s: u64,
    samples: u64,
}

/// Submits `jobs` on schedule to a brain of 4 CPUs under `policy` and waits for every one to
/// succeed.
async fn run(policy: &str, jobs: &[Submit]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.toml"), policy).unwrap();
    let (mut brain, url) = start_brain(dir.path(), 4);
    let mut c = client(&url, dir.path()).await;
    let t0 = Instant::now();
    let mut submitted = Vec::new();
    for j in jobs {
        let at = Duration::from_secs(j.at_s);
        tokio::time::sleep(at.saturating_sub(t0.elapsed())).await;
        let r = c
            .submit_job(pb::SubmitJobRequest {
                spec_yaml: j.spec.clone(),
                origin: j.name.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        submitted.push((r.job_id, t0.elapsed()));
    }
    let mut ended = std::collections::BTreeMap::new();
    let mut plans = 0;
    while ended.len() < jobs.len() {
        let all = c
            .list_jobs(pb::ListJobsRequest {})
            .await
            .unwrap()
            .into_inner()
            .jobs;
        for j in &all {
            match j.state.as_str() {
                "succeeded" => {
                    ended.entry(j.job_id).or_insert(t0.elapsed());
                }
                "failed" | "cancelled" => panic!("{} ended {}: {}", j.job_name, j.state, j.outcome),
                _ => {}
            }
        }
        plans = all.iter().map(|j| j.plan_version).sum();
        assert!(t0.elapsed() < Duration::from_secs(900), "jobs did not end");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let records = c
        .list_jobs(pb::ListJobsRequest {})
        .await
        .unwrap()
        .into_inner()
        .jobs;
    brain.kill();
    let makespan_s = ended.values().max().unwrap().as_secs_f64();
    let jct = |id: &u64| {
        let at = submitted.iter().find(|(j, _)| j == id).unwrap().1;
        ended[id].as_secs_f64() - at.as_secs_f64()
    };
    let mean_jct_s = submitted.iter().map(|(id, _)| jct(id)).sum::<f64>() / submitted.len() as f64;
    // Per job: its JCT, plans and the PS reshards its job master carried out.
    let per_job = records
        .iter()
        .map(|r| {
            let report = std::path::Path::new(&r.run_dir).join("master/report.json");
            let report: serde_json::Value = std::fs::read(&report)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            let list = |key: &str| report[key].as_array().cloned().unwrap_or_default();
            let reshards: Vec<String> = list("reshards")
                .iter()
                .map(|x| format!("{}->{}", x["from_ps"], x["to_ps"]))
                .collect();
            // "plan 2 accepted: 1 ps + 2 worker -> 2 ps + 1 worker; ...": the sizes.
            let plans: Vec<String> = list("events")
                .iter()
                .filter_map(|e| e.as_str())
                .filter_map(|e| e.split_once(" accepted: "))
                .map(|(_, sizes)| sizes.split(';').next().unwrap_or(sizes).to_string())
                .collect();
            format!(
                "{}: JCT {:.1} s, ps reshards [{}], plans [{}]",
                r.job_name,
                jct(&r.job_id),
                reshards.join(", "),
                plans.join("; ")
            )
        })
        .collect();
    Outcome {
        makespan_s,
        mean_jct_s,
        plans,
        samples: jobs.iter().map(|j| j.samples as f64).sum(),
        per_job,
    }
}

async fn scenario(resource_free: bool) -> Outcome {
    let policy = if resource_free {
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\nrestart_delay_s = 3\n[live]\ninterval_s = 1\ncooldown_s = 3\n"
    } else {
        "heuristics = []\n[scheduler]\nkind = \"fifo\"\n[live]\ninterval_s = 1\n"
    };
    let jobs: Vec<Submit> = [("a", "allreduce"), ("b", "ps"), ("c", "allreduce")]
        .iter()
        .enumerate()
        .map(|(i, (name, kind))| Submit {
            name: name.to_string(),
            spec: spec(name, kind, !resource_free),
            at_s: 6 * i as u64,
            samples: SAMPLES * EPOCHS,
        })
        .collect();
    run(policy, &jobs).await
}

/// How the four-job workload is run.
#[derive(Clone, Copy)]
enum Mode {
    /// Resource-free under the brain: elastic_lp and the default heuristics.
    Brain,
    /// DLRover's rule: each job at its request, grown while it speeds up (the `dlrover`
    /// scheduler, no cluster-wide decision), with the same heuristics.
    DlroverRule,
    /// Static requests, first come first served, no heuristics.
    Static,
}

/// Samples of the PS-bound job: its workers do no extra compute, so the PS is the bottleneck.
const PS_BOUND_SAMPLES: u64 = 2_000_000;

/// Four jobs, one PS-bound (its one PS given 200m, its workers pushing as fast as they can),
/// submitted 4 s apart.
fn four_jobs(mode: Mode) -> Vec<Submit> {
    let worker = match mode {
        Mode::Brain => "  worker: { min: 1, max: 4 }\n",
        Mode::DlroverRule => "  worker: { replicas: 2, min: 1, max: 4 }\n",
        Mode::Static => {
            "  worker: { replicas: 2, min: 2, max: 2, resources: { cpu: 1, memory: 512Mi } }\n"
        }
    };
    let ps = |bound: bool| match (mode, bound) {
        (Mode::Static, true) => "  ps: { replicas: 1, resources: { cpu: 200m, memory: 512Mi } }\n",
        (_, true) => "  ps: { replicas: 1, max: 3, resources: { cpu: 200m } }\n",
        (Mode::Static, false) => "  ps: { replicas: 1, resources: { cpu: 1, memory: 512Mi } }\n",
        (_, false) => "  ps: {}\n",
    };
    let job = |name: &str, kind: &str, ps: &str, delay: u32, samples: u64, epochs: u64| {
        format!(
            "name: {name}\nkind: {kind}\nroles:\n{ps}{worker}\
             workload:\n  builtin: {{ batch_size: 128, step_delay_us: {delay} }}\n\
             data: {{ num_samples: {samples}, shard_size: 500, eval_samples: 2000 }}\n\
             epochs: {epochs}\ncheckpoint: {{ dir: checkpoints, every_shards: 40 }}\n"
        )
    };
    let specs = [
        (
            "a",
            job("a", "allreduce", "", 600, SAMPLES, EPOCHS),
            SAMPLES * EPOCHS,
        ),
        (
            "b",
            job("b", "ps", ps(true), 0, PS_BOUND_SAMPLES, 1),
            PS_BOUND_SAMPLES,
        ),
        (
            "c",
            job("c", "allreduce", "", 600, SAMPLES, EPOCHS),
            SAMPLES * EPOCHS,
        ),
        (
            "d",
            job("d", "ps", ps(false), 600, SAMPLES, EPOCHS),
            SAMPLES * EPOCHS,
        ),
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(i, (name, spec, samples))| Submit {
            name: name.into(),
            spec,
            at_s: 4 * i as u64,
            samples,
        })
        .collect()
}

async fn four_job_scenario(mode: Mode) -> Outcome {
    let policy = match mode {
        Mode::Brain => {
            "[scheduler]\nkind = \"elastic_lp\"\nrestart_delay_s = 3\nmax_growth = 2\n\
             [live]\ninterval_s = 1\ncooldown_s = 3\n"
        }
        Mode::DlroverRule => {
            "[scheduler]\nkind = \"dlrover\"\ncooldown_s = 3\npending_timeout_s = 30\n\
             [live]\ninterval_s = 1\ncooldown_s = 3\n"
        }
        Mode::Static => "heuristics = []\n[scheduler]\nkind = \"fifo\"\n[live]\ninterval_s = 1\n",
    };
    run(policy, &four_jobs(mode)).await
}

async fn round_with(jobs: usize) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policy.toml"),
        "[live]\ninterval_s = 3600\n",
    )
    .unwrap();
    let (mut brain, url) = start_brain(dir.path(), (jobs * 3) as u32);
    let mut c = client(&url, dir.path()).await;
    register_running(&url, dir.path(), &c, jobs).await;
    println!(
        "\n{:<24} {:>12} {:>14} {:>14}",
        "policy", "solve (ms)", "round (ms)", "resized jobs"
    );
    // Every shipped policy (examples/policies/), as an operator would put it in force.
    let mut shipped: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
    shipped.sort();
    for file in shipped {
        let kind = file.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        c.set_policy(pb::PolicyText {
            toml: format!("{text}\n[live]\ninterval_s = 3600\ncooldown_s = 0\n"),
            path: String::new(),
        })
        .await
        .unwrap();
        let mut solve = Vec::new();
        let mut round = Vec::new();
        let mut changed = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let r = c.dry_run(pb::DryRunRequest {}).await.unwrap().into_inner();
            round.push(t.elapsed().as_secs_f64() * 1000.0);
            solve.push(r.solve_ms);
            changed = r
                .decisions
                .iter()
                .filter(|d| d.roles.iter().any(|c| c.training && c.from != c.to))
                .count();
            assert_eq!(r.decisions.len(), jobs);
        }
        solve.sort_by(f64::total_cmp);
        round.sort_by(f64::total_cmp);
        println!(
            "{kind:<24} {:>12.1} {:>14.1} {:>14}",
            solve[2], round[2], changed
        );
    }
    brain.kill();
}

/// Registers `jobs` running all-reduce jobs through the operator client `c` (1–4 workers each,
/// with speeds reported at 1..=its workers, as a job master reports them), 16 at a time;
/// returns each job's client (its own secret, over one of 8 shared connections) and id, in
/// order.
async fn register_running(url: &str, dir: &Path, c: &Client, jobs: usize) -> Vec<(Client, u64)> {
    const AT_ONCE: usize = 16;
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(endpoint(url, dir).connect().await.unwrap());
    }
    let mut set = tokio::task::JoinSet::new();
    for k in 0..AT_ONCE {
        let (mut c, channels) = (c.clone(), channels.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            for i in (k..jobs).step_by(AT_ONCE) {
                let workers = 1 + (i % 4) as u32;
                let registered = c
                    .register_job(pb::RegisterJobRequest {
                        job_name: format!("job-{i}"),
                        master_address: "127.0.0.1:9".into(),
                        shape: Some(pb::JobShape {
                            kind: "allreduce".into(),
                            roles: vec![pb::RoleShape {
                                role: "worker".into(),
                                topology: "allreduce".into(),
                                training: true,
                                count: workers,
                                min: 1,
                                max: 8,
                                node_unit: 1,
                                resources: Some(jm::Resources {
                                    cpu_millicores: 1000,
                                    memory_bytes: 1 << 30,
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }],
                            total_samples: 1_000_000,
                            ..Default::default()
                        }),
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let id = registered.job_id;
                let mut job = BrainClient::with_interceptor(
                    channels[i % channels.len()].clone(),
                    auth::WithToken::new(auth::Token::parse(&registered.job_token)),
                );
                let per = 500.0 + (i % 7) as f64 * 100.0;
                let reports = (1..=workers)
                    .map(|n| pb::MetricReport {
                        at_unix_ms: 1_700_000_000_000 + n as i64,
                        global_step: n as u64,
                        samples_per_second: per * n as f64 / (1.0 + 0.1 * n as f64),
                        roles: vec![pb::RoleCount {
                            role: "worker".into(),
                            count: n,
                            training: true,
                        }],
                        samples_done: 1000 * i as u64 % 900_000,
                        ..Default::default()
                    })
                    .collect();
                job.report_metrics(pb::MetricsBatch {
                    job_id: id,
                    reports,
                })
                .await
                .unwrap();
                out.push((i, job, id));
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.unwrap());
    }
    all.sort_by_key(|(i, _, _)| *i);
    all.into_iter().map(|(_, c, id)| (c, id)).collect()
}

/// A counter or a sum from the brain's `GET /metrics` (with its metrics token).
fn scraped(url: &str, dir: &Path, name: &str) -> f64 {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let token = auth::read_secret(&dir.join("metrics.token")).unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        token.expose()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `jobs` simulated job masters, each reporting one report every 10 s (phases spread evenly),
/// for `secs`, side by side: with no round running, and with the brain's live round every
/// second (elastic_lp, plans dispatched). Prints the reports' latency, what was stored, and
/// the rounds run.
async fn ingest_during_rounds(jobs: usize, secs: u64) {
    println!(
        "\n{:<14} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>14} {:>11} {:>11}",
        "rounds",
        "reports",
        "stored",
        "p50 (ms)",
        "p99 (ms)",
        "max (ms)",
        "rounds",
        "snapshot (ms)",
        "solve (ms)",
        "round (ms)"
    );
    for rounds in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("policy.toml"),
            format!(
                "[scheduler]\nkind = \"elastic_lp\"\n[live]\ninterval_s = {}\ncooldown_s = 3600\n",
                if rounds { 1 } else { 3600 }
            ),
        )
        .unwrap();
        let (mut brain, url) = start_brain(dir.path(), (jobs * 3) as u32);
        let c = client(&url, dir.path()).await;
        let clients = register_running(&url, dir.path(), &c, jobs).await;
        let initial: u64 = (0..jobs).map(|i| 1 + (i % 4) as u64).sum();
        let rounds_before = scraped(&url, dir.path(), "brain_rounds_total");
        let phases = ["snapshot_seconds", "solve_seconds", "seconds"];
        let mut before = Vec::new();
        for p in phases {
            before.push((
                scraped(&url, dir.path(), &format!("brain_round_{p}_sum")),
                scraped(&url, dir.path(), &format!("brain_round_{p}_count")),
            ));
        }
        let start = tokio::time::Instant::now() + Duration::from_secs(1);
        let period = Duration::from_secs(10);
        let mut set = tokio::task::JoinSet::new();
        for (k, (mut c, id)) in clients.into_iter().enumerate() {
            let offset = period * k as u32 / jobs as u32;
            set.spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u32;
                loop {
                    let at = start + offset + period * n;
                    if at > start + Duration::from_secs(secs) {
                        break;
                    }
                    tokio::time::sleep_until(at).await;
                    let t = Instant::now();
                    c.report_metrics(pb::MetricsBatch {
                        job_id: id,
                        reports: vec![pb::MetricReport {
                            at_unix_ms: 1_700_000_010_000 + 10_000 * n as i64,
                            global_step: 100 + n as u64,
                            samples_per_second: 1000.0,
                            roles: vec![pb::RoleCount {
                                role: "worker".into(),
                                count: 1,
                                training: true,
                            }],
                            ..Default::default()
                        }],
                    })
                    .await
                    .unwrap();
                    latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                    n += 1;
                }
                latencies
            });
        }
        let mut latencies = Vec::new();
        while let Some(r) = set.join_next().await {
            latencies.extend(r.unwrap());
        }
        latencies.sort_by(f64::total_cmp);
        let pick = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        let mut op = c.clone();
        let stored: u64 = op
            .list_jobs(pb::ListJobsRequest {})
            .await
            .unwrap()
            .into_inner()
            .jobs
            .iter()
            .map(|j| j.reports)
            .sum::<u64>()
            - initial;
        let mut means = Vec::new();
        for (p, (sum, count)) in phases.iter().zip(before) {
            let n = scraped(&url, dir.path(), &format!("brain_round_{p}_count")) - count;
            let s = scraped(&url, dir.path(), &format!("brain_round_{p}_sum")) - sum;
            means.push(if n > 0.0 {
                format!("{:.0}", s / n * 1000.0)
            } else {
                "-".into()
            });
        }
        println!(
            "{:<14} {:>8} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>14} {:>11} {:>11}",
            if rounds { "every second" } else { "none" },
            latencies.len(),
            stored,
            pick(0.5),
            pick(0.99),
            pick(1.0),
            scraped(&url, dir.path(), "brain_rounds_total") - rounds_before,
            means[0],
            means[1],
            means[2]
        );
        brain.kill();
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench --bench live_brain -- four_jobs` runs that table only (also `three_jobs`,
    // `round`, `ingest`); no name runs them all.
    let names: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |table: &str| names.is_empty() || names.iter().any(|n| n == table);
    if wanted("three_jobs") {
        three_jobs().await;
    }
    if wanted("four_jobs") {
        four_job_table().await;
    }
    if wanted("round") {
        for jobs in [1_000, 10_000] {
            println!("\none round with {jobs} registered running jobs (median of 5 dry runs):");
            round_with(jobs).await;
        }
    }
    if wanted("ingest") {
        println!(
            "\n10,000 simulated job masters, each reporting every 10 s for 60 s, without and \
             with the live round every second (10,000 running jobs, elastic_lp):"
        );
        ingest_during_rounds(10_000, 60).await;
    }
}

fn row(name: &str, o: &Outcome) {
    println!(
        "{name:<40} {:>12.1} {:>16.0} {:>12.1} {:>8}",
        o.makespan_s,
        o.samples / o.makespan_s,
        o.mean_jct_s,
        o.plans
    )
}

async fn three_jobs() {
    println!(
        "three jobs (2 allreduce, 1 ps; {SAMPLES} samples x {EPOCHS} epochs each) submitted 6 s apart, 4 CPUs"
    );
    let brain = scenario(true).await;
    let fixed = scenario(false).await;
    println!(
        "{:<40} {:>12} {:>16} {:>12} {:>8}",
        "mode", "makespan (s)", "aggregate sps", "mean JCT (s)", "plans"
    );
    row("brain (resource-free, pollux, resized)", &brain);
    row("static requests (2 workers, fifo)", &fixed);
    println!(
        "aggregate samples/s, brain / static: {:.2}x",
        fixed.makespan_s / brain.makespan_s
    );
}

async fn four_job_table() {
    println!(
        "\nfour jobs submitted 4 s apart (2 allreduce and 1 ps of {SAMPLES} samples x {EPOCHS} \
         epochs; 1 PS-bound ps job of {PS_BOUND_SAMPLES} samples, its PS given 200m), 4 CPUs"
    );
    println!(
        "{:<40} {:>12} {:>16} {:>12} {:>8}",
        "mode", "makespan (s)", "aggregate sps", "mean JCT (s)", "plans"
    );
    let modes = [
        ("brain (elastic_lp + heuristics)", Mode::Brain),
        ("DLRover's rule (dlrover + heuristics)", Mode::DlroverRule),
        ("static requests (fifo, no heuristics)", Mode::Static),
    ];
    for (name, mode) in modes {
        let o = four_job_scenario(mode).await;
        row(name, &o);
        for line in &o.per_job {
            println!("    {line}");
        }
    }
}
