//! The plugin wire: the four message shapes, the host's error object, and the
//! lines the host writes (seed 000, "The four message shapes", "Calls the
//! host makes to a plugin", "What the host sends without being asked",
//! "Errors"; API 1.1 additions from issue seed 001).
//!
//! The host feeds every line a plugin wrote to [`parse_line`] and gets either
//! a typed [`Incoming`] message or a [`LineError`] that says what to do:
//! answer the line with a failure ([`LineError::Answer`]), or stop the plugin
//! with a fault ([`LineError::Fault`]). Everything the host writes is built by
//! the `encode_*` functions here, and by [`super::calls`] for results.
//!
//! Decisions where the page is silent:
//! - Line length: "at most 65,536 bytes" counts the JSON text without the line
//!   feed that ends it (the line feed is the frame, not the line). A reader
//!   therefore needs at most 65,537 bytes to see one line. Both directions use
//!   the same count.
//! - A line the host cannot answer is a fault of the plugin, `invalid-message`
//!   in the page's fault list: bytes that are not UTF-8, text that is not
//!   JSON, JSON that is not an object, a line without an `id` (plugins send no
//!   notifications in API 1.0 or 1.1), an `id` that is not a string matching
//!   the id pattern (a failure must repeat it, and may only repeat a valid
//!   one), and a response or failure that does not have its shape (answers
//!   are not answered). A line longer than the limit is the fault
//!   `oversized-line`.
//! - A line with a valid id that carries `method` or `params` is a request; if
//!   a member is missing, of the wrong type or unknown, the host answers
//!   `invalid-request`. A string method the host does not serve (including the
//!   four the host itself sends) gets `method-not-found`.
//! - The host checks, in this order: the shape ([`parse_line`]), whether the
//!   id is in use ([`HostError::id_in_use`]), `not-initialized`, the call's
//!   permission ([`Method::permission`], `permission-denied`), then the params
//!   ([`super::calls::Call::parse`], `invalid-params`), so a plugin learns
//!   nothing about a call it may not make.
//! - A message the host writes names no text of the plugin except a method
//!   name that matches the id pattern (as in the page's "Unknown method:
//!   storage.clear").

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::calls::{self, Call};
use super::text;
use crate::limits;

/// The API version this host speaks, sent as `api` in initialize.
pub const HOST_API: &str = "1.1";

/// The manifest `api` versions this host runs.
pub const RUNNABLE_APIS: &[&str] = &["1.0", "1.1"];

/// True when `id` matches `^[A-Za-z0-9_.:-]{1,64}$`, the id of a request.
pub fn is_wire_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= limits::PLUGIN_WIRE_ID_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// True when `code` matches `^[a-z]+(?:-[a-z]+)*$` and has at most 64
/// characters: an error code, or a task-refused reason.
pub fn is_error_code(code: &str) -> bool {
    code.len() <= limits::PLUGIN_ERROR_CODE_MAX
        && !code.is_empty()
        && code
            .split('-')
            .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
}

/// The id of the host's `n`th request to a plugin: `h-<n>`, which always
/// matches the id pattern.
pub fn host_request_id(n: u64) -> String {
    format!("h-{n}")
}

/// The permissions of the permission table, in its order (the derived `Ord`
/// is that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// `events.read`: events.subscribe, events.unsubscribe.
    EventsRead,
    /// `lists.read`: sessions.list, lanes.list, seats.list, sessions.get.
    ListsRead,
    /// `commands.add`: the manifest's commands, run through command.run.
    CommandsAdd,
    /// `storage.own`: storage.get, .set, .delete, .list.
    StorageOwn,
    /// `tasks.create`: tasks.create, tasks.cancel.
    TasksCreate,
}

impl Permission {
    /// Every permission, in table order.
    pub const ALL: [Permission; 5] = [
        Permission::EventsRead,
        Permission::ListsRead,
        Permission::CommandsAdd,
        Permission::StorageOwn,
        Permission::TasksCreate,
    ];

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            Permission::EventsRead => "events.read",
            Permission::ListsRead => "lists.read",
            Permission::CommandsAdd => "commands.add",
            Permission::StorageOwn => "storage.own",
            Permission::TasksCreate => "tasks.create",
        }
    }

    /// The permission of a wire name.
    pub fn from_name(name: &str) -> Option<Permission> {
        Permission::ALL.into_iter().find(|p| p.name() == name)
    }

    /// `list` without repeats, in table order, as initialize and
    /// plugin.approve carry it.
    pub fn table_order(list: &[Permission]) -> Vec<Permission> {
        let mut v = list.to_vec();
        v.sort();
        v.dedup();
        v
    }
}

impl Serialize for Permission {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A call a plugin makes to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `events.subscribe`
    EventsSubscribe,
    /// `events.unsubscribe`
    EventsUnsubscribe,
    /// `sessions.list`
    SessionsList,
    /// `sessions.get` (API 1.1)
    SessionsGet,
    /// `lanes.list`
    LanesList,
    /// `seats.list`
    SeatsList,
    /// `storage.get`
    StorageGet,
    /// `storage.set`
    StorageSet,
    /// `storage.delete`
    StorageDelete,
    /// `storage.list`
    StorageList,
    /// `tasks.create`
    TasksCreate,
    /// `tasks.cancel` (API 1.1)
    TasksCancel,
}

impl Method {
    /// Every call the host serves.
    pub const ALL: [Method; 12] = [
        Method::EventsSubscribe,
        Method::EventsUnsubscribe,
        Method::SessionsList,
        Method::SessionsGet,
        Method::LanesList,
        Method::SeatsList,
        Method::StorageGet,
        Method::StorageSet,
        Method::StorageDelete,
        Method::StorageList,
        Method::TasksCreate,
        Method::TasksCancel,
    ];

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            Method::EventsSubscribe => "events.subscribe",
            Method::EventsUnsubscribe => "events.unsubscribe",
            Method::SessionsList => "sessions.list",
            Method::SessionsGet => "sessions.get",
            Method::LanesList => "lanes.list",
            Method::SeatsList => "seats.list",
            Method::StorageGet => "storage.get",
            Method::StorageSet => "storage.set",
            Method::StorageDelete => "storage.delete",
            Method::StorageList => "storage.list",
            Method::TasksCreate => "tasks.create",
            Method::TasksCancel => "tasks.cancel",
        }
    }

    /// The call of a wire name; `None` for anything the host does not serve.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The permission the approved list must hold for this call.
    pub fn permission(self) -> Permission {
        match self {
            Method::EventsSubscribe | Method::EventsUnsubscribe => Permission::EventsRead,
            Method::SessionsList | Method::SessionsGet | Method::LanesList | Method::SeatsList => {
                Permission::ListsRead
            }
            Method::StorageGet
            | Method::StorageSet
            | Method::StorageDelete
            | Method::StorageList => Permission::StorageOwn,
            Method::TasksCreate | Method::TasksCancel => Permission::TasksCreate,
        }
    }

    /// True for the list calls the rate limit counts ("more than 10 list calls
    /// in the current second").
    pub fn is_list(self) -> bool {
        matches!(
            self,
            Method::SessionsList | Method::LanesList | Method::SeatsList
        )
    }
}

/// One line a plugin wrote, of a shape the host accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A call to the host; its params are checked by
    /// [`super::calls::Call::parse`] after the id and permission checks.
    Request {
        /// The plugin's id for the request.
        id: String,
        /// The call.
        method: Method,
        /// The params, not yet checked against the call, or the call when
        /// reading them could not have failed.
        params: Params,
    },
    /// The plugin's answer to a host request that succeeded.
    Response {
        /// The host's id the answer repeats.
        id: String,
        /// The result object.
        result: Map<String, Value>,
    },
    /// The plugin's answer to a host request that failed.
    Failure {
        /// The host's id the answer repeats.
        id: String,
        /// The plugin's error object.
        error: PluginError,
    },
}

