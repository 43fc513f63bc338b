//! A primal-dual interior-point method for the allocation LP's block-angular shape.
//!
//! The allocation LPs couple their jobs only through a few rows: one per worker type (capacity)
//! and one per tenant and type (quota). Everything else is a job's own: its shares (one per type
//! it can run on), at most three rows of its own (shares sum to at most `hi`, at least `lo`, and
//! for max-min the fairness row `Σ_j fair_j · x_j ≥ t`), and the single variable `t` that every
//! fairness row shares. A general sparse solver factors the whole KKT system at every iteration
//! (clarabel: ~100 ms at 2,048 distinct jobs; cvxpy + ECOS: ~70 ms); here each Newton system is
//! reduced to a dense one the size of the coupling rows:
//!
//! - Mehrotra's predictor-corrector on `min cᵀx s.t. Ax + w = b, x, w ≥ 0`, started infeasible,
//!   with separate primal and dual step lengths; the Newton step is the normal-equation system
//!   `(A D Aᵀ + W/Y) Δy = r` with `D = X/Z`.
//! - Rows ordered [each job's own rows | coupling rows]: a job's own rows touch only its own
//!   variables, so `A D Aᵀ` is block diagonal there, bordered by the coupling rows. The blocks are
//!   R x R with R the number of own rows the problem uses (1 for max-sum, 2 for max-min, one more
//!   with minimum shares): fixed-size matrices on the stack, R a const generic. The shared `t` adds the rank-one term `d_t·a·aᵀ` over the fairness
//!   rows; it becomes one more bordering unknown `u = d_t·aᵀΔy` (row `aᵀΔy − u/d_t = 0`).
//! - The bordered system is solved through its Schur complement on the coupling unknowns: the
//!   number of worker types (plus tenants' quota rows, plus `u`), a dense LU of a few rows.
//!
//! One iteration costs O(jobs · types²); 15–40 iterations reach a relative duality gap of 1e-9.
//! Costs are scaled to at most 1, the fairness coefficients so that `t` is at most about 1, and
//! every coupling row to right-hand side 1. The method has no infeasibility detection: it returns
//! `None` when it does not converge (an infeasible problem, or numerical trouble), and the
//! caller falls back to the general solver, which tells the two apart.

//!
//! The files: `layout` (the scaled problem in flat arrays, its products `Ax` and `Aᵀy`),
//! `newton` (each Newton system factored block by block and solved through the Schur
//! complement on the coupling rows), `iterate` (the predictor-corrector iterations, the step
//! lengths, the answer unscaled).

mod iterate;
mod layout;
mod newton;

use layout::Layout;

/// Iterations before giving up; the allocation LPs converge in 15–40.
const MAX_ITERATIONS: usize = 100;
/// Converged when the residuals, relative to the data, and the duality gap, relative to the
/// objective, are this small (in scaled units).
const TOLERANCE: f64 = 1e-9;
/// When progress stops short of [`TOLERANCE`] (the Newton systems lose accuracy near the
/// boundary), the best iterate is still an answer if it is within this.
const TOLERANCE_STALLED: f64 = 1e-8;
/// Iterative-refinement steps per Newton solve, at most, once the complementarity gap is below
/// `REFINE_BELOW_MU` (before that the plain solve is accurate enough).
const REFINEMENTS: usize = 2;
const REFINE_BELOW_MU: f64 = 1e-6;
/// Gondzio centrality correctors per iteration, at most.
const CORRECTORS: usize = 2;
const ETA_MIN: f64 = 0.95;
const CORRECT_BELOW_STEP: f64 = 0.0;

/// One job's (or one class of identical jobs') share on one worker type.
#[derive(Clone, Debug)]
pub struct Var {
    /// Objective coefficient (maximised), unused for max-min.
    pub gain: f64,
    /// Coefficient in the block's fairness row, unused for max-sum.
    pub fair: f64,
    /// The coupling rows it uses and how much: (row, coefficient > 0).
    pub uses: Vec<(usize, f64)>,
}

/// One job's variables and own rows: `lo ≤ Σ x ≤ hi`.
#[derive(Clone, Debug)]
pub struct Block {
    pub vars: Vec<Var>,
    pub hi: f64,
    pub lo: Option<f64>,
}

/// maximise Σ gain·x (or, with `max_min`, the smallest Σ fair·x over blocks) subject to each
/// block's own rows and `Σ coefficient·x ≤ rhs` on each coupling row, x ≥ 0.
#[derive(Clone, Debug)]
pub struct BlockLp {
    pub blocks: Vec<Block>,
    /// Right-hand side of each coupling row, > 0 (rows of zero capacity are the caller's to
    /// drop, with the variables they would pin at 0).
    pub coupling_rhs: Vec<f64>,
    pub max_min: bool,
}

#[derive(Clone, Debug)]
pub struct BlockSolution {
    /// Per block, per variable, in the order given.
    pub x: Vec<Vec<f64>>,
    /// The optimum: Σ gain·x, or t for max-min.
    pub objective: f64,
    pub iterations: usize,
}

impl BlockLp {
    /// The optimum, or `None` when the method did not converge (the caller then asks the
    /// general solver, which also tells an infeasible problem apart).
    pub fn solve(&self) -> Option<BlockSolution> {
        // A block whose minimum share needs variables it does not have is infeasible.
        if self
            .blocks
            .iter()
            .any(|b| b.vars.is_empty() && b.lo.is_some_and(|l| l > 0.0))
        {
            return None;
        }
        let any_lo = self.blocks.iter().any(|b| b.lo.is_some_and(|l| l > 0.0));
        match (any_lo, self.max_min) {
            (false, false) => Layout::<1>::new(self, any_lo).run(self),
            (true, true) => Layout::<3>::new(self, any_lo).run(self),
            _ => Layout::<2>::new(self, any_lo).run(self),
        }
    }
}
