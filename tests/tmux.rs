//! Sessions in tmux panes through the real daemon (issue 15, "Tests"): a
//! real tmux server on the test's own socket directory (`TMUX_TMPDIR`), a
//! fake Claude Code in a pane (tests/fixtures/tmux/claude, with a
//! transcript file under the daemon's HOME), discovered with the seed's
//! fields; capture, keys and input reaching it; the busy rule; kill; the
//! error texts; `session.event`s to a watcher; a spawn into the daemon's
//! own server.

mod util;

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use util::tmux::Servers;
use util::{Daemon, Opts, PATIENCE, TestDir, fixture};

/// Dropped in this order: the client, the daemon, the tmux servers (whose
/// sockets live in the test's directory), then the directory.
struct Rig {
    c: util::Client,
    d: Daemon,
    servers: Servers,
    proj: PathBuf,
    home: PathBuf,
    _dir: TestDir,
}

fn have_tmux() -> bool {
    util::need::have(util::need::program("tmux"), "the Debian package tmux").is_some()
}

/// A git repository on branch `trunk` with a fake Claude Code running in
/// a pane of the `default` server, its transcript ending a turn, and a
/// daemon whose HOME and tmux directory are the test's.
fn rig(name: &str) -> Rig {
    let dir = TestDir::new(name);
    let tmpdir = dir.join("x");
    std::fs::create_dir_all(&tmpdir).unwrap();
    let servers = Servers { tmpdir };
    let proj = dir.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    util::git(&proj, &["init", "-q", "-b", "trunk"]);
    let home = dir.join("home");
    servers.fake_claude(&home, &proj);
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            env: servers.daemon_env(&home),
            ..Default::default()
        },
    );
    let c = d.connect();
    Rig {
        _dir: dir,
        servers,
        d,
        c,
        proj,
        home,
    }
}

impl Rig {
    /// The tmux sessions of `sessions.refresh` until `ok` holds for them.
    fn refresh_until(&mut self, what: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let list = self.c.call("sessions.refresh", json!({}));
            let tmux: Vec<Value> = list
                .as_array()
                .expect("a list")
                .iter()
                .filter(|s| s.get("tmux").is_some())
                .cloned()
                .collect();
            if ok(&tmux) {
                return tmux;
            }
            if Instant::now() > deadline {
                self.d.fail(&format!("no refresh with {what}: {tmux:?}"));
            }
        }
    }

    /// The pane's screen once it shows `needle`.
    fn screen_until(&mut self, id: &str, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let screen = self.c.call("sessions.capture", json!({"session_id": id}))["screen"]
                .as_str()
                .expect("a screen")
                .to_string();
            if screen.contains(needle) {
                return screen;
            }
            if Instant::now() > deadline {
                self.d
                    .fail(&format!("the screen never showed {needle:?}: {screen}"));
            }
        }
    }
}

fn find<'a>(list: &'a [Value], id: &str) -> Option<&'a Value> {
    list.iter().find(|s| s["id"] == id)
}

#[test]
fn a_fake_claude_code_in_a_pane_is_discovered_with_the_seed_s_fields() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-disc");
    let list = r.refresh_until("the fake agent", |l| {
        find(l, "default:%0").is_some_and(|s| s["agent"] == "claude")
    });
    let s = find(&list, "default:%0").unwrap();
    let proj = r.proj.display().to_string();
    assert_eq!(s["source"], "discovered");
    assert_eq!(s["input_mode"], "pane");
    assert_eq!(s["frontend"], "tmux");
    assert_eq!(
        s["tmux"],
        json!({"server": "default", "pane_id": "%0", "session_name": "work",
               "window_index": 0, "current_path": proj})
    );
    assert_eq!(s["cwd"], json!(proj));
    assert_eq!(s["repo"], "proj");
    assert_eq!(s["branch"], "trunk");
    // The transcript's last record ended a turn.
    assert_eq!(s["status"], "idle");
    assert_eq!(s["status_label"], "idle");
    assert_eq!(s["can_prompt"], true);
    assert_eq!(s["can_open_terminal"], true);
    assert_eq!(
        s["agent_session_id"],
        "0b6f0d8e-1111-4222-8333-944455556666"
    );
    assert!(
        s["transcript_path"]
            .as_str()
            .unwrap()
            .ends_with("/0b6f0d8e-1111-4222-8333-944455556666.jsonl"),
        "{s}"
    );
    // sessions.list holds it too, from the scan just made.
    let listed = r.c.call("sessions.list", json!({}));
    assert!(
        find(listed.as_array().unwrap(), "default:%0").is_some(),
        "{listed}"
    );
    // A pane with no agent in it is no session.
    r.servers.tmux(
        "default",
        &["new-window", "-d", "-t", "work:", "--", "sleep", "600"],
    );
    let list = r.refresh_until("two panes looked at", |l| l.len() == 1);
    assert_eq!(list.len(), 1, "{list:?}");
}

