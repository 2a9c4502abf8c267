//! Typed calls of the SQL functions in schema `fencing`.
//!
//! Each function here is one statement that calls one SQL function and decodes its row:
//! the decisions themselves stay in SQL, so the gateway, the election library and a DBA's
//! trigger can never disagree.

use std::time::{Duration, SystemTime};

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};

use crate::error::Error;

/// The row `fencing.acquire` and `fencing.renew` return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseReply {
    /// True when the caller holds the lease after the call.
    pub ok: bool,
    /// The valid holder: the caller when `ok`, else whoever holds it, or `None` when nobody does.
    pub holder: Option<String>,
    /// The term of the caller's lease when `ok`, else of the last period (`None` for a key never
    /// acquired).
    pub term: Option<i64>,
    /// When the lease expires by the store's clock.
    pub expires_at: Option<SystemTime>,
    /// How long the lease has left by the store's clock, rounded down; zero when nobody holds it.
    /// A holder's deadline is the instant it sent the request plus this, minus its safety margin.
    pub remaining: Duration,
    /// For an acquire refused because the last period ended without a release: how much of the
    /// key's lock-delay is left (schema version 12); zero otherwise.
    pub lock_delay: Duration,
    /// For a successful renewal: a handover was requested of this term (schema version 14,
    /// [`request_resign`]): stop leader work, drain, release.
    pub resign_requested: bool,
}

/// A row of `fencing.leases`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The lease key.
    pub key: String,
    /// The last holder; it holds the lease while `remaining` is not zero.
    pub owner: String,
    /// The term of the last leadership period.
    pub term: i64,
    /// When the current period started.
    pub acquired_at: SystemTime,
    /// When the lease was last acquired or renewed.
    pub renewed_at: SystemTime,
    /// When the lease expires (or expired) by the store's clock.
    pub expires_at: SystemTime,
    /// How long the lease has left by the store's clock, rounded down.
    pub remaining: Duration,
    /// The value the holder of `term` attached (JSON text, as the store prints it; schema
    /// version 11), or `None`: a value of an earlier term is no value of this one.
    pub value: Option<String>,
    /// What is left of the key's lock-delay (schema version 12): no new term before it passes.
    pub lock_delay: Duration,
}

/// A lease as a watcher sees it (`fencing.observe_lease`, schema versions 13 and 14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    /// The row, as [`get_lease`] reads it.
    pub lease: LeaseRow,
    /// The revision of this state: it differs from an earlier read's exactly when the lease
    /// changed between the two (a new term or holder, a value, a handover request, a release,
    /// an expiry), never for a renewal alone. Never 0 (a key never acquired). Compare with
    /// `!=`: a step back of the store's clock can bring an ended lease back, and its revision.
    pub revision: i64,
    /// A handover was requested of the current term, while held (schema version 14).
    pub resign_requested: bool,
    /// The successor named in that request, or, once the holder released, the owner the next
    /// term is reserved for.
    pub successor: Option<String>,
    /// What is left of that reservation; zero without one.
    pub reserved: Duration,
}

/// A row of `fencing.fences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRow {
    /// The resource name.
    pub resource: String,
    /// The highest term admitted for it (0 when bound but never written).
    pub max_term: i64,
    /// The lease key it is bound to, if any.
    pub lease_key: Option<String>,
    /// When the row last changed.
    pub updated_at: SystemTime,
}

/// Why `fencing.try_admit` admitted or refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The write may go ahead.
    Admitted,
    /// The term is lower than the resource's maximum, or than its bound lease's current term.
    Stale,
    /// The resource is bound and the term is higher than its lease's current term.
    FutureTerm,
    /// The resource is bound and its lease's current period has ended.
    NotLeader,
    /// The resource is bound to another lease than the one the write asked for (or is used by
    /// a protected table): a write never rebinds a resource.
    WrongLease,
}

impl Outcome {
    fn parse(label: &str) -> Option<Outcome> {
        match label {
            "admitted" => Some(Outcome::Admitted),
            "stale" => Some(Outcome::Stale),
            "future_term" => Some(Outcome::FutureTerm),
            "not_leader" => Some(Outcome::NotLeader),
            "wrong_lease" => Some(Outcome::WrongLease),
            _ => None,
        }
    }
}

/// The row `fencing.try_admit` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Why the write was admitted or refused.
    pub outcome: Outcome,
    /// The resource's maximum after the call.
    pub max_term: i64,
    /// The lease the resource is bound to, if any.
    pub lease_key: Option<String>,
    /// That lease's current term, when bound and the lease exists.
    pub lease_term: Option<i64>,
}

impl Admission {
    /// True when the write may go ahead.
    pub fn is_admitted(&self) -> bool {
        self.outcome == Outcome::Admitted
    }

