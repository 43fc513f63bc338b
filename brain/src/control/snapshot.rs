//! What a live round plans on: the queued and running jobs from the store, with their reported
//! speeds (all of them in two queries), processes and corrections, read under the store's lock.
//!
//! `Control::snapshot` takes it (after reading the capacity and the cordons) and [`solve`]
//! runs the operator's scheduler on it off the async threads.
//!
//! The round sizes a job's training group; the service and single roles of running jobs hold
//! their CPU, processes, memory and GPUs outside it, so the cluster the round plans on is what
//! they leave. A role that shares the workers' devices (`placement:` with `share_devices`) holds
//! no GPU of its own: the round places each worker with its device's whole bundle, and a
//! start's worker with its partners' CPU and memory beside it (`LiveRole::beside_workers`).

use std::time::Instant;

use optimizer::heuristics::SpeedPoint;
use optimizer::live::{
    LiveCluster, LiveJob, LivePs, LiveSnapshot, LiveState, LiveWorkers, RoundPlan, plan_round,
};
use optimizer::throughput::ps_speed::PsSpeedPoint;

use prost::Message;
use proto::jobmaster::v1 as jm;

use crate::BrainError;
use crate::store::{JobState, Store};
use vocab::spec::Topology;

/// The snapshot a round plans on.
pub(super) fn take(
    store: &Store,
    cluster: &LiveCluster,
    now_ms: i64,
) -> Result<LiveSnapshot, BrainError> {
    let now_s = now_ms as f64 / 1000.0;
    let mut jobs = Vec::new();
    let mut cluster = cluster.clone();
    // Where the round places processes on nodes: each GPU node's room device by device,
    // before the running roles' GPUs come off the nodes' counts below.
    if !cluster.free.is_empty() {
        crate::capacity::by_device(&mut cluster, &store.device_use());
    }
    let (mut speeds, mut ps_speeds) = store.active_speeds()?;
    for row in store.active()? {
        let Some(shape) = row.shape.clone() else {
            continue;
        };
        if row.state == JobState::Running {
            for (_, s) in shape.others() {
                cluster.cpu_millicores = cluster
                    .cpu_millicores
                    .saturating_sub(u64::from(s.count) * s.millicores);
                cluster.max_processes = cluster.max_processes.saturating_sub(s.count);
                if cluster.memory_bytes > 0 {
                    // Counted memory stays counted: at least a byte is left.
                    cluster.memory_bytes = cluster
                        .memory_bytes
                        .saturating_sub(u64::from(s.count) * s.memory_bytes)
                        .max(1);
                }
                if !s.shares_worker_devices {
                    take_gpus(
                        &mut cluster.nodes,
                        s.gpus.devices_for(s.count),
                        shape.model_of(s),
                    );
                }
            }
        }
        let speed = speeds
            .remove(&row.id)
            .unwrap_or_default()
            .into_iter()
            .map(|(workers, samples_per_s)| SpeedPoint {
                workers,
                samples_per_s,
            })
            .collect();
        // Whether it pins the job is the policy's (`[live] pin_while_plan_in_flight`). A job
        // being cancelled counts as one whose plan is on its way: it holds its CPU until
        // it has stopped, and nothing more is planned for it.
        let plan_in_flight = (row.plan_version > row.reached_version
            && row.plan_version != row.rejected_version)
            || row.cancel_requested.is_some();
        let (ps_processes, worker_processes) = store.processes(row.id, shape.training);
        // The PS count the job master reports, unless a plan that changes it is on its way.
        let ps = if ps_processes.is_empty() {
            shape.ps()
        } else if plan_in_flight {
            shape.ps().max(ps_processes.len() as u32)
        } else {
            ps_processes.len() as u32
        };
        let (t, no_ps) = (shape.training_group(), crate::store::RoleShape::default());
        let p = shape.ps_group().unwrap_or(&no_ps);
        jobs.push(LiveJob {
            id: row.id,
            name: row.name.clone(),
            state: if row.state == JobState::Queued {
                LiveState::Queued
            } else {
                LiveState::Running
            },
            submitted_s: row.registered_unix_ms as f64 / 1000.0,
            ps: LivePs {
                count: ps,
                min: shape.ps_bounds().0,
                max: shape.ps_bounds().1,
                millicores: p.millicores,
                memory_bytes: p.memory_bytes,
                processes: ps_processes,
                // Only PS jobs have a PS speed model.
                speed: if shape.ps() == 0 {
                    Vec::new()
                } else {
                    ps_speeds.remove(&row.id).unwrap_or_default()
                }
                .into_iter()
                .map(|(workers, ps, samples_per_s)| PsSpeedPoint {
                    workers,
                    ps,
                    samples_per_s,
                })
                .collect(),
            },
            workers: LiveWorkers {
                count: row.workers.max(t.min),
                // Launched, not yet reported, or shrinking: count the larger.
                held: row.workers.max(row.reported_workers),
                min: t.min,
                max: t.max,
                node_unit: t.node_unit,
                peak: row.peak_workers,
                millicores: t.millicores,
                memory_bytes: t.memory_bytes,
                gpus: t.device_gpus(),
                gpu_type: t.gpu_type.clone(),
                processes: worker_processes,
            },
            speed,
            samples_left: shape.total_samples.saturating_sub(row.samples_done) as f64,
            last_change_s: row.last_change_unix_ms.map(|t| t as f64 / 1000.0),
            running_s: row
                .started_unix_ms
                .map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0),
            restarts: 0,
            plan_in_flight,
            history: store.corrections(row.id),
            roles: service_roles(&shape, store.role_rates(row.id), |r| store.nodes(row.id, r)),
            rates_unmeasured_s: store.rates_unmeasured_s(row.id),
            // Read only where the round places processes on nodes (it skips this otherwise).
            not_placed: match cluster.free.is_empty() {
                true => Vec::new(),
                false => unplaced(store, &row, &shape, plan_in_flight)?,
            },
            groups: groups(&shape),
        });
    }
    Ok(LiveSnapshot {
        now_s,
        cluster,
        jobs,
    })
}

