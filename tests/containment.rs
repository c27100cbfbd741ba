//! Agents are contained (issue 16, "Tests"): a scripted ACP agent tries,
//! during its turn, every way to the operator's powers the issue names (the
//! daemon socket, directly, through a double fork and setsid and through
//! /proc; the state directory's token, ledger and a write; the user's bus
//! and systemd manager; tmux servers, the operator's and the default one)
//! and does ordinary work (edits its worktree, commits with git, writes in
//! the operator's home, reaches the HTTP API over loopback). Every escape
//! fails and all the work succeeds. A stop reaches the agent as SIGTERM, so
//! it can end cleanly. With `[agents] isolation = "none"`, and on a PATH
//! without bwrap, the daemon says that agents run uncontained, in its log,
//! its replies and the command line's `status` and `seats`. Real Claude
//! Code runs a turn inside the namespace against a loopback stand-in of its
//! API (tests/fixtures/anthropic_standin.py).
//!
//! Everything the agent is told about (the runtime directory with its
//! `bus`, the tmux directory, the home) is made by the test under its own
//! directory and handed to the daemon through its environment, so the test
//! does not depend on the machine having a user manager or a desktop.

mod util;

use serde_json::{Value, json};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use util::{Daemon, Opts, TestDir, bwrap_works, fixture, git};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

/// The operator's surroundings, made under the test directory: a home, a
/// runtime directory whose `bus` and `systemd/private` sockets the test
/// listens on, a tmux directory with a running tmux server, a worktree
/// that is a git repository.
struct World {
    home: PathBuf,
    runtime: PathBuf,
    tmux_dir: PathBuf,
    tmux_socket: PathBuf,
    wt: PathBuf,
    bus: UnixListener,
    systemd: UnixListener,
    tmux_started: bool,
}

impl World {
    fn new(dir: &TestDir) -> World {
        World::new_with(dir, false)
    }

    /// With `linked`, the daemon's state and socket directories and the
    /// home's parent are reached through symlinks, as on a machine whose
    /// `/home` is a link to another disk.
    fn new_with(dir: &TestDir, linked: bool) -> World {
        use std::os::unix::fs::PermissionsExt;
        if linked {
            for (link, real) in [
                ("state", "state.real"),
                ("run", "run.real"),
                ("homes", "homes.real"),
            ] {
                std::fs::create_dir_all(dir.join(real)).unwrap();
                std::os::unix::fs::symlink(dir.join(real), dir.join(link)).unwrap();
            }
        }
        let home = if linked {
            dir.join("homes/op")
        } else {
            dir.join("home")
        };
        let runtime = dir.join("rt");
        let tmux_base = dir.join("tmx");
        let tmux_dir = tmux_base.join(format!("tmux-{}", uid()));
        let wt = dir.join("wt");
        for d in [&home, &runtime, &tmux_dir, &wt, &runtime.join("systemd")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&tmux_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let bus = UnixListener::bind(runtime.join("bus")).unwrap();
        let systemd = UnixListener::bind(runtime.join("systemd/private")).unwrap();
        bus.set_nonblocking(true).unwrap();
        systemd.set_nonblocking(true).unwrap();
        let tmux_socket = tmux_dir.join("default");
        let tmux_started = Command::new("tmux")
            .arg("-S")
            .arg(&tmux_socket)
            .args(["new-session", "-d", "-s", "op", "sleep 600"])
            .status()
            .is_ok_and(|s| s.success());
        git(&wt, &["init", "-q", "-b", "main"]);
        std::fs::write(wt.join("a.txt"), "one\n").unwrap();
        git(&wt, &["add", "a.txt"]);
        git(&wt, &["commit", "-q", "-m", "first"]);
        World {
            home,
            runtime,
            tmux_dir,
            tmux_socket,
            wt: wt.canonicalize().unwrap(),
            bus,
            systemd,
            tmux_started,
        }
    }

    /// The daemon's environment: the operator's, as the world has it.
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("HOME".into(), self.home.display().to_string()),
            (
                "XDG_CONFIG_HOME".into(),
                self.home.join(".config").display().to_string(),
            ),
            ("XDG_RUNTIME_DIR".into(), self.runtime.display().to_string()),
            (
                "TMUX_TMPDIR".into(),
                self.tmux_dir.parent().unwrap().display().to_string(),
            ),
        ]
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if self.tmux_started {
            let _ = Command::new("tmux")
                .arg("-S")
                .arg(&self.tmux_socket)
                .arg("kill-server")
                .status();
        }
    }
}

