//! The daemon's own git runs nothing a builder configured, uncontained
//! (issue 16, item 1 of the outside review). A builder agent writes its
//! repository's git directory: it installs the hooks the daemon's git
//! would run (post-commit, post-checkout, post-merge), sets
//! `core.fsmonitor`, and names a clean and smudge filter in
//! `.gitattributes`. Each of them, when run, leaves a marker saying which
//! PID namespace it ran in and whether it reached the daemon's socket. The
//! lane then commits, checks out, checks, verifies and merges through the
//! daemon's git. Afterwards no hook and no file-system monitor ran at all,
//! and the filter (which git must run to stage and check out) ran, always
//! in a namespace of its own and never with the socket in reach.

mod util;

use serde_json::{Value, json};
use std::path::Path;
use util::{Daemon, Opts, TestDir, bwrap_works, git};

fn seat(harness: &str, family: &str, script: &Value) -> String {
    let q = |v: &str| serde_json::to_string(v).unwrap();
    format!(
        "[[seat]]\nharness = \"{harness}\"\ncommand = \"python3\"\nargs = [{}]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"{family}\"\nenv = {{ FAKE_SCRIPT = {} }}\n\n",
        q(&format!(
            "{}/tests/fixtures/fake_acp_agent.py",
            env!("CARGO_MANIFEST_DIR")
        )),
        q(&script.to_string())
    )
}

/// The marker every planted program runs: `mark.sh NAME [cat]` writes
/// `MARKS/NAME.<reached|blocked>.<pid>` holding its PID namespace, then
/// (as a filter) copies its input to its output.
fn mark_script(marks: &Path, socket: &Path) -> String {
    format!(
        r#"#!/bin/sh
r=blocked
if python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])' '{sock}' 2>/dev/null; then r=reached; fi
readlink /proc/self/ns/pid > '{marks}'/"$1.$r.$$"
if [ "$2" = cat ]; then exec cat; fi
"#,
        sock = socket.display(),
        marks = marks.display()
    )
}

#[test]
fn the_daemons_git_runs_no_hook_and_contains_the_filters() {
    if !bwrap_works() {
        return;
    }
    let dir = TestDir::new("gitcont");
    let repo = dir.join("shop");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    git(&repo, &["add", "a.txt"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    let marks = dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let mark = dir.join("mark.sh");
    std::fs::write(&mark, mark_script(&marks, &dir.join("run/d.sock"))).unwrap();
    let m = mark.display();
    // What the builder plants, from inside its own namespace, in the
    // repository's git directory and its worktree.
    let plant = format!(
        r#"set -e
G=$(git rev-parse --path-format=absolute --git-common-dir)
mkdir -p "$G/hooks"
for h in post-commit post-checkout post-merge; do
  printf '#!/bin/sh\nexec sh {m} %s\n' "$h" > "$G/hooks/$h"
  chmod +x "$G/hooks/$h"
done
printf '#!/bin/sh\nexec sh {m} fsmonitor\n' > "$G/fsmonitor.sh"
chmod +x "$G/fsmonitor.sh"
git config core.fsmonitor "$G/fsmonitor.sh"
git config filter.evil.clean "sh {m} clean cat"
git config filter.evil.smudge "sh {m} smudge cat"
git config filter.evil.required true
echo '* filter=evil' > .gitattributes
echo feature > feature.txt
"#
    );
    let builder = json!([[{"run": ["sh", "-c", plant]}, {"text": "done"}]]);
    let verifier =
        json!([[{"text": "I read it.\n```omniconflux-verdict\n{\"verdict\":\"pass\"}\n```\n"}]]);
    let config = format!(
        "[[repo]]\npath = \"{}\"\n\n{}{}",
        repo.display(),
        seat("builder", "anthropic", &builder),
        seat("verifier", "openai", &verifier)
    );
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(config),
            ..Opts::default()
        },
    );
    d.wait_log("agents run contained");
    d.wait_log("seat builder: ready");
    d.wait_log("seat verifier: ready");
    d.wait_log("plugins run");
    let mut events = d.connect();
    events.call("events.subscribe", json!({"streams": ["lanes"]}));
    let mut c = d.connect();
    let lane = c.call(
        "task.dispatch",
        json!({"repo": repo.display().to_string(), "task": "Add feature.txt", "builder": "builder",
               "verifier": "verifier", "acceptance": {"name": "feature exists", "command": "test -f feature.txt"},
               "name": "add feature"}),
    );
    let id = lane["lane"].as_str().unwrap().to_string();
    let mut stages = Vec::new();
    loop {
        let ev = events.next_note("event")["params"].clone();
        if ev["kind"] == "lane.stage" {
            let s = ev["data"]["stage"].as_str().unwrap().to_string();
            stages.push(s.clone());
            if ["merged", "sent-back", "cap", "merge-failed"].contains(&s.as_str()) {
                break;
            }
        }
    }
    assert_eq!(
        stages.last().map(String::as_str),
        Some("merged"),
        "{stages:?}"
    );
    // The builder did plant everything, and the lane went through the
    // daemon's commit, checkout and merge with it in place.
    let common = repo.join(".git");
    assert!(common.join("hooks/post-merge").is_file());
    assert_eq!(
        git(
            &repo,
            &["config", "--file", ".git/config", "core.fsmonitor"]
        ),
        common.join("fsmonitor.sh").display().to_string()
    );
    assert_eq!(git(&repo, &["show", "main:feature.txt"]), "feature");
    d.wait_log(&format!("lane {id}: worktree "));

    let ours = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let found: Vec<(String, String)> = std::fs::read_dir(&marks)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let ns = std::fs::read_to_string(e.path()).unwrap();
            (e.file_name().to_string_lossy().into_owned(), ns)
        })
        .collect();
    for (name, ns) in &found {
        let what = name.split('.').next().unwrap();
        assert!(
            what == "clean" || what == "smudge",
            "{what} ran: the daemon's git ran a hook or the monitor ({found:?})"
        );
        assert!(
            name.contains(".blocked."),
            "a filter reached the socket: {found:?}"
        );
        assert_ne!(
            Path::new(ns.trim()),
            ours.as_path(),
            "a filter ran in the operator's PID namespace: {found:?}"
        );
    }
    // Staging the builder's work needs the clean filter: it ran, contained.
    assert!(
        found.iter().any(|(n, _)| n.starts_with("clean.")),
        "{found:?}"
    );
    d.stop();
}
