//! Bearer tokens for Brain's gRPC APIs. A [`Token`] is 32 random bytes, written as 64 hex digits;
//! it travels in the `authorization: Bearer …` header ([`WithToken`] adds it on the client side,
//! [`bearer`] reads it on the server side), lives on disk only in files its owner alone can read
//! ([`write_secret`], [`read_secret`]: mode 0600, a file others can read is refused), and never
//! appears in argv or logs (its `Debug` shows a digest prefix). A server that keeps tokens it
//! minted keeps their SHA-256 ([`Token::digest`]) and compares in constant time
//! ([`Token::matches`], [`digest_of`]).
//!
//! A server that answers one secret only (a job master, a parameter server: the job's secret in
//! [`JOB_TOKEN_FILE`]) checks it with [`Require`]; raw-TCP peers (the ring all-reduce) exchange a
//! [`Token::proof`] instead. [`tls`] holds the TLS side: server and client configurations and
//! the private CA `brainctl certs` makes; [`connect_with`] and [`endpoint`] dial with both.
//! [`listen`] is how every server takes its connections: handshake and idle timeouts, caps in
//! all and per peer, so that nobody locks a server out without a credential.
//!
//! Who holds which token (the brain's operator token, a job's secret) and what each may do is
//! the servers' business; this crate only makes, stores, sends and checks them.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::{Ascii, MetadataValue};

pub mod listen;
pub mod tls;

/// Where a token travels: the standard header.
pub const HEADER: &str = "authorization";

/// The file in a job master's run directory that holds the job's secret (mode 0600): the brain
/// writes it before it starts the master, a master started by hand creates it at its first
/// start. The job master, its agents, its training processes and its parameter servers all
/// authenticate to each other with it.
pub const JOB_TOKEN_FILE: &str = "job.token";

/// The environment variable that names the job's secret file to an agent and its training
/// process (the path only: the secret itself never travels in argv or the environment).
pub const JOB_TOKEN_ENV: &str = "BRAIN_JOB_TOKEN_FILE";

/// A client channel that sends a token with every call.
pub type Channel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, WithToken>;

/// Wraps a connected channel so that every call sends `token`.
pub fn with_token(channel: tonic::transport::Channel, token: WithToken) -> Channel {
    tonic::service::interceptor::InterceptedService::new(channel, token)
}

/// Connects to `url` (`http://HOST:PORT`); every call on the channel sends `token`, and ends
/// at its deadline in `deadlines`.
pub async fn connect(
    url: String,
    token: &Token,
    deadlines: Deadlines,
) -> Result<Channel, tonic::transport::Error> {
    connect_with(
        url,
        WithToken::new(Some(token.clone())).within(deadlines),
        None,
    )
    .await
}

/// What a process of a job holds to reach the job's others: the job's secret, and the job's
/// TLS when the job runs with it.
#[derive(Clone, Debug)]
pub struct JobCreds {
    pub token: Token,
    pub tls: Option<tls::JobTls>,
}

/// The secret alone: a job without TLS.
impl From<Token> for JobCreds {
    fn from(token: Token) -> JobCreds {
        JobCreds { token, tls: None }
    }
}

impl JobCreds {
    /// The job's secret from the file [`JOB_TOKEN_ENV`] names and its TLS from
    /// [`tls::JOB_TLS_ENV`] (none when unset): what a job's process is started with.
    pub fn from_env() -> Result<JobCreds, AuthError> {
        Ok(JobCreds {
            token: job_token_from_env()?,
            tls: tls::JobTls::from_env()?,
        })
    }

    /// Connects to `url` (`http://HOST:PORT`: over the job's mutual TLS when it runs with it),
    /// sending the job's secret with every call; each call ends at its deadline in
    /// `deadlines`.
    pub async fn connect(
        &self,
        url: String,
        deadlines: Deadlines,
    ) -> Result<Channel, tonic::transport::Error> {
        connect_with(
            url,
            WithToken::new(Some(self.token.clone())).within(deadlines),
            self.tls.as_ref().map(tls::JobTls::client),
        )
        .await
    }

