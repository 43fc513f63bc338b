//! The baseline every user already has: provision what was asked for.

use serde::{Deserialize, Serialize};

use super::{Demand, History, Predictor, ProfileSample};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserRequest {}

impl Predictor for UserRequest {
    fn name(&self) -> String {
        "user request".into()
    }

    fn predict(&self, _history: &History, job: &ProfileSample) -> Option<Demand> {
        job.requested
    }
}
