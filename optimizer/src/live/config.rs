//! The operator's pacing of the live loop: `[live]` in the policy file, validated at load.

use serde::{Deserialize, Serialize};

use super::RolesConfig;
use crate::error::PolicyError;

/// The operator's pacing of the live loop (`[live]` in the policy file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveConfig {
    /// Seconds between rounds when no event (arrival, completion, failure) comes sooner.
    #[serde(default = "default_interval")]
    pub interval_s: f64,
    /// A job keeps a size this long before it is resized again.
    #[serde(default = "default_cooldown")]
    pub cooldown_s: f64,
    /// A job whose last plan is still on its way is not resized again until it is carried out
    /// (or rejected): its size counts as changed just now, as after a plan.
    #[serde(default = "default_true")]
    pub pin_while_plan_in_flight: bool,
    /// How often the brain starts a job's master again (`--resume`, from the latest
    /// checkpoint) after it died before its job ended; then the job is recorded failed.
    #[serde(default = "default_max_resumes")]
    pub max_resumes: u32,
    /// How rounds size a running job's service roles against each other (`roles.rs`).
    #[serde(default)]
    pub roles: RolesConfig,
    /// How long a node a job's pre-run check found faulty stays cordoned, seconds (`brainctl
    /// nodes uncordon` lifts it sooner); 0: such a node is not cordoned.
    #[serde(default = "default_faulty_cordon")]
    pub faulty_node_cordon_s: u64,
}

fn default_interval() -> f64 {
    30.0
}
fn default_cooldown() -> f64 {
    60.0
}
fn default_true() -> bool {
    true
}
fn default_max_resumes() -> u32 {
    3
}
fn default_faulty_cordon() -> u64 {
    3600
}

impl Default for LiveConfig {
    fn default() -> Self {
        LiveConfig {
            interval_s: default_interval(),
            cooldown_s: default_cooldown(),
            pin_while_plan_in_flight: true,
            max_resumes: default_max_resumes(),
            roles: RolesConfig::default(),
            faulty_node_cordon_s: default_faulty_cordon(),
        }
    }
}

impl LiveConfig {
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.interval_s.is_finite() && self.interval_s > 0.0) {
            return Err(PolicyError::InvalidConfig(format!(
                "live.interval_s is {}, expected more than 0",
                self.interval_s
            )));
        }
        if !(self.cooldown_s.is_finite() && self.cooldown_s >= 0.0) {
            return Err(PolicyError::InvalidConfig(format!(
                "live.cooldown_s is {}, expected 0 or more",
                self.cooldown_s
            )));
        }
        if let Some(why) = self.roles.problem() {
            return Err(PolicyError::InvalidConfig(why));
        }
        Ok(())
    }
}
