//! The raw metric time series, kept outside SQLite when an InfluxDB is configured: every report
//! a job master sends becomes one point of the measurement `job_metrics` (tags `job`, `job_id`;
//! fields `global_step`, `samples_per_second`, `workers`, `ps`, `cpu_millicores`,
//! `memory_bytes`, `gpu_utilisation_pct`, `samples_done`; millisecond timestamps), written in
//! line protocol built with the influxdb2 crate's `DataPoint`.
//!
//! One writer per server API, behind [`Writer`], chosen with [`SinkConfig`]:
//! * [`influx_v1`]: the `/write` and `/query` endpoints of InfluxDB 1.x (tested against
//!   Debian's `influxdb` 1.6.7); InfluxDB 1.8+, 2.x and 3.x serve the same endpoints for
//!   compatibility.
//! * [`influx_v2`]: InfluxDB 2.x's `/api/v2/write` (org, bucket, token) through the influxdb2
//!   crate.
//!
//! Ingest never waits for the sink: accepted batches go to a bounded queue that a task drains,
//! retrying with backoff while the server is away; past [`MAX_QUEUED`] points the oldest are
//! dropped and counted (`brain_sink_dropped_points_total`).

pub mod influx_v1;
pub mod influx_v2;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use influxdb2::models::{DataPoint, WriteDataPoint};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::BrainError;
use crate::metrics::Metrics;
use crate::store::{JobId, Metric};

/// Points kept while the server cannot be reached.
pub const MAX_QUEUED: usize = 1_000_000;
const MEASUREMENT: &str = "job_metrics";

/// Where raw metrics go (`[sink]` in the brain's config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "api", rename_all = "snake_case", deny_unknown_fields)]
pub enum SinkConfig {
    /// InfluxDB's 1.x HTTP API (`/write`, `/query`); the database is created if missing.
    InfluxV1(influx_v1::InfluxV1Config),
    /// InfluxDB 2.x (`/api/v2/write`).
    InfluxV2(influx_v2::InfluxV2Config),
}

/// Sends line protocol to a server.
#[async_trait::async_trait]
pub trait Writer: Send + Sync {
    /// Makes sure the destination exists (called once, again after failures).
    async fn prepare(&self) -> Result<(), BrainError>;
    async fn write(&self, lines: String) -> Result<(), BrainError>;
}

impl SinkConfig {
    pub fn validate(&self) -> Result<(), BrainError> {
        let url = match self {
            SinkConfig::InfluxV1(c) => &c.url,
            SinkConfig::InfluxV2(c) => &c.url,
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(BrainError::Config(format!(
                "sink.url {url:?}: expected http://HOST:PORT or https://..."
            )));
        }
        Ok(())
    }

    fn writer(&self) -> Result<Arc<dyn Writer>, BrainError> {
        Ok(match self {
            SinkConfig::InfluxV1(c) => Arc::new(influx_v1::InfluxV1::new(c.clone())?),
            SinkConfig::InfluxV2(c) => Arc::new(influx_v2::InfluxV2::new(c.clone())),
        })
    }
}

/// One report as line protocol.
pub fn line(job: &str, id: JobId, m: &Metric) -> Result<String, BrainError> {
    let bad = |e: &dyn std::fmt::Display| BrainError::Sink(format!("job {id}: a point: {e}"));
    let point = DataPoint::builder(MEASUREMENT)
        .tag("job", job)
        .tag("job_id", id.0.to_string())
        .field("global_step", m.global_step as i64)
        .field("samples_per_second", m.samples_per_second)
        .field("workers", m.workers as i64)
        .field("ps", m.ps as i64)
        .field("cpu_millicores", m.cpu_millicores as i64)
        .field("memory_bytes", m.memory_bytes as i64)
        .field("gpu_utilisation_pct", m.gpu_utilisation_pct)
        .field("samples_done", m.samples_done as i64)
        .timestamp(m.at_unix_ms)
        .build()
        .map_err(|e| bad(&e))?;
    let mut out = Vec::new();
    point.write_data_point_to(&mut out).map_err(|e| bad(&e))?;
    String::from_utf8(out).map_err(|e| bad(&e))
}

