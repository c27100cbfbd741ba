//! A validating JSON scanner for the lines the daemon reads most, which
//! needs no tree and no copy: the gateway's relay frames
//! ([`crate::gateway::wire::relay_chan`]) and an ACP agent's streamed text
//! chunks ([`crate::agents::acp`]). Pure; it decides a line only where it
//! can decide it exactly as serde_json would (RFC 8259 and serde_json's
//! limits), and says `None` wherever it cannot, so that its callers leave
//! that line to serde and nothing a line means depends on which path read
//! it.
//!
//! Why: serde_json stops on every byte of a string to check for a quote, a
//! backslash or a control character and builds what it reads; these lines
//! are mostly one long string (a relayed `body`, a chunk's `text`), which
//! this scan skips sixteen bytes at a time.
//!
//! The same holds for the line the daemon writes most: a
//! `transcript.delta`, mostly the growing entry's text. [`write_array`]
//! writes values as serde_json's compact form does, byte for byte (the
//! test below holds the two to each other), copying each string in runs
//! between the bytes it must escape.

use serde_json::Value;

/// Nesting the scan follows before it leaves the line to serde (whose
/// limit is 128).
pub const SCAN_DEPTH: usize = 64;

pub struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    /// No string so far held a byte past ASCII.
    ascii: bool,
}

impl<'a> Scan<'a> {
    pub fn new(b: &'a [u8]) -> Scan<'a> {
        Scan {
            b,
            i: 0,
            ascii: true,
        }
    }

    /// Whether the whole input was read and is UTF-8: outside strings the
    /// scan takes only ASCII, so only a string that held other bytes makes
    /// the input need a check of its own.
    pub fn at_valid_end(&self) -> bool {
        self.i == self.b.len() && (self.ascii || std::str::from_utf8(self.b).is_ok())
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub fn byte(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    pub fn eat(&mut self, c: u8) -> Option<()> {
        (self.byte()? == c).then_some(())
    }

    /// JSON whitespace but `\n`, which would end the line.
    pub fn ws(&mut self) -> Option<()> {
        while let Some(b' ' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
        Some(())
    }

    pub fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string whose escapes are all simple; its raw content (escapes not
    /// decoded: the names the scan looks for contain none, so a name with
    /// one matches none of them, as serde's would not).
    pub fn string(&mut self) -> Option<&'a [u8]> {
        let (start, _) = self.string_to_end(false)?;
        Some(&self.b[start + 1..self.i - 1])
    }

    /// Reads a string to its closing quote; where it started and whether it
    /// held an escape. With `any_escape` every escaped character is skipped
    /// whatever it is (a quote must not end the string; serde checks the
    /// rest when it decodes it); without, only the simple ones are taken.
    fn string_to_end(&mut self, any_escape: bool) -> Option<(usize, bool)> {
        let start = self.i;
        self.eat(b'"')?;
        let mut escaped = false;
        loop {
            self.i += special(&self.b[self.i..], &mut self.ascii)?;
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Some((start, escaped));
                }
                b'\\' => {
                    let next = *self.b.get(self.i + 1)?;
                    let simple =
                        matches!(next, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't');
                    if !(any_escape || simple) {
                        return None;
                    }
                    escaped = true;
                    self.i += 2;
                }
                _ => return None,
            }
        }
    }

    pub fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        let digits = self.i - start;
        let ok = digits > 0 && digits <= 18 && (digits == 1 || self.b[start] != b'0');
        let plain = !matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        (ok && plain).then_some(())
    }

    /// An object whose members' values `member` reads, given each member's
    /// raw name (escapes not decoded, as [`string`](Self::string) gives it).
    pub fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        self.eat(b'{')?;
        self.ws()?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws()?;
            let name = self.string()?;
            self.ws()?;
            self.eat(b':')?;
            self.ws()?;
            member(self, name)?;
            self.ws()?;
            match self.byte()? {
                b',' => continue,
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }

    pub fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' if depth >= SCAN_DEPTH => None,
            b'{' => self.object(|s, _| s.value(depth + 1)),
            b'[' => {
                self.i += 1;
                self.ws()?;
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws()?;
                    self.value(depth + 1)?;
                    self.ws()?;
                    match self.byte()? {
                        b',' => continue,
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// A string with any escapes: its raw bytes between the quotes, the
    /// quotes included, and whether it holds a backslash (then decoding it
    /// is serde's: `serde_json::from_slice::<String>` on the raw bytes reads
    /// it exactly as a parse of the whole input would, `\u` escapes and
    /// surrogate pairs included, and refuses what it would refuse).
    pub fn quoted(&mut self) -> Option<(&'a [u8], bool)> {
        let (start, escaped) = self.string_to_end(true)?;
        Some((&self.b[start..self.i], escaped))
    }
}

/// How many bytes of `s` come before its first `"`, `\\` or control
/// character (below 0x20); `None` if there is none. Clears `ascii` if a
/// byte past ASCII comes before it (or near it: a false alarm costs only
/// a UTF-8 check). Sixteen bytes at a time with SSE2, which every x86_64
/// CPU has: a 64 KiB body is most of a relayed frame, and this loop all
/// the gateway's own work on it.
#[cfg(target_arch = "x86_64")]
fn special(s: &[u8], ascii: &mut bool) -> Option<usize> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    // SAFETY (both blocks): SSE2 is part of the x86_64 baseline, so these
    // instructions exist on every CPU this is built for (the intrinsics
    // are `unsafe` only for that); each load reads `s[i..i + 16]` for an
    // `i` the loop's condition keeps in bounds, and `_mm_loadu_si128` takes
    // any alignment.
    let hits = |i: usize| unsafe {
        let v = _mm_loadu_si128(s.as_ptr().add(i).cast::<__m128i>());
        // A byte is below 0x20 when its unsigned minimum with 0x1F is
        // itself.
        let hit = _mm_or_si128(
            _mm_or_si128(
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
            ),
            _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1F)), v),
        );
        (v, hit)
    };
    let mask = |v: __m128i| unsafe { _mm_movemask_epi8(v) };
    let mut high = 0;
    let mut at = 0;
    // Most strings are short (member names, ids, methods): the first
    // sixteen bytes settle them without the wide loop's four loads.
    if s.len() >= 16 {
        let (v, hit) = hits(0);
        let m = mask(hit);
        if m != 0 {
            *ascii &= mask(v) == 0;
            return Some(m.trailing_zeros() as usize);
        }
        high = mask(v);
        at = 16;
    }
    // Sixty-four bytes a turn, one test of the four vectors together; the
    // sixteen that hit are then found one vector at a time.
    while at + 64 <= s.len() {
        let (a, b, c, d) = (hits(at), hits(at + 16), hits(at + 32), hits(at + 48));
        // SAFETY: as above.
        let (any, seen) = unsafe {
            (
                _mm_or_si128(_mm_or_si128(a.1, b.1), _mm_or_si128(c.1, d.1)),
                _mm_or_si128(_mm_or_si128(a.0, b.0), _mm_or_si128(c.0, d.0)),
            )
        };
        if mask(any) != 0 {
            break;
        }
        high |= mask(seen);
        at += 64;
    }
    while at + 16 <= s.len() {
        let (v, hit) = hits(at);
        high |= mask(v);
        let m = mask(hit);
        if m != 0 {
            *ascii &= high == 0;
            return Some(at + m.trailing_zeros() as usize);
        }
        at += 16;
    }
    *ascii &= high == 0;
    special_bytes(&s[at..], ascii).map(|i| at + i)
}

