//! Why the proxy answered a request itself: the one place that maps a refusal to its status,
//! its problem document and its `outcome` metric label.

use fencing_schema::store::Outcome as StoreOutcome;
use http::StatusCode;
use serde_json::json;

use crate::fence::Refusal;

use crate::problem::{Problem, forbidden, unauthenticated};
use crate::security::auth::Unauthenticated;

/// The label of `fencing_writes_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and forwarded (whatever the upstream answered).
    Admitted,
    /// The term is lower than the resource's maximum or its lease's current term.
    Stale,
    /// Stamp mode: the owner does not hold the lease; or the bound lease is not held.
    NotLeader,
    /// A bound resource was written with a term above its lease's current term.
    FutureTerm,
    /// A fenced write presented no token and no lease.
    MissingToken,
    /// The request was malformed (token, headers, body size, resource).
    Malformed,
    /// The fence decision could not be made.
    Unavailable,
    /// Admitted, but the upstream could not be reached or timed out.
    UpstreamError,
    /// No valid bearer token (401), or the client may not use the lease (403).
    Unauthorized,
}

impl Outcome {
    /// The metric label.
    pub fn as_label(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Stale => "stale",
            Outcome::NotLeader => "not_leader",
            Outcome::FutureTerm => "future_term",
            Outcome::MissingToken => "missing_token",
            Outcome::Malformed => "malformed",
            Outcome::Unavailable => "unavailable",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Unauthorized => "unauthorized",
        }
    }
}

/// Why the gateway answered a request itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// No route matches the path.
    NoRoute,
    /// CONNECT, or another method the proxy never forwards.
    MethodNotAllowed,
    /// A fence decision refused the write.
    Fenced {
        /// Stale, NotLeader or FutureTerm.
        outcome: Outcome,
        /// The resource written.
        resource: String,
        /// The fence the decision was made on (the resource, or `<prefix>/<resource>` for an
        /// unbound route).
        fence: String,
        /// The term presented (`None` in stamp mode when no term applies).
        presented_term: Option<i64>,
        /// The term the writer lost to.
        current_term: Option<i64>,
        /// Why a write was not the leader's (`NotLeader` only), for its detail.
        why: NotLeaderWhy,
    },
    /// A fenced write with neither `Fencing-Token` nor `Fencing-Lease`.
    MissingToken,
    /// Malformed input; the detail says what.
    Malformed(String),
    /// The body is over the limit.
    BodyTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The fence store did not decide in time or failed.
    Unavailable,
    /// This gateway's clock and the store's disagree: nothing is admitted, or sent, until they
    /// agree again.
    ClocksDisagree,
    /// The upstream could not be reached.
    UpstreamUnreachable,
    /// A route with `[routes.reads]` knows no follower within its bound and no leader.
    NoReader,
    /// A read that went through too many gateways (a `read_url` that leads back to one).
    ReadLoop,
    /// The upstream did not answer before the write's forward deadline.
    UpstreamTimeout,
    /// Clients are configured and the write carries no valid bearer token.
    Unauthenticated(Unauthenticated),
    /// The authenticated client may not write under this lease; the detail says which.
    Forbidden(String),
    /// `Host` is missing, repeated or malformed (400), or not one of the configured names
    /// (421); the problem says which.
    BadHost(Problem),
}

/// Why a write was refused as not the leader's: the detail says only what applies to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotLeaderWhy {
    /// Verify mode: no one holds the lease at the presented term.
    NotHeld,
    /// Stamp mode: the owner presented does not hold the lease.
    OwnerNotHolder,
    /// The resource is bound to another lease than the route's.
    OtherLease,
}

impl Rejection {
    /// A fence decision's refusal of a write to `resource`, decided on `fence`; `stamp` when the
    /// write presented a lease and owner (stamp mode).
    pub fn fenced(refusal: &Refusal, resource: &str, fence: &str, stamp: bool) -> Rejection {
        let why = match (refusal.outcome, stamp) {
            (StoreOutcome::WrongLease, _) => NotLeaderWhy::OtherLease,
            (_, true) => NotLeaderWhy::OwnerNotHolder,
            (_, false) => NotLeaderWhy::NotHeld,
        };
        let outcome = match refusal.outcome {
            StoreOutcome::Stale | StoreOutcome::Admitted => Outcome::Stale,
            StoreOutcome::FutureTerm => Outcome::FutureTerm,
            StoreOutcome::NotLeader | StoreOutcome::WrongLease => Outcome::NotLeader,
        };
        Rejection::Fenced {
            outcome,
            resource: resource.to_owned(),
            fence: fence.to_owned(),
            presented_term: refusal.presented_term,
            current_term: refusal.current_term,
            why,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::NoRoute => StatusCode::NOT_FOUND,
            Rejection::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Rejection::Fenced { .. } => StatusCode::CONFLICT,
            Rejection::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            Rejection::Malformed(_) => StatusCode::BAD_REQUEST,
            Rejection::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Unavailable | Rejection::ClocksDisagree | Rejection::NoReader => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::UpstreamUnreachable => StatusCode::BAD_GATEWAY,
            Rejection::ReadLoop => StatusCode::LOOP_DETECTED,
            Rejection::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Rejection::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Rejection::Forbidden(_) => StatusCode::FORBIDDEN,
            Rejection::BadHost(problem) => problem.status(),
        }
    }

