//! InfluxDB's 1.x HTTP API: `POST /write?db=..&precision=ms` with line protocol, `POST /query`
//! for `CREATE DATABASE` and InfluxQL reads. The endpoints exist in InfluxDB 1.x and, for
//! compatibility, in 1.8+, 2.x (with a database/retention-policy mapping) and 3.x.

use serde::{Deserialize, Serialize};

use super::Writer;
use crate::BrainError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InfluxV1Config {
    /// e.g. `http://127.0.0.1:8086`.
    pub url: String,
    #[serde(default = "default_database")]
    pub database: String,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
}

fn default_database() -> String {
    "brain".into()
}

pub struct InfluxV1 {
    config: InfluxV1Config,
    http: reqwest::Client,
}

impl InfluxV1 {
    pub fn new(config: InfluxV1Config) -> Result<InfluxV1, BrainError> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| BrainError::Internal(format!("http client: {e}")))?;
        Ok(InfluxV1 { config, http })
    }

    fn auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match (&self.config.username, &self.config.password) {
            (Some(u), p) => r.basic_auth(u, p.as_ref()),
            _ => r,
        }
    }

    /// Runs an InfluxQL statement; answers the server's JSON.
    pub async fn query(&self, q: &str) -> Result<serde_json::Value, BrainError> {
        let url = &self.config.url;
        let failed = |e: &dyn std::fmt::Display| BrainError::Sink(format!("{url}: {e}"));
        let r = self
            .auth(self.http.post(format!("{url}/query")))
            .query(&[("db", self.config.database.as_str()), ("q", q)])
            .send()
            .await
            .map_err(|e| failed(&e))?;
        let status = r.status();
        let text = r.text().await.map_err(|e| failed(&e))?;
        if !status.is_success() {
            return Err(failed(&format!("query answered {status}: {text}")));
        }
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| failed(&e))?;
        if let Some(e) = v["results"][0]["error"].as_str() {
            return Err(failed(&format!("query failed: {e}")));
        }
        Ok(v)
    }
}

#[async_trait::async_trait]
impl Writer for InfluxV1 {
    async fn prepare(&self) -> Result<(), BrainError> {
        self.query(&format!(
            "CREATE DATABASE \"{}\"",
            self.config.database.replace('"', "\\\"")
        ))
        .await
        .map(|_| ())
    }

    async fn write(&self, lines: String) -> Result<(), BrainError> {
        let url = &self.config.url;
        let r = self
            .auth(self.http.post(format!("{}/write", self.config.url)))
            .query(&[("db", self.config.database.as_str()), ("precision", "ms")])
            .body(lines)
            .send()
            .await
            .map_err(|e| BrainError::Sink(format!("{url}: {e}")))?;
        let status = r.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(BrainError::Sink(format!(
                "{url}: write answered {status}: {}",
                r.text().await.unwrap_or_default()
            )))
        }
    }
}
