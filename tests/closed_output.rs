//! A client command whose standard output goes away (`omniconfluxd events
//! --follow | head`) ends quietly with status 0, as src/cli/mod.rs decides:
//! no panic, nothing on standard error. Standard output that cannot be
//! written for another reason (a full device) fails with status 1 and says
//! why. Each command runs as the real binary against a real daemon, its
//! standard output a pipe whose reading end is closed before it starts, so
//! its first write meets EPIPE.

mod util;

use serde_json::json;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use util::{Daemon, PATIENCE, TestDir, bin};

/// Runs the binary with `stdout` as its standard output; returns its exit
/// status and standard error, failing the test if it does not end.
fn run_into(args: &[&str], stdout: Stdio) -> (ExitStatus, String) {
    let child = Command::new(bin())
        .args(args)
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cli");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(out) => {
            let out = out.expect("wait for cli");
            (out.status, String::from_utf8_lossy(&out.stderr).into())
        }
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{args:?} did not end after its standard output closed");
        }
    }
}

/// A pipe whose reader has gone, as `| head` leaves it: the standard input
/// of a `true` that has ended.
fn closed_pipe() -> Stdio {
    let mut reader = Command::new("true")
        .stdin(Stdio::piped())
        .spawn()
        .expect("run true");
    let writer = reader.stdin.take().expect("true's standard input");
    reader.wait().expect("wait for true");
    Stdio::from(writer)
}

#[test]
fn a_closed_standard_output_ends_a_client_command_quietly() {
    let dir = TestDir::new("closedout");
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    c.call(
        "events.append",
        json!({"stream": "x-closed", "kind": "note", "data": {"n": 1}}),
    );
    let sock = d.socket.display().to_string();
    let commands: [&[&str]; 9] = [
        &["events", "--stream", "x-closed", "--follow"],
        &["events", "--stream", "x-closed"],
        &["sessions"],
        &["approvals"],
        &["lanes"],
        &["repos"],
        &["--json", "plugin", "list"],
        &["status"],
        &["help"],
    ];
    for args in commands {
        let mut all = vec!["--socket", sock.as_str()];
        all.extend_from_slice(args);
        let (status, err) = run_into(&all, closed_pipe());
        assert_eq!(
            (status.code(), err.as_str()),
            (Some(0), ""),
            "{args:?} into a closed pipe"
        );
    }
    d.stop();
}

#[test]
fn a_full_standard_output_fails_the_command_and_says_why() {
    let dir = TestDir::new("fullout");
    let d = Daemon::start(&dir.path);
    let sock = d.socket.display().to_string();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let (status, err) = run_into(&["--socket", &sock, "sessions"], Stdio::from(full));
    assert_eq!(
        (status.code(), err.as_str()),
        (
            Some(1),
            "omniconfluxd: unable to write to standard output: no space left on device\n"
        )
    );
    d.stop();
}
