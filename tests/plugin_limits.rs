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

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use util::{Daemon, Opts, TestDir};

fn config(extra: &str) -> String {
    let py = if Path::new("/usr/bin/python3").exists() { "/usr/bin/python3" } else { "python3" };
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
    Daemon::start_with(&dir.path, Opts { config: Some(cfg), ..Opts::default() })
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
            {"id": "fill", "title": "Fill its input", "input": "text"},
            {"id": "notes", "title": "Notifications", "input": "text"},
        ],
    });
    std::fs::write(folder.join("omniconflux-plugin.json"), manifest.to_string()).unwrap();
    folder
}

/// Installs and approves the folder; returns the plugin id.
fn install_approve(c: &mut util::Client, folder: &Path) -> String {
    let inst = c.call("plugin.install", json!({"path": folder.display().to_string()}));
    let id = inst["plugin"].as_str().unwrap().to_string();
    let got = c.call("plugin.get", json!({"plugin": id}));
    let m = &got["waiting"]["manifest"];
    let mut perms: Vec<String> = m["permissions"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
    let order = ["events.read", "lists.read", "commands.add", "storage.own", "tasks.create"];
    perms.sort_by_key(|p| order.iter().position(|o| o == p));
    let cmds: Vec<Value> = m["commands"].as_array().cloned().unwrap_or_default().iter().map(|c| c["id"].clone()).collect();
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
    let mut out: Vec<(usize, Value)> = o.iter().map(|(k, v)| (k.parse().unwrap(), v.clone())).collect();
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
    let id = install_approve(&mut c, &limits_plugin(&dir, "limits-store", &["commands.add", "storage.own"]));
    d.wait_log("plugin limits-store is running");

    // A value is at most 16,384 characters, counted as characters: 16,384
    // two-byte characters are stored (32,768 bytes), one more is refused.
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "u", "value": "@e:16384"})), json!({"key": "u", "bytes": 32768}));
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "u", "value": "@e:16385"})), "!invalid-params");
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "u", "value": "@x:16385"})), "!invalid-params");
    assert_eq!(one(&mut c, &id, "storage.delete", json!({"key": "u"})), json!({"key": "u", "deleted": true}));

    // A key is a name, never a path.
    let bad = ["", "Upper", "../x", ".dot", "-dash", "a/b", "sp ace", &"k".repeat(65)];
    for key in bad {
        assert_eq!(one(&mut c, &id, "storage.set", json!({"key": key, "value": "v"})), "!invalid-params", "{key:?}");
        assert_eq!(one(&mut c, &id, "storage.get", json!({"key": key})), "!invalid-params", "{key:?}");
    }
    let longest = "k".repeat(64);
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": longest, "value": ""})), json!({"key": longest, "bytes": 0}));
    assert_eq!(one(&mut c, &id, "storage.delete", json!({"key": longest})), json!({"key": longest, "deleted": true}));

    // 1 MiB in all: 64 values of 16,384 bytes fill it exactly, one byte
    // more is refused with data.limit bytes, a replacement of the same size
    // is not.
    let got = calls(&mut c, &id, json!({"seq": [["storage.set", {"key": "b{i}", "value": "@x:16384"}, 64]], "window": 8}));
    assert!(got.iter().all(|a| a["bytes"] == 16384), "{got:?}");
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "z", "value": "x"})), "!quota-exceeded:bytes");
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "b0", "value": "@x:16385"})), "!invalid-params");
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "b0", "value": "@x:16384"})), json!({"key": "b0", "bytes": 16384}));
    // 128 keys: 64 empty ones more fill them, the 129th is refused with
    // data.limit keys; replacing a key's value is not a new key.
    let got = calls(&mut c, &id, json!({"seq": [["storage.set", {"key": "k{i}", "value": ""}, 64]], "window": 8}));
    assert!(got.iter().all(|a| a["bytes"] == 0), "{got:?}");
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "one-more", "value": ""})), "!quota-exceeded:keys");
    assert_eq!(one(&mut c, &id, "storage.list", json!({})), json!({"keys": 128, "bytes": 1_048_576}));
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(got["storage"], json!({"keys": 128, "bytes": 1_048_576}));

    // The value is on disk before the response: the daemon is killed the
    // moment the answer is back, and the next daemon has it.
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "k0", "value": "x"})), "!quota-exceeded:bytes");
    assert_eq!(one(&mut c, &id, "storage.set", json!({"key": "b0", "value": "survives"})), json!({"key": "b0", "bytes": 8}));
    d.kill9();
    let d = start(&dir, config(""));
    let mut c = d.connect();
    d.wait_log("plugin limits-store is running");
    assert_eq!(one(&mut c, &id, "storage.get", json!({"key": "b0"})), json!({"key": "b0", "value": "survives"}));
    assert_eq!(one(&mut c, &id, "storage.list", json!({})), json!({"keys": 128, "bytes": 1_048_576 - 16_384 + 8}));
    d.stop();
}
