//! The rendezvous a training process joins: its round, rank and peers (allreduce) or its
//! TF cluster (ps), the checkpoint it resumes from, and whether its round restores together.

use super::*;

impl JobContext {
    pub fn join_rendezvous(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        now_ms: u64,
    ) -> Result<JoinView, Error> {
        self.join_rendezvous_at(key, incarnation, None, now_ms)
    }

    /// [`Self::join_rendezvous`] from a process that will serve on `service_addr` (a new port
    /// after each restart) rather than the address its agent registered.
    pub fn join_rendezvous_at(
        &mut self,
        key: SlotKey,
        incarnation: u64,
        service_addr: Option<String>,
        now_ms: u64,
    ) -> Result<JoinView, Error> {
        self.training(key, incarnation)?;
        if let Some(addr) = service_addr {
            let s = self.roles.slot_mut(key).expect("checked");
            if s.service_addr.as_deref() != Some(addr.as_str()) {
                s.service_addr = Some(addr.clone());
                if key.role == Role::PS
                    && !s.fresh
                    && let Some(c) = self.group.cluster_mut()
                {
                    c.set_ps(key.index, addr);
                }
            }
        }
        let slot = self.current(key, incarnation)?.clone();
        let addr = slot.service_addr.clone().unwrap_or_default();
        let resume_from = if slot.fresh {
            None
        } else {
            self.latest_checkpoint().map(|c| c.manifest.clone())
        };
        let mut view = JoinView {
            ready: false,
            round: 0,
            rank: 0,
            world_size: 0,
            peers: Vec::new(),
            cluster: None,
            waiting_reason: String::new(),
            restart_count: slot.restart_count,
            resume_from,
            removed: false,
            state_from_rank0: None,
            restore_together: false,
        };
        if !slot.phase.is_live() {
            // A removed allreduce member learns it here, at the step boundary where the group
            // re-forms; it leaves without holding anything.
            let member = self.spec.kind == JobKind::Allreduce && key.role == self.trainer();
            if member {
                // Its agent learns from its next heartbeat that it is done; no stop needed.
                let _ = self.remove_slot(key, now_ms);
            }
            view.removed = slot.phase == SlotPhase::Removed || member;
            if view.removed {
                return Ok(view);
            }
        }
        if self.moves_out(&slot) {
            // Its successor is launched by `advance`, once this answer is decided.
            self.roles.slot_mut(key).expect("checked").left_to_move = true;
            view.removed = true;
            return Ok(view);
        }
        match self.spec.kind {
            JobKind::Allreduce => {
                let rdzv = self.rendezvous_now().expect("allreduce jobs have one");
                match rdzv.join(
                    Member {
                        index: key.index,
                        incarnation,
                        addr,
                    },
                    now_ms,
                ) {
                    JoinOutcome::Ready {
                        round,
                        rank,
                        world_size,
                        peers,
                    } => {
                        view.state_from_rank0 = self.peer_state_for(round, &peers);
                        if !slot.fresh {
                            view.resume_from = self.resume_of_round(round);
                        }
                        let s = self.roles.slot_mut(key).expect("checked");
                        s.told_round = round;
                        s.first_round = match s.first_round {
                            // An older master's context: this incarnation may have been told
                            // an earlier round, so it counts as told one.
                            Some(FIRST_ROUND_UNKNOWN) => Some((incarnation, 0)),
                            Some((i, first)) if i == incarnation => Some((i, first)),
                            _ => Some((incarnation, round)),
                        };
                        view.restore_together =
                            view.resume_from.is_some() && self.restores_together(round);
                        view.ready = true;
                        view.round = round;
                        view.rank = rank;
                        view.world_size = world_size;
                        view.peers = peers;
                    }
                    JoinOutcome::Waiting { reason } => view.waiting_reason = reason,
                }
            }
            JobKind::Ps => {
                // A command's TF cluster spec must name every task: nobody starts before all
                // have joined.
                let barrier = self.restarts_to_rescale().then(|| {
                    self.roles.slot_mut(key).expect("checked").joined = incarnation;
                    let live = self.roles.slots().filter(|s| s.phase.is_live());
                    let (joined, all) = live.fold((0, 0), |(j, n), s| {
                        (j + u32::from(s.joined == s.incarnation), n + 1)
                    });
                    (joined, all)
                });
                let trainer = self.trainer();
                let live_workers = self
                    .roles
                    .slots()
                    .filter(|s| s.key.role == trainer && s.phase.is_live())
                    .count() as u32;
                let ps_to = self
                    .transition
                    .as_ref()
                    .and_then(|t| t.to.get(&Role::PS).copied());
                // Workers start only once every PS of the layout runs its current incarnation:
                // an old PS process about to restart must never receive a push.
                let layout_running = self.ps_layout_running();
                let trainer = self.trainer();
                let cluster = self.group.cluster_mut().expect("ps jobs have one");
                if key.role == trainer {
                    cluster.set_worker(key.index, addr);
                }
                if let Some((joined, all)) = barrier {
                    if joined == all && cluster.ps.len() as u32 >= cluster.expected_ps {
                        view.ready = true;
                        view.round = cluster.version;
                        view.rank = key.index;
                        view.world_size = match key.role {
                            Role::PS => cluster.expected_ps,
                            _ => live_workers,
                        };
                    } else {
                        view.waiting_reason = format!(
                            "waiting for every task of the cluster to join ({joined} of {all} have)"
                        );
                    }
                } else if key.role == Role::PS {
                    // A PS needs nothing from the others to start. One added by a reshard serves
                    // the new layout and starts empty.
                    view.ready = true;
                    view.round = cluster.version;
                    view.rank = key.index;
                    view.world_size = if slot.fresh {
                        ps_to.unwrap_or(cluster.expected_ps)
                    } else {
                        cluster.expected_ps
                    };
                } else if layout_running {
                    view.ready = true;
                    view.round = cluster.version;
                    view.rank = key.index;
                    view.world_size = cluster.workers.len() as u32;
                } else {
                    view.waiting_reason = format!(
                        "waiting for the {} parameter servers to run ({} have addresses)",
                        cluster.expected_ps,
                        cluster.ps.len()
                    );
                }
                view.cluster = Some(cluster.clone());
            }
        }
        if view.ready {
            let trainer = self.trainer();
            let s = self.roles.slot_mut(key).expect("checked");
            if s.phase == SlotPhase::Restarting {
                s.phase = SlotPhase::Running;
            }
            if key.role == trainer
                && let Some(c) = self.group.cluster()
            {
                s.ps_version = c.ps_version;
            }
        }
        Ok(view)
    }

    /// The checkpoint the members of `round` resume from: the latest when its first member
    /// is told, and that one for every other member (a commit may come between their answers:
    /// a part copied before a restart, written out late).
    fn resume_of_round(&mut self, round: u64) -> Option<PathBuf> {
        if let Some(t) = &self.resume_told
            && t.round == round
        {
            return t.from.clone();
        }
        let from = self.latest_checkpoint().map(|c| c.manifest.clone());
        self.resume_told = Some(ResumeTold {
            round,
            from: from.clone(),
        });
        from
    }

    /// The rendezvous, told how many live workers have not joined it yet (starting, registering
    /// or about to join): last call waits for them, up to the register timeout.
    pub(super) fn rendezvous_now(&mut self) -> Option<&mut RoundRendezvous> {
        let live: Vec<u32> = self
            .roles
            .slots()
            .filter(|s| {
                s.key.role == self.trainer()
                    && matches!(
                        s.phase,
                        SlotPhase::Launching | SlotPhase::Running | SlotPhase::Restarting
                    )
            })
            .map(|s| s.key.index)
            .collect();
        let r = self.group.rendezvous_mut()?;
        r.launching = live.iter().filter(|&&i| !r.has_joined(i)).count() as u32;
        Some(r)
    }
}
