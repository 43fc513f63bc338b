//! Checkpoints of a further all-reduce group (a critic trained by ranks of its own): the group's
//! rank 0 writes its state to a file under `<checkpoint.dir>/roles/<role>/` and commits it here
//! (`CommitCheckpoint` from a process of that role); the step committed, its file and digest are
//! the role group's ([`RoleGroup::checkpoint`]), kept with the job's context, so that the
//! group's processes after a restart or a resize restore from it (`GetCommittedStep` answers a
//! process of the role with the role's checkpoint, not the training group's).
//!
//! The group keeps its two newest commits ([`RoleGroup::checkpoint`] and
//! [`RoleGroup::previous_checkpoint`]): a process that finds the newest file missing or damaged
//! restores the one before it. A group that re-formed since its newest commit (a restart or a
//! resize) may commit a step at or before it (it restored an older one): the commits at or
//! after that step are dropped.
//!
//! A commit is refused from a stale incarnation (the group restarted since it saved), from a
//! role that is not a further all-reduce group, for a step not after the one committed by the
//! same formation of the group, and for a file outside the role's directory. The training
//! group's checkpoints are untouched by it.

use super::*;
use std::path::Component;

use crate::spec::Topology;

/// The newest checkpoint a further all-reduce group committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleCheckpoint {
    pub step: u64,
    /// The file its rank 0 wrote (under `<checkpoint.dir>/roles/<role>/`).
    pub path: PathBuf,
    /// The file's SHA-256, as the writer computed it (hex).
    pub digest: String,
    /// Which incarnation of which process committed it, and when.
    pub index: u32,
    pub incarnation: u64,
    pub at_ms: u64,
    /// The group's formation when it was committed ([`JobContext::formation`]; 0 in state
    /// written before it was kept).
    #[serde(default)]
    pub formation: u64,
}

impl JobContext {
    /// Where `role`'s checkpoint files go: `<checkpoint.dir>/roles/<role>/`.
    pub fn role_checkpoint_dir(&self, role: Role) -> PathBuf {
        self.spec.checkpoint.dir.join("roles").join(role.as_str())
    }

    /// Whether `role` is a further all-reduce group (its own collective, outside the training
    /// group): the only role groups that commit checkpoints of their own.
    pub fn is_collective_group(&self, role: Role) -> bool {
        self.is_service(role) && self.spec.topology(role) == Topology::Allreduce
    }

    /// Which formation of `role`'s group runs: the sum of its processes' incarnations, which
    /// grows whenever any of them restarts (a further all-reduce group restarts whole, and a
    /// resize restarts the staying ones).
    pub fn formation(&self, role: Role) -> u64 {
        self.roles
            .group(role)
            .map_or(0, |g| g.slots.values().map(|s| s.incarnation).sum())
    }

