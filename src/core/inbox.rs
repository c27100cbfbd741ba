//! The approvals inbox as a reusable core (DESIGN.md, "Approvals inbox";
//! issue 3, "The approvals inbox"): every request that waits on the
//! operator, whoever made it, by id, with its risk label, its deadline and
//! fallback, and, once it is over, who resolved it, when, through which
//! surface and whether the answer reached the requester.
//!
//! Pure state: no I/O, no clock, no timers. `core::approvals` adds the
//! rules (risk, rows, expiry, owners); the router delivers resolutions. Two kinds of request wait here: an agent's permission
//! (`<session>-aN`) and a plugin's task (`plugin_<uuid>`, from the plugin
//! host's tasks.create). Another kind is a new [`Subject`] variant plus its
//! owner in `core::approvals::owner`, which the router delivers answers to.

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

use crate::limits;

/// The risk gate's label (seed 000, approval.request `risk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Risk {
    Low,
    Medium,
    High,
}

impl Risk {
    pub fn wire_name(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::Medium => "medium",
            Risk::High => "high",
        }
    }

    pub fn parse(s: &str) -> Option<Risk> {
        match s {
            "low" => Some(Risk::Low),
            "medium" => Some(Risk::Medium),
            "high" => Some(Risk::High),
            _ => None,
        }
    }
}

/// What a request is about. Every variant names the exact action it
/// approves: a tool and the SHA-256 digest of its input, so that an answer
/// is bound to what the operator saw.
#[derive(Clone, Debug, PartialEq)]
pub enum Subject {
    /// A permission an agent of a session asked for.
    Agent(AgentAsk),
    /// A task a plugin asked to start (tasks.create).
    PluginTask(PluginTask),
    /// A lane's pass waiting for the operator's consent to merge (issue 5:
    /// "The operator can require an approval in the inbox before any
    /// merge"; `lanes.require_merge_approval`).
    LaneMerge(LaneMerge),
}

/// A merge the operator must allow. The digest is the commit that passed:
/// an allow merges exactly that commit.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneMerge {
    pub lane: String,
    /// The lane, its task's name, its branch and base.
    pub summary: String,
    pub commit: String,
}

/// A plugin's task request. The whole request is the plugin host's
/// (`plugins::tasks`, plugin.request.get); the inbox holds what the
/// operator's list shows and what binds the answer to the request.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginTask {
    /// The plugin's id.
    pub plugin: String,
    /// The plugin's name, the repository, and the task's name or first line.
    pub summary: String,
    /// Lowercase hex SHA-256 of the request as the host stored it: its
    /// scopeIdentity (seed 000, plugin.request.get `digest`).
    pub digest: String,
}

/// The exact action an agent's request would carry out (issue 10, item
/// 12: "a model can describe a destructive command innocently"), read from
/// the tool input the answer is bound to and never from the model-written
/// title or description: a string `command` (or an array of strings, joined
/// by spaces) is a `command`; else a string `url` is a `url`; else the paths
/// the input names (`risk::paths_of`, one a line) are a `path`; else a
/// non-empty input is the `input` itself as compact JSON. Past
/// `limits::APPROVAL_TARGET_MAX` bytes the text is cut at a character
/// boundary and `truncated` is set; the whole input is in the transcript
/// (sessions.toolDetail) and the digest covers all of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// command, url, path or input.
    pub kind: String,
    pub text: String,
    pub truncated: bool,
}

