//! Talking to the parameter servers and the allreduce checkpoint: PS checkpoints, digests,
//! the reshard routine, final statistics, and committing a rank-0 checkpoint.

use super::*;

type PsClient = pb::parameter_server_client::ParameterServerClient<auth::Channel>;

fn ps_error(addr: &str, problem: impl std::fmt::Display) -> Error {
    Error::Ps {
        addr: addr.to_string(),
        problem: problem.to_string(),
    }
}

/// A client of the parameter server at `addr`, sending the job's secret (over the job's TLS
/// when it runs with it).
pub(super) async fn ps_client(addr: &str, creds: &auth::JobCreds) -> Result<PsClient, Error> {
    creds
        .connect(format!("http://{addr}"))
        .await
        .map(PsClient::new)
        .map_err(|e| ps_error(addr, format!("cannot reach it: {e}")))
}

/// Saves every PS's part of `step` into `dir` (below the job's checkpoint directory
/// `checkpoints`) as checkpoint `id`, and writes its manifest there.
pub(super) async fn save_ps(
    id: u64,
    (checkpoints, dir): (&std::path::Path, &std::path::Path),
    ps: &[String],
    step: u64,
    kind: String,
    creds: &auth::JobCreds,
) -> Result<PathBuf, Error> {
    crate::persist::create_dir_for_processes(checkpoints, dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut parts = Vec::new();
    for (index, addr) in ps.iter().enumerate() {
        let resp = ps_client(addr, creds)
            .await?
            .save(pb::SaveRequest {
                dir: dir.display().to_string(),
                checkpoint_id: id,
                ..Default::default()
            })
            .await
            .map_err(|e| ps_error(addr, format!("ps {index} could not save: {}", e.message())))?
            .into_inner();
        parts.push(Part {
            index: index as u32,
            path: resp.path,
            digest: resp.digest,
            keys: resp.keys,
        });
    }
    let manifest = Manifest {
        id,
        kind,
        step,
        ps: parts,
        model: None,
        shards: Vec::new(),
    };
    let path = dir.join(MANIFEST_FILE);
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Checkpoint {
        path: path.clone(),
        problem: e.to_string(),
    })?;
    crate::persist::write_in_checkpoints(checkpoints, &path, &json).map_err(|source| {
        Error::Io {
            path: path.clone(),
            source,
        }
    })?;
    Ok(path)
}

/// A flash cut: every PS (at once) copies its partition of `step` into its agent's memory,
/// keeping its copy of the `committed` step. Why not, if one did not (its answer, or a PS out
/// of reach): the cut then goes to disk.
pub(super) async fn copy_ps_cut(
    ps: &[String],
    step: u64,
    committed: Option<u64>,
    creds: &auth::JobCreds,
) -> Result<(), String> {
    let calls: Vec<_> = ps
        .iter()
        .enumerate()
        .map(|(index, addr)| {
            let (addr, creds) = (addr.clone(), creds.clone());
            tokio::spawn(async move {
                let resp = ps_client(&addr, &creds)
                    .await
                    .map_err(|e| e.to_string())?
                    .save(pb::SaveRequest {
                        in_memory: true,
                        step,
                        committed_step: committed,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| format!("ps {index} could not copy it: {}", e.message()))?
                    .into_inner();
                match resp.not_in_memory.is_empty() {
                    true => Ok(()),
                    false => Err(format!(
                        "ps {index} could not copy it: {}",
                        resp.not_in_memory
                    )),
                }
            })
        })
        .collect();
    let mut why = Vec::new();
    for call in calls {
        match call.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => why.push(e),
            Err(e) => why.push(e.to_string()),
        }
    }
    match why.is_empty() {
        true => Ok(()),
        false => Err(why.join("; ")),
    }
}

/// Sum of the PS' order-independent parameter digests (of the keys each owns) and their keys.
pub(super) async fn ps_digest(
    addrs: &[String],
    creds: &auth::JobCreds,
) -> Result<(u64, u64), Error> {
    let mut digest = 0u64;
    let mut keys = 0;
    for addr in addrs {
        let s = ps_client(addr, creds)
            .await?
            .stats(pb::StatsRequest {})
            .await
            .map_err(|e| ps_error(addr, e.message()))?
            .into_inner();
        digest = digest.wrapping_add(s.param_digest);
        keys += s.keys;
    }
    Ok((digest, keys))
}

/// Moves keys from the PS set `from` to the layout `to`: each old PS streams the keys whose
/// owner changes to their new owner. The digest of the whole parameter set is taken before and
/// after (nobody pushes meanwhile: the job is at a consistent cut). `creds`: the job's secret
/// and TLS.
pub async fn reshard_ps(
    version: u64,
    from: &[String],
    to: &[String],
    creds: &auth::JobCreds,
) -> Result<ReshardRecord, Error> {
    let started = Instant::now();
    let (digest_before, total_keys) = ps_digest(from, creds).await?;
    let mut moved_keys = 0;
    let mut moved_bytes = 0;
    let calls: Vec<_> = from
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let to = to.to_vec();
            let addr = addr.clone();
            let old = from.len() as u32;
            let creds = creds.clone();
            tokio::spawn(async move {
                let mut c = ps_client(&addr, &creds).await?;
                c.reshard(pb::ReshardRequest {
                    num_ps: to.len() as u32,
                    ps: to,
                    donor: i == 0,
                    old_num_ps: old,
                })
                .await
                .map(|r| r.into_inner())
                .map_err(|e| ps_error(&addr, format!("ps {i} could not reshard: {}", e.message())))
            })
        })
        .collect();
    for call in calls {
        let r = call.await??;
        moved_keys += r.moved_keys;
        moved_bytes += r.moved_bytes;
    }
    let (digest_after, _) = ps_digest(to, creds).await?;
    Ok(ReshardRecord {
        version,
        from_ps: from.len() as u32,
        to_ps: to.len() as u32,
        moved_keys,
        moved_bytes,
        total_keys,
        digest_before,
        digest_after,
        took_ms: started.elapsed().as_millis() as u64,
    })
}

pub(super) async fn ps_stats(addr: &str, creds: &auth::JobCreds) -> Result<PsStats, Error> {
    let s = ps_client(addr, creds)
        .await?
        .stats(pb::StatsRequest {})
        .await
        .map_err(|e| ps_error(addr, e.message()))?
        .into_inner();
    Ok(PsStats {
        index: 0,
        keys: s.keys,
        applied_batches: s.applied_batches,
        applied_samples: s.applied_samples,
        applied_index_sum: s.applied_index_sum,
        duplicate_pushes: s.duplicate_pushes,
    })
}
