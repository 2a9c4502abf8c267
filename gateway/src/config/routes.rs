//! The `[[routes]]`: each one checked, no prefix twice, the longest prefix first (the proxy
//! takes the first match), and no two routes binding one resource to different leases.

use http::{Method, Uri};

use crate::config::model::{DEFAULT_READ_HOSTS, MAX_READ_LAG_MS, Reads, ResourceNaming, Route};
use crate::config::raw::{RawReads, RawResource, RawRoute};
use crate::names::{check_prefix, check_resource_header, check_resource_name, folded};

/// The routes, longest prefix first, and the warnings about their bindings.
pub(super) fn routes(raw: Vec<RawRoute>, problems: &mut Vec<String>) -> (Vec<Route>, Vec<String>) {
    let mut routes = Vec::new();
    for (index, route) in raw.into_iter().enumerate() {
        if let Some(route) = validate_route(index, route, problems) {
            routes.push(route);
        }
    }
    for (i, a) in routes.iter().enumerate() {
        let spelling = |route: &Route| {
            let prefix = route.prefix.trim_end_matches('/');
            folded(prefix).unwrap_or_else(|| prefix.to_owned())
        };
        if routes[..i].iter().any(|b| spelling(b) == spelling(a)) {
            problems.push(format!(
                "routes[{i}].prefix: {:?} is configured twice (prefixes that differ only in case or trailing dots \
                 are one to many upstreams)",
                a.prefix
            ));
        }
    }
    // Longest prefix first, so the first match is the longest.
    routes.sort_by_key(|route| std::cmp::Reverse(route.prefix.trim_end_matches('/').len()));
    let warnings = check_bindings(&routes, problems);
    (routes, warnings)
}

/// Two routes bound to different leases that can name one resource would fight over its
/// binding (a write never rebinds, so the second route's writes would all be refused): the same
/// fixed name is a configuration error; a route that names resources by header or segment can
/// name anything, so beside another lease it is a warning.
fn check_bindings(routes: &[Route], problems: &mut Vec<String>) -> Vec<String> {
    let mut warnings = Vec::new();
    for (i, a) in routes.iter().enumerate() {
        for b in &routes[i + 1..] {
            let (Some(lease_a), Some(lease_b)) = (&a.lease, &b.lease) else { continue };
            if lease_a == lease_b {
                continue;
            }
            match (&a.resource, &b.resource) {
                (ResourceNaming::Fixed(x), ResourceNaming::Fixed(y)) if x == y => problems.push(format!(
                    "routes {:?} and {:?} bind the resource {x:?} to different leases ({lease_a:?}, {lease_b:?})",
                    a.prefix, b.prefix
                )),
                (ResourceNaming::Fixed(_), ResourceNaming::Fixed(_)) => {}
                _ => warnings.push(format!(
                    "routes {:?} (lease {lease_a:?}) and {:?} (lease {lease_b:?}) can name the same resource; \
                     a resource stays bound to the lease that first wrote it, and the other route's writes to it \
                     are refused (rebinding is `fencing-gateway admin rebind`)",
                    a.prefix, b.prefix
                )),
            }
        }
    }
    warnings
}

