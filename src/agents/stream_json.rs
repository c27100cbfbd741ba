//! Claude Code's stream-json mode, as an I/O-free core: the CLI run with
//! `-p --input-format stream-json --output-format stream-json --verbose
//! --permission-prompt-tool stdio` (see `BASE_ARGS`), one JSON object a
//! line each way, as recorded from Claude Code 2.1.328 in
//! `tests/fixtures/recordings/cc-*`.
//!
//! What the core owns:
//! - prompts in as `{"type":"user","message":{"role":"user","content":..},
//!   "parent_tool_use_id":null}`, exactly one in flight. A prompt given while
//!   a turn runs waits in the core's queue (`limits::AGENT_PROMPT_QUEUE`) and
//!   is written when the turn's `result` arrives; its turn.start mode is
//!   `prompt`, since the CLI never saw it queued. The CLI has a queue of its
//!   own, but Claude Code 2.1.328 merges every user line written during a
//!   turn into one next turn with one `result` (cc-queue-merge: three
//!   prompts, two results), while an older or other build may answer each
//!   separately (cc-queue); counting results against prompts written cannot
//!   tell the two apart, and guessing wrong files later output under the
//!   wrong turn for ever. Holding the queue here makes both behave alike.
//!   Queued prompts outlive an interrupt (the CLI itself runs its queued
//!   lines after one, cc-queue-interrupt): interrupt stops a turn, not the
//!   session's plan, as for ACP;
//! - the session id from the `system` `init` line (repeated at every turn;
//!   reported once) and `resume_args` for reopening it after a restart;
//! - transcript from the complete `assistant` and `user` lines. `stream_event`
//!   lines are previews of the same text and are not recorded twice; user
//!   lines marked `isReplay` repeat a prompt we already recorded;
//! - `control_request` `can_use_tool` -> a permission request, answered with
//!   a `control_response`: allow echoes the original input as
//!   `updatedInput`; deny carries a message. Other control requests of the
//!   CLI get an error answer: we serve none of them;
//! - questions and plans (cc-question, cc-plan): a `can_use_tool` of
//!   `AskUserQuestion` is a `question` interaction, its `questions[]` read
//!   from the input; its allow adds `answers` to the echoed input, an object
//!   from question text to the chosen label (a multi-select's labels joined
//!   with `, `, as the CLI itself joins them in the tool result). A
//!   `can_use_tool` of `ExitPlanMode` is a `plan` interaction: the CLI sends
//!   it with `input: {}`, so the plan is the `plan` of the `assistant`
//!   line's tool_use with the same `tool_use_id` (remembered for the
//!   running turn, at most `AGENT_PENDING_REQUESTS`), empty without one.
//!   An allow that switches the permission mode writes, right after its
//!   `control_response`, a `control_request` `set_permission_mode` with our
//!   own id (`mode-N`); a refusal of it becomes a transcript line;
//! - interrupt: a `control_request` `interrupt` with our own id (`int-N`);
//!   its `control_response` is checked. Open permissions are answered deny.
//!   The CLI acknowledges but ignores an interrupt that arrives after a
//!   prompt line and before it has begun that turn (seen with 2.1.328: the
//!   turn then runs to its end), so an interrupt asked for before the turn's
//!   `system` `init` line is held and written when that line arrives; a
//!   turn that ends without one ends `interrupted` all the same.
//!
//! Turn end reasons, from the `result` line:
//!
//! | result                                                          | reason        |
//! | --------------------------------------------------------------- | ------------- |
//! | any, after we sent interrupt                                    | interrupted   |
//! | `is_error` and (`api_error_status` 429, or the turn's assistant line had `error: "rate_limit"`) | usage-limited |
//! | `is_error`, or `subtype` other than `success`                   | failed        |
//! | `subtype` `success`                                             | completed     |
//! | the CLI exits mid-turn                                          | failed        |
//!
//! While the CLI retries a failed API call it prints a `system` `api_retry`
//! line per try (cc-ratelimit; three minutes of them at its defaults): each
//! becomes `AgentEvent::Retrying(Some(..))` (and a transcript line), and the
//! next line that is output again (assistant, user, stream_event, result,
//! control_request) or the CLI's exit ends it with `Retrying(None)`.
//!
//! Claude Code reports a 429 as `subtype: success` with `is_error: true`
//! (cc-ratelimit), which is why `is_error` is read before `subtype`.
//! Tokens come from the `result` (the turn's total; assistant lines carry
//! partial counts while streaming), the model from the turn's assistant
//! lines (`<synthetic>` is the CLI's own error message, not a model).
//!
//! A line that is not a JSON object with a string `type`, a
//! `control_response` to a request we never sent, or a `result` with no
//! turn running is a `Violation`; unknown line types are ignored.

use std::collections::{HashMap, VecDeque};

use serde_json::{Map, Value, json};

use super::{
    ActionKind, AgentEvent, Capabilities, CommandError, Decision, EndReason, Entry, Interaction,
    PermissionMode, PermissionRequest, Question, Retry, SignInState, Step, ToolEntry, ToolStatus,
    Usage, Violation, parse_line, prompt_chars,
};
use crate::limits::{AGENT_PENDING_REQUESTS, AGENT_PROMPT_QUEUE};

/// The arguments that put the CLI in the mode this core speaks; the seat's
/// own arguments (model, settings) come before them.
pub const BASE_ARGS: [&str; 8] = [
    "-p",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
    "--permission-prompt-tool",
    "stdio",
];

/// Extra arguments that reopen a stored session after a daemon restart.
pub fn resume_args(agent_session_id: &str) -> Vec<String> {
    vec!["--resume".to_string(), agent_session_id.to_string()]
}

/// What the CLI can do, as far as the daemon uses it: `--resume` reopens a
/// session; there is no replay-style load.
const CAPABILITIES: Capabilities = Capabilities {
    load_session: false,
    resume_session: true,
};

