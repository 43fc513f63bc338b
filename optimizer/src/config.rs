//! The operator's policy file, in TOML: which scheduler shares the cluster, which runtime
//! heuristics correct running jobs, and how the live loop is paced.
//!
//! ```toml
//! [scheduler]
//! kind = "gavel"
//! [scheduler.allocation]
//! policy = "max_min_fairness"
//!
//! [[heuristics]]
//! kind = "hot_ps"
//! hot_fraction = 0.85
//! cooldown_s = 300
//! ```
//!
//! `[scheduler]` names the round-based scheduler ([`SchedulerKind`]): what `brainctl whatif`
//! replays and what the live brain runs each round (`elastic_lp` when none is named); an LP
//! allocation policy shares the cluster through the `gavel` scheduler's `[scheduler.allocation]`.
//! `[[heuristics]]` correct running jobs in every live round ([`crate::live`]). `[live]` paces
//! the live brain ([`LiveConfig`]); `[submissions]` says what a submitted job may run
//! ([`SubmissionPolicy`]).
//!
//! Unknown fields and bad values are rejected with their path (`heuristics[0].hot_fracton`).
//! A top-level `[allocation]` (read by nothing since the LP policies moved under the `gavel`
//! scheduler) is refused with where it belongs. A file without `[[heuristics]]` gets all four
//! with their defaults; `heuristics = []` turns them off.

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::heuristics::{HeuristicKind, Heuristics};
use crate::live::LiveConfig;
use crate::schedule::{Scheduler, SchedulerKind};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    #[serde(default = "default_heuristics")]
    pub heuristics: Vec<HeuristicKind>,
    /// The round-based scheduler for elastic GPU jobs (what `brainctl whatif` replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerKind>,
    /// Pacing of the live brain's rounds.
    #[serde(default)]
    pub live: LiveConfig,
    /// What a job submitted to the live brain may run.
    #[serde(default)]
    pub submissions: SubmissionPolicy,
}

/// What a submitted job may run (`[submissions]`): a `command:` job runs only a whole command
/// the operator allows here, program and arguments, so that an allowed interpreter is no way
/// to run code of the job's choosing (`python3 -c CODE`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmissionPolicy {
    /// The commands a `command:` job may run, each written as a command line (shell words):
    /// the program as the job writes it, then one pattern per argument (`*` any text, `?` one
    /// character, `[..]` a class, within the word); a last word `...` lets any further
    /// arguments follow. `"python3 examples/pytorch-ddp/train.py ..."` allows that script with
    /// any arguments, and no other. Empty (the default): `command:` jobs are refused, only the
    /// built-in workload runs.
    #[serde(default)]
    pub commands: Vec<CommandPattern>,
}

/// One allowed command: the program, a pattern per argument, and whether more may follow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CommandPattern {
    text: String,
    program: String,
    args: Vec<glob::Pattern>,
    more: bool,
}

impl TryFrom<String> for CommandPattern {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let words = shlex::split(&text)
            .ok_or_else(|| format!("{text:?}: not a command line (unbalanced quotes)"))?;
        let (program, rest) = words
            .split_first()
            .ok_or_else(|| format!("{text:?}: an empty command"))?;
        if program.contains(['*', '?', '[']) || program == "..." {
            return Err(format!(
                "{text:?}: the program is named as written, without patterns"
            ));
        }
        let more = rest.last().is_some_and(|w| w == "...");
        let rest = if more { &rest[..rest.len() - 1] } else { rest };
        let args = rest
            .iter()
            .map(|w| {
                if w == "..." {
                    return Err(format!("{text:?}: `...` may only end a command"));
                }
                glob::Pattern::new(w).map_err(|e| format!("{text:?}: {w:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(CommandPattern {
            program: program.clone(),
            args,
            more,
            text,
        })
    }
}

/// Whether `word`, read as a path, has a `..` component (it may climb out of a directory).
pub fn climbs(word: &str) -> bool {
    word.split('/').any(|c| c == "..")
}

impl From<CommandPattern> for String {
    fn from(p: CommandPattern) -> String {
        p.text
    }
}

impl CommandPattern {
    /// Whether `argv` (program first) is this command. A pattern stays within its directory:
    /// `*`, `?` and `[..]` never match a `/`, and a word with a `..` component never matches
    /// (`scripts/*.py` admits `scripts/a.py`, never `scripts/../../anything.py`).
    pub fn matches(&self, argv: &[String]) -> bool {
        const WITHIN: glob::MatchOptions = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        let Some((program, args)) = argv.split_first() else {
            return false;
        };
        if argv.iter().any(|w| climbs(w)) {
            return false;
        }
        let count_ok = if self.more {
            args.len() >= self.args.len()
        } else {
            args.len() == self.args.len()
        };
        *program == self.program
            && count_ok
            && self
                .args
                .iter()
                .zip(args)
                .all(|(p, a)| p.matches_with(a, WITHIN))
    }

