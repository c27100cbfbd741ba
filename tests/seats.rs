//! Seats on defaults (issue 9, items 2 and 3): with no `[[seat]]` the
//! daemon offers the agent CLIs it knows on PATH, `[seats] detect = false`
//! turns that off, configured seats always win, and a seat reads `probing`
//! until its first probe answers. The agents are small shell scripts named
//! like the real CLIs, in a directory put first on the daemon's PATH; the
//! `claude` one runs tests/fixtures/fake_stream_json_agent.py. A probe the
//! test must catch in the act blocks on a FIFO the test opens when it has
//! looked; nothing here sleeps.

mod util;

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use util::http::{Conn, check_reply, openapi, request};
use util::{Daemon, Opts, PATIENCE, TestDir, run_cli};

/// A directory of fake agent CLIs, first on the daemon's PATH.
struct Bin {
    dir: PathBuf,
}

impl Bin {
    fn new(dir: &TestDir) -> Bin {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        Bin { dir: bin }
    }

    /// `name`, answering `--version` after running `before_version`, and
    /// otherwise the fake stream-json agent.
    fn agent(&self, name: &str, before_version: &str) {
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_stream_json_agent.py");
        let text = format!(
            "#!/bin/sh\nif [ \"$1\" = \"--version\" ]; then\n  {before_version}\n  echo '2.1.328 (Claude Code)'\n  exit 0\nfi\nexec python3 '{}' \"$@\"\n",
            fixture.display()
        );
        // Written under another name and renamed, so that no process ever
        // runs a file still open for writing.
        let tmp = self.dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, self.dir.join(name)).unwrap();
    }

    fn path_var(&self) -> String {
        format!(
            "{}:{}",
            self.dir.display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
        )
    }
}

fn start(dir: &TestDir, bin: &Bin, config: Option<&str>, extra: &[&str]) -> Daemon {
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    Daemon::start_with(
        &dir.path,
        Opts {
            config: config.map(String::from),
            no_config_file: config.is_none(),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            env: vec![
                ("PATH".into(), bin.path_var()),
                ("XDG_CONFIG_HOME".into(), xdg.display().to_string()),
                // Not absolute, so not a service's configuration directory.
                ("CONFIGURATION_DIRECTORY".into(), String::new()),
            ],
        },
    )
}

fn seats(d: &Daemon) -> Vec<Value> {
    d.connect().call("seats.list", json!({}))["seats"]
        .as_array()
        .unwrap()
        .clone()
}

