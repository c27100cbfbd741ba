//! The lane methods of the daemon socket (issue 5, "Dispatch" and "Operator
//! control and restarts"). Names are snake_case like every socket method.
//!
//! | method        | who      | answers                                              |
//! |---------------|----------|------------------------------------------------------|
//! | repos.list    | operator | the known repositories with their worktrees          |
//! | repos.add     | operator | the repository added (persisted)                     |
//! | task.dispatch | operator | {lane, session, branch, worktree} once lane.start is committed |
//! | verify.list   | anyone¹  | lanes newest first, `{lanes, next_cursor}`           |
//! | lanes.get     | anyone¹  | one lane, archived ones included                     |
//! | lanes.close   | operator | stops its sessions; keeps or removes the worktree    |
//! | lanes.merge   | operator | merges a lane that passed (or retries a failed merge)|
//! | lanes.rework  | operator | sends a lane waiting on the operator back to its builder |
//!
//! ¹ a caller inside an agent session sees only its own lane; plugins and
//! unverified callers none.
//!
//! task.dispatch takes the members and patterns of tasks.create (seed 000)
//! and refuses with a stable code that the plugin host passes on as
//! task-refused's reason: repo-unknown, seat-not-found, seat-not-ready,
//! same-family, base-unknown, name-taken, isolation-missing.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::path::PathBuf;

use super::{NoParams, params, require_operator};
use crate::daemon::router::lanes as route;
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::lanes::controller::{self, Lane};
use crate::lanes::machine::Input;
use crate::limits;
use crate::socket::views;

pub fn serves(method: &str) -> bool {
    matches!(
        method,
        "repos.list"
            | "repos.add"
            | "task.dispatch"
            | "verify.list"
            | "lanes.get"
            | "lanes.close"
            | "lanes.merge"
            | "lanes.rework"
    )
}

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let r = match method {
        "repos.list" => repos_list(d, &req, p),
        "repos.add" => repos_add(d, &req, p),
        "task.dispatch" => task_dispatch(d, &req, p),
        "verify.list" => verify_list(d, &req, p),
        "lanes.get" => lanes_get(d, &req, p),
        "lanes.close" => lanes_close(d, &req, p),
        "lanes.merge" => lanes_operator(d, &req, p, |_| Input::OperatorMerge),
        "lanes.rework" => lanes_rework(d, &req, p),
        _ => Err(RpcError::new(
            Code::MethodNotFound,
            format!("unknown method {method}"),
        )),
    };
    super::finish(d, req, r);
}

use super::Handled;

