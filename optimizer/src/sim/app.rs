//! The ground truth of one application in a simulation: how long a step takes in a placement
//! (measured step and synchronisation times, interpolated) and how much a step of a given batch
//! size is worth (the gradient statistics of measured training curves), as in Pollux's artifact.
//!
//! Progress is counted in steps at the initial batch size: a step at batch `B` adds the
//! statistical gain `(var + sqr) / (var / s + sqr)` with `s = B / B₀`, and an epoch ends when
//! progress reaches the curve's. A job finishes after `max_epochs` epochs.
//!
//! Step times: a placement measured as such (GPUs per node, in any rotation) is interpolated in
//! the local batch size; any other is read from a [`MeasuredTable`] of all measurements by
//! (nodes, replicas, local batch size), for the step and for its compute part alike.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::throughput::table::{MeasuredTable, piecewise};
use crate::throughput::{Placement as ModelPlacement, StepSample, ThroughputModel};

/// One measured configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    /// GPUs on each node used, when the measurement names its placement (`[2, 2]` = two nodes
    /// with two GPUs each); `None` for a measurement known only by its node and replica counts.
    pub placement: Option<Vec<u32>>,
    pub nodes: u32,
    pub replicas: u32,
    pub local_bsz: f64,
    pub step_time: f64,
    pub sync_time: f64,
}

/// One epoch of a training curve at one batch size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurveRow {
    /// Progress (steps at the initial batch size) at the end of the epoch.
    pub progress: f64,
    pub iteration: f64,
    pub metric: f64,
    pub grad_sqr: f64,
    pub grad_var: f64,
}

/// Limits the application's trainer imposes; `None` takes the value the data implies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppLimits {
    pub init_batch_size: Option<u32>,
    pub max_batch_size: Option<u32>,
    pub min_local_bsz: Option<u32>,
    pub max_local_bsz: Option<u32>,
    pub max_epochs: Option<u32>,
    /// The most GPUs the application's trainer can use (Pollux's artifact runs NCF on one).
    pub max_replicas: Option<u32>,
    /// A total batch size the application always trains with, whatever the scheduler.
    pub fixed_batch_size: Option<u32>,
}

/// Everything measured about an application, per GPU type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppProfile {
    pub name: String,
    /// Step measurements per GPU type (worker type name).
    pub steps: BTreeMap<String, Vec<StepRow>>,
    /// Training curves per total batch size.
    pub curves: BTreeMap<u32, Vec<CurveRow>>,
    pub limits: AppLimits,
}

/// A batch configuration: `replicas × atomic_bsz × (accum_steps + 1)` samples per step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchConfig {
    pub atomic_bsz: u32,
    pub accum_steps: u32,
}

struct GpuSteps {
    /// Normalised placement → (local bsz, step, sync), sorted by bsz.
    exact: HashMap<Vec<u32>, Vec<(f64, f64, f64)>>,
    step: MeasuredTable,
    compute: MeasuredTable,
}

/// (GPU type, normalised placement, atomic batch size).
type StepKey = (usize, Vec<u32>, u32);

/// (GPU type, normalised placement, epoch up to the last): what [`App::best_config`] answers
/// for.
type BestKey = (usize, Vec<u32>, u32);

/// An [`AppProfile`] made ready to answer quickly. Answers are memoised, so an `App` belongs to
/// one simulation at a time (it is `Send`, not `Sync`).
pub struct App {
    pub name: String,
    pub init_batch_size: u32,
    pub max_batch_size: u32,
    pub min_local_bsz: u32,
    pub max_local_bsz: u32,
    pub max_epochs: u32,
    pub max_replicas: Option<u32>,
    pub fixed_batch_size: Option<u32>,
    gpus: BTreeMap<String, GpuSteps>,
    curves: Vec<(u32, Vec<CurveRow>)>,
    /// Progress at the end of each epoch (index e = after e epochs), the least over the curves.
    epoch_progress: Vec<f64>,
    cache: RefCell<HashMap<StepKey, (f64, f64)>>,
    best: RefCell<HashMap<BestKey, (BatchConfig, f64)>>,
}

