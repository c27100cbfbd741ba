//! The approvals inbox, the seats and the plugins over HTTP (issue 6,
//! phase 2), reusing the core's rules rather than restating them:
//!
//! | path                                   | method | who      | reuses                      |
//! |----------------------------------------|--------|----------|-----------------------------|
//! | /approvals                             | GET    | token*   | inbox list, pending first   |
//! | /approvals/{approval_id}               | GET    | token*   | inbox get, else the ledger  |
//! | /approvals/{approval_id}/answer        | POST   | operator | `router::sessions::answer`, surface "http" |
//! | /seats                                 | GET    | token    | the seat registry           |
//! | /plugins                               | GET    | token    | plugin.list                 |
//! | /plugins/{plugin_id}                   | GET    | token    | plugin.get                  |
//! | /plugins/{plugin_id}                   | DELETE | operator | plugin.remove               |
//! | /plugins/{plugin_id}/approve           | POST   | operator | plugin.approve              |
//! | /plugins/{plugin_id}/discard           | POST   | operator | plugin.discard              |
//! | /plugins/{plugin_id}/enable            | POST   | operator | plugin.enable               |
//! | /plugins/{plugin_id}/disable           | POST   | token    | plugin.disable              |
//! | /plugins/{plugin_id}/commands          | GET    | token    | plugin.commands             |
//! | /plugins/{plugin_id}/commands/{command_id}/run | POST | operator | plugin.command.run   |
//! | /plugin-requests/{request_id}          | GET    | token    | plugin.request.get          |
//!
//! *a caller inside a session sees only its own session's approvals, as
//! on the daemon socket.
//!
//! The plugin operations run the daemon socket's `plugin.*` methods
//! themselves ([`crate::socket::methods::plugins::dispatch`]) with the caller
//! class this connection was given and a [`ReplyTo::Http`] carrying this
//! handler's reply channel. Their results are the socket method's result
//! objects; their errors map to problems by [`Problem::from_rpc`].

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::problem::{Code, Problem};
use super::{Answer, Ctx, Reply};
use crate::core::approvals::{self, Settle};
use crate::core::inbox::{Answerer, Verdict};
use crate::daemon::{ReplyTo, Req, router};
use crate::errors::RpcError;
use crate::procs::CallerClass;

fn may_see(class: &CallerClass, item: &crate::core::inbox::Item) -> bool {
    match class {
        CallerClass::Operator => true,
        CallerClass::AgentSession(Some(s)) => item.subject.session() == Some(s.as_str()),
        _ => false,
    }
}

// ---- approvals ----

pub fn get_approvals(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let class = ctx.caller()?;
    let limit = super::pages::limit(ctx.param("limit"))?;
    let after = match ctx.param("next") {
        Some(t) => Some(super::pages::resume(ctx.route, &ctx.query, t)?),
        None => None,
    };
    let state = match ctx.param("state") {
        None | Some("all") => None,
        Some(s @ ("pending" | "resolved")) => Some(s == "pending"),
        Some(_) => return Err(Problem::invalid("state must be pending, resolved or all")),
    };
    let (route, query) = (ctx.route, ctx.query.clone());
    let body = ctx.reactor(move |d, answer: Answer<Value>| {
        let mut items: Vec<&crate::core::inbox::Item> = d
            .core
            .approvals
            .list(true)
            .into_iter()
            .filter(|i| may_see(&class, i))
            .filter(|i| state.is_none_or(|p| p == i.is_pending()))
            .collect();
        // Pending first, then the newest.
        items.sort_by(|a, b| {
            b.is_pending()
                .cmp(&a.is_pending())
                .then(b.created_ms.cmp(&a.created_ms))
                .then(a.id.cmp(&b.id))
        });
        let start = after
            .as_ref()
            .and_then(|a| items.iter().position(|i| &i.id == a).map(|p| p + 1))
            .unwrap_or(0);
        let page: Vec<Value> = items
            .iter()
            .skip(start)
            .take(limit)
            .map(|i| crate::socket::views::approval(i))
            .collect();
        let more = items.len() > start + page.len();
        let (page, all) = super::pages::fit(page);
        let next = match page.last() {
            Some(last) if more || !all => json!(super::pages::token(
                route,
                &query,
                last["request_id"].as_str().unwrap_or_default()
            )),
            _ => Value::Null,
        };
        answer.send(json!({"items": page, "next": next}));
    })?;
    Ok(Reply::representation(body))
}

