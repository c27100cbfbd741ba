//! The approvals inbox's rules beside the pure inbox (`core::inbox`;
//! issue 3, "The approvals inbox"): the risk gate and rule answers when a
//! request comes in, the ledger rows and the session's approval.request /
//! approval.resolved events, expiry with its fallback, and who an answer
//! goes to.
//!
//! Three kinds of request come in: an agent's permission
//! ([`add_agent_request`], risk by the gate and its rules, the config's
//! timeout and fallback), a plugin's task ([`add_plugin_task`], once the
//! plugin host has stored the request: always high risk, never answered by
//! a rule, denied as `approval-expired` after 30 minutes) and a lane's
//! merge ([`add_lane_merge`]). A plugin's task has no session: it writes no
//! approval events, its ledger row has `session` NULL, `action` `task` and
//! `tool` `tasks.create`, and the plugin and the whole request are in
//! `plugin_requests` under the same id.
//!
//! Nothing here knows the daemon, the sessions, the lanes or the plugins
//! (DESIGN.md, "How subsystems talk"; issue 11). The functions take the
//! inbox, the config and the time, push the ledger rows into the batch
//! they are given, and return [`Effect`]s: an expiry timer with its item's
//! id, or an answer to settle now (a rule's). Settling an answer is the
//! router's (daemon/router/sessions.rs): it takes the pending item
//! ([`pending`]), asks [`owner`] who the answer goes to (the session whose
//! agent asked, the lane that waits to merge, the plugin request), hands
//! it to that subsystem, and closes the item with [`close`] and whether
//! the owner could still take it. So a rule's answer to a request that an
//! agent's line just made is delivered after that line is handled, never
//! from inside it.
//!
//! Every item's ledger row carries what its history needs (issue 10, items
//! 11 and 12): an agent request's exact action (`inbox::Target`), a plugin
//! task's plugin and summary. At start [`read_left`] gives the last run's
//! pending requests (withdrawn, [`withdraw_stale`]) and its newest
//! `limits::INBOX_RESOLVED_KEPT` resolved ones, which go back into the
//! inbox's history; `approvals.get` of an older id reads the row
//! ([`read_one`]).
//!
//! Integration point for another kind of request: add a `Subject` variant
//! in `core::inbox` and an [`Owner`] for it, create items with an `add_*`
//! here, and let the router hand the owner its answer.

use ring::digest;
use rusqlite::types::Value as Sql;
use serde_json::{Value, json};

use crate::agents::{Grant, PermissionRequest};
use crate::config::FileConfig;
use crate::core::inbox::{
    AgentAsk, Answerer, Fallback, Inbox, InboxError, Item, LaneMerge, PluginTask, Resolution, Risk,
    Subject, Target, Verdict,
};
use crate::errors::{Code, RpcError};
use crate::ledger::Op;
use crate::limits;

const UPSERT: &str = "INSERT OR REPLACE INTO approvals (id, subject, session, action, tool, digest, risk, created_at, expires_at, fallback, \
                      state, decision, delivered, answered_by, surface, answered_at, reason, plugin, summary, target, answer) \
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)";

/// The columns `read_items` reads, in the order `item_of_row` takes them.
const ITEM_COLUMNS: &str = "id, subject, session, action, tool, digest, risk, created_at, expires_at, fallback, \
                            decision, delivered, answered_by, surface, answered_at, reason, plugin, summary, target, answer";

/// Lowercase hex SHA-256 of `bytes`: what binds an answer to its action.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::ids::hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

/// The ledger row of an item, as it is now.
pub fn persist(item: &Item) -> Op {
    let r = item.resolution.as_ref();
    let t = |s: Option<String>| s.map(Sql::Text).unwrap_or(Sql::Null);
    Op::Exec {
        sql: UPSERT,
        params: vec![
            Sql::Text(item.id.clone()),
            Sql::Text(item.subject.kind().into()),
            t(item.subject.session().map(str::to_string)),
            Sql::Text(item.subject.action().into()),
            Sql::Text(item.subject.tool().into()),
            Sql::Text(item.subject.digest().into()),
            Sql::Text(item.risk.wire_name().into()),
            Sql::Text(crate::clock::format_ts(item.created_ms)),
            t(item.expires_ms.map(crate::clock::format_ts)),
            Sql::Text(item.fallback.name().into()),
            Sql::Text(if r.is_some() { "resolved" } else { "pending" }.into()),
            t(r.map(|r| r.verdict.wire_name().to_string())),
            r.map(|r| Sql::Integer(r.delivered as i64))
                .unwrap_or(Sql::Null),
            t(r.map(|r| r.by.describe())),
            t(r.map(|r| r.surface.to_string())),
            t(r.map(|r| crate::clock::format_ts(r.at_ms))),
            t(r.and_then(|r| r.reason.clone())),
            t(item.subject.plugin().map(str::to_string)),
            t(item.subject.summary().map(str::to_string)),
            t(item.subject.target().map(|x| x.to_json().to_string())),
            t(r.and_then(|r| r.answer.clone())),
        ],
    }
}

