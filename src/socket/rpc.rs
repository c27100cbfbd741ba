//! The JSON-RPC 2.0 envelope of the daemon socket (seed 004, "Envelope",
//! "Errors"; DESIGN.md, "Surfaces and their conventions"). Pure: a line in,
//! a classified frame or the exact error reply out.
//!
//! Decisions where the node protocol leaves room: a request id may be a
//! number or a string and is echoed exactly; `params` may be absent (an empty
//! object) or an object, and an array is invalid params since no method takes
//! positional arguments; a frame with a `route` (a relay frame) is refused on
//! the daemon socket, which carries no relay channels.

use serde_json::{Map, Value, json};

use crate::errors::{Code, RpcError};

/// A classified incoming frame.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    /// A notification from the client; the daemon serves none, so it is
    /// dropped (JSON-RPC forbids answering a notification).
    Notification { method: String },
    /// A response to a request of ours; the daemon sends clients none yet.
    Response,
}

/// What to do with a line that is not a usable frame.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    /// The id to answer with; `Value::Null` when there is none to echo.
    pub id: Value,
    pub error: RpcError,
}

pub fn parse(line: &[u8]) -> Result<Frame, Refusal> {
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(_) => {
            return Err(Refusal {
                id: Value::Null,
                error: RpcError::new(Code::ParseError, "parse error"),
            });
        }
    };
    let Value::Object(mut obj) = v else {
        return Err(invalid(Value::Null, "a frame must be a JSON object"));
    };
    let id = obj.remove("id");
    let echo = match &id {
        Some(v @ (Value::Number(_) | Value::String(_))) => v.clone(),
        _ => Value::Null,
    };
    if obj.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return Err(invalid(echo, "jsonrpc must be \"2.0\""));
    }
    if obj.contains_key("route") || obj.contains_key("body") {
        return Err(invalid(
            echo,
            "relay frames are not served on the daemon socket",
        ));
    }
    let method = match obj.remove("method") {
        None => None,
        Some(Value::String(m)) => Some(m),
        Some(_) => return Err(invalid(echo, "method must be a string")),
    };
    match (id, method) {
        (None, Some(method)) => Ok(Frame::Notification { method }),
        (None, None) => Err(invalid(Value::Null, "a frame needs a method or an id")),
        (Some(id), method) => {
            if !matches!(id, Value::Number(_) | Value::String(_)) {
                return Err(invalid(Value::Null, "id must be a number or a string"));
            }
            let Some(method) = method else {
                return Ok(Frame::Response);
            };
            let params = match obj.remove("params") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(p)) => p,
                Some(_) => {
                    return Err(Refusal {
                        id,
                        error: RpcError::invalid_params("params must be an object"),
                    });
                }
            };
            Ok(Frame::Request { id, method, params })
        }
    }
}

fn invalid(id: Value, message: &str) -> Refusal {
    Refusal {
        id,
        error: RpcError::new(Code::InvalidRequest, message),
    }
}

/// A success reply line, with its `\n`.
pub fn reply(id: &Value, result: &Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// An error reply line: the JSON-RPC integer, one line of message, and the
/// stable code in `data.code`; `data` may carry more members for a code
/// that names something.
pub fn error(id: &Value, e: &RpcError, extra: Option<Map<String, Value>>) -> Vec<u8> {
    let mut data = extra.unwrap_or_default();
    data.insert("code".into(), Value::String(e.code.as_str().into()));
    line(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": e.code.rpc(), "message": e.message, "data": data},
    }))
}

/// A notification line.
pub fn notification(method: &str, params: &Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
}

fn line(v: &Value) -> Vec<u8> {
    // Serialising a Value built from maps and strings cannot fail.
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(line: &str) -> (Value, i64, &'static str) {
        let r = parse(line.as_bytes()).unwrap_err();
        (r.id, r.error.code.rpc(), r.error.code.as_str())
    }

    #[test]
    fn classifies_frames() {
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap(),
            Frame::Request {
                id: json!(7),
                method: "ping".into(),
                params: Map::new()
            }
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","method":"x"}"#).unwrap(),
            Frame::Notification { method: "x".into() }
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":"a","result":null}"#).unwrap(),
            Frame::Response
        );
    }

    #[test]
    fn refuses_with_the_codes_of_the_spec() {
        assert_eq!(refused("{not json"), (Value::Null, -32700, "parse-error"));
        assert_eq!(refused("[1,2]"), (Value::Null, -32600, "invalid-request"));
        assert_eq!(
            refused(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#),
            (json!(3), -32600, "invalid-request")
        );
        assert_eq!(
            refused(r#"{"id":3,"method":"ping"}"#),
            (json!(3), -32600, "invalid-request")
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":3,"method":5}"#),
            (json!(3), -32600, "invalid-request")
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":[1]}"#),
            (json!(3), -32602, "invalid-params")
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#),
            (Value::Null, -32600, "invalid-request")
        );
    }

    #[test]
    fn error_reply_carries_the_stable_code() {
        let l = error(
            &json!(1),
            &RpcError::new(Code::NotFound, "no such stream"),
            None,
        );
        let v: Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["error"]["code"], json!(-32000));
        assert_eq!(v["error"]["data"]["code"], json!("not-found"));
        assert_eq!(*l.last().unwrap(), b'\n');
    }
}
