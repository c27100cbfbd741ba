//! The daemon socket's views of domain types: the snake_case objects its
//! methods answer with and its notifications carry (DESIGN.md, "Surfaces
//! and their conventions": each surface owns its wire types, and the core's
//! types know nothing of JSON field names). HTTP answers with the same
//! objects where its routes show the same thing (GET /seats, /approvals).
//! The plugin wire's views are the plugin surface's, in src/plugins/.

use serde_json::{Value, json};

use crate::agents::{Interaction, PermissionMode};
use crate::core::inbox::{Item, Target};
use crate::core::seats::Seat;
use crate::core::sessions::{OpenAsk, Session, State};
use crate::lanes::controller::Lane;

/// The daemon socket's Session (snake_case; seed 004's fields where
/// they apply, sessions.list's state fields as issue 3 names them).
pub fn session(s: &Session, node: &str) -> Value {
    // seed 004's SessionStatus.
    let status = match s.state() {
        State::Ended => "dead",
        State::Starting => "starting",
        State::AwaitingApproval => "awaiting_input",
        State::Running => "working",
        State::Idle => "idle",
    };
    let interaction = s.open.first().map(interaction);
    // seed 004: "awaiting" for awaiting_input, else the status; while
    // the agent's harness retries a failed API call, what holds it up
    // (issue 10, item 13).
    let status_label = match (&s.retry, status) {
        (Some((r, _)), "working") if r.error_status == Some(429) => "rate-limited",
        (Some(_), "working") => "retrying",
        (_, "awaiting_input") => "awaiting",
        _ => status,
    };
    let retry = s.retry.as_ref().map(|(r, since)| {
        json!({
            "attempt": r.attempt,
            "max_retries": r.max_retries,
            "error_status": r.error_status,
            "error": r.error,
            "retry_delay_ms": r.retry_delay_ms,
            "since": crate::clock::format_ts(*since),
        })
    });
    let mut v = json!({
        "id": s.id,
        "agent": s.harness,
        "harness": s.harness,
        "provider": s.provider,
        "transport": s.transport.wire_name(),
        "agent_session_id": s.agent_session_id,
        "name": s.name,
        "cwd": s.cwd.display().to_string(),
        "node": node,
        "source": "spawned",
        "input_mode": "api",
        "state": s.state().wire_name(),
        "status": status,
        "status_label": status_label,
        "status_since": crate::clock::format_ts(s.status_since_ms),
        "retry": retry,
        "turn": s.turn,
        "turn_active": s.turn_active,
        "end_reason": s.end_reason.map(crate::agents::EndReason::wire_name),
        "pending_approvals": s.open.len(),
        "parent": s.parent,
        "created_at": s.created_at,
        "can_prompt": s.can_prompt(),
        "queued": s.queued(),
        "interaction": interaction,
        "summary": {
            "model_name": s.model,
            "tokens": s.input_tokens + s.output_tokens,
            "last_activity": s.last_activity_ms.map(crate::clock::format_ts),
        },
        "exit": s.exit.map(|e| json!({"code": e.code, "signal": e.signal.map(crate::procs::signal_name)})),
    });
    absent_when_null(&mut v, &["agent_session_id", "name", "interaction", "exit"]);
    v
}

/// Removes the `keys` of object `v` whose value is null: seed 004's
/// optional Session fields are absent, not null, when there is nothing to
/// say ("interaction?: present only while the session waits for input").
pub fn absent_when_null(v: &mut Value, keys: &[&str]) {
    if let Value::Object(m) = v {
        for k in keys {
            if m.get(*k).is_some_and(Value::is_null) {
                m.remove(*k);
            }
        }
    }
}

