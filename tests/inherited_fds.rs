//! A descriptor the daemon inherited does not reach its agents (issue 16,
//! item 5 of the outside review): started as `exec 7>file; omniconfluxd
//! serve` would start it, with a file left open across exec, the daemon
//! marks it close-on-exec first, so an agent and the shell it runs list no
//! descriptor of that file. Alone in its own test binary: the open
//! descriptor would leak into what the other tests start.

mod util;

use serde_json::json;
use std::os::fd::AsRawFd;
use util::{Daemon, Opts, TestDir};

#[test]
fn an_inherited_descriptor_does_not_reach_the_agent() {
    let dir = TestDir::new("fds");
    let wt = dir.join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let wt = wt.canonicalize().unwrap();
    let secret = dir.join("left-open-by-the-starter.txt");
    let file = std::fs::File::create(&secret).unwrap();
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFD/F_SETFD change only the flags of our own open
    // descriptor, which `file` keeps open for the whole test.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        assert!(flags >= 0);
        assert_eq!(libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC), 0);
    }
    // The agent's shell lists what it and the agent (its parent) hold.
    let list = "for f in /proc/$$/fd/* /proc/$PPID/fd/*; do readlink \"$f\"; done > fds.txt";
    let script = json!([[{"run": ["sh", "-c", list]}, {"text": "listed"}]]);
    let config = format!(
        "[[seat]]\nharness = \"fake\"\ncommand = \"python3\"\nargs = [\"{}/tests/fixtures/fake_acp_agent.py\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"local\"\nenv = {{ FAKE_SCRIPT = {} }}\n",
        env!("CARGO_MANIFEST_DIR"),
        serde_json::to_string(&script.to_string()).unwrap()
    );
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(config),
            ..Opts::default()
        },
    );
    // The daemon was started with it: its own table shows the file.
    let theirs = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .any(|t| t == secret);
    assert!(theirs, "the daemon did not inherit the descriptor");
    let mut c = d.connect();
    c.call("events.subscribe", json!({}));
    let sid = c.call(
        "sessions.spawn",
        json!({"harness": "fake", "cwd": wt.display().to_string(), "prompt": "list"}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    loop {
        let n = c.next_note("event");
        if n["params"]["stream"] == sid.as_str() && n["params"]["kind"] == "turn.end" {
            break;
        }
    }
    let fds = std::fs::read_to_string(wt.join("fds.txt")).unwrap();
    assert!(fds.lines().count() >= 3, "{fds}");
    assert!(
        !fds.contains("left-open-by-the-starter"),
        "the agent holds the inherited file:\n{fds}"
    );
    drop(file);
    d.stop();
}
