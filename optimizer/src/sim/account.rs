//! Where a job's time went: its JCT split into parts that add up to it, measured as the replay
//! runs, so that a policy's distance to the lower bound ([`super::bound`]) can be told apart
//! trace by trace (issue 45): waiting for a first start or after one, restarts, and training
//! slower than the best any placement gives, by why (the batch size, the GPU count while GPUs
//! idled or while the cluster was full, the GPU type, the spread over nodes, slow nodes), and
//! what faults cost.
//!
//! The training parts come from the rates of each stretch of progress: with `g` the job's
//! goodput on its placement, `any` the best goodput any placement and batch choice gives in
//! that epoch (the alone bound's), `own` the best under the job's own batch choice, `grown` the
//! best it could have had with the GPUs left idle that round, `count` the best of its GPU count
//! packed on any type, and `typed` its count packed on its own type, a stretch of `d` seconds
//! is `d·g/any` seconds of work at the best rate and `d·(any − own)/any` (batch) +
//! `d·(own − grown)/any` (sharing) + `d·(grown − count)/any` (sizing) +
//! `d·(count − typed)/any` (GPU type) + `d·(typed − raw)/any` (spread; `raw` the goodput before
//! slow nodes) + `d·(raw − g)/any` (slow nodes), which sum to `d`. Each may be negative where a
//! placement beats the one it is compared with.

use serde::{Deserialize, Serialize};

use super::app::App;
use super::world::{JobState, World, packed};

/// A finished job's JCT in parts, seconds; [`JctAccount::total`] is its JCT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JctAccount {
    /// From its submission to the first round after it, and the first start's restart
    /// penalty: what any scheduler makes it wait (the alone bound's floor).
    pub floor_s: f64,
    /// Its work at the best rate any placement gives in each epoch, once: with `floor_s` its
    /// alone bound.
    pub least_s: f64,
    /// From the first round after its submission to its first start.
    pub queue_s: f64,
    /// Without GPUs after its first start (preempted, or given none back after a fault).
    pub waits_s: f64,
    /// Restart penalties after the first start (rescales, moves, preemptions, faults).
    pub restarts_s: f64,
    /// Training slower than the best because its batch size did not adapt (a fixed-batch
    /// scheduler's choice).
    pub batch_s: f64,
    /// ... because it ran on fewer GPUs than its best while GPUs it could have had were left
    /// idle (the policy's sizing).
    pub sizing_s: f64,
    /// ... because it ran on fewer GPUs than its best with none left idle that it could have
    /// had (sharing a full cluster).
    pub sharing_s: f64,
    /// ... because it ran on another GPU type than the best for its count.
    pub type_s: f64,
    /// ... because its GPUs were spread over more nodes than packed (fragmentation).
    pub spread_s: f64,
    /// ... because a node it ran on was slowed.
    pub slow_s: f64,
    /// Saves, stalls, work done again after a failure took it back to its last save, and
    /// GPUs held without progress.
    pub faults_s: f64,
}

impl JctAccount {
    /// The parts added up: the JCT of the job it accounts for.
    pub fn total(&self) -> f64 {
        self.floor_s + self.least_s + self.beyond_alone()
    }

    /// What it took beyond its alone bound (`floor_s + least_s`).
    pub fn beyond_alone(&self) -> f64 {
        self.queue_s + self.waits_s + self.restarts_s + self.training_beyond() + self.faults_s
    }

    /// Training slower than the best, all whys together.
    pub fn training_beyond(&self) -> f64 {
        self.batch_s + self.sizing_s + self.sharing_s + self.type_s + self.spread_s + self.slow_s
    }

    /// The parts' names, as the what-if's tables name their columns, in the order of
    /// [`JctAccount::values`].
    pub const NAMES: [&'static str; 12] = [
        "floor_s",
        "least_s",
        "queue_s",
        "waits_s",
        "restarts_s",
        "batch_s",
        "sizing_s",
        "sharing_s",
        "type_s",
        "spread_s",
        "slow_s",
        "faults_s",
    ];

    /// The parts, in the order of [`JctAccount::NAMES`].
    pub fn values(&self) -> [f64; 12] {
        [
            self.floor_s,
            self.least_s,
            self.queue_s,
            self.waits_s,
            self.restarts_s,
            self.batch_s,
            self.sizing_s,
            self.sharing_s,
            self.type_s,
            self.spread_s,
            self.slow_s,
            self.faults_s,
        ]
    }

