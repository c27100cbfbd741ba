//! The transcript of a discovered Claude Code session, read from its
//! transcript file (issue 15, "Transcripts of discovered Claude Code
//! sessions"; seed 004, Transcripts, the Transcript and Task types). This
//! file owns the parse: one [`File`] per transcript file, which a tmux
//! worker reads on from the byte offset it reached (incremental; at most
//! `TRANSCRIPT_READ_PER_JOB` bytes a job), turning each record (a JSON
//! line) into the seed's entries, the agent's prompt queue and its task
//! list. The reactor holds the `File` between reads and hands it to the
//! worker by value for each one (src/daemon/router/tmux.rs), so one
//! thread at a time owns it.
//!
//! Records, as Claude Code writes them (`type`):
//! - `user`: a prompt (a `user` entry, which starts a turn), or tool
//!   results (`tool_result` blocks: the tool entry they answer gets its
//!   `resultIsError`, the result is kept for `sessions.toolDetail`). The
//!   text `[Request interrupted by user...]` ends the turn as
//!   interrupted. `isMeta` records (what Claude Code adds for itself) are
//!   no entries; an `isCompactSummary` one is a `compact` entry.
//! - `assistant`: one entry per content block (`text`, `thinking`,
//!   `tool_use` as `tool`); a `stop_reason` other than `tool_use` ends the
//!   turn. Streaming writes one record per block, with the same message
//!   id: output tokens are counted once per message.
//! - `system`: `turn_duration` ends a turn still open (or gives the last
//!   `turn_end` its `durationMs`); `compact_boundary` is a `compact`
//!   entry; others with text are `system` entries (`isError` for level
//!   `error`).
//! - `queue-operation`: `enqueue` (content), `dequeue`, `remove`,
//!   `popAll`: the session's queue (seed 004, `queue`).
//! - Anything else (`summary`, snapshots, attachments) is no entry.
//!
//! Turn end (seed 004: "emits a turn_end entry only for a finished turn"):
//! a `turn_end` entry follows the turn's last entry, once, with the
//! model, usage (output summed over the turn's API calls, the rest from
//! its last call), stop reason, duration (from the prompt's timestamp to
//! the end's), thinking and tool counts, and `interrupted`.
//!
//! Entry ids are the record's `uuid` and the block's position
//! (`<uuid>.<n>`, `<uuid>.end` for a turn end), so they are stable as the
//! file grows; a record without a uuid uses its line number.
//!
//! Tasks (seed 004, Task; `sessions.tasks`): Claude Code's TaskCreate
//! (ids 1, 2, ... in creation order, as Claude Code numbers them) and
//! TaskUpdate (`taskId`, `status` — `deleted` removes it —, `subject`,
//! `description`, `activeForm`, `addBlocks`, `addBlockedBy`), and the
//! older TodoWrite, whose `todos` replace the list.

use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::limits;

/// One entry: its wire form and what only `sessions.toolDetail` gives.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub wire: Map<String, Value>,
    pub input: Option<String>,
    pub result: Option<String>,
}

impl Item {
    fn kind(&self) -> &str {
        self.wire.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    /// seed 004: "A turn_end, system, compact, or shell entry ends a turn."
    pub fn ends_turn(&self) -> bool {
        matches!(self.kind(), "turn_end" | "system" | "compact" | "shell")
    }
}

/// seed 004's Task.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub id: String,
    pub subject: String,
    pub description: Option<String>,
    pub active_form: Option<String>,
    pub status: String,
    pub blocks: Vec<String>,
    pub blocked_by: Vec<String>,
}

impl Task {
    pub fn wire(&self) -> Value {
        let mut v = json!({"id": self.id, "subject": self.subject, "status": self.status});
        if let Some(d) = &self.description {
            v["description"] = json!(d);
        }
        if let Some(a) = &self.active_form {
            v["active_form"] = json!(a);
        }
        if !self.blocks.is_empty() {
            v["blocks"] = json!(self.blocks);
        }
        if !self.blocked_by.is_empty() {
            v["blocked_by"] = json!(self.blocked_by);
        }
        v
    }
}