/// A request's params as [`parse_line`] read them.
#[derive(Debug, Clone, PartialEq)]
pub enum Params {
    /// The params object, to be checked by [`super::calls::Call::parse`].
    Object(Map<String, Value>),
    /// The call itself, read straight from the line because its params
    /// were exactly what [`super::calls::Call::parse`] accepts (the
    /// `storage.get` and `storage.delete` of a well-formed key, and the
    /// `storage.set` of one with a value written without escapes and
    /// within the limit, issue 11):
    /// checking them later could find nothing wrong, so the order of the
    /// host's checks is kept.
    Checked(Call),
}

/// The error object of a plugin's failure, as the plugin sent it. `message`
/// may be long and hold any character; show it only through
/// [`PluginError::client_message`].
#[derive(Debug, Clone, PartialEq)]
pub struct PluginError {
    /// Matches `^[a-z]+(?:-[a-z]+)*$`, at most 64 characters.
    pub code: String,
    /// Text for a person, raw.
    pub message: String,
    /// The optional data object.
    pub data: Option<Map<String, Value>>,
}

impl PluginError {
    /// The message cleaned and cut to 500 characters, as a client may see it.
    pub fn client_message(&self) -> String {
        text::clean_failure_message(&self.message)
    }
}

/// A fault: the plugin broke the wire and the host stops it (seed 000, the
/// fault names of plugin.get's `lastExit.fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `oversized-line`: a line longer than 65,536 bytes.
    OversizedLine,
    /// `invalid-message`: a line that is none of the four shapes and cannot
    /// be answered.
    InvalidMessage,
}

impl Fault {
    /// The fault name as plugin.list and plugin.get give it.
    pub fn name(self) -> &'static str {
        match self {
            Fault::OversizedLine => "oversized-line",
            Fault::InvalidMessage => "invalid-message",
        }
    }
}

/// Why a line was not accepted, and what the host does about it.
#[derive(Debug, Clone, PartialEq)]
pub enum LineError {
    /// Answer with `encode_failure(id, error)` and read on.
    Answer {
        /// The request's id.
        id: String,
        /// What to answer.
        error: HostError,
    },
    /// Stop the plugin with this fault. `detail` is the host's own words for
    /// its log; it holds no text of the plugin.
    Fault {
        /// The fault.
        fault: Fault,
        /// What was wrong, for the log.
        detail: &'static str,
    },
}

fn fault(detail: &'static str) -> LineError {
    LineError::Fault {
        fault: Fault::InvalidMessage,
        detail,
    }
}

fn invalid_request(id: &str, message: &str) -> LineError {
    LineError::Answer {
        id: id.to_string(),
        error: HostError::new(HostErrorKind::InvalidRequest, message),
    }
}

/// Parses one line a plugin wrote. `line` may end with the line feed that
/// framed it; that one line feed is not counted against the limit.
pub fn parse_line(line: &[u8]) -> Result<Incoming, LineError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    if line.len() > limits::PLUGIN_MAX_LINE {
        return Err(LineError::Fault {
            fault: Fault::OversizedLine,
            detail: "a line longer than 65,536 bytes",
        });
    }
    let text = std::str::from_utf8(line).map_err(|_| fault("a line that is not UTF-8"))?;
    if let Some(request) = plain_request(text) {
        return Ok(request);
    }
    parse_text(text)
}

/// [`parse_line`] of any line, through a `Value` of the whole line.
fn parse_text(text: &str) -> Result<Incoming, LineError> {
    let value: Value = serde_json::from_str(text).map_err(|_| fault("a line that is not JSON"))?;
    let Value::Object(mut obj) = value else {
        return Err(fault("a line that is not a JSON object"));
    };
    let id = match obj.remove("id") {
        None => return Err(fault("a line without an id, which cannot be answered")),
        Some(Value::String(s)) if is_wire_id(&s) => s,
        Some(_) => return Err(fault("an id that is not a string of the id pattern")),
    };
    if obj.contains_key("method") || obj.contains_key("params") {
        return parse_request(id, obj);
    }
    match (obj.remove("result"), obj.remove("error")) {
        (Some(result), None) => {
            if !obj.is_empty() {
                return Err(fault("a response with a member other than id and result"));
            }
            match result {
                Value::Object(result) => Ok(Incoming::Response { id, result }),
                _ => Err(fault("a response whose result is not an object")),
            }
        }
        (None, Some(error)) => {
            if !obj.is_empty() {
                return Err(fault("a failure with a member other than id and error"));
            }
            let error = parse_plugin_error(error)
                .ok_or_else(|| fault("a failure whose error object is not valid"))?;
            Ok(Incoming::Failure { id, error })
        }
        (Some(_), Some(_)) => Err(fault("a line with both result and error")),
        (None, None) => Err(fault("a line that is none of the four shapes")),
    }
}

/// The members of a request, exactly these, the id and method as they
/// are written (no escapes).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlainRequest<'a> {
    id: &'a str,
    method: &'a str,
    #[serde(borrow)]
    params: &'a RawValue,
}

/// The params of a call that takes only a storage key, written without
/// escapes.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyParams<'a> {
    key: &'a str,
}

/// The params of a `storage.set`, both strings written without escapes.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SetParams<'a> {
    key: &'a str,
    value: &'a str,
}

/// The common line, a well-formed request of a method the host serves,
/// read straight into its parts (issue 11: most of the work of a
/// `storage.get` was building a `Value` of the whole line and taking it
/// apart, then a map of its params). Anything else, or any doubt (a member
/// twice, an escaped id), is `None`, and [`parse_line`] reads the line the
/// general way, which gives the same answer for every line this accepts
/// and says what is wrong with the others.
fn plain_request(text: &str) -> Option<Incoming> {
    // A derived struct is read from a JSON array too (its fields in
    // order), where the general reading wants an object: the line and its
    // params are taken this way only when they are objects.
    let object = |t: &str| {
        t.trim_start_matches([' ', '\t', '\n', '\r'])
            .starts_with('{')
    };
    if !object(text) {
        return None;
    }
    let r: PlainRequest = serde_json::from_str(text).ok()?;
    if !is_wire_id(r.id) {
        return None;
    }
    let method = Method::from_name(r.method)?;
    let params = r.params.get();
    if !object(params) {
        return None;
    }
    let key_call = |call: fn(String) -> Call| {
        serde_json::from_str::<KeyParams>(params)
            .ok()
            .filter(|p| calls::is_storage_key(p.key))
            .map(|p| call(p.key.to_string()))
    };
    let checked = match method {
        Method::StorageGet => key_call(|key| Call::StorageGet { key }),
        Method::StorageDelete => key_call(|key| Call::StorageDelete { key }),
        // The durable write of issue 4's figures: its params as a map were
        // about 2,000 of the reactor's 15,000 instructions a set.
        Method::StorageSet => serde_json::from_str::<SetParams>(params)
            .ok()
            .filter(|p| calls::is_storage_key(p.key) && calls::is_storage_value(p.value))
            .map(|p| Call::StorageSet {
                key: p.key.to_string(),
                value: p.value.to_string(),
            }),
        _ => None,
    };
    let params = match checked {
        Some(call) => Params::Checked(call),
        None => Params::Object(serde_json::from_str(params).ok()?),
    };
    Some(Incoming::Request {
        id: r.id.to_string(),
        method,
        params,
    })
}

fn parse_request(id: String, mut obj: Map<String, Value>) -> Result<Incoming, LineError> {
    let method = match obj.remove("method") {
        None => return Err(invalid_request(&id, "The request has no method")),
        Some(Value::String(m)) => m,
        Some(_) => {
            return Err(invalid_request(
                &id,
                "The request's method must be a string",
            ));
        }
    };
    let params = match obj.remove("params") {
        None => return Err(invalid_request(&id, "The request has no params")),
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Err(invalid_request(
                &id,
                "The request's params must be an object",
            ));
        }
    };
    if !obj.is_empty() {
        return Err(invalid_request(
            &id,
            "The request has a member other than id, method and params",
        ));
    }
    match Method::from_name(&method) {
        Some(method) => Ok(Incoming::Request {
            id,
            method,
            params: Params::Object(params),
        }),
        None => {
            let message = if is_wire_id(&method) {
                format!("Unknown method: {method}")
            } else {
                "Unknown method".to_string()
            };
            Err(LineError::Answer {
                id,
                error: HostError::new(HostErrorKind::MethodNotFound, &message),
            })
        }
    }
}

