//! Metric-report ingest of the brain service: batches of `batch` reports from `clients`
//! concurrent job masters (one connection each) over gRPC on loopback, each batch validated and
//! folded into the job's summary in one SQLite transaction (WAL) before it is acknowledged, and
//! each report's 6 per-process samples folded into the heuristics' in-memory view.
//! Throughput is in reports per second.
//!
//! The group `brain_ingest_security` measures the same ingest side by side in one run with no
//! authentication (`insecure`), with tokens (every call's bearer token checked: the default),
//! and with tokens over mutual TLS (`brain --tls-dir`).
//!
//! The group `brain_ingest_flood` measures the latency of one job's single reports (a call
//! every 3 ms) alone, while another job floods the brain with batches of 1,000 from 4 connections without
//! rate limits, and the same flood under the brain's default `[limits]`.
//!
//! cargo bench -p benches --bench brain_ingest

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proto::service::v1 as pb;

mod common;

type Client = pb::brain_client::BrainClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, auth::WithToken>,
>;

/// How callers reach the brain.
#[derive(Clone, Copy, Debug)]
enum Security {
    /// `--insecure`: no token checked, plain text.
    Insecure,
    /// The default: every call's token checked, plain text on loopback.
    Tokens,
    /// Tokens over mutual TLS.
    MutualTls,
}