/// What the inbox asks of the router.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Arm item `id`'s expiry timer, `after_ms` from now; when it fires
    /// the router asks [`expire`] what to do.
    Expire { id: String, after_ms: i64 },
    /// Settle this answer now (a config rule answered the request).
    Settle(Settle),
}

/// An answer to deliver to an item's owner and record.
#[derive(Clone, Debug, PartialEq)]
pub struct Settle {
    pub id: String,
    pub verdict: Verdict,
    pub by: Answerer,
    /// Where the answer came in, as `Resolution::surface` names it.
    pub surface: &'static str,
    pub reason: Option<String>,
    /// The owner gets a cancel, but the request is recorded undelivered
    /// (a withdrawn request: the `withdraw` fallback).
    pub withdraw: bool,
    /// An allow's answers and mode switch (`sessions.respond`); only an
    /// agent's request takes one.
    pub grant: Option<Grant>,
}

/// The ledger's record of what `g` carried (the `answer` column):
/// `{"answers": {question: [label, ...]}, "set_mode": mode}`.
pub fn answer_json(g: &Grant) -> String {
    let answers: serde_json::Map<String, Value> = g
        .answers
        .iter()
        .map(|(q, labels)| (q.clone(), json!(labels)))
        .collect();
    json!({"answers": answers, "set_mode": g.set_mode.map(|m| m.wire_name())}).to_string()
}

/// Who an item's answer goes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Owner<'a> {
    /// The agent of `session` asked; `key` is its transport's request.
    Session { session: &'a str, key: &'a str },
    /// Lane `lane` waits to merge `commit`.
    Lane { lane: &'a str, commit: &'a str },
    /// The plugin host's task request of the item's id.
    PluginRequest { id: &'a str },
}

/// Who the answer to `item` goes to.
pub fn owner(item: &Item) -> Owner<'_> {
    match &item.subject {
        Subject::Agent(a) => Owner::Session {
            session: &a.session,
            key: &a.agent_request_key,
        },
        Subject::LaneMerge(m) => Owner::Lane {
            lane: &m.lane,
            commit: &m.commit,
        },
        Subject::PluginTask(_) => Owner::PluginRequest { id: &item.id },
    }
}

/// The event `kind` in session `sid`'s stream.
fn session_event(sid: &str, kind: &str, data: Value) -> Op {
    Op::Event {
        stream: sid.to_string(),
        kind: kind.to_string(),
        ts: crate::clock::now_ts(),
        data: data.to_string(),
    }
}

/// An agent's permission request, as the session hands it over.
#[derive(Clone, Debug, PartialEq)]
pub struct Ask {
    pub session: String,
    /// The item's id: `<session>-a<n>`.
    pub id: String,
    pub request: PermissionRequest,
    /// The session's worktree, which the risk rules judge paths against.
    pub cwd: std::path::PathBuf,
}

