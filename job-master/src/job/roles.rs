//! Every role group of a job by name ([`Roles`]): the training group's roles (a ps job's `ps`
//! and `worker`, or an allreduce job's all-reduce group) and the others (service, single and
//! further all-reduce groups). Each [`RoleGroup`] keeps what it should be (`desired`, the
//! resources plans set) apart from what runs (its processes' slots, by index).
//!
//! The training group's processes meet in rendezvous rounds or a PS cluster, read the data
//! and are resized by transitions; the others start, fail and are resized on their own
//! (`services`). Lookups by process name a group's kind: [`Roles::slot`] finds a training
//! process only, [`Roles::any`] a process of any group.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{RoleGroup, Slot, SlotKey};
use crate::spec::{Resources, Role};

/// A job's role groups by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Roles(BTreeMap<Role, RoleGroup>);

impl Roles {
    /// Adds `role`'s group, empty, of the training group or not.
    pub(super) fn add(&mut self, role: Role, training: bool, desired: u32) {
        self.0.insert(
            role,
            RoleGroup {
                training,
                desired,
                ..RoleGroup::default()
            },
        );
    }

    /// `role`'s group, of any kind.
    pub fn group(&self, role: Role) -> Option<&RoleGroup> {
        self.0.get(&role)
    }

    pub fn group_mut(&mut self, role: Role) -> Option<&mut RoleGroup> {
        self.0.get_mut(&role)
    }

    /// Every group, by role name.
    pub fn groups(&self) -> impl Iterator<Item = (Role, &RoleGroup)> {
        self.0.iter().map(|(r, g)| (*r, g))
    }

    /// The training group's roles, by name.
    pub fn training(&self) -> impl Iterator<Item = (Role, &RoleGroup)> {
        self.groups().filter(|(_, g)| g.training)
    }

    /// The groups outside the training group (service, single and further all-reduce
    /// groups), by name.
    pub fn services(&self) -> impl Iterator<Item = (Role, &RoleGroup)> {
        self.groups().filter(|(_, g)| !g.training)
    }

    /// `role`'s group, where it is outside the training group.
    pub fn service(&self, role: Role) -> Option<&RoleGroup> {
        self.0.get(&role).filter(|g| !g.training)
    }

    pub fn service_mut(&mut self, role: Role) -> Option<&mut RoleGroup> {
        self.0.get_mut(&role).filter(|g| !g.training)
    }

    /// The slot of a training process.
    pub fn slot(&self, key: SlotKey) -> Option<&Slot> {
        self.0
            .get(&key.role)
            .filter(|g| g.training)
            .and_then(|g| g.slots.get(&key.index))
    }

    pub fn slot_mut(&mut self, key: SlotKey) -> Option<&mut Slot> {
        self.0
            .get_mut(&key.role)
            .filter(|g| g.training)
            .and_then(|g| g.slots.get_mut(&key.index))
    }

    /// Puts `slot` in its role's group (which [`Roles::add`] made).
    pub(super) fn insert_slot(&mut self, slot: Slot) {
        let group = self.0.get_mut(&slot.key.role).expect("the role's group");
        group.slots.insert(slot.key.index, slot);
    }

    /// The slot of a training process, made (incarnation 0, launching) where it has none.
    pub(super) fn slot_or_new(&mut self, key: SlotKey, now_ms: u64) -> &mut Slot {
        let group = self.0.entry(key.role).or_insert_with(|| RoleGroup {
            training: true,
            ..RoleGroup::default()
        });
        group
            .slots
            .entry(key.index)
            .or_insert_with(|| Slot::new(key, 0, now_ms))
    }

    /// The slot of a process of any group.
    pub fn any(&self, key: SlotKey) -> Option<&Slot> {
        self.0.get(&key.role).and_then(|g| g.slots.get(&key.index))
    }

    pub fn any_mut(&mut self, key: SlotKey) -> Option<&mut Slot> {
        self.0
            .get_mut(&key.role)
            .and_then(|g| g.slots.get_mut(&key.index))
    }

