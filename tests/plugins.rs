//! The plugin host through the real binary (issue 4, "Tests"): sample
//! plugins in node and python installed, approved, run and removed through
//! the daemon socket; every line the host wrote to them checked against the
//! schemas; and a hostile plugin for each fault, each ending in the page's
//! state and reason while the daemon and the other plugins keep running.
//!
//! Waiting is on the daemon's log lines and on the plugins' own answers to
//! command.run (a `report` command answers once what it waits for has
//! happened), never on sleeps.

mod schema_check;
mod util;

use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use util::{Daemon, Opts, TestDir};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/plugins")
        .join(name)
}

fn config(extra: &str) -> String {
    let py = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    format!("[plugins]\nnode = \"node\"\npython = \"{py}\"\nrestart_backoff_ms = 20\n{extra}")
}

fn start(dir: &TestDir, extra: &str) -> Daemon {
    start_with_seats(dir, extra, &[])
}

/// A `[[seat]]` of the fake ACP agent: its harness, its script, its
/// environment.
type Seat<'a> = (&'a str, Value, Vec<(&'a str, String)>);

/// As `start`, with `[[seat]]`s of the fake ACP agent.
fn start_with_seats(dir: &TestDir, extra: &str, seats: &[Seat]) -> Daemon {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_acp_agent.py");
    let mut cfg = config(extra);
    for (harness, steps, env) in seats {
        let mut env_s = format!("FAKE_SCRIPT = '{steps}'");
        for (k, v) in env {
            env_s.push_str(&format!(", {k} = '{v}'"));
        }
        cfg.push_str(&format!(
            "\n[[seat]]\nharness = \"{harness}\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ {env_s} }}\n",
            script.display()
        ));
    }
    Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(cfg),
            ..Opts::default()
        },
    )
}

/// Spawns a session of `harness` in `dir`/wt with `prompt`; its id.
fn spawn(c: &mut util::Client, dir: &TestDir, harness: &str, prompt: &str) -> String {
    let wt = dir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let r = c.call("sessions.spawn", json!({"harness": harness, "cwd": wt.canonicalize().unwrap().display().to_string(), "prompt": prompt}));
    r["session_id"].as_str().unwrap().to_string()
}

/// The seq of the first `kind` event of `stream` in the ledger.
fn seq_of(c: &mut util::Client, stream: &str, kind: &str) -> Value {
    let r = c.call("events.list", json!({"stream": stream, "limit": 1000}));
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == kind)
        .map(|e| e["seq"].clone())
        .unwrap_or(Value::Null)
}