/// The running turn's accounting, for its `turn_end`.
#[derive(Debug, Default, Clone, PartialEq)]
struct Turn {
    open: bool,
    start_ms: Option<i64>,
    model: Option<String>,
    /// Output tokens per API message id.
    output: Vec<(String, u64)>,
    last_usage: Option<Value>,
    thinking: u64,
    tools: u64,
}

/// One transcript file, parsed as far as it was read.
#[derive(Clone, Debug, PartialEq)]
pub struct File {
    pub path: PathBuf,
    offset: u64,
    carry: Vec<u8>,
    /// Inside a record longer than `TRANSCRIPT_LINE_MAX`: skipped to its end.
    skipping: bool,
    lines: u64,
    pub entries: Vec<Item>,
    tools: HashMap<String, usize>,
    pub queue: Vec<String>,
    pub tasks: Vec<Task>,
    next_task: u64,
    turn: Turn,
    /// The first entry changed since [`File::settle`].
    pub changed_from: Option<usize>,
    pub queue_changed: bool,
    /// Tasks count when last settled: `tasks.changed` when it went up.
    settled_tasks: usize,
    /// A subagent's own file, whose records are all its side chain; the
    /// main file's side-chain records (older Claude Code wrote its
    /// subagents' there) are no entries of the session.
    subagent: bool,
}

impl File {
    pub fn new(path: PathBuf) -> File {
        File {
            path,
            offset: 0,
            carry: Vec::new(),
            skipping: false,
            lines: 0,
            entries: Vec::new(),
            tools: HashMap::new(),
            queue: Vec::new(),
            tasks: Vec::new(),
            next_task: 1,
            turn: Turn::default(),
            changed_from: None,
            queue_changed: false,
            settled_tasks: 0,
            subagent: false,
        }
    }

    /// A subagent's transcript file (module comment).
    pub fn subagent(path: PathBuf) -> File {
        File {
            subagent: true,
            ..File::new(path)
        }
    }

    /// Reads what was appended since the last read, at most
    /// `TRANSCRIPT_READ_PER_JOB` bytes. A file now shorter than what was
    /// read was rewritten: it is parsed again from its start.
    pub fn read_on(&mut self) -> std::io::Result<()> {
        let mut f = std::fs::File::open(&self.path)?;
        let len = f.metadata()?.len();
        if len < self.offset {
            let (settled, subagent) = (self.settled_tasks, self.subagent);
            *self = File::new(self.path.clone());
            self.settled_tasks = settled;
            self.subagent = subagent;
            self.changed_from = Some(0);
            self.queue_changed = true;
        }
        if len == self.offset {
            return Ok(());
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut raw = Vec::new();
        f.take(limits::TRANSCRIPT_READ_PER_JOB as u64)
            .read_to_end(&mut raw)?;
        self.offset += raw.len() as u64;
        self.feed(&raw);
        Ok(())
    }

    /// Parses the complete lines of `raw` (after what was carried over).
    pub fn feed(&mut self, raw: &[u8]) {
        let mut rest = raw;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let (line, tail) = rest.split_at(nl);
            rest = &tail[1..];
            if std::mem::take(&mut self.skipping) {
                self.carry.clear();
                continue;
            }
            let whole = if self.carry.is_empty() {
                line.to_vec()
            } else {
                let mut c = std::mem::take(&mut self.carry);
                c.extend_from_slice(line);
                c
            };
            self.lines += 1;
            if let Ok(v) = serde_json::from_slice::<Value>(&whole) {
                self.record(&v);
            }
        }
        if !self.skipping {
            self.carry.extend_from_slice(rest);
            if self.carry.len() > limits::TRANSCRIPT_LINE_MAX {
                self.carry = Vec::new();
                self.skipping = true;
            }
        }
    }

    /// Marks what the last deltas told; says whether the task count went
    /// up since the last settle (`tasks.changed`).
    pub fn settle(&mut self) -> bool {
        self.changed_from = None;
        self.queue_changed = false;
        let up = self.tasks.len() > self.settled_tasks;
        self.settled_tasks = self.tasks.len();
        up
    }