/// A job's placement groups laid out by a strategy (those that share devices with the
/// training group are its workers' bundles, [`optimizer::live::LiveRole::beside_workers`]),
/// its training group as the round names it (`worker`).
fn groups(shape: &crate::store::Shape) -> Vec<optimizer::live::LiveGroup> {
    let trainer = shape.training;
    shape
        .placement
        .iter()
        .filter(|g| !(g.share_devices && g.roles.contains(&trainer)))
        .map(|g| optimizer::live::LiveGroup {
            share_devices: g.share_devices,
            roles: g
                .roles
                .iter()
                .map(|&r| if r == trainer { vocab::Role::WORKER } else { r })
                .collect(),
            strategy: g.strategy,
        })
        .collect()
}

/// A job's service and single roles with their newest rates: what a start must leave room
/// for, and what the round may resize against each other (service roles).
fn service_roles(
    shape: &crate::store::Shape,
    rates: Vec<(vocab::Role, optimizer::live::RoleRate)>,
    nodes: impl Fn(vocab::Role) -> Vec<String>,
) -> Vec<optimizer::live::LiveRole> {
    shape
        .others()
        .map(|(role, s)| optimizer::live::LiveRole {
            role,
            count: s.count,
            min: s.min,
            max: s.max,
            millicores: s.millicores,
            memory_bytes: s.memory_bytes,
            gpus: if s.shares_worker_devices {
                vocab::Gpus::ZERO
            } else {
                s.gpus
            },
            gpu_type: s.gpu_type.clone(),
            beside_workers: s.shares_worker_devices,
            // Where its processes run: a worker added beside one goes to its node, and a
            // process added to its placement group beside the group's by its strategy.
            nodes: match s.shares_worker_devices
                || shape.placement.iter().any(|g| g.roles.contains(&role))
            {
                true => nodes(role),
                false => Vec::new(),
            },
            // A further all-reduce group restarts whole when resized: the round only grows
            // it, where it bounds the job.
            sizing: match s.topology {
                Topology::Single => optimizer::live::RoleSizing::Fixed,
                Topology::Allreduce => optimizer::live::RoleSizing::Grows,
                Topology::Service | Topology::Ps => optimizer::live::RoleSizing::Rates,
            },
            rate: rates.iter().find(|(r, _)| *r == role).map(|(_, x)| *x),
        })
        .collect()
}

