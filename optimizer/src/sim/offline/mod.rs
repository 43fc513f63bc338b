//! The best offline schedule of a small trace (issue 45, item 2): what a scheduler that knew
//! every arrival and every job's speed in advance could do, set beside the lower bound
//! ([`super::bound`]) and the policies, so that a policy's distance to the bound splits into
//! "ours vs a schedule known to be reachable" and "that schedule vs the bound".
//!
//! The model is time-indexed. Time is cut into slots of `slot_s` (a multiple of the round);
//! each job picks one *configuration* (a GPU type and a GPU count, its GPUs packed on as few
//! nodes as the type allows) and one start slot, and runs there to the end: its duration is
//! the restart penalty plus each epoch at that configuration's goodput (the best batch
//! configuration where the replay adapts it). Configurations that another of the same type
//! beats on both GPUs and time are dropped. A binary variable per (job, configuration, start);
//! each job starts once, no later than the horizon allows; in every slot the GPUs of each
//! type held by the jobs running in it (from their start to the slot their end falls in) are at
//! most the type's. The objective is the sum of completion times.
//!
//! * [`offline_plan`] solves the model's LP relaxation (a lower bound on every schedule of the
//!   model), rounds it (jobs in order of their LP mean completion, each at its most-used
//!   configuration, placed at the earliest slot where it fits), and, when the model is small
//!   enough, solves it exactly by branch and bound (microlp). The slots are those up to the
//!   makespan of the shortest of a few greedy list schedules of the model; the relaxation may
//!   also start a job after them, at the least completion that has and holding no GPUs, so it
//!   bounds every plan of the model; the exact solve is over the plans that end by the
//!   rounding's end (if later), so the rounding is one of them.
//! * [`Planned`] is the scheduler that carries a plan out in the replay: each job starts at
//!   its configuration at its planned round or, if its GPUs are not free then, at the first
//!   round after where they are; it is never resized. The replay's figures, not the model's,
//!   are what is reported: they are reachable, so the optimum of the replay lies between the
//!   bound and the best plan's replay.
//!
//! The model leaves out what the replay has and the plan cannot use (resizing a job while it
//! runs, placements other than packed, fragmentation of a type's GPUs across nodes), so the
//! plan is the exact optimum of schedules that never resize, to the slot, not of all
//! schedules.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::app::App;
use super::setup::Setup;
use super::{AppProfile, ClusterSpec, Report, SimConfig, TraceJob, Work, simulate};
use crate::error::PolicyError;

mod planned;
mod solve;

pub use planned::Planned;
use solve::{Solved, solve};

/// How the offline model is cut and how far it is solved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineOptions {
    /// Seconds per slot: a multiple of the round. Finer is closer to the replay and larger.
    pub slot_s: f64,
    /// The most (job, configuration, start) variables the model may have; a larger trace is
    /// refused with its size.
    pub max_variables: usize,
    /// The most variables for which the model is also solved exactly (branch and bound).
    pub max_exact_variables: usize,
}

impl Default for OfflineOptions {
    fn default() -> Self {
        OfflineOptions {
            slot_s: 600.0,
            max_variables: 60_000,
            max_exact_variables: 3_000,
        }
    }
}

impl OfflineOptions {
    /// Checks the options against the replay's rounds: the slot a multiple of the round.
    pub fn validate(&self, config: &SimConfig) -> Result<(), PolicyError> {
        let steps = self.slot_s / config.round_s;
        if !(self.slot_s.is_finite() && steps >= 1.0 - 1e-9 && (steps - steps.round()).abs() < 1e-9)
        {
            return Err(PolicyError::InvalidConfig(format!(
                "the offline plan's slot of {} s is not a multiple of the {} s round",
                self.slot_s, config.round_s
            )));
        }
        Ok(())
    }
}

/// One job's place in a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedJob {
    /// Index into the cluster's worker types (in order of first appearance).
    pub worker_type: usize,
    pub replicas: u32,
    /// The round at which it is to start.
    pub start_s: f64,
    /// Its completion in the model: start, restart penalty and training at the configuration.
    pub model_end_s: f64,
}

