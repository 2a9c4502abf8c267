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
    if name.ends_with('.') {
        // Windows, NTFS and IIS drop trailing dots: `job.` would be `job` to them.
        return Err(format!("a resource name does not end with a dot, got {name:?}"));
    }
    Ok(())
}

/// A route's prefix: `/` and `A-Z a-z 0-9 . _ ~ -` only, as a plain path. So no percent-encoding
/// or sub-delimiter in a request's path (which [`check_path`] lets through where a name could
/// not hold them) can spell another route's prefix.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'~' | b'-');
    if !prefix.bytes().all(allowed) {
        return Err(format!("a route prefix is made of / and A-Z a-z 0-9 . _ ~ - only, got {prefix:?}"));
    }
    check_path(prefix)?;
    if prefix.split('/').any(|segment| segment.ends_with('.')) {
        return Err(format!("a route prefix has no segment ending with a dot, got {prefix:?}"));
    }
    Ok(())
}

/// A header a route reads resources from: `a-z 0-9 -` (any case), and `Fencing-Resource` or
/// one the gateway does not set, strip or read for itself.
pub fn check_resource_header(name: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    if lower == "fencing-resource" {
        return Ok(());
    }
    if lower.is_empty() || !lower.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err(format!("a resource header's name is made of a-z 0-9 - only, got {name:?}"));
    }
    let owned = ["host", "content-length", "transfer-encoding", "authorization", "connection", "te", "upgrade"];
    let owned = owned.contains(&lower.as_str())
        || ["expect", "x-request-id", "forwarded", "proxy"].contains(&lower.as_str())
        || ["fencing-", "x-forwarded", "proxy-"].iter().any(|prefix| lower.starts_with(prefix));
    if owned {
        return Err(format!("{name:?} is a header the gateway sets, strips or reads itself"));
    }
    Ok(())
}

/// How an upstream that ignores case, folds letters with diacritics or lookalikes to ASCII
/// (Windows' best-fit conversions) and drops trailing dots (Windows, IIS) may read `path`: the
/// path decoded, each character lower-cased or folded to its ASCII letters (others kept), each
/// segment's trailing dots and spaces dropped. `None` when that is `path` itself (the common
/// case, decided without allocating).
pub fn folded(path: &str) -> Option<String> {
    let plain = path.bytes().all(|b| b != b'%' && !b.is_ascii_uppercase() && b.is_ascii())
        && !path.split('/').any(|segment| segment.ends_with('.'));
    if plain {
        return None;
    }
    use unicode_normalization::UnicodeNormalization;
    let decoded = decode(path).unwrap_or_default();
    let decoded = String::from_utf8_lossy(&decoded);
    let mut folded = String::with_capacity(decoded.len());
    for c in decoded.chars() {
        if c.is_ascii() {
            folded.push(c.to_ascii_lowercase());
        } else if let Some(ascii) = best_fit(c) {
            folded.push(ascii);
        } else {
            let ascii: String = std::iter::once(c).nfkd().filter(char::is_ascii).collect();
            if ascii.is_empty() {
                folded.push(c);
            } else {
                folded.push_str(&ascii.to_ascii_lowercase());
            }
        }
    }
    let folded = folded.split('/').map(|segment| segment.trim_end_matches(['.', ' '])).collect::<Vec<_>>().join("/");
    Some(folded)
}

/// Windows' best-fit conversions (from the published WorstFit tables) of characters that NFKC
/// leaves alone into the ASCII a path is structured by: yen and won signs and the set minus into
/// `\`, division and fraction slashes into `/`, middle dots and bullets into `.`, the Arabic
/// percent sign and per mille into `%`, ratio and Armenian full stop into `:`, small tilde into
/// `~` (an 8.3 short name's).
fn best_fit(c: char) -> Option<char> {
    Some(match c {
        '\u{00A5}' | '\u{20A9}' | '\u{2216}' => '\\',
        '\u{2215}' | '\u{2044}' => '/',
        '\u{00B7}' | '\u{2219}' | '\u{22C5}' | '\u{2022}' => '.',
        '\u{066A}' | '\u{2030}' => '%',
        '\u{0589}' | '\u{2236}' => ':',
        '\u{02DC}' => '~',
        _ => return None,
    })
}

/// Whether `c`, not ASCII, could turn into ASCII on its way to an upstream: its compatibility
/// form (NFKC) differs and holds ASCII (fullwidth letters, digits and punctuation, `…`, `º`,
/// ligatures), or Windows' best-fit conversion makes it ASCII punctuation.
fn lookalike(c: char) -> bool {
    use unicode_normalization::UnicodeNormalization;
    best_fit(c).is_some()
        || (std::iter::once(c).nfkc().any(|d| d.is_ascii()) && !std::iter::once(c).nfkc().eq(std::iter::once(c)))
}