    /// The training group's slots, in key order (role name, then index).
    pub fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.0
            .values()
            .filter(|g| g.training)
            .flat_map(|g| g.slots.values())
    }

    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut Slot> {
        self.0
            .values_mut()
            .filter(|g| g.training)
            .flat_map(|g| g.slots.values_mut())
    }

    /// Every slot of the job: the training group's, then each other group's.
    pub fn all(&self) -> impl Iterator<Item = &Slot> {
        self.slots().chain(
            self.0
                .values()
                .filter(|g| !g.training)
                .flat_map(|g| g.slots.values()),
        )
    }

    /// Relaunches of every role group so far (the training group's and the services'), for
    /// the roles that had any: what the report and the summary count.
    pub fn restarts(&self) -> BTreeMap<Role, u32> {
        self.groups()
            .filter(|(_, g)| g.restarts > 0)
            .map(|(r, g)| (r, g.restarts))
            .collect()
    }

    /// The resources plans set for the training group's roles' future launches.
    pub fn training_resources(&self) -> BTreeMap<Role, Resources> {
        self.training()
            .filter_map(|(r, g)| g.resources.clone().map(|x| (r, x)))
            .collect()
    }

    /// Puts the training group's roles' resources back to `resources` (none where it names
    /// none).
    pub(super) fn set_training_resources(&mut self, resources: &BTreeMap<Role, Resources>) {
        for (role, g) in self.0.iter_mut().filter(|(_, g)| g.training) {
            g.resources = resources.get(role).cloned();
        }
    }
}

/// Persisted contexts written before the role groups were one map (before 2026-12-06): the
/// training group's slots (`slots`, keyed `role-index`), its relaunches (`restarts`) and
/// plans' resources (`role_resources`) beside the other groups (`services`).
pub mod legacy {
    use serde_json::{Map, Value};

