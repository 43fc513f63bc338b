//! What a round decides: per job a [`Decision`] (its role groups' counts, migrations, the
//! reasons), and the [`RoundPlan`] of all of them with the capacity they use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::LiveState;
use crate::heuristics::Change;
use crate::plan::{Migration, Role, ScalePlan};
use crate::units::JobId;

/// What the round decided for one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub job: JobId,
    pub name: String,
    pub state: LiveState,
    /// The role groups the round sizes, each with its count now and from now on: the
    /// training group first (always; keyed `worker` inside the round, which names its
    /// processes `worker-N`, and flagged; 0 now for a queued job, 0 from now on for one that
    /// keeps waiting), then the parameter servers where the job has or gets any, then each
    /// service role the round resizes. Kept in that shape by [`Decision::sizing`] and
    /// [`Decision::resize`], and refused when read back in another ([`training_first`]).
    #[serde(deserialize_with = "training_first")]
    pub(super) roles: Vec<RoleChange>,
    /// Processes replaced by ones with other resources (the heuristics' corrections).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<Migration>,
    /// What the heuristics changed, to be remembered for their cool-downs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corrections: Vec<Change>,
    pub predicted_samples_per_s: f64,
    pub reasons: Vec<String>,
    /// A GPU job's GPU model (the one it starts on, or runs on) and where its workers' GPUs
    /// fit (node, GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_placement: Vec<(String, u32)>,
    /// Where the round placed the processes a running job's plan adds, by role (the training
    /// group as `worker`), in the order of their indices from the role's count now, as the
    /// platform names the nodes (where it reports them): the plan names them, and the job
    /// master launches each there while that node holds it. A role left out, or a process
    /// past its list, is placed by the job master. For a start, every process it starts with
    /// from index 0 ([`Decision::start_nodes`]), which its job master is told when started.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<Role, Vec<String>>,
}

impl Decision {
    /// A decision for `job` that sizes its training group `workers` (now, from now on) and
    /// its parameter servers `ps` (listed where it has or gets any), and nothing else yet.
    pub fn sizing(
        job: JobId,
        name: &str,
        state: LiveState,
        workers: (u32, u32),
        ps: (u32, u32),
    ) -> Decision {
        let mut roles = vec![RoleChange {
            role: Role::WORKER,
            from: workers.0,
            to: workers.1,
            training: true,
        }];
        if ps.0 > 0 || ps.1 > 0 {
            roles.push(RoleChange {
                role: Role::PS,
                from: ps.0,
                to: ps.1,
                training: false,
            });
        }
        Decision {
            job,
            name: name.to_string(),
            state,
            roles,
            migrations: Vec::new(),
            corrections: Vec::new(),
            predicted_samples_per_s: 0.0,
            reasons: Vec::new(),
            gpu_type: None,
            gpu_placement: Vec::new(),
            nodes: BTreeMap::new(),
        }
    }

    /// The training group's change (keyed `worker`).
    pub fn training(&self) -> RoleChange {
        self.roles[0]
    }

    /// Workers now (0 for a queued job).
    pub fn from_workers(&self) -> u32 {
        self.roles[0].from
    }

    /// Workers from now on (0: the job keeps waiting).
    pub fn to_workers(&self) -> u32 {
        self.roles[0].to
    }

    /// The training group's size from now on.
    pub fn set_workers(&mut self, to: u32) {
        self.roles[0].to = to;
    }

    /// Parameter servers now, and from now on (0 where the job has none).
    pub fn ps(&self) -> u32 {
        self.change_of(Role::PS).map_or(0, |c| c.from)
    }

    pub fn to_ps(&self) -> u32 {
        self.change_of(Role::PS).map_or(0, |c| c.to)
    }

    /// The change of one role group, where the decision lists it (the training group as
    /// `worker`).
    pub fn change_of(&self, role: Role) -> Option<RoleChange> {
        self.roles.iter().find(|c| c.role == role).copied()
    }

    /// A service role resized from `from` to `to` processes (its earlier resize in this
    /// decision replaced).
    pub fn resize(&mut self, role: Role, from: u32, to: u32) {
        let change = RoleChange {
            role,
            from,
            to,
            training: false,
        };
        match self.roles.iter_mut().skip(1).find(|c| c.role == role) {
            Some(c) => *c = change,
            None => self.roles.push(change),
        }
    }

    /// The service roles the decision resizes: (role, from, to), in the order resized.
    pub fn resized_roles(&self) -> Vec<(Role, u32, u32)> {
        self.roles
            .iter()
            .skip(1)
            .filter(|c| c.role != Role::PS)
            .map(|c| (c.role, c.from, c.to))
            .collect()
    }

