//! Discovery of agent sessions in tmux panes (issue 15, "Discovery of
//! agent sessions"; seed 004, Session): which agent runs in a pane, in
//! which directory, on which branch, and what it is doing.
//!
//! - **Agent.** A pane holds an agent when a process of the pane's tree
//!   (the pane's process and its descendants, breadth first) is one: its
//!   command name (`/proc/PID/comm`) or the base name of its first or
//!   second argument (`node /usr/lib/.../gemini`) is `claude`, `codex`,
//!   `gemini` or `opencode`. The first such process is the agent.
//! - **cwd** is the agent process's working directory; **repo** and
//!   **branch** are read from the `.git` above it (the base name of the
//!   work tree, and HEAD's branch or its short commit id) without running
//!   git, so that no hook or file-system monitor of a repository runs.
//! - **Status.** Claude Code writes its transcript to
//!   `~/.claude/projects/<cwd, each character other than a letter or a
//!   digit as '-'>/<session id>.jsonl`, HOME being the daemon's. The
//!   newest file there is the session's transcript; its last record gives
//!   the status: an assistant message that ended its turn, or a system
//!   record, is `idle`; a prompt, a tool result or an assistant message
//!   that calls a tool is `working`. Every other agent, and Claude Code
//!   without a transcript, is read from the screen: a line offering
//!   "esc to interrupt" (or cancel) is `working`, and anything else
//!   `idle`. A screen asking "Do you want to ..." (a permission prompt)
//!   is `awaiting_input` for every agent, transcript or not, and that
//!   line of the screen, trimmed of the box drawn around it, is kept as
//!   the request's `prompt` (seed 004's `interaction.message`).
//!
//! Blocking (files under /proc, the transcript, one capture per agent
//! pane): it runs on the tmux workers.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::driver::{self, Pane, Server};
use crate::limits;

/// The agents discovery recognises, by the names their processes carry.
pub const AGENTS: &[&str] = &["claude", "codex", "gemini", "opencode"];

/// seed 004's SessionStatus, as far as discovery can tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Working,
    AwaitingInput,
    Idle,
}

impl Status {
    pub fn wire_name(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::AwaitingInput => "awaiting_input",
            Status::Idle => "idle",
        }
    }
}

/// An agent session found in a pane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// `<server>:<pane_id>` (seed 004, Composite ids).
    pub id: String,
    pub server: String,
    pub pane: Pane,
    /// The agent's name, or for a pane of the daemon's own server
    /// without one, the pane's command.
    pub agent: String,
    pub agent_pid: i32,
    pub cwd: String,
    pub repo: Option<String>,
    pub branch: Option<String>,
    pub status: Status,
    pub transcript_path: Option<String>,
    pub agent_session_id: Option<String>,
    /// While `awaiting_input`: the screen's prompt line (module comment).
    pub prompt: Option<String>,
}

/// The process table: each process's parent and names.
#[derive(Default)]
pub struct Procs {
    children: HashMap<i32, Vec<i32>>,
    names: HashMap<i32, Vec<String>>,
}

impl Procs {
    /// Reads /proc once, at most `PROC_SCAN_MAX` processes.
    pub fn read() -> Procs {
        let mut p = Procs::default();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return p;
        };
        for e in dir.flatten().take(limits::PROC_SCAN_MAX) {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Some(stat) = crate::procs::read_stat(pid) else {
                continue;
            };
            p.children.entry(stat.ppid).or_default().push(pid);
            p.names.insert(pid, names_of(pid));
        }
        p
    }

    /// The first process of `root`'s tree, breadth first, that is an
    /// agent, with the agent's name; at most `PROC_TREE_MAX` processes are
    /// looked at.
    pub fn agent_in(&self, root: i32) -> Option<(i32, &'static str)> {
        let mut queue = VecDeque::from([root]);
        let mut seen = 0;
        while let Some(pid) = queue.pop_front() {
            seen += 1;
            if seen > limits::PROC_TREE_MAX {
                return None;
            }
            if let Some(agent) = self.names.get(&pid).and_then(|n| agent_named(n)) {
                return Some((pid, agent));
            }
            if let Some(kids) = self.children.get(&pid) {
                queue.extend(kids.iter().copied());
            }
        }
        None
    }
}

/// A process's names: its command name, and the base names of its first
/// two arguments.
fn names_of(pid: i32) -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        names.push(comm.trim_end().to_string());
    }
    if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/cmdline")) {
        let mut raw = Vec::new();
        let _ = f
            .take(limits::PROC_CMDLINE_MAX_BYTES as u64)
            .read_to_end(&mut raw);
        for arg in raw.split(|b| *b == 0).take(2) {
            let arg = String::from_utf8_lossy(arg);
            if let Some(base) = Path::new(arg.as_ref()).file_name() {
                names.push(base.to_string_lossy().into_owned());
            }
        }
    }
    names
}

/// The agent one of `names` names, if any.
pub fn agent_named(names: &[String]) -> Option<&'static str> {
    names
        .iter()
        .find_map(|n| AGENTS.iter().find(|a| **a == n.as_str()).copied())
}

