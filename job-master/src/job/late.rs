//! Workers that join the training group after its round closed without them, while no plan is
//! on its way (a platform that placed one late, at the start or after a group restart): the
//! group re-forms once more to take them in, as a plan's Settle does for its own late workers
//! (`advance.rs`). The group drains to a cut, the cut is committed on disk (the late workers
//! load it from there), and the members are told to re-form; the next round takes in the late
//! ones. A script on the SDK, or the built-in all-reduce workers, whose cut is held in flash
//! memory re-form at once instead, rank 0 of the cut sending the late ones its state over the
//! new group (`flash.rs`). A command that does not re-form in place would have to restart the
//! whole group for them, and a worker slow to start is as slow again after the restart (likely
//! what a CI run showed: a command's workers at their third incarnation in two minutes, never
//! training): its late workers are left outside the group until its next plan or restart, said
//! in an event.

use super::*;

/// Where a re-formation for late joiners is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LateReform {
    /// Draining to the cut the late workers will load.
    AtCut,
    /// The cut is committed: the members re-form until a round numbered at least this closes.
    ToRound(u64),
    /// A command's late workers, left outside the group until its next restart (or plan).
    LeftOut,
}

impl JobContext {
    /// Starts a re-formation when workers within the group's size wait outside its round and
    /// nothing else is under way (a plan, a cut, a cancel, a replacement).
    pub(super) fn take_in_late_joiners(&mut self, now_ms: u64) -> Vec<Effect> {
        self.late_reform_formed();
        let quiet = self.phase == JobPhase::Running
            && self.transition.is_none()
            && self.late_reform.is_none()
            && !self.checkpoint_pending
            && self.cancelling.is_none()
            && self.stability.replace_at_cut.is_none()
            && !self.ledger.is_complete();
        if !quiet {
            return Vec::new();
        }
        let Some((closed, late)) = self.late_joiners() else {
            return Vec::new();
        };
        let why = format!(
            "worker(s) {late:?} joined after round {closed} closed without them and no plan is \
             on its way"
        );
        if self.restarts_to_rescale() {
            self.late_reform = Some(LateReform::LeftOut);
            self.log(
                now_ms,
                format!(
                    "{why}: a command that does not re-form in place takes them in at its next \
                     plan or restart"
                ),
            );
            return Vec::new();
        }
        self.log(
            now_ms,
            format!("{why}: the group drains to a cut and re-forms to take them in"),
        );
        self.late_reform = Some(LateReform::AtCut);
        self.checkpoint_pending = true;
        Vec::new()
    }

    /// The workers within the group's size that wait outside its closed round, and the round.
    fn late_joiners(&mut self) -> Option<(u64, Vec<u32>)> {
        let trainer = self.trainer();
        let size = self.role_counts().get(&trainer).copied().unwrap_or(0);
        let (closed, late) = self.rendezvous_now()?.late_joiners()?;
        let late: Vec<u32> = late.into_iter().filter(|&i| i < size).collect();
        (!late.is_empty()).then_some((closed, late))
    }

    /// The cut committed: when it was taken for late joiners, the members are told to re-form
    /// (true). A plan that came meanwhile re-forms the group itself.
    pub(super) fn late_reform_at_cut(&mut self, now_ms: u64) -> bool {
        if self.late_reform != Some(LateReform::AtCut) {
            return false;
        }
        if self.transition.is_some() {
            self.late_reform = None;
            return false;
        }
        let Some(r) = self.group.rendezvous_mut() else {
            self.late_reform = None;
            return false;
        };
        r.invalidate();
        let round = r.next_round_number();
        self.late_reform = Some(LateReform::ToRound(round));
        self.log(
            now_ms,
            format!("the group re-forms from the cut as round {round}, with the late worker(s)"),
        );
        true
    }

    /// Whether the members are told to leave their round and re-form (for late joiners): until
    /// the round that takes them in closes.
    pub(super) fn late_reform_reforming(&self) -> bool {
        let Some(LateReform::ToRound(n)) = self.late_reform else {
            return false;
        };
        let current = self.group.rendezvous().and_then(|r| r.current());
        current.is_none_or(|c| c.number < n)
    }

