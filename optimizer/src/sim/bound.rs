//! A lower bound on what any scheduler can reach on a trace and cluster, for the what-if's
//! mean JCT, p99 JCT and makespan: the row every table sets beside the policies' (issue 45).
//!
//! * **Alone**, per job: a job joins at the first round at or after its submission, pays the
//!   restart penalty at least once, then trains each epoch no faster than the best goodput any
//!   placement on one GPU type of the cluster gives in that epoch (every GPU count up to the
//!   type's, every step time a placement over that type's nodes can have
//!   ([`App::step_time_classes`]), the best batch configuration or the fixed one its trainer
//!   or a fixed-batch scheduler uses); a rigid job runs its duration. Whatever the other jobs
//!   do, none finishes sooner, so each JCT is at least its job's bound and each order
//!   statistic of the JCTs (the p99 among them) at least the bound's.
//! * **Capacity**: in every epoch a job needs at least the fewest GPU-seconds per unit of
//!   progress any of those configurations gives (a rigid job its GPUs × duration). Any
//!   schedule of the cluster, seen as one machine of all its GPUs, gives each job at least
//!   that many GPU-seconds before it ends; on one machine, shortest remaining work first from
//!   each job's first round (SRPT) has the least total completion time there is, so its mean
//!   JCT bounds every schedule's, and its last completion the makespan.
//! * **Rate-capped** (mean JCT only, `rate_bound.rs`): capacity again, but with each
//!   job's speed capped at its own best rate, as a time-indexed LP; strongest under load.
//!
//! For each figure the largest is the bound. A property test replays random traces
//! under every scheduler and checks that none beats it (`tests` below).

use super::app::{App, Timed};
use super::rate_bound::{self, CappedJob};
use super::report::quantile;
use super::setup::Setup;
use super::{AppProfile, ClusterSpec, SimConfig, TraceJob, Work};
use crate::error::PolicyError;

/// The bound of one trace on one cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct LowerBound {
    /// Each job's least JCT (alone), in trace order.
    pub alone_s: Vec<f64>,
    /// Each job's least GPU-seconds, in trace order.
    pub work_gpu_s: Vec<f64>,
    pub mean_jct_s: f64,
    pub p99_jct_s: f64,
    /// From the first submission to the last completion.
    pub makespan_s: f64,
    /// The rate-capped LP's bound on the mean JCT (`rate_bound.rs`); `None` for a trace too
    /// large for it.
    pub rate_capped_mean_jct_s: Option<f64>,
    /// Which bound gave the mean JCT ("alone", "capacity" or "rate-capped") and the makespan
    /// ("alone" or "capacity").
    pub mean_from: &'static str,
    pub makespan_from: &'static str,
}

/// Per epoch, the best goodput and the fewest GPU-seconds per unit of progress of an
/// application under one batch choice (`None`: the best configuration of each placement).
pub(super) type EpochBest = Vec<(f64, f64)>;

