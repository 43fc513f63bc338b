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

// The loops walk several parallel arrays (variables' columns, values, bounds) by index.
#![allow(clippy::needless_range_loop)]

use nalgebra::{Cholesky, Const, DMatrix, DVector, SMatrix, SVector};

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

/// The scaled problem in flat arrays: variables block by block then `t`; rows R per block
/// (slot 0 `Σx ≤ hi`, then `Σx ≥ lo` if any block has one, then fairness for max-min; absent
/// ones masked) then the coupling rows. Scaling: gains divided by the largest; each fairness
/// row by its block's largest coefficient, and `t = t_scale · t̂` with `t_scale` the smallest
/// block's best possible value, so t̂ ≤ 1; coupling rows to right-hand side 1.
struct Layout<const R: usize> {
    /// First variable of each block (and one past the last).
    start: Vec<usize>,
    nb: usize,
    ng: usize,
    nv: usize,
    nr: usize,
    /// Index of `t`, when max-min.
    t: Option<usize>,
    present: Vec<bool>,
    b: Vec<f64>,
    c: Vec<f64>,
    gain_scale: f64,
    t_scale: f64,
    /// Each variable's column in its block's own rows.
    local: Vec<SVector<f64, R>>,
    /// `t`'s column in each block's own rows.
    t_local: Vec<SVector<f64, R>>,
    /// Per block, from `border_start[k]`: where its bordering columns sit in the Schur
    /// complement (the coupling rows its variables use, deduplicated, then `u` for max-min).
    border_index: Vec<usize>,
    border_start: Vec<usize>,
    /// Per variable, its uses as (position among its block's bordering columns, scaled
    /// coefficient), from `use_start[v]`.
    uses: Vec<(usize, f64)>,
    use_start: Vec<usize>,
    /// The same uses as (row index among all rows, scaled coefficient).
    use_rows: Vec<(usize, f64)>,
}

impl<const R: usize> Layout<R> {
    fn new(lp: &BlockLp, any_lo: bool) -> Self {
        let lo_slot = any_lo.then_some(1);
        let fair_slot = lp.max_min.then_some(R - 1);
        let nb = lp.blocks.len();
        let ng = lp.coupling_rhs.len();
        let mut start = Vec::with_capacity(nb + 1);
        let mut nv = 0;
        for blk in &lp.blocks {
            start.push(nv);
            nv += blk.vars.len();
        }
        start.push(nv);
        let t = lp.max_min.then_some(nv);
        let nr = R * nb + ng;
        let gain_scale = max_abs(lp.blocks.iter().flat_map(|b| b.vars.iter().map(|v| v.gain)));
        let fair_max: Vec<f64> = lp
            .blocks
            .iter()
            .map(|b| max_abs(b.vars.iter().map(|v| v.fair)))
            .collect();
        // t can be no larger than any block's best: all its time on its best type.
        let t_scale = lp
            .blocks
            .iter()
            .zip(&fair_max)
            .filter(|(b, _)| !b.vars.is_empty())
            .map(|(b, f)| f * b.hi)
            .fold(f64::INFINITY, f64::min);
        let t_scale = if t_scale.is_finite() && t_scale > 0.0 {
            t_scale
        } else {
            1.0
        };
        let mut present = vec![false; nr];
        let mut b = vec![0.0; nr];
        let mut c = vec![0.0; nv + usize::from(lp.max_min)];
        let mut local = Vec::with_capacity(nv);
        let mut t_local = Vec::with_capacity(nb);
        let mut border_index = Vec::new();
        let mut border_start = Vec::with_capacity(nb + 1);
        let mut uses = Vec::new();
        let mut use_start = Vec::with_capacity(nv + 1);
        for (k, blk) in lp.blocks.iter().enumerate() {
            present[R * k] = !blk.vars.is_empty();
            b[R * k] = blk.hi;
            let mut col = SVector::<f64, R>::zeros();
            col[0] = if blk.vars.is_empty() { 0.0 } else { 1.0 };
            let mut has_lo = false;
            if let (Some(s), Some(lo)) = (lo_slot, blk.lo.filter(|l| *l > 0.0)) {
                present[R * k + s] = true;
                b[R * k + s] = -lo;
                col[s] = -1.0;
                has_lo = true;
            }
            let mut tcol = SVector::<f64, R>::zeros();
            if let Some(s) = fair_slot {
                present[R * k + s] = true;
                tcol[s] = t_scale / fair_max[k];
            }
            t_local.push(tcol);
            let first = border_index.len();
            border_start.push(first);
            for (i, v) in blk.vars.iter().enumerate() {
                if !lp.max_min {
                    c[start[k] + i] = -v.gain / gain_scale;
                }
                let mut l = col;
                if let Some(s) = fair_slot {
                    l[s] = -v.fair / fair_max[k];
                }
                debug_assert!(has_lo || lo_slot.is_none_or(|s| l[s] == 0.0));
                local.push(l);
                use_start.push(uses.len());
                for &(g, coef) in &v.uses {
                    let pos = border_index[first..]
                        .iter()
                        .position(|&r| r == g)
                        .unwrap_or_else(|| {
                            border_index.push(g);
                            border_index.len() - 1 - first
                        });
                    uses.push((pos, coef / lp.coupling_rhs[g]));
                    present[R * nb + g] = true;
                }
            }
            if lp.max_min {
                border_index.push(ng);
            }
        }
        border_start.push(border_index.len());
        use_start.push(uses.len());
        let mut use_rows = Vec::with_capacity(uses.len());
        for k in 0..nb {
            for v in start[k]..start[k + 1] {
                for &(pos, coef) in &uses[use_start[v]..use_start[v + 1]] {
                    use_rows.push((R * nb + border_index[border_start[k] + pos], coef));
                }
            }
        }
        for g in 0..ng {
            b[R * nb + g] = 1.0;
        }
        if let Some(t) = t {
            c[t] = -1.0;
        }
        Layout {
            start,
            nb,
            ng,
            nv: c.len(),
            nr,
            t,
            present,
            b,
            c,
            gain_scale,
            t_scale,
            local,
            t_local,
            border_index,
            border_start,
            uses,
            use_start,
            use_rows,
        }
    }