/// A `[[seat]]` running the fake ACP agent with `script` and `env`.
fn seat(command: &str, args: &[String], script: &Value, env: &[(&str, String)]) -> String {
    let mut env_s = format!("FAKE_SCRIPT = '{script}'");
    for (k, v) in env {
        env_s.push_str(&format!(", {k} = '{v}'"));
    }
    format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"{command}\"\nargs = {}\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ {env_s} }}\n\n",
        serde_json::to_string(args).unwrap()
    )
}

/// Waits for the event `kind` of stream `sid` (the client subscribed).
fn wait_event(c: &mut util::Client, sid: &str, kind: &str) -> Value {
    loop {
        let n = c.next_note("event");
        if n["params"]["stream"] == sid && n["params"]["kind"] == kind {
            return n["params"].clone();
        }
    }
}

/// The JSON report the agent's turn wrote as its reply text.
fn turn_report(c: &mut util::Client, sid: &str) -> Value {
    let entries = c.call("sessions.transcriptView", json!({"session_id": sid}))["entries"]
        .as_array()
        .unwrap()
        .clone();
    let text = entries
        .iter()
        .find(|e| e["kind"] == "text")
        .and_then(|e| e["text"].as_str())
        .unwrap_or_else(|| panic!("no report in {entries:?}"));
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn start(dir: &TestDir, w: &World, config: String) -> (Daemon, util::Client) {
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(config),
            env: w.env(),
            ..Opts::default()
        },
    );
    let mut c = d.connect();
    c.call("events.subscribe", json!({}));
    (d, c)
}

fn spawn(c: &mut util::Client, w: &World, prompt: &str) -> String {
    let r = c.call(
        "sessions.spawn",
        json!({"harness": "fake", "cwd": w.wt.display().to_string(), "prompt": prompt}),
    );
    r["session_id"].as_str().unwrap().to_string()
}

#[test]
fn every_escape_fails_and_ordinary_work_succeeds() {
    every_escape_fails(false);
}

/// Paths reached through symlinks are mounted over where they lead:
/// bwrap refuses to mount on a path with a symlink on the way, and every
/// agent would fail to start.
#[test]
fn a_state_dir_and_a_home_behind_symlinks_still_contain_agents() {
    every_escape_fails(true);
}

