//! One job while the round sizes it ([`Sized`]): its slots, its workers for a number of slots,
//! the split of slots between PS and workers, and the speed model (`speed_model`) the round
//! and the GPU part both use.

use super::*;

pub(super) struct Sized<'a> {
    pub(super) job: &'a LiveJob,
    pub(super) model: AmdahlModel,
    /// Parameter servers decided, the slots they hold together, and a new one's.
    pub(super) ps: u32,
    pub(super) ps_slots: u32,
    pub(super) ps_slot_each: u32,
    pub(super) worker_slots: u32,
    pub(super) migrations: Vec<Migration>,
    pub(super) corrections: Vec<Change>,
    pub(super) to: u32,
    /// Workers whose slots the job's own new PS take in this plan (`correct::grow_if_room`):
    /// they are not held past the plan, since the job master carries both out together.
    pub(super) traded: u32,
    /// A running PS job's PS speed model, where the round may change its PS count: the
    /// scheduler's goodput table and the split of the slots it gives weigh PS and workers
    /// together ([`Sized::split`]).
    pub(super) ps_model: Option<PsSpeedModel>,
    /// The (workers, PS) that split chose for the slots the scheduler gave.
    pub(super) joint: Option<(u32, u32)>,
    pub(super) pinned: bool,
    pub(super) reasons: Vec<String>,
    /// Where the nodes' gate placed the processes a running job adds ([`Decision::nodes`]).
    pub(super) nodes: BTreeMap<Role, Vec<String>>,
}