/// The processes of a running job that the platform has not placed yet: by role, those
/// planned beyond those running in its newest report (launched and waiting for the platform
/// count as not placed: the job master reports them apart). Without a report, all of them
/// where its job master has not reported since it started or a plan is on its way; none
/// otherwise (a brain started again hears from it within a report). Each with the node its
/// newest plan (before any, its start) named for it, where it named one.
fn unplaced(
    store: &Store,
    row: &crate::store::JobRow,
    shape: &crate::store::Shape,
    plan_in_flight: bool,
) -> Result<Vec<optimizer::live::NotPlaced>, BrainError> {
    if row.state != JobState::Running || row.cancel_requested.is_some() {
        return Ok(Vec::new());
    }
    let seen = store.snapshot(row.id);
    if seen.at_unix_ms == 0 && !plan_in_flight && row.reports > 0 {
        return Ok(Vec::new());
    }
    let running: Vec<(vocab::Role, u32)> = seen.roles.iter().map(|(r, n, _)| (*r, *n)).collect();
    let mut beyond = planned_beyond(shape, row.workers, &running);
    if !beyond.is_empty() {
        let named = planned_nodes(store, row.id)?;
        for (role, u) in &mut beyond {
            u.nodes = held_on(&named, *role, u.count);
        }
    }
    Ok(beyond.into_iter().map(|(_, u)| u).collect())
}

/// The nodes the job's newest plan named for the processes it adds, by role (none where it
/// named none, or its body does not read as a plan: those are held on the freest nodes);
/// without a plan, where the round placed its processes when it started it.
fn planned_nodes(
    store: &Store,
    job: vocab::JobId,
) -> Result<Vec<(String, Vec<String>)>, BrainError> {
    let Some(stored) = store.plan_after(job, 0)? else {
        let at_start = store.start_nodes(job)?.into_iter();
        return Ok(at_start.map(|(r, on)| (r.to_string(), on)).collect());
    };
    Ok(
        jm::ScalePlan::decode(stored.body.as_slice()).map_or(Vec::new(), |plan| {
            plan.roles
                .into_iter()
                .filter(|t| !t.nodes.is_empty())
                .map(|t| (t.role, t.nodes))
                .collect()
        }),
    )
}

/// The nodes of `named` (see [`planned_nodes`]) that `count` processes of `role` not placed
/// yet are held on: the last of those named, the processes a plan adds being launched in the
/// order of their indices (those named first are the first it adds).
fn held_on(named: &[(String, Vec<String>)], role: vocab::Role, count: u32) -> Vec<String> {
    let Some((_, nodes)) = named.iter().find(|(r, _)| r == role.as_str()) else {
        return Vec::new();
    };
    nodes[nodes.len().saturating_sub(count as usize)..].to_vec()
}

/// The processes `shape` plans (its training group at `workers`) beyond those `running`
/// (role, count), by role, with the GPUs each takes on its node: a worker whose devices
/// roles share takes the whole bundle, the roles' processes that share it none. No node is
/// named yet.
fn planned_beyond(
    shape: &crate::store::Shape,
    workers: u32,
    running: &[(vocab::Role, u32)],
) -> Vec<(vocab::Role, optimizer::live::NotPlaced)> {
    let launched = |role: vocab::Role| {
        running
            .iter()
            .find(|(r, _)| *r == role)
            .map_or(0, |(_, n)| *n)
    };
    // Each role group at its count in force (the training group's is `workers`), with the
    // GPUs each of its processes takes on its node: a worker whose devices roles share its
    // device's whole bundle, the roles' processes that share it none.
    // The PS first, then the workers, then the other roles by name.
    let ps = shape.ps_group().map(|s| (vocab::Role::PS, s));
    let training = (shape.training, shape.training_group());
    let planned = ps
        .into_iter()
        .chain([training])
        .chain(shape.others())
        .map(|(role, s)| {
            let (count, gpus) = match (role == shape.training, s.shares_worker_devices) {
                (true, _) => (workers, s.device_gpus()),
                (false, true) => (s.count, vocab::Gpus::ZERO),
                (false, false) => (s.count, s.gpus),
            };
            (role, count, s.millicores, s.memory_bytes, gpus)
        });
    planned
        .into_iter()
        .filter_map(|(role, count, millicores, memory_bytes, gpus)| {
            let count = count.saturating_sub(launched(role));
            (count > 0).then_some((
                role,
                optimizer::live::NotPlaced {
                    count,
                    millicores,
                    memory_bytes,
                    gpus,
                    nodes: Vec::new(),
                },
            ))
        })
        .collect()
}