#[test]
fn capture_keys_and_input_reach_the_pane_and_kill_ends_it() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-drive");
    r.refresh_until("the fake agent", |l| find(l, "default:%0").is_some());
    let id = "default:%0";
    r.screen_until(id, "fake claude ready");
    // Input: the text, then Enter (submit).
    let v = r.c.call(
        "sessions.input",
        json!({"session_id": id, "text": "hello there", "submit": true, "prepare": true}),
    );
    assert_eq!(v, Value::Null);
    r.screen_until(id, "got: hello there");
    // Keys: named keys and single characters, in order.
    r.c.call(
        "sessions.key",
        json!({"session_id": id, "keys": ["x", "y", "Enter"]}),
    );
    r.screen_until(id, "got: xy");
    // Copy mode is left before the text is typed (prepare).
    r.servers.tmux("default", &["copy-mode", "-t", "%0"]);
    r.c.call(
        "sessions.input",
        json!({"session_id": id, "text": "after copy mode", "submit": true, "prepare": true}),
    );
    r.screen_until(id, "got: after copy mode");
    assert_eq!(
        r.c.call("sessions.focus", json!({"session_id": id})),
        Value::Null
    );
    // A permission prompt on the screen: the session is busy.
    r.c.call(
        "sessions.input",
        json!({"session_id": id, "text": "ask", "submit": true}),
    );
    r.screen_until(id, "Do you want to proceed?");
    let list = r.refresh_until("awaiting input", |l| {
        find(l, id).is_some_and(|s| s["status"] == "awaiting_input")
    });
    let s = find(&list, id).unwrap();
    assert_eq!(s["status_label"], "awaiting");
    assert_eq!(s["can_prompt"], false);
    let e = r.c.request(
        "sessions.input",
        json!({"session_id": id, "text": "more", "submit": true}),
    );
    assert_eq!(e["error"]["data"]["code"], "session-busy", "{e}");
    assert_eq!(e["error"]["message"], "session is busy");
    // Keys still reach it: they answer the prompt.
    r.c.call(
        "sessions.key",
        json!({"session_id": id, "keys": ["1", "Enter"]}),
    );
    r.screen_until(id, "got: 1");
    // Kill: the pane is gone, and so is the session.
    assert_eq!(
        r.c.call("sessions.kill", json!({"session_id": id})),
        Value::Null
    );
    let panes = Command::new("tmux")
        .args(["-L", "default", "list-panes", "-a", "-F", "#{pane_id}"])
        .env("TMUX_TMPDIR", &r.servers.tmpdir)
        .output()
        .expect("tmux");
    assert!(
        !String::from_utf8_lossy(&panes.stdout).contains("%0"),
        "the pane is still there"
    );
    let list = r.c.call("sessions.list", json!({}));
    assert!(find(list.as_array().unwrap(), id).is_none(), "{list}");
}

#[test]
fn pane_methods_fail_with_the_seed_s_texts() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-errs");
    r.refresh_until("the fake agent", |l| find(l, "default:%0").is_some());
    for (method, params) in [
        ("sessions.capture", json!({"session_id": "default:%77"})),
        ("sessions.focus", json!({"session_id": "nope"})),
        (
            "sessions.key",
            json!({"session_id": "omniconflux:%3", "keys": ["a"]}),
        ),
    ] {
        let id = params["session_id"].as_str().unwrap().to_string();
        let e = r.c.request(method, params);
        assert_eq!(
            e["error"]["data"]["code"], "session-not-found",
            "{method}: {e}"
        );
        assert_eq!(
            e["error"]["message"],
            format!("unknown session: {id}"),
            "{e}"
        );
    }
    // Empty text: no terminal control (seed 004).
    let e = r.c.request(
        "sessions.input",
        json!({"session_id": "default:%0", "text": "", "submit": true}),
    );
    assert_eq!(e["error"]["data"]["code"], "no-terminal-control", "{e}");
    assert_eq!(e["error"]["message"], "session has no terminal control");
    // Keys that are not key names.
    for keys in [json!([]), json!(["a b"]), json!(["\u{1b}"])] {
        let e = r.c.request(
            "sessions.key",
            json!({"session_id": "default:%0", "keys": keys}),
        );
        assert_eq!(e["error"]["data"]["code"], "invalid-params", "{e}");
    }
    let e = r.c.request(
        "sessions.capture",
        json!({"session_id": "default:%0", "extra": 1}),
    );
    assert_eq!(e["error"]["data"]["code"], "invalid-params", "{e}");
}

#[test]
fn a_watcher_hears_tmux_sessions_come_and_go() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-watch");
    r.refresh_until("the fake agent", |l| find(l, "default:%0").is_some());
    let mut w = r.d.connect();
    w.call("sessions.subscribe", json!({}));
    let added = w.next_note("session.event");
    assert_eq!(added["params"]["type"], "added", "{added}");
    assert_eq!(added["params"]["session"]["id"], "default:%0");
    // A second agent pane appears without anyone asking: the watch rescans.
    r.servers.tmux(
        "default",
        &[
            "new-window",
            "-d",
            "-t",
            "work:",
            "-c",
            &r.proj.display().to_string(),
            "--",
            &fixture("tmux/claude"),
        ],
    );
    let deadline = Instant::now() + PATIENCE;
    let second = loop {
        let ev = w.next_note("session.event");
        if ev["params"]["type"] == "added" && ev["params"]["session"]["id"] != "default:%0" {
            break ev;
        }
        assert!(Instant::now() < deadline, "no added event for the new pane");
    };
    let id = second["params"]["session"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    r.servers
        .tmux("default", &["kill-pane", "-t", &id["default:".len()..]]);
    loop {
        let ev = w.next_note("session.event");
        if ev["params"]["type"] == "removed" && ev["params"]["session"]["id"] == id.as_str() {
            break;
        }
        assert!(Instant::now() < deadline, "no removed event for {id}");
    }
}

#[test]
fn spawn_starts_a_command_in_the_daemon_s_own_server() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-spawn");
    let proj = r.proj.display().to_string();
    let v = r.c.call(
        "sessions.spawn",
        json!({"command": fixture("tmux/claude"), "cwd": proj, "name": "builds"}),
    );
    let sid = v["session_id"].as_str().unwrap().to_string();
    let pane = v["pane_id"].as_str().unwrap().to_string();
    assert_eq!(sid, format!("omniconflux:{pane}"), "{v}");
    let names = r
        .servers
        .tmux("omniconflux", &["list-sessions", "-F", "#{session_name}"]);
    assert_eq!(names.trim(), "builds");
    let list = r.refresh_until("the spawned session", |l| {
        find(l, &sid).is_some_and(|s| s["agent"] == "claude")
    });
    let s = find(&list, &sid).unwrap();
    assert_eq!(s["source"], "spawned");
    assert_eq!(s["tmux"]["server"], "omniconflux");
    assert_eq!(s["cwd"], json!(proj));
    r.screen_until(&sid, "fake claude ready");
    // The daemon blocks signals for its signal thread; the server it
    // started, and the panes, must not inherit that mask.
    let pid = r.servers.tmux(
        "omniconflux",
        &["display", "-p", "-t", &pane, "#{pane_pid}"],
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
    assert!(
        status.lines().any(|l| l == "SigBlk:\t0000000000000000"),
        "the pane's program has signals blocked:\n{status}"
    );
    // An agent by name: its program on the daemon's PATH, with the model
    // and the first prompt in its own flags.
    let v = r.c.call(
        "sessions.spawn",
        json!({"agent": "claude", "cwd": "~", "model": "m1", "prompt": "fix it"}),
    );
    let sid = v["session_id"].as_str().unwrap().to_string();
    r.screen_until(&sid, "fake claude ready --model m1 fix it");
    let list = r.refresh_until("the agent's session", |l| find(l, &sid).is_some());
    let s = find(&list, &sid).unwrap();
    assert_eq!(s["tmux"]["session_name"], "claude");
    assert_eq!(s["cwd"], json!(r.home.display().to_string()));
    // A past Claude Code session, resumed in a pane.
    let v = r.c.call(
        "sessions.resume",
        json!({"agent": "claude", "agent_session_id": "0b6f0d8e", "cwd": proj}),
    );
    let sid = v["session_id"].as_str().unwrap().to_string();
    r.screen_until(&sid, "fake claude ready --resume 0b6f0d8e");
    let e = r.c.request(
        "sessions.resume",
        json!({"agent": "claude", "agent_session_id": "0b6f0d8e", "cwd": ""}),
    );
    assert_eq!(
        e["error"]["message"], "cannot resume: session working directory is unknown",
        "{e}"
    );
    let e = r.c.request(
        "sessions.resume",
        json!({"agent": "codex", "agent_session_id": "x", "cwd": proj}),
    );
    assert_eq!(e["error"]["code"], -32600, "{e}");
    // The seed's refusals (-32600, invalid-request here).
    for params in [
        json!({"command": "true", "cwd": "relative/dir"}),
        json!({"command": "true", "cwd": "/does/not/exist"}),
        json!({"command": "true", "model": "m"}),
        json!({"agent": "vim"}),
    ] {
        let e = r.c.request("sessions.spawn", params.clone());
        assert_eq!(
            e["error"]["data"]["code"], "invalid-request",
            "{params}: {e}"
        );
    }
}

