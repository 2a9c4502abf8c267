//! The route stage: which route a request takes and the rules every request must follow (S8),
//! then, for a fenced write, what the fence decides on: the caller's right to write there, the
//! presented term or lease, the resource and the fence it names, and the whole body.
//!
//! Routes are matched by the longest prefix at a segment boundary (the configuration keeps them
//! longest first).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::config::{ProxyConfig, ResourceNaming, Route};
use crate::fence::Presented;
use crate::names::{check_path, check_resource_name, folded};
use crate::proxy::headers::{
    ALWAYS_REMOVED, FENCING_LEASE, FENCING_OWNER, FENCING_RESOURCE, FENCING_TOKEN, HOP_BY_HOP, METHOD_OVERRIDE_HEADERS,
    REQUEST_ID, client_claim_header,
};
use crate::proxy::rejection::Rejection;
use crate::security::auth::{Caller, Unauthenticated};

/// Where a request goes.
#[derive(Debug)]
pub enum Routed {
    /// An unfenced method on route `index`, bodiless and cleaned: straight to the upstream.
    Read {
        /// The route, in `config.routes`.
        index: usize,
        /// The request, its hop-by-hop headers removed.
        request: Request<Incoming>,
    },
    /// A fenced method on route `index`: to the fence first.
    Write {
        /// The route, in `config.routes`.
        index: usize,
        /// The request, its hop-by-hop headers removed.
        request: Request<Incoming>,
    },
}

/// A fenced write as the fence sees it, with what is forwarded if it is admitted.
#[derive(Debug)]
pub struct Write {
    /// The request's head, to forward.
    pub parts: http::request::Parts,
    /// The whole body, read before the decision.
    pub body: Bytes,
    /// The term or the lease it presents (in stamp mode, the owner as the store keeps it).
    pub presented: Presented,
    /// The resource it changes.
    pub resource: String,
    /// The fence it is decided on (see [`fence_name`]).
    pub fence: String,
    /// Who sent it.
    pub caller: Caller,
}

/// Routes `request`, applying the rules every request follows: the method, the request
/// target's form, the path's one spelling, header names, and for an unfenced method no body
/// and no method override.
pub fn route(routes: &[Route], mut request: Request<Incoming>) -> Result<Routed, Rejection> {
    check_method(request.method())?;
    if request.uri().scheme().is_some() || request.uri().authority().is_some() {
        return Err(Rejection::Malformed(
            "absolute-form request targets are not accepted: send origin-form (a path)".to_owned(),
        ));
    }
    // S8: one spelling per resource. A path an upstream could read another way is refused,
    // never normalised, so the upstream receives exactly the path that was fenced.
    check_path(request.uri().path()).map_err(Rejection::Malformed)?;
    let index = find(routes, request.uri().path()).ok_or(Rejection::NoRoute)?;
    if let Some(other) = aliased(routes, index, request.uri().path()) {
        return Err(Rejection::Malformed(format!(
            "the path {:?} reads as one under the route {:?} to an upstream that ignores case, folds letters or \
             drops trailing dots, but would be decided under {:?}; send it in its one plain spelling",
            request.uri().path(),
            routes[other].prefix,
            routes[index].prefix
        )));
    }
    let route = &routes[index];
    check_header_names(request.headers_mut(), route)?;
    if route.unfenced_methods.contains(request.method()) {
        check_unfenced(&request)?;
        strip_hop_by_hop(request.headers_mut());
        return Ok(Routed::Read { index, request });
    }
    strip_hop_by_hop(request.headers_mut());
    Ok(Routed::Write { index, request })
}

/// The index of the route for `path` in `routes` (longest first): the longest matching prefix.
pub fn find(routes: &[Route], path: &str) -> Option<usize> {
    routes.iter().position(|route| matches(route, path))
}

/// True when `path` falls under `route`'s prefix, at a segment boundary.
fn matches(route: &Route, path: &str) -> bool {
    under(route.prefix.trim_end_matches('/'), path)
}