    /// The `outcome` label, for rejections of writes on a route.
    pub fn outcome(&self) -> Outcome {
        match self {
            Rejection::Fenced { outcome, .. } => *outcome,
            Rejection::MissingToken => Outcome::MissingToken,
            Rejection::NoRoute
            | Rejection::MethodNotAllowed
            | Rejection::Malformed(_)
            | Rejection::BodyTooLarge { .. }
            | Rejection::BadHost(_)
            | Rejection::ReadLoop => Outcome::Malformed,
            Rejection::Unauthenticated(_) | Rejection::Forbidden(_) => Outcome::Unauthorized,
            Rejection::Unavailable | Rejection::ClocksDisagree | Rejection::NoReader => Outcome::Unavailable,
            Rejection::UpstreamUnreachable | Rejection::UpstreamTimeout => Outcome::UpstreamError,
        }
    }

    /// The problem document.
    pub fn problem(&self) -> Problem {
        let status = self.status();
        match self {
            Rejection::NoRoute => Problem::new(status, "no-route", "No route", "no configured route matches this path"),
            Rejection::MethodNotAllowed => Problem::new(
                status,
                "method-not-allowed",
                "Method not allowed",
                "the gateway forwards only to configured upstreams; CONNECT and TRACE are refused",
            ),
            Rejection::Fenced { outcome, resource, fence, presented_term, current_term, why } => {
                let (kind, title, detail) = match outcome {
                    Outcome::FutureTerm => (
                        "future-term",
                        "Future term",
                        format!(
                            "resource {resource:?} is bound to a lease whose current term is lower than the presented term"
                        ),
                    ),
                    Outcome::NotLeader => (
                        "not-leader",
                        "Not the leader",
                        match why {
                            NotLeaderWhy::NotHeld => format!(
                                "resource {resource:?} is bound to a lease that nobody holds at the presented term (it \
                                 expired or was released): this writer's period is over; it must stop acting as leader"
                            ),
                            NotLeaderWhy::OwnerNotHolder => format!(
                                "the owner presented does not hold the lease that resource {resource:?} needs (it expired, \
                                 was released or was taken over): it must stop acting as leader"
                            ),
                            NotLeaderWhy::OtherLease => {
                                format!("resource {resource:?} is bound to another lease than this route's")
                            }
                        },
                    ),
                    _ => (
                        "stale-term",
                        "Stale term",
                        format!(
                            "a term newer than the presented one exists for resource {resource:?} (admitted for it, or granted to the \
                             lease it is bound to): this writer's period is over; it must stop acting as leader"
                        ),
                    ),
                };
                Problem::new(status, kind, title, &detail)
                    .with("resource", json!(resource))
                    .with("fence", json!(fence))
                    .with("presented_term", json!(presented_term))
                    .with("current_term", json!(current_term))
                    .current_term(*current_term)
            }
            Rejection::MissingToken => Problem::new(
                status,
                "missing-token",
                "Fencing token required",
                "a fenced write must present Fencing-Token, or Fencing-Lease with Fencing-Owner",
            ),
            Rejection::Malformed(detail) => Problem::new(status, "malformed-request", "Malformed request", detail),
            Rejection::BodyTooLarge { limit } => Problem::new(
                status,
                "body-too-large",
                "Request body too large",
                &format!("the request body is over the limit of {limit} bytes"),
            ),
            Rejection::Unavailable => Problem::new(
                status,
                "fence-store-unavailable",
                "Fence store unavailable",
                "the fence decision could not be made; the write was not forwarded",
            )
            .retry_after(1),
            Rejection::ClocksDisagree => Problem::new(
                status,
                "fence-store-unavailable",
                "Fence store unavailable",
                "this gateway's clock and the fence store's disagree (a step of the store's clock, or a clock \
                 running fast or slow); nothing is admitted until they agree again; the write was not forwarded",
            )
            .retry_after(1),
            Rejection::NoReader => Problem::new(
                status,
                "no-reader",
                "No reader",
                "this route sends reads to its followers within the lag bound, else to its leader, and knows neither \
                 now (no follower's report within the bound, no holder of the leader lease with a read_url)",
            )
            .retry_after(1),
            Rejection::ReadLoop => Problem::new(
                status,
                "read-loop",
                "Read loop",
                "this read went through 3 gateways (Fencing-Read-Hops): a follower's read_url leads back to a gateway",
            ),
            Rejection::UpstreamUnreachable => Problem::new(
                status,
                "upstream-unreachable",
                "Upstream unreachable",
                "the write was admitted but the upstream could not be reached",
            ),
            Rejection::UpstreamTimeout => Problem::new(
                status,
                "upstream-timeout",
                "Upstream timed out",
                "the write was admitted but the upstream did not answer before its forward deadline; it was aborted",
            ),
            Rejection::Unauthenticated(reason) => unauthenticated(&reason.to_string()),
            Rejection::Forbidden(detail) => forbidden(detail),
            Rejection::BadHost(problem) => problem.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use fencing_schema::store::Outcome;

    use crate::fence::Refusal;
    use crate::proxy::rejection::Rejection;

    /// Issue 31: a verify-mode write refused as not the leader's was told about stamp mode.
    #[test]
    fn not_leader_details_say_only_what_applies_to_the_writes_mode() {
        let detail = |outcome, stamp| {
            let refusal = Refusal { outcome, presented_term: Some(3), current_term: Some(4) };
            Rejection::fenced(&refusal, "acct", "acct", stamp).problem().detail().unwrap_or_default().to_owned()
        };
        let verify = detail(Outcome::NotLeader, false);
        assert!(verify.contains("nobody holds") && !verify.contains("owner") && !verify.contains("stamp"), "{verify}");
        let stamp = detail(Outcome::NotLeader, true);
        assert!(stamp.contains("owner presented") && !stamp.contains("stamp"), "{stamp}");
        let other = detail(Outcome::WrongLease, false);
        assert!(other.contains("another lease"), "{other}");
    }
}
