//! The daemon foundation through the real binary (issue 2, "Tests"): bad
//! input on the socket, two daemons and stale sockets, config errors, clean
//! stops under traffic, kill -9 during writes, bounds, caller classes, the
//! read-only ledger and the command line's exit statuses.

mod util;

use serde_json::{Value, json};
use std::io::Write;
use util::{Daemon, Opts, TestDir, run_cli};

fn append(c: &mut util::Client, stream: &str, n: i64) -> Value {
    c.call(
        "events.append",
        json!({"stream": stream, "kind": "note", "data": {"n": n}}),
    )
}

#[test]
fn bad_input_gets_typed_answers_and_another_client_keeps_being_served() {
    let dir = TestDir::new("badinput");
    let d = Daemon::start(&dir.path);
    let mut other = d.connect();
    let mut bad = d.connect();
    let mut check =
        |bad: &mut util::Client, line: &[u8], want_rpc: i64, want_code: &str, want_id: Value| {
            bad.send_raw(line);
            bad.send_raw(b"\n");
            let r = bad.read_line().expect("an answer");
            assert_eq!(r["error"]["code"], json!(want_rpc), "{r}");
            assert_eq!(r["error"]["data"]["code"], json!(want_code), "{r}");
            assert_eq!(r["id"], want_id, "{r}");
            assert_eq!(other.call("ping", json!({})), Value::Null);
        };
    check(&mut bad, b"garbage", -32700, "parse-error", Value::Null);
    check(&mut bad, b"[1,2,3]", -32600, "invalid-request", Value::Null);
    check(
        &mut bad,
        b"\"just a string\"",
        -32600,
        "invalid-request",
        Value::Null,
    );
    check(
        &mut bad,
        br#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#,
        -32600,
        "invalid-request",
        json!(5),
    );
    check(
        &mut bad,
        br#"{"jsonrpc":"2.0","id":6,"method":"no.such"}"#,
        -32601,
        "method-not-found",
        json!(6),
    );
    check(
        &mut bad,
        br#"{"jsonrpc":"2.0","id":"s","method":"events.list","params":{"stream":5}}"#,
        -32602,
        "invalid-params",
        json!("s"),
    );
    check(
        &mut bad,
        br#"{"jsonrpc":"2.0","id":7,"method":"events.list","params":{"stream":"x-a","bogus":1}}"#,
        -32602,
        "invalid-params",
        json!(7),
    );
    check(
        &mut bad,
        br#"{"jsonrpc":"2.0","id":8,"method":"ping","params":[1]}"#,
        -32602,
        "invalid-params",
        json!(8),
    );
    bad.send_raw(b"\n");
    // Empty lines are skipped; the connection still answers after all that.
    bad.send_raw(b"\n\n   \n");
    assert_eq!(bad.call("ping", json!({})), Value::Null);

    // A truncated line followed by a close: nothing is answered, nothing breaks.
    let mut trunc = d.connect();
    trunc.send_raw(br#"{"jsonrpc":"2.0","id":1,"meth"#);
    trunc.stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(trunc.read_line().is_none());
    assert_eq!(other.call("ping", json!({})), Value::Null);

    // A line over 16 MiB closes that connection only.
    let mut huge = d.connect();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..17 {
        if huge.stream.write_all(&chunk).is_err() {
            break;
        }
    }
    assert!(huge.read_line().is_none(), "connection must be closed");
    assert_eq!(other.call("ping", json!({})), Value::Null);
    d.stop();
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused_and_a_stale_file_replaced() {
    let dir = TestDir::new("twodaemons");
    let d = Daemon::start(&dir.path);
    let second_dir = TestDir::new("twodaemons2");
    let out = std::process::Command::new(util::bin())
        .args([
            "--state-dir",
            &second_dir.join("state").display().to_string(),
            "--socket",
            &d.socket.display().to_string(),
            "--config",
            &second_dir.join("none.toml").display().to_string(),
            "serve",
        ])
        .env("XDG_CONFIG_HOME", second_dir.join("xdg-config"))
        .output()
        .unwrap();
    std::fs::write(second_dir.join("none.toml"), "").unwrap();
    // The config named by --config did not exist at first: usage error.
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(util::bin())
        .args([
            "--state-dir",
            &second_dir.join("state").display().to_string(),
            "--socket",
            &d.socket.display().to_string(),
            "--config",
            &second_dir.join("none.toml").display().to_string(),
            "serve",
        ])
        .env("XDG_CONFIG_HOME", second_dir.join("xdg-config"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("another daemon answers on"), "{err}");
    // The first daemon is untouched.
    assert_eq!(d.connect().call("ping", json!({})), Value::Null);
    let mut d = d;
    d.kill9();
    // kill -9 leaves the socket file behind; nobody answers on it.
    assert!(d.socket.exists());
    let d2 = Daemon::start(&dir.path);
    d2.wait_log("replacing stale socket file");
    assert_eq!(d2.connect().call("ping", json!({})), Value::Null);
    let socket = d2.socket.clone();
    assert!(d2.stop().success());
    assert!(!socket.exists(), "a clean stop removes the socket");
}

#[test]
fn socket_and_directory_modes_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TestDir::new("modes");
    let d = Daemon::start(&dir.path);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.socket), 0o600);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o700);
    // The state directory holds the ledger and the keys: 0700 whatever the
    // umask the daemon was started with.
    assert_eq!(mode(&d.state), 0o700);
    d.stop();
}