fn under(prefix: &str, path: &str) -> bool {
    prefix.is_empty() || path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

/// S8: the route, other than `routes[index]`, whose prefix `path` spells for an upstream that
/// ignores case (ASP.NET Core's routing, IIS), folds letters (Windows' best-fit conversions) or
/// drops trailing dots (`/LEDGER/x`, `/l%C4%95dger/x` and `/ledger./x` are `/ledger/x` to them),
/// when that route's prefix is at least as long: the write would be decided under one route
/// and applied under another. None for a path already in its folded form.
fn aliased(routes: &[Route], index: usize, path: &str) -> Option<usize> {
    let spelled = folded(path)?;
    let own = routes[index].prefix.trim_end_matches('/').len();
    let aliases = |(other, route): &(usize, &Route)| {
        let prefix = route.prefix.trim_end_matches('/');
        *other != index && prefix.len() >= own && under(&folded(prefix).unwrap_or_else(|| prefix.to_owned()), &spelled)
    };
    routes.iter().enumerate().find(aliases).map(|(other, _)| other)
}

/// The name of the fence a write to `resource` through `route` is decided on: the resource
/// itself when the route is bound to a lease (so a protected table bound to the same lease
/// shares it), else `<prefix>/<resource>`, the route's own namespace, so an unbound route can
/// never create, raise or poison a fence another route or a table uses (S8). Resource names
/// never contain `/`, so no two routes' namespaces meet.
pub fn fence_name(route: &Route, resource: &str) -> String {
    match &route.lease {
        Some(_) => resource.to_owned(),
        None => format!("{}/{resource}", route.prefix.trim_end_matches('/')),
    }
}

/// A fenced write on `route`, read whole: the caller may write there (with clients
/// configured, a fenced write is a client's, under a lease the client may use; its stamp-mode
/// owner is the client's), it presents one term or lease, names its resource, and its body
/// arrives whole within the limits before anything is decided.
pub async fn write(
    proxy: &ProxyConfig,
    route: &Route,
    request: Request<Incoming>,
    caller: Result<Caller, Unauthenticated>,
) -> Result<Write, Rejection> {
    let caller = caller.map_err(Rejection::Unauthenticated)?;
    let forbidden =
        |key: &str| Rejection::Forbidden(format!("client {:?} may not write under lease {key:?}", caller.name()));
    match &route.lease {
        Some(key) if !caller.may_use(key) => return Err(forbidden(key)),
        None if !caller.may_write_unbound(&route.prefix) => {
            return Err(Rejection::Forbidden(format!(
                "client {:?} may not write through the unbound route {:?} (add it to the client's routes)",
                caller.name(),
                route.prefix
            )));
        }
        _ => {}
    }
    let limit = proxy.body_limit_bytes;
    if let Some(length) = content_length(request.headers())?
        && length > limit
    {
        return Err(Rejection::BodyTooLarge { limit });
    }
    let mut presented = presented(request.headers())?;
    if let Presented::Lease { key, owner } = &mut presented {
        if !caller.may_use(key) {
            return Err(forbidden(key));
        }
        *owner = caller.store_owner(owner);
        if owner.chars().count() > 256 {
            return Err(Rejection::Malformed(format!(
                "Fencing-Owner is too long: with the client's name it must be at most 256 characters, got {}",
                owner.chars().count()
            )));
        }
    }
    let resource = resource(route, &request)?;
    // S8: a body only on the methods that carry one. An upstream that reads no body for another
    // method (`DELETE`, an extension method) would read the body as the next request on the
    // connection, with whatever token its author wrote in it.
    if !route.body_methods.contains(request.method()) && has_body(&request)? {
        return Err(Rejection::Malformed(format!(
            "{} may not carry a body on this route (its body_methods are {})",
            request.method(),
            route.body_methods.iter().map(Method::as_str).collect::<Vec<_>>().join(", ")
        )));
    }
    let fence = fence_name(route, &resource);
    tracing::Span::current().record("resource", resource.as_str());

    // The whole body before the decision: a malformed, oversized or abandoned body is refused
    // before any fence changes, and nothing of the write waits on the client once the write has
    // a deadline.
    let (parts, body) = request.into_parts();
    let body = read_body(body, limit, proxy.body_read_timeout).await?;
    Ok(Write { parts, body, presented, resource, fence, caller })
}

/// S8: methods. CONNECT and TRACE are never forwarded (405); a method that is not an upper-case
/// token is refused (400), because frameworks that upper-case methods would apply `post` as a
/// POST although it is not one of the route's unfenced methods.
fn check_method(method: &Method) -> Result<(), Rejection> {
    if *method == Method::CONNECT || *method == Method::TRACE {
        return Err(Rejection::MethodNotAllowed);
    }
    if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(Rejection::Malformed(format!("the method must be an upper-case token, got {:?}", method.as_str())));
    }
    Ok(())
}