    /// The entry list from `from` on, in wire form.
    pub fn wire_from(&self, from: usize) -> Vec<Value> {
        self.entries
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|i| Value::Object(i.wire.clone()))
            .collect()
    }

    /// seed 004: where a first `transcript.subscribe` result starts for a
    /// client holding `have` entries.
    pub fn subscribe_start(&self, have: usize) -> usize {
        let have = have.min(self.entries.len());
        if have == 0 {
            return 0;
        }
        if self.entries[have - 1].ends_turn() {
            return have - 1;
        }
        self.entries[..have - 1]
            .iter()
            .rposition(Item::ends_turn)
            .map(|p| p + 1)
            .unwrap_or(0)
    }

    /// `sessions.toolDetail` of call `tool_id`.
    pub fn tool_detail(&self, tool_id: &str) -> Option<Value> {
        let item = &self.entries[*self.tools.get(tool_id)?];
        let mut m = Map::new();
        if let Some(i) = &item.input {
            m.insert("toolInput".into(), json!(i));
        }
        if let Some(r) = &item.result {
            m.insert("result".into(), json!(r));
        }
        if let Some(e) = item.wire.get("resultIsError") {
            m.insert("resultIsError".into(), e.clone());
        }
        Some(Value::Object(m))
    }

    pub fn queue_wire(&self) -> Value {
        Value::Array(self.queue.iter().map(|t| json!({"text": t})).collect())
    }

    fn changed(&mut self, idx: usize) {
        self.changed_from = Some(self.changed_from.map_or(idx, |c| c.min(idx)));
    }

    fn push(&mut self, id: String, kind: &str, ts: Option<&str>, fields: Map<String, Value>) {
        self.push_item(id, kind, ts, fields, None);
    }

    fn push_item(
        &mut self,
        id: String,
        kind: &str,
        ts: Option<&str>,
        fields: Map<String, Value>,
        input: Option<String>,
    ) -> Option<usize> {
        if self.entries.len() >= limits::TRANSCRIPT_FILE_ENTRIES_MAX {
            return None;
        }
        let mut wire = Map::new();
        wire.insert("id".into(), json!(id));
        wire.insert("kind".into(), json!(kind));
        if let Some(t) = ts {
            wire.insert("timestamp".into(), json!(t));
        }
        wire.extend(fields);
        let idx = self.entries.len();
        self.entries.push(Item {
            wire,
            input,
            result: None,
        });
        self.changed(idx);
        Some(idx)
    }

    fn record(&mut self, v: &Value) {
        if !self.subagent && v.get("isSidechain").and_then(Value::as_bool) == Some(true) {
            return;
        }
        let base = v
            .get("uuid")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("l{}", self.lines));
        let ts = v.get("timestamp").and_then(Value::as_str);
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "user" => self.user(v, &base, ts),
            "assistant" => self.assistant(v, &base, ts),
            "system" => self.system(v, &base, ts),
            "queue-operation" => self.queue_op(v),
            _ => {}
        }
    }

    fn user(&mut self, v: &Value, base: &str, ts: Option<&str>) {
        if v.get("isMeta").and_then(Value::as_bool) == Some(true) {
            return;
        }
        let content = &v["message"]["content"];
        if v.get("isCompactSummary").and_then(Value::as_bool) == Some(true) {
            let mut f = Map::new();
            f.insert("summary".into(), json!(text_of(content)));
            self.push(format!("{base}.0"), "compact", ts, f);
            self.turn = Turn::default();
            return;
        }
        let blocks: Vec<Value> = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(a) => a.clone(),
            _ => return,
        };
        let mut prompt = String::new();
        for b in &blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => prompt.push_str(b["text"].as_str().unwrap_or("")),
                Some("tool_result") => self.tool_result(b),
                _ => {}
            }
        }
        if prompt.is_empty() {
            return;
        }
        if prompt.starts_with("[Request interrupted by user") {
            self.end_turn(base, ts, "interrupted", true);
            return;
        }
        if self.turn.open {
            // A prompt taken while a turn ran (Claude Code's queue) joins
            // it: the turn ends once, after its last answer.
        } else {
            self.turn = Turn {
                open: true,
                start_ms: ts.and_then(crate::clock::parse_ts),
                ..Turn::default()
            };
        }
        let mut f = Map::new();
        f.insert("text".into(), json!(prompt));
        self.push(format!("{base}.0"), "user", ts, f);
    }

    fn tool_result(&mut self, b: &Value) {
        let Some(id) = b.get("tool_use_id").and_then(Value::as_str) else {
            return;
        };
        let Some(&idx) = self.tools.get(id) else {
            return;
        };
        let err = b.get("is_error").and_then(Value::as_bool) == Some(true);
        let result = cut(text_of(&b["content"]));
        let item = &mut self.entries[idx];
        item.wire.insert("resultIsError".into(), json!(err));
        item.result = Some(result);
        self.changed(idx);
    }

    fn assistant(&mut self, v: &Value, base: &str, ts: Option<&str>) {
        let m = &v["message"];
        if !self.turn.open {
            // An answer without a prompt seen (the file was cut, or the
            // agent started it): a turn all the same.
            self.turn = Turn {
                open: true,
                start_ms: ts.and_then(crate::clock::parse_ts),
                ..Turn::default()
            };
        }
        if let Some(model) = m.get("model").and_then(Value::as_str) {
            if model != "<synthetic>" {
                self.turn.model = Some(model.to_string());
            }
        }
        if let Some(u) = m.get("usage").filter(|u| u.is_object()) {
            let msg = m.get("id").and_then(Value::as_str).unwrap_or(base);
            let out = u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
            match self.turn.output.iter_mut().find(|(id, _)| id == msg) {
                Some(slot) => slot.1 = slot.1.max(out),
                None => self.turn.output.push((msg.to_string(), out)),
            }
            self.turn.last_usage = Some(u.clone());
        }
        if let Some(blocks) = m.get("content").and_then(Value::as_array) {
            for (n, b) in blocks.iter().enumerate() {
                let id = format!("{base}.{n}");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let mut f = Map::new();
                        f.insert("text".into(), json!(b["text"].as_str().unwrap_or("")));
                        self.push(id, "text", ts, f);
                    }
                    Some("thinking") => {
                        let mut f = Map::new();
                        f.insert("text".into(), json!(b["thinking"].as_str().unwrap_or("")));
                        let signed = b
                            .get("signature")
                            .and_then(Value::as_str)
                            .is_some_and(|s| !s.is_empty());
                        f.insert("signature".into(), json!(signed));
                        self.turn.thinking += 1;
                        self.push(id, "thinking", ts, f);
                    }
                    Some("tool_use") => self.tool_use(id, ts, b),
                    _ => {}
                }
            }
        }
        match m.get("stop_reason").and_then(Value::as_str) {
            None | Some("tool_use") => {}
            Some(reason) => self.end_turn(base, ts, reason, false),
        }
    }

    fn tool_use(&mut self, id: String, ts: Option<&str>, b: &Value) {
        let name = b.get("name").and_then(Value::as_str).unwrap_or("");
        let tool_id = b
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let input = b.get("input").cloned().unwrap_or(Value::Null);
        let input_text = cut(input.to_string());
        let mut f = Map::new();
        f.insert("toolName".into(), json!(name));
        f.insert("toolId".into(), json!(tool_id));
        f.insert(
            "inputPreview".into(),
            json!(crate::core::transcript::preview(&input_text)),
        );
        self.turn.tools += 1;
        if let Some(idx) = self.push_item(id, "tool", ts, f, Some(input_text)) {
            if !tool_id.is_empty() {
                self.tools.insert(tool_id, idx);
            }
        }
        self.task_tool(name, &input);
    }

    fn task_tool(&mut self, name: &str, input: &Value) {
        let s = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_string);
        let list = |k: &str| -> Vec<String> {
            input
                .get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| match x {
                            Value::String(s) => Some(s.clone()),
                            Value::Number(n) => Some(n.to_string()),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        match name {
            "TaskCreate" => {
                if self.tasks.len() >= limits::TRANSCRIPT_TASKS_MAX {
                    return;
                }
                let id = self.next_task.to_string();
                self.next_task += 1;
                self.tasks.push(Task {
                    id,
                    subject: s("subject").unwrap_or_default(),
                    description: s("description"),
                    active_form: s("activeForm"),
                    status: "pending".into(),
                    blocks: Vec::new(),
                    blocked_by: Vec::new(),
                });
            }
            "TaskUpdate" => {
                let id = match input.get("taskId") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => return,
                };
                let Some(pos) = self.tasks.iter().position(|t| t.id == id) else {
                    return;
                };
                if s("status").as_deref() == Some("deleted") {
                    self.tasks.remove(pos);
                    return;
                }
                let t = &mut self.tasks[pos];
                if let Some(st) = s("status").filter(|x| is_task_status(x)) {
                    t.status = st;
                }
                if let Some(x) = s("subject") {
                    t.subject = x;
                }
                if let Some(x) = s("description") {
                    t.description = Some(x);
                }
                if let Some(x) = s("activeForm") {
                    t.active_form = Some(x);
                }
                t.blocks.extend(list("addBlocks"));
                t.blocked_by.extend(list("addBlockedBy"));
            }
            "TodoWrite" => {
                let Some(todos) = input.get("todos").and_then(Value::as_array) else {
                    return;
                };
                self.tasks = todos
                    .iter()
                    .take(limits::TRANSCRIPT_TASKS_MAX)
                    .enumerate()
                    .map(|(n, t)| Task {
                        id: t
                            .get("id")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                            .unwrap_or_else(|| (n + 1).to_string()),
                        subject: t["content"].as_str().unwrap_or("").to_string(),
                        description: None,
                        active_form: t
                            .get("activeForm")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                        status: t
                            .get("status")
                            .and_then(Value::as_str)
                            .filter(|x| is_task_status(x))
                            .unwrap_or("pending")
                            .to_string(),
                        blocks: Vec::new(),
                        blocked_by: Vec::new(),
                    })
                    .collect();
            }
            _ => {}
        }
    }

    fn system(&mut self, v: &Value, base: &str, ts: Option<&str>) {
        match v.get("subtype").and_then(Value::as_str).unwrap_or("") {
            "turn_duration" => {
                let ms = v.get("durationMs").and_then(Value::as_u64);
                if self.turn.open {
                    self.end_turn(base, ts, "end_turn", false);
                }
                if let Some(ms) = ms {
                    if let Some(idx) = self.entries.iter().rposition(|i| i.kind() == "turn_end") {
                        self.entries[idx]
                            .wire
                            .insert("durationMs".into(), json!(ms));
                        self.changed(idx);
                    }
                }
            }
            "compact_boundary" => {
                self.turn = Turn::default();
                let mut f = Map::new();
                f.insert("label".into(), json!("compacted"));
                self.push(format!("{base}.0"), "compact", ts, f);
            }
            _ => {
                let Some(text) = v.get("content").and_then(Value::as_str) else {
                    return;
                };
                let mut f = Map::new();
                f.insert("text".into(), json!(text));
                if v.get("level").and_then(Value::as_str) == Some("error") {
                    f.insert("isError".into(), json!(true));
                }
                self.push(format!("{base}.0"), "system", ts, f);
            }
        }
    }

    fn queue_op(&mut self, v: &Value) {
        let content = v.get("content").and_then(Value::as_str);
        match v.get("operation").and_then(Value::as_str) {
            Some("enqueue") => {
                if let Some(c) = content {
                    if self.queue.len() < limits::TRANSCRIPT_QUEUE_MAX {
                        self.queue.push(c.to_string());
                    }
                }
            }
            Some("dequeue") => {
                if !self.queue.is_empty() {
                    self.queue.remove(0);
                }
            }
            Some("remove") => {
                let pos = content
                    .and_then(|c| self.queue.iter().position(|q| q == c))
                    .or((!self.queue.is_empty()).then_some(0));
                if let Some(p) = pos {
                    self.queue.remove(p);
                }
            }
            Some("popAll") => self.queue.clear(),
            _ => return,
        }
        self.queue_changed = true;
    }

    fn end_turn(&mut self, base: &str, ts: Option<&str>, reason: &str, interrupted: bool) {
        if !self.turn.open {
            return;
        }
        let t = std::mem::take(&mut self.turn);
        let mut f = Map::new();
        if let Some(m) = t.model {
            f.insert("modelName".into(), json!(m));
        }
        let mut usage = Map::new();
        if let Some(u) = &t.last_usage {
            for (from, to) in [
                ("input_tokens", "input"),
                ("cache_read_input_tokens", "cacheRead"),
                ("cache_creation_input_tokens", "cacheCreation"),
            ] {
                if let Some(n) = u.get(from).and_then(Value::as_u64) {
                    usage.insert(to.into(), json!(n));
                }
            }
            usage.insert(
                "output".into(),
                json!(t.output.iter().map(|(_, n)| n).sum::<u64>()),
            );
        }
        if !usage.is_empty() {
            f.insert("usage".into(), Value::Object(usage));
        }
        f.insert("stopReason".into(), json!(reason));
        if let (Some(a), Some(b)) = (t.start_ms, ts.and_then(crate::clock::parse_ts)) {
            if b >= a {
                f.insert("durationMs".into(), json!(b - a));
            }
        }
        f.insert("thinking".into(), json!(t.thinking));
        f.insert("toolCount".into(), json!(t.tools));
        f.insert("interrupted".into(), json!(interrupted));
        self.push(format!("{base}.end"), "turn_end", ts, f);
    }
}

