//! The plugin host's limits through the real binary (seed 000): storage
//! quotas and their survival of a daemon killed right after an answer,
//! pages that shrink to fit one line, the list-call limit, the request
//! budget, too-many-pending, busy commands, events.dropped, and the copies
//! that wait again (files-changed, store-changed) or are discarded.
//!
//! The fixture `tests/fixtures/plugins/limits` is driven by command.run
//! inputs; waiting is on the daemon's log lines, its event notifications
//! and the plugin's own answers, never on sleeps in the test (the fixture
//! sleeps where a budget must refill).

mod util;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use util::{Daemon, Opts, TestDir};

fn config(extra: &str) -> String {
    let py = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    format!("[plugins]\nnode = \"node\"\npython = \"{py}\"\nrestart_backoff_ms = 20\n{extra}")
}

/// The config with one `[[seat]]` "fake" of the fake ACP agent.
fn config_with_fake(extra: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_acp_agent.py");
    format!(
        "{}\n[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ FAKE_SCRIPT = '[]' }}\n",
        config(extra),
        script.display()
    )
}

fn start(dir: &TestDir, cfg: String) -> Daemon {
    Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(cfg),
            ..Opts::default()
        },
    )
}

/// Writes the limits fixture's folder under `id` with `perms`.
fn limits_plugin(dir: &TestDir, id: &str, perms: &[&str]) -> PathBuf {
    let folder = dir.join(&format!("src-{id}"));
    std::fs::create_dir_all(&folder).unwrap();
    let main = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/plugins/limits/main.py");
    std::fs::copy(main, folder.join("main.py")).unwrap();
    let manifest = json!({
        "manifestVersion": 1, "api": "1.0", "id": id, "name": "Limits", "version": "1.0.0",
        "description": "Pushes the host's limits.", "main": "main.py", "permissions": perms,
        "commands": [
            {"id": "calls", "title": "Calls", "input": "text"},
            {"id": "hold", "title": "Never answered"},
            {"id": "fail", "title": "Fails", "input": "text"},
            {"id": "fill", "title": "Fill its input", "input": "text"},
            {"id": "notes", "title": "Notifications", "input": "text"},
        ],
    });
    std::fs::write(folder.join("omniconflux-plugin.json"), manifest.to_string()).unwrap();
    folder
}

