//! Mehrotra's predictor-corrector with Gondzio's correctors, iterative refinement of each
//! Newton solve, the step lengths, and the answer unscaled.

// The loops walk several parallel arrays (variables' columns, values, bounds) by index.
#![allow(clippy::needless_range_loop)]

use super::layout::Layout;
use super::newton::Factor;
use super::*;

/// Interior-point iterate: primal `x` (variables), `w` (row slacks); dual `y` (rows), `z`
/// (variables). Absent rows hold w = y = 1 and take no part.
#[derive(Clone)]
pub(super) struct Point {
    pub(super) x: Vec<f64>,
    pub(super) w: Vec<f64>,
    pub(super) y: Vec<f64>,
    pub(super) z: Vec<f64>,
}

pub(super) type Direction = Point;

/// The largest step in (0, 1] keeping `v + α·dv > 0`.
pub(super) fn max_step(pairs: &[(&[f64], &[f64])]) -> f64 {
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
    pub(super) fn run(&self, lp: &BlockLp) -> Option<BlockSolution> {
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

    pub(super) fn solution(&self, lp: &BlockLp, p: &Point, iterations: usize) -> BlockSolution {
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
    pub(super) fn normal(&self, d: &[f64], e: &[f64], v: &[f64]) -> Vec<f64> {
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
    pub(super) fn direction(
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
    pub(super) fn steps(&self, p: &Point, dir: &Direction) -> (f64, f64) {
        (
            max_step(&[(&p.x, &dir.x), (&p.w, &dir.w)]),
            max_step(&[(&p.z, &dir.z), (&p.y, &dir.y)]),
        )
    }
}

pub(super) fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(super) fn masked_dot(mask: &[bool], a: &[f64], b: &[f64]) -> f64 {
    mask.iter()
        .zip(a.iter().zip(b))
        .filter(|(m, _)| **m)
        .map(|(_, (x, y))| x * y)
        .sum()
}

/// The largest magnitude; NaN if any entry is (f64::max would drop it).
pub(super) fn inf_norm(v: &[f64]) -> f64 {
    v.iter().fold(0.0_f64, |m, x| {
        if x.is_nan() || x.abs() > m {
            x.abs()
        } else {
            m
        }
    })
}