/// A schedule of the model and what it gives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// In trace order.
    pub jobs: Vec<PlannedJob>,
    /// Mean JCT in the model.
    pub model_mean_jct_s: f64,
}

/// What [`offline_plan`] found.
#[derive(Clone, Debug)]
pub struct Offline {
    pub slot_s: f64,
    /// Binary variables of the model, and slots of its horizon.
    pub variables: usize,
    pub horizon_slots: usize,
    /// The model's LP relaxation: no schedule of the model has a lower mean JCT.
    pub relaxation_mean_jct_s: f64,
    /// The rounding of the relaxation, and its replay.
    pub rounded: Plan,
    pub rounded_replay: Report,
    /// The model's exact optimum and its replay, when the model was small enough.
    pub exact: Option<(Plan, Report)>,
}

impl Offline {
    /// The replay with the lowest mean JCT of the plans found.
    pub fn best_replay(&self) -> &Report {
        match &self.exact {
            Some((_, r)) if r.summary.mean_jct_s < self.rounded_replay.summary.mean_jct_s => r,
            _ => &self.rounded_replay,
        }
    }
}

/// A job's configuration: type, GPUs and seconds from start to completion.
#[derive(Clone, Debug, PartialEq)]
struct Config {
    worker_type: usize,
    replicas: u32,
    duration_s: f64,
}

/// The model of a trace: per job its first slot and configurations.
struct Model {
    slot_s: f64,
    release: Vec<usize>,
    submit: Vec<f64>,
    configs: Vec<Vec<Config>>,
    capacity: Vec<u32>,
}

impl Model {
    fn slots(&self, c: &Config) -> usize {
        // A job that ends inside a slot holds its GPUs to the slot's end.
        ((c.duration_s / self.slot_s) - 1e-9).ceil().max(1.0) as usize
    }

    /// The plan of `choice` (job → configuration, start slot).
    fn plan(&self, choice: &[(usize, usize)]) -> Plan {
        let jobs: Vec<PlannedJob> = choice
            .iter()
            .enumerate()
            .map(|(j, &(c, s))| {
                let c = &self.configs[j][c];
                let start_s = s as f64 * self.slot_s;
                PlannedJob {
                    worker_type: c.worker_type,
                    replicas: c.replicas,
                    start_s,
                    model_end_s: start_s + c.duration_s,
                }
            })
            .collect();
        let n = jobs.len().max(1) as f64;
        let model_mean_jct_s = jobs
            .iter()
            .zip(&self.submit)
            .map(|(p, s)| p.model_end_s - s)
            .sum::<f64>()
            / n;
        Plan {
            jobs,
            model_mean_jct_s,
        }
    }

    /// Per job, the configuration with the fewest GPUs among those within `factor` of its
    /// fastest time (the fastest with the fewest GPUs at 1).
    fn within(&self, factor: f64) -> Vec<usize> {
        self.configs
            .iter()
            .map(|cs| {
                let fastest = cs
                    .iter()
                    .map(|c| c.duration_s)
                    .fold(f64::INFINITY, f64::min);
                (0..cs.len())
                    .filter(|&c| cs[c].duration_s <= fastest * factor)
                    .min_by(|&a, &b| {
                        (cs[a].replicas, cs[a].duration_s)
                            .partial_cmp(&(cs[b].replicas, cs[b].duration_s))
                            .expect("finite")
                    })
                    .expect("the fastest is within")
            })
            .collect()
    }

    /// The (job, configuration, start) variables of the model over `horizon` slots.
    fn variables(&self, horizon: usize) -> usize {
        (0..self.configs.len())
            .map(|j| {
                self.configs[j]
                    .iter()
                    .map(|c| (horizon + 1).saturating_sub(self.release[j] + self.slots(c)))
                    .sum::<usize>()
            })
            .sum()
    }

    /// Sum of JCTs of the list schedule of `order` at `config`.
    fn cost(&self, order: &[usize], config: &[usize]) -> f64 {
        let start = self.list_schedule(order, config);
        (0..order.len())
            .map(|j| {
                start[j] as f64 * self.slot_s + self.configs[j][config[j]].duration_s
                    - self.submit[j]
            })
            .sum()
    }

