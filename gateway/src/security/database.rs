//! How the gateway connects to Postgres: libpq's URL with `sslmode` and `sslrootcert`, which
//! tokio-postgres does not know, taken out and turned into a rustls connector.
//!
//! No setting falls back to plaintext: `sslmode=prefer` and `allow` (which would) are refused at
//! start-up, and `require`, `verify-ca` and `verify-full` never connect without TLS.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::security::tls::{provider, root_store};

/// How the gateway connects to Postgres: the parsed configuration and the TLS connector.
#[derive(Clone)]
pub struct Database {
    /// The connection settings, `sslmode` set to what the TLS connector enforces.
    pub config: tokio_postgres::Config,
    /// The rustls connector (unused with `sslmode=disable`).
    pub tls: MakeRustlsConnect,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config's Debug redacts the password; the connector has nothing to show.
        f.debug_struct("Database").field("config", &self.config).finish_non_exhaustive()
    }
}

/// libpq's TLS modes the gateway honours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    /// Encrypted; the server's certificate is verified only when `sslrootcert` is given (as libpq).
    Require,
    /// The chain is verified, not the host name.
    VerifyCa,
    /// The chain and the host name are verified.
    VerifyFull,
}

/// How long one host of `database.url` has to accept a connection, unless the URL's
/// `connect_timeout` says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Database {
    /// Parses a libpq URL (`postgres://...?sslmode=verify-full&sslrootcert=/ca.pem`) or key=value
    /// string. `sslmode` is `disable` when absent; `prefer` and `allow` are refused.
    pub fn parse(text: &str) -> Result<Database, String> {
        for variable in ["PGSSLMODE", "PGSSLROOTCERT"] {
            if std::env::var_os(variable).is_some() {
                return Err(format!(
                    "{variable} is set but not read by the gateway: give sslmode and sslrootcert in database.url"
                ));
            }
        }
        let (rest, sslmode, sslrootcert) = take_tls_parameters(text)?;
        let mut config: tokio_postgres::Config =
            rest.parse().map_err(|error: tokio_postgres::Error| format!("database.url: {error}"))?;
        // A host that drops connection attempts (down, or cut off) would hold every connection
        // for the kernel's whole SYN retry, minutes, before the next host of a multi-host URL
        // is tried. Unless the URL says otherwise, a host gets 5 s (pools give it less).
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        // tokio-postgres reads the rest its own way: if it still finds an sslmode (spelled so
        // that the split above missed it), the two readings differ: refuse rather than guess.
        if !matches!(config.get_ssl_mode(), SslMode::Prefer) {
            return Err("database.url: sslmode is given in a form the gateway cannot read reliably (a `?` in the \
                        password, a percent-encoded name, a glued key=value pair); write it plainly"
                .to_owned());
        }
        let mode = match sslmode.as_deref() {
            None | Some("disable") => Mode::Disable,
            Some("require") => Mode::Require,
            Some("verify-ca") => Mode::VerifyCa,
            Some("verify-full") => Mode::VerifyFull,
            Some(other @ ("prefer" | "allow")) => {
                return Err(format!(
                    "database.url: sslmode={other} would fall back to plaintext without saying so; use disable, \
                     require, verify-ca or verify-full"
                ));
            }
            Some(other) => return Err(format!("database.url: sslmode={other:?} is not a libpq mode")),
        };
        let roots = match (&sslrootcert, mode) {
            (Some(_), Mode::Disable) => {
                return Err("database.url: sslrootcert without sslmode=require, verify-ca or verify-full would \
                            connect in plaintext"
                    .to_owned());
            }
            (Some(path), _) => Some(root_store(Path::new(path)).map_err(|error| format!("sslrootcert: {error}"))?),
            // As libpq: verify-ca has no default roots (the public web's CAs would accept any
            // name's certificate).
            (None, Mode::VerifyCa) => return Err("database.url: sslmode=verify-ca needs sslrootcert".to_owned()),
            (None, Mode::VerifyFull) => {
                let found = rustls_native_certs::load_native_certs();
                let mut roots = RootCertStore::empty();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(format!("database.url: sslmode={} needs sslrootcert", sslmode.unwrap_or_default()));
                }
                Some(roots)
            }
            (None, _) => None,
        };
        // libpq: `require` with a root certificate verifies like verify-ca.
        let mode = if mode == Mode::Require && roots.is_some() { Mode::VerifyCa } else { mode };
        config.ssl_mode(if mode == Mode::Disable { SslMode::Disable } else { SslMode::Require });
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?;
        let client = match (mode, roots) {
            (Mode::VerifyFull, Some(roots)) => builder.with_root_certificates(roots).with_no_client_auth(),
            (Mode::VerifyCa, Some(roots)) => {
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|error| error.to_string())?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(inner))).with_no_client_auth()
            }
            // Only `require` without a root encrypts without verifying; `disable` never uses it.
            (Mode::Require | Mode::Disable, None) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider())))
                .with_no_client_auth(),
            (Mode::VerifyCa | Mode::VerifyFull, None) | (Mode::Require | Mode::Disable, Some(_)) => {
                return Err("database.url: no roots to verify the server with".to_owned());
            }
        };
        Ok(Database { config, tls: MakeRustlsConnect::new(client) })
    }

    /// Connects one client, driving its connection on a spawned task.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(self.tls.clone()).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %crate::error_chain(&error), "database connection ended");
            }
        });
        Ok(client)
    }
}