fn every_escape_fails(linked: bool) {
    if !bwrap_works() {
        return;
    }
    let dir = TestDir::new(if linked { "containl" } else { "contain" });
    let w = World::new_with(&dir, linked);
    let port = free_port();
    let state = dir.join("state");
    let script = json!([[{"text_from": ["python3", fixture("escape_attempts.py")]}]]);
    let env = [
        ("ESC_SOCKET", dir.join("run/d.sock").display().to_string()),
        ("ESC_STATE", state.display().to_string()),
        ("ESC_TOKEN", state.join("http.token").display().to_string()),
        ("ESC_HTTP", format!("127.0.0.1:{port}")),
        ("ESC_RUNTIME", w.runtime.display().to_string()),
        ("ESC_TMUX", w.tmux_socket.display().to_string()),
        (
            "ESC_CONFIG",
            dir.join("omniconfluxd.toml").display().to_string(),
        ),
        (
            "ESC_DEFAULT_CONFIG_DIR",
            w.home.join(".config/omniconflux").display().to_string(),
        ),
    ];
    let config = format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n\n{}",
        seat("python3", &[fixture("fake_acp_agent.py")], &script, &env)
    );
    let (d, mut c) = start(&dir, &w, config);
    d.wait_log("agents run contained");
    if uid() == 0 {
        let line = d.wait_log("agents run as root");
        assert_eq!(
            line,
            "warn: agents run as root: they can write root-owned files such as /etc"
        );
    }
    assert!(
        state.join("http.token").exists(),
        "the token is there to steal"
    );
    let sid = spawn(&mut c, &w, "try every door");
    let end = wait_event(&mut c, &sid, "turn.end");
    assert_eq!(end["data"]["reason"], "completed", "{end}");
    let line = d.wait_log(&format!("session {sid}: started fake"));
    assert!(line.ends_with(", contained"), "{line}");

    let report = turn_report(&mut c, &sid);
    let mut tried: Vec<&str> = Vec::new();
    for (name, r) in report["escapes"].as_object().unwrap() {
        assert_eq!(r["escaped"], false, "escape {name} worked: {report:#}");
        tried.push(name);
    }
    let mut expected = vec![
        "socket",
        "state_listing",
        "token",
        "ledger",
        "state_write",
        "bus",
        "systemd",
        "double_fork",
        "proc_root",
        "config_write",
        "default_config_write",
        "sys_write",
    ];
    // Without tmux the other escapes are still worth trying; under CI the
    // rule of `util::need` fails the test.
    let tmux = util::need::have(
        if w.tmux_started {
            Ok(())
        } else {
            Err("tmux does not start a server here".to_string())
        },
        "the Debian package tmux",
    );
    if tmux.is_some() {
        expected.extend([
            "tmux_operator_list",
            "tmux_operator_new",
            "tmux_default_listing",
            "tmux_default",
        ]);
    }
    for name in expected {
        assert!(tried.contains(&name), "{name} was not tried: {report:#}");
    }
    for name in ["edit", "git", "home_write", "loopback"] {
        assert_eq!(
            report["work"][name]["ok"], true,
            "{name} failed: {report:#}"
        );
    }
    // The HTTP API answered over loopback, and without the token refused.
    let head = report["work"]["loopback"]["detail"].as_str().unwrap();
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");

    // What the operator sees afterwards.
    assert!(!state.join("planted").exists());
    let config = std::fs::read_to_string(dir.join("omniconfluxd.toml")).unwrap();
    assert!(!config.contains("approvals.rule"), "{config}");
    assert!(
        !w.home
            .join(".config/omniconflux/omniconfluxd.toml")
            .exists()
    );
    assert_eq!(
        std::fs::read_to_string(w.home.join("from-agent.txt")).unwrap(),
        "the operator's files are the agent's work\n"
    );
    assert_eq!(
        git(&w.wt, &["log", "-1", "--format=%s"]),
        "the agent's edit"
    );
    for l in [&w.bus, &w.systemd] {
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the agent reached the user's bus or manager: {other:?}"),
        }
    }
    if w.tmux_started {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&w.tmux_socket)
            .args(["list-sessions", "-F", "#{session_name}"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "op\n");
    }
    let info = c.call("server.info", json!({}));
    assert_eq!(
        info["agent_isolation"],
        json!({"mode": "namespace", "reason": null})
    );
    let seats = c.call("seats.list", json!({}));
    assert_eq!(seats["agent_isolation"]["mode"], "namespace");
    d.stop();
}

