//! What a replay can honour. A trace is checked against them after it is read, once the
//! cluster and the application profiles are known ([`crate::pollux::check_workload`],
//! [`crate::philly::check_jobs`]); the first value no cluster or profile can honour is refused
//! with the file, line and column it is in, instead of being shrunk, clamped or replayed into a
//! wrong number.

use std::collections::BTreeMap;

/// Ten years: arrivals later than this after a trace's first are refused unless the operator
/// states another horizon (the public traces span at most 109 days; a million jobs drawn from
/// Philly's by `brainctl trace philly-like` span 3.7 years).
pub const DEFAULT_HORIZON_S: f64 = 10.0 * 365.0 * 86_400.0;

#[derive(Clone, Debug, PartialEq)]
pub struct TraceLimits {
    /// GPUs of the simulated cluster's largest GPU type: a job runs on one type, so a request
    /// for more can never be met.
    pub largest_type_gpus: u32,
    /// Arrivals later than this many seconds after the trace's start are refused.
    pub horizon_s: f64,
    /// Per application, the total batch sizes its training curves cover (smallest, largest):
    /// progress at a batch size outside them would be extrapolated from nothing.
    pub batch_sizes: BTreeMap<String, (u32, u32)>,
}
