//! DLRover's initial-resource rule (its brain's job-resource optimiser): the median of the
//! same-scenario jobs of the last 7 days plus margins, +50 % CPU (DLRover's) and +20 % memory
//! (our reading of its memory headroom); a job with no such neighbour gets the median of all
//! jobs of the last 7 days with the same margins.

use serde::{Deserialize, Serialize};

use super::{Demand, History, Predictor, ProfileSample, WEEK_S, median};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlRoverRule {
    #[serde(default = "default_cpu")]
    pub cpu_margin: f64,
    #[serde(default = "default_memory")]
    pub memory_margin: f64,
    #[serde(default = "default_window")]
    pub window_s: f64,
}

fn default_cpu() -> f64 {
    0.5
}
fn default_memory() -> f64 {
    0.2
}
fn default_window() -> f64 {
    WEEK_S
}

impl Default for DlRoverRule {
    fn default() -> Self {
        DlRoverRule {
            cpu_margin: default_cpu(),
            memory_margin: default_memory(),
            window_s: default_window(),
        }
    }
}

impl Predictor for DlRoverRule {
    fn name(&self) -> String {
        "DLRover rule".into()
    }

    fn predict(&self, history: &History, job: &ProfileSample) -> Option<Demand> {
        let margins = [1.0 + self.cpu_margin, 1.0 + self.memory_margin, 1.0];
        let mut d = Demand::default();
        for (t, margin) in margins.iter().enumerate() {
            let m = median(history.same_recent(&job.scenario, job.at_s, self.window_s, t))
                .or_else(|| median(history.all_recent(job.at_s, self.window_s, t)))
                .or_else(|| median(history.all_values(t)))?;
            d.0[t] = m * margin;
        }
        Some(d)
    }
}