#[test]
fn a_stop_reaches_the_agent_as_sigterm_inside_its_namespace() {
    if !bwrap_works() {
        return;
    }
    let dir = TestDir::new("cterm");
    let w = World::new(&dir);
    // The agent is bash (its --version satisfies the seat probe), which records the SIGTERM it gets, with the fake
    // ACP agent as its child on the same stdio: were the signal to reach
    // only bwrap, the namespace would end in SIGKILL and nothing be written.
    // A stop closes the agent's stdin as it signals it, so the fake agent
    // may end first: bash then waits on for the signal (a `wait` returns
    // at once for a trapped one), rather than exiting before it arrives.
    let wrapper = format!(
        "exec 3<&0; trap 'echo SIGTERM > \"$WT\"/term.txt; exit 0' TERM; python3 {} 0<&3 3<&- & wait; sleep infinity & wait $!",
        fixture("fake_acp_agent.py")
    );
    let env = [("WT", w.wt.display().to_string())];
    let config = seat("bash", &["-c".into(), wrapper], &json!([]), &env);
    let (d, mut c) = start(&dir, &w, config);
    let sid = spawn(&mut c, &w, "hello");
    wait_event(&mut c, &sid, "turn.end");
    c.call("sessions.kill", json!({"session_id": sid}));
    let end = wait_event(&mut c, &sid, "session.end");
    assert_eq!(end["data"]["code"], 0, "{end}");
    assert_eq!(
        std::fs::read_to_string(w.wt.join("term.txt")).unwrap(),
        "SIGTERM\n"
    );
    assert_eq!(end["data"]["code"], 0, "{end}");
    d.stop();
}

/// A contained agent of one daemon is no operator of another daemon on the
/// machine: its walk reaches pid 1 outside that daemon's tree, but it lives
/// in another pid namespace (issue 16; omniconfluxd(8) CALLERS).
#[test]
fn an_agent_of_one_daemon_is_refused_operator_methods_by_another() {
    if !bwrap_works() {
        return;
    }
    let other_dir = TestDir::new("cross-b");
    let port = free_port();
    let other = Daemon::start_with(
        &other_dir.path,
        Opts {
            config: Some(format!("[http]\nlisten = \"127.0.0.1:{port}\"\n")),
            ..Opts::default()
        },
    );
    let other_socket = other_dir.join("run/d.sock");
    let other_token = other_dir.join("state/http.token");
    let dir = TestDir::new("cross-a");
    let w = World::new(&dir);
    let script = json!([[{"text_from": ["python3", fixture("escape_attempts.py"), "other",
        other_socket.display().to_string(), format!("127.0.0.1:{port}"),
        other_token.display().to_string()]}]]);
    let config = seat("python3", &[fixture("fake_acp_agent.py")], &script, &[]);
    let (d, mut c) = start(&dir, &w, config);
    let sid = spawn(&mut c, &w, "call the other daemon");
    let end = wait_event(&mut c, &sid, "turn.end");
    assert_eq!(end["data"]["reason"], "completed", "{end}");
    let got = turn_report(&mut c, &sid);
    assert_eq!(
        got["info"]["result"]["caller"]["class"], "unverified",
        "{got}"
    );
    assert_eq!(
        got["stop"]["error"]["data"]["code"], "operator-only",
        "{got}"
    );
    // Over HTTP, with the other daemon's token in hand, likewise.
    assert_eq!(got["http"]["status"], 403, "{got}");
    assert_eq!(got["http"]["body"]["code"], "operator_only", "{got}");
    // The other daemon still runs, and its own operator is still one.
    let mut oc = other.connect();
    assert_eq!(
        oc.call("server.info", json!({}))["caller"]["class"],
        "operator"
    );
    d.stop();
    other.stop();
}

