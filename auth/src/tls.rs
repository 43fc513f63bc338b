//! TLS for Brain's gRPC links (rustls, through tonic): what a server presents ([`ServerTls`],
//! with mutual TLS when it names a client CA), what a client trusts ([`ClientTls`], with its own
//! certificate for mutual TLS), and [`make`], behind `brainctl certs`: a private CA and the
//! brain's and its clients' certificates, signed by it (rcgen, ECDSA P-256).
//!
//! Inside a job ([`JobTls`]): the job master makes a CA of the job's own and one certificate,
//! signed by it, that every process of the job presents as a server and as a client (mutual
//! TLS, the name [`JOB_SERVER_NAME`] whatever the address); the CA's key is thrown away, so no
//! other certificate can ever chain to it. The files lie beside the job's secret, in the run
//! directory the job's nodes share, and reach the processes as [`JOB_TLS_ENV`].

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::AuthError;

/// The files [`make`] writes into its directory.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const SERVER_CERT: &str = "brain.pem";
pub const SERVER_KEY: &str = "brain.key";
pub const CLIENT_CERT: &str = "client.pem";
pub const CLIENT_KEY: &str = "client.key";

/// What a TLS server presents; with `client_ca_file`, mutual TLS: every client must present a
/// certificate signed by that CA, or the handshake fails.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    /// Owner-only (mode 0600), as every private key here.
    pub key_file: PathBuf,
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// What a TLS client trusts (the CA the server's certificate must chain to) and, for mutual
/// TLS, the certificate and key it presents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    pub ca_file: PathBuf,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A private key: refused when its group or others may read it.
fn read_key(path: &Path) -> Result<Vec<u8>, AuthError> {
    crate::read_private(path)
}

impl ServerTls {
    /// Mutual TLS with the files [`make`] wrote into `dir`: the brain's certificate, and its
    /// CA for the clients'.
    pub fn in_dir(dir: &Path) -> Self {
        ServerTls {
            cert_file: dir.join(SERVER_CERT),
            key_file: dir.join(SERVER_KEY),
            client_ca_file: Some(dir.join(CA_CERT)),
        }
    }

    /// The server's TLS configuration, its files read now (a missing or exposed file is an
    /// error at start, not at the first handshake).
    pub fn config(&self) -> Result<ServerTlsConfig, AuthError> {
        let identity = Identity::from_pem(read(&self.cert_file)?, read_key(&self.key_file)?);
        let mut c = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca_file {
            c = c.client_ca_root(Certificate::from_pem(read(ca)?));
        }
        Ok(c)
    }
}

impl ServerTls {
    /// The server's TLS as rustls takes it, for [`crate::listen::incoming`] (which does the
    /// handshake, under its timeout): HTTP/2 and HTTP/1.1 offered (`GET /metrics`), the
    /// clients' certificates required when `client_ca_file` is given.
    pub fn rustls(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, AuthError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |path: &Path, e: rustls::pki_types::pem::Error| {
            AuthError::Tls(format!("{}: {e}", path.display()))
        };
        let cert = read(&self.cert_file)?;
        let chain = CertificateDer::pem_slice_iter(&cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&self.cert_file, e))?;
        let key = PrivateKeyDer::from_pem_slice(&read_key(&self.key_file)?)
            .map_err(|e| bad(&self.key_file, e))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| AuthError::Tls(e.to_string()))?;
        let builder = match &self.client_ca_file {
            Some(ca) => {
                let pem = read(ca)?;
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(&pem) {
                    roots
                        .add(c.map_err(|e| bad(ca, e))?)
                        .map_err(|e| AuthError::Tls(format!("{}: {e}", ca.display())))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    std::sync::Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| AuthError::Tls(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| AuthError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(std::sync::Arc::new(config))
    }
}

impl ClientTls {
    /// Mutual TLS with the files [`make`] wrote into `dir`: its CA, and the clients'
    /// certificate.
    pub fn in_dir(dir: &Path) -> Self {
        ClientTls {
            ca_file: dir.join(CA_CERT),
            cert_file: Some(dir.join(CLIENT_CERT)),
            key_file: Some(dir.join(CLIENT_KEY)),
        }
    }

    pub fn config(&self) -> Result<ClientTlsConfig, AuthError> {
        let mut c =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca_file)?));
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                c = c.identity(Identity::from_pem(read(cert)?, read_key(key)?));
            }
            (None, None) => {}
            _ => {
                return Err(AuthError::Tls(
                    "a client certificate needs both its certificate and its key".into(),
                ));
            }
        }
        Ok(c)
    }
}