/// Installs and approves the folder; returns the plugin id.
fn install_approve(c: &mut util::Client, folder: &Path) -> String {
    let inst = c.call(
        "plugin.install",
        json!({"path": folder.display().to_string()}),
    );
    let id = inst["plugin"].as_str().unwrap().to_string();
    let got = c.call("plugin.get", json!({"plugin": id}));
    let m = &got["waiting"]["manifest"];
    let mut perms: Vec<String> = m["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    let order = [
        "events.read",
        "lists.read",
        "commands.add",
        "storage.own",
        "tasks.create",
    ];
    perms.sort_by_key(|p| order.iter().position(|o| o == p));
    let cmds: Vec<Value> = m["commands"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    let r = c.call(
        "plugin.approve",
        json!({"plugin": id, "snapshotHash": inst["snapshotHash"], "permissions": perms, "commands": cmds, "operator": "test operator"}),
    );
    assert_eq!(r["approved"], json!(true), "{r}");
    id
}

/// Runs `command` of plugin `id` with `input`; its JSON answer.
fn run(c: &mut util::Client, id: &str, command: &str, input: &str) -> Value {
    let mut p = json!({"command": format!("{id}.{command}")});
    if !input.is_empty() {
        p["input"] = json!(input);
    }
    let r = c.call("plugin.command.run", p);
    serde_json::from_str(r["text"].as_str().unwrap()).unwrap()
}

/// The `calls` command: `spec` as its input; the answers by index.
fn calls(c: &mut util::Client, id: &str, spec: Value) -> Vec<Value> {
    let got = run(c, id, "calls", &spec.to_string());
    let o = got.as_object().unwrap();
    let mut out: Vec<(usize, Value)> = o
        .iter()
        .map(|(k, v)| (k.parse().unwrap(), v.clone()))
        .collect();
    out.sort_by_key(|(k, _)| *k);
    out.into_iter().map(|(_, v)| v).collect()
}

/// One call's answer.
fn one(c: &mut util::Client, id: &str, method: &str, params: Value) -> Value {
    calls(c, id, json!({"seq": [[method, params, 1]]})).remove(0)
}

#[test]
fn storage_quotas_hold_and_storage_survives_a_killed_daemon() {
    let dir = TestDir::new("plstore");
    let mut d = start(&dir, config(""));
    let mut c = d.connect();
    let id = install_approve(
        &mut c,
        &limits_plugin(&dir, "limits-store", &["commands.add", "storage.own"]),
    );
    d.wait_log("plugin limits-store is running");

    // A value is at most 16,384 characters, counted as characters: 16,384
    // two-byte characters are stored (32,768 bytes), one more is refused.
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "u", "value": "@e:16384"})
        ),
        json!({"key": "u", "bytes": 32768})
    );
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "u", "value": "@e:16385"})
        ),
        "!invalid-params"
    );
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "u", "value": "@x:16385"})
        ),
        "!invalid-params"
    );
    assert_eq!(
        one(&mut c, &id, "storage.delete", json!({"key": "u"})),
        json!({"key": "u", "deleted": true})
    );

    // A key is a name, never a path.
    let bad = [
        "",
        "Upper",
        "../x",
        ".dot",
        "-dash",
        "a/b",
        "sp ace",
        &"k".repeat(65),
    ];
    for key in bad {
        assert_eq!(
            one(
                &mut c,
                &id,
                "storage.set",
                json!({"key": key, "value": "v"})
            ),
            "!invalid-params",
            "{key:?}"
        );
        assert_eq!(
            one(&mut c, &id, "storage.get", json!({"key": key})),
            "!invalid-params",
            "{key:?}"
        );
    }
    let longest = "k".repeat(64);
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": longest, "value": ""})
        ),
        json!({"key": longest, "bytes": 0})
    );
    assert_eq!(
        one(&mut c, &id, "storage.delete", json!({"key": longest})),
        json!({"key": longest, "deleted": true})
    );

    // 1 MiB in all: 64 values of 16,384 bytes fill it exactly, one byte
    // more is refused with data.limit bytes, a replacement of the same size
    // is not.
    let got = calls(
        &mut c,
        &id,
        json!({"seq": [["storage.set", {"key": "b{i}", "value": "@x:16384"}, 64]], "window": 8}),
    );
    assert!(got.iter().all(|a| a["bytes"] == 16384), "{got:?}");
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "z", "value": "x"})
        ),
        "!quota-exceeded:bytes"
    );
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "b0", "value": "@x:16385"})
        ),
        "!invalid-params"
    );
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "b0", "value": "@x:16384"})
        ),
        json!({"key": "b0", "bytes": 16384})
    );
    // 128 keys: 64 empty ones more fill them, the 129th is refused with
    // data.limit keys; replacing a key's value is not a new key.
    let got = calls(
        &mut c,
        &id,
        json!({"seq": [["storage.set", {"key": "k{i}", "value": ""}, 64]], "window": 8}),
    );
    assert!(got.iter().all(|a| a["bytes"] == 0), "{got:?}");
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "one-more", "value": ""})
        ),
        "!quota-exceeded:keys"
    );
    assert_eq!(
        one(&mut c, &id, "storage.list", json!({})),
        json!({"keys": 128, "bytes": 1_048_576})
    );
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(got["storage"], json!({"keys": 128, "bytes": 1_048_576}));

    // The value is on disk before the response: the daemon is killed the
    // moment the answer is back, and the next daemon has it.
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "k0", "value": "x"})
        ),
        "!quota-exceeded:bytes"
    );
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "b0", "value": "survives"})
        ),
        json!({"key": "b0", "bytes": 8})
    );
    d.kill9();
    let d = start(&dir, config(""));
    let mut c = d.connect();
    d.wait_log("plugin limits-store is running");
    assert_eq!(
        one(&mut c, &id, "storage.get", json!({"key": "b0"})),
        json!({"key": "b0", "value": "survives"})
    );
    assert_eq!(
        one(&mut c, &id, "storage.list", json!({})),
        json!({"keys": 128, "bytes": 1_048_576 - 16_384 + 8})
    );
    d.stop();
}

