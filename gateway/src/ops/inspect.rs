//! `fencing-gateway inspect` and `fencing-gateway admin`: what an operator reads and changes by
//! hand, through the schema's functions.

use std::fmt::Write as _;
use std::io::BufRead;
use std::time::SystemTime;

use fencing_schema::store;
use tokio_postgres::Client;

use crate::Error;
use crate::ops::cli::{Admin, Inspect};

fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

async fn connect(database_url: &str) -> Result<Client, Error> {
    let database = crate::security::database::Database::parse(database_url).map_err(Error::Setup)?;
    let client = database.connect().await.map_err(Error::Connect)?;
    fencing_schema::check_schema_version(&client).await?;
    // The admin actions that end a period or change a bound fence decide at READ COMMITTED only
    // (they must see every grant committed before them): whatever the database's default.
    client
        .batch_execute("SET default_transaction_isolation = 'read committed'")
        .await
        .map_err(|e| Error::Schema(fencing_schema::Error::Store(e)))?;
    Ok(client)
}

/// Runs one `inspect` command and returns what to print.
pub async fn inspect(database_url: &str, what: &Inspect) -> Result<String, Error> {
    let client = connect(database_url).await?;
    let mut out = String::new();
    match what {
        Inspect::Leases => {
            let _ = writeln!(
                out,
                "{:<32} {:<40} {:>8} {:>12}  {:<24}  VALUE",
                "KEY", "HOLDER", "TERM", "LEFT", "EXPIRES AT"
            );
            for lease in store::list_leases(&client).await? {
                // How the last period ended, when it did: released, handed over, forced, expired
                // (an expiry is recorded only when the next period starts).
                let ended = if lease.remaining.is_zero() {
                    let period = store::list_history(&client, &lease.key, 1).await?.into_iter().next();
                    match period.filter(|period| period.term == lease.term).and_then(|period| period.end_reason) {
                        Some(reason) if reason == "force_released" => "forced".to_owned(),
                        Some(reason) => reason.replace('_', " "),
                        None => "expired".to_owned(),
                    }
                } else {
                    String::new()
                };
                let resigning = store::observe_lease(&client, &lease.key)
                    .await?
                    .is_some_and(|state| state.resign_requested && !lease.remaining.is_zero());
                let (holder, left) = if !lease.lock_delay.is_zero() {
                    (format!("(none; last {})", lease.owner), format!("delay {:.1}s", lease.lock_delay.as_secs_f64()))
                } else if lease.remaining.is_zero() {
                    (format!("(none; last {})", lease.owner), ended)
                } else if resigning {
                    (lease.owner.clone(), format!("{:.1}s resign", lease.remaining.as_secs_f64()))
                } else {
                    (lease.owner.clone(), format!("{:.1}s", lease.remaining.as_secs_f64()))
                };
                // The value of the lease's term, as its holder set it (cut to one line's worth).
                let value = lease.value.as_deref().map_or_else(
                    || "-".to_owned(),
                    |value| {
                        let mut shown: String = value.chars().take(80).collect();
                        if shown.len() < value.len() {
                            shown.push_str("...");
                        }
                        shown
                    },
                );
                let _ = writeln!(
                    out,
                    "{:<32} {:<40} {:>8} {:>12}  {:<24}  {}",
                    lease.key,
                    holder,
                    lease.term,
                    left,
                    time(lease.expires_at),
                    value
                );
            }
        }
        Inspect::Fence { resource } => match store::get_fence(&client, resource).await? {
            Some(fence) => {
                let _ = writeln!(out, "resource:   {}", fence.resource);
                let _ = writeln!(out, "max term:   {}", fence.max_term);
                let _ = writeln!(out, "bound to:   {}", or_dash(fence.lease_key));
                let _ = writeln!(out, "updated at: {}", time(fence.updated_at));
            }
            None => {
                let _ = writeln!(out, "no fence for {resource:?}: no write was ever admitted for it");
            }
        },
        Inspect::Refusals { resource, limit } => {
            let _ = writeln!(
                out,
                "{:<24} {:<24} {:<16} {:<12} {:>9} {:>9}  {:<20} {:<24} {:<22} {:<24} GATEWAY",
                "AT",
                "RESOURCE",
                "ROUTE",
                "OUTCOME",
                "PRESENTED",
                "CURRENT",
                "LEASE",
                "OWNER / CLIENT",
                "ADDRESS",
                "REQUEST ID"
            );
            for refusal in store::list_refusals(&client, resource.as_deref(), *limit).await? {
                let _ = writeln!(
                    out,
                    "{:<24} {:<24} {:<16} {:<12} {:>9} {:>9}  {:<20} {:<24} {:<22} {:<24} {}",
                    time(refusal.at),
                    refusal.resource,
                    or_dash(refusal.route),
                    refusal.outcome,
                    or_dash(refusal.presented_term),
                    or_dash(refusal.current_term),
                    or_dash(refusal.lease_key),
                    or_dash(match (refusal.owner, refusal.caller) {
                        (Some(owner), _) => Some(owner),
                        (None, Some(caller)) => Some(format!("client {caller}")),
                        (None, None) => None,
                    }),
                    or_dash(refusal.client_addr),
                    or_dash(refusal.request_id),
                    or_dash(refusal.gateway)
                );
            }
            // Postgres's own refusals (fencing.admit, the guard on a protected table) roll back
            // with the refused transaction, so no row of them can be kept: only their count.
            let in_sql = store::sql_refusal_count(&client).await?;
            let _ = writeln!(
                out,
                "Above: writes the gateways refused. Postgres itself refused {in_sql} write(s) since the schema was \
                 installed (fencing.admit and the guard of protected tables, metric fencing_sql_refusals_total); those \
                 roll back with the refused transaction, so they leave no row here: the writer got SQLSTATE ZF409 with \
                 the resource and the terms, and PostgreSQL's log has each as an ERROR (logged by default)."
            );
        }
        Inspect::History { key, limit } => {
            let _ = writeln!(out, "{:>8} {:<40} {:<24} {:<24}  END", "TERM", "OWNER", "GRANTED AT", "ENDED AT");
            for period in store::list_history(&client, key, *limit).await? {
                let _ = writeln!(
                    out,
                    "{:>8} {:<40} {:<24} {:<24}  {}",
                    period.term,
                    period.owner,
                    time(period.granted_at),
                    period.ended_at.map_or_else(|| "-".to_owned(), time),
                    period.end_reason.unwrap_or_else(|| "(running or not yet known)".to_owned())
                );
            }
        }
        Inspect::Streams { stream } => {
            let streams = match stream {
                Some(stream) => vec![stream.clone()],
                None => fencing_schema::log::list_streams(&client).await?,
            };
            let _ = writeln!(
                out,
                "{:<32} {:<32} {:>8} {:>10} {:>10}  RETENTION",
                "STREAM", "LEASE", "TERM", "HEAD", "FIRST KEPT"
            );
            for name in streams {
                let status = fencing_schema::log::status(&client, &name).await?;
                let retention = &status.retention;
                let retention = format!(
                    "count {}, age {}, at most {}",
                    or_dash(retention.keep_count),
                    retention
                        .keep_age
                        .map_or_else(|| "-".to_owned(), |age| humantime::format_duration(age).to_string()),
                    or_dash(retention.max_entries)
                );
                let _ = writeln!(
                    out,
                    "{:<32} {:<32} {:>8} {:>10} {:>10}  {retention}",
                    name,
                    or_dash(status.lease_key),
                    or_dash(status.max_term),
                    status.head,
                    status.first_seq
                );
                for follower in fencing_schema::log::followers(&client, &name).await? {
                    let _ = writeln!(
                        out,
                        "  follower {:<32} applied {:>10}  behind {:>8} entries, {:>9}  reported {:.1}s ago",
                        follower.follower,
                        follower.applied,
                        follower.lag_entries,
                        follower.lag.map_or_else(|| "unknown".to_owned(), |lag| format!("{:.1}s", lag.as_secs_f64())),
                        follower.reported_ago.as_secs_f64()
                    );
                }
            }
        }
        Inspect::Audit { limit } => {
            for entry in store::list_audit(&client, *limit).await? {
                let _ = writeln!(
                    out,
                    "{}  {}  {} {}  reason: {}\n  before: {}\n  after:  {}",
                    time(entry.at),
                    entry.actor,
                    entry.action,
                    entry.target,
                    entry.reason,
                    or_dash(entry.before),
                    or_dash(entry.after)
                );
            }
        }
    }
    Ok(out)
}