    /// As the operator wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

fn default_heuristics() -> Vec<HeuristicKind> {
    Heuristics::default().heuristics
}

impl PolicyConfig {
    /// Parses and validates a policy file's text.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let de = toml::Deserializer::parse(text)
            .map_err(|e| PolicyError::InvalidConfig(format!("{e}")))?;
        if text
            .parse::<toml::Table>()
            .is_ok_and(|t| t.contains_key("allocation"))
        {
            return Err(PolicyError::InvalidConfig(
                "allocation: a top-level [allocation] is not read; an LP allocation policy \
                 shares the cluster through the gavel scheduler: [scheduler] kind = \"gavel\" \
                 with [scheduler.allocation] policy = ..."
                    .into(),
            ));
        }
        let config: PolicyConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            PolicyError::InvalidConfig(format!("{path}: {}", e.inner().message()))
        })?;
        if let Some(s) = &config.scheduler {
            s.validate().map_err(|e| match e {
                PolicyError::InvalidConfig(m) => {
                    PolicyError::InvalidConfig(format!("scheduler: {m}"))
                }
                e => e,
            })?;
        }
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

    #[test]
    fn a_command_pattern_stays_in_its_directory() {
        let p: CommandPattern = "python3 scripts/*.py ...".to_string().try_into().unwrap();
        let argv = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert!(p.matches(&argv(&["python3", "scripts/train.py", "--lr", "0.1"])));
        for bad in [
            &["python3", "scripts/../../anything.py"][..],
            &["python3", "scripts/a/b.py"],
            &["python3", "scripts/x.py", "../../etc/passwd"],
            &["python3", "scripts/..", "x"],
        ] {
            assert!(!p.matches(&argv(bad)), "{bad:?}");
        }
        let any: CommandPattern = "python3 *".to_string().try_into().unwrap();
        assert!(
            !any.matches(&argv(&["python3", "/etc/x.py"])),
            "`*` crosses no `/`"
        );
        assert!(any.matches(&argv(&["python3", "x.py"])));
    }