#[test]
fn host_methods_answer_and_the_capabilities_say_what_the_node_serves() {
    let dir = TestDir::new("tmux-host");
    let home = dir.join("home");
    for d in ["src", "scripts", ".cache", "docs"] {
        std::fs::create_dir_all(home.join(d)).unwrap();
    }
    std::fs::write(home.join("setup.py"), "").unwrap();
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            env: vec![("HOME".into(), home.display().to_string())],
            ..Default::default()
        },
    );
    let mut c = d.connect();
    let info = c.call("host.info", json!({}));
    assert!(info["uptime_seconds"].as_u64().unwrap() > 0, "{info}");
    assert_eq!(info["wakelock"], json!({}));
    assert!(
        info["os"].as_str().is_some_and(|o| o.ends_with(')')),
        "{info}"
    );
    let v = c.call("host.completeDir", json!({"path": "~/s"}));
    assert_eq!(
        v,
        json!({"home": home.display().to_string(), "paths": ["~/scripts/", "~/src/"]})
    );
    let v = c.call("host.completeDir", json!({"path": "~/."}));
    assert_eq!(v["paths"], json!(["~/.cache/"]));
    let v = c.call("host.completeDir", json!({"path": "relative"}));
    assert_eq!(v["paths"], json!([]));
    // Whether this machine's systemd-inhibit can take a lock is the
    // probe's to say; the capability and the method agree with it.
    let served = !d.wait_log("wakelock").contains("no wakelock");
    let caps = &c.call("server.info", json!({}))["nodes"][0]["capabilities"];
    assert_eq!(
        caps,
        &json!({"spawn_session": util::need::program("tmux").is_ok(),
                "terminal": util::need::program("tmux").is_ok(), "host_wakelock": served})
    );
    if !served {
        let e = c.request("host.setWakelock", json!({"until": "9999-12-31T23:59:59Z"}));
        assert_eq!(e["error"]["code"], -32600, "{e}");
        assert_eq!(e["error"]["message"], "wakelock not supported on this node");
    }
}

/// The text of `terminal.output`s for `term_id` on `c` until it holds
/// `needle`.
fn output_until(c: &mut util::Client, term_id: &str, needle: &str) -> String {
    let mut seen = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let n = c.next_note("terminal.output");
        assert_eq!(n["params"]["term_id"], term_id, "{n}");
        let data = n["params"]["data"].as_str().unwrap();
        seen.extend(omniconfluxd::tmux::terminal::b64_decode(data).expect("standard base64"));
        let text = String::from_utf8_lossy(&seen).into_owned();
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in {text:?}");
    }
}

fn b64(s: &str) -> String {
    omniconfluxd::tmux::terminal::b64_encode(s.as_bytes())
}

#[test]
fn a_live_terminal_redraws_echoes_resizes_and_is_evicted_by_a_second_opener() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-term");
    r.refresh_until("the fake agent", |l| find(l, "default:%0").is_some());
    let id = "default:%0";
    let open = json!({"term_id": "t1", "session_id": id, "cols": 90, "rows": 20});
    assert_eq!(r.c.call("terminal.open", open), Value::Null);
    // The first output is a full redraw: the screen as it is.
    output_until(&mut r.c, "t1", "fake claude ready");
    r.c.call(
        "terminal.input",
        json!({"term_id": "t1", "data": b64("typed\r")}),
    );
    output_until(&mut r.c, "t1", "got: typed");
    // The size reaches the real window.
    r.c.call(
        "terminal.resize",
        json!({"term_id": "t1", "cols": 0, "rows": 5}),
    );
    r.c.call(
        "terminal.resize",
        json!({"term_id": "t1", "cols": 70, "rows": 15}),
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let size = r.servers.tmux(
            "default",
            &[
                "display",
                "-p",
                "-t",
                "%0",
                "#{window_width}x#{window_height}",
            ],
        );
        if size.trim() == "70x15" {
            break;
        }
        assert!(Instant::now() < deadline, "the window stayed {size}");
        // Wait for the daemon to be done with what it was sent.
        r.c.call("ping", json!({}));
    }
    // Errors.
    let e =
        r.c.request("terminal.input", json!({"term_id": "t1", "data": "%%%"}));
    assert_eq!(e["error"]["message"], "bad base64", "{e}");
    let e =
        r.c.request("terminal.input", json!({"term_id": "nope", "data": ""}));
    assert_eq!(e["error"]["message"], "unknown term_id: nope", "{e}");
    let e = r.c.request("terminal.open", json!({"session_id": id}));
    assert_eq!(e["error"]["message"], "term_id required", "{e}");
    let e = r.c.request(
        "terminal.open",
        json!({"term_id": "x", "session_id": id, "terminal_id": "y"}),
    );
    assert_eq!(
        e["error"]["message"],
        "set session_id or terminal_id, not both"
    );
    let e = r.c.request("terminal.open", json!({"term_id": "x"}));
    assert_eq!(e["error"]["message"], "session_id or terminal_id required");
    let e = r.c.request(
        "terminal.open",
        json!({"term_id": "x", "session_id": "default:%42"}),
    );
    assert_eq!(e["error"]["message"], "unknown session: default:%42");
    // A second opener, on another connection, evicts the first.
    let mut c2 = r.d.connect();
    c2.call("terminal.open", json!({"term_id": "t2", "session_id": id}));
    let ev = r.c.next_note("terminal.exited");
    assert_eq!(ev["params"], json!({"term_id": "t1", "reason": "evicted"}));
    output_until(&mut c2, "t2", "got: typed");
    // The pane goes: the terminal exits.
    r.servers.tmux("default", &["kill-pane", "-t", "%0"]);
    let ev = c2.next_note("terminal.exited");
    assert_eq!(ev["params"], json!({"term_id": "t2", "reason": "exited"}));
    // No viewer session is left behind.
    let left = Command::new("tmux")
        .args(["-L", "default", "list-sessions", "-F", "#{session_name}"])
        .env("TMUX_TMPDIR", &r.servers.tmpdir)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains("omniconflux-view"),
        "{left:?}"
    );
}