    /// Whether the job changes: its size (a queued job that starts included), or, running,
    /// the count of another of its role groups or a process's resources.
    pub fn changes(&self) -> bool {
        self.from_workers() != self.to_workers()
            || (self.state == LiveState::Running
                && (self.roles.iter().any(|c| c.from != c.to) || !self.migrations.is_empty()))
    }

    /// The plan that carries a running job's decision out: the counts that change, the
    /// migrations, and the reasons. The round sizes a job's training group as its `workers`
    /// (the heuristics name its processes `worker-N`); `trainer` is the role the job calls it
    /// (`worker`, or an all-reduce group's own name), and the plan speaks that name.
    pub fn scale_plan(&self, version: u64, trainer: Role) -> ScalePlan {
        let named = |mut m: Migration| {
            if m.key.role == Role::WORKER {
                m.key.role = trainer;
            }
            m
        };
        let mut plan = ScalePlan {
            version,
            migrations: self.migrations.iter().cloned().map(named).collect(),
            reasons: self.reasons.clone(),
            ..Default::default()
        };
        for change in self.role_changes(trainer) {
            if change.from == change.to {
                continue;
            }
            plan.set_count(change.role, change.to);
            let placed = match change.training {
                true => self.nodes.get(&Role::WORKER),
                false => self.nodes.get(&change.role),
            };
            if let (Some(nodes), Some(target)) = (placed, plan.roles.get_mut(&change.role)) {
                let adds = change.to.saturating_sub(change.from) as usize;
                target.nodes = nodes.iter().take(adds).cloned().collect();
            }
        }
        plan
    }

    pub fn starts(&self) -> bool {
        self.state == LiveState::Queued && self.to_workers() > 0
    }

    /// Where a start's processes go, by role as the job names them (the training group as
    /// `trainer`), each role's from index 0; empty for a decision that starts nothing, or
    /// where the platform reports no nodes.
    pub fn start_nodes(&self, trainer: Role) -> BTreeMap<Role, Vec<String>> {
        if !self.starts() {
            return BTreeMap::new();
        }
        self.nodes
            .iter()
            .map(|(&role, on)| match role == Role::WORKER {
                true => (trainer, on.clone()),
                false => (role, on.clone()),
            })
            .collect()
    }

    /// The role groups the round sizes, each with its count now and from now on, as the job
    /// names them: the training group (under `trainer`, the role the job calls it; always
    /// listed, 0 → 0 for a job that keeps waiting), the parameter servers where the job has
    /// or gets any, then each service role it resizes. What a dry run shows of the decision,
    /// role by role.
    pub fn role_changes(&self, trainer: Role) -> Vec<RoleChange> {
        let mut changes = self.roles.clone();
        changes[0].role = trainer;
        changes
    }
}

/// Reads a decision's role groups, refusing a list whose training group is not first and
/// alone, or that names a role twice: the accessors read the training group at index 0.
fn training_first<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<RoleChange>, D::Error> {
    use serde::de::Error;
    let roles = Vec::<RoleChange>::deserialize(d)?;
    match roles.first() {
        None => {
            return Err(D::Error::custom(
                "a decision sizes its training group: none listed",
            ));
        }
        Some(first) if !first.training => {
            return Err(D::Error::custom(format!(
                "a decision lists its training group first: {} is not it",
                first.role
            )));
        }
        Some(_) => {}
    }
    if let Some(extra) = roles.iter().skip(1).find(|c| c.training) {
        return Err(D::Error::custom(format!(
            "a decision has one training group: {} and {} are both flagged",
            roles[0].role, extra.role
        )));
    }
    for (i, c) in roles.iter().enumerate() {
        if roles[..i].iter().any(|o| o.role == c.role) {
            return Err(D::Error::custom(format!(
                "a decision lists each role group once: {} twice",
                c.role
            )));
        }
    }
    Ok(roles)
}