    fn from_values(v: [f64; 12]) -> JctAccount {
        let [
            floor_s,
            least_s,
            queue_s,
            waits_s,
            restarts_s,
            batch_s,
            sizing_s,
            sharing_s,
            type_s,
            spread_s,
            slow_s,
            faults_s,
        ] = v;
        JctAccount {
            floor_s,
            least_s,
            queue_s,
            waits_s,
            restarts_s,
            batch_s,
            sizing_s,
            sharing_s,
            type_s,
            spread_s,
            slow_s,
            faults_s,
        }
    }

    /// Part by part, `self + other`.
    pub fn add(&mut self, o: &JctAccount) {
        let (a, b) = (self.values(), o.values());
        *self = JctAccount::from_values(std::array::from_fn(|i| a[i] + b[i]));
    }

    /// Part by part, `self × k`.
    pub fn scaled(&self, k: f64) -> JctAccount {
        JctAccount::from_values(self.values().map(|v| v * k))
    }
}

/// Per epoch of a training job's application, the best goodput any placement of the cluster
/// gives under any batch choice the job could get (`any`, the alone bound's) and under the
/// batch choice it has (`own`); and the least seconds its work takes at `any`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct EpochRates {
    pub(super) any: Vec<f64>,
    pub(super) own: Vec<f64>,
    pub(super) least_s: f64,
}

impl EpochRates {
    /// From the per-epoch bests of each batch choice (`choices`, as the bound takes them) and
    /// of the job's own (`own`).
    pub(super) fn new(app: &App, choices: &[&[f64]], own: &[f64]) -> EpochRates {
        let any: Vec<f64> = (0..app.max_epochs as usize)
            .map(|e| choices.iter().map(|c| c[e]).fold(0.0, f64::max))
            .collect();
        let least_s = (0..app.max_epochs)
            .map(|e| {
                let span = app.progress_at(e + 1) - app.progress_at(e);
                if any[e as usize] > 0.0 {
                    span / any[e as usize]
                } else {
                    0.0
                }
            })
            .sum();
        EpochRates {
            any,
            own: own.to_vec(),
            least_s,
        }
    }
}

/// What a training job's stretches of progress are compared with while its epoch, placement
/// and the GPUs left idle stay the same: the best of its GPU count packed on any type
/// (`count`) and on its own (`typed`), and the best it could have had with the GPUs left
/// idle (`grown`: its own type's added to its count, or another type's instead).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct HeldRates {
    epoch: u32,
    held: u32,
    worker_type: usize,
    idle: Vec<u32>,
    rates: Held,
}

/// A training job's goodput on `r` GPUs packed on each type, in one epoch, computed once each
/// (a replay asks every round, with the GPUs left idle, for a few of them).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PackedRates {
    epoch: u32,
    /// `[t × (most + 1) + r]`; NaN where not computed yet.
    rates: Vec<f64>,
    most: u32,
}

impl PackedRates {
    /// Its goodput on `r` GPUs packed on type `t` in its epoch, with the best configuration
    /// its batch choice allows; 0 where the type cannot run it or has fewer GPUs.
    fn get(&mut self, world: &World, job: &JobState, app: usize, t: usize, r: u32) -> f64 {
        let most = world.type_gpus.iter().copied().max().unwrap_or(0);
        if r == 0 || r > world.type_gpus[t] {
            return 0.0;
        }
        if self.rates.is_empty() || self.epoch != job.epoch || self.most != most {
            self.epoch = job.epoch;
            self.most = most;
            self.rates.clear();
            self.rates
                .resize(world.per_node.len() * (most as usize + 1), f64::NAN);
        }
        let i = t * (most as usize + 1) + r as usize;
        if self.rates[i].is_nan() {
            self.rates[i] = match world.gpu[app][t] {
                Some(gpu) => {
                    let digits = packed(r, world.per_node[t]);
                    world.config_on(job, gpu, &digits, &world.apps[app]).1
                }
                None => 0.0,
            };
        }
        self.rates[i]
    }
}