#[test]
fn a_persistent_shell_survives_close_and_a_daemon_restart_until_killed() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-pterm");
    let mut w = r.d.connect();
    w.call("sessions.subscribe", json!({}));
    assert_eq!(
        r.c.call("terminal.list", json!({})),
        json!({"terminals": []})
    );
    let t = r.c.call("terminal.create", json!({}));
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["cwd"], "~", "{t}");
    assert_eq!(t["name"], "");
    assert_eq!(t["attached"], false);
    w.next_note("terminal.changed");
    let t2 = r.c.call("terminal.create", json!({}));
    w.next_note("terminal.changed");
    r.c.call(
        "terminal.rename",
        json!({"terminal_id": id, "name": "  builds "}),
    );
    w.next_note("terminal.changed");
    let list = r.c.call("terminal.list", json!({}));
    let ids: Vec<&str> = list["terminals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [id.as_str(), t2["id"].as_str().unwrap()],
        "creation order"
    );
    assert_eq!(list["terminals"][0]["name"], "builds");
    // Terminals are no sessions.
    let sessions = r.refresh_until("the fake agent", |l| find(l, "default:%0").is_some());
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    // Attach, type, detach: the shell stays.
    r.c.call("terminal.open", json!({"term_id": "p", "terminal_id": id}));
    w.next_note("terminal.changed");
    let listed = r.c.call("terminal.list", json!({}));
    assert_eq!(listed["terminals"][0]["attached"], true, "{listed}");
    r.c.call(
        "terminal.input",
        json!({"term_id": "p", "data": b64("echo marker-$((40+2))\r")}),
    );
    output_until(&mut r.c, "p", "marker-42");
    r.c.call("terminal.close", json!({"term_id": "p"}));
    w.next_note("terminal.changed");
    drop(w);
    // A restart: the shell is still there, with its name and history.
    let Rig {
        c,
        d,
        servers,
        proj,
        home,
        _dir,
    } = r;
    drop(c);
    d.stop();
    let d = Daemon::start_with(
        &_dir.path,
        Opts {
            env: vec![
                ("HOME".into(), home.display().to_string()),
                ("TMUX_TMPDIR".into(), servers.tmpdir.display().to_string()),
            ],
            ..Default::default()
        },
    );
    let mut c = d.connect();
    let list = c.call("terminal.list", json!({}));
    assert_eq!(list["terminals"][0]["id"], json!(id), "{list}");
    assert_eq!(list["terminals"][0]["name"], "builds");
    c.call("terminal.open", json!({"term_id": "q", "terminal_id": id}));
    output_until(&mut c, "q", "marker-42");
    // The errors of the seed.
    let e = c.request("terminal.rename", json!({"terminal_id": id, "name": " "}));
    assert_eq!(e["error"]["message"], "name required", "{e}");
    let e = c.request(
        "terminal.open",
        json!({"term_id": "z", "terminal_id": "abc123"}),
    );
    assert_eq!(e["error"]["message"], "unknown terminal: abc123", "{e}");
    // Kill: the attach exits, the list forgets it.
    c.call("terminal.kill", json!({"terminal_id": id}));
    let ev = c.next_note("terminal.exited");
    assert_eq!(ev["params"], json!({"term_id": "q", "reason": "exited"}));
    let list = c.call("terminal.list", json!({}));
    assert_eq!(list["terminals"].as_array().unwrap().len(), 1, "{list}");
    let e = c.request("terminal.kill", json!({"terminal_id": id}));
    assert_eq!(
        e["error"]["message"],
        format!("unknown terminal: {id}"),
        "{e}"
    );
    let _ = proj;
    drop(c);
    drop(d);
    drop(servers);
}

/// Claude Code's project directory of `proj` under `home`.
fn project_dir(home: &std::path::Path, proj: &std::path::Path) -> PathBuf {
    home.join(".claude/projects").join(
        proj.display()
            .to_string()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>(),
    )
}

fn append(path: &std::path::Path, records: &[Value]) {
    use std::io::Write;
    let mut text = String::new();
    for r in records {
        text.push_str(&r.to_string());
        text.push('\n');
    }
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    // One write: the daemon never sees half of it.
    f.write_all(text.as_bytes()).unwrap();
}

