//! One Newton system: each block's R x R system factored (Cholesky), bordered by the coupling
//! rows, and solved through the Schur complement on them (a dense LU of a few rows).

// The loops walk several parallel arrays (variables' columns, values, bounds) by index.
#![allow(clippy::needless_range_loop)]

use nalgebra::{Cholesky, Const, DMatrix, DVector, SMatrix, SVector};

use super::layout::Layout;

/// The factored Newton system of one iteration; its buffers are reused across iterations.
pub(super) struct Factor<const R: usize> {
    /// Per block: Cholesky of its R x R block (absent rows are identity).
    pub(super) chol: Vec<Cholesky<f64, Const<R>>>,
    /// Per block its bordering columns, laid out as `Layout::border_index`.
    pub(super) border: Vec<SVector<f64, R>>,
    /// Schur complement on [coupling rows | u], LU-factored.
    pub(super) schur: Option<nalgebra::LU<f64, nalgebra::Dyn, nalgebra::Dyn>>,
    /// Scratch: the Schur complement before factoring, B⁻¹·border of one block, and the coupling
    /// rows' own products of one block.
    pub(super) s: DMatrix<f64>,
    pub(super) solved: Vec<SVector<f64, R>>,
    pub(super) cc: Vec<f64>,
}

impl<const R: usize> Layout<R> {
    pub(super) fn schur_dim(&self) -> usize {
        self.ng + usize::from(self.t.is_some())
    }

    pub(super) fn new_factor(&self) -> Factor<R> {
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
    pub(super) fn factor(&self, f: &mut Factor<R>, d: &[f64], e: &[f64]) -> bool {
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
    pub(super) fn solve_rows(&self, f: &Factor<R>, r: &[f64]) -> Option<Vec<f64>> {
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
