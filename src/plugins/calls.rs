//! The calls a plugin makes to the host: their typed params, checked exactly
//! as the page's schemas say, and their typed results (seed 000, "Calls a
//! plugin makes to the host"; API 1.1's sessions.get and tasks.cancel from
//! issue seed 001).
//!
//! [`Call::parse`] takes the method and params of a request that passed
//! [`super::wire::parse_line`], the id check and the permission check, and
//! gives a [`Call`] or an `invalid-params` [`HostError`] whose one-line
//! message names the member. The result types serialise to the page's result
//! objects; list results are written with [`super::wire::encode_page`].
//! sessions.list, sessions.get and seats.list items are not typed here: the
//! views build them (`super::views` from a session's summary,
//! `Seat::plugin_item`) and hand them to the host as they are.
//!
//! Decisions where the page is silent:
//! - An integer member (`limit`) accepts any JSON number with an integral
//!   value (`2` and `2.0`), as JSON Schema's `integer` does.
//! - A message names a member the plugin sent only when the name is a plain
//!   identifier; otherwise it says "an unknown member".
//! - sessions.get's result is the session's item itself, with exactly the
//!   members of a sessions.list item. A session the daemon does not know is
//!   `invalid-params` ("name something the daemon does not know").
//! - tasks.cancel's `id` has the wire id pattern; its result `requestId` is
//!   the inbox request id of the retracted call (the one tasks.create's
//!   result would have carried).

use serde::Serialize;
use serde_json::{Map, Value};

use super::text;
use super::wire::{EventKind, HostError, HostErrorKind, Method, QuotaLimit, is_wire_id};
use crate::limits;

/// A call a plugin made, with params that fit its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// events.subscribe; `kinds` in the order of the kind list, every kind
    /// when the plugin named none. This is also the result.
    EventsSubscribe {
        /// The kinds to deliver.
        kinds: Vec<EventKind>,
    },
    /// events.unsubscribe
    EventsUnsubscribe,
    /// sessions.list
    SessionsList {
        /// The nextCursor of the page before.
        cursor: Option<String>,
        /// Page size, 1 to 500, 100 when absent.
        limit: u64,
    },
    /// sessions.get (API 1.1)
    SessionsGet {
        /// A session id.
        session: String,
    },
    /// lanes.list
    LanesList {
        /// The nextCursor of the page before: `<createdAt>/<lane>`.
        cursor: Option<String>,
    },
    /// seats.list
    SeatsList {
        /// The nextCursor of the page before.
        cursor: Option<String>,
    },
    /// storage.get
    StorageGet {
        /// The key.
        key: String,
    },
    /// storage.set
    StorageSet {
        /// The key.
        key: String,
        /// At most 16,384 characters.
        value: String,
    },
    /// storage.delete
    StorageDelete {
        /// The key.
        key: String,
    },
    /// storage.list
    StorageList,
    /// tasks.create
    TasksCreate(TaskRequest),
    /// tasks.cancel (API 1.1)
    TasksCancel {
        /// The wire id of the plugin's tasks.create request to retract.
        id: String,
    },
}

/// The params of tasks.create, as the host stores and dispatches them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskRequest {
    /// A local absolute path, never a share or a device path.
    pub repo: String,
    /// What the builder is asked to do.
    pub task: String,
    /// The builder's harness id.
    pub builder: String,
    /// The verifier's harness id.
    pub verifier: String,
    /// The check that decides whether the task is done.
    pub acceptance: Acceptance,
    /// A short name for the task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The branch the task starts from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

impl From<TaskRequest> for crate::lanes::controller::DispatchRequest {
    fn from(t: TaskRequest) -> Self {
        crate::lanes::controller::DispatchRequest {
            repo: t.repo.into(),
            task: t.task,
            builder: t.builder,
            verifier: t.verifier,
            acceptance_name: t.acceptance.name,
            acceptance_command: t.acceptance.command,
            name: t.name,
            base: t.base,
        }
    }
}

/// `acceptance` of tasks.create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Acceptance {
    /// 1 to 64 printable basic Latin characters, no space at either end.
    pub name: String,
    /// One line of 1 to 900 printable basic Latin characters, not only spaces.
    pub command: String,
}

fn bad(message: &str) -> HostError {
    HostError::invalid_params(message)
}

fn is_plain_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic())
        && s.len() <= 64
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
}

/// Reads members of a params object and refuses members the call does not
/// take.
struct Members<'a> {
    map: &'a Map<String, Value>,
    allowed: &'static [&'static str],
}

