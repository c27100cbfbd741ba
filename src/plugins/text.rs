//! Character classes and the cleaning of plugin text (seed 000).
//!
//! The page forbids, in paths, task text and cleaned command text, the Unicode
//! categories Cc, Cf, Cs, Zl and Zp ("no control or invisible formatting
//! character"), and says that text a plugin sends is cleaned before a client
//! sees it: failure messages (cut to 500 characters, "The four message
//! shapes", Failure), command text ("control characters other than line feed
//! and tab are removed, invisible formatting characters are shown as marks,
//! and the result is cut to 16384 bytes", command.run) and the error-output
//! tail ("cleaned like every text of a plugin, and of that the last 4096
//! bytes, starting at a character boundary", plugin.get).
//!
//! Decisions where the page is silent:
//! - The mark for an invisible formatting character is `<U+XXXX>` (its code
//!   point in uppercase hex, at least four digits): plain ASCII, so it is
//!   itself neither invisible nor a control, and it tells the reader which
//!   character was there.
//! - Line and paragraph separators (Zl, Zp) become a line feed in multi-line
//!   text and a space in one-line text; a carriage return is removed from
//!   multi-line text (so CR LF becomes LF) and becomes a space in one line.
//! - Cs (surrogates) cannot occur in a Rust `str`, so no code here tests it;
//!   bytes that are not UTF-8 (in error output) are decoded as U+FFFD first.

use crate::limits;

/// The code points of Unicode general category Cf (format), as ranges, from
/// the Unicode Character Database 16.0 (`DerivedGeneralCategory.txt`).
/// Sorted, so a binary search finds a code point.
const CF_RANGES: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
];

