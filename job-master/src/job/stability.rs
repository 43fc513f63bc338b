//! Stragglers and hangs in the training group (the job's `stability:` settings).
//!
//! * **Stragglers**: each training process reports, about once a second, how many steps it
//!   trained and the seconds of its own work in them (outside collectives and waits: in a
//!   synchronous group every rank's wall time is the slowest's). A process whose compute per
//!   step is at least `straggler_ratio` times the median of the rest of its role group in two
//!   reports in a row is a straggler; the event says by how much. With `straggler_action:
//!   replace` its node is avoided by the job from then on, and the process is replaced: a ps
//!   worker alone at once, an all-reduce group after a checkpoint at a consistent cut (nothing
//!   trained is lost), both with a new agent that the platform places elsewhere; with `shrink`
//!   the group goes on one process smaller instead (`moves.rs`, which also moves a process off
//!   a node the brain cordoned).
//! * **Hangs**: a training process with a shard to train (any, for an all-reduce rank) and no
//!   step for `hang_after_steps` of its typical steps (never sooner than `hang_min_s`) is hung.
//!   Its agent (every rank's, in an all-reduce group) captures the stacks; once they are in,
//!   or after [`CAPTURE_WAIT_MS`], the process fails with the reason and restarts as a failure
//!   would: an all-reduce group from its latest checkpoint. Never the collective's own timeout.
//!
//! Pure, like the rest of [`super`]: the detection runs on reports and timer ticks.

use std::collections::{BTreeSet, VecDeque};

use super::*;
use crate::spec::StragglerAction;
pub use vocab::report::HangRecord;
use vocab::report::{NodeHealth, PrecheckRecord};

/// Reports of compute per step kept per process (the test is the last two).
const WINDOW: usize = 3;
/// How long a hang waits for the stacks before the restart.
pub const CAPTURE_WAIT_MS: u64 = 5_000;
/// Hangs kept with the job, newest last; only the newest few keep their stacks, and a hang
/// keeps at most [`MAX_HANG_STACKS_BYTES`] of them (the context is written on every change).
const MAX_HANGS: usize = 20;
const HANGS_WITH_STACKS: usize = 3;
const MAX_HANG_STACKS_BYTES: usize = 256 * 1024;

/// What the job master knows about the stability of the training group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stability {
    /// Per training process: its incarnation and its recent compute per step, ms.
    pub compute: BTreeMap<SlotKey, (u64, VecDeque<f64>)>,
    /// The processes flagged as stragglers now.
    pub stragglers: BTreeMap<SlotKey, Straggler>,
    /// Per training process: the progress its current incarnation made.
    pub progress: BTreeMap<SlotKey, StepProgress>,
    /// Nodes this job avoids (a straggler ran there), with the reason.
    pub avoided: BTreeMap<String, String>,
    /// An all-reduce straggler to replace once the cut checkpoint is committed.
    pub replace_at_cut: Option<SlotKey>,
    /// The node the brain cordoned that the move under way takes a process off (none: the
    /// move is a straggler's replacement).
    #[serde(default)]
    pub moving_off: Option<String>,
    /// The move under way shrinks the group by one (`straggler_action: shrink`).
    #[serde(default)]
    pub shrinking: bool,
    /// A hang whose stacks are being captured.
    pub capturing: Option<Capture>,
    /// The hangs found, with the stacks captured.
    pub hangs: Vec<HangRecord>,
    /// A transition held the group still until then: no hang is counted before.
    pub quiet_until_ms: u64,
    /// What the pre-run check found, when the job ran one.
    #[serde(default)]
    pub precheck: Option<PrecheckRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    pub since_ms: u64,
    /// `straggler_action` (`replace` or `shrink`) acted on it (a group busy then is tried
    /// again at the next slow report).
    #[serde(default)]
    pub replaced: bool,
    pub host: String,
    /// Its compute per step and its group's median, ms (the latest report).
    pub step_ms: f64,
    pub median_ms: f64,
}

