//! The daemon socket's `plugin.*` methods (seed 000, "Daemon methods that
//! manage plugins"): params checked strictly (an unknown member is
//! `invalid-params`), the caller class decided from `req.class`, and the
//! page's errors as `data.code`.
//!
//! | method              | who                                   |
//! |---------------------|---------------------------------------|
//! | plugin.install      | anyone; `installedBy` is the class    |
//! | plugin.list, .get, .commands, .request.get, .disable | anyone |
//! | plugin.approve, .enable, .command.run | the operator only     |
//! | plugin.discard, .remove | no caller inside anything the daemon started (the operator only) |
//!
//! Decisions where the page is silent: a caller the daemon could not verify
//! is `agent-session` in `installedBy` (it is not the operator); a second
//! plugin.remove while the first waits for the process answers
//! `plugin-remove-pending`.
//!
//! A method that changed the plugin records answers once they are on disk
//! (`Host::when_saved`), `unavailable` when they could not be written.
//! plugin.install answers once its copy is made on the install thread
//! (`Host::stage`; the router hands the copy to [`staged`]), checked, put
//! in place and recorded. Every call that changes the host goes through
//! `router::plugins::with`, which applies the effects the host returns; a
//! request the host answers later is handed to it as a `ReplyKey`.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::path::PathBuf;

use super::{params, require_operator};
use crate::daemon::router::plugins as route;
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::ledger::Op;
use crate::limits;
use crate::plugins::effects::{ApproveRequest, Saved};
use crate::plugins::host::{self, AfterStop, Phase, Plugin};
use crate::plugins::manifest::{
    self, CommandInput, Manifest, Snapshot, is_command_id, is_plugin_id,
};
use crate::plugins::store::{self, Approval, Copy, Record, Waiting};
use crate::plugins::text;
use crate::plugins::wire::{Permission, RUNNABLE_APIS, ShutdownReason};
use crate::procs::CallerClass;

use super::Handled;

/// Serves one `plugin.*` method.
pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let asked = d.plugins.records_asked();
    let result = match method {
        "plugin.install" => install(d, &req, p),
        "plugin.list" => list(d, p),
        "plugin.get" => get(d, p),
        "plugin.approve" => approve(d, &req, p),
        "plugin.discard" => discard(d, &req, p),
        "plugin.enable" => enable(d, &req, p),
        "plugin.disable" => disable(d, p),
        "plugin.remove" => remove(d, &req, p),
        "plugin.commands" => commands(d, p),
        "plugin.command.run" => command_run(d, &req, p),
        "plugin.request.get" => request_get(d, &req, p),
        other => Err(super::unknown_method(other)),
    };
    answer_saved(d, req, asked, result);
}

/// Answers `req`; when the records changed since `asked`, once they are
/// on disk.
fn answer_saved(d: &mut Daemon, req: Req, asked: u64, result: Handled) {
    match result {
        Ok(Some(value)) if d.plugins.records_asked() != asked => {
            let to = route::reply_key(d, req);
            route::with(d, |h, _| h.when_saved(Saved::Answer { to, value }));
        }
        other => super::finish(d, req, other),
    }
}

fn not_found(id: &str) -> RpcError {
    RpcError::new(Code::PluginNotFound, format!("no plugin {id} is installed"))
}

fn check_id(id: &str) -> Result<(), RpcError> {
    if is_plugin_id(id) {
        Ok(())
    } else {
        Err(RpcError::invalid_params("plugin must be a plugin id"))
    }
}

fn plugin_of<'a>(d: &'a mut Daemon, id: &str) -> Result<&'a mut Plugin, RpcError> {
    check_id(id)?;
    d.plugins.plugins.get_mut(id).ok_or_else(|| not_found(id))
}

fn not_removing(p: &Plugin) -> Result<(), RpcError> {
    match p.rec.removal {
        Some(_) => Err(RpcError::new(
            Code::PluginRemovePending,
            "the plugin is being removed, or its removal did not finish",
        )),
        None => Ok(()),
    }
}