/// Whether a header name needs no mapping: `a-z`, `0-9` and `-` only (names arrive lower case).
fn plain_name(name: &str) -> bool {
    name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// S8: header names. WSGI, CGI, FastCGI and many frameworks map every character of a name that
/// is not a letter or a digit to `_` (so `Fencing_Token`, `Fencing.Token` and `Fencing-Token` are
/// one variable to them), so such a name could forge a header the gateway sets, strips or reads.
/// A name with any character but `a-z`, `0-9` and `-` is refused (400) when, with those
/// characters read as `-`, it is such a header, and removed otherwise, as nginx does by default
/// (`ignore_invalid_headers`, `underscores_in_headers off`). The URL-rewrite headers and
/// `Proxy` are removed from every request.
fn check_header_names(headers: &mut HeaderMap, route: &Route) -> Result<(), Rejection> {
    for name in &ALWAYS_REMOVED {
        headers.remove(name);
    }
    if headers.keys().all(|name| plain_name(name.as_str())) {
        return Ok(());
    }
    let mut dropped = Vec::new();
    for name in headers.keys().filter(|name| !plain_name(name.as_str())) {
        let dashed: String =
            name.as_str().chars().map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' }).collect();
        if gateway_owned(&dashed, route) {
            return Err(Rejection::Malformed(format!(
                "the header name {name:?} reads as {dashed:?} to many upstreams: header names are a-z 0-9 - only"
            )));
        }
        dropped.push(name.clone());
    }
    for name in dropped {
        headers.remove(name);
    }
    Ok(())
}

/// Whether `name` (lower case, with `-`) is a header the gateway sets, strips or reads.
fn gateway_owned(name: &str, route: &Route) -> bool {
    let known = [FENCING_TOKEN, FENCING_RESOURCE, FENCING_LEASE, FENCING_OWNER, REQUEST_ID, HOST, CONTENT_LENGTH];
    known.iter().any(|owned| owned == name)
        || name.starts_with("fencing-")
        || name == http::header::AUTHORIZATION
        || client_claim_header(name)
        || HOP_BY_HOP.iter().any(|owned| owned == name)
        || METHOD_OVERRIDE_HEADERS.iter().any(|owned| owned == name)
        || ALWAYS_REMOVED.iter().any(|owned| owned == name)
        || matches!(&route.resource, ResourceNaming::Header(header) if header == name)
}

/// Whether the request carries a body: `Transfer-Encoding`, or a `Content-Length` above 0.
fn has_body(request: &Request<Incoming>) -> Result<bool, Rejection> {
    let headers = request.headers();
    Ok(headers.contains_key(http::header::TRANSFER_ENCODING)
        || content_length(headers)?.is_some_and(|length| length > 0)
        || !http_body::Body::is_end_stream(request.body()))
}

/// S8: an unfenced request carries no write. It has no body (a body on GET is read by many
/// upstreams as the next request on the connection, unfenced), so neither `Transfer-Encoding`
/// nor a `Content-Length` above 0; no method-override header; and no `_method` query parameter
/// (Apache CXF, Akka HTTP and others can be set to apply it on GET).
fn check_unfenced(request: &Request<Incoming>) -> Result<(), Rejection> {
    let method = request.method();
    if request.headers().contains_key(http::header::TRANSFER_ENCODING) {
        return Err(Rejection::Malformed(format!(
            "{method} is not fenced on this route, so it may not carry a body (Transfer-Encoding)"
        )));
    }
    if has_body(request)? {
        return Err(Rejection::Malformed(format!("{method} is not fenced on this route, so it may not carry a body")));
    }
    let headers = request.headers();
    if let Some(name) = METHOD_OVERRIDE_HEADERS.iter().find(|name| headers.contains_key(*name)) {
        return Err(Rejection::Malformed(format!(
            "{name} is refused on {method}, which is not fenced on this route: send the write as the method it is"
        )));
    }
    if request.uri().query().is_some_and(overrides_method) {
        return Err(Rejection::Malformed(format!(
            "a _method query parameter is refused on {method}, which is not fenced on this route: send the write as \
             the method it is"
        )));
    }
    Ok(())
}

/// Whether a query names a method to apply instead of the request's: a `_method` parameter,
/// however its name is spelled as the frameworks read it. Decoded once (`+` as a space), cut at
/// a NUL or an array's `[` (PHP, Rack, Node's `qs`), every character but a letter or a digit
/// read as `_` (PHP turns ` ` and `.` into `_`), trailing ones dropped and leading ones
/// counted as one: `_method`, `.method`, `%20method`, `__method`, `_method[]`, `_method%00`
/// and `_Method.` all name it; `method` does not.
fn overrides_method(query: &str) -> bool {
    query.split(['&', ';']).any(|pair| {
        let name = pair.split('=').next().unwrap_or_default().as_bytes();
        let mut decoded = Vec::with_capacity(name.len());
        let mut index = 0;
        while let Some(&byte) = name.get(index) {
            let hex = name.get(index + 1..index + 3).filter(|pair| pair.iter().all(u8::is_ascii_hexdigit));
            match hex.filter(|_| byte == b'%').and_then(|pair| std::str::from_utf8(pair).ok()) {
                Some(pair) => {
                    decoded.push(u8::from_str_radix(pair, 16).unwrap_or(0));
                    index += 3;
                }
                None => {
                    decoded.push(if byte == b'+' { b' ' } else { byte });
                    index += 1;
                }
            }
        }
        let end = decoded.iter().position(|&b| b == 0 || b == b'[').unwrap_or(decoded.len());
        let read: Vec<u8> = decoded[..end]
            .iter()
            .map(|b| if b.is_ascii_alphanumeric() { b.to_ascii_lowercase() } else { b'_' })
            .collect();
        let read = &read[..read.iter().rposition(|&b| b != b'_').map_or(0, |last| last + 1)];
        let word = read.iter().position(|&b| b != b'_').unwrap_or(read.len());
        word > 0 && &read[word..] == b"method"
    })
}

/// Removes the hop-by-hop headers, including every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Rejection> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let parse = |value: &HeaderValue| value.to_str().ok().and_then(|text| text.trim().parse::<u64>().ok());
    let length = parse(first).ok_or_else(|| Rejection::Malformed("Content-Length is not a number".to_owned()))?;
    if values.any(|value| parse(value) != Some(length)) {
        return Err(Rejection::Malformed("conflicting Content-Length headers".to_owned()));
    }
    Ok(Some(length))
}