/// One role group's size before and after a round's decision ([`Decision::role_changes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleChange {
    pub role: Role,
    pub from: u32,
    pub to: u32,
    /// The training group, which the round sizes by its speed model (the others by their
    /// callers' rates, or the PS by the heuristics).
    pub training: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundPlan {
    pub scheduler: String,
    pub decisions: Vec<Decision>,
    /// CPU and processes of the running and starting jobs at the decided sizes.
    pub cpu_millicores: u64,
    pub processes: u32,
    /// Memory they ask for, bytes (what roles ask no memory for counts nothing).
    #[serde(default)]
    pub memory_bytes: u64,
    pub notes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(from: u32, to: u32, ps: (u32, u32)) -> Decision {
        Decision::sizing(JobId(1), "j", LiveState::Running, (from, to), ps)
    }

    #[test]
    fn a_decision_lists_its_role_groups_the_training_group_under_the_jobs_name_for_it() {
        let change = |role: &str, from, to, training| RoleChange {
            role: Role::new(role).unwrap(),
            from,
            to,
            training,
        };
        // An all-reduce job whose group is `trainer`, resizing a service role: no PS listed.
        let mut d = decision(2, 4, (0, 0));
        d.resize(Role::new("rollout").unwrap(), 1, 3);
        let trainer = Role::new("trainer").unwrap();
        assert_eq!(
            d.role_changes(trainer),
            [
                change("trainer", 2, 4, true),
                change("rollout", 1, 3, false)
            ]
        );
        // The plan speaks the same names and counts.
        let plan = d.scale_plan(3, trainer);
        assert_eq!(plan.count_of(trainer), Some(4));
        assert_eq!(plan.count_of(Role::new("rollout").unwrap()), Some(3));
        // No nodes named: the job master places them all.
        assert!(plan.roles.values().all(|t| t.nodes.is_empty()));
        // A ps job gaining a PS; a job that keeps waiting is listed 0 -> 0.
        assert_eq!(
            decision(3, 3, (1, 2)).role_changes(Role::WORKER),
            [change("worker", 3, 3, true), change("ps", 1, 2, false)]
        );
        assert_eq!(
            decision(0, 0, (0, 0)).role_changes(Role::WORKER),
            [change("worker", 0, 0, true)]
        );
    }

    #[test]
    fn a_plan_names_the_nodes_the_round_placed_what_it_adds_on_under_the_jobs_names() {
        let rollout = Role::new("rollout").unwrap();
        let trainer = Role::new("trainer").unwrap();
        use crate::live::tests::names;
        let mut d = decision(2, 3, (1, 2));
        d.resize(rollout, 1, 3);
        d.nodes = [
            (Role::WORKER, names(&["b"])),
            (Role::PS, names(&["c"])),
            // More than the role adds: the rest are dropped.
            (rollout, names(&["a", "b", "c"])),
        ]
        .into();
        let plan = d.scale_plan(4, trainer);
        assert_eq!(plan.roles[&trainer].nodes, ["b"]);
        assert_eq!(plan.roles[&Role::PS].nodes, ["c"]);
        assert_eq!(plan.roles[&rollout].nodes, ["a", "b"]);
        assert!(!plan.roles.contains_key(&Role::WORKER));
        // Nodes of a role the plan does not grow are not sent.
        d.set_workers(2);
        let plan = d.scale_plan(5, trainer);
        assert!(!plan.roles.contains_key(&trainer));
        // A running job's nodes are not a start's.
        assert!(d.start_nodes(trainer).is_empty());
    }

    #[test]
    fn a_starts_nodes_are_given_under_the_jobs_names() {
        let rollout = Role::new("rollout").unwrap();
        let trainer = Role::new("trainer").unwrap();
        let mut d = decision(0, 2, (1, 1));
        d.state = LiveState::Queued;
        d.nodes = [
            (Role::WORKER, vec!["a".to_string(), "b".into()]),
            (Role::PS, vec!["a".into()]),
            (rollout, vec!["b".into()]),
        ]
        .into();
        assert_eq!(
            d.start_nodes(trainer),
            BTreeMap::from([
                (trainer, vec!["a".to_string(), "b".into()]),
                (Role::PS, vec!["a".into()]),
                (rollout, vec!["b".into()]),
            ])
        );
        // One that keeps waiting starts nothing anywhere.
        d.set_workers(0);
        assert!(d.start_nodes(trainer).is_empty());
    }

    #[test]
    fn a_decision_is_read_back_as_written_and_refused_without_its_training_group_first() {
        let mut d = decision(2, 3, (1, 2));
        d.resize(Role::new("rollout").unwrap(), 1, 2);
        let json = serde_json::to_value(&d).unwrap();
        let back: Decision = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, d);
        let with_roles = |roles: serde_json::Value| {
            let mut j = json.clone();
            j["roles"] = roles;
            serde_json::from_value::<Decision>(j)
                .unwrap_err()
                .to_string()
        };
        let change = |role: &str, training: bool| serde_json::json!({"role": role, "from": 1, "to": 2, "training": training});
        let err = with_roles(serde_json::json!([]));
        assert!(err.contains("none listed"), "{err}");
        let err = with_roles(serde_json::json!([
            change("ps", false),
            change("worker", true)
        ]));
        assert!(err.contains("first: ps is not it"), "{err}");
        let err = with_roles(serde_json::json!([
            change("worker", true),
            change("critic", true)
        ]));
        assert!(err.contains("worker and critic are both flagged"), "{err}");
        let err = with_roles(serde_json::json!([
            change("worker", true),
            change("ps", false),
            change("ps", false)
        ]));
        assert!(err.contains("ps twice"), "{err}");
    }
}
