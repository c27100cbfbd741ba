//! Identifiers the daemon mints: session ids `s-` + 12 hex and lane ids `t-` +
//! 12 hex (seed 000, sessions.list and lanes.list patterns), UUIDs for plugin
//! requests (`plugin_<uuid>`), instance ids and secret tokens. All randomness
//! comes from the kernel through getrandom.

/// Fills `buf` from the kernel's CSPRNG. The kernel call cannot fail on Linux
/// after early boot; if it ever does, continuing with predictable ids would be
/// worse than stopping, so this is the one place that aborts.
pub fn random_bytes(buf: &mut [u8]) {
    if let Err(e) = getrandom::fill(buf) {
        eprintln!("omniconfluxd: the kernel's random source failed: {e}");
        std::process::abort();
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// `prefix` followed by 12 random lowercase hex digits (48 bits).
pub fn prefixed_id(prefix: &str) -> String {
    let mut b = [0u8; 6];
    random_bytes(&mut b);
    format!("{prefix}{}", hex(&b))
}

/// Whether `s` is `prefix` followed by 12 lowercase hex digits: the form
/// [`prefixed_id`] mints.
pub fn is_prefixed_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|h| {
        h.len() == 12
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A random (version 4) UUID in its canonical lowercase form.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    random_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    format_uuid(&b)
}

/// Formats 16 bytes as `8-4-4-4-12` lowercase hex.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h = hex(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A secret of `n` random bytes as hex, for bearer tokens.
pub fn secret_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    random_bytes(&mut b);
    hex(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_their_patterns() {
        let s = prefixed_id("s-");
        assert_eq!(s.len(), 14);
        assert!(
            s[2..]
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(prefixed_id("t-"), prefixed_id("t-"));
        assert!(is_prefixed_id(&s, "s-") && !is_prefixed_id(&s, "t-"));
        assert!(
            !is_prefixed_id("s-4F9A1C2B7D3E", "s-")
                && !is_prefixed_id("s-4f9a1c2b7d3", "s-")
                && !is_prefixed_id("x-s1", "s-")
        );
    }
}