fn validate_route(index: usize, raw: RawRoute, problems: &mut Vec<String>) -> Option<Route> {
    let key = |name: &str| format!("routes[{index}].{name}");
    let before = problems.len();
    if !raw.prefix.starts_with('/') {
        problems.push(format!("{}: {:?} must start with /", key("prefix"), raw.prefix));
    }
    let upstream = match raw.upstream.parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.authority().is_some()
                && uri.query().is_none() =>
        {
            Some(uri)
        }
        Ok(_) => {
            problems.push(format!(
                "{}: {:?} must be an http:// or https:// URL with a host and no query",
                key("upstream"),
                raw.upstream
            ));
            None
        }
        Err(error) => {
            problems.push(format!("{}: {:?}: {error}", key("upstream"), raw.upstream));
            None
        }
    };
    let resource = match raw.resource {
        RawResource::Fixed(name) => match check_resource_name(&name) {
            Ok(()) => Some(ResourceNaming::Fixed(name)),
            Err(reason) => {
                problems.push(format!("{}: {reason}", key("resource")));
                None
            }
        },
        RawResource::Header(name) => match check_resource_header(&name)
            .and_then(|()| http::HeaderName::from_bytes(name.as_bytes()).map_err(|error| error.to_string()))
        {
            Ok(header) => Some(ResourceNaming::Header(header)),
            Err(reason) => {
                problems.push(format!("{}: {reason}", key("resource")));
                None
            }
        },
        RawResource::Segment(n) if n >= 1 => usize::try_from(n).ok().map(ResourceNaming::Segment),
        RawResource::Segment(n) => {
            problems.push(format!("{}: segment must be 1 or more, got {n}", key("resource")));
            None
        }
    };
    if let Some(lease) = &raw.lease
        && (lease.is_empty() || lease.chars().count() > 256)
    {
        problems.push(format!("{}: a lease key must be 1 to 256 characters", key("lease")));
    }
    let mut methods = |name: &str, given: Option<Vec<String>>, default: &[Method]| -> Vec<Method> {
        match given {
            None => default.to_vec(),
            Some(names) => names
                .iter()
                .filter_map(|method| match Method::from_bytes(method.as_bytes()) {
                    Ok(parsed)
                        if parsed != Method::CONNECT
                            && parsed != Method::TRACE
                            && !method.bytes().any(|b| b.is_ascii_lowercase()) =>
                    {
                        Some(parsed)
                    }
                    _ => {
                        problems
                            .push(format!("{}: {method:?} is not an upper-case method the proxy forwards", key(name)));
                        None
                    }
                })
                .collect(),
        }
    };
    let unfenced_methods =
        methods("unfenced_methods", raw.unfenced_methods, &[Method::GET, Method::HEAD, Method::OPTIONS]);
    let body_methods = methods("body_methods", raw.body_methods, &[Method::POST, Method::PUT, Method::PATCH]);
    for method in body_methods.iter().filter(|method| unfenced_methods.contains(method)) {
        problems.push(format!(
            "{}: {method} is unfenced on this route, and an unfenced method never carries a body",
            key("body_methods")
        ));
    }
    if raw.prefix.starts_with('/')
        && let Err(reason) = check_prefix(&raw.prefix)
    {
        problems.push(format!("{}: {reason}", key("prefix")));
    }
    let reads = raw.reads.and_then(|reads| validate_reads(&key("reads"), reads, upstream.as_ref(), problems));
    if problems.len() > before {
        return None;
    }
    Some(Route {
        prefix: raw.prefix,
        upstream: upstream?,
        resource: resource?,
        lease: raw.lease,
        unfenced_methods,
        body_methods,
        reads,
    })
}

/// A route's `[routes.reads]`: names the store accepts, a bound of 1 ms to an hour, hosts.
fn validate_reads(key: &str, raw: RawReads, upstream: Option<&Uri>, problems: &mut Vec<String>) -> Option<Reads> {
    let before = problems.len();
    let mut name = |what: &str, value: &str, longest: usize| {
        if value.is_empty() || value.chars().count() > longest {
            problems.push(format!("{key}.{what}: must be 1 to {longest} characters"));
        }
    };
    name("cluster", &raw.cluster, 256);
    // A stream's name is at most 244 characters (its fence is `fencing.log/<stream>`).
    name("stream", &raw.stream, 244);
    if let Some(lease) = &raw.leader_lease {
        name("leader_lease", lease, 256);
    }
    if raw.max_lag_ms == 0 || raw.max_lag_ms > MAX_READ_LAG_MS {
        problems.push(format!("{key}.max_lag_ms: must be 1 to {MAX_READ_LAG_MS}, got {}", raw.max_lag_ms));
    }
    let allow_hosts = raw.allow_hosts.unwrap_or_else(|| DEFAULT_READ_HOSTS.map(str::to_owned).to_vec());
    for host in &allow_hosts {
        if host.contains('@')
            || host.parse::<http::uri::Authority>().map_or(true, |authority| authority.port().is_some())
        {
            problems.push(format!("{key}.allow_hosts: {host:?} is not a host name or address (no port)"));
        }
    }
    if allow_hosts.is_empty() {
        problems.push(format!("{key}.allow_hosts: must name at least one host"));
    }
    if upstream.is_none() || problems.len() > before {
        return None;
    }
    Some(Reads {
        cluster: raw.cluster,
        stream: raw.stream,
        max_lag: std::time::Duration::from_millis(raw.max_lag_ms),
        leader_lease: raw.leader_lease,
        allow_hosts: allow_hosts.into_iter().map(|host| host.to_ascii_lowercase()).collect(),
    })
}
