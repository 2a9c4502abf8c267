//! The gateway as a real process over real sockets, against a real PostgreSQL and a recording
//! upstream: the contract's status table, bad input, faults, replicas, the zombie story and
//! shutdown.

#![allow(clippy::unwrap_used)]

mod bounded;
mod clients;
mod clocks;
mod contract;
mod control_api;
mod demo;
mod embedded;
mod failover;
mod faults;
mod follower_reads;
mod grants;
mod handover;
mod hygiene;
mod inspect;
mod lease_grants;
mod observability;
mod outbox;
mod replicas;
mod s8_nothing_goes_around;
mod security;
mod shutdown;
mod streams;
mod tls;
mod upstream_connections;
mod verify;
mod watch;
mod zombie;

use fencing_tests::gateway::{Gateway, Upstream};
use fencing_tests::pg::TestDb;

/// A database, an upstream and one gateway with the usual test routes:
/// `/ledger/{account}/...` bound to lease `ledger-writer`, `/jobs` named by header, `/fixed`
/// with one fixed resource, and `/dead` to a port nothing listens on.
pub struct Setup {
    pub db: TestDb,
    pub upstream: Upstream,
    pub gateway: Gateway,
}

pub fn routes(upstream: &str) -> String {
    format!(
        r#"
[proxy]
body_limit_bytes = 1024
header_read_timeout_ms = 500
client_claim_headers = ["X-Tenant"]
[upstream]
forward_timeout_ms = 1500
[[routes]]
prefix = "/ledger"
upstream = "{upstream}"
resource = {{ segment = 2 }}
lease = "ledger-writer"
[[routes]]
prefix = "/jobs"
upstream = "{upstream}"
resource = {{ header = "Fencing-Resource" }}
[[routes]]
prefix = "/fixed"
upstream = "{upstream}"
resource = {{ fixed = "the-fixed-one" }}
[[routes]]
prefix = "/dead"
upstream = "http://127.0.0.1:1"
resource = {{ fixed = "dead" }}
"#
    )
}

impl Setup {
    pub async fn new() -> Setup {
        let db = TestDb::new().await;
        let upstream = Upstream::start().await.unwrap();
        let gateway = Gateway::start(&db.url(), &routes(&upstream.url())).await.unwrap();
        Setup { db, upstream, gateway }
    }
}