#[test]
fn request_budgets_list_calls_pending_tasks_and_busy_commands() {
    let dir = TestDir::new("plrate");
    let d = start(&dir, config(""));
    let mut c = d.connect();
    let perms = ["lists.read", "commands.add", "storage.own", "tasks.create"];
    let id = install_approve(&mut c, &limits_plugin(&dir, "limits-rate", &perms));
    d.wait_log("plugin limits-rate is running");

    // More than 10 list calls in one second: 21 at once span at most two
    // seconds, so one of them is over; the first 10 never are.
    let got = calls(&mut c, &id, json!({"seq": [["seats.list", {}, 21]]}));
    assert!(
        got[..10]
            .iter()
            .all(|a| a == &json!({"seats": 0, "nextCursor": null})),
        "{got:?}"
    );
    let limited = got.iter().filter(|a| *a == "!rate-limited").count();
    assert!(limited >= 1, "{got:?}");
    assert_eq!(
        limited + got.iter().filter(|a| a["seats"] == 0).count(),
        21,
        "{got:?}"
    );

    // 50 a second with 200 at once: after 4 s of rest the budget is full;
    // 260 requests at once get 200 answers and then, unless the host took
    // more than a second for them, rate-limited.
    let got = calls(
        &mut c,
        &id,
        json!({"seq": [["storage.get", {"key": "k"}, 260]], "pause": 4}),
    );
    assert!(
        got[..200]
            .iter()
            .all(|a| a == &json!({"key": "k", "value": null})),
        "{got:?}"
    );
    let limited = got.iter().filter(|a| *a == "!rate-limited").count();
    assert!(limited >= 1, "{got:?}");
    assert_eq!(
        limited + got.iter().filter(|a| a["key"] == "k").count(),
        260
    );

    // 3 unanswered task requests: the fourth is too-many-pending at once.
    let task = json!({"repo": "/srv/work/shop", "task": "Add a test.", "builder": "claude", "verifier": "codex",
                      "acceptance": {"name": "unit tests", "command": "npm test"}});
    let got = run(
        &mut c,
        &id,
        "calls",
        &json!({"seq": [["tasks.create", task, 4]], "pause": 2, "need": 1}).to_string(),
    );
    assert_eq!(got, json!({"3": "!too-many-pending"}));
    d.wait_log_count("waits for the operator", 3);
    // Once one is answered, a new request is taken again.
    let list = c.call("approvals.list", json!({}));
    let items: Vec<&Value> = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["subject"] == "plugin-task")
        .collect();
    assert_eq!(items.len(), 3, "{list}");
    c.call(
        "approvals.answer",
        json!({"request_id": items[0]["request_id"], "decision": "deny"}),
    );
    let got = run(
        &mut c,
        &id,
        "calls",
        &json!({"seq": [["tasks.create", task, 2]], "need": 1}).to_string(),
    );
    assert_eq!(got, json!({"1": "!too-many-pending"}));
    d.wait_log_count("waits for the operator", 4);

    // 4 unanswered commands: a fifth is busy. All five are sent at once on
    // one connection, so the daemon takes them in order.
    let mut raw = d.connect();
    let mut batch = String::new();
    for n in 1..=5 {
        batch.push_str(&format!("{}\n", json!({"jsonrpc": "2.0", "id": n, "method": "plugin.command.run", "params": {"command": format!("{id}.hold")}})));
    }
    raw.send_raw(batch.as_bytes());
    let first = raw.read_line().unwrap();
    assert_eq!(
        (first["id"].clone(), first["error"]["data"]["code"].clone()),
        (json!(5), json!("busy")),
        "{first}"
    );
    // The held ones end when the plugin does: plugin-not-running.
    c.call("plugin.disable", json!({"plugin": id}));
    for _ in 1..=4 {
        let r = raw.read_line().unwrap();
        assert_eq!(r["error"]["data"]["code"], "plugin-not-running", "{r}");
    }
    d.stop();
}