/// [`special`] elsewhere: eight bytes at a time in a `u64`. A word holds a
/// byte equal to `c` when XOR with eight `c`s leaves a zero byte, and one
/// below 0x20 when subtracting eight 0x20s borrows into a byte whose high
/// bit was clear; both tests may flag bytes above the first hit but never
/// miss it, and the word is then searched byte by byte, so the result is
/// exact.
#[cfg(any(test, not(target_arch = "x86_64")))]
fn special_words(s: &[u8], ascii: &mut bool) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGHS;
    let mut words = s.chunks_exact(8);
    let mut at = 0;
    for c in &mut words {
        let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        let hit = zero(w ^ (ONES * b'"' as u64))
            | zero(w ^ (ONES * b'\\' as u64))
            | (w.wrapping_sub(ONES * 0x20) & !w & HIGHS);
        if hit != 0 {
            return special_bytes(c, ascii).map(|i| at + i);
        }
        *ascii &= w & HIGHS == 0;
        at += 8;
    }
    special_bytes(words.remainder(), ascii).map(|i| at + i)
}

#[cfg(not(target_arch = "x86_64"))]
use special_words as special;

/// [`special`] one byte at a time, for what is left of the fast loops.
fn special_bytes(s: &[u8], ascii: &mut bool) -> Option<usize> {
    let at = s.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
    *ascii &= s[..at.unwrap_or(s.len())].is_ascii();
    at
}

