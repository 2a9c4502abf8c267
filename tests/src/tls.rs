//! A certificate authority made inside the test (rcgen), its certificates as files, and an HTTP
//! client over rustls for one request.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::gateway::Reply;

/// A CA for one test, with the folder its files are written to.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Where the PEM files go; removed on drop.
    pub dir: PathBuf,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<TestCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("fencing test CA {name}"));
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let dir =
            std::env::temp_dir().join(format!("fencing-tls-{name}-{}-{}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&dir)?;
        // The test cluster's user must read the files too.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let ca = TestCa { issuer, dir };
        std::fs::write(ca.ca_file(), ca.issuer.pem())?;
        Ok(ca)
    }

    /// The CA certificate's PEM file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate for `names` (DNS names or IP addresses), signed by this CA.
    pub fn issue(&self, file_stem: &str, names: &[&str]) -> Result<Issued> {
        let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let issued =
            Issued { cert: self.dir.join(format!("{file_stem}.pem")), key: self.dir.join(format!("{file_stem}.key")) };
        std::fs::write(&issued.cert, cert.pem())?;
        std::fs::write(&issued.key, key.serialize_pem())?;
        Ok(issued)
    }

    /// A rustls client configuration trusting this CA, with a client certificate if given.
    pub fn client_config(&self, client: Option<&Issued>) -> Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(self.ca_file())? {
            roots.add(cert?)?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        Ok(match client {
            Some(issued) => {
                let certs = CertificateDer::pem_file_iter(&issued.cert)?.collect::<Result<Vec<_>, _>>()?;
                builder.with_client_auth_cert(certs, PrivateKeyDer::from_pem_file(&issued.key)?)?
            }
            None => builder.with_no_client_auth(),
        })
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends one request over TLS (server name `server_name`) and reads the whole response.
pub async fn send_tls(
    config: rustls::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Reply> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| anyhow!("server name: {e}"))?;
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| anyhow!("TLS handshake timed out"))?
        .context("TLS handshake")?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(connection);
    let mut request = Request::builder().method(method).uri(path).header("host", server_name);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::copy_from_slice(body.as_bytes())))?;
    let response = tokio::time::timeout(Duration::from_secs(30), sender.send_request(request))
        .await
        .map_err(|_| anyhow!("no response within 30 s"))??;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Reply { status: parts.status, headers: parts.headers, body })
}

/// Reads a PEM file (for tests that hand certificates to a server they run themselves).
pub fn server_config(issued: &Issued) -> Result<rustls::ServerConfig> {
    let certs = CertificateDer::pem_file_iter(&issued.cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&issued.key)?;
    Ok(rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?)
}
