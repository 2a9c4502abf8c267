//! The configuration file as written: serde's view of each section, before any check.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawFile {
    pub(super) proxy: RawProxy,
    pub(super) control: RawControl,
    pub(super) database: RawDatabase,
    pub(super) upstream: RawUpstream,
    pub(super) shutdown: RawShutdown,
    pub(super) routes: Vec<RawRoute>,
    pub(super) clients: Vec<RawClient>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    pub(super) name: String,
    pub(super) token_sha256: String,
    #[serde(default)]
    pub(super) leases: Vec<String>,
    #[serde(default)]
    pub(super) read: bool,
    #[serde(default)]
    pub(super) routes: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawProxy {
    pub(super) listen: Option<String>,
    pub(super) body_limit_bytes: Option<u64>,
    pub(super) max_header_bytes: Option<u64>,
    pub(super) header_read_timeout_ms: Option<u64>,
    pub(super) body_read_timeout_ms: Option<u64>,
    pub(super) max_connections: Option<u64>,
    pub(super) threads: Option<u64>,
    pub(super) pin_threads: Option<bool>,
    pub(super) write_timeout_ms: Option<u64>,
    pub(super) hosts: Option<Vec<String>>,
    pub(super) trusted_proxies: Option<Vec<String>>,
    pub(super) client_claim_headers: Option<Vec<String>>,
    pub(super) client_request_ids: Option<bool>,
    pub(super) tls: Option<RawTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: String,
    pub(super) key: String,
    pub(super) client_ca: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawControl {
    pub(super) listen: Option<String>,
    pub(super) min_ttl_ms: Option<u64>,
    pub(super) max_ttl_ms: Option<u64>,
    pub(super) hosts: Option<Vec<String>>,
    pub(super) tls: Option<RawTls>,
    pub(super) watch_max_wait_ms: Option<u64>,
    pub(super) max_watchers: Option<u64>,
    pub(super) max_watchers_per_client: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawDatabase {
    pub(super) url: Option<String>,
    pub(super) pool_size: Option<u64>,
    pub(super) control_pool_size: Option<u64>,
    pub(super) max_batches_in_flight: Option<u64>,
    pub(super) fence_check_timeout_ms: Option<u64>,
    pub(super) grant_ms: Option<u64>,
    pub(super) clock_rate_tolerance: Option<f64>,
    pub(super) standby_check: Option<String>,
    pub(super) data_dir: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawUpstream {
    pub(super) connect_timeout_ms: Option<u64>,
    pub(super) forward_timeout_ms: Option<u64>,
    pub(super) settle_margin_ms: Option<u64>,
    pub(super) ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawShutdown {
    pub(super) grace_period_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) prefix: String,
    pub(super) upstream: String,
    pub(super) resource: RawResource,
    pub(super) lease: Option<String>,
    pub(super) unfenced_methods: Option<Vec<String>>,
    pub(super) body_methods: Option<Vec<String>>,
    pub(super) reads: Option<RawReads>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReads {
    pub(super) cluster: String,
    pub(super) stream: String,
    pub(super) max_lag_ms: u64,
    pub(super) leader_lease: Option<String>,
    pub(super) allow_hosts: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub(super) enum RawResource {
    Fixed(String),
    Header(String),
    Segment(i64),
}