/// Runs `command` of sample-py with `input`; its JSON answer.
fn py(c: &mut util::Client, command: &str, input: &str) -> Value {
    let mut p = json!({"command": format!("sample-py.{command}")});
    if !input.is_empty() {
        p["input"] = json!(input);
    }
    let r = c.call("plugin.command.run", p);
    serde_json::from_str(r["text"].as_str().unwrap()).unwrap()
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

fn report(c: &mut util::Client, id: &str, wait: &str) -> Value {
    let r = c.call(
        "plugin.command.run",
        json!({"command": format!("{id}.report"), "input": wait}),
    );
    serde_json::from_str(r["text"].as_str().unwrap()).unwrap()
}

/// Checks every line the host wrote to a plugin, from the plugin's logs in
/// its working directory.
fn check_wire(state: &Path, id: &str) -> usize {
    let work = state.join("plugins").join(id).join("work");
    let schemas = schema_check::Schemas::load();
    let mut asked = HashMap::new();
    for line in std::fs::read_to_string(work.join("wire-out.jsonl"))
        .unwrap_or_default()
        .lines()
    {
        let v: Value = serde_json::from_str(line).unwrap();
        if let (Some(i), Some(m)) = (v["id"].as_str(), v["method"].as_str()) {
            // The first request under an id is the one answered with a
            // result; a second one under it can only be refused.
            asked.entry(i.to_string()).or_insert_with(|| m.to_string());
        }
    }
    let text = std::fs::read_to_string(work.join("wire-in.jsonl")).unwrap();
    let mut n = 0;
    for line in text.lines() {
        if let Err(e) = schemas.check_host_line(line, &asked) {
            panic!("the host wrote a line that is not valid: {e}");
        }
        n += 1;
    }
    n
}

#[test]
fn install_approve_run_subscribe_and_get_a_committed_event() {
    let dir = TestDir::new("pslice");
    let d = start_with_seats(&dir, "", &[("fake", json!([]), vec![])]);
    let mut c = d.connect();
    let inst = c.call(
        "plugin.install",
        json!({"path": fixture("sample-node").display().to_string()}),
    );
    assert_eq!(inst["state"], "pending-approval");
    assert_eq!(inst["installedBy"], "operator");
    assert_eq!(inst["unchanged"], false);
    let again = c.call(
        "plugin.install",
        json!({"path": fixture("sample-node").display().to_string()}),
    );
    assert_eq!(again["unchanged"], true);
    let listed = c.call("plugin.list", json!({}));
    assert_eq!(listed["plugins"][0]["reason"], "first-approval");
    let got = c.call("plugin.get", json!({"plugin": "sample-node"}));
    assert_eq!(got["waiting"]["kind"], "install");
    let diff = got["waiting"]["diff"].as_array().unwrap();
    assert_eq!(diff.last().unwrap()["field"], "files");
    assert_eq!(diff.last().unwrap()["added"], 2);
    // A stale approval is refused.
    let stale = c.error_code(
        "plugin.approve",
        json!({"plugin": "sample-node", "snapshotHash": inst["snapshotHash"], "permissions": ["storage.own"], "commands": ["report", "note"], "operator": "op"}),
    );
    assert_eq!(stale, "plugin-stale-snapshot");

    install_approve(&mut c, &fixture("sample-node"));
    d.wait_log("plugin sample-node is running");
    let seen = report(&mut c, "sample-node", "subscribed");
    assert_eq!(seen["subscribed"], json!(["session.start", "turn.end"]));
    assert_eq!(
        seen["sessions"],
        json!({"sessions": [], "nextCursor": null})
    );
    assert_eq!(seen["boot"], json!({"key": "boots", "bytes": 1}));

    // What an operator appends on an x- stream looks like a session's
    // events but is never offered. A real session's session.start and
    // turn.end, committed by the daemon, are delivered with their seq and
    // only the page's members; its turn.start, a kind the plugin did not
    // subscribe to, is not.
    c.call(
        "events.append",
        json!({"stream": "x-s1", "kind": "turn.end", "data": {"reason": "completed"}}),
    );
    c.call("events.append", json!({"stream": "x-s1", "kind": "session.start", "data": {"harness": "h", "provider": "p", "transport": "acp", "flags": {}}}));
    let sid = spawn(&mut c, &dir, "fake", "hello");
    let seen = report(&mut c, "sample-node", "events:2");
    let events = seen["events"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["session"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [("session.start", sid.as_str()), ("turn.end", sid.as_str())],
        "{seen}"
    );
    assert_eq!(events[0]["seq"], seq_of(&mut c, &sid, "session.start"));
    assert_eq!(events[1]["seq"], seq_of(&mut c, &sid, "turn.end"));
    assert_eq!(events[1]["data"], json!({"reason": "completed"}));
    let start_data: Vec<&String> = events[0]["data"].as_object().unwrap().keys().collect();
    assert_eq!(start_data, ["flags", "harness", "provider", "transport"]);

    // A note goes to storage, on disk before the answer.
    let r = c.call(
        "plugin.command.run",
        json!({"command": "sample-node.note", "input": "check the flaky login test"}),
    );
    assert_eq!(r["text"], "Saved.");
    let got = c.call("plugin.get", json!({"plugin": "sample-node"}));
    assert_eq!(got["state"], "running");
    assert_eq!(got["storage"], json!({"keys": 2, "bytes": 27}));
    assert_eq!(got["approval"]["operator"], "test operator");
    assert!(got["waiting"].is_null());
    assert_eq!(
        c.error_code("plugin.command.run", json!({"command": "sample-node.note"})),
        "invalid-params"
    );
    assert_eq!(
        c.error_code("plugin.command.run", json!({"command": "sample-node.nope"})),
        "command-not-found"
    );
    let cmds = c.call("plugin.commands", json!({}));
    assert_eq!(cmds["commands"].as_array().unwrap().len(), 2);
    assert_eq!(cmds["commands"][0]["command"], "sample-node.note");

    // Disable stops it with shutdown; enable starts it again, and its storage
    // survived (boots is 2).
    let r = c.call("plugin.disable", json!({"plugin": "sample-node"}));
    assert_eq!(r["state"], "disabled");
    d.wait_log("plugin sample-node exited (code 0)");
    let got = c.call("plugin.get", json!({"plugin": "sample-node"}));
    assert_eq!(got["lastExit"]["fault"], Value::Null);
    c.call("plugin.enable", json!({"plugin": "sample-node"}));
    d.wait_log_count("plugin sample-node is running", 2);
    let seen = report(&mut c, "sample-node", "subscribed");
    assert_eq!(seen["boot"], json!({"key": "boots", "bytes": 1}));
    let n = check_wire(&d.state, "sample-node");
    assert!(n >= 10, "{n} lines");

    let r = c.call("plugin.remove", json!({"plugin": "sample-node"}));
    assert_eq!(
        r,
        json!({"plugin": "sample-node", "removed": true, "stopped": 0, "worktrees": []})
    );
    assert!(!d.state.join("plugins/sample-node").exists());
    assert_eq!(
        c.error_code("plugin.get", json!({"plugin": "sample-node"})),
        "plugin-not-found"
    );
    d.stop();
}

/// Writes a hostile plugin's folder: the shared script under its own id.
fn hostile(dir: &TestDir, kind: &str) -> PathBuf {
    let folder = dir.join(&format!("src-{kind}"));
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(fixture("hostile/main.py"), folder.join("main.py")).unwrap();
    let (perms, cmds) = if kind == "inflight" {
        (
            json!(["storage.own", "commands.add"]),
            json!([{"id": "report", "title": "Report", "input": "text"}]),
        )
    } else {
        (json!(["storage.own"]), json!([]))
    };
    let manifest = json!({
        "manifestVersion": 1, "api": "1.0", "id": format!("hostile-{kind}"), "name": format!("Hostile {kind}"),
        "version": "1.0.0", "description": "Misbehaves on purpose.", "main": "main.py", "permissions": perms, "commands": cmds,
    });
    std::fs::write(folder.join("omniconflux-plugin.json"), manifest.to_string()).unwrap();
    folder
}

#[test]
fn each_hostile_plugin_ends_in_its_fault_and_the_others_keep_running() {
    let dir = TestDir::new("phostile");
    // Generous enough that a loaded machine starts python within it: only
    // `noinit`, which never answers, may meet it.
    let d = start_with_seats(
        &dir,
        "initialize_timeout_ms = 3000\nping_interval_ms = 200\nping_timeout_ms = 1500\ncrash_limit = 3\nmemory_mb = 768\nmax_processes = 8\nwatch_interval_ms = 100\n",
        &[("fake", json!([]), vec![])],
    );
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-node"));
    d.wait_log("plugin sample-node is running");
    report(&mut c, "sample-node", "subscribed");
    let cases = [
        ("flood", "flood"),
        ("oversized", "oversized-line"),
        ("invalid", "invalid-message"),
        ("refusals", "refusals"),
        ("noinit", "initialize-timeout"),
        ("noping", "unresponsive"),
        ("balloon", "memory"),
        ("forkloop", "processes"),
        ("stdoutclosed", "stdout-closed"),
        ("exitloop", "exit"),
        ("loadrefused", "load-refused"),
        ("initfail", "initialize-failed"),
        ("mismatch", "api-mismatch"),
    ];
    for (kind, _) in &cases {
        install_approve(&mut c, &hostile(&dir, kind));
    }
    install_approve(&mut c, &hostile(&dir, "inflight"));
    // Under bubblewrap the sandbox's own processes hold the plugin's stdout
    // open, so closing it is found by the next ping (omniconflux-plugin(7)).
    let isolated = d
        .log_text()
        .contains("plugins run isolated with bubblewrap");
    for (kind, fault) in &cases {
        let fault = if *kind == "stdoutclosed" && isolated {
            &"unresponsive"
        } else {
            fault
        };
        d.wait_log(&format!("plugin hostile-{kind}: 3 crashes in 10 minutes"));
        let got = c.call("plugin.get", json!({"plugin": format!("hostile-{kind}")}));
        assert_eq!(
            (got["state"].as_str(), got["reason"].as_str()),
            (Some("failed"), Some("crash-limit")),
            "{kind}: {got}"
        );
        assert_eq!(got["lastExit"]["fault"], json!(fault), "{kind}: {got}");
        assert_eq!(got["crashes"], json!(3), "{kind}");
        let listed = c.call(
            "plugin.list",
            json!({"cursor": format!("hostile-{kind}").replace("hostile-", "hostile")}),
        );
        assert!(listed["plugins"].is_array());
    }
    // 17 requests in flight: exactly the 17th is busy.
    d.wait_log("plugin hostile-inflight is running");
    let r = c.call(
        "plugin.command.run",
        json!({"command": "hostile-inflight.report", "input": "now"}),
    );
    let codes: HashMap<String, String> = serde_json::from_str(r["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        codes.values().filter(|c| *c == "busy").count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes.values().filter(|c| *c == "ok").count(),
        16,
        "{codes:?}"
    );
    // The daemon, its sessions and the well-behaved plugin never noticed.
    let sid = spawn(&mut c, &dir, "fake", "still there?");
    let seen = report(&mut c, "sample-node", "events:2");
    assert_eq!(seen["events"][1]["session"], json!(sid));
    assert_eq!(seen["events"][1]["data"], json!({"reason": "completed"}));
    let got = c.call("plugin.get", json!({"plugin": "sample-node"}));
    assert_eq!(got["state"], "running");
    assert_eq!(got["crashes"], 0);
    // Enable clears the crash count and starts a failed plugin again.
    let r = c.call("plugin.enable", json!({"plugin": "hostile-exitloop"}));
    assert_eq!(r["enabled"], true);
    let got = c.call("plugin.get", json!({"plugin": "hostile-exitloop"}));
    assert_ne!(got["reason"], "crash-limit");
    let pid = d.pid();
    let status = d.stop();
    assert!(status.success());
    // No plugin process outlived the daemon.
    let left = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|cmd| cmd.contains(&dir.path.display().to_string()) && cmd.contains("main."))
        .count();
    assert_eq!(left, 0, "plugin processes of daemon {pid} outlived it");
}

#[test]
fn unisolated_a_closed_stdout_is_its_own_fault_and_the_tail_says_why() {
    let dir = TestDir::new("pnoiso");
    let d = start(&dir, "isolation = \"none\"\ncrash_limit = 1\n");
    d.wait_log("plugins run without isolation: plugins.isolation is none");
    let mut c = d.connect();
    install_approve(&mut c, &hostile(&dir, "stdoutclosed"));
    d.wait_log("plugin hostile-stdoutclosed: 1 crashes in 10 minutes");
    let got = c.call("plugin.get", json!({"plugin": "hostile-stdoutclosed"}));
    assert_eq!(got["lastExit"]["fault"], "stdout-closed", "{got}");
    assert!(
        got["stderrTail"]
            .as_str()
            .unwrap()
            .starts_with("[omniconfluxd] this plugin ran without isolation"),
        "{got}"
    );
    // A main that is neither a script the host knows nor executable cannot
    // be started: spawn-failed.
    let folder = dir.join("src-spawnfail");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("main.bin"), "not a program\n").unwrap();
    let manifest = json!({
        "manifestVersion": 1, "api": "1.0", "id": "spawnfail", "name": "Spawn fail", "version": "1.0.0",
        "description": "Cannot start.", "main": "main.bin", "permissions": [], "commands": [],
    });
    std::fs::write(folder.join("omniconflux-plugin.json"), manifest.to_string()).unwrap();
    install_approve(&mut c, &folder);
    d.wait_log("plugin spawnfail: 1 crashes in 10 minutes");
    let got = c.call("plugin.get", json!({"plugin": "spawnfail"}));
    assert_eq!(
        (got["state"].clone(), got["lastExit"]["fault"].clone()),
        (json!("failed"), json!("spawn-failed")),
        "{got}"
    );
    d.stop();
}

#[test]
fn a_python_plugin_asks_for_a_task_and_withdraws_it_with_api_1_1() {
    let dir = TestDir::new("ppython");
    let d = start(&dir, "");
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");
    let r = c.call("plugin.command.run", json!({"command": "sample-py.ask"}));
    let got: Value = serde_json::from_str(r["text"].as_str().unwrap()).unwrap();
    assert_eq!(got["create"]["error"]["code"], "request-cancelled", "{got}");
    let rid = got["cancel"]["result"]["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(got["cancel"]["result"]["cancelled"], true);
    assert!(rid.starts_with("plugin_"), "{rid}");
    assert_eq!(
        got["again"]["error"],
        json!({"code": "not-pending", "message": "The request is not pending: cancelled", "data": {"state": "cancelled"}})
    );
    assert_eq!(got["unknown"]["error"]["data"]["state"], "unknown");
    let req = c.call("plugin.request.get", json!({"requestId": rid}));
    assert_eq!(req["state"], "orphaned");
    assert_eq!(req["call"], "tasks.create");
    assert_eq!(req["params"]["acceptance"]["command"], "npm test");
    let digest = req["digest"].as_str().unwrap();
    assert_eq!(digest.len(), 64);
    assert_eq!(
        c.error_code(
            "plugin.request.get",
            json!({"requestId": "plugin_00000000-0000-4000-8000-000000000000"})
        ),
        "not-found"
    );

    // Calls outside its permissions and bad params get the page's errors.
    let r = c.call("plugin.command.run", json!({"command": "sample-py.probe"}));
    let got: Value = serde_json::from_str(r["text"].as_str().unwrap()).unwrap();
    assert_eq!(got["storage"]["error"]["code"], "permission-denied");
    assert_eq!(got["storage"]["error"]["data"]["permission"], "storage.own");
    assert_eq!(got["limit"]["error"]["code"], "invalid-params");
    assert_eq!(
        got["get"]["error"],
        json!({"code": "not-found", "message": "No session s-nope on this daemon"})
    );
    assert_eq!(
        got["seats"]["result"],
        json!({"seats": [], "nextCursor": null})
    );
    check_wire(&d.state, "sample-py");
    d.stop();
}

#[test]
fn the_command_line_installs_shows_approves_and_runs() {
    let dir = TestDir::new("pcli");
    let d = start(&dir, "");
    let sock = d.socket.display().to_string();
    let cfg = dir.join("omniconfluxd.toml").display().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec![
            "--config",
            cfg.as_str(),
            "--socket",
            sock.as_str(),
            "plugin",
        ];
        all.extend_from_slice(args);
        util::run_cli(&all)
    };
    let path = fixture("sample-node").display().to_string();
    let (code, out, err) = cli(&["install", &path]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("sample-node 1.0.0 installed by the operator"),
        "{out}"
    );
    let (code, out, err) = cli(&["approve", "sample-node", "--yes", "--operator", "cli test"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("permissions events.read, lists.read, commands.add, storage.own"),
        "{err}"
    );
    assert!(err.contains("main.mjs"), "{err}");
    d.wait_log("plugin sample-node is running");
    let (_, out, _) = cli(&["list"]);
    assert!(
        out.contains("sample-node") && out.contains("running"),
        "{out}"
    );
    let (code, out, _) = cli(&["run", "sample-node.note", "from the cli"]);
    assert_eq!((code, out.trim()), (0, "Saved."));
    let (code, _, err) = cli(&["show", "nope-nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("plugin-not-found"), "{err}");
    d.stop();
}

#[test]
fn a_plugin_reads_the_real_sessions_seats_and_their_events() {
    let dir = TestDir::new("pviews");
    let script = json!([[{"permission": {"id": "c1", "title": "Run it", "kind": "execute", "input": {"command": "ls"}}}]]);
    let d = start_with_seats(&dir, "", &[("fake", script, vec![])]);
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");
    let seen = py(&mut c, "events", "0");
    assert_eq!(
        seen["subscribed"]["result"]["kinds"]
            .as_array()
            .unwrap()
            .len(),
        9
    );
    // An approval.request an operator appends, whatever id it names, is
    // not a session's.
    c.call("events.append", json!({"stream": "x-s1", "kind": "approval.request", "data": {"requestId": "x-s1-a1", "action": "execute", "risk": "high"}}));
    let sid = spawn(&mut c, &dir, "fake", "go");
    let seen = py(&mut c, "events", "3");
    let kinds: Vec<&str> = seen["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["session.start", "turn.start", "approval.request"],
        "{seen}"
    );
    assert_eq!(
        seen["events"][2]["data"],
        json!({"requestId": format!("{sid}-a1"), "action": "execute", "risk": "high"})
    );

    // While the agent waits for the answer, the plugin reads its session
    // as sessions.list and sessions.get (1.1) give it, and the seat.
    let lists = py(&mut c, "lists", &sid);
    let wt = dir.join("wt").canonicalize().unwrap().display().to_string();
    let item = &lists["sessions"]["result"]["sessions"][0];
    assert_eq!(
        lists["sessions"]["result"]["sessions"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "{lists}"
    );
    assert_eq!(lists["sessions"]["result"]["nextCursor"], Value::Null);
    for (k, v) in [
        ("session", json!(sid)),
        ("harness", json!("fake")),
        ("provider", json!("test")),
        ("transport", json!("acp")),
        ("state", json!("awaiting-approval")),
        ("turn", json!(1)),
        ("turnActive", json!(true)),
        ("endReason", Value::Null),
        ("pendingApprovals", json!(1)),
        ("parent", Value::Null),
        ("worktree", json!(wt)),
    ] {
        assert_eq!(item[k], v, "{k}: {item}");
    }
    assert_eq!(&lists["get"]["result"], item);
    let seat = &lists["seats"]["result"]["seats"][0];
    assert_eq!(
        (
            seat["harness"].clone(),
            seat["provider"].clone(),
            seat["family"].clone()
        ),
        (json!("fake"), json!("test"), json!("local")),
        "{seat}"
    );
    assert_eq!(lists["seats"]["result"]["nextCursor"], Value::Null);

    c.call(
        "approvals.answer",
        json!({"request_id": format!("{sid}-a1"), "decision": "allow"}),
    );
    let seen = py(&mut c, "events", "5");
    let events = seen["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "session.start",
            "turn.start",
            "approval.request",
            "approval.resolved",
            "turn.end"
        ],
        "{seen}"
    );
    assert!(events.iter().all(|e| e["session"] == json!(sid)), "{seen}");
    assert_eq!(
        events[3]["data"],
        json!({"requestId": format!("{sid}-a1"), "decision": "allow", "delivered": true})
    );
    assert_eq!(events[4]["seq"], seq_of(&mut c, &sid, "turn.end"));
    let after = py(&mut c, "lists", &sid);
    assert_eq!(after["get"]["result"]["state"], "idle");
    assert_eq!(after["get"]["result"]["endReason"], "completed");
    check_wire(&d.state, "sample-py");
    d.stop();
}

/// sample-py asks for a task; the pending plugin-task item of the inbox,
/// once the request is stored and in the inbox (the `n`th).
fn ask_task(c: &mut util::Client, d: &Daemon, n: usize) -> (String, Value) {
    let wid = py(c, "create", "")["wid"].as_str().unwrap().to_string();
    d.wait_log_count("waits for the operator", n);
    let list = c.call("approvals.list", json!({}));
    let item = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|i| i["subject"] == "plugin-task")
        .cloned()
        .unwrap();
    (wid, item)
}

#[test]
fn a_task_request_waits_in_the_approvals_inbox_for_the_operator() {
    let dir = TestDir::new("ptasks");
    let socket = dir.join("run/d.sock").display().to_string();
    let helper = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/answer_own_approval.py")
        .display()
        .to_string();
    let (ask_file, report_file) = (
        dir.join("ask.json").display().to_string(),
        dir.join("seen.json"),
    );
    let rogue = json!([[{"spawn": ["python3", helper, "direct", ask_file, report_file.display().to_string()]}]]);
    // Agents uncontained: the namespace would hide the socket from the rogue
    // (tests/containment.rs); here the classification behind it is tested.
    let d = start_with_seats(
        &dir,
        "[agents]\nisolation = \"none\"\n",
        &[
            ("plain", json!([]), vec![]),
            ("rogue", rogue, vec![("OMNI_SOCKET", socket)]),
        ],
    );
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");

    // The request is in the inbox: high risk, its summary, the digest of
    // the stored request, 30 minutes.
    let (wid, item) = ask_task(&mut c, &d, 1);
    let rid = item["request_id"].as_str().unwrap().to_string();
    assert!(rid.starts_with("plugin_"), "{item}");
    assert_eq!(item["plugin"], "sample-py");
    assert_eq!(
        item["summary"],
        "Sample Python: login redirect test in /srv/work/shop"
    );
    assert_eq!(
        (
            item["risk"].clone(),
            item["session"].clone(),
            item["state"].clone()
        ),
        (json!("high"), Value::Null, json!("pending"))
    );
    let req = c.call("plugin.request.get", json!({"requestId": rid}));
    assert_eq!(req["state"], "pending");
    assert_eq!(req["digest"], item["digest"]);
    assert_eq!(req["expiresAt"], item["expires_at"]);
    assert_eq!(req["createdAt"], item["created_at"]);
    // The operator denies it: the plugin's call fails approval-denied.
    let a = c.call(
        "approvals.answer",
        json!({"request_id": rid, "decision": "deny", "digest": item["digest"]}),
    );
    assert_eq!(
        (a["decision"].clone(), a["delivered"].clone()),
        (json!("deny"), json!(true)),
        "{a}"
    );
    assert_eq!(
        py(&mut c, "result", &wid)["error"],
        json!({"code": "approval-denied", "message": "The operator did not allow the task"})
    );
    // Answered: tasks.cancel says so rather than claiming a retraction.
    assert_eq!(
        py(&mut c, "cancel", &wid)["error"]["data"],
        json!({"state": "answered"})
    );
    assert_eq!(
        c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "answered"
    );
    assert_eq!(
        c.error_code(
            "approvals.answer",
            json!({"request_id": rid, "decision": "allow"})
        ),
        "not-pending"
    );

    // Allowed, the stored request is dispatched, and the daemon's refusal
    // (the repository is not one it knows) comes back as the reason.
    let (wid, item) = ask_task(&mut c, &d, 2);
    let rid = item["request_id"].as_str().unwrap().to_string();
    c.call(
        "approvals.answer",
        json!({"request_id": rid, "decision": "allow"}),
    );
    let got = py(&mut c, "result", &wid);
    let reason = "repo-unknown";
    assert_eq!(got["error"]["code"], "task-refused", "{got}");
    assert_eq!(got["error"]["data"], json!({"reason": reason}));
    assert_eq!(
        c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "answered"
    );

    // tasks.cancel withdraws it from the inbox.
    let (wid, item) = ask_task(&mut c, &d, 3);
    let rid = item["request_id"].as_str().unwrap().to_string();
    let cancelled = py(&mut c, "cancel", &wid);
    assert_eq!(
        cancelled["result"],
        json!({"requestId": rid, "cancelled": true})
    );
    assert_eq!(
        py(&mut c, "result", &wid)["error"]["code"],
        "request-cancelled"
    );
    let pending = c.call("approvals.list", json!({}));
    assert!(
        pending["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["request_id"] != json!(rid)),
        "{pending}"
    );
    let got = c.call("approvals.get", json!({"request_id": rid}));
    assert_eq!(
        (
            got["decision"].clone(),
            got["delivered"].clone(),
            got["surface"].clone()
        ),
        (json!("cancel"), json!(false), json!("plugin")),
        "{got}"
    );
    assert_eq!(
        c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "orphaned"
    );

    // An agent cannot answer it, and reads only its own session.
    let (_, item) = ask_task(&mut c, &d, 4);
    let rid = item["request_id"].as_str().unwrap().to_string();
    let other = spawn(&mut c, &dir, "plain", "hi");
    std::fs::write(
        &ask_file,
        json!({"request": rid, "probe": [other]}).to_string(),
    )
    .unwrap();
    let sid = spawn(&mut c, &dir, "rogue", "go");
    d.wait_log(&format!(
        "refused approvals.answer for {rid} from a caller of class agent-session"
    ));
    let seen: Value =
        serde_json::from_str(&std::fs::read_to_string(&report_file).unwrap()).unwrap();
    assert_eq!(seen["own"], json!(sid));
    let listed: Vec<&Value> = seen["list"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["id"])
        .collect();
    assert_eq!(listed, [&json!(sid)], "{seen}");
    assert_eq!(
        seen["get"][&other]["error"]["data"]["code"], "session-not-found",
        "{seen}"
    );
    assert_eq!(seen["get"][&sid]["result"]["id"], json!(sid));
    // Nor another session's events, nor every stream at once.
    assert_eq!(
        seen["events"][&other]["error"]["data"]["code"], "operator-only",
        "{seen}"
    );
    assert!(
        seen["events"][&sid]["result"]["events"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{seen}"
    );
    assert_eq!(
        seen["follow_all"]["error"]["data"]["code"], "operator-only",
        "{seen}"
    );
    assert_eq!(
        seen["approvals"]["result"]["approvals"],
        json!([]),
        "{seen}"
    );
    assert_eq!(
        c.call("approvals.get", json!({"request_id": rid}))["state"],
        "pending"
    );
    assert_eq!(
        c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "pending"
    );
    assert_eq!(
        c.call("sessions.list", json!({})).as_array().unwrap().len(),
        2
    );

    // The plugin's run ends: nobody waits for the answer any more.
    c.call("plugin.disable", json!({"plugin": "sample-py"}));
    d.wait_log("plugin sample-py exited");
    let got = c.call("approvals.get", json!({"request_id": rid}));
    assert_eq!(
        (got["decision"].clone(), got["delivered"].clone()),
        (json!("cancel"), json!(false)),
        "{got}"
    );
    assert_eq!(
        c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "orphaned"
    );
    check_wire(&d.state, "sample-py");
    d.stop();
}

#[test]
fn an_allowed_task_request_is_dispatched_as_a_lane_and_merged() {
    let dir = TestDir::new("ptasklane");
    let repo = dir.join("shop");
    std::fs::create_dir_all(&repo).unwrap();
    for args in [
        vec!["init", "-q", "-b", "main"],
        vec!["commit", "-q", "--allow-empty", "-m", "first"],
    ] {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(&args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_acp_agent.py");
    let q = |v: &Value| serde_json::to_string(&v.to_string()).unwrap();
    let builder = json!([[{"run": ["sh", "-c", "echo feature > feature.txt"]}, {"text": "done"}]]);
    let verifier = json!([[{"text": "```omniconflux-verdict\n{\"verdict\":\"pass\"}\n```\n"}]]);
    let mut cfg = config(&format!("[[repo]]\npath = \"{}\"\n", repo.display()));
    for (h, fam, script) in [
        ("builder", "anthropic", &builder),
        ("verifier", "openai", &verifier),
    ] {
        cfg.push_str(&format!(
            "\n[[seat]]\nharness = \"{h}\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"{fam}\"\nenv = {{ FAKE_SCRIPT = {} }}\n",
            agent.display(),
            q(script)
        ));
    }
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(cfg),
            ..Opts::default()
        },
    );
    d.wait_log("seat builder: ready");
    d.wait_log("seat verifier: ready");
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");
    let task = json!({"repo": repo.display().to_string(), "builder": "builder", "verifier": "verifier",
                      "acceptance": {"name": "feature", "command": "test -f feature.txt"}, "name": "add feature"});
    let wid = py(&mut c, "dispatch", &task.to_string())["wid"]
        .as_str()
        .unwrap()
        .to_string();
    d.wait_log("waits for the operator");
    let list = c.call("approvals.list", json!({}));
    let item = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["subject"] == "plugin-task")
        .cloned()
        .unwrap();
    let rid = item["request_id"].as_str().unwrap().to_string();
    c.call(
        "approvals.answer",
        json!({"request_id": rid, "decision": "allow"}),
    );
    let got = py(&mut c, "result", &wid);
    let started = &got["result"];
    assert_eq!(started["requestId"], json!(rid), "{got}");
    let lane = started["lane"].as_str().unwrap().to_string();
    assert!(
        lane.starts_with("t-") && started["session"].as_str().unwrap().starts_with("s-"),
        "{got}"
    );
    d.wait_log(&format!("lane {lane}: merged"));
    // The plugin was offered the lane's events: its start, its stages and
    // the verifier's verdict.
    let seen = py(&mut c, "events", "0");
    let kinds: Vec<&str> = seen["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["lane"] == json!(lane))
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    for kind in ["lane.start", "lane.stage", "lane.verdict"] {
        assert!(kinds.contains(&kind), "{kind} missing: {kinds:?}");
    }
    check_wire(&d.state, "sample-py");
    d.stop();
}

/// A daemon with a git repository `shop` (a `[[repo]]`) whose smudge
/// filter, which git runs as `git worktree add` checks out the one file
/// `gated`, blocks on a FIFO the test controls while the file `arm`
/// exists (it removes it first, so it blocks once per arming; when the
/// FIFO `gate.started` exists it first says so there) and fails while
/// `fail` exists. A filter, not a hook: the daemon's git runs no hooks
/// (and runs filters in the agents' kind of namespace, where the test's
/// folder is in sight as it is); seats `builder` (anthropic, whose turn stalls
/// until it is stopped) and `verifier` (openai) of the fake agent; and
/// sample-py running. `extra` goes into `[plugins]`.
struct Rig {
    d: Daemon,
    c: util::Client,
    cfg: String,
    repo: PathBuf,
    gate: PathBuf,
    arm: PathBuf,
    fail: PathBuf,
}

fn rig(dir: &TestDir, extra: &str) -> Rig {
    let repo = dir.join("shop");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("gated"), "held by the gate\n").unwrap();
    std::fs::write(repo.join(".gitattributes"), "gated filter=gate\n").unwrap();
    let (gate, arm, fail) = (dir.join("gate"), dir.join("arm"), dir.join("fail"));
    let filter = dir.join("gate.sh");
    let smudge = format!("sh '{}'", filter.display());
    for args in [
        vec!["init", "-q", "-b", "main"],
        vec!["add", "gated", ".gitattributes"],
        vec!["commit", "-q", "-m", "first"],
        vec!["config", "filter.gate.smudge", &smudge],
        vec!["config", "filter.gate.required", "true"],
    ] {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(&args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let ok = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::write(
        &filter,
        format!(
            "[ -e '{f}' ] && exit 1\nif [ -e '{a}' ]; then rm -f '{a}'; [ -p '{g}.started' ] && echo started > '{g}.started'; cat '{g}' > /dev/null; fi\nexec cat\n",
            f = fail.display(),
            a = arm.display(),
            g = gate.display()
        ),
    )
    .unwrap();
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_acp_agent.py");
    let q = |v: &Value| serde_json::to_string(&v.to_string()).unwrap();
    let builder = json!([[{"stall": 600}]]);
    let verifier = json!([[{"text": "```omniconflux-verdict\n{\"verdict\":\"pass\"}\n```\n"}]]);
    let mut cfg = config(&format!(
        "{extra}\n[[repo]]\npath = \"{}\"\n",
        repo.display()
    ));
    for (h, fam, script) in [
        ("builder", "anthropic", &builder),
        ("verifier", "openai", &verifier),
    ] {
        cfg.push_str(&format!(
            "\n[[seat]]\nharness = \"{h}\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"{fam}\"\nenv = {{ FAKE_SCRIPT = {} }}\n",
            agent.display(),
            q(script)
        ));
    }
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(cfg.clone()),
            ..Opts::default()
        },
    );
    d.wait_log("seat builder: ready");
    d.wait_log("seat verifier: ready");
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");
    Rig {
        d,
        c,
        cfg,
        repo,
        gate,
        arm,
        fail,
    }
}

impl Rig {
    /// sample-py asks for a task named `name` in the repository; its wire
    /// id and request id, once it waits in the inbox (the `n`th to).
    fn ask(&mut self, name: &str, n: usize) -> (String, String) {
        let task = json!({"repo": self.repo.display().to_string(), "builder": "builder", "verifier": "verifier",
                          "acceptance": {"name": "feature", "command": "true"}, "name": name});
        let wid = py(&mut self.c, "dispatch", &task.to_string())["wid"]
            .as_str()
            .unwrap()
            .to_string();
        self.d.wait_log_count("waits for the operator", n);
        let list = self.c.call("approvals.list", json!({}));
        let rid = list["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|i| i["subject"] == "plugin-task")
            .map(|i| i["request_id"].as_str().unwrap().to_string())
            .unwrap();
        (wid, rid)
    }

    fn allow(&mut self, rid: &str) {
        self.c.call(
            "approvals.answer",
            json!({"request_id": rid, "decision": "allow"}),
        );
    }

    /// Lets the blocked filter go on: opening the FIFO for writing waits
    /// for the filter to read it, so this also proves it was blocked.
    fn release(&self) {
        let gate = self.gate.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(gate);
            let _ = tx.send(f.is_ok());
        });
        let opened = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or(false);
        assert!(opened, "the smudge filter never read the gate");
    }

    /// Lets a filter that is blocked on the gate go on, and does nothing
    /// when none is: a FIFO opened for writing without blocking opens only
    /// while a reader holds it.
    fn release_if_held(&self) {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.gate);
    }

    /// Kills the daemon with SIGKILL and starts it again on the same state.
    fn restart(mut self, dir: &TestDir) -> Rig {
        self.d.kill9();
        let d = Daemon::start_with(
            &dir.path,
            Opts {
                config: Some(self.cfg.clone()),
                ..Opts::default()
            },
        );
        d.wait_log("plugin sample-py is running");
        let c = d.connect();
        Rig { d, c, ..self }
    }

    /// Waits until the filter blocks: it writes to `gate.started` (made by
    /// `announce`) just before.
    fn started(&self) {
        let started = self.gate.with_extension("started");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::fs::read_to_string(started).unwrap_or_default());
        });
        let said = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_default();
        assert_eq!(said, "started\n", "the smudge filter never started");
    }

    /// Makes the FIFO the filter announces itself on.
    fn announce(&self) {
        let ok = std::process::Command::new("mkfifo")
            .arg(self.gate.with_extension("started"))
            .status()
            .unwrap();
        assert!(ok.success());
    }

    fn plugin_get(&mut self) -> Value {
        self.c.call("plugin.get", json!({"plugin": "sample-py"}))
    }
}