#[test]
fn a_claude_code_transcript_file_is_viewed_followed_and_switched() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-transcript");
    let project = project_dir(&r.home, &r.proj);
    let file = project.join("0b6f0d8e-1111-4222-8333-944455556666.jsonl");
    std::fs::copy(fixture("tmux/transcript.jsonl"), &file).unwrap();
    let id = "default:%0";
    r.refresh_until("the fake agent", |l| find(l, id).is_some());

    let v =
        r.c.call("sessions.transcriptView", json!({"session_id": id}));
    let entries = v["entries"].as_array().expect("entries").clone();
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["user", "thinking", "tool", "tool", "text", "turn_end"],
        "{v}"
    );
    assert_eq!(entries[0]["text"], "list the files");
    assert_eq!(entries[0]["id"], "11111111-0000-4000-8000-000000000001.0");
    assert_eq!(entries[1]["signature"], true);
    let tool = &entries[2];
    assert_eq!(tool["toolName"], "Bash");
    assert_eq!(tool["toolId"], "toolu_01");
    assert_eq!(tool["resultIsError"], false);
    assert!(
        tool["inputPreview"].as_str().unwrap().contains("ls"),
        "{tool}"
    );
    assert!(tool.get("toolInput").is_none() && tool.get("result").is_none());
    let end = &entries[5];
    assert_eq!(end["stopReason"], "end_turn");
    assert_eq!(end["interrupted"], false);
    assert_eq!(end["modelName"], "claude-sonnet-4-5");
    assert_eq!(end["toolCount"], 2);
    assert_eq!(end["thinking"], 1);
    assert_eq!(end["durationMs"], 4000);
    // Output summed over the turn's API calls (msg_01 counted once), the
    // rest from its last call.
    assert_eq!(
        end["usage"],
        json!({"input": 60, "output": 59, "cacheRead": 100, "cacheCreation": 0})
    );

    let detail = r.c.call(
        "sessions.toolDetail",
        json!({"session_id": id, "tool_id": "toolu_01"}),
    );
    assert_eq!(
        detail,
        json!({"toolInput": r#"{"command":"ls","description":"List files"}"#,
               "result": "README.md\nsrc", "resultIsError": false})
    );
    let e = r.c.request(
        "sessions.toolDetail",
        json!({"session_id": id, "tool_id": "toolu_99"}),
    );
    assert_eq!(e["error"]["data"]["code"], "not-found", "{e}");
    let tasks = r.c.call("sessions.tasks", json!({"session_id": id}));
    assert_eq!(
        tasks,
        json!({"tasks": [{"id": "1", "subject": "Read the README", "status": "pending",
                          "description": "Look at README.md", "active_form": "Reading the README"}]})
    );

    // The turn rule: a client holding all six entries (the last ends a
    // turn) starts at that one; one holding three at the turn's start.
    let mut w = r.d.connect();
    let first = w.call(
        "transcript.subscribe",
        json!({"sub_id": "s2", "session_id": id, "have_entries": 3}),
    );
    assert_eq!(first["from_index"], 0, "{first}");
    assert_eq!(
        w.call("transcript.unsubscribe", json!({"sub_id": "s2"})),
        Value::Null
    );
    let first = w.call(
        "transcript.subscribe",
        json!({"sub_id": "s1", "session_id": id, "have_entries": 6}),
    );
    assert_eq!(first["sub_id"], "s1");
    assert_eq!(first["from_index"], 5, "{first}");
    assert_eq!(first["entries"].as_array().unwrap().len(), 1);
    assert_eq!(first["queue"], json!([]));

    // A prompt queued: a delta of the queue alone.
    append(
        &file,
        &[
            json!({"type":"queue-operation","operation":"enqueue","timestamp":"2026-03-01T10:01:00.000Z","content":"now run the tests","sessionId":"0b6f0d8e-1111-4222-8333-944455556666"}),
        ],
    );
    let d = w.next_note("transcript.delta");
    assert_eq!(
        d["params"],
        json!({"sub_id": "s1", "from_index": 6, "entries": [],
               "queue": [{"text": "now run the tests"}]})
    );
    // It leaves the queue as it becomes the next prompt, which creates a
    // task: entries from 6, then tasks.changed.
    append(
        &file,
        &[
            json!({"type":"queue-operation","operation":"dequeue","timestamp":"2026-03-01T10:01:01.000Z"}),
            json!({"type":"user","uuid":"u-2","timestamp":"2026-03-01T10:01:01.100Z","message":{"role":"user","content":"now run the tests"}}),
            json!({"type":"assistant","uuid":"a-2","timestamp":"2026-03-01T10:01:02.000Z","message":{"id":"msg_04","model":"claude-sonnet-4-5","content":[{"type":"tool_use","id":"toolu_03","name":"TaskCreate","input":{"subject":"Run the tests"}}],"stop_reason":"tool_use","usage":{"input_tokens":5,"output_tokens":5}}}),
        ],
    );
    let d = w.next_note("transcript.delta");
    assert_eq!(d["params"]["from_index"], 6, "{d}");
    assert_eq!(d["params"]["queue"], json!([]), "{d}");
    let kinds: Vec<&str> = d["params"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["user", "tool"], "{d}");
    let t = w.next_note("tasks.changed");
    assert_eq!(t["params"], json!({"sub_id": "s1", "session_id": id}));
    let tasks = r.c.call("sessions.tasks", json!({"session_id": id}));
    assert_eq!(tasks["tasks"].as_array().unwrap().len(), 2, "{tasks}");

    // /clear: Claude Code goes on in a new file, which is followed from
    // its start.
    std::fs::write(
        project.join("ffffffff-2222-4333-8444-955566667777.jsonl"),
        concat!(
            r#"{"type":"user","uuid":"n-1","timestamp":"2026-03-01T10:02:00.000Z","message":{"role":"user","content":"fresh start"}}"#,
            "\n"
        ),
    )
    .unwrap();
    let d = w.next_note("transcript.delta");
    assert_eq!(d["params"]["from_index"], 0, "{d}");
    assert_eq!(d["params"]["entries"][0]["text"], "fresh start", "{d}");
    assert_eq!(d["params"]["entries"].as_array().unwrap().len(), 1, "{d}");

    // A subagent's own file: followed with agent_id, never with a queue.
    let subagents = project.join("ffffffff-2222-4333-8444-955566667777/subagents");
    std::fs::create_dir_all(&subagents).unwrap();
    std::fs::write(
        subagents.join("agent-a7.jsonl"),
        concat!(
            r#"{"type":"user","isSidechain":true,"uuid":"s-1","message":{"role":"user","content":"look around"}}"#,
            "\n",
            r#"{"type":"assistant","isSidechain":true,"uuid":"s-2","message":{"id":"m9","content":[{"type":"tool_use","id":"toolu_s1","name":"Read","input":{"file_path":"README.md"}}],"stop_reason":"tool_use"}}"#,
            "\n"
        ),
    )
    .unwrap();
    let first = w.call(
        "transcript.subscribe",
        json!({"sub_id": "sub", "session_id": id, "agent_id": "a7", "have_entries": 0}),
    );
    assert_eq!(first["from_index"], 0, "{first}");
    assert!(first.get("queue").is_none(), "{first}");
    assert_eq!(first["entries"][1]["toolId"], "toolu_s1", "{first}");
    let detail = w.call(
        "sessions.toolDetail",
        json!({"session_id": id, "agent_id": "a7", "tool_id": "toolu_s1"}),
    );
    assert_eq!(detail["toolInput"], r#"{"file_path":"README.md"}"#);
    // The seed's errors.
    let e = w.request(
        "transcript.subscribe",
        json!({"sub_id": "", "session_id": id, "have_entries": 0}),
    );
    assert_eq!(e["error"]["message"], "sub_id required", "{e}");
    for agent in ["a8", "../x"] {
        let e = w.request(
            "transcript.subscribe",
            json!({"sub_id": "x", "session_id": id, "agent_id": agent, "have_entries": 0}),
        );
        assert_eq!(
            e["error"]["message"],
            format!("unknown subagent: {agent}"),
            "{e}"
        );
    }
    let e = w.request(
        "sessions.transcriptView",
        json!({"session_id": "default:%55"}),
    );
    assert_eq!(e["error"]["message"], "unknown session: default:%55", "{e}");
    // After a restart, a client that lists nothing first is answered all
    // the same: the daemon scans before it answers.
    drop(w);
    let Rig {
        c,
        d,
        servers,
        home,
        _dir,
        ..
    } = r;
    drop(c);
    d.stop();
    let d = Daemon::start_with(
        &_dir.path,
        Opts {
            env: vec![
                ("HOME".into(), home.display().to_string()),
                ("TMUX_TMPDIR".into(), servers.tmpdir.display().to_string()),
            ],
            ..Default::default()
        },
    );
    let mut c = d.connect();
    let v = c.call("sessions.transcriptView", json!({"session_id": id}));
    assert_eq!(v["entries"][0]["text"], "fresh start", "{v}");
}