/// A placement of `r` GPUs on exactly `k` nodes of at most `per_node` each that `measured`
/// does not name, the most packed first; `None` when every one is measured.
fn unmeasured_partition(
    r: u32,
    k: u32,
    per_node: u32,
    measured: impl Fn(&[u32]) -> bool,
) -> Option<Vec<u32>> {
    // Non-increasing parts, each from 1 to per_node, summing to r.
    fn walk(
        left: u32,
        slots: u32,
        cap: u32,
        part: &mut Vec<u32>,
        found: &mut dyn FnMut(&[u32]) -> bool,
    ) -> bool {
        if slots == 0 {
            return left == 0 && found(part);
        }
        let most = cap.min(left.saturating_sub(slots - 1));
        let least = left.div_ceil(slots);
        for g in (least..=most).rev() {
            part.push(g);
            if walk(left - g, slots - 1, g, part, found) {
                return true;
            }
            part.pop();
        }
        false
    }
    if k == 0 || r < k || r > k * per_node {
        return None;
    }
    let mut answer = None;
    let mut part = Vec::with_capacity(k as usize);
    walk(r, k, per_node, &mut part, &mut |p| {
        if measured(p) {
            return false;
        }
        answer = Some(p.to_vec());
        true
    });
    answer
}

/// The lexicographically smallest rotation without empty nodes, as the measurements name it.
/// The rotations are compared in place; only the answer is allocated (this runs for every
/// goodput the simulator asks for).
fn normalise(placement: &[u32]) -> Vec<u32> {
    let p: Vec<u32> = placement.iter().copied().filter(|&g| g > 0).collect();
    let rotation = |i: usize| p[i..].iter().chain(&p[..i]);
    let least = (1..p.len()).fold(0, |best, i| {
        if rotation(i).lt(rotation(best)) {
            i
        } else {
            best
        }
    });
    rotation(least).copied().collect()
}

