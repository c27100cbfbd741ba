//! Errors of the HTTP API as `application/problem+json` (RFC 9457; seed 002,
//! "Revisions and errors"): `type: "about:blank"`, `title`, `status`,
//! `detail` and a stable snake_case `code` that programs branch on. The
//! detail is one line for a person; it never carries a token, a request
//! body or another session's data.
//!
//! Every code the API answers with is a [`Code`]; the status goes with it,
//! so a handler cannot pair a code with the wrong status.

use serde_json::json;

/// Stable error codes of the HTTP API, each with its one status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// 400: invalid syntax, fields, query or framing.
    InvalidRequest,
    /// 400: a UUIDv7 identity more than five minutes ahead.
    IdentityFuture,
    /// 401: missing or wrong bearer token.
    Unauthorized,
    /// 403: an `Origin` not in `http.allowed_origins`.
    OriginNotAllowed,
    /// 403: a `Host` that is neither the listener nor a public name.
    HostNotAllowed,
    /// 403: the caller is not the operator (DESIGN.md, "Who is calling").
    OperatorOnly,
    /// 404: no such resource.
    NotFound,
    /// 405: known path, unsupported method; with `Allow`.
    MethodNotAllowed,
    /// 406: no representation the `Accept` header admits.
    NotAcceptable,
    /// 409: the request names another daemon instance.
    InstanceChanged,
    /// 410: a UUIDv7 identity older than seven days.
    IdentityExpired,
    /// 412: `If-Match` names a representation that no longer holds.
    PreconditionFailed,
    /// 408: the request's body did not arrive within
    /// `HTTP_BODY_DEADLINE_MS`; the connection is closed.
    RequestTimeout,
    /// 413: the body is over its limit.
    BodyTooLarge,
    /// 415: a body that is not `application/json`, or content-coded.
    UnsupportedMediaType,
    /// 417: an `Expect` other than `100-continue`.
    ExpectationFailed,
    /// 428: `If-Match` is required and missing.
    PreconditionRequired,
    /// 503: every connection slot is taken.
    TooManyConnections,
    /// 503: every stream slot (or a topic's watcher slot) is taken.
    TooManyStreams,
    /// 503: the daemon is stopping and takes no new work.
    ShuttingDown,
    /// 503: the ledger's queue is full; try again.
    LedgerBusy,
    /// 503: the ledger cannot be trusted and is read-only.
    LedgerCorrupt,
    /// 503: a part of the daemon the request needs did not answer.
    Unavailable,
    /// 409: a creation UUIDv7 already names another intent.
    IdentityConflict,
    /// 409: an input UUIDv7 already names another intent.
    InputConflict,
    /// 429: the session has its maximum of waiting inputs.
    QueueFull,
    /// 409: the session has ended.
    SessionEnded,
    /// 409: the seat is unknown, missing or degraded.
    SeatUnavailable,
    /// 429: the daemon holds its maximum of sessions.
    TooManySessions,
    /// 409: the approval was already answered, withdrawn or expired.
    NotPending,
    /// 409: the answer names another action than the request's.
    ActionMismatch,
    /// 409: the operation does not fit the resource's current state (a
    /// plugin's state, for one); `detail` says how.
    Conflict,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "invalid_request",
            Code::IdentityFuture => "identity_future",
            Code::Unauthorized => "unauthorized",
            Code::OriginNotAllowed => "origin_not_allowed",
            Code::HostNotAllowed => "host_not_allowed",
            Code::OperatorOnly => "operator_only",
            Code::NotFound => "not_found",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::NotAcceptable => "not_acceptable",
            Code::InstanceChanged => "instance_changed",
            Code::IdentityExpired => "identity_expired",
            Code::PreconditionFailed => "precondition_failed",
            Code::RequestTimeout => "request_timeout",
            Code::BodyTooLarge => "body_too_large",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::ExpectationFailed => "expectation_failed",
            Code::PreconditionRequired => "precondition_required",
            Code::TooManyConnections => "too_many_connections",
            Code::TooManyStreams => "too_many_streams",
            Code::ShuttingDown => "shutting_down",
            Code::LedgerBusy => "ledger_busy",
            Code::LedgerCorrupt => "ledger_corrupt",
            Code::Unavailable => "unavailable",
            Code::IdentityConflict => "identity_conflict",
            Code::InputConflict => "input_conflict",
            Code::QueueFull => "queue_full",
            Code::SessionEnded => "session_ended",
            Code::SeatUnavailable => "seat_unavailable",
            Code::TooManySessions => "too_many_sessions",
            Code::NotPending => "not_pending",
            Code::ActionMismatch => "action_mismatch",
            Code::Conflict => "conflict",
        }
    }

    /// The code a stored decision names (the inverse of [`Code::as_str`]).
    pub fn parse(s: &str) -> Option<Code> {
        ALL.iter().copied().find(|c| c.as_str() == s)
    }

    pub fn status(self) -> u16 {
        match self {
            Code::InvalidRequest | Code::IdentityFuture => 400,
            Code::Unauthorized => 401,
            Code::OriginNotAllowed | Code::HostNotAllowed | Code::OperatorOnly => 403,
            Code::NotFound => 404,
            Code::MethodNotAllowed => 405,
            Code::NotAcceptable => 406,
            Code::InstanceChanged
            | Code::IdentityConflict
            | Code::InputConflict
            | Code::SessionEnded
            | Code::SeatUnavailable
            | Code::NotPending
            | Code::ActionMismatch
            | Code::Conflict => 409,
            Code::QueueFull | Code::TooManySessions => 429,
            Code::IdentityExpired => 410,
            Code::PreconditionFailed => 412,
            Code::RequestTimeout => 408,
            Code::BodyTooLarge => 413,
            Code::UnsupportedMediaType => 415,
            Code::ExpectationFailed => 417,
            Code::PreconditionRequired => 428,
            Code::TooManyConnections
            | Code::TooManyStreams
            | Code::ShuttingDown
            | Code::LedgerBusy
            | Code::LedgerCorrupt
            | Code::Unavailable => 503,
        }
    }
}