/// Spawns a session of the fake seat in `cwd` with a prompt; its id.
fn spawn(c: &mut util::Client, cwd: &Path) -> String {
    std::fs::create_dir_all(cwd).unwrap();
    let r = c.call("sessions.spawn", json!({"harness": "fake", "cwd": cwd.canonicalize().unwrap().display().to_string(), "prompt": "hello"}));
    r["session_id"].as_str().unwrap().to_string()
}

/// Waits, on a client subscribed to every stream, for `sid`'s turn.end.
fn turn_end(events: &mut util::Client, sid: &str) {
    loop {
        let n = events.next_note("event");
        if n["params"]["stream"] == sid && n["params"]["kind"] == "turn.end" {
            return;
        }
    }
}

/// The API-kind events of `sid`'s stream, as (kind, seq).
fn api_events(c: &mut util::Client, sid: &str) -> Vec<(String, Value)> {
    let kinds = [
        "session.start",
        "session.end",
        "turn.start",
        "turn.end",
        "approval.request",
        "approval.resolved",
    ];
    let r = c.call("events.list", json!({"stream": sid, "limit": 1000}));
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| kinds.contains(&e["kind"].as_str().unwrap()))
        .map(|e| (e["kind"].as_str().unwrap().to_string(), e["seq"].clone()))
        .collect()
}

#[test]
fn events_past_1_mib_waiting_are_dropped_and_counted_once() {
    let dir = TestDir::new("pldrop");
    let d = start(&dir, config_with_fake(""));
    d.wait_log("seat fake: ready");
    let mut c = d.connect();
    let mut events = d.connect();
    events.call("events.subscribe", json!({}));
    let id = install_approve(
        &mut c,
        &limits_plugin(
            &dir,
            "limits-events",
            &["events.read", "commands.add", "storage.own"],
        ),
    );
    d.wait_log("plugin limits-events is running");
    // Its subscription (sent right after initialize) is in force before
    // this answer comes.
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "big", "value": "@x:16384"})
        ),
        json!({"key": "big", "bytes": 16384})
    );

    // The plugin asks for 100 values of 16 KiB and stops reading: more
    // than 1 MiB waits for it once the host has its requests, which is
    // before the answer to `fill`.
    assert_eq!(run(&mut c, &id, "fill", "100"), json!({"sent": 100}));
    let a = spawn(&mut c, &dir.join("wt"));
    turn_end(&mut events, &a);
    let dropped = api_events(&mut c, &a);
    assert!(dropped.len() >= 3, "{dropped:?}");

    // It reads again: one events.dropped counting every event of the
    // session, and none of them.
    std::fs::write(d.state.join("plugins").join(&id).join("work/resume"), "").unwrap();
    let notes = run(&mut c, &id, "notes", "1");
    assert_eq!(
        notes,
        json!([{"method": "events.dropped", "params": {"count": dropped.len()}}])
    );

    // Later events come after it, and it is not sent again.
    let b = spawn(&mut c, &dir.join("wt"));
    turn_end(&mut events, &b);
    let later = api_events(&mut c, &b);
    let notes = run(&mut c, &id, "notes", &(1 + later.len()).to_string());
    let notes = notes.as_array().unwrap();
    assert_eq!(notes.len(), 1 + later.len(), "{notes:?}");
    assert_eq!(notes[0]["method"], "events.dropped");
    let got: Vec<(String, Value)> = notes[1..]
        .iter()
        .map(|n| {
            assert_eq!(
                (n["method"].as_str(), n["params"]["session"].as_str()),
                (Some("event"), Some(b.as_str())),
                "{n}"
            );
            (
                n["params"]["kind"].as_str().unwrap().to_string(),
                n["params"]["seq"].clone(),
            )
        })
        .collect();
    assert_eq!(got, later);
    d.stop();
}