/// The single value of `name`, or `None`; a repeated header is malformed.
/// The one value of header `name`, trimmed: `None` when absent, 400 when repeated or not visible
/// ASCII.
pub(crate) fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, Rejection> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::Malformed(format!("{name} must appear at most once")));
    }
    let text = value.to_str().map_err(|_| Rejection::Malformed(format!("{name} is not visible ASCII")))?;
    Ok(Some(text.trim()))
}

/// Parses a `Fencing-Token`: a decimal integer in 1..=2^63-1, nothing else.
pub fn parse_token(text: &str) -> Result<i64, Rejection> {
    let malformed = || {
        Rejection::Malformed(format!("Fencing-Token must be a decimal integer in 1..9223372036854775807, got {text:?}"))
    };
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    match text.parse::<i64>() {
        Ok(term) if term >= 1 => Ok(term),
        _ => Err(malformed()),
    }
}

fn presented(headers: &HeaderMap) -> Result<Presented, Rejection> {
    let token = single(headers, &FENCING_TOKEN)?;
    let lease = single(headers, &FENCING_LEASE)?;
    let owner = single(headers, &FENCING_OWNER)?;
    match (token, lease, owner) {
        // A Fencing-Owner beside a token is not a mode of its own: it is removed, never forwarded.
        (Some(token), None, _) => Ok(Presented::Token(parse_token(token)?)),
        (None, Some(key), Some(owner)) => {
            for (name, value) in [("Fencing-Lease", key), ("Fencing-Owner", owner)] {
                if value.is_empty() || value.chars().count() > 256 {
                    return Err(Rejection::Malformed(format!("{name} must be 1 to 256 characters")));
                }
            }
            Ok(Presented::Lease { key: key.to_owned(), owner: owner.to_owned() })
        }
        (None, None, None) => Err(Rejection::MissingToken),
        (Some(_), _, _) => Err(Rejection::Malformed(
            "present either Fencing-Token or Fencing-Lease with Fencing-Owner, not both".to_owned(),
        )),
        (None, _, _) => Err(Rejection::Malformed("Fencing-Lease and Fencing-Owner go together".to_owned())),
    }
}

fn resource(route: &Route, request: &Request<Incoming>) -> Result<String, Rejection> {
    let name = match &route.resource {
        ResourceNaming::Fixed(name) => name.clone(),
        ResourceNaming::Header(header) => single(request.headers(), header)?
            .ok_or_else(|| Rejection::Malformed(format!("this route names the resource by the {header} header")))?
            .to_owned(),
        ResourceNaming::Segment(n) => request
            .uri()
            .path()
            .split('/')
            .filter(|segment| !segment.is_empty())
            .nth(n - 1)
            .ok_or_else(|| {
                Rejection::Malformed(format!("this route names the resource by path segment {n}, which is missing"))
            })?
            .to_owned(),
    };
    check_resource_name(&name).map_err(Rejection::Malformed)?;
    Ok(name)
}