#[test]
fn attach_shows_the_pane_in_a_real_terminal_and_restores_it_on_detach() {
    if !have_tmux() || util::need::have(util::need::program("python3"), "python3").is_none() {
        return;
    }
    let mut r = rig("tmux-attach");
    let id = "default:%0";
    r.refresh_until("the fake agent", |l| find(l, id).is_some());
    let socket = r.d.socket.display().to_string();
    // `sessions` lists the tmux session, and `sessions input` submits.
    let (code, out, err) = util::run_cli(&["--socket", &socket, "sessions"]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("no {id} in {out}"));
    assert!(
        line.contains("claude") && line.contains("tmux work:0"),
        "{line}"
    );
    let (code, _, err) =
        util::run_cli(&["--socket", &socket, "sessions", "input", id, "from the cli"]);
    assert_eq!(code, 0, "{err}");
    r.screen_until(id, "got: from the cli");
    // No terminal: refused before anything is opened.
    let (code, _, err) = util::run_cli(&["--socket", &socket, "attach", id]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs a terminal"), "{err}");
    // Through a real pseudo-terminal (the script says what it checks).
    let out = Command::new("python3")
        .arg(fixture("tmux/pty_attach.py"))
        .args([util::bin(), &socket, id, "%0", "got: from the cli"])
        .env("TMUX_TMPDIR", &r.servers.tmpdir)
        .env_remove("TMUX")
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Detached, the pane runs on.
    r.c.call(
        "sessions.input",
        json!({"session_id": id, "text": "still here", "submit": true}),
    );
    r.screen_until(id, "got: still here");
}

/// Waits until process `pid` has exited (a zombie counts): its pidfd turns
/// readable then, so this waits for the event, not by polling.
fn wait_gone(d: &Daemon, pid: &str) {
    let pid: libc::pid_t = pid.parse().unwrap();
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new
    // descriptor or -1; no memory is shared with the kernel.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as libc::c_int;
    if fd < 0 {
        // ESRCH: gone (and reaped) already.
        return;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd that lives across the call, and the
    // count says one; `fd` is ours and closed once, right after.
    let ready = unsafe { libc::poll(&mut p, 1, PATIENCE.as_millis() as libc::c_int) };
    unsafe { libc::close(fd) };
    if ready != 1 {
        d.fail(&format!("systemd-inhibit {pid} still runs"));
    }
}

/// Whether process `pid` runs (and is no zombie).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// The fixture's log: a FIFO the fixture writes "PID ARGS" to as each
/// systemd-inhibit starts, held open for reading and writing here so that
/// the fixture's open never blocks and the reader never sees its end.
struct Inhibitors {
    lines: std::sync::mpsc::Receiver<(String, String)>,
    seen: Vec<(String, String)>,
}

impl Inhibitors {
    fn new(home: &std::path::Path) -> Inhibitors {
        let path = home.join("inhibit.fifo");
        let status = Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(status.success(), "mkfifo {}", path.display());
        let fifo = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(fifo).lines() {
                let Ok(l) = l else { return };
                let (pid, args) = l.split_once(' ').unwrap_or((&l, ""));
                if tx.send((pid.to_string(), args.to_string())).is_err() {
                    return;
                }
            }
        });
        Inhibitors {
            lines,
            seen: Vec::new(),
        }
    }

    /// Every start so far once there have been `n`, in order.
    fn until(&mut self, d: &Daemon, n: usize) -> Vec<(String, String)> {
        let deadline = Instant::now() + PATIENCE;
        while self.seen.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => d.fail(&format!(
                    "systemd-inhibit ran {} times, not {n}: {:?}",
                    self.seen.len(),
                    self.seen
                )),
            }
        }
        self.seen.clone()
    }
}

