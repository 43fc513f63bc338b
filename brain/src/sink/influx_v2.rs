//! InfluxDB 2.x: line protocol to `/api/v2/write` through the influxdb2 crate.

use serde::{Deserialize, Serialize};

use super::Writer;
use crate::BrainError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InfluxV2Config {
    /// e.g. `http://127.0.0.1:8086`.
    pub url: String,
    pub org: String,
    pub bucket: String,
    pub token: String,
}

pub struct InfluxV2 {
    config: InfluxV2Config,
    client: influxdb2::Client,
}

impl InfluxV2 {
    pub fn new(config: InfluxV2Config) -> InfluxV2 {
        let client = influxdb2::Client::new(&config.url, &config.org, &config.token);
        InfluxV2 { config, client }
    }
}

#[async_trait::async_trait]
impl Writer for InfluxV2 {
    async fn prepare(&self) -> Result<(), BrainError> {
        // Buckets are made by the operator (they carry retention and ownership).
        Ok(())
    }

    async fn write(&self, lines: String) -> Result<(), BrainError> {
        self.client
            .write_line_protocol_with_precision(
                &self.config.org,
                &self.config.bucket,
                lines,
                influxdb2::api::write::TimestampPrecision::Milliseconds,
            )
            .await
            .map_err(|e| BrainError::Sink(format!("{}: {e}", self.config.url)))
    }
}