fn parse_plugin_error(error: Value) -> Option<PluginError> {
    let Value::Object(mut e) = error else {
        return None;
    };
    let code = match e.remove("code") {
        Some(Value::String(c))
            if c.chars().count() <= limits::PLUGIN_ERROR_CODE_MAX && is_error_code(&c) =>
        {
            c
        }
        _ => return None,
    };
    let message = match e.remove("message") {
        Some(Value::String(m)) => m,
        _ => return None,
    };
    let data = match e.remove("data") {
        None => None,
        Some(Value::Object(d)) => Some(d),
        Some(_) => return None,
    };
    if !e.is_empty() {
        return None;
    }
    Some(PluginError {
        code,
        message,
        data,
    })
}

/// Which storage limit a `quota-exceeded` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaLimit {
    /// `keys`: 128 keys.
    Keys,
    /// `bytes`: 1 MiB of values.
    Bytes,
}

impl QuotaLimit {
    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            QuotaLimit::Keys => "keys",
            QuotaLimit::Bytes => "bytes",
        }
    }
}

/// Why `tasks.cancel` found nothing to retract (API 1.1, `not-pending`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingState {
    /// The operator answered, or the request otherwise got its response.
    Answered,
    /// The request expired.
    Expired,
    /// An earlier tasks.cancel retracted it.
    Cancelled,
    /// The plugin never made a tasks.create request with that id in this run.
    Unknown,
}

impl PendingState {
    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            PendingState::Answered => "answered",
            PendingState::Expired => "expired",
            PendingState::Cancelled => "cancelled",
            PendingState::Unknown => "unknown",
        }
    }
}

/// The code of an error the host sends, with the data the codes that name
/// something carry. The type makes the page's rule hold: data exactly for
/// permission-denied, quota-exceeded, task-refused and (1.1) not-pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostErrorKind {
    /// `invalid-request`
    InvalidRequest,
    /// `method-not-found`
    MethodNotFound,
    /// `invalid-params`
    InvalidParams,
    /// `permission-denied`, naming the permission.
    PermissionDenied(Permission),
    /// `not-initialized`
    NotInitialized,
    /// `busy`
    Busy,
    /// `rate-limited`
    RateLimited,
    /// `result-too-large`
    ResultTooLarge,
    /// `quota-exceeded`, naming the limit.
    QuotaExceeded(QuotaLimit),
    /// `too-many-pending`
    TooManyPending,
    /// `approval-denied`
    ApprovalDenied,
    /// `approval-expired`
    ApprovalExpired,
    /// `task-refused`, with the daemon's code or `isolation-missing`. A
    /// reason that is not an error code makes the error `internal-error`.
    TaskRefused(String),
    /// `unavailable`
    Unavailable,
    /// `shutting-down`
    ShuttingDown,
    /// `internal-error`
    InternalError,
    /// `request-cancelled` (API 1.1): the tasks.create call was retracted.
    RequestCancelled,
    /// `not-pending` (API 1.1): tasks.cancel found nothing to retract.
    NotPending(PendingState),
    /// `not-found` (API 1.1): sessions.get names no session of the daemon
    /// (the page's code for a name that names nothing).
    NotFound,
}

impl HostErrorKind {
    /// The wire code.
    pub fn code(&self) -> &'static str {
        match self {
            HostErrorKind::InvalidRequest => "invalid-request",
            HostErrorKind::MethodNotFound => "method-not-found",
            HostErrorKind::InvalidParams => "invalid-params",
            HostErrorKind::PermissionDenied(_) => "permission-denied",
            HostErrorKind::NotInitialized => "not-initialized",
            HostErrorKind::Busy => "busy",
            HostErrorKind::RateLimited => "rate-limited",
            HostErrorKind::ResultTooLarge => "result-too-large",
            HostErrorKind::QuotaExceeded(_) => "quota-exceeded",
            HostErrorKind::TooManyPending => "too-many-pending",
            HostErrorKind::ApprovalDenied => "approval-denied",
            HostErrorKind::ApprovalExpired => "approval-expired",
            HostErrorKind::TaskRefused(_) => "task-refused",
            HostErrorKind::Unavailable => "unavailable",
            HostErrorKind::ShuttingDown => "shutting-down",
            HostErrorKind::InternalError => "internal-error",
            HostErrorKind::RequestCancelled => "request-cancelled",
            HostErrorKind::NotPending(_) => "not-pending",
            HostErrorKind::NotFound => "not-found",
        }
    }

    fn default_message(&self) -> String {
        match self {
            HostErrorKind::InvalidRequest => "The line is a request in name only".into(),
            HostErrorKind::MethodNotFound => "Unknown method".into(),
            HostErrorKind::InvalidParams => "The params do not fit the call".into(),
            HostErrorKind::PermissionDenied(p) => {
                format!("This plugin was not approved for {}", p.name())
            }
            HostErrorKind::NotInitialized => "The plugin has not answered initialize yet".into(),
            HostErrorKind::Busy => "16 requests of the plugin are unanswered".into(),
            HostErrorKind::RateLimited => "The plugin's budget of requests is empty".into(),
            HostErrorKind::ResultTooLarge => "The response would not fit on one line".into(),
            HostErrorKind::QuotaExceeded(QuotaLimit::Keys) => {
                "The plugin's folder holds 128 keys".into()
            }
            HostErrorKind::QuotaExceeded(QuotaLimit::Bytes) => {
                "The plugin's folder would hold more than 1 MiB".into()
            }
            HostErrorKind::TooManyPending => "3 task requests of the plugin are unanswered".into(),
            HostErrorKind::ApprovalDenied => "The operator did not allow the task".into(),
            HostErrorKind::ApprovalExpired => "The operator did not answer in 30 minutes".into(),
            HostErrorKind::TaskRefused(r) => format!("The daemon refused the task: {r}"),
            HostErrorKind::Unavailable => "The daemon could not do it now".into(),
            HostErrorKind::ShuttingDown => "The plugin is being stopped".into(),
            HostErrorKind::InternalError => INTERNAL_ERROR_MESSAGE.into(),
            HostErrorKind::RequestCancelled => "The plugin cancelled this request".into(),
            HostErrorKind::NotPending(s) => format!("The request is not pending: {}", s.name()),
            HostErrorKind::NotFound => "No such session".into(),
        }
    }
}

/// The one message of `internal-error`.
pub const INTERNAL_ERROR_MESSAGE: &str = "The host could not complete the request.";

/// An error the host sends to a plugin: valid against `hostError` by
/// construction (one line of at most 500 characters, no control character,
/// data only where the page allows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError {
    kind: HostErrorKind,
    message: String,
}

impl HostError {
    /// An error of `kind` with `message`, which is cleaned to one line and cut
    /// to 500 characters; an empty message becomes the code's default words.
    /// `internal-error` always carries its fixed message, and a task-refused
    /// reason that is not an error code turns the error into internal-error.
    pub fn new(kind: HostErrorKind, message: &str) -> HostError {
        let kind = match kind {
            HostErrorKind::TaskRefused(r) if !is_error_code(&r) => HostErrorKind::InternalError,
            k => k,
        };
        let message = if kind == HostErrorKind::InternalError {
            INTERNAL_ERROR_MESSAGE.to_string()
        } else {
            let cleaned = text::clean_line(message);
            let cut = text::cut_chars(cleaned.trim(), limits::PLUGIN_ERROR_MESSAGE_MAX);
            if cut.is_empty() {
                kind.default_message()
            } else {
                cut.to_string()
            }
        };
        HostError { kind, message }
    }

    /// An error of `kind` with the code's default message.
    pub fn of(kind: HostErrorKind) -> HostError {
        HostError::new(kind, "")
    }

    /// `internal-error` with its fixed message.
    pub fn internal() -> HostError {
        HostError::of(HostErrorKind::InternalError)
    }

    /// `invalid-params` with a one-line message naming the member.
    pub fn invalid_params(message: &str) -> HostError {
        HostError::new(HostErrorKind::InvalidParams, message)
    }