/// `path` with each percent-encoding decoded once; `None` when one is malformed (not two hex
/// digits) or spelled with lower-case hex digits.
fn decode(path: &str) -> Option<Vec<u8>> {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        if byte != b'%' {
            decoded.push(byte);
            index += 1;
            continue;
        }
        let pair = bytes.get(index + 1..index + 3)?;
        if !pair.iter().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b)) {
            return None;
        }
        decoded.push(u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?);
        index += 3;
    }
    Some(decoded)
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
/// - raw, it may hold only `pchar`s (RFC 3986), `/` and `%`, and no `;` (a parameter) and no
///   `+` (a space to Java's `URLDecoder` and PHP's `urldecode`: send `%2B`): a backslash, a
///   space, `"`, `<`, `>`, `^`, `` ` ``, `{`, `|`, `}`, `[`, `]` or a byte outside ASCII must be
///   percent-encoded;
/// - no dot segment and no empty segment (a trailing slash aside);
/// - a percent-encoding has two upper-case hex digits (`%3F`, never `%3f`) and encodes a
///   character that needs it: never an unreserved character (`%2D`, `%41`, `%2E`), `/`, `\`,
///   `;`, `?` or `#` (an upstream that decodes before it splits the path reads a parameter, a
///   query or a fragment), nor a control character (`%00`); the sub-delimiters, `:` and `@`
///   may be sent either way (as `encodeURIComponent` and its kin send them), since no route
///   prefix or resource name can hold them;
/// - decoded once, it must be UTF-8 (no overlong dot, `%C0%AE`), hold no control character (C1
///   included) and no invisible format character (bidi controls, zero-width characters, the
///   BOM; a zero-width joiner or non-joiner only between two characters outside ASCII, where
///   Persian words and emoji sequences need them), be in Unicode's composed form (NFC), hold no
///   character that compatibility normalisation (NFKC) or Windows' best-fit conversion turns
///   into ASCII (a fullwidth dot or slash, `…`, `¥`, `∕`), and no second percent-encoding
///   (`%252E`, IIS's `%u002e`), which an upstream that decodes twice reads.
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
    if path.contains('+') {
        return refuse("has a +, which some upstreams read as a space (send %2B)");
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
    for encoding in path.split('%').skip(1) {
        let pair = encoding.as_bytes().get(..2).unwrap_or_default();
        if pair.len() < 2 || !pair.iter().all(u8::is_ascii_hexdigit) {
            return refuse("has a malformed percent-encoding");
        }
        if pair.iter().any(u8::is_ascii_lowercase) {
            return refuse("spells a percent-encoding with lower-case hex digits (%3F, not %3f)");
        }
        let encoded = u8::from_str_radix(encoding.get(..2).unwrap_or_default(), 16).unwrap_or_default();
        let unreserved = encoded.is_ascii_alphanumeric() || matches!(encoded, b'-' | b'.' | b'_' | b'~');
        if unreserved || matches!(encoded, b'/' | b'\\' | b';' | b'?' | b'#') {
            return refuse("percent-encodes a character that needs no encoding, or / \\ ; ? #");
        }
        if encoded.is_ascii_control() {
            return refuse("percent-encodes a control character (NUL included)");
        }
    }
    let Some(Ok(decoded)) = decode(path).map(String::from_utf8) else {
        return refuse("decodes to bytes that are not UTF-8 (an overlong or partial sequence)");
    };
    // ASCII decoded holds no control character (refused above) and nothing to normalise.
    if !decoded.is_ascii() {
        let chars: Vec<char> = decoded.chars().collect();
        let visible_non_ascii = |c: Option<&char>| c.is_some_and(|c| !c.is_ascii() && !invisible(*c));
        for (index, &c) in chars.iter().enumerate() {
            let joiner = matches!(c, '\u{200C}' | '\u{200D}')
                && visible_non_ascii(index.checked_sub(1).and_then(|before| chars.get(before)))
                && visible_non_ascii(chars.get(index + 1));
            if c.is_control() || (invisible(c) && !joiner) {
                return refuse("decodes to a control or invisible format character");
            }
        }
        if !unicode_normalization::is_nfc(&decoded) {
            return refuse("decodes to text not in Unicode's composed form (NFC)");
        }
        if chars.iter().any(|&c| !c.is_ascii() && lookalike(c)) {
            return refuse(
                "decodes to a character that compatibility normalisation (NFKC) or Windows' best-fit conversion \
                 turns into ASCII (a fullwidth dot or slash, \u{2026}, \u{a5})",
            );
        }
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
    use crate::names::{check_path, check_prefix, check_resource_header, check_resource_name, folded};

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
            "/%E2%82%AC",
            "/a:c@d!$&'()*,=",
            "/%22%3C%3E%5E%60%7B%7C%7D%5B%5D",
            "/%E6%97%A5%E6%9C%AC",
            // What encodeURIComponent, quote(safe='') and URLEncoder send for @ : + , $ & = ' ( ) * !
            "/users/alice%40example.com",
            "/v1/jobs/j%3Arun",
            "/tel/%2B15551234",
            "/a%2Cb%24%26%3D%27%28%29%2A%21",
            // Ordinary text that NFC keeps and no conversion turns into ASCII.
            "/%C2%B5m",
            "/%EF%BD%B1",
            // A Persian word with a zero-width non-joiner, an emoji sequence with a joiner.
            "/%D9%85%DB%8C%E2%80%8C%D8%AE%D9%88%D8%A7%D9%87%D9%85",
            "/%F0%9F%91%A8%E2%80%8D%F0%9F%91%A9",
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
            "/a%5Cb",
            "/a%3Bb",
            "/q%3Fx",
            "/a%23b",
            "/acct%2D7",
            "/a%41",
            "/a%2E",
            "/a%7E",
            "/a%5F",
            "/a%zz",
            "/a%2",
            "/a%+F",
            "/a%3f",
            "/caf%c3%a9",
            "/a%00b",
            "/a%0Ab",
            "/a%7F",
            "/a%C0%AE",
            "/a%E0%80%AE",
            "/a%ED%A0%80",
            "/a%FF",
            "/caf%E9",
            "/a%252E",
            "/a%252F",
            "/a%2541",
            "/50%25ABoff",
            "/caf\u{e9}",
            "/a b",
            "/a\tb",
            "/a+b",
            "/tel/+15551234",
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
            // Joiners between ASCII letters, or at an end.
            "/le%E2%80%8Ddger",
            "/%E2%80%8C%D9%85",
            "/%D9%85%E2%80%8C",
            "/%EF%BC%8E%EF%BC%8E/x",
            "/%EF%BC%8F",
            "/%C2%A0",
            "/%E2%80%A6",
            "/1%C2%BA",
            "/%EF%BC%91",
            "/%EF%AC%81le",
            // Best-fit: yen, won, division and fraction slashes, a bullet, Arabic percent.
            "/seg/job-7/..%C2%A5job-8",
            "/..%E2%82%A9x",
            "/..%E2%88%95..%E2%88%95x",
            "/..%E2%81%84x",
            "/a%E2%80%A2",
            "/a%D9%AA",
            // NFD: send the composed form.
            "/cafe%CC%81",
            "/%EF%A4%80",
            "/%25u002e%25u002e/x",
            "/%25U002F",
        ] {
            check_spelling(other, false);
        }
    }

    #[test]
    fn names_prefixes_and_resource_headers_have_one_spelling() {
        for name in ["job-7", "a.b", "A_b~1"] {
            assert!(check_resource_name(name).is_ok(), "{name:?}");
        }
        for name in ["", ".", "..", "job.", "job..", "a/b", "a%41", "caf\u{e9}", "a b"] {
            assert!(check_resource_name(name).is_err(), "{name:?}");
        }
        for prefix in ["/", "/ledger", "/v1/Ledger_2", "/a.b/c"] {
            assert!(check_prefix(prefix).is_ok(), "{prefix:?}");
        }
        for prefix in ["/a%20b", "/a@b", "/a:b", "/a+b", "/ledger./x", "/a/./b", "/a;b"] {
            assert!(check_prefix(prefix).is_err(), "{prefix:?}");
        }
        for header in ["X-Job", "job-id", "x-resource", "Fencing-Resource"] {
            assert!(check_resource_header(header).is_ok(), "{header:?}");
        }
        for header in ["X_Job", "X.Job", "Host", "Fencing-Token", "fencing-x", "X-Forwarded-For", "Content-Length", ""]
        {
            assert!(check_resource_header(header).is_err(), "{header:?}");
        }
    }

    #[test]
    fn a_path_folds_as_upstreams_that_ignore_case_and_diacritics_read_it() {
        assert_eq!(folded("/ledger/acct-7"), None);
        assert_eq!(folded("/LEDGER/x").as_deref(), Some("/ledger/x"));
        assert_eq!(folded("/ledger./x").as_deref(), Some("/ledger/x"));
        assert_eq!(folded("/l%C4%95dger/x").as_deref(), Some("/ledger/x"));
        assert_eq!(folded("/Caf%C3%A9").as_deref(), Some("/cafe"));
    }
}