    /// The term a refused writer should know about: the bound lease's term, else the maximum.
    pub fn current_term(&self) -> i64 {
        self.lease_term.unwrap_or(self.max_term)
    }
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

fn ms(value: i64) -> Duration {
    Duration::from_millis(u64::try_from(value).unwrap_or(0))
}

fn lease_reply(row: &Row) -> Result<LeaseReply, Error> {
    Ok(LeaseReply {
        ok: row.try_get("ok").map_err(Error::Store)?,
        holder: row.try_get("holder").map_err(Error::Store)?,
        term: row.try_get("term").map_err(Error::Store)?,
        expires_at: row.try_get("expires_at").map_err(Error::Store)?,
        remaining: ms(row.try_get::<_, Option<i64>>("remaining_ms").map_err(Error::Store)?.unwrap_or(0)),
        lock_delay: ms(row.try_get::<_, Option<i64>>("lock_delay_ms").map_err(Error::Store)?.unwrap_or(0)),
        resign_requested: row.try_get::<_, Option<bool>>("resign_requested").map_err(Error::Store)?.unwrap_or(false),
    })
}

/// Calls `fencing.request_resign(key, actor, reason, successor, holder_prefix)`: asks the holder
/// of `key` to step down, naming the owner that should lead next, if any (schema version 14);
/// with `holder_prefix`, only a holder whose owner starts with it. Returns the term asked to step
/// down, or `None` (nothing changed) when nobody (or no such owner) holds the lease. Audited.
pub async fn request_resign(
    client: &impl GenericClient,
    key: &str,
    (actor, reason): (&str, &str),
    successor: Option<&str>,
    holder_prefix: Option<&str>,
) -> Result<Option<i64>, Error> {
    let row = client
        .query_one(
            "SELECT fencing.request_resign($1, $2, $3, $4, $5)",
            &[&key, &actor, &reason, &successor, &holder_prefix],
        )
        .await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.force_handover(key, term, actor, reason)`: ends the period of `term` now if it
/// still holds the lease (a holder that did not step down in time), never a later term's.
/// Whether it ended one. Audited as a force-release.
pub async fn force_handover(
    client: &impl GenericClient,
    key: &str,
    term: i64,
    actor: &str,
    reason: &str,
) -> Result<bool, Error> {
    let row =
        client.query_one("SELECT fencing.force_handover($1, $2, $3, $4)", &[&key, &term, &actor, &reason]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.set_lock_delay(key, delay, actor, reason)`: the lock-delay of `key`, or with
/// `None` the default of keys without one (schema version 12); `delay` `None` for a key removes
/// its own setting. Audited.
pub async fn set_lock_delay(
    client: &impl GenericClient,
    key: Option<&str>,
    delay: Option<Duration>,
    actor: &str,
    reason: &str,
) -> Result<(), Error> {
    let delay_ms = delay.map(ttl_ms);
    client
        .execute(
            "SELECT fencing.set_lock_delay($1, $2::bigint * interval '1 millisecond', $3, $4)",
            &[&key, &delay_ms, &actor, &reason],
        )
        .await?;
    Ok(())
}

const ACQUIRE_SQL: &str = "SELECT ok, holder, term, expires_at, remaining_ms, lock_delay_ms, resign_requested
    FROM fencing.acquire($1, $2, $3::bigint * interval '1 millisecond')";

const ACQUIRE_NEW_PERIOD_SQL: &str =
    "SELECT ok, holder, term, expires_at, remaining_ms, lock_delay_ms, resign_requested
    FROM fencing.acquire($1, $2, $3::bigint * interval '1 millisecond', true)";

const RENEW_SQL: &str = "SELECT ok, holder, term, expires_at, remaining_ms, lock_delay_ms, resign_requested
    FROM fencing.renew($1, $2, $3::bigint * interval '1 millisecond')";

async fn lease_call(
    client: &impl GenericClient,
    sql: &str,
    key: &str,
    owner: &str,
    ttl: Duration,
) -> Result<LeaseReply, Error> {
    let row = client.query_one(sql, &[&key, &owner, &ttl_ms(ttl)]).await?;
    lease_reply(&row)
}

/// Calls `fencing.acquire(key, owner, ttl)`.
pub async fn acquire(client: &impl GenericClient, key: &str, owner: &str, ttl: Duration) -> Result<LeaseReply, Error> {
    lease_call(client, ACQUIRE_SQL, key, owner, ttl).await
}

/// Calls `fencing.acquire(key, owner, ttl, new_period => true)`: as [`acquire`], except that a
/// caller that still holds the lease gets a new period with the next term instead of keeping
/// its old one (the election library's acquire: a period it ended locally is over, S2).
pub async fn acquire_new_period(
    client: &impl GenericClient,
    key: &str,
    owner: &str,
    ttl: Duration,
) -> Result<LeaseReply, Error> {
    lease_call(client, ACQUIRE_NEW_PERIOD_SQL, key, owner, ttl).await
}

/// Calls `fencing.renew(key, owner, ttl)`.
pub async fn renew(client: &impl GenericClient, key: &str, owner: &str, ttl: Duration) -> Result<LeaseReply, Error> {
    lease_call(client, RENEW_SQL, key, owner, ttl).await
}

/// Calls `fencing.release(key, owner)`: true when the caller held the lease and now does not.
pub async fn release(client: &impl GenericClient, key: &str, owner: &str) -> Result<bool, Error> {
    let row = client.query_one("SELECT fencing.release($1, $2)", &[&key, &owner]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// Reads one lease row, with the time it has left by the store's clock.
pub async fn get_lease(client: &impl GenericClient, key: &str) -> Result<Option<LeaseRow>, Error> {
    let row = client
        .query_opt(
            "SELECT key, owner, term, acquired_at, renewed_at, expires_at, remaining_ms, value, lock_delay_ms
               FROM fencing.read_lease($1)",
            &[&key],
        )
        .await?;
    row.as_ref().map(lease_row).transpose()
}

/// Reads one lease as a watcher sees it, with its revision and handover (`fencing.observe_lease`,
/// schema version 14); `None` for a key never acquired.
pub async fn observe_lease(client: &impl GenericClient, key: &str) -> Result<Option<LeaseState>, Error> {
    let row = client
        .query_opt(
            "SELECT key, owner, term, acquired_at, renewed_at, expires_at, remaining_ms, value, lock_delay_ms, revision,
                    resign_requested, successor, reserved_ms
               FROM fencing.observe_lease($1)",
            &[&key],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(LeaseState {
        lease: lease_row(&row)?,
        revision: row.try_get("revision").map_err(Error::Store)?,
        resign_requested: row.try_get("resign_requested").map_err(Error::Store)?,
        successor: row.try_get("successor").map_err(Error::Store)?,
        reserved: ms(row.try_get("reserved_ms").map_err(Error::Store)?),
    }))
}

fn lease_row(row: &Row) -> Result<LeaseRow, Error> {
    Ok(LeaseRow {
        key: row.try_get("key").map_err(Error::Store)?,
        owner: row.try_get("owner").map_err(Error::Store)?,
        term: row.try_get("term").map_err(Error::Store)?,
        acquired_at: row.try_get("acquired_at").map_err(Error::Store)?,
        renewed_at: row.try_get("renewed_at").map_err(Error::Store)?,
        expires_at: row.try_get("expires_at").map_err(Error::Store)?,
        remaining: ms(row.try_get("remaining_ms").map_err(Error::Store)?),
        value: row.try_get("value").map_err(Error::Store)?,
        lock_delay: ms(row.try_get::<_, Option<i64>>("lock_delay_ms").map_err(Error::Store)?.unwrap_or(0)),
    })
}

/// The most JSON text a lease's value may have ([`set_lease_value`]).
pub const MAX_LEASE_VALUE_BYTES: usize = 4096;

/// Calls `fencing.set_lease_value(key, owner, term, value)`: attaches `value` (JSON text; `null`
/// clears it) to the lease while `owner` holds it at `term`. False when it does not (a zombie's
/// call with its old term, or after its lease ended), and nothing changed. Invalid JSON or more
/// than [`MAX_LEASE_VALUE_BYTES`] is an error, nothing changed.
pub async fn set_lease_value(
    client: &impl GenericClient,
    key: &str,
    owner: &str,
    term: i64,
    value: &str,
) -> Result<bool, Error> {
    let row = client
        .query_one("SELECT fencing.set_lease_value($1, $2, $3, $4::text::jsonb)", &[&key, &owner, &term, &value])
        .await?;
    row.try_get(0).map_err(Error::Store)
}

/// Reads one fence row.
pub async fn get_fence(client: &impl GenericClient, resource: &str) -> Result<Option<FenceRow>, Error> {
    let row = client
        .query_opt(
            "SELECT resource, max_term, lease_key, updated_at FROM fencing.fences WHERE resource = $1",
            &[&resource],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(FenceRow {
        resource: row.try_get("resource").map_err(Error::Store)?,
        max_term: row.try_get("max_term").map_err(Error::Store)?,
        lease_key: row.try_get("lease_key").map_err(Error::Store)?,
        updated_at: row.try_get("updated_at").map_err(Error::Store)?,
    }))
}

/// Calls `fencing.try_admit(resource, term, hold_lock)`: the fence decision, without raising.
pub async fn try_admit(
    client: &impl GenericClient,
    resource: &str,
    term: i64,
    hold_lock: bool,
) -> Result<Admission, Error> {
    let row = client
        .query_one(
            "SELECT outcome, max_term, lease_key, lease_term FROM fencing.try_admit($1, $2, $3)",
            &[&resource, &term, &hold_lock],
        )
        .await?;
    let label: String = row.try_get("outcome").map_err(Error::Store)?;
    let outcome = Outcome::parse(&label).ok_or_else(|| Error::UnexpectedReply {
        message: format!("fencing.try_admit returned the unknown outcome {label:?}"),
    })?;
    Ok(Admission {
        outcome,
        max_term: row.try_get("max_term").map_err(Error::Store)?,
        lease_key: row.try_get("lease_key").map_err(Error::Store)?,
        lease_term: row.try_get("lease_term").map_err(Error::Store)?,
    })
}

/// Calls `fencing.admit(resource, term)`: the resource's maximum, or [`Error::Refused`].
pub async fn admit(client: &impl GenericClient, resource: &str, term: i64) -> Result<i64, Error> {
    let row = client.query_one("SELECT fencing.admit($1, $2)", &[&resource, &term]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.bind(resource, lease_key)`: the resource's maximum.
pub async fn bind(client: &impl GenericClient, resource: &str, lease_key: &str) -> Result<i64, Error> {
    let row = client.query_one("SELECT fencing.bind($1, $2)", &[&resource, &lease_key]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// The row `fencing.gate` and `fencing.gate_lease` return: the gateway's decision for a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// Why the write was admitted or refused.
    pub outcome: Outcome,
    /// The term decided on: the presented one, or the lease's in stamp mode (`None` when the
    /// owner does not hold the lease).
    pub term: Option<i64>,
    /// The resource's maximum after the call (`None` for a resource never written).
    pub max_term: Option<i64>,
    /// The lease the resource is bound to, or the presented lease in stamp mode.
    pub lease_key: Option<String>,
    /// That lease's current term, if it exists.
    pub lease_term: Option<i64>,
    /// How long to wait before forwarding, counted from the decision, so no lower-term write
    /// can be overtaken (S5).
    pub wait: Duration,
    /// How long, counted from the decision, writes of this term to this resource may be admitted
    /// without asking (a grant; zero when none was asked for or given; never more than asked).
    /// On a bound resource the grant covers the lease at this term: every resource of the lease
    /// that had an admitted decision at this term and [`Gate::epoch`].
    pub grant: Duration,
    /// The bound lease's fence epoch the decision was made at (`None`: an unbound fence, or a
    /// refusal). An operator's change of a fence bound to the lease moves it on: a decision counts
    /// for a lease's grant only at the same epoch (schema version 9).
    pub epoch: Option<i64>,
    /// The settle [`Gate::wait`] belongs to: every change of the fence's term or binding starts
    /// a new one. A gateway that has seen the wait pass names it to `fencing.mark_settled`, so a
    /// late mark never ends a later settle of the same term, binding and length (schema version
    /// 10). `None` for a refusal and for a decision with nothing to settle.
    pub settle_id: Option<i64>,
}

impl Gate {
    /// True when the write may be forwarded (after [`Gate::wait`]).
    pub fn is_admitted(&self) -> bool {
        self.outcome == Outcome::Admitted
    }

    /// The term a refused writer should know about: the bound lease's term, else the maximum.
    pub fn current_term(&self) -> Option<i64> {
        self.lease_term.or(self.max_term)
    }

    /// Decodes a row of [`GATE_SQL`] or [`GATE_LEASE_SQL`].
    pub fn from_row(row: &Row) -> Result<Gate, Error> {
        let label: String = row.try_get("outcome").map_err(Error::Store)?;
        let outcome = Outcome::parse(&label).ok_or_else(|| Error::UnexpectedReply {
            message: format!("fencing.gate returned the unknown outcome {label:?}"),
        })?;
        Ok(Gate {
            outcome,
            term: row.try_get("term").map_err(Error::Store)?,
            max_term: row.try_get("max_term").map_err(Error::Store)?,
            lease_key: row.try_get("lease_key").map_err(Error::Store)?,
            lease_term: row.try_get("lease_term").map_err(Error::Store)?,
            wait: ms(row.try_get::<_, Option<i64>>("wait_ms").map_err(Error::Store)?.unwrap_or(0)),
            grant: ms(row.try_get::<_, Option<i64>>("grant_ms").map_err(Error::Store)?.unwrap_or(0)),
            epoch: row.try_get("lease_epoch").map_err(Error::Store)?,
            settle_id: row.try_get("settle_id").map_err(Error::Store)?,
        })
    }
}

/// `fencing.gate(resource, term, forward timeout ms, bind lease, grant ms)`: prepare it once per
/// connection.
pub const GATE_SQL: &str =
    "SELECT admitted, outcome, term, max_term, lease_key, lease_term, wait_ms, grant_ms, lease_epoch, settle_id
    FROM fencing.gate($1, $2, $3::bigint * interval '1 millisecond', $4, $5::bigint * interval '1 millisecond')";

/// `fencing.gate_lease(resource, lease key, owner, forward timeout ms, bind lease, grant ms)`.
pub const GATE_LEASE_SQL: &str =
    "SELECT admitted, outcome, term, max_term, lease_key, lease_term, wait_ms, grant_ms, lease_epoch, settle_id
    FROM fencing.gate_lease($1, $2, $3, $4::bigint * interval '1 millisecond', $5,
                            $6::bigint * interval '1 millisecond')";

/// `fencing.gate_many(resources, terms, lease keys, owners, bind leases, forward timeout ms,
/// grant ms)`: one row per item, in order.
pub const GATE_MANY_SQL: &str =
    "SELECT admitted, outcome, term, max_term, lease_key, lease_term, wait_ms, grant_ms, lease_epoch, settle_id,
           extract(epoch FROM clock_timestamp())::float8 AS store_clock
    FROM fencing.gate_many($1, $2, $3, $4, $5, $6::bigint * interval '1 millisecond',
                           $7::bigint * interval '1 millisecond')";

/// Calls `fencing.gate`: the gateway's decision for a write presenting `term` (verify mode).
pub async fn gate(
    client: &impl GenericClient,
    resource: &str,
    term: i64,
    forward_timeout: Duration,
    bind_lease: Option<&str>,
) -> Result<Gate, Error> {
    gate_granted(client, resource, term, forward_timeout, bind_lease, Duration::ZERO).await
}

/// Calls `fencing.gate` asking for a grant of `grant` (zero: none): see [`Gate::grant`].
pub async fn gate_granted(
    client: &impl GenericClient,
    resource: &str,
    term: i64,
    forward_timeout: Duration,
    bind_lease: Option<&str>,
    grant: Duration,
) -> Result<Gate, Error> {
    let row =
        client.query_one(GATE_SQL, &[&resource, &term, &ttl_ms(forward_timeout), &bind_lease, &ttl_ms(grant)]).await?;
    Gate::from_row(&row)
}

/// Calls `fencing.gate_lease`: the gateway's decision for a write presenting a lease and owner
/// (stamp mode).
pub async fn gate_lease(
    client: &impl GenericClient,
    resource: &str,
    lease_key: &str,
    owner: &str,
    forward_timeout: Duration,
    bind_lease: Option<&str>,
) -> Result<Gate, Error> {
    let row = client
        .query_one(GATE_LEASE_SQL, &[&resource, &lease_key, &owner, &ttl_ms(forward_timeout), &bind_lease, &0_i64])
        .await?;
    Gate::from_row(&row)
}

/// A refused write, as recorded in `fencing.refusals`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// When it was recorded, by the store's clock.
    pub at: SystemTime,
    /// The resource written.
    pub resource: String,
    /// The gateway route it came through.
    pub route: Option<String>,
    /// stale, not_leader or future_term.
    pub outcome: String,
    /// The term the writer presented (none in stamp mode when it held no lease).
    pub presented_term: Option<i64>,
    /// The term it lost to.
    pub current_term: Option<i64>,
    /// The gateway that refused it.
    pub gateway: Option<String>,
    /// The address of the client that sent it.
    pub client_addr: Option<String>,
    /// Its request id (`X-Request-Id`).
    pub request_id: Option<String>,
    /// The lease the resource is bound to, or the stamp-mode lease (schema version 15).
    pub lease_key: Option<String>,
    /// The stamp-mode owner.
    pub owner: Option<String>,
    /// The authenticated client, with `[[clients]]`.
    pub caller: Option<String>,
}

/// An audited admin action, from `fencing.admin_audit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// When, by the store's clock.
    pub at: SystemTime,
    /// Who.
    pub actor: String,
    /// `force_release` or `advance_fence`.
    pub action: String,
    /// The lease key or resource.
    pub target: String,
    /// Why.
    pub reason: String,
    /// The row before, as JSON text.
    pub before: Option<String>,
    /// The row after, as JSON text.
    pub after: Option<String>,
}

/// Appends refused writes to `fencing.refusals`, keeping the newest `keep` rows; commits
/// without waiting for the WAL flush.
pub async fn record_refusals(
    client: &impl GenericClient,
    refusals: &[Refusal],
    gateway: &str,
    keep: i32,
) -> Result<(), Error> {
    let resources: Vec<&str> = refusals.iter().map(|r| r.resource.as_str()).collect();
    let routes: Vec<Option<&str>> = refusals.iter().map(|r| r.route.as_deref()).collect();
    let outcomes: Vec<&str> = refusals.iter().map(|r| r.outcome.as_str()).collect();
    let presented: Vec<Option<i64>> = refusals.iter().map(|r| r.presented_term).collect();
    let current: Vec<Option<i64>> = refusals.iter().map(|r| r.current_term).collect();
    let clients: Vec<Option<&str>> = refusals.iter().map(|r| r.client_addr.as_deref()).collect();
    let request_ids: Vec<Option<&str>> = refusals.iter().map(|r| r.request_id.as_deref()).collect();
    let leases: Vec<Option<&str>> = refusals.iter().map(|r| r.lease_key.as_deref()).collect();
    let owners: Vec<Option<&str>> = refusals.iter().map(|r| r.owner.as_deref()).collect();
    let callers: Vec<Option<&str>> = refusals.iter().map(|r| r.caller.as_deref()).collect();
    client
        .execute(
            "SELECT fencing.record_refusals($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            &[
                &resources,
                &routes,
                &outcomes,
                &presented,
                &current,
                &clients,
                &request_ids,
                &leases,
                &owners,
                &callers,
                &gateway,
                &keep,
            ],
        )
        .await?;
    Ok(())
}

/// How many writes Postgres itself refused (`fencing.admit`, the guard) since the schema was
/// installed; counted outside the refused transactions, so rollbacks do not hide them.
pub async fn sql_refusal_count(client: &impl GenericClient) -> Result<i64, Error> {
    let row = client.query_one("SELECT fencing.sql_refusal_count()", &[]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// The newest refused writes, for `resource` or all, newest first.
pub async fn list_refusals(
    client: &impl GenericClient,
    resource: Option<&str>,
    limit: i64,
) -> Result<Vec<Refusal>, Error> {
    let rows = client
        .query(
            "SELECT at, resource, route, outcome, presented_term, current_term, gateway, client_addr, request_id,
                    lease_key, owner, caller
               FROM fencing.refusals
              WHERE $1::text IS NULL OR resource = $1 ORDER BY id DESC LIMIT $2",
            &[&resource, &limit],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Refusal {
                at: row.try_get("at").map_err(Error::Store)?,
                resource: row.try_get("resource").map_err(Error::Store)?,
                route: row.try_get("route").map_err(Error::Store)?,
                outcome: row.try_get("outcome").map_err(Error::Store)?,
                presented_term: row.try_get("presented_term").map_err(Error::Store)?,
                current_term: row.try_get("current_term").map_err(Error::Store)?,
                gateway: row.try_get("gateway").map_err(Error::Store)?,
                client_addr: row.try_get("client_addr").map_err(Error::Store)?,
                request_id: row.try_get("request_id").map_err(Error::Store)?,
                lease_key: row.try_get("lease_key").map_err(Error::Store)?,
                owner: row.try_get("owner").map_err(Error::Store)?,
                caller: row.try_get("caller").map_err(Error::Store)?,
            })
        })
        .collect()
}

/// Every lease, by key, with the time it has left by the store's clock.
pub async fn list_leases(client: &impl GenericClient) -> Result<Vec<LeaseRow>, Error> {
    let keys = client.query("SELECT key FROM fencing.leases ORDER BY key", &[]).await?;
    let mut leases = Vec::with_capacity(keys.len());
    for row in keys {
        let key: String = row.try_get(0).map_err(Error::Store)?;
        if let Some(lease) = get_lease(client, &key).await? {
            leases.push(lease);
        }
    }
    Ok(leases)
}

/// Calls `fencing.force_release(key, actor, reason)`: ends the current period, audited.
pub async fn force_release(client: &impl GenericClient, key: &str, actor: &str, reason: &str) -> Result<(), Error> {
    client.execute("SELECT fencing.force_release($1, $2, $3)", &[&key, &actor, &reason]).await?;
    Ok(())
}

/// Calls `fencing.advance_fence(resource, term, actor, reason)`: raises the maximum, audited.
pub async fn advance_fence(
    client: &impl GenericClient,
    resource: &str,
    term: i64,
    actor: &str,
    reason: &str,
) -> Result<(), Error> {
    client.execute("SELECT fencing.advance_fence($1, $2, $3, $4)", &[&resource, &term, &actor, &reason]).await?;
    Ok(())
}

/// Calls `fencing.rebind(resource, lease_key, actor, reason)`: binds a resource to another
/// lease, audited. A write never rebinds; this is the admin action that does.
pub async fn rebind(
    client: &impl GenericClient,
    resource: &str,
    lease_key: &str,
    actor: &str,
    reason: &str,
) -> Result<(), Error> {
    client.execute("SELECT fencing.rebind($1, $2, $3, $4)", &[&resource, &lease_key, &actor, &reason]).await?;
    Ok(())
}

/// Calls `fencing.reset_fence(resource, term, actor, reason)`: sets an unbound, poisoned
/// fence's maximum back to `term`, audited; the one way a fence goes back.
pub async fn reset_fence(
    client: &impl GenericClient,
    resource: &str,
    term: i64,
    actor: &str,
    reason: &str,
) -> Result<(), Error> {
    client.execute("SELECT fencing.reset_fence($1, $2, $3, $4)", &[&resource, &term, &actor, &reason]).await?;
    Ok(())
}

/// One leadership period, from `fencing.lease_history`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// The lease key.
    pub key: String,
    /// The period's term.
    pub term: i64,
    /// Who held it.
    pub owner: String,
    /// When it was granted, by the store's clock.
    pub granted_at: SystemTime,
    /// When it ended (for an expired lease: its expiry), if known to have ended.
    pub ended_at: Option<SystemTime>,
    /// released, expired, abandoned or force_released.
    pub end_reason: Option<String>,
}

/// The newest `limit` leadership periods of `key`, newest first.
pub async fn list_history(client: &impl GenericClient, key: &str, limit: i64) -> Result<Vec<Period>, Error> {
    let rows = client
        .query(
            "SELECT key, term, owner, granted_at, ended_at, end_reason FROM fencing.lease_history
              WHERE key = $1 ORDER BY term DESC LIMIT $2",
            &[&key, &limit],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Period {
                key: row.try_get("key").map_err(Error::Store)?,
                term: row.try_get("term").map_err(Error::Store)?,
                owner: row.try_get("owner").map_err(Error::Store)?,
                granted_at: row.try_get("granted_at").map_err(Error::Store)?,
                ended_at: row.try_get("ended_at").map_err(Error::Store)?,
                end_reason: row.try_get("end_reason").map_err(Error::Store)?,
            })
        })
        .collect()
}

/// The newest audited admin actions, newest first.
pub async fn list_audit(client: &impl GenericClient, limit: i64) -> Result<Vec<AuditEntry>, Error> {
    let rows = client
        .query(
            "SELECT at, actor, action, target, reason, before::text AS before, after::text AS after
               FROM fencing.admin_audit ORDER BY id DESC LIMIT $1",
            &[&limit],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(AuditEntry {
                at: row.try_get("at").map_err(Error::Store)?,
                actor: row.try_get("actor").map_err(Error::Store)?,
                action: row.try_get("action").map_err(Error::Store)?,
                target: row.try_get("target").map_err(Error::Store)?,
                reason: row.try_get("reason").map_err(Error::Store)?,
                before: row.try_get("before").map_err(Error::Store)?,
                after: row.try_get("after").map_err(Error::Store)?,
            })
        })
        .collect()
}

