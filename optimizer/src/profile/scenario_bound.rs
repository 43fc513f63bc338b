//! Not a predictor a brain could run: it peeks at the jobs it is scored on. Per scenario it
//! gives every job the `quantile` of that scenario's *scored* jobs (per resource), the best any
//! predictor that tells jobs apart only by scenario can do at that coverage. `brainctl train
//! --evaluate` prints it beside the real predictors so that a target a trace cannot support
//! shows as such (Alibaba 2023's scenario, QoS, says little about a pod's size).

use std::collections::HashMap;

use super::{Demand, History, Predictor, ProfileSample};

#[derive(Clone, Debug, PartialEq)]
pub struct ScenarioBound {
    quantile: f64,
    by_scenario: HashMap<String, Demand>,
}

impl ScenarioBound {
    /// The bound for `scored` at `quantile` (0..=1): per scenario and resource, the smallest
    /// value that covers that share of the scenario's jobs.
    pub fn new(scored: &[ProfileSample], quantile: f64) -> Self {
        let mut values: HashMap<&str, [Vec<f64>; 3]> = HashMap::new();
        for s in scored {
            let v = values.entry(s.scenario.as_str()).or_default();
            for (t, x) in s.used.0.iter().enumerate() {
                v[t].push(*x);
            }
        }
        let q = quantile.clamp(0.0, 1.0);
        let by_scenario = values
            .into_iter()
            .map(|(scenario, mut v)| {
                let mut d = Demand::default();
                for (t, xs) in v.iter_mut().enumerate() {
                    xs.sort_by(f64::total_cmp);
                    // The smallest value with at least ⌈q·n⌉ values at or below it.
                    let k = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
                    d.0[t] = xs[k - 1];
                }
                (scenario.to_string(), d)
            })
            .collect();
        ScenarioBound {
            quantile: q,
            by_scenario,
        }
    }
}

impl Predictor for ScenarioBound {
    fn name(&self) -> String {
        format!("bound: scenario q{:.0} (peeks)", self.quantile * 100.0)
    }

    fn predict(&self, _history: &History, job: &ProfileSample) -> Option<Demand> {
        self.by_scenario.get(&job.scenario).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(scenario: &str, cpu: f64) -> ProfileSample {
        ProfileSample {
            at_s: 0.0,
            scenario: scenario.into(),
            family: String::new(),
            requested: None,
            used: Demand([cpu, 1.0, 0.0]),
        }
    }

    #[test]
    fn covers_the_asked_share_of_each_scenario() {
        let mut scored: Vec<_> = (1..=20).map(|i| sample("a", i as f64)).collect();
        scored.push(sample("b", 7.0));
        let b = ScenarioBound::new(&scored, 0.95);
        let h = History::default();
        assert_eq!(b.predict(&h, &sample("a", 0.0)).unwrap().0[0], 19.0);
        assert_eq!(b.predict(&h, &sample("b", 0.0)).unwrap().0[0], 7.0);
        assert_eq!(b.predict(&h, &sample("c", 0.0)), None);
        let covered = scored[..20].iter().filter(|s| s.used.0[0] <= 19.0).count();
        assert_eq!(covered, 19);
    }
}
