//! The offline model as an LP or a MILP (microlp): one variable per (job, configuration,
//! start), each job started once, each type's GPUs within capacity in every slot.

use super::Model;
use crate::error::PolicyError;

/// A solution of the model: its objective (sum of completion minus submission) and the
/// nonzero (job, configuration, start slot, value).
pub(super) struct Solved {
    pub(super) objective: f64,
    pub(super) values: Vec<(usize, usize, usize, f64)>,
    /// Relaxed only: per job, its share started after the horizon and the least completion
    /// time such a start has.
    pub(super) tail: Vec<(f64, f64)>,
}

/// The time-indexed model over `horizon` slots, relaxed or with binary starts. Relaxed, each
/// job may also start after the horizon (its tail) at the least completion time that has,
/// holding no GPUs: the relaxation then bounds every plan, not only those that end in time.
/// With binary starts it is the best plan that ends within the horizon.
pub(super) fn solve(model: &Model, horizon: usize, integral: bool) -> Result<Solved, PolicyError> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    let mut p = Problem::new(OptimizationDirection::Minimize);
    let mut vars = Vec::new();
    let mut tails = Vec::new();
    // Per (type, slot), the (variable, GPUs) that hold it.
    let mut hold: Vec<Vec<Vec<(microlp::Variable, f64)>>> =
        vec![vec![Vec::new(); horizon]; model.capacity.len()];
    for (j, configs) in model.configs.iter().enumerate() {
        let mut once = Vec::new();
        for (c, conf) in configs.iter().enumerate() {
            let len = model.slots(conf);
            for s in model.release[j]..(horizon + 1).saturating_sub(len) {
                let jct = s as f64 * model.slot_s + conf.duration_s - model.submit[j];
                let v = if integral {
                    p.add_binary_var(jct)
                } else {
                    p.add_var(jct, (0.0, 1.0))
                };
                once.push((v, 1.0));
                for held in &mut hold[conf.worker_type][s..s + len] {
                    held.push((v, f64::from(conf.replicas)));
                }
                vars.push((j, c, s, v));
            }
        }
        if !integral {
            let end = configs
                .iter()
                .map(|c| {
                    let first = (horizon + 1)
                        .saturating_sub(model.slots(c))
                        .max(model.release[j]);
                    first as f64 * model.slot_s + c.duration_s
                })
                .fold(f64::INFINITY, f64::min);
            let v = p.add_var(end - model.submit[j], (0.0, 1.0));
            once.push((v, 1.0));
            tails.push((v, end));
        }
        p.add_constraint(once.as_slice(), ComparisonOp::Eq, 1.0);
    }
    for (t, slots) in hold.iter().enumerate() {
        for terms in slots.iter().filter(|h| !h.is_empty()) {
            p.add_constraint(
                terms.as_slice(),
                ComparisonOp::Le,
                f64::from(model.capacity[t]),
            );
        }
    }
    let solution = p
        .solve()
        .map_err(|e| PolicyError::Solver(format!("the offline model: {e}")))?;
    let values = vars
        .into_iter()
        .map(|(j, c, s, v)| (j, c, s, solution[v]))
        .filter(|v| v.3 > 1e-9)
        .collect();
    let tail = tails.iter().map(|&(v, end)| (solution[v], end)).collect();
    Ok(Solved {
        objective: solution.objective(),
        values,
        tail,
    })
}