pub fn get_approval(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let class = ctx.caller()?;
    let id = ctx
        .path_param("approval_id")
        .unwrap_or_default()
        .to_string();
    let body = ctx.reactor(move |d, answer: Answer<Result<Option<Value>, Problem>>| {
        if let Some(i) = d.core.approvals.get(&id) {
            return answer.send(Ok(
                may_see(&class, i).then(|| crate::socket::views::approval(i))
            ));
        }
        // Older than the history kept in memory: the ledger has it.
        let inbox = d.inbox.clone();
        let fallback = answer.clone();
        let queued = d.ledger.read(Box::new(move |conn| {
            let found = approvals::read_one(conn, &id);
            inbox.run(move |_d| {
                answer.send(match found {
                    Ok(item) => Ok(item
                        .filter(|i| may_see(&class, i))
                        .map(|i| crate::socket::views::approval(&i))),
                    Err(e) => Err(super::routes::read_failed(&e)),
                })
            });
        }));
        if let Err(e) = queued {
            fallback.send(Err(super::routes::ledger_problem(e)));
        }
    })??;
    body.map(Reply::representation)
        .ok_or_else(|| Problem::new(Code::NotFound, "no such approval"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    digest: Option<String>,
}

pub fn post_answer(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let id = ctx
        .path_param("approval_id")
        .unwrap_or_default()
        .to_string();
    let body: AnswerBody = ctx.json()?;
    let verdict = match body.decision.as_str() {
        "allow" => Verdict::Allow,
        "deny" => Verdict::Deny,
        _ => return Err(Problem::invalid("decision must be allow or deny")),
    };
    if body
        .reason
        .as_ref()
        .is_some_and(|r| r.len() > 4096 || r.chars().any(|c| c.is_control() && c != '\n'))
    {
        return Err(Problem::invalid(
            "reason must be at most 4096 bytes without control characters",
        ));
    }
    let pid = super::peer::peer_processes(ctx.conn.peer, ctx.conn.local)
        .first()
        .map_or(0, |h| h.pid);
    let v = ctx.reactor(move |d, answer: Answer<Result<Value, Problem>>| {
        let settle = Settle {
            id,
            verdict,
            by: Answerer::Operator { pid },
            surface: "http",
            reason: body.reason,
            withdraw: false,
            grant: None,
        };
        router::sessions::answer(d, settle, body.digest.as_deref(), move |_d, r| {
            answer.send(
                r.map(|i| crate::socket::views::approval(&i))
                    .map_err(|e| Problem::from_rpc(&e)),
            );
        });
    })??;
    Ok(Reply::json(200, v))
}

// ---- seats ----

pub fn get_seats(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let body = ctx.reactor(|d, answer: Answer<Value>| {
        let items: Vec<Value> = d
            .core
            .seats
            .list
            .iter()
            .map(crate::socket::views::seat)
            .collect();
        answer.send(json!({"items": items, "next": null}));
    })?;
    Ok(Reply::representation(body))
}

// ---- plugins ----

/// Runs a daemon-socket method for this request and waits for its answer.
/// `operator`: the route is operator-only, and the pipeline has checked
/// the caller already.
fn socket_method(
    ctx: &mut Ctx,
    operator: bool,
    method: &'static str,
    params: Map<String, Value>,
) -> Result<Value, Problem> {
    let class = if operator {
        CallerClass::Operator
    } else {
        ctx.caller()?
    };
    ctx.reactor(move |d, answer: Answer<Result<Value, RpcError>>| {
        let req = Req {
            to: ReplyTo::Http(answer),
            class,
        };
        crate::socket::methods::plugins::dispatch(d, req, method, params);
    })?
    .map_err(|e| Problem::from_rpc(&e))
}

fn plugin_params(ctx: &Ctx) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "plugin".into(),
        json!(ctx.path_param("plugin_id").unwrap_or_default()),
    );
    m
}