    /// `invalid-request` for a request whose id is in use.
    pub fn id_in_use() -> HostError {
        HostError::new(HostErrorKind::InvalidRequest, "The request's id is in use")
    }

    /// `permission-denied` for `permission`.
    pub fn permission_denied(permission: Permission) -> HostError {
        HostError::of(HostErrorKind::PermissionDenied(permission))
    }

    /// `result-too-large`.
    pub fn result_too_large() -> HostError {
        HostError::of(HostErrorKind::ResultTooLarge)
    }

    /// The kind, with its data.
    pub fn kind(&self) -> &HostErrorKind {
        &self.kind
    }

    /// The wire code.
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error object, as a failure carries it.
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("code".into(), Value::from(self.code()));
        o.insert("message".into(), Value::from(self.message.as_str()));
        let data = match &self.kind {
            HostErrorKind::PermissionDenied(p) => Some(("permission", p.name().to_string())),
            HostErrorKind::QuotaExceeded(l) => Some(("limit", l.name().to_string())),
            HostErrorKind::TaskRefused(r) => Some(("reason", r.clone())),
            HostErrorKind::NotPending(s) => Some(("state", s.name().to_string())),
            _ => None,
        };
        if let Some((k, v)) = data {
            let mut d = Map::new();
            d.insert(k.into(), Value::from(v));
            o.insert("data".into(), Value::Object(d));
        }
        Value::Object(o)
    }
}

fn line_of(value: &Value) -> String {
    // Serialising a Value whose keys are strings cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

/// True when `line` (without its line feed) fits the wire.
pub fn fits_line(line: &str) -> bool {
    line.len() <= limits::PLUGIN_MAX_LINE
}

/// A failure line answering the plugin's request `id`. It always fits: an id
/// is at most 64 bytes and a host message at most 500 characters.
pub fn encode_failure(id: &str, error: &HostError) -> String {
    let mut o = Map::new();
    o.insert("id".into(), Value::from(id));
    o.insert("error".into(), error.to_json());
    line_of(&Value::Object(o))
}

/// A response line answering the plugin's request `id` with `result`, or
/// `result-too-large` when the line would be longer than 65,536 bytes (send
/// it with [`encode_failure`]). A result that does not serialise to an object
/// is the host's own defect and gives `internal-error`.
///
/// The line is written in one pass straight from `result`, not through a
/// `serde_json::Value` (which built a map of every member, allocated each
/// key and value, and sorted them, on every answer): the members keep the
/// order the result type declares.
pub fn encode_response<T: Serialize>(id: &str, result: &T) -> Result<String, HostError> {
    let mut line = Vec::with_capacity(128);
    line.extend_from_slice(b"{\"id\":");
    serde_json::to_writer(&mut line, id).map_err(|_| HostError::internal())?;
    line.extend_from_slice(b",\"result\":");
    let at = line.len();
    serde_json::to_writer(&mut line, result).map_err(|_| HostError::internal())?;
    if line.get(at) != Some(&b'{') {
        return Err(HostError::internal());
    }
    line.push(b'}');
    // serde_json writes UTF-8 only.
    let line = String::from_utf8(line).map_err(|_| HostError::internal())?;
    if fits_line(&line) {
        Ok(line)
    } else {
        Err(HostError::result_too_large())
    }
}

/// The answer to a `storage.get`: byte for byte the line
/// [`encode_response`] makes of a [`super::calls::StorageValue`], written
/// straight from the borrowed key and value (issue 11: the value's copy
/// and serde_json's escape check, a table look-up a byte, were the largest
/// parts of a get). One allocation, sized for the line and its line feed.
pub fn encode_storage_value(id: &str, key: &str, value: Option<&str>) -> Result<String, HostError> {
    let mut line = String::with_capacity(48 + id.len() + key.len() + value.map_or(4, str::len));
    line.push_str("{\"id\":");
    push_json_str(&mut line, id)?;
    line.push_str(",\"result\":{\"key\":");
    push_json_str(&mut line, key)?;
    line.push_str(",\"value\":");
    match value {
        Some(v) => push_json_str(&mut line, v)?,
        None => line.push_str("null"),
    }
    line.push_str("}}");
    if fits_line(&line) {
        Ok(line)
    } else {
        Err(HostError::result_too_large())
    }
}

/// Appends `s` as a JSON string. Text with nothing to escape (no control
/// character, quote or backslash) goes as it is, which is what serde_json
/// writes for it; the check runs 16 bytes at a time with no early exit
/// inside a block, so that it compiles to vector compares. Other text goes
/// through serde_json, so every escape is the one it writes elsewhere.
fn push_json_str(out: &mut String, s: &str) -> Result<(), HostError> {
    fn escapes(block: &[u8]) -> bool {
        block.iter().fold(0u8, |acc, &b| {
            acc | u8::from(b < 0x20) | u8::from(b == b'"') | u8::from(b == b'\\')
        }) != 0
    }
    let mut blocks = s.as_bytes().chunks_exact(16);
    let rest = blocks.remainder();
    let plain = !escapes(rest) && !blocks.any(escapes);
    if plain {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).map_err(|_| HostError::internal())?);
    }
    Ok(())
}

/// One page of a list call, fitted to the line: as many of `items` (from the
/// first) as fit, under the result member `member`, with `nextCursor` the
/// cursor of the last item sent when items were left out or `more` says the
/// daemon has more, and null otherwise. Returns the line and how many items
/// it holds. `result-too-large` when not even one item fits.
pub fn encode_page<T: Serialize>(
    id: &str,
    member: &str,
    items: &[T],
    more: bool,
    cursor_of: impl Fn(&T) -> String,
) -> Result<(String, usize), HostError> {
    // Serialise each item once; the page is these texts joined by commas, so
    // its length is known for every count without encoding it again.
    let mut texts = Vec::with_capacity(items.len());
    for item in items {
        texts.push(serde_json::to_string(item).map_err(|_| HostError::internal())?);
    }
    let id_json = line_of(&Value::from(id));
    let member_json = line_of(&Value::from(member));
    let build = |n: usize| -> String {
        let last = n.checked_sub(1).and_then(|i| items.get(i));
        let cursor = match last {
            Some(last) if n < items.len() || more => line_of(&Value::from(cursor_of(last))),
            _ => "null".to_string(),
        };
        format!(
            "{{\"id\":{id_json},\"result\":{{{member_json}:[{}],\"nextCursor\":{cursor}}}}}",
            texts[..n].join(",")
        )
    };
    // The fixed part, with room for the longest cursor any item would give,
    // then items while they fit.
    let fixed =
        format!("{{\"id\":{id_json},\"result\":{{{member_json}:[],\"nextCursor\":}}}}").len();
    let longest_cursor = items
        .iter()
        .map(|i| line_of(&Value::from(cursor_of(i))).len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut used = fixed + longest_cursor;
    let mut n = 0;
    for (i, t) in texts.iter().enumerate() {
        let add = t.len() + usize::from(i > 0);
        if used + add > limits::PLUGIN_MAX_LINE {
            break;
        }
        used += add;
        n += 1;
    }
    if n == 0 && !items.is_empty() {
        return Err(HostError::result_too_large());
    }
    let line = build(n);
    if fits_line(&line) {
        Ok((line, n))
    } else {
        Err(HostError::result_too_large())
    }
}

/// `platform` of initialize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// `linux`
    Linux,
    /// `macos`
    Macos,
    /// `windows`
    Windows,
}

impl Platform {
    /// The platform this binary was built for; any other unix reports
    /// `linux`, the closest of the three.
    pub fn current() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::Macos
        } else if cfg!(windows) {
            Platform::Windows
        } else {
            Platform::Linux
        }
    }

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Linux => "linux",
            Platform::Macos => "macos",
            Platform::Windows => "windows",
        }
    }
}

/// `reason` of shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownReason {
    /// `daemon-stop`
    DaemonStop,
    /// `disabled`
    Disabled,
    /// `removed`
    Removed,
    /// `updated`
    Updated,
}

