//! Runs the breadth-first checker on one configuration: every reachable state within the
//! boundary, or (for a planted variant) until the first violation, whose path is then a shortest
//! counterexample.

// The checker's own run time is measured with the standard clock (no Tokio runtime here).
#[allow(clippy::disallowed_types)]
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::config::Config;
use crate::protocol::{Action, Protocol};
use crate::state::State;

/// A counterexample: (state, action, next state) per step.
pub type Steps = Vec<(State, Action, State)>;

/// What one check found.
#[derive(Debug)]
pub struct Report {
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The deepest level reached.
    pub max_depth: usize,
    /// Wall time of the check.
    pub elapsed: Duration,
    /// Each violated property, with its counterexample: (state, action, next state) per step.
    pub violations: Vec<(&'static str, Steps)>,
    /// The names of the witnesses ([`crate::Witness`], `sometimes` properties) reached in some
    /// explored state.
    pub reached: Vec<&'static str>,
}

impl Report {
    /// One line: states, depth, time.
    pub fn summary(&self) -> String {
        format!(
            "{} distinct states ({} generated), depth {}, {:.1} s",
            self.unique_states,
            self.states,
            self.max_depth,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Checks `config` breadth first on one thread (so a counterexample is a shortest one), or depth
/// first on representatives of its renamings when `config.symmetry` is set; with `stop_at_first`,
/// stops at the first violation.
pub fn check(config: Config, stop_at_first: bool) -> Report {
    #[allow(clippy::disallowed_types)]
    let started = Instant::now();
    let protocol = Protocol::new(config);
    let mut builder = protocol.clone().checker();
    if let Some(target) = std::env::var("MODEL_TARGET_STATES").ok().and_then(|t| t.parse().ok()) {
        builder = builder.target_state_count(target);
    }
    if stop_at_first {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    if config.symmetry {
        let checker = builder.symmetry_fn(crate::symmetry::representative).spawn_dfs().join();
        report(&protocol, &checker, started)
    } else {
        let checker = builder.spawn_bfs().join();
        report(&protocol, &checker, started)
    }
}

/// What `checker`, done, found.
#[allow(clippy::disallowed_types)]
fn report(protocol: &Protocol, checker: &impl Checker<Protocol>, started: Instant) -> Report {
    let elapsed = started.elapsed();
    let properties = protocol.properties();
    let is_example =
        |name: &str| properties.iter().any(|p| p.name == name && matches!(p.expectation, Expectation::Sometimes));
    let mut reached = Vec::new();
    let mut violations: Vec<(&'static str, Steps)> = Vec::new();
    for (name, path) in checker.discoveries() {
        if is_example(name) {
            reached.push(name);
            continue;
        }
        let pairs = path.into_vec();
        let steps = pairs
            .windows(2)
            .filter_map(|pair| {
                let [(before, action), (after, _)] = pair else { return None };
                Some((before.clone(), (*action)?, after.clone()))
            })
            .collect();
        violations.push((name, steps));
    }
    violations.sort_by_key(|(name, steps)| (steps.len(), *name));
    reached.sort_unstable();
    Report {
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        violations,
        reached,
    }
}
