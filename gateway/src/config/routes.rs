//! The `[[routes]]`: each one checked, no prefix twice, the longest prefix first (the proxy
//! takes the first match), and no two routes binding one resource to different leases.

use http::{Method, Uri};

use crate::config::model::{ResourceNaming, Route};
use crate::config::raw::{RawResource, RawRoute};
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
    })
}