/// The current year, from the system clock.
fn this_year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

fn tls_err(what: &str) -> impl Fn(rcgen::Error) -> AuthError + '_ {
    move |e| AuthError::Tls(format!("{what}: {e}"))
}

/// Writes a private CA and, signed by it, the brain's server certificate (for `hosts`, plus
/// localhost and 127.0.0.1) and a client certificate (for mutual TLS) into `dir`: [`CA_CERT`],
/// [`CA_KEY`], [`SERVER_CERT`], [`SERVER_KEY`], [`CLIENT_CERT`], [`CLIENT_KEY`]; keys owner-only.
/// The CA is valid for 10 years, the others for 2. Refuses to overwrite any of them: a CA
/// replaced by mistake locks every holder of the old one out. Returns the files written.
pub fn make(dir: &Path, hosts: &[String]) -> Result<Vec<PathBuf>, AuthError> {
    let files = [
        CA_CERT,
        CA_KEY,
        SERVER_CERT,
        SERVER_KEY,
        CLIENT_CERT,
        CLIENT_KEY,
    ];
    if let Some(f) = files.iter().map(|f| dir.join(f)).find(|p| p.exists()) {
        return Err(AuthError::Tls(format!(
            "{} exists already: certificates are never overwritten (remove them, or choose \
             another directory)",
            f.display()
        )));
    }
    let ca = Ca::new("Brain private CA")?;
    let ca_pem = ca.key_pem.clone();
    let mut names: Vec<String> = hosts.to_vec();
    for default in ["localhost", "127.0.0.1"] {
        if !names.iter().any(|n| n == default) {
            names.push(default.into());
        }
    }
    let (server, server_key) = ca.leaf(names, "brain", &[ExtendedKeyUsagePurpose::ServerAuth])?;
    let (client, client_key) = ca.leaf(
        Vec::new(),
        "brain client",
        &[ExtendedKeyUsagePurpose::ClientAuth],
    )?;
    let ca_cert = ca.cert;
    let (public, private) = writers(dir)?;
    Ok(vec![
        public(CA_CERT, &ca_cert)?,
        private(CA_KEY, &ca_pem)?,
        public(SERVER_CERT, &server)?,
        private(SERVER_KEY, &server_key)?,
        public(CLIENT_CERT, &client)?,
        private(CLIENT_KEY, &client_key)?,
    ])
}

/// A fresh CA: its certificate (PEM), and what signs with it.
struct Ca {
    cert: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
    year: i32,
}