impl Target {
    pub fn of_input(input: &Value) -> Option<Target> {
        let command = match input.get("command").or_else(|| input.get("cmd")) {
            Some(Value::String(c)) => Some(c.clone()),
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => Some(
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        };
        let (kind, text) = if let Some(c) = command {
            ("command", c)
        } else if let Some(u) = input.get("url").and_then(Value::as_str) {
            ("url", u.to_string())
        } else {
            let paths = crate::core::risk::paths_of(input);
            if !paths.is_empty() {
                ("path", paths.join("\n"))
            } else if input.is_null() || input.as_object().is_some_and(|m| m.is_empty()) {
                return None;
            } else {
                ("input", input.to_string())
            }
        };
        let mut t = Target {
            kind: kind.to_string(),
            text,
            truncated: false,
        };
        if t.text.len() > limits::APPROVAL_TARGET_MAX {
            let mut end = limits::APPROVAL_TARGET_MAX;
            while !t.text.is_char_boundary(end) {
                end -= 1;
            }
            t.text.truncate(end);
            t.truncated = true;
        }
        Some(t)
    }

    pub fn to_json(&self) -> Value {
        json!({"kind": self.kind, "text": self.text, "truncated": self.truncated})
    }

    /// Reads back what `to_json` wrote (the ledger's `target` column).
    pub fn from_json(v: &Value) -> Option<Target> {
        Some(Target {
            kind: v.get("kind")?.as_str()?.to_string(),
            text: v.get("text")?.as_str()?.to_string(),
            truncated: v.get("truncated").and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

/// An agent's permission request.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentAsk {
    pub session: String,
    /// The transport core's key for the open request.
    pub agent_request_key: String,
    /// The tool as the agent named it (its title).
    pub tool: String,
    /// The action kind's wire name (read, edit, execute, ...).
    pub action: String,
    /// Lowercase hex SHA-256 of the tool input's JSON text.
    pub digest: String,
    /// The exact action, from the tool input.
    pub target: Option<Target>,
}

impl Subject {
    /// The kind's name in the ledger and on the socket.
    pub fn kind(&self) -> &'static str {
        match self {
            Subject::Agent(_) => "agent",
            Subject::PluginTask(_) => "plugin-task",
            Subject::LaneMerge(_) => "lane-merge",
        }
    }

    /// The session that asked; None for a plugin's task.
    pub fn session(&self) -> Option<&str> {
        match self {
            Subject::Agent(a) => Some(&a.session),
            Subject::PluginTask(_) | Subject::LaneMerge(_) => None,
        }
    }

    /// The plugin that asked; None for an agent's request.
    pub fn plugin(&self) -> Option<&str> {
        match self {
            Subject::Agent(_) | Subject::LaneMerge(_) => None,
            Subject::PluginTask(t) => Some(&t.plugin),
        }
    }

    /// One line for the operator's list; None for an agent's request, whose
    /// tool and action say it.
    pub fn summary(&self) -> Option<&str> {
        match self {
            Subject::Agent(_) => None,
            Subject::PluginTask(t) => Some(&t.summary),
            Subject::LaneMerge(m) => Some(&m.summary),
        }
    }

    /// The action kind: the agent's (read, edit, execute, ...), or `task`.
    pub fn action(&self) -> &str {
        match self {
            Subject::Agent(a) => &a.action,
            Subject::PluginTask(_) => "task",
            Subject::LaneMerge(_) => "merge",
        }
    }

    /// The tool as the agent named it, or the plugin call `tasks.create`.
    pub fn tool(&self) -> &str {
        match self {
            Subject::Agent(a) => &a.tool,
            Subject::PluginTask(_) => "tasks.create",
            Subject::LaneMerge(_) => "lanes.merge",
        }
    }

    /// The exact action of an agent's request; None for the other kinds,
    /// whose summary says it.
    pub fn target(&self) -> Option<&Target> {
        match self {
            Subject::Agent(a) => a.target.as_ref(),
            Subject::PluginTask(_) | Subject::LaneMerge(_) => None,
        }
    }

    pub fn digest(&self) -> &str {
        match self {
            Subject::Agent(a) => &a.digest,
            Subject::PluginTask(t) => &t.digest,
            Subject::LaneMerge(m) => &m.commit,
        }
    }
}

/// How a request ended (seed 000, approval.resolved `decision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
    /// Withdrawn without a yes or no.
    Cancel,
}

impl Verdict {
    pub fn wire_name(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Cancel => "cancel",
        }
    }
}

/// What an unanswered request becomes at its deadline: the config's
/// `[approvals] fallback`, whose names the socket and the ledger use too.
pub use crate::config::Fallback;

/// Who resolved a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Answerer {
    /// The operator, as the socket's peer credentials named them.
    Operator { pid: i32 },
    /// The config's `[[approvals.rule]]` with this index (from 1).
    Rule(usize),
    /// The deadline passed; the fallback applied.
    Timeout,
    /// The daemon itself (the requester went away, the daemon restarted).
    Daemon(String),
    /// Read back from the ledger for the history of an earlier run: the
    /// text `describe` gave then.
    Recorded(String),
}

