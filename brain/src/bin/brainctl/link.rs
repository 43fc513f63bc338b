//! How brainctl reaches a running brain: the operator token, and the TLS that proves the server
//! is the brain before the token is sent (the CA the flags name, or the one the brain made
//! beside its database); plain text only with `--insecure`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use proto::service::v1::brain_client::BrainClient;

use crate::Cli;

/// How every call reaches the brain: `--token-file` and the TLS flags.
pub struct Link {
    pub token_file: PathBuf,
    /// `None`: plain text, no token (`--insecure`).
    pub tls: Option<auth::tls::ClientTls>,
}

/// The CA that checks the brain: what the flags name, else the one the brain made beside its
/// database (`tls/ca.pem` in the token file's directory); `None` with `--insecure`. Without
/// either, nothing is sent: a token goes only to a server that proved it is the brain.
pub fn brain_tls(cli: &Cli) -> anyhow::Result<Option<auth::tls::ClientTls>> {
    if cli.insecure {
        return Ok(None);
    }
    if let Some(dir) = &cli.tls_dir {
        return Ok(Some(auth::tls::ClientTls::in_dir(dir)));
    }
    if let Some(ca_file) = &cli.ca {
        return Ok(Some(auth::tls::ClientTls {
            ca_file: ca_file.clone(),
            cert_file: cli.tls_cert.clone(),
            key_file: cli.tls_key.clone(),
        }));
    }
    let beside = cli
        .token_file
        .parent()
        .unwrap_or(std::path::Path::new(""))
        .join(brain::server::TLS_DIR)
        .join(auth::tls::CA_CERT);
    if beside.exists() {
        return Ok(Some(auth::tls::ClientTls {
            ca_file: beside,
            cert_file: None,
            key_file: None,
        }));
    }
    bail!(
        "no CA to check the brain's certificate with: {} does not exist. Give --ca with the \
         brain's tls/ca.pem (beside its database), or --insecure for a brain started with \
         --insecure",
        beside.display()
    )
}

/// Why the brain at `address` could not be reached, with what to check: the innermost cause
/// (refused, no route, a TLS handshake that failed) rather than the transport's wrapper.
fn unreachable_brain(address: &str, e: &tonic::transport::Error) -> anyhow::Error {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let cause = cause.to_string();
    let hint = if cause.contains("refused") {
        "is the brain running, listening there? (`brain` prints `listening on ADDRESS` when it \
         starts; give --brain URL for another address)"
    } else if cause.to_lowercase().contains("certificate")
        || cause.contains("InvalidContentType")
        || cause.contains("tls")
    {
        "the TLS handshake failed: a brain started with --insecure needs brainctl --insecure; \
         else check --ca names the CA that signed the brain's certificate"
    } else {
        "check the address (--brain URL) and that this machine can reach it"
    };
    anyhow::anyhow!("cannot reach the brain at {address}: {cause}. {hint}")
}

pub static LINK: std::sync::OnceLock<Link> = std::sync::OnceLock::new();

/// A client of the brain that sends the operator token.
pub type Client = BrainClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, auth::WithToken>,
>;

/// How long connecting to the brain (TCP and the TLS handshake) may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long each call to the brain may take before brainctl gives up with the reason: the brain
/// answers most at once; those that read a job master's files or ask it (events, logs,
/// diagnose: the brain gives its reading 60 s) and a dry run's solve get longer.
const CALLS: auth::Deadlines = auth::Deadlines {
    default: std::time::Duration::from_secs(60),
    by_method: &[
        ("Diagnose", std::time::Duration::from_secs(120)),
        ("JobEvents", std::time::Duration::from_secs(120)),
        ("JobLogs", std::time::Duration::from_secs(120)),
        ("DryRun", std::time::Duration::from_secs(120)),
    ],
};

/// Where `brainctl submit` keeps job owners' tokens by default: `owners/` beside the operator
/// token (the operator's own directory, which holds the token that steers every job anyway).
pub fn owners_dir() -> PathBuf {
    LINK.get()
        .map(|l| l.token_file.parent().unwrap_or(std::path::Path::new("")))
        .unwrap_or(std::path::Path::new(""))
        .join("owners")
}

/// Asks a running brain, on a runtime of its own (the rest of brainctl is synchronous).
pub fn ask_brain<T>(
    address: &str,
    f: impl AsyncFnOnce(Client) -> Result<T, tonic::Status>,
) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let link = LINK.get().context("no --token-file")?;
        // Plain text (--insecure): the brain checks no token, and none is sent.
        let token = match &link.tls {
            None => None,
            Some(_) => Some(auth::read_secret(&link.token_file).with_context(|| {
                "the operator token (the brain writes it at its first start beside its \
                 database; --token-file or BRAIN_TOKEN_FILE names another)"
            })?),
        };
        let tls = link
            .tls
            .as_ref()
            .map(auth::tls::ClientTls::config)
            .transpose()
            .context("--ca, --tls-cert, --tls-key")?;
        // A server that takes the connection but never completes the handshake (not the
        // brain) is given up on.
        let endpoint = auth::endpoint(address.to_string(), tls)
            .with_context(|| format!("the brain's address {address}"))?
            .connect_timeout(CONNECT_TIMEOUT);
        let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "no TLS handshake within {} s: whatever answers there is not the brain",
                    CONNECT_TIMEOUT.as_secs()
                )
            })
            .with_context(|| format!("connecting to the brain at {address}"))?
            .map_err(|e| unreachable_brain(address, &e))?;
        let client =
            BrainClient::with_interceptor(channel, auth::WithToken::new(token).within(CALLS));
        f(client).await.map_err(|s| call_failed(address, &s))
    })
}

/// A failed call in words: a deadline that passed is the brain's silence, not its answer.
fn call_failed(address: &str, s: &tonic::Status) -> anyhow::Error {
    match s.code() {
        tonic::Code::DeadlineExceeded => anyhow::anyhow!(
            "the brain at {address} did not answer in time ({}): it is stopped, hung or cut \
             off; try again, or see its log",
            s.message()
        ),
        code => anyhow::anyhow!("the brain answered {code:?}: {}", s.message()),
    }
}

/// A job id, or a name looked up among the brain's jobs.
pub async fn job_id(c: &mut Client, job: &str) -> Result<u64, tonic::Status> {
    if let Ok(id) = job.parse() {
        return Ok(id);
    }
    let jobs = c
        .list_jobs(proto::service::v1::ListJobsRequest {})
        .await?
        .into_inner()
        .jobs;
    jobs.iter()
        .find(|j| j.job_name == job)
        .map(|j| j.job_id)
        .ok_or_else(|| tonic::Status::not_found(format!("no job named {job:?}")))
}
