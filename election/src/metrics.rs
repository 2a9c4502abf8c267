//! The metrics an elector records through the `metrics` facade, each labelled with `key`.
//!
//! Install any `metrics` recorder (the gateway uses `metrics-exporter-prometheus`) to export them.

/// Gauge: 1 while this process leads the key, else 0.
pub const IS_LEADER: &str = "election_is_leader";
/// Gauge: the term this process leads with, or 0 while a follower.
pub const TERM: &str = "election_term";
/// Counter: renewals that failed, errored, timed out or were refused.
pub const RENEW_FAILURES: &str = "election_renew_failures_total";
/// Counter: leadership periods this process ended because a handover was requested of them
/// (it drained and released: no failure).
pub const RESIGNATIONS: &str = "election_resignations_total";
/// Gauge: seconds left until this process's local deadline, as of the last acquire or renew.
pub const LEASE_REMAINING_SECONDS: &str = "election_lease_remaining_seconds";

/// Counter: acquires, renewals and probes in which the store's clock and this host's boot clock
/// disagreed (a step of the store's wall clock, or a clock running fast or slow): the elector
/// stepped down, or did not lead.
pub const CLOCK_DISAGREEMENTS: &str = "election_clock_disagreements_total";

/// Describes every metric once, for exporters that show help text.
pub fn describe() {
    metrics::describe_gauge!(IS_LEADER, "1 while this process leads the lease key, else 0");
    metrics::describe_gauge!(TERM, "The term this process leads with (the fencing token), 0 while a follower");
    metrics::describe_counter!(RENEW_FAILURES, "Lease renewals that failed, errored, timed out or were refused");
    metrics::describe_counter!(RESIGNATIONS, "Leadership periods ended because a handover was requested of them");
    metrics::describe_counter!(
        CLOCK_DISAGREEMENTS,
        "Round trips in which the store's clock and this host's boot clock disagreed (the elector stepped down)"
    );
    metrics::describe_gauge!(
        LEASE_REMAINING_SECONDS,
        metrics::Unit::Seconds,
        "Seconds left until this process's local leadership deadline, as of the last acquire or renew"
    );
}
