//! The `Host` header, checked the same way on both listeners (RFC 9112; DNS rebinding).

use http::StatusCode;
use http::header::{HOST, HeaderMap};

use crate::problem::Problem;

/// RFC 9112: an HTTP/1.1 request without `Host`, or any request with more than one or with
/// one that is not a valid authority, gets 400. When `allowed` names hosts, `Host` (without its
/// port) must be one of them, else 421: a page on another site that reaches this gateway
/// through DNS rebinding carries its own name.
pub fn check_host(headers: &HeaderMap, version: http::Version, allowed: &[String]) -> Result<(), Problem> {
    let bad = |detail: &str| Problem::new(StatusCode::BAD_REQUEST, "bad-host", "Bad Host header", detail);
    let mut values = headers.get_all(HOST).iter();
    let value = match (values.next(), values.next()) {
        (None, _) if version >= http::Version::HTTP_11 => return Err(bad("an HTTP/1.1 request needs one Host header")),
        (None, _) if allowed.is_empty() => return Ok(()),
        (None, _) => return Err(bad("this gateway needs a Host header")),
        (Some(_), Some(_)) => return Err(bad("more than one Host header")),
        (Some(value), None) => value,
    };
    let authority = value
        .to_str()
        .ok()
        .and_then(|text| text.parse::<http::uri::Authority>().ok())
        .filter(|authority| !authority.as_str().contains('@'))
        .ok_or_else(|| bad("the Host header is not a host and optional port"))?;
    // The host, then nothing or `:` and a port of 1 to 65535 (or empty, as RFC 3986 allows): the
    // Host goes into `Forwarded` and is matched against the configured names, so nothing may
    // follow the host that a name check would not see (`[::1].evil.example`), and an upstream
    // must not be told of a port that cannot exist.
    let port_ok = |port: &str| {
        port.is_empty()
            || (port.len() <= 5
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok_and(|p| p >= 1))
    };
    match authority.as_str().get(authority.host().len()..) {
        Some("") => {}
        Some(rest) if rest.strip_prefix(':').is_some_and(port_ok) => {}
        _ => return Err(bad("the Host header is not a host and an optional port in 1..65535")),
    }
    if allowed.is_empty() || allowed.iter().any(|name| authority.host().eq_ignore_ascii_case(name)) {
        return Ok(());
    }
    Err(Problem::new(
        StatusCode::MISDIRECTED_REQUEST,
        "misdirected-host",
        "Host not served here",
        "the Host header names a host this gateway is not configured to serve",
    ))
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use http::header::{HOST, HeaderMap};

    use crate::problem::Problem;
    use crate::security::host::check_host;

    #[test]
    fn host_must_be_one_valid_authority_and_a_configured_name_when_names_are_set() {
        let headers = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                if let Ok(value) = HeaderValue::from_str(value) {
                    headers.append(HOST, value);
                }
            }
            headers
        };
        let v11 = http::Version::HTTP_11;
        let names = vec!["gw.internal".to_owned()];
        assert!(check_host(&headers(&["127.0.0.1:8080"]), v11, &[]).is_ok());
        assert!(check_host(&headers(&["GW.internal:8080"]), v11, &names).is_ok());
        assert!(check_host(&headers(&["gw.internal"]), v11, &names).is_ok());
        assert!(check_host(&headers(&[]), http::Version::HTTP_10, &[]).is_ok());
        let status = |result: Result<(), Problem>| result.err().map(|p| p.into_response().status().as_u16());
        assert_eq!(status(check_host(&headers(&[]), v11, &[])), Some(400));
        assert_eq!(status(check_host(&headers(&["a", "b"]), v11, &[])), Some(400));
        assert_eq!(status(check_host(&headers(&["evil\\"]), v11, &[])), Some(400));
        assert_eq!(status(check_host(&headers(&["user@gw.internal"]), v11, &names)), Some(400));
        assert_eq!(status(check_host(&headers(&["evil.example"]), v11, &names)), Some(421));
        for port in ["0", "65536", "99999", "1000000", "-1"] {
            assert_eq!(status(check_host(&headers(&[&format!("127.0.0.1:{port}")]), v11, &[])), Some(400), "{port:?}");
        }
        assert_eq!(status(check_host(&headers(&["[::1]:70000"]), v11, &[])), Some(400));
        assert!(check_host(&headers(&["[::1]:65535"]), v11, &[]).is_ok());
        assert!(check_host(&headers(&["[::1]"]), v11, &[]).is_ok());
        assert!(check_host(&headers(&["localhost:1"]), v11, &[]).is_ok());
        assert!(check_host(&headers(&["localhost:"]), v11, &[]).is_ok(), "an empty port is allowed (RFC 3986)");
        for junk in ["[::1].evil.example:0", "[::1]x:99999", "[::1]evil", "[::1]:80:80"] {
            assert_eq!(status(check_host(&headers(&[junk]), v11, &names)), Some(400), "{junk}");
        }
        assert_eq!(status(check_host(&headers(&["gw.internal.evil.example"]), v11, &names)), Some(421));
    }
}
