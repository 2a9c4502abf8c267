//! Leader election on the PostgreSQL lease row of `fencing-schema`, whose term is a fencing
//! token.
//!
//! An [`Elector`] holds one lease key for one owner. Started, it runs one background task that
//! acquires the lease (with exponential backoff and full jitter while a follower), renews it
//! every `ttl/3` or so while leader, and steps down the moment a renewal fails, errors, times
//! out, or its local deadline passes. The deadline is the monotonic instant it sent the last
//! successful acquire or renew, plus the `remaining_ms` the store returned, minus a safety
//! margin (invariant S7): expiry is decided by the store's clock, never by this process's wall
//! clock.
//!
//! Leader code gets, from the [`ElectorHandle`]:
//! - a watchable [`LeaderState`] and a stream of [`Event`]s;
//! - a [`Leadership`] per term, with a cancellation token cancelled the instant leadership ends,
//!   and [`ElectorHandle::spawn_leader_work`] to run work only while leader;
//! - the current term for stamping writes, and [`ElectorHandle::write_fenced`], which refuses
//!   to send while not leader and abandons the send when leadership ends;
//! - [`ElectorHandle::shutdown`], which stops leader work and releases the lease;
//! - a value attached to the lease for each period ([`ElectorBuilder::value`],
//!   [`ElectorHandle::set_value`]), which anyone reads with [`observe`] to find the leader.
//!
//! This crate knows nothing about HTTP: [`FencingToken`] gives the header name and value to put
//! on a request made with any client.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use fencing_election::{Elector, FencingToken};
//!
//! # async fn example(pool: deadpool_postgres::Pool) -> Result<(), fencing_election::Error> {
//! let elector = Elector::builder(pool, "billing-reconciler")
//!     .ttl(Duration::from_secs(10))
//!     .build()?
//!     .start();
//!
//! // Runs only while this process leads; cancelled the instant it stops leading.
//! elector.spawn_leader_work(|leadership| async move {
//!     loop {
//!         // Check just before any action others can see.
//!         let Ok(term) = leadership.check() else { return };
//!         println!("reconciling as leader of term {term}");
//!         tokio::time::sleep(Duration::from_secs(1)).await;
//!     }
//! });
//!
//! // A write through the gateway, stamped with the current term; refused while not leader.
//! let sent = elector
//!     .write_fenced(|token: FencingToken| async move {
//!         // e.g. client.post(url).header(FencingToken::HEADER, token.header_value()).send().await
//!         token.term()
//!     })
//!     .await;
//! # let _ = sent;
//! elector.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! - [`clock`]: the boot clock (`CLOCK_BOOTTIME`) that decides validity.
//! - [`config`]: the builder, its defaults and the validation that refuses unsafe settings.
//! - [`state`]: what leader code sees: [`LeaderState`], [`Event`], [`Leadership`], [`FencingToken`].
//! - `runtime`: the background task.
//! - [`membership`]: cluster membership: every process heartbeats its node row and hears nodes
//!   join and leave ([`membership::Membership`]).
//! - [`daemons`]: background work units the cluster's leader assigns to live nodes, through
//!   the fence, with an acknowledged lifecycle ([`daemons::Daemons`]).
//! - [`watch`]: wait for a lease or a cluster's members to change ([`watch::LeaseWatch`],
//!   [`watch::MembersWatch`]), woken by Postgres LISTEN/NOTIFY ([`watch::Wakeups`]).
//! - [`log`]: replication model B on the fenced log: the leader's [`log::Appender`]
//!   ([`ElectorHandle::appender`]) and a [`log::Follower`] that tails a stream in order into a
//!   projection, with its lag.
//! - [`pool`]: a connection by a deadline, without abandoning one being opened.
//! - [`metrics`]: the names of the metrics it records.
//! - [`Error`]: this crate's one error type.

pub mod clock;
pub mod config;
pub mod daemons;
mod error;
pub mod log;
pub mod membership;
pub mod metrics;
pub mod pool;
mod runtime;
pub mod state;
pub mod watch;

pub use config::{Elector, ElectorBuilder};
pub use error::Error;
pub use runtime::{ElectorHandle, Leader, observe};
pub use state::{Event, FencingToken, LeaderState, Leadership, LossReason};