/// The bound of `trace` on `cluster` under `config`'s rounds and restart penalty. A job the
/// replay would refuse (no profile for its application, a rigid job larger than any GPU type)
/// is refused here too, named.
pub fn lower_bound(
    trace: &[TraceJob],
    profiles: &[AppProfile],
    cluster: &ClusterSpec,
    config: &SimConfig,
) -> Result<LowerBound, PolicyError> {
    // The setup checks every job as a replay would (any scheduler: the sizes below are
    // every scheduler's).
    let scheduler = crate::schedule::Optimus::default();
    let setup = Setup::new(profiles, cluster, &scheduler, config)?;
    let world = &setup.world;
    let nodes_of = &setup.nodes_of;
    let mut caps: std::collections::HashMap<(usize, Option<u32>), Vec<Cap>> = Default::default();
    let (mut alone_s, mut work_gpu_s, mut release) = (Vec::new(), Vec::new(), Vec::new());
    let mut capped = Vec::new();
    for (i, j) in trace.iter().enumerate() {
        let state = setup.admit(i, j.clone())?;
        let first_round = (j.submit_s / config.round_s).ceil() * config.round_s;
        let wait = first_round - j.submit_s + config.restart_penalty_s;
        let mut configs = Vec::new();
        let (least_s, work) = match (&j.work, state.app) {
            (Work::Rigid { duration_s, .. }, _) => {
                for (t, &gpus) in world.type_gpus.iter().enumerate() {
                    if gpus >= state.requested {
                        configs.push((t, state.requested, 1.0));
                    }
                }
                (*duration_s, *duration_s * f64::from(state.requested))
            }
            (Work::Train { batch_size, .. }, Some(a)) => {
                let app = &world.apps[a];
                let choices = setup.batch_choices(a, *batch_size);
                for c in &choices {
                    let each = caps
                        .entry((a, *c))
                        .or_insert_with(|| rate_caps(app, &world.gpu[a], world, nodes_of, *c));
                    configs.extend(each.iter().copied());
                }
                let per_epoch: Vec<std::sync::Arc<EpochBest>> = choices
                    .into_iter()
                    .map(|c| setup.epoch_best(a, c))
                    .collect();
                train_bound(app, &per_epoch).ok_or_else(|| {
                    PolicyError::InvalidConfig(format!(
                        "job {}: no placement on this cluster gives {} progress",
                        j.name, app.name
                    ))
                })?
            }
            (Work::Train { .. }, None) => unreachable!("a training job has an application"),
        };
        alone_s.push(wait + least_s);
        capped.push(CappedJob {
            submit_s: j.submit_s,
            release_s: rate_bound::release(j.submit_s, config),
            alone_end_s: j.submit_s + wait + least_s,
            work: match (&j.work, state.app) {
                (Work::Rigid { duration_s, .. }, _) => *duration_s,
                (_, Some(a)) => world.apps[a].total_progress(),
                (_, None) => unreachable!("a training job has an application"),
            },
            configs,
        });
        // Its first start holds at least its least GPUs through the restart penalty.
        let least_gpus = match j.work {
            Work::Rigid { .. } => state.requested,
            Work::Train { .. } => 1,
        };
        work_gpu_s.push(work + f64::from(least_gpus) * config.restart_penalty_s);
        release.push(first_round);
    }
    let gpus: u32 = cluster.nodes.iter().map(|n| n.gpus).sum();
    let mut b = combine(trace, alone_s, work_gpu_s, &release, gpus);
    // The rate-capped LP, where it is stronger than both on the mean.
    let first = trace
        .iter()
        .map(|j| j.submit_s)
        .fold(f64::INFINITY, f64::min);
    let end = rate_bound::horizon(&capped, first + b.makespan_s);
    let capacity = rate_bound::type_capacity(cluster);
    let lp = rate_bound::rate_capped_mean(&capped, &capacity, end, rate_bound::SLOTS)?;
    b.rate_capped_mean_jct_s = lp;
    if let Some(lp) = lp.filter(|lp| *lp > b.mean_jct_s) {
        b.mean_jct_s = lp;
        b.mean_from = "rate-capped";
    }
    Ok(b)
}

/// (worker type, GPUs, best goodput in any epoch) of `app` for every size on every type of the
/// cluster, over the step-time classes of placement, with batch `choice`.
type Cap = (usize, u32, f64);

fn rate_caps(
    app: &App,
    gpu_of: &[Option<usize>],
    world: &super::world::World,
    nodes_of: &[u32],
    choice: Option<u32>,
) -> Vec<Cap> {
    let mut out = Vec::new();
    for (t, gpu) in gpu_of.iter().enumerate() {
        let Some(gpu) = *gpu else { continue };
        let most = world.type_gpus[t].min(app.max_replicas.unwrap_or(u32::MAX));
        for r in 1..=most {
            let mut best = 0.0f64;
            for p in app.step_time_classes(gpu, r, nodes_of[t], world.per_node[t]) {
                let timed = timed_configs(app, gpu, &p, choice);
                for e in 0..app.max_epochs {
                    best = best.max(goodput_of(app, &timed, e));
                }
            }
            if best > 0.0 {
                out.push((t, r, best));
            }
        }
    }
    out
}

/// The alone and capacity bounds put together.
fn combine(
    trace: &[TraceJob],
    alone_s: Vec<f64>,
    work_gpu_s: Vec<f64>,
    release: &[f64],
    gpus: u32,
) -> LowerBound {
    let n = trace.len().max(1) as f64;
    let mut sorted = alone_s.clone();
    sorted.sort_by(f64::total_cmp);
    let mean_alone = alone_s.iter().sum::<f64>() / n;
    let first = trace
        .iter()
        .map(|j| j.submit_s)
        .fold(f64::INFINITY, f64::min);
    let span_alone = trace
        .iter()
        .zip(&alone_s)
        .map(|(j, a)| j.submit_s + a)
        .fold(f64::NEG_INFINITY, f64::max)
        - first;
    let done = srpt(release, &work_gpu_s, f64::from(gpus.max(1)));
    let mean_capacity = trace
        .iter()
        .zip(&done)
        .map(|(j, c)| c - j.submit_s)
        .sum::<f64>()
        / n;
    let span_capacity = done.iter().copied().fold(f64::NEG_INFINITY, f64::max) - first;
    let pick = |alone: f64, capacity: f64| {
        if capacity > alone {
            (capacity, "capacity")
        } else {
            (alone, "alone")
        }
    };
    let (mean_jct_s, mean_from) = pick(mean_alone, mean_capacity);
    let (makespan_s, makespan_from) = pick(span_alone, span_capacity);
    LowerBound {
        rate_capped_mean_jct_s: None,
        p99_jct_s: quantile(&sorted, 0.99),
        alone_s,
        work_gpu_s,
        mean_jct_s,
        makespan_s,
        mean_from,
        makespan_from,
    }
}