    /// How one of the job's servers takes its connections ([`listen::incoming`]): under
    /// `limits`, over the job's mutual TLS when it runs with it.
    pub fn listening(
        &self,
        name: &'static str,
        limits: listen::ConnLimits,
    ) -> Result<listen::Listening, AuthError> {
        let tls = self
            .tls
            .as_ref()
            .map(tls::JobTls::rustls_grpc_server)
            .transpose()?;
        Ok(listen::Listening::new(name, limits, tls))
    }
}

/// Connects to `url`, over TLS when `tls` is given (an `http://` URL is then taken as
/// `https://`); every call on the channel sends the token `token` holds.
pub async fn connect_with(
    url: String,
    token: WithToken,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let channel = endpoint(url, tls)?.connect().await?;
    Ok(with_token(channel, token))
}

/// The endpoint for `url`, with TLS when `tls` is given (see [`connect_with`]); it connects
/// lazily, so that a client can be built before its server answers.
pub fn endpoint(
    url: String,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    let endpoint = match tls {
        Some(tls) => {
            let url = match url.strip_prefix("http://") {
                Some(rest) => format!("https://{rest}"),
                None => url,
            };
            tonic::transport::Endpoint::from_shared(url)?.tls_config(tls)?
        }
        None => tonic::transport::Endpoint::from_shared(url)?,
    };
    Ok(endpoint.connect_timeout(CONNECT_TIMEOUT))
}

/// How long a connection (TCP, and TLS where there is TLS) may take to be made: a peer that
/// never answers is an error after this, never a wait without end. Each call sets its own
/// deadline besides (by its kind, where it is made).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path}: readable by others (mode {mode:o}): a secret (token or private key) must be \
         its owner's alone (chmod 600 {path})"
    )]
    Exposed { path: PathBuf, mode: u32 },
    #[error(
        "{path}: {what}: a secret (token or private key) must be a regular file of the user who \
         reads it"
    )]
    NotPlain { path: PathBuf, what: String },
    #[error("{path}: not a token (expected 64 hex digits on one line)")]
    Malformed { path: PathBuf },
    #[error(
        "{JOB_TOKEN_ENV} is not set: a job's processes read the job's secret from the file it \
         names (the job master's platform sets it; an agent started by hand needs \
         --token-file with the master's run directory's {JOB_TOKEN_FILE})"
    )]
    NoJobToken,
    #[error("TLS: {0}")]
    Tls(String),
}

/// A secret that authenticates its holder.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(sha256 {}…)", &hex::encode(self.digest())[..8])
    }
}

impl Token {
    /// A fresh token from the operating system's random source.
    pub fn generate() -> Token {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        Token(hex::encode(bytes))
    }

    /// A token as written (64 hex digits); `None` otherwise.
    pub fn parse(text: &str) -> Option<Token> {
        let t = text.trim();
        (t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| Token(t.to_ascii_lowercase()))
    }

    /// The secret itself, for a file or an environment variable only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its SHA-256: what a server keeps instead of the token.
    pub fn digest(&self) -> [u8; 32] {
        digest_of(&self.0)
    }

    /// A proof of holding this token bound to `context` (SHA-256 of the token and the
    /// context, which is of fixed length for each use): what a raw-TCP peer sends instead of
    /// the token itself, so that a proof seen on the wire is good for that context only.
    pub fn proof(&self, context: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.0.as_bytes());
        h.update([0u8]);
        h.update(context);
        h.finalize().into()
    }

    /// Whether `presented` is this token, in time that does not depend on where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }

    fn header(&self) -> MetadataValue<Ascii> {
        format!("Bearer {}", self.0)
            .parse()
            .expect("hex digits are a valid header value")
    }
}

/// The SHA-256 of a presented token, to look it up among digests a server keeps.
pub fn digest_of(presented: &str) -> [u8; 32] {
    Sha256::digest(presented.as_bytes()).into()
}

/// Whether two digests are equal, in constant time.
pub fn digests_match(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.ct_eq(b).into()
}