    fn borders(&self, k: usize) -> &[usize] {
        &self.border_index[self.border_start[k]..self.border_start[k + 1]]
    }

    fn uses(&self, v: usize) -> &[(usize, f64)] {
        &self.uses[self.use_start[v]..self.use_start[v + 1]]
    }

    fn local_rows(&self, k: usize, r: &[f64]) -> SVector<f64, R> {
        SVector::<f64, R>::from_fn(|s, _| {
            if self.present[R * k + s] {
                r[R * k + s]
            } else {
                0.0
            }
        })
    }

    fn use_rows(&self, v: usize) -> &[(usize, f64)] {
        &self.use_rows[self.use_start[v]..self.use_start[v + 1]]
    }

    fn ax(&self, x: &[f64]) -> Vec<f64> {
        let nb = self.nb;
        let mut r = vec![0.0; self.nr];
        for k in 0..nb {
            let mut local = SVector::<f64, R>::zeros();
            for v in self.start[k]..self.start[k + 1] {
                local += self.local[v] * x[v];
                for &(row, coef) in self.use_rows(v) {
                    r[row] += coef * x[v];
                }
            }
            if let Some(t) = self.t {
                local += self.t_local[k] * x[t];
            }
            r[R * k..R * k + R].copy_from_slice(local.as_slice());
        }
        r
    }

    fn aty(&self, y: &[f64]) -> Vec<f64> {
        let nb = self.nb;
        let mut r = vec![0.0; self.nv];
        for k in 0..nb {
            let yl = self.local_rows(k, y);
            for v in self.start[k]..self.start[k + 1] {
                let mut s = self.local[v].dot(&yl);
                for &(row, coef) in self.use_rows(v) {
                    s += coef * y[row];
                }
                r[v] = s;
            }
            if let Some(t) = self.t {
                r[t] += self.t_local[k].dot(&yl);
            }
        }
        r
    }
}

fn max_abs(values: impl Iterator<Item = f64>) -> f64 {
    let m = values.fold(0.0_f64, |m, v| m.max(v.abs()));
    if m > 0.0 { m } else { 1.0 }
}

