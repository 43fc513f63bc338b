//! Optimus' speed model (Peng et al., EuroSys '18), fitted with non-negative least squares.
//!
//! Optimus models the time of one synchronous step of a PS job with `p` parameter servers and
//! `w` workers, each on a local batch `m`, as a sum of non-negative terms:
//!
//! T(p, w) = θ₀·m + θ₁ + θ₂·w/p + θ₃·w + θ₄·p
//!
//! (forward/backward, fixed overhead, parameter traffic per PS, per-worker overhead, per-PS
//! overhead). Data-parallel allreduce jobs have no PS; for them the PS terms are zero and the
//! synchronisation terms take the ring's place: a constant and a per-replica cost inside one
//! node, and the same across nodes plus a per-node cost, all only when there is more than one
//! replica. Every θ is kept non-negative, so the model never predicts that more workers or PS
//! make a step cheaper than its parts. The fit weighs each sample by 1/T, so it minimises the
//! relative error Optimus reports rather than favouring the slowest steps.

use serde::{Deserialize, Serialize};

use super::{FitError, Placement, StepSample, ThroughputModel, nnls, validate_samples};

/// Names of the terms, in the order of [`OptimusModel::theta`].
pub const TERMS: [&str; 10] = [
    "local batch",
    "constant",
    "workers per ps",
    "workers",
    "ps",
    "ring constant (one node)",
    "ring per replica (one node)",
    "ring constant (several nodes)",
    "ring per replica (several nodes)",
    "ring per node",
];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimusModel {
    /// One coefficient per entry of [`TERMS`], each ≥ 0.
    pub theta: Vec<f64>,
}

fn features(p: &Placement) -> [f64; 10] {
    let w = p.replicas as f64;
    let mut f = [0.0; 10];
    f[0] = p.local_bsz;
    f[1] = 1.0;
    if p.ps > 0 {
        f[2] = w / p.ps as f64;
        f[3] = w;
        f[4] = p.ps as f64;
    } else if p.replicas > 1 {
        let k = w - 2.0;
        if p.nodes <= 1 {
            f[5] = 1.0;
            f[6] = k;
        } else {
            f[7] = 1.0;
            f[8] = k;
            f[9] = p.nodes as f64;
        }
    }
    f
}

impl OptimusModel {
    /// Fits θ ≥ 0 to the samples' step times (sync times are not needed).
    pub fn fit(samples: &[StepSample]) -> Result<Self, FitError> {
        validate_samples(samples, false)?;
        if samples.is_empty() {
            return Err(FitError::NotEnoughData("no samples".into()));
        }
        let rows: Vec<Vec<f64>> = samples
            .iter()
            .map(|s| {
                features(&s.placement)
                    .iter()
                    .map(|x| x / s.step_time)
                    .collect()
            })
            .collect();
        let b = vec![1.0; samples.len()];
        let theta = nnls(&rows, &b)?;
        Ok(OptimusModel { theta })
    }
}

impl ThroughputModel for OptimusModel {
    fn step_time(&self, p: &Placement) -> f64 {
        features(p)
            .iter()
            .zip(&self.theta)
            .map(|(x, t)| x * t)
            .sum::<f64>()
            .max(f64::MIN_POSITIVE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throughput::mean_relative_error;

    fn at(ps: u32, workers: u32, bsz: f64) -> Placement {
        Placement {
            ps,
            nodes: workers,
            replicas: workers,
            local_bsz: bsz,
        }
    }

    #[test]
    fn recovers_a_ps_model_it_generated_and_keeps_coefficients_non_negative() {
        let truth = OptimusModel {
            theta: vec![0.002, 0.05, 0.03, 0.004, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0],
        };
        let mut samples = Vec::new();
        for ps in 1..=4 {
            for w in 1..=8 {
                for bsz in [32.0, 64.0, 128.0] {
                    let p = at(ps, w, bsz);
                    samples.push(StepSample {
                        placement: p,
                        step_time: truth.step_time(&p),
                        sync_time: None,
                    });
                }
            }
        }
        let fit = OptimusModel::fit(&samples).unwrap();
        assert!(mean_relative_error(&fit, &samples) < 1e-4, "{fit:?}");
        for (got, want) in fit.theta.iter().zip(&truth.theta) {
            assert!((got - want).abs() < 1e-4, "{fit:?}");
        }
        // More PS than workers help only through the w/p term: the optimum is interior.
        let best = (1..=8)
            .min_by(|a, b| {
                fit.step_time(&at(*a, 8, 64.0))
                    .total_cmp(&fit.step_time(&at(*b, 8, 64.0)))
            })
            .unwrap();
        assert!((2..=6).contains(&best), "best ps count {best}");
        assert!(fit.theta.iter().all(|t| *t >= 0.0));
    }

    #[test]
    fn a_decreasing_trend_is_not_fitted_with_a_negative_coefficient() {
        // Step time falling with the local batch would need θ₀ < 0; NNLS clamps it at 0.
        let samples: Vec<StepSample> = [(16.0, 0.5), (32.0, 0.4), (64.0, 0.3)]
            .iter()
            .map(|&(bsz, t)| StepSample {
                placement: at(0, 1, bsz),
                step_time: t,
                sync_time: None,
            })
            .collect();
        let fit = OptimusModel::fit(&samples).unwrap();
        assert!(fit.theta.iter().all(|t| *t >= 0.0), "{fit:?}");
        assert_eq!(fit.theta[0], 0.0);
    }
}