/// An agent asked for permission: label it, record it into `ops`, and
/// answer it at once when a rule says so.
pub fn add_agent_request(
    inbox: &mut Inbox,
    cfg: &FileConfig,
    ask: &Ask,
    now_ms: i64,
    ops: &mut Vec<Op>,
) -> Vec<Effect> {
    let (sid, id, req) = (ask.session.as_str(), ask.id.as_str(), &ask.request);
    let target = Target::of_input(&req.input);
    // The rules and the label see the worse of the announced kind and the
    // target (core::risk, "effective_action").
    let announced = req.action.wire_name();
    let action = crate::core::risk::effective_action(announced, target.as_ref());
    if action != announced {
        crate::info!(
            "approval {id}: announced as {announced}, its {} makes it {action}",
            target.as_ref().map_or("input", |t| t.kind.as_str())
        );
    }
    let digest = sha256_hex(req.input.to_string().as_bytes());
    let gate =
        crate::core::risk::judge(&cfg.approvals.rule, action, &req.tool, &req.input, &ask.cwd);
    let timeout_ms = (cfg.approvals.timeout > 0).then(|| (cfg.approvals.timeout * 1000) as i64);
    let subject = Subject::Agent(AgentAsk {
        session: sid.to_string(),
        agent_request_key: req.agent_request_key.clone(),
        tool: req.title.clone(),
        action: action.to_string(),
        digest,
        target,
    });
    let item = match inbox.add(
        id.to_string(),
        subject,
        gate.risk,
        now_ms,
        timeout_ms,
        cfg.approvals.fallback(),
    ) {
        Ok(i) => i,
        Err(e) => {
            crate::error!("approval {id} could not be added: {e:?}");
            return Vec::new();
        }
    };
    ops.push(persist(item));
    ops.push(session_event(
        sid,
        "approval.request",
        json!({"requestId": id, "action": action, "risk": gate.risk.wire_name()}),
    ));
    crate::info!(
        "approval {id}: {} {:?} ({} risk) waits",
        action,
        req.title,
        gate.risk.wire_name()
    );
    if let Some((verdict, rule)) = gate.auto {
        return vec![Effect::Settle(Settle {
            id: id.to_string(),
            verdict,
            by: Answerer::Rule(rule),
            surface: "config-rule",
            reason: Some(format!("answered by [[approvals.rule]] {rule}")),
            withdraw: false,
            grant: None,
        })];
    }
    timeout_ms
        .map(|t| Effect::Expire {
            id: id.to_string(),
            after_ms: t,
        })
        .into_iter()
        .collect()
}

/// A plugin asked for a task at `created_ms` and the request is stored: it
/// waits for the operator, high risk (a task runs an agent and a command),
/// until `plugins.task_expiry_ms` after it was asked, then is denied by the
/// timer. The item's times are the request's, so approvals.get and
/// plugin.request.get show the same. No rule answers it: "nothing starts
/// unless the operator allows this very request" (seed 000, tasks.create).
/// Returns the item's ledger row and its expiry.
pub fn add_plugin_task(
    inbox: &mut Inbox,
    cfg: &FileConfig,
    id: &str,
    task: PluginTask,
    created_ms: i64,
    now_ms: i64,
) -> Result<(Op, Effect), InboxError> {
    let timeout = cfg.plugins.task_expiry_ms as i64;
    let item = inbox.add(
        id.to_string(),
        Subject::PluginTask(task),
        crate::core::risk::PLUGIN_TASK,
        created_ms,
        Some(timeout),
        Fallback::Deny,
    )?;
    crate::info!(
        "approval {id}: plugin task ({} risk) waits",
        item.risk.wire_name()
    );
    let expire = Effect::Expire {
        id: id.to_string(),
        after_ms: created_ms.saturating_add(timeout).saturating_sub(now_ms),
    };
    Ok((persist(item), expire))
}

/// Puts a lane's merge in the inbox as `<lane>-merge-<round>`: high risk
/// (it changes the base branch), with the approvals timeout and fallback of
/// the config, like an agent's request. Returns the item's ledger row and
/// its expiry, if it has one.
pub fn add_lane_merge(
    inbox: &mut Inbox,
    cfg: &FileConfig,
    id: &str,
    merge: LaneMerge,
    now_ms: i64,
) -> Result<(Op, Option<Effect>), InboxError> {
    let timeout = cfg.approvals.timeout;
    let timeout_ms = (timeout > 0).then(|| (timeout as i64).saturating_mul(1000));
    let item = inbox.add(
        id.to_string(),
        Subject::LaneMerge(merge),
        crate::core::risk::LANE_MERGE,
        now_ms,
        timeout_ms,
        cfg.approvals.fallback(),
    )?;
    crate::info!("approval {id}: lane merge waits for the operator");
    let expire = timeout_ms.map(|t| Effect::Expire {
        id: id.to_string(),
        after_ms: t,
    });
    Ok((persist(item), expire))
}