/// Takes `n` GPUs off the nodes of `model` (any model when none), one at a time from the node
/// with the most left: where a running job's service processes hold them (the brain does not
/// know which node; the freest is the one Ray's own spread would use).
fn take_gpus(nodes: &mut [optimizer::live::LiveNode], n: u32, model: Option<&str>) {
    for _ in 0..n {
        let Some(node) = nodes
            .iter_mut()
            .filter(|x| x.gpus > 0 && model.is_none_or(|m| m == x.gpu_type))
            .max_by_key(|x| x.gpus)
        else {
            return;
        };
        node.gpus -= 1;
    }
}

impl super::Control {
    /// What a round plans on, now: the cluster as the capacity source reads it (cordoned
    /// nodes left out, which also tells the launcher) and the jobs in the store; with the
    /// cluster planned on and how long the snapshot took (ms).
    pub(super) async fn snapshot(&self) -> Result<(LiveSnapshot, LiveCluster, f64), BrainError> {
        let last = self
            .cluster
            .read()
            .expect("no panic under the lock")
            .clone();
        let (cluster, nodes) = self.capacity.read(&last).await;
        *self.cluster.write().expect("no panic under the lock") = (cluster.clone(), nodes.clone());
        let now = crate::now_unix_ms();
        // Cordoned nodes are not planned on: no process goes there, and jobs on them shrink.
        let (cordons, held) = self
            .with_store(move |s| {
                s.prune_cordons(now)?;
                Ok((s.cordons(now)?, s.device_use_by_job()))
            })
            .await?;
        self.launcher
            .set_cordoned(cordons.iter().map(|c| c.node.clone()).collect());
        self.launcher.set_devices(held);
        let cluster = crate::capacity::without(&cluster, &nodes, &cordons);
        let planned = cluster.clone();
        // The snapshot under the store's lock; the solve outside it, so that ingest and the
        // job masters' calls never wait for a solve. A job that leaves the queue meanwhile
        // (cancelled) is not started; a plan for a job that ended meanwhile is never fetched.
        let (snap, snapshot_ms) = self
            .with_store(move |s| {
                let started = Instant::now();
                let snap = take(s, &cluster, now)?;
                Ok((snap, started.elapsed().as_secs_f64() * 1000.0))
            })
            .await?;
        Ok((snap, planned, snapshot_ms))
    }
}

