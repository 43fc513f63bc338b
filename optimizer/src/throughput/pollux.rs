//! Pollux's step-time model (Qiao et al., OSDI '21):
//!
//! T_grad(m) = α_c + β_c · m, for local batch size m;
//! T_sync(K) = 0 for one replica, α_r + β_r · (K − 2) on one node, α_n + β_n · (K − 2) across
//! nodes, for K replicas;
//! T_step = (T_grad^γ + T_sync^γ)^(1/γ), γ ≥ 1 (γ = 1: no overlap, γ → ∞: full overlap).
//!
//! Pollux fits all seven parameters jointly by gradient descent. Where the samples also carry
//! the measured synchronisation time (as Pollux's and Sia's traces do) this fit is staged and
//! deterministic: the compute line by least squares on single-replica samples, the two sync lines
//! by least squares on the measured sync times, then γ by a one-dimensional search on the step
//! times. All parameters are kept non-negative, as in Pollux.

use serde::{Deserialize, Serialize};

use super::{FitError, Placement, StepSample, ThroughputModel, validate_samples};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolluxModel {
    pub alpha_c: f64,
    pub beta_c: f64,
    pub alpha_r: f64,
    pub beta_r: f64,
    pub alpha_n: f64,
    pub beta_n: f64,
    pub gamma: f64,
}

/// Least squares y ≈ a + b·x with a, b ≥ 0 (a zero-clamped coefficient is refitted alone).
fn line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.is_empty() {
        return None;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let (a, b) = if sxx > 0.0 {
        (my - sxy / sxx * mx, sxy / sxx)
    } else {
        (my, 0.0)
    };
    Some(match (a >= 0.0, b >= 0.0) {
        (true, true) => (a, b),
        // Refit with one coefficient fixed at zero.
        (_, false) => (my.max(0.0), 0.0),
        (false, true) => {
            let sxx0: f64 = points.iter().map(|(x, _)| x * x).sum();
            let b = if sxx0 > 0.0 {
                points.iter().map(|(x, y)| x * y).sum::<f64>() / sxx0
            } else {
                0.0
            };
            (0.0, b.max(0.0))
        }
    })
}

impl PolluxModel {
    fn t_grad(&self, m: f64) -> f64 {
        self.alpha_c + self.beta_c * m
    }

    fn t_sync(&self, p: &Placement) -> f64 {
        if p.replicas <= 1 {
            return 0.0;
        }
        let k = (p.replicas as f64 - 2.0).max(0.0);
        if p.nodes <= 1 {
            self.alpha_r + self.beta_r * k
        } else {
            self.alpha_n + self.beta_n * k
        }
    }

    fn combine(grad: f64, sync: f64, gamma: f64) -> f64 {
        if sync <= 0.0 {
            return grad;
        }
        // Scale before the power so large γ does not overflow.
        let top = grad.max(sync);
        top * ((grad / top).powf(gamma) + (sync / top).powf(gamma)).powf(1.0 / gamma)
    }

    /// Fits the model to `samples`; each must have a measured sync time.
    pub fn fit(samples: &[StepSample]) -> Result<Self, FitError> {
        validate_samples(samples, true)?;
        let single: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| s.placement.replicas == 1)
            .map(|s| (s.placement.local_bsz, s.step_time))
            .collect();
        // Without single-replica samples, the compute part is step minus sync time.
        let compute = if single.is_empty() {
            samples
                .iter()
                .map(|s| {
                    (
                        s.placement.local_bsz,
                        (s.step_time - s.sync_time.unwrap_or(0.0)).max(0.0),
                    )
                })
                .collect()
        } else {
            single
        };
        let (alpha_c, beta_c) =
            line(&compute).ok_or_else(|| FitError::NotEnoughData("no samples".into()))?;
        let sync_points = |multi_node: bool| -> Vec<(f64, f64)> {
            samples
                .iter()
                .filter(|s| s.placement.replicas > 1 && (s.placement.nodes > 1) == multi_node)
                .map(|s| {
                    (
                        (s.placement.replicas as f64 - 2.0).max(0.0),
                        s.sync_time.unwrap_or(0.0),
                    )
                })
                .collect()
        };
        let (alpha_r, beta_r) = line(&sync_points(false)).unwrap_or((0.0, 0.0));
        // No multi-node samples: assume the network costs what the node's links cost.
        let (alpha_n, beta_n) = line(&sync_points(true)).unwrap_or((alpha_r, beta_r));
        let mut model = PolluxModel {
            alpha_c,
            beta_c,
            alpha_r,
            beta_r,
            alpha_n,
            beta_n,
            gamma: 1.0,
        };
        let error = |g: f64, m: &PolluxModel| -> f64 {
            samples
                .iter()
                .map(|s| {
                    let t =
                        Self::combine(m.t_grad(s.placement.local_bsz), m.t_sync(&s.placement), g);
                    (t.ln() - s.step_time.ln()).powi(2)
                })
                .sum()
        };
        // γ on a grid over [1, 10], then refined around the best point.
        let mut best = (f64::INFINITY, 1.0);
        for i in 0..=180 {
            let g = 1.0 + 0.05 * i as f64;
            let e = error(g, &model);
            if e < best.0 {
                best = (e, g);
            }
        }
        for i in -50..=50 {
            let g = (best.1 + 0.001 * i as f64).max(1.0);
            let e = error(g, &model);
            if e < best.0 {
                best = (e, g);
            }
        }
        model.gamma = best.1;
        Ok(model)
    }
}

impl ThroughputModel for PolluxModel {
    fn step_time(&self, p: &Placement) -> f64 {
        Self::combine(self.t_grad(p.local_bsz), self.t_sync(p), self.gamma)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throughput::mean_relative_error;

    fn sample(m: &PolluxModel, nodes: u32, replicas: u32, bsz: f64) -> StepSample {
        let p = Placement {
            ps: 0,
            nodes,
            replicas,
            local_bsz: bsz,
        };
        StepSample {
            placement: p,
            step_time: m.step_time(&p),
            sync_time: Some(m.t_sync(&p)),
        }
    }

    #[test]
    fn recovers_the_parameters_of_data_it_generated() {
        let truth = PolluxModel {
            alpha_c: 0.02,
            beta_c: 0.001,
            alpha_r: 0.01,
            beta_r: 0.002,
            alpha_n: 0.05,
            beta_n: 0.01,
            gamma: 2.5,
        };
        let mut samples = Vec::new();
        for bsz in [16.0, 32.0, 64.0, 128.0] {
            for (n, r) in [(1, 1), (1, 2), (1, 4), (2, 4), (2, 8), (4, 16)] {
                samples.push(sample(&truth, n, r, bsz));
            }
        }
        let fit = PolluxModel::fit(&samples).unwrap();
        assert!(mean_relative_error(&fit, &samples) < 1e-3, "{fit:?}");
        assert!((fit.gamma - 2.5).abs() < 0.01, "{fit:?}");
    }

    #[test]
    fn bad_samples_are_named() {
        let s = StepSample {
            placement: Placement {
                ps: 0,
                nodes: 2,
                replicas: 1,
                local_bsz: 8.0,
            },
            step_time: 0.1,
            sync_time: Some(0.0),
        };
        assert!(matches!(
            PolluxModel::fit(&[s]),
            Err(FitError::BadSample { index: 0, .. })
        ));
    }
}
