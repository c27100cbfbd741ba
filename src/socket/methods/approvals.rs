//! The daemon socket's methods of the approvals inbox (issue 3, Approvals).
//!
//! | method           | who      | answers                               |
//! |------------------|----------|---------------------------------------|
//! | approvals.list   | anyone*  | {approvals}                           |
//! | approvals.get    | anyone*  | the approval                          |
//! | approvals.answer | operator | the resolved approval, once committed |
//!
//! *a caller inside a session sees only its own session's approvals.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Handled, params, require_operator};
use crate::core::approvals::{self, Settle};
use crate::core::inbox::{Answerer, Verdict};
use crate::daemon::{Daemon, Req, router};
use crate::errors::{Code, RpcError};
use crate::socket::views;

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "approvals.list" => approvals_list(d, &req, p),
        "approvals.get" => approvals_get(d, &req, p),
        "approvals.answer" => approvals_answer(d, &req, p),
        other => Err(super::unknown_method(other)),
    };
    super::finish(d, req, result);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalsListParams {
    #[serde(default)]
    all: bool,
}

/// Whether `req`'s caller may see `item`: the operator sees every item; a
/// caller inside a session only its own session's, so that no session
/// learns what another asks for; anyone else none.
fn may_see(req: &Req, item: &crate::core::inbox::Item) -> bool {
    match &req.class {
        crate::procs::CallerClass::Operator => true,
        crate::procs::CallerClass::AgentSession(Some(s)) => {
            item.subject.session() == Some(s.as_str())
        }
        _ => false,
    }
}

fn approvals_list(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ApprovalsListParams { all } = params(p)?;
    let items: Vec<Value> = d
        .core
        .approvals
        .list(all)
        .into_iter()
        .filter(|i| may_see(req, i))
        .map(views::approval)
        .collect();
    Ok(Some(json!({"approvals": items})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalRef {
    request_id: String,
}

fn approvals_get(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ApprovalRef { request_id } = params(p)?;
    let not_found = |id: &str| RpcError::new(Code::NotFound, format!("no approval {id}"));
    if let Some(i) = d.core.approvals.get(&request_id) {
        return match may_see(req, i) {
            true => Ok(Some(views::approval(i))),
            false => Err(not_found(&request_id)),
        };
    }
    // Older than the history the inbox keeps in memory: the ledger has
    // every approval of every run (issue 10, item 11).
    let inbox = d.inbox.clone();
    let req = req.clone();
    let queued = d.ledger.read(Box::new(move |conn| {
        let found = approvals::read_one(conn, &request_id);
        inbox.run(move |d| {
            let r = match found {
                Ok(Some(item)) if may_see(&req, &item) => Ok(views::approval(&item)),
                Ok(_) => Err(not_found(&request_id)),
                Err(e) => {
                    crate::error!("approval {request_id} could not be read: {e}");
                    Err(RpcError::new(
                        Code::Unavailable,
                        format!("the ledger could not read approval {request_id}"),
                    ))
                }
            };
            d.answer(req, r);
        });
    }));
    queued.map(|()| None).map_err(RpcError::from)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerParams {
    request_id: String,
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    /// The digest the operator saw; refused if the request is for another
    /// action.
    #[serde(default)]
    digest: Option<String>,
}

fn approvals_answer(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let AnswerParams {
        request_id,
        decision,
        reason,
        digest,
    } = params(p)?;
    let verdict = match decision.as_str() {
        "allow" => Verdict::Allow,
        "deny" => Verdict::Deny,
        other => {
            return Err(RpcError::invalid_params(format!(
                "decision must be allow or deny, found {other:?}"
            )));
        }
    };
    let pid = req
        .conn()
        .and_then(|c| d.socket.conns.get(&c))
        .map_or(0, |c| c.peer_pid);
    if let Err(e) = require_operator(req) {
        crate::warn!(
            "refused approvals.answer for {request_id} from a caller of class {} (pid {pid})",
            req.class.name()
        );
        return Err(e);
    }
    if reason
        .as_ref()
        .is_some_and(|r| r.len() > 4096 || r.chars().any(|c| c.is_control() && c != '\n'))
    {
        return Err(RpcError::invalid_params(
            "reason must be at most 4096 bytes without control characters",
        ));
    }
    let req = req.clone();
    let answer = Settle {
        id: request_id,
        verdict,
        by: Answerer::Operator { pid },
        surface: "socket",
        reason,
        withdraw: false,
        grant: None,
    };
    router::sessions::answer(d, answer, digest.as_deref(), move |d, r| {
        d.answer(req, r.map(|i| views::approval(&i)))
    });
    Ok(None)
}