/// Accepted batches waiting for the writer task to take them into its queue; beyond, a
/// batch's points are dropped (counted in `brain_sink_dropped_points_total`): ingest never
/// waits for the sink.
const CHANNEL_BATCHES: usize = 1024;

/// The queue in front of the writer task.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<Vec<String>>,
    metrics: Arc<Metrics>,
}

impl Sink {
    /// Starts the writer task.
    pub fn start(config: &SinkConfig, metrics: Arc<Metrics>) -> Result<Sink, BrainError> {
        config.validate()?;
        let writer = config.writer()?;
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        tokio::spawn(drain(writer, rx, metrics.clone()));
        Ok(Sink { tx, metrics })
    }

    /// Queues the lines of an accepted batch; drops them (counted) when the writer is that far
    /// behind.
    pub fn send(&self, lines: Vec<String>) {
        if let Err(mpsc::error::TrySendError::Full(lines)) = self.tx.try_send(lines) {
            self.metrics.sink_dropped.inc_by(lines.len() as u64);
        }
    }
}

async fn drain(
    writer: Arc<dyn Writer>,
    mut rx: mpsc::Receiver<Vec<String>>,
    metrics: Arc<Metrics>,
) {
    let mut queue: VecDeque<String> = VecDeque::new();
    let mut ready = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        if queue.is_empty() {
            match rx.recv().await {
                Some(lines) => queue.extend(lines),
                None => return,
            }
        }
        while let Ok(lines) = rx.try_recv() {
            queue.extend(lines);
        }
        while queue.len() > MAX_QUEUED {
            queue.pop_front();
            metrics.sink_dropped.inc();
        }
        if !ready {
            match writer.prepare().await {
                Ok(()) => ready = true,
                Err(e) => {
                    tracing::warn!("metrics sink not ready: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            }
        }
        let n = queue.len().min(5000);
        let body = queue.iter().take(n).cloned().collect::<Vec<_>>().join("\n");
        match writer.write(body).await {
            Ok(()) => {
                queue.drain(..n);
                metrics.sink_points.inc_by(n as u64);
                backoff = Duration::from_millis(100);
            }
            Err(e) => {
                tracing::warn!("metrics sink write failed, retrying: {e}");
                ready = false;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_that_far_behind_costs_points_not_memory_nor_ingest() {
        let metrics = Arc::new(Metrics::default());
        let (tx, _rx) = mpsc::channel(CHANNEL_BATCHES);
        let sink = Sink {
            tx,
            metrics: metrics.clone(),
        };
        for _ in 0..CHANNEL_BATCHES + 3 {
            sink.send(vec!["a".into(), "b".into()]);
        }
        assert_eq!(metrics.sink_dropped.get(), 6);
    }

    #[test]
    fn a_report_is_one_line_of_line_protocol_with_millisecond_time() {
        let m = Metric {
            at_unix_ms: 1_700_000_000_123,
            global_step: 42,
            samples_per_second: 1500.5,
            workers: 4,
            ps: 1,
            cpu_millicores: 3000,
            memory_bytes: 1 << 30,
            gpu_utilisation_pct: 0.0,
            samples_done: 9000,
            processes: Vec::new(),
            role_rates: Vec::new(),
            ..Default::default()
        };
        let l = line("ctr a", JobId(7), &m).unwrap();
        assert!(l.starts_with("job_metrics,job=ctr\\ a,job_id=7 "), "{l}");
        assert!(
            l.contains("global_step=42i") && l.contains("samples_per_second=1500.5"),
            "{l}"
        );
        assert!(l.trim_end().ends_with(" 1700000000123"), "{l}");
    }
}
