//! A real Prometheus (Debian's `prometheus`) scrapes a real brain over its TLS with the
//! metrics token, as docs/operators.md tells operators to set it up, and the per-job,
//! per-role and per-node series are there to query through Prometheus' own HTTP API.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{brainctl, jobs, token_file};

/// Asks Prometheus at `base` for `query`; the samples' values by their labels.
async fn query(base: &str, query: &str) -> Vec<(serde_json::Value, f64)> {
    let r: serde_json::Value = reqwest::Client::new()
        .get(format!("{base}/api/v1/query"))
        .query(&[("query", query)])
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map(|r| r.json())
        .unwrap_or_else(|e| panic!("{query}: {e}"))
        .await
        .unwrap();
    r["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let v = s["value"][1].as_str().unwrap().parse().unwrap();
            (s["metric"].clone(), v)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_brain_and_finds_per_job_role_and_node_series() {
    // Debian's package puts it here.
    let prometheus = Path::new("/usr/bin/prometheus");
    if !prometheus.exists() {
        test_support::optional_server(
            "BRAIN_REQUIRE_PROMETHEUS",
            "prometheus",
            "apt-get install --no-install-recommends prometheus",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut brain, url) = common::still_brain(d, 4);
    let addr = url.trim_start_matches("http://").to_string();
    let spec = d.join("scraped.yaml");
    std::fs::write(
        &spec,
        "name: scraped\nkind: allreduce\nroles:\n  worker:\n    min: 1\n    max: 2\n\
         workload:\n  builtin:\n    batch_size: 128\n    step_delay_us: 4000\n\
         data:\n  num_samples: 200000\n  shard_size: 1000\n  eval_samples: 1000\n\
         checkpoint:\n  dir: checkpoints\n  every_shards: 5\n",
    )
    .unwrap();
    let (ok, out) = brainctl(&["submit", spec.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{out}");

    // Prometheus as docs/operators.md sets it up: HTTPS with the brain's CA, the metrics
    // token from its file.
    let ca = common::own_ca(&url).expect("the brain's own TLS");
    let metrics_token = token_file(&url).with_file_name("metrics.token");
    let config = d.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: brain\n    \
             scheme: https\n    tls_config:\n      ca_file: {}\n    authorization:\n      \
             credentials_file: {}\n    honor_labels: true\n    static_configs:\n      - targets: ['{addr}']\n",
            ca.display(),
            metrics_token.display()
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", common::free_port());
    let log = std::fs::File::create(d.join("prometheus.log")).unwrap();
    let mut server = test_support::Spawned {
        child: std::process::Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", d.join("tsdb").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    };
    let base = format!("http://{web}");

    // The job runs and Prometheus has scraped it: each series the dashboard reads.
    let wanted = [
        "up{job=\"brain\"}",
        "brain_job_workers{job=\"scraped\"}",
        "brain_job_processes{job=\"scraped\",role=\"worker\"}",
        "brain_job_samples_per_second{job=\"scraped\"}",
        "brain_job_cpu_cores{job=\"scraped\"}",
        "brain_job_memory_bytes{job=\"scraped\"}",
        "brain_node_cpu_cores",
        "brain_jobs{state=\"running\"}",
    ];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut missing: Vec<&str> = wanted.to_vec();
    while !missing.is_empty() {
        let mut still = Vec::new();
        for q in missing {
            let found = reqwest::get(format!("{base}/-/ready")).await.is_ok()
                && query(&base, q).await.iter().any(|(_, v)| *v > 0.0);
            if !found {
                still.push(q);
            }
        }
        missing = still;
        if !missing.is_empty() {
            assert!(
                Instant::now() < deadline,
                "not in Prometheus after 120 s: {missing:?}\n{}",
                std::fs::read_to_string(d.join("prometheus.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    // Its scrape of the brain succeeds with the token; a brain-wide figure matches the brain's.
    let workers = query(&base, "brain_job_workers{job=\"scraped\"}").await[0].1;
    let record = jobs(&url).await.unwrap();
    let shape = record[0].shape.as_ref().unwrap();
    let shape_workers = brain::console::pages::training(shape).unwrap().count as f64;
    assert_eq!(workers, shape_workers, "{record:#?}");
    let (ok, out) = brainctl(&["cancel", "scraped", "--brain", &url]);
    assert!(ok, "{out}");
    server.kill();
    brain.kill();
}
