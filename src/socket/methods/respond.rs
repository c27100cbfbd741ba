//! `sessions.respond` (seed 004, Features › Sessions, "Answering an
//! interaction"; issue 13, "Answering from a phone"): a seed client answers
//! the `interaction` of a session that waits (`status: "awaiting_input"`)
//! through the approvals inbox, with the binding, single use, audit and
//! operator rule of `approvals.answer`.
//!
//! | method           | who      | answers                                   |
//! |------------------|----------|-------------------------------------------|
//! | sessions.respond | operator | null once the answer is committed         |
//!
//! The request answered is the one `request_id` names (an
//! `interaction.request_id`, which is the approval's id), else the
//! session's oldest open one; a session with none takes the answer and
//! drops it, as the seed says ("In all other cases, the node drops the
//! answer and returns success"). The decision is `behavior`, else
//! `option_value` (`deny` denies, `allow` and any other value allow); with
//! neither the call is refused. Our interactions are all `permission`s:
//! `answers`, `question_action`, `notes`, `set_mode`, `kind`,
//! `option_index` and `text` are taken and ignored (a set mode is not
//! applied), which omniconfluxd(8) lists among the differences from the
//! seed.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{Handled, params, require_operator};
use crate::core::approvals::Settle;
use crate::core::inbox::{Answerer, Verdict};
use crate::daemon::{Daemon, ReplyTo, Req, router};
use crate::errors::{Code, RpcError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RespondParams {
    session_id: String,
    #[serde(default)]
    behavior: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    option_value: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    // Taken and ignored (module comment).
    #[serde(default, rename = "answers")]
    _answers: Option<Value>,
    #[serde(default, rename = "question_action")]
    _question_action: Option<String>,
    #[serde(default, rename = "notes")]
    _notes: Option<Value>,
    #[serde(default, rename = "set_mode")]
    _set_mode: Option<String>,
    #[serde(default, rename = "kind")]
    _kind: Option<String>,
    #[serde(default, rename = "option_index")]
    _option_index: Option<Value>,
    #[serde(default, rename = "text")]
    _text: Option<String>,
}

pub fn dispatch(d: &mut Daemon, req: Req, p: Map<String, Value>) {
    let r = respond(d, &req, p);
    super::finish(d, req, r);
}

fn respond(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let RespondParams {
        session_id,
        behavior,
        reason,
        option_value,
        request_id,
        ..
    } = params(p)?;
    require_operator(req)?;
    let verdict = match (behavior.as_deref(), option_value.as_deref()) {
        (Some("allow"), _) => Verdict::Allow,
        (Some("deny"), _) => Verdict::Deny,
        (Some(other), _) => {
            return Err(RpcError::invalid_params(format!(
                "behavior must be allow or deny, found {other:?}"
            )));
        }
        (None, Some("deny")) => Verdict::Deny,
        (None, Some(_)) => Verdict::Allow,
        (None, None) => {
            return Err(RpcError::invalid_params(
                "an answer needs behavior or option_value",
            ));
        }
    };
    if reason
        .as_ref()
        .is_some_and(|r| r.len() > 4096 || r.chars().any(|c| c.is_control() && c != '\n'))
    {
        return Err(RpcError::invalid_params(
            "reason must be at most 4096 bytes without control characters",
        ));
    }
    let Some(s) = d.core.sessions.get(&session_id) else {
        return Err(RpcError::new(
            Code::SessionNotFound,
            format!("unknown session {session_id}"),
        ));
    };
    let open = match &request_id {
        Some(id) => match s.open.iter().find(|a| &a.approval_id == id) {
            Some(a) => a.approval_id.clone(),
            None => {
                return Err(RpcError::new(
                    Code::NotPending,
                    format!("request {id} of session {session_id} is not waiting for an answer"),
                ));
            }
        },
        None => match s.open.first() {
            Some(a) => a.approval_id.clone(),
            None => return Ok(Some(Value::Null)),
        },
    };
    let pid = req
        .conn()
        .and_then(|c| d.socket.conns.get(&c))
        .map_or(0, |c| c.peer_pid);
    let surface = match req.to {
        ReplyTo::Relay { .. } => "relay",
        ReplyTo::Http(_) => "http",
        ReplyTo::Socket { .. } => "socket",
    };
    let answer = Settle {
        id: open,
        verdict,
        by: Answerer::Operator { pid },
        surface,
        reason,
        withdraw: false,
    };
    let req = req.clone();
    router::sessions::answer(d, answer, None, move |d, r| {
        d.answer(req, r.map(|_| Value::Null))
    });
    Ok(None)
}