/// The pending item `id` an answer from outside the inbox is for, when
/// `expect_digest` (if given) is its action's.
pub fn pending(inbox: &Inbox, id: &str, expect_digest: Option<&str>) -> Result<Item, RpcError> {
    let item = inbox.pending(id).map_err(inbox_error(id))?;
    if expect_digest.is_some_and(|want| want != item.subject.digest()) {
        return Err(RpcError::new(
            Code::ActionMismatch,
            format!("approval {id} is for another action than the one answered"),
        ));
    }
    Ok(item.clone())
}

/// Resolves a pending item (its owner was told, or is gone), recording it
/// and the session's approval.resolved into `ops`.
#[allow(clippy::too_many_arguments)]
pub fn close(
    inbox: &mut Inbox,
    id: &str,
    verdict: Verdict,
    by: Answerer,
    surface: &'static str,
    delivered: bool,
    reason: Option<String>,
    answer: Option<String>,
    now_ms: i64,
    ops: &mut Vec<Op>,
) -> Option<Item> {
    let res = Resolution {
        verdict,
        by,
        surface,
        at_ms: now_ms,
        delivered,
        reason,
        answer,
    };
    let item = inbox.resolve(id, res).ok()?;
    ops.push(persist(&item));
    match &item.subject {
        Subject::Agent(a) => ops.push(session_event(
            &a.session,
            "approval.resolved",
            json!({"requestId": id, "decision": verdict.wire_name(), "delivered": delivered}),
        )),
        Subject::PluginTask(_) | Subject::LaneMerge(_) => {}
    }
    crate::info!(
        "approval {id}: {} by {} through {} (delivered {delivered})",
        verdict.wire_name(),
        item.resolution
            .as_ref()
            .map(|r| r.by.describe())
            .unwrap_or_default(),
        surface
    );
    Some(item)
}

/// The error of an answer to item `id` the inbox refused.
pub fn inbox_error(id: &str) -> impl Fn(InboxError) -> RpcError + '_ {
    move |e| match e {
        InboxError::NotPending => RpcError::new(
            Code::NotPending,
            format!("approval {id} was already answered, withdrawn or expired"),
        ),
        InboxError::NotFound | InboxError::Duplicate => {
            RpcError::new(Code::NotFound, format!("no approval {id}"))
        }
    }
}

/// Item `id`'s expiry timer fired: the answer its declared fallback gives,
/// when it is still pending and due.
pub fn expire(inbox: &Inbox, id: &str, now_ms: i64) -> Option<Settle> {
    if !inbox.is_due(id, now_ms) {
        return None;
    }
    let item = inbox.get(id)?;
    let waited_s = item
        .expires_ms
        .map_or(0, |at| at.saturating_sub(item.created_ms) / 1000);
    let (verdict, withdraw) = match item.fallback {
        Fallback::Deny => (Verdict::Deny, false),
        Fallback::Withdraw => (Verdict::Cancel, true),
    };
    Some(Settle {
        id: id.to_string(),
        verdict,
        by: Answerer::Timeout,
        surface: "timer",
        reason: Some(format!("no answer within {waited_s} s")),
        grant: None,
        withdraw,
    })
}

/// What the last run left in the ledger: its pending approvals, oldest
/// first, and its newest `limits::INBOX_RESOLVED_KEPT` resolved ones,
/// oldest first (issue 10, item 11: the audit trail survives a restart).
pub struct Left {
    pub pending: Vec<Item>,
    pub resolved: Vec<Item>,
}

pub fn read_left(conn: &rusqlite::Connection) -> rusqlite::Result<Left> {
    let pending = read_items(
        conn,
        &format!(
            "SELECT {ITEM_COLUMNS} FROM approvals WHERE state = 'pending' ORDER BY created_at"
        ),
        [],
    )?;
    let mut resolved = read_items(
        conn,
        &format!(
            "SELECT {ITEM_COLUMNS} FROM approvals WHERE state = 'resolved' ORDER BY answered_at DESC, id DESC LIMIT ?1"
        ),
        [limits::INBOX_RESOLVED_KEPT as i64],
    )?;
    resolved.reverse();
    Ok(Left { pending, resolved })
}