/// Reads a fenced write's whole body, at most `limit` bytes, each piece within `pause` of the
/// last: 413 over the limit, 400 for a body that is malformed, cut off or too slow.
///
/// Each frame is awaited under its own timeout, which arms a timer only when the frame is not
/// there yet (a small body arrives with its head), and reading stops at the body's end.
async fn read_body(mut body: Incoming, limit: u64, pause: Duration) -> Result<Bytes, Rejection> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut length: u64 = 0;
    while !http_body::Body::is_end_stream(&body) {
        let frame = match tokio::time::timeout(pause, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(error))) => {
                return Err(Rejection::Malformed(format!(
                    "the request body could not be read ({error}); nothing was decided"
                )));
            }
            Err(_) => {
                return Err(Rejection::Malformed(format!(
                    "the request body paused for longer than {} ms; nothing was decided",
                    pause.as_millis()
                )));
            }
        };
        // Trailers are not forwarded: the gateway sends the body with its length.
        let Ok(data) = frame.into_data() else { continue };
        length = length.saturating_add(data.len() as u64);
        if length > limit {
            return Err(Rejection::BodyTooLarge { limit });
        }
        match (&first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(_), Some(joined)) => joined.extend_from_slice(&data),
            (Some(head), None) => {
                let mut both = BytesMut::with_capacity(head.len() + data.len());
                both.extend_from_slice(head);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(match (joined, first) {
        (Some(joined), _) => joined.freeze(),
        (None, Some(only)) => only,
        (None, None) => Bytes::new(),
    })
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use crate::proxy::rejection::Rejection;
    use std::collections::BTreeMap;

    use crate::config::Config;
    use crate::proxy::route::{find, overrides_method, parse_token, strip_hop_by_hop};

    fn check_token(text: &str, expected: Option<i64>) {
        match (parse_token(text), expected) {
            (Ok(term), Some(expected)) => assert_eq!(term, expected, "{text:?}"),
            (Err(Rejection::Malformed(_)), None) => {}
            (other, _) => panic!("{text:?}: got {other:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn the_longest_prefix_wins_at_a_segment_boundary() {
        let config = Config::parse(
            r#"
[[routes]]
prefix = "/ledger"
upstream = "http://127.0.0.1:9000"
resource = { segment = 2 }
[[routes]]
prefix = "/ledger/special"
upstream = "http://127.0.0.1:9001"
resource = { fixed = "special" }
"#,
            &BTreeMap::new(),
        )
        .expect("valid");
        let route = |path: &str| find(&config.routes, path).map(|index| config.routes[index].prefix.as_str());
        assert_eq!(route("/ledger/special/x"), Some("/ledger/special"));
        assert_eq!(route("/ledger/acct-7/entries"), Some("/ledger"));
        assert_eq!(route("/ledger"), Some("/ledger"));
        assert_eq!(route("/ledgers"), None, "prefixes match at segment boundaries");
        assert_eq!(route("/other"), None);
    }

    #[test]
    fn tokens_are_decimal_integers_from_1_to_i64_max() {
        check_token("1", Some(1));
        check_token("42", Some(42));
        check_token("9223372036854775807", Some(i64::MAX));
        check_token("0007", Some(7));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "0x10",
            "abc",
            "9223372036854775808",
            "99999999999999999999",
            "1 2",
            "١",
        ] {
            check_token(bad, None);
        }
    }

    #[test]
    fn a_method_override_is_found_however_a_framework_spells_its_name() {
        for query in [
            "_method=DELETE",
            "a=1&_METHOD=DELETE",
            "a=1;_method=DELETE",
            ".method=DELETE",
            "%20method=DELETE",
            "+method=DELETE",
            "__method=DELETE",
            "_method.=DELETE",
            "_method[]=DELETE",
            "_method%5B%5D=DELETE",
            "_method%00x=DELETE",
            "%5Fmethod=DELETE",
            "%5fMethod=DELETE",
            "_method",
        ] {
            assert!(overrides_method(query), "{query:?} should name _method");
        }
        for query in ["method=card", "x_method=1", "_methods=1", "a=_method", "%+Fmethod=1", "_me%74hod2=1", ""] {
            assert!(!overrides_method(query), "{query:?} should not name _method");
        }
    }

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("keep-alive, x-secret, fencing-token"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        headers.insert("fencing-token", HeaderValue::from_static("7"));
        headers.insert("accept", HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key("accept"));
    }
}
