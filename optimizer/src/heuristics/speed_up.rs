//! The worker count follows the observed speed-up. DLRover adds workers while the measured
//! speed grows; here the decision uses the efficiency of the last step in worker count —
//! (speed gain) / (worker gain), 1 for linear scaling — with a hysteresis band: grow by `step`
//! while it is at least `grow_efficiency`, go back to the smaller count when it falls below
//! `shrink_efficiency`, stay in between. A count already measured to scale badly is not tried
//! again. Changes are at least `cooldown_s` apart, so each count is measured before the next.

use serde::{Deserialize, Serialize};

use super::{Action, ChangeKind, Heuristic, JobRuntime, Proposal, SpeedPoint, check_range};
use crate::error::PolicyError;
use crate::plan::Role;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpeedUp {
    /// Grow while the last step's efficiency is at least this.
    pub grow_efficiency: f64,
    /// Shrink back when it is below this (≤ `grow_efficiency`).
    pub shrink_efficiency: f64,
    /// Workers added per step.
    pub step: u32,
    /// Seconds between worker-count changes.
    pub cooldown_s: f64,
}

impl Default for SpeedUp {
    fn default() -> Self {
        SpeedUp {
            grow_efficiency: 0.7,
            shrink_efficiency: 0.4,
            step: 1,
            cooldown_s: 300.0,
        }
    }
}

/// Efficiency of going from `a` to `b` workers (b > a): relative speed gain per relative worker
/// gain.
fn efficiency(a: &SpeedPoint, b: &SpeedPoint) -> f64 {
    if a.samples_per_s <= 0.0 {
        return 0.0;
    }
    (b.samples_per_s / a.samples_per_s - 1.0) / (b.workers as f64 / a.workers as f64 - 1.0)
}

impl SpeedUp {
    /// Whether growing a job of `w` workers is borne out by its measured `speed`: `Err` with
    /// the measurement when the last step up scaled below `grow_efficiency`, or a larger count
    /// already measured did. The live brain asks this before the scheduler grows a job.
    pub fn gate_growth(&self, w: u32, speed: &[SpeedPoint]) -> Result<(), String> {
        let mut by_count = std::collections::BTreeMap::new();
        for p in speed {
            by_count.insert(p.workers, *p);
        }
        let Some(now) = by_count.get(&w).copied() else {
            return Ok(());
        };
        let poor = |a: &SpeedPoint, b: &SpeedPoint| {
            let e = efficiency(a, b);
            (e < self.grow_efficiency).then(|| {
                format!(
                    "{} -> {} workers gained {:.0} % of linear (< {:.0} %)",
                    a.workers,
                    b.workers,
                    100.0 * e,
                    100.0 * self.grow_efficiency
                )
            })
        };
        let below = by_count.range(..w).next_back().map(|(_, p)| *p);
        let above = by_count.range(w + 1..).next().map(|(_, p)| *p);
        match (
            below.and_then(|b| poor(&b, &now)),
            above.and_then(|a| poor(&now, &a)),
        ) {
            (Some(why), _) | (None, Some(why)) => Err(why),
            (None, None) => Ok(()),
        }
    }
}

