//! What a process is in a job: the job's kind, the role of a process (a name, one of the job's
//! role groups), and its slot.

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

/// The role a process of a job plays: the name of one of the job's role groups (`ps`,
/// `worker`, `rollout`, `reward`, ...). Roles are data: a job names its own in its spec.
///
/// A role name is a DNS-1123 label that starts with a letter (at most 63 lowercase letters,
/// digits and `-`, not ending with `-`), so it can name a host, a Ray placement-group bundle and a
/// file. Names are interned: a `Role` is a copyable pointer to one shared copy of the name,
/// compared and ordered by the name. At most [`MAX_ROLE_NAMES`] distinct names live in one
/// process (a spec interns its roles' names only once their count is within the spec limit,
/// so a refused spec of many roles costs nothing); a name beyond that is refused, saying so.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Role(&'static str);

/// The most distinct role names one process keeps: far beyond any real use (a brain taking
/// a job of 64 new role names every minute reaches it after a year), at most 64 MiB of names.
pub const MAX_ROLE_NAMES: usize = 1 << 20;

static NAMES: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

impl Role {
    /// The parameter servers of a `kind: ps` job.
    pub const PS: Role = Role("ps");
    /// The training processes of a `kind: ps` or `kind: allreduce` job.
    pub const WORKER: Role = Role("worker");

    /// The role called `name`, if it is a valid role name.
    pub fn new(name: &str) -> Result<Role, String> {
        match name {
            "ps" => return Ok(Role::PS),
            "worker" => return Ok(Role::WORKER),
            _ => {}
        }
        crate::spec::limits::dns_label(name).map_err(|why| format!("role name: {why}"))?;
        if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(format!("role name {name:?}: must start with a letter"));
        }
        let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&known) = names.get(name) {
            return Ok(Role(known));
        }
        if names.len() >= MAX_ROLE_NAMES {
            return Err(format!(
                "role name {name:?}: this process already knows {MAX_ROLE_NAMES} distinct role \
                 names, the most it keeps; it takes the names it knows, and new ones once \
                 restarted"
            ));
        }
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(leaked);
        Ok(Role(leaked))
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// Whether `name` is interned already (tests).
    #[cfg(test)]
    pub(crate) fn is_known(name: &str) -> bool {
        NAMES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }
}

impl fmt::Debug for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Role({:?})", self.0)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Role::new(s)
    }
}

impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Role::new(&name).map_err(serde::de::Error::custom)
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

/// A role's target count as a command line writes it: `rollout=4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleCount {
    pub role: Role,
    pub count: u32,
}

impl std::str::FromStr for RoleCount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (role, count) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not <role>=<count> (e.g. rollout=4)"))?;
        let role = role.trim().parse()?;
        let count = count
            .trim()
            .parse()
            .map_err(|e| format!("count of {s:?}: {e}"))?;
        Ok(RoleCount { role, count })
    }
}

/// Targets per role from `--workers`, `--ps` and `--role NAME=N` flags; a role named twice is
/// refused.
pub fn role_targets(
    workers: Option<u32>,
    ps: Option<u32>,
    roles: &[RoleCount],
) -> Result<std::collections::BTreeMap<Role, u32>, String> {
    let mut out = std::collections::BTreeMap::new();
    let short = [(Role::WORKER, workers), (Role::PS, ps)];
    let named = roles.iter().map(|r| (r.role, Some(r.count)));
    for (role, count) in short.into_iter().chain(named) {
        if let Some(count) = count
            && out.insert(role, count).is_some()
        {
            return Err(format!("role {role} is given two targets"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_counts_parse_and_a_role_named_twice_is_refused() {
        let r: RoleCount = "rollout=4".parse().unwrap();
        assert_eq!((r.role.as_str(), r.count), ("rollout", 4));
        assert!("rollout".parse::<RoleCount>().is_err());
        assert!("rollout=-1".parse::<RoleCount>().is_err());
        assert!("Roll=1".parse::<RoleCount>().is_err());
        let t = role_targets(Some(3), None, &[r]).unwrap();
        assert_eq!(t[&Role::WORKER], 3);
        assert_eq!(t[&r.role], 4);
        let twice = "worker=2".parse::<RoleCount>().unwrap();
        let e = role_targets(Some(3), None, &[twice]).unwrap_err();
        assert_eq!(e, "role worker is given two targets");
    }

    #[test]
    fn slot_keys_read_back_what_they_print() {
        for key in [
            SlotKey {
                role: Role::PS,
                index: 0,
            },
            SlotKey {
                role: Role::WORKER,
                index: 12,
            },
        ] {
            assert_eq!(key.to_string().parse::<SlotKey>(), Ok(key));
        }
        let rollout = "rollout-engine-3".parse::<SlotKey>().unwrap();
        assert_eq!(rollout.role.as_str(), "rollout-engine");
        assert_eq!(rollout.index, 3);
        assert_eq!(rollout.to_string(), "rollout-engine-3");
        assert!("worker".parse::<SlotKey>().is_err());
        assert!("Worker-1".parse::<SlotKey>().is_err());
        assert!("-1".parse::<SlotKey>().is_err());
    }
}

#[cfg(test)]
mod role_names {
    use super::*;

    #[test]
    fn a_role_is_its_name_interned_once() {
        let a = Role::new("rollout").unwrap();
        let b: Role = "rollout".parse().unwrap();
        assert_eq!(a, b);
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(Role::new("ps").unwrap(), Role::PS);
        assert!(Role::PS < Role::WORKER);
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"rollout\"");
        assert_eq!(serde_json::from_str::<Role>("\"rollout\"").unwrap(), a);
    }

    #[test]
    fn names_that_are_not_dns_labels_are_refused() {
        for bad in ["", "Rollout", "roll_out", "-x", "x-", "1x", &"a".repeat(64)] {
            let e = Role::new(bad).unwrap_err();
            assert!(e.starts_with("role name"), "{bad:?}: {e}");
        }
        assert!(serde_json::from_str::<Role>("\"a b\"").is_err());
    }
}