impl<'a> Members<'a> {
    fn new(
        map: &'a Map<String, Value>,
        allowed: &'static [&'static str],
    ) -> Result<Members<'a>, HostError> {
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(if is_plain_identifier(k) {
                bad(&format!("params has an unknown member: {k}"))
            } else {
                bad("params has an unknown member")
            });
        }
        Ok(Members { map, allowed })
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        debug_assert!(self.allowed.contains(&name));
        self.map.get(name)
    }

    fn opt_str(&self, name: &str) -> Result<Option<&'a str>, HostError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(bad(&format!("{name} must be a string"))),
        }
    }

    fn str(&self, name: &str) -> Result<&'a str, HostError> {
        self.opt_str(name)?
            .ok_or_else(|| bad(&format!("{name} is required")))
    }
}

fn all_bytes(s: &str, min: usize, max: usize, ok: impl Fn(u8) -> bool) -> bool {
    (min..=max).contains(&s.len()) && s.bytes().all(ok)
}

/// `^[a-zA-Z0-9_-]{1,128}$`: a session id, a harness id of the registry, a
/// cursor of sessions.list and seats.list.
pub fn is_token(s: &str) -> bool {
    all_bytes(s, 1, limits::PLUGIN_CURSOR_MAX, |b| {
        b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
    })
}

/// `^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$`.
pub fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 24
        && b.iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'.',
            23 => c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// `^t-[0-9a-f]{12}$`: a lane id.
pub fn is_lane_id(s: &str) -> bool {
    s.len() == 14
        && s.starts_with("t-")
        && s.bytes()
            .skip(2)
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A lanes.list cursor: a timestamp, `/`, a lane id.
pub fn is_lane_cursor(s: &str) -> bool {
    s.len() == 39 && is_timestamp(&s[..24]) && s.as_bytes()[24] == b'/' && is_lane_id(&s[25..])
}

/// The lanes.list cursor of a lane: `<createdAt>/<lane>`.
pub fn lane_cursor(created_at: &str, lane: &str) -> String {
    format!("{created_at}/{lane}")
}

/// `^[a-z0-9][a-z0-9._-]{0,63}$`: a storage key.
pub fn is_storage_key(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    all_bytes(s, 1, limits::PLUGIN_STORAGE_KEY_MAX, |b| {
        ok(b) || matches!(b, b'.' | b'_' | b'-')
    }) && s.bytes().next().is_some_and(ok)
}

/// A storage value: at most 16,384 characters.
pub fn is_storage_value(s: &str) -> bool {
    s.len() <= limits::PLUGIN_STORAGE_VALUE_MAX_CHARS
        || s.chars().count() <= limits::PLUGIN_STORAGE_VALUE_MAX_CHARS
}

/// tasks.create's repo: at most 4,096 characters, matching
/// `^(?:/(?!/)|[A-Za-z]:[\\/])[^\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]*$`.
pub fn is_task_repo(s: &str) -> bool {
    let b = s.as_bytes();
    let start = (b.first() == Some(&b'/') && b.get(1) != Some(&b'/'))
        || (b.len() >= 3
            && b[0].is_ascii_alphabetic()
            && b[1] == b':'
            && matches!(b[2], b'\\' | b'/'));
    start && s.chars().count() <= limits::PLUGIN_PATH_MAX && text::is_plain(s)
}

/// tasks.create's task: 1 to 4,000 characters, plain multi-line text, not
/// only white space.
pub fn is_task_text(s: &str) -> bool {
    let n = s.chars().count();
    (1..=limits::PLUGIN_TASK_TEXT_MAX).contains(&n)
        && text::is_plain_multiline(s)
        && !text::is_ecma_blank(s)
}

fn is_printable(b: u8) -> bool {
    (b' '..=b'~').contains(&b)
}

/// `^[!-~](?:[ -~]*[!-~])?$`, 1 to 64 characters: an acceptance name.
pub fn is_acceptance_name(s: &str) -> bool {
    all_bytes(s, 1, limits::PLUGIN_ACCEPTANCE_NAME_MAX, is_printable)
        && !s.starts_with(' ')
        && !s.ends_with(' ')
}

/// `^[ -~]*[!-~][ -~]*$`, 1 to 900 characters: an acceptance command.
pub fn is_acceptance_command(s: &str) -> bool {
    all_bytes(s, 1, limits::PLUGIN_ACCEPTANCE_COMMAND_MAX, is_printable)
        && s.bytes().any(|b| b != b' ')
}

/// `^[A-Za-z0-9][A-Za-z0-9 ._-]{0,47}$`: a task name.
pub fn is_task_name(s: &str) -> bool {
    all_bytes(s, 1, 48, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b' ' | b'.' | b'_' | b'-')
    }) && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// `^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$`: a base branch.
pub fn is_base_branch(s: &str) -> bool {
    all_bytes(s, 1, 200, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-')
    }) && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn as_integer(v: &Value) -> Option<i128> {
    if let Some(u) = v.as_u64() {
        return Some(i128::from(u));
    }
    if let Some(i) = v.as_i64() {
        return Some(i128::from(i));
    }
    let f = v.as_f64()?;
    (f.fract() == 0.0 && f.abs() < 1e18).then_some(f as i128)
}