/// The token a request carries (`authorization: Bearer TOKEN`), if any.
pub fn bearer<T>(request: &tonic::Request<T>) -> Option<&str> {
    request
        .metadata()
        .get(HEADER)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Writes `token` to `path`, readable and writable by its owner only (mode 0600 from the
/// moment it exists), replacing what was there.
pub fn write_secret(path: &Path, token: &Token) -> Result<(), AuthError> {
    write_private(path, format!("{}\n", token.0).as_bytes())
}

/// Writes `bytes` to `path`, owner-only (mode 0600) from the moment it exists, replacing what
/// was there atomically.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), AuthError> {
    let io = |source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

/// Refuses a secret file (a token, a private key) that is not a regular file of this process's
/// user that only that user may read (see [`read_private`]).
pub fn check_private(path: &Path) -> Result<(), AuthError> {
    open_private(path).map(drop)
}

/// Opens a secret file, refusing what is not a regular file owned by this process's user and
/// readable by it alone: a symbolic link (not followed), a FIFO or device (opened without
/// waiting, so a FIFO planted where a token was expected cannot hang the reader), another
/// user's file, one its group or others may read.
fn open_private(path: &Path) -> Result<std::fs::File, AuthError> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::MetadataExt;
    let io = |source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ELOOP) {
                AuthError::NotPlain {
                    path: path.to_path_buf(),
                    what: "a symbolic link".into(),
                }
            } else {
                io(e)
            }
        })?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(AuthError::NotPlain {
            path: path.to_path_buf(),
            what: "not a regular file".into(),
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(AuthError::NotPlain {
            path: path.to_path_buf(),
            what: format!(
                "owned by user {}, not by this process's user {me}",
                meta.uid()
            ),
        });
    }
    let mode = meta.mode();
    if mode & 0o077 != 0 {
        return Err(AuthError::Exposed {
            path: path.to_path_buf(),
            mode: mode & 0o777,
        });
    }
    Ok(file)
}

/// The bytes of a secret file, checked as [`check_private`] says.
pub fn read_private(path: &Path) -> Result<Vec<u8>, AuthError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_private(path)?
        .take(1 << 20)
        .read_to_end(&mut bytes)
        .map_err(|source| AuthError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(bytes)
}

/// Reads a token file (see [`check_private`] for what is refused).
pub fn read_secret(path: &Path) -> Result<Token, AuthError> {
    let bytes = read_private(path)?;
    std::str::from_utf8(&bytes)
        .ok()
        .and_then(Token::parse)
        .ok_or_else(|| AuthError::Malformed {
            path: path.to_path_buf(),
        })
}

/// The token in `path`, or a new one written there when the file does not exist (a service's
/// first start).
pub fn read_or_create(path: &Path) -> Result<(Token, bool), AuthError> {
    // A link is there even when it leads nowhere: read (and refused), never written through.
    if path.symlink_metadata().is_ok() {
        return Ok((read_secret(path)?, false));
    }
    let token = Token::generate();
    write_secret(path, &token)?;
    Ok((token, true))
}

/// The job's secret, from the file [`JOB_TOKEN_ENV`] names (what a training process reads).
pub fn job_token_from_env() -> Result<Token, AuthError> {
    let path = std::env::var_os(JOB_TOKEN_ENV).ok_or(AuthError::NoJobToken)?;
    read_secret(Path::new(&path))
}

/// A server interceptor that lets through only calls that carry one token (a job's secret:
/// the job master's and a parameter server's APIs). Anything else is UNAUTHENTICATED.
#[derive(Clone)]
pub struct Require {
    token: Arc<Token>,
    server: &'static str,
}

impl Require {
    /// `server` names the API in refusals ("the job master", "the parameter server").
    pub fn new(token: Token, server: &'static str) -> Require {
        Require {
            token: Arc::new(token),
            server,
        }
    }
}

impl tonic::service::Interceptor for Require {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match bearer(&request) {
            Some(presented) if self.token.matches(presented) => Ok(request),
            Some(_) => Err(tonic::Status::unauthenticated(format!(
                "the token is not this job's secret: {} answers its own job's processes only",
                self.server
            ))),
            None => Err(tonic::Status::unauthenticated(format!(
                "no token: {} needs `authorization: Bearer TOKEN` with the job's secret (the \
                 file {JOB_TOKEN_ENV} names; `{JOB_TOKEN_FILE}` in the job master's run \
                 directory)",
                self.server
            ))),
        }
    }
}