fn is_task_status(s: &str) -> bool {
    matches!(s, "pending" | "in_progress" | "completed")
}

/// The text of a message content: a string, or its text blocks joined.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// `s` cut to `TRANSCRIPT_TOOL_DETAIL_MAX` bytes at a character boundary.
fn cut(mut s: String) -> String {
    if s.len() > limits::TRANSCRIPT_TOOL_DETAIL_MAX {
        let mut at = limits::TRANSCRIPT_TOOL_DETAIL_MAX;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// What a worker brings back from following a session's transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct Followed {
    pub file: Box<File>,
    /// The session moved to a newer transcript file (seed 004: `/clear`,
    /// `/resume`): `file` is the new one, read from its start.
    pub switched: bool,
    /// The file does not exist (for a subagent: no such subagent).
    pub missing: bool,
    pub error: Option<String>,
}

/// Reads on `file` (a fresh one for `path` when `None`), first following
/// the session to the newest transcript of its project directory; a
/// subagent's file (`subagent`) is not followed anywhere.
pub fn follow(
    home: &Path,
    cwd: &str,
    path: PathBuf,
    file: Option<Box<File>>,
    subagent: bool,
) -> Followed {
    let mut switched = false;
    let mut file = match (file, subagent) {
        (Some(f), true) => f,
        (None, true) => Box::new(File::subagent(path)),
        (f, false) => {
            let newest = super::discover::newest_transcript(home, cwd);
            match f {
                Some(f) => match newest {
                    Some(n) if n != f.path => {
                        switched = true;
                        Box::new(File::new(n))
                    }
                    _ => f,
                },
                None => Box::new(File::new(newest.unwrap_or(path))),
            }
        }
    };
    let (mut missing, mut error) = (false, None);
    if let Err(e) = file.read_on() {
        missing = e.kind() == std::io::ErrorKind::NotFound;
        error = Some(format!("cannot read {}: {}", file.path.display(), e));
    }
    Followed {
        file,
        switched,
        missing,
        error,
    }
}

/// Where Claude Code keeps subagent `agent_id`'s transcript for the
/// session whose transcript is `main`: `<dir>/<session id>/subagents/
/// agent-<agent_id>.jsonl`.
pub fn subagent_path(main: &Path, agent_id: &str) -> Option<PathBuf> {
    let stem = main.file_stem()?;
    Some(
        main.parent()?
            .join(stem)
            .join("subagents")
            .join(format!("agent-{agent_id}.jsonl")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(f: &mut File, recs: &[Value]) {
        let mut raw = Vec::new();
        for r in recs {
            raw.extend(r.to_string().bytes());
            raw.push(b'\n');
        }
        f.feed(&raw);
    }

    fn kinds(f: &File) -> Vec<String> {
        f.entries.iter().map(|i| i.kind().to_string()).collect()
    }

    #[test]
    fn a_turn_with_a_tool_call_ends_once_with_its_figures() {
        let mut f = File::new("/x.jsonl".into());
        lines(
            &mut f,
            &[
                json!({"type":"user","uuid":"u1","timestamp":"2026-01-01T00:00:00.000Z","message":{"role":"user","content":"list files"}}),
                json!({"type":"assistant","uuid":"a1","timestamp":"2026-01-01T00:00:01.000Z","message":{"id":"m1","model":"claude-sonnet-4-5","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}],"stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5}}}),
                json!({"type":"user","uuid":"u2","timestamp":"2026-01-01T00:00:02.000Z","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a\nb","is_error":false}]}}),
                json!({"type":"assistant","uuid":"a2","timestamp":"2026-01-01T00:00:03.500Z","message":{"id":"m2","model":"claude-sonnet-4-5","content":[{"type":"text","text":"two files"}],"stop_reason":"end_turn","usage":{"input_tokens":20,"output_tokens":7,"cache_read_input_tokens":3}}}),
            ],
        );
        assert_eq!(kinds(&f), ["user", "tool", "text", "turn_end"]);
        let end = &f.entries[3].wire;
        assert_eq!(end["id"], "a2.end");
        assert_eq!(
            end["usage"],
            json!({"input": 20, "output": 12, "cacheRead": 3})
        );
        assert_eq!(end["durationMs"], 3500);
        assert_eq!(end["toolCount"], 1);
        assert_eq!(end["modelName"], "claude-sonnet-4-5");
        assert_eq!(f.entries[1].wire["resultIsError"], false);
        assert_eq!(
            f.tool_detail("t1"),
            Some(
                json!({"toolInput": r#"{"command":"ls"}"#, "result": "a\nb", "resultIsError": false})
            )
        );
        assert!(!f.entries[1].wire.contains_key("toolInput"));
        // The turn rule: a client holding all four starts at the turn_end;
        // one holding two starts at the turn's first entry.
        assert_eq!(f.subscribe_start(4), 3);
        assert_eq!(f.subscribe_start(2), 0);
    }

    #[test]
    fn lines_split_across_reads_and_an_interrupt_end_a_turn() {
        let mut f = File::new("/x.jsonl".into());
        let raw = format!(
            "{}\n{}\n",
            json!({"type":"user","uuid":"u1","message":{"content":"go"}}),
            json!({"type":"user","uuid":"u2","message":{"content":[{"type":"text","text":"[Request interrupted by user]"}]}})
        );
        let (a, b) = raw.as_bytes().split_at(17);
        f.feed(a);
        assert!(f.entries.is_empty());
        f.feed(b);
        assert_eq!(kinds(&f), ["user", "turn_end"]);
        assert_eq!(f.entries[1].wire["interrupted"], true);
        assert_eq!(f.changed_from, Some(0));
        assert!(!f.settle());
    }

    #[test]
    fn side_chain_records_belong_to_subagents_only() {
        let side =
            json!({"type":"user","isSidechain":true,"uuid":"s","message":{"content":"sub task"}});
        let mut main = File::new("/x.jsonl".into());
        lines(&mut main, std::slice::from_ref(&side));
        assert!(main.entries.is_empty());
        let mut sub = File::subagent("/x/subagents/agent-a.jsonl".into());
        lines(&mut sub, &[side]);
        assert_eq!(kinds(&sub), ["user"]);
    }

    #[test]
    fn the_queue_and_tasks_follow_their_records() {
        let mut f = File::new("/x.jsonl".into());
        lines(
            &mut f,
            &[
                json!({"type":"queue-operation","operation":"enqueue","content":"next"}),
                json!({"type":"queue-operation","operation":"enqueue","content":"later"}),
                json!({"type":"queue-operation","operation":"dequeue"}),
                json!({"type":"assistant","uuid":"a","message":{"id":"m","content":[
                    {"type":"tool_use","id":"t1","name":"TaskCreate","input":{"subject":"one","activeForm":"doing one"}},
                    {"type":"tool_use","id":"t2","name":"TaskCreate","input":{"subject":"two"}},
                    {"type":"tool_use","id":"t3","name":"TaskUpdate","input":{"taskId":"1","status":"in_progress","addBlocks":["2"]}}
                ]}}),
            ],
        );
        assert_eq!(f.queue, ["later"]);
        assert!(f.queue_changed);
        assert_eq!(f.tasks.len(), 2);
        assert_eq!(
            f.tasks[0].wire(),
            json!({"id":"1","subject":"one","status":"in_progress","active_form":"doing one","blocks":["2"]})
        );
        assert!(f.settle(), "the count went up");
        assert!(!f.settle());
    }
}
