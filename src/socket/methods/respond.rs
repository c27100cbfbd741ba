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
//! answer and returns success"), once its fields are valid. So does a
//! session in a tmux pane the scans know ([`tmux_pane`]): no agent waits
//! on the node there.
//!
//! The decision, in this order:
//!
//! | fields                                  | decision                          |
//! |-----------------------------------------|-----------------------------------|
//! | `behavior: "deny"`                      | deny, `reason` to the agent       |
//! | `question_action: "cancel"` or `"chat"` | deny (a question declined)        |
//! | `behavior: "allow"`                     | allow                             |
//! | `option_value: "deny"` / `"allow"`      | deny / allow                      |
//! | `option_value` a permission mode        | allow that also sets that mode    |
//! | `answers` alone                         | allow                             |
//!
//! An allow of a `question` carries `answers` (question text -> a label,
//! or labels for a multi-select question), one for every question; an
//! allow of any kind may carry `set_mode` (`acceptEdits`, `default`,
//! `auto`), which Claude Code takes after the answer. What does not fit
//! its request is refused with -32602 before anything is answered: answers
//! for a permission or a plan, a question allowed without them, answers to
//! questions not asked or several labels for a single-select question,
//! `set_mode` with a deny or on an ACP session (ACP has no modes here).
//! `notes` (Codex's) and `kind`, `option_index`, `text` are taken and
//! ignored, as the seed says the node does.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{Handled, params, require_operator};
use crate::agents::{Grant, Interaction, PermissionMode, Transport};
use crate::core::approvals::Settle;
use crate::core::inbox::{Answerer, Verdict};
use crate::daemon::{Daemon, ReplyTo, Req, router};
use crate::errors::{Code, RpcError};

use crate::limits::RESPOND_TEXT_MAX as TEXT_MAX;

