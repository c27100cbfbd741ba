//! The gateway's envelope (seed 004, "Envelope", "Errors", "Route header"):
//! one line in, its class out, and the lines the gateway writes. Pure.
//!
//! A line is classified without decoding `body`: a relay frame is found by
//! its `route.chan_id` and forwarded as the bytes it arrived as. Lines that
//! are not JSON get `-32700 parse error` with no `id`; JSON that is not a
//! frame (not an object, an `id` that is neither number nor string, a
//! `method` that is no string) gets `-32600 invalid request`. Errors carry
//! the seed's code and text, and the stable kebab-case code in `data.code`
//! as every other reply of the daemon (DESIGN.md, "Surfaces").

use serde::Deserialize;
use serde_json::{Value, json};
use std::borrow::Cow;

/// One classified line.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// `ping`, answered where it is read (seed 004, Keepalive).
    Ping { id: Value },
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification; the gateway serves none and drops it.
    Notification,
    /// An answer to a request of the gateway's (`node.identify`).
    Response { id: Value, result: Option<Value> },
    /// A relay frame: its channel id and the line as it came, without its
    /// `\n`.
    Relay { chan: String, line: Vec<u8> },
    /// A relay frame without a usable `chan_id`: dropped without a reply.
    Unroutable,
    /// What to answer at once: an error line.
    Refused(Vec<u8>),
}

/// The members the gateway reads; every other member (`body` above all) is
/// skipped by the parser without being decoded or copied.
#[derive(Deserialize)]
struct Env<'a> {
    #[serde(default)]
    route: Option<Value>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    params: Option<Value>,
    #[serde(default)]
    result: Option<Value>,
}

/// Classifies `line` (without its `\n`); a relay frame keeps it.
pub fn classify(line: Vec<u8>) -> Frame {
    // serde would read an array as the struct's fields in order.
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(&line) {
            Ok(_) => Frame::Refused(error(
                &Value::Null,
                &GwError::invalid_request("a frame must be a JSON-RPC object"),
            )),
            Err(_) => Frame::Refused(parse_error()),
        };
    }
    let env: Env = match serde_json::from_slice(&line) {
        Ok(e) => e,
        Err(e) if e.is_syntax() || e.is_eof() => return Frame::Refused(parse_error()),
        Err(_) => {
            return Frame::Refused(error(
                &Value::Null,
                &GwError::invalid_request("a frame must be a JSON-RPC object"),
            ));
        }
    };
    // "relay frame: has route, of any shape" (seed 004, Envelope).
    if let Some(route) = env.route {
        return match route.get("chan_id").and_then(Value::as_str) {
            Some(chan) => Frame::Relay {
                chan: chan.to_string(),
                line,
            },
            None => Frame::Unroutable,
        };
    }
    let id = match env.id {
        None => None,
        Some(v @ (Value::Number(_) | Value::String(_))) => Some(v),
        Some(_) => {
            return Frame::Refused(error(
                &Value::Null,
                &GwError::invalid_request("id must be a number or a string"),
            ));
        }
    };
    match (id, env.method) {
        (Some(id), Some(m)) if m == "ping" => Frame::Ping { id },
        (Some(id), Some(m)) => Frame::Request {
            id,
            method: m.into_owned(),
            // No params, or null, is an empty object: a method that needs
            // one names the missing field, not a type of ours.
            params: match env.params {
                None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
                Some(v) => v,
            },
        },
        (None, Some(_)) => Frame::Notification,
        (Some(id), None) => Frame::Response {
            id,
            result: env.result,
        },
        (None, None) => Frame::Refused(error(
            &Value::Null,
            &GwError::invalid_request("a frame needs a method or an id"),
        )),
    }
}