impl Straggler {
    pub fn ratio(&self) -> f64 {
        self.step_ms / self.median_ms.max(1e-9)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepProgress {
    pub incarnation: u64,
    pub step: u64,
    /// When `step` was first reported.
    pub at_ms: u64,
    /// Wall time per step, ms, averaged over its recent reports (0: not known yet).
    pub typical_ms: f64,
    /// When it last reported, and the time between its reports, ms (averaged; 0: not known):
    /// a hang is never called before three report intervals passed without a step.
    #[serde(default)]
    pub reported_ms: u64,
    #[serde(default)]
    pub report_gap_ms: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capture {
    pub started_ms: u64,
    /// The process found hung, which fails once the stacks are in.
    pub hung: SlotKey,
    pub hung_incarnation: u64,
    pub why: String,
    /// Processes whose stacks are asked for (with the incarnation asked) and not in yet.
    pub awaiting: BTreeSet<(SlotKey, u64)>,
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl JobContext {
    /// Takes the pre-run check's verdict: its faulty nodes and stragglers are avoided from
    /// now on, each said in the job's events with the figures. Returns the nodes to avoid.
    pub fn precheck_done(&mut self, record: PrecheckRecord, now_ms: u64) -> Vec<String> {
        let mut avoid = Vec::new();
        for n in record.unhealthy() {
            let why = format!(
                "the pre-run check found it {}: {}",
                n.health.phrase(),
                n.why
            );
            self.log_as(
                EventKind::Node,
                now_ms,
                format!("node {} avoided: {why}", n.node),
            );
            self.stability.avoided.insert(n.node.clone(), why);
            avoid.push(n.node.clone());
        }
        let mut unchecked = 0;
        for n in record
            .nodes
            .iter()
            .filter(|n| n.health == NodeHealth::Unchecked)
        {
            unchecked += 1;
            self.log_as(
                EventKind::Node,
                now_ms,
                format!(
                    "node {} not checked (the job may use it): {}",
                    n.node, n.why
                ),
            );
        }
        let healthy = record.nodes.len() - avoid.len() - unchecked;
        self.log_as(
            EventKind::Node,
            now_ms,
            format!(
                "pre-run check of {} node(s) took {:.1} s: {healthy} healthy{}",
                record.nodes.len(),
                record.elapsed_ms as f64 / 1000.0,
                if unchecked > 0 {
                    format!(", {unchecked} not checked")
                } else {
                    String::new()
                }
            ),
        );
        self.stability.precheck = Some(record);
        avoid
    }

    /// A training process reported `steps` steps with `compute_s` seconds of its own work and
    /// its step counter at `global_step`: its progress and compute are recorded, and its
    /// group is checked for stragglers.
    pub(super) fn observe_steps(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        global_step: u64,
        steps: u32,
        compute_s: f64,
        now_ms: u64,
    ) -> Vec<Effect> {
        self.observe_progress(key, incarnation, global_step, now_ms);
        if steps == 0 || !compute_s.is_finite() || compute_s <= 0.0 {
            return Vec::new();
        }
        let per_step = compute_s * 1000.0 / steps as f64;
        let entry = self
            .stability
            .compute
            .entry(key)
            .or_insert((incarnation, VecDeque::new()));
        if entry.0 != incarnation {
            *entry = (incarnation, VecDeque::new());
            self.stability.stragglers.remove(&key);
        }
        entry.1.push_back(per_step);
        if entry.1.len() > WINDOW {
            entry.1.pop_front();
        }
        self.check_straggler(key, now_ms)
    }

    fn observe_progress(&mut self, key: SlotKey, incarnation: u64, step: u64, now_ms: u64) {
        let fresh = StepProgress {
            incarnation,
            step,
            at_ms: now_ms,
            typical_ms: 0.0,
            reported_ms: now_ms,
            report_gap_ms: 0.0,
        };
        let known = self.stability.progress.contains_key(&key);
        let p = self.stability.progress.entry(key).or_insert(fresh.clone());
        if !known {
            self.training_resumed(now_ms);
            return;
        }
        if p.incarnation != incarnation {
            *p = fresh;
            // Its first report follows its first step: the group trains from here.
            self.training_resumed(now_ms);
            return;
        }
        let gap = now_ms.saturating_sub(p.reported_ms) as f64;
        p.report_gap_ms = if p.report_gap_ms == 0.0 {
            gap
        } else {
            0.8 * p.report_gap_ms + 0.2 * gap
        };
        p.reported_ms = now_ms;
        if step > p.step {
            let per_step = now_ms.saturating_sub(p.at_ms) as f64 / (step - p.step) as f64;
            p.typical_ms = if p.typical_ms == 0.0 {
                per_step
            } else {
                0.8 * p.typical_ms + 0.2 * per_step
            };
            p.step = step;
            p.at_ms = now_ms;
            let (typical, gap) = (p.typical_ms, p.report_gap_ms);
            self.count_training(typical, gap, now_ms);
        }
    }

    /// `key` against the median of the rest of its role group: flagged after two slow reports
    /// in a row, cleared after two that are not.
    fn check_straggler(&mut self, key: SlotKey, now_ms: u64) -> Vec<Effect> {
        let live = |k: &SlotKey| {
            self.roles
                .slot(*k)
                .is_some_and(|s| s.phase == SlotPhase::Running)
        };
        let peers: Vec<f64> = self
            .stability
            .compute
            .iter()
            .filter(|(k, (inc, w))| {
                k.role == key.role
                    && **k != key
                    && live(k)
                    && self.roles.slot(**k).unwrap().incarnation == *inc
                    && !w.is_empty()
            })
            .map(|(_, (_, w))| *w.back().expect("not empty"))
            .collect();
        let Some((_, mine)) = self.stability.compute.get(&key) else {
            return Vec::new();
        };
        if peers.is_empty() || mine.len() < 2 || !live(&key) {
            return Vec::new();
        }
        let ratio = self.spec.stability.straggler_ratio;
        let med = median(peers);
        let last_two: Vec<f64> = mine.iter().rev().take(2).copied().collect();
        let slow = last_two.iter().all(|&v| v >= ratio * med);
        let fine = last_two.iter().all(|&v| v < ratio * med);
        let step_ms = last_two[0];
        let flagged = self.stability.stragglers.contains_key(&key);
        if slow && !flagged {
            let host = self.roles.slot(key).unwrap().host.clone();
            let s = Straggler {
                since_ms: now_ms,
                replaced: false,
                host: host.clone(),
                step_ms,
                median_ms: med,
            };
            let action = self.spec.stability.straggler_action;
            self.log_as(
                EventKind::Straggler,
                now_ms,
                format!(
                    "straggler: {key} on {host} computes a step in {step_ms:.1} ms, {:.2}x the \
                     median of the other {}s ({med:.1} ms), two reports in a row; action: {action}",
                    s.ratio(),
                    key.role
                ),
            );
            self.stability.stragglers.insert(key, s);
            if action != StragglerAction::Report {
                return self.act_on_straggler(key, now_ms);
            }
        } else if let Some(s) = self.stability.stragglers.get_mut(&key) {
            s.step_ms = step_ms;
            s.median_ms = med;
            let retry = slow
                && !s.replaced
                && self.spec.stability.straggler_action != StragglerAction::Report;
            if retry {
                return self.act_on_straggler(key, now_ms);
            }
            if fine {
                self.stability.stragglers.remove(&key);
                self.log_as(EventKind::Straggler,
                    now_ms,
                    format!(
                        "{key} is no longer a straggler: {step_ms:.1} ms a step, the median {med:.1} ms"
                    ),
                );
            }
        }
        Vec::new()
    }

    /// Timer: a hung training process is found, or a capture under way ends.
    pub(super) fn check_hangs(&mut self, now_ms: u64) -> Vec<Effect> {
        if self.transition.is_some() {
            self.stability.quiet_until_ms = now_ms;
        }
        if let Some(c) = &self.stability.capturing {
            if c.awaiting.is_empty() || now_ms.saturating_sub(c.started_ms) > CAPTURE_WAIT_MS {
                return self.fail_hung(now_ms);
            }
            return Vec::new();
        }
        if self.phase != JobPhase::Running
            || self.cancelling.is_some()
            || self.transition.is_some()
            || self.ledger.is_complete()
        {
            return Vec::new();
        }
        let Some((key, incarnation, why)) = self.hung(now_ms) else {
            return Vec::new();
        };
        // An all-reduce group is stuck together: every rank's stacks tell where.
        let keys: Vec<(SlotKey, u64)> = if self.spec.kind == JobKind::Allreduce {
            self.roles
                .slots()
                .filter(|s| s.key.role == key.role && s.phase == SlotPhase::Running)
                .map(|s| (s.key, s.incarnation))
                .collect()
        } else {
            vec![(key, incarnation)]
        };
        self.log_as(
            EventKind::Hang,
            now_ms,
            format!(
                "hang: {why}; capturing the stacks of {}",
                keys.iter()
                    .map(|(k, _)| k.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        self.stability.hangs.push(HangRecord {
            at_ms: now_ms,
            why: why.clone(),
            stacks: BTreeMap::new(),
        });
        if self.stability.hangs.len() > MAX_HANGS {
            self.stability.hangs.remove(0);
        }
        let n = self.stability.hangs.len();
        for old in &mut self.stability.hangs[..n.saturating_sub(HANGS_WITH_STACKS)] {
            old.stacks.clear();
        }
        self.stability.capturing = Some(Capture {
            started_ms: now_ms,
            hung: key,
            hung_incarnation: incarnation,
            why,
            awaiting: keys.into_iter().collect(),
        });
        Vec::new()
    }

    /// The first training process with a shard to train and no step for longer than the
    /// `stability:` settings allow, with why.
    fn hung(&self, now_ms: u64) -> Option<(SlotKey, u64, String)> {
        let allreduce = self.spec.kind == JobKind::Allreduce;
        self.roles.slots().find_map(|s| {
            let p = self.stability.progress.get(&s.key)?;
            if s.phase != SlotPhase::Running || p.incarnation != s.incarnation {
                return None;
            }
            // A ps worker without a shard waits for the others' data: not stuck.
            if !allreduce
                && self
                    .ledger
                    .held_by(&Self::holder(s.key, s.incarnation))
                    .is_none()
            {
                return None;
            }
            let since = p.at_ms.max(self.stability.quiet_until_ms);
            let silent = now_ms.saturating_sub(since);
            // Before a second report times its steps, its own work per step is a lower bound.
            let typical = match p.typical_ms {
                t if t > 0.0 => t,
                _ => self.step_compute_ms(s.key, s.incarnation).unwrap_or(0.0),
            };
            let limit = self
                .spec
                .stability
                .hang_after_ms(typical)
                .max((3.0 * p.report_gap_ms) as u64);
            (silent > limit).then(|| {
                (
                    s.key,
                    s.incarnation,
                    format!(
                        "{} reported no step for {:.1} s, since step {} (a step takes {:.0} ms; \
                         the limit is {:.1} s)",
                        if allreduce {
                            format!("the {} group", s.key.role)
                        } else {
                            s.key.to_string()
                        },
                        silent as f64 / 1000.0,
                        p.step,
                        typical,
                        limit as f64 / 1000.0
                    ),
                )
            })
        })
    }

    /// `key`'s own work per step in its latest report from `incarnation`, ms.
    pub fn step_compute_ms(&self, key: SlotKey, incarnation: u64) -> Option<f64> {
        let (inc, w) = self.stability.compute.get(&key)?;
        (*inc == incarnation).then(|| w.back().copied())?
    }

    /// Whether the agent of `key` running `incarnation` must capture its process's stacks.
    pub fn stacks_wanted(&self, key: SlotKey, incarnation: u64) -> bool {
        self.stability
            .capturing
            .as_ref()
            .is_some_and(|c| c.awaiting.contains(&(key, incarnation)))
    }

    /// The stacks of `key` arrived; the restart follows once every one asked for has.
    pub fn stacks_reported(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        text: String,
        now_ms: u64,
    ) -> Vec<Effect> {
        let Some(c) = self.stability.capturing.as_mut() else {
            return Vec::new();
        };
        if !c.awaiting.remove(&(key, incarnation)) {
            return Vec::new();
        }
        let first = text.lines().next().unwrap_or("").to_string();
        if let Some(h) = self.stability.hangs.last_mut() {
            let kept: usize = h.stacks.values().map(String::len).sum();
            let text = if kept + text.len() > MAX_HANG_STACKS_BYTES {
                format!(
                    "(not kept: this hang's stacks passed {} KiB)",
                    MAX_HANG_STACKS_BYTES / 1024
                )
            } else {
                text
            };
            h.stacks.insert(key.to_string(), text);
        }
        self.log_as(
            EventKind::Hang,
            now_ms,
            format!("stacks of {key} captured: {first}"),
        );
        if self
            .stability
            .capturing
            .as_ref()
            .is_some_and(|c| c.awaiting.is_empty())
        {
            return self.fail_hung(now_ms);
        }
        Vec::new()
    }

    /// The capture is over: the hung process fails (its group restarts as for a failure).
    fn fail_hung(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(c) = self.stability.capturing.take() else {
            return Vec::new();
        };
        if !c.awaiting.is_empty() {
            self.log_as(
                EventKind::Hang,
                now_ms,
                format!(
                    "no stacks from {} within {} s",
                    c.awaiting
                        .iter()
                        .map(|(k, _)| k.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    CAPTURE_WAIT_MS / 1000
                ),
            );
        }
        if self.current(c.hung, c.hung_incarnation).is_err() || self.phase.is_terminal() {
            return Vec::new();
        }
        self.fail_slot(c.hung, format!("hung: {}", c.why), false, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_middle_pair_s_mean() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