impl Heuristic for SpeedUp {
    fn name(&self) -> &'static str {
        "speed_up"
    }

    fn validate(&self) -> Result<(), PolicyError> {
        check_range(
            "speed_up",
            "grow_efficiency",
            self.grow_efficiency,
            0.0,
            1.5,
        )?;
        check_range(
            "speed_up",
            "shrink_efficiency",
            self.shrink_efficiency,
            0.0,
            self.grow_efficiency,
        )?;
        check_range("speed_up", "cooldown_s", self.cooldown_s, 0.0, f64::MAX)?;
        if self.step == 0 {
            return Err(PolicyError::InvalidConfig("speed_up.step is 0".into()));
        }
        Ok(())
    }

    fn propose(&self, job: &JobRuntime) -> Result<Vec<Proposal>, PolicyError> {
        let w = job.config.workers;
        if job.cooling(ChangeKind::Workers, None, self.cooldown_s) {
            return Ok(Vec::new());
        }
        // The latest measurement per count.
        let mut by_count = std::collections::BTreeMap::new();
        for p in &job.speed {
            by_count.insert(p.workers, *p);
        }
        let Some(now) = by_count.get(&w).copied() else {
            return Ok(Vec::new()); // the current count is not measured yet
        };
        let below = by_count.range(..w).next_back().map(|(_, p)| *p);
        let above = by_count.range(w + 1..).next().map(|(_, p)| *p);
        let set = |count: u32, reason: String| {
            Ok(vec![Proposal {
                kind: ChangeKind::Workers,
                action: Action::SetCount {
                    role: Role::WORKER,
                    count,
                },
                reason,
            }])
        };
        if let Some(b) = below {
            let e = efficiency(&b, &now);
            if e < self.shrink_efficiency && b.workers >= job.min_workers {
                return set(
                    b.workers,
                    format!(
                        "{} -> {w} workers gained {:.0} % of linear (< {:.0} %): back to {}",
                        b.workers,
                        100.0 * e,
                        100.0 * self.shrink_efficiency,
                        b.workers
                    ),
                );
            }
            if e < self.grow_efficiency {
                return Ok(Vec::new()); // in the band: stay
            }
        }
        let next = (w + self.step).min(job.max_workers);
        if next <= w {
            return Ok(Vec::new());
        }
        if let Some(a) = above
            && a.workers <= next
            && efficiency(&now, &a) < self.grow_efficiency
        {
            return Ok(Vec::new()); // tried, and it did not pay
        }
        let why = match below {
            Some(b) => format!(
                "{} -> {w} workers gained {:.0} % of linear (≥ {:.0} %)",
                b.workers,
                100.0 * efficiency(&b, &now),
                100.0 * self.grow_efficiency
            ),
            None => format!("no smaller count measured; trying {next}"),
        };
        set(next, format!("{why}: {w} -> {next} workers"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heuristics::Change;
    use crate::heuristics::tests::job;

    fn with(workers: u32, speed: &[(u32, f64)]) -> JobRuntime {
        let mut j = job(1, workers);
        j.speed = speed
            .iter()
            .map(|&(workers, samples_per_s)| SpeedPoint {
                workers,
                samples_per_s,
            })
            .collect();
        j
    }

    #[test]
    fn growth_is_gated_on_the_measured_speed_up() {
        let h = SpeedUp::default();
        // Nothing measured at the current count, or scaling well: the gate is open.
        h.gate_growth(2, &with(2, &[]).speed).unwrap();
        h.gate_growth(2, &with(2, &[(1, 100.0), (2, 190.0)]).speed)
            .unwrap();
        // 1 -> 2 gained 20 % of linear: closed, saying so.
        let e = h
            .gate_growth(2, &with(2, &[(1, 100.0), (2, 120.0)]).speed)
            .unwrap_err();
        assert!(e.contains("1 -> 2 workers gained 20 %"), "{e}");
        // 2 -> 4 was tried and gained little: closed from above too.
        assert!(
            h.gate_growth(2, &with(2, &[(2, 200.0), (4, 220.0)]).speed)
                .is_err()
        );
    }

    fn target(j: &JobRuntime) -> Option<u32> {
        SpeedUp::default()
            .propose(j)
            .unwrap()
            .first()
            .map(|p| match p.action {
                Action::SetCount { count, .. } => count,
                _ => panic!(),
            })
    }

    #[test]
    fn grows_while_it_pays_stays_in_the_band_and_backs_off_below_it() {
        assert_eq!(target(&with(2, &[(2, 100.0)])), Some(3), "explore");
        assert_eq!(target(&with(4, &[(2, 100.0), (4, 190.0)])), Some(5), "90 %");
        assert_eq!(
            target(&with(4, &[(2, 100.0), (4, 150.0)])),
            None,
            "50 %: band"
        );
        assert_eq!(target(&with(4, &[(2, 100.0), (4, 110.0)])), Some(2), "10 %");
        // 4 -> 5 was measured at 20 %: not again.
        assert_eq!(
            target(&with(4, &[(2, 100.0), (4, 190.0), (5, 199.0)])),
            None
        );
        assert_eq!(target(&with(3, &[])), None, "not measured yet");
    }

    #[test]
    fn bounds_and_cooldown_hold() {
        let mut j = with(16, &[(8, 100.0), (16, 200.0)]);
        assert_eq!(target(&j), None, "at max_workers");
        j.min_workers = 12;
        j.speed[1].samples_per_s = 101.0;
        assert_eq!(target(&j), None, "8 is below the minimum");
        let mut j = with(2, &[(2, 100.0)]);
        j.history.push(Change {
            at_s: j.now_s - 1.0,
            kind: ChangeKind::Workers,
            process: None,
        });
        assert_eq!(target(&j), None);
    }
}
