//! TLS for Brain's gRPC links (rustls, through tonic): what a server presents ([`ServerTls`],
//! with mutual TLS when it names a client CA), what a client trusts ([`ClientTls`], with its own
//! certificate for mutual TLS), and [`make`], behind `brainctl certs`: a private CA and the
//! brain's and its clients' certificates, signed by it (rcgen, ECDSA P-256).

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
    crate::check_private(path)?;
    read(path)
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

/// The current year, from the system clock (certificates are valid from the year before, so a
/// node whose clock is a little behind accepts them).
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
    let year = this_year();
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls_err("the CA"))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "Brain private CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    ca.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
    let ca_key = KeyPair::generate().map_err(tls_err("the CA's key"))?;
    let ca_cert = ca.self_signed(&ca_key).map_err(tls_err("the CA"))?;
    let ca_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);

    let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(names).map_err(tls_err(cn))?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![usage];
        p.use_authority_key_identifier_extension = true;
        p.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
        p.not_after = rcgen::date_time_ymd(year + 2, 1, 1);
        let key = KeyPair::generate().map_err(tls_err(cn))?;
        let cert = p.signed_by(&key, &issuer).map_err(tls_err(cn))?;
        Ok::<_, AuthError>((cert.pem(), key.serialize_pem()))
    };
    let mut names: Vec<String> = hosts.to_vec();
    for default in ["localhost", "127.0.0.1"] {
        if !names.iter().any(|n| n == default) {
            names.push(default.into());
        }
    }
    let (server, server_key) = leaf(names, "brain", ExtendedKeyUsagePurpose::ServerAuth)?;
    let (client, client_key) = leaf(
        Vec::new(),
        "brain client",
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    std::fs::create_dir_all(dir).map_err(|source| AuthError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let public = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).map_err(|source| AuthError::Io {
            path: path.clone(),
            source,
        })?;
        Ok::<_, AuthError>(path)
    };
    let private = |name: &str, pem: &str| {
        let path = dir.join(name);
        crate::write_private(&path, pem.as_bytes())?;
        Ok::<_, AuthError>(path)
    };
    Ok(vec![
        public(CA_CERT, &ca_cert.pem())?,
        private(CA_KEY, &ca_pem)?,
        public(SERVER_CERT, &server)?,
        private(SERVER_KEY, &server_key)?,
        public(CLIENT_CERT, &client)?,
        private(CLIENT_KEY, &client_key)?,
    ])
}

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
}