/// The channel of a relay frame, found without serde: `Some` only for a
/// line that is one JSON object, valid, whose `route` is an object with a
/// string `chan_id`, and that [`classify`] would take as a relay frame of
/// that channel; `None` for anything else, which [`classify`] then decides.
///
/// Why: serde read every byte of `body` (several per byte: its string
/// scanner stops on each to check for a quote, a backslash or a control
/// character), about a tenth of relaying a 64 KiB frame. This scan skips
/// strings eight bytes at a time and builds nothing. It gives up (`None`)
/// on whatever it does not need to decide exactly as serde would: `\u`
/// escapes and escapes in member names, numbers with a fraction or an
/// exponent or past 18 digits, nesting past [`SCAN_DEPTH`], a `\n` outside
/// strings, a `method` that is not a string, a repeated member serde
/// would refuse (`route`, `id`, `method`, `params`, `result`, or
/// `chan_id` in `route`). `Some` also means the line is UTF-8: outside
/// strings the scan takes only ASCII, and a string holding other bytes
/// has the whole line checked, so a text message that is one relay frame
/// needs no check of its own ([`super::conn::take_message`]).
pub fn relay_chan(line: &[u8]) -> Option<&str> {
    let mut s = Scan {
        b: line,
        i: 0,
        ascii: true,
    };
    s.ws()?;
    s.eat(b'{')?;
    let mut chan = None;
    let mut seen = 0u8;
    s.ws()?;
    if s.peek()? != b'}' {
        loop {
            s.ws()?;
            let key = s.string()?;
            s.ws()?;
            s.eat(b':')?;
            s.ws()?;
            let bit = match key {
                b"route" => 1,
                b"id" => 2,
                b"method" => 4,
                b"params" => 8,
                b"result" => 16,
                _ => 0,
            };
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            match bit {
                1 => chan = Some(s.route()?),
                4 => {
                    s.string()?;
                }
                _ => s.value(0)?,
            }
            s.ws()?;
            match s.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    } else {
        s.i += 1;
    }
    s.ws()?;
    if s.i != line.len() || !s.ascii && std::str::from_utf8(line).is_err() {
        return None;
    }
    // UTF-8, cut at ASCII quotes.
    std::str::from_utf8(chan?).ok()
}

/// Nesting the scan follows before it leaves the line to serde (whose
/// limit is 128).
const SCAN_DEPTH: usize = 64;

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    /// No string so far held a byte past ASCII.
    ascii: bool,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    /// JSON whitespace but `\n`, which would end the line.
    fn ws(&mut self) -> Option<()> {
        while let Some(b' ' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
        Some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string whose escapes are all simple; its raw content (escapes not
    /// decoded: the names the scan looks for contain none, so a name with
    /// one matches none of them, as serde's would not).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            self.i += special(&self.b[self.i..], &mut self.ascii)?;
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Some(&self.b[start..self.i - 1]);
                }
                b'\\' => match self.b.get(self.i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    fn number(&mut self) -> Option<()> {
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

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' if depth >= SCAN_DEPTH => None,
            b'{' => {
                self.i += 1;
                self.ws()?;
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws()?;
                    self.string()?;
                    self.ws()?;
                    self.eat(b':')?;
                    self.ws()?;
                    self.value(depth + 1)?;
                    self.ws()?;
                    match self.next()? {
                        b',' => continue,
                        b'}' => return Some(()),
                        _ => return None,
                    }
                }
            }
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
                    match self.next()? {
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

    /// `route`'s value: an object with one string `chan_id`; what else it
    /// holds is skipped.
    fn route(&mut self) -> Option<&'a [u8]> {
        self.eat(b'{')?;
        let mut chan = None;
        self.ws()?;
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            self.ws()?;
            let key = self.string()?;
            self.ws()?;
            self.eat(b':')?;
            self.ws()?;
            if key == b"chan_id" {
                // A Value map keeps the last of repeated names: leave
                // that to serde.
                if chan.is_some() || self.peek()? != b'"' {
                    return None;
                }
                let c = self.string()?;
                // An escaped channel id is decoded by serde: leave it.
                if c.contains(&b'\\') {
                    return None;
                }
                chan = Some(c);
            } else {
                self.value(1)?;
            }
            self.ws()?;
            match self.next()? {
                b',' => continue,
                b'}' => return chan,
                _ => return None,
            }
        }
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

/// A failure the gateway answers: the seed's integer and text, and a stable
/// code for programs.
#[derive(Clone, Debug, PartialEq)]
pub struct GwError {
    pub rpc: i64,
    pub code: &'static str,
    pub message: String,
}

impl GwError {
    pub fn invalid_request(message: impl Into<String>) -> GwError {
        GwError {
            rpc: -32600,
            code: "invalid-request",
            message: message.into(),
        }
    }

    /// "-32600 invalid params: ..." (seed 004, Opening a channel).
    pub fn invalid_params(why: impl std::fmt::Display) -> GwError {
        GwError {
            rpc: -32600,
            code: "invalid-params",
            message: format!("invalid params: {why}"),
        }
    }

    pub fn refused(code: &'static str, message: impl Into<String>) -> GwError {
        GwError {
            rpc: -32600,
            code,
            message: message.into(),
        }
    }

    /// "-32601 method not found": the method is not served on this
    /// connection (seed 004, Errors).
    pub fn not_found() -> GwError {
        GwError {
            rpc: -32601,
            code: "method-not-found",
            message: "method not found".into(),
        }
    }

    /// "Other connections get -32600 with the message unauthorized: admin
    /// token required" (seed 004, Authentication).
    pub fn admin_only() -> GwError {
        GwError::refused("unauthorized", "unauthorized: admin token required")
    }

    pub fn internal(message: impl Into<String>) -> GwError {
        GwError {
            rpc: -32603,
            code: "internal-error",
            message: message.into(),
        }
    }
}

fn line(v: &Value) -> Vec<u8> {
    // Serialising a Value built from maps and strings cannot fail.
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

pub fn reply(id: &Value, result: &Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

pub fn error(id: &Value, e: &GwError) -> Vec<u8> {
    let err = json!({"code": e.rpc, "message": e.message, "data": {"code": e.code}});
    if id.is_null() {
        line(&json!({"jsonrpc": "2.0", "error": err}))
    } else {
        line(&json!({"jsonrpc": "2.0", "id": id, "error": err}))
    }
}

/// "the receiver sends back an error response with code -32700, message
/// "parse error", and no id" (seed 004, Framing).
pub fn parse_error() -> Vec<u8> {
    error(
        &Value::Null,
        &GwError {
            rpc: -32700,
            code: "parse-error",
            message: "parse error".into(),
        },
    )
}

pub fn answer(id: &Value, r: &Result<Value, GwError>) -> Vec<u8> {
    match r {
        Ok(v) => reply(id, v),
        Err(e) => error(id, e),
    }
}

pub fn notification(method: &str, params: &Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
}

pub fn request(id: u64, method: &str) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "method": method}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_classified_without_reading_body() {
        let l = br#"{"jsonrpc":"2.0","id":4,"method":"x","route":{"chan_id":"c3","node_id":"h"},"body":"AAAA"}"#;
        assert_eq!(
            classify(l.to_vec()),
            Frame::Relay {
                chan: "c3".into(),
                line: l.to_vec()
            }
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","route":{"x":1}}"#.to_vec()),
            Frame::Unroutable
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#.to_vec()),
            Frame::Ping { id: json!("a") }
        );
        assert!(matches!(classify(b"{nope".to_vec()), Frame::Refused(l) if l == parse_error()));
        assert!(
            matches!(classify(b"[1]".to_vec()), Frame::Refused(l) if String::from_utf8_lossy(&l).contains("-32600"))
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":1,"result":{"id":"h"}}"#.to_vec()),
            Frame::Response {
                id: json!(1),
                result: Some(json!({"id":"h"}))
            }
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","method":"n"}"#.to_vec()),
            Frame::Notification
        );
        let pe: Value = serde_json::from_slice(&parse_error()).unwrap();
        assert!(pe.get("id").is_none());
        assert_eq!(pe["error"]["message"], "parse error");
    }

    /// The scan never disagrees with serde: where it answers, `classify`
    /// gives the same relay frame; where serde finds a relay frame the
    /// scan either agrees or leaves it to serde.
    #[test]
    fn the_relay_scan_agrees_with_serde() {
        let relays: &[&[u8]] = &[
            br#"{"jsonrpc":"2.0","id":42,"method":"sessions.list","route":{"chan_id":"c12","node_id":"home"},"body":"QUJD"}"#,
            br#"{"body":"QUJD","route":{"node_id":"h","chan_id":"c1"},"id":-7}"#,
            br#" {"route" : { "chan_id" : "c2" } ,"x":[1,{"y":[true,false,null]},"s\"\\\/"],"result":{},"params":[]}	 "#,
            br#"{"route":{"chan_id":"c3","n":{"a":[0]}},"id":"x","method":"m","z":"\n"}"#,
            "{\"route\":{\"chan_id\":\"ça\"},\"body\":\"é€😀\"}".as_bytes(),
            br#"{"route":{"chan_id":""}}"#,
        ];
        let others: &[&[u8]] = &[
            br#"{"route":{"chan_id":"c1"},"route":{"chan_id":"c2"}}"#,
            br#"{"route":{"chan_id":"c1","chan_id":"c2"}}"#,
            br#"{"route":{"chan_id":"c\u0031"}}"#,
            br#"{"route":{"chan_id":"c3"},"z":"\u00e9"}"#,
            br#"{"route":{"chan_id":"c\/1"}}"#,
            br#"{"route":{"chan_id":1}}"#,
            br#"{"route":{}}"#,
            br#"{"route":null}"#,
            br#"{"route":[1]}"#,
            br#"{"route":{"chan_id":"c1"},"method":5}"#,
            br#"{"route":{"chan_id":"c1"},"method":null}"#,
            br#"{"route":{"chan_id":"c1"},"id":1.5}"#,
            br#"{"route":{"chan_id":"c1"},"id":1e3}"#,
            br#"{"route":{"chan_id":"c1"},"id":01}"#,
            br#"{"route":{"chan_id":"c1"},"id":1234567890123456789012}"#,
            br#"{"route":{"chan_id":"c1"},"id":-}"#,
            br#"{"route":{"chan_id":"c1"},"body":"a	b"}"#,
            br#"{"route":{"chan_id":"c1"},"body":"a\qb"}"#,
            br#"{"route":{"chan_id":"c1"},"body":"ab}"#,
            br#"{"route":{"chan_id":"c1"},"body":"ab"} x"#,
            br#"{"route":{"chan_id":"c1"},"body":"ab"}}"#,
            br#"{"route":{"chan_id":"c1"},"body":tru}"#,
            br#"{"route":{"chan_id":"c1"},}"#,
            br#"{"route":{"chan_id":"c1"} "id":1}"#,
            br#"{"route":{"chan_id":"c1"},"rout\u0065":1}"#,
            b"{\"route\":{\"chan_id\":\"c1\"},\n\"id\":1}",
            b"{\"route\":{\"chan_id\":\"c1\"},\"body\":\"\xC3(\"}",
            br#"[{"route":{"chan_id":"c1"}}]"#,
            br#"{}"#,
            b"",
        ];
        for l in relays {
            let chan = relay_chan(l).unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(l)));
            assert_eq!(
                classify(l.to_vec()),
                Frame::Relay {
                    chan: chan.into(),
                    line: l.to_vec()
                }
            );
        }
        for l in others {
            assert_eq!(relay_chan(l), None, "{}", String::from_utf8_lossy(l));
        }
        // Deep nesting is left to serde.
        let deep = format!(
            "{{\"route\":{{\"chan_id\":\"c\"}},\"x\":{}{}}}",
            "[".repeat(SCAN_DEPTH + 1),
            "]".repeat(SCAN_DEPTH + 1)
        );
        assert_eq!(relay_chan(deep.as_bytes()), None);
        let shallow = format!(
            "{{\"route\":{{\"chan_id\":\"c\"}},\"x\":{}{}}}",
            "[".repeat(SCAN_DEPTH - 1),
            "]".repeat(SCAN_DEPTH - 1)
        );
        assert_eq!(relay_chan(shallow.as_bytes()), Some("c"));
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
