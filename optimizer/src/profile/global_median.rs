//! The baseline that ignores what a job is: the median of every earlier job, per resource.

use serde::{Deserialize, Serialize};

use super::{Demand, History, Predictor, ProfileSample, median};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalMedian {}

impl Predictor for GlobalMedian {
    fn name(&self) -> String {
        "global median".into()
    }

    fn predict(&self, history: &History, _job: &ProfileSample) -> Option<Demand> {
        let mut d = Demand::default();
        for t in 0..3 {
            d.0[t] = median(history.all_values(t))?;
        }
        Some(d)
    }
}