/// Completion times of jobs released at `release` needing `work` on one machine of speed
/// `speed`, shortest remaining work first (preemptive).
fn srpt(release: &[f64], work: &[f64], speed: f64) -> Vec<f64> {
    use ordered_float::OrderedFloat;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    /// Work left, then the job's index.
    type Left = (OrderedFloat<f64>, usize);
    let mut order: Vec<usize> = (0..release.len()).collect();
    order.sort_by(|&a, &b| release[a].total_cmp(&release[b]).then(a.cmp(&b)));
    let mut done = vec![0.0; release.len()];
    let mut queue: BinaryHeap<Reverse<Left>> = BinaryHeap::new();
    let (mut t, mut next) = (f64::NEG_INFINITY, 0);
    while next < order.len() || !queue.is_empty() {
        if queue.is_empty() {
            t = t.max(release[order[next]]);
        }
        while next < order.len() && release[order[next]] <= t {
            let j = order[next];
            queue.push(Reverse((OrderedFloat(work[j] / speed), j)));
            next += 1;
        }
        let Reverse((OrderedFloat(left), j)) = queue.pop().expect("a job is queued");
        let until = order.get(next).map_or(f64::INFINITY, |&k| release[k]);
        if t + left <= until {
            t += left;
            done[j] = t;
        } else {
            queue.push(Reverse((OrderedFloat(left - (until - t)), j)));
            t = until;
        }
    }
    done
}

/// Per epoch of `app`, the best goodput and the fewest GPU-seconds per unit of progress on
/// any GPU type of the cluster (`gpu_of[t]`: the app's index of type `t`), any count and any
/// step-time class of placement, with batch `choice`.
pub(super) fn epoch_best(
    app: &App,
    gpu_of: &[Option<usize>],
    world: &super::world::World,
    nodes_of: &[u32],
    choice: Option<u32>,
) -> EpochBest {
    let mut placements: Vec<(usize, Vec<u32>)> = Vec::new();
    for (t, gpu) in gpu_of.iter().enumerate() {
        let Some(gpu) = *gpu else { continue };
        let most = world.type_gpus[t].min(app.max_replicas.unwrap_or(u32::MAX));
        for r in 1..=most {
            for p in app.step_time_classes(gpu, r, nodes_of[t], world.per_node[t]) {
                placements.push((gpu, p));
            }
        }
    }
    let timed: Vec<(u32, Vec<Timed>)> = placements
        .iter()
        .map(|(gpu, p)| (p.iter().sum(), timed_configs(app, *gpu, p, choice)))
        .collect();
    (0..app.max_epochs)
        .map(|e| {
            let (mut best, mut least) = (0.0f64, f64::INFINITY);
            for (r, configs) in &timed {
                let g = goodput_of(app, configs, e);
                if g > 0.0 {
                    best = best.max(g);
                    least = least.min(f64::from(*r) / g);
                }
            }
            (best, least)
        })
        .collect()
}

/// The configurations of batch `choice` on placement `p` of GPU `gpu`, each timed once: only
/// the gradient statistics change with the epoch ([`goodput_of`]). With no choice, those
/// `App::best_config` tries, or its fallback where none is usable.
fn timed_configs(app: &App, gpu: usize, p: &[u32], choice: Option<u32>) -> Vec<Timed> {
    let r: u32 = p.iter().sum();
    let configs = match choice {
        Some(b) => vec![app.fixed_config(r, b)],
        None => match app.candidates(p) {
            (c, fallback) if c.is_empty() => vec![fallback],
            (c, _) => c,
        },
    };
    configs
        .into_iter()
        .filter_map(|c| app.timed(gpu, p, c))
        .collect()
}

/// The goodput in `epoch` of the best of a placement's timed configurations: what
/// `App::goodput` (one choice) or `App::best_config` (none) gives there.
fn goodput_of(app: &App, timed: &[Timed], epoch: u32) -> f64 {
    timed
        .iter()
        .map(|t| app.goodput_timed(t, epoch))
        .fold(0.0, f64::max)
}

