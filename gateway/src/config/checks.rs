//! The problems a check finds, and the checks every section makes.

use std::net::SocketAddr;
use std::time::Duration;

/// The problems found so far, with the checks every section uses.
#[derive(Debug, Default)]
pub(super) struct Checks {
    pub(super) problems: Vec<String>,
}

impl Checks {
    pub(super) fn push(&mut self, problem: String) {
        self.problems.push(problem);
    }

    /// A positive number of milliseconds at `key`, or `default` when absent.
    pub(super) fn positive_ms(&mut self, key: &str, value: Option<u64>, default: Duration) -> Duration {
        match value {
            Some(0) => {
                self.push(format!("{key}: must be positive"));
                default
            }
            Some(value) => Duration::from_millis(value),
            None => default,
        }
    }

    /// An IP address and port at `key`, or `default` when absent.
    pub(super) fn address(&mut self, key: &str, value: Option<String>, default: &str) -> SocketAddr {
        let text = value.unwrap_or_else(|| default.to_owned());
        text.parse().unwrap_or_else(|error| {
            self.push(format!("{key}: {text:?} is not an IP address and port: {error}"));
            SocketAddr::from(([127, 0, 0, 1], 0))
        })
    }
}
