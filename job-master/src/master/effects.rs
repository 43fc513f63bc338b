//! Carrying out the effects the job context returns: agents launched and stopped through the
//! platform, PS checkpoints and reshards, the final statistics.

use super::ps::{copy_ps_cut, ps_client, ps_stats, reshard_ps, save_ps};
use super::*;

pub(super) async fn execute(
    shared: &Arc<Shared>,
    platform: &Arc<dyn Platform>,
    addr: std::net::SocketAddr,
    effect: Effect,
) {
    match effect {
        Effect::LaunchAgent { key, incarnation } => {
            let (resources, device_share, node) = {
                let ctx = shared.job.lock().await;
                (
                    ctx.launch_resources(key),
                    ctx.spec.device_share(key),
                    ctx.launch_node(key),
                )
            };
            let launch = AgentLaunch {
                key,
                incarnation,
                master_addr: addr,
                resources,
                token_file: shared.token_file.clone(),
                tls_dir: shared.creds.tls.as_ref().map(|t| t.dir().to_path_buf()),
                device_share,
                node,
            };
            match platform.launch(launch).await {
                Err(e) => {
                    shared
                        .apply_logged("agent launch", |ctx, now| {
                            ctx.fail(e.to_string(), now);
                            Ok(((), vec![], true))
                        })
                        .await
                }
                Ok(()) if !platform.reports_placement() => {
                    shared
                        .apply_logged("agent placed", |ctx, now| {
                            Ok(((), vec![], ctx.agent_placed(key, incarnation, now)))
                        })
                        .await
                }
                Ok(()) => {}
            }
        }
        Effect::StopAgent { key, graceful } => {
            let grace = if graceful {
                // The agent's own SIGTERM-then-SIGKILL of its process, and a little more.
                Duration::from_millis(shared.job.lock().await.grace_period_ms() + 2_000)
            } else {
                Duration::ZERO
            };
            platform.stop(key, grace).await
        }
        Effect::SavePsCheckpoint {
            id,
            dir,
            ps,
            step,
            generation,
        } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                save_ps_and_commit(&shared, id, &dir, &ps, step, generation).await;
            });
        }
        Effect::CopyPsCut {
            id,
            dir,
            ps,
            step,
            generation,
            committed,
        } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                match copy_ps_cut(&ps, step, committed, &shared.creds).await {
                    Ok(()) => {
                        shared
                            .apply_logged("ps cut in memory", |ctx, now| {
                                Ok(((), ctx.ps_cut_in_memory(step, generation, now), true))
                            })
                            .await;
                    }
                    Err(why) => {
                        shared
                            .apply_logged("ps cut to disk", |ctx, now| {
                                ctx.ps_cut_not_in_memory(step, generation, &why, now);
                                Ok(((), vec![], true))
                            })
                            .await;
                        save_ps_and_commit(&shared, id, &dir, &ps, step, generation).await;
                    }
                }
            });
        }
        Effect::RemoveCheckpoints { dirs } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                // Only once the record without them is on disk: a master resumed from an
                // older record could otherwise restore from a directory already gone.
                if let Err(e) = shared.persister.durable(shared.persister.changed()).await {
                    tracing::warn!("old checkpoints kept: the job context is not durable: {e}");
                    return;
                }
                let checkpoints = shared.job.lock().await.spec.checkpoint.dir.clone();
                let removed = tokio::task::spawn_blocking(move || {
                    for dir in dirs {
                        // Reached without following a link: the job's processes write there.
                        if let Err(e) = crate::persist::remove_in_checkpoints(&checkpoints, &dir)
                            && e.kind() != std::io::ErrorKind::NotFound
                        {
                            tracing::warn!("cannot delete old checkpoint {}: {e}", dir.display());
                        }
                    }
                });
                let _ = removed.await;
            });
        }
        Effect::ReshardPs {
            version,
            from,
            to,
            generation,
        } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                match reshard_ps(version, &from, &to, &shared.creds).await {
                    Ok(record) => {
                        let r = shared
                            .apply(|ctx, now| {
                                ctx.reshard_done(generation, record, now).map(|e| ((), e))
                            })
                            .await;
                        if let Err(e) = r {
                            tracing::warn!("reshard for plan {version} dropped: {e}");
                        }
                    }
                    Err(problem) => {
                        shared
                            .apply_logged("reshard failure", |ctx, now| {
                                Ok((
                                    (),
                                    ctx.reshard_failed(generation, problem.to_string(), now),
                                    true,
                                ))
                            })
                            .await;
                    }
                }
            });
        }
        Effect::AvoidNodes(nodes) => platform.avoid(&nodes),
        Effect::DropPs { ps } => {
            for addr in ps {
                let r = match ps_client(&addr, &shared.creds).await {
                    Ok(mut c) => c
                        .drop(ps::within(pb::DropRequest {}, ps::PS_CALL_TIMEOUT))
                        .await
                        .map(|r| r.into_inner().dropped)
                        .map_err(|e| e.message().to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match r {
                    Ok(n) => tracing::info!(%addr, dropped = n, "ps dropped the keys it lent"),
                    // Keys it no longer owns only cost memory; the PS refuses requests for them.
                    Err(e) => tracing::warn!(%addr, "ps could not drop lent keys: {e}"),
                }
            }
        }
        Effect::Finish => {
            // Only the built-in PS answer for their statistics; a command's are its own servers.
            let ps = {
                let ctx = shared.job.lock().await;
                ctx.group
                    .cluster()
                    .filter(|_| ctx.spec.workload.builtin.is_some())
                    .map(|c| c.ps.clone())
                    .unwrap_or_default()
            };
            let mut stats = Vec::new();
            for (index, addr) in ps {
                match ps_stats(&addr, &shared.creds).await {
                    Ok(s) => stats.push(PsStats { index, ..s }),
                    Err(e) => tracing::warn!("cannot read statistics of ps {index}: {e}"),
                }
            }
            *shared.ps_stats.lock().await = stats;
            shared
                .apply_logged("finish", |ctx, now| {
                    ctx.finish(now);
                    Ok(((), vec![], true))
                })
                .await;
        }
    }
}

/// Saves every PS to `dir` as checkpoint `id` of `step`, and commits it (or says it failed).
async fn save_ps_and_commit(
    shared: &Shared,
    id: u64,
    dir: &std::path::Path,
    ps: &[String],
    step: u64,
    generation: u64,
) {
    let (kind, checkpoints, deadline) = {
        let ctx = shared.job.lock().await;
        (
            ctx.spec.kind.to_string(),
            ctx.spec.checkpoint.dir.clone(),
            Duration::from_millis(ctx.timing.ps_save_timeout_ms),
        )
    };
    let saved = save_ps(
        id,
        (&checkpoints, dir),
        ps,
        (step, kind),
        &shared.creds,
        deadline,
    );
    match saved.await {
        Ok(manifest) => {
            let r = shared
                .apply(|ctx, now| {
                    ctx.checkpoint_committed(id, manifest, step, generation, now)
                        .map(|e| ((), e))
                })
                .await;
            if let Err(e) = r {
                tracing::warn!("checkpoint {id} dropped: {e}");
            }
        }
        Err(problem) => {
            shared
                .apply_logged("checkpoint failure", |ctx, now| {
                    ctx.checkpoint_failed(generation, problem.to_string(), now);
                    Ok(((), vec![], true))
                })
                .await;
        }
    }
}
