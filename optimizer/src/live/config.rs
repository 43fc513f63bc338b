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
    /// How long a job master's writes of its job's state (its run directory's context) may go
    /// on failing, seconds, before the job fails with the reason and its processes stop: a
    /// job that cannot keep its record could lose or repeat work. Told to each master the
    /// brain starts from then on (`job-master run --persist-give-up-ms`).
    #[serde(default = "default_state_write_give_up")]
    pub state_write_give_up_s: u64,
}

/// The longest a job master's state writes may fail before its job fails: a day.
pub const MAX_STATE_WRITE_GIVE_UP_S: u64 = 86_400;

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
fn default_state_write_give_up() -> u64 {
    60
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
            state_write_give_up_s: default_state_write_give_up(),
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
        if self.state_write_give_up_s == 0 || self.state_write_give_up_s > MAX_STATE_WRITE_GIVE_UP_S
        {
            return Err(PolicyError::InvalidConfig(format!(
                "live.state_write_give_up_s is {}, expected 1 to {MAX_STATE_WRITE_GIVE_UP_S} \
                 (a day): a job whose state cannot be written must fail in the end",
                self.state_write_give_up_s
            )));
        }
        if let Some(why) = self.roles.problem() {
            return Err(PolicyError::InvalidConfig(why));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_write_give_up_of_none_or_past_a_day_is_refused() {
        assert_eq!(LiveConfig::default().state_write_give_up_s, 60);
        for bad in [0, MAX_STATE_WRITE_GIVE_UP_S + 1] {
            let c = LiveConfig {
                state_write_give_up_s: bad,
                ..LiveConfig::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("live.state_write_give_up_s"), "{e}");
        }
        let c: LiveConfig = toml::from_str("state_write_give_up_s = 300").unwrap();
        assert_eq!(c.state_write_give_up_s, 300);
        c.validate().unwrap();
    }
}