/// A client interceptor that sends a token with every call; the token may be replaced while
/// clients hold it (a job master swaps the operator token it registered with for the job's
/// own), or be absent (the server then answers UNAUTHENTICATED). With [`Deadlines`]
/// ([`WithToken::within`]) it also gives every call that sets none its deadline by its kind.
#[derive(Clone, Debug, Default)]
pub struct WithToken {
    token: Arc<RwLock<Option<Token>>>,
    deadlines: Option<Deadlines>,
}

impl WithToken {
    pub fn new(token: Option<Token>) -> WithToken {
        WithToken {
            token: Arc::new(RwLock::new(token)),
            deadlines: None,
        }
    }

    /// The same, and every call made through it that sets no deadline of its own gets the one
    /// `deadlines` gives its method.
    pub fn within(mut self, deadlines: Deadlines) -> WithToken {
        self.deadlines = Some(deadlines);
        self
    }

    /// From now on every call through this interceptor (and its clones) sends `token`.
    pub fn replace(&self, token: Token) {
        *self.token.write().expect("no panic under the lock") = Some(token);
    }
}

impl PartialEq for WithToken {
    fn eq(&self, other: &WithToken) -> bool {
        *self.token.read().expect("no panic under the lock")
            == *other.token.read().expect("no panic under the lock")
            && self.deadlines == other.deadlines
    }
}

impl tonic::service::Interceptor for WithToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = self.token.read().expect("no panic under the lock").as_ref() {
            request.metadata_mut().insert(HEADER, t.header());
        }
        if let Some(d) = &self.deadlines
            && !request.metadata().contains_key(GRPC_TIMEOUT)
        {
            let method = request
                .extensions()
                .get::<tonic::GrpcMethod<'static>>()
                .map(tonic::GrpcMethod::method);
            request.set_timeout(d.of(method));
        }
        Ok(request)
    }
}

/// The header a call's deadline travels in; the client ends the call when it passes.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// How long each kind of call to one service may take: past it the client ends the call with
/// DEADLINE_EXCEEDED, whatever the server does (a server stopped, hung, or holding the
/// connection without answering). Every internal client names its table where it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// A call not named in `by_method`.
    pub default: std::time::Duration,
    /// Methods (as the `.proto` names them: `Heartbeat`) with a deadline of their own.
    pub by_method: &'static [(&'static str, std::time::Duration)],
}

impl Deadlines {
    /// The same deadline for every call.
    pub const fn all(d: std::time::Duration) -> Deadlines {
        Deadlines {
            default: d,
            by_method: &[],
        }
    }