#[test]
fn a_sessions_page_that_would_not_fit_one_line_shrinks() {
    let dir = TestDir::new("plpage");
    let d = start(&dir, config_with_fake(""));
    d.wait_log("seat fake: ready");
    let mut c = d.connect();
    let mut events = d.connect();
    events.call("events.subscribe", json!({}));
    let id = install_approve(
        &mut c,
        &limits_plugin(&dir, "limits-page", &["lists.read", "commands.add"]),
    );
    d.wait_log("plugin limits-page is running");
    // Worktrees of about 4,000 characters: 16 sessions are more than one
    // line of 65,536 bytes holds.
    let mut wt = dir.join("wt");
    while wt.display().to_string().len() < 3_900 {
        wt = wt.join("d".repeat(200));
    }
    let sids: Vec<String> = (0..16).map(|_| spawn(&mut c, &wt)).collect();
    let mut ended = std::collections::HashSet::new();
    while ended.len() < sids.len() {
        let n = events.next_note("event");
        if n["params"]["kind"] == "turn.end" {
            ended.insert(n["params"]["stream"].as_str().unwrap().to_string());
        }
    }
    let first = one(&mut c, &id, "sessions.list", json!({"limit": 500}));
    let n = first["sessions"].as_u64().unwrap() as usize;
    assert!((1..16).contains(&n), "{first}");
    assert_eq!(first["nextCursor"], json!(sids[n - 1]), "{first}");
    let rest = one(
        &mut c,
        &id,
        "sessions.list",
        json!({"limit": 500, "cursor": sids[n - 1]}),
    );
    assert_eq!(rest, json!({"sessions": 16 - n, "nextCursor": null}));
    // A limit below what fits is kept, and says there is more.
    let two = one(&mut c, &id, "sessions.list", json!({"limit": 2}));
    assert_eq!(two, json!({"sessions": 2, "nextCursor": sids[1]}));
    d.stop();
}