    /// Local search from a rounding: swaps of neighbours in the order and other configurations
    /// of one job, each kept when the list schedule's sum of JCTs falls, until none does (at
    /// most `PASSES` times over).
    fn improve(&self, mut order: Vec<usize>, mut config: Vec<usize>) -> (Vec<usize>, Vec<usize>) {
        const PASSES: usize = 20;
        let mut best = self.cost(&order, &config);
        for _ in 0..PASSES {
            let before = best;
            for i in 1..order.len() {
                order.swap(i - 1, i);
                let c = self.cost(&order, &config);
                if c < best - 1e-9 {
                    best = c;
                } else {
                    order.swap(i - 1, i);
                }
            }
            for j in 0..order.len() {
                for k in 0..self.configs[j].len() {
                    let was = std::mem::replace(&mut config[j], k);
                    let c = self.cost(&order, &config);
                    if c < best - 1e-9 {
                        best = c;
                    } else {
                        config[j] = was;
                    }
                }
            }
            if best >= before - 1e-9 {
                break;
            }
        }
        (order, config)
    }

    /// Places jobs in `order`, each at configuration `config[j]`, at the earliest slot from its
    /// release where its GPUs are free throughout (backfilling); returns the start slots.
    fn list_schedule(&self, order: &[usize], config: &[usize]) -> Vec<usize> {
        let mut used: Vec<Vec<u32>> = vec![Vec::new(); self.capacity.len()];
        let mut start = vec![0; order.len()];
        for &j in order {
            let c = &self.configs[j][config[j]];
            let (t, len) = (c.worker_type, self.slots(c));
            let row = &mut used[t];
            let mut s = self.release[j];
            loop {
                if row.len() < s + len {
                    row.resize(s + len, 0);
                }
                match (s..s + len).find(|&k| row[k] + c.replicas > self.capacity[t]) {
                    Some(k) => s = k + 1,
                    None => break,
                }
            }
            for held in &mut row[s..s + len] {
                *held += c.replicas;
            }
            start[j] = s;
        }
        start
    }
}

/// The offline plans of `trace` on `cluster` (see the module's comment). Refused, with the
/// sizes, when the model would have more than `options.max_variables` variables; a job the
/// replay would refuse is refused here too, named.
pub fn offline_plan(
    trace: &[TraceJob],
    profiles: &[AppProfile],
    cluster: &ClusterSpec,
    config: &SimConfig,
    options: &OfflineOptions,
) -> Result<Offline, PolicyError> {
    options.validate(config)?;
    if trace.is_empty() {
        return Err(PolicyError::InvalidConfig("the trace has no jobs".into()));
    }
    let model = build(trace, profiles, cluster, config, options.slot_s)?;
    let n = trace.len();
    let horizon = model.horizon();
    let variables = model.variables(horizon);
    if variables > options.max_variables {
        return Err(PolicyError::InvalidConfig(format!(
            "the offline model of {n} jobs over {horizon} slots of {} s has {variables} variables, \
             more than the {} allowed: take fewer jobs, a smaller cluster or longer slots",
            options.slot_s, options.max_variables
        )));
    }
    let relaxed = solve(&model, horizon, false)?;
    let (order, config_of) = model.round(&relaxed);
    let (order, config_of) = model.improve(order, config_of);
    let starts = model.list_schedule(&order, &config_of);
    let choice: Vec<(usize, usize)> = config_of.iter().copied().zip(starts).collect();
    let rounded = model.plan(&choice);
    let replay = |plan: &Plan| -> Result<Report, PolicyError> {
        simulate(
            trace,
            profiles,
            cluster,
            &Planned::new(plan),
            config,
            &mut (),
        )
    };
    let rounded_replay = replay(&rounded)?;
    // The exact plan is sought among plans that end by the rounding's end, if later than the
    // horizon, so that the rounding is one of them.
    let end = model.end(&choice).max(horizon);
    let exact = if model.variables(end) <= options.max_exact_variables {
        let plan = model.plan(&model.exact(end)?);
        let report = replay(&plan)?;
        Some((plan, report))
    } else {
        None
    };
    Ok(Offline {
        slot_s: options.slot_s,
        variables,
        horizon_slots: horizon,
        relaxation_mean_jct_s: relaxed.objective / n as f64,
        rounded,
        rounded_replay,
        exact,
    })
}