impl Call {
    /// Checks `params` against `method`'s schema.
    pub fn parse(method: Method, params: &Map<String, Value>) -> Result<Call, HostError> {
        match method {
            Method::EventsSubscribe => {
                let m = Members::new(params, &["kinds"])?;
                let kinds = match m.get("kinds") {
                    None => EventKind::ALL.to_vec(),
                    Some(Value::Array(items)) => {
                        if items.is_empty() || items.len() > limits::PLUGIN_SUBSCRIBE_KINDS_MAX {
                            return Err(bad("kinds must be 1 to 9 items"));
                        }
                        let mut kinds = Vec::with_capacity(items.len());
                        for item in items {
                            let kind =
                                item.as_str()
                                    .and_then(EventKind::from_name)
                                    .ok_or_else(|| {
                                        bad("kinds holds an item that is not an event kind")
                                    })?;
                            if kinds.contains(&kind) {
                                return Err(bad("kinds holds an item twice"));
                            }
                            kinds.push(kind);
                        }
                        kinds.sort();
                        kinds
                    }
                    Some(_) => return Err(bad("kinds must be an array")),
                };
                Ok(Call::EventsSubscribe { kinds })
            }
            Method::EventsUnsubscribe => {
                Members::new(params, &[])?;
                Ok(Call::EventsUnsubscribe)
            }
            Method::SessionsList => {
                let m = Members::new(params, &["cursor", "limit"])?;
                let cursor = token_cursor(&m)?;
                let limit = match m.get("limit") {
                    None => limits::PLUGIN_SESSIONS_PAGE_DEFAULT,
                    Some(v) => match as_integer(v) {
                        Some(n)
                            if (1..=i128::from(limits::PLUGIN_SESSIONS_PAGE_MAX)).contains(&n) =>
                        {
                            n as u64
                        }
                        Some(_) => return Err(bad("limit must be from 1 to 500")),
                        None => return Err(bad("limit must be an integer")),
                    },
                };
                Ok(Call::SessionsList { cursor, limit })
            }
            Method::SessionsGet => {
                let m = Members::new(params, &["session"])?;
                let session = m.str("session")?;
                if !is_token(session) {
                    return Err(bad("session must be a session id"));
                }
                Ok(Call::SessionsGet {
                    session: session.to_string(),
                })
            }
            Method::LanesList => {
                let m = Members::new(params, &["cursor"])?;
                let cursor = m.opt_str("cursor")?;
                if cursor.is_some_and(|c| !is_lane_cursor(c)) {
                    return Err(bad("cursor must be the nextCursor of the page before"));
                }
                Ok(Call::LanesList {
                    cursor: cursor.map(str::to_string),
                })
            }
            Method::SeatsList => {
                let m = Members::new(params, &["cursor"])?;
                Ok(Call::SeatsList {
                    cursor: token_cursor(&m)?,
                })
            }
            Method::StorageGet => Ok(Call::StorageGet {
                key: key_only(params)?,
            }),
            Method::StorageDelete => Ok(Call::StorageDelete {
                key: key_only(params)?,
            }),
            Method::StorageSet => {
                let m = Members::new(params, &["key", "value"])?;
                let key = storage_key(&m)?;
                let value = m.str("value")?;
                if !is_storage_value(value) {
                    return Err(bad("value must be at most 16384 characters"));
                }
                Ok(Call::StorageSet {
                    key,
                    value: value.to_string(),
                })
            }
            Method::StorageList => {
                Members::new(params, &[])?;
                Ok(Call::StorageList)
            }
            Method::TasksCreate => Ok(Call::TasksCreate(task_request(params)?)),
            Method::TasksCancel => {
                let m = Members::new(params, &["id"])?;
                let id = m.str("id")?;
                if !is_wire_id(id) {
                    return Err(bad("id must be the id of a tasks.create request"));
                }
                Ok(Call::TasksCancel { id: id.to_string() })
            }
        }
    }
}

fn token_cursor(m: &Members) -> Result<Option<String>, HostError> {
    let cursor = m.opt_str("cursor")?;
    if cursor.is_some_and(|c| !is_token(c)) {
        return Err(bad("cursor must be the nextCursor of the page before"));
    }
    Ok(cursor.map(str::to_string))
}

fn storage_key(m: &Members) -> Result<String, HostError> {
    let key = m.str("key")?;
    if !is_storage_key(key) {
        return Err(bad(
            "key must be 1 to 64 characters: lowercase letters, digits, dots, underscores and hyphens",
        ));
    }
    Ok(key.to_string())
}

fn key_only(params: &Map<String, Value>) -> Result<String, HostError> {
    storage_key(&Members::new(params, &["key"])?)
}