impl App {
    pub fn new(profile: &AppProfile) -> Result<App, PolicyError> {
        let bad =
            |m: String| PolicyError::InvalidConfig(format!("application {}: {m}", profile.name));
        if profile.curves.is_empty() {
            return Err(bad("no training curves".into()));
        }
        if profile.steps.values().all(Vec::is_empty) {
            return Err(bad("no step-time measurements".into()));
        }
        let all_bsz = profile.steps.values().flatten().map(|r| r.local_bsz);
        let min_local = all_bsz.clone().fold(f64::INFINITY, f64::min);
        let max_local = all_bsz.fold(0.0, f64::max);
        let l = &profile.limits;
        let init_batch_size = l
            .init_batch_size
            .unwrap_or(*profile.curves.keys().next().unwrap());
        let max_batch_size = l
            .max_batch_size
            .unwrap_or(*profile.curves.keys().last().unwrap());
        let min_local_bsz = l.min_local_bsz.unwrap_or(min_local.ceil() as u32).max(1);
        let max_local_bsz = l.max_local_bsz.unwrap_or(max_local.floor() as u32);
        let shortest = profile.curves.values().map(Vec::len).min().unwrap_or(0) as u32;
        let max_epochs = l.max_epochs.unwrap_or(shortest);
        if max_epochs == 0 || max_epochs > shortest {
            return Err(bad(format!(
                "max_epochs {max_epochs}, but the shortest curve has {shortest} epochs"
            )));
        }
        if init_batch_size > max_batch_size || min_local_bsz > max_local_bsz {
            return Err(bad(format!(
                "batch sizes: initial {init_batch_size}, max {max_batch_size}, local {min_local_bsz}..{max_local_bsz}"
            )));
        }
        if max_batch_size < min_local_bsz {
            return Err(bad(format!(
                "max batch size {max_batch_size} below the least local batch size {min_local_bsz}"
            )));
        }
        let mut gpus = BTreeMap::new();
        for (gpu, rows) in &profile.steps {
            if rows.is_empty() {
                continue;
            }
            let mut exact: HashMap<Vec<u32>, Vec<(f64, f64, f64)>> = HashMap::new();
            let mut samples = Vec::new();
            let mut compute = Vec::new();
            for r in rows {
                if !(r.step_time > 0.0 && r.sync_time >= 0.0 && r.sync_time <= r.step_time) {
                    return Err(bad(format!(
                        "{gpu}: step time {} with sync time {}",
                        r.step_time, r.sync_time
                    )));
                }
                if let Some(p) = &r.placement {
                    exact.entry(normalise(p)).or_default().push((
                        r.local_bsz,
                        r.step_time,
                        r.sync_time,
                    ));
                }
                let placement = ModelPlacement {
                    ps: 0,
                    nodes: r.nodes,
                    replicas: r.replicas,
                    local_bsz: r.local_bsz,
                };
                samples.push(StepSample {
                    placement,
                    step_time: r.step_time,
                    sync_time: None,
                });
                compute.push(StepSample {
                    placement,
                    step_time: (r.step_time - r.sync_time).max(1e-9),
                    sync_time: None,
                });
            }
            for v in exact.values_mut() {
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            let fit =
                |s: &[StepSample]| MeasuredTable::fit(s).map_err(|e| bad(format!("{gpu}: {e}")));
            gpus.insert(
                gpu.clone(),
                GpuSteps {
                    exact,
                    step: fit(&samples)?,
                    compute: fit(&compute)?,
                },
            );
        }
        let curves: Vec<(u32, Vec<CurveRow>)> = profile
            .curves
            .iter()
            .map(|(b, c)| (*b, c.clone()))
            .collect();
        let epoch_progress = (0..=max_epochs as usize)
            .map(|e| {
                if e == 0 {
                    0.0
                } else {
                    curves
                        .iter()
                        .map(|(_, c)| c[e - 1].progress)
                        .fold(f64::INFINITY, f64::min)
                }
            })
            .collect();
        Ok(App {
            name: profile.name.clone(),
            init_batch_size,
            max_batch_size,
            min_local_bsz,
            max_local_bsz,
            max_epochs,
            max_replicas: l.max_replicas,
            fixed_batch_size: l.fixed_batch_size,
            gpus,
            curves,
            epoch_progress,
            cache: RefCell::new(HashMap::new()),
            best: RefCell::new(HashMap::new()),
        })
    }

    /// The GPU types this application has measurements for, in name order.
    pub fn gpu_types(&self) -> impl Iterator<Item = &str> {
        self.gpus.keys().map(String::as_str)
    }

    /// Progress needed to finish `epochs` epochs.
    pub fn progress_at(&self, epochs: u32) -> f64 {
        self.epoch_progress[epochs.min(self.max_epochs) as usize]
    }

    /// Progress needed to finish the job.
    pub fn total_progress(&self) -> f64 {
        self.progress_at(self.max_epochs)
    }

    /// Placements of `r` GPUs of type `gpu` on at most `nodes` nodes of at most `per_node`
    /// GPUs each that, between them, have every step time any such placement has: each
    /// measured placement that fits, and for each node count one that is not measured (the
    /// others of that count read the same row of the measurement table). What a bound on the
    /// best goodput has to look at, without enumerating every placement.
    pub fn step_time_classes(
        &self,
        gpu: usize,
        r: u32,
        nodes: u32,
        per_node: u32,
    ) -> Vec<Vec<u32>> {
        let Some(steps) = self.gpus.values().nth(gpu) else {
            return Vec::new();
        };
        let per_node = per_node.max(1);
        let mut out: Vec<Vec<u32>> = steps
            .exact
            .keys()
            .filter(|p| {
                p.iter().sum::<u32>() == r
                    && p.len() as u32 <= nodes
                    && p.iter().all(|&g| g <= per_node)
            })
            .cloned()
            .collect();
        for k in r.div_ceil(per_node)..=r.min(nodes) {
            if let Some(p) =
                unmeasured_partition(r, k, per_node, |p| steps.exact.contains_key(&normalise(p)))
            {
                out.push(p);
            }
        }
        out
    }

    /// (step time, sync time) in seconds on GPU type `gpu` (index among [`App::gpu_types`]).
    pub fn step_time(&self, gpu: usize, placement: &[u32], atomic_bsz: u32) -> Option<(f64, f64)> {
        let key = (gpu, normalise(placement), atomic_bsz);
        if let Some(v) = self.cache.borrow().get(&key) {
            return Some(*v);
        }
        let steps = self.gpus.values().nth(gpu)?;
        let bsz = atomic_bsz as f64;
        let v = match steps.exact.get(&key.1) {
            Some(pts) => {
                let step: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.1)).collect();
                let sync: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.2)).collect();
                let linear = |x: f64, (x0, y0): (f64, f64)| y0 * x / x0;
                let s = piecewise(bsz, &step, 0.0, linear).max(1e-9);
                let y = piecewise(bsz, &sync, f64::NEG_INFINITY, |_, (_, y0)| y0).clamp(0.0, s);
                (s, y)
            }
            None => {
                let p = ModelPlacement {
                    ps: 0,
                    nodes: (key.1.len() as u32).min(16),
                    replicas: key.1.iter().sum(),
                    local_bsz: bsz,
                };
                let s = steps.step.step_time(&p);
                let c = steps.compute.step_time(&p).min(s);
                (s, s - c)
            }
        };
        self.cache.borrow_mut().insert(key, v);
        Some(v)
    }

    /// Gradient (squared norm, variance) at total batch `batch` during epoch `epoch`, linear
    /// between the measured batch sizes around it.
    pub fn grad_stats(&self, batch: f64, epoch: u32) -> (f64, f64) {
        let e = (epoch.min(self.max_epochs - 1)) as usize;
        let at = |i: usize| (self.curves[i].1[e].grad_sqr, self.curves[i].1[e].grad_var);
        let upper = self.curves.partition_point(|(b, _)| (*b as f64) < batch);
        if upper == 0 {
            return at(0);
        }
        if upper >= self.curves.len() {
            return at(self.curves.len() - 1);
        }
        let (b0, b1) = (self.curves[upper - 1].0 as f64, self.curves[upper].0 as f64);
        let ((s0, v0), (s1, v1)) = (at(upper - 1), at(upper));
        let w = (batch - b0) / (b1 - b0);
        (s0 + w * (s1 - s0), v0 + w * (v1 - v0))
    }

    /// Progress per second with `config` on `placement` during `epoch`.
    pub fn goodput(&self, gpu: usize, placement: &[u32], config: BatchConfig, epoch: u32) -> f64 {
        self.timed(gpu, placement, config)
            .map_or(0.0, |t| self.goodput_timed(&t, epoch))
    }

    /// What [`App::goodput`] needs of `config` on `placement` that does not change with the
    /// epoch: its step and sync times and its total batch; `None` where it makes no progress.
    pub(crate) fn timed(
        &self,
        gpu: usize,
        placement: &[u32],
        config: BatchConfig,
    ) -> Option<Timed> {
        let replicas: u32 = placement.iter().sum();
        if replicas == 0 || config.atomic_bsz == 0 {
            return None;
        }
        let (step, sync) = self.step_time(gpu, placement, config.atomic_bsz)?;
        Some(Timed {
            step,
            sync,
            batch: (replicas * config.atomic_bsz * (config.accum_steps + 1)) as f64,
            accum_steps: config.accum_steps,
        })
    }

    /// [`App::goodput`] during `epoch` of a configuration already timed.
    pub(crate) fn goodput_timed(&self, t: &Timed, epoch: u32) -> f64 {
        let scale = t.batch / self.init_batch_size as f64;
        let (sqr, var) = self.grad_stats(t.batch, epoch);
        let denom = var / scale + sqr;
        let gain = if denom > 0.0 {
            (var + sqr) / denom
        } else {
            1.0
        };
        gain / (t.step + (t.step - t.sync) * t.accum_steps as f64)
    }

    /// The batch configuration a job with a fixed total batch size runs on `replicas` GPUs.
    pub fn fixed_config(&self, replicas: u32, batch_size: u32) -> BatchConfig {
        let r = replicas.max(1);
        let local = batch_size.div_ceil(r);
        let mut accum = local.div_ceil(self.max_local_bsz).saturating_sub(1);
        if r == 1 && batch_size > self.init_batch_size {
            accum = accum.max(1);
        }
        let atomic = local.div_ceil(accum + 1);
        self.capped(r, atomic, accum)
    }

    fn capped(&self, replicas: u32, atomic: u32, accum: u32) -> BatchConfig {
        let cap = self.max_batch_size / (replicas * (accum + 1)).max(1);
        BatchConfig {
            atomic_bsz: atomic.min(cap).max(1),
            accum_steps: accum,
        }
    }

    /// The batch configuration with the most goodput on `placement` during `epoch` (Pollux's
    /// co-adaptation): 50 total batch sizes spaced geometrically from the least usable to the
    /// largest, with gradient accumulation past the largest local batch.
    /// Memoised: the answer depends only on the GPU type, the placement as the measurements
    /// name it, and the epoch (past the last, the last's).
    pub fn best_config(&self, gpu: usize, placement: &[u32], epoch: u32) -> (BatchConfig, f64) {
        let key = (
            gpu,
            normalise(placement),
            epoch.min(self.max_epochs.saturating_sub(1)),
        );
        if let Some(v) = self.best.borrow().get(&key) {
            return *v;
        }
        let v = self.search_config(gpu, placement, epoch);
        self.best.borrow_mut().insert(key, v);
        v
    }

    /// [`App::best_config`] worked out.
    fn search_config(&self, gpu: usize, placement: &[u32], epoch: u32) -> (BatchConfig, f64) {
        let (candidates, fallback) = self.candidates(placement);
        let mut best = (fallback, -1.0);
        for config in candidates {
            let g = self.goodput(gpu, placement, config, epoch);
            if g > best.1 {
                best = (config, g);
            }
        }
        if best.1 < 0.0 {
            let g = self.goodput(gpu, placement, best.0, epoch);
            best.1 = g;
        }
        best
    }

    /// The configurations [`App::best_config`] tries on `placement`, and the one it falls back
    /// to where none is usable.
    pub(crate) fn candidates(&self, placement: &[u32]) -> (Vec<BatchConfig>, BatchConfig) {
        let r: u32 = placement.iter().sum::<u32>().max(1);
        let lo = (self.init_batch_size as f64).max((self.min_local_bsz * r) as f64);
        let hi = (self.max_batch_size as f64).max(lo);
        let fallback = self.fixed_config(r, lo.ceil() as u32);
        const CANDIDATES: usize = 50;
        let mut out = Vec::with_capacity(CANDIDATES);
        for i in 0..CANDIDATES {
            let batch = lo * (hi / lo).powf(i as f64 / (CANDIDATES - 1) as f64);
            let local = batch / r as f64;
            let mut accum =
                ((local / self.max_local_bsz as f64 - 1e-8).ceil() as u32).saturating_sub(1);
            if r == 1 && local > self.init_batch_size as f64 + 1e-8 {
                accum = accum.max(1);
            }
            let atomic = (local / (accum + 1) as f64 - 1e-8).ceil() as u32;
            if atomic < self.min_local_bsz || atomic > self.max_local_bsz {
                continue;
            }
            out.push(self.capped(r, atomic, accum));
        }
        (out, fallback)
    }
}

