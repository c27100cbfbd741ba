//! The glue between the pure approvals inbox (`core::inbox`) and the rest
//! of the daemon (issue 3, "The approvals inbox"): the risk gate and rule
//! answers when a request comes in, the ledger rows and the session's
//! approval.request / approval.resolved events, expiry timers with their
//! fallback, and delivery of an answer to the request's owner.
//!
//! Two kinds of request come in: an agent's permission
//! ([`add_agent_request`], risk by the gate and its rules, the config's
//! timeout and fallback) and a plugin's task ([`add_plugin_task`], from
//! `plugins::tasks` once the request is stored: always high risk, never
//! answered by a rule, denied as `approval-expired` after 30 minutes). A
//! plugin's task has no session: it writes no approval events, its ledger
//! row has `session` NULL, `action` `task` and `tool` `tasks.create`, and
//! the plugin and the whole request are in `plugin_requests` under the same
//! id. [`deliver`] tells the owner: the agent through its transport, the
//! plugin through `plugins::tasks::on_answer`.
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
//! in `core::inbox`, create items with `Inbox::add` plus [`persist`] and
//! [`arm_expiry`], and add an arm to [`deliver`] that tells the owner.

use ring::digest;
use rusqlite::types::Value as Sql;
use serde_json::{Value, json};
use std::time::Duration;

use crate::agents::{CommandError, Decision, PermissionRequest};
use crate::core::inbox::{
    AgentAsk, Answerer, Fallback, InboxError, Item, LaneMerge, PluginTask, Resolution, Risk,
    Subject, Target, Verdict,
};
use crate::core::sessions::{self, Effects};
use crate::daemon::Daemon;
use crate::errors::{Code, RpcError};
use crate::ledger::Op;
use crate::limits;

const UPSERT: &str = "INSERT OR REPLACE INTO approvals (id, subject, session, action, tool, digest, risk, created_at, expires_at, fallback, \
                      state, decision, delivered, answered_by, surface, answered_at, reason, plugin, summary, target) \
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)";

/// The columns `read_items` reads, in the order `item_of_row` takes them.
const ITEM_COLUMNS: &str = "id, subject, session, action, tool, digest, risk, created_at, expires_at, fallback, \
                            decision, delivered, answered_by, surface, answered_at, reason, plugin, summary, target";

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
        ],
    }
}

/// Schedules the expiry of a pending item at its deadline.
pub fn arm_expiry(d: &mut Daemon, item_id: &str, after_ms: i64) {
    let id = item_id.to_string();
    d.reactor
        .schedule(Duration::from_millis(after_ms.max(0) as u64), move |d| {
            expire(d, &id)
        });
}

/// An agent asked for permission: label it, record it, and answer it at
/// once when a rule says so.
pub fn add_agent_request(
    d: &mut Daemon,
    sid: &str,
    id: &str,
    req: &PermissionRequest,
    cwd: &std::path::Path,
    fx: &mut Effects,
) {
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
    let gate = crate::core::risk::judge(&d.cfg.approvals.rule, action, &req.tool, &req.input, cwd);
    let timeout_ms = (d.cfg.approvals.timeout > 0).then(|| (d.cfg.approvals.timeout * 1000) as i64);
    let fallback = d.cfg.approvals.fallback();
    let subject = Subject::Agent(AgentAsk {
        session: sid.to_string(),
        agent_request_key: req.agent_request_key.clone(),
        tool: req.title.clone(),
        action: action.to_string(),
        digest,
        target,
    });
    let now = crate::clock::now_ms();
    let item = match d.core.approvals.add(
        id.to_string(),
        subject,
        gate.risk,
        now,
        timeout_ms,
        fallback,
    ) {
        Ok(i) => i.clone(),
        Err(e) => {
            crate::error!("approval {id} could not be added: {e:?}");
            return;
        }
    };
    fx.ops.push(persist(&item));
    fx.event(
        sid,
        "approval.request",
        json!({"requestId": id, "action": action, "risk": gate.risk.wire_name()}),
    );
    crate::info!(
        "approval {id}: {} {:?} ({} risk) waits",
        action,
        req.title,
        gate.risk.wire_name()
    );
    if let Some((verdict, rule)) = gate.auto {
        if let Err(e) = settle(
            d,
            id,
            verdict,
            Answerer::Rule(rule),
            "config-rule",
            Some(format!("answered by [[approvals.rule]] {rule}")),
            false,
            fx,
        ) {
            crate::warn!(
                "approval {id}: rule {rule} could not answer it: {}",
                e.message
            );
        }
        return;
    }
    if let Some(t) = timeout_ms {
        arm_expiry(d, id, t);
    }
}

