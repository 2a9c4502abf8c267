//! S8's rules of spelling, which the configuration and the proxy both apply: a resource name
//! and a path each have exactly one spelling. Anything an upstream could read another way is
//! refused, never normalised.

/// The one character set of resource names, from a path segment, a header or the
/// configuration: `A-Z a-z 0-9 . _ ~ -`, 1 to 256 of them, not `.` or `..`. So a name has one
/// spelling: nothing in it can be percent-encoded, split, or read as a list.
pub fn check_resource_name(name: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-');
    if name.is_empty() || name.len() > 256 {
        return Err(format!("a resource name must be 1 to 256 characters, got {}", name.len()));
    }
    if name == "." || name == ".." || !name.bytes().all(allowed) {
        return Err(format!("a resource name is made of A-Z a-z 0-9 . _ ~ - only (and is not . or ..), got {name:?}"));
    }
    Ok(())
}

/// Whether `byte` may stand unencoded in a path segment (RFC 3986 `pchar`): an unreserved
/// character, a sub-delimiter, `:` or `@`.
fn pchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(byte, b'-' | b'.' | b'_' | b'~')
        || matches!(byte, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
        || matches!(byte, b':' | b'@')
}

/// Unicode format characters (category Cf: bidi controls, zero-width characters, the BOM, tags)
/// and the line and paragraph separators: invisible in a name, ignored or acted on by some
/// upstreams.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// S8: one spelling per path. A path is refused when an upstream could read it as another:
/// - raw, it may hold only `pchar`s (RFC 3986), `/` and `%`, and no `;` (a parameter): a
///   backslash, a space, `"`, `<`, `>`, `^`, `` ` ``, `{`, `|`, `}`, `[`, `]` or a byte outside
///   ASCII must be percent-encoded;
/// - no dot segment and no empty segment (a trailing slash aside);
/// - a percent-encoding must encode a character that needs it: never a `pchar` (`%2D`, `%3A`,
///   `%2B`), `/` or `\`, nor a control character (`%00`);
/// - decoded once, it must be UTF-8 (no overlong dot, `%c0%ae`), hold no control character (C1
///   included), no invisible format character (bidi controls, zero-width characters, the BOM),
///   nothing that Unicode compatibility normalisation (NFKC) would change (a fullwidth dot or
///   slash, which best-fit conversions and NFKC turn into `.` and `/`), and no second
///   percent-encoding (`%252e`, IIS's `%u002e`), which an upstream that decodes twice reads.
pub fn check_path(path: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("the path {path:?} {why}; send it in its one plain spelling"));
    if !path.starts_with('/') {
        return refuse("does not start with /");
    }
    if path.contains(';') {
        return refuse("has ; parameters");
    }
    if path.contains('\\') {
        return refuse("has a backslash");
    }
    if !path.bytes().all(|b| pchar(b) || b == b'/' || b == b'%') {
        return refuse(
            "has a character that must be percent-encoded (a space, a quote, <>^`{|}[] or a byte outside ASCII)",
        );
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    for (index, segment) in segments.iter().enumerate() {
        if segment.is_empty() && index + 1 < segments.len() {
            return refuse("has an empty segment");
        }
        if *segment == "." || *segment == ".." {
            return refuse("has a dot segment");
        }
    }
    if !path.contains('%') {
        return Ok(());
    }
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        if byte != b'%' {
            decoded.push(byte);
            index += 1;
            continue;
        }
        let hex = bytes.get(index + 1..index + 3).and_then(|pair| std::str::from_utf8(pair).ok());
        let Some(value) = hex.and_then(|pair| u8::from_str_radix(pair, 16).ok()) else {
            return refuse("has a malformed percent-encoding");
        };
        if pchar(value) || matches!(value, b'/' | b'\\') {
            return refuse("percent-encodes a character that needs no encoding (or / or \\)");
        }
        if value.is_ascii_control() {
            return refuse("percent-encodes a control character (NUL included)");
        }
        decoded.push(value);
        index += 3;
    }
    let Ok(decoded) = String::from_utf8(decoded) else {
        return refuse("decodes to bytes that are not UTF-8 (an overlong or partial sequence)");
    };
    if decoded.chars().any(|c| c.is_control() || invisible(c)) {
        return refuse("decodes to a control or invisible format character");
    }
    if !decoded.is_ascii() && !unicode_normalization::is_nfkc(&decoded) {
        return refuse("decodes to a character that compatibility normalisation (NFKC) turns into another");
    }
    let twice = decoded.as_bytes();
    let hex = |digits: &[u8]| digits.iter().all(u8::is_ascii_hexdigit);
    let reencoded = twice.windows(3).any(|w| w[0] == b'%' && hex(&w[1..]))
        || twice.windows(6).any(|w| w[0] == b'%' && matches!(w[1], b'u' | b'U') && hex(&w[2..]));
    if reencoded {
        return refuse("decodes to another percent-encoding (an upstream that decodes twice reads another path)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::names::check_path;

    fn check_spelling(path: &str, accepted: bool) {
        match (check_path(path), accepted) {
            (Ok(()), true) | (Err(_), false) => {}
            (other, _) => panic!("{path:?}: got {other:?}, expected accepted = {accepted}"),
        }
    }

    #[test]
    fn a_path_has_one_spelling_decoded_once_or_twice() {
        for plain in [
            "/",
            "/ledger/acct-7/e",
            "/ledger/acct-7/",
            "/a%20b",
            "/caf%C3%A9",
            "/100%25",
            "/q%3Fx",
            "/%E2%82%AC",
            "/a+b:c@d!$&'()*,=",
            "/%22%3C%3E%5E%60%7B%7C%7D%5B%5D",
            "/%E6%97%A5%E6%9C%AC",
        ] {
            check_spelling(plain, true);
        }
        for other in [
            "ledger",
            "/a/../b",
            "/a/./b",
            "/a//b",
            "/a;b",
            "/a\\b",
            "/a%2Fb",
            "/a%5cb",
            "/a%3Bb",
            "/acct%2D7",
            "/a%zz",
            "/a%2",
            "/a%00b",
            "/a%0Ab",
            "/a%7F",
            "/a%C0%AE",
            "/a%E0%80%AE",
            "/a%ED%A0%80",
            "/a%FF",
            "/caf%E9",
            "/a%252e",
            "/a%252F",
            "/a%2541",
            "/caf\u{e9}",
            "/a b",
            "/a\tb",
            "/a%2Bb",
            "/a%3A",
            "/a%40",
            "/a%21",
            "/a%2C",
            "/a%3D",
            "/a\"b",
            "/a|b",
            "/a^b",
            "/a[b]",
            "/a{b}",
            "/a`b",
            "/%C2%85",
            "/%E2%80%AE",
            "/%EF%BB%BF",
            "/%E2%80%8B",
            "/%EF%BC%8E%EF%BC%8E/x",
            "/%EF%BC%8F",
            "/%C2%A0",
            "/%25u002e%25u002e/x",
            "/%25U002F",
        ] {
            check_spelling(other, false);
        }
    }
}
