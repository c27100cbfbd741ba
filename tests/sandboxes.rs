//! Acceptance commands and plugins have at least the agents' secrecy (the
//! follow-up of issue 16, "Acceptance commands and plugins keep their
//! stricter sandboxes"): each runs tests/fixtures/sandbox_probe.py, which
//! tries to read the daemon's `http.token` and ledger, list its state
//! directory, connect to its socket, list the operator's runtime directory
//! and connect to the session bus, systemd and tmux sockets in it, and
//! looks at its own capabilities. Every attempt fails. The acceptance
//! command's ordinary work succeeds beside it, in a lane of a repository
//! under /tmp (which the check's private /tmp would hide but for the bind
//! of the repository's git directory): read and write its checkout, run
//! `git status`, `git diff --quiet HEAD`, `git log` and tools from /usr,
//! with no signal blocked; a `git commit` there fails and leaves the
//! repository's refs alone. The plugin writes its working directory and
//! reads its own copy.
//!
//! The runtime directory, with its `bus` and `systemd/private` sockets, and
//! the tmux directory are made by the test under its own directory and
//! handed to the daemon through its environment, as tests/containment.rs
//! does, so nothing depends on the machine's user manager.

mod util;

use serde_json::{Value, json};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use util::{Daemon, Opts, TestDir, bwrap_works, fixture, git};

fn uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

/// The operator's surroundings under the test directory: a home, a
/// runtime directory with `bus` and `systemd/private` listening, a tmux
/// directory with a listening socket.
struct World {
    home: PathBuf,
    runtime: PathBuf,
    tmux_base: PathBuf,
    tmux_socket: PathBuf,
    _listeners: Vec<UnixListener>,
}

impl World {
    fn new(dir: &TestDir) -> World {
        use std::os::unix::fs::PermissionsExt;
        let home = dir.join("home");
        let runtime = dir.join("rt");
        let tmux_base = dir.join("tmx");
        let tmux_dir = tmux_base.join(format!("tmux-{}", uid()));
        for d in [&home, &runtime, &tmux_dir, &runtime.join("systemd")] {
            std::fs::create_dir_all(d).unwrap();
        }
        for d in [&runtime, &tmux_dir] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let tmux_socket = tmux_dir.join("default");
        let listeners = [
            runtime.join("bus"),
            runtime.join("systemd/private"),
            tmux_socket.clone(),
        ]
        .iter()
        .map(|p| UnixListener::bind(p).unwrap())
        .collect();
        World {
            home,
            runtime,
            tmux_base,
            tmux_socket,
            _listeners: listeners,
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("HOME".into(), self.home.display().to_string()),
            ("XDG_RUNTIME_DIR".into(), self.runtime.display().to_string()),
            ("TMUX_TMPDIR".into(), self.tmux_base.display().to_string()),
        ]
    }

    /// What the probe tries, as its JSON argument.
    fn paths(&self, d: &Daemon) -> String {
        json!({
            "state": d.state.display().to_string(),
            "socket": d.socket.display().to_string(),
            "runtime": self.runtime.display().to_string(),
            "tmux": self.tmux_socket.display().to_string(),
        })
        .to_string()
    }
}

/// A directory of its own under /tmp, removed when the test passes.
struct UnderTmp(PathBuf);

impl UnderTmp {
    fn new(tag: &str) -> UnderTmp {
        let p = Path::new("/tmp").join(format!(
            "omni-{tag}-{}-{}",
            std::process::id(),
            omniconfluxd::ids::secret_hex(4)
        ));
        std::fs::create_dir_all(&p).unwrap();
        UnderTmp(p)
    }
}