fn ledger_ok(d: &Daemon) -> Result<(), RpcError> {
    match d.ledger.corrupt {
        Some(_) => Err(RpcError::new(
            Code::LedgerCorrupt,
            "the ledger is read-only, so nothing was changed",
        )),
        None => Ok(()),
    }
}

fn store_ok(d: &Daemon) -> Result<(), RpcError> {
    d.plugins.usable_store().map(|_| ())
}

fn incompatible(api: &str) -> RpcError {
    RpcError::new(
        Code::PluginIncompatible,
        format!(
            "the plugin is built for API {api}; this host runs {}",
            RUNNABLE_APIS.join(" and ")
        ),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathParams {
    path: String,
}

fn install(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let PathParams { path } = params(p)?;
    let abs =
        path.starts_with('/') || path.starts_with("\\\\") || path.as_bytes().get(1) == Some(&b':');
    if !abs || path.chars().count() > limits::PLUGIN_PATH_MAX || !text::is_plain(&path) {
        return Err(RpcError::invalid_params(
            "path must be an absolute path of at most 4096 characters without control or invisible characters",
        ));
    }
    ledger_ok(d)?;
    store_ok(d)?;
    let installed_by = match &req.class {
        CallerClass::Operator => "operator",
        CallerClass::Plugin(_) => "plugin",
        CallerClass::AgentSession(_)
        | CallerClass::Unverified
        | CallerClass::RemoteClient { .. } => "agent-session",
    };
    let to = route::reply_key(d, req.clone());
    let staged = route::with(d, |h, _| h.stage(to, installed_by, PathBuf::from(path)));
    if let Err(e) = staged {
        route::take_reply(d, to);
        return Err(e);
    }
    Ok(None)
}

/// plugin.install's copy is made (or failed): placed and answered.
pub fn staged(
    d: &mut Daemon,
    req: Req,
    installed_by: &'static str,
    staged: Result<(PathBuf, Snapshot), manifest::Problem>,
) {
    let asked = d.plugins.records_asked();
    let result = place(d, installed_by, staged);
    answer_saved(d, req, asked, result);
}

/// The rest of plugin.install once the copy is made: checked against the
/// installed plugins, then put in place as the waiting copy, in one step.
fn place(
    d: &mut Daemon,
    installed_by: &'static str,
    staged: Result<(PathBuf, Snapshot), manifest::Problem>,
) -> Handled {
    let (staging, snap) = staged.map_err(|e| RpcError::new(Code::PluginInvalid, e.message()))?;
    let m = &snap.manifest;
    let id = m.id.clone();
    let count = d.plugins.plugins.len();
    let existing = d.plugins.plugins.get(&id);
    let refused = if !m.is_runnable() {
        Some(incompatible(&m.api))
    } else {
        match existing {
            Some(p) => not_removing(p).err(),
            None if count >= limits::PLUGIN_MAX_INSTALLED => {
                Some(RpcError::new(Code::PluginLimit, "20 plugins are installed"))
            }
            None => None,
        }
    };
    if let Some(e) = refused {
        route::with(d, |h, _| h.discard_copy(staging));
        return Err(e);
    }
    let same_approved = existing
        .and_then(|p| p.approved.as_ref())
        .is_some_and(|l| l.hash == snap.hash);
    let same_waiting = existing
        .and_then(|p| p.rec.waiting.as_ref())
        .is_some_and(|w| w.snapshot_hash == snap.hash);
    if let (Some(p), true) = (existing, same_approved || same_waiting) {
        let installed = p
            .rec
            .waiting
            .as_ref()
            .filter(|_| same_waiting)
            .and_then(|w| w.installed_by.clone());
        let answer = json!({
            "plugin": id, "version": m.version, "snapshotHash": snap.hash, "state": p.state().0,
            "replaced": false, "unchanged": true, "installedBy": installed.unwrap_or_else(|| installed_by.to_string()),
        });
        route::with(d, |h, _| h.discard_copy(staging));
        return Ok(Some(answer));
    }
    let replaced = existing.is_some_and(|p| p.rec.waiting.is_some());
    let store = d.plugins.store.as_ref().ok_or_else(RpcError::internal)?;
    match store.place_waiting(&id, &staging) {
        Ok(retired) => {
            if let Some(old) = retired {
                route::with(d, |h, _| h.discard_copy(old));
            }
        }
        Err(e) => {
            route::with(d, |h, _| h.discard_copy(staging));
            crate::error!(
                "plugin {id}: unable to place the installed copy: {}",
                crate::errors::io_cause(&e)
            );
            return Err(RpcError::new(
                Code::Unavailable,
                "the installed copy could not be placed in the store",
            ));
        }
    }
    let waiting = Waiting {
        kind: "install".into(),
        snapshot_hash: snap.hash.clone(),
        installed_by: Some(installed_by.into()),
        installed_at: crate::clock::now_ts(),
    };
    match d.plugins.plugins.get_mut(&id) {
        Some(p) => p.rec.waiting = Some(waiting),
        None => {
            let mut rec = Record::new(&id);
            rec.waiting = Some(waiting);
            d.plugins.plugins.insert(id.clone(), Plugin::new(rec));
        }
    }
    route::with(d, |h, _| h.persist());
    crate::info!(
        "plugin {id} {} installed by the {installed_by}; it waits for approval",
        snap.manifest.version
    );
    let state = d
        .plugins
        .plugins
        .get(&id)
        .map(|p| p.state().0)
        .unwrap_or("pending-approval");
    Ok(Some(json!({
        "plugin": id, "version": m.version, "snapshotHash": snap.hash, "state": state,
        "replaced": replaced, "unchanged": false, "installedBy": installed_by,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CursorParams {
    cursor: Option<String>,
}

/// The manifest to show for a plugin: the approved one, else the waiting
/// copy's when it is valid.
fn shown_manifest(d: &Daemon, p: &Plugin) -> Option<Manifest> {
    if let Some(l) = &p.approved {
        return Some(l.manifest.clone());
    }
    waiting_manifest(d, &p.rec.plugin)
}

fn waiting_manifest(d: &Daemon, id: &str) -> Option<Manifest> {
    let dir = d.plugins.store.as_ref()?.copy_dir(id, Copy::Waiting);
    let bytes = std::fs::read(dir.join(manifest::MANIFEST_FILE)).ok()?;
    Manifest::parse(&bytes).ok()
}

fn list_item(d: &Daemon, p: &Plugin) -> Value {
    let m = shown_manifest(d, p);
    let (state, reason) = p.state();
    json!({
        "plugin": p.rec.plugin,
        "name": m.as_ref().map(|m| m.name.clone()).unwrap_or_else(|| p.rec.plugin.clone()),
        "version": m.as_ref().map(|m| m.version.clone()).unwrap_or_default(),
        "description": m.as_ref().map(|m| m.description.clone()).unwrap_or_default(),
        "publisher": m.as_ref().and_then(|m| m.publisher.clone()),
        "api": m.as_ref().map(|m| m.api.clone()).unwrap_or_else(|| "1.0".into()),
        "state": state,
        "reason": reason,
        "enabled": p.rec.enabled,
        "approved": p.approved.is_some(),
        "waiting": p.rec.waiting.is_some(),
        "permissions": m.as_ref().map(|m| m.permissions_in_table_order().iter().map(|x| x.name()).collect::<Vec<_>>()).unwrap_or_default(),
        "commands": m.as_ref().map(|m| m.commands.len()).unwrap_or(0),
    })
}

fn list(d: &mut Daemon, p: Map<String, Value>) -> Handled {
    let CursorParams { cursor } = params(p)?;
    if let Some(c) = &cursor {
        check_id(c).map_err(|_| RpcError::invalid_params("cursor must be a plugin id"))?;
    }
    let items: Vec<Value> = d
        .plugins
        .plugins
        .values()
        .filter(|p| {
            cursor
                .as_ref()
                .is_none_or(|c| p.rec.plugin.as_str() > c.as_str())
        })
        .map(|p| list_item(d, p))
        .collect();
    Ok(Some(json!({"plugins": items, "nextCursor": null})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdParams {
    plugin: String,
}

fn get(d: &mut Daemon, p: Map<String, Value>) -> Handled {
    let IdParams { plugin } = params(p)?;
    let p = plugin_of(d, &plugin)?;
    let crashes = p.crashes();
    let p = d
        .plugins
        .plugins
        .get(&plugin)
        .ok_or_else(|| not_found(&plugin))?;
    let store = d.plugins.store.as_ref().ok_or_else(RpcError::internal)?;
    let (state, reason) = p.state();
    let waiting = p.rec.waiting.as_ref().map(|w| {
        let wdir = store.copy_dir(&plugin, Copy::Waiting);
        let wjson = store::manifest_json(&wdir);
        let valid = std::fs::read(wdir.join(manifest::MANIFEST_FILE))
            .ok()
            .is_some_and(|b| Manifest::parse(&b).is_ok());
        let after_entries = store::raw_entries(&wdir);
        let before_entries = p
            .approved
            .as_ref()
            .map(|_| store::raw_entries(&store.copy_dir(&plugin, Copy::Approved)));
        let before = p
            .approved
            .as_ref()
            .zip(before_entries.as_ref())
            .map(|(l, e)| (&l.json, e.as_slice()));
        let diff = store::diff(before, (wjson.as_ref(), &after_entries));
        json!({
            "kind": w.kind,
            "snapshotHash": w.snapshot_hash,
            "manifest": if valid { wjson.clone() } else { None },
            "diff": diff,
            "installedBy": w.installed_by,
            "installedAt": w.installed_at,
        })
    });
    let usage = p.storage_usage();
    Ok(Some(json!({
        "plugin": plugin,
        "state": state,
        "reason": reason,
        "enabled": p.rec.enabled,
        "approved": p.approved.is_some(),
        "manifest": p.approved.as_ref().map(|l| l.json.clone()),
        "approval": p.approved.as_ref().and(p.rec.approval.as_ref()).map(|a| json!({"snapshotHash": a.snapshot_hash, "operator": a.operator, "at": a.at})),
        "waiting": waiting,
        "files": {"count": p.approved.as_ref().map_or(0, |l| l.files_count), "bytes": p.approved.as_ref().map_or(0, |l| l.files_bytes)},
        "storage": {"keys": usage.keys, "bytes": usage.bytes},
        "lanes": route::lanes_at_work(d, &p.rec),
        "starting": p.rec.starting.iter().take(limits::PLUGIN_GET_LIST_MAX).collect::<Vec<_>>(),
        "crashes": crashes,
        "lastExit": p.last_exit.as_ref().map(|e| json!({"at": e.at, "code": e.code, "signal": e.signal, "fault": e.fault.map(|f| f.name())})),
        "stderrTail": p.stderr_tail,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ApproveParams {
    plugin: String,
    snapshot_hash: String,
    permissions: Vec<String>,
    commands: Vec<String>,
    operator: String,
}

fn is_hash(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn stale(what: &str) -> RpcError {
    RpcError::new(
        Code::PluginStaleSnapshot,
        format!("the copy that waits is not the one named: {what}"),
    )
}

fn approve(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let a: ApproveParams = params(p)?;
    check_id(&a.plugin)?;
    if !is_hash(&a.snapshot_hash) {
        return Err(RpcError::invalid_params(
            "snapshotHash must be 64 lowercase hex digits",
        ));
    }
    let mut perms = Vec::new();
    for name in &a.permissions {
        let perm = Permission::from_name(name).ok_or_else(|| {
            RpcError::invalid_params("permissions holds an item that is not a permission")
        })?;
        if perms.contains(&perm) {
            return Err(RpcError::invalid_params("permissions holds an item twice"));
        }
        perms.push(perm);
    }
    if a.commands.len() > limits::PLUGIN_COMMANDS_MAX
        || a.commands.iter().any(|c| !is_command_id(c))
    {
        return Err(RpcError::invalid_params(
            "commands must be at most 8 command ids",
        ));
    }
    if a.commands
        .iter()
        .enumerate()
        .any(|(i, c)| a.commands[..i].contains(c))
    {
        return Err(RpcError::invalid_params("commands holds an item twice"));
    }
    let op_ok = (1..=64).contains(&a.operator.len())
        && a.operator
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b' ' | b'.' | b'_' | b'-'));
    if !op_ok {
        return Err(RpcError::invalid_params(
            "operator must be 1 to 64 letters, digits, spaces, dots, underscores and hyphens",
        ));
    }
    require_operator(req)?;
    let id = a.plugin.clone();
    let p = plugin_of(d, &id)?;
    not_removing(p)?;
    let w = p
        .rec
        .waiting
        .clone()
        .ok_or_else(|| stale("no copy waits for approval"))?;
    if w.snapshot_hash != a.snapshot_hash {
        return Err(stale("another snapshot hash"));
    }
    ledger_ok(d)?;
    let to = route::reply_key(d, req.clone());
    let a = ApproveRequest {
        plugin: a.plugin,
        snapshot_hash: a.snapshot_hash,
        permissions: a.permissions,
        commands: a.commands,
        operator: a.operator,
    };
    if let Err(e) = route::with(d, |h, _| h.check_waiting(to, a)) {
        route::take_reply(d, to);
        return Err(e);
    }
    Ok(None)
}

/// plugin.approve's waiting copy is checked (on the install thread):
/// approved and answered, unless the plugin changed meanwhile.
pub fn approve_checked(
    d: &mut Daemon,
    req: Req,
    a: ApproveRequest,
    checked: Result<Snapshot, manifest::Problem>,
) {
    let asked = d.plugins.records_asked();
    let result = approve_place(d, a, checked);
    answer_saved(d, req, asked, result);
}

/// The rest of plugin.approve once the copy is checked: the plugin is
/// looked at again (it may have been removed, or another copy installed,
/// while the copy was checked), then the copy is put in force.
fn approve_place(
    d: &mut Daemon,
    a: ApproveRequest,
    checked: Result<Snapshot, manifest::Problem>,
) -> Handled {
    let id = a.plugin.clone();
    let p = plugin_of(d, &id)?;
    not_removing(p)?;
    let w = p
        .rec
        .waiting
        .clone()
        .ok_or_else(|| stale("no copy waits for approval"))?;
    if w.snapshot_hash != a.snapshot_hash {
        return Err(stale("another snapshot hash"));
    }
    ledger_ok(d)?;
    let store = d.plugins.store.as_ref().ok_or_else(RpcError::internal)?;
    let snap = checked.map_err(|e| RpcError::new(Code::PluginInvalid, e.message()))?;
    if snap.hash != w.snapshot_hash {
        return Err(stale("the copy changed on disk after it was installed"));
    }
    let m = &snap.manifest;
    if m.id != id {
        return Err(RpcError::new(
            Code::PluginInvalid,
            format!("manifest-invalid: the copy names the id {}, not {id}", m.id),
        ));
    }
    if !m.is_runnable() {
        return Err(incompatible(&m.api));
    }
    let want: Vec<&str> = m
        .permissions_in_table_order()
        .iter()
        .map(|x| x.name())
        .collect();
    if want != a.permissions.iter().map(String::as_str).collect::<Vec<_>>() {
        return Err(stale("another permission list"));
    }
    let want: Vec<&str> = m.commands.iter().map(|c| c.id.as_str()).collect();
    if want != a.commands.iter().map(String::as_str).collect::<Vec<_>>() {
        return Err(stale("other command ids"));
    }
    let mut approval = Approval {
        snapshot_hash: snap.hash.clone(),
        permissions: a.permissions.clone(),
        commands: a.commands.clone(),
        operator: a.operator.clone(),
        at: crate::clock::now_ts(),
        check: String::new(),
    };
    approval.check = store.check_of(&id, &approval).ok_or_else(|| {
        RpcError::new(
            Code::Unavailable,
            "the plugin store key cannot be used; the log says why",
        )
    })?;
    let retired = store.promote_waiting(&id).map_err(|e| {
        crate::error!(
            "plugin {id}: unable to put the approved copy in force: {}",
            crate::errors::io_cause(&e)
        );
        RpcError::new(
            Code::Unavailable,
            "the approved copy could not be put in force",
        )
    })?;
    let loaded = host::loaded_of(store, &id, &approval);
    if let Some(old) = retired {
        route::with(d, |h, _| h.discard_copy(old));
    }
    let p = d
        .plugins
        .plugins
        .get_mut(&id)
        .ok_or_else(|| not_found(&id))?;
    p.rec.approval = Some(approval);
    p.rec.waiting = None;
    p.approved = loaded;
    if matches!(p.phase, Phase::Failed(_)) {
        p.phase = Phase::Idle;
    }
    let running = p.run.is_some();
    route::with(d, |h, _| h.persist());
    crate::info!("plugin {id}: {} approved by {}", snap.hash, a.operator);
    if running {
        if let Some(p) = d.plugins.plugins.get_mut(&id) {
            p.after_stop = AfterStop::Start;
        }
        route::with(d, |h, _| h.stop(&id, ShutdownReason::Updated));
    } else {
        route::with(d, |h, cx| h.start(&id, cx));
    }
    let state = d
        .plugins
        .plugins
        .get(&id)
        .map(|p| p.state().0)
        .unwrap_or("pending-approval");
    Ok(Some(
        json!({"plugin": id, "snapshotHash": snap.hash, "approved": true, "state": state}),
    ))
}

fn discard(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let IdParams { plugin } = params(p)?;
    check_id(&plugin)?;
    require_operator(req)?;
    let p = plugin_of(d, &plugin)?;
    not_removing(p)?;
    if p.rec.waiting.is_none() {
        return Err(RpcError::new(
            Code::NotFound,
            "no installed copy of the plugin waits",
        ));
    }
    let never = p.approved.is_none();
    let store = d.plugins.store.as_ref().ok_or_else(RpcError::internal)?;
    let res = if never {
        store.retire_plugin(&plugin)
    } else {
        store.retire_copy(&plugin, Copy::Waiting)
    };
    match res {
        Ok(retired) => {
            if let Some(old) = retired {
                route::with(d, |h, _| h.discard_copy(old));
            }
        }
        Err(e) => {
            crate::error!(
                "plugin {plugin}: unable to delete the waiting copy: {}",
                crate::errors::io_cause(&e)
            );
            return Err(RpcError::new(
                Code::Unavailable,
                "the waiting copy could not be deleted",
            ));
        }
    }
    if never {
        d.plugins.plugins.remove(&plugin);
        let op = Op::Exec {
            sql: "DELETE FROM plugin_storage WHERE plugin = ?1",
            params: vec![plugin.clone().into()],
        };
        d.write(vec![op], |_, r| {
            if let Err(e) = r {
                crate::error!("storage of a discarded plugin was not deleted: {e:?}");
            }
        });
    } else if let Some(p) = d.plugins.plugins.get_mut(&plugin) {
        p.rec.waiting = None;
    }
    route::with(d, |h, _| h.persist());
    Ok(Some(
        json!({"plugin": plugin, "discarded": true, "removed": never}),
    ))
}

fn enable(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let IdParams { plugin } = params(p)?;
    check_id(&plugin)?;
    require_operator(req)?;
    let p = plugin_of(d, &plugin)?;
    not_removing(p)?;
    ledger_ok(d)?;
    let p = plugin_of(d, &plugin)?;
    p.rec.enabled = true;
    host::clear_crashes(p);
    let to = route::reply_key(d, req.clone());
    let value = json!({"plugin": plugin, "enabled": true});
    route::with(d, |h, cx| {
        h.persist();
        h.start_and_answer(&plugin, to, value, cx);
    });
    Ok(None)
}

fn disable(d: &mut Daemon, p: Map<String, Value>) -> Handled {
    let IdParams { plugin } = params(p)?;
    let p = plugin_of(d, &plugin)?;
    p.rec.enabled = false;
    if matches!(p.phase, Phase::Failed(_) | Phase::Restarting(_)) {
        p.phase = Phase::Idle;
    }
    route::with(d, |h, _| {
        h.persist();
        h.stop(&plugin, ShutdownReason::Disabled);
    });
    let state = d
        .plugins
        .plugins
        .get(&plugin)
        .map(|p| p.state().0)
        .unwrap_or("disabled");
    Ok(Some(
        json!({"plugin": plugin, "enabled": false, "state": state}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RemoveParams {
    plugin: String,
    #[serde(default)]
    stop_tasks: Option<bool>,
}

fn remove(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let RemoveParams { plugin, stop_tasks } = params(p)?;
    check_id(&plugin)?;
    require_operator(req)?;
    let p = plugin_of(d, &plugin)?;
    if p.run.is_some() && matches!(p.after_stop, AfterStop::Remove { .. }) {
        return Err(RpcError::new(
            Code::PluginRemovePending,
            "the plugin is being removed",
        ));
    }
    if !p.removal.aborting.is_empty() {
        return Err(RpcError::new(
            Code::PluginRemovePending,
            format!(
                "the plugin is being removed; {} aborted dispatch(es) have not ended",
                p.removal.aborting.len()
            ),
        ));
    }
    p.rec.removal = Some("removing".into());
    // stopTasks (true when absent): every lane of its requests still at work
    // is closed, which stops its sessions; a dispatch cut off by a daemon
    // stop is aborted now (its lane closed, its worktree listed); a dispatch
    // in flight is waited for (host::finish_removal) and aborted when it
    // lands (tasks::landed). False: they go on as ordinary lanes.
    let stop = stop_tasks.unwrap_or(true);
    p.removal.stop_tasks = stop;
    let lanes = std::mem::take(&mut p.rec.lanes);
    let starting = std::mem::take(&mut p.rec.starting);
    let running = p.run.is_some();
    if stop {
        let mut stopped = 0;
        for lane in lanes {
            stopped += crate::daemon::router::lanes::stop_for_removal(d, &lane);
        }
        if let Some(p) = d.plugins.plugins.get_mut(&plugin) {
            p.stopped_sessions = stopped;
        }
        for rid in starting {
            if d.plugins.tasks.dispatching(&rid) {
                if let Some(p) = d.plugins.plugins.get_mut(&plugin) {
                    p.removal.aborting.insert(rid);
                }
            } else {
                route::with(d, |h, _| h.abort_cut_off(&plugin, &rid));
            }
        }
    }
    let waits = d
        .plugins
        .plugins
        .get(&plugin)
        .map_or(0, |p| p.removal.aborting.len());
    crate::info!(
        "plugin {plugin}: removing (stopTasks {stop}); {waits} dispatch(es) in flight to abort"
    );
    route::with(d, |h, _| h.persist());
    let to = route::reply_key(d, req.clone());
    if running {
        if let Some(p) = d.plugins.plugins.get_mut(&plugin) {
            p.after_stop = AfterStop::Remove { to };
        }
        route::with(d, |h, _| h.stop(&plugin, ShutdownReason::Removed));
    } else {
        route::with(d, |h, cx| h.finish_removal(&plugin, Some(to), cx));
    }
    Ok(None)
}

fn is_full_command(s: &str) -> bool {
    s.chars().count() <= 97
        && s.split_once('.')
            .is_some_and(|(p, c)| is_plugin_id(p) && is_command_id(c))
}

fn commands(d: &mut Daemon, p: Map<String, Value>) -> Handled {
    let CursorParams { cursor } = params(p)?;
    if cursor.as_ref().is_some_and(|c| !is_full_command(c)) {
        return Err(RpcError::invalid_params(
            "cursor must be a command as <plugin>.<command>",
        ));
    }
    let mut items = Vec::new();
    for p in d.plugins.plugins.values() {
        let (state, _) = p.state();
        if !matches!(state, "starting" | "running" | "restarting" | "failed") {
            continue;
        }
        let Some(l) = &p.approved else { continue };
        let mut cmds = l.manifest.commands.clone();
        cmds.sort_by(|a, b| a.id.cmp(&b.id));
        for c in cmds {
            let full = format!("{}.{}", p.rec.plugin, c.id);
            if cursor.as_ref().is_some_and(|cur| {
                (p.rec.plugin.as_str(), c.id.as_str()) <= cur.split_once('.').unwrap_or(("", ""))
            }) {
                continue;
            }
            items.push(json!({
                "command": full, "plugin": p.rec.plugin, "pluginName": l.manifest.name, "title": c.title,
                "description": c.description, "input": if c.input == CommandInput::Text { "text" } else { "none" },
                "available": state == "running",
            }));
        }
    }
    let more = items.len() > limits::PLUGIN_COMMANDS_PAGE_MAX;
    items.truncate(limits::PLUGIN_COMMANDS_PAGE_MAX);
    let next = if more {
        items
            .last()
            .map(|i| i["command"].clone())
            .unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    Ok(Some(json!({"commands": items, "nextCursor": next})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunParams {
    command: String,
    input: Option<String>,
}

fn command_run(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let RunParams { command, input } = params(p)?;
    if !is_full_command(&command) {
        return Err(RpcError::invalid_params(
            "command must be <plugin id>.<command id>",
        ));
    }
    if let Some(i) = &input {
        if i.chars().count() > limits::PLUGIN_COMMAND_INPUT_MAX
            || i.chars().any(|c| c < ' ' || c == '\u{7f}')
        {
            return Err(RpcError::invalid_params(
                "input must be one line of at most 1024 characters without control characters",
            ));
        }
    }
    require_operator(req)?;
    let (plugin, cid) = command.split_once('.').ok_or_else(RpcError::internal)?;
    let missing = || {
        RpcError::new(
            Code::CommandNotFound,
            "no plugin that can run has this command",
        )
    };
    let p = d.plugins.plugins.get(plugin).ok_or_else(missing)?;
    let (state, _) = p.state();
    if !matches!(state, "starting" | "running" | "restarting" | "failed") {
        return Err(missing());
    }
    let c = p
        .approved
        .as_ref()
        .and_then(|l| l.manifest.commands.iter().find(|c| c.id == cid))
        .ok_or_else(missing)?;
    match (c.input, &input) {
        (CommandInput::Text, None) => {
            return Err(RpcError::invalid_params("this command takes input"));
        }
        (CommandInput::None, Some(_)) => {
            return Err(RpcError::invalid_params("this command takes no input"));
        }
        _ => {}
    }
    let run = p
        .run
        .as_ref()
        .filter(|r| r.initialized && state == "running")
        .ok_or_else(|| {
            RpcError::new(
                Code::PluginNotRunning,
                "the command's plugin is not running",
            )
        })?;
    if run.commands >= limits::PLUGIN_MAX_COMMANDS_IN_FLIGHT {
        return Err(RpcError::new(
            Code::Busy,
            "4 commands of the plugin are unanswered",
        ));
    }
    let to = route::reply_key(d, req.clone());
    route::with(d, |h, cx| {
        h.run_command(plugin, to, cid.to_string(), input, cx)
    });
    Ok(None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RequestParams {
    request_id: String,
}

fn request_get(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let RequestParams { request_id } = params(p)?;
    let ok = request_id.strip_prefix("plugin_").is_some_and(|u| {
        u.len() == 36
            && u.bytes().enumerate().all(|(i, b)| {
                if matches!(i, 8 | 13 | 18 | 23) {
                    b == b'-'
                } else {
                    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
                }
            })
    });
    if !ok {
        return Err(RpcError::invalid_params(
            "requestId must be plugin_ and a lowercase UUID",
        ));
    }
    let to = route::reply_key(d, req.clone());
    route::with(d, |h, _| h.task_get(to, request_id));
    Ok(None)
}
