//! plugins.json is written off the reactor (issue 11, "Blocking file work
//! runs on workers"), through the real binary: every answer to a method
//! that changed a plugin's record finds the change on disk already, many
//! changes in flight at once leave the last one on disk, and a write that
//! fails answers `unavailable` with the record kept in the running daemon
//! until a later write succeeds.
//!
//! Nothing here waits but for answers: the property under test is that an
//! answer is sent only after its write returned.

mod util;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use util::{Client, Daemon, Opts, TestDir};

fn start(dir: &TestDir) -> Daemon {
    Daemon::start_with(
        &dir.path,
        Opts {
            config: Some("[plugins]\nnode = \"node\"\npython = \"python3\"\n".into()),
            ..Opts::default()
        },
    )
}

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/plugins/sample-py")
}

/// Installs the sample plugin; its id and the install's answer.
fn install(c: &mut Client) -> (String, Value) {
    let inst = c.call(
        "plugin.install",
        json!({"path": sample().display().to_string()}),
    );
    (inst["plugin"].as_str().unwrap().to_string(), inst)
}

/// The record of `id` in plugins.json as it is on disk now.
fn on_disk(d: &Daemon, id: &str) -> Value {
    let text = std::fs::read_to_string(d.state.join("plugins/plugins.json")).unwrap();
    let file: Value = serde_json::from_str(&text).unwrap();
    file["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["plugin"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The names of the threads of process `pid`.
fn threads_of(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// Sends every request at once, then reads every answer; the results in
/// the order sent.
fn pipelined(c: &mut Client, calls: &[(&str, Value)]) -> Vec<Value> {
    let mut text = String::new();
    for (i, (method, params)) in calls.iter().enumerate() {
        let line = json!({"jsonrpc": "2.0", "id": 1000 + i, "method": method, "params": params});
        text.push_str(&format!("{line}\n"));
    }
    c.send_raw(text.as_bytes());
    let mut got: Vec<Value> = vec![Value::Null; calls.len()];
    let mut left = calls.len();
    while left > 0 {
        let msg = c.read_line().expect("the daemon closed the connection");
        let Some(id) = msg["id"].as_u64() else {
            continue;
        };
        got[(id - 1000) as usize] = msg;
        left -= 1;
    }
    got
}

#[test]
fn every_answer_finds_its_record_on_disk_and_the_last_change_wins() {
    let dir = TestDir::new("precords");
    let d = start(&dir);
    let mut c = d.connect();
    let (id, inst) = install(&mut c);
    let rec = on_disk(&d, &id);
    assert_eq!(
        rec["waiting"]["snapshotHash"], inst["snapshotHash"],
        "{rec}"
    );
    assert_eq!(rec["waiting"]["installedBy"], "operator", "{rec}");
    // The copy was made, and the record written, by the store's threads.
    let threads = threads_of(d.pid());
    for t in ["plugin-install", "plugin-records"] {
        assert!(threads.iter().any(|n| n == t), "{t} in {threads:?}");
    }

    // One at a time: each answer finds its own change on disk.
    for _ in 0..3 {
        let r = c.call("plugin.disable", json!({"plugin": id}));
        assert_eq!(r["enabled"], false, "{r}");
        assert_eq!(on_disk(&d, &id)["enabled"], false);
        let r = c.call("plugin.enable", json!({"plugin": id}));
        assert_eq!(r["enabled"], true, "{r}");
        assert_eq!(on_disk(&d, &id)["enabled"], true);
    }

    // Forty at once, ending with a disable: whatever the writes coalesced,
    // every answer is a success and the last change is the one on disk
    // once the last answer is in.
    let calls: Vec<(&str, Value)> = (0..40)
        .map(|i| {
            let m = if i % 2 == 0 {
                "plugin.enable"
            } else {
                "plugin.disable"
            };
            (m, json!({"plugin": id}))
        })
        .collect();
    for (i, r) in pipelined(&mut c, &calls).iter().enumerate() {
        assert_eq!(r["result"]["enabled"], i % 2 == 0, "{i}: {r}");
    }
    assert_eq!(on_disk(&d, &id)["enabled"], false);

    // The same folder again changes nothing and says so.
    let (_, again) = install(&mut c);
    assert_eq!(again["unchanged"], true, "{again}");
    assert_eq!(again["snapshotHash"], inst["snapshotHash"], "{again}");

    // A clean stop leaves the last state; the next daemon reads it.
    let state = d.state.clone();
    d.stop();
    let d = start(&dir);
    assert_eq!(d.state, state);
    let mut c = d.connect();
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(got["enabled"], false, "{got}");
    assert_eq!(
        got["waiting"]["snapshotHash"], inst["snapshotHash"],
        "{got}"
    );
    d.stop();
}

#[test]
fn a_record_that_cannot_be_written_is_unavailable_and_the_next_write_catches_up() {
    let dir = TestDir::new("precfail");
    let d = start(&dir);
    let mut c = d.connect();
    let (id, _) = install(&mut c);
    // A folder where the temporary file goes: the write fails whoever the
    // daemon runs as.
    let blocker = d.state.join("plugins/.plugins.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("keep"), b"").unwrap();
    let r = c.request("plugin.disable", json!({"plugin": id}));
    assert_eq!(r["error"]["data"]["code"], "unavailable", "{r}");
    assert_eq!(
        r["error"]["message"],
        "the plugin record could not be written; the log says why"
    );
    d.wait_log("unable to write ");
    assert_eq!(on_disk(&d, &id)["enabled"], true);
    // The change stands in the running daemon...
    let got = c.call("plugin.get", json!({"plugin": id}));
    assert_eq!(got["enabled"], false, "{got}");
    // ...and the next write that succeeds takes it with it.
    std::fs::remove_dir_all(&blocker).unwrap();
    let r = c.call("plugin.disable", json!({"plugin": id}));
    assert_eq!(r["enabled"], false, "{r}");
    assert_eq!(on_disk(&d, &id)["enabled"], false);
    d.stop();
}
