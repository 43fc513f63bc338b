//! Talking to the parameter servers and the allreduce checkpoint: PS checkpoints, digests,
//! the reshard routine, final statistics, and committing a rank-0 checkpoint.

use super::*;

type PsClient = pb::parameter_server_client::ParameterServerClient<auth::Channel>;

/// How long a PS may take to answer a call other than a save to disk or a reshard (its
/// statistics, an in-memory copy, dropping lent keys).
pub(super) const PS_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a reshard may take (every old PS streaming the keys it gives away).
const PS_RESHARD_TIMEOUT: Duration = Duration::from_secs(600);

/// `message` as a request that fails with DEADLINE_EXCEEDED when not answered within `d`.
pub(super) fn within<T>(message: T, d: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.set_timeout(d);
    r
}

/// Why a call to a PS failed, in words: a deadline that passed says how long it waited.
fn failed_call(e: &tonic::Status, d: Duration) -> String {
    match e.code() {
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            format!("no answer within {} s ({})", d.as_secs(), e.message())
        }
        _ => e.message().to_string(),
    }
}

fn ps_error(addr: &str, problem: impl std::fmt::Display) -> Error {
    Error::Ps {
        addr: addr.to_string(),
        problem: problem.to_string(),
    }
}

/// The deadlines of the master's calls to a PS that set none of their own (a save to disk sets
/// the job's `ps_save_timeout_ms`).
const PS_CALLS: auth::Deadlines = auth::Deadlines {
    default: PS_CALL_TIMEOUT,
    by_method: &[("Reshard", PS_RESHARD_TIMEOUT)],
};

/// A client of the parameter server at `addr`, sending the job's secret (over the job's TLS
/// when it runs with it); each call ends at its deadline ([`PS_CALLS`], or its own).
pub(super) async fn ps_client(addr: &str, creds: &auth::JobCreds) -> Result<PsClient, Error> {
    creds
        .connect(format!("http://{addr}"), PS_CALLS)
        .await
        .map(PsClient::new)
        .map_err(|e| ps_error(addr, format!("cannot reach it: {e}")))
}

/// Saves every PS's part of `step` into `dir` (below the job's checkpoint directory
/// `checkpoints`) as checkpoint `id`, and writes its manifest there. A PS that does not answer
/// within `deadline` fails the save (the job goes on, and checkpoints at its next cut).
pub(super) async fn save_ps(
    id: u64,
    (checkpoints, dir): (&std::path::Path, &std::path::Path),
    ps: &[String],
    (step, kind): (u64, String),
    creds: &auth::JobCreds,
    deadline: Duration,
) -> Result<PathBuf, Error> {
    crate::persist::create_dir_for_processes(checkpoints, dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut parts = Vec::new();
    for (index, addr) in ps.iter().enumerate() {
        let resp = ps_client(addr, creds)
            .await?
            .save(within(
                pb::SaveRequest {
                    dir: dir.display().to_string(),
                    checkpoint_id: id,
                    ..Default::default()
                },
                deadline,
            ))
            .await
            .map_err(|e| {
                let why = failed_call(&e, deadline);
                ps_error(addr, format!("ps {index} could not save: {why}"))
            })?
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
                    .save(within(
                        pb::SaveRequest {
                            in_memory: true,
                            step,
                            committed_step: committed,
                            ..Default::default()
                        },
                        PS_CALL_TIMEOUT,
                    ))
                    .await
                    .map_err(|e| {
                        let why = failed_call(&e, PS_CALL_TIMEOUT);
                        format!("ps {index} could not copy it: {why}")
                    })?
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
            .stats(within(pb::StatsRequest {}, PS_CALL_TIMEOUT))
            .await
            .map_err(|e| ps_error(addr, failed_call(&e, PS_CALL_TIMEOUT)))?
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
                let request = pb::ReshardRequest {
                    num_ps: to.len() as u32,
                    ps: to,
                    donor: i == 0,
                    old_num_ps: old,
                };
                c.reshard(within(request, PS_RESHARD_TIMEOUT))
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|e| {
                        let why = failed_call(&e, PS_RESHARD_TIMEOUT);
                        ps_error(&addr, format!("ps {i} could not reshard: {why}"))
                    })
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
        .stats(within(pb::StatsRequest {}, PS_CALL_TIMEOUT))
        .await
        .map_err(|e| ps_error(addr, failed_call(&e, PS_CALL_TIMEOUT)))?
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A PS that takes the connection and never answers (what held a ps job's cut, and every
    /// lease, for 10 minutes in a chaos soak): the save fails within its deadline, saying so.
    #[tokio::test]
    async fn a_ps_that_never_answers_its_save_fails_it_within_the_deadline() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                kept.push(s);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("ps-1");
        let creds = auth::JobCreds::from(auth::Token::generate());
        let ps = [addr];
        let save = save_ps(
            1,
            (dir.path(), &at),
            &ps,
            (10, "ps".into()),
            &creds,
            Duration::from_secs(1),
        );
        let e = tokio::time::timeout(Duration::from_secs(30), save)
            .await
            .expect("the save ended")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ps 0 could not save: no answer within 1 s"),
            "{e}"
        );
        assert!(!at.join(MANIFEST_FILE).exists());
        held.abort();
    }
}