/// A plugin asked for a task at `created_ms` and the request is stored: it
/// waits for the operator, high risk (a task runs an agent and a command),
/// until `plugins.task_expiry_ms` after it was asked, then is denied by the
/// timer. The item's times are the request's, so approvals.get and
/// plugin.request.get show the same. No rule answers it: "nothing starts
/// unless the operator allows this very request" (seed 000, tasks.create).
pub fn add_plugin_task(
    d: &mut Daemon,
    id: &str,
    task: PluginTask,
    created_ms: i64,
) -> Result<(), InboxError> {
    let timeout = d.cfg.plugins.task_expiry_ms as i64;
    let item = d
        .core
        .approvals
        .add(
            id.to_string(),
            Subject::PluginTask(task),
            crate::core::risk::PLUGIN_TASK,
            created_ms,
            Some(timeout),
            Fallback::Deny,
        )?
        .clone();
    let rid = id.to_string();
    d.write(vec![persist(&item)], move |_d, r| {
        if let Err(e) = r {
            crate::error!("approval {rid}: the ledger refused its record: {e:?}");
        }
    });
    crate::info!(
        "approval {id}: plugin task ({} risk) waits",
        item.risk.wire_name()
    );
    arm_expiry(
        d,
        id,
        created_ms
            .saturating_add(timeout)
            .saturating_sub(crate::clock::now_ms()),
    );
    Ok(())
}

/// Puts a lane's merge in the inbox as `<lane>-merge-<round>`: high risk
/// (it changes the base branch), with the approvals timeout and fallback of
/// the config, like an agent's request.
pub fn add_lane_merge(d: &mut Daemon, id: &str, merge: LaneMerge) -> Result<(), InboxError> {
    let now = crate::clock::now_ms();
    let timeout = d.cfg.approvals.timeout;
    let timeout_ms = (timeout > 0).then(|| (timeout as i64).saturating_mul(1000));
    let fallback = d.cfg.approvals.fallback();
    let item = d
        .core
        .approvals
        .add(
            id.to_string(),
            Subject::LaneMerge(merge),
            crate::core::risk::LANE_MERGE,
            now,
            timeout_ms,
            fallback,
        )?
        .clone();
    let rid = id.to_string();
    d.write(vec![persist(&item)], move |_d, r| {
        if let Err(e) = r {
            crate::error!("approval {rid}: the ledger refused its record: {e:?}");
        }
    });
    crate::info!("approval {id}: lane merge waits for the operator");
    if let Some(t) = timeout_ms {
        arm_expiry(d, id, t);
    }
    Ok(())
}

/// Delivers `verdict` to the item's owner and resolves it; the ledger
/// writes go into `fx`. `withdraw` sends the owner a cancel but records
/// the request as undelivered (a withdrawn request).
#[allow(clippy::too_many_arguments)]
pub fn settle(
    d: &mut Daemon,
    id: &str,
    verdict: Verdict,
    by: Answerer,
    surface: &'static str,
    reason: Option<String>,
    withdraw: bool,
    fx: &mut Effects,
) -> Result<Item, RpcError> {
    let item = d
        .core
        .approvals
        .pending(id)
        .map_err(inbox_error(id))?
        .clone();
    let delivered = deliver(d, &item, verdict, &by, reason.clone(), fx)? && !withdraw;
    close(d, id, verdict, by, surface, delivered, reason, fx).ok_or_else(|| {
        RpcError::new(
            Code::NotPending,
            format!("approval {id} is no longer pending"),
        )
    })
}

/// Tells the owner of `item` the answer; Ok(false) when the owner can no
/// longer take it (the agent is gone, the request vanished, the plugin's
/// call no longer waits).
fn deliver(
    d: &mut Daemon,
    item: &Item,
    verdict: Verdict,
    by: &Answerer,
    reason: Option<String>,
    fx: &mut Effects,
) -> Result<bool, RpcError> {
    match &item.subject {
        Subject::PluginTask(_) => Ok(crate::daemon::router::plugins::task_answered(
            d, &item.id, verdict, by,
        )),
        Subject::LaneMerge(m) => Ok(crate::lanes::controller::on_merge_answer(
            d, &m.lane, &m.commit, verdict,
        )),
        Subject::Agent(a) => {
            let Some(s) = d.core.sessions.get_mut(&a.session) else {
                return Ok(false);
            };
            let pos = s.open.iter().position(|o| o.approval_id == item.id);
            let Some(drv) = s.driver.as_mut() else {
                return Ok(false);
            };
            let decision = match verdict {
                Verdict::Allow => Decision::Allow,
                Verdict::Deny => Decision::Deny { message: reason },
                Verdict::Cancel => Decision::Cancel,
            };
            match drv.answer(&a.agent_request_key, decision) {
                Ok(step) => {
                    if let Some(p) = pos {
                        s.open.remove(p);
                    }
                    fx.changed = true;
                    sessions::handle_step(d, &a.session, step, fx);
                    Ok(true)
                }
                Err(CommandError::NoMatchingOption) => Err(RpcError::new(
                    Code::Unavailable,
                    format!(
                        "the agent offered no option to {} approval {}",
                        verdict.wire_name(),
                        item.id
                    ),
                )),
                Err(_) => {
                    if let Some(p) = pos {
                        s.open.remove(p);
                    }
                    Ok(false)
                }
            }
        }
    }
}