#[test]
fn a_wakelock_holds_systemd_inhibit_survives_a_restart_and_ends() {
    let dir = TestDir::new("tmux-wake");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut inhibitors = Inhibitors::new(&home);
    let opts = || Opts {
        env: vec![
            ("HOME".into(), home.display().to_string()),
            // systemd-inhibit is the fixture: there is no logind here.
            (
                "PATH".into(),
                format!(
                    "{}:{}",
                    fixture("wakelock"),
                    std::env::var("PATH").unwrap_or_default()
                ),
            ),
        ],
        ..Default::default()
    };
    let d = Daemon::start_with(&dir.path, opts());
    d.wait_log("the wakelock is served");
    let mut c = d.connect();
    let caps = &c.call("server.info", json!({}))["nodes"][0]["capabilities"];
    assert_eq!(caps["host_wakelock"], true, "{caps}");
    // The seed's refusals.
    for (until, message) in [
        (
            "2000-01-01T00:00:00Z",
            "until is in the past: 2000-01-01T00:00:00Z",
        ),
        ("tomorrow", "invalid until: tomorrow"),
    ] {
        let e = c.request("host.setWakelock", json!({"until": until}));
        assert_eq!(e["error"]["code"], -32600, "{e}");
        assert_eq!(e["error"]["message"], message);
    }
    // On until turned off: a systemd-inhibit child held meanwhile.
    let forever = "9999-12-31T23:59:59Z";
    assert_eq!(
        c.call("host.setWakelock", json!({"until": forever})),
        json!({"until": forever})
    );
    assert_eq!(
        c.call("host.info", json!({}))["wakelock"],
        json!({"until": forever})
    );
    let held = inhibitors.until(&d, 2);
    assert_eq!(held.len(), 2, "the probe, then the lock: {held:?}");
    assert!(
        held[1].1.contains("--what=idle:sleep") && held[1].1.contains("--mode=block"),
        "{held:?}"
    );
    let first = held[1].0.clone();
    assert!(running(&first), "systemd-inhibit {first} is not running");
    assert!(d.state.join("wakelock").exists());
    // A restart takes it again; the old child went with the old daemon.
    drop(c);
    d.stop();
    let d = Daemon::start_with(&dir.path, opts());
    wait_gone(&d, &first);
    d.wait_log("the wakelock is served");
    let mut c = d.connect();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let w = c.call("host.info", json!({}))["wakelock"].clone();
        if w == json!({"until": forever}) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wakelock was not taken again: {w}"
        );
    }
    // The second daemon's probe, then its lock.
    let second = inhibitors.until(&d, 4)[3].0.clone();
    assert!(running(&second));
    // Off: the child ends and nothing is kept.
    assert_eq!(c.call("host.setWakelock", json!({})), json!({}));
    assert_eq!(c.call("host.info", json!({}))["wakelock"], json!({}));
    wait_gone(&d, &second);
    assert!(!d.state.join("wakelock").exists());
    // A near until ends by itself.
    let soon = omniconfluxd::clock::format_ts(omniconfluxd::clock::now_ms() + 1_000);
    assert_eq!(
        c.call("host.setWakelock", json!({"until": soon})),
        json!({"until": soon})
    );
    let third = inhibitors.until(&d, 5)[4].0.clone();
    wait_gone(&d, &third);
    assert_eq!(c.call("host.info", json!({}))["wakelock"], json!({}));
}

/// The sessions of the daemon's own tmux server.
fn own_sessions(servers: &Servers) -> String {
    let out = Command::new("tmux")
        .args([
            "-L",
            "omniconflux",
            "list-sessions",
            "-F",
            "#{session_name}",
        ])
        .env("TMUX_TMPDIR", &servers.tmpdir)
        .env_remove("TMUX")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_session_without_a_pane_is_shown_in_a_viewer_pane_following_its_transcript() {
    if !have_tmux() {
        return;
    }
    let dir = TestDir::new("tmux-viewer");
    let tmpdir = dir.join("x");
    std::fs::create_dir_all(&tmpdir).unwrap();
    let servers = Servers { tmpdir };
    let wt = dir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let gone = dir.join("gone");
    std::fs::create_dir_all(&gone).unwrap();
    let seat = format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"stream-json\"\nprovider = \"test\"\nfamily = \"local\"\n",
        fixture("fake_stream_json_agent.py")
    );
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(seat),
            env: vec![("TMUX_TMPDIR".into(), servers.tmpdir.display().to_string())],
            ..Default::default()
        },
    );
    let mut c = d.connect();
    let spawn = |c: &mut util::Client, cwd: &std::path::Path| {
        let r = c.call(
            "sessions.spawn",
            json!({"harness": "fake", "cwd": cwd.display().to_string(), "prompt": "paint it blue"}),
        );
        r["session_id"].as_str().unwrap().to_string()
    };
    let sid = spawn(&mut c, &wt);
    // Wide enough that no event line wraps on the screen.
    let open = json!({"term_id": "v", "session_id": sid, "cols": 1000, "rows": 40});
    assert_eq!(c.call("terminal.open", open), Value::Null);
    // The pane shows the session's transcript: the prompt, the agent's
    // answer and the turn's end, then follows it as it grows.
    let text = output_until(&mut c, "v", "-- turn ended: completed --");
    assert!(
        text.contains("> paint it blue") && text.contains("echo: paint it blue"),
        "{text:?}"
    );
    c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "and the door"}),
    );
    output_until(&mut c, "v", "echo: and the door");
    let names = own_sessions(&servers);
    assert!(
        names.lines().any(|n| n.ends_with("-feed")),
        "no viewer pane in the daemon's own server: {names}"
    );
    // The viewer pane goes with the terminal.
    assert_eq!(
        c.call("terminal.close", json!({"term_id": "v"})),
        Value::Null
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let names = own_sessions(&servers);
        if !names.contains("omniconflux-view") {
            break;
        }
        assert!(Instant::now() < deadline, "viewer sessions left: {names}");
        c.call("ping", json!({}));
    }
    // Its directory is checked as a spawn's is.
    let sid2 = spawn(&mut c, &gone);
    std::fs::remove_dir(&gone).unwrap();
    let e = c.request("terminal.open", json!({"term_id": "w", "session_id": sid2}));
    assert_eq!(e["error"]["code"], -32600, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("cwd cannot be entered: "),
        "{e}"
    );
    drop(c);
    drop(d);
}

