//! Throughput models: how fast a job steps in a given configuration, fitted from observations.
//! One model per file behind [`ThroughputModel`].
//!
//! * [`pollux`]: Pollux's GPU step-time model (compute and synchronisation combined with an
//!   exponent γ), fitted to step-time samples.
//! * [`optimus`]: Optimus' additive speed model for PS (and here also allreduce) jobs, fitted
//!   with non-negative least squares ([`nnls`], solved as a QP by clarabel).
//! * [`amdahl`]: a live job's samples/s against its worker count (Amdahl's law), fitted from
//!   what its job master reports.
//! * [`table`]: a measured table (Gavel's `simulation_throughputs.json`, or step times averaged
//!   per placement), interpolated between measured sizes.

pub mod amdahl;
pub mod optimus;
pub mod pollux;
pub mod ps_speed;
pub mod table;

use serde::{Deserialize, Serialize};

/// Where and how a data-parallel job runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// Parameter servers (0 for allreduce jobs).
    #[serde(default)]
    pub ps: u32,
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
    #[error("the least-squares solver failed: {0}")]
    Solver(String),
    #[error("throughput file: {0}")]
    BadFile(String),
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

/// Checks every sample before a fit; `need_sync` when the model reads the measured sync time.
pub(crate) fn validate_samples(samples: &[StepSample], need_sync: bool) -> Result<(), FitError> {
    for (index, s) in samples.iter().enumerate() {
        let p = &s.placement;
        let bad = |problem: String| Err(FitError::BadSample { index, problem });
        if !(s.step_time.is_finite() && s.step_time > 0.0) {
            return bad(format!("step time {}", s.step_time));
        }
        if p.replicas == 0
            || p.nodes == 0
            || p.nodes > p.replicas
            || !p.local_bsz.is_finite()
            || p.local_bsz <= 0.0
        {
            return bad(format!("placement {p:?}"));
        }
        if need_sync && s.sync_time.is_none_or(|t| !t.is_finite() || t < 0.0) {
            return bad(format!(
                "sync time {:?} (this fit needs it measured)",
                s.sync_time
            ));
        }
    }
    Ok(())
}

/// Non-negative least squares: argmin ‖A·x − b‖² subject to x ≥ 0, for the rows of `a`.
///
/// Solved as the QP ½·xᵀ(AᵀA)x − (Aᵀb)ᵀx, x ≥ 0 with clarabel, on columns scaled to unit norm
/// (a column of zeros gets coefficient 0).
pub fn nnls(a: &[Vec<f64>], b: &[f64]) -> Result<Vec<f64>, FitError> {
    use clarabel::algebra::CscMatrix;
    use clarabel::solver::{
        DefaultSettingsBuilder, DefaultSolver, IPSolver, NonnegativeConeT, SolverStatus,
    };
    let n = a.first().map_or(0, Vec::len);
    if a.is_empty() || n == 0 || a.len() != b.len() || a.iter().any(|r| r.len() != n) {
        return Err(FitError::NotEnoughData(format!(
            "{} rows of unequal length for {} targets",
            a.len(),
            b.len()
        )));
    }
    let norm: Vec<f64> = (0..n)
        .map(|j| a.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
        .collect();
    let col = |r: &Vec<f64>, j: usize| if norm[j] > 0.0 { r[j] / norm[j] } else { 0.0 };
    // Upper triangle of AᵀA, column by column, as clarabel takes it.
    let (mut colptr, mut rowval, mut nzval) = (vec![0], Vec::new(), Vec::new());
    for j in 0..n {
        for i in 0..=j {
            let v: f64 = a.iter().map(|r| col(r, i) * col(r, j)).sum();
            if v != 0.0 || i == j {
                rowval.push(i);
                // A zero column still needs a positive curvature to stay bounded.
                nzval.push(if i == j && v == 0.0 { 1.0 } else { v });
            }
        }
        colptr.push(rowval.len());
    }
    let p = CscMatrix::new(n, n, colptr, rowval, nzval);
    let q: Vec<f64> = (0..n)
        .map(|j| -a.iter().zip(b).map(|(r, y)| col(r, j) * y).sum::<f64>())
        .collect();
    // s = 0 − (−I)·x = x ∈ ℝ₊ⁿ.
    let cons = CscMatrix::new(n, n, (0..=n).collect(), (0..n).collect(), vec![-1.0; n]);
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .tol_gap_abs(1e-10)
        .tol_gap_rel(1e-10)
        .tol_feas(1e-10)
        .build()
        .map_err(|e| FitError::Solver(format!("settings: {e:?}")))?;
    let mut solver = DefaultSolver::new(
        &p,
        &q,
        &cons,
        &vec![0.0; n],
        &[NonnegativeConeT(n)],
        settings,
    )
    .map_err(|e| FitError::Solver(format!("{e:?}")))?;
    solver.solve();
    match solver.solution.status {
        // Stalling this close to the optimum still leaves a usable answer.
        SolverStatus::Solved | SolverStatus::AlmostSolved | SolverStatus::InsufficientProgress
            if solver.solution.x.iter().all(|x| x.is_finite()) => {}
        other => {
            return Err(FitError::Solver(format!("stopped with {other:?}")));
        }
    }
    Ok(solver
        .solution
        .x
        .iter()
        .zip(&norm)
        // The interior point stops just inside the bound; what sits on it is exactly 0.
        .map(|(x, s)| if *s > 0.0 && *x > 1e-9 { x / s } else { 0.0 })
        .collect())
}