/// Resolves a pending item without delivering anything (the owner already
/// knows, or is gone), recording it and the session's approval.resolved.
#[allow(clippy::too_many_arguments)]
pub fn close(
    d: &mut Daemon,
    id: &str,
    verdict: Verdict,
    by: Answerer,
    surface: &'static str,
    delivered: bool,
    reason: Option<String>,
    fx: &mut Effects,
) -> Option<Item> {
    let res = Resolution {
        verdict,
        by,
        surface,
        at_ms: crate::clock::now_ms(),
        delivered,
        reason,
    };
    let item = d.core.approvals.resolve(id, res).ok()?;
    fx.ops.push(persist(&item));
    match &item.subject {
        Subject::Agent(a) => fx.event(
            &a.session,
            "approval.resolved",
            json!({"requestId": id, "decision": verdict.wire_name(), "delivered": delivered}),
        ),
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

fn inbox_error(id: &str) -> impl Fn(InboxError) -> RpcError + '_ {
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

/// `approvals.answer` and every other answer from outside the inbox: the
/// commit of the answer's records comes before `then`, which gets the
/// resolved item for its surface to show.
#[allow(clippy::too_many_arguments)]
pub fn answer(
    d: &mut Daemon,
    id: &str,
    verdict: Verdict,
    by: Answerer,
    surface: &'static str,
    reason: Option<String>,
    expect_digest: Option<&str>,
    withdraw: bool,
    then: impl FnOnce(&mut Daemon, Result<Item, RpcError>) + 'static,
) {
    let item = match d.core.approvals.pending(id) {
        Ok(i) => i.clone(),
        Err(e) => return then(d, Err(inbox_error(id)(e))),
    };
    if let Some(want) = expect_digest {
        if want != item.subject.digest() {
            return then(
                d,
                Err(RpcError::new(
                    Code::ActionMismatch,
                    format!("approval {id} is for another action than the one answered"),
                )),
            );
        }
    }
    let mut fx = Effects::default();
    match settle(d, id, verdict, by, surface, reason, withdraw, &mut fx) {
        Ok(item) => {
            let stream = item.subject.session().unwrap_or_default().to_string();
            sessions::finish(
                d,
                &stream,
                fx,
                false,
                Some(Box::new(
                    move |d: &mut Daemon, r: Result<(), crate::ledger::WriteError>| {
                        then(d, r.map(|()| item).map_err(RpcError::from))
                    },
                )),
            );
        }
        Err(e) => then(d, Err(e)),
    }
}

/// A deadline passed: the declared fallback answers.
fn expire(d: &mut Daemon, id: &str) {
    if !d.core.approvals.is_due(id, crate::clock::now_ms()) {
        return;
    }
    let Some(item) = d.core.approvals.get(id) else {
        return;
    };
    let fallback = item.fallback;
    let waited_s = item
        .expires_ms
        .map_or(0, |at| at.saturating_sub(item.created_ms) / 1000);
    let why = Some(format!("no answer within {waited_s} s"));
    let (verdict, withdraw) = match fallback {
        Fallback::Deny => (Verdict::Deny, false),
        Fallback::Withdraw => (Verdict::Cancel, true),
    };
    let id_owned = id.to_string();
    answer(
        d,
        id,
        verdict,
        Answerer::Timeout,
        "timer",
        why,
        None,
        withdraw,
        move |_d, r| {
            if let Err(e) = r {
                crate::warn!(
                    "approval {id_owned}: its fallback could not be applied: {}",
                    e.message
                );
            }
        },
    );
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
/// ledger; returns it resolved, for the inbox's history.
pub fn withdraw_stale(mut item: Item, fx: &mut Effects) -> Item {
    let (id, session) = (item.id.clone(), item.subject.session().map(str::to_string));
    item.resolution = Some(Resolution {
        verdict: Verdict::Cancel,
        by: Answerer::Daemon("restarted".into()),
        surface: "daemon",
        at_ms: crate::clock::now_ms(),
        delivered: false,
        reason: None,
    });
    let (id, session) = (id.as_str(), session.as_deref());
    fx.ops.push(Op::Exec {
        sql: "UPDATE approvals SET state = 'resolved', decision = 'cancel', delivered = 0, answered_by = 'daemon: restarted', \
              surface = 'daemon', answered_at = ?2 WHERE id = ?1 AND state = 'pending'",
        params: vec![Sql::Text(id.into()), Sql::Text(crate::clock::now_ts())],
    });
    if let Some(s) = session {
        fx.event(
            s,
            "approval.resolved",
            json!({"requestId": id, "decision": "cancel", "delivered": false}),
        );
    }
    item
}
