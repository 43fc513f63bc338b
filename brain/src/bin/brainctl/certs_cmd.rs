//! `brainctl certs`: a private CA, the brain's certificate and a client certificate, and the
//! configuration that uses them.

/// `brainctl certs`: the files, and the configuration that uses them.
pub fn certs(out: &std::path::Path, hosts: &[String]) -> anyhow::Result<()> {
    use auth::tls::*;
    let written = auth::tls::make(out, hosts)?;
    for f in &written {
        say!("wrote {}", f.display());
    }
    let p = |f: &str| out.join(f).display().to_string();
    say!(
        "\nIn the brain's configuration (brain --config FILE):\n\n\
         [tls]\ncert_file = {:?}\nkey_file = {:?}\n\
         # mutual TLS: every client presents a certificate this CA signed\n\
         client_ca_file = {:?}\n\n\
         [launcher.tls]  # how the job masters the brain starts reach it\n\
         ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n\n\
         brainctl: --ca {} (mutual TLS: --tls-cert {} --tls-key {})\n\
         job-master run --brain URL: --brain-ca {} (--brain-cert {} --brain-key {})",
        p(SERVER_CERT),
        p(SERVER_KEY),
        p(CA_CERT),
        p(CA_CERT),
        p(CLIENT_CERT),
        p(CLIENT_KEY),
        p(CA_CERT),
        p(CLIENT_CERT),
        p(CLIENT_KEY),
        p(CA_CERT),
        p(CLIENT_CERT),
        p(CLIENT_KEY),
    );
    Ok(())
}
