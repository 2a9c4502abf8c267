//! Typed calls of the fenced log's SQL functions (`schema/functions/log.sql`, schema version 16).
//!
//! A stream is bound to a lease: [`append`] is admitted only for the lease's current term while
//! the lease is held (else [`Error::Refused`], nothing appended), and numbers its entries without
//! a gap in the order they commit, so [`read`] after the last sequence a reader saw never skips
//! one. Entries removed by retention are [`Error::Compacted`] to a reader that asks for them.

use std::time::{Duration, SystemTime};

use tokio_postgres::GenericClient;

use crate::error::Error;

/// One entry of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its sequence number: 1, 2, ... per stream, without a gap.
    pub seq: i64,
    /// The term of the leader that appended it.
    pub term: i64,
    /// When it was appended, by the store's clock.
    pub appended_at: SystemTime,
    /// Its payload, as JSON text (as Postgres prints `jsonb`).
    pub payload: String,
}

/// A stream's retention: an entry may go once `keep_count` newer ones exist or once it is older
/// than `keep_age`, but not while a follower has not applied it, unless more than `max_entries`
/// are kept. All `None`: every entry is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep at least this many of the newest entries.
    pub keep_count: Option<i64>,
    /// Keep entries younger than this.
    pub keep_age: Option<Duration>,
    /// Never keep more than this many, followers or not.
    pub max_entries: Option<i64>,
}

/// A follower of a stream as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerRow {
    /// Its name.
    pub follower: String,
    /// The last sequence it reported applied.
    pub applied: i64,
    /// Entries it has not applied.
    pub lag_entries: i64,
    /// How long ago the first entry it has not applied was appended (zero when it applied all);
    /// `None` when that is unknown (retention removed it, or its position is past the head).
    pub lag: Option<Duration>,
    /// How long ago it reported, by the store's clock.
    pub reported_ago: Duration,
}

/// A stream as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStatus {
    /// The lease it is bound to.
    pub lease_key: Option<String>,
    /// The highest term that appended to it (0 before the first append).
    pub max_term: Option<i64>,
    /// The last sequence number given (0 before the first append).
    pub head: i64,
    /// The oldest entry kept.
    pub first_seq: i64,
    /// Its retention.
    pub retention: Retention,
    /// How many followers are registered.
    pub followers: i64,
}

fn interval(duration: Option<Duration>) -> Option<String> {
    duration.map(|duration| format!("{} milliseconds", duration.as_millis()))
}

/// Calls `fencing.create_stream`: true when created, false when it exists bound to `lease_key`
/// (its retention unchanged).
pub async fn create_stream(
    client: &impl GenericClient,
    stream: &str,
    lease_key: &str,
    retention: Retention,
) -> Result<bool, Error> {
    let row = client
        .query_one(
            "SELECT fencing.create_stream($1, $2, $3, $4::text::interval, $5)",
            &[&stream, &lease_key, &retention.keep_count, &interval(retention.keep_age), &retention.max_entries],
        )
        .await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.set_retention`.
pub async fn set_retention(client: &impl GenericClient, stream: &str, retention: Retention) -> Result<(), Error> {
    client
        .execute(
            "SELECT fencing.set_retention($1, $2, $3::text::interval, $4)",
            &[&stream, &retention.keep_count, &interval(retention.keep_age), &retention.max_entries],
        )
        .await?;
    Ok(())
}

/// Calls `fencing.append`: appends `payloads` (JSON texts) as the writer of `term`, and returns
/// the sequence number of the first (the others follow it).
pub async fn append(client: &impl GenericClient, stream: &str, term: i64, payloads: &[&str]) -> Result<i64, Error> {
    let row =
        client.query_one("SELECT fencing.append($1, $2, $3::text[]::jsonb[])", &[&stream, &term, &payloads]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.append` naming the writer's lease: refused ([`Error::Refused`]) on a stream
/// bound to another lease, as for a term that does not lead the stream's own.
pub async fn append_for_lease(
    client: &impl GenericClient,
    stream: &str,
    term: i64,
    lease_key: &str,
    payloads: &[&str],
) -> Result<i64, Error> {
    let row = client
        .query_one("SELECT fencing.append($1, $2, $3::text[]::jsonb[], $4)", &[&stream, &term, &payloads, &lease_key])
        .await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.open_stream`: a new leader's barrier before it reads; the head once every
/// older term's append has ended.
pub async fn open_stream(
    client: &impl GenericClient,
    stream: &str,
    term: i64,
    lease_key: Option<&str>,
) -> Result<i64, Error> {
    let row = client.query_one("SELECT fencing.open_stream($1, $2, $3)", &[&stream, &term, &lease_key]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.read_stream`: up to `max_count` entries after sequence `after`, in order.
pub async fn read(client: &impl GenericClient, stream: &str, after: i64, max_count: i32) -> Result<Vec<Entry>, Error> {
    let rows = client
        .query(
            "SELECT seq, term, appended_at, payload::text AS payload FROM fencing.read_stream($1, $2, $3)",
            &[&stream, &after, &max_count],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Entry {
                seq: row.try_get("seq").map_err(Error::Store)?,
                term: row.try_get("term").map_err(Error::Store)?,
                appended_at: row.try_get("appended_at").map_err(Error::Store)?,
                payload: row.try_get("payload").map_err(Error::Store)?,
            })
        })
        .collect()
}