/// The agent sessions of one server's panes; with `every_pane` (the
/// daemon's own server, where every pane was spawned as a session), panes
/// without an agent too.
pub fn scan(
    server: &Server,
    panes: Vec<Pane>,
    procs: &Procs,
    home: &Path,
    every_pane: bool,
) -> Vec<Found> {
    let mut found = Vec::new();
    for pane in panes {
        // A live terminal's viewer session shows a pane already listed; a
        // persistent terminal is no agent session.
        if pane
            .session_name
            .starts_with(super::terminal::VIEWER_PREFIX)
            || pane.session_name.starts_with(super::persistent::PREFIX)
        {
            continue;
        }
        let (agent_pid, agent) = match procs.agent_in(pane.pid) {
            Some((pid, a)) => (pid, a.to_string()),
            None if every_pane => (pane.pid, pane.command.clone()),
            None => continue,
        };
        let cwd = std::fs::read_link(format!("/proc/{agent_pid}/cwd"))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| pane.current_path.clone());
        let (repo, branch) = git_head(Path::new(&cwd)).unzip();
        let transcript = (agent == "claude")
            .then(|| newest_transcript(home, &cwd))
            .flatten();
        let screen = driver::capture(server, &pane.pane_id).unwrap_or_default();
        let from_screen = screen_status(&screen);
        let status = match (
            from_screen,
            transcript.as_ref().and_then(|t| file_status(t)),
        ) {
            (Status::AwaitingInput, _) => Status::AwaitingInput,
            (_, Some(s)) => s,
            (s, None) => s,
        };
        let prompt = (status == Status::AwaitingInput)
            .then(|| prompt_line(&screen))
            .flatten();
        let agent_session_id = transcript
            .as_ref()
            .and_then(|t| t.file_stem())
            .map(|s| s.to_string_lossy().into_owned());
        found.push(Found {
            id: format!("{}:{}", server.name, pane.pane_id),
            server: server.name.clone(),
            pane,
            agent,
            agent_pid,
            cwd,
            repo,
            branch,
            status,
            transcript_path: transcript.map(|t| t.display().to_string()),
            agent_session_id,
            prompt,
        });
    }
    found
}

/// Claude Code's project directory name for `cwd`.
pub fn project_dir_name(cwd: &str) -> String {
    cwd.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The most recently written `.jsonl` of Claude Code's project directory
/// for `cwd`, among at most `TRANSCRIPT_DIR_SCAN_MAX` entries.
pub fn newest_transcript(home: &Path, cwd: &str) -> Option<PathBuf> {
    let dir = home.join(".claude/projects").join(project_dir_name(cwd));
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .take(limits::TRANSCRIPT_DIR_SCAN_MAX)
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

/// The status the last record of a Claude Code transcript gives, read
/// from its last `TRANSCRIPT_TAIL_BYTES`; `None` when no record tells.
pub fn file_status(path: &Path) -> Option<Status> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let from = len.saturating_sub(limits::TRANSCRIPT_TAIL_BYTES as u64);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut raw = Vec::new();
    f.take(limits::TRANSCRIPT_TAIL_BYTES as u64)
        .read_to_end(&mut raw)
        .ok()?;
    let text = String::from_utf8_lossy(&raw);
    let mut lines: Vec<&str> = text.lines().collect();
    if from > 0 && !lines.is_empty() {
        // The first line read may be the end of a longer one.
        lines.remove(0);
    }
    lines.iter().rev().find_map(|l| record_status(l))
}

/// What one transcript record says of the session, if anything.
pub fn record_status(line: &str) -> Option<Status> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    match v.get("type")?.as_str()? {
        "assistant" => match v["message"]["stop_reason"].as_str() {
            Some("tool_use") | None => Some(Status::Working),
            Some(_) => Some(Status::Idle),
        },
        "user" => {
            let content = &v["message"]["content"];
            let text = match content {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                _ => String::new(),
            };
            if text.starts_with("[Request interrupted by user") {
                Some(Status::Idle)
            } else {
                Some(Status::Working)
            }
        }
        "system" => Some(Status::Idle),
        _ => None,
    }
}

/// The status a screen shows (module comment).
pub fn screen_status(screen: &str) -> Status {
    let lower = screen.to_lowercase();
    if lower.contains("do you want to") {
        Status::AwaitingInput
    } else if ["esc to interrupt", "esc to cancel", "esc interrupt"]
        .iter()
        .any(|s| lower.contains(s))
    {
        Status::Working
    } else {
        Status::Idle
    }
}

/// The line of a screen that asks "Do you want to ..." (a permission
/// prompt), without the box drawn around it, at most
/// `TMUX_PROMPT_LINE_MAX` characters.
pub fn prompt_line(screen: &str) -> Option<String> {
    let line = screen
        .lines()
        .find(|l| l.to_lowercase().contains("do you want to"))?;
    let frame = |c: char| c.is_whitespace() || ('\u{2500}'..='\u{257f}').contains(&c) || c == '|';
    let text: String = line
        .trim_matches(frame)
        .chars()
        .take(limits::TMUX_PROMPT_LINE_MAX)
        .collect();
    Some(text)
}