/// A training job's least seconds and least GPU-seconds from the per-epoch bests of each
/// batch choice it may get; `None` if some epoch makes no progress anywhere.
fn train_bound(app: &App, per_epoch: &[std::sync::Arc<EpochBest>]) -> Option<(f64, f64)> {
    let (mut seconds, mut work) = (0.0, 0.0);
    for e in 0..app.max_epochs {
        let span = app.progress_at(e + 1) - app.progress_at(e);
        let best = per_epoch
            .iter()
            .map(|c| c[e as usize].0)
            .fold(0.0, f64::max);
        let least = per_epoch
            .iter()
            .map(|c| c[e as usize].1)
            .fold(f64::INFINITY, f64::min);
        if best <= 0.0 {
            return None;
        }
        seconds += span / best;
        work += span * least;
    }
    Some((seconds, work))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{BatchSizing, Scheduler};
    use crate::sim::app::tests::toy_profile;
    use crate::sim::engine::tests::{all, arb_trace, fastest_toy_s, job, rigid};
    use crate::sim::simulate;
    use proptest::prelude::*;

    /// Within float noise.
    fn at_least(got: f64, bound: f64) -> bool {
        got >= bound - 1e-6 * bound.abs().max(1.0)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// No scheduler's replay beats the bound: not a job's JCT its alone bound, not the
        /// mean, the p99 or the makespan theirs.
        #[test]
        fn no_replay_beats_the_bound(trace in arb_trace(), nodes in 2usize..=3) {
            // Two nodes: jobs queue, and the capacity bound is the one that binds.
            let cluster = ClusterSpec::uniform(nodes, 4, "t4");
            let config = SimConfig::default();
            let b = lower_bound(&trace, &[toy_profile()], &cluster, &config).unwrap();
            for s in all() {
                let r = simulate(&trace, &[toy_profile()], &cluster, &s, &config, &mut ()).unwrap();
                prop_assume!(r.summary.finished == r.summary.jobs);
                for (j, alone) in r.jobs.iter().zip(&b.alone_s) {
                    let jct = j.jct_s().unwrap();
                    prop_assert!(at_least(jct, *alone), "{}: {} {jct} < {alone}", s.name(), j.name);
                }
                // Each job's account starts from the same alone bound, and adds up to its JCT;
                // without faults no work is done twice.
                for (j, alone) in r.jobs.iter().zip(&b.alone_s) {
                    let a = j.account;
                    let floor = (a.floor_s + a.least_s - alone).abs();
                    prop_assert!(floor < 1e-6 * alone, "{}: {} {a:?} against {alone}", s.name(), j.name);
                    prop_assert!((a.total() - j.jct_s().unwrap()).abs() < 1e-6 * alone);
                    prop_assert!(a.faults_s.abs() < 1e-6 * alone, "{}: {} {a:?}", s.name(), j.name);
                }
                let m = &r.summary;
                prop_assert!((m.mean_account.total() - m.mean_jct_s).abs() < 1e-6 * m.mean_jct_s);
                prop_assert!(at_least(m.mean_jct_s, b.mean_jct_s), "{} mean {} < {b:?}", s.name(), m.mean_jct_s);
                prop_assert!(at_least(m.p99_jct_s, b.p99_jct_s), "{} p99 {} < {b:?}", s.name(), m.p99_jct_s);
                prop_assert!(at_least(m.makespan_s, b.makespan_s), "{} makespan {} < {b:?}", s.name(), m.makespan_s);
            }
        }
    }

    #[test]
    fn the_step_time_classes_find_the_best_goodput_every_placement_gives() {
        // Against every placement of every size on 3 nodes of 4, enumerated.
        let cluster = ClusterSpec::uniform(3, 4, "t4");
        let config = SimConfig::default();
        for batch in [8, 64] {
            let trace = [job("a", 0.0, 1, batch)];
            let b = lower_bound(&trace, &[toy_profile()], &cluster, &config).unwrap();
            let fastest = [BatchSizing::Fixed, BatchSizing::Adaptive]
                .map(|s| fastest_toy_s(3, batch, s))
                .into_iter()
                .fold(f64::INFINITY, f64::min);
            let wait = config.restart_penalty_s;
            assert!(
                (b.alone_s[0] - wait - fastest).abs() < 1e-9 * fastest,
                "{b:?} {fastest}"
            );
        }
    }

    /// The replay of rigid jobs `trace` under FIFO.
    fn fifo(trace: &[TraceJob], cluster: &ClusterSpec, config: &SimConfig) -> crate::sim::Report {
        let fifo = crate::schedule::Fifo::default();
        simulate(trace, &[], cluster, &fifo, config, &mut ()).unwrap()
    }

    #[test]
    fn jobs_queued_for_the_whole_cluster_meet_the_capacity_bound() {
        // Three rigid jobs of every GPU, 100 s each, at once; rounds of 10 s, no penalty:
        // FIFO runs them back to back, as shortest-remaining-first on one machine would.
        let trace: Vec<TraceJob> = (0..3)
            .map(|i| rigid(&format!("r{i}"), 0.0, 4, 100.0))
            .collect();
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let config = SimConfig {
            round_s: 10.0,
            restart_penalty_s: 0.0,
            ..SimConfig::default()
        };
        let b = lower_bound(&trace, &[], &cluster, &config).unwrap();
        assert_eq!((b.mean_from, b.makespan_from), ("capacity", "capacity"));
        assert_eq!((b.mean_jct_s, b.makespan_s), (200.0, 300.0));
        let r = fifo(&trace, &cluster, &config);
        assert_eq!((r.summary.mean_jct_s, r.summary.makespan_s), (200.0, 300.0));
    }

    #[test]
    fn a_lone_rigid_job_meets_its_bound_so_no_tighter_one_is_valid() {
        // FIFO runs a lone rigid job as soon as it may: its JCT is the bound, to the float.
        let trace = [rigid("r", 30.0, 2, 500.0)];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let config = SimConfig::default();
        let b = lower_bound(&trace, &[], &cluster, &config).unwrap();
        let r = fifo(&trace, &cluster, &config);
        assert!(
            (r.summary.mean_jct_s - b.mean_jct_s).abs() < 1e-9,
            "{b:?} {:?}",
            r.summary
        );
        assert!(!at_least(r.summary.mean_jct_s, b.mean_jct_s + 1.0));
    }

    #[test]
    fn under_load_the_rate_capped_bound_is_the_strongest_and_no_scheduler_beats_it() {
        // Eight jobs of one GPU for 100 s at once on one node of 4: at best four run, then
        // four (mean 150 s of work and wait). The capacity bound runs them one by one at the
        // node's four GPUs (mean 112.5 s); capped at one GPU's rate, the LP finds the queue.
        let trace: Vec<TraceJob> = (0..8)
            .map(|i| rigid(&format!("r{i}"), 0.0, 1, 100.0))
            .collect();
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let config = SimConfig::default();
        let b = lower_bound(&trace, &[], &cluster, &config).unwrap();
        assert_eq!(b.mean_from, "rate-capped", "{b:?}");
        let penalty = config.restart_penalty_s;
        assert!(
            b.mean_jct_s > penalty + 140.0 && b.mean_jct_s <= penalty + 150.0,
            "{b:?}"
        );
        for s in all() {
            let r = simulate(&trace, &[], &cluster, &s, &config, &mut ()).unwrap();
            assert!(
                at_least(r.summary.mean_jct_s, b.mean_jct_s),
                "{} {} < {b:?}",
                s.name(),
                r.summary.mean_jct_s
            );
        }
    }

    #[test]
    fn srpt_serves_the_shortest_remaining_work_first() {
        // One machine: job 0 (10 s) at 0, job 1 (2 s) at 1 preempts it, job 2 (5 s) at 20.
        let done = srpt(&[0.0, 1.0, 20.0], &[10.0, 2.0, 5.0], 1.0);
        assert_eq!(done, [12.0, 3.0, 25.0]);
        // Twice the speed: half the times.
        let done = srpt(&[0.0], &[10.0], 2.0);
        assert_eq!(done, [5.0]);
    }

    #[test]
    fn a_rigid_job_alone_waits_for_its_round_pays_the_penalty_and_runs_its_duration() {
        let trace = vec![TraceJob {
            name: "r".into(),
            submit_s: 10.0,
            requested_replicas: 2,
            work: Work::Rigid {
                duration_s: 100.0,
                label: "x".into(),
            },
        }];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let config = SimConfig::default();
        let b = lower_bound(&trace, &[], &cluster, &config).unwrap();
        let wait = config.round_s - 10.0 + config.restart_penalty_s;
        assert_eq!(b.alone_s, [wait + 100.0]);
        assert_eq!(b.work_gpu_s, [200.0 + 2.0 * config.restart_penalty_s]);
        assert_eq!(b.mean_jct_s, wait + 100.0);
        assert_eq!((b.mean_from, b.makespan_from), ("alone", "alone"));
    }
}
