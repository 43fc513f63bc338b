//! A real client's latency while the brain is flooded with connections that never speak
//! (issue 40, attack 1). A release `brain` runs with its open-file limit at 1,024 (soft and
//! hard, the common default it cannot raise), in plain text (`--insecure`) and with its own TLS
//! (the default: a certificate it makes, pinned by the client); a thread holds 3,000
//! connections to it that never send a byte (or never start their TLS handshake), renewing each
//! the brain closes. A client measures `ListJobs` on a fresh connection each time (connect,
//! TLS, the call: what `brainctl` pays) and on one kept connection, first alone, then under the
//! flood. Prints a table (p50, p99, max, and how many calls failed).
//!
//! cargo build --release -p brain && cargo bench -p benches --bench connection_flood

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proto::service::v1 as pb;

mod common;

type Client = pb::brain_client::BrainClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, auth::WithToken>,
>;

const CALLS: usize = 300;
const HELD: usize = 3000;

fn start_brain(d: &Path, insecure: bool) -> (test_support::Spawned, String) {
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=1024:1024")
        .arg(common::release_bin("brain"))
        .args(["--listen", "127.0.0.1:0", "--cpus", "2"])
        .arg("--database")
        .arg(d.join("brain.db"))
        .arg("--runs-dir")
        .arg(d.join("runs"))
        .stderr(std::fs::File::create(d.join("brain.log")).unwrap());
    if insecure {
        cmd.arg("--insecure");
    }
    test_support::brain_run_as(&mut cmd);
    test_support::spawn_announcing(&mut cmd, "listening on ", Duration::from_secs(60))
}

async fn connect(
    addr: &str,
    token: &auth::Token,
    tls: Option<&auth::tls::ClientTls>,
) -> Result<Client, String> {
    let (url, tls) = match tls {
        Some(t) => (format!("https://{addr}"), Some(t.config().unwrap())),
        None => (format!("http://{addr}"), None),
    };
    let channel = auth::endpoint(url, tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(Client::new(auth::with_token(
        channel,
        auth::WithToken::new(Some(token.clone())),
    )))
}

/// The latencies of `CALLS` calls, ms, and how many failed.
async fn measure(
    addr: &str,
    token: &auth::Token,
    tls: Option<&auth::tls::ClientTls>,
    fresh: bool,
) -> (Vec<f64>, usize) {
    let mut kept = None;
    let (mut ms, mut failed) = (Vec::new(), 0);
    for _ in 0..CALLS {
        let t = Instant::now();
        let r = async {
            let c = match (&mut kept, fresh) {
                (Some(c), false) => c,
                _ => kept.insert(connect(addr, token, tls).await?),
            };
            c.list_jobs(pb::ListJobsRequest {})
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(20), r).await {
            Ok(Ok(())) => ms.push(t.elapsed().as_secs_f64() * 1000.0),
            _ => {
                failed += 1;
                kept = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ms.sort_by(f64::total_cmp);
    (ms, failed)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    auth::listen::raise_open_files().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!(
        "| brain | connection | flood | p50 ms | p99 ms | max ms | failed | flood connections made |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for with_tls in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (_brain, addr) = start_brain(d, !with_tls);
        let tls = with_tls.then(|| auth::tls::ClientTls {
            ca_file: d.join("tls").join(auth::tls::CA_CERT),
            cert_file: None,
            key_file: None,
        });
        // An --insecure brain checks no token (and may not have written one yet).
        let token = if with_tls {
            auth::read_secret(&d.join("operator.token")).unwrap()
        } else {
            auth::Token::generate()
        };
        for flooded in [false, true] {
            let stop = Arc::new(AtomicBool::new(false));
            let made = Arc::new(AtomicUsize::new(0));
            let flooder = flooded.then(|| {
                test_support::hold_silent_connections(
                    addr.clone(),
                    HELD,
                    stop.clone(),
                    made.clone(),
                )
            });
            if flooded {
                while made.load(Ordering::Relaxed) < HELD {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            for fresh in [true, false] {
                let (ms, failed) = rt.block_on(measure(&addr, &token, tls.as_ref(), fresh));
                println!(
                    "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {failed} of {CALLS} | {} |",
                    if with_tls {
                        "its own TLS (default)"
                    } else {
                        "plain (--insecure)"
                    },
                    if fresh { "new per call" } else { "kept" },
                    if flooded {
                        format!("{HELD} silent held")
                    } else {
                        "none".into()
                    },
                    quantile(&ms, 0.5),
                    quantile(&ms, 0.99),
                    ms.last().copied().unwrap_or(f64::NAN),
                    made.load(Ordering::Relaxed),
                );
            }
            stop.store(true, Ordering::Relaxed);
            if let Some(f) = flooder {
                f.join().unwrap();
            }
        }
    }
}