/// What `fencing.heartbeat` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// False when another live incarnation holds the node id (nothing changed then).
    pub ok: bool,
    /// The caller's incarnation when `ok`; `None` when refused (who holds the id is not said).
    pub incarnation: Option<String>,
    /// When the holding incarnation joined.
    pub started_at: SystemTime,
    /// When the node expires by the store's clock unless it heartbeats again.
    pub expires_at: SystemTime,
    /// Time left until then, by the store's clock, rounded down.
    pub remaining: Duration,
}

/// One live node of a cluster, as `fencing.members` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The node id.
    pub node_id: String,
    /// Its display name.
    pub name: String,
    /// When this incarnation of the node joined: a node that left and came back has a new one.
    pub started_at: SystemTime,
    /// Its last heartbeat.
    pub heartbeat_at: SystemTime,
    /// When it expires by the store's clock unless it heartbeats again.
    pub expires_at: SystemTime,
    /// Time left until then, when it was read.
    pub remaining: Duration,
    /// Its metadata: a JSON object, as text.
    pub metadata: String,
}

/// Calls `fencing.heartbeat(cluster, node_id, incarnation, name, ttl, metadata)`.
pub async fn heartbeat(
    client: &impl GenericClient,
    node: (&str, &str, &str),
    name: &str,
    ttl: Duration,
    metadata: &str,
) -> Result<Heartbeat, Error> {
    let (cluster, node_id, incarnation) = node;
    // Typed: one round trip and no named statement, so a call abandoned mid-way leaves none
    // behind on a connection that goes back to the pool.
    let row = client
        .query_typed_one(
            "SELECT ok, incarnation, started_at, expires_at, remaining_ms
               FROM fencing.heartbeat($1, $2, $3, $4, $5::bigint * interval '1 millisecond', $6)",
            &[
                (&cluster, Type::TEXT),
                (&node_id, Type::TEXT),
                (&incarnation, Type::TEXT),
                (&name, Type::TEXT),
                (&ttl_ms(ttl), Type::INT8),
                (&metadata, Type::TEXT),
            ],
        )
        .await?;
    Ok(Heartbeat {
        ok: row.try_get("ok").map_err(Error::Store)?,
        incarnation: row.try_get("incarnation").map_err(Error::Store)?,
        started_at: row.try_get("started_at").map_err(Error::Store)?,
        expires_at: row.try_get("expires_at").map_err(Error::Store)?,
        remaining: ms(row.try_get("remaining_ms").map_err(Error::Store)?),
    })
}