/// The agent's environment (omniconfluxd(8), "Environment of agents"):
/// provider settings and proxies of the daemon's environment pass, the
/// daemon's own OMNICONFLUX_* and NOTIFY_SOCKET do not, a seat's `env` wins,
/// and a contained agent's XDG_RUNTIME_DIR is an empty directory of its own.
#[test]
fn an_agent_gets_provider_settings_and_an_own_runtime_dir_but_not_the_daemons() {
    if !bwrap_works() {
        return;
    }
    let dir = TestDir::new("agentenv");
    let w = World::new(&dir);
    // Double quotes only: the script travels in a TOML literal string.
    let report = r#"import json, os; r = os.environ.get("XDG_RUNTIME_DIR"); open(os.path.join(r, "mine"), "w").write("x"); print(json.dumps({"env": dict(os.environ), "runtime": sorted(os.listdir(r))}))"#;
    let script = json!([[{"text_from": ["python3", "-c", report]}]]);
    let env = [("ANTHROPIC_MODEL", "from-the-seat".to_string())];
    let config = seat("python3", &[fixture("fake_acp_agent.py")], &script, &env);
    let mut daemon_env = w.env();
    for (k, v) in [
        ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/standin"),
        ("ANTHROPIC_MODEL", "from-the-daemon"),
        ("HTTPS_PROXY", "http://proxy.invalid:3128"),
        ("OMNICONFLUX_NOT_FOR_AGENTS", "secret"),
        ("SOME_OTHER_SECRET", "secret"),
    ] {
        daemon_env.push((k.into(), v.into()));
    }
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(config),
            env: daemon_env,
            ..Opts::default()
        },
    );
    let mut c = d.connect();
    c.call("events.subscribe", json!({}));
    let sid = spawn(&mut c, &w, "report your environment");
    let end = wait_event(&mut c, &sid, "turn.end");
    assert_eq!(end["data"]["reason"], "completed", "{end}");
    let got = turn_report(&mut c, &sid);
    let env = got["env"].as_object().unwrap();
    assert_eq!(env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:9/standin");
    assert_eq!(env["HTTPS_PROXY"], "http://proxy.invalid:3128");
    assert_eq!(env["ANTHROPIC_MODEL"], "from-the-seat");
    assert_eq!(env["OMNICONFLUX_SESSION"], sid.as_str());
    let leaked: Vec<&String> = env
        .keys()
        .filter(|k| k.starts_with("OMNICONFLUX_") && *k != "OMNICONFLUX_SESSION")
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
    assert!(!env.contains_key("SOME_OTHER_SECRET"));
    assert!(!env.contains_key("NOTIFY_SOCKET"));
    // Its runtime directory is the operator's path, empty and its own: the
    // operator's bus and manager are not in it, and what it wrote there is
    // not in the operator's.
    assert_eq!(
        env["XDG_RUNTIME_DIR"],
        w.runtime.display().to_string().as_str()
    );
    assert_eq!(got["runtime"], json!(["mine"]));
    assert!(!w.runtime.join("mine").exists());
    d.stop();
}

#[test]
fn agents_run_uncontained_when_configured_so_and_the_daemon_says_it() {
    let dir = TestDir::new("cnone");
    let w = World::new(&dir);
    let config = format!(
        "[agents]\nisolation = \"none\"\n\n{}",
        seat("python3", &[fixture("fake_acp_agent.py")], &json!([]), &[])
    );
    let (d, mut c) = start(&dir, &w, config);
    d.wait_log("agents run uncontained: agents.isolation is none");
    let info = c.call("server.info", json!({}));
    assert_eq!(
        info["agent_isolation"],
        json!({"mode": "none", "reason": "agents.isolation is none"})
    );
    let sid = spawn(&mut c, &w, "hello");
    wait_event(&mut c, &sid, "turn.end");
    let line = d.wait_log(&format!("session {sid}: started fake"));
    assert!(line.ends_with(", uncontained"), "{line}");
    let socket = d.socket.display().to_string();
    let (code, out, err) = util::run_cli(&["--socket", &socket, "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("agents      uncontained: agents.isolation is none"),
        "{out}"
    );
    let (code, out, err) = util::run_cli(&["--socket", &socket, "seats"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("agents run uncontained: agents.isolation is none"),
        "{out}"
    );
    d.stop();
}

/// The real Claude Code CLI, installed by tests/fixtures/install-claude-code.sh
/// beside the build (`.ci/run` does); missing, the rule of `util::need`
/// applies.
fn claude() -> Option<PathBuf> {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent()?;
    let p = target.join("claude-code/node_modules/.bin/claude");
    util::need::have(
        if p.is_file() {
            Ok(p)
        } else {
            Err(format!("Claude Code is not installed at {}", p.display()))
        },
        "Claude Code with tests/fixtures/install-claude-code.sh",
    )
}

/// The loopback stand-in of the Anthropic API, answering with `replies`.
/// Its stdin is held, so it ends with the test (`--die-with-stdin`).
fn standin(replies: &[&str]) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut child = Command::new("python3")
        .arg(fixture("anthropic_standin.py"))
        .arg("--die-with-stdin")
        .args(replies)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("port {line:?}"));
    (child, port)
}

