//! The `[[clients]]`: names, token hashes and lease globs checked, each route a client lists
//! checked against the routes, and the rule of development mode (no clients: loopback only).

use std::net::SocketAddr;

use crate::config::model::Route;
use crate::config::raw::RawClient;
use crate::security::auth::{Client, glob_match, parse_sha256_hex, valid_client_name};

/// The clients, checked against `routes`; what is allowed but worth a warning goes to `warnings`.
pub(super) fn clients(
    raw: Vec<RawClient>,
    routes: &[Route],
    problems: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Vec<Client> {
    let clients = validate_clients(raw, problems);
    for (index, client) in clients.iter().enumerate() {
        for route in &client.routes {
            match routes.iter().find(|r| r.prefix.trim_end_matches('/') == route.trim_end_matches('/')) {
                None => problems.push(format!("clients[{index}].routes: {route:?} is no configured route prefix")),
                Some(r) if r.lease.is_some() => problems.push(format!(
                    "clients[{index}].routes: {route:?} is bound to a lease: allow the lease in `leases` instead"
                )),
                Some(_) => {}
            }
        }
        for other in &clients[index + 1..] {
            let shared =
                client.leases.iter().find(|a| other.leases.iter().any(|b| glob_match(a, b) || glob_match(b, a)));
            if let Some(pattern) = shared {
                warnings.push(format!(
                    "clients {:?} and {:?} may both use lease keys matching {pattern:?}: either can write under \
                     such a lease with its current term (only renew, release and stamp mode are the acquirer's own)",
                    client.name, other.name
                ));
            }
        }
    }
    clients
}

/// Development mode (no clients): nobody authenticates, so nobody off this host may connect.
pub(super) fn development_mode(listeners: [(&str, SocketAddr); 2], problems: &mut Vec<String>) {
    for (key, addr) in listeners {
        if !addr.ip().is_loopback() {
            problems.push(format!(
                "{key}: {addr} is not a loopback address; listening beyond this host needs [[clients]] \
                 (bearer tokens), see docs/operations.md, \"Security model\""
            ));
        }
    }
}

fn validate_clients(raw: Vec<RawClient>, problems: &mut Vec<String>) -> Vec<Client> {
    let mut clients: Vec<Client> = Vec::new();
    for (index, client) in raw.into_iter().enumerate() {
        let key = |name: &str| format!("clients[{index}].{name}");
        let before = problems.len();
        if !valid_client_name(&client.name) {
            problems.push(format!("{}: {:?} must be 1 to 64 of A-Z a-z 0-9 . _ -", key("name"), client.name));
        }
        if clients.iter().any(|c| c.name == client.name) {
            problems.push(format!("{}: {:?} is configured twice", key("name"), client.name));
        }
        let hash = parse_sha256_hex(&client.token_sha256.to_ascii_lowercase());
        if hash.is_none() {
            problems.push(format!(
                "{}: must be 64 hex digits, the SHA-256 of the token (never the token itself; \
                 `fencing-gateway token` makes one)",
                key("token_sha256")
            ));
        }
        if let Some(hash) = hash
            && clients.iter().any(|c| c.token_sha256 == hash)
        {
            problems.push(format!("{}: two clients share one token", key("token_sha256")));
        }
        for pattern in &client.leases {
            if pattern.is_empty() || pattern.chars().count() > 256 {
                problems.push(format!("{}: {pattern:?} must be 1 to 256 characters", key("leases")));
            }
        }
        if problems.len() == before
            && let Some(hash) = hash
        {
            clients.push(Client {
                name: client.name,
                token_sha256: hash,
                leases: client.leases,
                read: client.read,
                routes: client.routes,
            });
        }
    }
    clients
}