impl ShutdownReason {
    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            ShutdownReason::DaemonStop => "daemon-stop",
            ShutdownReason::Disabled => "disabled",
            ShutdownReason::Removed => "removed",
            ShutdownReason::Updated => "updated",
        }
    }
}

/// The params of initialize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Initialize {
    /// The platform.
    pub platform: Platform,
    /// The plugin's id, from its approved manifest.
    pub plugin_id: String,
    /// The plugin's version, from its approved manifest.
    pub plugin_version: String,
    /// The approved permissions, in any order; sent in table order.
    pub permissions: Vec<Permission>,
}

/// A request the host sends to a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRequest {
    /// `initialize`: api is [`HOST_API`], hostVersion this crate's version.
    Initialize(Initialize),
    /// `ping`
    Ping,
    /// `command.run`; `input` is present exactly when the manifest gives the
    /// command input text. The daemon checked both against plugin.command.run.
    CommandRun {
        /// The command's id inside the plugin.
        command: String,
        /// The line the operator typed.
        input: Option<String>,
    },
    /// `shutdown`
    Shutdown(ShutdownReason),
}

impl HostRequest {
    /// The method name.
    pub fn method(&self) -> &'static str {
        match self {
            HostRequest::Initialize(_) => "initialize",
            HostRequest::Ping => "ping",
            HostRequest::CommandRun { .. } => "command.run",
            HostRequest::Shutdown(_) => "shutdown",
        }
    }

    fn params(&self) -> Value {
        let mut p = Map::new();
        match self {
            HostRequest::Initialize(i) => {
                p.insert("api".into(), Value::from(HOST_API));
                p.insert("hostVersion".into(), Value::from(env!("CARGO_PKG_VERSION")));
                p.insert("platform".into(), Value::from(i.platform.name()));
                let mut plugin = Map::new();
                plugin.insert("id".into(), Value::from(i.plugin_id.as_str()));
                plugin.insert("version".into(), Value::from(i.plugin_version.as_str()));
                p.insert("plugin".into(), Value::Object(plugin));
                let perms = Permission::table_order(&i.permissions)
                    .into_iter()
                    .map(|x| Value::from(x.name()))
                    .collect();
                p.insert("permissions".into(), Value::Array(perms));
            }
            HostRequest::Ping => {}
            HostRequest::CommandRun { command, input } => {
                p.insert("command".into(), Value::from(command.as_str()));
                if let Some(input) = input {
                    p.insert("input".into(), Value::from(input.as_str()));
                }
            }
            HostRequest::Shutdown(r) => {
                p.insert("reason".into(), Value::from(r.name()));
            }
        }
        Value::Object(p)
    }

    /// The request line with the host's id `id` (see [`host_request_id`]).
    /// Every host request is bounded far below the line limit.
    pub fn encode(&self, id: &str) -> String {
        let mut o = Map::new();
        o.insert("id".into(), Value::from(id));
        o.insert("method".into(), Value::from(self.method()));
        o.insert("params".into(), self.params());
        line_of(&Value::Object(o))
    }
}

/// The event kinds of API 1.0 (unchanged in 1.1), in the order of the kind
/// list (the derived `Ord` is that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// `session.start`
    SessionStart,
    /// `session.end`
    SessionEnd,
    /// `turn.start`
    TurnStart,
    /// `turn.end`
    TurnEnd,
    /// `approval.request`
    ApprovalRequest,
    /// `approval.resolved`
    ApprovalResolved,
    /// `lane.start`
    LaneStart,
    /// `lane.stage`
    LaneStage,
    /// `lane.verdict`
    LaneVerdict,
}

impl EventKind {
    /// Every kind, in the order of the kind list.
    pub const ALL: [EventKind; 9] = [
        EventKind::SessionStart,
        EventKind::SessionEnd,
        EventKind::TurnStart,
        EventKind::TurnEnd,
        EventKind::ApprovalRequest,
        EventKind::ApprovalResolved,
        EventKind::LaneStart,
        EventKind::LaneStage,
        EventKind::LaneVerdict,
    ];

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::SessionStart => "session.start",
            EventKind::SessionEnd => "session.end",
            EventKind::TurnStart => "turn.start",
            EventKind::TurnEnd => "turn.end",
            EventKind::ApprovalRequest => "approval.request",
            EventKind::ApprovalResolved => "approval.resolved",
            EventKind::LaneStart => "lane.start",
            EventKind::LaneStage => "lane.stage",
            EventKind::LaneVerdict => "lane.verdict",
        }
    }

    /// The kind of a wire name.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// True for the lane kinds, whose events carry `lane`; the others carry
    /// `session`.
    pub fn is_lane(self) -> bool {
        matches!(
            self,
            EventKind::LaneStart | EventKind::LaneStage | EventKind::LaneVerdict
        )
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The params of one `event` notification. `subject` is the session id for a
/// session kind and the lane id for a lane kind; `data` is the kind's data
/// object as the page gives it (the core builds it from its own event).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The kind.
    pub kind: EventKind,
    /// When the daemon recorded it, in the daemon's time form.
    pub ts: String,
    /// Its number in its ledger stream, at least 1.
    pub seq: u64,
    /// The session id or lane id, by kind.
    pub subject: String,
    /// The kind's data object.
    pub data: Map<String, Value>,
}

/// An `event` notification line, or `None` when it would not fit one line
/// (events of the page's shapes always fit; the host counts such an event as
/// dropped).
pub fn encode_event(event: &Event) -> Option<String> {
    let mut p = Map::new();
    p.insert("kind".into(), Value::from(event.kind.name()));
    p.insert("ts".into(), Value::from(event.ts.as_str()));
    p.insert("seq".into(), Value::from(event.seq));
    let subject = if event.kind.is_lane() {
        "lane"
    } else {
        "session"
    };
    p.insert(subject.into(), Value::from(event.subject.as_str()));
    p.insert("data".into(), Value::Object(event.data.clone()));
    let line = encode_notification("event", p);
    fits_line(&line).then_some(line)
}

/// An `events.dropped` notification line; `count` is at least 1.
pub fn encode_events_dropped(count: u64) -> String {
    let mut p = Map::new();
    p.insert("count".into(), Value::from(count.max(1)));
    encode_notification("events.dropped", p)
}

fn encode_notification(method: &str, params: Map<String, Value>) -> String {
    let mut o = Map::new();
    o.insert("method".into(), Value::from(method));
    o.insert("params".into(), Value::Object(params));
    line_of(&Value::Object(o))
}

/// True when `api` matches `^[1-9][0-9]{0,3}\.(?:0|[1-9][0-9]{0,3})$`.
pub fn is_api_version(api: &str) -> bool {
    let Some((major, minor)) = api.split_once('.') else {
        return false;
    };
    let number = |s: &str, zero: bool| {
        !s.is_empty()
            && s.len() <= 4
            && s.bytes().all(|b| b.is_ascii_digit())
            && (!s.starts_with('0') || (zero && s == "0"))
    };
    number(major, false) && number(minor, true)
}

/// Why a plugin's answer to a host request is not valid: for initialize the
/// host stops the plugin with the fault `initialize-failed`; for command.run
/// the daemon answers `plugin-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidAnswer(pub &'static str);

/// The plugin's result of initialize: its `api`, the only member. The host
/// then compares it with the manifest's api (`api-mismatch` when they
/// differ).
pub fn parse_initialize_result(result: &Map<String, Value>) -> Result<String, InvalidAnswer> {
    if result.len() != 1 {
        return Err(InvalidAnswer("initialize result must hold api only"));
    }
    match result.get("api") {
        Some(Value::String(api)) if is_api_version(api) => Ok(api.clone()),
        _ => Err(InvalidAnswer(
            "initialize result's api is not an API version",
        )),
    }
}