    /// The current incarnation of `key`, a process of a further all-reduce group, committed its
    /// group's state at `step` in the file `path` (SHA-256 `digest`).
    pub fn commit_role_checkpoint(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        step: u64,
        path: PathBuf,
        digest: String,
        now_ms: u64,
    ) -> Result<(), Error> {
        self.current(key, incarnation)?;
        let role = key.role;
        if !self.is_collective_group(role) {
            return Err(Error::InvalidRequest(format!(
                "{key} commits a checkpoint of its own, but {role} is not a further all-reduce \
                 group (a role with `topology: allreduce` and a command of its own): the \
                 training group commits through the job's checkpoints, other roles keep their \
                 state themselves"
            )));
        }
        let dir = self.role_checkpoint_dir(role);
        let plain = path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain || path.parent() != Some(dir.as_path()) {
            return Err(Error::InvalidRequest(format!(
                "{key}'s checkpoint {} is not a file in its role's directory {}",
                path.display(),
                dir.display()
            )));
        }
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::InvalidRequest(format!(
                "{key}'s checkpoint digest {:?} is not a SHA-256 in hex",
                digest.chars().take(80).collect::<String>()
            )));
        }
        let formation = self.formation(role);
        let group = self.roles.service_mut(role).expect("a service role");
        if let Some(c) = &group.checkpoint
            && step <= c.step
            && formation == c.formation
        {
            return Err(Error::InvalidRequest(format!(
                "{key} commits step {step}, but {role} has committed step {} already",
                c.step
            )));
        }
        // A group that re-formed since restored an older step: what it committed at or
        // after this step is no longer its line.
        let kept = [group.previous_checkpoint.take(), group.checkpoint.take()];
        let mut kept = kept.into_iter().flatten().filter(|c| c.step < step);
        group.previous_checkpoint = kept.next_back();
        group.checkpoint = Some(RoleCheckpoint {
            step,
            path: path.clone(),
            digest,
            index: key.index,
            incarnation,
            at_ms: now_ms,
            formation,
        });
        self.log(
            now_ms,
            format!(
                "{role} checkpoint committed at step {step} by {key} ({})",
                path.display()
            ),
        );
        Ok(())
    }

    /// The checkpoint `key`'s role group committed, for a process of a further all-reduce
    /// group (none yet: `None`); an error for a process the job does not have.
    pub fn role_checkpoint_for(&self, key: SlotKey) -> Result<Option<&RoleCheckpoint>, Error> {
        Ok(self.role_checkpoints_for(key)?.into_iter().next())
    }

    /// The checkpoints `key`'s role group keeps, the newest first (at most two: the one
    /// before is restored where the newest file is missing or damaged).
    pub fn role_checkpoints_for(&self, key: SlotKey) -> Result<Vec<&RoleCheckpoint>, Error> {
        self.slot(key)?;
        Ok(self.roles.service(key.role).map_or(Vec::new(), |g| {
            g.checkpoint
                .iter()
                .chain(g.previous_checkpoint.iter())
                .collect()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> (JobContext, Role) {
        let spec = JobSpec::from_yaml(
            "name: rl\nkind: allreduce\nroles:\n  worker: { replicas: 1 }\n  \
             rollout: { replicas: 1, command: [rollout] }\n  \
             critic: { topology: allreduce, replicas: 2, min: 1, max: 3, command: [critic] }\n\
             workload:\n  builtin: {}\n\
             data: { num_samples: 1000, shard_size: 10 }\ncheckpoint: { dir: /ck }\n",
        )
        .unwrap();
        spec.validate().unwrap();
        let (ctx, _) = JobContext::new(spec, "r".into(), Timing::default(), 0);
        (ctx, Role::new("critic").unwrap())
    }

    fn key(role: Role, index: u32) -> SlotKey {
        SlotKey { role, index }
    }

    const SHA: &str = "aa000000000000000000000000000000000000000000000000000000000000bb";

    #[test]
    fn a_further_groups_checkpoint_is_its_own_and_moves_only_forward() {
        let (mut ctx, critic) = job();
        let file = |step: u64| PathBuf::from(format!("/ck/roles/critic/step-{step}.pt"));
        assert_eq!(ctx.role_checkpoint_for(key(critic, 1)).unwrap(), None);
        ctx.commit_role_checkpoint(key(critic, 0), 1, 10, file(10), SHA.into(), 5)
            .unwrap();
        // Every process of the group is told the group's checkpoint.
        let c = ctx.role_checkpoint_for(key(critic, 1)).unwrap().unwrap();
        assert_eq!((c.step, c.path.clone(), c.index), (10, file(10), 0));
        assert!(
            ctx.events
                .last()
                .unwrap()
                .text
                .contains("critic checkpoint committed at step 10")
        );
        // The training group's checkpoints are not touched, nor is it told the critic's.
        assert_eq!(ctx.committed_step(), None);
        assert_eq!(ctx.role_checkpoint_for(key(Role::WORKER, 0)).unwrap(), None);

        let refused =
            |ctx: &mut JobContext, k: SlotKey, inc: u64, step: u64, path: PathBuf, d: &str| {
                ctx.commit_role_checkpoint(k, inc, step, path, d.into(), 6)
                    .unwrap_err()
                    .to_string()
            };
        let e = refused(&mut ctx, key(critic, 0), 1, 10, file(10), SHA);
        assert!(e.contains("has committed step 10 already"), "{e}");
        let e = refused(&mut ctx, key(critic, 0), 2, 20, file(20), SHA);
        assert!(e.contains("stale"), "{e}");
        let e = refused(
            &mut ctx,
            key(critic, 0),
            1,
            20,
            "/ck/roles/rollout/x.pt".into(),
            SHA,
        );
        assert!(
            e.contains("not a file in its role's directory /ck/roles/critic"),
            "{e}"
        );
        for bad in [
            "/ck/roles/critic/../x",
            "/ck/roles/critic/..",
            "ck/roles/critic/x",
        ] {
            let e = refused(&mut ctx, key(critic, 0), 1, 20, bad.into(), SHA);
            assert!(
                e.contains("not a file in its role's directory"),
                "{bad}: {e}"
            );
        }
        let e = refused(&mut ctx, key(critic, 0), 1, 20, file(20), "abc");
        assert!(e.contains("not a SHA-256"), "{e}");
        let rollout = Role::new("rollout").unwrap();
        let e = refused(&mut ctx, key(rollout, 0), 1, 20, file(20), SHA);
        assert!(
            e.contains("rollout is not a further all-reduce group"),
            "{e}"
        );
        let e = refused(&mut ctx, key(Role::WORKER, 0), 1, 20, file(20), SHA);
        assert!(
            e.contains("worker is not a further all-reduce group"),
            "{e}"
        );
        assert!(
            refused(&mut ctx, key(critic, 7), 1, 20, file(20), SHA).contains("unknown process")
        );
        // Nothing refused changed it.
        assert_eq!(
            ctx.role_checkpoint_for(key(critic, 0))
                .unwrap()
                .unwrap()
                .step,
            10
        );

        // Another rank may commit the next one (rank 0 after a resize may be another index).
        ctx.commit_role_checkpoint(key(critic, 1), 1, 20, file(20), SHA.into(), 7)
            .unwrap();
        assert_eq!(
            ctx.role_checkpoint_for(key(critic, 0))
                .unwrap()
                .unwrap()
                .step,
            20
        );
    }

    #[test]
    fn a_further_group_keeps_its_two_newest_commits_and_goes_back_only_once_it_reformed() {
        let (mut ctx, critic) = job();
        let file = |step: u64| PathBuf::from(format!("/ck/roles/critic/step-{step}.pt"));
        let commit = |ctx: &mut JobContext, inc: u64, step: u64| {
            ctx.commit_role_checkpoint(key(critic, 0), inc, step, file(step), SHA.into(), 5)
        };
        let kept = |ctx: &JobContext| -> Vec<u64> {
            let kept = ctx.role_checkpoints_for(key(critic, 1)).unwrap();
            kept.iter().map(|c| c.step).collect()
        };
        for step in [5, 10, 15] {
            commit(&mut ctx, 1, step).unwrap();
        }
        assert_eq!(kept(&ctx), [15, 10], "the newest first, two at most");
        // The same formation never goes back.
        let e = commit(&mut ctx, 1, 10).unwrap_err().to_string();
        assert!(e.contains("has committed step 15 already"), "{e}");
        // Resized, the group re-forms (its staying processes restart) and restored step 10
        // (step 15's file was damaged): its commit at step 12 replaces 15, 10 stays before it.
        let formed = ctx.formation(critic);
        ctx.apply_plan(
            vocab::ScalePlan::count(1, critic, 3),
            &crate::scale::Capacity::default(),
            10,
        )
        .unwrap();
        assert!(ctx.formation(critic) > formed);
        let inc = ctx.roles.any(key(critic, 0)).unwrap().incarnation;
        commit(&mut ctx, inc, 12).unwrap();
        assert_eq!(kept(&ctx), [12, 10]);
        // Within its new formation it moves forward only.
        let e = commit(&mut ctx, inc, 12).unwrap_err().to_string();
        assert!(e.contains("has committed step 12 already"), "{e}");
        commit(&mut ctx, inc, 20).unwrap();
        assert_eq!(kept(&ctx), [20, 12]);
        // Read back, it keeps both.
        let back: JobContext = serde_json::from_str(&serde_json::to_string(&ctx).unwrap()).unwrap();
        assert_eq!(kept(&back), [20, 12]);
    }

    #[test]
    fn a_further_groups_checkpoint_outlives_its_restart_and_resize_and_a_reread_context() {
        let (mut ctx, critic) = job();
        let file = PathBuf::from("/ck/roles/critic/step-3.pt");
        ctx.commit_role_checkpoint(key(critic, 0), 1, 3, file, SHA.into(), 5)
            .unwrap();
        ctx.apply_plan(
            vocab::ScalePlan::count(1, critic, 3),
            &crate::scale::Capacity::default(),
            10,
        )
        .unwrap();
        let back: JobContext = serde_json::from_str(&serde_json::to_string(&ctx).unwrap()).unwrap();
        for i in 0..3 {
            let c = back.role_checkpoint_for(key(critic, i)).unwrap().unwrap();
            assert_eq!((c.step, c.digest.as_str()), (3, SHA));
        }
    }
}