/// Validates tasks.create params; task.dispatch on the daemon socket takes
/// the same members and patterns (issue 5, "Dispatch").
pub fn task_request(params: &Map<String, Value>) -> Result<TaskRequest, HostError> {
    let m = Members::new(
        params,
        &[
            "repo",
            "task",
            "builder",
            "verifier",
            "acceptance",
            "name",
            "base",
        ],
    )?;
    let repo = m.str("repo")?;
    if !is_task_repo(repo) {
        return Err(bad(
            "repo must be a local absolute path of at most 4096 characters without control or invisible characters",
        ));
    }
    let task = m.str("task")?;
    if !is_task_text(task) {
        return Err(bad(
            "task must be 1 to 4000 characters, not only spaces, with no control or invisible character but line feed and tab",
        ));
    }
    let builder = m.str("builder")?;
    if !is_token(builder) {
        return Err(bad("builder must be a harness id"));
    }
    let verifier = m.str("verifier")?;
    if !is_token(verifier) {
        return Err(bad("verifier must be a harness id"));
    }
    let acceptance = match m.get("acceptance") {
        None => return Err(bad("acceptance is required")),
        Some(Value::Object(a)) => {
            if a.keys().any(|k| k != "name" && k != "command") {
                return Err(bad("acceptance has a member other than name and command"));
            }
            let name = match a.get("name") {
                Some(Value::String(s)) if is_acceptance_name(s) => s.clone(),
                Some(_) => {
                    return Err(bad(
                        "acceptance.name must be 1 to 64 printable basic Latin characters",
                    ));
                }
                None => return Err(bad("acceptance.name is required")),
            };
            let command = match a.get("command") {
                Some(Value::String(s)) if is_acceptance_command(s) => s.clone(),
                Some(_) => {
                    return Err(bad(
                        "acceptance.command must be one line of 1 to 900 printable basic Latin characters, not only spaces",
                    ));
                }
                None => return Err(bad("acceptance.command is required")),
            };
            Acceptance { name, command }
        }
        Some(_) => return Err(bad("acceptance must be an object")),
    };
    let name = m.opt_str("name")?;
    if name.is_some_and(|n| !is_task_name(n)) {
        return Err(bad(
            "name must be 1 to 48 letters, digits, spaces, dots, underscores and hyphens",
        ));
    }
    let base = m.opt_str("base")?;
    if base.is_some_and(|b| !is_base_branch(b)) {
        return Err(bad(
            "base must be a branch name of 1 to 200 letters, digits, dots, underscores, slashes and hyphens",
        ));
    }
    Ok(TaskRequest {
        repo: repo.to_string(),
        task: task.to_string(),
        builder: builder.to_string(),
        verifier: verifier.to_string(),
        acceptance,
        name: name.map(str::to_string),
        base: base.map(str::to_string),
    })
}

/// What a plugin's storage folder holds, to decide a storage.set before it is
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StorageUsage {
    /// Keys held.
    pub keys: usize,
    /// Total bytes of UTF-8 of the values.
    pub bytes: usize,
}

impl StorageUsage {
    /// The usage after setting a key that held `old_bytes` (`None` when it
    /// held nothing) to a value of `new_bytes`, or `quota-exceeded` when that
    /// would pass 128 keys (`keys`) or 1,048,576 bytes (`bytes`).
    pub fn after_set(
        self,
        old_bytes: Option<usize>,
        new_bytes: usize,
    ) -> Result<StorageUsage, HostError> {
        let keys = self.keys + usize::from(old_bytes.is_none());
        if keys > limits::PLUGIN_STORAGE_MAX_KEYS {
            return Err(HostError::of(HostErrorKind::QuotaExceeded(
                QuotaLimit::Keys,
            )));
        }
        let bytes = self.bytes - old_bytes.unwrap_or(0).min(self.bytes) + new_bytes;
        if bytes > limits::PLUGIN_STORAGE_MAX_BYTES {
            return Err(HostError::of(HostErrorKind::QuotaExceeded(
                QuotaLimit::Bytes,
            )));
        }
        Ok(StorageUsage { keys, bytes })
    }
}

/// Result of events.subscribe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subscribed {
    /// The kinds now delivered, in the order of the kind list.
    pub kinds: Vec<EventKind>,
}

/// Result of events.unsubscribe: `{"kinds": []}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Unsubscribed {
    /// Always empty.
    pub kinds: [EventKind; 0],
}

/// A provider family of the registry: the config's `family`, whose names
/// are the page's.
pub use crate::config::Family;

/// A lane's state as verify.list gives it: the lane machine's own, whose
/// wire names are the page's.
pub use crate::lanes::machine::LaneState;

/// Where a lane is in the lane loop: the lane machine's own stage, whose
/// wire names are the page's (seed 000, lanes[].stage).
pub use crate::lanes::machine::Stage as LaneStage;