/// The factored Newton system of one iteration; its buffers are reused across iterations.
struct Factor<const R: usize> {
    /// Per block: Cholesky of its R x R block (absent rows are identity).
    chol: Vec<Cholesky<f64, Const<R>>>,
    /// Per block its bordering columns, laid out as `Layout::border_index`.
    border: Vec<SVector<f64, R>>,
    /// Schur complement on [coupling rows | u], LU-factored.
    schur: Option<nalgebra::LU<f64, nalgebra::Dyn, nalgebra::Dyn>>,
    /// Scratch: the Schur complement before factoring, B⁻¹·border of one block, and the coupling
    /// rows' own products of one block.
    s: DMatrix<f64>,
    solved: Vec<SVector<f64, R>>,
    cc: Vec<f64>,
}

impl<const R: usize> Layout<R> {
    fn schur_dim(&self) -> usize {
        self.ng + usize::from(self.t.is_some())
    }

    fn new_factor(&self) -> Factor<R> {
        let dim = self.schur_dim();
        Factor {
            chol: Vec::with_capacity(self.nb),
            border: vec![SVector::zeros(); self.border_index.len()],
            schur: None,
            s: DMatrix::zeros(dim, dim),
            solved: Vec::new(),
            cc: Vec::new(),
        }
    }

    /// Factors the Newton system for `d` = x/z per variable, `e` = w/y per row; false on
    /// numerical breakdown.
    fn factor(&self, f: &mut Factor<R>, d: &[f64], e: &[f64]) -> bool {
        let (nb, ng) = (self.nb, self.ng);
        f.s.fill(0.0);
        for g in 0..ng {
            f.s[(g, g)] = if self.present[R * nb + g] {
                e[R * nb + g]
            } else {
                1.0
            };
        }
        if let Some(t) = self.t {
            f.s[(ng, ng)] = -1.0 / d[t];
        }
        f.chol.clear();
        f.border.fill(SVector::zeros());
        for k in 0..nb {
            let first = self.border_start[k];
            let borders = self.borders(k);
            let nt = borders.len() - usize::from(self.t.is_some());
            let mut bk =
                SMatrix::<f64, R, R>::from_fn(|i, j| match (i == j, self.present[R * k + i]) {
                    (true, true) => e[R * k + i],
                    (true, false) => 1.0,
                    _ => 0.0,
                });
            f.cc.clear();
            f.cc.resize(nt * nt, 0.0);
            for v in self.start[k]..self.start[k + 1] {
                let l = self.local[v];
                bk += l * l.transpose() * d[v];
                let uses = self.uses(v);
                for &(p, a) in uses {
                    f.border[first + p] += l * (d[v] * a);
                    for &(q, b) in uses {
                        f.cc[p * nt + q] += d[v] * a * b;
                    }
                }
            }
            if self.t.is_some() {
                f.border[first + nt] = self.t_local[k];
            }
            let Some(ch) = Cholesky::new(bk) else {
                return false;
            };
            let cols = &f.border[first..first + borders.len()];
            f.solved.clear();
            f.solved.extend(cols.iter().map(|c| ch.solve(c)));
            for (p, cp) in cols.iter().enumerate() {
                for (q, sq) in f.solved.iter().enumerate() {
                    let mut v = -cp.dot(sq);
                    if p < nt && q < nt {
                        v += f.cc[p * nt + q];
                    }
                    f.s[(borders[p], borders[q])] += v;
                }
            }
            f.chol.push(ch);
        }
        if !f.s.iter().all(|v| v.is_finite()) {
            return false;
        }
        f.schur = Some(f.s.clone().lu());
        true
    }

    /// Solves (A D Aᵀ + E) Δy = r with a factor.
    fn solve_rows(&self, f: &Factor<R>, r: &[f64]) -> Option<Vec<f64>> {
        let (nb, ng) = (self.nb, self.ng);
        let cols = |k: usize| &f.border[self.border_start[k]..self.border_start[k + 1]];
        let mut rhs = DVector::<f64>::zeros(self.schur_dim());
        for g in 0..ng {
            if self.present[R * nb + g] {
                rhs[g] = r[R * nb + g];
            }
        }
        for k in 0..nb {
            let q = f.chol[k].solve(&self.local_rows(k, r));
            for (col, &i) in cols(k).iter().zip(self.borders(k)) {
                rhs[i] -= col.dot(&q);
            }
        }
        let border = f.schur.as_ref()?.solve(&rhs)?;
        let mut dy = vec![0.0; self.nr];
        for k in 0..nb {
            let mut rk = self.local_rows(k, r);
            for (col, &i) in cols(k).iter().zip(self.borders(k)) {
                rk -= col * border[i];
            }
            let v = f.chol[k].solve(&rk);
            for s in 0..R {
                if self.present[R * k + s] {
                    dy[R * k + s] = v[s];
                }
            }
        }
        for g in 0..ng {
            if self.present[R * nb + g] {
                dy[R * nb + g] = border[g];
            }
        }
        Some(dy)
    }
}

