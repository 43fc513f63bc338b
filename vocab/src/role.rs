//! What a process is in a job: the job's kind, the role of a process, and its slot.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which distributed training strategy the job uses.
///
/// The default, `allreduce`, only serves values built in code with `..Default::default()`: a
/// job spec always names its kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// Parameter servers hold the model; workers pull, compute, push asynchronously.
    Ps,
    /// Workers hold replicas of the model and average gradients with a ring all-reduce.
    #[default]
    Allreduce,
}

impl std::str::FromStr for JobKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ps" => Ok(JobKind::Ps),
            "allreduce" => Ok(JobKind::Allreduce),
            other => Err(format!("kind {other:?}: expected \"ps\" or \"allreduce\"")),
        }
    }
}

impl fmt::Display for JobKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobKind::Ps => "ps",
            JobKind::Allreduce => "allreduce",
        })
    }
}

/// The role a process of a job plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Ps,
    Worker,
}

impl Role {
    pub const ALL: [Role; 2] = [Role::Ps, Role::Worker];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Ps => "ps",
            Role::Worker => "worker",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ps" => Ok(Role::Ps),
            "worker" => Ok(Role::Worker),
            other => Err(format!("unknown role {other:?}")),
        }
    }
}

/// One process slot of a job: its role and index (`worker-3`). A slot keeps its key across
/// relaunches; each launch is a new incarnation.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
pub struct SlotKey {
    pub role: Role,
    pub index: u32,
}

impl std::str::FromStr for SlotKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (role, index) = s
            .rsplit_once('-')
            .ok_or_else(|| format!("{s:?} is not <role>-<index>"))?;
        let role = role.parse()?;
        let index = index.parse().map_err(|e| format!("index of {s:?}: {e}"))?;
        Ok(SlotKey { role, index })
    }
}

impl fmt::Display for SlotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.role, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_keys_read_back_what_they_print() {
        for key in [
            SlotKey {
                role: Role::Ps,
                index: 0,
            },
            SlotKey {
                role: Role::Worker,
                index: 12,
            },
        ] {
            assert_eq!(key.to_string().parse::<SlotKey>(), Ok(key));
        }
        assert_eq!(
            "gpu-1".parse::<SlotKey>(),
            Err("unknown role \"gpu\"".to_string())
        );
        assert!("worker".parse::<SlotKey>().is_err());
    }
}