/// A can_use_tool request waiting for the operator.
#[derive(Debug)]
struct OpenRequest {
    /// The tool's input, echoed as `updatedInput` by an allow.
    input: Value,
    /// An `AskUserQuestion`: an allow adds the answers to the input.
    question: bool,
}

/// The stream-json core of one session.
#[derive(Debug, Default)]
pub struct StreamJsonClient {
    started: bool,
    closed: bool,
    session_id: Option<String>,
    turn_active: bool,
    /// The running turn's `system` `init` line has arrived: the CLI is in
    /// the turn and heeds an interrupt.
    turn_begun: bool,
    interrupting: bool,
    /// An interrupt asked for before `turn_begun`, to write when it is.
    interrupt_held: bool,
    next_control: u64,
    /// Our control requests awaiting the CLI's control_response.
    controls: Vec<String>,
    /// Prompts given while a turn runs, not yet written.
    queued: VecDeque<String>,
    /// Open can_use_tool requests by request_id.
    permissions: HashMap<String, OpenRequest>,
    /// The running turn's `ExitPlanMode` tool_uses: tool_use_id -> plan
    /// (module comment).
    plans: HashMap<String, String>,
    model: Option<String>,
    rate_limited: bool,
    /// An `api_retry` line came and no output since.
    retrying: bool,
    /// The sign-in state this session last reported: each change is
    /// reported once (an auth failure signs out, a completed turn signs in).
    sign_in_reported: Option<SignInState>,
}

impl StreamJsonClient {
    pub fn new() -> StreamJsonClient {
        StreamJsonClient::default()
    }

    pub fn agent_session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    pub fn turn_active(&self) -> bool {
        self.turn_active
    }

    /// Prompts waiting in the core's queue for the running turn to end.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// The CLI says nothing until it has a prompt (its init line comes with
    /// the first turn), so starting is only the first prompt, if any.
    pub fn start(&mut self, prompt: Option<String>) -> Result<Step, CommandError> {
        if self.closed {
            return Err(CommandError::Closed);
        }
        if self.started {
            return Err(CommandError::AlreadyStarted);
        }
        self.started = true;
        match prompt {
            Some(p) => self.prompt(p),
            None => Ok(Step::default()),
        }
    }

    /// Writes a prompt now when no turn runs, else queues it until the
    /// running turn's `result` (see the module comment).
    pub fn prompt(&mut self, text: String) -> Result<Step, CommandError> {
        if self.closed {
            return Err(CommandError::Closed);
        }
        self.started = true;
        let mut step = Step::default();
        if self.turn_active {
            if self.queued.len() >= AGENT_PROMPT_QUEUE {
                return Err(CommandError::QueueFull);
            }
            self.queued.push_back(text);
        } else {
            self.send_prompt(&mut step, text);
        }
        Ok(step)
    }

    fn send_prompt(&mut self, step: &mut Step, text: String) {
        step.write(&json!({
            "type": "user",
            "message": {"role": "user", "content": text},
            "parent_tool_use_id": null
        }));
        self.begin_turn(step, text);
    }

    /// Asks the CLI to stop the running turn (nothing when none runs).
    pub fn interrupt(&mut self) -> Step {
        let mut step = Step::default();
        if !self.turn_active || self.interrupting || self.closed {
            return step;
        }
        self.interrupting = true;
        if self.turn_begun {
            self.write_interrupt(&mut step);
        } else {
            self.interrupt_held = true;
        }
        let mut keys: Vec<String> = self.permissions.keys().cloned().collect();
        keys.sort();
        for key in keys {
            self.permissions.remove(&key);
            write_deny(&mut step, &key, "The operator interrupted the turn.");
            step.event(AgentEvent::PermissionClosed {
                agent_request_key: key,
                delivered: true,
            });
        }
        step
    }

    fn write_interrupt(&mut self, step: &mut Step) {
        self.interrupt_held = false;
        self.next_control += 1;
        let id = format!("int-{}", self.next_control);
        step.write(&json!({"type": "control_request", "request_id": id, "request": {"subtype": "interrupt"}}));
        self.controls.push(id);
    }

    /// Answers a can_use_tool request.
    pub fn answer_permission(
        &mut self,
        key: &str,
        decision: Decision,
    ) -> Result<Step, CommandError> {
        let Some(open) = self.permissions.remove(key) else {
            return Err(CommandError::UnknownRequest);
        };
        let mut step = Step::default();
        match decision {
            Decision::Allow => write_allow(&mut step, key, open.input),
            Decision::AllowWith(grant) => {
                let mut input = open.input;
                if open.question {
                    let answers: Map<String, Value> = grant
                        .answers
                        .into_iter()
                        .map(|(q, labels)| (q, Value::String(labels.join(", "))))
                        .collect();
                    if let Some(o) = input.as_object_mut() {
                        o.insert("answers".into(), Value::Object(answers));
                    }
                }
                write_allow(&mut step, key, input);
                if let Some(mode) = grant.set_mode {
                    self.set_mode(&mut step, mode);
                }
            }
            Decision::Deny { message } => write_deny(
                &mut step,
                key,
                message.as_deref().unwrap_or("The operator denied this."),
            ),
            Decision::Cancel => write_deny(
                &mut step,
                key,
                "The request was withdrawn without an answer.",
            ),
        }
        Ok(step)
    }

    /// Switches the CLI's permission mode (cc-plan). Our control requests
    /// are bounded like the CLI's: past `AGENT_PENDING_REQUESTS` unanswered
    /// ones the switch is not asked for, and the transcript says so.
    fn set_mode(&mut self, step: &mut Step, mode: PermissionMode) {
        if self.controls.len() >= AGENT_PENDING_REQUESTS {
            step.event(AgentEvent::Transcript(Entry::System {
                text: format!(
                    "permission mode not changed to {}: the agent answers no control requests",
                    mode.wire_name()
                ),
            }));
            return;
        }
        self.next_control += 1;
        let id = format!("mode-{}", self.next_control);
        step.write(&json!({
            "type": "control_request",
            "request_id": id,
            "request": {"subtype": "set_permission_mode", "mode": mode.wire_name()}
        }));
        self.controls.push(id);
    }