/// A verifier's verdict: the lane machine's own, whose wire names are the
/// page's.
pub use crate::lanes::machine::VerdictKind as Verdict;

/// The seat that builds a lane now, and its session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneBuilder {
    /// The builder's session, or null.
    pub session: Option<String>,
    /// The seat.
    #[serde(flatten)]
    pub seat: LaneSeat,
}

/// A seat a lane was built or is verified on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneSeat {
    /// A seat's harness id.
    pub harness: String,
    /// A provider name of the registry, or unknown.
    pub provider: String,
    /// The provider family.
    pub family: Family,
    /// A plain model name, or null.
    pub model: Option<String>,
}

/// The latest verdict of a lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneVerdict {
    /// pass or rework.
    pub verdict: Verdict,
    /// The commit it is on.
    pub commit: String,
}

/// One item of lanes.list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneItem {
    /// The lane id.
    pub lane: String,
    /// The repository.
    pub repo: String,
    /// The base branch.
    pub base: String,
    /// The lane's branch.
    pub branch: String,
    /// The lane's worktree.
    pub worktree: String,
    /// The state as verify.list gives it.
    pub state: LaneState,
    /// The stage of the lane loop.
    pub stage: LaneStage,
    /// The builder now.
    pub builder: LaneBuilder,
    /// The verifier.
    pub verifier: LaneSeat,
    /// The latest verdict, or null before the first.
    pub verdict: Option<LaneVerdict>,
    /// The commit the branch points at, or null when it is gone.
    pub head: Option<String>,
    /// True when the verdict is on another commit than head.
    pub stale: bool,
    /// When the lane was dispatched.
    pub created_at: String,
}

impl LaneItem {
    /// This lane's lanes.list cursor.
    pub fn cursor(&self) -> String {
        lane_cursor(&self.created_at, &self.lane)
    }
}

/// Result of storage.get; the host writes it with
/// [`super::wire::encode_storage_value`], whose line is this one's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StorageValue {
    /// The key.
    pub key: String,
    /// The value, or null when the key holds nothing.
    pub value: Option<String>,
}

/// Result of storage.set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StorageWritten {
    /// The key.
    pub key: String,
    /// The size of the stored value in bytes of UTF-8.
    pub bytes: usize,
}

/// Result of storage.delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StorageDeleted {
    /// The key.
    pub key: String,
    /// False when the key held nothing.
    pub deleted: bool,
}

/// Result of storage.list: every key sorted by key, and the total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StorageKeys {
    /// Each key and the size of its value.
    pub keys: Vec<StorageWritten>,
    /// The total of the values in bytes.
    pub bytes: usize,
}

/// Result of tasks.create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStarted {
    /// The inbox request the operator allowed.
    pub request_id: String,
    /// The lane.
    pub lane: String,
    /// The builder's session.
    pub session: String,
}

/// Result of tasks.cancel (API 1.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskCancelled {
    /// The inbox request id of the retracted call.
    pub request_id: String,
    /// Always true.
    pub cancelled: bool,
}