#[derive(Deserialize)]
#[serde(untagged)]
enum Answer {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RespondParams {
    session_id: String,
    #[serde(default)]
    behavior: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    answers: Option<BTreeMap<String, Answer>>,
    #[serde(default)]
    question_action: Option<String>,
    #[serde(default)]
    set_mode: Option<String>,
    #[serde(default)]
    option_value: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    // Taken and ignored (module comment).
    #[serde(default, rename = "notes")]
    _notes: Option<Value>,
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

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::invalid_params(message)
}

fn plain_text(t: &str) -> bool {
    t.len() <= TEXT_MAX && !t.chars().any(|c| c.is_control() && c != '\n')
}

/// The decision and the mode an option_value or set_mode asks for.
fn decide(p: &RespondParams) -> Result<(Verdict, Option<PermissionMode>), RpcError> {
    let mode = match p.set_mode.as_deref() {
        None => None,
        Some(m) => Some(PermissionMode::from_wire_name(m).ok_or_else(|| {
            invalid(format!(
                "set_mode must be acceptEdits, default or auto, found {m:?}"
            ))
        })?),
    };
    let action = match p.question_action.as_deref() {
        None | Some("") => None,
        Some(a @ ("cancel" | "chat")) => Some(a),
        Some(other) => {
            return Err(invalid(format!(
                "question_action must be cancel or chat, found {other:?}"
            )));
        }
    };
    let verdict = match (p.behavior.as_deref(), action, p.option_value.as_deref()) {
        (Some("deny"), _, _) | (None, Some(_), _) => Verdict::Deny,
        (Some("allow"), Some(a), _) => {
            return Err(invalid(format!(
                "behavior allow contradicts question_action {a}"
            )));
        }
        (Some("allow"), None, _) => Verdict::Allow,
        (Some(other), _, _) => {
            return Err(invalid(format!(
                "behavior must be allow or deny, found {other:?}"
            )));
        }
        (None, None, Some("deny")) => Verdict::Deny,
        (None, None, Some("allow")) => Verdict::Allow,
        (None, None, Some(v)) => {
            let Some(m) = PermissionMode::from_wire_name(v) else {
                return Err(invalid(format!(
                    "option_value must be allow, deny or a permission mode, found {v:?}"
                )));
            };
            if mode.is_some_and(|set| set != m) {
                return Err(invalid(format!(
                    "option_value {v} contradicts set_mode {}",
                    p.set_mode.as_deref().unwrap_or_default()
                )));
            }
            return Ok((Verdict::Allow, Some(m)));
        }
        (None, None, None) if p.answers.is_some() => Verdict::Allow,
        (None, None, None) => {
            return Err(invalid(
                "an answer needs behavior, answers, question_action or option_value",
            ));
        }
    };
    if verdict == Verdict::Deny && mode.is_some() {
        return Err(invalid("set_mode goes with an allow, not a deny"));
    }
    Ok((verdict, mode))
}

/// A question's answers in the order it asked them, every question
/// answered, each with labels that fit it.
fn answers_for(
    asked: &[crate::agents::Question],
    mut given: BTreeMap<String, Answer>,
) -> Result<Vec<(String, Vec<String>)>, RpcError> {
    let mut out = Vec::with_capacity(asked.len());
    for q in asked {
        let Some(a) = given.remove(&q.question) else {
            return Err(invalid(format!(
                "answers has no answer to the question {:?}",
                q.question
            )));
        };
        let labels = match a {
            Answer::One(l) => vec![l],
            Answer::Many(ls) => ls,
        };
        if labels.is_empty() || (labels.len() > 1 && !q.multi_select) {
            return Err(invalid(format!(
                "the question {:?} takes {}, found {} labels",
                q.question,
                if q.multi_select {
                    "one label or more"
                } else {
                    "one label"
                },
                labels.len()
            )));
        }
        let bytes: usize = labels.iter().map(String::len).sum();
        if bytes > TEXT_MAX || !labels.iter().all(|l| plain_text(l)) {
            return Err(invalid(format!(
                "the answer to {:?} must be at most {TEXT_MAX} bytes without control characters",
                q.question
            )));
        }
        out.push((q.question.clone(), labels));
    }
    if let Some(extra) = given.keys().next() {
        return Err(invalid(format!(
            "answers names a question that was not asked: {extra:?}"
        )));
    }
    Ok(out)
}

fn respond(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let mut p: RespondParams = params(p)?;
    require_operator(req)?;
    let (verdict, mode) = decide(&p)?;
    if p.reason.as_deref().is_some_and(|r| !plain_text(r)) {
        return Err(invalid(format!(
            "reason must be at most {TEXT_MAX} bytes without control characters"
        )));
    }
    let session_id = p.session_id.clone();
    if d.tmux.state.owns_id(&session_id) {
        return tmux_pane(d, req, session_id, p.request_id);
    }
    let Some(s) = d.core.sessions.get(&session_id) else {
        return Err(RpcError::new(
            Code::SessionNotFound,
            format!("unknown session {session_id}"),
        ));
    };
    if mode.is_some() && s.transport != Transport::StreamJson {
        return Err(invalid(format!(
            "set_mode needs a Claude Code (stream-json) session; {session_id} is {}",
            s.transport.wire_name()
        )));
    }
    let open = match &p.request_id {
        Some(id) => match s.open.iter().find(|a| &a.approval_id == id) {
            Some(a) => a,
            None => {
                return Err(RpcError::new(
                    Code::NotPending,
                    format!("request {id} of session {session_id} is not waiting for an answer"),
                ));
            }
        },
        None => match s.open.first() {
            Some(a) => a,
            None => return Ok(Some(Value::Null)),
        },
    };
    let answers = match (&open.interaction, p.answers.take(), verdict) {
        (Interaction::Question(asked), Some(given), Verdict::Allow) => answers_for(asked, given)?,
        (Interaction::Question(_), None, Verdict::Allow) => {
            return Err(invalid(format!(
                "request {} is a question: allow it with answers, or decline it with question_action cancel",
                open.approval_id
            )));
        }
        (Interaction::Question(_), _, _) => Vec::new(),
        (other, Some(_), _) => {
            return Err(invalid(format!(
                "answers are for a question; request {} is a {}",
                open.approval_id,
                other.kind()
            )));
        }
        (_, None, _) => Vec::new(),
    };
    if p.question_action.as_deref().is_some_and(|a| !a.is_empty())
        && !matches!(open.interaction, Interaction::Question(_))
    {
        return Err(invalid(format!(
            "question_action is for a question; request {} is a {}",
            open.approval_id,
            open.interaction.kind()
        )));
    }
    let id = open.approval_id.clone();
    let grant =
        (verdict == Verdict::Allow && (!answers.is_empty() || mode.is_some())).then_some(Grant {
            answers,
            set_mode: mode,
        });
    let reason = match (verdict, p.reason, p.question_action.as_deref()) {
        (Verdict::Deny, None, Some("chat")) => {
            Some("The user wants to talk this over before answering.".to_string())
        }
        (Verdict::Deny, None, Some("cancel")) => Some("The user declined to answer.".to_string()),
        (_, r, _) => r,
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
        id,
        verdict,
        by: Answerer::Operator { pid },
        surface,
        reason,
        withdraw: false,
        grant,
    };
    let req = req.clone();
    router::sessions::answer(d, answer, None, move |d, r| {
        d.answer(req, r.map(|_| Value::Null))
    });
    Ok(None)
}

/// A respond to a session in a tmux pane: no agent waits on the node for
/// the answer, so a session the scans know takes it and drops it (seed
/// 004: "In all other cases, the node drops the answer and returns
/// success"); an answer is typed into the pane with `sessions.key`. Its
/// `interaction` has no `request_id`, so one given names nothing waiting.
fn tmux_pane(d: &mut Daemon, req: &Req, sid: String, request_id: Option<String>) -> Handled {
    let id = sid.clone();
    let then: router::tmux::Then = Box::new(move |d, req, s| {
        let out = match (s, request_id) {
            (None, _) => Err(RpcError::new(
                Code::SessionNotFound,
                format!("unknown session {sid}"),
            )),
            (Some(_), Some(id)) => Err(RpcError::new(
                Code::NotPending,
                format!("request {id} of session {sid} is not waiting for an answer"),
            )),
            (Some(_), None) => Ok(Value::Null),
        };
        d.answer(req, out)
    });
    router::tmux::when_seen(d, req.clone(), id, then);
    Ok(None)
}
