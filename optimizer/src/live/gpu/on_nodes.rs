//! The GPU round's check against the nodes' free room (`nodes.rs`): a GPU job's new
//! processes placed on it as the job master places them ([`on_nodes`]), what is cut when they
//! do not fit ([`Cut`]), and a start of any model moved to another model's nodes
//! ([`elsewhere`]).

use std::collections::BTreeMap;

use super::super::nodes::{self, Free};
use super::{Gpu, LiveNode, model_name_of, pack};
use vocab::Gpus;

/// A GPU job whose new processes the nodes' free room does not hold: the most workers it
/// holds (`fits`: 0, none), and why.
pub(super) struct Cut {
    pub(super) job: usize,
    pub(super) fits: u32,
    asked: String,
    lowest: u32,
    room: String,
    /// The placement group the nodes could not hold at the fewest workers tried, if that
    /// was why (as the reasons name it).
    group: Option<String>,
}

impl Cut {
    /// Sizes the job to what fits: a start at fewer workers, down to its minimum, or none (it
    /// waits); a growth to fewer added workers, or none (it keeps its size).
    pub(super) fn apply(&self, j: &mut Gpu) {
        let Cut {
            fits,
            asked,
            room,
            group,
            ..
        } = self;
        let unfit = group.as_ref().map(|g| nodes::group_unfit(g, room));
        if j.running() {
            let wanted = j.to;
            j.to = (*fits).max(j.job.workers.count);
            j.reasons.push(match (fits, unfit) {
                (0, Some(why)) => format!("kept at {} workers: {why}", j.job.workers.count),
                (0, None) => format!(
                    "kept at {} workers: no node has room for another worker of {asked} \
                     ({room})",
                    j.job.workers.count
                ),
                (w, _) => format!(
                    "{w} workers, not {wanted}: no more fit on the nodes' free room ({room})"
                ),
            });
        } else if *fits == 0 {
            j.reasons.push(match unfit {
                Some(why) => format!("waits at its minimum of {} workers: {why}", self.lowest),
                None => format!(
                    "waits: no node has room for its processes of {asked} at its minimum of {} \
                     workers ({room})",
                    self.lowest
                ),
            });
            j.to = 0;
            j.on = None;
        } else {
            j.reasons.push(format!(
                "starts with {fits} workers, not {}: no more fit on the nodes' free room ({room})",
                j.to
            ));
            j.to = *fits;
        }
    }
}

/// A start that may run on another GPU model than the one the scheduler gave it, and whose
/// processes that model's nodes do not hold: moved to the first other model it may run on
/// where, at the scheduler's size or its minimum, both the GPUs the round counts and the
/// nodes' free room hold it (each model tried once: the one left is no longer allowed).
/// Whether it moved.
pub(super) fn elsewhere(
    jobs: &mut [Gpu],
    i: usize,
    nodes: &[LiveNode],
    model_of: &[usize],
    models: &[String],
    free: &Free,
) -> bool {
    let (on, to) = (jobs[i].on, jobs[i].to);
    if jobs[i].running() {
        return false;
    }
    if let Some(t) = on {
        jobs[i].allowed[t] = false;
    }
    let min = jobs[i].job.workers.min.max(1);
    let others: Vec<usize> = (0..models.len()).filter(|&t| jobs[i].allowed[t]).collect();
    for t in others {
        for size in [to, min] {
            (jobs[i].on, jobs[i].to) = (Some(t), size);
            let fits_gpus = pack(nodes, model_of, jobs).1.is_empty();
            // The jobs placed before it are as before: a cut of another comes after it.
            let on_nodes = on_nodes(jobs, models, free).map_or_else(|c| c.job != i, |_| true);
            if fits_gpus && on_nodes {
                jobs[i].reasons.push(format!(
                    "moved to {} GPUs: the {} nodes have no room for its processes ({})",
                    models[t],
                    model_name_of(models, on),
                    free.freest_shown()
                ));
                return true;
            }
        }
    }
    (jobs[i].on, jobs[i].to) = (on, to);
    false
}

/// The GPU jobs' new processes placed on the nodes' free room: the room left, and by job
/// (index into the round's jobs) the nodes of the processes it adds by role, in the order of
/// their indexes (a growth's added workers, for its plan to name; a start's every process,
/// for its job master).
pub(super) type Placed = (Free, BTreeMap<usize, BTreeMap<vocab::Role, Vec<String>>>);

