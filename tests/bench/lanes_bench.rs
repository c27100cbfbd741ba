//! Issue 5, lanes: what a round costs the daemon itself, and how long
//! creating a lane's worktree takes next to a plain `git worktree add`.
//!
//! Setup: a repository of 10,000 small files (100 folders of 100), made
//! once and kept in `<target>/bench-cache/repo-10k/` (`cargo clean` removes
//! it), cloned into a temporary directory for each run so that the lanes'
//! merges never touch the cached copy. One daemon serves the whole run, with
//! two seats of tests/fixtures/fake_acp_agent.py: a builder whose one turn
//! writes `feature.txt` and ends, and a verifier of another family whose
//! one turn answers a pass verdict. The acceptance command is `true`. The
//! daemon is not pinned; its agents and git children share its cores.
//!
//! `lane_round_daemon_cpu`: per round, task.dispatch sent to the lane's
//! `merged` stage, and on until the lane's worktree is removed, every agent
//! has exited and the daemon has reaped every child. The daemon's CPU is
//! read from /proc/PID/stat before and after: utime+stime (its own threads)
//! plus cutime+cstime (every child it reaped, with theirs: git, the
//! acceptance command under bwrap, and the agents). The agents and the
//! acceptance command are not the daemon's cost, so two baselines are taken
//! out:
//! - the agent-only round, alternating with the lane rounds on the same
//!   daemon: the same two seats started with `sessions.spawn` (the builder
//!   in a scratch folder, the verifier with a prompt of the size the lane
//!   gives it), each turn waited for, both killed with `sessions.kill`, and
//!   every child reaped; measured the same way. It holds the agents' own CPU
//!   (python start, the builder's `sh`) and what the daemon spends on any
//!   session (its events and transcript), which a lane pays as well;
//! - the acceptance command: `lanes::check::run` with the daemon's isolation
//!   (bwrap when the probe passes) running `true` in an empty folder,
//!   from the harness, its cost read from getrusage(RUSAGE_CHILDREN).
//!
//! value = lane round - agent-only round - acceptance command, median of the
//! rounds in ms; goal <= 50 ms. /proc counts in clock ticks (10 ms), so each
//! round's figure carries that grain; `mean_ms` (totals over all rounds)
//! is the finer estimate. Also given: wall time per round (dispatch sent to
//! `merged`), and the split into the daemon's own threads and its children.
//!
//! `lane_worktree_vs_git`: task.dispatch sent to its answer (the lane
//! worker's git steps: current branch, base commit, branch-name check,
//! branch exists, `git worktree add -b`; then the builder's agent process
//! started and its session.start committed), against, in the same round,
//! `git worktree add -q -b <branch> <path> main` run by the harness plus
//! spawning the same fake agent (Command::spawn returns after exec). Goal:
//! ratio <= 1.5. The extra `worktree_step_ms` times the lane worker's git
//! steps alone through the library (`omniconfluxd::lanes::git`, in a
//! namespace as the daemon runs them while agents are contained), and
//! `git_worktree_add_ms` the plain command alone. Before each timed step
//! the harness calls sync(2), so that no side pays for the writeback of
//! the 10,000-file checkouts and removals before it.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use omniconfluxd::lanes::{check, git as lgit};

use crate::util::{self, Figure, Proc, Rpc, TempDir};

pub const ROUND: &str = "lane_round_daemon_cpu";
pub const WORKTREE: &str = "lane_worktree_vs_git";

const FILES: usize = 10_000;
const WAIT: Duration = Duration::from_secs(120);

pub fn run() {
    let (want_round, want_wt) = (util::selected(ROUND), util::selected(WORKTREE));
    if !want_round && !want_wt {
        return;
    }
    let skip = |why: &str| {
        if want_round {
            util::skipped(ROUND, None, why);
        }
        if want_wt {
            util::skipped(WORKTREE, None, why);
        }
    };
    if util::find_tool("git").is_none() {
        return skip("git not found");
    }
    let Some(py) = util::python3() else {
        return skip("python3 not found");
    };
    if let Err(e) = measure(&py, want_round, want_wt) {
        skip(&format!("error: {e}"));
    }
}