/// One approval of any run from the ledger, for `approvals.get` of an id
/// older than what the inbox keeps in memory.
pub fn read_one(conn: &rusqlite::Connection, id: &str) -> rusqlite::Result<Option<Item>> {
    Ok(read_items(
        conn,
        &format!("SELECT {ITEM_COLUMNS} FROM approvals WHERE id = ?1"),
        [id],
    )?
    .pop())
}

fn read_items<P: rusqlite::Params>(
    conn: &rusqlite::Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<Vec<Item>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map(params, |r| Ok(item_of_row(r)))?;
    let mut out = Vec::new();
    for row in rows {
        // A row this binary cannot read back (a kind it does not know) is
        // left out of the history rather than failing the whole read.
        if let Some(item) = row? {
            out.push(item);
        }
    }
    Ok(out)
}

fn item_of_row(r: &rusqlite::Row) -> Option<Item> {
    let text = |i: usize| r.get::<_, Option<String>>(i).ok().flatten();
    let id = text(0)?;
    let (tool, digest, summary) = (text(4)?, text(5)?, text(17).unwrap_or_default());
    let subject = match text(1)?.as_str() {
        "agent" => Subject::Agent(AgentAsk {
            session: text(2)?,
            agent_request_key: String::new(),
            tool,
            action: text(3)?,
            digest,
            target: text(18)
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| Target::from_json(&v)),
        }),
        "plugin-task" => Subject::PluginTask(PluginTask {
            plugin: text(16).unwrap_or_default(),
            summary,
            digest,
        }),
        "lane-merge" => Subject::LaneMerge(LaneMerge {
            lane: id.rsplit_once("-merge-").map(|(l, _)| l.to_string())?,
            summary,
            commit: digest,
        }),
        _ => return None,
    };
    let ts = |i: usize| text(i).as_deref().and_then(crate::clock::parse_ts);
    let verdict = match text(10).as_deref() {
        Some("allow") => Some(Verdict::Allow),
        Some("deny") => Some(Verdict::Deny),
        Some("cancel") => Some(Verdict::Cancel),
        _ => None,
    };
    let resolution = verdict.map(|verdict| Resolution {
        verdict,
        by: Answerer::Recorded(text(12).unwrap_or_default()),
        surface: surface_name(text(13).as_deref().unwrap_or_default()),
        at_ms: ts(14).unwrap_or(0),
        delivered: r.get::<_, Option<i64>>(11).ok().flatten().unwrap_or(0) != 0,
        reason: text(15),
        answer: text(19),
    });
    let fallback = text(9)
        .and_then(|t| t.parse().ok())
        .unwrap_or(Fallback::Deny);
    Some(Item::restored(
        id,
        subject,
        text(6)
            .as_deref()
            .and_then(Risk::parse)
            .unwrap_or(Risk::High),
        ts(7).unwrap_or(0),
        ts(8),
        fallback,
        resolution,
    ))
}

/// The surfaces an answer comes through, as `Resolution::surface` names
/// them.
fn surface_name(s: &str) -> &'static str {
    match s {
        "socket" => "socket",
        "http" => "http",
        "config-rule" => "config-rule",
        "timer" => "timer",
        "daemon" => "daemon",
        _ => "unknown",
    }
}

