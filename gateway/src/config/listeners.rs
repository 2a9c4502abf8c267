//! The `[proxy]` and `[control]` sections: addresses, limits and timeouts, proxy threads, the
//! names `Host` may carry, trusted proxies and TLS.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::config::checks::Checks;
use crate::config::model::{
    ControlConfig, DEFAULT_BODY_LIMIT_BYTES, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_CONTROL_LISTEN,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_TTL,
    DEFAULT_MAX_WATCHERS, DEFAULT_MAX_WATCHERS_PER_CLIENT, DEFAULT_MIN_TTL, DEFAULT_PROXY_LISTEN,
    DEFAULT_WATCH_MAX_WAIT, DEFAULT_WRITE_TIMEOUT, DatabaseConfig, MAX_PROXY_THREADS, ProxyConfig,
};
use crate::config::raw::{RawControl, RawProxy, RawTls};
use crate::security::tls::{ListenerTls, server_config};

/// The `[proxy]` section; its thread default depends on whether `database` has grants.
pub(super) fn proxy(raw: RawProxy, database: &DatabaseConfig, checks: &mut Checks) -> ProxyConfig {
    let header_read_timeout =
        checks.positive_ms("proxy.header_read_timeout_ms", raw.header_read_timeout_ms, DEFAULT_HEADER_READ_TIMEOUT);
    let body_read_timeout =
        checks.positive_ms("proxy.body_read_timeout_ms", raw.body_read_timeout_ms, DEFAULT_BODY_READ_TIMEOUT);
    let write_timeout = checks.positive_ms("proxy.write_timeout_ms", raw.write_timeout_ms, DEFAULT_WRITE_TIMEOUT);
    let listen = checks.address("proxy.listen", raw.listen, DEFAULT_PROXY_LISTEN);
    let body_limit_bytes = raw.body_limit_bytes.unwrap_or(DEFAULT_BODY_LIMIT_BYTES);
    let max_header_bytes = match raw.max_header_bytes.map(usize::try_from) {
        None => DEFAULT_MAX_HEADER_BYTES,
        Some(Ok(bytes)) if bytes >= 8192 => bytes,
        Some(_) => {
            checks.push("proxy.max_header_bytes: must be at least 8192".to_owned());
            DEFAULT_MAX_HEADER_BYTES
        }
    };
    let max_connections = match raw.max_connections.map(usize::try_from) {
        None => DEFAULT_MAX_CONNECTIONS,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            checks.push("proxy.max_connections: must be positive".to_owned());
            DEFAULT_MAX_CONNECTIONS
        }
    };
    // Without grants every write waits for a batched decision on the shared runtime, where
    // work stealing keeps that hop short; with grants a write stays on its thread.
    let threads = match raw.threads.map(usize::try_from) {
        None if database.grant.is_zero() => 0,
        None => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).min(MAX_PROXY_THREADS),
        Some(Ok(n)) if n <= MAX_PROXY_THREADS => n,
        Some(_) => {
            checks.push(format!("proxy.threads: 0 (the shared runtime) to {MAX_PROXY_THREADS}"));
            0
        }
    };
    // Per-CPU runtimes, one on each CPU: no thread is moved onto another's CPU (where the two
    // would take turns, a scheduler tick each, while the other CPU runs something else).
    let pin_threads = raw.pin_threads.unwrap_or(threads > 0 && threads <= crate::cpus::allowed().len());
    let trusted_proxies = raw
        .trusted_proxies
        .unwrap_or_default()
        .iter()
        .filter_map(|text| match text.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                checks.push(format!("proxy.trusted_proxies: {text:?} is not an IP address"));
                None
            }
        })
        .collect();
    let client_claim_headers = raw
        .client_claim_headers
        .unwrap_or_default()
        .iter()
        .filter_map(|text| match http::HeaderName::from_bytes(text.as_bytes()) {
            Ok(name) if name.as_str().bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') => {
                Some(name)
            }
            _ => {
                checks.push(format!("proxy.client_claim_headers: {text:?} is not a header name of a-z 0-9 - only"));
                None
            }
        })
        .collect();
    ProxyConfig {
        listen,
        body_limit_bytes,
        max_header_bytes,
        header_read_timeout,
        body_read_timeout,
        max_connections,
        threads,
        pin_threads,
        write_timeout,
        hosts: host_names("proxy.hosts", raw.hosts, checks),
        trusted_proxies,
        client_claim_headers,
        client_request_ids: raw.client_request_ids.unwrap_or(false),
        tls: listener_tls("proxy.tls", raw.tls, checks),
    }
}