/// A batch configuration on a placement, timed: what its goodput in any epoch follows from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timed {
    step: f64,
    sync: f64,
    batch: f64,
    accum_steps: u32,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn toy_profile() -> AppProfile {
        // Compute 0.1 s + 0.01 s per sample; sync 0.05 s within a node, 0.2 s across nodes.
        let mut rows = Vec::new();
        for placement in [vec![1], vec![2], vec![4], vec![2, 2], vec![4, 4]] {
            for bsz in [8.0, 16.0, 32.0] {
                let replicas: u32 = placement.iter().sum();
                let sync = match (placement.len(), replicas) {
                    (_, 1) => 0.0,
                    (1, _) => 0.05,
                    _ => 0.2,
                };
                rows.push(StepRow {
                    nodes: placement.len() as u32,
                    replicas,
                    placement: Some(placement.clone()),
                    local_bsz: bsz,
                    step_time: 0.1 + 0.01 * bsz + sync,
                    sync_time: sync,
                });
            }
        }
        let curve = |scale: f64, var: f64| {
            (1..=4)
                .map(|e| CurveRow {
                    progress: 100.0 * e as f64,
                    iteration: 100.0 * e as f64 / scale,
                    metric: e as f64,
                    grad_sqr: 1.0,
                    grad_var: var,
                })
                .collect::<Vec<_>>()
        };
        AppProfile {
            name: "toy".into(),
            steps: BTreeMap::from([("t4".to_string(), rows)]),
            curves: BTreeMap::from([(8, curve(1.0, 8.0)), (64, curve(4.0, 8.0))]),
            limits: AppLimits::default(),
        }
    }

    #[test]
    fn placements_are_named_by_their_smallest_rotation() {
        assert_eq!(normalise(&[2, 1, 0, 3]), vec![1, 3, 2]);
        assert_eq!(normalise(&[4]), vec![4]);
        assert_eq!(normalise(&[]), Vec::<u32>::new());
        assert_eq!(normalise(&[3, 1, 2, 1, 1]), vec![1, 1, 3, 1, 2]);
        assert_eq!(normalise(&[2, 2, 0, 2]), vec![2, 2, 2]);
    }

    #[test]
    fn the_best_config_is_the_same_asked_again_and_for_a_rotation() {
        let app = App::new(&toy_profile()).unwrap();
        for epoch in [0, 1, app.max_epochs, app.max_epochs + 5] {
            let first = app.best_config(0, &[2, 1], epoch);
            assert_eq!(first, app.search_config(0, &[2, 1], epoch));
            assert_eq!(app.best_config(0, &[1, 0, 2], epoch), first);
        }
    }

    #[test]
    fn measured_placements_interpolate_and_others_come_from_the_table() {
        let app = App::new(&toy_profile()).unwrap();
        let (s, y) = app.step_time(0, &[2, 2], 12).unwrap();
        assert!(
            (s - (0.1 + 0.12 + 0.2)).abs() < 1e-9 && (y - 0.2).abs() < 1e-9,
            "{s} {y}"
        );
        // Rotations and empty nodes do not matter.
        assert_eq!(
            app.step_time(0, &[0, 2, 2], 12),
            app.step_time(0, &[2, 2], 12)
        );
        // Three nodes were never measured: the table answers, between 2 and 4 nodes' worth.
        let (s, _) = app.step_time(0, &[2, 2, 2], 16).unwrap();
        assert!(s > 0.2 && s < 1.0, "{s}");
        assert_eq!(app.step_time(1, &[1], 8), None, "unknown GPU type");
    }

    #[test]
    fn larger_batches_gain_less_per_sample_and_the_best_config_uses_it() {
        let app = App::new(&toy_profile()).unwrap();
        assert_eq!((app.init_batch_size, app.max_batch_size), (8, 64));
        assert_eq!(
            (app.min_local_bsz, app.max_local_bsz, app.max_epochs),
            (8, 32, 4)
        );
        let small = app.goodput(
            0,
            &[1],
            BatchConfig {
                atomic_bsz: 8,
                accum_steps: 0,
            },
            0,
        );
        // gain of batch 8 is 1; one step takes 0.18 s.
        assert!((small - 1.0 / 0.18).abs() < 1e-9, "{small}");
        let (config, best) = app.best_config(0, &[4], 0);
        assert!(best >= app.goodput(0, &[4], app.fixed_config(4, 32), 0) - 1e-12);
        assert!(
            config.atomic_bsz >= 8 && config.atomic_bsz <= 32,
            "{config:?}"
        );
        assert_eq!(app.total_progress(), 400.0);
    }

    #[test]
    fn fixed_batches_accumulate_past_the_largest_local_batch() {
        let app = App::new(&toy_profile()).unwrap();
        assert_eq!(
            app.fixed_config(1, 64),
            BatchConfig {
                atomic_bsz: 32,
                accum_steps: 1
            }
        );
        assert_eq!(
            app.fixed_config(4, 64),
            BatchConfig {
                atomic_bsz: 16,
                accum_steps: 0
            }
        );
        // A single replica above the initial batch accumulates at least once.
        assert_eq!(
            app.fixed_config(1, 16),
            BatchConfig {
                atomic_bsz: 8,
                accum_steps: 1
            }
        );
    }
}
