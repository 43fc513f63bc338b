//! Throughput models: how fast a job steps in a given configuration, fitted from observations.
//! One model per file behind [`ThroughputModel`].
//!
//! * [`pollux`]: Pollux's GPU step-time model (compute and synchronisation combined with an
//!   exponent γ), fitted to step-time samples.

pub mod pollux;

use serde::{Deserialize, Serialize};

/// Where and how a data-parallel job runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub nodes: u32,
    pub replicas: u32,
    /// Per-replica batch size.
    pub local_bsz: f64,
}

/// One measurement: a placement and its time per step (and, when measured, the part spent
/// synchronising gradients).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSample {
    pub placement: Placement,
    pub step_time: f64,
    pub sync_time: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error("no usable samples: {0}")]
    NotEnoughData(String),
    #[error("sample {index} is invalid: {problem}")]
    BadSample { index: usize, problem: String },
}

pub trait ThroughputModel {
    /// Seconds per step at `p`.
    fn step_time(&self, p: &Placement) -> f64;

    /// Samples (of the global batch) per second at `p`.
    fn throughput(&self, p: &Placement) -> f64 {
        p.replicas as f64 * p.local_bsz / self.step_time(p)
    }
}

/// Mean absolute relative error of `model` on `samples`.
pub fn mean_relative_error(model: &dyn ThroughputModel, samples: &[StepSample]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples
        .iter()
        .map(|s| ((model.step_time(&s.placement) - s.step_time) / s.step_time).abs())
        .sum::<f64>()
        / samples.len() as f64
}