/// The repository (its work tree's base name) and branch (or short
/// commit id for a detached HEAD) that hold `dir`, read from the files of
/// the nearest `.git` above it.
pub fn git_head(dir: &Path) -> Option<(String, String)> {
    let mut at = Some(dir);
    let mut steps = 0;
    while let Some(d) = at {
        steps += 1;
        if steps > limits::GIT_WALK_MAX {
            return None;
        }
        let dot = d.join(".git");
        let git_dir = if dot.is_dir() {
            Some(dot)
        } else if dot.is_file() {
            // A worktree or submodule: "gitdir: PATH".
            let text = read_small(&dot)?;
            let p = PathBuf::from(text.strip_prefix("gitdir:")?.trim());
            Some(if p.is_absolute() { p } else { d.join(p) })
        } else {
            None
        };
        if let Some(g) = git_dir {
            let head = read_small(&g.join("HEAD"))?;
            let head = head.trim();
            let branch = match head.strip_prefix("ref: ") {
                Some(r) => r.strip_prefix("refs/heads/").unwrap_or(r).to_string(),
                None => head.chars().take(7).collect(),
            };
            let repo = d.file_name()?.to_string_lossy().into_owned();
            return Some((repo, branch));
        }
        at = d.parent();
    }
    None
}

fn read_small(p: &Path) -> Option<String> {
    let f = std::fs::File::open(p).ok()?;
    let mut s = String::new();
    f.take(4096).read_to_string(&mut s).ok()?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_code_s_project_directory_replaces_every_other_character() {
        assert_eq!(project_dir_name("/srv/work/demo"), "-srv-work-demo");
        assert_eq!(project_dir_name("/home/op/my_app.v2"), "-home-op-my-app-v2");
    }

    #[test]
    fn an_agent_is_known_by_its_command_name_or_its_script() {
        let n = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(agent_named(&n(&["claude"])), Some("claude"));
        assert_eq!(agent_named(&n(&["node", "node", "gemini"])), Some("gemini"));
        assert_eq!(agent_named(&n(&["bash", "bash"])), None);
        assert_eq!(agent_named(&n(&["claude-helper"])), None);
    }

    #[test]
    fn the_last_transcript_record_tells_working_from_idle() {
        let asst = |stop: &str| {
            format!(
                r#"{{"type":"assistant","message":{{"role":"assistant","stop_reason":{stop}}}}}"#
            )
        };
        assert_eq!(record_status(&asst(r#""end_turn""#)), Some(Status::Idle));
        assert_eq!(record_status(&asst(r#""tool_use""#)), Some(Status::Working));
        assert_eq!(record_status(&asst("null")), Some(Status::Working));
        let user = r#"{"type":"user","message":{"role":"user","content":"hi"}}"#;
        assert_eq!(record_status(user), Some(Status::Working));
        let stopped = r#"{"type":"user","message":{"content":[{"type":"text","text":"[Request interrupted by user]"}]}}"#;
        assert_eq!(record_status(stopped), Some(Status::Idle));
        assert_eq!(record_status(r#"{"type":"summary"}"#), None);
        assert_eq!(record_status("not json"), None);
    }

    #[test]
    fn a_screen_shows_a_permission_prompt_work_or_nothing() {
        assert_eq!(
            screen_status("Bash(rm x)\n Do you want to proceed?\n 1. Yes"),
            Status::AwaitingInput
        );
        assert_eq!(
            screen_status("* Thinking (esc to interrupt)"),
            Status::Working
        );
        assert_eq!(screen_status("> "), Status::Idle);
    }

    #[test]
    fn a_permission_prompt_s_line_is_kept_without_its_box() {
        let screen = "╭────╮\n│ Bash(rm x)                 │\n│ Do you want to proceed?    │\n│ ❯ 1. Yes │\n";
        assert_eq!(
            prompt_line(screen).as_deref(),
            Some("Do you want to proceed?")
        );
        assert_eq!(prompt_line("> "), None);
        let wide = format!("Do you want to {}", "x".repeat(2000));
        assert_eq!(
            prompt_line(&wide).map(|l| l.chars().count()),
            Some(limits::TMUX_PROMPT_LINE_MAX)
        );
    }

    #[test]
    fn the_branch_comes_from_head_and_a_detached_head_is_a_short_id() {
        let dir = std::env::temp_dir().join(format!("oc-git-head-{}", std::process::id()));
        let sub = dir.join("proj/src");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::create_dir_all(dir.join("proj/.git")).unwrap();
        std::fs::write(dir.join("proj/.git/HEAD"), "ref: refs/heads/feature/x\n").unwrap();
        assert_eq!(
            git_head(&sub),
            Some(("proj".to_string(), "feature/x".to_string()))
        );
        std::fs::write(dir.join("proj/.git/HEAD"), "0123456789abcdef\n").unwrap();
        assert_eq!(
            git_head(&sub),
            Some(("proj".to_string(), "0123456".to_string()))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
