//! The scaled problem in flat arrays and its products with the constraint matrix.

// The loops walk several parallel arrays (variables' columns, values, bounds) by index.
#![allow(clippy::needless_range_loop)]

use nalgebra::SVector;

use super::BlockLp;

/// The scaled problem in flat arrays: variables block by block then `t`; rows R per block
/// (slot 0 `Σx ≤ hi`, then `Σx ≥ lo` if any block has one, then fairness for max-min; absent
/// ones masked) then the coupling rows. Scaling: gains divided by the largest; each fairness
/// row by its block's largest coefficient, and `t = t_scale · t̂` with `t_scale` the smallest
/// block's best possible value, so t̂ ≤ 1; coupling rows to right-hand side 1.
pub(super) struct Layout<const R: usize> {
    /// First variable of each block (and one past the last).
    pub(super) start: Vec<usize>,
    pub(super) nb: usize,
    pub(super) ng: usize,
    pub(super) nv: usize,
    pub(super) nr: usize,
    /// Index of `t`, when max-min.
    pub(super) t: Option<usize>,
    pub(super) present: Vec<bool>,
    pub(super) b: Vec<f64>,
    pub(super) c: Vec<f64>,
    pub(super) gain_scale: f64,
    pub(super) t_scale: f64,
    /// Each variable's column in its block's own rows.
    pub(super) local: Vec<SVector<f64, R>>,
    /// `t`'s column in each block's own rows.
    pub(super) t_local: Vec<SVector<f64, R>>,
    /// Per block, from `border_start[k]`: where its bordering columns sit in the Schur
    /// complement (the coupling rows its variables use, deduplicated, then `u` for max-min).
    pub(super) border_index: Vec<usize>,
    pub(super) border_start: Vec<usize>,
    /// Per variable, its uses as (position among its block's bordering columns, scaled
    /// coefficient), from `use_start[v]`.
    pub(super) uses: Vec<(usize, f64)>,
    pub(super) use_start: Vec<usize>,
    /// The same uses as (row index among all rows, scaled coefficient).
    pub(super) use_rows: Vec<(usize, f64)>,
}

impl<const R: usize> Layout<R> {
    pub(super) fn new(lp: &BlockLp, any_lo: bool) -> Self {
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

    pub(super) fn borders(&self, k: usize) -> &[usize] {
        &self.border_index[self.border_start[k]..self.border_start[k + 1]]
    }

    pub(super) fn uses(&self, v: usize) -> &[(usize, f64)] {
        &self.uses[self.use_start[v]..self.use_start[v + 1]]
    }

    pub(super) fn local_rows(&self, k: usize, r: &[f64]) -> SVector<f64, R> {
        SVector::<f64, R>::from_fn(|s, _| {
            if self.present[R * k + s] {
                r[R * k + s]
            } else {
                0.0
            }
        })
    }

    pub(super) fn use_rows(&self, v: usize) -> &[(usize, f64)] {
        &self.use_rows[self.use_start[v]..self.use_start[v + 1]]
    }

    pub(super) fn ax(&self, x: &[f64]) -> Vec<f64> {
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

    pub(super) fn aty(&self, y: &[f64]) -> Vec<f64> {
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