#[test]
fn changed_copies_and_records_wait_again_and_a_waiting_copy_is_discarded() {
    let dir = TestDir::new("plcopy");
    let d = start(&dir, config(""));
    let mut c = d.connect();
    let src = limits_plugin(&dir, "limits-copy", &["commands.add", "storage.own"]);
    let id = install_approve(&mut c, &src);
    d.wait_log("plugin limits-copy is running");
    assert_eq!(
        one(
            &mut c,
            &id,
            "storage.set",
            json!({"key": "kept", "value": "yes"})
        ),
        json!({"key": "kept", "bytes": 3})
    );

    // Nothing waits: discard is not-found.
    assert_eq!(
        c.error_code("plugin.discard", json!({"plugin": id})),
        "not-found"
    );
    // A new copy waits beside the approved one; discarding it leaves the
    // approved copy running.
    std::fs::write(src.join("notes.txt"), "a second version").unwrap();
    let inst = c.call("plugin.install", json!({"path": src.display().to_string()}));
    assert_eq!(inst["unchanged"], false, "{inst}");
    assert_eq!(
        c.call("plugin.get", json!({"plugin": id}))["waiting"]["kind"],
        "install"
    );
    let r = c.call("plugin.discard", json!({"plugin": id}));
    assert_eq!(
        r,
        json!({"plugin": id, "discarded": true, "removed": false})
    );
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(
        (got["state"].clone(), got["waiting"].clone()),
        (json!("running"), Value::Null),
        "{got}"
    );
    assert_eq!(
        c.error_code("plugin.discard", json!({"plugin": id})),
        "not-found"
    );

    // The approved copy changes on disk: the next start finds it, and the
    // copy waits again as files-changed, installed by nobody.
    let approved = d.state.join("plugins").join(&id).join("approved");
    let main = approved.join("main.py");
    let mut perm = std::fs::metadata(&main).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
    std::fs::set_permissions(&main, perm).unwrap();
    let text = std::fs::read_to_string(&main).unwrap();
    std::fs::write(&main, format!("{text}\n# changed after its approval\n")).unwrap();
    c.call("plugin.disable", json!({"plugin": id}));
    d.wait_log("plugin limits-copy exited");
    let r = c.call("plugin.enable", json!({"plugin": id}));
    assert_eq!(r["state"], "pending-approval", "{r}");
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(
        (got["state"].clone(), got["reason"].clone()),
        (json!("pending-approval"), json!("files-changed")),
        "{got}"
    );
    assert_eq!(
        (
            got["waiting"]["kind"].clone(),
            got["waiting"].get("installedBy"),
            got["approved"].clone()
        ),
        (json!("files-changed"), Some(&Value::Null), json!(false)),
        "{got}"
    );
    assert_eq!(
        c.error_code(
            "plugin.command.run",
            json!({"command": format!("{id}.hold")})
        ),
        "command-not-found"
    );
    // Approving the changed copy runs it, with its storage.
    let m = &got["waiting"]["manifest"];
    let cmds: Vec<Value> = m["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    let r = c.call(
        "plugin.approve",
        json!({"plugin": id, "snapshotHash": got["waiting"]["snapshotHash"], "permissions": ["commands.add", "storage.own"], "commands": cmds, "operator": "test operator"}),
    );
    assert_eq!(r["approved"], true, "{r}");
    d.wait_log_count("plugin limits-copy is running", 2);
    assert_eq!(
        one(&mut c, &id, "storage.get", json!({"key": "kept"})),
        json!({"key": "kept", "value": "yes"})
    );
    let state = d.state.clone();
    d.stop();

    // An approval record that fails its check counts as nothing approved:
    // the next daemon does not start the plugin, which waits as
    // store-changed.
    let record = state.join("plugins/plugins.json");
    let mut file: Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    let a = &mut file["plugins"][0]["approval"];
    a["operator"] = json!("someone else");
    std::fs::write(&record, file.to_string()).unwrap();
    let d = start(&dir, config(""));
    let mut c = d.connect();
    d.wait_log("plugin limits-copy: the approved copy waits for approval again (store-changed)");
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(
        (got["state"].clone(), got["reason"].clone()),
        (json!("pending-approval"), json!("store-changed")),
        "{got}"
    );
    assert_eq!(
        (
            got["waiting"]["kind"].clone(),
            got.get("approval"),
            got["approved"].clone()
        ),
        (json!("store-changed"), Some(&Value::Null), json!(false)),
        "{got}"
    );
    assert_eq!(
        c.error_code(
            "plugin.command.run",
            json!({"command": format!("{id}.hold")})
        ),
        "command-not-found"
    );
    // Every plugin that can run is started once the isolation probe has
    // answered, in the same step as this line.
    d.wait_log("plugins run ");
    assert!(
        !d.log_text().contains("plugin limits-copy started"),
        "{}",
        d.log_text()
    );
    d.stop();
}

/// Denies every plugin-task request waiting in the inbox; how many.
fn deny_all(c: &mut util::Client) -> usize {
    let list = c.call("approvals.list", json!({}));
    let ids: Vec<Value> = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["subject"] == "plugin-task")
        .map(|i| i["request_id"].clone())
        .collect();
    for id in &ids {
        c.call(
            "approvals.answer",
            json!({"request_id": id, "decision": "deny"}),
        );
    }
    ids.len()
}

