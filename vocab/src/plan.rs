//! The scale plan: what the brain (or an operator) asks a job master to carry out. Per role a
//! target count and the resources of processes launched from then on, plus migrations (one
//! process replaced by one with other resources, its state handed over). Versions increase per
//! job; the optimizer builds plans, the job master validates and carries them out, the wire
//! carries them ([`crate::wire`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::JobId;
use crate::role::{Role, SlotKey};
use crate::spec::Resources;

/// What one role should become.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleTarget {
    pub count: u32,
    /// Resources of processes launched from now on; `None` keeps the role's.
    pub resources: Option<Resources>,
    /// Where the sender (the brain's round) placed the processes the plan adds, in the order
    /// of their indices from the role's current count, as the platform names the nodes: each
    /// is launched there while that node still holds it, else where the job master finds
    /// room. Empty: the job master places them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// Replace one process by one with other resources, its state handed over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Migration {
    pub key: SlotKey,
    pub resources: Resources,
    pub reason: String,
}

/// A versioned plan for one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScalePlan {
    /// The job it is for, where the sender numbers jobs (the brain); a job master's own plans
    /// leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobId>,
    pub version: u64,
    /// Target per role; a role left out keeps its count and resources.
    pub roles: BTreeMap<Role, RoleTarget>,
    pub migrations: Vec<Migration>,
    /// Why, one line per decision, for `brainctl plan --dry-run` and the logs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

impl ScalePlan {
    /// A plan that only sets `role`'s count.
    pub fn count(version: u64, role: Role, count: u32) -> Self {
        let mut plan = ScalePlan {
            version,
            ..Default::default()
        };
        plan.set_count(role, count);
        plan
    }

    /// Sets `role`'s target count, keeping resources already asked for.
    pub fn set_count(&mut self, role: Role, count: u32) {
        self.roles.entry(role).or_default().count = count;
    }

    /// The target count of `role`, if the plan names it.
    pub fn count_of(&self, role: Role) -> Option<u32> {
        self.roles.get(&role).map(|t| t.count)
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty() && self.migrations.is_empty()
    }
}