pub fn get_plugins(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let v = socket_method(ctx, false, "plugin.list", Map::new())?;
    Ok(Reply::representation(v))
}

pub fn get_plugin(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let p = plugin_params(ctx);
    Ok(Reply::representation(socket_method(
        ctx,
        false,
        "plugin.get",
        p,
    )?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    snapshot_hash: String,
    permissions: Vec<String>,
    commands: Vec<String>,
    operator: String,
}

pub fn post_plugin_approve(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let b: ApproveBody = ctx.json()?;
    let mut p = plugin_params(ctx);
    p.insert("snapshot_hash".into(), json!(b.snapshot_hash));
    p.insert("permissions".into(), json!(b.permissions));
    p.insert("commands".into(), json!(b.commands));
    p.insert("operator".into(), json!(b.operator));
    Ok(Reply::json(
        200,
        socket_method(ctx, true, "plugin.approve", p)?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

fn plain(ctx: &mut Ctx, operator: bool, method: &'static str) -> Result<Reply, Problem> {
    let Empty {} = ctx.json()?;
    let p = plugin_params(ctx);
    Ok(Reply::json(200, socket_method(ctx, operator, method, p)?))
}

pub fn post_plugin_enable(ctx: &mut Ctx) -> Result<Reply, Problem> {
    plain(ctx, true, "plugin.enable")
}

pub fn post_plugin_disable(ctx: &mut Ctx) -> Result<Reply, Problem> {
    plain(ctx, false, "plugin.disable")
}

pub fn post_plugin_discard(ctx: &mut Ctx) -> Result<Reply, Problem> {
    plain(ctx, true, "plugin.discard")
}

pub fn delete_plugin(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let mut p = plugin_params(ctx);
    match ctx.param("stop_tasks") {
        None => {}
        Some("true") => {
            p.insert("stop_tasks".into(), json!(true));
        }
        Some("false") => {
            p.insert("stop_tasks".into(), json!(false));
        }
        Some(_) => return Err(Problem::invalid("stop_tasks must be true or false")),
    }
    Ok(Reply::json(
        200,
        socket_method(ctx, true, "plugin.remove", p)?,
    ))
}

pub fn get_plugin_commands(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let id = ctx.path_param("plugin_id").unwrap_or_default().to_string();
    // plugin.commands lists every plugin's; this resource is one plugin's.
    let v = socket_method(ctx, false, "plugin.commands", Map::new())?;
    let prefix = format!("{id}.");
    let items: Vec<Value> = v["commands"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|c| {
                    c["command"]
                        .as_str()
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    Ok(Reply::representation(json!({"items": items, "next": null})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    #[serde(default)]
    input: Option<String>,
}

pub fn post_plugin_command_run(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let b: RunBody = ctx.json()?;
    let command = format!(
        "{}.{}",
        ctx.path_param("plugin_id").unwrap_or_default(),
        ctx.path_param("command_id").unwrap_or_default()
    );
    let mut p = Map::new();
    p.insert("command".into(), json!(command));
    if let Some(i) = b.input {
        p.insert("input".into(), json!(i));
    }
    Ok(Reply::json(
        200,
        socket_method(ctx, true, "plugin.command.run", p)?,
    ))
}

pub fn get_plugin_request(ctx: &mut Ctx) -> Result<Reply, Problem> {
    let mut p = Map::new();
    p.insert(
        "request_id".into(),
        json!(ctx.path_param("request_id").unwrap_or_default()),
    );
    Ok(Reply::representation(socket_method(
        ctx,
        false,
        "plugin.request.get",
        p,
    )?))
}