#[test]
fn a_tmux_seat_starts_its_command_in_a_pane_of_the_daemon_s_own_server() {
    if !have_tmux() {
        return;
    }
    let dir = TestDir::new("tmux-seat");
    let tmpdir = dir.join("x");
    std::fs::create_dir_all(&tmpdir).unwrap();
    let servers = Servers { tmpdir };
    let wt = dir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let seat = concat!(
        "[[seat]]\nharness = \"plain\"\ncommand = \"sh\"\n",
        "args = [\"-c\", \"echo seat says $GREETING in $(pwd); exec cat\"]\n",
        "transport = \"tmux\"\nprovider = \"test\"\nfamily = \"local\"\n",
        "env = { GREETING = \"hello\" }\n"
    );
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(seat.into()),
            env: vec![("TMUX_TMPDIR".into(), servers.tmpdir.display().to_string())],
            ..Default::default()
        },
    );
    let mut c = d.connect();
    let cwd = wt.display().to_string();
    // Not a seat the core drives: the registry leaves it out.
    let seats = c.call("seats.list", json!({}));
    assert_eq!(seats["seats"], json!([]), "{seats}");
    let e = c.request(
        "sessions.spawn",
        json!({"harness": "plain", "cwd": cwd, "prompt": "hi"}),
    );
    assert_eq!(e["error"]["code"], -32600, "{e}");
    let v = c.call("sessions.spawn", json!({"harness": "plain", "cwd": cwd}));
    let sid = v["session_id"].as_str().unwrap().to_string();
    let pane = v["pane_id"].as_str().unwrap().to_string();
    assert_eq!(sid, format!("omniconflux:{pane}"), "{v}");
    let names = servers.tmux("omniconflux", &["list-sessions", "-F", "#{session_name}"]);
    assert_eq!(names.trim(), "plain");
    // Its command runs with the seat's environment, in the cwd asked for,
    // and takes what is typed into the pane.
    let deadline = Instant::now() + PATIENCE;
    let want = format!("seat says hello in {cwd}");
    loop {
        let screen = servers.tmux("omniconflux", &["capture-pane", "-p", "-t", &pane]);
        if screen.contains(&want) {
            break;
        }
        assert!(Instant::now() < deadline, "no {want:?} on {screen}");
        c.call("ping", json!({}));
    }
    servers.tmux("omniconflux", &["send-keys", "-t", &pane, "-l", "typed"]);
    servers.tmux("omniconflux", &["send-keys", "-t", &pane, "Enter"]);
    loop {
        let screen = servers.tmux("omniconflux", &["capture-pane", "-p", "-t", &pane]);
        if screen.matches("typed").count() >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "cat did not echo: {screen}");
        c.call("ping", json!({}));
    }
    drop(c);
    drop(d);
}

/// The seed's answers on pane sessions that the review found missing: a
/// terminal.open right after the spawn that made its pane, a composite id
/// with the node's own prefix in sessions.focus, sessions.respond dropping
/// the answer (no agent waits on the node), session.rename refused with
/// the seed's texts, and a screen-read permission prompt as an
/// `interaction`.
#[test]
fn pane_sessions_take_the_seed_s_open_focus_respond_and_rename() {
    if !have_tmux() {
        return;
    }
    let mut r = rig("tmux-seed");
    let list = r.refresh_until("the fake agent", |l| find(l, "default:%0").is_some());
    let id = "default:%0";
    assert_eq!(find(&list, id).unwrap()["interaction"], Value::Null);
    let node = find(&list, id).unwrap()["node"]
        .as_str()
        .unwrap()
        .to_string();

    // The spawn's own pane is known to the very next call.
    let v = r.c.call("sessions.spawn", json!({"command": "sleep 300"}));
    let sid = v["session_id"].as_str().unwrap().to_string();
    let open = json!({"term_id": "t1", "session_id": sid, "cols": 80, "rows": 24});
    assert_eq!(r.c.call("terminal.open", open), Value::Null);
    assert_eq!(
        r.c.call("terminal.close", json!({"term_id": "t1"})),
        Value::Null
    );

    // sessions.focus takes `<node_id>:<session id>`.
    let composite = format!("{node}:{id}");
    assert_eq!(
        r.c.call("sessions.focus", json!({"session_id": composite})),
        Value::Null
    );
    let e = r.c.request(
        "sessions.focus",
        json!({"session_id": format!("{node}:default:%77")}),
    );
    assert_eq!(e["error"]["data"]["code"], "session-not-found", "{e}");

    // A permission prompt read from the screen is the interaction.
    r.c.call(
        "sessions.input",
        json!({"session_id": id, "text": "ask", "submit": true}),
    );
    r.screen_until(id, "Do you want to proceed?");
    let list = r.refresh_until("awaiting input", |l| {
        find(l, id).is_some_and(|s| s["status"] == "awaiting_input")
    });
    assert_eq!(
        find(&list, id).unwrap()["interaction"],
        json!({"kind": "permission", "message": "Do you want to proceed?"})
    );

    // sessions.respond: no agent waits on the node, so the answer is
    // dropped with success; the prompt stays for the keys to answer.
    let v = r.c.call(
        "sessions.respond",
        json!({"session_id": id, "behavior": "allow"}),
    );
    assert_eq!(v, Value::Null);
    let e = r.c.request(
        "sessions.respond",
        json!({"session_id": id, "behavior": "allow", "request_id": "x"}),
    );
    assert_eq!(e["error"]["data"]["code"], "not-pending", "{e}");
    let e = r.c.request(
        "sessions.respond",
        json!({"session_id": "default:%77", "behavior": "deny"}),
    );
    assert_eq!(e["error"]["data"]["code"], "session-not-found", "{e}");

    // session.rename: Claude Code renames only through the Argus plugin,
    // which a pane has not; other programs have no rename here.
    let e =
        r.c.request("session.rename", json!({"session_id": id, "name": "x"}));
    assert_eq!(e["error"]["code"], -32600, "{e}");
    assert_eq!(
        e["error"]["message"], "rename needs the Argus plugin connection",
        "{e}"
    );
    let e =
        r.c.request("session.rename", json!({"session_id": sid, "name": " y "}));
    let m = e["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.starts_with("rename unsupported for ") && m.ends_with(" sessions"),
        "{e}"
    );
    let e =
        r.c.request("session.rename", json!({"session_id": id, "name": " "}));
    assert_eq!(e["error"]["data"]["code"], "invalid-params", "{e}");
    let e = r.c.request(
        "session.rename",
        json!({"session_id": "default:%77", "name": "x"}),
    );
    assert_eq!(e["error"]["data"]["code"], "session-not-found", "{e}");
}