/// seed 004's Interaction of a session's oldest open request. A plan
/// offers approving it as is, approving it and accepting edits from then
/// on (an `option_value` that is a permission mode, which
/// `sessions.respond` turns into an allow that sets it), and keeping on
/// planning; a question offers no options: its answers name the labels.
fn interaction(a: &OpenAsk) -> Value {
    let mut v = json!({
        "kind": a.interaction.kind(),
        "message": a.tool,
        "tool_name": a.tool_name,
        "tool_input": a.preview,
        "request_id": a.approval_id,
    });
    match &a.interaction {
        Interaction::Permission => {
            v["options"] = json!([
                {"label": "Allow", "value": "allow"},
                {"label": "Deny", "value": "deny", "reject": true},
            ]);
        }
        Interaction::Question(qs) => {
            v["questions"] = qs
                .iter()
                .map(|q| {
                    json!({
                        "header": q.header,
                        "question": q.question,
                        "multi_select": q.multi_select,
                        "options": q.options,
                        "option_descriptions": q.option_descriptions,
                    })
                })
                .collect();
        }
        Interaction::Plan(plan) => {
            v["plan"] = json!(plan);
            v["options"] = json!([
                {"label": "Approve", "value": "allow"},
                {"label": "Approve and accept edits", "value": PermissionMode::AcceptEdits.wire_name()},
                {"label": "Keep planning", "value": "deny", "reject": true},
            ]);
        }
    }
    v
}

/// The daemon socket's shape (snake_case), also HTTP's GET /seats item.
pub fn seat(s: &Seat) -> Value {
    json!({
        "harness": s.cfg.harness,
        "origin": s.origin.wire_name(),
        "provider": s.cfg.provider,
        "family": s.cfg.family,
        "transport": s.cfg.transport,
        "command": s.cfg.command,
        "args": s.cfg.args,
        "model": s.cfg.model,
        "status": s.status_name(),
        "reason": s.reason,
        "program": s.program.as_ref().map(|p| p.display().to_string()),
        "sign_in": s.sign_in_name(),
        "probed_at": s.probed_at_ms.map(crate::clock::format_ts),
    })
}

/// The daemon socket's shape of an item (snake_case).
pub fn approval(item: &Item) -> Value {
    let r = item.resolution.as_ref();
    json!({
        "request_id": item.id,
        "subject": item.subject.kind(),
        "session": item.subject.session(),
        "plugin": item.subject.plugin(),
        "summary": item.subject.summary(),
        "action": item.subject.action(),
        "tool": item.subject.tool(),
        "digest": item.subject.digest(),
        "risk": item.risk.wire_name(),
        "created_at": crate::clock::format_ts(item.created_ms),
        "expires_at": item.expires_ms.map(crate::clock::format_ts),
        "fallback": item.fallback.name(),
        "state": if r.is_some() { "resolved" } else { "pending" },
        "decision": r.map(|r| r.verdict.wire_name()),
        "delivered": r.map(|r| r.delivered),
        "answered_by": r.map(|r| r.by.describe()),
        "surface": r.map(|r| r.surface),
        "answered_at": r.map(|r| crate::clock::format_ts(r.at_ms)),
        "reason": r.and_then(|r| r.reason.clone()),
        "target": item.subject.target().map(Target::to_json),
        "answer": r
            .and_then(|r| r.answer.as_deref())
            .and_then(|a| serde_json::from_str::<Value>(a).ok()),
    })
}

/// The socket's view of a lane (snake_case).
pub fn lane(l: &Lane, node: &str) -> Value {
    let verdict = l
        .machine
        .last_verdict
        .as_ref()
        .map(|(v, c)| json!({"verdict": v, "commit": c}));
    let (head, stale) = crate::lanes::controller::head_and_stale(l);
    json!({
        "lane": l.id,
        "repo": l.repo.display().to_string(),
        "base": l.base,
        "branch": l.branch,
        "worktree": l.worktree.display().to_string(),
        "state": l.machine.stage.state(),
        "stage": l.machine.stage.name(),
        "since": crate::clock::format_ts(l.stage_since_ms),
        "builder": {"session": l.builder_session, "harness": l.builder.harness, "provider": l.builder.provider, "family": l.builder.family, "model": l.builder.model},
        "verifier": l.verifier.to_json(),
        "verifier_session": l.verifier_session,
        "verdict": verdict,
        "head": head,
        "stale": stale,
        "rounds": l.machine.rounds_used,
        "max_rounds": l.machine.max_rounds,
        "task": {"task": l.task.task, "name": l.task.name, "acceptance": {"name": l.task.acceptance_name, "command": l.task.acceptance_command}},
        "last_check": l.last_check.as_ref().map(|o| json!({"passed": o.passed(), "summary": o.summary(), "tail": o.tail})),
        "reason": l.reason,
        "waits_for_operator": l.machine.stage.waits_for_operator(),
        "created_at": crate::clock::format_ts(l.created_ms),
        "archived": l.archived,
        "node": node,
    })
}
