//! Sessions over HTTP through the real daemon with fake agents (issue 6,
//! phase 2): lost creation and input responses retried with their
//! original ids, changed intents and expired or future ids refused, a
//! full queue that stays rejected, a watch attached during a turn that
//! replays, resets on an evicted or old cursor and survives a restart with
//! its history, a stalled collection reader beside a live one, and an
//! agent holding the token refused an operator-only operation. Every
//! reply and every decoded SSE batch is validated against openapi.yaml.

mod util;

use serde_json::{Value, json};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use util::http::{Conn, Resp, Watch, check_reply, openapi, request, response_schema, validate};
use util::{Daemon, Opts, TestDir, fixture};

/// A stream-json fake agent seat playing `script`.
fn seat(script: &Value, env: &[(&str, &str)]) -> String {
    let mut env_s = format!("FAKE_SCRIPT = '{script}'");
    for (k, v) in env {
        env_s.push_str(&format!(", {k} = '{v}'"));
    }
    format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"stream-json\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ {env_s} }}\n\n",
        fixture("fake_stream_json_agent.py")
    )
}

/// A UUIDv7 minted `ms` milliseconds from now, distinct by `n`.
fn uuid7(ms: i64, n: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let t = (now + ms) as u64;
    format!(
        "{:08x}-{:04x}-7{:03x}-8{:03x}-{:012x}",
        t >> 16,
        t & 0xffff,
        n & 0xfff,
        (n >> 12) & 0xfff,
        (n.wrapping_mul(2654435761)) & 0xffff_ffff_ffff
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Api {
    d: Daemon,
    addr: SocketAddr,
    token: String,
    doc: Value,
    wt: String,
}

impl Api {
    fn start(dir: &TestDir, config: &str, port: u16) -> Api {
        let wt = dir.join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        let config = format!(
            "[http]\ntoken_file = \"{}\"\n\n{config}",
            dir.join("token").display()
        );
        let d = Daemon::start_with(
            &dir.path,
            Opts {
                config: Some(config),
                extra_args: vec!["--http".into(), format!("127.0.0.1:{port}")],
                ..Opts::default()
            },
        );
        let line = d.wait_log("serving HTTP on ");
        let addr: SocketAddr = line
            .split("serving HTTP on ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|a| a.parse().ok())
            .expect("address in log");
        let token = std::fs::read_to_string(dir.join("token"))
            .expect("token file")
            .trim()
            .to_string();
        Api {
            d,
            addr,
            token,
            doc: openapi(),
            wt: wt.canonicalize().unwrap().display().to_string(),
        }
    }

    fn send(
        &self,
        method: &str,
        target: &str,
        extra: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Resp {
        let auth = format!("Bearer {}", self.token);
        let mut headers = vec![("Authorization", auth.as_str())];
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        headers.extend_from_slice(extra);
        let text = body.map(|b| b.to_string());
        let mut c = Conn::open(self.addr);
        c.send(&request(
            method,
            target,
            &self.addr.to_string(),
            &headers,
            text.as_deref().map(str::as_bytes),
        ));
        c.read().expect("an answer")
    }

    /// Sends and checks the reply against the document's `path` template.
    fn call(
        &self,
        method: &str,
        target: &str,
        template: &str,
        extra: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Resp {
        let r = self.send(method, target, extra, body);
        check_reply(&self.doc, template, &method.to_lowercase(), &r);
        r
    }

    fn create(&self, id: &str, body: &Value) -> Resp {
        self.call(
            "PUT",
            &format!("/sessions/{id}"),
            "/sessions/{session_id}",
            &[("If-None-Match", "*")],
            Some(body),
        )
    }

    fn input(&self, sid: &str, iid: &str, body: &Value) -> Resp {
        self.call(
            "PUT",
            &format!("/sessions/{sid}/inputs/{iid}"),
            "/sessions/{session_id}/inputs/{input_id}",
            &[],
            Some(body),
        )
    }

    fn watch(&self, target: &str) -> Watch {
        let mut c = Conn::open(self.addr);
        let auth = format!("Bearer {}", self.token);
        c.send(&request(
            "GET",
            target,
            &self.addr.to_string(),
            &[("Authorization", &auth), ("Accept", "text/event-stream")],
            None,
        ));
        let (status, headers) = c.read_head().expect("a watch head");
        assert_eq!(status, 200, "{headers:?}");
        Watch::new(c)
    }

    fn batch(&self, w: &mut Watch, template: &str) -> Value {
        let b = w.next().expect("a batch");
        let schema = response_schema(&self.doc, template, "get", 200, "text/event-stream");
        if let Err(e) = validate(&self.doc, schema, &b, "$") {
            panic!("SSE batch does not match openapi.yaml: {e}\n{b}");
        }
        b
    }

    /// Reads session batches until `pred` holds for an event; returns the
    /// last batch's cursor.
    fn until(&self, w: &mut Watch, pred: impl Fn(&Value) -> bool) -> (String, u64) {
        loop {
            let b = self.batch(w, "/sessions/{session_id}");
            let hit = b["events"].as_array().unwrap().iter().any(&pred);
            if hit {
                return (
                    b["generation"].as_str().unwrap().to_string(),
                    b["cursor"].as_u64().unwrap(),
                );
            }
        }
    }
}

fn is(kind: &'static str) -> impl Fn(&Value) -> bool {
    move |e: &Value| e["type"] == kind
}

#[test]
fn lost_responses_retry_with_their_ids_and_changed_intents_conflict() {
    let dir = TestDir::new("hscreate");
    let api = Api::start(&dir, &seat(&json!([]), &[]), 0);
    let cid = uuid7(0, 1);
    let body = json!({"harness": "fake", "worktree": api.wt, "name": "first"});
    let first = api.create(&cid, &body);
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let sid = first.json()["id"].as_str().unwrap().to_string();
    assert!(sid.starts_with("s-"));
    assert_eq!(
        first.header("location"),
        Some(format!("/sessions/{sid}").as_str())
    );
    assert!(first.header("etag").is_some_and(|t| t.starts_with('"')));
    // The response was lost: the same PUT finds the session made, so its
    // If-None-Match: * fails (412); the read at the UUIDv7 proves it.
    let again = api.create(&cid, &body);
    assert_eq!(
        (again.status, again.code().as_str()),
        (412, "precondition_failed")
    );
    let changed = api.create(
        &cid,
        &json!({"harness": "fake", "worktree": api.wt, "name": "other"}),
    );
    assert_eq!(
        (changed.status, changed.code().as_str()),
        (409, "identity_conflict")
    );
    let old = api.create(&uuid7(-8 * 24 * 3600 * 1000, 2), &body);
    assert_eq!((old.status, old.code().as_str()), (410, "identity_expired"));
    let ahead = api.create(&uuid7(10 * 60 * 1000, 3), &body);
    assert_eq!(
        (ahead.status, ahead.code().as_str()),
        (400, "identity_future")
    );
    let bare = api.send(
        "PUT",
        &format!("/sessions/{}", uuid7(0, 4)),
        &[],
        Some(&body),
    );
    assert_eq!(bare.status, 428);
    // The creation's UUIDv7 names the session too.
    let by_uuid = api.call(
        "GET",
        &format!("/sessions/{cid}"),
        "/sessions/{session_id}",
        &[],
        None,
    );
    assert_eq!(by_uuid.json()["id"], json!(sid));
    assert_eq!(by_uuid.json()["creation"]["submitted"]["name"], "first");
    // Issue 10, item 27: the JSON read gives the cursor a first watch
    // resumes from, before any watch attached.
    let cursor = by_uuid.json()["cursor"].clone();
    let (generation, after) = (
        cursor["generation"].as_str().expect("a cursor").to_string(),
        cursor["sequence"].as_u64().expect("a sequence"),
    );
    let mut resumed = api.watch(&format!(
        "/sessions/{sid}?after_generation={generation}&after_seq={after}"
    ));

    let mut w = api.watch(&format!("/sessions/{sid}"));
    let reset = api.batch(&mut w, "/sessions/{session_id}");
    assert_eq!(reset["events"][0]["data"]["reason"], "initial");
    let iid = uuid7(0, 10);
    let msg = json!({"kind": "message", "text": "hello"});
    let r = api.input(&sid, &iid, &msg);
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["admission"]["state"], "accepted");
    assert_eq!(r.json()["acceptance_order"], 1);
    // Lost 202: the same PUT, the same decision; echo-only client_id too.
    let again = api.input(
        &sid,
        &iid,
        &json!({"kind": "message", "text": "hello", "client_id": "c1"}),
    );
    assert_eq!(
        (again.status, again.json()["acceptance_order"].clone()),
        (202, json!(1))
    );
    let changed = api.input(&sid, &iid, &json!({"kind": "message", "text": "bye"}));
    assert_eq!(
        (changed.status, changed.code().as_str()),
        (409, "input_conflict")
    );
    api.until(&mut w, |e| {
        e["type"] == "turn_completed" && e["data"]["input_ids"][0] == json!(iid)
    });
    // The watch seeded from the JSON read replayed from there: no reset,
    // its first event the one after the read's cursor.
    let b = loop {
        let b = api.batch(&mut resumed, "/sessions/{session_id}");
        if !b["events"].as_array().unwrap().is_empty() {
            break b;
        }
    };
    assert_eq!(b["generation"], json!(generation));
    assert_ne!(b["events"][0]["type"], "reset", "{b}");
    assert_eq!(b["events"][0]["sequence"], after + 1);
    drop(resumed);
    let got = api.call(
        "GET",
        &format!("/sessions/{sid}/inputs/{iid}"),
        "/sessions/{session_id}/inputs/{input_id}",
        &[],
        None,
    );
    assert_eq!(got.json()["delivery"], "committed");
    assert_eq!(got.json()["turn"]["outcome"], "completed");
    let h = api.call(
        "GET",
        &format!("/sessions/{sid}/history"),
        "/sessions/{session_id}/history",
        &[],
        None,
    );
    let texts: Vec<String> = h.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["text"].as_str().map(str::to_string))
        .collect();
    assert!(texts.iter().any(|t| t.contains("echo: hello")), "{texts:?}");
    // Item 28: a conditional end needs the Session's current ETag.
    let stale = api.call(
        "DELETE",
        &format!("/sessions/{sid}"),
        "/sessions/{session_id}",
        &[("If-Match", "\"nope\"")],
        None,
    );
    assert_eq!(
        (stale.status, stale.code().as_str()),
        (412, "precondition_failed")
    );
    let put_if_match = api.call(
        "POST",
        &format!("/sessions/{sid}/interrupt"),
        "/sessions/{session_id}/interrupt",
        &[("If-Match", "*")],
        Some(&json!({"run_id": "r1"})),
    );
    assert_eq!(put_if_match.status, 400, "not evaluated, so refused");
    // Stopping keeps the record and the decisions. The session may still
    // change between the read and the end (its status settling): read
    // again until the end finds what was read.
    let deadline = std::time::Instant::now() + util::PATIENCE;
    let del = loop {
        let read = api.call(
            "GET",
            &format!("/sessions/{sid}"),
            "/sessions/{session_id}",
            &[],
            None,
        );
        let tag = read.header("etag").expect("an ETag").to_string();
        let del = api.call(
            "DELETE",
            &format!("/sessions/{sid}"),
            "/sessions/{session_id}",
            &[("If-Match", &tag)],
            None,
        );
        if del.status != 412 || std::time::Instant::now() > deadline {
            break del;
        }
    };
    assert_eq!(del.status, 200);
    api.until(&mut w, |e| {
        e["type"] == "status" && e["data"]["phase"] == "ended"
    });
    let got = api.call(
        "GET",
        &format!("/sessions/{sid}/inputs/{iid}"),
        "/sessions/{session_id}/inputs/{input_id}",
        &[],
        None,
    );
    assert_eq!(got.status, 200);
    let list = api.call("GET", "/sessions?state=ended", "/sessions", &[], None);
    assert_eq!(list.json()["items"][0]["id"], json!(sid));
    let storage = api.call("GET", "/storage", "/storage", &[], None);
    assert!(
        storage.json()["sessions"]["items"][0]["transcript_entries"]
            .as_u64()
            .unwrap()
            >= 2
    );
    api.d.stop();
}

#[test]
fn a_full_queue_stays_rejected_and_interrupt_takes_exactly_its_run() {
    let dir = TestDir::new("hsqueue");
    let api = Api::start(&dir, &seat(&json!([[{"stall": 60}]]), &[]), 0);
    let created = api.create(
        &uuid7(0, 1),
        &json!({"harness": "fake", "worktree": api.wt, "prompt": "wait"}),
    );
    let sid = created.json()["id"].as_str().unwrap().to_string();
    let mut w = api.watch(&format!("/sessions/{sid}"));
    api.until(&mut w, |e| {
        e["type"] == "status" && e["data"]["phase"] == "running"
    });
    let ids: Vec<String> = (0..33).map(|n| uuid7(0, 100 + n)).collect();
    for (n, id) in ids.iter().take(32).enumerate() {
        let r = api.input(
            &sid,
            id,
            &json!({"kind": "message", "text": format!("m{n}")}),
        );
        assert_eq!(r.status, 202);
    }
    let full = api.input(&sid, &ids[32], &json!({"kind": "message", "text": "m32"}));
    assert_eq!((full.status, full.code().as_str()), (429, "queue_full"));
    assert!(full.header("retry-after").is_some(), "{:?}", full.headers);
    let cancel = api.call(
        "POST",
        &format!("/sessions/{sid}/inputs/{}/cancel", ids[0]),
        "/sessions/{session_id}/inputs/{input_id}/cancel",
        &[],
        Some(&json!({})),
    );
    assert_eq!(cancel.json()["result"], "cancelled");
    // Capacity cleared; the rejected decision stays rejected.
    let again = api.input(&sid, &ids[32], &json!({"kind": "message", "text": "m32"}));
    assert_eq!((again.status, again.code().as_str()), (429, "queue_full"));
    assert!(again.header("retry-after").is_some());
    let s = api
        .call(
            "GET",
            &format!("/sessions/{sid}"),
            "/sessions/{session_id}",
            &[],
            None,
        )
        .json();
    let run = s["status"]["run_id"].clone();
    assert_eq!(s["pending_inputs"].as_array().unwrap().len(), 31);
    // A stale run id interrupts nothing; the captured one is interrupted,
    // and waiting inputs through order 5 are cancelled.
    let stale = api.call(
        "POST",
        &format!("/sessions/{sid}/interrupt"),
        "/sessions/{session_id}/interrupt",
        &[],
        Some(&json!({"run_id": "r999", "through_input_order": 0})),
    );
    assert_eq!(stale.json()["state"], "already_ended");
    let r = api.call(
        "POST",
        &format!("/sessions/{sid}/interrupt"),
        "/sessions/{session_id}/interrupt",
        &[],
        Some(&json!({"run_id": run, "through_input_order": 5})),
    );
    assert_eq!(r.json()["state"], "requested");
    assert_eq!(r.json()["cancelled_input_ids"].as_array().unwrap().len(), 4);
    // The next waiting input (order 6) runs after the interrupted turn.
    api.until(&mut w, |e| {
        e["type"] == "input"
            && e["data"]["input"]["acceptance_order"] == 6
            && e["data"]["input"]["delivery"] == "committed"
    });
    api.d.stop();
}

#[test]
fn watches_replay_reset_and_survive_a_restart_with_history() {
    let dir = TestDir::new("hswatch");
    let port = free_port();
    let long: Vec<Value> = (0..300)
        .map(|i| json!({"text": format!("chunk {i} ")}))
        .collect();
    let script = json!([[{"text": "a"}, {"stall": 60}], long]);
    let api = Api::start(&dir, &seat(&script, &[]), port);
    let sid = api
        .create(
            &uuid7(0, 1),
            &json!({"harness": "fake", "worktree": api.wt, "prompt": "go"}),
        )
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Attach during the turn: a reset with the snapshot, then live events.
    let mut w = api.watch(&format!("/sessions/{sid}"));
    let first = api.batch(&mut w, "/sessions/{session_id}");
    assert_eq!(first["events"][0]["type"], "reset");
    assert_eq!(first["snapshot"]["id"], json!(sid));
    let (generation, cursor) = api.until(&mut w, |e| {
        e["type"] == "status" && e["data"]["phase"] == "running"
    });
    drop(w);
    // Reconnect from the cursor: replay, no reset.
    let mut w = api.watch(&format!(
        "/sessions/{sid}?after_generation={generation}&after_seq={}",
        cursor.saturating_sub(1)
    ));
    let b = api.batch(&mut w, "/sessions/{session_id}");
    assert_ne!(b["events"][0]["type"], "reset", "{b}");
    assert_eq!(b["events"][0]["sequence"], cursor);
    // Interrupt, then a longer turn; a cursor the buffer cannot serve (here
    // one from the future; eviction is sse.rs's unit test) resets.
    let run = api
        .call(
            "GET",
            &format!("/sessions/{sid}"),
            "/sessions/{session_id}",
            &[],
            None,
        )
        .json()["status"]["run_id"]
        .clone();
    api.call(
        "POST",
        &format!("/sessions/{sid}/interrupt"),
        "/sessions/{session_id}/interrupt",
        &[],
        Some(&json!({"run_id": run, "through_input_order": 0})),
    );
    let iid = uuid7(0, 2);
    api.input(&sid, &iid, &json!({"kind": "message", "text": "long"}));
    api.until(&mut w, |e| {
        e["type"] == "turn_completed" && e["data"]["input_ids"][0] == json!(iid)
    });
    drop(w);
    let mut w = api.watch(&format!(
        "/sessions/{sid}?after_generation={generation}&after_seq={}",
        cursor + 1000
    ));
    let b = api.batch(&mut w, "/sessions/{session_id}");
    assert_eq!(
        b["events"][0]["data"]["reason"], "replay_unavailable",
        "{b}"
    );
    let (generation, cursor) = (
        b["generation"].as_str().unwrap().to_string(),
        b["cursor"].as_u64().unwrap(),
    );
    drop(w);
    let entries_before = api
        .call(
            "GET",
            &format!("/sessions/{sid}/history?limit=200"),
            "/sessions/{session_id}/history",
            &[],
            None,
        )
        .json()["high_water"]
        .clone();
    // Restart: committed history survives; the old cursor resets.
    let Api { d, .. } = api;
    d.stop();
    let api = Api::start(&dir, &seat(&script, &[]), port);
    let h = api
        .call(
            "GET",
            &format!("/sessions/{sid}/history"),
            "/sessions/{session_id}/history",
            &[],
            None,
        )
        .json();
    assert!(
        h["high_water"].as_u64().unwrap() >= entries_before.as_u64().unwrap(),
        "{h}"
    );
    let older = api
        .call(
            "GET",
            &format!("/sessions/{sid}/history?before={}&limit=5", h["high_water"]),
            "/sessions/{session_id}/history",
            &[],
            None,
        )
        .json();
    assert_eq!(older["items"].as_array().unwrap().len(), 5);
    assert!(older["older"].is_u64(), "{older}");
    let got = api.call(
        "GET",
        &format!("/sessions/{sid}/inputs/{iid}"),
        "/sessions/{session_id}/inputs/{input_id}",
        &[],
        None,
    );
    assert_eq!(got.json()["turn"]["outcome"], "completed");
    let mut w = loop {
        // The session is live again once the daemon has reopened it.
        let r = api.send("GET", &format!("/sessions/{sid}"), &[], None);
        if r.json()["state"] != "starting" && r.json()["state"] != "ended" {
            break api.watch(&format!(
                "/sessions/{sid}?after_generation={generation}&after_seq={cursor}"
            ));
        }
        api.d.wait_log("reopened");
    };
    let b = api.batch(&mut w, "/sessions/{session_id}");
    assert_eq!(
        b["events"][0]["data"]["reason"], "generation_changed",
        "{b}"
    );
    api.d.stop();
}

/// A growing reply reaches a watcher as appended `text` pieces, each
/// starting where the previous one ended, and once whole as `message`:
/// the bytes a watcher gets grow with the reply, not with its square.
#[test]
fn growing_text_is_sent_as_appended_pieces_then_once_whole() {
    let dir = TestDir::new("hsgrow");
    let port = free_port();
    let mut long = vec![
        json!({"think": "plan"}),
        json!({"text": "héllo "}),
        json!({"stall": 0.05}),
    ];
    for i in 0..200 {
        long.push(json!({"text": format!("chunk {i} ")}));
        if i % 40 == 0 {
            long.push(json!({"stall": 0.02}));
        }
    }
    long.push(
        json!({"tool": {"id": "t1", "name": "Read", "input": {"file_path": "x"}, "output": "ok"}}),
    );
    long.push(json!({"text": "done"}));
    let script = json!([[{"text": "ready"}], long]);
    let api = Api::start(&dir, &seat(&script, &[]), port);
    let sid = api
        .create(
            &uuid7(0, 1),
            &json!({"harness": "fake", "worktree": api.wt, "prompt": "go"}),
        )
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = api.watch(&format!("/sessions/{sid}"));
    let first = api.batch(&mut w, "/sessions/{session_id}");
    assert_eq!(first["events"][0]["type"], "reset");
    let mut texts: std::collections::HashMap<String, String> =
        first["snapshot"]["history"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["id"].as_str().unwrap().to_string(),
                    e["text"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
    let iid = uuid7(0, 2);
    api.input(&sid, &iid, &json!({"kind": "message", "text": "long"}));
    let mut messages: std::collections::HashMap<String, usize> = Default::default();
    let mut appended_bytes = 0;
    // Read until the turn is over and the watcher has every entry history
    // has (turn_completed may precede the last round's entries).
    let (mut done, mut committed, mut want) = (false, 0, u64::MAX);
    while !done || committed < want {
        if done && want == u64::MAX {
            let h = api
                .call(
                    "GET",
                    &format!("/sessions/{sid}/history?limit=1"),
                    "/sessions/{session_id}/history",
                    &[],
                    None,
                )
                .json();
            want = h["high_water"].as_u64().unwrap();
            continue;
        }
        let b = api.batch(&mut w, "/sessions/{session_id}");
        for e in b["events"].as_array().unwrap() {
            match e["type"].as_str().unwrap() {
                "text" | "thinking" => {
                    let id = e["data"]["message_id"].as_str().unwrap().to_string();
                    let have = texts.entry(id.clone()).or_default();
                    assert_eq!(
                        e["data"]["offset"].as_u64().unwrap() as usize,
                        have.len(),
                        "{id} continues where it stopped: {e}"
                    );
                    let piece = e["data"]["text"].as_str().unwrap();
                    appended_bytes += piece.len();
                    have.push_str(piece);
                }
                "message" => {
                    let entry = &e["data"]["entry"];
                    let id = entry["id"].as_str().unwrap().to_string();
                    if let Some(t) = entry["text"].as_str() {
                        if let Some(have) = texts.get(&id) {
                            // The whole entry replaces its pieces; a round
                            // that completes it may also have grown it.
                            assert!(
                                t.starts_with(have.as_str()),
                                "the whole {id} continues what its pieces made:\n{have}\n{t}"
                            );
                        }
                        texts.insert(id.clone(), t.to_string());
                    }
                    *messages.entry(id).or_default() += 1;
                }
                "turn_completed" if e["data"]["input_ids"][0] == json!(iid) => done = true,
                "committed" => committed = e["data"]["high_water"].as_u64().unwrap(),
                _ => {}
            }
        }
    }
    let h = api
        .call(
            "GET",
            &format!("/sessions/{sid}/history?limit=200"),
            "/sessions/{session_id}/history",
            &[],
            None,
        )
        .json();
    let mut long_id = None;
    for e in h["items"].as_array().unwrap() {
        let id = e["id"].as_str().unwrap();
        if let Some(t) = e["text"].as_str() {
            if e["kind"] == "text" || e["kind"] == "thinking" {
                assert_eq!(
                    texts.get(id).map(String::as_str),
                    Some(t),
                    "the watcher holds {id} as history does"
                );
            }
            if t.starts_with("héllo chunk 0") {
                long_id = Some(id.to_string());
            }
        }
    }
    let long_id = long_id.expect("the long reply in history");
    assert_eq!(
        messages.get(&long_id),
        Some(&1),
        "the long reply goes out whole once: {messages:?}"
    );
    let long_len = texts[&long_id].len();
    assert!(
        appended_bytes < 2 * long_len + 64,
        "appended {appended_bytes} bytes for a reply of {long_len}"
    );
    api.d.stop();
}

#[test]
fn a_stalled_collection_reader_does_not_hold_back_a_live_one() {
    let dir = TestDir::new("hsstall");
    let many: Vec<Value> = (0..200)
        .map(|i| json!({"text": format!("{i} {}", "x".repeat(200))}))
        .collect();
    let api = Api::start(&dir, &seat(&json!([many]), &[]), 0);
    // The stalled one: subscribed, never read.
    let stalled = api.watch("/sessions");
    let mut live = api.watch("/sessions");
    let b = api.batch(&mut live, "/sessions");
    assert_eq!(
        (
            b["events"][0]["type"].clone(),
            b["events"][1]["type"].clone()
        ),
        (json!("ready"), json!("reset"))
    );
    let sids: Vec<String> = (0..4)
        .map(|n| {
            api.create(
                &uuid7(0, n),
                &json!({"harness": "fake", "worktree": api.wt, "prompt": "go"}),
            )
            .json()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut idle = std::collections::HashSet::new();
    while idle.len() < sids.len() {
        let b = api.batch(&mut live, "/sessions");
        for e in b["events"].as_array().unwrap() {
            if e["type"] == "activity"
                && e["data"]["status"]["phase"] == "idle"
                && e["data"]["activity"]["lines"]
                    .as_array()
                    .is_some_and(|l| !l.is_empty())
            {
                idle.insert(e["data"]["session_id"].as_str().unwrap().to_string());
            }
            assert_ne!(e["type"], "overflow");
        }
    }
    let list = api
        .call(
            "GET",
            "/sessions?harness=fake&limit=2",
            "/sessions",
            &[],
            None,
        )
        .json();
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert!(list["next"].is_string());
    drop(stalled);
    api.d.stop();
}

#[test]
fn an_agent_holding_the_token_cannot_answer_its_own_approval() {
    let dir = TestDir::new("hsagent");
    let port = free_port();
    let token = dir.join("token").display().to_string();
    let addr = format!("127.0.0.1:{port}");
    let script = json!([[
        {"permission": {"id": "c1", "name": "Bash", "input": {"command": "curl evil"}, "description": "d"}}
    ]]);
    let helper = fixture("http_answer_own_approval.py");
    let mut cfg = seat(
        &script,
        &[("OMNI_HTTP", &addr), ("OMNI_TOKEN_FILE", &token)],
    );
    // Uncontained: the namespace would hide the token (tests/containment.rs);
    // here what the token alone allows an agent is tested.
    cfg = format!("[agents]\nisolation = \"none\"\n\n{cfg}");
    // The agent's first step runs the helper, which holds the token.
    cfg = cfg.replace(
        "FAKE_SCRIPT = '[[",
        &format!("FAKE_SCRIPT = '[[{{\"spawn\": [\"python3\", \"{helper}\"]}}, "),
    );
    let api = Api::start(&dir, &cfg, port);
    let sid = api
        .create(
            &uuid7(0, 1),
            &json!({"harness": "fake", "worktree": api.wt, "prompt": "go"}),
        )
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let line = api
        .d
        .wait_log("refused HTTP POST /approvals/{approval_id}/answer");
    assert!(line.contains("agent-session"), "{line}");
    let id = format!("{sid}-a1");
    let mut w = api.watch(&format!("/sessions/{sid}"));
    loop {
        let b = api.batch(&mut w, "/sessions/{session_id}");
        let waiting = |st: &Value| st["phase"] == "awaiting_approval";
        if waiting(&b["snapshot"]["status"])
            || b["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["type"] == "status" && waiting(&e["data"]))
        {
            break;
        }
    }
    let a = api.call(
        "GET",
        &format!("/approvals/{id}"),
        "/approvals/{approval_id}",
        &[],
        None,
    );
    assert_eq!(a.json()["state"], "pending");
    // The exact command, not only the model's description (issue 10, 12).
    assert_eq!(
        a.json()["target"],
        json!({"kind": "command", "text": "curl evil", "truncated": false})
    );
    let list = api.call("GET", "/approvals", "/approvals", &[], None);
    assert_eq!(list.json()["items"][0]["request_id"], json!(id));
    assert_eq!(list.json()["items"][0]["target"]["text"], "curl evil");
    let r = api.call(
        "POST",
        &format!("/approvals/{id}/answer"),
        "/approvals/{approval_id}/answer",
        &[],
        Some(&json!({"decision": "allow"})),
    );
    assert_eq!(
        (r.status, r.json()["surface"].clone()),
        (200, json!("http"))
    );
    api.until(&mut w, is("turn_completed"));
    let seats = api.call("GET", "/seats", "/seats", &[], None);
    assert_eq!(seats.json()["items"][0]["harness"], "fake");
    let plugins = api.call("GET", "/plugins", "/plugins", &[], None);
    assert_eq!(plugins.status, 200);
    api.d.stop();
}

#[test]
fn an_agent_holding_the_token_reads_only_its_own_session() {
    let dir = TestDir::new("hsread");
    let port = free_port();
    let token = dir.join("token").display().to_string();
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let addr = format!("127.0.0.1:{port}");
    let helper = fixture("http_read_sessions.py");
    let script = json!([[{"spawn": ["python3", helper]}]]);
    let out_s = out.display().to_string();
    let cfg = seat(
        &script,
        &[
            ("OMNI_HTTP", &addr),
            ("OMNI_TOKEN_FILE", &token),
            ("OMNI_OUT", &out_s),
        ],
    );
    // Uncontained, as above: the token must be readable for this test.
    let cfg = format!("[agents]\nisolation = \"none\"\n\n{cfg}");
    let api = Api::start(&dir, &cfg, port);
    let body = json!({"harness": "fake", "worktree": api.wt, "prompt": "go"});
    let a = api.create(&uuid7(0, 1), &body).json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = api.create(&uuid7(0, 2), &body).json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The operator reads both.
    let all = api.call("GET", "/sessions", "/sessions", &[], None).json();
    assert_eq!(all["items"].as_array().unwrap().len(), 2, "{all}");
    // The helper says it is done through a FIFO; reading it blocks until
    // then, on a thread so that the test's patience bounds the wait.
    let fifo = out.join("done.fifo");
    let c_path = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    // SAFETY: a valid NUL-terminated path and a plain mode.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let want = a.clone();
    std::thread::spawn(move || {
        // Both sessions run the helper; each names itself when it is done.
        loop {
            match std::fs::read_to_string(&fifo) {
                Ok(text) if text.lines().any(|l| l == want) => break,
                Ok(_) => {}
                Err(_) => return,
            }
        }
        let _ = tx.send(());
    });
    std::fs::write(out.join("probe"), &b).unwrap();
    rx.recv_timeout(util::PATIENCE)
        .expect("the agent's helper finished");
    let file = out.join(format!("{a}.json"));
    let got: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(got["list"]["status"], 200, "{got}");
    let ids: Vec<&str> = got["list"]["body"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![a.as_str()], "{got}");
    assert_eq!(got["own"]["status"], 200, "{got}");
    assert_eq!(
        (
            got["other"]["status"].clone(),
            got["other"]["body"]["code"].clone()
        ),
        (json!(404), json!("not_found")),
        "{got}"
    );
    assert_eq!(got["other_history"]["status"], 404, "{got}");
    api.d.stop();
}

/// Opens a session watch on a new connection: its status, and the
/// connection when it was accepted.
fn try_watch(addr: SocketAddr, token: &str, sid: &str) -> (u16, Option<Conn>) {
    let mut c = Conn::open(addr);
    let auth = format!("Bearer {token}");
    c.send(&request(
        "GET",
        &format!("/sessions/{sid}"),
        &addr.to_string(),
        &[("Authorization", &auth), ("Accept", "text/event-stream")],
        None,
    ));
    let (status, _) = c.read_head().expect("a watch head");
    (status, (status == 200).then_some(c))
}

/// Issue 10, item 24: attempts refused at a session's watcher cap do not
/// hold back the live watchers' keepalives, and watchers whose clients
/// closed give their slots back without waiting for a write.
#[test]
fn refused_watches_spare_live_watchers_and_dead_ones_free_their_slots() {
    let dir = TestDir::new("hswatchcap");
    let api = Api::start(&dir, &seat(&json!([[{"stall": 120}]]), &[]), 0);
    let created = api.create(
        &uuid7(0, 1),
        &json!({"harness": "fake", "worktree": api.wt, "prompt": "wait"}),
    );
    let sid = created.json()["id"].as_str().unwrap().to_string();
    let mut watchers: Vec<Watch> = (0..128)
        .map(|_| api.watch(&format!("/sessions/{sid}")))
        .collect();
    for w in watchers.iter_mut() {
        let first = api.batch(w, "/sessions/{session_id}");
        assert_eq!(first["events"][0]["type"], "reset");
    }
    assert_eq!(try_watch(api.addr, &api.token, &sid).0, 503);
    // Attempts keep being refused while the first watcher waits for its
    // keepalive: each one used to restart every watcher's wait.
    // The hammer runs until told to stop; between attempts it waits for
    // that word, at most 50 ms.
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (first_tx, first_rx) = std::sync::mpsc::sync_channel(1);
    let hammer = {
        let (addr, token, sid) = (api.addr, api.token.clone(), sid.clone());
        std::thread::spawn(move || {
            let mut refused = 0;
            loop {
                assert_eq!(try_watch(addr, &token, &sid).0, 503);
                if refused == 0 {
                    first_tx.send(()).unwrap();
                }
                refused += 1;
                // Simulated load: an attempt every 50 ms, far more often
                // than the keepalive period, until the word to stop.
                match stopped.recv_timeout(std::time::Duration::from_millis(50)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
            }
            refused
        })
    };
    // Two keepalives written after the refusals began (one could have
    // been on its way before).
    first_rx.recv().unwrap();
    watchers[0].discard_received();
    let mut keepalives = 0;
    while keepalives < 2 {
        let b = api.batch(&mut watchers[0], "/sessions/{session_id}");
        if b["events"].as_array().unwrap().is_empty() {
            keepalives += 1;
        }
    }
    let _ = stop.send(());
    assert!(hammer.join().unwrap() > 0);
    // Eight clients go away without a word; their slots come back.
    watchers.truncate(120);
    let deadline = std::time::Instant::now() + util::PATIENCE;
    let mut attached = Vec::new();
    while attached.len() < 8 {
        match try_watch(api.addr, &api.token, &sid) {
            (200, Some(c)) => attached.push(c),
            (503, _) if std::time::Instant::now() < deadline => std::thread::yield_now(),
            (s, _) => panic!("the departed watchers' slots did not come back: {s}"),
        }
    }
    assert_eq!(try_watch(api.addr, &api.token, &sid).0, 503);
    api.d.stop();
}

/// A daemon with `http` (keys of its [http] table) and one session of the
/// fake agent, which starts and says nothing; and that session's id.
fn with_session(dir: &TestDir, http: &str) -> (Api, String) {
    let api = Api::start(dir, &format!("{http}\n{}", seat(&json!([]), &[])), 0);
    let body = json!({"harness": "fake", "worktree": api.wt});
    let sid = api.create(&uuid7(0, 1), &body).json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    (api, sid)
}

/// An answer as compared between two connections: all but the Date.
fn comparable(r: &Resp) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let headers = r
        .headers
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case("date"))
        .cloned()
        .collect();
    (r.status, headers, r.body.clone())
}

/// Issue 11: on a connection whose caller is known, a request is
/// answered as a handler thread answers it on a new connection, byte for
/// byte but the Date, whichever thread answers it (the poller at once,
/// src/http/listener.rs, "Reads answered at once", or a handler when
/// the answer needs one): the read itself, its conditional forms, the
/// refusals, and a close.
#[test]
fn reads_on_a_kept_connection_are_answered_as_on_a_new_one() {
    let dir = TestDir::new("hsatonce");
    let (api, sid) = with_session(&dir, "");
    let host = api.addr.to_string();
    let auth = format!("Bearer {}", api.token);
    let path = format!("/sessions/{sid}");
    let etag = api
        .send("GET", &path, &[], None)
        .header("etag")
        .unwrap()
        .to_string();
    let get_as = |token: &str, target: &str, extra: &[(&str, &str)]| {
        let mut h = vec![("Authorization", token)];
        h.extend_from_slice(extra);
        request("GET", target, &host, &h, None)
    };
    let get = |target: &str, extra: &[(&str, &str)]| get_as(&auth, target, extra);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("the read", get(&path, &[]), 200),
        (
            "a matching If-None-Match",
            get(&path, &[("If-None-Match", &etag)]),
            304,
        ),
        (
            "a failing If-Match",
            get(&path, &[("If-Match", "\"other\"")]),
            412,
        ),
        (
            "a JSON-less Accept",
            get(&path, &[("Accept", "text/html")]),
            406,
        ),
        ("a bad tail", get(&format!("{path}?tail=many"), &[]), 400),
        (
            "an unknown parameter",
            get(&format!("{path}?colour=red"), &[]),
            400,
        ),
        ("a wrong token", get_as("Bearer nope", &path, &[]), 401),
        (
            "a foreign Origin",
            get(&path, &[("Origin", "http://elsewhere.example")]),
            403,
        ),
        (
            "another method",
            request("POST", &path, &host, &[("Authorization", &auth)], None),
            405,
        ),
        (
            "a preflight",
            request("OPTIONS", &path, &host, &[], None),
            204,
        ),
        (
            "an unknown session",
            get("/sessions/s-000000000000", &[]),
            404,
        ),
        ("a close", get(&path, &[("Connection", "close")]), 200),
    ];
    let mut kept = Conn::open(api.addr);
    kept.send(&get(&path, &[]));
    assert_eq!(kept.read().expect("a first answer").status, 200);
    for (what, req, status) in &cases {
        let mut fresh = Conn::open(api.addr);
        fresh.send(req);
        let new = fresh.read().expect("an answer on a new connection");
        kept.send(req);
        let again = kept
            .read()
            .unwrap_or_else(|| panic!("{what}: no answer on the kept connection"));
        assert_eq!(new.status, *status, "{what}: {new:?}");
        assert_eq!(comparable(&again), comparable(&new), "{what}");
    }
    let mut end = [0u8; 1];
    let after = std::io::Read::read(&mut kept.r, &mut end);
    assert!(
        matches!(after, Ok(0)),
        "Connection: close did not close: {after:?}"
    );
    api.d.stop();
}

/// Issue 11: with the only handler thread held by a client that
/// pipelines reads and does not read the answers, another client's
/// requests on its open connection are still answered, at once, by the
/// poller, with the bytes a handler gave for them on new connections;
/// the held client then gets every answer, whole and in order, however
/// the poller and the handler shared the writing of them.
#[test]
fn requests_are_answered_at_once_while_the_only_handler_is_held() {
    let dir = TestDir::new("hsheld");
    let (api, sid) = with_session(&dir, "threads = 1\n");
    let host = api.addr.to_string();
    let auth = format!("Bearer {}", api.token);
    let path = format!("/sessions/{sid}");
    // Refusals and a preflight, each answered first by the handler on a
    // new connection. (Whether a read is answered at once also depends on
    // its snapshot being current, which a timer of the daemon's may end at
    // any moment; tests/bench measures reads.)
    let get_as = |token: &str, target: &str| {
        request("GET", target, &host, &[("Authorization", token)], None)
    };
    let refusals = [
        (get_as("Bearer nope", &path), 401),
        (get_as(&auth, &format!("{path}?tail=many")), 400),
        (get_as(&auth, "/nowhere"), 404),
        (request("OPTIONS", &path, &host, &[], None), 204),
    ];
    let by_handler: std::collections::HashMap<Vec<u8>, Resp> = refusals
        .iter()
        .map(|(req, _)| {
            let mut c = Conn::open(api.addr);
            c.send(req);
            (
                req.clone(),
                c.read().expect("an answer on a new connection"),
            )
        })
        .collect();
    let get = request("GET", &path, &host, &[("Authorization", &auth)], None);
    let mut other = Conn::open(api.addr);
    other.send(&get);
    assert_eq!(other.read().expect("a first answer").status, 200);
    let mut held = Conn::open(api.addr);
    held.send(&get);
    let first = held.read().expect("a first answer");
    assert_eq!(first.status, 200);
    // More pipelined reads than the largest socket buffers on both sides
    // can hold the answers of, so that the daemon ends up blocked writing
    // them on its only handler thread.
    let max = |f: &str| -> usize {
        let t = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{f}")).unwrap();
        t.split_whitespace().last().unwrap().parse().unwrap()
    };
    let n = 2 * (max("tcp_wmem") + max("tcp_rmem")) / first.body.len() + 1024;
    let mut w = held.w.try_clone().unwrap();
    let pipelined = get.repeat(n);
    let writer = std::thread::spawn(move || w.write_all(&pipelined).unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !blocked_writing(api.d.pid(), "http-0") {
        assert!(
            std::time::Instant::now() < deadline,
            "the handler never blocked writing answers"
        );
        std::thread::yield_now();
    }
    // Until this client reads, that handler is held; the other client's
    // requests are answered meanwhile.
    for (req, status) in &refusals {
        other.send(req);
        let r = other.read().expect("an answer while the handler is held");
        assert_eq!(r.status, *status, "{r:?}");
        assert_eq!(comparable(&r), comparable(&by_handler[req]), "{r:?}");
    }
    for i in 0..n {
        let r = held
            .read()
            .unwrap_or_else(|| panic!("answer {i} of {n} never came"));
        assert_eq!((r.status, &r.body), (200, &first.body), "answer {i}");
    }
    writer.join().unwrap();
    assert!(held.open_and_quiet(), "more answers than requests");
    api.d.stop();
}

/// Whether the daemon's thread `name` is blocked in a write to a socket,
/// as its system call in /proc shows.
fn blocked_writing(pid: i32, name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        let nr = call.split(' ').next().and_then(|n| n.parse::<i64>().ok());
        comm.trim() == name && nr.is_some_and(|n| n == libc::SYS_sendto || n == libc::SYS_write)
    })
}
