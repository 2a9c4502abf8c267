//! Clients: who may call the control API and write through the proxy.
//!
//! Without `[[clients]]` the gateway is in development mode: both listeners bind loopback only
//! (checked at start-up) and nobody authenticates. With clients, every control call but
//! `/healthz` and `/readyz`, and every fenced write, carries `Authorization: Bearer <token>`.
//! The configuration keeps only the token's SHA-256; a presented token is hashed and compared
//! with every client's hash in constant time.
//!
//! A lease belongs to the client that acquired it: the store's owner is `<client>/<owner>`, so
//! another client that learns the owner string (every 409 and GET shows the holder) still
//! cannot renew, release or stamp with it. Client names cannot contain `/`, so the prefix is
//! unambiguous.

use std::sync::Arc;

use http::header::{AUTHORIZATION, HeaderMap};
use sha2::{Digest, Sha256};

use crate::problem::{Problem, unauthenticated};

/// One configured client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// The client's name: letters, digits, `.`, `_`, `-`.
    pub name: String,
    /// SHA-256 of the client's bearer token.
    pub token_sha256: [u8; 32],
    /// The lease keys (globs, `*` for any run of characters) it may acquire, renew, release and
    /// write under.
    pub leases: Vec<String>,
    /// Whether it may read leases, fences and `/metrics`.
    pub read: bool,
    /// The prefixes of unbound routes it may write through (a bound route needs its lease).
    pub routes: Vec<String>,
}

impl Client {
    /// Whether this client may use `key`.
    pub fn may_use(&self, key: &str) -> bool {
        self.leases.iter().any(|pattern| glob_match(pattern, key))
    }

    /// The owner string the store keeps for this client's `owner`.
    pub fn store_owner(&self, owner: &str) -> String {
        format!("{}/{owner}", self.name)
    }

    /// Whether this client may write through the unbound route `prefix`.
    pub fn may_write_unbound(&self, prefix: &str) -> bool {
        self.routes.iter().any(|route| route.trim_end_matches('/') == prefix.trim_end_matches('/'))
    }
}

/// Who made a request.
#[derive(Debug, Clone)]
pub enum Caller {
    /// Development mode: no clients are configured, everyone may do everything.
    Anyone,
    /// Not authenticated, and needs not be (the health probes): may do nothing else.
    Nobody,
    /// An authenticated client.
    Client(Arc<Client>),
}

impl Caller {
    /// Whether the caller may use lease `key`.
    pub fn may_use(&self, key: &str) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Nobody => false,
            Caller::Client(client) => client.may_use(key),
        }
    }

    /// Whether the caller may write through the unbound route `prefix`.
    pub fn may_write_unbound(&self, prefix: &str) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Nobody => false,
            Caller::Client(client) => client.may_write_unbound(prefix),
        }
    }

    /// Whether the caller may read leases, fences and metrics.
    pub fn may_read(&self) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Nobody => false,
            Caller::Client(client) => client.read,
        }
    }

    /// The owner string the store keeps for the caller's `owner`.
    pub fn store_owner(&self, owner: &str) -> String {
        match self {
            Caller::Anyone | Caller::Nobody => owner.to_owned(),
            Caller::Client(client) => client.store_owner(owner),
        }
    }

    /// The client's name, for logs.
    pub fn name(&self) -> &str {
        match self {
            Caller::Anyone | Caller::Nobody => "-",
            Caller::Client(client) => &client.name,
        }
    }
}

/// Why a request could not be authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// No `Authorization` header.
    #[error("this gateway requires Authorization: Bearer <token>")]
    Missing,
    /// A header that is not one `Bearer` token.
    #[error("the Authorization header must be one `Bearer <token>`")]
    Malformed,
    /// A token no client has.
    #[error("the bearer token is not one of a configured client")]
    Unknown,
}

impl Unauthenticated {
    /// The 401 answer: says why, never which clients exist.
    pub fn problem(self) -> Problem {
        unauthenticated(&self.to_string())
    }
}

/// The configured clients; empty in development mode.
#[derive(Debug, Clone, Default)]
pub struct Clients {
    clients: Vec<Arc<Client>>,
}

impl Clients {
    /// The clients of the configuration.
    pub fn new(clients: Vec<Client>) -> Clients {
        Clients { clients: clients.into_iter().map(Arc::new).collect() }
    }

    /// Every client's lease-key globs.
    pub fn lease_patterns(&self) -> impl Iterator<Item = &str> {
        self.clients.iter().flat_map(|client| client.leases.iter().map(String::as_str))
    }