/// Removes `sslmode` and `sslrootcert` from a libpq URL or key=value string (tokio-postgres
/// knows neither `verify-*` nor `sslrootcert`); returns the rest and their values.
fn take_tls_parameters(text: &str) -> Result<(String, Option<String>, Option<String>), String> {
    let (mut sslmode, mut sslrootcert) = (None, None);
    let mut twice = None;
    let mut take = |key: &str, value: String| -> bool {
        let slot = match key {
            "sslmode" => &mut sslmode,
            "sslrootcert" => &mut sslrootcert,
            _ => return false,
        };
        if slot.replace(value).is_some() {
            twice = Some(key.to_owned());
        }
        true
    };
    let lower = text.to_ascii_lowercase();
    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        let Some((base, query)) = text.split_once('?') else {
            return Ok((text.to_owned(), None, None));
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                !take(&percent_decode(key), percent_decode(value))
            })
            .collect();
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        if let Some(key) = twice {
            return Err(format!("database.url: {key} is given twice"));
        }
        return Ok((rest, sslmode, sslrootcert));
    }
    let mut kept = Vec::new();
    for token in text.split_whitespace() {
        let (key, value) = token.split_once('=').unwrap_or((token, ""));
        let key = key.trim();
        if (key == "sslmode" || key == "sslrootcert") && value.starts_with('\'') {
            return Err(format!("database.url: a quoted {key} is not supported; use the URL form"));
        }
        if !take(key, value.to_owned()) {
            kept.push(token);
        }
    }
    if let Some(key) = twice {
        return Err(format!("database.url: {key} is given twice"));
    }
    Ok((kept.join(" "), sslmode, sslrootcert))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// verify-ca: the chain must lead to a configured root; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `sslmode=require` without a root certificate, as libpq: encrypted, the server unverified.
/// The handshake's signatures are still checked.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_both_forms() {
        let (rest, mode, root) =
            take_tls_parameters("postgres://u@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem")
                .unwrap_or_default();
        assert_eq!(rest, "postgres://u@h:5/db?application_name=x");
        assert_eq!((mode.as_deref(), root.as_deref()), (Some("verify-full"), Some("/ca.pem")));
        let (rest, mode, root) = take_tls_parameters("host=h user=u sslmode=require dbname=d").unwrap_or_default();
        assert_eq!((rest.as_str(), mode.as_deref(), root), ("host=h user=u dbname=d", Some("require"), None));
        assert!(take_tls_parameters("host=h sslrootcert='/a b.pem'").is_err());
    }

    #[test]
    fn modes_that_fall_back_to_plaintext_are_refused() {
        for mode in ["prefer", "allow"] {
            let error = Database::parse(&format!("postgres://u@127.0.0.1/db?sslmode={mode}")).err().unwrap_or_default();
            assert!(error.contains("plaintext"), "{error}");
        }
        assert!(Database::parse("postgres://u@127.0.0.1/db?sslmode=bogus").is_err());
        // Spellings one reader could miss and the other not: refused, never plaintext.
        for url in [
            "postgres://gw:pa?ss@127.0.0.1/app?sslmode=require",
            "postgres://gw@127.0.0.1/app?%73slmode=disable&sslmode=require",
            "postgres://gw@127.0.0.1/app?sslmode=verify-full&sslmode=disable",
            "postgres://gw@127.0.0.1/app?sslrootcert=/nonexistent.pem",
            "postgres://gw@127.0.0.1/app?sslmode=verify-ca",
        ] {
            let parsed = Database::parse(url).map(|db| db.config.get_ssl_mode());
            assert!(parsed.is_err(), "{url} was accepted as {parsed:?}");
        }
        let plain = Database::parse("postgres://u@127.0.0.1/db").map(|db| db.config.get_ssl_mode());
        assert!(matches!(plain, Ok(SslMode::Disable)));
        let required = Database::parse("postgres://u@127.0.0.1/db?sslmode=require").map(|db| db.config.get_ssl_mode());
        assert!(matches!(required, Ok(SslMode::Require)));
    }
}