impl Sized<'_> {
    pub(super) fn running(&self) -> bool {
        self.job.state == LiveState::Running
    }
    pub(super) fn slots(&self, workers: u32) -> u64 {
        if workers == 0 && !self.running() {
            0
        } else {
            self.ps_slots as u64 + workers as u64 * self.worker_slots as u64
        }
    }
    pub(super) fn processes(&self, workers: u32) -> u32 {
        if workers == 0 && !self.running() {
            0
        } else {
            self.ps + workers
        }
    }
    /// Memory the job's processes ask for at `workers` workers: its PS as reported (a
    /// correction may have given one more), else as its role asks, and each worker as its role
    /// asks (a role that asks none counts nothing).
    pub(super) fn memory(&self, workers: u32) -> u64 {
        if workers == 0 && !self.running() {
            return 0;
        }
        let job = self.job;
        let ps = if self.ps == job.ps.count && job.ps.processes.len() == job.ps.count as usize {
            job.ps.processes.iter().map(|p| p.resources.memory.0).sum()
        } else {
            self.ps as u64 * job.ps.memory_bytes
        };
        ps + workers as u64 * job.workers.memory_bytes
    }
    /// Workers counted against capacity at size `to`: a running job keeps what it holds
    /// until a shrink is carried out.
    pub(super) fn counted(&self, to: u32) -> u32 {
        if self.running() {
            to.max(self.job.workers.held.saturating_sub(self.traded))
        } else {
            to
        }
    }
    /// Workers that `slots` slots hold: whole node units within the bounds, 0 below the minimum.
    pub(super) fn workers_in(&self, slots: u32) -> u32 {
        self.workers_with(slots, self.ps_slots)
    }
    /// Workers that `slots` slots hold beside parameter servers holding `ps_slots`.
    pub(super) fn workers_with(&self, slots: u32, ps_slots: u32) -> u32 {
        let unit = self.job.workers.node_unit.max(1);
        let w = slots.saturating_sub(ps_slots) / self.worker_slots;
        // The most whole node units within the maximum (a maximum that is not a multiple of
        // the unit made sizes that were not either).
        let w = (w / unit * unit).min(self.job.workers.max / unit * unit);
        if w < self.job.workers.min.max(1) {
            0
        } else {
            w
        }
    }
    /// Slots `p` parameter servers hold: what the job's hold now at its PS count, a new
    /// one's each otherwise.
    pub(super) fn ps_slots_at(&self, p: u32) -> u32 {
        if p == self.job.ps.count {
            self.ps_slots
        } else {
            p * self.ps_slot_each
        }
    }
    /// The (workers, PS) that `slots` slots hold best by the job's PS speed model: over the
    /// spec's PS bounds, the fewest PS within 5 % of the best predicted speed (as
    /// [`PsSpeedModel::best_ps`] chooses). `(0, current PS)` where no split reaches the
    /// minimum of workers.
    pub(super) fn split(&self, model: &PsSpeedModel, slots: u32) -> (u32, u32) {
        let (lo, hi) = correct::ps_range(self.job);
        let options: Vec<(u32, u32, f64)> = (lo..=hi)
            .map(|p| {
                let w = self.workers_with(slots, self.ps_slots_at(p));
                (
                    w,
                    p,
                    if w > 0 {
                        model.samples_per_s(w, p)
                    } else {
                        0.0
                    },
                )
            })
            .collect();
        let best = options.iter().map(|o| o.2).fold(0.0, f64::max);
        options
            .iter()
            .find(|o| best > 0.0 && o.2 >= best * 0.95)
            .map_or((0, self.job.ps.count), |o| (o.0, o.1))
    }
    /// Predicted samples/s at `workers` workers and `ps` PS: by the PS speed model where the
    /// round weighs PS, else by the speed model over workers.
    pub(super) fn predicted(&self, workers: u32, ps: u32) -> f64 {
        match &self.ps_model {
            Some(m) => m.samples_per_s(workers, ps),
            None => self.model.samples_per_s(workers),
        }
    }
    /// The round's decision for the job as sized, with the predicted speed change among its
    /// reasons.
    pub(super) fn decision(self) -> Decision {
        let from = match self.job.state {
            LiveState::Running => self.job.workers.count,
            LiveState::Queued => 0,
        };
        let predicted = self.predicted(self.to, self.ps);
        let before = self.predicted(from, self.job.ps.count);
        let mut reasons = self.reasons;
        if (from != self.to || self.ps != self.job.ps.count) && from > 0 {
            reasons.push(format!("predicted {before:.0} -> {predicted:.0} samples/s"));
        }
        let job = self.job;
        Decision {
            migrations: self.migrations,
            corrections: self.corrections,
            predicted_samples_per_s: predicted,
            reasons,
            nodes: self.nodes,
            ..Decision::sizing(
                job.id,
                &job.name,
                job.state,
                (from, self.to),
                (job.ps.count, self.ps),
            )
        }
    }
    /// Predicted samples/s on `slots` slots: the job's speed model at the workers they hold,
    /// or its PS speed model at their best split.
    pub(super) fn goodput(&self, slots: u32) -> f64 {
        match &self.ps_model {
            Some(m) => match self.split(m, slots) {
                (0, _) => 0.0,
                (w, p) => m.samples_per_s(w, p),
            },
            None => self.model.samples_per_s(self.workers_in(slots)),
        }
    }
}

/// The job's fitted speed model, or, without one, `prior` samples/s per worker, linear; the
/// reason goes to `reasons`.
pub(super) fn speed_model(
    fit: Option<AmdahlModel>,
    prior: f64,
    reasons: &mut Vec<String>,
) -> AmdahlModel {
    match fit {
        Some(m) => {
            reasons.push(format!(
                "speed model 1/samples_per_s = {:.3e} + {:.3e}/workers from {} worker count(s)",
                m.serial, m.parallel, m.counts_seen
            ));
            m
        }
        None => {
            reasons.push(format!(
                "no speed reported yet: assumed {prior:.1} samples/s per worker, linear"
            ));
            AmdahlModel::linear(prior)
        }
    }
}

pub(super) fn slots_of(millicores: u64, slot: u64) -> u32 {
    millicores.div_ceil(slot).max(1) as u32
}