    /// Rewrites an older context's JSON into today's form, in place; a context of today's
    /// form is left as it is. The training group's desired counts are its live slots.
    pub fn upgrade(ctx: &mut Value) -> Result<(), String> {
        let Some(obj) = ctx.as_object_mut() else {
            return Err("the context is not a JSON object".into());
        };
        if obj.contains_key("roles") || !obj.contains_key("slots") {
            return Ok(());
        }
        let take = |obj: &mut Map<String, Value>, field: &str| match obj.remove(field) {
            Some(Value::Object(m)) => Ok(m),
            None | Some(Value::Null) => Ok(Map::new()),
            Some(other) => Err(format!("{field}: expected an object, found {other}")),
        };
        let slots = take(obj, "slots")?;
        let restarts = take(obj, "restarts")?;
        let resources = take(obj, "role_resources")?;
        let mut roles = take(obj, "services")?;
        for group in roles.values_mut() {
            if let Some(g) = group.as_object_mut() {
                g.insert("training".into(), Value::Bool(false));
            }
        }
        for (key, slot) in slots {
            let Some((role, index)) = key.rsplit_once('-') else {
                return Err(format!("slots: {key:?} is not a process name"));
            };
            let live = slot
                .get("phase")
                .and_then(Value::as_str)
                .is_some_and(|p| p != "Removing" && p != "Removed");
            let group = roles
                .entry(role.to_string())
                .or_insert_with(|| {
                    serde_json::json!({
                        "training": true,
                        "desired": 0,
                        "slots": {},
                        "restarts": restarts.get(role).cloned().unwrap_or(Value::from(0)),
                        "resources": resources.get(role).cloned().unwrap_or(Value::Null),
                    })
                })
                .as_object_mut()
                .ok_or_else(|| format!("services.{role}: expected an object"))?;
            if live {
                let n = group.get("desired").and_then(Value::as_u64).unwrap_or(0);
                group.insert("desired".into(), Value::from(n + 1));
            }
            group
                .get_mut("slots")
                .and_then(Value::as_object_mut)
                .ok_or_else(|| format!("services.{role}.slots: expected an object"))?
                .insert(index.to_string(), slot);
        }
        obj.insert("roles".into(), Value::Object(roles));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::{JobContext, SlotPhase, Timing};
    use super::*;

    /// A ps job with a rollout service: its worker relaunched twice with a plan's resources,
    /// its last worker removed.
    fn context() -> JobContext {
        let spec = crate::spec::JobSpec::from_yaml(
            "name: p\nkind: ps\nroles:\n  ps: { replicas: 1 }\n  worker: { replicas: 3, max: 4 }\n\
             \x20 rollout: { replicas: 2, min: 1, max: 4, command: [serve] }\n\
             workload:\n  builtin: {}\ndata: { num_samples: 100, shard_size: 10 }\n\
             checkpoint: { dir: /tmp/brain-roles-legacy-test }\n",
        )
        .unwrap();
        spec.validate().unwrap();
        let (mut ctx, _) = JobContext::new(spec, "p-1".into(), Timing::default(), 0);
        let worker = ctx.roles.group_mut(Role::WORKER).unwrap();
        worker.restarts = 2;
        worker.resources = Some(Resources {
            cpu: Some(vocab::Millicores(1500)),
            ..Resources::default()
        });
        worker.desired = 2;
        let last = SlotKey {
            role: Role::WORKER,
            index: 2,
        };
        ctx.roles.slot_mut(last).unwrap().phase = SlotPhase::Removed;
        ctx
    }

    /// `ctx` as a job master wrote it before the role groups were one map.
    fn written_before(ctx: &JobContext) -> Value {
        let mut v = serde_json::to_value(ctx).unwrap();
        let obj = v.as_object_mut().unwrap();
        let Value::Object(roles) = obj.remove("roles").unwrap() else {
            panic!("roles is a map")
        };
        let (mut slots, mut services) = (json!({}), json!({}));
        let (mut restarts, mut resources) = (json!({}), json!({}));
        for (role, mut group) in roles {
            if group.get("training") != Some(&Value::Bool(true)) {
                services[&role] = group;
                continue;
            }
            if group["restarts"] != json!(0) {
                restarts[&role] = group["restarts"].take();
            }
            if !group["resources"].is_null() {
                resources[&role] = group["resources"].take();
            }
            for (index, slot) in group["slots"].as_object().unwrap() {
                slots[format!("{role}-{index}")] = slot.clone();
            }
        }
        obj.insert("slots".into(), slots);
        obj.insert("services".into(), services);
        obj.insert("restarts".into(), restarts);
        obj.insert("role_resources".into(), resources);
        v
    }

    #[test]
    fn a_context_written_before_role_groups_were_one_map_reads_back_the_same() {
        let ctx = context();
        let mut old = written_before(&ctx);
        assert!(old.get("roles").is_none() && old["slots"].get("worker-2").is_some());
        legacy::upgrade(&mut old).unwrap();
        let back: JobContext = serde_json::from_value(old).unwrap();
        assert_eq!(back, ctx);
        assert_eq!(back.roles.restarts(), [(Role::WORKER, 2)].into());
        let rollout = Role::new("rollout").unwrap();
        assert!(
            back.roles.service(rollout).is_some()
                && back
                    .roles
                    .slot(SlotKey {
                        role: rollout,
                        index: 0
                    })
                    .is_none()
        );
        // Today's form is left as it is; a malformed one is refused with the field.
        let mut today = serde_json::to_value(&ctx).unwrap();
        legacy::upgrade(&mut today).unwrap();
        assert_eq!(today, serde_json::to_value(&ctx).unwrap());
        let mut bad = written_before(&ctx);
        bad["services"] = json!([1]);
        assert!(
            legacy::upgrade(&mut bad)
                .unwrap_err()
                .starts_with("services: expected an object")
        );
        let mut bad = written_before(&ctx);
        bad["slots"]["worker"] = bad["slots"]["worker-0"].clone();
        assert!(
            legacy::upgrade(&mut bad)
                .unwrap_err()
                .contains("\"worker\" is not a process name")
        );
    }
}
