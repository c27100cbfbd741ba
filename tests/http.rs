//! The HTTP API through the real binary (issue 6, phase 1): bearer
//! failures, origins and CORS preflights, Host checks, strict requests,
//! body limits for fixed and chunked bodies, the connection bound, pages,
//! the events watch with reconnection, and shutdown by the operator. Every
//! reply is checked against vendor-schemas/openapi.yaml.

mod util;

use serde_json::{Value, json};
use std::net::SocketAddr;
use util::http::{Conn, Resp, SseError, SseParser, Watch, check_reply, openapi, request, validate};
use util::{Daemon, Opts, TestDir};

/// A daemon serving HTTP on a free loopback port.
struct Api {
    d: Daemon,
    addr: SocketAddr,
    token: String,
    doc: Value,
}

impl Api {
    fn start(dir: &TestDir, config: &str) -> Api {
        let d = Daemon::start_with(
            &dir.path,
            Opts {
                config: Some(config.into()),
                extra_args: vec!["--http".into(), "127.0.0.1:0".into()],
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
        let token = std::fs::read_to_string(d.state.join("http.token"))
            .expect("token file")
            .trim()
            .to_string();
        Api {
            d,
            addr,
            token,
            doc: openapi(),
        }
    }

    fn host(&self) -> String {
        self.addr.to_string()
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// Sends one request on a new connection and reads the answer.
    fn send(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Resp {
        let mut c = Conn::open(self.addr);
        c.send(&request(method, target, &self.host(), headers, body));
        c.read().expect("an answer")
    }

    fn get(&self, target: &str) -> Resp {
        let auth = self.bearer();
        self.send("GET", target, &[("Authorization", &auth)], None)
    }

    fn post_json(&self, target: &str, body: &Value) -> Resp {
        let auth = self.bearer();
        self.send(
            "POST",
            target,
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            Some(body.to_string().as_bytes()),
        )
    }

    fn check(&self, path: &str, method: &str, r: &Resp) {
        check_reply(&self.doc, path, method, r);
    }

    fn watch(&self, query: &str) -> Watch {
        let mut c = Conn::open(self.addr);
        let auth = self.bearer();
        c.send(&request(
            "GET",
            &format!("/events?{query}"),
            &self.host(),
            &[("Authorization", &auth), ("Accept", "text/event-stream")],
            None,
        ));
        let (status, headers) = c.read_head().expect("a watch head");
        assert_eq!(status, 200, "{headers:?}");
        assert!(
            headers
                .iter()
                .any(|(n, v)| n.eq_ignore_ascii_case("content-type") && v == "text/event-stream")
        );
        Watch::new(c)
    }

    fn check_batch(&self, b: &Value) {
        let schema =
            util::http::response_schema(&self.doc, "/events", "get", 200, "text/event-stream");
        if let Err(e) = validate(&self.doc, schema, b, "$") {
            panic!("SSE batch does not match openapi.yaml: {e}\n{b}");
        }
    }
}

#[test]
fn token_is_private_and_bearer_failures_are_401_with_a_challenge() {
    let dir = TestDir::new("httpauth");
    let api = Api::start(&dir, "");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(api.d.state.join("http.token"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(api.token.len(), 64);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Basic abc"),
        Some(&*format!("Bearer {}x", api.token)),
    ] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
        let r = api.send("GET", "/server", &headers, None);
        assert_eq!(r.status, 401);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert_eq!(r.code(), "unauthorized");
        api.check("/server", "get", &r);
        assert!(!String::from_utf8_lossy(&r.body).contains(&api.token));
    }
    let r = api.get("/server");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    api.check("/server", "get", &r);
    assert_eq!(r.json()["state"], "ready");
    // A representation's ETag makes a conditional read a 304.
    let tag = r.header("etag").expect("etag").to_string();
    let auth = api.bearer();
    let again = api.send(
        "GET",
        "/server",
        &[("Authorization", &auth), ("If-None-Match", &tag)],
        None,
    );
    assert_eq!(again.status, 304);
    assert!(
        !api.d.log_text().contains(&api.token),
        "the token must never be logged"
    );
    api.d.stop();
}

#[test]
fn origins_preflights_and_hosts() {
    let dir = TestDir::new("httporigin");
    let api = Api::start(
        &dir,
        "[http]\nallowed_origins = [\"https://app.example\"]\npublic_names = [\"box.lan\"]\n",
    );
    let auth = api.bearer();
    // A foreign origin is refused before anything else, token or not.
    let r = api.send(
        "GET",
        "/server",
        &[("Authorization", &auth), ("Origin", "https://evil.example")],
        None,
    );
    assert_eq!((r.status, r.code().as_str()), (403, "origin_not_allowed"));
    api.check("/server", "get", &r);
    let r = api.send(
        "OPTIONS",
        "/server/shutdown",
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        None,
    );
    assert_eq!(r.status, 403);
    // The allowed origin gets exact CORS headers, never a wildcard or cookies.
    let r = api.send(
        "GET",
        "/server",
        &[("Authorization", &auth), ("Origin", "https://app.example")],
        None,
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(
        r.header("access-control-expose-headers")
            .unwrap()
            .contains("ETag")
    );
    assert!(r.headers_named("vary").iter().any(|v| v.contains("Origin")));
    assert!(r.header("access-control-allow-credentials").is_none());
    // A preflight needs no token and answers only metadata.
    let r = api.send(
        "OPTIONS",
        "/server/shutdown",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
        None,
    );
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("POST, OPTIONS")
    );
    let allowed = r
        .header("access-control-allow-headers")
        .unwrap()
        .to_ascii_lowercase();
    for h in ["authorization", "content-type", "if-match", "if-none-match"] {
        assert!(allowed.contains(h), "{allowed}");
    }
    assert!(r.body.is_empty());
    // Host: the listener's address, localhost, or a public name; nothing else.
    for (host, status) in [
        ("evil.example", 403),
        ("box.lan", 200),
        (&*format!("localhost:{}", api.addr.port()), 200),
        ("127.0.0.1:1", 403),
    ] {
        let mut c = Conn::open(api.addr);
        c.send(&request(
            "GET",
            "/server",
            host,
            &[("Authorization", &auth)],
            None,
        ));
        let r = c.read().unwrap();
        assert_eq!(r.status, status, "Host {host}");
        if status == 403 {
            assert_eq!(r.code(), "host_not_allowed");
        }
    }
    // Unknown paths, unsupported methods.
    let r = api.get("/nowhere");
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    let r = api.send("DELETE", "/server", &[("Authorization", &auth)], None);
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, OPTIONS")));
    let r = api.send(
        "GET",
        "/events?stream=x-a",
        &[("Authorization", &auth), ("Accept", "text/html")],
        None,
    );
    assert_eq!((r.status, r.code().as_str()), (406, "not_acceptable"));
    api.d.stop();
}

#[test]
fn unknown_fields_and_parameters_are_400_and_bodies_are_bounded() {
    let dir = TestDir::new("httpstrict");
    let api = Api::start(&dir, "");
    let r = api.get("/server?verbose=1");
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    api.check("/server", "get", &r);
    let r = api.get("/events?stream=x-a&stream=x-b");
    assert_eq!(r.status, 400);
    let id = api.get("/server").json()["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = api.post_json("/server/shutdown", &json!({"instance_id": id, "now": true}));
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    api.check("/server/shutdown", "post", &r);
    let r = api.post_json(
        "/server/shutdown",
        &json!({"instance_id": id, "timeout_ms": 30001}),
    );
    assert_eq!(r.status, 400);
    let auth = api.bearer();
    let r = api.send(
        "POST",
        "/server/shutdown",
        &[("Authorization", &auth), ("Content-Type", "text/plain")],
        Some(b"{}"),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (415, "unsupported_media_type")
    );

    // Fixed length over 64 KiB: refused from the header, before the body.
    let mut c = Conn::open(api.addr);
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 65537\r\n\r\n", api.host()).as_bytes());
    let r = c.read().unwrap();
    assert_eq!((r.status, r.code().as_str()), (413, "body_too_large"));
    api.check("/server/shutdown", "post", &r);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed());
    // A claim of a terabyte costs nothing either.
    let mut c = Conn::open(api.addr);
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 1099511627776\r\n\r\n", api.host()).as_bytes());
    assert_eq!(c.read().unwrap().status, 413);
    // Chunked: the limit holds while reading, whatever the chunk sizes say.
    let mut c = Conn::open(api.addr);
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", api.host()).as_bytes());
    let chunk = vec![b' '; 16 * 1024];
    for _ in 0..4 {
        c.send(format!("{:x}\r\n", chunk.len()).as_bytes());
        c.send(&chunk);
        c.send(b"\r\n");
    }
    c.send(b"10\r\n0123456789abcdef\r\n");
    let r = c.read().unwrap();
    assert_eq!((r.status, r.code().as_str()), (413, "body_too_large"));
    assert!(c.closed());
    // A chunked body under the limit is read whole (and the instance is wrong).
    let mut c = Conn::open(api.addr);
    let body = json!({"instance_id": "not-this-one"}).to_string();
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n", api.host(), body.len()).as_bytes());
    assert_eq!(c.read().unwrap().status, 409);
    // Ambiguous framing is refused without running anything.
    let mut c = Conn::open(api.addr);
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{{}}", api.host()).as_bytes());
    assert_eq!(c.read().unwrap().status, 400);
    // The daemon still answers, on a kept-alive connection, two in a row.
    let mut c = Conn::open(api.addr);
    c.send(&request(
        "GET",
        "/server",
        &api.host(),
        &[("Authorization", &auth)],
        None,
    ));
    c.send(&request(
        "GET",
        "/storage",
        &api.host(),
        &[("Authorization", &auth)],
        None,
    ));
    assert_eq!(c.read().unwrap().status, 200);
    let storage = c.read().unwrap();
    assert_eq!(storage.status, 200);
    api.check("/storage", "get", &storage);
    api.d.stop();
}

#[test]
fn connections_past_the_bound_get_503() {
    let dir = TestDir::new("httpconns");
    let api = Api::start(&dir, "[http]\nmax_connections = 2\nthreads = 1\n");
    let auth = api.bearer();
    let mut held: Vec<Conn> = (0..2).map(|_| Conn::open(api.addr)).collect();
    // Both are admitted: each answers a request and stays open.
    for c in held.iter_mut() {
        c.send(&request(
            "GET",
            "/server",
            &api.host(),
            &[("Authorization", &auth)],
            None,
        ));
        assert_eq!(c.read().unwrap().status, 200);
    }
    let mut third = Conn::open(api.addr);
    let r = third.read().expect("a refusal");
    assert_eq!((r.status, r.code().as_str()), (503, "too_many_connections"));
    api.check("/server", "get", &r);
    assert!(r.header("retry-after").is_some());
    // Closing one frees its slot.
    drop(held.pop());
    let deadline = std::time::Instant::now() + util::PATIENCE;
    loop {
        let mut c = Conn::open(api.addr);
        c.send(&request(
            "GET",
            "/server",
            &api.host(),
            &[("Authorization", &auth)],
            None,
        ));
        match c.read() {
            Some(r) if r.status == 200 => break,
            _ if std::time::Instant::now() < deadline => std::thread::yield_now(),
            other => panic!("the freed slot was not reused: {other:?}"),
        }
    }
    api.d.stop();
}

fn append(c: &mut util::Client, stream: &str, n: u64) {
    c.call(
        "events.append",
        json!({"stream": stream, "kind": "note", "data": {"n": n}}),
    );
}

#[test]
fn events_pages_are_bounded_and_tied_to_their_query() {
    let dir = TestDir::new("httppages");
    let api = Api::start(&dir, "");
    let mut sock = api.d.connect();
    for n in 1..=5 {
        append(&mut sock, "x-a", n);
    }
    let mut seen = Vec::new();
    let mut target = "/events?stream=x-a&limit=2".to_string();
    loop {
        let r = api.get(&target);
        assert_eq!(r.status, 200);
        api.check("/events", "get", &r);
        let page = r.json();
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["seq"].as_u64().unwrap()),
        );
        match page["next"].as_str() {
            Some(next) => {
                // A token belongs to its query.
                let r = api.get(&format!("/events?stream=x-a&limit=3&next={next}"));
                assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
                target = format!("/events?stream=x-a&limit=2&next={next}");
            }
            None => break,
        }
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);
    assert_eq!(
        api.get("/events?stream=x-a&after_seq=3").json()["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(api.get("/events?stream=x-a&limit=201").status, 400);
    let storage = api.get("/storage");
    api.check("/storage", "get", &storage);
    assert_eq!(
        storage.json()["streams"]["items"],
        json!([{"stream": "x-a", "events": 5}])
    );
    api.d.stop();
}

#[test]
fn the_events_watch_resumes_after_seq_without_duplicates() {
    let dir = TestDir::new("httpwatch");
    let api = Api::start(&dir, "");
    let mut sock = api.d.connect();
    append(&mut sock, "x-w", 1);
    let generation = api.get("/server").json()["instance_id"]
        .as_str()
        .unwrap()
        .to_string();

    // First attachment: a reset whose snapshot says what history covers.
    let mut w = api.watch("stream=x-w");
    let first = w.next().unwrap();
    api.check_batch(&first);
    assert_eq!(first["generation"], json!(generation));
    assert_eq!(
        first["events"][0],
        json!({"type": "reset", "data": {"reason": "initial"}})
    );
    assert_eq!(first["snapshot"], json!({"stream": "x-w", "high_water": 1}));
    let mut cursor = first["cursor"].as_u64().unwrap();
    let mut got = Vec::new();
    for n in 2..=4 {
        append(&mut sock, "x-w", n);
    }
    while got.len() < 3 {
        let b = w.next().expect("a batch");
        api.check_batch(&b);
        for e in b["events"].as_array().unwrap() {
            got.push(e["sequence"].as_u64().unwrap());
        }
        cursor = b["cursor"].as_u64().unwrap();
    }
    assert_eq!(got, vec![2, 3, 4]);
    drop(w);

    // Committed while nobody watched; a reconnect from the cursor replays
    // exactly those, once each.
    for n in 5..=7 {
        append(&mut sock, "x-w", n);
    }
    let mut w = api.watch(&format!(
        "stream=x-w&after_generation={generation}&after_seq={cursor}"
    ));
    let mut again = Vec::new();
    while again.len() < 3 {
        let b = w.next().expect("a batch");
        api.check_batch(&b);
        assert_ne!(
            b["events"][0]["type"], "reset",
            "a servable cursor must not reset: {b}"
        );
        again.extend(
            b["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["sequence"].as_u64().unwrap()),
        );
    }
    assert_eq!(again, vec![5, 6, 7]);
    drop(w);

    // Another generation's cursor (a previous daemon) resets.
    let mut w = api.watch("stream=x-w&after_generation=someone-else&after_seq=3");
    let b = w.next().unwrap();
    assert_eq!(b["events"][0]["data"]["reason"], "generation_changed");
    assert_eq!(b["snapshot"]["high_water"], 7);
    // Malformed cursors are 400 before any header.
    assert_eq!(
        api.send(
            "GET",
            "/events?stream=x-w&after_seq=3",
            &[
                ("Authorization", &api.bearer()),
                ("Accept", "text/event-stream")
            ],
            None
        )
        .status,
        400
    );
    assert_eq!(
        api.send(
            "GET",
            "/events?stream=x-w&after_generation=g&after_seq=-1",
            &[
                ("Authorization", &api.bearer()),
                ("Accept", "text/event-stream")
            ],
            None
        )
        .status,
        400
    );

    // Stopping ends the watch with a failure batch.
    api.d.signal(libc::SIGTERM);
    let mut last = None;
    while let Some(b) = w.next() {
        api.check_batch(&b);
        last = Some(b);
    }
    assert_eq!(
        last.expect("a final batch")["events"][0],
        json!({"type": "failure", "data": {"code": "shutting_down"}})
    );
    let mut d = api.d;
    assert_eq!(d.wait().code(), Some(0));
}

#[test]
fn shutdown_names_its_instance_and_this_process_is_the_operator() {
    let dir = TestDir::new("httpstop");
    let api = Api::start(&dir, "");
    let r = api.post_json(
        "/server/shutdown",
        &json!({"instance_id": "0190b9a0-5f2e-7c3a-8b1d-2e4f6a8c0d1e"}),
    );
    assert_eq!((r.status, r.code().as_str()), (409, "instance_changed"));
    api.check("/server/shutdown", "post", &r);
    assert_eq!(api.get("/server").json()["state"], "ready");
    let id = api.get("/server").json()["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The test process was not started by the daemon: it is the operator.
    let r = api.post_json(
        "/server/shutdown",
        &json!({"instance_id": id, "timeout_ms": 2000}),
    );
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    api.check("/server/shutdown", "post", &r);
    assert_eq!(r.json(), json!({"instance_id": id, "state": "draining"}));
    let mut d = api.d;
    assert_eq!(d.wait().code(), Some(0));
}

#[test]
fn sse_parser_handles_fragments_line_ends_and_utf8_bounds() {
    let stream = "\u{feff}: comment\r\ndata: {\"a\":\"\u{e9}\u{1f600}\"}\r\n\r\ndata: x\rdata: y\r\rid: 1\nevent: e\ndata\n\n".as_bytes();
    let want = vec![
        "{\"a\":\"\u{e9}\u{1f600}\"}".to_string(),
        "x\ny".to_string(),
        String::new(),
    ];
    // Every split point, including inside a multibyte character and between
    // a CR and its LF, gives the same events.
    for size in 1..=stream.len() {
        let mut p = SseParser::new(1024);
        let mut got = Vec::new();
        for piece in stream.chunks(size) {
            got.extend(p.feed(piece).unwrap());
        }
        assert_eq!(got, want, "pieces of {size}");
    }
    assert_eq!(
        SseParser::new(1024).feed(b"data: \xff\xfe\n\n"),
        Err(SseError::NotUtf8)
    );
    assert_eq!(
        SseParser::new(8).feed(b"data: 0123456789\n"),
        Err(SseError::TooLarge)
    );
    let mut p = SseParser::new(8);
    assert_eq!(p.feed(b"data: 12345\ndata: 6\n"), Err(SseError::TooLarge));
}

/// Issue 10, item 23: connections that sent part of a head hold no
/// handler thread. Before, each held one of the `threads` until its head
/// timed out (15 s), and only then was the next connection read.
#[test]
fn partial_heads_do_not_hold_handler_threads() {
    let dir = TestDir::new("httptrickle");
    let api = Api::start(&dir, "[http]\nthreads = 2\n");
    let auth = api.bearer();
    let partials: [&[u8]; 4] = [
        b"G",
        b"GET /server HTTP/1.1\r\nHo",
        b"GET /server HTTP/1.1\r\nHost: x\r\n",
        b"\r\n\r\nPOST /sessions",
    ];
    let mut tricklers: Vec<Conn> = (0..24)
        .map(|i| {
            let mut c = Conn::open(api.addr);
            c.send(partials[i % partials.len()]);
            c
        })
        .collect();
    // A second byte on some of them, as a trickling client would send.
    for c in tricklers.iter_mut().step_by(3) {
        c.send(b"E");
    }
    for _ in 0..3 {
        let r = api.get("/server");
        assert_eq!(r.status, 200);
        api.check("/server", "get", &r);
    }
    // Answered while every trickler still waits for its head: none was
    // timed out to make room.
    for (i, c) in tricklers.iter_mut().enumerate() {
        assert!(c.open_and_quiet(), "trickler {i} was closed or answered");
    }
    // Each finishes its head and is answered like any other.
    let mut c = tricklers.remove(1);
    c.send(format!("st: {}\r\nAuthorization: {auth}\r\n\r\n", api.host()).as_bytes());
    assert_eq!(c.read().unwrap().status, 200);
    api.d.stop();
}

/// Issue 11: a handler keeps a busy keep-alive connection while its
/// client sends request after request, but only while another handler is
/// free: with two handler threads, two clients sending back to back on
/// their connections do not keep a third client from being answered.
#[test]
fn busy_keep_alive_connections_do_not_hold_every_handler() {
    let dir = TestDir::new("httpbusy");
    let api = Api::start(&dir, "[http]\nthreads = 2\n");
    let auth = api.bearer();
    let get = request(
        "GET",
        "/server",
        &api.host(),
        &[("Authorization", &auth)],
        None,
    );
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (first_tx, first_rx) = std::sync::mpsc::channel();
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let (addr, get, done, first) = (api.addr, get.clone(), done.clone(), first_tx.clone());
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                let mut served = 0u64;
                // Bounded, so that a starved third client fails the test
                // instead of hanging it.
                while !done.load(std::sync::atomic::Ordering::Acquire) && served < 200_000 {
                    c.send(&get);
                    let r = c.read().expect("an answer on a busy connection");
                    assert_eq!(r.status, 200);
                    served += 1;
                    if served == 1 {
                        let _ = first.send(());
                    }
                }
                served
            })
        })
        .collect();
    // Both busy clients have been answered on their connections before
    // the third comes.
    for _ in 0..2 {
        first_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a busy client is answered");
    }
    let mut other = Conn::open(api.addr);
    other.send(&get);
    let r = other.read().expect("the third client is answered");
    done.store(true, std::sync::atomic::Ordering::Release);
    assert_eq!(r.status, 200);
    api.check("/server", "get", &r);
    for b in busy {
        let served = b.join().expect("a busy client");
        assert!(
            served < 200_000,
            "the third client waited while a busy one was answered {served} times"
        );
    }
    api.d.stop();
}

/// Issue 10, item 32: silent connections that never proved the token
/// cannot hold every slot; the oldest make room, per peer first.
#[test]
fn unproven_connections_make_room_oldest_first() {
    let dir = TestDir::new("httpunproven");
    let api = Api::start(&dir, "[http]\nmax_connections = 8\nthreads = 1\n");
    let auth = api.bearer();
    // One proven connection, kept open.
    let mut proven = Conn::open(api.addr);
    proven.send(&request(
        "GET",
        "/server",
        &api.host(),
        &[("Authorization", &auth)],
        None,
    ));
    assert_eq!(proven.read().unwrap().status, 200);
    // Seven silent ones fill the other slots.
    let mut silent: Vec<Conn> = (0..7).map(|_| Conn::open(api.addr)).collect();
    // A new authorised client is served: the oldest silent one made room.
    let r = api.get("/server");
    assert_eq!(r.status, 200);
    assert!(silent[0].closed(), "the oldest silent connection was kept");
    for (i, c) in silent.iter_mut().enumerate().skip(1) {
        assert!(c.open_and_quiet(), "silent connection {i} was closed");
    }
    // The proven connection is never the one closed.
    for _ in 0..10 {
        assert_eq!(api.get("/server").status, 200);
    }
    proven.send(&request(
        "GET",
        "/server",
        &api.host(),
        &[("Authorization", &auth)],
        None,
    ));
    assert_eq!(proven.read().unwrap().status, 200);
    api.d.stop();

    // One peer holds at most 32 unproven connections: its 33rd closes its
    // oldest, however many slots are free.
    let dir = TestDir::new("httppeercap");
    let api = Api::start(&dir, "");
    let mut silent: Vec<Conn> = (0..40).map(|_| Conn::open(api.addr)).collect();
    assert_eq!(api.get("/server").status, 200);
    // The 40 and the authorised one: the 9 oldest were closed.
    for (i, c) in silent.iter_mut().enumerate() {
        if i < 9 {
            assert!(c.closed(), "silent connection {i} was kept");
        } else {
            assert!(c.open_and_quiet(), "silent connection {i} was closed");
        }
    }
    api.d.stop();
}

/// A connection whose body is still arriving has proven the token with
/// its head: it is not closed to make room for others.
#[test]
fn a_connection_waiting_for_its_body_is_not_closed_to_make_room() {
    let dir = TestDir::new("httpbodyroom");
    let api = Api::start(&dir, "[http]\nmax_connections = 9\nthreads = 1\n");
    let auth = api.bearer();
    let mut warm = Conn::open(api.addr);
    let mut waiting = Conn::open(api.addr);
    waiting.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 31\r\n\r\n{{", api.host()).as_bytes());
    // The one handler thread took the waiting head before this one, so
    // once this is answered the body is being waited for.
    warm.send(&request(
        "GET",
        "/server",
        &api.host(),
        &[("Authorization", &auth)],
        None,
    ));
    assert_eq!(warm.read().unwrap().status, 200);
    let mut silent: Vec<Conn> = (0..7).map(|_| Conn::open(api.addr)).collect();
    assert_eq!(api.get("/server").status, 200);
    assert!(silent[0].closed(), "the oldest silent connection was kept");
    assert!(waiting.open_and_quiet(), "the body's connection was closed");
    // Its body finishes and it is answered (the instance is not this one).
    waiting.send(br#""instance_id": "not-this-one"}"#);
    let r = waiting.read().expect("an answer once the body is whole");
    assert_eq!((r.status, r.code().as_str()), (409, "instance_changed"));
    api.d.stop();
}

/// `Expect: 100-continue`: the interim answer comes when the daemon
/// waits for the body, never when the declared length is already too
/// large.
#[test]
fn expect_continue_is_answered_before_the_body_is_waited_for() {
    let dir = TestDir::new("httpcontinue");
    let api = Api::start(&dir, "");
    let auth = api.bearer();
    let body = json!({"instance_id": "not-this-one"}).to_string();
    let mut c = Conn::open(api.addr);
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", api.host(), body.len()).as_bytes());
    let (status, _) = c.read_head().expect("an interim answer");
    assert_eq!(status, 100);
    c.send(body.as_bytes());
    let r = c.read().expect("the final answer");
    assert_eq!((r.status, r.code().as_str()), (409, "instance_changed"));
    let mut c = Conn::open(api.addr);
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 65537\r\n\r\n", api.host()).as_bytes());
    let r = c.read().expect("an answer");
    assert_eq!((r.status, r.code().as_str()), (413, "body_too_large"));
    assert!(c.closed());
    api.d.stop();
}

/// Issue 10, item 25: framing the independent client found loose.
#[test]
fn loose_framing_is_400_and_closes() {
    let dir = TestDir::new("httpframing");
    let api = Api::start(&dir, "");
    let auth = api.bearer();
    let host = api.host();
    let get = format!("GET /server HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\n\r\n");
    // An empty Content-Length is no length: 400, and what followed is not
    // taken for a second request.
    let mut c = Conn::open(api.addr);
    c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length:\r\n\r\n{get}").as_bytes());
    let r = c.read().unwrap();
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    api.check("/server/shutdown", "post", &r);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed());
    for bad in [
        format!("GET /server HTTP/1.1\r\nHost:\r\nAuthorization: {auth}\r\n\r\n"),
        format!("GET /server HTTP/1.0\r\nAuthorization: {auth}\r\n\r\n"),
        format!("GET /events?stream=%+f HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\n\r\n"),
    ] {
        let mut c = Conn::open(api.addr);
        c.send(bad.as_bytes());
        let r = c.read().unwrap();
        assert_eq!(r.status, 400, "{bad:?}");
        api.check("/server", "get", &r);
    }
    // Chunk lines with a bare LF or a leading space.
    for chunks in ["2;a\nb\r\n{}\r\n0\r\n\r\n", " 2\r\n{}\r\n0\r\n\r\n"] {
        let mut c = Conn::open(api.addr);
        c.send(format!("POST /server/shutdown HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}").as_bytes());
        let r = c.read().unwrap();
        assert_eq!(r.status, 400, "{chunks:?}");
        assert!(c.closed());
    }
    // HTTP/1.0 naming this listener is served.
    let mut c = Conn::open(api.addr);
    c.send(
        format!("GET /server HTTP/1.0\r\nHost: {host}\r\nAuthorization: {auth}\r\n\r\n").as_bytes(),
    );
    assert_eq!(c.read().unwrap().status, 200);
    api.d.stop();
}

/// Issue 10, items 26, 28 and 29: the seed's capabilities, Accept on
/// JSON-only routes, If-Match on reads and refused where not evaluated.
#[test]
fn capabilities_accept_and_preconditions() {
    let dir = TestDir::new("httpaccept");
    let api = Api::start(&dir, "");
    let auth = api.bearer();
    let server = api.get("/server");
    let caps = &server.json()["capabilities"];
    assert_eq!(caps["durable_inputs"], 1);
    assert_eq!(caps["collection_invalidation"], 1);
    assert_eq!(caps["session_replay"], 2);
    for (path, accept, want) in [
        ("/server", "application/xml", 406),
        ("/seats", "application/xml", 406),
        ("/server", "text/event-stream", 406),
        ("/server", "text/html, application/*;q=0.5", 200),
        ("/seats", "*/*", 200),
        ("/server", "application/json;q=0", 406),
    ] {
        let r = api.send(
            "GET",
            path,
            &[("Authorization", &auth), ("Accept", accept)],
            None,
        );
        assert_eq!(r.status, want, "{path} {accept}");
        api.check(path, "get", &r);
        if want == 406 {
            assert_eq!(r.code(), "not_acceptable");
        }
    }
    // If-Match on a read: 412 unless it names the representation.
    let tag = server.header("etag").unwrap().to_string();
    let r = api.send(
        "GET",
        "/server",
        &[("Authorization", &auth), ("If-Match", "\"nope\"")],
        None,
    );
    assert_eq!((r.status, r.code().as_str()), (412, "precondition_failed"));
    api.check("/server", "get", &r);
    let r = api.send(
        "GET",
        "/server",
        &[("Authorization", &auth), ("If-Match", &tag)],
        None,
    );
    assert_eq!(r.status, 200);
    // A change that does not evaluate If-Match refuses it.
    let r = api.send(
        "POST",
        "/server/shutdown",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("If-Match", "*"),
        ],
        Some(b"{\"instance_id\":\"x\"}"),
    );
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    api.check("/server/shutdown", "post", &r);
    api.d.stop();
}

/// Issue 10, item 30: what the OpenAPI now documents beside its
/// operations: OPTIONS on every path (Allow as documented), 405 with
/// Allow, 404, and ids past maxLength 128 as 400.
#[test]
fn options_405_404_and_long_ids_are_as_documented() {
    let dir = TestDir::new("httpdoc");
    let api = Api::start(&dir, "");
    let auth = api.bearer();
    let problem = serde_json::json!({"$ref": "#/components/schemas/Problem"});
    let paths = api.doc["paths"].as_object().unwrap().clone();
    for (path, ops) in &paths {
        let concrete = path
            .split('/')
            .map(|s| if s.starts_with('{') { "x1" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let r = api.send("OPTIONS", &concrete, &[], None);
        assert_eq!(r.status, 204, "OPTIONS {path}");
        let allow = ops["options"]["responses"]["204"]["headers"]["Allow"]["schema"]["const"]
            .as_str()
            .unwrap();
        assert_eq!(r.header("allow"), Some(allow), "OPTIONS {path}");
        // A method the path does not list: 405 with the same Allow.
        if ops.get("patch").is_none() {
            let r = api.send("PATCH", &concrete, &[("Authorization", &auth)], None);
            assert_eq!((r.status, r.code().as_str()), (405, "method_not_allowed"));
            assert_eq!(r.header("allow"), Some(allow), "PATCH {path}");
            validate(&api.doc, &problem, &r.json(), "$").unwrap();
        }
    }
    let r = api.get("/no/such/path");
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    validate(&api.doc, &problem, &r.json(), "$").unwrap();
    // Ids: 128 characters route (and are unknown), 129 are refused.
    let id = |n: usize| "a".repeat(n);
    let r = api.get(&format!("/sessions/{}", id(128)));
    assert_eq!(r.status, 404);
    api.check("/sessions/{session_id}", "get", &r);
    for target in [
        format!("/sessions/{}", id(129)),
        format!("/sessions/{}/history", id(2000)),
        format!("/approvals/{}", id(16_000 - 64)),
    ] {
        let r = api.get(&target);
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{}",
            &target[..20]
        );
        validate(&api.doc, &problem, &r.json(), "$").unwrap();
    }
    api.d.stop();
}

/// Issue 10, item 31: with `--http 127.0.0.1:0` the port chosen is in
/// `server.info` and on `status`'s http line, not only in the log.
#[test]
fn the_port_chosen_for_port_zero_is_shown_by_server_info_and_status() {
    let dir = TestDir::new("httpport");
    let api = Api::start(&dir, "");
    let info = api.d.connect().call("server.info", json!({}));
    assert_eq!(info["http"]["address"], json!(api.addr.to_string()));
    let (code, out, err) =
        util::run_cli(&["--socket", &api.d.socket.display().to_string(), "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["http", &api.addr.to_string()]),
        "{out}"
    );
    api.d.stop();
}

/// A UUIDv7 minted now, distinct by `n`.
fn uuid7_now(n: u64) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    format!(
        "{:08x}-{:04x}-7{:03x}-8{:03x}-{:012x}",
        t >> 16,
        t & 0xffff,
        n & 0xfff,
        (n >> 12) & 0xfff,
        n.wrapping_mul(2654435761) & 0xffff_ffff_ffff
    )
}

/// An outside review: four authorised input PUTs declaring a 60,000-byte
/// body that send only `{` held the four handler threads, so every other
/// request waited. Bodies are now read by the listener: more stalled
/// bodies than handler threads, fixed-length and chunked, hold no thread,
/// others are served meanwhile, and each stalled one is answered 408 and
/// closed when its body's time is up. A chunked input sets aside its
/// whole limit (6,295,552 bytes) of the 64 MiB for large bodies, so of
/// eleven stalled at once exactly one is refused 503.
#[test]
fn stalled_bodies_do_not_hold_handler_threads() {
    let dir = TestDir::new("httpstall");
    let api = Api::start(&dir, "[http]\nthreads = 2\n");
    let auth = api.bearer();
    let host = api.host();
    let target = |n: u64| format!("/sessions/{}/inputs/{}", uuid7_now(1000 + n), uuid7_now(n));
    let stall = |n: u64, framing: &str| {
        let mut c = Conn::open(api.addr);
        c.send(format!("PUT {} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\n{framing}", target(n)).as_bytes());
        c
    };
    let mut fixed: Vec<Conn> = (0..3)
        .map(|n| stall(n, "Content-Length: 60000\r\n\r\n{"))
        .collect();
    let mut chunked: Vec<Conn> = (10..21)
        .map(|n| stall(n, "Transfer-Encoding: chunked\r\n\r\nea60\r\n{"))
        .collect();
    // One sends its body in two parts and finishes it: served like any.
    let body = json!({"kind": "message", "text": "hello"}).to_string();
    let (first, rest) = body.split_at(5);
    let mut slow = Conn::open(api.addr);
    slow.send(format!("PUT {} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{first}", target(100), body.len()).as_bytes());
    for _ in 0..3 {
        let r = api.get("/server");
        assert_eq!(r.status, 200);
        api.check("/server", "get", &r);
    }
    let path = "/sessions/{session_id}/inputs/{input_id}";
    let r = api.send(
        "PUT",
        &target(101),
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        Some(body.as_bytes()),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.json()
    );
    api.check(path, "put", &r);
    slow.send(rest.as_bytes());
    let r = slow.read().expect("an answer to the finished body");
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    // Served while the stalled bodies still wait: none was cut short to
    // make room (but the one chunked body past the budget).
    for (i, c) in fixed.iter_mut().enumerate() {
        assert!(c.open_and_quiet(), "stalled body {i} was answered early");
    }
    let answered = chunked
        .iter_mut()
        .map(|c| !c.open_and_quiet())
        .filter(|a| *a)
        .count();
    assert!(
        answered <= 1,
        "{answered} chunked bodies were answered early"
    );
    for (i, c) in fixed.iter_mut().enumerate() {
        let r = c.read().expect("an answer to a stalled body");
        assert_eq!(
            (r.status, r.code().as_str()),
            (408, "request_timeout"),
            "stalled body {i}"
        );
        api.check(path, "put", &r);
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed(), "stalled body {i} stays open");
    }
    let mut codes: Vec<(u16, String)> = chunked
        .iter_mut()
        .map(|c| {
            let r = c.read().expect("an answer to a stalled chunked body");
            api.check(path, "put", &r);
            assert_eq!(r.header("connection"), Some("close"));
            assert!(
                r.status != 503 || r.header("retry-after").is_some(),
                "503 without Retry-After"
            );
            assert!(c.closed());
            (r.status, r.code())
        })
        .collect();
    codes.sort();
    let mut want = vec![(408, "request_timeout".to_string()); 10];
    want.push((503, "unavailable".to_string()));
    assert_eq!(codes, want);
    api.d.stop();
}
