//! Client identities as UUIDv7 (RFC 9562, 5.7), for phase 2's idempotent
//! PUTs (sessions, inputs, visits). Seed 002, "Input admission and
//! outcomes": "Unknown UUIDv7 identities older than seven days return 410
//! identity_expired and cannot execute; identities more than five minutes
//! ahead return 400 identity_future." Known identities are looked up
//! first; [`check_age`] is for the unknown ones.

use super::problem::{Code, Problem};
use crate::limits;

/// A parsed UUIDv7.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Uuid7 {
    bytes: [u8; 16],
}

impl Uuid7 {
    /// Parses the canonical `8-4-4-4-12` hex form (either case) and checks
    /// the version (7) and the variant (RFC 9562, `10` bits).
    pub fn parse(s: &str) -> Result<Uuid7, Problem> {
        let bad = |why: &str| {
            Problem::invalid(format!(
                "{why}: expected a UUIDv7 like 0190b9a0-5f2e-7c3a-8b1d-2e4f6a8c0d1e"
            ))
        };
        let b = s.as_bytes();
        if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
            return Err(bad("not a UUID"));
        }
        let hex: Vec<u8> = b.iter().copied().filter(|&c| c != b'-').collect();
        if hex.len() != 32 {
            return Err(bad("not a UUID"));
        }
        let mut bytes = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).map_err(|_| bad("not a UUID"))?;
            bytes[i] = u8::from_str_radix(text, 16).map_err(|_| bad("not a UUID"))?;
        }
        if bytes[6] >> 4 != 7 {
            return Err(bad("not version 7"));
        }
        if bytes[8] >> 6 != 0b10 {
            return Err(bad("not the RFC 9562 variant"));
        }
        Ok(Uuid7 { bytes })
    }

    /// Milliseconds since the Unix epoch in the first 48 bits.
    pub fn unix_ms(&self) -> i64 {
        self.bytes[..6]
            .iter()
            .fold(0i64, |acc, &b| (acc << 8) | i64::from(b))
    }

    /// The canonical lowercase form, the one key an identity is stored by.
    pub fn canonical(&self) -> String {
        crate::ids::format_uuid(&self.bytes)
    }

    /// Refuses an unknown identity minted too long ago or too far ahead.
    pub fn check_age(&self, now_ms: i64) -> Result<(), Problem> {
        let t = self.unix_ms();
        if t > now_ms + limits::UUID7_MAX_AHEAD_MS {
            return Err(Problem::new(
                Code::IdentityFuture,
                "the identity's timestamp is more than five minutes ahead of the daemon's clock",
            ));
        }
        if t < now_ms - limits::UUID7_MAX_AGE_MS {
            return Err(Problem::new(
                Code::IdentityExpired,
                "the identity is older than seven days and unknown; mint a new one",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(ms: i64) -> String {
        let mut b = [0x11u8; 16];
        b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        b[6] = 0x70 | (b[6] & 0x0f);
        b[8] = 0x80 | (b[8] & 0x3f);
        crate::ids::format_uuid(&b)
    }

    #[test]
    fn parses_and_extracts_the_timestamp() {
        let u = Uuid7::parse("0190B9A0-5F2E-7C3A-8B1D-2E4F6A8C0D1E").unwrap();
        assert_eq!(u.unix_ms(), 0x0190_b9a0_5f2e);
        assert_eq!(u.canonical(), "0190b9a0-5f2e-7c3a-8b1d-2e4f6a8c0d1e");
        let now = 1_750_000_000_000;
        assert_eq!(Uuid7::parse(&make(now)).unwrap().unix_ms(), now);
    }

    #[test]
    fn refuses_other_versions_variants_and_shapes() {
        for bad in [
            "0190b9a0-5f2e-4c3a-8b1d-2e4f6a8c0d1e",     // version 4
            "0190b9a0-5f2e-7c3a-cb1d-2e4f6a8c0d1e",     // variant 110
            "0190b9a05f2e7c3a8b1d2e4f6a8c0d1e",         // no dashes
            "0190b9a0-5f2e-7c3a-8b1d-2e4f6a8c0d1",      // short
            "0190b9a0-5f2e-7c3a-8b1d_2e4f6a8c0d1e",     // wrong separator
            "0190b9a0-5f2e-7c3a-8b1d-2e4f6a8c0d1g",     // not hex
            "0190b9a0-5f2e-7c3a-8b1d-2e4f6a8c0d\u{e9}", // not ASCII
        ] {
            assert_eq!(Uuid7::parse(bad).unwrap_err().status(), 400, "{bad}");
        }
    }

    #[test]
    fn age_bounds() {
        let now = 1_750_000_000_000;
        let at = |ms: i64| Uuid7::parse(&make(ms)).unwrap().check_age(now);
        assert!(at(now).is_ok());
        assert!(at(now + limits::UUID7_MAX_AHEAD_MS).is_ok());
        assert_eq!(
            at(now + limits::UUID7_MAX_AHEAD_MS + 1).unwrap_err().code,
            Code::IdentityFuture
        );
        assert!(at(now - limits::UUID7_MAX_AGE_MS).is_ok());
        let e = at(now - limits::UUID7_MAX_AGE_MS - 1).unwrap_err();
        assert_eq!((e.code, e.status()), (Code::IdentityExpired, 410));
    }
}