    /// The deadline of a call to `method` (the default when unknown).
    pub fn of(&self, method: Option<&str>) -> std::time::Duration {
        method
            .and_then(|m| self.by_method.iter().find(|(name, _)| *name == m))
            .map_or(self.default, |(_, d)| *d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use tonic::service::Interceptor;

    #[test]
    fn tokens_are_random_hex_and_match_only_themselves() {
        let (a, b) = (Token::generate(), Token::generate());
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 64);
        assert_eq!(Token::parse(a.expose()), Some(a.clone()));
        assert!(a.matches(a.expose()));
        assert!(!a.matches(b.expose()));
        assert!(!a.matches(""));
        assert!(!a.matches(&a.expose()[..63]));
        assert!(digests_match(&a.digest(), &digest_of(a.expose())));
        assert!(!digests_match(&a.digest(), &b.digest()));
        assert!(digests_match(&a.proof(b"x"), &a.proof(b"x")));
        assert!(!digests_match(&a.proof(b"x"), &a.proof(b"y")));
        assert!(!digests_match(&a.proof(b"x"), &b.proof(b"x")));
        assert_eq!(Token::parse("not hex"), None);
        // Debug never shows the secret.
        assert!(!format!("{a:?}").contains(a.expose()));
    }

    #[test]
    fn token_files_are_the_owners_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/operator.token");
        let (t, created) = read_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_or_create(&path).unwrap(), (t.clone(), false));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_secret(&path).unwrap_err().to_string();
        assert!(e.contains("readable by others (mode 644)"), "{e}");
        std::fs::write(dir.path().join("bad"), "x").unwrap();
        std::fs::set_permissions(
            dir.path().join("bad"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let e = read_secret(&dir.path().join("bad"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a token"), "{e}");
    }

    /// Issue 40, attack 10: `brainctl` hung on a FIFO token file and followed a symbolic link
    /// to another user's token file.
    #[test]
    fn a_token_file_must_be_a_regular_file_of_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.token");
        let t = Token::generate();
        write_secret(&real, &t).unwrap();
        assert_eq!(read_secret(&real).unwrap(), t);
        let link = dir.path().join("link.token");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = read_secret(&link).unwrap_err().to_string();
        assert!(e.contains("a symbolic link"), "{e}");
        let e = read_or_create(&link).unwrap_err().to_string();
        assert!(e.contains("a symbolic link"), "{e}");
        let fifo = dir.path().join("fifo.token");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Refused at once: nothing waits for a writer.
        let e = read_secret(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        if nix::unistd::geteuid().is_root() {
            let theirs = dir.path().join("theirs.token");
            write_secret(&theirs, &t).unwrap();
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let e = read_secret(&theirs).unwrap_err().to_string();
            assert!(e.contains("owned by user 65534"), "{e}");
        }
    }

    #[test]
    fn a_server_requiring_a_token_lets_only_it_through() {
        let (t, other) = (Token::generate(), Token::generate());
        let mut require = Require::new(t.clone(), "the job master");
        let with = |tok: Option<&Token>| {
            WithToken::new(tok.cloned())
                .call(tonic::Request::new(()))
                .unwrap()
        };
        assert!(require.call(with(Some(&t))).is_ok());
        let e = require.call(with(Some(&other))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("not this job's secret"), "{e}");
        let e = require.call(with(None)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("no token"), "{e}");
    }

    #[test]
    fn the_client_sends_the_token_it_holds_now() {
        let mut with = WithToken::new(None);
        let r = with.call(tonic::Request::new(())).unwrap();
        assert_eq!(bearer(&r), None);
        let t = Token::generate();
        with.clone().replace(t.clone());
        let r = with.call(tonic::Request::new(())).unwrap();
        assert_eq!(bearer(&r), Some(t.expose()));
    }

    #[test]
    fn each_call_gets_the_deadline_of_its_kind_unless_it_set_one() {
        const D: Deadlines = Deadlines {
            default: std::time::Duration::from_secs(30),
            by_method: &[("Heartbeat", std::time::Duration::from_secs(5))],
        };
        let mut with = WithToken::new(None).within(D);
        let call = |method: Option<&'static str>| {
            let mut r = tonic::Request::new(());
            if let Some(m) = method {
                r.extensions_mut().insert(tonic::GrpcMethod::new("svc", m));
            }
            r
        };
        let timeout = |r: &tonic::Request<()>| {
            r.metadata()
                .get(GRPC_TIMEOUT)
                .map(|v| v.to_str().unwrap().to_string())
        };
        let r = with.call(call(Some("Heartbeat"))).unwrap();
        assert_eq!(timeout(&r).as_deref(), Some("5000000u"));
        let r = with.call(call(Some("GetWorkload"))).unwrap();
        assert_eq!(timeout(&r).as_deref(), Some("30000000u"));
        let r = with.call(call(None)).unwrap();
        assert_eq!(timeout(&r).as_deref(), Some("30000000u"));
        // A call that set its own keeps it.
        let mut own = call(Some("Heartbeat"));
        own.set_timeout(std::time::Duration::from_secs(600));
        let r = with.call(own).unwrap();
        assert_eq!(timeout(&r).as_deref(), Some("600000m"));
        // Without a table, none is set.
        let r = WithToken::new(None).call(call(Some("Heartbeat"))).unwrap();
        assert_eq!(timeout(&r), None);
    }
}
