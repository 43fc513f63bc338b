//! The allocation LP handed whole to clarabel through good_lp: the reference the structured
//! method is tested against, and the fallback that decides when it does not converge.
//!
//! One variable `y[c][j] ∈ [0, n_c]` per class and type it can run on; the base rows of
//! [`super`]; max-min adds a variable `t` and one row per class.

use good_lp::{
    Constraint, Expression, ProblemVariables, Solution, SolverModel, Variable, clarabel, variable,
};

use super::{Class, Objective};
use crate::error::PolicyError;
use crate::problem::Problem;

/// Per class, each member's share per worker type (unclamped).
pub fn solve<F: Fn(&Class, usize) -> f64>(
    problem: &Problem,
    classes: &[Class],
    objective: &Objective<F>,
) -> Result<Vec<Vec<f64>>, PolicyError> {
    let mut vars = ProblemVariables::new();
    let y: Vec<Vec<Option<Variable>>> = classes
        .iter()
        .map(|c| {
            c.throughput
                .iter()
                .map(|&t| (t > 0.0).then(|| vars.add(variable().min(0.0).max(c.size()))))
                .collect()
        })
        .collect();
    let row = |c: usize, coef: &dyn Fn(usize) -> f64| {
        let mut e = Expression::with_capacity(y[c].len());
        for (j, v) in y[c].iter().enumerate() {
            if let Some(v) = v {
                e.add_mul(coef(j), *v);
            }
        }
        e
    };
    let mut rows = base_rows(problem, classes, &y, &row);
    let goal: Expression = match objective {
        Objective::Linear(coef) => {
            let mut e = Expression::with_capacity(classes.len() * problem.cluster.capacity.len());
            for (c, class) in classes.iter().enumerate() {
                e += row(c, &|j| coef(class, j));
            }
            e
        }
        Objective::MaxMin(coef) if !classes.is_empty() => {
            let t = vars.add(variable().min(0.0));
            for (c, class) in classes.iter().enumerate() {
                rows.push(row(c, &|j| coef(class, j) / class.size()).geq(t));
            }
            t.into()
        }
        Objective::MaxMin(_) => Expression::default(),
    };
    let mut model = vars.maximise(goal).using(clarabel);
    model
        .settings()
        .tol_gap_rel(1e-10)
        .tol_gap_abs(1e-10)
        .tol_feas(1e-10);
    let solution = model.with_all(rows).solve().map_err(|e| match e {
        good_lp::ResolutionError::Infeasible => {
            PolicyError::Infeasible("no allocation satisfies every constraint".into())
        }
        other => PolicyError::Solver(other.to_string()),
    })?;
    Ok(classes
        .iter()
        .zip(&y)
        .map(|(class, y)| {
            y.iter()
                .map(|v| v.map_or(0.0, |v| solution.value(v) / class.size()))
                .collect()
        })
        .collect())
}

/// Σ_j coef(j) · y\[c\]\[j\] for class `c`.
type Row<'a> = &'a dyn Fn(usize, &dyn Fn(usize) -> f64) -> Expression;

/// Each class's shares sum to at most `n_c · max_share` and at least `n_c · min_share`; on each
/// type the workers in use stay within capacity, and each tenant's within its quota.
fn base_rows(
    problem: &Problem,
    classes: &[Class],
    y: &[Vec<Option<Variable>>],
    row: Row,
) -> Vec<Constraint> {
    let mut rows = Vec::with_capacity(y.len() + problem.cluster.capacity.len());
    for (c, class) in classes.iter().enumerate() {
        let runnable = y[c].iter().any(Option::is_some);
        let most = class.max_share.unwrap_or(1.0) * class.size();
        if runnable {
            rows.push(row(c, &|_| 1.0).leq(most));
        }
        if let Some(least) = class.min_share.filter(|l| *l > 0.0) {
            // A job that must run but can run nowhere makes the problem infeasible.
            rows.push(row(c, &|_| 1.0).geq(least * class.size()));
        }
    }
    for (tenant, quota) in &problem.quotas {
        for (j, &q) in quota.iter().enumerate() {
            let mut e = Expression::with_capacity(y.len());
            for (c, class) in classes.iter().enumerate() {
                if class.tenant.as_ref() == Some(tenant)
                    && let Some(v) = y[c][j]
                {
                    e.add_mul(class.scale_factor as f64, v);
                }
            }
            rows.push(e.leq(q));
        }
    }
    for (j, &cap) in problem.cluster.capacity.iter().enumerate() {
        let mut e = Expression::with_capacity(y.len());
        for (c, class) in classes.iter().enumerate() {
            if let Some(v) = y[c][j] {
                e.add_mul(class.scale_factor as f64, v);
            }
        }
        rows.push(e.leq(cap));
    }
    rows
}