const ALL: [Code; 32] = [
    Code::InvalidRequest,
    Code::IdentityFuture,
    Code::Unauthorized,
    Code::OriginNotAllowed,
    Code::HostNotAllowed,
    Code::OperatorOnly,
    Code::NotFound,
    Code::MethodNotAllowed,
    Code::NotAcceptable,
    Code::InstanceChanged,
    Code::IdentityExpired,
    Code::PreconditionFailed,
    Code::RequestTimeout,
    Code::BodyTooLarge,
    Code::UnsupportedMediaType,
    Code::ExpectationFailed,
    Code::PreconditionRequired,
    Code::TooManyConnections,
    Code::TooManyStreams,
    Code::ShuttingDown,
    Code::LedgerBusy,
    Code::LedgerCorrupt,
    Code::Unavailable,
    Code::IdentityConflict,
    Code::InputConflict,
    Code::QueueFull,
    Code::SessionEnded,
    Code::SeatUnavailable,
    Code::TooManySessions,
    Code::NotPending,
    Code::ActionMismatch,
    Code::Conflict,
];

/// One problem answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub code: Code,
    pub detail: String,
    /// 405: the methods the path supports.
    pub allow: Option<String>,
    /// 503 and 429: seconds after which a new attempt can succeed.
    pub retry_after: Option<u64>,
    /// A retained decision answers with the status it was first given.
    pub status_override: Option<u16>,
}