#[test]
fn an_allowed_request_is_answered_not_pending_while_its_dispatch_runs() {
    let dir = TestDir::new("pdispatch");
    let mut r = rig(&dir, "");
    std::fs::write(&r.arm, "").unwrap();
    let (wid, rid) = r.ask("slow checkout", 1);
    r.allow(&rid);
    // The dispatch runs (the filter holds `git worktree add`): the request is
    // answered, and tasks.cancel says so instead of claiming a retraction.
    let got = r.c.call("plugin.request.get", json!({"requestId": rid}));
    assert_eq!(got["state"], "answered", "{got}");
    assert_eq!(
        py(&mut r.c, "cancel", &wid)["error"],
        json!({"code": "not-pending", "message": "The request is not pending: answered", "data": {"state": "answered"}})
    );
    let got = r.plugin_get();
    assert_eq!(
        (got["starting"].clone(), got["lanes"].clone()),
        (json!([rid]), json!([])),
        "{got}"
    );
    r.release();
    let done = py(&mut r.c, "result", &wid);
    let lane = done["result"]["lane"].as_str().unwrap().to_string();
    assert_eq!(done["result"]["requestId"], json!(rid), "{done}");
    let got = r.plugin_get();
    assert_eq!(
        (got["starting"].clone(), got["lanes"].clone()),
        (json!([]), json!([lane])),
        "{got}"
    );
    // The plugin reads the lane with lanes.list, and got its lane.start.
    let listed = py(&mut r.c, "lists", "s-000000000000")["lanes"].clone();
    let item = &listed["result"]["lanes"][0];
    assert_eq!(
        (
            item["lane"].clone(),
            item["stage"].clone(),
            item["builder"]["session"].clone(),
            item["verifier"]["harness"].clone()
        ),
        (
            json!(lane),
            json!("building"),
            done["result"]["session"].clone(),
            json!("verifier")
        ),
        "{listed}"
    );
    let seen = py(&mut r.c, "events", "0");
    let start = seen["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "lane.start")
        .cloned()
        .unwrap_or_else(|| panic!("no lane.start: {seen}"));
    assert_eq!(start["lane"], json!(lane), "{start}");
    assert_eq!(
        start["data"]["session"], done["result"]["session"],
        "{start}"
    );
    assert_eq!(
        r.c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "answered"
    );

    // A dispatch that fails without a code of its own (git refused the
    // worktree) is `unavailable`, the page's error, not a refusal.
    std::fs::write(&r.fail, "").unwrap();
    let (wid, rid) = r.ask("failing checkout", 2);
    r.allow(&rid);
    let got = py(&mut r.c, "result", &wid);
    assert_eq!(
        got["error"],
        json!({"code": "unavailable", "message": "The daemon could not do it now"})
    );
    std::fs::remove_file(&r.fail).unwrap();

    // A second lane: plugin.get lists the lanes at work newest first; one
    // the operator closed is gone from the list at once.
    let (wid, rid) = r.ask("second lane", 3);
    r.allow(&rid);
    let second = py(&mut r.c, "result", &wid)["result"]["lane"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(r.plugin_get()["lanes"], json!([second, lane]));
    r.c.call("lanes.close", json!({"lane": lane}));
    assert_eq!(r.plugin_get()["lanes"], json!([second]));
    check_wire(&r.d.state, "sample-py");
    r.d.stop();
}

#[test]
fn a_dispatch_past_its_bound_answers_unavailable_and_stops_counting() {
    let dir = TestDir::new("pdispbound");
    let mut r = rig(&dir, "task_dispatch_timeout_ms = 300");
    std::fs::write(&r.arm, "").unwrap();
    let (wid, rid) = r.ask("late lane", 1);
    r.allow(&rid);
    // The filter holds the dispatch until the test lets it go, so the bound
    // (here 300 ms, 15 minutes by default) answers first.
    assert_eq!(
        py(&mut r.c, "result", &wid)["error"],
        json!({"code": "unavailable", "message": "The daemon could not do it now"})
    );
    assert_eq!(
        py(&mut r.c, "cancel", &wid)["error"]["data"],
        json!({"state": "answered"})
    );
    let got = r.plugin_get();
    assert_eq!(
        (got["starting"].clone(), got["lanes"].clone()),
        (json!([]), json!([])),
        "{got}"
    );
    // It no longer counts toward too-many-pending: three more wait.
    let mut wids = Vec::new();
    for n in 2..=4 {
        wids.push(ask_task(&mut r.c, &r.d, n).0);
    }
    let fourth = py(&mut r.c, "create", "")["wid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        py(&mut r.c, "result", &fourth)["error"]["code"],
        "too-many-pending"
    );
    // The lane that starts after its request ended is closed at once.
    r.release();
    let line = r.d.wait_log(&format!(
        "started after its task request {rid} ended; closing it"
    ));
    let lane = line
        .split_whitespace()
        .find(|w| w.starts_with("t-"))
        .unwrap()
        .trim_end_matches(':')
        .to_string();
    let got = r.c.call("lanes.get", json!({"lane": lane}));
    assert_eq!(got["stage"], "closed", "{got}");
    assert_eq!(r.plugin_get()["lanes"], json!([]));
    r.d.stop();
}

#[test]
fn an_unanswered_request_expires_and_cannot_be_cancelled_after() {
    let dir = TestDir::new("pexpire");
    let d = start(&dir, "task_expiry_ms = 200");
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");
    let (wid, item) = ask_task(&mut c, &d, 1);
    let rid = item["request_id"].as_str().unwrap().to_string();
    assert_eq!(
        py(&mut c, "result", &wid)["error"],
        json!({"code": "approval-expired", "message": "The operator did not answer in 30 minutes"})
    );
    assert_eq!(
        c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "expired"
    );
    assert_eq!(
        py(&mut c, "cancel", &wid)["error"]["data"],
        json!({"state": "expired"})
    );
    assert_eq!(
        c.error_code(
            "approvals.answer",
            json!({"request_id": rid, "decision": "allow"})
        ),
        "not-pending"
    );
    check_wire(&d.state, "sample-py");
    d.stop();
}

#[test]
fn removing_a_plugin_stops_its_lanes_and_aborts_its_dispatches() {
    let dir = TestDir::new("premove");
    let mut r = rig(&dir, "");
    let wt_root = r.repo.canonicalize().unwrap().with_file_name("shop-wt");

    // stopTasks absent: a dispatch in flight is waited for, its lane closed
    // and its builder counted, and the worktree it left is listed.
    std::fs::write(&r.arm, "").unwrap();
    let (_, rid) = r.ask("aborted", 1);
    r.allow(&rid);
    let mut other = r.d.connect();
    other.send_raw(
        format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": 7, "method": "plugin.remove", "params": {"plugin": "sample-py"}})
        )
        .as_bytes(),
    );
    r.d.wait_log("plugin sample-py: removing (stopTasks true); 1 dispatch(es) in flight to abort");
    r.release();
    let reply = other.read_line().unwrap();
    assert_eq!(
        reply["result"],
        json!({"plugin": "sample-py", "removed": true, "stopped": 1,
               "worktrees": [wt_root.join("aborted").display().to_string()]}),
        "{reply}"
    );
    r.d.wait_log("closed because the plugin that asked for it is removed");

    // stopTasks true, a lane at work: closed, its builder counted.
    install_approve(&mut r.c, &fixture("sample-py"));
    r.d.wait_log_count("plugin sample-py is running", 2);
    let (wid, rid) = r.ask("live", 2);
    r.allow(&rid);
    let lane = py(&mut r.c, "result", &wid)["result"]["lane"]
        .as_str()
        .unwrap()
        .to_string();
    let got = r.c.call(
        "plugin.remove",
        json!({"plugin": "sample-py", "stopTasks": true}),
    );
    assert_eq!(
        got,
        json!({"plugin": "sample-py", "removed": true, "stopped": 1, "worktrees": []})
    );
    assert_eq!(
        r.c.call("lanes.get", json!({"lane": lane}))["stage"],
        "closed"
    );

    // stopTasks false: a lane at work and a dispatch in flight go on as
    // ordinary lanes.
    install_approve(&mut r.c, &fixture("sample-py"));
    r.d.wait_log_count("plugin sample-py is running", 3);
    let (wid, rid) = r.ask("kept", 3);
    r.allow(&rid);
    let kept = py(&mut r.c, "result", &wid)["result"]["lane"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(&r.arm, "").unwrap();
    let (_, rid) = r.ask("kept in flight", 4);
    r.allow(&rid);
    let got = r.c.call(
        "plugin.remove",
        json!({"plugin": "sample-py", "stopTasks": false}),
    );
    assert_eq!(
        got,
        json!({"plugin": "sample-py", "removed": true, "stopped": 0, "worktrees": []})
    );
    r.release();
    let line =
        r.d.wait_log(&format!("task request {rid}: dispatched as lane"));
    let late = line.rsplit(' ').next().unwrap().to_string();
    for lane in [kept, late] {
        let got = r.c.call("lanes.get", json!({"lane": lane}));
        assert_eq!(got["stage"], "building", "{got}");
    }
    r.d.stop();
}

#[test]
fn sessions_get_counts_an_agent_stop_in_progress_as_busy() {
    let dir = TestDir::new("pbusy");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_acp_agent.py");
    // An agent whose process group ignores SIGTERM: after its turn, the
    // daemon's stop holds until the SIGKILL 3 s later.
    let agent = dir.join("stubborn.sh");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo stubborn 1; exit 0; }}\ntrap '' TERM\npython3 '{}'\nexec sleep 600\n",
            script.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = config(&format!(
        "\n[[seat]]\nharness = \"stubborn\"\ncommand = \"{}\"\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\n",
        agent.display()
    ));
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(cfg),
            ..Opts::default()
        },
    );
    d.wait_log("seat stubborn: ready");
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");
    // Subscribed before the session starts, so that it sees session.start.
    py(&mut c, "events", "0");
    let sid = spawn(&mut c, &dir, "stubborn", "hello");
    let seen = py(&mut c, "events", "3");
    assert_eq!(seen["events"][2]["kind"], "turn.end", "{seen}");
    let idle = py(&mut c, "lists", &sid)["get"]["result"].clone();
    assert_eq!(
        (idle["state"].clone(), idle["turnActive"].clone()),
        (json!("idle"), json!(false)),
        "{idle}"
    );
    c.call("sessions.kill", json!({"session_id": sid}));
    // The stop is in progress until the SIGKILL: busy, though no turn runs.
    // (Should this test be slower than the 3 s grace, the session has
    // ended; it must never read idle.)
    let got = py(&mut c, "lists", &sid)["get"]["result"].clone();
    let state = got["state"].as_str().unwrap();
    assert!(
        state == "running" || state == "ended",
        "an agent being stopped reads {state}: {got}"
    );
    assert_eq!(got["turnActive"], false, "{got}");
    // A session id of the right form that names no session: not-found.
    let got = py(&mut c, "lists", "s-000000000000")["get"].clone();
    assert_eq!(got["error"]["code"], "not-found", "{got}");
    check_wire(&d.state, "sample-py");
    d.stop();
}