    /// The re-formation is over once its round closed.
    fn late_reform_formed(&mut self) {
        let Some(LateReform::ToRound(n)) = self.late_reform else {
            return;
        };
        let current = self.group.rendezvous().and_then(|r| r.current());
        if current.is_some_and(|c| c.number >= n) {
            self.late_reform = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{W0, W1, elastic, round_size, spec};
    use super::*;

    const W2: SlotKey = SlotKey {
        role: Role::WORKER,
        index: 2,
    };

    fn events(ctx: &JobContext) -> Vec<&str> {
        ctx.events.iter().map(|e| e.text.as_str()).collect()
    }

    /// A built-in allreduce job of 3 whose round closed with workers 0 and 1 (worker 2's
    /// platform slow); then worker 2 registers and joins. The closed round's number.
    fn round_without_worker_2() -> (JobContext, u64) {
        let (mut ctx, _) = JobContext::new(
            spec("allreduce", 0, 3, 0),
            "t-1".into(),
            Timing::default(),
            0,
        );
        elastic(&mut ctx);
        for key in [W0, W1] {
            ctx.register_agent(key, 1, "h".into(), format!("127.0.0.1:{}", key.index), 1)
                .unwrap();
            ctx.join_rendezvous(key, 1, 2).unwrap();
        }
        let r = ctx.group.rendezvous_mut().unwrap();
        assert!(r.try_close(2) || r.try_close(1_000_000));
        let round = r.current().unwrap().number;
        ctx.register_agent(W2, 1, "h".into(), "127.0.0.1:2".into(), 3)
            .unwrap();
        assert!(!ctx.join_rendezvous(W2, 1, 4).unwrap().ready);
        (ctx, round)
    }

    #[test]
    fn a_worker_that_joins_after_its_round_closed_is_taken_in_at_the_next_cut() {
        let (mut ctx, round) = round_without_worker_2();
        assert!(ctx.take_in_late_joiners(5).is_empty());
        assert!(ctx.checkpoint_pending);
        assert_eq!(ctx.late_reform, Some(LateReform::AtCut));
        assert!(
            events(&ctx).contains(
                &"worker(s) [2] joined after round 0 closed without them and no plan is on its \
                  way: the group drains to a cut and re-forms to take them in"
            ),
            "{:?}",
            events(&ctx)
        );
        // Nothing more while it is under way.
        assert!(ctx.take_in_late_joiners(6).is_empty());
        // Drained: rank 0 saves the cut to disk and commits it (worker 2 loads it).
        let (v, _) = ctx.lease_with(W0, 1, None, Some(round), 7).unwrap();
        assert!(v.checkpoint_due && !v.reform);
        let g = ctx.generation;
        ctx.checkpoint_committed(1, "/c/m.json".into(), 40, g, 9)
            .unwrap();
        assert!(!ctx.checkpoint_pending);
        // The members are told to re-form, and the next round takes in all three.
        let (v, _) = ctx.lease_with(W1, 1, None, Some(round), 10).unwrap();
        assert!(v.reform);
        for key in [W0, W1, W2] {
            ctx.join_rendezvous(key, 1, 11).unwrap();
        }
        let view = ctx.join_rendezvous(W2, 1, 12).unwrap();
        assert!(view.ready);
        // Its members train in it at once, before a tick has seen it close.
        let (v, _) = ctx.lease_with(W2, 1, None, Some(view.round), 12).unwrap();
        assert!(!v.reform);
        assert_eq!(round_size(&ctx), 3);
        assert!(ctx.take_in_late_joiners(13).is_empty());
        assert_eq!(ctx.late_reform, None);
        assert!(!ctx.checkpoint_pending);
        let (v, _) = ctx.lease_with(W0, 1, None, Some(view.round), 14).unwrap();
        assert!(!v.reform);
    }

    #[test]
    fn a_script_s_late_worker_gets_the_cut_from_rank_0_with_no_wait_for_the_disk() {
        let (mut ctx, round) = round_without_worker_2();
        ctx.spec.workload.builtin = None;
        ctx.spec.workload.command = Some(vec!["train".into()]);
        ctx.spec.workload.rescale = Some(crate::spec::Rescale::InPlace);
        assert!(ctx.process_joins());
        late_worker_gets_the_cut_from_rank_0(ctx, round);
    }

    /// The built-in all-reduce workers send it over their ring the same way.
    #[test]
    fn a_builtin_late_worker_gets_the_cut_from_rank_0_with_no_wait_for_the_disk() {
        let (ctx, round) = round_without_worker_2();
        assert!(ctx.is_builtin() && !ctx.process_joins());
        late_worker_gets_the_cut_from_rank_0(ctx, round);
    }

    /// Worker 2 waits outside `round`: the group drains to a cut held in memory, re-forms at
    /// once, and rank 0 of the cut sends each rank its state.
    fn late_worker_gets_the_cut_from_rank_0(mut ctx: JobContext, round: u64) {
        ctx.take_in_late_joiners(5);
        let (v, _) = ctx.lease_with(W0, 1, None, Some(round), 7).unwrap();
        assert!(v.checkpoint_due);
        ctx.cut_in_memory(W0, 1, 40, 8).unwrap();
        assert!(
            !ctx.checkpoint_saving && !ctx.checkpoint_pending,
            "no wait for the disk"
        );
        assert!(
            events(&ctx).iter().any(|e| e.contains(
                "training goes on while it is written out; the workers that joined late get it \
                 from rank 0 over the new group"
            )),
            "{:?}",
            events(&ctx)
        );
        // Told to re-form at once: the round after takes in all three, worker 0 (rank 0 of
        // the cut) sending the cut's state to each.
        let (v, _) = ctx.lease_with(W1, 1, None, Some(round), 10).unwrap();
        assert!(v.reform);
        for key in [W0, W1, W2] {
            ctx.join_rendezvous(key, 1, 11).unwrap();
        }
        for (key, rank) in [(W0, 0), (W1, 1), (W2, 2)] {
            let v = ctx.join_rendezvous(key, 1, 12).unwrap();
            assert!(v.ready, "{key}: {v:?}");
            assert_eq!(
                (v.rank, v.state_from_rank0),
                (rank, Some(40)),
                "{key}: {v:?}"
            );
        }
        assert!(ctx.take_in_late_joiners(13).is_empty());
        assert_eq!(ctx.late_reform, None);
        // The copy written out later commits the step; nothing re-forms again.
        let g = ctx.generation;
        ctx.checkpoint_committed(1, "/c/m.json".into(), 40, g, 14)
            .unwrap();
        assert_eq!(ctx.late_reform, None);
        let (v, _) = ctx.lease_with(W2, 1, None, Some(round + 1), 15).unwrap();
        assert!(!v.reform, "{v:?}");
    }

    #[test]
    fn a_command_s_late_worker_is_left_out_until_its_next_restart_said_once() {
        let (mut ctx, _) = round_without_worker_2();
        ctx.spec.workload.builtin = None;
        ctx.spec.workload.command = Some(vec!["train".into()]);
        assert!(ctx.restarts_to_rescale());
        let g = ctx.generation;
        for t in [5, 6] {
            assert!(ctx.take_in_late_joiners(t).is_empty(), "no restart");
        }
        assert_eq!(ctx.generation, g);
        assert!(!ctx.checkpoint_pending);
        assert_eq!(ctx.late_reform, Some(LateReform::LeftOut));
        let said = events(&ctx)
            .iter()
            .filter(|e| e.contains("takes them in at its next plan or restart"))
            .count();
        assert_eq!(said, 1, "{:?}", events(&ctx));
        // A restart (for whatever reason) takes everyone in anew.
        ctx.group_restart(7, "for the test");
        assert_eq!(ctx.late_reform, None);
    }

    #[test]
    fn a_late_joiner_waits_while_a_plan_is_on_its_way_and_a_failed_cut_lets_it_try_again() {
        let (mut ctx, _) = round_without_worker_2();
        ctx.checkpoint_pending = true;
        assert!(ctx.take_in_late_joiners(5).is_empty());
        assert_eq!(ctx.late_reform, None, "a cut is under way");
        ctx.checkpoint_pending = false;
        ctx.take_in_late_joiners(6);
        assert_eq!(ctx.late_reform, Some(LateReform::AtCut));
        let g = ctx.generation;
        ctx.checkpoint_failed(g, "disk full".into(), 7);
        assert_eq!(ctx.late_reform, None);
        ctx.take_in_late_joiners(8);
        assert_eq!(ctx.late_reform, Some(LateReform::AtCut));
    }
}