impl TaskCancelled {
    /// The result for the retracted request `request_id`.
    pub fn new(request_id: &str) -> TaskCancelled {
        TaskCancelled {
            request_id: request_id.to_string(),
            cancelled: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::wire::{Incoming, Params, encode_page, encode_response, parse_line};
    use serde_json::json;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn parse(method: Method, v: Value) -> Result<Call, HostError> {
        Call::parse(method, &params(v))
    }

    fn refused(method: Method, v: Value) -> String {
        match parse(method, v.clone()) {
            Err(e) => {
                assert_eq!(e.code(), "invalid-params", "{v}");
                assert!(!e.message().contains('\n'));
                e.message().to_string()
            }
            Ok(c) => panic!("accepted {v}: {c:?}"),
        }
    }

    #[test]
    fn subscribe() {
        let c = parse(
            Method::EventsSubscribe,
            json!({"kinds": ["lane.verdict", "turn.end"]}),
        )
        .unwrap();
        let Call::EventsSubscribe { kinds } = c else {
            panic!()
        };
        assert_eq!(
            serde_json::to_value(Subscribed { kinds }).unwrap(),
            json!({"kinds": ["turn.end", "lane.verdict"]})
        );
        let Call::EventsSubscribe { kinds } = parse(Method::EventsSubscribe, json!({})).unwrap()
        else {
            panic!()
        };
        assert_eq!(kinds, EventKind::ALL.to_vec());
        assert!(
            refused(
                Method::EventsSubscribe,
                json!({"kinds": ["turn.end", "turn.end"]})
            )
            .contains("twice")
        );
        refused(Method::EventsSubscribe, json!({"kinds": []}));
        refused(Method::EventsSubscribe, json!({"kinds": ["turn.middle"]}));
        refused(Method::EventsSubscribe, json!({"kinds": "turn.end"}));
        refused(Method::EventsSubscribe, json!({"kinds": [1]}));
        let ten: Vec<&str> = EventKind::ALL
            .iter()
            .map(|k| k.name())
            .chain(["turn.end"])
            .collect();
        refused(Method::EventsSubscribe, json!({ "kinds": ten }));
        assert_eq!(
            refused(Method::EventsSubscribe, json!({"kind": []})),
            "params has an unknown member: kind"
        );
        assert_eq!(
            refused(Method::EventsSubscribe, json!({"a b": 1})),
            "params has an unknown member"
        );
        assert_eq!(
            parse(Method::EventsUnsubscribe, json!({})),
            Ok(Call::EventsUnsubscribe)
        );
        refused(Method::EventsUnsubscribe, json!({"kinds": ["turn.end"]}));
        assert_eq!(
            serde_json::to_value(Unsubscribed { kinds: [] }).unwrap(),
            json!({"kinds": []})
        );
    }

    #[test]
    fn lists() {
        assert_eq!(
            parse(Method::SessionsList, json!({"limit": 2})),
            Ok(Call::SessionsList {
                cursor: None,
                limit: 2
            })
        );
        assert_eq!(
            parse(Method::SessionsList, json!({})),
            Ok(Call::SessionsList {
                cursor: None,
                limit: 100
            })
        );
        assert_eq!(
            parse(
                Method::SessionsList,
                json!({"limit": 500.0, "cursor": "s-7a1b2c3d4e5f"})
            ),
            Ok(Call::SessionsList {
                cursor: Some("s-7a1b2c3d4e5f".into()),
                limit: 500
            })
        );
        for bad in [
            json!({"limit": 0}),
            json!({"limit": 501}),
            json!({"limit": -1}),
            json!({"limit": 2.5}),
            json!({"limit": "2"}),
            json!({"cursor": ""}),
            json!({"cursor": "a/b"}),
            json!({"cursor": "x".repeat(129)}),
            json!({"cursor": null}),
        ] {
            refused(Method::SessionsList, bad);
        }
        assert_eq!(
            parse(Method::LanesList, json!({})),
            Ok(Call::LanesList { cursor: None })
        );
        let c = "2026-11-14T09:12:43.870Z/t-0c1d2e3f4a5b";
        assert_eq!(
            parse(Method::LanesList, json!({ "cursor": c })),
            Ok(Call::LanesList {
                cursor: Some(c.into())
            })
        );
        refused(
            Method::LanesList,
            json!({"cursor": "2026-11-14T09:12:43.870Z/t-0C1D2E3F4A5B"}),
        );
        refused(Method::LanesList, json!({"cursor": "s-4f9a1c2b7d3e"}));
        assert_eq!(
            parse(Method::SeatsList, json!({"cursor": "codex"})),
            Ok(Call::SeatsList {
                cursor: Some("codex".into())
            })
        );
        refused(Method::SeatsList, json!({"limit": 1}));
        assert_eq!(
            parse(Method::SessionsGet, json!({"session": "s-4f9a1c2b7d3e"})),
            Ok(Call::SessionsGet {
                session: "s-4f9a1c2b7d3e".into()
            })
        );
        assert_eq!(
            refused(Method::SessionsGet, json!({})),
            "session is required"
        );
        refused(Method::SessionsGet, json!({"session": "../etc"}));
    }

    #[test]
    fn storage() {
        assert_eq!(
            parse(Method::StorageGet, json!({"key": "last-run"})),
            Ok(Call::StorageGet {
                key: "last-run".into()
            })
        );
        assert_eq!(
            parse(Method::StorageDelete, json!({"key": "0.a_b-c"})),
            Ok(Call::StorageDelete {
                key: "0.a_b-c".into()
            })
        );
        for key in ["", "-a", ".a", "A", "a/b", "a b", &"a".repeat(65)] {
            assert!(
                refused(Method::StorageGet, json!({ "key": key }))
                    .starts_with("key must be 1 to 64 characters")
            );
        }
        assert!(parse(Method::StorageGet, json!({"key": "a".repeat(64)})).is_ok());
        let v = "é".repeat(16_384);
        assert_eq!(
            parse(Method::StorageSet, json!({"key": "k", "value": v})),
            Ok(Call::StorageSet {
                key: "k".into(),
                value: v.clone()
            })
        );
        refused(Method::StorageSet, json!({"key": "k", "value": v + "x"}));
        refused(Method::StorageSet, json!({"key": "k"}));
        refused(Method::StorageSet, json!({"key": "k", "value": null}));
        assert_eq!(parse(Method::StorageList, json!({})), Ok(Call::StorageList));
        refused(Method::StorageList, json!({"cursor": "a"}));

        let full = StorageUsage {
            keys: 128,
            bytes: 10,
        };
        assert_eq!(
            full.after_set(Some(5), 7),
            Ok(StorageUsage {
                keys: 128,
                bytes: 12
            })
        );
        assert_eq!(
            full.after_set(None, 1).unwrap_err().to_json()["data"],
            json!({"limit": "keys"})
        );
        let big = StorageUsage {
            keys: 1,
            bytes: 1_048_570,
        };
        assert_eq!(
            big.after_set(None, 7).unwrap_err().to_json()["data"],
            json!({"limit": "bytes"})
        );
        assert!(big.after_set(None, 6).is_ok());

        let list = StorageKeys {
            keys: vec![
                StorageWritten {
                    key: "last-run".into(),
                    bytes: 24,
                },
                StorageWritten {
                    key: "notes".into(),
                    bytes: 310,
                },
            ],
            bytes: 334,
        };
        assert_eq!(
            serde_json::to_value(list).unwrap(),
            json!({"keys": [{"key": "last-run", "bytes": 24}, {"key": "notes", "bytes": 310}], "bytes": 334})
        );
        assert_eq!(
            serde_json::to_value(StorageValue {
                key: "never-set".into(),
                value: None
            })
            .unwrap(),
            json!({"key": "never-set", "value": null})
        );
        assert_eq!(
            serde_json::to_value(StorageDeleted {
                key: "last-run".into(),
                deleted: true
            })
            .unwrap(),
            json!({"key": "last-run", "deleted": true})
        );
    }

    fn example_task() -> Value {
        json!({
            "repo": "/srv/work/shop",
            "task": "Add a test for the login redirect and make it pass.",
            "builder": "claude",
            "verifier": "codex",
            "acceptance": {"name": "unit tests", "command": "npm test"},
            "name": "login redirect test"
        })
    }

    #[test]
    fn tasks_create_example_round_trips() {
        let line = serde_json::to_string(
            &json!({"id": "t1", "method": "tasks.create", "params": example_task()}),
        )
        .unwrap();
        let Ok(Incoming::Request {
            method,
            params: Params::Object(params),
            ..
        }) = parse_line(line.as_bytes())
        else {
            panic!()
        };
        let Call::TasksCreate(req) = Call::parse(method, &params).unwrap() else {
            panic!()
        };
        assert_eq!(serde_json::to_value(&req).unwrap(), example_task());
        let started = TaskStarted {
            request_id: "plugin_3b0c5a52-6d0f-4f0e-9d5c-1f2a3b4c5d6e".into(),
            lane: "t-0c1d2e3f4a5b".into(),
            session: "s-4f9a1c2b7d3e".into(),
        };
        assert_eq!(
            serde_json::to_value(started).unwrap(),
            json!({"requestId": "plugin_3b0c5a52-6d0f-4f0e-9d5c-1f2a3b4c5d6e", "lane": "t-0c1d2e3f4a5b", "session": "s-4f9a1c2b7d3e"})
        );
    }

    fn with(member: &str, value: Value) -> Value {
        let mut t = example_task();
        t[member] = value;
        t
    }

    #[test]
    fn tasks_create_refuses() {
        let ok = |v: Value| assert!(parse(Method::TasksCreate, v.clone()).is_ok(), "{v}");
        ok(with("repo", json!("C:\\work\\shop")));
        ok(with("repo", json!("d:/work")));
        ok(with("task", json!("line one\n\tline two")));
        ok(with("base", json!("release/1.2")));
        ok(with("task", json!("x".repeat(4000))));
        for repo in [
            json!("//server/share"),
            json!("\\\\server\\share"),
            json!("relative/path"),
            json!("C:"),
            json!("/a\u{0}b"),
            json!("/a\u{200f}b"),
            json!("/a\u{2028}"),
            json!(format!("/{}", "a".repeat(4096))),
            json!(1),
        ] {
            assert!(refused(Method::TasksCreate, with("repo", repo)).starts_with("repo"));
        }
        for task in [
            "",
            "   \n\t ",
            "\u{3000}",
            "a\rb",
            "esc\u{1b}[2J",
            "bidi \u{202e}evil",
            "zero\u{200b}width",
            "tag\u{e0041}",
            "nel\u{85}",
            "ls\u{2028}",
        ] {
            assert!(
                refused(Method::TasksCreate, with("task", json!(task))).starts_with("task"),
                "{task:?}"
            );
        }
        refused(Method::TasksCreate, with("task", json!("x".repeat(4001))));
        refused(Method::TasksCreate, with("builder", json!("cla ude")));
        refused(Method::TasksCreate, with("verifier", json!("")));
        for acc in [
            json!({"name": "n"}),
            json!({"command": "c"}),
            json!({"name": " n", "command": "c"}),
            json!({"name": "n", "command": "   "}),
            json!({"name": "n", "command": "a\nb"}),
            json!({"name": "n", "command": "é"}),
            json!({"name": "n", "command": "c", "cwd": "/"}),
            json!({"name": "n", "command": "x".repeat(901)}),
            json!("npm test"),
        ] {
            assert!(
                refused(Method::TasksCreate, with("acceptance", acc)).starts_with("acceptance")
            );
        }
        for name in [
            json!(" lead"),
            json!("a/b"),
            json!("x".repeat(49)),
            json!(null),
        ] {
            refused(Method::TasksCreate, with("name", name));
        }
        for base in [json!("-x"), json!("a b"), json!("x".repeat(201))] {
            refused(Method::TasksCreate, with("base", base));
        }
        refused(Method::TasksCreate, with("priority", json!(1)));
        let mut t = example_task();
        t.as_object_mut().unwrap().remove("acceptance");
        assert_eq!(refused(Method::TasksCreate, t), "acceptance is required");
    }

    #[test]
    fn tasks_cancel() {
        assert_eq!(
            parse(Method::TasksCancel, json!({"id": "t1"})),
            Ok(Call::TasksCancel { id: "t1".into() })
        );
        refused(Method::TasksCancel, json!({"id": "a b"}));
        refused(Method::TasksCancel, json!({"id": 1}));
        refused(Method::TasksCancel, json!({}));
        assert_eq!(
            serde_json::to_value(TaskCancelled::new("plugin_x")).unwrap(),
            json!({"requestId": "plugin_x", "cancelled": true})
        );
    }

    #[test]
    fn a_task_request_becomes_the_lanes_dispatch_request() {
        let params = json!({"repo": "/srv/shop", "task": "Fix the login", "builder": "claude", "verifier": "codex",
            "acceptance": {"name": "tests", "command": "make test"}, "base": "main"});
        let Value::Object(m) = params else {
            unreachable!()
        };
        let d: crate::lanes::controller::DispatchRequest = task_request(&m).unwrap().into();
        assert_eq!(
            d,
            crate::lanes::controller::DispatchRequest {
                repo: "/srv/shop".into(),
                task: "Fix the login".into(),
                builder: "claude".into(),
                verifier: "codex".into(),
                acceptance_name: "tests".into(),
                acceptance_command: "make test".into(),
                name: None,
                base: Some("main".into()),
            }
        );
    }

    #[test]
    fn lane_results_match_the_page_example() {
        let lane = LaneItem {
            lane: "t-0c1d2e3f4a5b".into(),
            repo: "/srv/work/shop".into(),
            base: "main".into(),
            branch: "omni/fix-login".into(),
            worktree: "/srv/work/shop-wt/fix-login".into(),
            state: LaneState::Verified,
            stage: LaneStage::Pass,
            builder: LaneBuilder {
                session: Some("s-4f9a1c2b7d3e".into()),
                seat: LaneSeat {
                    harness: "claude".into(),
                    provider: "anthropic".into(),
                    family: Family::Anthropic,
                    model: Some("claude-fable-5-2".into()),
                },
            },
            verifier: LaneSeat {
                harness: "codex".into(),
                provider: "openai".into(),
                family: Family::Openai,
                model: Some("gpt-6-astra".into()),
            },
            verdict: Some(LaneVerdict {
                verdict: Verdict::Pass,
                commit: "9f2c4e6a8b0d1f3a5c7e9b1d3f5a7c9e0b2d4f6a".into(),
            }),
            head: Some("9f2c4e6a8b0d1f3a5c7e9b1d3f5a7c9e0b2d4f6a".into()),
            stale: false,
            created_at: "2026-11-14T09:12:43.870Z".into(),
        };
        assert!(is_lane_cursor(&lane.cursor()));
        let (line, _) = encode_page("2", "lanes", &[lane], false, LaneItem::cursor).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v["result"],
            json!({"lanes": [{"lane": "t-0c1d2e3f4a5b", "repo": "/srv/work/shop", "base": "main", "branch": "omni/fix-login", "worktree": "/srv/work/shop-wt/fix-login", "state": "verified", "stage": "pass",
                "builder": {"session": "s-4f9a1c2b7d3e", "harness": "claude", "provider": "anthropic", "family": "anthropic", "model": "claude-fable-5-2"},
                "verifier": {"harness": "codex", "provider": "openai", "family": "openai", "model": "gpt-6-astra"},
                "verdict": {"verdict": "pass", "commit": "9f2c4e6a8b0d1f3a5c7e9b1d3f5a7c9e0b2d4f6a"},
                "head": "9f2c4e6a8b0d1f3a5c7e9b1d3f5a7c9e0b2d4f6a", "stale": false, "createdAt": "2026-11-14T09:12:43.870Z"}], "nextCursor": null})
        );

        assert!(
            encode_response(
                "4",
                &StorageWritten {
                    key: "last-run".into(),
                    bytes: 24
                }
            )
            .is_ok()
        );
    }
}