/// The `[control]` section; `proxy` was checked first (the two may not share an address).
pub(super) fn control(raw: RawControl, proxy: &ProxyConfig, checks: &mut Checks) -> ControlConfig {
    let min_ttl = checks.positive_ms("control.min_ttl_ms", raw.min_ttl_ms, DEFAULT_MIN_TTL);
    let max_ttl = checks.positive_ms("control.max_ttl_ms", raw.max_ttl_ms, DEFAULT_MAX_TTL);
    let listen = checks.address("control.listen", raw.listen, DEFAULT_CONTROL_LISTEN);
    if proxy.listen == listen && listen.port() != 0 {
        checks.push(format!("control.listen: must differ from proxy.listen ({listen})"));
    }
    if min_ttl > max_ttl {
        checks.push(format!("control.min_ttl_ms: {min_ttl:?} is above control.max_ttl_ms {max_ttl:?}"));
    }
    if max_ttl > fencing_schema::MAX_TTL {
        checks.push(format!("control.max_ttl_ms: at most {} ms", fencing_schema::MAX_TTL.as_millis()));
    }
    let watch_max_wait = checks.positive_ms("control.watch_max_wait_ms", raw.watch_max_wait_ms, DEFAULT_WATCH_MAX_WAIT);
    if watch_max_wait > Duration::from_secs(600) {
        checks.push("control.watch_max_wait_ms: at most 600000 (10 minutes)".to_owned());
    }
    let mut count = |key: &str, value: Option<u64>, default: usize| match value.map(usize::try_from) {
        None => default,
        Some(Ok(count)) if (1..=100_000).contains(&count) => count,
        Some(_) => {
            checks.push(format!("{key}: must be between 1 and 100000"));
            default
        }
    };
    let max_watchers =
        count("control.max_watchers", raw.max_watchers, DEFAULT_MAX_WATCHERS.min(proxy.max_connections / 2));
    let max_watchers_per_client =
        count("control.max_watchers_per_client", raw.max_watchers_per_client, DEFAULT_MAX_WATCHERS_PER_CLIENT);
    if max_watchers > proxy.max_connections / 2 {
        checks.push(format!(
            "control.max_watchers: at most half of proxy.max_connections ({}): each waiting watch holds a \
             connection of the control listener, and the rest stay for renewals and heartbeats",
            proxy.max_connections
        ));
    }
    ControlConfig {
        listen,
        min_ttl,
        max_ttl,
        hosts: host_names("control.hosts", raw.hosts, checks),
        tls: listener_tls("control.tls", raw.tls, checks),
        watch_max_wait,
        max_watchers,
        max_watchers_per_client,
    }
}

/// Development mode (no clients): nobody authenticates, so a web page that rebinds its own
/// name to 127.0.0.1 must not reach the listeners: without configured names, only loopback
/// names are served.
pub(super) fn loopback_names(names: &mut Vec<String>, listen: SocketAddr) {
    if names.is_empty() {
        names.extend(["localhost", "127.0.0.1", "[::1]"].map(str::to_owned));
        let ip = match listen.ip() {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        if !names.contains(&ip) {
            names.push(ip);
        }
    }
}

fn host_names(key: &str, names: Option<Vec<String>>, checks: &mut Checks) -> Vec<String> {
    let names = names.unwrap_or_default();
    for name in &names {
        let bracketed_v6 = name.starts_with('[') && name.ends_with(']');
        if name.is_empty() || name.contains(['/', ' ', '@']) || (name.contains(':') && !bracketed_v6) {
            checks.push(format!("{key}: {name:?} must be a host name without port"));
        }
    }
    names.into_iter().map(|name| name.to_ascii_lowercase()).collect()
}

fn listener_tls(key: &str, raw: Option<RawTls>, checks: &mut Checks) -> Option<ListenerTls> {
    let raw = raw?;
    let tls = ListenerTls {
        cert: PathBuf::from(raw.cert),
        key: PathBuf::from(raw.key),
        client_ca: raw.client_ca.map(PathBuf::from),
    };
    match server_config(&tls) {
        Ok(_) => Some(tls),
        Err(error) => {
            checks.push(format!("{key}: {error}"));
            None
        }
    }
}