    #[test]
    fn a_policy_file_names_the_policy_and_tunes_heuristics() {
        let c = PolicyConfig::from_toml(
            r#"
            [scheduler]
            kind = "gavel"
            [scheduler.allocation]
            policy = "max_sum_throughput"
            normalize = true

            [[heuristics]]
            kind = "speed_up"
            grow_efficiency = 0.8
            "#,
        )
        .unwrap();
        assert_eq!(
            c.scheduler.as_ref().unwrap().scheduler().name(),
            "gavel_max_throughput"
        );
        assert_eq!(c.heuristics.len(), 1);
        let c = PolicyConfig::from_toml("").unwrap();
        assert_eq!(c.heuristics.len(), 4, "defaults when none are named");
        let c = PolicyConfig::from_toml("heuristics = []\n").unwrap();
        assert!(c.heuristics.is_empty());
        let c = PolicyConfig::from_toml(
            "[scheduler]\nkind = \"tiresias\"\nqueue_threshold_gpu_s = 3600\n",
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
        let e = PolicyConfig::from_toml("[scheduler]\nkind = \"pollux\"\npp = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("scheduler") && e.contains("pp"), "{e}");
    }

    #[test]
    fn an_allowed_command_is_a_whole_command_line() {
        let c = PolicyConfig::from_toml(
            "[submissions]\ncommands = [\"python3 train.py --lr=* ...\", \"/bin/echo hi\"]\n",
        )
        .unwrap();
        let allowed = |argv: &[&str]| {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            c.submissions.commands.iter().any(|p| p.matches(&argv))
        };
        assert!(allowed(&["python3", "train.py", "--lr=0.1"]));
        assert!(allowed(&[
            "python3", "train.py", "--lr=0.1", "--epochs", "2"
        ]));
        assert!(allowed(&["/bin/echo", "hi"]));
        for no in [
            &["python3", "-c", "import os"][..],
            &["python3", "train.py"],
            &["python3", "other.py", "--lr=1"],
            &["/bin/echo", "hi", "there"],
            &["/bin/echo"],
            &["echo", "hi"],
            &[],
        ] {
            assert!(!allowed(no), "{no:?}");
        }
        // It is written back as the operator wrote it.
        let back = toml::to_string(&c.submissions).unwrap();
        assert!(back.contains("python3 train.py --lr=* ..."), "{back}");
    }

    #[test]
    fn mistakes_are_reported_with_their_path() {
        for (text, expected) in [
            (
                "[[heuristics]]\nkind = \"hot_ps\"\nhot_fracton = 0.8\n",
                "heuristics[0]",
            ),
            (
                "[scheduler]\nkind = \"gavel\"\n[scheduler.allocation]\npolicy = \"fastest\"\n",
                "fastest",
            ),
            (
                "[allocation]\npolicy = \"max_min_fairness\"\n",
                "allocation: a top-level [allocation] is not read; an LP allocation policy shares the cluster through the gavel scheduler",
            ),
            ("[alocation]\npolicy = \"max_min_fairness\"\n", "alocation"),
            (
                "[[heuristics]]\nkind = \"speed_up\"\nshrink_efficiency = 0.9\n",
                "speed_up.shrink_efficiency",
            ),
            ("[allocation\n", "invalid policy settings"),
            (
                "[[heuristics]]\nkind = \"hot_ps\"\n[[heuristics]]\nkind = \"oom_growth\"\n\
                 [[heuristics]]\nkind = \"hot_ps\"\nmax_ps = 2\n",
                "heuristics[2]: hot_ps is already heuristics[0]",
            ),
            (
                "[[heuristics]]\nkind = \"hot_ps\"\nmax_cpu = 400\n\
                 [[heuristics]]\nkind = \"pending_shrink\"\nmin_ps_cpu = 500\n",
                "heuristics[1].min_ps_cpu (500m) is above heuristics[0].max_cpu (400m)",
            ),
            (
                "[scheduler]\nkind = \"elastic_lp\"\nfairness_weight = -0.1\n",
                "scheduler: fairness_weight is -0.1, expected 0 or more",
            ),
            (
                "[scheduler]\nkind = \"pollux\"\np = 2\n",
                "scheduler: p is 2, expected a negative number",
            ),
            (
                "[scheduler]\nkind = \"dlrover\"\ngrow_efficiency = 0.1\n",
                "scheduler: efficiencies grow 0.1 / shrink 0.4",
            ),
            (
                "[submissions]\ncommands = [\"python3 ... x\"]\n",
                "`...` may only end a command",
            ),
            (
                "[submissions]\ncommands = [\"py* train.py\"]\n",
                "the program is named as written",
            ),
            ("[submissions]\ncommands = [\"\"]\n", "an empty command"),
            (
                "[submissions]\ncommands = [\"python3 'x\"]\n",
                "unbalanced quotes",
            ),
        ] {
            let e = PolicyConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
    }
}