async fn client(
    addr: std::net::SocketAddr,
    token: Option<auth::Token>,
    tls: Option<&auth::tls::ClientTls>,
) -> Client {
    let Some(tls) = tls else {
        return common::brain_client(&format!("http://{addr}"), token).await;
    };
    let endpoint = auth::endpoint(format!("https://{addr}"), Some(tls.config().unwrap())).unwrap();
    loop {
        if let Ok(channel) = endpoint.connect().await {
            return Client::new(auth::with_token(channel, auth::WithToken::new(token)));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
type Stop = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    tempfile::TempDir,
);

/// Starts a brain on a fresh database; returns one registered client per job.
async fn brain(clients: usize, security: Security, limited: bool) -> (Vec<(Client, u64)>, Stop) {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut config = brain::BrainConfig::with_database(dir.path().join("brain.db"));
    config.runs_dir = dir.path().join("runs");
    // Ingest as fast as the brain takes it: no rate limit per job (each sends far more than a
    // job master does), unless the limits are what is measured.
    if !limited {
        config.limits.calls_per_second = 0;
        config.limits.reports_per_second = 0;
    }
    let mut tls = None;
    match security {
        Security::Insecure => config.insecure = true,
        Security::Tokens => {}
        Security::MutualTls => {
            use auth::tls::*;
            let d = dir.path().join("tls");
            make(&d, &[]).unwrap();
            let client = ClientTls::in_dir(&d);
            config.tls = Some(ServerTls::in_dir(&d));
            config.launcher.tls = Some(client.clone());
            tls = Some(client);
        }
    }
    let handle = tokio::spawn(async move {
        if let Err(e) = brain::run(config, listener, async {
            let _ = rx.await;
        })
        .await
        {
            eprintln!("brain failed: {e}");
        }
    });
    // Registered by the operator; each job reports with its own secret, as job masters do.
    let token_file = dir.path().join("operator.token");
    let operator = loop {
        if let Ok(t) = auth::read_secret(&token_file) {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut op = client(addr, Some(operator), tls.as_ref()).await;
    let mut out = Vec::new();
    for i in 0..clients {
        let r = op
            .register_job(pb::RegisterJobRequest {
                job_name: format!("job-{i}"),
                master_address: "127.0.0.1:1".into(),
                shape: None,
            })
            .await
            .unwrap()
            .into_inner();
        out.push((
            client(addr, auth::Token::parse(&r.job_token), tls.as_ref()).await,
            r.job_id,
        ));
    }
    (out, (tx, handle, dir))
}

async fn stop((tx, handle, dir): Stop) {
    let _ = tx.send(());
    let _ = handle.await;
    drop(dir);
}

fn batch(size: usize, from: u64) -> Vec<pb::MetricReport> {
    (0..size as u64)
        .map(|k| pb::MetricReport {
            at_unix_ms: 1_700_000_000_000 + (from + k) as i64,
            global_step: from + k,
            samples_per_second: 1000.0 + k as f64,
            roles: vec![
                pb::RoleCount {
                    role: "worker".into(),
                    count: 4,
                    training: true,
                },
                pb::RoleCount {
                    role: "ps".into(),
                    count: 2,
                    training: false,
                },
            ],
            cpu_millicores: 8000,
            samples_done: (from + k) * 100,
            memory_bytes: 4 << 30,
            gpu_utilisation_pct: 80.0,
            role_rates: Vec::new(),
            // What a job master sends: each of its 6 processes, as the heuristics read them.
            processes: (0..6u32)
                .map(|i| pb::ProcessReport {
                    role: if i < 2 { "ps" } else { "worker" }.into(),
                    index: i % 4,
                    resources: Some(proto::jobmaster::v1::Resources {
                        cpu_millicores: 1000,
                        memory_bytes: 2 << 30,
                        ..Default::default()
                    }),
                    cpu_millicores: 900 + k,
                    memory_bytes: 1 << 30,
                    memory_peak_bytes: 1 << 30,
                    oom_kills: 0,
                    pending_ms: 0,
                    pending_reason: String::new(),
                    // The workers' GPUs, as NVML on their nodes reports them.
                    gpu_utilisation_pct: if i < 2 { 0.0 } else { 80.0 },
                    gpu_memory_bytes: if i < 2 { 0 } else { 20 << 30 },
                    host: format!("10.0.0.{}", i % 3 + 1),
                    devices: if i < 2 {
                        String::new()
                    } else {
                        format!("{}", i % 4)
                    },
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("brain_ingest");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (clients, size) in [(1usize, 1usize), (1, 100), (4, 100), (4, 1000)] {
        g.throughput(Throughput::Elements((clients * size) as u64));
        g.bench_function(format!("{clients} job masters, batches of {size}"), |b| {
            b.to_async(&rt)
                .iter_custom(|iters| ingest(clients, size, Security::Tokens, iters));
        });
    }
    g.finish();
    let mut g = c.benchmark_group("brain_ingest_security");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (clients, size) in [(1usize, 1usize), (4, 100)] {
        for security in [Security::Insecure, Security::Tokens, Security::MutualTls] {
            g.throughput(Throughput::Elements((clients * size) as u64));
            g.bench_function(
                format!("{security:?}, {clients} job masters, batches of {size}"),
                |b| {
                    b.to_async(&rt)
                        .iter_custom(|iters| ingest(clients, size, security, iters));
                },
            );
        }
    }
    g.finish();
    let mut g = c.benchmark_group("brain_ingest_flood");
    // The time measured is the calls' own (not the pauses between them): a short target.
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for flood in [Flood::None, Flood::Unlimited, Flood::Limited] {
        g.bench_function(format!("one report per call, {flood:?}"), |b| {
            b.to_async(&rt).iter_custom(|iters| flooded(flood, iters));
        });
    }
    g.finish();
}

/// What another job does while one job reports.
#[derive(Clone, Copy, Debug)]
enum Flood {
    /// Nothing.
    None,
    /// Sends batches of 1,000 reports from 4 connections as fast as it can, no rate limit.
    Unlimited,
    /// The same, under the brain's default `[limits]`.
    Limited,
}

/// Time one job's `iters` single reports took (their calls only), while another job floods
/// the brain as `flood` says.
async fn flooded(flood: Flood, iters: u64) -> Duration {
    let (mut cs, s) = brain(2, Security::Tokens, matches!(flood, Flood::Limited)).await;
    let (mut honest, honest_id) = cs.remove(0);
    let (flooder, flooder_id) = cs.remove(0);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut set = tokio::task::JoinSet::new();
    if !matches!(flood, Flood::None) {
        for k in 0..4u64 {
            let (mut c, done) = (flooder.clone(), done.clone());
            set.spawn(async move {
                let mut i = k << 40;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    // Refusals (RESOURCE_EXHAUSTED) are what the limits are for: go on.
                    let _ = c
                        .report_metrics(pb::MetricsBatch {
                            job_id: flooder_id,
                            reports: batch(1000, i),
                        })
                        .await;
                    i += 1000;
                }
            });
        }
        // The flood under way.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Paced as a busy job master (a call every 3 ms, within its own calls_per_second); the
    // calls' time only is summed.
    let mut elapsed = Duration::ZERO;
    for i in 0..iters {
        let start = Instant::now();
        honest
            .report_metrics(pb::MetricsBatch {
                job_id: honest_id,
                reports: batch(1, i),
            })
            .await
            .unwrap();
        elapsed += start.elapsed();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    stop(s).await;
    elapsed
}

/// Time for `clients` job masters to send `iters` batches of `size` reports each.
async fn ingest(clients: usize, size: usize, security: Security, iters: u64) -> Duration {
    let (cs, s) = brain(clients, security, false).await;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (mut c, id) in cs {
        set.spawn(async move {
            for i in 0..iters {
                c.report_metrics(pb::MetricsBatch {
                    job_id: id,
                    reports: batch(size, i * size as u64),
                })
                .await
                .unwrap();
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    let elapsed = start.elapsed();
    stop(s).await;
    elapsed
}

criterion_group!(benches, bench);
criterion_main!(benches);