fn harnesses(d: &Daemon) -> Vec<(String, String)> {
    seats(d)
        .iter()
        .map(|s| {
            (
                s["harness"].as_str().unwrap().to_string(),
                s["origin"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn cli(d: &Daemon, args: &[&str]) -> String {
    let sock = d.socket.display().to_string();
    let mut all = vec!["--socket", sock.as_str()];
    all.extend_from_slice(args);
    let (code, out, err) = run_cli(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

/// GET /seats, checked against openapi.yaml.
fn http_seats(d: &Daemon) -> Value {
    let line = d.wait_log("serving HTTP on ");
    let addr: std::net::SocketAddr = line
        .split("serving HTTP on ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|a| a.parse().ok())
        .expect("address in log");
    let token = std::fs::read_to_string(d.state.join("http.token")).expect("token file");
    let auth = format!("Bearer {}", token.trim());
    let mut c = Conn::open(addr);
    c.send(&request(
        "GET",
        "/seats",
        &addr.to_string(),
        &[("Authorization", &auth)],
        None,
    ));
    let r = c.read().expect("an answer");
    assert_eq!(r.status, 200);
    check_reply(&openapi(), "/seats", "get", &r);
    r.json()
}

#[test]
fn a_fresh_daemon_offers_the_claude_on_its_path_probes_it_and_runs_turns() {
    let dir = TestDir::new("seatfresh");
    let bin = Bin::new(&dir);
    let fifo = dir.join("version-gate");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    bin.agent("claude", &format!("cat '{}' >/dev/null", fifo.display()));
    let d = start(&dir, &bin, None, &["--http", "127.0.0.1:0"]);

    // Detected, and probing while its `--version` waits on the FIFO.
    d.wait_log("seat claude: detected");
    let s = seats(&d);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0]["harness"], "claude");
    assert_eq!(s[0]["origin"], "detected");
    assert_eq!(s[0]["status"], "probing");
    assert_eq!(s[0]["transport"], "stream-json");
    assert_eq!(s[0]["provider"], "anthropic");
    assert_eq!(s[0]["family"], "anthropic");
    assert_eq!(s[0]["probed_at"], Value::Null);
    let h = http_seats(&d);
    assert_eq!(h["items"][0]["status"], "probing", "{h}");
    assert_eq!(h["items"][0]["origin"], "detected", "{h}");
    let out = cli(&d, &["seats"]);
    assert!(
        out.contains("claude") && out.contains("probing") && out.contains("detected"),
        "{out}"
    );

    // Let the probe answer: opening the FIFO for writing releases its
    // reader, on a thread so that a probe that never came cannot hang us.
    let (tx, rx) = mpsc::channel();
    let gate = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::OpenOptions::new().write(true).open(&gate).is_ok());
    });
    assert_eq!(
        rx.recv_timeout(PATIENCE),
        Ok(true),
        "the probe never read its FIFO"
    );
    d.wait_log("seat claude: ready");
    let s = seats(&d);
    assert_eq!(s[0]["status"], "ready", "{s:?}");
    assert!(
        s[0]["program"].as_str().unwrap().ends_with("/bin/claude"),
        "{s:?}"
    );
    assert_eq!(http_seats(&d)["items"][0]["status"], "ready");

    // A session on it runs a turn, with no config file at all.
    let wt = dir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let mut c = d.connect();
    c.call("events.subscribe", json!({}));
    let sid = c.call(
        "sessions.spawn",
        json!({"harness": "claude", "cwd": wt.display().to_string(), "prompt": "hello"}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    loop {
        let n = c.next_note("event");
        if n["params"]["stream"] == sid.as_str() && n["params"]["kind"] == "turn.end" {
            assert_eq!(n["params"]["data"]["reason"], "completed", "{n}");
            break;
        }
    }
    let view = c.call("sessions.transcriptView", json!({"session_id": sid}));
    assert!(view.to_string().contains("echo: hello"), "{view}");
    d.stop();

    // After a restart the session is reopened on the detected seat, which
    // the registry knows only once the probe worker has looked at PATH.
    bin.agent("claude", ":");
    let d = start(&dir, &bin, None, &[]);
    d.wait_log(&format!("session {sid}: reopened claude"));
    let mut c = d.connect();
    c.call("events.subscribe", json!({}));
    c.call(
        "sessions.input",
        json!({"session_id": sid, "text": "again"}),
    );
    loop {
        let n = c.next_note("event");
        if n["params"]["stream"] == sid.as_str() && n["params"]["kind"] == "turn.end" {
            assert_eq!(n["params"]["data"]["reason"], "completed", "{n}");
            break;
        }
    }
    d.stop();
}

#[test]
fn detection_follows_the_key_reloads_and_probes_and_configured_seats_win() {
    let dir = TestDir::new("seatdetect");
    let bin = Bin::new(&dir);
    bin.agent("claude", ":");
    let d = start(&dir, &bin, Some("[seats]\ndetect = false\n"), &[]);
    let cfg = dir.join("omniconfluxd.toml");

    // Off by the key: nothing offered although claude is on PATH.
    assert_eq!(harnesses(&d), vec![]);
    assert!(cli(&d, &["seats"]).contains("no seats"));

    // On again (the default) by a reload.
    std::fs::write(&cfg, "").unwrap();
    d.signal(libc::SIGHUP);
    d.wait_log("seat claude: detected");
    d.wait_log("seat claude: ready");
    assert_eq!(
        harnesses(&d),
        vec![("claude".to_string(), "detected".to_string())]
    );

    // seats.probe detects again: a new agent joins, a removed one leaves.
    bin.agent("codex-acp", ":");
    d.connect().call("seats.probe", json!({}));
    d.wait_log("seat codex: detected");
    d.wait_log("seat codex: ready");
    let s = seats(&d);
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(
        (&s[1]["harness"], &s[1]["transport"], &s[1]["family"]),
        (&json!("codex"), &json!("acp"), &json!("openai"))
    );
    std::fs::remove_file(bin.dir.join("claude")).unwrap();
    d.connect().call("seats.probe", json!({}));
    d.wait_log("seat claude: no longer detected on PATH");
    assert_eq!(
        harnesses(&d),
        vec![("codex".to_string(), "detected".to_string())]
    );

    // One [[seat]] and nothing is detected.
    std::fs::write(&cfg, mine()).unwrap();
    d.signal(libc::SIGHUP);
    d.wait_log("seat mine: ready");
    assert_eq!(
        harnesses(&d),
        vec![("mine".to_string(), "configured".to_string())]
    );
    d.stop();
}

#[test]
fn configured_seats_win_from_the_start() {
    let dir = TestDir::new("seatconf");
    let bin = Bin::new(&dir);
    bin.agent("claude", ":");
    let d = start(&dir, &bin, Some(&mine()), &[]);
    d.wait_log("seat mine: ready");
    assert_eq!(
        harnesses(&d),
        vec![("mine".to_string(), "configured".to_string())]
    );
    assert!(!d.log_text().contains("seat claude"), "{}", d.log_text());
    d.stop();
}

/// A configured stream-json seat on the fake agent.
fn mine() -> String {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_stream_json_agent.py");
    format!(
        "[[seat]]\nharness = \"mine\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"stream-json\"\nprovider = \"test\"\nfamily = \"local\"\n",
        fixture.display()
    )
}

#[test]
fn a_lane_refuses_a_seat_whose_first_probe_has_not_answered() {
    let dir = TestDir::new("seatlane");
    let bin = Bin::new(&dir);
    let fifo = dir.join("version-gate");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    bin.agent(
        "slow-agent",
        &format!("cat '{}' >/dev/null", fifo.display()),
    );
    bin.agent("quick-agent", ":");
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let seat = |harness: &str, command: &str, family: &str| {
        format!(
            "[[seat]]\nharness = \"{harness}\"\ncommand = \"{command}\"\ntransport = \"stream-json\"\nprovider = \"{family}\"\nfamily = \"{family}\"\n\n"
        )
    };
    let config = format!(
        "[[repo]]\npath = \"{}\"\n\n{}{}",
        repo.display(),
        // Probed in this order, one at a time: quick answers, slow waits.
        seat("quick", "quick-agent", "openai"),
        seat("slow", "slow-agent", "anthropic")
    );
    let d = start(&dir, &bin, Some(&config), &[]);
    d.wait_log("seat quick: ready");
    let mut c = d.connect();
    let s = seats(&d);
    assert_eq!(s[1]["status"], "probing", "{s:?}");
    let code = c.error_code(
        "task.dispatch",
        json!({"repo": repo.display().to_string(), "task": "Add a file.", "builder": "slow",
               "verifier": "quick", "acceptance": {"name": "file exists", "command": "test -f a"}}),
    );
    assert_eq!(code, "seat-not-ready");

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::OpenOptions::new().write(true).open(&fifo).is_ok());
    });
    assert_eq!(
        rx.recv_timeout(PATIENCE),
        Ok(true),
        "the probe never read its FIFO"
    );
    d.wait_log("seat slow: ready");
    d.stop();
}