/// Unicode category Cc: U+0000 to U+001F and U+007F to U+009F.
pub fn is_cc(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// Unicode category Cf (invisible formatting characters, bidirectional
/// controls among them).
pub fn is_cf(c: char) -> bool {
    let cp = c as u32;
    CF_RANGES
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Unicode categories Zl (U+2028) and Zp (U+2029).
pub fn is_separator(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

/// The page's class `[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]`: a control or
/// invisible formatting character.
pub fn is_forbidden(c: char) -> bool {
    is_cc(c) || is_cf(c) || is_separator(c)
}

/// True when `s` has no character of `[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]`.
pub fn is_plain(s: &str) -> bool {
    !s.chars().any(is_forbidden)
}

/// True when `s` matches `^(?:[\n\t]|[^\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}])*$`:
/// plain text that may hold line feeds and tabs.
pub fn is_plain_multiline(s: &str) -> bool {
    !s.chars().any(|c| c != '\n' && c != '\t' && is_forbidden(c))
}

/// ECMAScript's `\s` (the regex dialect of JSON Schema): true when `s` is
/// only white space, as the page's `^\s*$` means it.
pub fn is_ecma_blank(s: &str) -> bool {
    s.chars().all(|c| {
        matches!(
            c,
            '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
                ..='\u{200a}'
                    | '\u{2028}'
                    | '\u{2029}'
                    | '\u{202f}'
                    | '\u{205f}'
                    | '\u{3000}'
                    | '\u{feff}'
        )
    })
}

fn push_mark(out: &mut String, c: char) {
    out.push_str(&format!("<U+{:04X}>", c as u32));
}

/// Cleans multi-line text a plugin sent (command text, error output): removes
/// every control character but line feed and tab, shows each invisible
/// formatting character as a mark, turns line and paragraph separators into
/// line feeds. The result matches the page's
/// `^(?:[\n\t]|[^\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}])*$`.
pub fn clean_multiline(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\n' || c == '\t' {
            out.push(c);
        } else if is_cc(c) {
            // removed, as the page says of control characters
        } else if is_cf(c) {
            push_mark(&mut out, c);
        } else if is_separator(c) {
            out.push('\n');
        } else {
            out.push(c);
        }
    }
    out
}

/// Cleans one line of text a plugin sent: line breaks, tabs and separators
/// become a space, other control characters are removed, invisible
/// formatting characters are shown as marks. The result matches
/// `^[^\x00-\x1f\x7f]*$` and has no Cf, Zl or Zp character.
pub fn clean_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\n' | '\r' | '\t') || is_separator(c) {
            out.push(' ');
        } else if is_cc(c) {
            // removed
        } else if is_cf(c) {
            push_mark(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out
}

/// The first `max` characters of `s`.
pub fn cut_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character
/// boundary.
pub fn cut_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The longest suffix of `s` of at most `max` bytes that starts at a
/// character boundary.
pub fn tail_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// A plugin's failure message as a client may see it: one clean line of at
/// most 500 characters.
pub fn clean_failure_message(s: &str) -> String {
    cut_chars(&clean_line(s), limits::PLUGIN_ERROR_MESSAGE_MAX).to_string()
}

/// A plugin's command text as plugin.command.run returns it: cleaned, then
/// cut to 16384 bytes at a character boundary.
pub fn clean_command_text(s: &str) -> String {
    cut_bytes(&clean_multiline(s), limits::PLUGIN_COMMAND_TEXT_MAX).to_string()
}

/// The tail of a plugin's error output as plugin.get shows it: the raw bytes
/// decoded as UTF-8 (anything else becomes U+FFFD), cleaned, and of that the
/// last 4096 bytes starting at a character boundary. The host may pass only
/// the end of what it kept, as long as that is more than 4096 bytes of raw
/// output or all of it.
pub fn stderr_tail(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    tail_bytes(&clean_multiline(&text), limits::PLUGIN_STDERR_TAIL_MAX).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories() {
        for c in ['\0', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}'] {
            assert!(is_cc(c) && is_forbidden(c));
        }
        assert!(!is_cc(' ') && !is_cc('\u{a0}'));
        for c in [
            '\u{ad}',
            '\u{200b}',
            '\u{200e}',
            '\u{202e}',
            '\u{2066}',
            '\u{feff}',
            '\u{1343f}',
            '\u{e0041}',
            '\u{e007f}',
        ] {
            assert!(is_cf(c), "{:x}", c as u32);
        }
        for c in [
            'a',
            '\u{ac}',
            '\u{ae}',
            '\u{2065}',
            '\u{2070}',
            '\u{13440}',
            '\u{e0000}',
            '\u{e0080}',
            '\u{10ffff}',
        ] {
            assert!(!is_cf(c), "{:x}", c as u32);
        }
        assert!(is_separator('\u{2028}') && is_separator('\u{2029}'));
        assert!(is_plain("/srv/work/shop"));
        assert!(!is_plain("a\tb"));
        assert!(is_plain_multiline("a\tb\nc"));
        assert!(!is_plain_multiline("a\rb"));
        assert!(!is_plain_multiline("evil\u{202e}txt"));
    }

    #[test]
    fn cf_table_is_sorted_and_disjoint() {
        for w in CF_RANGES.windows(2) {
            assert!(w[0].0 <= w[0].1 && w[0].1 < w[1].0);
        }
    }

    #[test]
    fn blank() {
        assert!(is_ecma_blank(""));
        assert!(is_ecma_blank(" \t\n\u{3000}"));
        assert!(!is_ecma_blank(" x "));
    }

    #[test]
    fn cleaning() {
        assert_eq!(
            clean_multiline("a\r\nb\tc\u{7}\u{200b}d\u{2028}e"),
            "a\nb\tc<U+200B>d\ne"
        );
        assert_eq!(clean_line("a\nb\u{1b}[31m\u{202e}"), "a b[31m<U+202E>");
        let long = "x".repeat(600) + "\n";
        assert_eq!(clean_failure_message(&long).chars().count(), 500);
        let text = "é".repeat(10_000);
        let cleaned = clean_command_text(&text);
        assert_eq!(cleaned.len(), 16_384);
        let odd = "a".to_string() + &"é".repeat(10_000);
        assert_eq!(clean_command_text(&odd).len(), 16_383);
    }

    #[test]
    fn tails() {
        let mut raw = vec![b'a'];
        raw.extend("é".repeat(3000).as_bytes());
        raw.extend(b"\xff\x1b!\n");
        let t = stderr_tail(&raw);
        assert!(t.len() <= 4096);
        assert!(t.ends_with("\u{fffd}!\n"));
        assert!(t.starts_with('é'));
        assert_eq!(tail_bytes("aé", 1), "");
        assert_eq!(cut_bytes("aé", 2), "a");
        assert_eq!(cut_chars("aéb", 2), "aé");
    }
}