#[test]
fn task_requests_hold_to_20_a_day_and_3_of_the_hours_60_records() {
    let dir = TestDir::new("pltasks");
    let d = start(&dir, config(""));
    let mut c = d.connect();
    let task = json!({"repo": "/srv/work/shop", "task": "Add a test {i}.", "builder": "claude", "verifier": "codex",
                      "acceptance": {"name": "unit tests", "command": "npm test"}});

    // 57 storage writes leave 3 of the hour's 60 records: one task request
    // still fits, the next does not, while storage writes go on.
    let perms = ["commands.add", "storage.own", "tasks.create"];
    let id = install_approve(&mut c, &limits_plugin(&dir, "limits-records", &perms));
    d.wait_log("plugin limits-records is running");
    let spec = json!({"seq": [["storage.set", {"key": "k{i}", "value": "v"}, 57], ["tasks.create", task, 1]],
                      "window": 8, "need": 57, "messages": true});
    let got = calls(&mut c, &id, spec);
    assert!(got.iter().all(|a| a["bytes"] == 1), "{got:?}");
    d.wait_log_count("waits for the operator", 1);
    let spec = json!({"seq": [["tasks.create", task, 1], ["storage.set", {"key": "last", "value": "v"}, 1]],
                      "messages": true});
    assert_eq!(
        calls(&mut c, &id, spec),
        [
            json!(
                "!rate-limited|too few of the hour's 60 ledger records are left for a task request"
            ),
            json!({"key": "last", "bytes": 1})
        ]
    );
    assert_eq!(deny_all(&mut c), 1);

    // 20 task requests in 24 hours, answered three at a time: the 21st is
    // refused.
    let perms = ["commands.add", "tasks.create"];
    let id = install_approve(&mut c, &limits_plugin(&dir, "limits-daily", &perms));
    d.wait_log("plugin limits-daily is running");
    let mut asked = 1;
    while asked < 21 {
        let n = 3.min(21 - asked);
        calls(
            &mut c,
            &id,
            json!({"seq": [["tasks.create", task, n]], "need": 0}),
        );
        asked += n;
        d.wait_log_count("waits for the operator", asked);
        assert_eq!(deny_all(&mut c), n);
    }
    let got = calls(
        &mut c,
        &id,
        json!({"seq": [["tasks.create", task, 1]], "messages": true}),
    );
    assert_eq!(got, [json!("!rate-limited|20 task requests in 24 hours")]);
    d.stop();
}

#[test]
fn a_command_not_answered_in_time_or_failed_reaches_the_operator_typed() {
    let dir = TestDir::new("plcmd");
    let d = start(&dir, config("command_timeout_ms = 300\n"));
    let mut c = d.connect();
    let id = install_approve(
        &mut c,
        &limits_plugin(&dir, "limits-cmd", &["commands.add"]),
    );
    d.wait_log("plugin limits-cmd is running");
    // The plugin never answers `hold`: plugin-timeout once the bound
    // (here 300 ms, 30 s by default) passed.
    let r = c.request(
        "plugin.command.run",
        json!({"command": format!("{id}.hold")}),
    );
    assert_eq!(
        (
            r["error"]["data"]["code"].clone(),
            r["error"]["message"].clone()
        ),
        (
            json!("plugin-timeout"),
            json!("the plugin did not answer command.run in 300 ms")
        ),
        "{r}"
    );
    // It answers `fail` with a failure: plugin-error naming it.
    let r = c.request(
        "plugin.command.run",
        json!({"command": format!("{id}.fail"), "input": "internal-error"}),
    );
    assert_eq!(r["error"]["data"]["code"], "plugin-error", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("the plugin failed: internal-error"), "{r}");
    // The plugin runs on: a timeout is no fault.
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(got["state"], "running", "{got}");
    d.stop();
}