/// Writes a plugin that notes each `shutdown` reason, and each SIGTERM when
/// `stubborn` (which then neither exits nor dies of SIGTERM), in `log`.
fn shutdown_plugin(dir: &TestDir, id: &str, stubborn: bool, version: &str) -> PathBuf {
    let folder = dir.join(&format!("src-{id}"));
    std::fs::create_dir_all(&folder).unwrap();
    let log = dir.join(&format!("{id}.log"));
    let main = format!(
        r#"import json, signal, sys, time
LOG = {log:?}
STUBBORN = {stubborn}


def note(s):
    with open(LOG, "a") as f:
        f.write(s + "\n")


def out(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()


if STUBBORN:
    signal.signal(signal.SIGTERM, lambda *_: note("TERM"))
for line in sys.stdin:
    m = json.loads(line)
    method = m.get("method")
    if method == "initialize":
        out({{"id": m["id"], "result": {{"api": "1.0"}}}})
    elif method == "ping":
        out({{"id": m["id"], "result": {{}}}})
    elif method == "shutdown":
        note(m["params"]["reason"])
        out({{"id": m["id"], "result": {{}}}})
        if not STUBBORN:
            sys.exit(0)
while STUBBORN:
    time.sleep(3600)
"#,
        log = log.display().to_string(),
        stubborn = if stubborn { "True" } else { "False" },
    );
    std::fs::write(folder.join("main.py"), main).unwrap();
    let manifest = json!({
        "manifestVersion": 1, "api": "1.0", "id": id, "name": id, "version": version,
        "description": "Notes its shutdowns.", "main": "main.py", "permissions": [], "commands": [],
    });
    std::fs::write(folder.join("omniconflux-plugin.json"), manifest.to_string()).unwrap();
    folder
}

fn noted(dir: &TestDir, id: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(&format!("{id}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_plugin_sees_each_shutdown_reason_and_sigterm_then_sigkill() {
    let dir = TestDir::new("pshutdown");
    // Unisolated, so that the plugins can note what they saw outside their
    // working directory, which a removal deletes.
    let mut d = start(&dir, "isolation = \"none\"\n");
    let mut c = d.connect();
    install_approve(&mut c, &shutdown_plugin(&dir, "shut-a", false, "1.0.0"));
    d.wait_log("plugin shut-a is running");
    // An approved update restarts it: `updated`.
    install_approve(&mut c, &shutdown_plugin(&dir, "shut-a", false, "1.0.1"));
    d.wait_log_count("plugin shut-a is running", 2);
    assert_eq!(noted(&dir, "shut-a"), ["updated"]);
    c.call("plugin.disable", json!({"plugin": "shut-a"}));
    d.wait_log_count("plugin shut-a exited (code 0)", 2);
    c.call("plugin.enable", json!({"plugin": "shut-a"}));
    d.wait_log_count("plugin shut-a is running", 3);
    c.call("plugin.remove", json!({"plugin": "shut-a"}));
    assert_eq!(noted(&dir, "shut-a"), ["updated", "disabled", "removed"]);

    // One that ignores shutdown gets SIGTERM, then SIGKILL, at a daemon stop.
    install_approve(&mut c, &shutdown_plugin(&dir, "shut-b", true, "1.0.0"));
    d.wait_log("plugin shut-b is running");
    let pid = d.pid();
    d.signal(libc::SIGTERM);
    d.wait_log("plugin shut-b exited (SIGKILL)");
    assert!(d.wait().success());
    assert_eq!(noted(&dir, "shut-b"), ["daemon-stop", "TERM"]);
    let left = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|cmd| cmd.contains(&dir.path.display().to_string()) && cmd.contains("main."))
        .count();
    assert_eq!(left, 0, "plugin processes of daemon {pid} outlived it");
}

#[test]
fn the_host_refuses_wire_misuse_and_a_second_subscribe_replaces_the_first() {
    let dir = TestDir::new("pprobe");
    let d = start_with_seats(&dir, "", &[("fake", json!([]), vec![])]);
    let mut c = d.connect();
    let folder = dir.join("src-probe");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(fixture("probe/main.py"), folder.join("main.py")).unwrap();
    let manifest = json!({
        "manifestVersion": 1, "api": "1.0", "id": "probe", "name": "Probe", "version": "1.0.0",
        "description": "Probes the host's refusals.", "main": "main.py",
        "permissions": ["events.read", "commands.add", "storage.own"],
        "commands": [{"id": "report", "title": "Report"}],
    });
    std::fs::write(folder.join("omniconflux-plugin.json"), manifest.to_string()).unwrap();
    install_approve(&mut c, &folder);
    d.wait_log("plugin probe is running");
    // Its subscriptions are answered before the session starts: the run's
    // requests are taken in order, and the report waits for a turn.end.
    spawn(&mut c, &dir, "fake", "hello");
    let r = c.call("plugin.command.run", json!({"command": "probe.report"}));
    let got: Value = serde_json::from_str(r["text"].as_str().unwrap()).unwrap();
    assert_eq!(got["codes"]["early"], "!not-initialized", "{got}");
    // The set is answered once stored; the get under its id is refused.
    let mut same: Vec<&str> = got["codes"]["same"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    same.sort();
    assert_eq!(same, ["!invalid-request", "ok"], "{got}");
    assert_eq!(got["codes"]["nope"], json!(["!method-not-found"]), "{got}");
    assert_eq!(got["codes"]["sub2"], json!(["ok"]), "{got}");
    // Only the second subscription's kinds arrive.
    assert_eq!(got["kinds"], json!(["turn.end"]), "{got}");
    check_wire(&d.state, "probe");
    d.stop();
}

#[test]
fn a_caller_inside_an_agent_session_gets_operator_only_for_each_operator_method() {
    let dir = TestDir::new("poponly");
    let socket = dir.join("run/d.sock").display().to_string();
    let helper = fixture("operator_only.py").display().to_string();
    let (ask_file, report) = (dir.join("ask.json"), dir.join("seen.json"));
    let rogue = json!([[{"run": ["python3", helper, ask_file.display().to_string(), report.display().to_string()]}]]);
    // Agents uncontained: the namespace would hide the socket from the rogue
    // (tests/containment.rs); here the operator-only rule behind it is tested.
    let d = start_with_seats(
        &dir,
        "[agents]\nisolation = \"none\"\n",
        &[("rogue", rogue, vec![("OMNI_SOCKET", socket)])],
    );
    let mut c = d.connect();
    install_approve(&mut c, &fixture("sample-py"));
    d.wait_log("plugin sample-py is running");
    let (_, item) = ask_task(&mut c, &d, 1);
    let rid = item["request_id"].as_str().unwrap().to_string();
    std::fs::write(
        &ask_file,
        json!({"plugin": "sample-py", "command": "sample-py.create", "request": rid}).to_string(),
    )
    .unwrap();
    let sid = spawn(&mut c, &dir, "rogue", "go");
    let mut events = d.connect();
    events.call("events.subscribe", json!({"streams": [sid]}));
    // The helper runs inside the agent's turn: its end means the report is
    // written.
    if !report.exists() {
        loop {
            let n = events.next_note("event");
            if n["params"]["kind"] == "turn.end" {
                break;
            }
        }
    }
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for method in [
        "plugin.approve",
        "plugin.enable",
        "plugin.command.run",
        "plugin.discard",
        "plugin.remove",
        "approvals.answer",
    ] {
        assert_eq!(
            seen[method]["error"]["data"]["code"], "operator-only",
            "{method}: {seen}"
        );
    }
    // Nothing changed: the plugin runs, its request still waits.
    assert_eq!(
        c.call("plugin.get", json!({"plugin": "sample-py"}))["state"],
        "running"
    );
    assert_eq!(
        c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "pending"
    );
    d.stop();
}

#[test]
fn a_dispatch_cut_off_by_a_daemon_stop_is_aborted_by_removal() {
    let dir = TestDir::new("pcutoff");
    let mut r = rig(&dir, "");
    r.announce();
    std::fs::write(&r.arm, "").unwrap();
    let (_, rid) = r.ask("cut off", 1);
    r.allow(&rid);
    r.started();
    assert_eq!(r.plugin_get()["starting"], json!([rid]));
    // The daemon dies while `git worktree add` waits on the gate: the
    // dispatch is cut off, and leaves its worktree.
    let mut r = r.restart(&dir);
    let got = r.plugin_get();
    assert_eq!(
        (got["starting"].clone(), got["lanes"].clone()),
        (json!([rid]), json!([])),
        "{got}"
    );
    assert_eq!(
        r.c.call("plugin.request.get", json!({"requestId": rid}))["state"],
        "answered"
    );
    let wt = r
        .repo
        .canonicalize()
        .unwrap()
        .with_file_name("shop-wt")
        .join("cut-off");
    // git makes the worktree's folder before it checks out (and smudges)
    // its files: it is there while the filter holds git.
    assert!(wt.is_dir(), "{}", wt.display());
    let got = r.c.call("plugin.remove", json!({"plugin": "sample-py"}));
    assert_eq!(
        got,
        json!({"plugin": "sample-py", "removed": true, "stopped": 0,
               "worktrees": [wt.display().to_string()]})
    );
    // Let the orphaned git end, if it outlived the daemon: in a namespace
    // it died with it (`--die-with-parent`), and nothing reads the gate.
    r.release_if_held();
    r.d.stop();
}

#[test]
fn a_removal_whose_aborted_dispatch_does_not_end_in_time_stays_remove_pending() {
    let dir = TestDir::new("prmpending");
    let mut r = rig(&dir, "remove_abort_timeout_ms = 300");
    std::fs::write(&r.arm, "").unwrap();
    let (_, rid) = r.ask("held", 1);
    r.allow(&rid);
    // The filter holds the dispatch past the bound (here 300 ms).
    let got = r.c.request("plugin.remove", json!({"plugin": "sample-py"}));
    assert_eq!(
        got["error"]["data"]["code"], "plugin-remove-pending",
        "{got}"
    );
    let p = r.plugin_get();
    assert_eq!(
        (p["state"].clone(), p["reason"].clone()),
        (json!("remove-pending"), json!("remove-failed")),
        "{p}"
    );
    // Asked again, the removal is still at work.
    assert_eq!(
        r.c.error_code("plugin.remove", json!({"plugin": "sample-py"})),
        "plugin-remove-pending"
    );
    // Once the dispatch lands, its lane is closed and the daemon finishes
    // the removal by itself.
    r.release();
    r.d.wait_log("plugin sample-py removed");
    r.d.wait_log("closed because the plugin that asked for it is removed");
    assert_eq!(
        r.c.error_code("plugin.get", json!({"plugin": "sample-py"})),
        "plugin-not-found"
    );
    r.d.stop();
}