/// Writes `items` as a JSON array, as `serde_json::to_writer` would.
pub fn write_array(out: &mut Vec<u8>, items: &[Value]) {
    out.push(b'[');
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_value(out, v);
    }
    out.push(b']');
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // Numbers are rare in an entry and serde's own form is the one to
        // match; writing to a Vec cannot fail.
        Value::Number(n) => {
            let _ = serde_json::to_writer(&mut *out, n);
        }
        Value::String(s) => write_str(out, s),
        Value::Array(a) => write_array(out, a),
        Value::Object(m) => {
            out.push(b'{');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                write_value(out, v);
            }
            out.push(b'}');
        }
    }
}

/// A string, quoted and escaped as serde_json escapes it: the short forms
/// for `"`, `\\`, and the five control characters that have one, `\u00xx`
/// (lowercase) for the other control characters, everything else as is.
fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    let mut i = 0;
    // `special` also notes whether it passed a byte past ASCII; a writer
    // has no use for that.
    let mut ascii = true;
    while let Some(n) = special(&b[i..], &mut ascii) {
        let at = i + n;
        out.extend_from_slice(&b[i..at]);
        let c = b[at];
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0C => out.extend_from_slice(b"\\f"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 0xF)],
            ]),
        }
        i = at + 1;
    }
    out.extend_from_slice(&b[i..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_writes_what_serde_json_writes() {
        let mut every_byte = String::new();
        for c in 0u8..0x80 {
            every_byte.push(char::from(c));
        }
        let long: String = "a\"b\\c\u{1}\u{e9}\u{20ac}\u{1F600}x".repeat(40);
        let entries = [
            serde_json::json!({"id": "e0", "kind": "text", "text": every_byte, "timestamp": "2026-12-02T19:00:00.000Z"}),
            serde_json::json!({"text": long, "n": -12, "f": 1.5, "big": u64::MAX, "t": true, "no": false, "z": null}),
            serde_json::json!([[], {}, [1, [2, {"a": [""]}]], "\u{7f}/<>"]),
            serde_json::json!(""),
        ];
        for n in 0..=entries.len() {
            let mut ours = Vec::new();
            write_array(&mut ours, &entries[..n]);
            let theirs = serde_json::to_vec(&entries[..n]).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(theirs).unwrap()
            );
        }
        // Every place of an escape in a string long enough for the wide
        // loop, and the runs between.
        for at in 0..130 {
            for c in ['"', '\\', '\n', '\u{0}', '\u{1f}', '\u{8}', '\u{c}'] {
                let mut s = "y".repeat(130);
                s.insert(at, c);
                let v = [Value::String(s)];
                let mut ours = Vec::new();
                write_array(&mut ours, &v);
                assert_eq!(ours, serde_json::to_vec(&v).unwrap(), "{at} {c:?}");
            }
        }
    }

    #[test]
    fn the_string_scans_find_the_first_special_byte_at_any_place() {
        type StringScan = fn(&[u8], &mut bool) -> Option<usize>;
        let scans: [StringScan; 3] = [special, special_words, special_bytes];
        for scan in scans {
            for at in 0..150 {
                for c in [b'"', b'\\', 0x00, 0x1F] {
                    let mut s = vec![b'A'; 150];
                    s[at] = c;
                    // Bytes just past the specials must not mislead it.
                    if at + 1 < 150 {
                        s[at + 1] = 0x20;
                    }
                    let mut ascii = true;
                    assert_eq!(scan(&s, &mut ascii), Some(at));
                    assert!(ascii);
                    // A byte past ASCII before the hit is seen.
                    if at > 0 {
                        s[at - 1] = 0xC3;
                        let mut ascii = true;
                        assert_eq!(scan(&s, &mut ascii), Some(at));
                        assert!(!ascii, "{at}");
                    }
                }
            }
            let mut ascii = true;
            assert_eq!(scan(&[b'A'; 141], &mut ascii), None);
            assert!(ascii);
            let mut ascii = true;
            assert_eq!(
                scan(" !#[]~\x7F\u{e9}\u{20ac}".as_bytes(), &mut ascii),
                None
            );
            assert!(!ascii);
            let mut late = vec![b'A'; 141];
            late[130] = 0xC3;
            let mut ascii = true;
            assert_eq!(scan(&late, &mut ascii), None);
            assert!(!ascii);
        }
    }
}
