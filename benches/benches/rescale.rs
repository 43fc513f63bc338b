//! Rescale figures, printed as tables:
//! * allreduce 2 → 4 and 4 → 2 on local processes: time from the plan being accepted to every
//!   worker of the new group reporting a training step (p50, p95 over 20 events each), and to
//!   the plan being reached (the new group formed); with `BRAIN_RAY_ADDRESS` set (a Ray
//!   dashboard), the same on Ray in the same run (10 events each);
//! * PS reshard of 10 MB and 100 MB of parameters, 2 → 3 and 3 → 2 PS: the PS servers run on
//!   loopback gRPC in this process, keys are moved by the job master's own reshard routine, and
//!   the parameter digest is checked before and after.
//!
//! cargo build --release -p job-master -p worker-agent && cargo bench -p benches --bench rescale
//! (BRAIN_RAY_ADDRESS=http://127.0.0.1:8265 for the Ray table)

mod common;

use common::{
    alternate_rescales, master_client, ray_address, start_master, stop_master, transitions,
};
use std::time::Duration;

use proto::jobmaster::v1 as pb;
use worker_agent::workload::model::{SparseTable, ps_owner};
use worker_agent::workload::ps_server::{PsService, serve};

const EVENTS: usize = 20;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn allreduce_rescale(ray: Option<&str>, events: usize) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "name: bench-rescale\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, min: 1, max: 4 }}\n\
         workload:\n  builtin: {{ batch_size: 256, hash_buckets: 65536 }}\n\
         data: {{ num_samples: 100000000, shard_size: 2000, eval_samples: 1000 }}\n\
         checkpoint: {{ dir: {}, every_shards: 0 }}\n",
        dir.path().join("ckpt").display()
    );
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, yaml).unwrap();
    let run_dir = dir.path().join("run");
    let (mut master, addr) = start_master(&spec, &run_dir, ray);
    let mut c = master_client(&addr, &run_dir).await;
    // Training first.
    while c
        .get_status(pb::StatusRequest {})
        .await
        .map(|s| s.into_inner().global_step)
        .unwrap_or(0)
        == 0
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    alternate_rescales(&mut c, &run_dir, events as u64, Duration::from_secs(60)).await;
    stop_master(&mut master.child);
    let t = transitions(&run_dir);
    let on = if ray.is_some() {
        "Ray"
    } else {
        "local processes"
    };
    println!("\nallreduce rescale on {on} ({events} events each, release build)");
    println!(
        "{:<10} {:>22} {:>22} {:>18}",
        "change", "resumed p50 / p95 (ms)", "reached p50 / p95 (ms)", "max resumed (ms)"
    );
    for (name, up) in [("2 -> 4", true), ("4 -> 2", false)] {
        let rows: Vec<&serde_json::Value> = t
            .iter()
            .filter(|r| (r["version"].as_u64().unwrap() % 2 == 1) == up)
            .collect();
        let ms = |r: &serde_json::Value, f: &str| {
            (r[f].as_u64().unwrap() - r["accepted_ms"].as_u64().unwrap()) as f64
        };
        let mut resumed: Vec<f64> = rows.iter().map(|r| ms(r, "resumed_ms")).collect();
        let mut reached: Vec<f64> = rows.iter().map(|r| ms(r, "reached_ms")).collect();
        println!(
            "{name:<10} {:>10.0} / {:<9.0} {:>10.0} / {:<9.0} {:>18.0}",
            percentile(&mut resumed, 0.5),
            percentile(&mut resumed, 0.95),
            percentile(&mut reached, 0.5),
            percentile(&mut reached, 0.95),
            resumed.iter().cloned().fold(0.0, f64::max)
        );
    }
}

/// Starts `n` PS on loopback holding `keys` keys split by the layout of `layout` servers
/// (servers at index ≥ `layout` start empty).
async fn start_ps(n: u32, layout: u32, keys: u64, token: &auth::Token) -> Vec<String> {
    let mut tables: Vec<SparseTable> = (0..n).map(|_| SparseTable::default()).collect();
    for k in 0..keys {
        let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        tables[ps_owner(key, layout) as usize]
            .params
            .insert(key, [k as f32 * 1e-6, 1.0 + k as f32 * 1e-7]);
    }
    let mut addrs = Vec::new();
    for (i, t) in tables.into_iter().enumerate() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap().to_string());
        let num_ps = if (i as u32) < layout { layout } else { n };
        let svc = PsService::new(i as u32, num_ps, 0.1, t, token.clone().into());
        tokio::spawn(serve(svc, listener, std::future::pending()));
    }
    addrs
}

async fn ps_reshard() {
    println!("\nPS reshard over loopback gRPC (keys moved PS to PS; 16 bytes per key)");
    println!(
        "{:<10} {:>12} {:>12} {:>14} {:>10} {:>16}",
        "change", "parameters", "keys", "moved keys", "time (ms)", "digest unchanged"
    );
    for mb in [10u64, 100] {
        let keys = mb * 1_000_000 / 16;
        for (from, to) in [(2u32, 3u32), (3, 2)] {
            let servers = from.max(to);
            let token = auth::Token::generate();
            let addrs = start_ps(servers, from, keys, &token).await;
            let old = addrs[..from as usize].to_vec();
            let new = addrs[..to as usize].to_vec();
            let r = job_master::master::reshard_ps(1, &old, &new, &token.clone().into())
                .await
                .unwrap();
            println!(
                "{:<10} {:>9} MB {:>12} {:>14} {:>10} {:>16}",
                format!("{from} -> {to}"),
                mb,
                r.total_keys,
                r.moved_keys,
                r.took_ms,
                r.digest_before == r.digest_after
            );
            assert_eq!(r.digest_before, r.digest_after);
        }
    }
}

fn main() {
    // `cargo bench` passes --bench; this binary takes no other arguments.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        ps_reshard().await;
        allreduce_rescale(None, EVENTS).await;
        if let Some(a) = ray_address() {
            allreduce_rescale(Some(&a), EVENTS / 2).await;
        }
    });
}
