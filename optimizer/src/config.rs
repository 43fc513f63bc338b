//! The operator's policy file: which allocation policy shares the cluster and which runtime
//! heuristics correct running jobs, in TOML.
//!
//! ```toml
//! [allocation]
//! policy = "max_min_fairness"
//!
//! [[heuristics]]
//! kind = "hot_ps"
//! hot_fraction = 0.85
//! cooldown_s = 300
//! ```
//!
//! A `[scheduler]` table names the round-based scheduler ([`SchedulerKind`]), e.g.
//! `kind = "pollux"`: what `brainctl whatif` replays and what the live brain runs each round
//! (`elastic_lp` when none is named). `[live]` paces the live brain ([`LiveConfig`]:
//! `interval_s`, `cooldown_s`).
//!
//! Unknown fields and bad values are rejected with their path (`heuristics[0].hot_fracton`).
//! A file without `[[heuristics]]` gets all four with their defaults; `heuristics = []` turns
//! them off.

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::heuristics::{HeuristicKind, Heuristics};
use crate::live::LiveConfig;
use crate::policy::PolicyKind;
use crate::schedule::SchedulerKind;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The LP policy that shares the cluster (default: max-sum throughput).
    #[serde(default = "default_allocation")]
    pub allocation: PolicyKind,
    #[serde(default = "default_heuristics")]
    pub heuristics: Vec<HeuristicKind>,
    /// The round-based scheduler for elastic GPU jobs (what `brainctl whatif` replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerKind>,
    /// Pacing of the live brain's rounds.
    #[serde(default)]
    pub live: LiveConfig,
}

fn default_allocation() -> PolicyKind {
    PolicyKind::MaxSumThroughput(Default::default())
}

fn default_heuristics() -> Vec<HeuristicKind> {
    Heuristics::default().heuristics
}

impl PolicyConfig {
    /// Parses and validates a policy file's text.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let de = toml::Deserializer::parse(text)
            .map_err(|e| PolicyError::InvalidConfig(format!("{e}")))?;
        let config: PolicyConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            PolicyError::InvalidConfig(format!("{path}: {}", e.inner().message()))
        })?;
        config.heuristics().validate()?;
        config.live.validate()?;
        Ok(config)
    }

    pub fn heuristics(&self) -> Heuristics {
        Heuristics {
            heuristics: self.heuristics.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    #[test]
    fn a_policy_file_names_the_policy_and_tunes_heuristics() {
        let c = PolicyConfig::from_toml(
            r#"
            [allocation]
            policy = "max_sum_throughput"
            normalize = true

            [[heuristics]]
            kind = "speed_up"
            grow_efficiency = 0.8
            "#,
        )
        .unwrap();
        assert_eq!(c.allocation.name(), "max_sum_throughput");
        assert_eq!(c.heuristics.len(), 1);
        let c = PolicyConfig::from_toml("[allocation]\npolicy = \"max_min_fairness\"\n").unwrap();
        assert_eq!(c.heuristics.len(), 4, "defaults when none are named");
        let c =
            PolicyConfig::from_toml("heuristics = []\n[allocation]\npolicy = \"min_makespan\"\n")
                .unwrap();
        assert!(c.heuristics.is_empty());
        let c = PolicyConfig::from_toml(
            "[allocation]\npolicy = \"max_min_fairness\"\n[scheduler]\nkind = \"tiresias\"\nqueue_threshold_gpu_s = 3600\n",
        )
        .unwrap();
        assert_eq!(
            c.scheduler,
            Some(SchedulerKind::Tiresias(crate::schedule::Tiresias {
                queue_threshold_gpu_s: 3600.0
            }))
        );
        let c = PolicyConfig::from_toml("[live]\ninterval_s = 2\ncooldown_s = 5\n").unwrap();
        assert_eq!((c.live.interval_s, c.live.cooldown_s), (2.0, 5.0));
        assert!(
            PolicyConfig::from_toml("[live]\ninterval_s = 0\n")
                .unwrap_err()
                .to_string()
                .contains("live.interval_s is 0")
        );
        let e = PolicyConfig::from_toml(
            "[allocation]\npolicy = \"max_min_fairness\"\n[scheduler]\nkind = \"pollux\"\npp = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("scheduler") && e.contains("pp"), "{e}");
    }

    #[test]
    fn mistakes_are_reported_with_their_path() {
        for (text, expected) in [
            (
                "[allocation]\npolicy = \"max_min_fairness\"\n[[heuristics]]\nkind = \"hot_ps\"\nhot_fracton = 0.8\n",
                "heuristics[0]",
            ),
            ("[allocation]\npolicy = \"fastest\"\n", "fastest"),
            (
                "[allocation]\npolicy = \"max_sum_throughput\"\nnormalise = true\n",
                "normalise",
            ),
            ("[alocation]\npolicy = \"max_min_fairness\"\n", "alocation"),
            (
                "[allocation]\npolicy = \"max_min_fairness\"\n[[heuristics]]\nkind = \"speed_up\"\nshrink_efficiency = 0.9\n",
                "speed_up.shrink_efficiency",
            ),
            ("[allocation\n", "invalid policy settings"),
        ] {
            let e = PolicyConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
    }
}