impl Drop for UnderTmp {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `[[seat]]` of the fake ACP agent.
fn seat(harness: &str, family: &str, script: &Value) -> String {
    let q = |v: &str| serde_json::to_string(v).unwrap();
    format!(
        "[[seat]]\nharness = \"{harness}\"\ncommand = \"python3\"\nargs = [{}]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"{family}\"\nenv = {{ FAKE_SCRIPT = {} }}\n\n",
        q(&fixture("fake_acp_agent.py")),
        q(&script.to_string())
    )
}

/// Checks a probe's report: every escape tried and failed, every piece of
/// work done.
fn assert_contained(report: &Value, escapes: &[&str], work: &[&str]) {
    for name in escapes {
        let r = &report["escapes"][name];
        assert!(r.is_object(), "{name} was not tried: {report:#}");
        assert_eq!(r["escaped"], false, "escape {name} worked: {report:#}");
    }
    for name in work {
        assert_eq!(
            report["work"][name]["ok"], true,
            "{name} failed: {report:#}"
        );
    }
}

const ESCAPES: [&str; 9] = [
    "token",
    "ledger",
    "state_listing",
    "socket",
    "runtime_listing",
    "bus",
    "systemd",
    "tmux",
    "capabilities",
];

#[test]
fn an_acceptance_command_reaches_no_secret_and_git_works_under_tmp() {
    if !bwrap_works() {
        return;
    }
    let dir = TestDir::new("sbxcheck");
    let w = World::new(&dir);
    let tmp = UnderTmp::new("sbx");
    let repo = tmp.0.join("shop");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    git(&repo, &["add", "a.txt"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    // The builder brings the probe into the lane's commit: the check runs
    // it from its checkout, which is all of the test it may see.
    let builder =
        json!([[{"run": ["cp", fixture("sandbox_probe.py"), "probe.py"]}, {"text": "done"}]]);
    let verifier =
        json!([[{"text": "I read it.\n```omniconflux-verdict\n{\"verdict\":\"pass\"}\n```\n"}]]);
    let config = format!(
        "[http]\nlisten = \"127.0.0.1:{}\"\n\n[[repo]]\npath = \"{}\"\n\n{}{}",
        free_port(),
        repo.display(),
        seat("builder", "anthropic", &builder),
        seat("verifier", "openai", &verifier)
    );
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(config),
            env: w.env(),
            ..Opts::default()
        },
    );
    d.wait_log("seat builder: ready");
    d.wait_log("seat verifier: ready");
    d.wait_log("plugins run");
    assert!(d.state.join("http.token").exists(), "the token is there");
    assert!(
        d.state.join("ledger.sqlite3").exists(),
        "the ledger is there"
    );
    let mut events = d.connect();
    events.call("events.subscribe", json!({"streams": ["lanes"]}));
    let mut c = d.connect();
    let command = format!("python3 probe.py check '{}'", w.paths(&d));
    let lane = c.call(
        "task.dispatch",
        json!({"repo": repo.display().to_string(), "task": "Bring the probe", "builder": "builder",
               "verifier": "verifier", "acceptance": {"name": "contained", "command": command}}),
    );
    let id = lane["lane"].as_str().unwrap().to_string();
    let mut stages = Vec::new();
    loop {
        let ev = events.next_note("event")["params"].clone();
        if ev["kind"] == "lane.stage" {
            let s = ev["data"]["stage"].as_str().unwrap().to_string();
            stages.push(s.clone());
            if ["merged", "sent-back", "cap"].contains(&s.as_str()) {
                break;
            }
        }
    }
    let got = c.call("lanes.get", json!({"lane": id}));
    let tail = got["last_check"]["tail"].as_str().unwrap_or_default();
    assert_eq!(
        got["last_check"]["passed"],
        json!(true),
        "stages {stages:?}: {tail}"
    );
    let line = tail.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {tail}"));
    let mut escapes = ESCAPES.to_vec();
    escapes.push("git_commit");
    assert_contained(
        &report,
        &escapes,
        &[
            "read_checkout",
            "write_checkout",
            "git_status",
            "git_diff",
            "git_log",
            "tool_from_usr",
            "no_signal_blocked",
        ],
    );
    // The check's commit was refused by the read-only repository, not by
    // an empty change.
    let refused = report["escapes"]["git_commit"]["detail"].as_str().unwrap();
    assert!(refused.contains("Read-only file system"), "{refused}");
    assert_eq!(stages.last().map(String::as_str), Some("merged"));
    // The merge is the lane's one commit on top of the first: nothing of
    // the check's.
    assert_eq!(
        git(&repo, &["log", "--format=%s", "main"])
            .lines()
            .filter(|s| s.contains("from a check"))
            .count(),
        0
    );
    assert_eq!(git(&repo, &["show", "main:a.txt"]), "one");
    d.stop();
}

#[test]
fn a_plugin_reaches_no_secret() {
    if !bwrap_works() {
        return;
    }
    let dir = TestDir::new("sbxplug");
    let w = World::new(&dir);
    let py = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let config = format!(
        "[http]\nlisten = \"127.0.0.1:{}\"\n\n[plugins]\npython = \"{py}\"\n",
        free_port()
    );
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(config),
            env: w.env(),
            ..Opts::default()
        },
    );
    d.wait_log("plugins run isolated");
    assert!(d.state.join("http.token").exists(), "the token is there");
    let mut c = d.connect();
    let folder = dir.join("src-sbx");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(fixture("sandbox_probe.py"), folder.join("main.py")).unwrap();
    let manifest = json!({
        "manifestVersion": 1, "api": "1.0", "id": "sbx", "name": "Sandbox probe", "version": "1.0.0",
        "description": "Tries to reach the daemon's secrets.", "main": "main.py",
        "permissions": ["commands.add"],
        "commands": [{"id": "report", "title": "Report", "input": "text"}],
    });
    std::fs::write(folder.join("omniconflux-plugin.json"), manifest.to_string()).unwrap();
    let inst = c.call(
        "plugin.install",
        json!({"path": folder.display().to_string()}),
    );
    let r = c.call(
        "plugin.approve",
        json!({"plugin": "sbx", "snapshotHash": inst["snapshotHash"], "permissions": ["commands.add"],
               "commands": ["report"], "operator": "test operator"}),
    );
    assert_eq!(r["approved"], json!(true), "{r}");
    d.wait_log("plugin sbx is running");
    let r = c.call(
        "plugin.command.run",
        json!({"command": "sbx.report", "input": w.paths(&d)}),
    );
    let text = r["text"].as_str().unwrap();
    let report: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_contained(
        &report,
        &ESCAPES,
        &["write_work_dir", "read_own_copy", "no_signal_blocked"],
    );
    assert_eq!(
        std::fs::read_to_string(d.state.join("plugins/sbx/work/note.txt")).unwrap(),
        "mine\n"
    );
    d.stop();
}