/// What a follower's report answers: the stream's head and the follower's lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// The stream's last sequence number.
    pub head: i64,
    /// How long ago the first entry the follower has not applied was appended, by the store's
    /// clock (zero when it applied all).
    pub lag: Duration,
}

/// Calls `fencing.report_position`: `follower` applied every entry up to `applied`.
pub async fn report_position(
    client: &impl GenericClient,
    stream: &str,
    follower: &str,
    applied: i64,
) -> Result<Reported, Error> {
    let row = client
        .query_one("SELECT head, lag_ms FROM fencing.report_position($1, $2, $3)", &[&stream, &follower, &applied])
        .await?;
    let lag: i64 = row.try_get("lag_ms").map_err(Error::Store)?;
    Ok(Reported {
        head: row.try_get("head").map_err(Error::Store)?,
        lag: Duration::from_millis(u64::try_from(lag).unwrap_or(0)),
    })
}

/// The last sequence `follower` reported applied (its durable cursor), `None` when it never
/// reported (or was forgotten).
pub async fn position(client: &impl GenericClient, stream: &str, follower: &str) -> Result<Option<i64>, Error> {
    Ok(followers(client, stream).await?.into_iter().find(|row| row.follower == follower).map(|row| row.applied))
}

/// Calls `fencing.forget_follower`: true when it was registered.
pub async fn forget_follower(client: &impl GenericClient, stream: &str, follower: &str) -> Result<bool, Error> {
    let row = client.query_one("SELECT fencing.forget_follower($1, $2)", &[&stream, &follower]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.retain_stream`: how many entries retention removed.
pub async fn retain(client: &impl GenericClient, stream: &str) -> Result<i64, Error> {
    let row = client.query_one("SELECT fencing.retain_stream($1)", &[&stream]).await?;
    row.try_get(0).map_err(Error::Store)
}

/// Calls `fencing.followers_of`.
pub async fn followers(client: &impl GenericClient, stream: &str) -> Result<Vec<FollowerRow>, Error> {
    let rows = client
        .query(
            "SELECT follower, applied, lag_entries, lag_ms, reported_ms_ago FROM fencing.followers_of($1)",
            &[&stream],
        )
        .await?;
    let ms = |value: i64| Duration::from_millis(u64::try_from(value).unwrap_or(0));
    rows.iter()
        .map(|row| {
            Ok(FollowerRow {
                follower: row.try_get("follower").map_err(Error::Store)?,
                applied: row.try_get("applied").map_err(Error::Store)?,
                lag_entries: row.try_get("lag_entries").map_err(Error::Store)?,
                lag: row.try_get::<_, Option<i64>>("lag_ms").map_err(Error::Store)?.map(ms),
                reported_ago: ms(row.try_get("reported_ms_ago").map_err(Error::Store)?),
            })
        })
        .collect()
}

/// Every stream's name, in order (a read of `fencing.streams`: the schema owner's, as
/// `fencing-gateway inspect` connects).
pub async fn list_streams(client: &impl GenericClient) -> Result<Vec<String>, Error> {
    let rows = client.query("SELECT stream FROM fencing.streams ORDER BY stream", &[]).await?;
    rows.iter().map(|row| row.try_get(0).map_err(Error::Store)).collect()
}

/// Calls `fencing.stream_status`.
pub async fn status(client: &impl GenericClient, stream: &str) -> Result<StreamStatus, Error> {
    let row = client
        .query_one(
            "SELECT lease_key, max_term, head, first_seq, keep_count,
                    (extract(epoch FROM keep_age) * 1000)::bigint AS keep_age_ms, max_entries, followers
               FROM fencing.stream_status($1)",
            &[&stream],
        )
        .await?;
    let keep_age: Option<i64> = row.try_get("keep_age_ms").map_err(Error::Store)?;
    Ok(StreamStatus {
        lease_key: row.try_get("lease_key").map_err(Error::Store)?,
        max_term: row.try_get("max_term").map_err(Error::Store)?,
        head: row.try_get("head").map_err(Error::Store)?,
        first_seq: row.try_get("first_seq").map_err(Error::Store)?,
        retention: Retention {
            keep_count: row.try_get("keep_count").map_err(Error::Store)?,
            keep_age: keep_age.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            max_entries: row.try_get("max_entries").map_err(Error::Store)?,
        },
        followers: row.try_get("followers").map_err(Error::Store)?,
    })
}