/// The plugin's result of command.run: its raw `text` (at most 16,384
/// characters), the only member. Show it only through
/// [`text::clean_command_text`].
pub fn parse_command_result(result: &Map<String, Value>) -> Result<String, InvalidAnswer> {
    if result.len() != 1 {
        return Err(InvalidAnswer("command.run result must hold text only"));
    }
    match result.get("text") {
        Some(Value::String(t)) if t.chars().count() <= limits::PLUGIN_COMMAND_TEXT_MAX => {
            Ok(t.clone())
        }
        Some(Value::String(_)) => Err(InvalidAnswer(
            "command.run text is longer than 16384 characters",
        )),
        _ => Err(InvalidAnswer("command.run result's text is not a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(r: Result<Incoming, LineError>) -> (String, String) {
        match r {
            Err(LineError::Answer { id, error }) => (id, error.code().to_string()),
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    fn fault_of(r: Result<Incoming, LineError>) -> Fault {
        match r {
            Err(LineError::Fault { fault, .. }) => fault,
            other => panic!("expected a fault, got {other:?}"),
        }
    }

    #[test]
    fn the_plain_request_reading_agrees_with_the_general_one() {
        let lines = [
            r#"{"id":"b1","method":"storage.get","params":{"key":"k0"}}"#,
            r#"{"params":{"key":"k0","x":[1,2.5,null]},"method":"storage.set","id":"b:2"}"#,
            r#"{"id":"d1","method":"storage.delete","params":{"key":"0.a_b-c"}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"value":"v é","key":"k0"}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"key":"k0","value":""}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"key":"k0","value":"a\nb"}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"key":"k0","value":"a","value":"b"}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"key":"k0","value":"a","x":1}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"key":"-k","value":"a"}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"key":"k0","value":3}}"#,
            r#"{"id":"s1","method":"storage.set","params":{"key":"k0"}}"#,
            r#"{"id":"b1","method":"storage.get","params":{"key":"K0"}}"#,
            r#"{"id":"b1","method":"storage.get","params":{"key":"k\u0030"}}"#,
            r#"{"id":"b1","method":"storage.get","params":{"key":"k0","key":"k1"}}"#,
            r#"{"id":"b1","method":"storage.get","params":{"key":"k0","other":1}}"#,
            r#"{"id":"b1","method":"storage.get","params":{"key":7}}"#,
            r#"{"id":"b1","method":"storage.get","params":{"key":"a"},"params":{"key":"b"}}"#,
            r#"{"id":"b\u0031","method":"storage.get","params":{}}"#,
            r#"{"id":"b1","method":"storage.clear","params":{}}"#,
            r#"{"id":"b1","method":"initialize","params":{}}"#,
            r#"{"id":"b1","method":"storage.get","params":{},"extra":1}"#,
            r#"{"id":"b1","method":"storage.get","params":[]}"#,
            r#"{"id":"b 1","method":"storage.get","params":{}}"#,
            r#"{"id":"b1","method":"storage.get"}"#,
            r#"{"id":"b1","method":"storage.get","params":{}} x"#,
            // Arrays: a derived struct reads one as its fields in order.
            r#"{"id":"s1","method":"storage.set","params":["k0","v"]}"#,
            r#"{"id":"b1","method":"storage.get","params":["k0"]}"#,
            r#"["s1","storage.set",{"key":"k0","value":"v"}]"#,
            r#" ["s1","storage.get",{"key":"k0"}]"#,
        ];
        // What the host ends up with: the call, or why the params are
        // refused, whichever way the params were read.
        let called = |r: Result<Incoming, LineError>| match r {
            Ok(Incoming::Request { id, method, params }) => Ok((
                id,
                match params {
                    Params::Checked(call) => Ok(call),
                    Params::Object(p) => Call::parse(method, &p),
                },
            )),
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(format!("{e:?}")),
        };
        let mut plain = 0;
        let mut checked = 0;
        for line in lines {
            let general = called(parse_text(line));
            if let Some(r) = plain_request(line) {
                plain += 1;
                checked += matches!(
                    &r,
                    Incoming::Request {
                        params: Params::Checked(_),
                        ..
                    }
                ) as usize;
                assert_eq!(called(Ok(r)), general, "{line}");
            }
            assert_eq!(called(parse_line(line.as_bytes())), general, "{line}");
        }
        // The first sixteen are read the plain way: the storage.get,
        // storage.delete and storage.sets of a good key and an unescaped
        // value into their call, the others into a map of params that
        // Call::parse refuses or reads as the general way does; the rest
        // fall back.
        assert_eq!((plain, checked), (16, 4));
        // A value past the limit, in characters and not only in bytes, is
        // left to Call::parse, which refuses it.
        let e = |n| "e".repeat(n);
        let é = |n| "é".repeat(n);
        for (value, fits) in [
            (é(16_385), false),
            (e(16_385), false),
            (é(16_384), true),
            (e(16_384), true),
            (e(16_383) + "é", true),
        ] {
            let line = format!(
                r#"{{"id":"s1","method":"storage.set","params":{{"key":"k0","value":"{value}"}}}}"#
            );
            let general = called(parse_text(&line));
            let plain = plain_request(&line).expect("a plain request");
            // Read into its call only when it fits; past the limit its map
            // goes to Call::parse, which refuses it.
            let checked = matches!(
                &plain,
                Incoming::Request {
                    params: Params::Checked(_),
                    ..
                }
            );
            assert_eq!(checked, fits, "{} chars", value.chars().count());
            assert_eq!(called(Ok(plain)), general);
            assert_eq!(general.map(|(_, call)| call.is_ok()), Ok(fits));
        }
    }

    #[test]
    fn page_examples_parse() {
        let r = parse_line(br#"{"id":"1","method":"events.subscribe","params":{"kinds":["turn.end","lane.verdict"]}}"#);
        match r {
            Ok(Incoming::Request { id, method, params }) => {
                assert_eq!(id, "1");
                assert_eq!(method, Method::EventsSubscribe);
                assert_eq!(
                    params,
                    Params::Object(
                        json!({"kinds": ["turn.end", "lane.verdict"]})
                            .as_object()
                            .unwrap()
                            .clone()
                    )
                );
            }
            other => panic!("{other:?}"),
        }
        let r = parse_line(b"{\"id\":\"h-1\",\"result\":{\"api\":\"1.0\"}}\n").unwrap();
        let Incoming::Response { id, result } = r else {
            panic!()
        };
        assert_eq!(id, "h-1");
        assert_eq!(parse_initialize_result(&result), Ok("1.0".to_string()));
        let r = parse_line(br#"{"id":"9","error":{"code":"method-not-found","message":"Unknown method: storage.clear"}}"#);
        let Ok(Incoming::Failure { id, error }) = r else {
            panic!()
        };
        assert_eq!(
            (id.as_str(), error.code.as_str()),
            ("9", "method-not-found")
        );
    }

    #[test]
    fn unknown_methods_are_method_not_found() {
        let (id, code) = answer(parse_line(
            br#"{"id":"9","method":"storage.clear","params":{}}"#,
        ));
        assert_eq!((id.as_str(), code.as_str()), ("9", "method-not-found"));
        let r = parse_line(br#"{"id":"9","method":"storage.clear","params":{}}"#);
        let Err(LineError::Answer { error, .. }) = r else {
            panic!()
        };
        assert_eq!(
            encode_failure("9", &error),
            r#"{"error":{"code":"method-not-found","message":"Unknown method: storage.clear"},"id":"9"}"#
        );
        // The host's own methods are not served to a plugin.
        for m in ["initialize", "ping", "command.run", "shutdown", "event"] {
            let line = format!(r#"{{"id":"2","method":"{m}","params":{{}}}}"#);
            assert_eq!(answer(parse_line(line.as_bytes())).1, "method-not-found");
        }
        // A method that is not a safe name is not echoed.
        let r = parse_line("{\"id\":\"2\",\"method\":\"a\\nb\",\"params\":{}}".as_bytes());
        let Err(LineError::Answer { error, .. }) = r else {
            panic!()
        };
        assert_eq!(error.message(), "Unknown method");
    }

    #[test]
    fn requests_in_name_only_are_invalid_request() {
        for line in [
            r#"{"id":"3","params":{}}"#,
            r#"{"id":"3","method":"storage.list"}"#,
            r#"{"id":"3","method":7,"params":{}}"#,
            r#"{"id":"3","method":"storage.list","params":[]}"#,
            r#"{"id":"3","method":"storage.list","params":null}"#,
            r#"{"id":"3","method":"storage.list","params":{},"extra":1}"#,
            r#"{"id":"3","method":"storage.list","params":{},"result":{}}"#,
            r#"{"id":"3","method":"storage.list","params":{},"jsonrpc":"2.0"}"#,
        ] {
            assert_eq!(
                answer(parse_line(line.as_bytes())),
                ("3".into(), "invalid-request".into()),
                "{line}"
            );
        }
        assert_eq!(HostError::id_in_use().code(), "invalid-request");
    }

    #[test]
    fn hostile_lines_are_faults() {
        let big = format!(
            r#"{{"id":"1","method":"storage.list","params":{{"x":"{}"}}}}"#,
            "a".repeat(70_000)
        );
        assert_eq!(fault_of(parse_line(big.as_bytes())), Fault::OversizedLine);
        assert_eq!(
            fault_of(parse_line(b"{\"id\":\"1\",\"result\":{\"t\":\"\xff\"}}")),
            Fault::InvalidMessage
        );
        for line in [
            "",
            "not json",
            "[1,2]",
            "\"id\"",
            "null",
            r#"{"method":"event","params":{}}"#,
            r#"{"method":"storage.list","params":{}}"#,
            r#"{"id":1,"method":"storage.list","params":{}}"#,
            r#"{"id":"","method":"storage.list","params":{}}"#,
            r#"{"id":"a b","method":"storage.list","params":{}}"#,
            r#"{"id":"ä","method":"storage.list","params":{}}"#,
            r#"{"id":"1"}"#,
            r#"{"id":"1","result":[]}"#,
            r#"{"id":"1","result":{},"extra":true}"#,
            r#"{"id":"1","result":{},"error":{"code":"x","message":""}}"#,
            r#"{"id":"1","error":{"code":"Bad","message":""}}"#,
            r#"{"id":"1","error":{"code":"a--b","message":""}}"#,
            r#"{"id":"1","error":{"code":"x","message":3}}"#,
            r#"{"id":"1","error":{"code":"x","message":"m","data":[]}}"#,
            r#"{"id":"1","error":{"code":"x","message":"m","stack":"..."}}"#,
            r#"{"id":"1","error":"boom"}"#,
        ] {
            assert_eq!(
                fault_of(parse_line(line.as_bytes())),
                Fault::InvalidMessage,
                "{line}"
            );
        }
        let long_id = format!(
            r#"{{"id":"{}","method":"storage.list","params":{{}}}}"#,
            "a".repeat(65)
        );
        assert_eq!(
            fault_of(parse_line(long_id.as_bytes())),
            Fault::InvalidMessage
        );
        let code65 = format!(
            r#"{{"id":"1","error":{{"code":"{}","message":""}}}}"#,
            "a".repeat(65)
        );
        assert_eq!(
            fault_of(parse_line(code65.as_bytes())),
            Fault::InvalidMessage
        );
    }

    #[test]
    fn line_limit_excludes_the_line_feed() {
        let prefix = r#"{"id":"1","result":{"t":""#;
        let pad = limits::PLUGIN_MAX_LINE - prefix.len() - 3;
        let line = format!("{prefix}{}\"}}}}", "a".repeat(pad));
        assert_eq!(line.len(), limits::PLUGIN_MAX_LINE);
        assert!(parse_line(line.as_bytes()).is_ok());
        assert!(parse_line(format!("{line}\n").as_bytes()).is_ok());
        let over = format!("{prefix}{}\"}}}}", "a".repeat(pad + 1));
        assert_eq!(fault_of(parse_line(over.as_bytes())), Fault::OversizedLine);
    }

    #[test]
    fn plugin_failure_messages_are_cleaned_for_clients() {
        let long = format!("{}\nsecond line\u{202e}", "m".repeat(600));
        let line = serde_json::to_string(
            &json!({"id": "h-2", "error": {"code": "boom", "message": long, "data": {"x": 1}}}),
        )
        .unwrap();
        let Ok(Incoming::Failure { error, .. }) = parse_line(line.as_bytes()) else {
            panic!()
        };
        let shown = error.client_message();
        assert_eq!(shown.chars().count(), 500);
        assert!(!shown.chars().any(|c| c.is_control()));
    }

    #[test]
    fn host_errors_have_the_page_shape() {
        let e = HostError::permission_denied(Permission::TasksCreate);
        assert_eq!(
            e.to_json(),
            json!({"code": "permission-denied", "message": "This plugin was not approved for tasks.create", "data": {"permission": "tasks.create"}})
        );
        let e = HostError::of(HostErrorKind::QuotaExceeded(QuotaLimit::Keys));
        assert_eq!(
            e.to_json(),
            json!({"code": "quota-exceeded", "message": "The plugin's folder holds 128 keys", "data": {"limit": "keys"}})
        );
        let e = HostError::of(HostErrorKind::TaskRefused(
            "registry-pending-approval".into(),
        ));
        assert_eq!(
            e.to_json(),
            json!({"code": "task-refused", "message": "The daemon refused the task: registry-pending-approval", "data": {"reason": "registry-pending-approval"}})
        );
        assert_eq!(
            HostError::of(HostErrorKind::TaskRefused("Not A Code".into())).code(),
            "internal-error"
        );
        let e = HostError::of(HostErrorKind::NotPending(PendingState::Expired));
        assert_eq!(e.to_json()["data"], json!({"state": "expired"}));
        assert_eq!(
            HostError::of(HostErrorKind::RequestCancelled)
                .to_json()
                .get("data"),
            None
        );
        let e = HostError::new(HostErrorKind::InternalError, "disk said: /var/lib/x");
        assert_eq!(e.message(), INTERNAL_ERROR_MESSAGE);
        let e = HostError::new(
            HostErrorKind::InvalidParams,
            &format!("a\nb\u{7f}{}", "x".repeat(900)),
        );
        assert_eq!(e.message().chars().count(), 500);
        assert!(!e.message().chars().any(|c| c.is_control()));
        assert_eq!(
            encode_failure(
                "1",
                &HostError::new(
                    HostErrorKind::RateLimited,
                    "More than 50 requests a second for too long"
                )
            ),
            r#"{"error":{"code":"rate-limited","message":"More than 50 requests a second for too long"},"id":"1"}"#
        );
        // Every code the page lists, plus 1.1's three.
        let kinds = [
            HostErrorKind::InvalidRequest,
            HostErrorKind::MethodNotFound,
            HostErrorKind::InvalidParams,
            HostErrorKind::PermissionDenied(Permission::EventsRead),
            HostErrorKind::NotInitialized,
            HostErrorKind::Busy,
            HostErrorKind::RateLimited,
            HostErrorKind::ResultTooLarge,
            HostErrorKind::QuotaExceeded(QuotaLimit::Bytes),
            HostErrorKind::TooManyPending,
            HostErrorKind::ApprovalDenied,
            HostErrorKind::ApprovalExpired,
            HostErrorKind::TaskRefused("isolation-missing".into()),
            HostErrorKind::Unavailable,
            HostErrorKind::ShuttingDown,
            HostErrorKind::InternalError,
            HostErrorKind::RequestCancelled,
            HostErrorKind::NotPending(PendingState::Unknown),
            HostErrorKind::NotFound,
        ];
        for k in kinds {
            let e = HostError::of(k);
            assert!(is_error_code(e.code()));
            let m = e.message();
            assert!(
                !m.is_empty()
                    && m.chars().count() <= 500
                    && !m.chars().any(|c| c <= '\u{1f}' || c == '\u{7f}')
            );
        }
    }

    #[test]
    fn host_requests_match_the_page() {
        let init = HostRequest::Initialize(Initialize {
            platform: Platform::Linux,
            plugin_id: "night-shift".into(),
            plugin_version: "1.2.0".into(),
            permissions: vec![
                Permission::StorageOwn,
                Permission::EventsRead,
                Permission::StorageOwn,
            ],
        });
        let v: Value = serde_json::from_str(&init.encode("h-1")).unwrap();
        assert_eq!(
            v,
            json!({"id": "h-1", "method": "initialize", "params": {
                "api": "1.1", "hostVersion": env!("CARGO_PKG_VERSION"), "platform": "linux",
                "plugin": {"id": "night-shift", "version": "1.2.0"},
                "permissions": ["events.read", "storage.own"]}})
        );
        let v: Value =
            serde_json::from_str(&HostRequest::Shutdown(ShutdownReason::Disabled).encode("h-1"))
                .unwrap();
        assert_eq!(
            v,
            json!({"id": "h-1", "method": "shutdown", "params": {"reason": "disabled"}})
        );
        let v: Value =
            serde_json::from_str(&HostRequest::Ping.encode(&host_request_id(7))).unwrap();
        assert_eq!(v, json!({"id": "h-7", "method": "ping", "params": {}}));
        let run = HostRequest::CommandRun {
            command: "note".into(),
            input: Some("check the flaky login test".into()),
        };
        let v: Value = serde_json::from_str(&run.encode("h-2")).unwrap();
        assert_eq!(
            v["params"],
            json!({"command": "note", "input": "check the flaky login test"})
        );
        let run = HostRequest::CommandRun {
            command: "summary".into(),
            input: None,
        };
        let v: Value = serde_json::from_str(&run.encode("h-3")).unwrap();
        assert_eq!(v["params"], json!({"command": "summary"}));
        assert!(is_wire_id(&host_request_id(u64::MAX)));
    }

    #[test]
    fn notifications_match_the_page() {
        let data = json!({"reason": "completed"}).as_object().unwrap().clone();
        let e = Event {
            kind: EventKind::TurnEnd,
            ts: "2026-11-14T09:31:07.412Z".into(),
            seq: 58,
            subject: "s-4f9a1c2b7d3e".into(),
            data,
        };
        let v: Value = serde_json::from_str(&encode_event(&e).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"method": "event", "params": {"kind": "turn.end", "ts": "2026-11-14T09:31:07.412Z", "seq": 58, "session": "s-4f9a1c2b7d3e", "data": {"reason": "completed"}}})
        );
        let e = Event {
            kind: EventKind::LaneStage,
            ts: "2026-11-14T09:31:09.002Z".into(),
            seq: 318,
            subject: "t-0c1d2e3f4a5b".into(),
            data: Map::new(),
        };
        let v: Value = serde_json::from_str(&encode_event(&e).unwrap()).unwrap();
        assert_eq!(v["params"]["lane"], "t-0c1d2e3f4a5b");
        let v: Value = serde_json::from_str(&encode_events_dropped(12)).unwrap();
        assert_eq!(
            v,
            json!({"method": "events.dropped", "params": {"count": 12}})
        );
        let mut huge = Map::new();
        huge.insert("x".into(), Value::from("a".repeat(70_000)));
        assert_eq!(encode_event(&Event { data: huge, ..e }), None);
    }

    #[test]
    fn responses_and_pages_fit_the_line() {
        let line = encode_response("1", &json!({"kinds": []})).unwrap();
        assert_eq!(line, r#"{"id":"1","result":{"kinds":[]}}"#);
        assert_eq!(
            encode_response("1", &json!({"value": "a".repeat(70_000)}))
                .unwrap_err()
                .code(),
            "result-too-large"
        );
        assert_eq!(
            encode_response("1", &json!([1])).unwrap_err().code(),
            "internal-error"
        );
        let typed = crate::plugins::calls::StorageValue {
            key: "k0".into(),
            value: Some("v\n".into()),
        };
        assert_eq!(
            encode_response("b7", &typed).unwrap(),
            r#"{"id":"b7","result":{"key":"k0","value":"v\n"}}"#
        );
        // The storage.get line written by hand is the typed one, byte for
        // byte: plain text, every escape, text around a block edge, no value.
        let mut values: Vec<Option<String>> = vec![None, Some(String::new())];
        for bad in ["\"", "\\", "\n", "\u{1}", "\u{1f}"] {
            for at in [0, 1, 15, 16, 17, 31, 32, 33, 100] {
                values.push(Some(format!("{}{bad}{}", "v".repeat(at), "w".repeat(40))));
            }
        }
        values.push(Some("v".repeat(100)));
        values.push(Some("é✓\u{7f} </script>".repeat(9)));
        for value in values {
            let typed = crate::plugins::calls::StorageValue {
                key: "k0".into(),
                value: value.clone(),
            };
            assert_eq!(
                encode_storage_value("b7", "k0", value.as_deref()).unwrap(),
                encode_response("b7", &typed).unwrap()
            );
        }
        assert_eq!(
            encode_storage_value("1", "k", Some(&"a".repeat(70_000)))
                .unwrap_err()
                .code(),
            "result-too-large"
        );

        let items: Vec<Value> = (0..500)
            .map(|i| json!({"session": format!("s-{i:012x}"), "pad": "p".repeat(400)}))
            .collect();
        let cursor = |v: &Value| v["session"].as_str().unwrap_or_default().to_string();
        let (line, n) = encode_page("7", "sessions", &items, false, cursor).unwrap();
        assert!(n > 0 && n < 500 && line.len() <= limits::PLUGIN_MAX_LINE);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["result"]["sessions"].as_array().unwrap().len(), n);
        assert_eq!(
            v["result"]["nextCursor"],
            Value::from(format!("s-{:012x}", n - 1))
        );
        // One more item would not have fit.
        let (_, m) = encode_page("7", "sessions", &items[..n + 1], false, cursor).unwrap();
        assert_eq!(m, n);

        let (line, n) = encode_page("7", "sessions", &items[..2], false, cursor).unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            serde_json::from_str::<Value>(&line).unwrap()["result"]["nextCursor"],
            Value::Null
        );
        let (line, _) = encode_page("7", "sessions", &items[..2], true, cursor).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&line).unwrap()["result"]["nextCursor"],
            "s-000000000001"
        );
        let (line, n) = encode_page::<Value>("7", "seats", &[], false, cursor).unwrap();
        assert_eq!(
            (line.as_str(), n),
            (r#"{"id":"7","result":{"seats":[],"nextCursor":null}}"#, 0)
        );
        let giant = vec![json!({"session": "s-1", "pad": "p".repeat(70_000)})];
        assert_eq!(
            encode_page("7", "sessions", &giant, false, cursor)
                .unwrap_err()
                .code(),
            "result-too-large"
        );
    }

    #[test]
    fn answers_to_host_requests() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        assert!(parse_initialize_result(&obj(json!({"api": "1.0", "x": 1}))).is_err());
        assert!(parse_initialize_result(&obj(json!({"api": "01.0"}))).is_err());
        assert!(parse_initialize_result(&obj(json!({"api": 1}))).is_err());
        assert_eq!(
            parse_command_result(&obj(json!({"text": "Saved."}))),
            Ok("Saved.".into())
        );
        assert!(parse_command_result(&obj(json!({"text": "x".repeat(16_385)}))).is_err());
        assert!(parse_command_result(&obj(json!({}))).is_err());
        for ok in ["1.0", "1.1", "9999.9999", "2.10"] {
            assert!(is_api_version(ok), "{ok}");
        }
        for bad in ["0.1", "1.01", "1", "1.", ".1", "10000.0", "1.0.0", "a.b"] {
            assert!(!is_api_version(bad), "{bad}");
        }
    }

    #[test]
    fn permissions_and_methods() {
        assert_eq!(
            Permission::table_order(&[Permission::TasksCreate, Permission::EventsRead]),
            vec![Permission::EventsRead, Permission::TasksCreate]
        );
        assert_eq!(
            Method::from_name("sessions.get").map(Method::permission),
            Some(Permission::ListsRead)
        );
        assert_eq!(
            Method::from_name("tasks.cancel").map(Method::permission),
            Some(Permission::TasksCreate)
        );
        assert_eq!(Method::StorageSet.permission(), Permission::StorageOwn);
        assert_eq!(
            Method::EventsUnsubscribe.permission(),
            Permission::EventsRead
        );
        for p in Permission::ALL {
            assert_eq!(Permission::from_name(p.name()), Some(p));
        }
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_name(k.name()), Some(k));
        }
    }
}