#[test]
fn bad_config_files_are_refused_naming_key_and_line() {
    let dir = TestDir::new("badconfig");
    let mut d = Daemon::spawn(
        &dir.path,
        Opts {
            config: Some("[daemon]\nlog_level = \"info\"\nfrobnicate = true\n".into()),
            ..Opts::default()
        },
    );
    let status = d.wait();
    assert_eq!(status.code(), Some(2));
    let log = d.log_text();
    assert!(log.contains("frobnicate") && log.contains(":3"), "{log}");

    let dir = TestDir::new("badtype");
    let mut d = Daemon::spawn(
        &dir.path,
        Opts {
            config: Some("[socket]\n\nmax_connections = \"lots\"\n".into()),
            ..Opts::default()
        },
    );
    assert_eq!(d.wait().code(), Some(2));
    assert!(d.log_text().contains(":3"), "{}", d.log_text());

    // config check says the same, and prints the effective config when good.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[daemon]\nlog_level = \"shouty\"\n").unwrap();
    let (code, _, err) = run_cli(&["config", "check", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("daemon.log_level") && err.contains(":2") && err.contains("expected one of"),
        "{err}"
    );
    let good = dir.join("good.toml");
    std::fs::write(&good, "[socket]\nmax_connections = 8\n").unwrap();
    let (code, out, err) = run_cli(&["config", "check", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("max_connections = 8") && out.contains("log_level = \"info\""),
        "{out}"
    );
}

#[test]
fn events_are_appended_listed_paged_and_followed() {
    let dir = TestDir::new("events");
    let d = Daemon::start(&dir.path);
    let mut sub = d.connect();
    sub.call("events.subscribe", json!({"streams": ["x-a"]}));
    let mut c = d.connect();
    for n in 1..=5 {
        assert_eq!(append(&mut c, "x-a", n)["seq"], json!(n));
    }
    append(&mut c, "x-b", 1);
    for n in 1..=5 {
        let ev = sub.next_note("event");
        assert_eq!(ev["params"]["seq"], json!(n));
        assert_eq!(ev["params"]["data"]["n"], json!(n));
        assert_eq!(ev["params"]["stream"], json!("x-a"));
    }
    let page = c.call(
        "events.list",
        json!({"stream": "x-a", "after_seq": 1, "limit": 2}),
    );
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_after_seq"], json!(3));
    let page = c.call("events.list", json!({"stream": "x-a", "after_seq": 3}));
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_after_seq"], Value::Null);
    assert_eq!(
        c.error_code(
            "events.append",
            json!({"stream": "session-x", "kind": "note"})
        ),
        "invalid-params"
    );
    let ts = page["events"][0]["ts"].as_str().unwrap();
    assert!(
        ts.len() == 24 && ts.ends_with('Z') && &ts[19..20] == ".",
        "{ts}"
    );
    let info = c.call("server.info", json!({}));
    assert_eq!(info["counts"]["events"], json!(6));
    assert_eq!(info["counts"]["streams"], json!(2));

    // The command line prints one JSON line per event.
    let sock = d.socket.display().to_string();
    let (code, out, err) = run_cli(&["--socket", &sock, "events", "--stream", "x-a"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[4]["seq"], json!(5));
    d.stop();
}

#[test]
fn the_caller_started_by_the_test_is_the_operator() {
    let dir = TestDir::new("operator");
    let d = Daemon::start(&dir.path);
    let info = d.connect().call("server.info", json!({}));
    assert_eq!(info["caller"]["class"], json!("operator"));
    assert_eq!(info["version"], json!(env!("CARGO_PKG_VERSION")));
    assert_eq!(info["instance_id"].as_str().unwrap().len(), 36);
    let (code, out, _) = run_cli(&["--socket", &d.socket.display().to_string(), "status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("operator") && out.contains("instance"),
        "{out}"
    );
    d.stop();
}

#[test]
fn client_exit_statuses() {
    let dir = TestDir::new("exits");
    let sock = dir.join("nobody.sock").display().to_string();
    let (code, _, err) = run_cli(&["--socket", &sock, "status"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.starts_with("omniconfluxd: no daemon answers on"),
        "{err}"
    );
    let (code, _, _) = run_cli(&["--socket", &sock, "frobnicate"]);
    assert_eq!(code, 2);
    let (code, _, _) = run_cli(&["--socket", &sock, "call", "ping", "not json"]);
    assert_eq!(code, 2);
    let d = Daemon::start(&dir.path);
    let sock = d.socket.display().to_string();
    let (code, out, _) = run_cli(&["--socket", &sock, "--json", "call", "ping"]);
    assert_eq!((code, out.trim()), (0, "null"));
    let (code, _, err) = run_cli(&["--socket", &sock, "call", "no.such.method"]);
    assert_eq!(code, 1);
    assert!(err.contains("method-not-found"), "{err}");
    let (code, _, err) = run_cli(&[
        "--socket",
        &sock,
        "call",
        "events.append",
        r#"{"stream":"bad","kind":"k"}"#,
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid-params"), "{err}");
    d.stop();
}

#[test]
fn sigterm_during_traffic_stops_cleanly_and_loses_nothing_acknowledged() {
    let dir = TestDir::new("sigterm");
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    // Pipeline many appends, then stop while they are in flight.
    let mut batch = String::new();
    for n in 1..=300 {
        batch.push_str(&format!("{}\n", json!({"jsonrpc": "2.0", "id": n, "method": "events.append", "params": {"stream": "x-t", "kind": "note", "data": {"n": n}}})));
    }
    c.send_raw(batch.as_bytes());
    let first = c.read_line().expect("first reply");
    assert!(first.get("result").is_some(), "{first}");
    d.signal(libc::SIGTERM);
    let mut acked = vec![first["result"]["seq"].as_i64().unwrap()];
    let mut refused = 0;
    while let Some(r) = c.read_line() {
        if let Some(seq) = r["result"]["seq"].as_i64() {
            acked.push(seq);
        } else {
            assert_eq!(r["error"]["data"]["code"], json!("shutting-down"), "{r}");
            refused += 1;
        }
    }
    let d = d.expect_notify("STOPPING=1");
    let socket = d.socket.clone();
    assert!(d.stop().success());
    assert!(!socket.exists());
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    let page = c.call("events.list", json!({"stream": "x-t", "limit": 1000}));
    let stored: Vec<i64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    for seq in &acked {
        assert!(stored.contains(seq), "acknowledged seq {seq} lost");
    }
    assert_eq!(
        stored,
        (1..=stored.len() as i64).collect::<Vec<_>>(),
        "seq without gaps"
    );
    assert!(acked.len() + refused <= 300);
    d.stop();
}

#[test]
fn kill_9_during_writes_then_restart_keeps_every_acknowledged_event_once() {
    let dir = TestDir::new("kill9");
    let mut d = Daemon::start(&dir.path);
    let mut c = d.connect();
    let mut batch = String::new();
    for n in 1..=2000 {
        batch.push_str(&format!("{}\n", json!({"jsonrpc": "2.0", "id": n, "method": "events.append", "params": {"stream": "x-k", "kind": "note", "data": {"n": n}}})));
    }
    let writer = {
        let mut s = c.stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = s.write_all(batch.as_bytes());
        })
    };
    // Kill once a good number were acknowledged, while more are in flight.
    let mut acked = std::collections::HashMap::new();
    while acked.len() < 200 {
        let r = c.read_line().expect("reply");
        acked.insert(
            r["result"]["seq"].as_i64().unwrap(),
            r["id"].as_i64().unwrap(),
        );
    }
    d.kill9();
    while let Some(r) = c.read_line() {
        if let Some(seq) = r["result"]["seq"].as_i64() {
            acked.insert(seq, r["id"].as_i64().unwrap());
        }
    }
    let _ = writer.join();
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    let mut stored = Vec::new();
    let mut after = 0;
    loop {
        let page = c.call(
            "events.list",
            json!({"stream": "x-k", "after_seq": after, "limit": 1000}),
        );
        for e in page["events"].as_array().unwrap() {
            stored.push((e["seq"].as_i64().unwrap(), e["data"]["n"].as_i64().unwrap()));
        }
        if page["next_after_seq"].is_null() {
            break;
        }
        after = page["next_after_seq"].as_i64().unwrap();
    }
    for (seq, id) in &acked {
        assert!(
            stored.contains(&(*seq, *id)),
            "acknowledged event {seq} (request {id}) lost or changed"
        );
    }
    let ns: std::collections::HashSet<i64> = stored.iter().map(|s| s.1).collect();
    assert_eq!(ns.len(), stored.len(), "an event was stored twice");
    let last = stored.len() as i64;
    assert_eq!(
        stored.iter().map(|s| s.0).collect::<Vec<_>>(),
        (1..=last).collect::<Vec<_>>()
    );
    // seq continues after the last one.
    assert_eq!(append(&mut c, "x-k", 0)["seq"], json!(last + 1));
    d.stop();
}

#[test]
fn a_client_that_does_not_read_is_disconnected_and_others_go_on() {
    let dir = TestDir::new("slow");
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some("[socket]\nmax_queued_bytes = 65536\n".into()),
            ..Opts::default()
        },
    );
    let mut stalled = d.connect();
    stalled.call("events.subscribe", json!({}));
    let mut writer = d.connect();
    let big = "y".repeat(4096);
    // Far more than 64 KiB of notifications while the subscriber reads nothing.
    for n in 0..200 {
        writer.call(
            "events.append",
            json!({"stream": "x-s", "kind": "note", "data": {"n": n, "pad": big}}),
        );
    }
    assert_eq!(writer.call("ping", json!({})), Value::Null);
    // The stalled reader finds some notifications, then the close.
    let mut seen = 0;
    while let Some(m) = stalled.read_line() {
        assert_eq!(m["method"], json!("event"));
        seen += 1;
    }
    assert!(
        seen < 200,
        "the slow reader should have been cut off, saw {seen}"
    );
    d.stop();
}

#[test]
fn connections_beyond_the_limit_are_refused_with_a_clear_error() {
    let dir = TestDir::new("connlimit");
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some("[socket]\nmax_connections = 2\n".into()),
            ..Opts::default()
        },
    );
    let mut a = d.connect();
    let mut b = d.connect();
    assert_eq!(a.call("ping", json!({})), Value::Null);
    assert_eq!(b.call("ping", json!({})), Value::Null);
    let mut c = d.connect();
    let r = c.read_line().expect("a refusal");
    assert_eq!(r["error"]["data"]["code"], json!("too-many-connections"));
    assert!(c.read_line().is_none());
    drop(a);
    // A freed slot is usable again; b was never disturbed.
    assert_eq!(b.call("ping", json!({})), Value::Null);
    d.stop();
}

#[test]
fn sighup_reloads_what_it_can_and_names_what_needs_a_restart() {
    let dir = TestDir::new("sighup");
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some("[daemon]\nlog_level = \"info\"\n".into()),
            ..Opts::default()
        },
    );
    std::fs::write(
        dir.join("omniconfluxd.toml"),
        "[daemon]\nlog_level = \"debug\"\nnode_name = \"other\"\n",
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    let line = d.wait_log("reloaded");
    assert!(
        line.contains("applied [daemon.log_level]")
            && line.contains("needs a restart [daemon.node_name]"),
        "{line}"
    );
    std::fs::write(dir.join("omniconfluxd.toml"), "[daemon]\nbogus = 1\n").unwrap();
    d.signal(libc::SIGHUP);
    let line = d.wait_log("unable to reload");
    assert!(line.contains("bogus"), "{line}");
    assert_eq!(d.connect().call("ping", json!({})), Value::Null);
    d.stop();
}