impl Answerer {
    pub fn describe(&self) -> String {
        match self {
            Answerer::Operator { pid } => format!("operator pid {pid}"),
            Answerer::Rule(n) => format!("rule {n}"),
            Answerer::Timeout => "timeout".into(),
            Answerer::Daemon(why) => format!("daemon: {why}"),
            Answerer::Recorded(text) => text.clone(),
        }
    }
}

/// A request's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    pub verdict: Verdict,
    pub by: Answerer,
    /// Where the answer came in: `socket`, `config-rule`, `timer`, `daemon`.
    pub surface: &'static str,
    pub at_ms: i64,
    /// Whether an answer reached the requester.
    pub delivered: bool,
    pub reason: Option<String>,
    /// What the answer carried beyond allow (`approvals::answer_json`).
    pub answer: Option<String>,
}

/// One request.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub id: String,
    pub subject: Subject,
    pub risk: Risk,
    pub created_ms: i64,
    pub expires_ms: Option<i64>,
    pub fallback: Fallback,
    pub resolution: Option<Resolution>,
    order: u64,
}

impl Item {
    pub fn is_pending(&self) -> bool {
        self.resolution.is_none()
    }

    /// An item of an earlier run, read back from the ledger.
    #[allow(clippy::too_many_arguments)]
    pub fn restored(
        id: String,
        subject: Subject,
        risk: Risk,
        created_ms: i64,
        expires_ms: Option<i64>,
        fallback: Fallback,
        resolution: Option<Resolution>,
    ) -> Item {
        Item {
            id,
            subject,
            risk,
            created_ms,
            expires_ms,
            fallback,
            resolution,
            order: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboxError {
    NotFound,
    /// Answered, withdrawn or expired already: every request is used once.
    NotPending,
    /// An item with that id exists.
    Duplicate,
}

/// Pending requests, and the most recent resolved ones.
#[derive(Default)]
pub struct Inbox {
    pending: HashMap<String, Item>,
    resolved: VecDeque<Item>,
    next_order: u64,
}

impl Inbox {
    /// Adds a pending request. `timeout` None waits without end.
    pub fn add(
        &mut self,
        id: String,
        subject: Subject,
        risk: Risk,
        now_ms: i64,
        timeout_ms: Option<i64>,
        fallback: Fallback,
    ) -> Result<&Item, InboxError> {
        if self.pending.contains_key(&id) || self.resolved.iter().any(|i| i.id == id) {
            return Err(InboxError::Duplicate);
        }
        self.next_order += 1;
        let item = Item {
            id: id.clone(),
            subject,
            risk,
            created_ms: now_ms,
            expires_ms: timeout_ms.map(|t| now_ms.saturating_add(t)),
            fallback,
            resolution: None,
            order: self.next_order,
        };
        Ok(self.pending.entry(id).or_insert(item))
    }

    /// Puts resolved items of an earlier run (from the ledger, oldest first)
    /// before those of this run, keeping the newest
    /// `limits::INBOX_RESOLVED_KEPT` of all; an id this run knows is skipped.
    pub fn restore_resolved(&mut self, items: Vec<Item>) {
        let mut merged: VecDeque<Item> = items
            .into_iter()
            .filter(|i| i.resolution.is_some() && self.get(&i.id).is_none())
            .collect();
        merged.extend(self.resolved.drain(..));
        while merged.len() > limits::INBOX_RESOLVED_KEPT {
            merged.pop_front();
        }
        self.resolved = merged;
    }

    /// The pending request `id`, to check before delivering an answer.
    pub fn pending(&self, id: &str) -> Result<&Item, InboxError> {
        match self.pending.get(id) {
            Some(i) => Ok(i),
            None if self.resolved.iter().any(|i| i.id == id) => Err(InboxError::NotPending),
            None => Err(InboxError::NotFound),
        }
    }

    /// Ends a pending request with `resolution`; returns the resolved item.
    pub fn resolve(&mut self, id: &str, resolution: Resolution) -> Result<Item, InboxError> {
        self.pending(id)?;
        let mut item = self.pending.remove(id).ok_or(InboxError::NotFound)?;
        item.resolution = Some(resolution);
        if self.resolved.len() >= limits::INBOX_RESOLVED_KEPT {
            self.resolved.pop_front();
        }
        self.resolved.push_back(item.clone());
        Ok(item)
    }

    /// Whether `id` is pending and its deadline has passed at `now_ms`.
    pub fn is_due(&self, id: &str, now_ms: i64) -> bool {
        self.pending
            .get(id)
            .and_then(|i| i.expires_ms)
            .is_some_and(|at| at <= now_ms)
    }

    pub fn get(&self, id: &str) -> Option<&Item> {
        self.pending
            .get(id)
            .or_else(|| self.resolved.iter().rev().find(|i| i.id == id))
    }

    /// Pending requests oldest first, then (with `resolved`) the kept
    /// resolved ones, oldest first.
    /// How many requests wait for an answer.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    pub fn list(&self, resolved: bool) -> Vec<&Item> {
        let mut out: Vec<&Item> = self.pending.values().collect();
        out.sort_by_key(|i| i.order);
        if resolved {
            out.extend(self.resolved.iter());
        }
        out
    }

    /// Ids of the pending requests `pred` selects, oldest first.
    pub fn pending_ids(&self, pred: impl Fn(&Item) -> bool) -> Vec<String> {
        let mut v: Vec<&Item> = self.pending.values().filter(|i| pred(i)).collect();
        v.sort_by_key(|i| i.order);
        v.into_iter().map(|i| i.id.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(n: u32) -> Subject {
        Subject::Agent(AgentAsk {
            session: "s-1".into(),
            agent_request_key: n.to_string(),
            tool: "Bash".into(),
            action: "execute".into(),
            digest: "00".into(),
            target: None,
        })
    }

    fn res(v: Verdict) -> Resolution {
        Resolution {
            verdict: v,
            by: Answerer::Operator { pid: 1 },
            surface: "socket",
            at_ms: 5,
            delivered: true,
            reason: None,
            answer: None,
        }
    }

    #[test]
    fn a_request_is_answered_once_and_then_kept_resolved() {
        let mut inbox = Inbox::default();
        inbox
            .add(
                "s-1-a1".into(),
                ask(1),
                Risk::High,
                0,
                Some(1000),
                Fallback::Deny,
            )
            .unwrap();
        inbox
            .add(
                "s-1-a2".into(),
                ask(2),
                Risk::Low,
                1,
                None,
                Fallback::Withdraw,
            )
            .unwrap();
        assert_eq!(
            inbox
                .add("s-1-a1".into(), ask(1), Risk::High, 0, None, Fallback::Deny)
                .unwrap_err(),
            InboxError::Duplicate
        );
        assert!(
            inbox.is_due("s-1-a1", 1000)
                && !inbox.is_due("s-1-a1", 999)
                && !inbox.is_due("s-1-a2", i64::MAX)
        );
        let ids: Vec<&str> = inbox.list(false).iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["s-1-a1", "s-1-a2"]);
        let item = inbox.resolve("s-1-a1", res(Verdict::Allow)).unwrap();
        assert_eq!(item.resolution.unwrap().verdict, Verdict::Allow);
        assert_eq!(
            inbox.resolve("s-1-a1", res(Verdict::Deny)).unwrap_err(),
            InboxError::NotPending
        );
        assert_eq!(
            inbox.resolve("nope", res(Verdict::Deny)).unwrap_err(),
            InboxError::NotFound
        );
        assert!(!inbox.get("s-1-a1").unwrap().is_pending());
        assert_eq!(inbox.list(true).len(), 2);
        assert_eq!(
            inbox.pending_ids(|i| i.subject.session() == Some("s-1")),
            vec!["s-1-a2".to_string()]
        );
    }

    #[test]
    fn a_plugin_task_has_no_session_and_names_its_plugin() {
        let t = Subject::PluginTask(PluginTask {
            plugin: "night-shift".into(),
            summary: "Night Shift: fix in /srv".into(),
            digest: "ab".into(),
        });
        assert_eq!(
            (t.kind(), t.session(), t.plugin(), t.summary()),
            (
                "plugin-task",
                None,
                Some("night-shift"),
                Some("Night Shift: fix in /srv")
            )
        );
        assert_eq!(
            (t.action(), t.tool(), t.digest()),
            ("task", "tasks.create", "ab")
        );
        let a = ask(1);
        assert_eq!(
            (a.kind(), a.session(), a.plugin(), a.summary()),
            ("agent", Some("s-1"), None, None)
        );
        let mut inbox = Inbox::default();
        inbox
            .add("s-1-a1".into(), a, Risk::High, 0, None, Fallback::Deny)
            .unwrap();
        inbox
            .add(
                "plugin_x".into(),
                t,
                Risk::High,
                0,
                Some(10),
                Fallback::Deny,
            )
            .unwrap();
        assert_eq!(
            inbox.pending_ids(|i| i.subject.session() == Some("s-1")),
            vec!["s-1-a1".to_string()]
        );
    }

    #[test]
    fn the_target_is_the_exact_action_of_the_input() {
        let t = |v: Value| Target::of_input(&v).map(|t| (t.kind, t.text, t.truncated));
        let k = |kind: &str, text: &str| Some((kind.to_string(), text.to_string(), false));
        assert_eq!(
            t(json!({"command": "rm -rf x", "description": "tidy"})),
            k("command", "rm -rf x")
        );
        assert_eq!(
            t(json!({"command": ["bash", "-lc", "ls"]})),
            k("command", "bash -lc ls")
        );
        assert_eq!(
            t(json!({"url": "https://x.test/", "prompt": "p"})),
            k("url", "https://x.test/")
        );
        assert_eq!(
            t(json!({"edits": [{"file_path": "/a"}, {"file_path": "/b"}]})),
            k("path", "/a\n/b")
        );
        assert_eq!(t(json!({"query": "q"})), k("input", r#"{"query":"q"}"#));
        assert_eq!(t(json!({})), None);
        assert_eq!(t(Value::Null), None);
        let long = "é".repeat(limits::APPROVAL_TARGET_MAX);
        let cut = Target::of_input(&json!({"command": long})).unwrap();
        assert!(cut.truncated && cut.text.len() <= limits::APPROVAL_TARGET_MAX);
        assert_eq!(Target::from_json(&cut.to_json()), Some(cut));
    }

    #[test]
    fn resolved_items_kept_are_bounded() {
        let mut inbox = Inbox::default();
        for n in 0..(limits::INBOX_RESOLVED_KEPT as u32 + 10) {
            let id = format!("s-1-a{n}");
            inbox
                .add(id.clone(), ask(n), Risk::Low, 0, None, Fallback::Deny)
                .unwrap();
            inbox.resolve(&id, res(Verdict::Deny)).unwrap();
        }
        assert_eq!(inbox.list(true).len(), limits::INBOX_RESOLVED_KEPT);
    }
}