#[derive(Default)]
struct Samples {
    lane_ms: Vec<f64>,
    lane_self_ms: Vec<f64>,
    lane_children_ms: Vec<f64>,
    agents_ms: Vec<f64>,
    agents_self_ms: Vec<f64>,
    agents_children_ms: Vec<f64>,
    accept_ms: Vec<f64>,
    value_ms: Vec<f64>,
    wall_ms: Vec<f64>,
    dispatch_ms: Vec<f64>,
    cli_ms: Vec<f64>,
    cli_add_ms: Vec<f64>,
    step_ms: Vec<f64>,
}

fn measure(py: &Path, want_round: bool, want_wt: bool) -> Result<(), String> {
    let cached = repo_10k()?;
    let tmp = TempDir::new("lanes");
    let repo = tmp.path().join("shop");
    let out = Command::new("git")
        .arg("clone")
        .arg("-q")
        .arg(&cached)
        .arg(&repo)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "git clone: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let repo = repo.canonicalize().map_err(|e| e.to_string())?;
    let isolation = match omniconfluxd::isolation::probe() {
        Ok(bwrap) => check::Isolation::Bwrap(bwrap),
        Err(_) => check::Isolation::Unisolated,
    };
    let lanes_cfg = if isolation == check::Isolation::Unisolated {
        "[lanes]\nrequire_isolation = false\n"
    } else {
        ""
    };
    // The daemon's git as it runs while agents are contained, which they
    // are wherever the probe passes.
    let daemon_git = match &isolation {
        check::Isolation::Bwrap(bwrap) => lgit::Git::contained(
            bwrap.clone(),
            omniconfluxd::isolation::Hidden::default(),
            &tmp.path().join("state/lanes"),
        ),
        check::Isolation::Unisolated => lgit::Git::host(),
    };
    let agent = fake_agent();
    let builder_script =
        json!([[{"run": ["sh", "-c", "echo feature > feature.txt"]}, {"text": "done"}]]);
    let verdict = "I read it.\n```omniconflux-verdict\n{\"verdict\":\"pass\"}\n```\n";
    let verifier_script = json!([[{"text": verdict}]]);
    let config = format!(
        "{lanes_cfg}\n[[repo]]\npath = \"{}\"\n\n{}{}",
        repo.display(),
        seat("builder", "anthropic", py, &agent, &builder_script),
        seat("verifier", "openai", py, &agent, &verifier_script)
    );
    let (daemon, dirs) = util::start_daemon(tmp.path(), &config, None)?;
    wait_log(
        &dirs.log,
        &["seat builder: ready", "seat verifier: ready", "plugins run"],
    )?;
    let pid = daemon.pid();
    let mut events = Rpc::connect(&dirs.socket)?;
    events.call("events.subscribe", json!({}))?;
    let mut c = Rpc::connect(&dirs.socket)?;
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let accept_dir = tmp.path().join("accept");
    std::fs::create_dir_all(&accept_dir).map_err(|e| e.to_string())?;
    let verifier_prompt = "You verify another agent's work. ".repeat(60);

    let rounds = util::rounds(8, 2);
    let mut s = Samples::default();
    for i in 0..rounds {
        eprintln!("bench: {ROUND} round {}/{rounds}", i + 1);
        // A: one lane through a round.
        settle();
        let before = cpu(pid)?;
        let t0 = Instant::now();
        let name = format!("bench round {i}");
        let lane = c.call(
            "task.dispatch",
            json!({"repo": repo.display().to_string(), "task": "Add feature.txt", "builder": "builder", "verifier": "verifier",
                   "acceptance": {"name": "true", "command": "true"}, "name": name}),
        )?;
        let dispatch_ms = t0.elapsed().as_secs_f64() * 1e3;
        let id = lane["lane"]
            .as_str()
            .ok_or("task.dispatch answered no lane")?
            .to_string();
        let wt = lane["worktree"].as_str().unwrap_or_default().to_string();
        let mut ends = 0;
        let mut merged_ms = None;
        while merged_ms.is_none() || ends < 2 {
            let ev = next_event(&mut events)?;
            match ev["kind"].as_str() {
                Some("lane.stage") if ev["data"]["lane"] == json!(id) => {
                    let st = ev["data"]["stage"].as_str().unwrap_or_default();
                    if st == "merged" {
                        merged_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
                    } else if ["sent-back", "cap", "merge-failed", "closed"].contains(&st) {
                        return Err(format!(
                            "lane {id} stopped at {st}; log: {}",
                            util::log_tail(&dirs.log)
                        ));
                    }
                }
                Some("session.end") => ends += 1,
                _ => {}
            }
        }
        wait_log(&dirs.log, &[&format!("lane {id}: worktree {wt} removed")])?;
        wait_no_children(pid)?;
        let after = cpu(pid)?;
        let lane_cpu = after.minus(&before);

        // B: the same agents without a lane.
        let before = cpu(pid)?;
        let b = c.call("sessions.spawn", json!({"harness": "builder", "cwd": scratch.display().to_string(), "prompt": "Add feature.txt"}))?;
        wait_turn(&mut events, b["session_id"].as_str().unwrap_or_default())?;
        let v = c.call("sessions.spawn", json!({"harness": "verifier", "cwd": scratch.display().to_string(), "prompt": verifier_prompt}))?;
        wait_turn(&mut events, v["session_id"].as_str().unwrap_or_default())?;
        for sid in [&b, &v] {
            c.call("sessions.kill", json!({"session_id": sid["session_id"]}))?;
        }
        let mut ends = 0;
        while ends < 2 {
            if next_event(&mut events)?["kind"] == "session.end" {
                ends += 1;
            }
        }
        wait_no_children(pid)?;
        let agents_cpu = cpu(pid)?.minus(&before);

        // The acceptance command alone, from the harness.
        let accept = accept_cpu_ms(&accept_dir, &isolation)?;

        // The plain git worktree add and agent spawn, and the library's
        // worktree step alone.
        let (cli, cli_add) = cli_worktree(&repo, tmp.path(), i, py, &agent)?;
        let step = library_step(&daemon_git, &repo, tmp.path(), i)?;

        s.lane_ms.push(lane_cpu.total());
        s.lane_self_ms.push(lane_cpu.own);
        s.lane_children_ms.push(lane_cpu.children);
        s.agents_ms.push(agents_cpu.total());
        s.agents_self_ms.push(agents_cpu.own);
        s.agents_children_ms.push(agents_cpu.children);
        s.accept_ms.push(accept);
        s.value_ms
            .push(lane_cpu.total() - agents_cpu.total() - accept);
        s.wall_ms.push(merged_ms.unwrap_or(f64::NAN));
        s.dispatch_ms.push(dispatch_ms);
        s.cli_ms.push(cli);
        s.cli_add_ms.push(cli_add);
        s.step_ms.push(step);
    }
    drop(events);
    drop(c);
    daemon.stop(Duration::from_secs(20));

    let m = util::median;
    let r3 = util::round3;
    if want_round {
        let v = m(&s.value_ms);
        let sum = |xs: &[f64]| xs.iter().sum::<f64>();
        let mean = (sum(&s.lane_ms) - sum(&s.agents_ms) - sum(&s.accept_ms)) / rounds as f64;
        Figure {
            name: ROUND,
            placement: None,
            value: v,
            baseline: None,
            baseline_of: "",
            ratio: Some(v / 50.0),
            better: "lower",
            goal: json!("<= 50 ms"),
            unit: "ms of daemon CPU per lane round (own + git children), agents and acceptance command taken out",
            pass: v <= 50.0,
            rounds,
            extra: vec![
                ("mean_ms", r3(mean)),
                ("value_spread", r3(util::spread(&s.value_ms))),
                ("wall_ms", r3(m(&s.wall_ms))),
                ("lane_round_cpu_ms", r3(m(&s.lane_ms))),
                ("lane_round_daemon_threads_ms", r3(m(&s.lane_self_ms))),
                ("lane_round_children_ms", r3(m(&s.lane_children_ms))),
                ("agent_only_round_cpu_ms", r3(m(&s.agents_ms))),
                ("agent_only_daemon_threads_ms", r3(m(&s.agents_self_ms))),
                ("agent_only_children_ms", r3(m(&s.agents_children_ms))),
                ("acceptance_cpu_ms", r3(m(&s.accept_ms))),
                ("isolation", json!(if isolation == check::Isolation::Unisolated { "none" } else { "bwrap" })),
                ("files", json!(FILES)),
                ("clock_tick_ms", r3(1000.0 / ticks_per_s())),
            ],
        }
        .emit();
    }
    if want_wt {
        let (v, b) = (m(&s.dispatch_ms), m(&s.cli_ms));
        let ratio = v / b;
        Figure {
            name: WORKTREE,
            placement: None,
            value: v,
            baseline: Some(b),
            baseline_of: "git worktree add -q -b BRANCH PATH main, then spawning the same fake agent",
            ratio: Some(ratio),
            better: "lower",
            goal: json!("ratio <= 1.5"),
            unit: "ms, task.dispatch sent to its answer",
            pass: ratio <= 1.5,
            rounds,
            extra: vec![
                ("value_spread", r3(util::spread(&s.dispatch_ms))),
                ("baseline_spread", r3(util::spread(&s.cli_ms))),
                ("worktree_step_ms", r3(m(&s.step_ms))),
                ("git_worktree_add_ms", r3(m(&s.cli_add_ms))),
                ("worktree_step_ratio", r3(m(&s.step_ms) / m(&s.cli_add_ms))),
                ("files", json!(FILES)),
            ],
        }
        .emit();
    }
    Ok(())
}