/// Places the GPU jobs' new processes (a start's PS, workers and roles; a growth's added
/// workers) on the nodes' free room, running jobs' growth first, then the starts, each in
/// submission order, as `nodes.rs` places the CPU jobs'. The room left with the nodes of the
/// processes it placed; or the first job that does not fit whole, with the most workers
/// that do.
pub(super) fn on_nodes(jobs: &[Gpu], models: &[String], free: &Free) -> Result<Placed, Cut> {
    let adds = |j: &Gpu| match j.running() {
        true => j.to.saturating_sub(j.counted(j.job.workers.count)),
        false => j.to,
    };
    let mut order: Vec<usize> = (0..jobs.len()).filter(|&i| adds(&jobs[i]) > 0).collect();
    nodes::sort_for_placing(&mut order, |i| jobs[i].job);
    let mut free = free.clone();
    let mut named = BTreeMap::new();
    for i in order {
        let j = &jobs[i];
        let model = j.on.map(|t| models[t].as_str());
        let worker = free.process(
            j.job.workers.millicores,
            j.job.workers.memory_bytes,
            j.g,
            model,
        );
        let start = !j.running();
        let (base, lowest) = match start {
            true => (0, j.job.workers.min.max(1)),
            false => (
                j.counted(j.job.workers.count),
                j.counted(j.job.workers.count) + 1,
            ),
        };
        let mut fixed = Vec::new();
        if start {
            let ps = free.process(j.job.ps.millicores, j.job.ps.memory_bytes, Gpus::ZERO, None);
            fixed = vec![ps; j.job.ps.count as usize];
            fixed.extend(nodes::roles_of(j.job, model, &free));
        }
        // A start's workers go with the processes that share their devices; a growth's added
        // workers join the partners that run already, on their nodes where known.
        let partners: Vec<Option<usize>> = match start {
            true => Vec::new(),
            false => (base..j.to)
                .map(|k| nodes::partner_node(j.job, k, &free))
                .collect(),
        };
        let workers = |w: u32| match start {
            true => (Vec::new(), nodes::with_partners(j.job, worker, w)),
            false => {
                let on = &partners[..(w - base) as usize];
                let pinned = on.iter().flatten().map(|&i| (worker, i)).collect();
                (
                    pinned,
                    vec![worker; on.iter().filter(|i| i.is_none()).count()],
                )
            }
        };
        let unit = j.job.workers.node_unit.max(1);
        let mut w = j.to;
        let mut unfit = None;
        let fits = loop {
            let mut procs = fixed.clone();
            let (pinned, rest) = workers(w);
            // The roles of each of `procs`, for its placement group and its name.
            let laid = match start {
                true => {
                    let mut laid = vec![vec![vocab::Role::PS]; j.job.ps.count as usize];
                    laid.extend(nodes::roles_of_laid(j.job));
                    laid.extend(nodes::with_partners_laid(j.job, w));
                    laid
                }
                false => vec![vec![vocab::Role::WORKER]; rest.len()],
            };
            procs.extend(rest);
            let mut trial = free.clone();
            let groups = nodes::Groups::of_job(j.job, &laid, &free);
            let placed = trial.take_pinned(pinned, procs, &groups);
            if let Err(g) = &placed {
                unfit = g.map(|g| j.job.groups[g].shown());
            }
            if let Ok(went) = placed {
                if w == j.to {
                    free = trial;
                    // Not where the workers it counts are more than it has (a shrink not
                    // carried out yet), whose new indexes are not these.
                    if start {
                        named.insert(i, nodes::start_nodes(&laid, &went, &free));
                    } else if base == j.job.workers.count {
                        let on = growth_nodes(&partners, &went, &free);
                        named.insert(i, BTreeMap::from([(vocab::Role::WORKER, on)]));
                    }
                }
                break w;
            }
            if w < lowest + unit {
                break 0;
            }
            w -= unit;
        };
        if fits == j.to {
            continue;
        }
        let roles = fixed.len().saturating_sub(j.job.ps.count as usize);
        // The first worker that did not fit (a start's with its partners), and the node of
        // its partner where it must go there.
        let (first, beside) = match start {
            true => (workers(1).1.first().copied().unwrap_or(worker), None),
            false => (worker, partners[(fits.max(base) - base) as usize]),
        };
        return Err(Cut {
            job: i,
            fits,
            asked: format!(
                "{}{}",
                nodes::shown(&first, &free),
                match (start, roles, beside) {
                    (true, n, _) if n > 0 => format!(" with its roles' {n}"),
                    (false, _, Some(at)) => format!(
                        " on {}, beside the process of its index that shares its device",
                        free.name(at)
                    ),
                    _ => String::new(),
                }
            ),
            lowest,
            room: free.freest_shown(),
            group: unfit,
        });
    }
    Ok((free, named))
}

/// The nodes of a growth's added workers by index: each beside its partner where it has one
/// (`partners`), the others where the room placed them (`went`, in order).
fn growth_nodes(partners: &[Option<usize>], went: &[usize], free: &Free) -> Vec<String> {
    let mut rest = went.iter();
    let on: Vec<usize> = partners
        .iter()
        .filter_map(|p| p.or_else(|| rest.next().copied()))
        .collect();
    free.names_of(&on)
}
