//! Leader election on the PostgreSQL lease row of `fencing-schema`.
//!
//! Not built yet: this crate will hold the elector runtime (acquire, renew at ttl/3 with
//! jitter, step down when renewal fails or the local deadline passes) described in
//! `ARCHITECTURE.md`. It depends on `fencing-schema` for the lease calls and never on HTTP crates.

pub use fencing_schema::store::LeaseReply;