    /// The CLI is gone: a running turn ends (`interrupted` if we had asked
    /// for it, else `failed`), open requests and queued prompts vanish.
    pub fn on_exit(&mut self, code: Option<i32>) -> Step {
        let mut step = Step::default();
        if self.closed {
            return step;
        }
        if self.retrying {
            self.retrying = false;
            step.event(AgentEvent::Retrying(None));
        }
        if self.turn_active {
            let detail = match code {
                Some(c) => format!("the agent exited with status {c}"),
                None => "the agent was killed by a signal".to_string(),
            };
            let reason = if self.interrupting {
                EndReason::Interrupted
            } else {
                EndReason::Failed
            };
            self.end_turn(&mut step, reason, Some(detail));
        }
        self.closed = true;
        self.queued.clear();
        step
    }

    /// Feeds one complete line the CLI wrote on stdout.
    pub fn on_line(&mut self, line: &[u8]) -> Result<Step, Violation> {
        if self.closed {
            return Err(Violation {
                reason: "a line after the transport closed".into(),
                turn_was_active: false,
            });
        }
        let msg = parse_line(line).map_err(|r| self.violate(r))?;
        let Some(kind) = msg.get("type").and_then(Value::as_str) else {
            return Err(self.violate("a line without a string type".into()));
        };
        let mut step = Step::default();
        if self.retrying
            && matches!(
                kind,
                "assistant" | "user" | "stream_event" | "result" | "control_request"
            )
        {
            self.retrying = false;
            step.event(AgentEvent::Retrying(None));
        }
        match kind {
            "system" => self.on_system(&mut step, &msg),
            "assistant" => self.on_assistant(&mut step, &msg),
            "user" => on_user(&mut step, &msg),
            "result" => self.on_result(&mut step, &msg)?,
            "control_request" => self.on_control_request(&mut step, &msg)?,
            "control_response" => self.on_control_response(&mut step, &msg)?,
            "control_cancel_request" => {
                let id = msg
                    .get("request_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if self.permissions.remove(id).is_some() {
                    step.event(AgentEvent::PermissionClosed {
                        agent_request_key: id.to_string(),
                        delivered: false,
                    });
                }
            }
            _ => {}
        }
        Ok(step)
    }

    fn violate(&mut self, reason: String) -> Violation {
        let turn_was_active = self.turn_active;
        self.closed = true;
        self.turn_active = false;
        self.queued.clear();
        self.permissions.clear();
        Violation {
            reason,
            turn_was_active,
        }
    }

    fn begin_turn(&mut self, step: &mut Step, text: String) {
        self.turn_active = true;
        self.turn_begun = false;
        self.interrupting = false;
        self.interrupt_held = false;
        self.rate_limited = false;
        step.event(AgentEvent::TurnStarted {
            chars: prompt_chars(&text),
        });
        step.event(AgentEvent::Transcript(Entry::User { text }));
    }

    fn end_turn(&mut self, step: &mut Step, reason: EndReason, detail: Option<String>) {
        self.turn_active = false;
        self.plans.clear();
        self.interrupting = false;
        self.interrupt_held = false;
        let mut keys: Vec<String> = self.permissions.keys().cloned().collect();
        keys.sort();
        for key in keys {
            self.permissions.remove(&key);
            step.event(AgentEvent::PermissionClosed {
                agent_request_key: key,
                delivered: false,
            });
        }
        step.event(AgentEvent::Transcript(Entry::TurnEnd { reason }));
        step.event(AgentEvent::TurnEnded { reason, detail });
    }

    fn on_system(&mut self, step: &mut Step, msg: &Map<String, Value>) {
        match msg.get("subtype").and_then(Value::as_str) {
            Some("init") => {
                if self.turn_active && !self.turn_begun {
                    self.turn_begun = true;
                    if self.interrupt_held {
                        self.write_interrupt(step);
                    }
                }
                if let Some(m) = msg.get("model").and_then(Value::as_str) {
                    self.model = Some(m.to_string());
                }
                let Some(sid) = msg.get("session_id").and_then(Value::as_str) else {
                    return;
                };
                if self.session_id.as_deref() != Some(sid) {
                    self.session_id = Some(sid.to_string());
                    step.event(AgentEvent::Ready {
                        agent_session_id: sid.to_string(),
                        capabilities: CAPABILITIES,
                    });
                }
            }
            Some("api_retry") => {
                let u = |k: &str| msg.get(k).and_then(Value::as_u64);
                self.retrying = true;
                step.event(AgentEvent::Retrying(Some(Retry {
                    attempt: u("attempt").unwrap_or(0),
                    max_retries: u("max_retries").unwrap_or(0),
                    error_status: u("error_status"),
                    error: msg.get("error").and_then(Value::as_str).map(String::from),
                    retry_delay_ms: u("retry_delay_ms"),
                })));
                let n = |k: &str| msg.get(k).map(Value::to_string).unwrap_or_default();
                step.event(AgentEvent::Transcript(Entry::System {
                    text: format!(
                        "API retry {} of {} after status {} ({})",
                        n("attempt"),
                        n("max_retries"),
                        n("error_status"),
                        msg.get("error").and_then(Value::as_str).unwrap_or("error")
                    ),
                }));
            }
            _ => {}
        }
    }

