//! TLS with rustls for HTTP: the listeners (optionally requiring client certificates) and
//! `https://` upstreams. Postgres's TLS is in [`crate::security::database`].
//!
//! No TLS setting falls back to plaintext: a listener with `tls` only speaks TLS; an `https://`
//! upstream is never contacted in clear.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// A listener's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// The CAs in a PEM file, as a root store.
pub fn root_store(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    Ok(roots)
}

/// The rustls server configuration of a listener.
pub fn server_config(tls: &ListenerTls) -> Result<Arc<ServerConfig>, String> {
    let certs = certificates(&tls.cert)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|error| format!("{}: {error}", tls.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?;
    let builder = match &tls.client_ca {
        Some(path) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(path)?), provider())
                .build()
                .map_err(|error| format!("{}: {error}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|error| format!("{} and {}: {error}", tls.cert.display(), tls.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The rustls client configuration for `https://` upstreams: the CAs of `ca_file`, else the
/// system's roots. Without any `https://` route, an empty store (nothing is ever verified).
pub fn upstream_client_config(ca_file: Option<&Path>, any_https: bool) -> Result<ClientConfig, String> {
    let roots = match ca_file {
        Some(path) => root_store(path)?,
        None if any_https => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "no system CA certificates found for https:// upstreams ({} errors); set upstream.ca_file",
                    found.errors.len()
                ));
            }
            roots
        }
        None => RootCertStore::empty(),
    };
    // No ALPN here: the HTTPS connector sets it (http/1.1).
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