/// What an admin action needs confirmed, and how.
fn confirm(prompt: &str, expected: &str, yes: bool, input: &mut dyn BufRead) -> bool {
    if yes {
        return true;
    }
    eprintln!("{prompt}");
    eprintln!("Type {expected:?} to confirm:");
    let mut line = String::new();
    input.read_line(&mut line).is_ok() && line.trim() == expected
}

fn default_actor() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    format!("{user}@{host}")
}

/// Runs one `admin` command, reading the confirmation from `input`; returns what to print, or
/// `None` when the operator did not confirm (nothing changed).
pub async fn admin(database_url: &str, action: &Admin, input: &mut dyn BufRead) -> Result<Option<String>, Error> {
    let client = connect(database_url).await?;
    match action {
        Admin::ReleaseLease { key, audit } => {
            let current = store::get_lease(&client, key).await?;
            let prompt = match &current {
                Some(lease) if !lease.remaining.is_zero() => format!(
                    "This ends the lease {key:?} held by {:?} with term {} ({:.1}s left); the next holder gets term {}.",
                    lease.owner,
                    lease.term,
                    lease.remaining.as_secs_f64(),
                    lease.term + 1
                ),
                Some(lease) => format!("The lease {key:?} (term {}) is not held; this only records it.", lease.term),
                None => format!("There is no lease {key:?}."),
            };
            if !confirm(&prompt, key, audit.yes, input) {
                return Ok(None);
            }
            let actor = audit.actor.clone().unwrap_or_else(default_actor);
            store::force_release(&client, key, &actor, &audit.reason).await?;
            Ok(Some(format!("released lease {key:?}; audited as {actor}\n")))
        }
        Admin::Handover { key, to, force_after_ms, audit } => {
            let Some(lease) = store::get_lease(&client, key).await?.filter(|lease| !lease.remaining.is_zero()) else {
                return Ok(Some(format!("nobody holds the lease {key:?}: there is nothing to hand over\n")));
            };
            let successor = to.as_deref().map_or_else(|| "whoever acquires first".to_owned(), |to| format!("{to:?}"));
            let prompt = format!(
                "This asks {:?}, holder of {key:?} with term {}, to step down; the next term goes to {successor}.",
                lease.owner, lease.term
            );
            if !confirm(&prompt, key, audit.yes, input) {
                return Ok(None);
            }
            let actor = audit.actor.clone().unwrap_or_else(default_actor);
            let Some(term) = store::request_resign(&client, key, (&actor, &audit.reason), to.as_deref(), None).await?
            else {
                return Ok(Some(format!("the lease {key:?} ended meanwhile: there is nothing to hand over\n")));
            };
            let Some(force_after) = force_after_ms.map(std::time::Duration::from_millis) else {
                return Ok(Some(format!(
                    "asked the holder of {key:?} (term {term}) to step down; audited as {actor}\n"
                )));
            };
            let until = tokio::time::Instant::now() + force_after;
            loop {
                let now = match tokio::time::timeout(std::time::Duration::from_secs(5), store::get_lease(&client, key))
                    .await
                {
                    Ok(read) => read?,
                    Err(_) => {
                        return Ok(Some(format!(
                            "the store did not answer within 5 s: the request to step down stands (term {term}), \
                             the holder was not forced\n"
                        )));
                    }
                };
                if now.is_none_or(|lease| lease.term != term || lease.remaining.is_zero()) {
                    return Ok(Some(format!("the holder of {key:?} stepped down (term {term}); audited as {actor}\n")));
                }
                if tokio::time::Instant::now() >= until {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            let reason = crate::control::forced_reason(&audit.reason, force_after);
            if store::force_handover(&client, key, term, &actor, &reason).await? {
                Ok(Some(format!(
                    "the holder of {key:?} did not step down within {} ms: its period (term {term}) was ended; \
                     audited as {actor}\n",
                    force_after.as_millis()
                )))
            } else {
                Ok(Some(format!("the holder of {key:?} stepped down (term {term}); audited as {actor}\n")))
            }
        }
        Admin::AdvanceFence { resource, term, audit } => {
            let current = store::get_fence(&client, resource).await?;
            let prompt = format!(
                "This raises the fence of {resource:?} from term {} to {term}: every writer below {term} is refused from now on.",
                current.map_or_else(|| "none".to_owned(), |fence| fence.max_term.to_string())
            );
            if !confirm(&prompt, resource, audit.yes, input) {
                return Ok(None);
            }
            let actor = audit.actor.clone().unwrap_or_else(default_actor);
            store::advance_fence(&client, resource, *term, &actor, &audit.reason).await?;
            Ok(Some(format!("fence of {resource:?} is at term {term}; audited as {actor}\n")))
        }
        Admin::Rebind { resource, lease, audit } => {
            let current = store::get_fence(&client, resource).await?;
            let prompt = match &current {
                Some(fence) => format!(
                    "This binds {resource:?} (max term {}) from lease {} to lease {lease:?}: from now on only {lease:?}'s \
                     current term is admitted, once it reaches {}.",
                    fence.max_term,
                    fence.lease_key.as_deref().map_or_else(|| "(none)".to_owned(), |key| format!("{key:?}")),
                    fence.max_term
                ),
                None => format!("There is no fence {resource:?}."),
            };
            if !confirm(&prompt, resource, audit.yes, input) {
                return Ok(None);
            }
            let actor = audit.actor.clone().unwrap_or_else(default_actor);
            store::rebind(&client, resource, lease, &actor, &audit.reason).await?;
            Ok(Some(format!("{resource:?} is bound to lease {lease:?}; audited as {actor}\n")))
        }
        Admin::CreateStream { stream, lease, keep_count, keep_age_ms, max_entries } => {
            let retention = fencing_schema::log::Retention {
                keep_count: *keep_count,
                keep_age: keep_age_ms.map(std::time::Duration::from_millis),
                max_entries: *max_entries,
            };
            fencing_schema::log::create_stream(&client, stream, lease, retention).await?;
            Ok(Some(format!("created stream {stream:?}, bound to lease {lease:?}\n")))
        }
        Admin::ResetFence { resource, term, audit } => {
            let current = store::get_fence(&client, resource).await?;
            let prompt = format!(
                "This sets the unbound fence {resource:?} from term {} back to {term}. A fence never goes back \
                 otherwise: do it only for a fence a client poisoned, after stopping that client.",
                current.map_or_else(|| "none".to_owned(), |fence| fence.max_term.to_string())
            );
            if !confirm(&prompt, resource, audit.yes, input) {
                return Ok(None);
            }
            let actor = audit.actor.clone().unwrap_or_else(default_actor);
            store::reset_fence(&client, resource, *term, &actor, &audit.reason).await?;
            Ok(Some(format!("fence of {resource:?} is at term {term}; audited as {actor}\n")))
        }
    }
}