impl HeldRates {
    /// The rates for `job` (a training job of application `app`) on `held` GPUs of type `t`
    /// with `idle` GPUs of each type left idle this round, kept from `cached` while they are
    /// the same; `packed` keeps the goodputs they are made of.
    pub(super) fn of(
        cached: Option<HeldRates>,
        world: &World,
        job: &JobState,
        app: usize,
        (t, held): (usize, u32),
        idle: &[u32],
        packed: &mut PackedRates,
    ) -> HeldRates {
        if let Some(c) = cached
            && (c.epoch, c.held, c.worker_type) == (job.epoch, held, t)
            && c.idle == idle
        {
            return c;
        }
        let types = 0..world.per_node.len();
        let mut rate = |u: usize, r: u32| packed.get(world, job, app, u, r);
        let count = types.clone().map(|u| rate(u, held)).fold(0.0, f64::max);
        // As many as any scheduler could give it (the bound's limit), not this one's.
        let most = world.apps[app].max_replicas.unwrap_or(u32::MAX);
        let grown = if idle.iter().all(|&n| n == 0) {
            count
        } else {
            types
                .map(|u| {
                    let more = if u == t { held + idle[u] } else { idle[u] };
                    rate(u, more.min(most))
                })
                .fold(count, f64::max)
        };
        HeldRates {
            epoch: job.epoch,
            held,
            worker_type: t,
            idle: idle.to_vec(),
            rates: Held {
                count,
                typed: rate(t, held),
                grown,
            },
        }
    }
}

/// The rates of [`HeldRates`] a stretch is compared with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Held {
    pub(super) count: f64,
    pub(super) typed: f64,
    pub(super) grown: f64,
}

impl HeldRates {
    pub(super) fn held(&self) -> Held {
        self.rates
    }
}

/// Adds `d` seconds of training at goodput `raw × speed` in epoch `epoch` to `acc`, against
/// `rates` and `held`: its work at the best rate to `least_s`, the rest by why.
pub(super) fn train(
    acc: &mut JctAccount,
    rates: &EpochRates,
    held: &Held,
    epoch: u32,
    d: f64,
    raw: f64,
    speed: f64,
) {
    let e = epoch as usize;
    let any = rates.any.get(e).copied().unwrap_or(0.0);
    if any <= 0.0 {
        // No placement makes progress in this epoch: none does here either.
        acc.faults_s += d;
        return;
    }
    let own = rates.own.get(e).copied().unwrap_or(0.0);
    let grown = held.grown.min(own).max(held.count);
    let g = raw * speed;
    acc.least_s += d * g / any;
    acc.batch_s += d * (any - own) / any;
    acc.sharing_s += d * (own - grown) / any;
    acc.sizing_s += d * (grown - held.count) / any;
    acc.type_s += d * (held.count - held.typed) / any;
    acc.spread_s += d * (held.typed - raw) / any;
    acc.slow_s += d * (raw - g) / any;
}

/// Adds `d` seconds of a rigid job running at `speed`.
pub(super) fn rigid(acc: &mut JctAccount, d: f64, speed: f64) {
    acc.least_s += d * speed;
    acc.slow_s += d * (1.0 - speed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretch_s_parts_add_up_to_its_seconds() {
        let rates = EpochRates {
            any: vec![10.0],
            own: vec![8.0],
            least_s: 0.0,
        };
        let held = Held {
            count: 6.0,
            typed: 5.0,
            grown: 7.0,
        };
        let mut acc = JctAccount::default();
        train(&mut acc, &rates, &held, 0, 100.0, 4.0, 0.5);
        // 100 s at 2 progress/s: 20 s at the best rate of 10.
        assert!((acc.least_s - 20.0).abs() < 1e-9, "{acc:?}");
        assert!((acc.batch_s - 20.0).abs() < 1e-9);
        assert!((acc.sharing_s - 10.0).abs() < 1e-9);
        assert!((acc.sizing_s - 10.0).abs() < 1e-9);
        assert!((acc.type_s - 10.0).abs() < 1e-9);
        assert!((acc.spread_s - 10.0).abs() < 1e-9);
        assert!((acc.slow_s - 20.0).abs() < 1e-9);
        assert!((acc.total() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn parts_add_and_scale_each() {
        let mut a = JctAccount {
            sizing_s: 8.0,
            queue_s: 1.0,
            sharing_s: 2.0,
            ..Default::default()
        };
        a.add(&JctAccount {
            queue_s: 3.0,
            faults_s: 4.0,
            ..Default::default()
        });
        let half = a.scaled(0.5);
        assert_eq!(
            (half.queue_s, half.sharing_s, half.faults_s),
            (2.0, 1.0, 2.0)
        );
        assert_eq!(half.total(), 9.0);
    }
}