/// Runs one round's solve on `snap` under `policy`, off the async runtime; with how long the
/// solve took (ms).
pub(super) async fn solve(
    snap: LiveSnapshot,
    policy: super::LoadedPolicy,
) -> Result<(RoundPlan, f64), BrainError> {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let plan = plan_round(
            &snap,
            policy.scheduler().scheduler(),
            &policy.config.live,
            &policy.config.heuristics(),
        )
        .map_err(|e| BrainError::Internal(format!("the round failed: {e}")))?;
        Ok::<_, BrainError>((plan, started.elapsed().as_secs_f64() * 1000.0))
    })
    .await
    .map_err(|e| BrainError::Internal(format!("round task: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RoleShape, Shape};

    /// Process `index` of `role` as a report saw it, running and idle, its node not said.
    fn sample(role: vocab::Role, index: u32) -> crate::store::ProcessSample {
        crate::store::ProcessSample {
            role,
            index,
            cpu_limit: 0,
            memory_limit: 0,
            gpus: vocab::Gpus::ZERO,
            cpu_millicores: 0,
            memory_bytes: 0,
            memory_peak_bytes: 0,
            oom_kills: 0,
            pending_ms: 0,
            pending_reason: String::new(),
            gpu_utilisation_pct: 0.0,
            gpu_memory_bytes: 0,
            host: String::new(),
            devices: String::new(),
        }
    }

    #[test]
    fn running_jobs_service_roles_hold_their_cpu_and_processes_outside_the_round() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("brain.db")).unwrap();
        let shape = Shape::new(
            vocab::JobKind::Allreduce,
            vocab::Role::WORKER,
            RoleShape {
                gpus: vocab::Gpus::from_milli(500),
                bundle_gpus: Some(vocab::Gpus::ONE),
                ..RoleShape::sized(Topology::Allreduce, 2, (1, 4), 1000)
            },
            1000,
        )
        .with(
            vocab::Role::new("rollout").unwrap(),
            RoleShape {
                // Half a GPU beside each worker's half: no GPU of its own.
                gpus: vocab::Gpus::from_milli(500),
                shares_worker_devices: true,
                ..RoleShape::sized(Topology::Service, 3, (1, 4), 500)
            },
        )
        // Three rewards of half a GPU each, on devices of their own: two GPUs.
        .with(
            vocab::Role::new("reward").unwrap(),
            RoleShape {
                memory_bytes: 1 << 30,
                gpus: vocab::Gpus::from_milli(500),
                ..RoleShape::sized(Topology::Service, 3, (3, 3), 500)
            },
        );
        store
            .register("rl", "127.0.0.1:1", Some(&shape), 10)
            .unwrap();
        let node = |name: &str, gpus: u32, model: &str| optimizer::live::LiveNode {
            name: name.into(),
            gpus,
            gpu_type: model.into(),
        };
        let cluster = LiveCluster {
            free: Vec::new(),
            cpu_millicores: 8000,
            slot_millicores: 1000,
            max_processes: 16,
            memory_bytes: 16 << 30,
            nodes: vec![node("v", 2, "V100"), node("a", 4, "A100")],
        };
        let snap = take(&store, &cluster, 20).unwrap();
        assert_eq!(snap.jobs.len(), 1);
        assert_eq!(snap.cluster.cpu_millicores, 8000 - 6 * 500);
        assert_eq!(snap.cluster.max_processes, 16 - 6);
        // The rewards' memory (1 GiB each) is off the pool; the engines ask none.
        assert_eq!(snap.cluster.memory_bytes, 13 << 30);
        assert_eq!(snap.jobs[0].roles[0].memory_bytes, 1 << 30);
        // The rewards' two GPUs come off the freest node; each worker is placed with its
        // device's whole bundle (its half and a rollout engine's).
        assert_eq!(
            snap.cluster.nodes,
            vec![node("v", 2, "V100"), node("a", 2, "A100")]
        );
        assert_eq!(snap.jobs[0].workers.gpus, vocab::Gpus::ONE);
        // What a start would have to place for its roles: the rewards' own GPUs, none for
        // the engines that share the workers' devices.
        let gpus: Vec<(String, vocab::Gpus)> = snap.jobs[0]
            .roles
            .iter()
            .map(|r| (r.role.to_string(), r.gpus))
            .collect();
        assert_eq!(
            gpus,
            vec![
                ("reward".into(), vocab::Gpus::from_milli(500)),
                ("rollout".into(), vocab::Gpus::ZERO)
            ]
        );
        // The engines go beside their workers (the round places each worker with its
        // engine's CPU); the rewards on their own.
        let beside: Vec<bool> = snap.jobs[0]
            .roles
            .iter()
            .map(|r| r.beside_workers)
            .collect();
        assert_eq!(beside, [false, true]);
        // Where the engines and workers run, as the job master reports them: a worker added
        // beside an engine goes to its node, an engine added beside a worker to the worker's.
        let on = |role: &str, index: u32, host: &str| crate::store::ProcessSample {
            host: host.into(),
            devices: String::new(),
            ..sample(vocab::Role::new(role).unwrap(), index)
        };
        let report = crate::store::Metric {
            at_unix_ms: 25,
            processes: vec![
                on("worker", 0, "10.0.0.1"),
                on("worker", 1, "10.0.0.2"),
                on("rollout", 0, "10.0.0.1"),
                on("rollout", 2, "10.0.0.3"),
                on("reward", 0, "10.0.0.3"),
            ],
            ..Default::default()
        };
        let job = snap.jobs[0].id;
        store.add_metrics(job, &[report]).unwrap();
        let snap = take(&store, &cluster, 30).unwrap();
        let nodes: Vec<&[String]> = snap.jobs[0].roles.iter().map(|r| &r.nodes[..]).collect();
        assert_eq!(
            nodes,
            [
                &[][..],
                &["10.0.0.1".to_string(), String::new(), "10.0.0.3".into()][..]
            ],
            "the engines' by index; none kept for the rewards, which go anywhere"
        );
        let workers: Vec<&str> = snap.jobs[0]
            .workers
            .processes
            .iter()
            .map(|p| p.node.as_str())
            .collect();
        assert_eq!(workers, ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn a_gpu_nodes_room_is_planned_on_device_by_device_as_the_reports_place_the_shares() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("brain.db")).unwrap();
        let shape = Shape::new(
            vocab::JobKind::Allreduce,
            vocab::Role::WORKER,
            RoleShape {
                gpus: vocab::Gpus::from_milli(600),
                gpu_type: Some("V100".into()),
                ..RoleShape::sized(Topology::Allreduce, 1, (1, 1), 1000)
            },
            1000,
        );
        let (job, _) = store
            .register("shares", "127.0.0.1:1", Some(&shape), 10)
            .unwrap();
        // A Ray cluster's V100 node of two devices, 0.7 of them free by Ray's count.
        let cluster = LiveCluster {
            free: vec![optimizer::live::NodeRoom {
                name: "10.0.0.2".into(),
                cpu_millicores: 4000,
                memory_bytes: 0,
                gpus: vocab::Gpus::from_milli(700),
                devices: Vec::new(),
            }],
            nodes: vec![optimizer::live::LiveNode {
                name: "10.0.0.2".into(),
                gpus: 2,
                gpu_type: "V100".into(),
            }],
            cpu_millicores: 4000,
            slot_millicores: 1000,
            max_processes: 8,
            memory_bytes: 0,
        };
        // Its worker holds 0.6 of device 0; a role's process 0.7 of device 1; one waiting
        // for the platform (the device it would get named) holds nothing yet.
        let on = |role: &str, index: u32, devices: &str, gpus: u32| crate::store::ProcessSample {
            host: "10.0.0.2".into(),
            devices: devices.into(),
            gpus: vocab::Gpus::from_milli(gpus),
            ..sample(vocab::Role::new(role).unwrap(), index)
        };
        let mut waiting = on("rollout", 1, "1", 700);
        waiting.pending_ms = 500;
        let report = crate::store::Metric {
            at_unix_ms: 25,
            workers: 1,
            processes: vec![
                on("worker", 0, "0", 600),
                on("rollout", 0, "1", 700),
                waiting,
            ],
            ..Default::default()
        };
        store.add_metrics(job, &[report]).unwrap();
        let snap = take(&store, &cluster, 30).unwrap();
        assert_eq!(
            snap.cluster.free[0].devices,
            [vocab::Gpus::from_milli(400), vocab::Gpus::from_milli(300)],
            "0.7 free, split 0.4 + 0.3: no 0.5 share fits"
        );
        // What another job's master is told of them (`GetPlanResponse.other_jobs_devices`),
        // and this job's own told nothing of itself.
        let (other, _) = store
            .register("other", "127.0.0.1:2", Some(&shape), 26)
            .unwrap();
        let held = |pairs: &[(&str, u32)]| {
            pairs
                .iter()
                .map(|&(d, h)| (d.to_string(), h))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(
            store.device_use_besides(other).on("10.0.0.2"),
            Some(&held(&[("0", 600), ("1", 700)]))
        );
        assert_eq!(store.device_use_besides(job), Default::default());
        // Job by job, for the masters the launcher starts: only the job holding shares.
        let by_job = store.device_use_by_job();
        assert_eq!(by_job.keys().copied().collect::<Vec<_>>(), [job]);
        assert_eq!(
            by_job[&job].on("10.0.0.2"),
            Some(&held(&[("0", 600), ("1", 700)]))
        );
        // The job ended: its shares are forgotten, and Ray's 0.7 is the node's amount only.
        store
            .finish(job, JobState::Succeeded, "done", 1000, 40)
            .unwrap();
        let snap = take(&store, &cluster, 50).unwrap();
        assert!(
            snap.cluster.free[0].devices.is_empty(),
            "{:?}",
            snap.cluster.free
        );
    }

    #[test]
    fn groups_sharing_devices_reach_the_round_unless_they_are_the_workers_bundles() {
        use vocab::spec::{PlacementGroup, Strategy};
        let [rollout, reward, reference] =
            ["rollout", "reward", "reference"].map(|r| vocab::Role::new(r).unwrap());
        let shape = Shape {
            placement: vec![
                PlacementGroup {
                    roles: vec![vocab::Role::WORKER, rollout],
                    strategy: Strategy::Pack,
                    share_devices: true,
                },
                PlacementGroup {
                    roles: vec![reference, reward],
                    strategy: Strategy::Spread,
                    share_devices: true,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            groups(&shape),
            vec![optimizer::live::LiveGroup {
                roles: vec![reference, reward],
                strategy: Strategy::Spread,
                share_devices: true,
            }]
        );
    }

    #[test]
    fn the_processes_the_platform_has_not_placed_yet_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("brain.db")).unwrap();
        let rollout = vocab::Role::new("rollout").unwrap();
        let mut shape = Shape::new(
            vocab::JobKind::Ps,
            vocab::Role::WORKER,
            RoleShape {
                memory_bytes: 1 << 30,
                ..RoleShape::sized(Topology::Ps, 2, (1, 8), 2000)
            },
            1000,
        )
        .with(
            vocab::Role::PS,
            RoleShape::sized(Topology::Ps, 1, (0, 0), 1500),
        )
        .with(rollout, RoleShape::sized(Topology::Service, 2, (1, 4), 500));
        // One group laid out by a strategy; one that shares devices (the workers' bundles).
        let group = |roles, strategy, share_devices| vocab::spec::PlacementGroup {
            roles,
            strategy,
            share_devices,
        };
        use vocab::spec::Strategy;
        shape.placement = vec![
            group(vec![rollout], Strategy::StrictSpread, false),
            group(vec![vocab::Role::WORKER], Strategy::Pack, true),
        ];
        let (job, _) = store
            .register("ps", "127.0.0.1:1", Some(&shape), 10)
            .unwrap();
        // A cluster that reports its nodes' room (a Ray cluster's).
        let cluster = LiveCluster {
            free: vec![optimizer::live::NodeRoom {
                name: "10.0.0.2".into(),
                cpu_millicores: 16_000,
                memory_bytes: 0,
                gpus: vocab::Gpus::ZERO,
                devices: Vec::new(),
            }],
            cpu_millicores: 16_000,
            slot_millicores: 1000,
            max_processes: 32,
            memory_bytes: 0,
            nodes: Vec::new(),
        };
        let u = |count, millicores, memory_bytes| optimizer::live::NotPlaced {
            count,
            millicores,
            memory_bytes,
            gpus: vocab::Gpus::ZERO,
            nodes: Vec::new(),
        };
        // Started, its job master not heard from yet: every process is listed.
        let snap = take(&store, &cluster, 20).unwrap();
        // Its placement group, laid out by its strategy.
        assert_eq!(
            snap.jobs[0].groups,
            vec![optimizer::live::LiveGroup {
                share_devices: false,
                roles: vec![rollout],
                strategy: vocab::spec::Strategy::StrictSpread,
            }]
        );
        assert_eq!(
            snap.jobs[0].not_placed,
            vec![u(1, 1500, 0), u(2, 2000, 1 << 30), u(2, 500, 0)]
        );
        // Where the round placed them when it started the job: held there.
        let named = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        store
            .started_on(
                job,
                &[
                    (vocab::Role::WORKER, named(&["10.0.0.2", "10.0.0.3"])),
                    (rollout, named(&["10.0.0.3"])),
                ]
                .into(),
            )
            .unwrap();
        let held = vec![
            u(1, 1500, 0),
            optimizer::live::NotPlaced {
                nodes: named(&["10.0.0.2", "10.0.0.3"]),
                ..u(2, 2000, 1 << 30)
            },
            optimizer::live::NotPlaced {
                nodes: named(&["10.0.0.3"]),
                ..u(2, 500, 0)
            },
        ];
        let snap = take(&store, &cluster, 21).unwrap();
        assert_eq!(snap.jobs[0].not_placed, held);
        // A restarted brain knows them too: they are stored.
        drop(store);
        let mut store = Store::open(&dir.path().join("brain.db")).unwrap();
        let snap = take(&store, &cluster, 21).unwrap();
        assert_eq!(snap.jobs[0].not_placed, held);
        // Reported, every process running: none is listed.
        let process = |role, index| crate::store::ProcessSample {
            host: format!("10.0.0.{}", 2 + index),
            ..sample(role, index)
        };
        let mut report = crate::store::Metric {
            at_unix_ms: 25,
            workers: 2,
            ps: 1,
            processes: vec![
                process(vocab::Role::PS, 0),
                process(vocab::Role::WORKER, 0),
                process(vocab::Role::WORKER, 1),
                process(rollout, 0),
                process(rollout, 1),
            ],
            ..Default::default()
        };
        store.add_metrics(job, &[report.clone()]).unwrap();
        let snap = take(&store, &cluster, 30).unwrap();
        assert_eq!(snap.jobs[0].not_placed, Vec::new());
        // Where its grouped role's processes run: a growth goes beside them by the strategy.
        assert_eq!(
            snap.jobs[0].roles[0].nodes,
            named(&["10.0.0.2", "10.0.0.3"])
        );
        // A worker launched but waiting for the platform: listed.
        report.at_unix_ms = 26;
        report.processes[2].pending_ms = 400;
        store.add_metrics(job, &[report.clone()]).unwrap();
        let snap = take(&store, &cluster, 30).unwrap();
        // Worker 1, whose node is the last the start named.
        assert_eq!(
            snap.jobs[0].not_placed,
            vec![optimizer::live::NotPlaced {
                nodes: named(&["10.0.0.3"]),
                ..u(1, 2000, 1 << 30)
            }]
        );
        report.at_unix_ms = 27;
        report.processes[2].pending_ms = 0;
        store.add_metrics(job, &[report.clone()]).unwrap();
        // A plan of 4 workers on its way: the two it adds are listed.
        let counts = crate::store::PlanCounts::default().with(vocab::Role::WORKER, 4);
        store
            .propose_plan(job, &|v| vec![v as u8], "grow", counts.clone(), &[], 30)
            .unwrap();
        let snap = take(&store, &cluster, 40).unwrap();
        assert_eq!(snap.jobs[0].not_placed, vec![u(2, 2000, 1 << 30)]);
        // A plan that names the nodes of the workers it adds: they are held there; once the
        // first of them runs, the other on the node named last.
        let naming = |v: u64| {
            jm::ScalePlan {
                version: v,
                roles: vec![jm::RoleTarget {
                    role: "worker".into(),
                    count: 4,
                    resources: None,
                    nodes: vec!["10.0.0.2".into(), "10.0.0.3".into()],
                }],
                migrations: Vec::new(),
            }
            .encode_to_vec()
        };
        store
            .propose_plan(job, &naming, "grow", counts, &[], 41)
            .unwrap();
        let on = |count, nodes: &[&str]| optimizer::live::NotPlaced {
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            ..u(count, 2000, 1 << 30)
        };
        let snap = take(&store, &cluster, 42).unwrap();
        assert_eq!(
            snap.jobs[0].not_placed,
            vec![on(2, &["10.0.0.2", "10.0.0.3"])]
        );
        report.at_unix_ms = 43;
        report.processes.push(process(vocab::Role::WORKER, 2));
        store.add_metrics(job, &[report]).unwrap();
        let snap = take(&store, &cluster, 44).unwrap();
        assert_eq!(snap.jobs[0].not_placed, vec![on(1, &["10.0.0.3"])]);
        // Processes with GPUs are listed with them: a worker whose devices a role shares
        // with the whole bundle, the sharing role's processes with none.
        let running = [(vocab::Role::PS, 1), (vocab::Role::WORKER, 2), (rollout, 4)];
        let beyond = |shape: &Shape, workers, running: &[(vocab::Role, u32)]| -> Vec<_> {
            planned_beyond(shape, workers, running)
                .into_iter()
                .map(|(_, u)| u)
                .collect()
        };
        assert_eq!(beyond(&shape, 4, &running), vec![u(2, 2000, 1 << 30)]);
        shape.training_group_mut().gpus = vocab::Gpus::from_milli(600);
        let with_gpus = |gpus: u32| optimizer::live::NotPlaced {
            gpus: vocab::Gpus::from_milli(gpus),
            ..u(2, 2000, 1 << 30)
        };
        assert_eq!(beyond(&shape, 4, &running), vec![with_gpus(600)]);
        shape.training_group_mut().bundle_gpus = Some(vocab::Gpus::ONE);
        let engines = shape.roles.get_mut(&rollout).unwrap();
        (engines.gpus, engines.shares_worker_devices, engines.count) =
            (vocab::Gpus::from_milli(400), true, 6);
        assert_eq!(
            beyond(&shape, 4, &running),
            vec![with_gpus(1000), u(2, 500, 0)]
        );
        // A role with GPUs of its own: listed with them.
        shape.roles.get_mut(&rollout).unwrap().shares_worker_devices = false;
        assert_eq!(
            beyond(&shape, 4, &running)[1],
            optimizer::live::NotPlaced {
                gpus: vocab::Gpus::from_milli(400),
                ..u(2, 500, 0)
            }
        );
    }
}