#[test]
fn real_claude_code_runs_a_turn_and_a_tool_inside_the_namespace() {
    if !bwrap_works() {
        return;
    }
    let Some(claude) = claude() else { return };
    let dir = TestDir::new("cclaude");
    let w = World::new(&dir);
    // One Bash tool use, then text: the tool is the agent's own child, so
    // it runs inside the namespace too; /proc/1 there is bwrap's init.
    let (_api, port) = standin(&[
        "bash:cat /proc/1/comm > made-inside.txt",
        "text:done inside",
    ]);
    let env = format!(
        "ANTHROPIC_BASE_URL = 'http://127.0.0.1:{port}', ANTHROPIC_API_KEY = 'dummy', \
         CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = '1', DISABLE_AUTOUPDATER = '1', \
         DISABLE_TELEMETRY = '1', DISABLE_ERROR_REPORTING = '1'"
    );
    let config = format!(
        "[[seat]]\nharness = \"claude\"\ncommand = \"{}\"\ntransport = \"stream-json\"\nprovider = \"anthropic\"\nfamily = \"anthropic\"\nenv = {{ {env} }}\n",
        claude.display()
    );
    let (d, mut c) = start(&dir, &w, config);
    d.wait_log("agents run contained");
    d.wait_log("seat claude: ready");
    let r = c.call(
        "sessions.spawn",
        json!({"harness": "claude", "cwd": w.wt.display().to_string(), "prompt": "make a file"}),
    );
    let sid = r["session_id"].as_str().unwrap().to_string();
    let req = wait_event(&mut c, &sid, "approval.request");
    c.call(
        "approvals.answer",
        json!({"request_id": req["data"]["requestId"], "decision": "allow"}),
    );
    let end = wait_event(&mut c, &sid, "turn.end");
    assert_eq!(end["data"]["reason"], "completed", "{end}");
    let line = d.wait_log(&format!("session {sid}: started claude"));
    assert!(line.ends_with(", contained"), "{line}");
    assert_eq!(
        std::fs::read_to_string(w.wt.join("made-inside.txt")).unwrap(),
        "bwrap\n"
    );
    let entries = c.call("sessions.transcriptView", json!({"session_id": sid}))["entries"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        entries
            .iter()
            .any(|e| e["kind"] == "text" && e["text"] == "done inside"),
        "{entries:?}"
    );
    d.stop();
}

#[test]
fn without_bubblewrap_agents_run_uncontained_and_the_daemon_warns() {
    let dir = TestDir::new("cnobw");
    let w = World::new(&dir);
    // A PATH with python3 and nothing else: no bwrap to be found.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let py = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let py = String::from_utf8_lossy(&py.stdout).trim().to_string();
    std::os::unix::fs::symlink(&py, bin.join("python3")).unwrap();
    let config = seat("python3", &[fixture("fake_acp_agent.py")], &json!([]), &[]);
    let mut env = w.env();
    env.push(("PATH".into(), bin.display().to_string()));
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(config),
            env,
            ..Opts::default()
        },
    );
    let line = d.wait_log("agents run uncontained");
    assert!(
        line.starts_with("warn:")
            && line.ends_with(
                "agents run uncontained, with every power of the operator's user: bubblewrap (bwrap) is not installed"
            ),
        "{line}"
    );
    let mut c = d.connect();
    c.call("events.subscribe", json!({}));
    assert_eq!(
        c.call("server.info", json!({}))["agent_isolation"],
        json!({"mode": "none", "reason": "bubblewrap (bwrap) is not installed"})
    );
    let sid = spawn(&mut c, &w, "hello");
    wait_event(&mut c, &sid, "turn.end");
    let line = d.wait_log(&format!("session {sid}: started fake"));
    assert!(line.ends_with(", uncontained"), "{line}");
    d.stop();
}