impl Ca {
    /// Valid for 10 years (from the year before: a node whose clock is a little behind accepts it).
    fn new(name: &str) -> Result<Ca, AuthError> {
        let year = this_year();
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls_err(name))?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name.push(DnType::CommonName, name);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
        ca.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
        let key = KeyPair::generate().map_err(tls_err("the CA's key"))?;
        let cert = ca.self_signed(&key).map_err(tls_err(name))?;
        Ok(Ca {
            cert: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(ca, key),
            year,
        })
    }

    /// A certificate for `names`, signed by this CA, valid for 2 years; with its key (PEM).
    fn leaf(
        &self,
        names: Vec<String>,
        cn: &str,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Result<(String, String), AuthError> {
        let mut p = CertificateParams::new(names).map_err(tls_err(cn))?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = usages.to_vec();
        p.use_authority_key_identifier_extension = true;
        p.not_before = rcgen::date_time_ymd(self.year - 1, 1, 1);
        p.not_after = rcgen::date_time_ymd(self.year + 2, 1, 1);
        let key = KeyPair::generate().map_err(tls_err(cn))?;
        let cert = p.signed_by(&key, &self.issuer).map_err(tls_err(cn))?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

type Writer<'a> = Box<dyn Fn(&str, &str) -> Result<PathBuf, AuthError> + 'a>;

/// Writers of a public file and of an owner-only one into `dir` (made if missing).
fn writers(dir: &Path) -> Result<(Writer<'_>, Writer<'_>), AuthError> {
    std::fs::create_dir_all(dir).map_err(|source| AuthError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    // Written whole or not at all (a temporary file renamed), as the keys are: a job master
    // killed while it makes them leaves no truncated certificate behind.
    let public = move |name: &str, pem: &str| {
        let path = dir.join(name);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, pem)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| AuthError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(path)
    };
    let private = move |name: &str, pem: &str| {
        let path = dir.join(name);
        crate::write_private(&path, pem.as_bytes())?;
        Ok(path)
    };
    Ok((Box::new(public), Box::new(private)))
}

/// Where a job's processes find the job's TLS files (a directory), when the job runs with TLS.
pub const JOB_TLS_ENV: &str = "BRAIN_JOB_TLS_DIR";
/// The name every process of a job presents and checks, whatever address it serves on (a
/// process's address is known only once it starts, after its certificate was made).
pub const JOB_SERVER_NAME: &str = "job.brain.internal";
/// The job's TLS directory, in the job master's run directory (beside the job's secret).
pub const JOB_DIR: &str = "tls";
/// The files of a job's TLS directory.
pub const JOB_CA: &str = "ca.pem";
pub const JOB_CERT: &str = "job.pem";
pub const JOB_KEY: &str = "job.key";

/// A job's TLS: its CA, and the certificate and key every process of the job presents (as a
/// server and as a client: mutual TLS on every link inside the job).
#[derive(Clone)]
pub struct JobTls {
    dir: PathBuf,
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for JobTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobTls")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl JobTls {
    /// The job's TLS files in `dir`, made first when any is missing (a job master's first
    /// start; a restarted one keeps the job's).
    pub fn make_or_load(dir: &Path) -> Result<JobTls, AuthError> {
        if [JOB_CA, JOB_CERT, JOB_KEY]
            .iter()
            .all(|f| dir.join(f).exists())
        {
            return JobTls::load(dir);
        }
        let ca = Ca::new("Brain job CA")?;
        let (cert, key) = ca.leaf(
            vec![JOB_SERVER_NAME.into()],
            "brain job",
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        // The CA's key is not kept: nothing else will ever be signed by it.
        let (public, private) = writers(dir)?;
        private(JOB_KEY, &key)?;
        public(JOB_CERT, &cert)?;
        public(JOB_CA, &ca.cert)?;
        JobTls::load(dir)
    }

    /// The job's TLS files in `dir`, read now (the key must be owner-only).
    pub fn load(dir: &Path) -> Result<JobTls, AuthError> {
        Ok(JobTls {
            dir: dir.to_path_buf(),
            ca: read(&dir.join(JOB_CA))?,
            cert: read(&dir.join(JOB_CERT))?,
            key: read_key(&dir.join(JOB_KEY))?,
        })
    }

    /// The job's TLS named by [`JOB_TLS_ENV`]; `None` when the job runs without.
    pub fn from_env() -> Result<Option<JobTls>, AuthError> {
        match std::env::var_os(JOB_TLS_ENV) {
            Some(dir) if !dir.is_empty() => JobTls::load(Path::new(&dir)).map(Some),
            _ => Ok(None),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What a server of the job presents; its clients must present the job's certificate.
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
    }

    /// What a client of the job trusts (the job's CA, under [`JOB_SERVER_NAME`]) and presents.
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(JOB_SERVER_NAME)
    }

    /// The PEM files' contents.
    pub fn pem(&self) -> (&[u8], &[u8], &[u8]) {
        (&self.ca, &self.cert, &self.key)
    }

    fn parsed(&self) -> Result<Parsed, AuthError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, e: rustls::pki_types::pem::Error| {
            AuthError::Tls(format!("{what} in {}: {e}", self.dir.display()))
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&self.ca) {
            roots
                .add(ca.map_err(|e| bad(JOB_CA, e))?)
                .map_err(|e| AuthError::Tls(format!("{JOB_CA}: {e}")))?;
        }
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(JOB_CERT, e))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| bad(JOB_KEY, e))?;
        Ok((std::sync::Arc::new(roots), chain, key))
    }

    /// rustls' server side of the job's mutual TLS, for a link that is not gRPC (the
    /// allreduce ring): the job's certificate presented, the client's required.
    pub fn rustls_server(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, AuthError> {
        let (roots, chain, key) = self.parsed()?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| AuthError::Tls(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| AuthError::Tls(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| AuthError::Tls(e.to_string()))?;
        // A ring link carries data one way only: session tickets the server sent after the
        // handshake would lie unread at the client, whose close then resets the connection
        // (RST) and discards what the server had not read yet. No tickets: nothing to resume.
        config.send_tls13_tickets = 0;
        Ok(std::sync::Arc::new(config))
    }

    /// rustls' server side of the job's mutual TLS for its gRPC servers (the job master, a
    /// parameter server), for [`crate::listen::incoming`]: HTTP/2 offered.
    pub fn rustls_grpc_server(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, AuthError> {
        let mut config = (*self.rustls_server()?).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(std::sync::Arc::new(config))
    }

    /// rustls' client side of the job's mutual TLS (see [`Self::rustls_server`]); the server
    /// is checked under [`JOB_SERVER_NAME`].
    pub fn rustls_client(&self) -> Result<std::sync::Arc<rustls::ClientConfig>, AuthError> {
        let (roots, chain, key) = self.parsed()?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| AuthError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| AuthError::Tls(e.to_string()))?;
        Ok(std::sync::Arc::new(config))
    }
}

/// The job's CA as trust roots, its certificate chain and key.
type Parsed = (
    std::sync::Arc<rustls::RootCertStore>,
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_are_made_once_with_private_keys_their_owners_alone() {
        let dir = tempfile::tempdir().unwrap();
        let written = make(dir.path(), &["brain.example".into(), "10.0.0.5".into()]).unwrap();
        assert_eq!(written.len(), 6);
        use std::os::unix::fs::PermissionsExt;
        for key in [CA_KEY, SERVER_KEY, CLIENT_KEY] {
            let mode = std::fs::metadata(dir.path().join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
        let e = make(dir.path(), &[]).unwrap_err().to_string();
        assert!(e.contains("exists already"), "{e}");
        let server = ServerTls {
            cert_file: dir.path().join(SERVER_CERT),
            key_file: dir.path().join(SERVER_KEY),
            client_ca_file: Some(dir.path().join(CA_CERT)),
        };
        server.config().unwrap();
        let client = ClientTls {
            ca_file: dir.path().join(CA_CERT),
            cert_file: Some(dir.path().join(CLIENT_CERT)),
            key_file: Some(dir.path().join(CLIENT_KEY)),
        };
        client.config().unwrap();
        let half = ClientTls {
            key_file: None,
            ..client
        };
        assert!(half.config().unwrap_err().to_string().contains("both"));
        std::fs::set_permissions(
            dir.path().join(SERVER_KEY),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let e = server.config().unwrap_err().to_string();
        assert!(e.contains("readable by others"), "{e}");
    }

    #[test]
    fn a_job_keeps_its_certificate_and_no_ca_key_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let tls = JobTls::make_or_load(dir.path()).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [JOB_CA, JOB_KEY, JOB_CERT]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(JOB_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = JobTls::make_or_load(dir.path()).unwrap();
        assert_eq!(tls.pem(), again.pem(), "a restarted master keeps the job's");
        assert!(!format!("{tls:?}").contains("PRIVATE"));
        tls.server();
        tls.client();
    }
}