fn repos_list(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    // The repositories and their worktrees are the operator's to see.
    require_operator(req)?;
    let req = req.clone();
    // `git worktree list` per repository: blocking, so on a lane worker.
    route::list_repos(d, move |d, r| {
        let r = r.map(|repos| {
            let list: Vec<Value> = repos
                .into_iter()
                .map(|r| {
                    json!({
                        "path": r.path.display().to_string(),
                        "exists": r.exists,
                        "worktrees": r.worktrees.into_iter().map(|(p, b)| json!({"path": p.display().to_string(), "branch": b})).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({"repos": list})
        });
        d.answer(req, r);
    });
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddParams {
    path: String,
}

fn repos_add(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let AddParams { path } = params(p)?;
    require_operator(req)?;
    if !path.starts_with('/') {
        return Err(RpcError::invalid_params(format!(
            "path must be absolute, found {path:?}"
        )));
    }
    let req = req.clone();
    route::add_repo(d, PathBuf::from(&path), move |d, r| {
        let r = r.map(|top| json!({"path": top.display().to_string()}));
        d.answer(req, r);
    });
    Ok(None)
}

fn task_dispatch(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    require_operator(req)?;
    let task = crate::plugins::calls::task_request(&p)
        .map_err(|e| RpcError::invalid_params(e.message().to_string()))?;
    let req = req.clone();
    route::dispatch(d, task.into(), move |d, r| {
        let r = r.map(|l| {
            json!({"lane": l.lane, "session": l.session, "branch": l.branch, "worktree": l.worktree.display().to_string()})
        });
        d.answer(req, r)
    });
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyParams {
    cursor: Option<String>,
    limit: Option<usize>,
}

/// Lanes newest first. The cursor is the last lane's `createdAt/laneId`,
/// the form lanes.list's nextCursor takes (seed 000).
fn verify_list(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let VerifyParams { cursor, limit } = params(p)?;
    let limit = limit.unwrap_or(limits::LANE_PAGE_DEFAULT);
    if !(1..=limits::LANE_PAGE_MAX).contains(&limit) {
        return Err(RpcError::invalid_params(format!(
            "limit must be 1 to {}",
            limits::LANE_PAGE_MAX
        )));
    }
    let all: Vec<&Lane> = d
        .lanes
        .listed()
        .into_iter()
        .filter(|l| may_read_lane(d, req, &l.id))
        .collect();
    let start = match &cursor {
        None => 0,
        Some(c) => match all.iter().position(|l| cursor_of(l) == *c) {
            Some(i) => i + 1,
            None => {
                return Err(RpcError::invalid_params(
                    "cursor names no lane of this list",
                ));
            }
        },
    };
    let page: Vec<String> = all
        .iter()
        .skip(start)
        .take(limit)
        .map(|l| l.id.clone())
        .collect();
    let next = (start + page.len() < all.len())
        .then(|| all.get(start + page.len() - 1).map(|l| cursor_of(l)))
        .flatten();
    // Each lane's head is read from its branch before the answer.
    let req = req.clone();
    route::fresh_heads(d, None, move |d| {
        let items: Vec<Value> = page
            .iter()
            .filter_map(|id| d.lanes.map.get(id))
            .map(|l| views::lane(l, &d.node_name))
            .collect();
        d.answer(req, Ok(json!({"lanes": items, "next_cursor": next})));
    });
    Ok(None)
}

pub fn cursor_of(l: &Lane) -> String {
    format!("{}/{}", crate::clock::format_ts(l.created_ms), l.id)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LaneParams {
    lane: String,
}

/// Whether the caller may read `lane`: the operator reads every lane; a
/// caller inside an agent session only the lane that session builds or
/// verifies (a lane's task, checks and verdicts are the operator's, as the
/// other sessions' events are). Others read none.
fn may_read_lane(d: &Daemon, req: &Req, lane: &str) -> bool {
    match &req.class {
        crate::procs::CallerClass::Operator => true,
        crate::procs::CallerClass::AgentSession(Some(sid)) => {
            d.lanes.lane_of_session(sid) == Some(lane)
        }
        _ => false,
    }
}

fn lanes_get(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let LaneParams { lane } = params(p)?;
    if !may_read_lane(d, req, &lane) {
        return Err(controller::not_found(&lane));
    }
    if !d.lanes.map.contains_key(&lane) {
        return Err(controller::not_found(&lane));
    }
    let req = req.clone();
    let also = lane.clone();
    route::fresh_heads(d, Some(&also), move |d| {
        let r = d
            .lanes
            .map
            .get(&lane)
            .map(|l| views::lane(l, &d.node_name))
            .ok_or_else(|| controller::not_found(&lane));
        d.answer(req, r);
    });
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseParams {
    lane: String,
    #[serde(default)]
    remove_worktree: bool,
}

fn lanes_close(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let CloseParams {
        lane,
        remove_worktree,
    } = params(p)?;
    require_operator(req)?;
    route::close(d, &lane, remove_worktree)?;
    Ok(Some(views::lane(
        d.lanes
            .map
            .get(&lane)
            .ok_or_else(|| controller::not_found(&lane))?,
        &d.node_name,
    )))
}

fn lanes_operator(
    d: &mut Daemon,
    req: &Req,
    p: Map<String, Value>,
    input: impl FnOnce(&Lane) -> Input,
) -> Handled {
    let LaneParams { lane } = params(p)?;
    require_operator(req)?;
    let l = d
        .lanes
        .map
        .get(&lane)
        .ok_or_else(|| controller::not_found(&lane))?;
    let i = input(l);
    route::step(d, &lane, i)?;
    Ok(Some(views::lane(
        d.lanes
            .map
            .get(&lane)
            .ok_or_else(|| controller::not_found(&lane))?,
        &d.node_name,
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReworkParams {
    lane: String,
    notes: String,
}

fn lanes_rework(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let ReworkParams { lane, notes } = params(p)?;
    if notes.trim().is_empty() || notes.len() > limits::PROMPT_MAX_BYTES {
        return Err(RpcError::invalid_params(
            "notes must be 1 byte to 1 MiB of text",
        ));
    }
    let mut m = Map::new();
    m.insert("lane".into(), json!(lane));
    lanes_operator(d, req, m, move |_| Input::OperatorRework { notes })
}
