//! Shard-lease RPC throughput of the job master: each element is one `LeaseShard` plus one
//! `ReportShardDone`, over gRPC on loopback, from 1, 8 or 32 concurrent training-process
//! clients (one connection each), with every change fsynced before it is acknowledged (group
//! commit). The ledger holds exactly the shards the measurement consumes. Each count is measured
//! twice side by side: as a job runs by default (the job's secret on every call) and with the
//! job's mutual TLS (`job-master run --job-tls`).
//!
//! cargo bench -p benches --bench shard_lease

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use job_master::MasterConfig;
use job_master::job::Timing;
use job_master::platform::PlatformConfig;
use job_master::spec::JobSpec;
use proto::jobmaster::v1 as pb;

type Client = pb::job_master_client::JobMasterClient<auth::Channel>;

fn spec(dir: &std::path::Path, workers: u32, shards: u64) -> JobSpec {
    let yaml = format!(
        "name: lease-bench\nkind: allreduce\nroles:\n  worker: {{ replicas: {workers} }}\nworkload:\n  builtin: {{}}\n\
         data: {{ num_samples: {shards}, shard_size: 1 }}\ncheckpoint: {{ dir: {}, every_shards: 0 }}\n",
        dir.join("ckpt").display()
    );
    JobSpec::from_yaml(&yaml).unwrap()
}

/// Starts a master for `clients` workers and `shards` shards; returns connected, registered clients.
type Stop = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    tempfile::TempDir,
);

async fn master(clients: u32, shards: u64, job_tls: bool) -> (Vec<Client>, Stop) {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let config = MasterConfig {
        spec: spec(dir.path(), clients, shards),
        run_dir: dir.path().join("run"),
        timing: Timing {
            heartbeat_timeout_ms: 3_600_000,
            ..Timing::default()
        },
        platform: PlatformConfig::External,
        brain: None,
        resume: false,
        advertise: None,
        token_file: None,
        job_tls,
        connections: Default::default(),
    };
    let handle = tokio::spawn(async move {
        let r = job_master::run(config, listener, async {
            let _ = rx.await;
        })
        .await;
        if let Err(e) = r {
            eprintln!("job master failed: {e}");
        }
    });
    let mut out = Vec::new();
    for index in 0..clients {
        let mut c = loop {
            let run = dir.path().join("run");
            if let Ok(token) = auth::read_secret(&run.join(auth::JOB_TOKEN_FILE)) {
                let tls = match job_tls {
                    true => {
                        auth::tls::JobTls::load(&run.join(job_master::master::JOB_TLS_DIR)).ok()
                    }
                    false => None,
                };
                if tls.is_some() == job_tls
                    && let Ok(c) = (auth::JobCreds { token, tls })
                        .connect(
                            format!("http://{addr}"),
                            auth::Deadlines::all(Duration::from_secs(60)),
                        )
                        .await
                {
                    break Client::new(c);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        c.register_agent(pb::RegisterAgentRequest {
            role: "worker".into(),
            index,
            incarnation: 1,
            host: "127.0.0.1".into(),
            agent_pid: 0,
            service_addr: "127.0.0.1:1".into(),
            devices: String::new(),
        })
        .await
        .unwrap();
        out.push(c);
    }
    (out, (tx, handle, dir))
}

/// Ends the master and only then removes its directory.
async fn stop((tx, handle, dir): Stop) {
    let _ = tx.send(());
    let _ = handle.await;
    drop(dir);
}

async fn lease_and_done(mut c: Client, index: u32, n: u64) {
    let me = pb::ProcessRef {
        role: "worker".into(),
        index,
        incarnation: 1,
    };
    for _ in 0..n {
        let r = c
            .lease_shard(pb::LeaseShardRequest {
                process: Some(me.clone()),
                cluster_version: 0,
                round: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let shard = r.shard.expect("enough shards for the measurement");
        c.report_shard_done(pb::ShardDone {
            process: Some(me.clone()),
            shard_id: shard.id,
            epoch: shard.epoch,
            samples: 1,
        })
        .await
        .unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("shard_lease");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (clients, tls) in [1u32, 8, 32]
        .into_iter()
        .flat_map(|n| [(n, false), (n, true)])
    {
        g.throughput(Throughput::Elements(clients as u64));
        let name = match tls {
            false => format!("lease+done, {clients} clients"),
            true => format!("lease+done, {clients} clients, job TLS"),
        };
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let (cs, m) = master(clients, iters * clients as u64, tls).await;
                let start = Instant::now();
                let mut set = tokio::task::JoinSet::new();
                for (i, c) in cs.into_iter().enumerate() {
                    set.spawn(lease_and_done(c, i as u32, iters));
                }
                while let Some(r) = set.join_next().await {
                    r.unwrap();
                }
                let elapsed = start.elapsed();
                stop(m).await;
                elapsed
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