/// A request pending when the daemon stopped: resolved undelivered in the
/// ledger (rows into `ops`); returns it resolved, for the inbox's history.
pub fn withdraw_stale(mut item: Item, now_ms: i64, ops: &mut Vec<Op>) -> Item {
    let (id, session) = (item.id.clone(), item.subject.session().map(str::to_string));
    item.resolution = Some(Resolution {
        verdict: Verdict::Cancel,
        by: Answerer::Daemon("restarted".into()),
        surface: "daemon",
        at_ms: now_ms,
        delivered: false,
        reason: None,
        answer: None,
    });
    let (id, session) = (id.as_str(), session.as_deref());
    ops.push(Op::Exec {
        sql: "UPDATE approvals SET state = 'resolved', decision = 'cancel', delivered = 0, answered_by = 'daemon: restarted', \
              surface = 'daemon', answered_at = ?2 WHERE id = ?1 AND state = 'pending'",
        params: vec![Sql::Text(id.into()), Sql::Text(crate::clock::format_ts(now_ms))],
    });
    if let Some(s) = session {
        ops.push(session_event(
            s,
            "approval.resolved",
            json!({"requestId": id, "decision": "cancel", "delivered": false}),
        ));
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::ActionKind;

    const NOW: i64 = 1_763_112_667_412;

    fn config(toml: &str) -> FileConfig {
        crate::config::parse(toml).expect("a valid config")
    }

    fn ask(session: &str, id: &str, command: &str) -> Ask {
        Ask {
            session: session.into(),
            id: id.into(),
            request: PermissionRequest {
                agent_request_key: "key-1".into(),
                tool_call_id: None,
                title: "Bash: run it".into(),
                tool: "Bash".into(),
                action: ActionKind::Execute,
                input: json!({"command": command}),
                options: Vec::new(),
                interaction: Default::default(),
            },
            cwd: "/srv/work".into(),
        }
    }

    /// The kinds and streams of the events among `ops`.
    fn events(ops: &[Op]) -> Vec<(String, String, Value)> {
        ops.iter()
            .filter_map(|o| match o {
                Op::Event {
                    stream, kind, data, ..
                } => Some((
                    stream.clone(),
                    kind.clone(),
                    serde_json::from_str(data).unwrap(),
                )),
                _ => None,
            })
            .collect()
    }

    fn rows(ops: &[Op]) -> usize {
        ops.iter().filter(|o| matches!(o, Op::Exec { .. })).count()
    }

    #[test]
    fn each_kind_of_item_is_answered_to_its_own_owner() {
        let mut inbox = Inbox::default();
        let cfg = config("");
        let mut ops = Vec::new();
        add_agent_request(&mut inbox, &cfg, &ask("s-1", "s-1-a1", "ls"), NOW, &mut ops);
        let task = PluginTask {
            plugin: "p-1".into(),
            summary: "a task".into(),
            digest: "d".into(),
        };
        add_plugin_task(&mut inbox, &cfg, "plugin_1", task, NOW, NOW).unwrap();
        let merge = LaneMerge {
            lane: "l-1".into(),
            summary: "merge".into(),
            commit: "c0ffee".into(),
        };
        add_lane_merge(&mut inbox, &cfg, "l-1-merge-1", merge, NOW).unwrap();
        assert_eq!(
            owner(inbox.get("s-1-a1").unwrap()),
            Owner::Session {
                session: "s-1",
                key: "key-1"
            }
        );
        assert_eq!(
            owner(inbox.get("plugin_1").unwrap()),
            Owner::PluginRequest { id: "plugin_1" }
        );
        assert_eq!(
            owner(inbox.get("l-1-merge-1").unwrap()),
            Owner::Lane {
                lane: "l-1",
                commit: "c0ffee"
            }
        );
    }

    #[test]
    fn an_agent_request_is_recorded_announced_and_armed_to_expire() {
        let mut inbox = Inbox::default();
        let cfg = config("[approvals]\ntimeout = 90\n");
        let mut ops = Vec::new();
        let fx = add_agent_request(&mut inbox, &cfg, &ask("s-1", "s-1-a1", "ls"), NOW, &mut ops);
        assert_eq!(
            fx,
            vec![Effect::Expire {
                id: "s-1-a1".into(),
                after_ms: 90_000
            }]
        );
        assert_eq!(rows(&ops), 1);
        let ev = events(&ops);
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].0.as_str(), ev[0].1.as_str()),
            ("s-1", "approval.request")
        );
        assert_eq!(ev[0].2["requestId"], "s-1-a1");
        assert_eq!(ev[0].2["action"], "execute");
        let item = inbox.pending("s-1-a1").unwrap();
        assert_eq!(
            item.subject.digest(),
            sha256_hex(json!({"command": "ls"}).to_string().as_bytes())
        );
        // No timeout in the config: nothing to arm.
        let cfg = config("[approvals]\ntimeout = 0\n");
        let fx = add_agent_request(&mut inbox, &cfg, &ask("s-1", "s-1-a2", "ls"), NOW, &mut ops);
        assert!(fx.is_empty(), "{fx:?}");
    }

    #[test]
    fn a_rule_s_answer_is_returned_to_settle_not_applied_in_place() {
        let mut inbox = Inbox::default();
        let cfg = config("[[approvals.rule]]\naction = \"execute\"\nanswer = \"allow\"\n");
        let mut ops = Vec::new();
        let fx = add_agent_request(&mut inbox, &cfg, &ask("s-1", "s-1-a1", "ls"), NOW, &mut ops);
        assert_eq!(
            fx,
            vec![Effect::Settle(Settle {
                id: "s-1-a1".into(),
                verdict: Verdict::Allow,
                by: Answerer::Rule(1),
                surface: "config-rule",
                reason: Some("answered by [[approvals.rule]] 1".into()),
                grant: None,
                withdraw: false,
            })]
        );
        // Still pending: only the router's settle resolves it, once the
        // agent's line that asked is handled.
        assert!(inbox.pending("s-1-a1").is_ok());
    }

    #[test]
    fn closing_records_the_answer_and_only_a_session_s_item_has_an_event() {
        let mut inbox = Inbox::default();
        let cfg = config("");
        let mut ops = Vec::new();
        add_agent_request(&mut inbox, &cfg, &ask("s-1", "s-1-a1", "ls"), NOW, &mut ops);
        let task = PluginTask {
            plugin: "p-1".into(),
            summary: "a task".into(),
            digest: "d".into(),
        };
        add_plugin_task(&mut inbox, &cfg, "plugin_1", task, NOW, NOW).unwrap();
        let mut ops = Vec::new();
        let item = close(
            &mut inbox,
            "s-1-a1",
            Verdict::Deny,
            Answerer::Operator { pid: 7 },
            "socket",
            true,
            None,
            None,
            NOW,
            &mut ops,
        )
        .unwrap();
        assert_eq!(item.resolution.as_ref().unwrap().verdict, Verdict::Deny);
        assert_eq!(rows(&ops), 1);
        let ev = events(&ops);
        assert_eq!(ev[0].1, "approval.resolved");
        assert_eq!(
            ev[0].2,
            json!({"requestId": "s-1-a1", "decision": "deny", "delivered": true})
        );
        let mut ops = Vec::new();
        close(
            &mut inbox,
            "plugin_1",
            Verdict::Allow,
            Answerer::Operator { pid: 7 },
            "http",
            true,
            None,
            None,
            NOW,
            &mut ops,
        )
        .unwrap();
        assert_eq!((rows(&ops), events(&ops).len()), (1, 0));
        // Answered once: the next answer is refused.
        let e = pending(&inbox, "s-1-a1", None).unwrap_err();
        assert_eq!(e.code, Code::NotPending);
        assert!(
            close(
                &mut inbox,
                "s-1-a1",
                Verdict::Allow,
                Answerer::Timeout,
                "timer",
                false,
                None,
                None,
                NOW,
                &mut Vec::new()
            )
            .is_none()
        );
    }

    #[test]
    fn an_answer_for_another_action_is_refused() {
        let mut inbox = Inbox::default();
        let mut ops = Vec::new();
        add_agent_request(
            &mut inbox,
            &config(""),
            &ask("s-1", "s-1-a1", "ls"),
            NOW,
            &mut ops,
        );
        let e = pending(&inbox, "s-1-a1", Some("0000")).unwrap_err();
        assert_eq!(e.code, Code::ActionMismatch);
        let digest = sha256_hex(json!({"command": "ls"}).to_string().as_bytes());
        assert!(pending(&inbox, "s-1-a1", Some(&digest)).is_ok());
        assert_eq!(
            pending(&inbox, "nope", None).unwrap_err().code,
            Code::NotFound
        );
    }

    #[test]
    fn at_its_deadline_the_fallback_answers() {
        for (fallback, verdict, withdraw) in [
            ("deny", Verdict::Deny, false),
            ("withdraw", Verdict::Cancel, true),
        ] {
            let mut inbox = Inbox::default();
            let cfg = config(&format!(
                "[approvals]\ntimeout = 60\nfallback = \"{fallback}\"\n"
            ));
            let mut ops = Vec::new();
            add_agent_request(&mut inbox, &cfg, &ask("s-1", "s-1-a1", "ls"), NOW, &mut ops);
            assert_eq!(expire(&inbox, "s-1-a1", NOW + 59_000), None);
            assert_eq!(
                expire(&inbox, "s-1-a1", NOW + 60_000),
                Some(Settle {
                    id: "s-1-a1".into(),
                    verdict,
                    by: Answerer::Timeout,
                    surface: "timer",
                    reason: Some("no answer within 60 s".into()),
                    grant: None,
                    withdraw,
                }),
                "{fallback}"
            );
        }
    }
}
