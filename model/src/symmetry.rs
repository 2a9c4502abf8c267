//! Symmetry reduction: states that differ only by a renaming of gateways, of electors, or of two
//! resources bound to the lease are the same state for every property (S1-S5 and the witnesses
//! read only counts and per-resource maxima, never a name). The checker explores one
//! representative of each class (the least of the renamings), which cuts the state space by up to
//! eight times and lets the larger configurations be proven exhaustively.
//!
//! stateright applies it in its depth-first search only: a check with symmetry proves that no
//! state violates a property, but a counterexample it prints need not be a shortest one. Planted
//! variants keep the breadth-first search.

use crate::config::{ELECTORS, GATEWAYS};
use crate::state::{Admin, State};

/// The least of the states that rename `s`'s gateways, electors and (when two resources are
/// bound) its two bound resources.
pub fn representative(s: &State) -> State {
    let mut best = s.clone();
    for swap_gateways in [false, true] {
        for swap_electors in [false, true] {
            for swap_resources in [false, true] {
                if !(swap_gateways || swap_electors || swap_resources) || (swap_resources && s.bound < 2) {
                    continue;
                }
                let mut renamed = s.clone();
                if swap_gateways {
                    renamed.gateways.swap(0, 1);
                }
                if swap_electors {
                    swap_elector_names(&mut renamed);
                }
                if swap_resources {
                    swap_resource_names(&mut renamed);
                }
                if renamed < best {
                    best = renamed;
                }
            }
        }
    }
    best
}

const _: () = assert!(GATEWAYS == 2 && ELECTORS == 2, "the renamings assume two gateways and two electors");

/// Electors 0 and 1 trade names: their state and the lease row's owner.
fn swap_elector_names(s: &mut State) {
    let rename = |owner: Option<u8>| owner.map(|owner| 1 - owner.min(1));
    s.electors.swap(0, 1);
    s.ghost.owned.swap(0, 1);
    for gateway in &mut s.gateways {
        for grant in gateway
            .grants
            .iter_mut()
            .chain(gateway.decided.iter_mut())
            .chain(std::iter::once(&mut gateway.lease_grant))
            .chain(std::iter::once(&mut gateway.ns_grant))
            .flatten()
        {
            grant.owner = rename(grant.owner);
        }
        for call in gateway.calls.iter_mut().flatten().chain(gateway.orphan.iter_mut()) {
            call.owner = rename(call.owner);
        }
        for write in gateway.writes.iter_mut().flatten() {
            write.owner = rename(write.owner);
        }
        gateway.calls.sort();
        gateway.writes.sort();
    }
    s.tables.lease.owner = s.tables.lease.owner.map(|owner| 1 - owner.min(1));
    if let Some(durable) = s.durable.as_mut() {
        durable.lease.owner = durable.lease.owner.map(|owner| 1 - owner.min(1));
    }
}

/// Resources 0 and 1 (both bound) trade names everywhere a resource is named.
fn swap_resource_names(s: &mut State) {
    let rename = |r: u8| match r {
        0 => 1,
        1 => 0,
        other => other,
    };
    s.tables.fences.swap(0, 1);
    if let Some(durable) = s.durable.as_mut() {
        durable.fences.swap(0, 1);
    }
    s.ghost.admitted.swap(0, 1);
    s.ghost.sent.swap(0, 1);
    s.ghost.bindings.swap(0, 1);
    if let Some(tx) = s.sql.as_mut() {
        tx.resource = rename(tx.resource);
    }
    if let Some(tx) = s.admin.as_mut() {
        tx.action = match tx.action {
            Admin::Advance { resource, term } => Admin::Advance { resource: rename(resource), term },
            Admin::Bind { resource } => Admin::Bind { resource: rename(resource) },
            Admin::Rebind { resource } => Admin::Rebind { resource: rename(resource) },
            Admin::ForceRelease => Admin::ForceRelease,
        };
    }
    for gateway in &mut s.gateways {
        gateway.grants.swap(0, 1);
        gateway.settles.swap(0, 1);
        gateway.decided.swap(0, 1);
        for call in gateway.calls.iter_mut().flatten().chain(gateway.orphan.iter_mut()) {
            call.resource = rename(call.resource);
        }
        for write in gateway.writes.iter_mut().flatten() {
            write.resource = rename(write.resource);
        }
        gateway.calls.sort();
        gateway.writes.sort();
    }
}