    /// Whether clients are configured (else: development mode).
    pub fn enabled(&self) -> bool {
        !self.clients.is_empty()
    }

    /// Who sent a request with these headers.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, Unauthenticated> {
        if !self.enabled() {
            return Ok(Caller::Anyone);
        }
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let value = values.next().ok_or(Unauthenticated::Missing)?;
        if values.next().is_some() {
            return Err(Unauthenticated::Malformed);
        }
        let text = value.to_str().map_err(|_| Unauthenticated::Malformed)?;
        let (scheme, token) = text.split_once(' ').ok_or(Unauthenticated::Malformed)?;
        let token = token.trim_matches(' ');
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(Unauthenticated::Malformed);
        }
        let digest = Sha256::digest(token.as_bytes());
        // Every client is compared, each in constant time: the time taken says nothing about
        // which client (if any) matched, nor how much of a hash did.
        let mut found = None;
        for client in &self.clients {
            if constant_time_eq(digest.as_slice(), &client.token_sha256) {
                found = Some(Arc::clone(client));
            }
        }
        found.map(Caller::Client).ok_or(Unauthenticated::Unknown)
    }
}

/// The SHA-256 of `token`, as the lower-case hex that `token_sha256` holds.
pub fn token_sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Parses 64 hex digits.
pub fn parse_sha256_hex(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0_u8; 32];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let digit = |b: u8| char::from(b).to_digit(16);
        *slot = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
    }
    Some(out)
}

/// Whether `name` is a valid client name.
pub fn valid_client_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// `*` matches any run of characters (also none); every other character matches itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (pattern, text): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn clients() -> Clients {
        Clients::new(vec![
            Client {
                name: "billing".to_owned(),
                token_sha256: parse_sha256_hex(&token_sha256_hex("s3cret")).unwrap_or_default(),
                leases: vec!["billing-*".to_owned()],
                read: true,
                routes: Vec::new(),
            },
            Client {
                name: "other".to_owned(),
                token_sha256: parse_sha256_hex(&token_sha256_hex("other-token")).unwrap_or_default(),
                leases: vec!["exact".to_owned()],
                read: false,
                routes: Vec::new(),
            },
        ])
    }

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(AUTHORIZATION, value);
        }
        headers
    }

    #[test]
    fn the_contract_example_hash_is_the_sha256_of_test() {
        assert_eq!(token_sha256_hex("test"), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        assert!(parse_sha256_hex("9f86").is_none());
        assert!(parse_sha256_hex(&"g".repeat(64)).is_none());
    }

    #[test]
    fn tokens_authenticate_their_client_and_nothing_else() {
        let clients = clients();
        assert!(matches!(clients.authenticate(&with("Bearer s3cret")), Ok(Caller::Client(c)) if c.name == "billing"));
        assert!(
            matches!(clients.authenticate(&with("bearer other-token")), Ok(Caller::Client(c)) if c.name == "other")
        );
        assert_eq!(clients.authenticate(&HeaderMap::new()).err(), Some(Unauthenticated::Missing));
        for bad in ["Bearer", "Bearer ", "Basic s3cret", "s3cret", "Bearer s3cret2", "Bearer S3CRET"] {
            assert!(clients.authenticate(&with(bad)).is_err(), "{bad:?} authenticated");
        }
        let mut twice = with("Bearer s3cret");
        twice.append(AUTHORIZATION, HeaderValue::from_static("Bearer s3cret"));
        assert_eq!(clients.authenticate(&twice).err(), Some(Unauthenticated::Malformed));
        assert!(matches!(Clients::default().authenticate(&HeaderMap::new()), Ok(Caller::Anyone)));
    }

    #[test]
    fn lease_globs_match_whole_keys() {
        for (pattern, key, expected) in [
            ("billing-*", "billing-1", true),
            ("billing-*", "billing-", true),
            ("billing-*", "xbilling-1", false),
            ("billing-*", "billing", false),
            ("*", "anything", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_match(pattern, key), expected, "{pattern:?} vs {key:?}");
        }
    }

    #[test]
    fn store_owners_are_prefixed_with_the_client() {
        let caller = clients().authenticate(&with("Bearer s3cret")).ok();
        assert_eq!(caller.map(|c| c.store_owner("w1")), Some("billing/w1".to_owned()));
        assert!(valid_client_name("billing-2.x_y"));
        assert!(!valid_client_name("a/b"));
        assert!(!valid_client_name(""));
    }
}
