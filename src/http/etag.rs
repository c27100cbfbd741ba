//! Validators (seed 002, "Revisions and errors"): "An ETag validates the
//! complete selected JSON representation. [...] PATCH and conditional
//! DELETE require the observed If-Match. Missing preconditions return 428;
//! stale ones return 412. [...] Validators are opaque."
//!
//! A representation's ETag is a strong validator derived from its exact
//! bytes (SHA-256, 128 bits shown), so equal bytes have equal tags and no
//! revision counter leaks. GETs honour `If-None-Match` with 304.

use super::problem::{Code, Problem};

/// The strong ETag of a representation's bytes, quotes included.
pub fn of(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    format!("\"{}\"", crate::ids::hex(&d.as_ref()[..16]))
}

fn tags(header: &str) -> impl Iterator<Item = &str> {
    header.split(',').map(str::trim).filter(|t| !t.is_empty())
}

/// `If-None-Match` (weak comparison, RFC 9110 13.1.2): whether the client
/// already holds `etag`, so that a GET answers 304.
pub fn none_match_hits(if_none_match: Option<&str>, etag: &str) -> bool {
    let Some(h) = if_none_match else { return false };
    let bare = etag.trim_start_matches("W/");
    tags(h).any(|t| t == "*" || t.trim_start_matches("W/") == bare)
}

/// `If-Match` on a change (strong comparison, RFC 9110 13.1.1): 428 when
/// missing, 412 when it names anything but the current representation.
pub fn require_match(if_match: Option<&str>, current: &str) -> Result<(), Problem> {
    let Some(h) = if_match else {
        return Err(Problem::new(
            Code::PreconditionRequired,
            "this change requires If-Match with the representation's ETag",
        ));
    };
    if tags(h).any(|t| t == "*" || (!t.starts_with("W/") && t == current)) {
        Ok(())
    } else {
        Err(Problem::new(
            Code::PreconditionFailed,
            "the representation changed since it was read; read it again",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_follow_bytes() {
        let a = of(b"{\"a\":1}");
        assert_eq!(a.len(), 34);
        assert_eq!(a, of(b"{\"a\":1}"));
        assert_ne!(a, of(b"{\"a\":2}"));
    }

    #[test]
    fn if_none_match_is_weak() {
        let t = of(b"x");
        assert!(none_match_hits(Some(&format!("\"zz\", W/{t}")), &t));
        assert!(none_match_hits(Some("*"), &t));
        assert!(!none_match_hits(Some("\"zz\""), &t));
        assert!(!none_match_hits(None, &t));
    }

    #[test]
    fn if_match_is_required_and_strong() {
        let t = of(b"x");
        assert_eq!(require_match(None, &t).unwrap_err().status(), 428);
        assert_eq!(
            require_match(Some("\"old\""), &t).unwrap_err().status(),
            412
        );
        assert_eq!(
            require_match(Some(&format!("W/{t}")), &t)
                .unwrap_err()
                .status(),
            412
        );
        assert!(require_match(Some(&t), &t).is_ok());
        assert!(require_match(Some(&format!("\"old\", {t}")), &t).is_ok());
    }
}
