//! Lists (seed 002, "Encoding, limits, and pagination"): `{ "items": [],
//! "next": null }`. "next is an opaque continuation token tied to the query
//! and representation, including limit. Follow-up requests retain the
//! original query and add next. Default limit is 50; maximum is 200. Each
//! page also respects its encoded byte limit [...]. Tokens never contain
//! credentials and cannot authorize access. A token for another query
//! returns 400."
//!
//! A token is `p1.<hex position>.<binding>`: the position is whatever the
//! route resumes after (a seq, a sort key and id), hex so that it survives
//! any URL; the binding is the first 64 bits of SHA-256 over the route, the
//! query without `next`, and the position, so a token used with another
//! query, another limit or an edited position is refused. The token is not
//! a secret and grants nothing: it only says where to resume.

use serde_json::Value;

use super::problem::Problem;
use crate::limits;

/// The `limit` parameter: default 50, 1 to 200.
pub fn limit(raw: Option<&str>) -> Result<usize, Problem> {
    match raw {
        None => Ok(limits::HTTP_PAGE_DEFAULT),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=limits::HTTP_PAGE_MAX).contains(&n) && !s.starts_with('+') => Ok(n),
            _ => Err(Problem::invalid(format!(
                "limit must be a whole number from 1 to {}",
                limits::HTTP_PAGE_MAX
            ))),
        },
    }
}

fn binding(route: &str, query: &[(String, String)], position: &str) -> String {
    let mut sorted: Vec<&(String, String)> = query.iter().filter(|(k, _)| k != "next").collect();
    sorted.sort();
    let mut text = String::from(route);
    for (k, v) in sorted {
        // Lengths first, so that no two queries share a text.
        text.push_str(&format!("\n{}:{k}={}:{v}", k.len(), v.len()));
    }
    text.push_str(&format!("\n@{position}"));
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    crate::ids::hex(&d.as_ref()[..8])
}

/// The token that resumes `route` with `query` after `position`.
pub fn token(route: &str, query: &[(String, String)], position: &str) -> String {
    format!(
        "p1.{}.{}",
        crate::ids::hex(position.as_bytes()),
        binding(route, query, position)
    )
}

/// The position inside a `next` token given with `query`; 400 when the
/// token is malformed or belongs to another query.
pub fn resume(route: &str, query: &[(String, String)], next: &str) -> Result<String, Problem> {
    let bad = || {
        Problem::invalid(
            "next is not a continuation of this query; repeat the original query without next",
        )
    };
    let mut parts = next.split('.');
    let (Some("p1"), Some(hex), Some(bind), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    if hex.len() % 2 != 0 || hex.len() > 512 {
        return Err(bad());
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    let position = String::from_utf8(bytes.ok_or_else(bad)?).map_err(|_| bad())?;
    if binding(route, query, &position) != bind {
        return Err(bad());
    }
    Ok(position)
}

/// Takes items while they fit the page's byte bound; returns the encoded
/// items and whether every given item was taken. The first item is always
/// taken: callers keep single items under the bound.
pub fn fit(items: impl IntoIterator<Item = Value>) -> (Vec<Value>, bool) {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let n = serde_json::to_vec(&item).map(|v| v.len()).unwrap_or(0) + 1;
        if !out.is_empty() && bytes + n > limits::HTTP_PAGE_MAX_BYTES {
            return (out, false);
        }
        bytes += n;
        out.push(item);
    }
    (out, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn limits_are_checked() {
        assert_eq!(limit(None).unwrap(), 50);
        assert_eq!(limit(Some("200")).unwrap(), 200);
        for bad in ["0", "201", "-1", "+5", "x", ""] {
            assert!(limit(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_are_tied_to_their_query() {
        let query = q(&[("stream", "x-a"), ("limit", "2")]);
        let t = token("/events", &query, "42");
        let mut with_next = query.clone();
        with_next.push(("next".into(), t.clone()));
        assert_eq!(resume("/events", &with_next, &t).unwrap(), "42");
        // Parameter order does not matter; content does.
        assert_eq!(
            resume("/events", &q(&[("limit", "2"), ("stream", "x-a")]), &t).unwrap(),
            "42"
        );
        assert!(resume("/events", &q(&[("stream", "x-b"), ("limit", "2")]), &t).is_err());
        assert!(resume("/events", &q(&[("stream", "x-a"), ("limit", "3")]), &t).is_err());
        assert!(resume("/storage", &query, &t).is_err());
        let forged = t.replace(&crate::ids::hex(b"42"), &crate::ids::hex(b"1"));
        assert!(resume("/events", &query, &forged).is_err());
        for junk in ["", "p1", "p1.zz.00", "p2.34.00", "p1.3.00"] {
            assert!(resume("/events", &query, junk).is_err(), "{junk}");
        }
    }

    #[test]
    fn pages_stop_at_their_byte_bound() {
        let big = "x".repeat(limits::HTTP_PAGE_MAX_BYTES / 3);
        let (items, all) = fit((0..5).map(|i| json!({"i": i, "s": big})));
        assert_eq!(items.len(), 2);
        assert!(!all);
        let (items, all) = fit((0..5).map(|i| json!({"i": i})));
        assert_eq!(items.len(), 5);
        assert!(all);
    }
}