#[test]
fn an_untrusted_ledger_is_served_read_only() {
    let dir = TestDir::new("corrupt");
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(dir.join("state/ledger.sqlite3"), vec![0x5a; 8192]).unwrap();
    let d = Daemon::start(&dir.path);
    let line = d.wait_log("cannot be trusted");
    assert!(
        line.contains("ledger-corrupt") && line.contains("to recover"),
        "{line}"
    );
    let mut c = d.connect();
    assert_eq!(
        c.error_code("events.append", json!({"stream": "x-a", "kind": "note"})),
        "ledger-corrupt"
    );
    let info = c.call("server.info", json!({}));
    assert_eq!(info["ledger"]["state"], json!("read-only"));
    assert_eq!(c.call("ping", json!({})), Value::Null);
    d.stop();
    // The file is left as it was for the operator to recover.
    assert_eq!(
        std::fs::read(dir.join("state/ledger.sqlite3")).unwrap(),
        vec![0x5a; 8192]
    );
}

#[test]
fn server_stop_replies_first_then_stops() {
    let dir = TestDir::new("srvstop");
    let mut d = Daemon::start(&dir.path);
    let mut c = d.connect();
    assert_eq!(c.call("server.stop", json!({})), Value::Null);
    assert!(c.read_line().is_none());
    assert!(d.wait().success());
    assert!(!d.socket.exists());
}

#[test]
fn a_client_that_half_closes_still_gets_its_answers() {
    let dir = TestDir::new("halfclose");
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    c.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"server.info\"}\n");
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let first = c.read_line().expect("ping answer");
    assert_eq!(first["id"], json!(1));
    let second = c.read_line().expect("server.info answer");
    assert_eq!(second["result"]["caller"]["class"], json!("operator"));
    assert!(c.read_line().is_none(), "closed after the answers");
    d.stop();
}