impl Model {
    /// Slots to the makespan of the shortest of a few greedy list schedules (release order,
    /// each job at the fewest GPUs within a factor of its fastest time).
    fn horizon(&self) -> usize {
        let n = self.configs.len();
        let mut by_release: Vec<usize> = (0..n).collect();
        by_release.sort_by_key(|&j| (self.release[j], j));
        [1.0, 1.1, 1.25, 1.5, 2.0, 3.0, f64::INFINITY]
            .into_iter()
            .map(|f| {
                let config = self.within(f);
                let start = self.list_schedule(&by_release, &config);
                self.end(&config.into_iter().zip(start).collect::<Vec<_>>())
            })
            .min()
            .expect("a factor")
    }

    /// The slot after the last of `choice` (job → configuration, start slot) ends.
    fn end(&self, choice: &[(usize, usize)]) -> usize {
        choice
            .iter()
            .enumerate()
            .map(|(j, &(c, s))| s + self.slots(&self.configs[j][c]))
            .max()
            .expect("a job")
    }

    /// The relaxation rounded: each job at its most-used configuration, in order of its LP
    /// mean completion (a share started after the horizon completing no sooner than there).
    fn round(&self, relaxed: &Solved) -> (Vec<usize>, Vec<usize>) {
        let n = self.configs.len();
        let mut mean_end: Vec<f64> = relaxed.tail.iter().map(|&(x, end)| x * end).collect();
        let mut weight: Vec<BTreeMap<usize, f64>> = vec![BTreeMap::new(); n];
        for &(j, c, s, x) in &relaxed.values {
            *weight[j].entry(c).or_default() += x;
            mean_end[j] += x * (s as f64 * self.slot_s + self.configs[j][c].duration_s);
        }
        let config_of = weight
            .iter()
            .map(|w| {
                w.iter()
                    .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
                    .map_or(0, |(c, _)| *c)
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| mean_end[a].total_cmp(&mean_end[b]).then(a.cmp(&b)));
        (order, config_of)
    }

    /// The best plan that ends within `horizon` slots, by branch and bound.
    fn exact(&self, horizon: usize) -> Result<Vec<(usize, usize)>, PolicyError> {
        let found = solve(self, horizon, true)?;
        let mut choice = vec![(0, 0); self.configs.len()];
        for &(j, c, s, x) in &found.values {
            if x > 0.5 {
                choice[j] = (c, s);
            }
        }
        Ok(choice)
    }
}

/// The model's jobs: release slots and configurations.
fn build(
    trace: &[TraceJob],
    profiles: &[AppProfile],
    cluster: &ClusterSpec,
    config: &SimConfig,
    slot_s: f64,
) -> Result<Model, PolicyError> {
    let planned = Planned::new(&Plan {
        jobs: Vec::new(),
        model_mean_jct_s: 0.0,
    });
    let setup = Setup::new(profiles, cluster, &planned, config)?;
    let world = &setup.world;
    let nodes_of: Vec<u32> = (0..world.per_node.len())
        .map(|t| world.node_type.iter().filter(|&&x| x == t).count() as u32)
        .collect();
    let mut model = Model {
        slot_s,
        release: Vec::new(),
        submit: Vec::new(),
        configs: Vec::new(),
        capacity: world.type_gpus.clone(),
    };
    for (i, j) in trace.iter().enumerate() {
        let state = setup.admit(i, j.clone())?;
        let first_round = (j.submit_s / config.round_s).ceil() * config.round_s;
        let mut configs = Vec::new();
        for (t, &type_gpus) in world.type_gpus.iter().enumerate() {
            let most = type_gpus.min(state.max_replicas);
            let packed = |r: u32| -> Vec<u32> {
                let p = world.per_node[t];
                let mut left = r;
                let mut out = Vec::new();
                while left > 0 && (out.len() as u32) < nodes_of[t] {
                    out.push(left.min(p));
                    left -= left.min(p);
                }
                out
            };
            match (&j.work, state.app) {
                (Work::Rigid { duration_s, .. }, _) => {
                    if state.requested <= type_gpus {
                        configs.push(Config {
                            worker_type: t,
                            replicas: state.requested,
                            duration_s: config.restart_penalty_s + duration_s,
                        });
                    }
                }
                (Work::Train { .. }, Some(a)) => {
                    let Some(gpu) = world.gpu[a][t] else { continue };
                    let app = &world.apps[a];
                    for r in 1..=most {
                        if let Some(s) = train_s(app, gpu, &packed(r), state.batch) {
                            configs.push(Config {
                                worker_type: t,
                                replicas: r,
                                duration_s: config.restart_penalty_s + s,
                            });
                        }
                    }
                }
                (Work::Train { .. }, None) => unreachable!("a training job has an application"),
            }
        }
        // Drop what another configuration of the same type beats on GPUs and time.
        let kept: Vec<Config> = configs
            .iter()
            .filter(|c| {
                !configs.iter().any(|o| {
                    o != *c
                        && o.worker_type == c.worker_type
                        && o.replicas <= c.replicas
                        && o.duration_s <= c.duration_s
                })
            })
            .cloned()
            .collect();
        if kept.is_empty() {
            return Err(PolicyError::InvalidConfig(format!(
                "job {}: no configuration on this cluster makes progress",
                j.name
            )));
        }
        model
            .release
            .push((first_round / slot_s - 1e-9).ceil() as usize);
        model.submit.push(j.submit_s);
        model.configs.push(kept);
    }
    Ok(model)
}

/// Seconds `app` trains to its end on `placement` of GPU `gpu` (a fixed total batch, or the
/// best configuration per epoch); `None` if some epoch makes no progress.
fn train_s(app: &App, gpu: usize, placement: &[u32], batch: Option<u32>) -> Option<f64> {
    let r: u32 = placement.iter().sum();
    let mut seconds = 0.0;
    for e in 0..app.max_epochs {
        let span = app.progress_at(e + 1) - app.progress_at(e);
        let g = match batch {
            Some(b) => app.goodput(gpu, placement, app.fixed_config(r, b), e),
            None => app.best_config(gpu, placement, e).1,
        };
        if g.is_nan() || g <= 0.0 {
            return None;
        }
        seconds += span / g;
    }
    Some(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::app::tests::toy_profile;
    use crate::sim::engine::tests::{arb_trace, rigid};
    use crate::sim::lower_bound;
    use proptest::prelude::*;

    fn no_penalty() -> SimConfig {
        SimConfig {
            restart_penalty_s: 0.0,
            ..SimConfig::default()
        }
    }

    #[test]
    fn the_exact_plan_runs_the_shortest_first_and_the_replay_meets_it() {
        // One node of 4, three jobs of all 4 GPUs at 0 (300, 60 and 120 s), slots of a round:
        // the best order is the shortest first (JCTs 60, 180, 480: mean 240), which FIFO's
        // trace order (300, 360, 480: mean 380) is not.
        let trace = [
            rigid("a", 0.0, 4, 300.0),
            rigid("b", 0.0, 4, 60.0),
            rigid("c", 0.0, 4, 120.0),
        ];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let config = no_penalty();
        let options = OfflineOptions {
            slot_s: 60.0,
            ..OfflineOptions::default()
        };
        let o = offline_plan(&trace, &[], &cluster, &config, &options).unwrap();
        let (plan, replay) = o.exact.as_ref().expect("small enough to solve exactly");
        let starts: Vec<f64> = plan.jobs.iter().map(|p| p.start_s).collect();
        assert_eq!(starts, [180.0, 0.0, 60.0]);
        assert_eq!(plan.model_mean_jct_s, 240.0);
        assert_eq!(replay.summary.mean_jct_s, 240.0);
        assert!(
            o.relaxation_mean_jct_s <= 240.0 + 1e-6,
            "{}",
            o.relaxation_mean_jct_s
        );
        assert_eq!(o.best_replay().summary.mean_jct_s, 240.0);
        let fifo = simulate(
            &trace,
            &[],
            &cluster,
            &crate::schedule::Fifo::default(),
            &config,
            &mut (),
        )
        .unwrap();
        assert_eq!(fifo.summary.mean_jct_s, 380.0);
    }

    #[test]
    fn a_plan_that_cannot_start_on_time_starts_at_the_next_round_with_room() {
        // Planned to start together on 4 GPUs, two jobs of 4: the second waits for the first.
        let trace = [rigid("a", 0.0, 4, 100.0), rigid("b", 0.0, 4, 100.0)];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let config = no_penalty();
        let plan = Plan {
            jobs: vec![
                PlannedJob {
                    worker_type: 0,
                    replicas: 4,
                    start_s: 0.0,
                    model_end_s: 100.0,
                };
                2
            ],
            model_mean_jct_s: 100.0,
        };
        let r = simulate(
            &trace,
            &[],
            &cluster,
            &Planned::new(&plan),
            &config,
            &mut (),
        )
        .unwrap();
        let starts: Vec<_> = r.jobs.iter().map(|j| j.start_s).collect();
        assert_eq!(starts, [Some(0.0), Some(120.0)]);
    }

    #[test]
    fn models_too_large_and_slots_off_the_rounds_are_refused_with_the_reason() {
        // Two jobs of the whole node, 3,030 s (51 slots) each: 102 slots, 52 starts each.
        let trace = [rigid("a", 0.0, 4, 3000.0), rigid("b", 0.0, 4, 3000.0)];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let config = SimConfig::default();
        let refused = |options: OfflineOptions| {
            offline_plan(&trace, &[], &cluster, &config, &options)
                .unwrap_err()
                .to_string()
        };
        let e = refused(OfflineOptions {
            slot_s: 90.0,
            ..OfflineOptions::default()
        });
        assert!(e.contains("not a multiple of the 60 s round"), "{e}");
        let e = refused(OfflineOptions {
            slot_s: 60.0,
            max_variables: 10,
            ..OfflineOptions::default()
        });
        assert!(
            e.contains("2 jobs over 102 slots of 60 s has 104 variables"),
            "{e}"
        );
        assert!(e.contains("more than the 10 allowed"), "{e}");
        let e = offline_plan(&[], &[], &cluster, &config, &OfflineOptions::default()).unwrap_err();
        assert!(e.to_string().contains("no jobs"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The relaxation is below the exact plan, the exact plan below the rounding (in the
        /// model); no plan's replay beats the lower bound; a plan never resizes a job.
        #[test]
        fn the_relaxation_the_exact_plan_and_the_rounding_are_in_order(
            trace in arb_trace().prop_map(|t| t.into_iter().take(6).collect::<Vec<_>>()),
            (nodes, per_node) in prop::sample::select(vec![(2usize, 4u32), (1, 8)]),
        ) {
            let cluster = ClusterSpec::uniform(nodes, per_node, "t4");
            let config = SimConfig::default();
            let options = OfflineOptions { slot_s: 120.0, ..OfflineOptions::default() };
            let o = offline_plan(&trace, &[toy_profile()], &cluster, &config, &options).unwrap();
            let (plan, replay) = o.exact.as_ref().expect("small");
            let eps = 1e-6 * plan.model_mean_jct_s;
            prop_assert!(o.relaxation_mean_jct_s <= plan.model_mean_jct_s + eps);
            prop_assert!(plan.model_mean_jct_s <= o.rounded.model_mean_jct_s + eps);
            let b = lower_bound(&trace, &[toy_profile()], &cluster, &config).unwrap();
            for r in [replay, &o.rounded_replay] {
                prop_assert_eq!(r.summary.finished, r.summary.jobs);
                prop_assert!(r.summary.mean_jct_s >= b.mean_jct_s - 1e-6 * b.mean_jct_s);
                for j in &r.jobs {
                    prop_assert_eq!(j.restarts, 0, "{:?}", j);
                }
            }
            for (p, j) in plan.jobs.iter().zip(&replay.jobs) {
                prop_assert_eq!(p.replicas, j.peak_replicas);
                prop_assert!(j.start_s.unwrap() >= p.start_s);
            }
        }
    }
}
