//! Wall-clock time in the one form the daemon writes everywhere:
//! `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, milliseconds), as the plugin API page
//! (seed 000, "createdAt") and the ledger's `ts` column require. It holds
//! the daemon's one civil-calendar conversion: the HTTP `Date` field
//! (`http::wire::http_date`) is built on [`civil_from_days`] too.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        // A clock before 1970 is a broken machine; clamp rather than panic.
        Err(_) => 0,
    }
}

/// The current time in the daemon's form.
pub fn now_ts() -> String {
    format_ts(now_ms())
}

/// Formats milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_ts(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

/// Parses the daemon's form back to milliseconds; `None` for anything else.
pub fn parse_ts(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 24
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'.'
        || b[23] != b'Z'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 59 {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    Some(((days * 86_400 + h * 3600 + mi * 60 + se) * 1000) + ms)
}

// Howard Hinnant's civil calendar algorithms (public domain), proleptic Gregorian.

/// The (year, month 1-12, day 1-31) of a count of days since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_ts(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ts(1_763_112_667_412), "2025-11-14T09:31:07.412Z");
        assert_eq!(format_ts(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn parse_round_trips_and_refuses_other_forms() {
        for ms in [0, 1_763_112_667_412, 951_782_400_000, 4_102_444_799_999] {
            assert_eq!(parse_ts(&format_ts(ms)), Some(ms));
        }
        assert_eq!(parse_ts("2025-11-14T09:31:07Z"), None);
        assert_eq!(parse_ts("2025-13-14T09:31:07.412Z"), None);
        assert_eq!(parse_ts("2025-11-14T09:31:07.41xZ"), None);
    }
}