/// Calls `fencing.leave(cluster, node_id, incarnation)`: true when the node was live under
/// that incarnation and now is not.
pub async fn leave(
    client: &impl GenericClient,
    cluster: &str,
    node_id: &str,
    incarnation: &str,
) -> Result<bool, Error> {
    let row = client
        .query_typed_one(
            "SELECT fencing.leave($1, $2, $3)",
            &[(&cluster, Type::TEXT), (&node_id, Type::TEXT), (&incarnation, Type::TEXT)],
        )
        .await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.members(cluster)`: the live nodes, by node id.
pub async fn members(client: &impl GenericClient, cluster: &str) -> Result<Vec<Member>, Error> {
    let rows = client
        .query(
            "SELECT node_id, name, started_at, heartbeat_at, expires_at, remaining_ms, metadata
               FROM fencing.members($1)",
            &[&cluster],
        )
        .await?;
    let mut members = Vec::with_capacity(rows.len());
    for row in &rows {
        members.extend(member_of(row)?);
    }
    Ok(members)
}

/// A member from a row with `fencing.members`'s columns; `None` for a row without a node (the
/// revision-only rows of `fencing.members_since` and `fencing.observe_members`).
fn member_of(row: &Row) -> Result<Option<Member>, Error> {
    let Some(node_id) = row.try_get::<_, Option<String>>("node_id").map_err(Error::Store)? else { return Ok(None) };
    Ok(Some(Member {
        node_id,
        name: row.try_get("name").map_err(Error::Store)?,
        started_at: row.try_get("started_at").map_err(Error::Store)?,
        heartbeat_at: row.try_get("heartbeat_at").map_err(Error::Store)?,
        expires_at: row.try_get("expires_at").map_err(Error::Store)?,
        remaining: ms(row.try_get("remaining_ms").map_err(Error::Store)?),
        metadata: row.try_get("metadata").map_err(Error::Store)?,
    }))
}

/// What `fencing.members_since` answered (schema version 15).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembersSince {
    /// The members' revision; `None` while it cannot be known without waiting (a heartbeat of a
    /// node that ran out is committing): the members are read then.
    pub revision: Option<i64>,
    /// The live nodes by node id, or `None` when the revision is still the one asked about (or
    /// nothing could be read now).
    pub members: Option<Vec<Member>>,
}

/// Calls `fencing.members_since(cluster, known)`: the members' revision, and the members when
/// it is not `known` (or cannot be known). It waits for no lock, so it may run in the
/// transaction of the caller's heartbeat; when it could not read now, both fields are `None`
/// (read again later).
pub async fn members_since(
    client: &impl GenericClient,
    cluster: &str,
    known: Option<i64>,
) -> Result<MembersSince, Error> {
    let rows = client
        .query_typed(
            "SELECT revision, node_id, name, started_at, heartbeat_at, expires_at, remaining_ms, metadata
               FROM fencing.members_since($1, $2)",
            &[(&cluster, Type::TEXT), (&known, Type::INT8)],
        )
        .await?;
    let revision = match rows.first() {
        Some(row) => row.try_get::<_, Option<i64>>("revision").map_err(Error::Store)?,
        None => return Ok(MembersSince { revision: None, members: None }),
    };
    if revision.is_some() && revision == known {
        return Ok(MembersSince { revision, members: None });
    }
    let mut members = Vec::with_capacity(rows.len());
    for row in &rows {
        members.extend(member_of(row)?);
    }
    Ok(MembersSince { revision, members: Some(members) })
}

/// The revision of a cluster's members, as `fencing.nodes_revision` gives it (schema version 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembersRevision {
    /// Differs from an earlier read's exactly when a node joined, left, changed or ran out
    /// between the two; 0 for a cluster never seen.
    pub revision: i64,
    /// How long until the next live node runs out by the store's clock: the members change then
    /// unless it heartbeats. `None` with no live node.
    pub next_expiry: Option<Duration>,
}

/// Calls `fencing.nodes_revision(cluster)`: notes the nodes that ran out since the last call
/// (each a change) and returns the members' revision. Read it before [`members`]: a change
/// between the two then shows as a later revision, never as a missed one.
pub async fn nodes_revision(client: &impl GenericClient, cluster: &str) -> Result<MembersRevision, Error> {
    let row = client.query_one("SELECT revision, next_expiry_ms FROM fencing.nodes_revision($1)", &[&cluster]).await?;
    Ok(MembersRevision {
        revision: row.try_get("revision").map_err(Error::Store)?,
        next_expiry: row.try_get::<_, Option<i64>>("next_expiry_ms").map_err(Error::Store)?.map(ms),
    })
}

/// Calls `fencing.observe_members(cluster)` (schema version 15): the members' revision, as
/// [`nodes_revision`] gives it, and the nodes live at the instant it is of, in one call, so the
/// list is never of a later instant than the revision (a watcher's read).
pub async fn observe_members(
    client: &impl GenericClient,
    cluster: &str,
) -> Result<(MembersRevision, Vec<Member>), Error> {
    let rows = client
        .query(
            "SELECT revision, next_expiry_ms, node_id, name, started_at, heartbeat_at, expires_at, remaining_ms,
                    metadata
               FROM fencing.observe_members($1)",
            &[&cluster],
        )
        .await?;
    let Some(first) = rows.first() else {
        return Ok((MembersRevision { revision: 0, next_expiry: None }, Vec::new()));
    };
    let revision = MembersRevision {
        revision: first.try_get("revision").map_err(Error::Store)?,
        next_expiry: first.try_get::<_, Option<i64>>("next_expiry_ms").map_err(Error::Store)?.map(ms),
    };
    let mut members = Vec::with_capacity(rows.len());
    for row in &rows {
        members.extend(member_of(row)?);
    }
    Ok((revision, members))
}

/// One change a leader's reconcile pass made (`fencing.reconcile_daemons`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonChange {
    /// The daemon.
    pub daemon: String,
    /// The assignment's generation.
    pub generation: i64,
    /// `assigning`, `revoking` or `deleted` (the assignment ended).
    pub state: String,
    /// The node of the assignment.
    pub node_id: String,
    /// Why: `rebalance` for a revocation; `node_expired`, `ack_timeout`, `drain_timeout` for an
    /// end; for an assignment, why the previous one ended (none for a daemon's first).
    pub reason: Option<String>,
}

/// One assignment of a node, as `fencing.assignments` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The daemon.
    pub daemon: String,
    /// The assignment's generation: the daemon's fencing token while it runs.
    pub generation: i64,
    /// `assigning`, `active` or `revoking`.
    pub state: String,
    /// Time left until the acknowledge or drain deadline, by the store's clock; none while active.
    pub remaining: Option<Duration>,
}

/// One daemon of a cluster, as `fencing.daemon_states` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonState {
    /// The daemon.
    pub daemon: String,
    /// `unassigned`, `assigning`, `active` or `revoking`.
    pub state: String,
    /// The current (or last) assignment's generation.
    pub generation: i64,
    /// The node it is assigned to.
    pub node_id: Option<String>,
    /// The term of the leader that last changed it.
    pub term: i64,
    /// Why the last assignment ended or is being revoked.
    pub reason: Option<String>,
    /// When it last changed.
    pub changed_at: SystemTime,
    /// Time left until the acknowledge or drain deadline; none otherwise.
    pub remaining: Option<Duration>,
}

/// Calls `fencing.reconcile_daemons(cluster, lease_key, owner, term, ack_timeout, drain_timeout)`:
/// the leader's pass, refused ([`Error::Refused`]) unless `owner` holds the lease at `term`.
pub async fn reconcile_daemons(
    client: &impl GenericClient,
    cluster: &str,
    lease: (&str, &str, i64),
    ack_timeout: Duration,
    drain_timeout: Duration,
) -> Result<Vec<DaemonChange>, Error> {
    let (lease_key, owner, term) = lease;
    let rows = client
        .query(
            "SELECT daemon, generation, state, node_id, reason
               FROM fencing.reconcile_daemons($1, $2, $3, $4, $5::bigint * interval '1 millisecond',
                                              $6::bigint * interval '1 millisecond')",
            &[&cluster, &lease_key, &owner, &term, &ttl_ms(ack_timeout), &ttl_ms(drain_timeout)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(DaemonChange {
                daemon: row.try_get("daemon").map_err(Error::Store)?,
                generation: row.try_get("generation").map_err(Error::Store)?,
                state: row.try_get("state").map_err(Error::Store)?,
                node_id: row.try_get("node_id").map_err(Error::Store)?,
                reason: row.try_get("reason").map_err(Error::Store)?,
            })
        })
        .collect()
}

/// Calls `fencing.assignments(cluster, node_id, incarnation, offered)`: records the daemons the
/// node offers and returns its assignments (none unless it is live as `incarnation`).
pub async fn assignments(
    client: &impl GenericClient,
    node: (&str, &str, &str),
    offered: &[&str],
) -> Result<Vec<Assignment>, Error> {
    let (cluster, node_id, incarnation) = node;
    let rows = client
        .query(
            "SELECT daemon, generation, state, remaining_ms FROM fencing.assignments($1, $2, $3, $4)",
            &[&cluster, &node_id, &incarnation, &offered],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Assignment {
                daemon: row.try_get("daemon").map_err(Error::Store)?,
                generation: row.try_get("generation").map_err(Error::Store)?,
                state: row.try_get("state").map_err(Error::Store)?,
                remaining: row.try_get::<_, Option<i64>>("remaining_ms").map_err(Error::Store)?.map(ms),
            })
        })
        .collect()
}

/// Calls `fencing.ack_daemon(cluster, node_id, incarnation, daemon, generation)`: how long the
/// daemon waited for a node when acknowledged, `None` when refused (the node must not start it).
pub async fn ack_daemon(
    client: &impl GenericClient,
    node: (&str, &str, &str),
    daemon: &str,
    generation: i64,
) -> Result<Option<Duration>, Error> {
    let (cluster, node_id, incarnation) = node;
    let row = client
        .query_one(
            "SELECT fencing.ack_daemon($1, $2, $3, $4, $5)",
            &[&cluster, &node_id, &incarnation, &daemon, &generation],
        )
        .await?;
    Ok(row.try_get::<_, Option<i64>>(0).map_err(Error::Store)?.map(ms))
}

/// Calls `fencing.daemon_stopped(cluster, node_id, incarnation, daemon, generation)`: whether
/// the assignment ended (drained after a revocation, or given back).
pub async fn daemon_stopped(
    client: &impl GenericClient,
    node: (&str, &str, &str),
    daemon: &str,
    generation: i64,
) -> Result<bool, Error> {
    let (cluster, node_id, incarnation) = node;
    let row = client
        .query_one(
            "SELECT fencing.daemon_stopped($1, $2, $3, $4, $5)",
            &[&cluster, &node_id, &incarnation, &daemon, &generation],
        )
        .await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.daemon_states(cluster)`: every daemon of the cluster, by name.
pub async fn daemon_states(client: &impl GenericClient, cluster: &str) -> Result<Vec<DaemonState>, Error> {
    let rows = client
        .query(
            "SELECT daemon, state, generation, node_id, term, reason, changed_at, remaining_ms
               FROM fencing.daemon_states($1)",
            &[&cluster],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(DaemonState {
                daemon: row.try_get("daemon").map_err(Error::Store)?,
                state: row.try_get("state").map_err(Error::Store)?,
                generation: row.try_get("generation").map_err(Error::Store)?,
                node_id: row.try_get("node_id").map_err(Error::Store)?,
                term: row.try_get("term").map_err(Error::Store)?,
                reason: row.try_get("reason").map_err(Error::Store)?,
                changed_at: row.try_get("changed_at").map_err(Error::Store)?,
                remaining: row.try_get::<_, Option<i64>>("remaining_ms").map_err(Error::Store)?.map(ms),
            })
        })
        .collect()
}