    fn on_assistant(&mut self, step: &mut Step, msg: &Map<String, Value>) {
        match msg.get("error").and_then(Value::as_str) {
            Some("rate_limit") => self.rate_limited = true,
            Some("authentication_failed") => self.report_sign_in(step, SignInState::SignedOut),
            _ => {}
        }
        let Some(message) = msg.get("message") else {
            return;
        };
        if let Some(m) = message
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| *m != "<synthetic>")
        {
            self.model = Some(m.to_string());
        }
        let blocks = message
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for b in blocks {
            let s = |k: &str| b.get(k).and_then(Value::as_str).map(String::from);
            if let (Some("tool_use"), Some("ExitPlanMode"), Some(id), Some(plan)) = (
                b.get("type").and_then(Value::as_str),
                b.get("name").and_then(Value::as_str),
                s("id"),
                b.get("input")
                    .and_then(|i| i.get("plan"))
                    .and_then(Value::as_str),
            ) && self.plans.len() < AGENT_PENDING_REQUESTS
            {
                self.plans.insert(id, plan.to_string());
            }
            let entry = match b.get("type").and_then(Value::as_str) {
                Some("text") => s("text").map(|text| Entry::Text { text }),
                Some("thinking") => s("thinking").map(|text| Entry::Thinking { text }),
                Some("tool_use") => s("id").map(|id| {
                    let name = s("name");
                    Entry::Tool(ToolEntry {
                        id,
                        kind: Some(name.as_deref().map_or(ActionKind::Other, action_of_tool)),
                        title: name,
                        input: b.get("input").cloned(),
                        status: Some(ToolStatus::Pending),
                        result: None,
                    })
                }),
                _ => None,
            };
            if let Some(e) = entry {
                step.event(AgentEvent::Transcript(e));
            }
        }
    }

    fn report_sign_in(&mut self, step: &mut Step, state: SignInState) {
        if self.sign_in_reported != Some(state) {
            self.sign_in_reported = Some(state);
            step.event(AgentEvent::SignIn(state));
        }
    }

    fn on_result(&mut self, step: &mut Step, msg: &Map<String, Value>) -> Result<(), Violation> {
        if !self.turn_active {
            return Err(self.violate("a result with no turn running".into()));
        }
        if let Some(u) = msg.get("usage") {
            let tokens = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            step.event(AgentEvent::Usage(Usage {
                model: self.model.clone(),
                input_tokens: tokens("input_tokens"),
                output_tokens: tokens("output_tokens"),
            }));
        }
        let is_error = msg
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let subtype = msg.get("subtype").and_then(Value::as_str).unwrap_or("");
        let status_429 = msg.get("api_error_status").and_then(Value::as_u64) == Some(429);
        let detail = msg
            .get("result")
            .and_then(Value::as_str)
            .map(String::from)
            .or_else(|| (!subtype.is_empty() && subtype != "success").then(|| subtype.to_string()));
        let (reason, detail) = if self.interrupting {
            (EndReason::Interrupted, None)
        } else if is_error && (status_429 || self.rate_limited) {
            (EndReason::UsageLimited, detail)
        } else if is_error || subtype != "success" {
            (EndReason::Failed, detail)
        } else {
            // The provider answered a whole turn: whatever failed before,
            // the agent is signed in now.
            self.report_sign_in(step, SignInState::SignedIn);
            (EndReason::Completed, None)
        };
        self.end_turn(step, reason, detail);
        if let Some(next) = self.queued.pop_front() {
            self.send_prompt(step, next);
        }
        Ok(())
    }

    fn on_control_request(
        &mut self,
        step: &mut Step,
        msg: &Map<String, Value>,
    ) -> Result<(), Violation> {
        let Some(id) = msg
            .get("request_id")
            .and_then(Value::as_str)
            .map(String::from)
        else {
            return Err(self.violate("a control_request without a request_id".into()));
        };
        let request = msg.get("request").cloned().unwrap_or(Value::Null);
        let subtype = request.get("subtype").and_then(Value::as_str).unwrap_or("");
        if subtype != "can_use_tool" {
            step.write(&json!({
                "type": "control_response",
                "response": {"subtype": "error", "request_id": id, "error": format!("unsupported control request: {subtype}")}
            }));
            return Ok(());
        }
        if self.permissions.contains_key(&id) {
            return Err(self.violate(format!("a second request with the open id {id}")));
        }
        if self.permissions.len() >= AGENT_PENDING_REQUESTS {
            return Err(self.violate("more open requests than the daemon holds".into()));
        }
        if self.interrupting {
            write_deny(step, &id, "The operator interrupted the turn.");
            return Ok(());
        }
        let s = |k: &str| request.get(k).and_then(Value::as_str);
        let tool = s("tool_name").unwrap_or("tool");
        let shown = s("display_name").unwrap_or(tool);
        let title = match s("description") {
            Some(d) => format!("{shown}: {d}"),
            None => shown.to_string(),
        };
        let input = request.get("input").cloned().unwrap_or(Value::Null);
        let tool_call_id = s("tool_use_id").map(String::from);
        let interaction = match tool {
            "AskUserQuestion" => Interaction::Question(questions_of(&input)),
            "ExitPlanMode" => Interaction::Plan(
                input
                    .get("plan")
                    .and_then(Value::as_str)
                    .map(String::from)
                    .or_else(|| tool_call_id.as_ref().and_then(|t| self.plans.remove(t)))
                    .unwrap_or_default(),
            ),
            _ => Interaction::Permission,
        };
        self.permissions.insert(
            id.clone(),
            OpenRequest {
                input: input.clone(),
                question: matches!(interaction, Interaction::Question(_)),
            },
        );
        step.event(AgentEvent::PermissionRequest(PermissionRequest {
            agent_request_key: id,
            tool_call_id,
            title,
            tool: tool.to_string(),
            action: action_of_tool(tool),
            input,
            options: Vec::new(),
            interaction,
        }));
        Ok(())
    }

    fn on_control_response(
        &mut self,
        step: &mut Step,
        msg: &Map<String, Value>,
    ) -> Result<(), Violation> {
        let response = msg.get("response");
        let id = response
            .and_then(|r| r.get("request_id"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(pos) = self.controls.iter().position(|c| c == id) else {
            return Err(self.violate(format!("a control_response to {id:?}, which we never sent")));
        };
        let id = self.controls.remove(pos);
        if response
            .and_then(|r| r.get("subtype"))
            .and_then(Value::as_str)
            == Some("error")
        {
            let why = response
                .and_then(|r| r.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("no reason given");
            let text = if id.starts_with("mode-") {
                format!("permission mode not changed: {why}")
            } else {
                // The CLI refused to interrupt: the turn goes on, and may
                // be interrupted again.
                self.interrupting = false;
                format!("interrupt refused: {why}")
            };
            step.event(AgentEvent::Transcript(Entry::System { text }));
        }
        Ok(())
    }
}

fn on_user(step: &mut Step, msg: &Map<String, Value>) {
    if msg.get("isReplay").and_then(Value::as_bool) == Some(true) {
        return;
    }
    let blocks = msg
        .get("message")
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for b in blocks {
        let entry = match b.get("type").and_then(Value::as_str) {
            Some("tool_result") => b.get("tool_use_id").and_then(Value::as_str).map(|id| {
                let failed = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                Entry::Tool(ToolEntry {
                    id: id.to_string(),
                    title: None,
                    kind: None,
                    input: None,
                    status: Some(if failed {
                        ToolStatus::Failed
                    } else {
                        ToolStatus::Completed
                    }),
                    result: b.get("content").cloned(),
                })
            }),
            // Text the CLI puts in the user's mouth, e.g. "[Request
            // interrupted by user]".
            Some("text") => b
                .get("text")
                .and_then(Value::as_str)
                .map(|t| Entry::System {
                    text: t.to_string(),
                }),
            _ => None,
        };
        if let Some(e) = entry {
            step.event(AgentEvent::Transcript(e));
        }
    }
}

fn write_allow(step: &mut Step, key: &str, input: Value) {
    write_verdict(
        step,
        key,
        json!({"behavior": "allow", "updatedInput": input}),
    );
}

/// The control response that answers permission request `key`.
fn write_verdict(step: &mut Step, key: &str, verdict: Value) {
    step.write(&json!({
        "type": "control_response",
        "response": {"subtype": "success", "request_id": key, "response": verdict}
    }));
}

/// `AskUserQuestion`'s `questions[]` (cc-question); what is not a string
/// or a boolean where one belongs reads as empty.
fn questions_of(input: &Value) -> Vec<Question> {
    let qs = input
        .get("questions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    qs.iter()
        .map(|q| {
            let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let options = q
                .get("options")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            Question {
                header: s(q, "header"),
                question: s(q, "question"),
                multi_select: q
                    .get("multiSelect")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                options: options.iter().map(|o| s(o, "label")).collect(),
                option_descriptions: options.iter().map(|o| s(o, "description")).collect(),
            }
        })
        .collect()
}

fn write_deny(step: &mut Step, key: &str, message: &str) {
    write_verdict(step, key, json!({"behavior": "deny", "message": message}));
}

/// Claude Code's tool names in ACP's words, for approval.request `action`.
fn action_of_tool(name: &str) -> ActionKind {
    match name {
        "Bash" | "BashOutput" | "KillShell" => ActionKind::Execute,
        "Read" | "NotebookRead" => ActionKind::Read,
        "Edit" | "MultiEdit" | "Write" | "NotebookEdit" => ActionKind::Edit,
        "Glob" | "Grep" | "WebSearch" | "ToolSearch" => ActionKind::Search,
        "WebFetch" => ActionKind::Fetch,
        _ => ActionKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::Grant;

    enum Rec {
        In(Value),
        Out(Vec<u8>),
    }

    /// The `.log` gives the order of what went in and out, but cuts long
    /// lines; the `.jsonl` has every line the CLI printed, whole. The i-th
    /// OUT of the log is the i-th line of the jsonl.
    fn recording(name: &str) -> Vec<Rec> {
        let dir = format!("{}/tests/fixtures/recordings", env!("CARGO_MANIFEST_DIR"));
        let log = std::fs::read_to_string(format!("{dir}/{name}.log")).expect("log");
        let jsonl = std::fs::read_to_string(format!("{dir}/{name}.jsonl")).expect("jsonl");
        let mut out = jsonl.lines();
        let mut recs = Vec::new();
        for l in log.lines() {
            let Some((_, rest)) = l.split_once("] ") else {
                continue;
            };
            if let Some(j) = rest.strip_prefix("IN  ") {
                recs.push(Rec::In(serde_json::from_str(j).expect("IN json")));
            } else if rest.starts_with("OUT ") {
                recs.push(Rec::Out(
                    out.next()
                        .expect("as many OUT as jsonl lines")
                        .as_bytes()
                        .to_vec(),
                ));
            }
        }
        assert!(
            out.next().is_none(),
            "{name}: jsonl has more lines than the log"
        );
        recs
    }

    fn parsed(writes: &[Vec<u8>]) -> Vec<Value> {
        writes
            .iter()
            .map(|w| serde_json::from_slice(w).expect("we write JSON"))
            .collect()
    }

    /// Replays a recording: every IN line is an operator action (`act`)
    /// whose writes must equal it and the IN lines after it (an allow that
    /// switches the mode writes two), or a prompt the core holds (it
    /// writes nothing then, and must write that very line later, when an
    /// OUT line ends the running turn); every OUT line goes into the core.
    /// Returns the events and the prompts still held at the end.
    fn replay(
        name: &str,
        act: &mut dyn FnMut(&mut StreamJsonClient, &Value, &[AgentEvent]) -> Step,
    ) -> (Vec<AgentEvent>, usize) {
        let mut c = StreamJsonClient::new();
        let mut events = Vec::new();
        let mut held: VecDeque<Value> = VecDeque::new();
        let mut written: VecDeque<Value> = VecDeque::new();
        for rec in recording(name) {
            match rec {
                Rec::In(msg) if !written.is_empty() => {
                    assert_eq!(
                        written.pop_front(),
                        Some(msg),
                        "{name}: the core wrote something else"
                    );
                }
                Rec::In(msg) => {
                    let step = if events.is_empty() {
                        let text = msg["message"]["content"]
                            .as_str()
                            .expect("prompt")
                            .to_string();
                        c.start(Some(text)).expect("start")
                    } else {
                        act(&mut c, &msg, &events)
                    };
                    if step.writes.is_empty() && msg["type"] == "user" {
                        held.push_back(msg);
                    } else {
                        written.extend(parsed(&step.writes));
                        assert_eq!(
                            written.pop_front(),
                            Some(msg),
                            "{name}: the core wrote something else"
                        );
                    }
                    events.extend(step.events);
                }
                Rec::Out(line) => {
                    let step = c.on_line(&line).expect("recorded lines are valid");
                    for w in parsed(&step.writes) {
                        assert_eq!(Some(w), held.pop_front(), "{name}: an unprompted write");
                    }
                    events.extend(step.events);
                }
            }
        }
        assert_eq!(held.len(), c.queued(), "{name}: held prompts are queued");
        assert!(
            written.is_empty(),
            "{name}: the core wrote more: {written:?}"
        );
        (events, held.len())
    }

    fn no_act(_: &mut StreamJsonClient, msg: &Value, _: &[AgentEvent]) -> Step {
        panic!("unexpected client line {msg}")
    }

    fn ended(events: &[AgentEvent]) -> Vec<(EndReason, Option<String>)> {
        events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::TurnEnded { reason, detail } => Some((*reason, detail.clone())),
                _ => None,
            })
            .collect()
    }

    fn permission(events: &[AgentEvent]) -> PermissionRequest {
        events
            .iter()
            .find_map(|e| match e {
                AgentEvent::PermissionRequest(p) => Some(p.clone()),
                _ => None,
            })
            .expect("a permission request")
    }

    #[test]
    fn replays_text() {
        let (events, _) = replay("cc-text", &mut no_act);
        assert_eq!(
            events[..3],
            [
                AgentEvent::TurnStarted { chars: 11 },
                AgentEvent::Transcript(Entry::User {
                    text: "hello there".into()
                }),
                AgentEvent::Ready {
                    agent_session_id: "833c2c66-1e38-4ba6-a2cf-c5a90282262c".into(),
                    capabilities: CAPABILITIES
                },
            ]
        );
        assert!(events.contains(&AgentEvent::Transcript(Entry::Text {
            text: "echo: hello there".into()
        })));
        assert!(events.contains(&AgentEvent::Usage(Usage {
            model: Some("claude-sonnet-4-5".into()),
            input_tokens: 10,
            output_tokens: 5
        })));
        assert_eq!(ended(&events), vec![(EndReason::Completed, None)]);
    }

    #[test]
    fn replays_bash_allow() {
        let (events, _) = replay("cc-bash-allow", &mut |c, msg, ev| {
            assert_eq!(msg["response"]["response"]["behavior"], "allow");
            c.answer_permission(&permission(ev).agent_request_key, Decision::Allow)
                .expect("answer")
        });
        let p = permission(&events);
        assert_eq!(p.action, ActionKind::Execute);
        assert_eq!(p.tool_call_id.as_deref(), Some("toolu_mock_1"));
        assert_eq!(p.title, "Bash: create a file");
        let tools: Vec<&ToolEntry> = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Transcript(Entry::Tool(t)) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(tools.len(), 2);
        assert_eq!(
            tools[0].input.as_ref().map(|i| i["command"].clone()),
            Some(json!("touch mock_created.txt"))
        );
        assert_eq!(tools[1].status, Some(ToolStatus::Completed));
        assert_eq!(ended(&events), vec![(EndReason::Completed, None)]);
    }

    fn permissions(events: &[AgentEvent]) -> Vec<PermissionRequest> {
        events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::PermissionRequest(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn replays_a_question_answered_then_declined() {
        let (events, _) = replay("cc-question", &mut |c, msg, ev| {
            let asked = permissions(ev);
            let key = &asked.last().expect("a question").agent_request_key;
            let grant = Grant {
                answers: vec![
                    (
                        "Which database should the service use?".into(),
                        vec!["SQLite".into()],
                    ),
                    (
                        "Which checks should run?".into(),
                        vec!["fmt".into(), "tests".into()],
                    ),
                ],
                set_mode: None,
            };
            let d = match msg["response"]["response"]["behavior"].as_str() {
                Some("allow") => Decision::AllowWith(grant),
                _ => Decision::Deny {
                    message: Some("the user declined to answer".into()),
                },
            };
            c.answer_permission(key, d).expect("answer")
        });
        let asked = permissions(&events);
        assert_eq!(asked.len(), 2);
        let Interaction::Question(qs) = &asked[0].interaction else {
            panic!("a question: {:?}", asked[0].interaction)
        };
        assert_eq!(
            qs[1],
            Question {
                header: "Checks".into(),
                question: "Which checks should run?".into(),
                multi_select: true,
                options: vec!["fmt".into(), "clippy".into(), "tests".into()],
                option_descriptions: vec![
                    "formatting".into(),
                    "lints".into(),
                    "the test suite".into()
                ],
            }
        );
        assert_eq!((qs[0].multi_select, qs[0].options.len()), (false, 2));
        assert_eq!(asked[0].interaction.kind(), "question");
        assert_eq!(ended(&events), vec![(EndReason::Completed, None)]);
    }

    #[test]
    fn replays_a_plan_allowed_with_a_mode_then_denied() {
        let (events, _) = replay("cc-plan", &mut |c, msg, ev| {
            if msg["type"] == "control_request" {
                // The recording's own mode switches, beyond one answer's.
                match msg["request"]["mode"].as_str() {
                    Some("auto") => {
                        let mut step = Step::default();
                        c.set_mode(&mut step, PermissionMode::Auto);
                        return step;
                    }
                    _ => {
                        c.next_control += 1;
                        c.controls.push(msg["request_id"].as_str().unwrap().into());
                        let mut step = Step::default();
                        step.write(msg);
                        return step;
                    }
                }
            }
            if msg["type"] == "user" {
                let text = msg["message"]["content"].as_str().expect("prompt");
                return c.prompt(text.into()).expect("prompt");
            }
            let key = permissions(ev)
                .last()
                .expect("a plan")
                .agent_request_key
                .clone();
            let d = match msg["response"]["response"]["behavior"].as_str() {
                Some("allow") => Decision::AllowWith(Grant {
                    answers: Vec::new(),
                    set_mode: Some(PermissionMode::AcceptEdits),
                }),
                _ => Decision::Deny {
                    message: Some("keep planning".into()),
                },
            };
            c.answer_permission(&key, d).expect("answer")
        });
        let asked = permissions(&events);
        assert_eq!(
            asked
                .iter()
                .map(|p| p.interaction.clone())
                .collect::<Vec<_>>(),
            vec![
                Interaction::Plan("1. add the column\n2. migrate".into()),
                Interaction::Plan("again".into())
            ]
        );
        assert!(events.contains(&AgentEvent::Transcript(Entry::System {
            text: "permission mode not changed: Cannot set permission mode: must be one of acceptEdits, auto, bypassPermissions, default, dontAsk, plan".into()
        })));
        assert_eq!(
            ended(&events),
            vec![(EndReason::Completed, None), (EndReason::Completed, None)]
        );
    }

    #[test]
    fn replays_bash_deny() {
        let (events, _) = replay("cc-bash-deny", &mut |c, msg, ev| {
            let message = msg["response"]["response"]["message"]
                .as_str()
                .map(String::from);
            c.answer_permission(
                &permission(ev).agent_request_key,
                Decision::Deny { message },
            )
            .expect("answer")
        });
        let failed = events.iter().any(|e| {
            matches!(e, AgentEvent::Transcript(Entry::Tool(t)) if t.status == Some(ToolStatus::Failed)
                && t.result == Some(json!("denied by test driver")))
        });
        assert!(failed);
        assert_eq!(ended(&events), vec![(EndReason::Completed, None)]);
    }

    #[test]
    fn replays_interrupt() {
        let (events, _) = replay("cc-interrupt", &mut |c, msg, _| {
            assert_eq!(msg["request"]["subtype"], "interrupt");
            c.interrupt()
        });
        assert!(events.contains(&AgentEvent::Transcript(Entry::System {
            text: "[Request interrupted by user]".into()
        })));
        assert_eq!(ended(&events), vec![(EndReason::Interrupted, None)]);
    }

    fn queue_act(c: &mut StreamJsonClient, msg: &Value, _: &[AgentEvent]) -> Step {
        let text = msg["message"]["content"]
            .as_str()
            .expect("prompt")
            .to_string();
        let step = c.prompt(text).expect("queued");
        assert!(step.writes.is_empty(), "a prompt is held while a turn runs");
        step
    }

    fn starts(events: &[AgentEvent]) -> Vec<&AgentEvent> {
        events
            .iter()
            .filter(|e| matches!(e, AgentEvent::TurnStarted { .. }))
            .collect()
    }

    #[test]
    fn replays_queue() {
        let (events, held) = replay("cc-queue", &mut queue_act);
        assert_eq!(held, 0);
        // The held prompt went out after the first result, as a plain
        // prompt: the CLI never saw it queued.
        assert_eq!(
            starts(&events),
            vec![
                &AgentEvent::TurnStarted { chars: 18 },
                &AgentEvent::TurnStarted { chars: 25 },
            ]
        );
        assert_eq!(
            ended(&events),
            vec![(EndReason::Completed, None), (EndReason::Completed, None)]
        );
        // The init line repeats at the second turn; Ready is said once, and
        // the replayed prompts are not recorded twice.
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, AgentEvent::Ready { .. }))
                .count(),
            1
        );
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, AgentEvent::Transcript(Entry::User { .. })))
                .count(),
            2
        );
        // Stream events are previews: the text is recorded once per answer.
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, AgentEvent::Transcript(Entry::Text { .. })))
                .count(),
            2
        );
    }

    /// cc-queue-merge: the real CLI, given two lines while busy, ran them
    /// as one turn with one result. The core never has two prompts in
    /// flight, so each result closes exactly the turn of the one prompt
    /// written before it; the third prompt went out after the second result
    /// and its turn is open when the recording ends (the recorded CLI had
    /// merged it and fell silent).
    #[test]
    fn replays_queue_merge_with_one_prompt_in_flight() {
        let (events, held) = replay("cc-queue-merge", &mut queue_act);
        assert_eq!(held, 0);
        assert_eq!(starts(&events).len(), 3);
        assert_eq!(
            ended(&events),
            vec![(EndReason::Completed, None), (EndReason::Completed, None)]
        );
    }

    /// cc-queue-interrupt: interrupting while lines wait; the CLI ends the
    /// turn, then runs what was queued. The core does the same with the
    /// prompts it holds.
    #[test]
    fn replays_interrupt_with_prompts_held() {
        let mut held_given = 0;
        let (events, _) = replay("cc-queue-interrupt", &mut |c, msg, ev| {
            if msg["type"] == "user" {
                held_given += 1;
                return queue_act(c, msg, ev);
            }
            assert_eq!(msg["request"]["subtype"], "interrupt");
            let step = c.interrupt();
            assert_eq!(parsed(&step.writes)[0]["request_id"], "int-1");
            step
        });
        assert_eq!(held_given, 2);
        let ends = ended(&events);
        assert_eq!(ends[0].0, EndReason::Interrupted);
        assert_eq!(ends[1].0, EndReason::Completed);
        assert_eq!(starts(&events).len(), 3, "the held prompts still run");
    }

    #[test]
    fn replays_rate_limit() {
        let (events, _) = replay("cc-ratelimit", &mut no_act);
        let ends = ended(&events);
        assert_eq!(ends.len(), 1);
        assert_eq!(ends[0].0, EndReason::UsageLimited);
        assert!(events.iter().any(
            |e| matches!(e, AgentEvent::Transcript(Entry::System { text }) if text.contains("429"))
        ));
        // The CLI's own error message is not a model.
        assert!(events.iter().any(
            |e| matches!(e, AgentEvent::Usage(u) if u.model.as_deref() == Some("claude-sonnet-4-5"))
        ));
    }

    /// Item 13: the retry shows while the CLI retries and clears when
    /// output resumes (here the CLI's own error message, then the result).
    #[test]
    fn replays_rate_limit_retrying_then_cleared() {
        let (events, _) = replay("cc-ratelimit", &mut no_act);
        let retries: Vec<&AgentEvent> = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::Retrying(_)))
            .collect();
        assert_eq!(
            retries,
            vec![
                &AgentEvent::Retrying(Some(Retry {
                    attempt: 1,
                    max_retries: 1,
                    error_status: Some(429),
                    error: Some("rate_limit".into()),
                    retry_delay_ms: Some(1204)
                })),
                &AgentEvent::Retrying(None)
            ]
        );
        let cleared = events
            .iter()
            .position(|e| *e == AgentEvent::Retrying(None))
            .expect("cleared");
        let ended = events
            .iter()
            .position(|e| matches!(e, AgentEvent::TurnEnded { .. }))
            .expect("ended");
        assert!(cleared < ended);
    }

    #[test]
    fn rate_limit_from_the_assistant_line_alone() {
        let mut c = StreamJsonClient::new();
        c.start(Some("x".into())).expect("start");
        c.on_line(br#"{"type":"assistant","message":{"content":[]},"error":"rate_limit"}"#)
            .expect("ok");
        let s = c
            .on_line(br#"{"type":"result","subtype":"success","is_error":true}"#)
            .expect("ok");
        assert_eq!(ended(&s.events)[0].0, EndReason::UsageLimited);
        let mut c = StreamJsonClient::new();
        c.start(Some("x".into())).expect("start");
        let s = c
            .on_line(br#"{"type":"result","subtype":"error_max_turns","is_error":false}"#)
            .expect("ok");
        assert_eq!(
            ended(&s.events)[0],
            (EndReason::Failed, Some("error_max_turns".into()))
        );
    }

    #[test]
    fn queue_bound_and_violations() {
        let mut c = StreamJsonClient::new();
        c.start(Some("first".into())).expect("start");
        for i in 0..AGENT_PROMPT_QUEUE {
            assert!(c.prompt(format!("q{i}")).expect("queued").writes.is_empty());
        }
        assert_eq!(c.prompt("over".into()), Err(CommandError::QueueFull));
        let v = c.on_line(
            br#"{"type":"control_response","response":{"subtype":"success","request_id":"nope"}}"#,
        );
        assert!(v.expect_err("violation").turn_was_active);
        assert_eq!(c.prompt("x".into()), Err(CommandError::Closed));
        for bad in [
            &b"garbage"[..],
            br#"{"no_type":1}"#,
            br#"{"type":"result","subtype":"success"}"#,
        ] {
            let mut c = StreamJsonClient::new();
            assert!(c.on_line(bad).is_err());
        }
    }

    /// An interrupt asked for before the CLI began the turn waits for the
    /// turn's init line (the CLI ignores it earlier); one asked for after
    /// goes out at once.
    #[test]
    fn interrupt_waits_for_the_turn_to_begin() {
        let init = br#"{"type":"system","subtype":"init","session_id":"s1"}"#;
        let mut c = StreamJsonClient::new();
        c.start(Some("one".into())).expect("start");
        assert!(c.interrupt().writes.is_empty());
        assert!(c.interrupt().writes.is_empty(), "asked once");
        let w = parsed(&c.on_line(init).expect("ok").writes);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0]["request"]["subtype"], "interrupt");
        let s = c
            .on_line(br#"{"type":"result","subtype":"success","is_error":false}"#)
            .expect("ok");
        assert_eq!(ended(&s.events)[0].0, EndReason::Interrupted);
        // A turn that ends before its init line still ends interrupted, and
        // the held interrupt is not carried into the next turn.
        c.prompt("two".into()).expect("prompt");
        assert!(c.interrupt().writes.is_empty());
        let s = c
            .on_line(br#"{"type":"result","subtype":"success","is_error":false}"#)
            .expect("ok");
        assert_eq!(ended(&s.events)[0].0, EndReason::Interrupted);
        c.prompt("three".into()).expect("prompt");
        assert!(c.on_line(init).expect("ok").writes.is_empty());
        assert_eq!(parsed(&c.interrupt().writes).len(), 1);
    }

    #[test]
    fn unsupported_control_requests_get_an_error_answer() {
        let mut c = StreamJsonClient::new();
        let s = c.on_line(br#"{"type":"control_request","request_id":"r1","request":{"subtype":"hook_callback"}}"#).expect("ok");
        let w = parsed(&s.writes);
        assert_eq!(w[0]["response"]["subtype"], "error");
        assert_eq!(w[0]["response"]["request_id"], "r1");
    }

    #[test]
    fn cancel_request_and_exit_close_permissions() {
        let mut c = StreamJsonClient::new();
        c.start(Some("x".into())).expect("start");
        let req = br#"{"type":"control_request","request_id":"p1","request":{"subtype":"can_use_tool","tool_name":"Write","input":{}}}"#;
        c.on_line(req).expect("ok");
        let s = c
            .on_line(br#"{"type":"control_cancel_request","request_id":"p1"}"#)
            .expect("ok");
        assert_eq!(
            s.events,
            vec![AgentEvent::PermissionClosed {
                agent_request_key: "p1".into(),
                delivered: false
            }]
        );
        let req2 = br#"{"type":"control_request","request_id":"p2","request":{"subtype":"can_use_tool","tool_name":"Write","input":{}}}"#;
        c.on_line(req2).expect("ok");
        let s = c.on_exit(Some(1));
        assert!(s.events.contains(&AgentEvent::PermissionClosed {
            agent_request_key: "p2".into(),
            delivered: false
        }));
        assert_eq!(ended(&s.events)[0].0, EndReason::Failed);
        assert_eq!(
            resume_args("abc"),
            vec!["--resume".to_string(), "abc".to_string()]
        );
    }
}
