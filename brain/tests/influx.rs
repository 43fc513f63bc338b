//! The InfluxDB sink against a real server: Debian's `influxdb` (1.6.7, the 1.x HTTP API),
//! started here on 127.0.0.1 with its data in a temporary directory. Reports a brain accepts
//! are written as line protocol and read back with InfluxQL, including those sent while the
//! server was down (killed with SIGKILL and started again).
//!
//! `.ci/run` installs the package and sets `BRAIN_REQUIRE_INFLUXDB=1`, which makes a missing
//! `influxd` a failure; elsewhere the test says it skipped.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brain::sink::SinkConfig;
use brain::sink::influx_v1::{InfluxV1, InfluxV1Config};
use proto::service::v1 as pb;

struct Influx {
    child: Child,
}

impl Drop for Influx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn influxd() -> Option<String> {
    let found = Command::new("sh")
        .args(["-c", "command -v influxd"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if found.is_none() {
        test_support::optional_server(
            "BRAIN_REQUIRE_INFLUXDB",
            "influxd",
            "apt-get install influxdb, as .ci/run does",
        );
    }
    found
}

/// Starts influxd with everything on 127.0.0.1 and its files under `dir`; waits for `/ping`.
fn start_influx(bin: &str, dir: &Path, http: u16, rpc: u16) -> Influx {
    let config = dir.join("influxdb.conf");
    std::fs::write(
        &config,
        format!(
            "reporting-disabled = true\nbind-address = \"127.0.0.1:{rpc}\"\n\
             [meta]\n  dir = \"{0}/meta\"\n\
             [data]\n  dir = \"{0}/data\"\n  wal-dir = \"{0}/wal\"\n  query-log-enabled = false\n\
             [monitor]\n  store-enabled = false\n\
             [http]\n  bind-address = \"127.0.0.1:{http}\"\n  log-enabled = false\n\
             [ifql]\n  enabled = false\n",
            dir.display()
        ),
    )
    .unwrap();
    let child = Command::new(bin)
        .arg("-config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("influxd.log")).unwrap())
        .spawn()
        .unwrap();
    let influx = Influx { child };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", http)) {
            use std::io::{Read, Write};
            let _ = write!(
                s,
                "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            );
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if out.starts_with("HTTP/1.1 204") {
                return influx;
            }
        }
        assert!(
            Instant::now() < deadline,
            "influxd did not answer /ping: {}",
            std::fs::read_to_string(dir.join("influxd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn report(i: u64) -> pb::MetricReport {
    pb::MetricReport {
        role_rates: Vec::new(),
        at_unix_ms: 1_700_000_000_000 + i as i64 * 1000,
        global_step: i,
        samples_per_second: 100.0 + i as f64,
        roles: common::counts(2, 1),
        cpu_millicores: 2500,
        memory_bytes: 1 << 30,
        gpu_utilisation_pct: 0.0,
        samples_done: i * 10,
        processes: Vec::new(),
        ..Default::default()
    }
}

async fn count(db: &InfluxV1) -> u64 {
    db.query("SELECT count(\"global_step\") FROM \"job_metrics\"")
        .await
        .ok()
        .and_then(|v| v["results"][0]["series"][0]["values"][0][1].as_u64())
        .unwrap_or(0)
}

async fn wait_for(db: &InfluxV1, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(db).await < n {
        assert!(
            Instant::now() < deadline,
            "{} points of {n} arrived",
            count(db).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn reports_reach_influxdb_and_survive_its_kill_9() {
    let Some(bin) = influxd() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // influxd is killed with SIGKILL and started again on the same ports, where the brain's
    // sink still points, so its ports are chosen here rather than by influxd binding port 0.
    let (http, rpc) = (common::free_port(), common::free_port());
    let influx = start_influx(&bin, dir.path(), http, rpc);
    let sink = InfluxV1Config {
        url: format!("http://127.0.0.1:{http}"),
        database: "brain_test".into(),
        username: None,
        password: None,
    };
    let db = InfluxV1::new(sink.clone()).unwrap();

    let mut config = brain::BrainConfig::with_database(dir.path().join("brain.db"));
    config.runs_dir = dir.path().join("runs");
    config.sink = Some(SinkConfig::InfluxV1(sink));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(brain::run(config, listener, async {
        let _ = stopped.await;
    }));
    // The operator token appears beside the database as the brain starts.
    let token_file = dir.path().join("operator.token");
    let operator = loop {
        if let Ok(t) = auth::read_secret(&token_file) {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut op = common::client_with(&format!("http://{addr}"), Some(operator)).await;
    let registered = op
        .register_job(pb::RegisterJobRequest {
            job_name: "ctr".into(),
            master_address: "127.0.0.1:9".into(),
            shape: None,
        })
        .await
        .unwrap()
        .into_inner();
    let id = registered.job_id;
    let mut c = common::client_with(
        &format!("http://{addr}"),
        auth::Token::parse(&registered.job_token),
    )
    .await;
    let send = |from: u64, to: u64| pb::MetricsBatch {
        job_id: id,
        reports: (from..to).map(report).collect(),
    };
    c.report_metrics(send(0, 50)).await.unwrap();
    // A rejected batch reaches neither the store nor the sink.
    let mut bad = send(50, 60);
    bad.reports[3].samples_per_second = f64::NAN;
    assert!(c.report_metrics(bad).await.is_err());
    wait_for(&db, 50).await;

    let v = db
        .query("SELECT \"samples_per_second\", \"workers\", \"job\" FROM \"job_metrics\" WHERE \"job_id\" = '1' ORDER BY time DESC LIMIT 1")
        .await
        .unwrap();
    let row = &v["results"][0]["series"][0]["values"][0];
    assert_eq!(row[0], "2023-11-14T22:14:09Z", "{v}");
    assert_eq!(row[1].as_f64(), Some(149.0), "{v}");
    assert_eq!(row[2].as_i64(), Some(2), "{v}");
    assert_eq!(row[3], "ctr", "{v}");

    // The server dies; ingest goes on, and what was accepted meanwhile arrives once it is back.
    drop(influx);
    c.report_metrics(send(100, 150)).await.unwrap();
    c.report_metrics(send(150, 200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _influx = start_influx(&bin, dir.path(), http, rpc);
    wait_for(&db, 150).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&db).await, 150, "each point once");

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// No InfluxDB 2.x server installs here, so the 2.x writer is checked against a stand-in on
/// 127.0.0.1 that records what arrives at `/api/v2/write`: the org, bucket, precision, token
/// and the line protocol the brain sends.
#[tokio::test]
async fn the_v2_writer_sends_what_influxdb_2_expects() {
    use axum::extract::{Query, State};
    use axum::http::HeaderMap;
    use brain::sink::Writer;
    use brain::sink::influx_v2::{InfluxV2, InfluxV2Config};
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    type Seen = Arc<Mutex<Vec<(HashMap<String, String>, String, String)>>>;
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            "/api/v2/write",
            axum::routing::post(
                |State(seen): State<Seen>,
                 Query(q): Query<HashMap<String, String>>,
                 headers: HeaderMap,
                 body: String| async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    seen.lock().unwrap().push((q, auth, body));
                    axum::http::StatusCode::NO_CONTENT
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let w = InfluxV2::new(InfluxV2Config {
        url: format!("http://{addr}"),
        org: "ml".into(),
        bucket: "training".into(),
        token: "s3cret".into(),
    });
    let line = brain::sink::line(
        "ctr",
        brain::store::JobId(3),
        &brain::store::Metric {
            at_unix_ms: 1_700_000_000_000,
            global_step: 1,
            samples_per_second: 10.0,
            workers: 1,
            ps: 0,
            cpu_millicores: 1000,
            memory_bytes: 1,
            gpu_utilisation_pct: 0.0,
            samples_done: 5,
            processes: Vec::new(),
            role_rates: Vec::new(),
            ..Default::default()
        },
    )
    .unwrap();
    w.prepare().await.unwrap();
    w.write(line.clone()).await.unwrap();
    let seen = seen.lock().unwrap();
    let (q, auth, body) = &seen[0];
    assert_eq!(q["org"], "ml");
    assert_eq!(q["bucket"], "training");
    assert_eq!(q["precision"], "ms");
    assert_eq!(auth, "Token s3cret");
    assert_eq!(body.trim_end(), line.trim_end());
}
