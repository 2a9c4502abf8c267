//! The header names the proxy sets, strips or reads, and the request id.

use http::header::CONNECTION;
use http::{HeaderName, HeaderValue};

/// `Fencing-Token`: the term, presented by a leader (verify mode) and stamped by the gateway.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");

/// `Fencing-Resource`: the resource, stamped by the gateway (or read, when a route says so).
pub const FENCING_RESOURCE: HeaderName = HeaderName::from_static("fencing-resource");

/// `Fencing-Lease`: the lease key, presented in stamp mode.
pub const FENCING_LEASE: HeaderName = HeaderName::from_static("fencing-lease");

/// `Fencing-Owner`: the lease owner, presented in stamp mode; never forwarded.
pub const FENCING_OWNER: HeaderName = HeaderName::from_static("fencing-owner");

/// On the answer to a read of a route with `[routes.reads]`: who served it, `follower <name>`
/// or `leader`.
pub const FENCING_READ_FROM: HeaderName = HeaderName::from_static("fencing-read-from");

/// On a read a route with `[routes.reads]` sends on: how many gateways it went through. A read
/// that arrives with 3 (or a value that is not 1 to 255) is refused (508 `read-loop`).
pub const FENCING_READ_HOPS: HeaderName = HeaderName::from_static("fencing-read-hops");

/// The request id, taken from a trusted proxy when it sends a sane one, else made up.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub(crate) const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// A request's id: the header value sent on to the upstream and back to the client, made once.
#[derive(Debug, Clone)]
pub struct RequestId(pub(crate) HeaderValue);

impl RequestId {
    /// The id as text (always visible ASCII).
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or("-")
    }
}

/// Whether a client could claim another address, host, scheme or identity with the header
/// `name` (lower case): `Forwarded`, every `X-Forwarded*`, `X-Real-IP`, and the client-address,
/// "this was TLS" and authenticated-user headers that CDNs, load balancers, auth proxies and
/// frameworks set and their upstreams trust (Jetty's `Proxy-ssl-id`, WebLogic's
/// `WL-Proxy-Client-IP`, oauth2-proxy's `X-Auth-Request-User`, AWS ALB's `X-Amzn-Oidc-*`).
/// Removed unless the peer is one of `proxy.trusted_proxies`; `proxy.client_claim_headers`
/// adds more. A fixed list has gaps: name your upstream's own in the configuration.
pub(crate) fn client_claim_header(name: &str) -> bool {
    const PREFIXES: [&str; 10] = [
        "x-forwarded",
        "x-auth-request-",
        "x-amzn-oidc-",
        "x-ms-client-principal",
        "x-goog-authenticated-user-",
        "cf-access-",
        "x-ssl-",
        "ssl-client-",
        "x-client-cert",
        "x-arr-",
    ];
    PREFIXES.iter().any(|prefix| name.starts_with(prefix))
        || matches!(
            name,
            // Addresses and hosts.
            "forwarded"
                | "forwarded-for"
                | "x-real-ip"
                | "x-client-ip"
                | "client-ip"
                | "true-client-ip"
                | "x-cluster-client-ip"
                | "cf-connecting-ip"
                | "cf-connecting-ipv6"
                | "fastly-client-ip"
                | "fly-client-ip"
                | "x-original-forwarded-for"
                | "x-original-host"
                | "x-host"
                | "wl-proxy-client-ip"
                | "proxy-client-ip"
                | "x-originating-ip"
                | "x-remote-ip"
                | "x-remote-addr"
                | "x-envoy-external-address"
                | "x-envoy-internal"
                | "x-proxyuser-ip"
                | "x-azure-clientip"
                | "x-azure-socketip"
                | "x-appengine-user-ip"
                // "This came over TLS", and client certificates.
                | "x-proxied-https"
                | "front-end-https"
                | "x-url-scheme"
                | "x-scheme"
                | "x-https"
                | "wl-proxy-ssl"
                | "proxy-auth-cert"
                | "proxy-ssl-id"
                | "wl-proxy-client-cert"
                // Who the user is, as an auth proxy says.
                | "remote-user"
                | "x-remote-user"
                | "x-remote-group"
                | "x-webauth-user"
                | "x-user"
                | "x-email"
                | "x-authenticated-user"
                | "x-auth-user"
        )
}

/// Whether `headers`' `Connection` names `name`: a hop-by-hop header for the gateway alone, removed
/// before anything reads the request (a bearer token named there authenticates nobody).
pub(crate) fn named_in_connection(headers: &http::HeaderMap, name: &HeaderName) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|named| named.trim().eq_ignore_ascii_case(name.as_str()))
}

/// Headers with which a client asks an upstream to apply another method than the request's
/// (Rails, Symfony, ASP.NET, Google's APIs and many more honour one of them). On an unfenced
/// method they would turn a read into a write nobody fenced, so they are refused there.
pub(crate) const METHOD_OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-method-override"),
    HeaderName::from_static("x-http-method"),
];

/// Headers with which a client asks an upstream (IIS, Symfony, Zend, nginx's `auth_request`,
/// Envoy) to act on another path than the request's, `Proxy`, which CGI upstreams read as the
/// `HTTP_PROXY` setting (httpoxy), and `Expect`: removed from every request, so the upstream
/// acts on the path that was fenced.
pub(crate) const ALWAYS_REMOVED: [HeaderName; 7] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-original-uri"),
    HeaderName::from_static("x-original-path"),
    HeaderName::from_static("x-envoy-original-path"),
    HeaderName::from_static("proxy"),
    // The gateway holds the whole body: an upstream has nothing to continue.
    http::header::EXPECT,
];

/// The hop-by-hop headers of RFC 9110 section 7.6.1, and the old ones proxies still see.
pub(crate) const HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];
