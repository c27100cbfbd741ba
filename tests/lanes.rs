//! Lanes through the real daemon (issue 5, "Tests"): real git repositories
//! in temporary directories, fake agents that edit, commit and answer
//! verdicts, and every lane event sequence checked against the stage order.

mod util;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use util::{Client, Daemon, Opts, TestDir, git};

fn fake_acp() -> String {
    format!(
        "{}/tests/fixtures/fake_acp_agent.py",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A repository with one commit on main.
fn repo(dir: &TestDir) -> PathBuf {
    let r = dir.join("shop");
    std::fs::create_dir_all(&r).unwrap();
    git(&r, &["init", "-q", "-b", "main"]);
    std::fs::write(r.join("a.txt"), "one\n").unwrap();
    git(&r, &["add", "a.txt"]);
    git(&r, &["commit", "-q", "-m", "first"]);
    r
}

fn seat(harness: &str, family: &str, script: &Value, env: &[(&str, &str)]) -> String {
    // JSON string escapes are valid TOML basic-string escapes.
    let q = |v: &str| serde_json::to_string(v).unwrap();
    let mut e = format!("FAKE_SCRIPT = {}", q(&script.to_string()));
    for (k, v) in env {
        e.push_str(&format!(", {k} = {}", q(v)));
    }
    format!(
        "[[seat]]\nharness = \"{harness}\"\ncommand = \"python3\"\nargs = [\"{}\"]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"{family}\"\nenv = {{ {e} }}\n\n",
        fake_acp()
    )
}

/// A verifier answer with the verdict block.
fn verdict_text(v: &str) -> String {
    format!("I read it.\n```omniconflux-verdict\n{v}\n```\n")
}

const PASS: &str = r#"{"verdict":"pass"}"#;
const REWORK: &str =
    r#"{"verdict":"rework","defects":[{"file":"feature.txt","line":1,"issue":"say fixed"}]}"#;

struct Rig {
    d: Daemon,
    c: Client,
    events: Client,
    repo: PathBuf,
}

impl Rig {
    fn start(dir: &TestDir, lanes_cfg: &str, seats: String, env: Vec<(String, String)>) -> Rig {
        let repo = repo(dir);
        let config = format!(
            "{lanes_cfg}\n[[repo]]\npath = \"{}\"\n\n{seats}",
            repo.display()
        );
        let d = Daemon::start_with(
            &dir.path,
            Opts {
                config: Some(config),
                env,
                ..Opts::default()
            },
        );
        d.wait_log("seat builder: ready");
        d.wait_log("seat verifier: ready");
        // Lanes and plugins learn isolation from the same probe, in one step.
        d.wait_log("plugins run");
        let mut events = d.connect();
        events.call("events.subscribe", json!({"streams": ["lanes"]}));
        let c = d.connect();
        Rig { d, c, events, repo }
    }

    fn dispatch(&mut self, acceptance: &str) -> Value {
        self.dispatch_named(acceptance, "add feature")
    }

    fn dispatch_named(&mut self, acceptance: &str, name: &str) -> Value {
        self.c.call(
            "task.dispatch",
            json!({"repo": self.repo.display().to_string(), "task": "Add feature.txt", "builder": "builder", "verifier": "verifier",
                   "acceptance": {"name": "feature exists", "command": acceptance}, "name": name}),
        )
    }

    /// Lane events until the lane reaches one of `until`; returns the stages
    /// in order and the verdict events.
    fn run_until(&mut self, until: &[&str]) -> (Vec<String>, Vec<Value>) {
        let mut stages = Vec::new();
        let mut verdicts = Vec::new();
        loop {
            let ev = self.events.next_note("event")["params"].clone();
            match ev["kind"].as_str() {
                Some("lane.stage") => {
                    let s = ev["data"]["stage"].as_str().unwrap().to_string();
                    let done = until.contains(&s.as_str());
                    stages.push(s);
                    if done {
                        return (stages, verdicts);
                    }
                }
                Some("lane.verdict") => verdicts.push(ev["data"].clone()),
                _ => {}
            }
        }
    }
}

fn builder_writes(turns: &[&str]) -> Value {
    Value::Array(
        turns.iter().map(|t| json!([{"run": ["sh", "-c", format!("echo {t} > feature.txt")]}, {"text": "done"}])).collect(),
    )
}

#[test]
fn pass_in_round_one_merges_and_archives() {
    let dir = TestDir::new("lanepass");
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    assert!(id.starts_with("t-") && id.len() == 14, "{lane}");
    assert_eq!(lane["branch"], json!("omni/add-feature"));
    let wt = PathBuf::from(lane["worktree"].as_str().unwrap());
    assert_eq!(wt, r.repo.with_file_name("shop-wt").join("add-feature"));
    let (stages, verdicts) = r.run_until(&["merged", "sent-back", "cap"]);
    assert_eq!(
        stages,
        [
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "pass",
            "merging",
            "merged"
        ]
    );
    assert_eq!(verdicts.len(), 1);
    assert_eq!(verdicts[0]["verdict"], json!("pass"));
    assert_eq!(verdicts[0]["round"], json!(1));
    assert_eq!(verdicts[0]["defects"], json!(0));
    // The pass is on base now, the worktree is gone, and the lane is archived.
    assert_eq!(git(&r.repo, &["show", "main:feature.txt"]), "feature");
    let list = r.c.call("verify.list", json!({}));
    assert_eq!(list["lanes"], json!([]));
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert_eq!(
        (got["stage"].as_str(), got["archived"].as_bool()),
        (Some("merged"), Some(true))
    );
    // Removal runs on a lane worker after the archive.
    r.d.wait_log(&format!("lane {id}: worktree {} removed", wt.display()));
    // Its checkout is kept for the repository's next lane, not removed.
    let given = r.d.wait_log(&format!("lane {id}: gives back checkout "));
    let co = given.rsplit_once("checkout ").unwrap().1.trim().to_string();
    r.d.wait_log(&format!("checkout {co}: kept for the next lane of "));
    assert!(Path::new(&co).starts_with(dir.join("state/lanes")), "{co}");
    assert!(!wt.exists());
    assert!(!git(&r.repo, &["worktree", "list"]).contains("add-feature"));
    r.d.stop();
}

#[test]
fn rework_then_pass_sends_the_defects_to_the_builder() {
    let dir = TestDir::new("lanerework");
    let judge = format!(
        "if grep -q fixed feature.txt; then printf '{}'; else printf '{}'; fi",
        verdict_text(PASS).replace('\n', "\\n"),
        verdict_text(REWORK).replace('\n', "\\n")
    );
    let verifier = json!([[{"text_from": ["sh", "-c", judge]}]]);
    let seats = format!(
        "{}{}",
        seat(
            "builder",
            "anthropic",
            &builder_writes(&["first", "fixed"]),
            &[]
        ),
        seat("verifier", "google", &verifier, &[])
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    let lane = r.dispatch("test -f feature.txt");
    let builder = lane["session"].as_str().unwrap().to_string();
    let (stages, verdicts) = r.run_until(&["merged", "sent-back", "cap"]);
    assert_eq!(
        stages,
        [
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "rework",
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "pass",
            "merging",
            "merged"
        ]
    );
    assert_eq!(
        verdicts
            .iter()
            .map(|v| (
                v["verdict"].clone(),
                v["round"].clone(),
                v["defects"].clone()
            ))
            .collect::<Vec<_>>(),
        vec![
            (json!("rework"), json!(1), json!(1)),
            (json!("pass"), json!(2), json!(0))
        ]
    );
    assert_ne!(verdicts[0]["commit"], verdicts[1]["commit"]);
    // The builder got the cited defect as its next turn, recorded as check-1.
    let evs =
        r.c.call("events.list", json!({"stream": builder, "limit": 1000}))["events"].clone();
    let check = evs
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "check.rework")
        .expect("a check.rework record");
    assert_eq!(check["data"]["id"], json!("check-1"));
    assert!(
        check["data"]["text"]
            .as_str()
            .unwrap()
            .contains("feature.txt:1: say fixed")
    );
    assert_eq!(git(&r.repo, &["show", "main:feature.txt"]), "fixed");
    r.d.stop();
}

#[test]
fn failing_acceptance_goes_back_to_the_builder_until_the_cap() {
    let dir = TestDir::new("lanecap");
    let seats = format!(
        "{}{}",
        seat(
            "builder",
            "anthropic",
            &json!([[{"text": "did nothing"}], [{"text": "still nothing"}]]),
            &[]
        ),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "[lanes]\nmax_rounds = 2\n", seats, vec![]);
    let lane = r.dispatch("echo the feature is missing; test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    let (stages, verdicts) = r.run_until(&["merged", "sent-back", "cap"]);
    assert_eq!(
        stages,
        [
            "building", "idle", "checking", "rework", "building", "idle", "checking", "cap"
        ]
    );
    assert!(verdicts.is_empty());
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert_eq!(got["state"], json!("sent-back"));
    assert!(
        got["last_check"]["tail"]
            .as_str()
            .unwrap()
            .contains("the feature is missing")
    );
    // The operator closes it and keeps the worktree.
    let closed = r.c.call("lanes.close", json!({"lane": id}));
    assert_eq!(closed["stage"], json!("closed"));
    let (stages, _) = r.run_until(&["closed"]);
    assert_eq!(stages, ["closed"]);
    assert!(PathBuf::from(lane["worktree"].as_str().unwrap()).exists());
    r.d.stop();
}

#[test]
fn an_answer_that_is_not_a_verdict_gets_a_second_opinion_then_goes_back() {
    let dir = TestDir::new("lanenoverdict");
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": "Looks fine to me."}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    let lane = r.dispatch("test -f feature.txt");
    let (stages, _) = r.run_until(&["merged", "sent-back", "cap"]);
    assert_eq!(
        stages,
        [
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "verify-failed",
            "second-opinion",
            "verifying",
            "verify-failed",
            "sent-back"
        ]
    );
    // The operator sends it back with notes; the builder gets them.
    let id = lane["lane"].as_str().unwrap();
    let got = r.c.call(
        "lanes.rework",
        json!({"lane": id, "notes": "please try again"}),
    );
    assert_eq!(got["state"], json!("building"));
    r.d.stop();
}

#[test]
fn a_merge_conflict_is_left_for_the_operator() {
    let dir = TestDir::new("laneconflict");
    let builder = json!([[{"run": ["sh", "-c", "echo lane > a.txt"]}, {"text": "done"}]]);
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder, &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(
        &dir,
        "[lanes]\nrequire_merge_approval = true\nmerge = \"merge-commit\"\n",
        seats,
        vec![],
    );
    let lane = r.dispatch("test -f a.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    let (stages, _) = r.run_until(&["pass"]);
    assert_eq!(stages.last().map(String::as_str), Some("pass"));
    // Base moves on with a conflicting change while the pass waits.
    std::fs::write(r.repo.join("a.txt"), "main moved\n").unwrap();
    git(&r.repo, &["commit", "-q", "-am", "main moved"]);
    r.c.call("lanes.merge", json!({"lane": id}));
    let (stages, _) = r.run_until(&["merged", "merge-failed"]);
    assert_eq!(stages, ["merging", "merge-failed"]);
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert!(got["reason"].as_str().unwrap().contains("a.txt"), "{got}");
    assert_eq!(
        git(&r.repo, &["status", "--porcelain"]),
        "",
        "the main worktree is left clean"
    );
    r.d.stop();
}

#[test]
fn dispatch_refusals_have_stable_codes() {
    let dir = TestDir::new("lanerefuse");
    let seats = format!(
        "{}{}{}",
        seat("builder", "anthropic", &json!([]), &[]),
        seat("verifier", "openai", &json!([]), &[]),
        seat("twin", "anthropic", &json!([]), &[])
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    r.d.wait_log("seat twin: ready");
    let base = |builder: &str, verifier: &str, repo: &str| json!({"repo": repo, "task": "t", "builder": builder, "verifier": verifier, "acceptance": {"name": "n", "command": "true"}, "name": "x"});
    let repo = r.repo.display().to_string();
    assert_eq!(
        r.c.error_code("task.dispatch", base("builder", "twin", &repo)),
        "same-family"
    );
    assert_eq!(
        r.c.error_code("task.dispatch", base("builder", "nobody", &repo)),
        "seat-not-found"
    );
    assert_eq!(
        r.c.error_code(
            "task.dispatch",
            base("builder", "verifier", "/no/such/repo")
        ),
        "repo-unknown"
    );
    let mut p = base("builder", "verifier", &repo);
    p["base"] = json!("no-such-branch");
    assert_eq!(r.c.error_code("task.dispatch", p), "base-unknown");
    git(&r.repo, &["branch", "omni/x"]);
    assert_eq!(
        r.c.error_code("task.dispatch", base("builder", "verifier", &repo)),
        "name-taken"
    );
    let mut p = base("builder", "verifier", &repo);
    p["extra"] = json!(1);
    assert_eq!(r.c.error_code("task.dispatch", p), "invalid-params");
    r.d.stop();
}

#[test]
fn a_machine_that_cannot_isolate_refuses_with_isolation_missing() {
    let dir = TestDir::new("laneiso");
    // A bwrap that cannot create namespaces, first on PATH: what a
    // container that forbids them looks like to the daemon.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        bin.join("bwrap"),
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("bwrap"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &json!([]), &[]),
        seat("verifier", "openai", &json!([]), &[])
    );
    let mut r = Rig::start(&dir, "", seats, vec![("PATH".into(), path)]);
    let repo = r.repo.display().to_string();
    let p = json!({"repo": repo, "task": "t", "builder": "builder", "verifier": "verifier", "acceptance": {"name": "n", "command": "true"}});
    assert_eq!(r.c.error_code("task.dispatch", p), "isolation-missing");
    r.d.stop();
}

#[test]
fn a_daemon_killed_mid_verify_resumes_the_lane() {
    let dir = TestDir::new("lanekill");
    let mark = dir.join("verifier-ran-once");
    // The first verifier hangs (the daemon is killed under it); the one the
    // restarted daemon asks answers at once.
    let judge = format!(
        "if [ -e {m} ]; then printf '{}'; else touch {m}; sleep 120; fi",
        verdict_text(PASS).replace('\n', "\\n"),
        m = mark.display()
    );
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text_from": ["sh", "-c", judge]}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats.clone(), vec![]);
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    let (stages, _) = r.run_until(&["verifying"]);
    assert_eq!(stages.last().map(String::as_str), Some("verifying"));
    while !mark.exists() {
        std::thread::yield_now();
    }
    let Rig { mut d, .. } = r;
    d.kill9();
    drop(d);
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(std::fs::read_to_string(dir.join("omniconfluxd.toml")).unwrap()),
            ..Opts::default()
        },
    );
    d.wait_log(&format!("lane {id}: resuming at verifying"));
    // The lane goes on from waiting-verifier and merges: follow the stream
    // (subscribe, then read what was committed before), deduplicated by seq.
    let mut sub = d.connect();
    sub.call("events.subscribe", json!({"streams": ["lanes"]}));
    let mut c = d.connect();
    let mut seen = std::collections::BTreeMap::new();
    for e in c.call("events.list", json!({"stream": "lanes", "limit": 1000}))["events"]
        .as_array()
        .unwrap()
    {
        seen.insert(e["seq"].as_i64().unwrap(), e.clone());
    }
    while !seen.values().any(|e| e["data"]["stage"] == "merged") {
        let e = sub.next_note("event")["params"].clone();
        seen.insert(e["seq"].as_i64().unwrap(), e);
    }
    let got = c.call("lanes.get", json!({"lane": id}));
    assert_eq!(got["stage"], json!("merged"));
    let stages: Vec<&str> = seen
        .values()
        .filter(|e| e["kind"] == "lane.stage")
        .filter_map(|e| e["data"]["stage"].as_str())
        .collect();
    assert_eq!(
        stages,
        [
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "waiting-verifier",
            "verifying",
            "pass",
            "merging",
            "merged"
        ]
    );
    d.stop();
}

#[test]
fn the_command_line_dispatches_shows_and_merges_a_lane() {
    let dir = TestDir::new("lanecli");
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(
        &dir,
        "[lanes]\nrequire_merge_approval = true\n",
        seats,
        vec![],
    );
    let sock = r.d.socket.display().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["--socket", sock.as_str()];
        all.extend_from_slice(args);
        util::run_cli(&all)
    };
    let repo = r.repo.display().to_string();
    let (code, out, err) = cli(&["repos", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next() == Some(repo.as_str()), "{out}");
    // A usage error names what is missing and exits 2 without asking the daemon.
    let (code, _, err) = cli(&[
        "lanes",
        "dispatch",
        "--repo",
        &repo,
        "--task",
        "Add feature.txt",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs --builder"), "{err}");
    let (code, _, err) = cli(&["lanes", "frobnicate"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = cli(&[
        "--json",
        "lanes",
        "dispatch",
        "--repo",
        &repo,
        "--task",
        "Add feature.txt",
        "--builder",
        "builder",
        "--verifier",
        "verifier",
        "--acceptance-name",
        "feature exists",
        "--acceptance",
        "test -f feature.txt",
        "--name",
        "add feature",
    ]);
    assert_eq!(code, 0, "{err}");
    let lane: Value = serde_json::from_str(&out).unwrap();
    let id = lane["lane"].as_str().unwrap().to_string();
    assert_eq!(lane["branch"], json!("omni/add-feature"));
    let (stages, _) = r.run_until(&["pass", "sent-back", "cap"]);
    assert_eq!(stages.last().map(String::as_str), Some("pass"));
    // The list line: id, stage, state, builder→verifier, branch, rounds.
    let (code, out, err) = cli(&["lanes", "list"]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{out}"));
    for part in [
        "pass",
        "verified",
        "builder\u{2192}verifier",
        "omni/add-feature",
        "round 1/3",
        "waits for you",
    ] {
        assert!(line.contains(part), "{part} not in {line}");
    }
    let (code, out, err) = cli(&["lanes", "show", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("the acceptance command exited with status 0"),
        "{out}"
    );
    assert!(out.contains("verdict     pass on "), "{out}");
    assert!(
        out.contains("waits for the operator's approval in the inbox"),
        "{out}"
    );
    let (code, out, _) = cli(&["--json", "lanes", "list"]);
    assert_eq!(code, 0);
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["lanes"][0]["lane"], json!(id));
    // A daemon error: code on stderr, exit 1.
    let (code, _, err) = cli(&["lanes", "rework", "t-nosuchlane0", "again"]);
    assert_eq!(code, 1);
    assert!(err.contains("lane-not-found"), "{err}");
    let (code, out, err) = cli(&["lanes", "merge", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("merging"), "{out}");
    let (stages, _) = r.run_until(&["merged", "merge-failed"]);
    assert_eq!(stages, ["merging", "merged"]);
    let (code, out, _) = cli(&["lanes", "show", &id]);
    assert_eq!(code, 0);
    assert!(
        out.contains(" merged ") && out.contains("(archived)"),
        "{out}"
    );
    let (code, out, _) = cli(&["lanes"]);
    assert_eq!((code, out.trim()), (0, "no lanes"));
    // Merging twice is refused: the lane is not waiting.
    let (code, _, err) = cli(&["lanes", "merge", &id]);
    assert_eq!(code, 1);
    assert!(err.contains("lane-not-waiting"), "{err}");
    assert_eq!(git(&r.repo, &["show", "main:feature.txt"]), "feature");
    r.d.stop();
}

#[test]
fn a_required_merge_approval_waits_in_the_inbox() {
    let dir = TestDir::new("lanemergeok");
    let seats = format!(
        "{}{}",
        seat(
            "builder",
            "anthropic",
            &builder_writes(&["feature", "again"]),
            &[]
        ),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(
        &dir,
        "[lanes]\nrequire_merge_approval = true\n",
        seats,
        vec![],
    );
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    r.run_until(&["pass"]);
    r.d.wait_log(&format!(
        "approval {id}-merge-1: lane merge waits for the operator"
    ));
    let item = r.c.call(
        "approvals.get",
        json!({"request_id": format!("{id}-merge-1")}),
    );
    assert_eq!(
        (
            item["subject"].as_str(),
            item["risk"].as_str(),
            item["state"].as_str()
        ),
        (Some("lane-merge"), Some("high"), Some("pending")),
        "{item}"
    );
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert_eq!(
        item["digest"], got["verdict"]["commit"],
        "the approval is bound to the commit that passed"
    );
    // Allowed in the inbox: the lane merges that commit.
    r.c.call(
        "approvals.answer",
        json!({"request_id": format!("{id}-merge-1"), "decision": "allow"}),
    );
    let (stages, _) = r.run_until(&["merged", "merge-failed"]);
    assert_eq!(stages, ["merging", "merged"]);
    assert_eq!(git(&r.repo, &["show", "main:feature.txt"]), "feature");
    r.d.stop();
}

#[test]
fn a_denied_merge_goes_back_to_the_operator() {
    let dir = TestDir::new("lanemergeno");
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(
        &dir,
        "[lanes]\nrequire_merge_approval = true\n",
        seats,
        vec![],
    );
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    r.run_until(&["pass"]);
    r.d.wait_log(&format!("approval {id}-merge-1: lane merge waits"));
    r.c.call(
        "approvals.answer",
        json!({"request_id": format!("{id}-merge-1"), "decision": "deny"}),
    );
    let (stages, _) = r.run_until(&["sent-back"]);
    assert_eq!(stages, ["sent-back"]);
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert_eq!(got["reason"], json!("the operator did not allow the merge"));
    assert!(
        git(&r.repo, &["ls-tree", "main", "--name-only"])
            .lines()
            .all(|f| f != "feature.txt")
    );
    r.d.stop();
}

#[test]
fn a_daemon_killed_mid_check_runs_the_check_again() {
    let dir = TestDir::new("lanekillchk");
    // The check hangs under the first daemon and passes under the second,
    // which the test starts with one more (absent) directory on PATH, the
    // one channel from the test to the check that works wherever the
    // checkout lives. A file would not do: the sandbox's /tmp is its own,
    // so a check never sees a test directory under /tmp.
    let rerun = "/omniconflux-check-may-pass";
    let check = format!("case \"$PATH\" in *:{rerun}) ;; *) while :; do sleep 1; done ;; esac");
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    let lane = r.dispatch(&check);
    let id = lane["lane"].as_str().unwrap().to_string();
    r.run_until(&["checking"]);
    let Rig { mut d, .. } = r;
    d.kill9();
    drop(d);
    let path = std::env::var("PATH").unwrap_or_default();
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(std::fs::read_to_string(dir.join("omniconfluxd.toml")).unwrap()),
            env: vec![("PATH".into(), format!("{path}:{rerun}"))],
            ..Opts::default()
        },
    );
    d.wait_log(&format!("lane {id}: resuming at checking"));
    d.wait_log(&format!("lane {id}: merged"));
    assert_eq!(
        git(&d.dir.join("shop"), &["show", "main:feature.txt"]),
        "feature"
    );
    d.stop();
}

#[test]
fn close_can_remove_the_worktree() {
    let dir = TestDir::new("laneclose");
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &json!([[{"text": "nothing"}]]), &[]),
        seat("verifier", "openai", &json!([]), &[])
    );
    let mut r = Rig::start(&dir, "[lanes]\nmax_rounds = 1\n", seats, vec![]);
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    let wt = PathBuf::from(lane["worktree"].as_str().unwrap());
    r.run_until(&["cap"]);
    let closed =
        r.c.call("lanes.close", json!({"lane": id, "remove_worktree": true}));
    assert_eq!(closed["stage"], json!("closed"));
    r.d.wait_log(&format!("lane {id}: worktree {} removed", wt.display()));
    assert!(!wt.exists());
    // The branch stays for the operator.
    assert!(git(&r.repo, &["branch", "--list", "omni/add-feature"]).contains("omni/add-feature"));
    r.d.stop();
}

#[test]
fn a_builder_that_fails_hands_over_to_another_ready_seat() {
    let dir = TestDir::new("lanefailover");
    let seats = format!(
        "{}{}{}",
        seat(
            "builder",
            "anthropic",
            &json!([[{"text": "starting"}, {"exit": 3}]]),
            &[]
        ),
        seat("second", "google", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    r.d.wait_log("seat second: ready");
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    let (stages, _) = r.run_until(&["merged", "sent-back", "cap"]);
    assert_eq!(
        stages.last().map(String::as_str),
        Some("merged"),
        "{stages:?}"
    );
    r.d.wait_log(&format!("lane {id}: the builder's session"));
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert_eq!(
        got["builder"]["harness"],
        json!("second"),
        "the lane shows the latest builder"
    );
    r.d.stop();
}

/// The checkout path a log line "... checkout PATH" names.
fn checkout_in(line: &str) -> String {
    line.rsplit_once("checkout ").unwrap().1.trim().to_string()
}

fn checkouts(dir: &TestDir) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("state/lanes"))
        .map(|e| e.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn the_next_lane_of_a_repository_reuses_the_checkout_the_last_one_gave_back() {
    let dir = TestDir::new("lanepool");
    // Each lane's builder writes its own worktree's path, so that every
    // lane has a commit of its own to check.
    let builder = json!([[{"run": ["sh", "-c", "pwd > feature.txt"]}, {"text": "done"}]]);
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder, &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats.clone(), vec![]);
    // A check leaves an untracked file in the checkout; the next lane's
    // check, in the same checkout, must not find it.
    let accept = "test ! -e left-by-a-check && touch left-by-a-check && test -f feature.txt";
    let mut ids = Vec::new();
    for name in ["first feature", "second feature"] {
        let lane = r.dispatch_named(accept, name);
        let id = lane["lane"].as_str().unwrap().to_string();
        let (stages, _) = r.run_until(&["merged", "sent-back", "cap"]);
        assert_eq!(
            stages.last().map(String::as_str),
            Some("merged"),
            "{}",
            r.d.log_text()
        );
        let given = checkout_in(&r.d.wait_log(&format!("lane {id}: gives back checkout ")));
        r.d.wait_log(&format!("checkout {given}: kept for the next lane of "));
        ids.push((id, given));
    }
    let made = checkout_in(&r.d.wait_log(&format!("lane {}: new checkout ", ids[0].0)));
    let reused = checkout_in(&r.d.wait_log(&format!("lane {}: reuses checkout ", ids[1].0)));
    assert_eq!(
        reused, made,
        "the second lane checks in the first one's checkout"
    );
    assert_eq!(ids[1].1, made);
    assert!(
        !r.d.log_text()
            .contains(&format!("lane {}: new checkout", ids[1].0))
    );
    assert_eq!(
        checkouts(&dir),
        vec![PathBuf::from(&made)],
        "one checkout for two lanes"
    );
    assert_eq!(
        git(&r.repo, &["show", "main:feature.txt"]),
        r.repo
            .with_file_name("shop-wt")
            .join("second-feature")
            .display()
            .to_string()
    );

    // A restart finds the spare under state/lanes/, no lane holds it, and
    // it goes back to the repository's pool for the next lane.
    let Rig { d, .. } = r;
    d.stop();
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(std::fs::read_to_string(dir.join("omniconfluxd.toml")).unwrap()),
            ..Opts::default()
        },
    );
    d.wait_log(&format!(
        "checkout {made}: left by the last run, kept for the next lane of "
    ));
    d.wait_log("seat verifier: ready");
    d.wait_log("plugins run");
    let mut events = d.connect();
    events.call("events.subscribe", json!({"streams": ["lanes"]}));
    let c = d.connect();
    let mut r = Rig {
        d,
        c,
        events,
        repo: dir.join("shop").canonicalize().unwrap(),
    };
    let lane = r.dispatch_named(accept, "third feature");
    let id = lane["lane"].as_str().unwrap().to_string();
    let (stages, _) = r.run_until(&["merged", "sent-back", "cap"]);
    assert_eq!(
        stages.last().map(String::as_str),
        Some("merged"),
        "{}",
        r.d.log_text()
    );
    assert_eq!(
        checkout_in(&r.d.wait_log(&format!("lane {id}: reuses checkout "))),
        made
    );
    assert_eq!(checkouts(&dir), vec![PathBuf::from(&made)]);
    r.d.stop();
}

/// Restarts the daemon of `dir` on its config after a SIGKILL, and follows
/// the lanes stream from its start (subscribe, then read what was committed
/// before, deduplicated by seq) until lane `id` reaches one of `until`.
/// Returns the daemon and every lane.stage of the stream in order.
fn restart_and_follow(dir: &TestDir, id: &str, until: &[&str]) -> (Daemon, Vec<String>) {
    let d = Daemon::start_with(
        &dir.path,
        Opts {
            config: Some(std::fs::read_to_string(dir.join("omniconfluxd.toml")).unwrap()),
            ..Opts::default()
        },
    );
    let mut sub = d.connect();
    sub.call("events.subscribe", json!({"streams": ["lanes"]}));
    let mut c = d.connect();
    let mut seen = std::collections::BTreeMap::new();
    for e in c.call("events.list", json!({"stream": "lanes", "limit": 1000}))["events"]
        .as_array()
        .unwrap()
    {
        seen.insert(e["seq"].as_i64().unwrap(), e.clone());
    }
    let reached = |seen: &std::collections::BTreeMap<i64, Value>| {
        seen.values().any(|e| {
            e["data"]["lane"] == json!(id)
                && e["data"]["stage"]
                    .as_str()
                    .is_some_and(|s| until.contains(&s))
        })
    };
    while !reached(&seen) {
        let e = sub.next_note("event")["params"].clone();
        seen.insert(e["seq"].as_i64().unwrap(), e);
    }
    let stages = seen
        .values()
        .filter(|e| e["kind"] == "lane.stage")
        .filter_map(|e| e["data"]["stage"].as_str().map(str::to_string))
        .collect();
    (d, stages)
}

/// Waits until `path` exists: a fake agent's command made it.
fn wait_for_file(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_daemon_killed_mid_build_prompts_the_reopened_builder_with_the_task() {
    let dir = TestDir::new("lanekillbuild");
    let mark = dir.join("builder-ran-once");
    // The first builder's turn hangs (the daemon is killed under it). The
    // agent cannot load its session, so the restart reopens it with a new
    // one: it writes the feature only when its prompt carries the task.
    let build = format!(
        "if [ -e {m} ]; then case \"$FAKE_PROMPT\" in *'Add feature.txt'*) echo feature > feature.txt;; esac; else touch {m}; sleep 120; fi",
        m = mark.display()
    );
    let seats = format!(
        "{}{}",
        seat(
            "builder",
            "anthropic",
            &json!([[{"run": ["sh", "-c", build]}, {"text": "done"}]]),
            &[]
        ),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    let builder = lane["session"].as_str().unwrap().to_string();
    // The builder's turn.start, committed before or after the subscription.
    let mut sub = r.d.connect();
    sub.call("events.subscribe", json!({"streams": [builder]}));
    let listed =
        r.c.call("events.list", json!({"stream": builder, "limit": 100}));
    if !listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "turn.start")
    {
        while sub.next_note("event")["params"]["kind"] != "turn.start" {}
    }
    wait_for_file(&mark);
    let Rig { mut d, .. } = r;
    d.kill9();
    drop(d);
    let (d, stages) = restart_and_follow(&dir, &id, &["merged", "sent-back", "cap"]);
    assert_eq!(
        stages,
        [
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "pass",
            "merging",
            "merged"
        ],
        "{}",
        d.log_text()
    );
    let log = d.log_text();
    assert!(
        log.contains(&format!("lane {id}: resuming at building")),
        "{log}"
    );
    assert!(
        log.contains(&format!("session {builder}: reopened builder")),
        "the builder's own session is reopened and prompted: {log}"
    );
    // Lanes resume once the seats are probed: no wait for a verifier
    // that only looked not ready.
    assert!(!log.contains("is not ready; looking again"), "{log}");
    assert_eq!(
        git(&d.dir.join("shop"), &["show", "main:feature.txt"]),
        "feature"
    );
    d.stop();
}

#[test]
fn rework_after_a_restart_carries_the_task_to_a_builder_that_lost_its_session() {
    let dir = TestDir::new("lanekillrework");
    let mark = dir.join("verifier-ran-once");
    // The builder's first process writes "first". After the restart its
    // agent, which cannot load sessions, starts a new one: it fixes the
    // work only when the rework prompt carries the task.
    let build = format!(
        "if [ -e {m} ]; then case \"$FAKE_PROMPT\" in *'Add feature.txt'*) echo fixed > feature.txt;; esac; else echo first > feature.txt; fi",
        m = mark.display()
    );
    // The first verifier hangs (the daemon is killed under it); the one the
    // restarted daemon asks judges the commit.
    let judge = format!(
        "if [ -e {m} ]; then if grep -q fixed feature.txt; then printf '{}'; else printf '{}'; fi; else touch {m}; sleep 120; fi",
        verdict_text(PASS).replace('\n', "\\n"),
        verdict_text(REWORK).replace('\n', "\\n"),
        m = mark.display()
    );
    let seats = format!(
        "{}{}",
        seat(
            "builder",
            "anthropic",
            &json!([[{"run": ["sh", "-c", build]}, {"text": "done"}]]),
            &[]
        ),
        seat(
            "verifier",
            "openai",
            &json!([[{"text_from": ["sh", "-c", judge]}]]),
            &[]
        )
    );
    let mut r = Rig::start(&dir, "", seats, vec![]);
    let lane = r.dispatch("test -f feature.txt");
    let id = lane["lane"].as_str().unwrap().to_string();
    let builder = lane["session"].as_str().unwrap().to_string();
    r.run_until(&["verifying"]);
    wait_for_file(&mark);
    let old_verifier = r.c.call("lanes.get", json!({"lane": id}))["verifier_session"]
        .as_str()
        .unwrap()
        .to_string();
    let Rig { mut d, .. } = r;
    d.kill9();
    drop(d);
    let (d, stages) = restart_and_follow(&dir, &id, &["merged", "sent-back", "cap"]);
    assert_eq!(
        stages,
        [
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "waiting-verifier",
            "verifying",
            "rework",
            "building",
            "idle",
            "checking",
            "waiting-verifier",
            "verifying",
            "pass",
            "merging",
            "merged"
        ],
        "{}",
        d.log_text()
    );
    let log = d.log_text();
    assert!(
        log.contains(&format!("session {builder}: reopened builder")),
        "{log}"
    );
    // The old verifier session is ended, not reopened only to be stopped.
    assert!(!log.contains("reopened verifier"), "{log}");
    assert!(!log.contains("could not set up a session"), "{log}");
    assert!(
        log.contains(&format!(
            "session {old_verifier}: cannot be reopened after the restart (the lane that started it does not need it again)"
        )),
        "{log}"
    );
    assert!(!log.contains("is not ready; looking again"), "{log}");
    // The rework went into the reopened session, defects and task.
    let mut c = d.connect();
    let evs = c.call("events.list", json!({"stream": builder, "limit": 1000}))["events"].clone();
    let check = evs
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "check.rework")
        .expect("a check.rework record");
    let text = check["data"]["text"].as_str().unwrap();
    assert!(text.contains("feature.txt:1: say fixed"), "{text}");
    assert!(text.contains("The task:\nAdd feature.txt"), "{text}");
    assert_eq!(
        git(&d.dir.join("shop"), &["show", "main:feature.txt"]),
        "fixed"
    );
    d.stop();
}

#[test]
fn a_worktree_stands_for_its_repository_and_head_follows_the_branch() {
    let dir = TestDir::new("laneheads");
    let seats = format!(
        "{}{}",
        seat("builder", "anthropic", &builder_writes(&["feature"]), &[]),
        seat(
            "verifier",
            "openai",
            &json!([[{"text": verdict_text(PASS)}]]),
            &[]
        )
    );
    let mut r = Rig::start(
        &dir,
        "[lanes]\nrequire_merge_approval = true\n",
        seats,
        vec![],
    );
    // A linked worktree of the known repository, given as `repo`; no name:
    // the branch is named after the task's first line.
    let other = dir.join("shop-side");
    git(
        &r.repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "side",
            &other.display().to_string(),
        ],
    );
    let lane = r.c.call(
        "task.dispatch",
        json!({"repo": other.display().to_string(), "task": "Add feature.txt\n\nIt holds the word feature.",
               "builder": "builder", "verifier": "verifier",
               "acceptance": {"name": "feature exists", "command": "test -f feature.txt"}}),
    );
    let id = lane["lane"].as_str().unwrap().to_string();
    assert_eq!(lane["branch"], json!("omni/add-feature-txt"), "{lane}");
    let wt = PathBuf::from(lane["worktree"].as_str().unwrap());
    let (stages, _) = r.run_until(&["pass", "sent-back", "cap"]);
    assert_eq!(stages.last().map(String::as_str), Some("pass"));
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert_eq!(
        got["repo"],
        json!(r.repo.canonicalize().unwrap().display().to_string())
    );
    assert_eq!(got["task"]["name"], json!("Add feature.txt"));
    let judged = got["verdict"]["commit"].clone();
    assert_eq!(
        (got["head"].clone(), got["stale"].clone()),
        (judged.clone(), json!(false))
    );
    // The lane's own worktree is a worktree the daemon lists, too: a second
    // lane may start from it (refused here only for its taken name).
    let p = json!({"repo": wt.display().to_string(), "task": "Add feature.txt", "builder": "builder",
                   "verifier": "verifier", "acceptance": {"name": "n", "command": "true"}});
    assert_eq!(r.c.error_code("task.dispatch", p), "name-taken");
    // Someone commits on the lane's branch: head is that commit now, and the
    // verdict is stale.
    git(&wt, &["commit", "-q", "--allow-empty", "-m", "by hand"]);
    let moved = git(&wt, &["rev-parse", "HEAD"]);
    let list = r.c.call("verify.list", json!({}));
    let item = &list["lanes"][0];
    assert_eq!(
        (item["head"].clone(), item["stale"].clone()),
        (json!(moved), json!(true)),
        "{item}"
    );
    // The branch is gone: head is null.
    git(
        &r.repo,
        &["worktree", "remove", "--force", &wt.display().to_string()],
    );
    git(&r.repo, &["branch", "-D", "omni/add-feature-txt"]);
    let got = r.c.call("lanes.get", json!({"lane": id}));
    assert_eq!(
        (got["head"].clone(), got["stale"].clone()),
        (Value::Null, json!(true))
    );
    // A folder inside a worktree is not a worktree.
    std::fs::create_dir_all(other.join("sub")).unwrap();
    let p = json!({"repo": other.join("sub").display().to_string(), "task": "t", "builder": "builder",
                   "verifier": "verifier", "acceptance": {"name": "n", "command": "true"}});
    assert_eq!(r.c.error_code("task.dispatch", p), "repo-unknown");
    // A directory that is neither a known repository nor a worktree of one.
    let stray = dir.join("stray");
    std::fs::create_dir_all(&stray).unwrap();
    git(&stray, &["init", "-q", "-b", "main"]);
    let p = json!({"repo": stray.display().to_string(), "task": "t", "builder": "builder",
                   "verifier": "verifier", "acceptance": {"name": "n", "command": "true"}});
    assert_eq!(r.c.error_code("task.dispatch", p), "repo-unknown");
    r.d.stop();
}