impl Problem {
    /// The one mapping of the daemon's error codes to HTTP's: every route
    /// that runs the core's rules (creations, inputs, interrupts, approval
    /// answers, the socket's plugin methods) answers a refusal through it.
    /// The ledger's refusals keep their own codes (`ledger_busy` with
    /// `Retry-After`, `ledger_corrupt`, `unavailable`), and a stopping
    /// daemon is `shutting_down`, as on every other route; anything without
    /// an HTTP code of its own is `conflict`. Where the HTTP code is coarser
    /// than the daemon's (`not_found` for `plugin-not-found`, `conflict`),
    /// the detail ends with the daemon's code in parentheses, so that a
    /// person still sees which one it was.
    pub fn from_rpc(e: &crate::errors::RpcError) -> Problem {
        use crate::errors::Code as R;
        let code = match e.code {
            R::InvalidParams | R::InvalidRequest => Code::InvalidRequest,
            R::NotFound | R::PluginNotFound | R::CommandNotFound | R::SessionNotFound => {
                Code::NotFound
            }
            R::SeatNotFound | R::SeatNotReady => Code::SeatUnavailable,
            R::TooManySessions => Code::TooManySessions,
            R::SessionEnded => Code::SessionEnded,
            R::QueueFull => Code::QueueFull,
            R::NotPending => Code::NotPending,
            R::ActionMismatch => Code::ActionMismatch,
            R::OperatorOnly => Code::OperatorOnly,
            R::LedgerCorrupt => Code::LedgerCorrupt,
            R::LedgerBusy => Code::LedgerBusy,
            R::Unavailable => Code::Unavailable,
            R::ShuttingDown => Code::ShuttingDown,
            _ => Code::Conflict,
        };
        let own = e.code.as_str();
        let detail = if code.as_str() == own.replace('-', "_") {
            e.message.clone()
        } else {
            format!("{} ({own})", e.message)
        };
        let p = Problem::new(code, detail);
        match code {
            Code::LedgerBusy => p.retry(1),
            _ => p,
        }
    }

    pub fn new(code: Code, detail: impl Into<String>) -> Problem {
        Problem {
            code,
            detail: detail.into(),
            allow: None,
            retry_after: None,
            status_override: None,
        }
    }

    /// Adds `Retry-After`.
    pub fn retry(mut self, seconds: u64) -> Problem {
        self.retry_after = Some(seconds);
        self
    }

    pub fn invalid(detail: impl Into<String>) -> Problem {
        Problem::new(Code::InvalidRequest, detail)
    }

    pub fn status(&self) -> u16 {
        self.status_override.unwrap_or_else(|| self.code.status())
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        let v = json!({
            "type": "about:blank",
            "title": crate::http::wire::reason(self.status()),
            "status": self.status(),
            "detail": self.detail,
            "code": self.code.as_str(),
        });
        serde_json::to_vec(&v).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_the_five_members() {
        let p = Problem::new(Code::InstanceChanged, "the daemon is instance b, not a");
        let v: serde_json::Value = serde_json::from_slice(&p.body()).unwrap();
        assert_eq!(v["type"], "about:blank");
        assert_eq!(v["title"], "Conflict");
        assert_eq!(v["status"], 409);
        assert_eq!(v["code"], "instance_changed");
        assert_eq!(v.as_object().unwrap().len(), 5);
    }

    #[test]
    fn the_daemons_refusals_map_once_and_keep_their_own_code_in_the_detail() {
        use crate::errors::{Code as R, RpcError};
        let p = Problem::from_rpc(&RpcError::new(R::LedgerBusy, "the ledger's queue is full"));
        assert_eq!(
            (p.code, p.status(), p.retry_after),
            (Code::LedgerBusy, 503, Some(1))
        );
        let p = Problem::from_rpc(&RpcError::new(R::ShuttingDown, "the daemon is stopping"));
        assert_eq!((p.code, p.status()), (Code::ShuttingDown, 503));
        let p = Problem::from_rpc(&RpcError::new(
            R::Unavailable,
            "the ledger could not commit",
        ));
        assert_eq!((p.code, p.status()), (Code::Unavailable, 503));
        // The same name on both surfaces: the detail is the message alone.
        let p = Problem::from_rpc(&RpcError::new(R::SessionEnded, "session s has ended"));
        assert_eq!(
            (p.code, p.detail.as_str()),
            (Code::SessionEnded, "session s has ended")
        );
        // Coarser on HTTP: the detail ends with the daemon's code.
        let p = Problem::from_rpc(&RpcError::new(R::PluginNotFound, "no plugin x"));
        assert_eq!(
            (p.code, p.detail.as_str()),
            (Code::NotFound, "no plugin x (plugin-not-found)")
        );
        let p = Problem::from_rpc(&RpcError::new(R::PluginNotRunning, "x is not running"));
        assert_eq!(
            (p.code, p.status(), p.detail.as_str()),
            (Code::Conflict, 409, "x is not running (plugin-not-running)")
        );
        let p = Problem::from_rpc(&RpcError::new(R::SeatNotReady, "the seat a is missing"));
        assert_eq!(p.code, Code::SeatUnavailable);
    }
}
