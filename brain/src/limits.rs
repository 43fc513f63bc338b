//! The sizes and rates the brain refuses to go beyond (`[limits]` in its config), each refusal
//! with its reason: read by the server (message size, connections), the service (spec size,
//! active jobs) and the throttle (calls, reports and submissions per client).

use serde::{Deserialize, Serialize};

/// Sizes the brain refuses to go beyond, each with the reason in the answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The largest gRPC message the brain decodes, bytes (tonic answers RESOURCE_EXHAUSTED).
    #[serde(default = "default_message_bytes")]
    pub max_message_bytes: usize,
    /// The largest job spec a submission may carry, bytes.
    #[serde(default = "default_spec_bytes")]
    pub max_spec_bytes: usize,
    /// Jobs queued or running at once; a submission beyond is refused until one ends.
    #[serde(default = "default_active_jobs")]
    pub max_active_jobs: usize,
    /// RPCs one client (the operator, a job's secret, or under `--insecure` a connection)
    /// may make per second; beyond, RESOURCE_EXHAUSTED. 0: no limit.
    #[serde(default = "default_calls_per_second")]
    pub calls_per_second: u32,
    /// Metric reports one job may send per second (a whole batch always fits the burst);
    /// beyond, RESOURCE_EXHAUSTED and the job master sends them later. 0: no limit.
    #[serde(default = "default_reports_per_second")]
    pub reports_per_second: u32,
    /// Jobs one client may submit per minute. 0: no limit.
    #[serde(default = "default_submissions_per_minute")]
    pub submissions_per_minute: u32,
    /// Console sign-ins one address may try per minute (right or wrong token). 0: no limit.
    #[serde(default = "default_sign_ins_per_minute")]
    pub sign_ins_per_minute: u32,
    /// How the brain's listener treats connections before any token is seen
    /// (`[limits.connections]` handshake_timeout_ms, idle_timeout_ms, max_connections,
    /// max_per_peer).
    #[serde(default)]
    pub connections: auth::listen::ConnLimits,
}

fn default_message_bytes() -> usize {
    4 << 20
}
fn default_spec_bytes() -> usize {
    256 << 10
}
fn default_active_jobs() -> usize {
    10_000
}
fn default_calls_per_second() -> u32 {
    500
}
fn default_reports_per_second() -> u32 {
    1_000
}
fn default_submissions_per_minute() -> u32 {
    120
}
fn default_sign_ins_per_minute() -> u32 {
    10
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: default_message_bytes(),
            max_spec_bytes: default_spec_bytes(),
            max_active_jobs: default_active_jobs(),
            calls_per_second: default_calls_per_second(),
            reports_per_second: default_reports_per_second(),
            submissions_per_minute: default_submissions_per_minute(),
            sign_ins_per_minute: default_sign_ins_per_minute(),
            connections: auth::listen::ConnLimits::default(),
        }
    }
}
