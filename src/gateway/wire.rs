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

use crate::jsonscan::Scan;

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
/// character), about a tenth of relaying a 64 KiB frame. The scan
/// ([`crate::jsonscan`]) skips strings sixteen bytes at a time and builds
/// nothing. It gives up (`None`) on whatever it does not need to decide
/// exactly as serde would: `\u` escapes and escapes in member names,
/// numbers with a fraction or an exponent or past 18 digits, nesting past
/// [`crate::jsonscan::SCAN_DEPTH`], a `\n` outside strings, a `method`
/// that is not a string, a repeated member serde would refuse (`route`,
/// `id`, `method`, `params`, `result`, or `chan_id` in `route`). `Some`
/// also means the line is UTF-8: outside strings the scan takes only
/// ASCII, and a string holding other bytes has the whole line checked, so
/// a text message that is one relay frame needs no check of its own
/// ([`super::conn::take_message`]).
pub fn relay_chan(line: &[u8]) -> Option<&str> {
    let mut s = Scan::new(line);
    let mut chan = None;
    let mut seen = 0u8;
    s.ws()?;
    s.object(|s, name| {
        let bit = match name {
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
            1 => chan = Some(route(s)?),
            4 => s.string().map(drop)?,
            _ => s.value(0)?,
        }
        Some(())
    })?;
    s.ws()?;
    if !s.at_valid_end() {
        return None;
    }
    // UTF-8, cut at ASCII quotes.
    std::str::from_utf8(chan?).ok()
}

/// `route`'s value: an object with one string `chan_id`; what else it
/// holds is skipped.
fn route<'a>(s: &mut Scan<'a>) -> Option<&'a [u8]> {
    let mut chan = None;
    s.object(|s, name| {
        if name != b"chan_id" {
            return s.value(1);
        }
        // A Value map keeps the last of repeated names: leave that to
        // serde.
        if chan.is_some() || s.peek()? != b'"' {
            return None;
        }
        let c = s.string()?;
        // An escaped channel id is decoded by serde: leave it.
        if c.contains(&b'\\') {
            return None;
        }
        chan = Some(c);
        Some(())
    })?;
    chan
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
    use crate::jsonscan::SCAN_DEPTH;

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
}