fn fake_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_acp_agent.py")
}

fn seat(harness: &str, family: &str, py: &Path, agent: &Path, script: &Value) -> String {
    // JSON string escapes are valid TOML basic-string escapes.
    let q = |v: &str| serde_json::to_string(v).unwrap_or_default();
    format!(
        "[[seat]]\nharness = \"{harness}\"\ncommand = {}\nargs = [{}]\ntransport = \"acp\"\nprovider = \"test\"\nfamily = \"{family}\"\nenv = {{ FAKE_SCRIPT = {} }}\n\n",
        q(&py.display().to_string()),
        q(&agent.display().to_string()),
        q(&script.to_string())
    )
}

/// Waits until the daemon's log holds every one of `lines`.
fn wait_log(log: &Path, lines: &[&str]) -> Result<(), String> {
    let end = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if lines.iter().all(|l| text.contains(l)) {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(format!(
                "the daemon never logged {lines:?}; log: {}",
                util::log_tail(log)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn next_event(events: &mut Rpc) -> Result<Value, String> {
    loop {
        if let Some(n) = events.notes.pop_front() {
            if n["method"] == "event" {
                return Ok(n["params"].clone());
            }
            continue;
        }
        let v = events.read()?;
        if v["method"] == "event" {
            return Ok(v["params"].clone());
        }
    }
}

/// Waits for the first turn.end of session `sid`.
fn wait_turn(events: &mut Rpc, sid: &str) -> Result<(), String> {
    loop {
        let ev = next_event(events)?;
        if ev["kind"] == "turn.end" && ev["stream"] == json!(sid) {
            return Ok(());
        }
    }
}

/// The daemon's CPU in ms: its own threads, and the children it reaped.
struct Cpu {
    own: f64,
    children: f64,
}

impl Cpu {
    fn total(&self) -> f64 {
        self.own + self.children
    }
    fn minus(&self, o: &Cpu) -> Cpu {
        Cpu {
            own: self.own - o.own,
            children: self.children - o.children,
        }
    }
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

fn cpu(pid: i32) -> Result<Cpu, String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    let rest = s.rsplit_once(')').map(|(_, r)| r).ok_or("bad /proc stat")?;
    // Fields after the command: state is field 3, utime 14 ... cstime 17.
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    if f.len() < 15 {
        return Err("short /proc stat".into());
    }
    let ms = 1000.0 / ticks_per_s();
    Ok(Cpu {
        own: (f[11] + f[12]) * ms,
        children: (f[13] + f[14]) * ms,
    })
}

/// Whether any process has `pid` as its parent (zombies included).
fn has_children(pid: i32) -> bool {
    for p in util::numbered(Path::new("/proc")) {
        let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let ppid = s
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|x| x.parse::<i32>().ok());
        if ppid == Some(pid) {
            return true;
        }
    }
    false
}

fn wait_no_children(pid: i32) -> Result<(), String> {
    let end = Instant::now() + WAIT;
    while has_children(pid) {
        if Instant::now() > end {
            return Err("the daemon's children did not exit".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Let the reactor finish what the last exit started.
    std::thread::sleep(Duration::from_millis(50));
    Ok(())
}

/// Writes dirty pages out before a timed step, so that no side pays for
/// the writeback of the checkouts and removals before it.
fn settle() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

fn children_cpu_ms() -> f64 {
    // SAFETY: getrusage writes one rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU of `true` run as the daemon runs an acceptance command.
fn accept_cpu_ms(dir: &Path, isolation: &check::Isolation) -> Result<f64, String> {
    let before = children_cpu_ms();
    let o = check::run(&check::Spec {
        git: &lgit::Git::host(),
        checkout: dir,
        command: "true",
        timeout: Duration::from_secs(60),
        isolation,
        hidden: &omniconfluxd::isolation::Hidden::default(),
        tail_bytes: 4096,
    })?;
    if !o.passed() {
        return Err(format!(
            "the acceptance command failed here: {}",
            o.summary()
        ));
    }
    Ok(children_cpu_ms() - before)
}

fn git(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "b")
        .env("GIT_AUTHOR_EMAIL", "b@b")
        .env("GIT_COMMITTER_NAME", "b")
        .env("GIT_COMMITTER_EMAIL", "b@b")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("git {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `git worktree add` plus spawning the agent, and the add alone, in ms;
/// then both are undone (not timed).
fn cli_worktree(
    repo: &Path,
    tmp: &Path,
    i: usize,
    py: &Path,
    agent: &Path,
) -> Result<(f64, f64), String> {
    let path = tmp.join(format!("cli-wt-{i}"));
    let branch = format!("bench/cli-{i}");
    settle();
    let t0 = Instant::now();
    git(
        repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            &branch,
            &path.display().to_string(),
            "main",
        ],
    )?;
    let add_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut cmd = Command::new(py);
    cmd.arg(agent).current_dir(&path).stdin(Stdio::piped());
    let p = Proc::spawn("fake agent", cmd, None, None)
        .map_err(|e| format!("unable to start the agent: {e}"))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    drop(p);
    git(
        repo,
        &["worktree", "remove", "--force", &path.display().to_string()],
    )?;
    git(repo, &["branch", "-D", "-q", &branch])?;
    Ok((ms, add_ms))
}

/// The lane worker's worktree step through the library, in ms; undone after.
fn library_step(g: &lgit::Git, repo: &Path, tmp: &Path, i: usize) -> Result<f64, String> {
    let path = tmp.join(format!("lib-wt-{i}"));
    let branch = format!("bench/lib-{i}");
    settle();
    let t0 = Instant::now();
    let base = lgit::current_branch(g, repo).ok_or("no branch checked out")?;
    let commit = lgit::commit_of(g, repo, &format!("refs/heads/{base}")).ok_or("no base commit")?;
    if !lgit::valid_branch_name(g, repo, &branch)
        || lgit::branch_exists(g, repo, &branch)
        || path.exists()
    {
        return Err(format!("{branch} cannot be made"));
    }
    lgit::add_worktree(g, repo, &path, &branch, &commit).map_err(|e| e.to_string())?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    lgit::remove_worktree(g, repo, &path).map_err(|e| e.to_string())?;
    lgit::delete_branch(g, repo, &branch).map_err(|e| e.to_string())?;
    Ok(ms)
}

/// A repository of 10,000 small files on `main`, one commit, packed; made
/// once under `<target>/bench-cache/repo-10k/`.
fn repo_10k() -> Result<PathBuf, String> {
    let root = util::target_dir().join("bench-cache/repo-10k");
    let repo = root.join("repo");
    let marker = root.join("complete");
    let want = format!("{FILES} files\n");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return Ok(repo);
    }
    let _ = std::fs::remove_dir_all(&root);
    eprintln!(
        "bench: preparing a repository of {FILES} files in {} (once)",
        repo.display()
    );
    let t0 = Instant::now();
    for n in 0..FILES {
        let dir = repo.join(format!("src/d{:02}", n / 100));
        if n % 100 == 0 {
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(
            dir.join(format!("f{:02}.txt", n % 100)),
            format!("file {n}\na small line of content\n"),
        )
        .map_err(|e| e.to_string())?;
    }
    git(&repo, &["init", "-q", "-b", "main"])?;
    git(&repo, &["add", "-A"])?;
    // Without gc.auto=0 the commit's 10,000 loose objects start an
    // automatic gc in the background, and the gc below then fails on its
    // lock ("gc is already running").
    git(
        &repo,
        &[
            "-c",
            "gc.auto=0",
            "commit",
            "-q",
            "-m",
            "ten thousand files",
        ],
    )?;
    git(&repo, &["gc", "-q"])?;
    std::fs::write(&marker, want).map_err(|e| e.to_string())?;
    eprintln!("bench: prepared in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(repo)
}