/// Interior-point iterate: primal `x` (variables), `w` (row slacks); dual `y` (rows), `z`
/// (variables). Absent rows hold w = y = 1 and take no part.
#[derive(Clone)]
struct Point {
    x: Vec<f64>,
    w: Vec<f64>,
    y: Vec<f64>,
    z: Vec<f64>,
}

type Direction = Point;

/// The largest step in (0, 1] keeping `v + α·dv > 0`.
fn max_step(pairs: &[(&[f64], &[f64])]) -> f64 {
    let mut a = 1.0_f64;
    for (v, dv) in pairs {
        for (vi, di) in v.iter().zip(dv.iter()) {
            if *di < 0.0 {
                a = a.min(-vi / di);
            }
        }
    }
    a
}

impl<const R: usize> Layout<R> {
    fn run(&self, lp: &BlockLp) -> Option<BlockSolution> {
        let (nv, nr) = (self.nv, self.nr);
        let mut p = Point {
            x: vec![0.0; nv],
            w: vec![1.0; nr],
            y: vec![1.0; nr],
            z: vec![1.0; nv],
        };
        for (k, blk) in lp.blocks.iter().enumerate() {
            let n = blk.vars.len() as f64;
            for v in self.start[k]..self.start[k + 1] {
                p.x[v] = blk.hi.max(1e-3) / (n + 1.0);
            }
        }
        // Start inside the coupling rows (at most half used), so that only the duals start
        // infeasible; t at half the smallest block's start value.
        let ax = self.ax(&p.x);
        let most = ax[R * self.nb..].iter().fold(0.0_f64, |m, v| m.max(*v));
        if most > 0.5 {
            p.x.iter_mut().for_each(|x| *x *= 0.5 / most);
        }
        if let Some(t) = self.t {
            let ax = self.ax(&p.x);
            let least = (0..self.nb)
                .filter(|k| !lp.blocks[*k].vars.is_empty())
                .map(|k| -ax[R * k + R - 1] / self.t_local[k][R - 1])
                .fold(f64::INFINITY, f64::min);
            p.x[t] = if least.is_finite() && least > 0.0 {
                0.5 * least
            } else {
                1e-3
            };
        }
        let ax = self.ax(&p.x);
        for r in 0..nr {
            if self.present[r] {
                p.w[r] = (self.b[r] - ax[r]).max(1e-2);
            }
        }
        let n_compl = (nv + self.present.iter().filter(|p| **p).count()) as f64;
        let b_norm = inf_norm(&self.b);
        let c_norm = inf_norm(&self.c);
        let mut factor = self.new_factor();
        let mut best: Option<(f64, Point, usize)> = None;
        for iteration in 0..MAX_ITERATIONS {
            let ax = self.ax(&p.x);
            let aty = self.aty(&p.y);
            let rp: Vec<f64> = (0..nr)
                .map(|r| {
                    if self.present[r] {
                        self.b[r] - ax[r] - p.w[r]
                    } else {
                        0.0
                    }
                })
                .collect();
            let rd: Vec<f64> = (0..nv).map(|v| -(self.c[v] + aty[v] - p.z[v])).collect();
            let compl = dot(&p.x, &p.z) + masked_dot(&self.present, &p.w, &p.y);
            let mu = compl / n_compl;
            let pobj = dot(&self.c, &p.x);
            let dobj = -masked_dot(&self.present, &self.b, &p.y);
            let error = (inf_norm(&rp) / (1.0 + b_norm))
                .max(inf_norm(&rd) / (1.0 + c_norm))
                .max((pobj - dobj).abs() / (1.0 + pobj.abs()));
            if !error.is_finite() {
                break;
            }
            if best.as_ref().is_none_or(|(e, _, _)| error < *e) {
                best = Some((error, p.clone(), iteration));
            }
            if error < TOLERANCE {
                break;
            }
            let d: Vec<f64> = (0..nv).map(|v| p.x[v] / p.z[v]).collect();
            let e: Vec<f64> = (0..nr).map(|r| p.w[r] / p.y[r]).collect();
            if !self.factor(&mut factor, &d, &e) {
                break;
            }
            // Predictor: the pure Newton (affine-scaling) direction.
            let rxz: Vec<f64> = (0..nv).map(|v| -p.x[v] * p.z[v]).collect();
            let rwy: Vec<f64> = (0..nr).map(|r| -p.w[r] * p.y[r]).collect();
            let Some(aff) = self.direction(
                &factor,
                &p,
                [&d, &e],
                mu < REFINE_BELOW_MU,
                [&rp, &rd, &rxz, &rwy],
            ) else {
                break;
            };
            let (ap, ad) = self.steps(&p, &aff);
            let mut compl_aff = 0.0;
            for v in 0..nv {
                compl_aff += (p.x[v] + ap * aff.x[v]) * (p.z[v] + ad * aff.z[v]);
            }
            for r in (0..nr).filter(|r| self.present[*r]) {
                compl_aff += (p.w[r] + ap * aff.w[r]) * (p.y[r] + ad * aff.y[r]);
            }
            let sigma = (compl_aff / compl).clamp(0.0, 1.0).powi(3);
            // Corrector: centring plus Mehrotra's second-order term.
            let rxz: Vec<f64> = (0..nv)
                .map(|v| sigma * mu - p.x[v] * p.z[v] - aff.x[v] * aff.z[v])
                .collect();
            let rwy: Vec<f64> = (0..nr)
                .map(|r| sigma * mu - p.w[r] * p.y[r] - aff.w[r] * aff.y[r])
                .collect();
            let refine = mu < REFINE_BELOW_MU;
            let Some(mut dir) =
                self.direction(&factor, &p, [&d, &e], refine, [&rp, &rd, &rxz, &rwy])
            else {
                break;
            };
            // Gondzio's centrality correctors: push the products that would end far from the
            // target back into [0.1, 10]·σμ, as long as that lengthens the step.
            let zero_v = vec![0.0; nv];
            let zero_r = vec![0.0; nr];
            for _ in 0..CORRECTORS {
                let (ap, ad) = self.steps(&p, &dir);
                if ap.min(ad) > CORRECT_BELOW_STEP {
                    break;
                }
                let (tp, td) = ((ap + 0.1).min(1.0), (ad + 0.1).min(1.0));
                let target = sigma * mu;
                let push = |prod: f64| {
                    if prod < 0.1 * target {
                        0.1 * target - prod
                    } else if prod > 10.0 * target {
                        (10.0 * target - prod).max(-10.0 * target)
                    } else {
                        0.0
                    }
                };
                let cxz: Vec<f64> = (0..nv)
                    .map(|v| push((p.x[v] + tp * dir.x[v]) * (p.z[v] + td * dir.z[v])))
                    .collect();
                let cwy: Vec<f64> = (0..nr)
                    .map(|r| {
                        if self.present[r] {
                            push((p.w[r] + tp * dir.w[r]) * (p.y[r] + td * dir.y[r]))
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let Some(c) = self.direction(
                    &factor,
                    &p,
                    [&d, &e],
                    refine,
                    [&zero_r, &zero_v, &cxz, &cwy],
                ) else {
                    break;
                };
                let trial = Direction {
                    x: add(&dir.x, &c.x),
                    w: add(&dir.w, &c.w),
                    y: add(&dir.y, &c.y),
                    z: add(&dir.z, &c.z),
                };
                let (bp, bd) = self.steps(&p, &trial);
                if bp.min(bd) < 1.01 * ap.min(ad) {
                    break;
                }
                dir = trial;
            }
            let (ap, ad) = self.steps(&p, &dir);
            let eta = (1.0 - mu).clamp(ETA_MIN, 0.999);
            let (ap, ad) = ((eta * ap).min(1.0), (eta * ad).min(1.0));
            if ap.max(ad) < 1e-12 {
                break;
            }
            for v in 0..nv {
                p.x[v] += ap * dir.x[v];
                p.z[v] += ad * dir.z[v];
            }
            for r in (0..nr).filter(|r| self.present[*r]) {
                p.w[r] += ap * dir.w[r];
                p.y[r] += ad * dir.y[r];
            }
        }
        let (error, p, iterations) = best?;
        let finite = p.x.iter().chain(&p.y).all(|v| v.is_finite());
        (finite && error < TOLERANCE_STALLED).then(|| self.solution(lp, &p, iterations))
    }

    fn solution(&self, lp: &BlockLp, p: &Point, iterations: usize) -> BlockSolution {
        let x: Vec<Vec<f64>> = (0..lp.blocks.len())
            .map(|k| p.x[self.start[k]..self.start[k + 1]].to_vec())
            .collect();
        let objective = match self.t {
            Some(t) => p.x[t] * self.t_scale,
            None => -dot(&self.c, &p.x) * self.gain_scale,
        };
        BlockSolution {
            x,
            objective,
            iterations,
        }
    }

    /// (A D Aᵀ + E)·v on the present rows.
    fn normal(&self, d: &[f64], e: &[f64], v: &[f64]) -> Vec<f64> {
        let mut dv = self.aty(v);
        dv.iter_mut().zip(d).for_each(|(a, d)| *a *= d);
        let mut out = self.ax(&dv);
        for r in 0..self.nr {
            out[r] = if self.present[r] {
                out[r] + e[r] * v[r]
            } else {
                0.0
            };
        }
        out
    }

    /// The Newton direction for right-hand sides [primal, dual, x·z, w·y].
    fn direction(
        &self,
        f: &Factor<R>,
        p: &Point,
        [d, e]: [&[f64]; 2],
        refine: bool,
        [rp, rd, rxz, rwy]: [&[f64]; 4],
    ) -> Option<Direction> {
        let (nv, nr) = (self.nv, self.nr);
        let xi: Vec<f64> = (0..nv).map(|v| rd[v] + rxz[v] / p.x[v]).collect();
        let dxi: Vec<f64> = (0..nv).map(|v| d[v] * xi[v]).collect();
        let adxi = self.ax(&dxi);
        let rhs: Vec<f64> = (0..nr)
            .map(|r| {
                if self.present[r] {
                    adxi[r] + rwy[r] / p.y[r] - rp[r]
                } else {
                    0.0
                }
            })
            .collect();
        let mut dy = self.solve_rows(f, &rhs)?;
        // Iterative refinement: near the optimum D and E spread over many orders of magnitude
        // and the reduced system loses digits; a correction or two recovers them.
        for _ in 0..if refine { REFINEMENTS } else { 0 } {
            let n_dy = self.normal(d, e, &dy);
            let resid: Vec<f64> = (0..nr).map(|r| rhs[r] - n_dy[r]).collect();
            if inf_norm(&resid) <= 1e-15 * (1.0 + inf_norm(&rhs)) {
                break;
            }
            let fix = self.solve_rows(f, &resid)?;
            dy.iter_mut().zip(fix).for_each(|(a, b)| *a += b);
        }
        let atdy = self.aty(&dy);
        let dx: Vec<f64> = (0..nv).map(|v| d[v] * (xi[v] - atdy[v])).collect();
        let dz: Vec<f64> = (0..nv)
            .map(|v| (rxz[v] - p.z[v] * dx[v]) / p.x[v])
            .collect();
        let dw: Vec<f64> = (0..nr)
            .map(|r| {
                if self.present[r] {
                    (rwy[r] - p.w[r] * dy[r]) / p.y[r]
                } else {
                    0.0
                }
            })
            .collect();
        Some(Direction {
            x: dx,
            w: dw,
            y: dy,
            z: dz,
        })
    }

    /// Largest primal and dual steps to the boundary.
    fn steps(&self, p: &Point, dir: &Direction) -> (f64, f64) {
        (
            max_step(&[(&p.x, &dir.x), (&p.w, &dir.w)]),
            max_step(&[(&p.z, &dir.z), (&p.y, &dir.y)]),
        )
    }
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn masked_dot(mask: &[bool], a: &[f64], b: &[f64]) -> f64 {
    mask.iter()
        .zip(a.iter().zip(b))
        .filter(|(m, _)| **m)
        .map(|(_, (x, y))| x * y)
        .sum()
}

/// The largest magnitude; NaN if any entry is (f64::max would drop it).
fn inf_norm(v: &[f64]) -> f64 {
    v.iter().fold(0.0_f64, |m, x| {
        if x.is_nan() || x.abs() > m {
            x.abs()
        } else {
            m
        }
    })
}
