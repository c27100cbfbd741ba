//! The configuration file `omniconfluxd.toml`, its defaults, and the paths the
//! daemon uses (DESIGN.md, "Paths"; issue 2, "config check").
//!
//! Parsing is apart from checking: [`parse`] turns TOML into [`FileConfig`]
//! and refuses unknown keys and wrong types (serde's `deny_unknown_fields`);
//! [`FileConfig::check`] then refuses bad values. Both errors name the key,
//! the line and what was expected. Every key has a default, so a missing file
//! and an empty file run the same daemon.
//!
//! A key whose value is one of a fixed set of names (`lanes.merge`,
//! `approvals.fallback`, `agents.isolation`, `plugins.isolation`,
//! `approvals.rule.answer`, `seat.family`) is an enum with the TOML names
//! (`choice!`): the file keeps the text, so that a wrong name is refused by
//! `check` with its key and line like any other bad value, and the daemon
//! reads the enum through the section's accessor.
//!
//! Path precedence, highest first: the command-line flag, the config file,
//! the directory a service manager hands over (`STATE_DIRECTORY`,
//! `RUNTIME_DIRECTORY`, `CONFIGURATION_DIRECTORY`, as systemd sets them for a
//! unit with StateDirectory= and friends), then the user's XDG directories.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::limits;
use crate::log::Level;

/// A config key whose value is one of a fixed set of names: an enum with
/// the TOML names, [`FromStr`](std::str::FromStr) (whose error is the
/// message `check` gives for any other value) and `name`. The file keeps the
/// text as written, so that `parse` reads any string and `check` refuses a
/// wrong one naming its key and line; the rest of the daemon reads the enum
/// through the section's accessor, after `check`.
macro_rules! choice {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vm])* $variant),+
        }

        impl $name {
            /// Every name, in the order the enum lists them.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The name the config file gives it.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!("expected {}, found {s:?}", one_of(Self::NAMES))),
                }
            }
        }
    };
}

/// `a`, `a or b`, `a, b or c`: the names a value may take, as messages say.
fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

choice! {
    /// `[lanes] merge`: how a pass is merged into its base.
    MergeMode {
        FastForward = "fast-forward",
        MergeCommit = "merge-commit",
    }
}

choice! {
    /// `[approvals] fallback`: what an unanswered request becomes at its
    /// deadline.
    Fallback {
        /// The agent is told no.
        Deny = "deny",
        /// The request is cancelled, delivered false.
        Withdraw = "withdraw",
    }
}

choice! {
    /// `[agents] isolation`: how agent sessions are contained.
    AgentIsolation {
        /// Each agent in its own namespace through bubblewrap, where it
        /// works here.
        Namespace = "namespace",
        /// Uncontained.
        None = "none",
    }
}

choice! {
    /// `[plugins] isolation`: how plugins are contained.
    PluginIsolation {
        /// Bubblewrap when it works here.
        Auto = "auto",
        /// Uncontained.
        None = "none",
    }
}

choice! {
    /// `[uplink] remote_operator`: which relay channels may do what only
    /// the operator may (answer approvals, approve plugins, ...).
    RemoteOperator {
        /// Only end-to-end encrypted channels (the default).
        E2ee = "e2ee",
        /// No channel.
        Never = "never",
        /// Plaintext channels too.
        Any = "any",
    }
}

choice! {
    /// `answer` of an `[[approvals.rule]]`: what the rule answers at once.
    RuleAnswer {
        Allow = "allow",
        Deny = "deny",
    }
}

choice! {
    /// A seat's provider family (seed 000, seats[].family). Lanes keep it
    /// in their records, and the plugin wire gives it, by these names.
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    Family {
        Anthropic = "anthropic",
        Openai = "openai",
        Google = "google",
        Xai = "xai",
        Moonshot = "moonshot",
        Deepseek = "deepseek",
        Local = "local",
        /// A harness that serves whichever provider its own config names:
        /// never the verifier of another family's work, nor its builder.
        Auto = "auto",
    }
}

/// The file as written, every section optional.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub daemon: DaemonSection,
    pub socket: SocketSection,
    pub plugins: PluginsSection,
    pub approvals: ApprovalsSection,
    pub http: HttpSection,
    /// `[gateway]`: the gateway role in the node (issue 12, seed 004).
    pub gateway: GatewaySection,
    /// `[uplink]`: the node dialing a gateway (issue 13, seed 004).
    pub uplink: UplinkSection,
    pub lanes: LanesSection,
    /// `[seats]`: whether agents found on PATH become seats when no
    /// `[[seat]]` is configured (issue 9, "Seats on defaults").
    pub seats: SeatsSection,
    /// `[agents]`: how agent sessions are contained (issue 16).
    pub agents: AgentsSection,
    /// `[[seat]]` tables: the agent harnesses the operator configured
    /// (issue 3, "Seats"), in registry order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub seat: Vec<SeatConfig>,
    /// `[[repo]]` tables: repositories lanes may work on, besides those
    /// added with repos.add (issue 5, "Dispatch").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repo: Vec<RepoEntry>,
}

/// `[gateway]`: the gateway role (seed 004; issue 12). Off unless `listen`
/// is set here or by `serve --gateway ADDR`; `omniconfluxd gateway` reads
/// the same section.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GatewaySection {
    /// `IP:PORT`, or an IP alone for port 8443. Empty: no gateway in the
    /// node.
    pub listen: String,
    /// The base URL devices reach the gateway at (`wss://gw.example`),
    /// returned by `clients.pairStart` and put in the pairing URI. Empty:
    /// the gateway has no public URL.
    pub public_url: String,
    /// WebSocket connections held at once.
    pub max_connections: usize,
    /// How long one frame may take to be written to a peer before its
    /// connection is closed (seed 004, Slow readers).
    pub write_timeout_ms: u64,
}

impl Default for GatewaySection {
    fn default() -> Self {
        GatewaySection {
            listen: String::new(),
            public_url: String::new(),
            max_connections: limits::GATEWAY_MAX_CONNECTIONS,
            write_timeout_ms: limits::GATEWAY_WRITE_TIMEOUT_MS,
        }
    }
}

impl GatewaySection {
    /// The address to bind: `listen` with port 8443 when it names none.
    /// `None` when `listen` is empty or not an address.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        gateway_addr(&self.listen)
    }

    /// Checks the section's values; `Err` holds the key and what was expected.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.listen.is_empty() && self.addr().is_none() {
            return Err((
                "listen",
                format!(
                    "expected IP:PORT or an IP such as 0.0.0.0, found {:?}",
                    self.listen
                ),
            ));
        }
        let url = &self.public_url;
        let scheme_ok = url
            .strip_prefix("ws://")
            .or_else(|| url.strip_prefix("wss://"));
        if !url.is_empty()
            && (scheme_ok.is_none_or(str::is_empty)
                || url.contains(|c: char| c.is_whitespace() || c == '?' || c == '#'))
        {
            return Err((
                "public_url",
                format!("expected a ws:// or wss:// base URL without a query, found {url:?}"),
            ));
        }
        if !(1..=limits::GATEWAY_MAX_CONNECTIONS_CEILING).contains(&self.max_connections) {
            return Err((
                "max_connections",
                format!(
                    "expected 1 to {}, found {}",
                    limits::GATEWAY_MAX_CONNECTIONS_CEILING,
                    self.max_connections
                ),
            ));
        }
        if !(100..=600_000).contains(&self.write_timeout_ms) {
            return Err((
                "write_timeout_ms",
                format!("expected 100 to 600000, found {}", self.write_timeout_ms),
            ));
        }
        Ok(())
    }
}

/// `[uplink]`: the node's side of a gateway (seed 004, "Connecting a
/// client", "Relay channels", "End-to-end encryption"; issue 13). Off
/// unless `url` is set; a node that runs the gateway itself (`[gateway]
/// listen`) is in that gateway's roster without it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UplinkSection {
    /// `ws://host[:port][/base]`: the gateway to dial; the node appends
    /// `/node`. Empty: no uplink.
    pub url: String,
    /// A file holding the gateway's master token (mode 0600 or stricter).
    /// `OMNICONFLUX_UPLINK_TOKEN` wins over it.
    pub token_file: String,
    /// A PEM file of CA certificates trusted for a `wss://` gateway, besides
    /// the system's roots. Empty: the system's only.
    pub ca_file: String,
    /// E2EE mode: frames for an unknown channel that are not
    /// `e2e.handshake` are dropped (seed 004, Mode mismatch). Off, the node
    /// serves plaintext channels and accepts handshakes too.
    pub e2ee: bool,
    /// Which channels may do what only the operator may (answer approvals,
    /// approve plugins, ...): `e2ee` (default: only end-to-end encrypted
    /// channels), `never`, or `any` (plaintext channels too).
    pub remote_operator: String,
}

impl Default for UplinkSection {
    fn default() -> Self {
        UplinkSection {
            url: String::new(),
            token_file: String::new(),
            ca_file: String::new(),
            e2ee: false,
            remote_operator: "e2ee".into(),
        }
    }
}

/// Where `[uplink] url` points, taken apart.
#[derive(Debug, Clone, PartialEq)]
pub struct UplinkUrl {
    /// How the bytes travel.
    pub via: UplinkVia,
    /// The URL of the `/node` route, for the WebSocket handshake.
    pub node_url: String,
}

/// How the uplink reaches the gateway.
#[derive(Debug, Clone, PartialEq)]
pub enum UplinkVia {
    /// TCP to `host:port`.
    Tcp { authority: String },
    /// TLS over TCP to `host:port`, checked against `host`.
    Tls { authority: String, host: String },
    /// `ssh [-p SSH_PORT] -W 127.0.0.1:PORT DEST`: the gateway listens on
    /// the SSH server's loopback.
    Ssh {
        dest: String,
        ssh_port: Option<u16>,
        port: u16,
    },
}

impl UplinkSection {
    /// The gateway to dial, `None` when `url` is empty. `Err` says what
    /// is wrong with it.
    pub fn target(&self) -> Result<Option<UplinkUrl>, String> {
        let url = self.url.trim_end_matches('/');
        if url.is_empty() {
            return Ok(None);
        }
        if let Some(rest) = self.url.strip_prefix("ssh://") {
            return ssh_target(rest).map(Some).ok_or_else(|| {
                format!("expected ssh://[user@]host[:sshport][?port=N], found {url:?}")
            });
        }
        let (tls, rest) = match (url.strip_prefix("ws://"), url.strip_prefix("wss://")) {
            (Some(r), _) => (false, r),
            (None, Some(r)) => (true, r),
            _ => {
                return Err(format!(
                    "expected ws://, wss:// or ssh:// and a host, found {url:?}"
                ));
            }
        };
        let (host, base) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if host.is_empty()
            || rest.contains(|c: char| c.is_whitespace() || c == '?' || c == '#' || c == '@')
        {
            return Err(format!("expected ws://host[:port][/base], found {url:?}"));
        }
        let has_port = match host.rfind(']') {
            Some(close) => host[close..].contains(':'),
            None => host.contains(':'),
        };
        let authority = match (has_port, tls) {
            (true, _) => host.to_string(),
            (false, false) => format!("{host}:80"),
            (false, true) => format!("{host}:443"),
        };
        let via = if tls {
            // The name the certificate must carry: the host without its
            // port or an IPv6 address's brackets.
            let name = match host.rfind(']') {
                Some(close) => &host[1..close],
                None => host.rsplit_once(':').map_or(host, |(h, _)| h),
            };
            UplinkVia::Tls {
                authority,
                host: name.to_string(),
            }
        } else {
            UplinkVia::Tcp { authority }
        };
        // The WebSocket handshake names the route the same either way.
        Ok(Some(UplinkUrl {
            via,
            node_url: format!("ws://{host}{base}/node"),
        }))
    }

    /// Whether a channel may do what only the operator may.
    pub fn operator_on(&self, e2ee: bool) -> bool {
        match self.remote_operator() {
            RemoteOperator::Any => true,
            RemoteOperator::Never => false,
            RemoteOperator::E2ee => e2ee,
        }
    }

    /// `remote_operator`, which `check` accepted.
    pub fn remote_operator(&self) -> RemoteOperator {
        self.remote_operator.parse().unwrap_or(RemoteOperator::E2ee)
    }

    /// Checks the section's values; `Err` holds the key and what was expected.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        self.target().map_err(|m| ("url", m))?;
        self.remote_operator
            .parse::<RemoteOperator>()
            .map_err(|m| ("remote_operator", m))?;
        Ok(())
    }
}

/// `[user@]host[:sshport][?port=N]` of an `ssh://` uplink URL; the port
/// on the SSH server's loopback defaults to the gateway's, 8443.
fn ssh_target(rest: &str) -> Option<UplinkUrl> {
    let (dest_port, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest.trim_end_matches('/'), None),
    };
    let port = match query {
        None => limits::GATEWAY_PORT,
        Some(q) => q
            .strip_prefix("port=")?
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)?,
    };
    let (dest, ssh_port) = match dest_port.rsplit_once(':') {
        Some((d, p)) => (d, Some(p.parse::<u16>().ok().filter(|p| *p > 0)?)),
        None => (dest_port, None),
    };
    let host = dest.rsplit_once('@').map_or(dest, |(_, h)| h);
    // What ssh would take for an option, or a path, is no destination.
    let plain = |s: &str| {
        !s.is_empty()
            && !s.starts_with('-')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
    };
    if !plain(dest) || !plain(host) || dest.matches('@').count() > 1 {
        return None;
    }
    Some(UplinkUrl {
        via: UplinkVia::Ssh {
            dest: dest.to_string(),
            ssh_port,
            port,
        },
        node_url: format!("ws://127.0.0.1:{port}/node"),
    })
}

/// `IP:PORT`, or an IP (IPv6 bare or in brackets) with port 8443.
pub fn gateway_addr(s: &str) -> Option<std::net::SocketAddr> {
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Some(a);
    }
    let ip = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    ip.parse::<std::net::IpAddr>()
        .ok()
        .map(|ip| std::net::SocketAddr::new(ip, limits::GATEWAY_PORT))
}

/// `[lanes]`: how lanes build, check, verify and merge (issue 5).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LanesSection {
    /// Branch prefix of lane branches: `<prefix>/<name>`.
    pub branch_prefix: String,
    /// Where lane worktrees go. Empty: `<repo>-wt/<name>` beside the repository.
    pub worktree_root: String,
    /// Verify rounds before a lane stops at cap.
    pub max_rounds: u32,
    /// `fast-forward` or `merge-commit`: read with [`LanesSection::merge`].
    merge: String,
    /// Ask the operator before any merge: a pass waits for lanes.merge.
    pub require_merge_approval: bool,
    /// The acceptance command's time limit, in seconds.
    pub check_timeout_secs: u64,
    /// Refuse tasks whose check cannot run isolated (bubblewrap).
    pub require_isolation: bool,
}

impl LanesSection {
    /// How a pass is merged; the file's value, which `check` accepted.
    pub fn merge(&self) -> MergeMode {
        self.merge.parse().unwrap_or(MergeMode::FastForward)
    }
}

impl Default for LanesSection {
    fn default() -> Self {
        LanesSection {
            branch_prefix: "omni".into(),
            worktree_root: String::new(),
            max_rounds: limits::LANE_DEFAULT_ROUNDS,
            merge: "fast-forward".into(),
            require_merge_approval: false,
            check_timeout_secs: limits::LANE_CHECK_TIMEOUT_SECS,
            require_isolation: true,
        }
    }
}

/// `[seats]`: how the registry is filled when the config has no
/// `[[seat]]` table (issue 9). Configured seats always win: one `[[seat]]`
/// and nothing is detected.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SeatsSection {
    /// Offer the agent CLIs the daemon knows (core::seats) that are on
    /// PATH as seats. A system service usually turns it off.
    pub detect: bool,
}

impl Default for SeatsSection {
    fn default() -> Self {
        SeatsSection { detect: true }
    }
}

/// `[agents]`: how agent sessions are contained (issue 16).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AgentsSection {
    /// `namespace` (each agent in its own mount and PID namespace through
    /// bubblewrap, where it works here) or `none`. Applies to the next
    /// session started. Read with [`AgentsSection::isolation`].
    isolation: String,
    /// Ended sessions held in memory (for `sessions.get`, lists and
    /// transcript reads) before the oldest are forgotten, at the next
    /// spawn; 0 to `limits::SESSIONS_ENDED_KEPT`, which is the default.
    pub ended_kept: usize,
}

impl AgentsSection {
    /// How agents are contained; the file's value, which `check` accepted.
    pub fn isolation(&self) -> AgentIsolation {
        self.isolation.parse().unwrap_or(AgentIsolation::Namespace)
    }
}

impl Default for AgentsSection {
    fn default() -> Self {
        AgentsSection {
            isolation: "namespace".into(),
            ended_kept: limits::SESSIONS_ENDED_KEPT,
        }
    }
}

/// One `[[repo]]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RepoEntry {
    /// The repository's absolute path.
    pub path: String,
}

/// One `[[seat]]`: how to start an agent harness and what it runs on.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SeatConfig {
    /// The registry id (seed 000 seats[].harness).
    pub harness: String,
    /// The program: an absolute path, or a name looked up in PATH.
    pub command: String,
    /// The approved arguments, before any the transport adds.
    #[serde(default)]
    pub args: Vec<String>,
    /// `acp` or `stream-json`; or `tmux` for an agent with no API: its
    /// command runs in a pane of the daemon's tmux server (issue 15,
    /// src/socket/methods/tmux.rs), and the seat is not one the session
    /// core or the lanes drive.
    pub transport: String,
    pub provider: String,
    /// One of seed 000's provider families; read as one with
    /// [`SeatConfig::family`].
    pub family: String,
    /// The model to ask for when `sessions.spawn` names none; a plain model
    /// name ([`valid_model_name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Variables added to the agent's constructed environment.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    /// Seconds a running turn may go without a line from the agent before
    /// it ends failed (not counted while an approval waits). Absent: the
    /// default in limits.rs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout: Option<u64>,
}

impl SeatConfig {
    /// Whether the seat runs in a tmux pane (`transport = "tmux"`).
    pub fn in_tmux(&self) -> bool {
        self.transport == "tmux"
    }

    /// The seat's provider family; the file's value, which `check`
    /// accepted (a detected seat's is the daemon's own).
    pub fn family(&self) -> Family {
        self.family.parse().unwrap_or(Family::Auto)
    }
}

/// `[approvals]`: the risk gate, its automatic answers, and the timeout.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalsSection {
    /// Seconds a request waits for an answer; 0 waits without end.
    pub timeout: u64,
    /// What a request that timed out becomes: `deny` (the agent is told no)
    /// or `withdraw` (the request is cancelled, delivered false). Read with
    /// [`ApprovalsSection::fallback`].
    fallback: String,
    /// `[[approvals.rule]]`, first match wins; then the built-in labels.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rule: Vec<RiskRule>,
}

impl ApprovalsSection {
    /// What a request that timed out becomes; the file's value, which
    /// `check` accepted.
    pub fn fallback(&self) -> Fallback {
        self.fallback.parse().unwrap_or(Fallback::Deny)
    }
}

impl Default for ApprovalsSection {
    fn default() -> Self {
        ApprovalsSection {
            timeout: limits::APPROVAL_TIMEOUT_DEFAULT_S,
            fallback: "deny".into(),
            rule: Vec::new(),
        }
    }
}

/// One rule of the risk gate.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RiskRule {
    /// An action kind (read, edit, execute, fetch, search, delete, move,
    /// think, other) or `*`.
    pub action: String,
    /// Matches only this tool name (`PermissionRequest::tool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Matches only when every path in the request is inside the session's
    /// worktree (symlinks resolved).
    #[serde(default)]
    pub inside_worktree: bool,
    /// low, medium or high.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    /// allow or deny: answer at once, recorded as this rule's answer. Read
    /// with [`RiskRule::answer`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    answer: Option<String>,
}

impl RiskRule {
    /// The rule's automatic answer; the file's value, which `check`
    /// accepted.
    pub fn answer(&self) -> Option<RuleAnswer> {
        self.answer.as_deref().and_then(|a| a.parse().ok())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonSection {
    /// Where the ledger and the plugin store live. Empty: the default.
    pub state_dir: String,
    /// The daemon socket's path. Empty: the default.
    pub socket: String,
    /// This machine's name in sessions.list (`node`). Empty: the host name.
    pub node_name: String,
    /// error, warn, info or debug.
    pub log_level: String,
}

impl Default for DaemonSection {
    fn default() -> Self {
        DaemonSection {
            state_dir: String::new(),
            socket: String::new(),
            node_name: String::new(),
            log_level: "info".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SocketSection {
    pub max_connections: usize,
    pub max_in_flight: usize,
    pub max_queued_bytes: usize,
}

impl Default for SocketSection {
    fn default() -> Self {
        SocketSection {
            max_connections: limits::SOCKET_MAX_CONNECTIONS,
            max_in_flight: limits::SOCKET_MAX_IN_FLIGHT,
            max_queued_bytes: limits::SOCKET_MAX_QUEUED_BYTES,
        }
    }
}

/// `[plugins]`: how the plugin host runs plugins (seed 000; issue 4). The
/// intervals default to the page's values; they are settings so that an
/// operator on a slow machine (or a test) can change them.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsSection {
    /// The interpreter of a `.mjs` or `.js` main: a path, or a name looked up in PATH.
    pub node: String,
    /// The interpreter of a `.py` main.
    pub python: String,
    /// `auto` (bubblewrap when it works here) or `none`. Read with
    /// [`PluginsSection::isolation`].
    isolation: String,
    /// "ping every 30 seconds" (seed 000, ping).
    pub ping_interval_ms: u64,
    /// "Any response or failure within 10 seconds" (seed 000, ping).
    pub ping_timeout_ms: u64,
    /// How long a plugin has to answer initialize.
    pub initialize_timeout_ms: u64,
    /// The first restart delay after a crash; it doubles up to 60 s.
    pub restart_backoff_ms: u64,
    /// Crashes in 10 minutes that make a plugin `failed` with `crash-limit`.
    pub crash_limit: u32,
    /// Plugins running at once; one more is `failed` with `run-limit`.
    pub max_running: usize,
    /// Memory of a plugin's process tree, in MiB (RLIMIT_AS and the watch).
    pub memory_mb: u64,
    /// Processes in a plugin's process tree.
    pub max_processes: usize,
    /// How often the host counts each plugin's processes and memory.
    pub watch_interval_ms: u64,
    /// How long an operator has to answer a plugin's task request.
    pub task_expiry_ms: u64,
    /// How long an allowed task request's dispatch may take.
    pub task_dispatch_timeout_ms: u64,
    /// How long a plugin has to answer command.run.
    pub command_timeout_ms: u64,
    /// How long plugin.remove waits for the dispatches it aborts.
    pub remove_abort_timeout_ms: u64,
}

impl PluginsSection {
    /// How plugins are contained; the file's value, which `check` accepted.
    pub fn isolation(&self) -> PluginIsolation {
        self.isolation.parse().unwrap_or(PluginIsolation::Auto)
    }
}

impl Default for PluginsSection {
    fn default() -> Self {
        PluginsSection {
            node: "node".into(),
            python: "python3".into(),
            isolation: "auto".into(),
            ping_interval_ms: limits::PLUGIN_PING_INTERVAL_MS,
            ping_timeout_ms: limits::PLUGIN_PING_TIMEOUT_MS,
            initialize_timeout_ms: limits::PLUGIN_INITIALIZE_TIMEOUT_MS,
            restart_backoff_ms: limits::PLUGIN_RESTART_BACKOFF_MS,
            crash_limit: limits::PLUGIN_CRASH_LIMIT,
            max_running: limits::PLUGIN_MAX_INSTALLED,
            memory_mb: limits::PLUGIN_MEMORY_MB,
            max_processes: limits::PLUGIN_MAX_PROCESSES,
            watch_interval_ms: limits::PLUGIN_WATCH_INTERVAL_MS,
            task_expiry_ms: limits::PLUGIN_TASK_EXPIRY_MS,
            task_dispatch_timeout_ms: limits::PLUGIN_TASK_DISPATCH_MS,
            command_timeout_ms: limits::PLUGIN_COMMAND_TIMEOUT_MS,
            remove_abort_timeout_ms: limits::PLUGIN_REMOVE_ABORT_MS,
        }
    }
}

/// The HTTP API (seed 002 mechanisms; issue 6). Off unless `listen` is set
/// here or by `serve --http ADDR`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSection {
    /// `IP:PORT` to listen on; loopback unless deliberately otherwise.
    /// Empty: no HTTP listener.
    pub listen: String,
    /// The bearer token's file. Empty: `http.token` in the state directory,
    /// created with mode 0600 at first start.
    pub token_file: String,
    /// Browser origins allowed to call, exactly as browsers send them
    /// (`https://app.example:8443`); no wildcards.
    pub allowed_origins: Vec<String>,
    /// Host names (or `name:port`) besides the listener's own address that
    /// requests may name in `Host`, e.g. behind a reverse proxy.
    pub public_names: Vec<String>,
    pub max_connections: usize,
    pub threads: usize,
}

impl Default for HttpSection {
    fn default() -> Self {
        HttpSection {
            listen: String::new(),
            token_file: String::new(),
            allowed_origins: Vec::new(),
            public_names: Vec::new(),
            max_connections: limits::HTTP_MAX_CONNECTIONS,
            threads: limits::HTTP_THREADS,
        }
    }
}

impl HttpSection {
    /// Checks the section's values; `Err` holds the key and what was expected.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.listen.is_empty() && self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err((
                "listen",
                format!(
                    "expected IP:PORT such as 127.0.0.1:7777, found {:?}",
                    self.listen
                ),
            ));
        }
        if !self.token_file.is_empty() && !Path::new(&self.token_file).is_absolute() {
            return Err((
                "token_file",
                format!("expected an absolute path, found {:?}", self.token_file),
            ));
        }
        for o in &self.allowed_origins {
            if !valid_origin(o) {
                return Err((
                    "allowed_origins",
                    format!("expected exact origins like https://app.example:8443, found {o:?}"),
                ));
            }
        }
        for n in &self.public_names {
            if !valid_public_name(n) {
                return Err((
                    "public_names",
                    format!("expected host names or name:port, found {n:?}"),
                ));
            }
        }
        if !(1..=limits::HTTP_MAX_CONNECTIONS_CEILING).contains(&self.max_connections) {
            return Err((
                "max_connections",
                format!(
                    "expected 1 to {}, found {}",
                    limits::HTTP_MAX_CONNECTIONS_CEILING,
                    self.max_connections
                ),
            ));
        }
        if !(1..=limits::HTTP_THREADS_CEILING).contains(&self.threads) {
            return Err((
                "threads",
                format!(
                    "expected 1 to {}, found {}",
                    limits::HTTP_THREADS_CEILING,
                    self.threads
                ),
            ));
        }
        Ok(())
    }
}

/// `scheme://host[:port]` with scheme http or https, lowercase, nothing after.
pub fn valid_origin(o: &str) -> bool {
    let Some(rest) = o
        .strip_prefix("https://")
        .or_else(|| o.strip_prefix("http://"))
    else {
        return false;
    };
    !rest.is_empty() && valid_public_name(rest)
}

/// A lowercase host name, IPv4 literal or bracketed IPv6 literal, with an
/// optional `:port`.
pub fn valid_public_name(n: &str) -> bool {
    let (host_ok, port) = if let Some(rest) = n.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return false,
            },
        };
        (v6.parse::<std::net::Ipv6Addr>().is_ok(), port)
    } else {
        let (host, port) = match n.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (n, None),
        };
        let ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        (ok, port)
    };
    host_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|v| v > 0))
}

/// A config file that could not be used: which file, which key, which line,
/// and what was expected.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub path: Option<PathBuf>,
    pub key: Option<String>,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.path {
            write!(f, "{}", p.display())?;
            if let Some(l) = self.line {
                write!(f, ":{l}")?;
            }
            write!(f, ": ")?;
        } else if let Some(l) = self.line {
            write!(f, "line {l}: ")?;
        }
        if let Some(k) = &self.key {
            write!(f, "key {k}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Parses TOML text; unknown keys and wrong types are errors with the line.
pub fn parse(text: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str::<FileConfig>(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        // toml's message is multi-line with a source excerpt; the first
        // sentence is what was wrong and what was expected.
        let message = e
            .message()
            .lines()
            .next()
            .unwrap_or("invalid toml")
            .trim()
            .to_string();
        ConfigError {
            path: None,
            key: key_from_message(&message),
            line,
            message,
        }
    })
}

fn line_of(text: &str, byte: usize) -> usize {
    text.as_bytes()[..byte.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn key_from_message(msg: &str) -> Option<String> {
    // "unknown field `foo`, expected one of ..." names the key in backticks.
    let start = msg.find('`')? + 1;
    let end = start + msg[start..].find('`')?;
    Some(msg[start..end].to_string())
}

/// Finds the line of `key` inside `[section]` for value errors found after
/// parsing. The config has flat sections, so a line scan is exact for files
/// written as the example is; `None` when the key is written some other way.
fn locate(text: &str, section: &str, key: &str) -> Option<usize> {
    let mut current = String::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix('[') {
            current = rest
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            continue;
        }
        if current == section {
            if let Some((k, _)) = line.split_once('=') {
                if k.trim().trim_matches('"') == key {
                    return Some(i + 1);
                }
            }
        }
    }
    None
}

/// Action kinds a risk rule may name (ACP ToolKind, as agents::ActionKind).
const ACTIONS: [&str; 9] = [
    "read", "edit", "execute", "fetch", "search", "delete", "move", "think", "other",
];

/// Finds the line of `key` inside the `n`th `[[table]]` of that name.
fn locate_nth(text: &str, table: &str, n: usize, key: &str) -> Option<usize> {
    let header = format!("[[{table}]]");
    let mut count = 0usize;
    let mut inside = false;
    let mut header_line = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('[') {
            inside = line.replace(' ', "") == header && {
                count += 1;
                count == n + 1
            };
            if inside {
                header_line = Some(i + 1);
            }
            continue;
        }
        if inside {
            if let Some((k, _)) = line.split_once('=') {
                if k.trim().trim_matches('"') == key {
                    return Some(i + 1);
                }
            }
        }
    }
    header_line
}

impl FileConfig {
    /// Checks values the types allow but the daemon does not. `text` is the
    /// file's source, used only to name the line.
    pub fn check(&self, text: &str) -> Result<(), ConfigError> {
        let bad = |section: &str, key: &str, message: String| ConfigError {
            path: None,
            key: Some(format!("{section}.{key}")),
            line: locate(text, section, key),
            message,
        };
        let d = &self.daemon;
        if Level::parse(&d.log_level).is_none() {
            return Err(bad(
                "daemon",
                "log_level",
                format!(
                    "expected one of error, warn, info, debug, found {:?}",
                    d.log_level
                ),
            ));
        }
        for (key, value) in [("state_dir", &d.state_dir), ("socket", &d.socket)] {
            if !value.is_empty() && !Path::new(value).is_absolute() {
                return Err(bad(
                    "daemon",
                    key,
                    format!("expected an absolute path, found {value:?}"),
                ));
            }
        }
        if !d.socket.is_empty() && d.socket.len() >= SUN_PATH_MAX {
            return Err(bad(
                "daemon",
                "socket",
                format!("expected a path shorter than {SUN_PATH_MAX} bytes"),
            ));
        }
        if !d.node_name.is_empty() && !valid_node_name(&d.node_name) {
            return Err(bad(
                "daemon",
                "node_name",
                "expected a letter or digit then up to 63 letters, digits, '_', '.' or '-'".into(),
            ));
        }
        let s = &self.socket;
        if !(1..=limits::SOCKET_MAX_CONNECTIONS_CEILING).contains(&s.max_connections) {
            return Err(bad(
                "socket",
                "max_connections",
                format!(
                    "expected 1 to {}, found {}",
                    limits::SOCKET_MAX_CONNECTIONS_CEILING,
                    s.max_connections
                ),
            ));
        }
        if !(1..=1024).contains(&s.max_in_flight) {
            return Err(bad(
                "socket",
                "max_in_flight",
                format!("expected 1 to 1024, found {}", s.max_in_flight),
            ));
        }
        if !(64 * 1024..=1024 * 1024 * 1024).contains(&s.max_queued_bytes) {
            return Err(bad(
                "socket",
                "max_queued_bytes",
                format!("expected 65536 to 1073741824, found {}", s.max_queued_bytes),
            ));
        }
        if let Err(e) = self.agents.isolation.parse::<AgentIsolation>() {
            return Err(bad("agents", "isolation", e));
        }
        if self.agents.ended_kept > limits::SESSIONS_ENDED_KEPT {
            return Err(bad(
                "agents",
                "ended_kept",
                format!(
                    "expected 0 to {}, found {}",
                    limits::SESSIONS_ENDED_KEPT,
                    self.agents.ended_kept
                ),
            ));
        }
        let p = &self.plugins;
        if let Err(e) = p.isolation.parse::<PluginIsolation>() {
            return Err(bad("plugins", "isolation", e));
        }
        for (key, value) in [("node", &p.node), ("python", &p.python)] {
            if value.is_empty() || value.contains('\0') {
                return Err(bad(
                    "plugins",
                    key,
                    "expected a program name or an absolute path".into(),
                ));
            }
        }
        for (key, value, min) in [
            ("ping_interval_ms", p.ping_interval_ms, 10),
            ("ping_timeout_ms", p.ping_timeout_ms, 10),
            ("initialize_timeout_ms", p.initialize_timeout_ms, 10),
            ("restart_backoff_ms", p.restart_backoff_ms, 1),
            ("watch_interval_ms", p.watch_interval_ms, 10),
            ("task_expiry_ms", p.task_expiry_ms, 10),
            ("task_dispatch_timeout_ms", p.task_dispatch_timeout_ms, 10),
            ("command_timeout_ms", p.command_timeout_ms, 10),
            ("remove_abort_timeout_ms", p.remove_abort_timeout_ms, 10),
        ] {
            if !(min..=3_600_000).contains(&value) {
                return Err(bad(
                    "plugins",
                    key,
                    format!("expected {min} to 3600000, found {value}"),
                ));
            }
        }
        if !(1..=1000).contains(&p.crash_limit) {
            return Err(bad(
                "plugins",
                "crash_limit",
                format!("expected 1 to 1000, found {}", p.crash_limit),
            ));
        }
        if !(1..=limits::PLUGIN_MAX_INSTALLED).contains(&p.max_running) {
            return Err(bad(
                "plugins",
                "max_running",
                format!(
                    "expected 1 to {}, found {}",
                    limits::PLUGIN_MAX_INSTALLED,
                    p.max_running
                ),
            ));
        }
        if !(64..=65_536).contains(&p.memory_mb) {
            return Err(bad(
                "plugins",
                "memory_mb",
                format!("expected 64 to 65536, found {}", p.memory_mb),
            ));
        }
        if !(1..=4096).contains(&p.max_processes) {
            return Err(bad(
                "plugins",
                "max_processes",
                format!("expected 1 to 4096, found {}", p.max_processes),
            ));
        }
        if let Err((key, message)) = self.http.check() {
            return Err(bad("http", key, message));
        }
        if let Err((key, message)) = self.gateway.check() {
            return Err(bad("gateway", key, message));
        }
        if let Err((key, message)) = self.uplink.check() {
            return Err(bad("uplink", key, message));
        }
        self.check_lanes(text)?;
        self.check_approvals(text)?;
        self.check_seats(text)
    }

    fn check_lanes(&self, text: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError {
            path: None,
            key: Some(format!("lanes.{key}")),
            line: locate(text, "lanes", key),
            message,
        };
        let l = &self.lanes;
        if l.branch_prefix.is_empty()
            || l.branch_prefix.len() > 64
            || !l
                .branch_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
            || l.branch_prefix.starts_with(['/', '.', '-'])
            || l.branch_prefix.ends_with('/')
        {
            return Err(bad("branch_prefix", "expected 1 to 64 letters, digits, '-', '_', '.' or '/', not starting with '/', '.' or '-'".into()));
        }
        if !l.worktree_root.is_empty() && !Path::new(&l.worktree_root).is_absolute() {
            return Err(bad(
                "worktree_root",
                format!("expected an absolute path, found {:?}", l.worktree_root),
            ));
        }
        if !(1..=50).contains(&l.max_rounds) {
            return Err(bad(
                "max_rounds",
                format!("expected 1 to 50, found {}", l.max_rounds),
            ));
        }
        if let Err(e) = l.merge.parse::<MergeMode>() {
            return Err(bad("merge", e));
        }
        if !(1..=86_400).contains(&l.check_timeout_secs) {
            return Err(bad(
                "check_timeout_secs",
                format!("expected 1 to 86400, found {}", l.check_timeout_secs),
            ));
        }
        for (i, r) in self.repo.iter().enumerate() {
            if !Path::new(&r.path).is_absolute() {
                return Err(ConfigError {
                    path: None,
                    key: Some("repo.path".into()),
                    line: locate_nth(text, "repo", i, "path"),
                    message: format!("expected an absolute path, found {:?}", r.path),
                });
            }
        }
        Ok(())
    }

    fn check_approvals(&self, text: &str) -> Result<(), ConfigError> {
        let a = &self.approvals;
        let bad = |key: &str, line: Option<usize>, message: String| ConfigError {
            path: None,
            key: Some(key.into()),
            line,
            message,
        };
        if let Err(e) = a.fallback.parse::<Fallback>() {
            return Err(bad(
                "approvals.fallback",
                locate(text, "approvals", "fallback"),
                e,
            ));
        }
        if a.timeout > limits::APPROVAL_TIMEOUT_MAX_S {
            return Err(bad(
                "approvals.timeout",
                locate(text, "approvals", "timeout"),
                format!(
                    "expected 0 to {}, found {}",
                    limits::APPROVAL_TIMEOUT_MAX_S,
                    a.timeout
                ),
            ));
        }
        for (i, r) in a.rule.iter().enumerate() {
            let at = |key: &str| locate_nth(text, "approvals.rule", i, key);
            if r.action != "*" && !ACTIONS.contains(&r.action.as_str()) {
                return Err(bad(
                    "approvals.rule.action",
                    at("action"),
                    format!(
                        "expected * or one of {}, found {:?}",
                        ACTIONS.join(", "),
                        r.action
                    ),
                ));
            }
            if let Some(risk) = &r.risk {
                if !matches!(risk.as_str(), "low" | "medium" | "high") {
                    return Err(bad(
                        "approvals.rule.risk",
                        at("risk"),
                        format!("expected low, medium or high, found {risk:?}"),
                    ));
                }
            }
            if let Some(Err(e)) = r.answer.as_deref().map(str::parse::<RuleAnswer>) {
                return Err(bad("approvals.rule.answer", at("answer"), e));
            }
            if r.risk.is_none() && r.answer.is_none() {
                return Err(bad(
                    "approvals.rule",
                    at("action"),
                    "a rule needs risk, answer, or both".into(),
                ));
            }
        }
        Ok(())
    }

    fn check_seats(&self, text: &str) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for (i, s) in self.seat.iter().enumerate() {
            let bad = |key: &str, message: String| ConfigError {
                path: None,
                key: Some(format!("seat.{key}")),
                line: locate_nth(text, "seat", i, key),
                message,
            };
            let id_ok = (1..=128).contains(&s.harness.len())
                && s.harness
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !id_ok {
                return Err(bad(
                    "harness",
                    format!(
                        "expected 1 to 128 letters, digits, '_' or '-', found {:?}",
                        s.harness
                    ),
                ));
            }
            if !seen.insert(s.harness.clone()) {
                return Err(bad(
                    "harness",
                    format!("the harness {} is configured twice", s.harness),
                ));
            }
            if s.command.is_empty() || s.command.contains('\0') {
                return Err(bad(
                    "command",
                    "expected a program name or an absolute path".into(),
                ));
            }
            if !s.in_tmux() && crate::agents::Transport::from_wire_name(&s.transport).is_none() {
                return Err(bad(
                    "transport",
                    format!("expected acp, stream-json or tmux, found {:?}", s.transport),
                ));
            }
            let p = s.provider.as_bytes();
            let provider_ok = !p.is_empty()
                && p.len() <= 64
                && p[0].is_ascii_lowercase()
                && p.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
            if !provider_ok {
                return Err(bad(
                    "provider",
                    format!(
                        "expected a lowercase name like anthropic, found {:?}",
                        s.provider
                    ),
                ));
            }
            if s.family.parse::<Family>().is_err() {
                return Err(bad(
                    "family",
                    format!(
                        "expected one of {}, found {:?}",
                        Family::NAMES.join(", "),
                        s.family
                    ),
                ));
            }
            for k in s.env.keys() {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(bad("env", format!("{k:?} is not a variable name")));
                }
            }
            if let Some(m) = &s.model {
                if !valid_model_name(m) {
                    return Err(bad(
                        "model",
                        format!(
                            "expected a plain model name (a letter or digit, then up to 127 letters, digits, '_', '.', ':', '/', '[', ']' or '-'), found {m:?}"
                        ),
                    ));
                }
            }
            if s.stall_timeout == Some(0) {
                return Err(bad("stall_timeout", "expected at least 1 second".into()));
            }
        }
        Ok(())
    }

    pub fn log_level(&self) -> Level {
        Level::parse(&self.daemon.log_level).unwrap_or(Level::Info)
    }

    /// The effective configuration as TOML, defaults filled in.
    pub fn to_toml(&self) -> String {
        toml::to_string(self)
            .unwrap_or_else(|e| format!("# unable to print the configuration: {e}\n"))
    }
}

/// `sockaddr_un.sun_path` holds 108 bytes on Linux, with the terminating NUL.
pub const SUN_PATH_MAX: usize = 108;

/// The pattern of a node name in seed 000 (sessions[].node).
pub fn valid_node_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Seed 000's model name (lane.start's `builder.model`, lanes.list):
/// `^[A-Za-z0-9][A-Za-z0-9_.:/\[\]-]{0,127}$`. A configured model must be
/// one, so that every surface can name it; what is not (a lane recorded
/// before this check) is reported as null, "not a plain model name".
pub fn valid_model_name(m: &str) -> bool {
    let b = m.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_.:/[]-".contains(c))
}

/// Reads and checks a config file.
pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        path: Some(path.to_path_buf()),
        key: None,
        line: None,
        message: format!("unable to read: {}", crate::errors::io_cause(&e)),
    })?;
    let with_path = |mut e: ConfigError| {
        e.path = Some(path.to_path_buf());
        e
    };
    let cfg = parse(&text).map_err(with_path)?;
    cfg.check(&text).map_err(with_path)?;
    Ok(cfg)
}

/// Paths given on the command line, which beat everything else.
#[derive(Debug, Clone, Default)]
pub struct PathFlags {
    pub config: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    /// `serve --http ADDR`: turns the HTTP listener on for this run.
    pub http_listen: Option<String>,
    /// `serve --gateway ADDR` or `gateway --listen ADDR`: the gateway's
    /// address for this run.
    pub gateway_listen: Option<String>,
}

/// The environment the path defaults come from, read once so that tests can
/// construct one.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub home: Option<PathBuf>,
    pub xdg_config_home: Option<PathBuf>,
    pub xdg_state_home: Option<PathBuf>,
    pub xdg_runtime_dir: Option<PathBuf>,
    pub configuration_directory: Option<PathBuf>,
    pub state_directory: Option<PathBuf>,
    pub runtime_directory: Option<PathBuf>,
    pub uid: u32,
}

impl Env {
    pub fn from_process() -> Env {
        let abs = |k: &str| {
            std::env::var_os(k)
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        // systemd may hand over several directories separated by ':'; ours is the first.
        let first = |k: &str| {
            abs(k).map(|p| {
                PathBuf::from(
                    p.to_string_lossy()
                        .split(':')
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
        };
        Env {
            home: abs("HOME"),
            xdg_config_home: abs("XDG_CONFIG_HOME"),
            xdg_state_home: abs("XDG_STATE_HOME"),
            xdg_runtime_dir: abs("XDG_RUNTIME_DIR"),
            configuration_directory: first("CONFIGURATION_DIRECTORY"),
            state_directory: first("STATE_DIRECTORY"),
            runtime_directory: first("RUNTIME_DIRECTORY"),
            // SAFETY: getuid has no preconditions and cannot fail.
            uid: unsafe { libc::getuid() },
        }
    }

    fn home_dir(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(|| PathBuf::from("/"))
    }

    /// The config file looked for when `--config` is not given.
    pub fn default_config_path(&self) -> PathBuf {
        if let Some(d) = &self.configuration_directory {
            return d.join("omniconfluxd.toml");
        }
        if self.uid == 0 && self.xdg_config_home.is_none() {
            return PathBuf::from("/etc/omniconflux/omniconfluxd.toml");
        }
        let base = self
            .xdg_config_home
            .clone()
            .unwrap_or_else(|| self.home_dir().join(".config"));
        base.join("omniconflux/omniconfluxd.toml")
    }

    fn default_state_dir(&self) -> PathBuf {
        if let Some(d) = &self.state_directory {
            return d.clone();
        }
        if self.uid == 0 && self.xdg_state_home.is_none() {
            return PathBuf::from("/var/lib/omniconflux");
        }
        let base = self
            .xdg_state_home
            .clone()
            .unwrap_or_else(|| self.home_dir().join(".local/state"));
        base.join("omniconflux")
    }

    fn default_socket(&self, state_dir: &Path) -> PathBuf {
        if let Some(d) = &self.runtime_directory {
            return d.join("omniconfluxd.sock");
        }
        if let Some(d) = &self.xdg_runtime_dir {
            return d.join("omniconflux/omniconfluxd.sock");
        }
        if self.uid == 0 {
            return PathBuf::from("/run/omniconflux/omniconfluxd.sock");
        }
        // No runtime directory (a login without a user manager): the state
        // directory is private to the user, unlike /tmp.
        state_dir.join("omniconfluxd.sock")
    }
}

/// Every path the daemon uses, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Paths {
    pub config: PathBuf,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub ledger: PathBuf,
}

impl Paths {
    pub fn resolve(flags: &PathFlags, cfg: &FileConfig, env: &Env) -> Paths {
        let config = flags
            .config
            .clone()
            .unwrap_or_else(|| env.default_config_path());
        let state_dir = flags
            .state_dir
            .clone()
            .or_else(|| non_empty(&cfg.daemon.state_dir))
            .unwrap_or_else(|| env.default_state_dir());
        let socket = flags
            .socket
            .clone()
            .or_else(|| non_empty(&cfg.daemon.socket))
            .unwrap_or_else(|| env.default_socket(&state_dir));
        let ledger = state_dir.join("ledger.sqlite3");
        Paths {
            config,
            state_dir,
            socket,
            ledger,
        }
    }
}

fn non_empty(s: &str) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// The config in force: the file when there is one, the defaults when the
/// default path has none. A file named by `--config` must exist.
pub fn load_effective(flags: &PathFlags, env: &Env) -> Result<(FileConfig, Paths), ConfigError> {
    let path = flags
        .config
        .clone()
        .unwrap_or_else(|| env.default_config_path());
    let mut cfg = if flags.config.is_none() && !path.exists() {
        FileConfig::default()
    } else {
        load(&path)?
    };
    if let Some(listen) = &flags.http_listen {
        cfg.http.listen = listen.clone();
        cfg.http.check().map_err(|(key, message)| ConfigError {
            path: None,
            key: Some(format!("--http ({key})")),
            line: None,
            message,
        })?;
    }
    if let Some(listen) = &flags.gateway_listen {
        cfg.gateway.listen = listen.clone();
        cfg.gateway.check().map_err(|(key, message)| ConfigError {
            path: None,
            key: Some(format!("--gateway ({key})")),
            line: None,
            message,
        })?;
    }
    let mut paths = Paths::resolve(flags, &cfg, env);
    paths.config = path;
    Ok((cfg, paths))
}

/// What a SIGHUP reload changed: applied now, or needing a restart.
#[derive(Debug, Default, PartialEq)]
pub struct ReloadReport {
    pub applied: Vec<String>,
    pub needs_restart: Vec<String>,
}

/// Keys a running daemon cannot take over without a restart: its paths and
/// name, and how plugins are isolated (decided once, at start). Every other
/// key applies at once or at the next use (a new connection, the next start
/// of a plugin, the next step of a lane).
pub const RESTART_KEYS: &[&str] = &[
    "daemon.state_dir",
    "daemon.socket",
    "daemon.node_name",
    "plugins.isolation",
];

/// Sections whose every key needs a restart: the HTTP listener, its token
/// and its checks, the gateway's listener and the uplink, are fixed when
/// they start.
pub const RESTART_SECTIONS: &[&str] = &["http", "gateway", "uplink"];

/// Compares the running config with a newly read one, key by key, so that
/// the reload log names exactly what changed. Sections are compared through
/// their TOML form, so a key added to any section is covered without a line
/// here; an array of tables (`[[seat]]`) is one key.
pub fn diff(old: &FileConfig, new: &FileConfig) -> ReloadReport {
    let mut r = ReloadReport::default();
    let table = |c: &FileConfig| toml::Table::try_from(c).unwrap_or_default();
    let (old, new) = (table(old), table(new));
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let (a, b) = (old.get(name), new.get(name));
        let keys: Vec<(String, Option<&toml::Value>, Option<&toml::Value>)> = match (a, b) {
            (Some(toml::Value::Table(ta)), Some(toml::Value::Table(tb))) => {
                let mut ks: Vec<&String> = ta.keys().chain(tb.keys()).collect();
                ks.sort();
                ks.dedup();
                ks.into_iter()
                    .map(|k| (format!("{name}.{k}"), ta.get(k), tb.get(k)))
                    .collect()
            }
            _ => vec![(name.clone(), a, b)],
        };
        for (key, va, vb) in keys {
            if va != vb {
                if RESTART_KEYS.contains(&key.as_str()) || RESTART_SECTIONS.contains(&name.as_str())
                {
                    r.needs_restart.push(key);
                } else {
                    r.applied.push(key);
                }
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {

    #[test]
    fn uplink_urls_are_ws_with_a_base_and_the_node_route() {
        let t = |u: &str| {
            UplinkSection {
                url: u.into(),
                ..UplinkSection::default()
            }
            .target()
        };
        assert_eq!(t("").unwrap(), None);
        let tcp = |a: &str| UplinkVia::Tcp {
            authority: a.into(),
        };
        let u = t("ws://gw.example:9000/base/").unwrap().unwrap();
        assert_eq!(u.via, tcp("gw.example:9000"));
        assert_eq!(u.node_url, "ws://gw.example:9000/base/node");
        let u = t("ws://[::1]").unwrap().unwrap();
        assert_eq!(u.via, tcp("[::1]:80"));
        assert_eq!(u.node_url, "ws://[::1]/node");
        let u = t("wss://gw.example/base").unwrap().unwrap();
        assert_eq!(
            u.via,
            UplinkVia::Tls {
                authority: "gw.example:443".into(),
                host: "gw.example".into()
            }
        );
        assert_eq!(u.node_url, "ws://gw.example/base/node");
        let u = t("ssh://me@box.example:2222?port=9000").unwrap().unwrap();
        assert_eq!(
            u.via,
            UplinkVia::Ssh {
                dest: "me@box.example".into(),
                ssh_port: Some(2222),
                port: 9000
            }
        );
        assert_eq!(u.node_url, "ws://127.0.0.1:9000/node");
        let u = t("ssh://box").unwrap().unwrap();
        assert_eq!(
            u.via,
            UplinkVia::Ssh {
                dest: "box".into(),
                ssh_port: None,
                port: 8443
            }
        );
        for bad in [
            "http://x",
            "ws://",
            "ws://h?x=1",
            "wss://",
            "ssh://-oProxyCommand=x",
            "ssh://h?port=0",
            "ssh://h?x=1",
            "ssh://a@b@c",
            "ssh://",
        ] {
            assert!(t(bad).is_err(), "{bad}");
        }
        let s = UplinkSection::default();
        assert!(s.operator_on(true) && !s.operator_on(false));
    }

    use super::*;

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(parse("").unwrap(), FileConfig::default());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = parse("[daemon]\nlog_level = \"info\"\nfrobnicate = 1\n").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert_eq!(e.key.as_deref(), Some("frobnicate"));
        assert!(e.message.contains("unknown field"), "{e}");
    }

    #[test]
    fn seats_and_rules_are_checked_naming_key_and_line() {
        let ok = "[[seat]]\nharness = \"claude\"\ncommand = \"claude\"\ntransport = \"stream-json\"\nprovider = \"anthropic\"\nfamily = \"anthropic\"\n";
        let cfg = parse(ok).unwrap();
        cfg.check(ok).unwrap();
        assert_eq!(cfg.seat[0].harness, "claude");
        let tmux = format!(
            "{ok}\n[[seat]]\nharness = \"x\"\ncommand = \"x\"\ntransport = \"tmux\"\nprovider = \"p\"\nfamily = \"local\"\n"
        );
        parse(&tmux).unwrap().check(&tmux).unwrap();
        let two = format!(
            "{ok}\n[[seat]]\nharness = \"x\"\ncommand = \"x\"\ntransport = \"pty\"\nprovider = \"p\"\nfamily = \"local\"\n"
        );
        let e = parse(&two).unwrap().check(&two).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("seat.transport"));
        assert_eq!(e.line, Some(11));
        let e = parse("[[seat]]\nharness = \"a\"\nfrob = 1\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("frob"));
        let rules = "[approvals]\ntimeout = 5\n\n[[approvals.rule]]\naction = \"read\"\nanswer = \"maybe\"\n";
        let e = parse(rules).unwrap().check(rules).unwrap_err();
        assert_eq!(
            (e.key.as_deref(), e.line),
            (Some("approvals.rule.answer"), Some(6))
        );
        let fb = "[approvals]\nfallback = \"shrug\"\n";
        let e = parse(fb).unwrap().check(fb).unwrap_err();
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn a_seat_model_must_be_a_plain_model_name() {
        let seat = |model: &str| {
            format!(
                "[[seat]]\nharness = \"a\"\ncommand = \"a\"\ntransport = \"acp\"\nprovider = \"p\"\nfamily = \"local\"\n\n[[seat]]\nharness = \"b\"\ncommand = \"b\"\ntransport = \"acp\"\nprovider = \"p\"\nfamily = \"local\"\nmodel = {model:?}\n"
            )
        };
        for good in ["claude-sonnet-4-5", "openai/gpt-5:high", "m[1m]", "x"] {
            let t = seat(good);
            parse(&t).unwrap().check(&t).unwrap();
        }
        for bad in ["", "-x", "gpt 5", "a;rm -rf /", &"m".repeat(129), "modèle"] {
            let t = seat(bad);
            let e = parse(&t).unwrap().check(&t).unwrap_err();
            assert_eq!(
                (e.key.as_deref(), e.line),
                (Some("seat.model"), Some(14)),
                "{bad:?}: {e}"
            );
            assert!(e.message.contains("plain model name"), "{e}");
        }
        assert!(valid_model_name(&"m".repeat(128)));
    }

    #[test]
    fn seat_detection_is_on_by_default_and_a_key_turns_it_off() {
        assert!(FileConfig::default().seats.detect);
        assert!(!parse("[seats]\ndetect = false\n").unwrap().seats.detect);
        let r = diff(
            &FileConfig::default(),
            &parse("[seats]\ndetect = false\n").unwrap(),
        );
        assert_eq!(r.applied, vec!["seats.detect".to_string()]);
    }

    #[test]
    fn wrong_type_names_line() {
        let e = parse("[socket]\nmax_connections = \"many\"\n").unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("invalid type"), "{e}");
    }

    #[test]
    fn bad_value_names_key_line_and_expectation() {
        let text = "[daemon]\n\nlog_level = \"loud\"\n";
        let e = parse(text).unwrap().check(text).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("daemon.log_level"));
        assert_eq!(e.line, Some(3));
        assert!(e.message.starts_with("expected one of"), "{e}");
        let text = "[socket]\nmax_connections = 0\n";
        let e = parse(text).unwrap().check(text).unwrap_err();
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn agents_isolation_is_namespace_unless_set_to_none() {
        assert_eq!(FileConfig::default().agents.isolation, "namespace");
        let text = "[agents]\nisolation = \"none\"\n";
        assert!(parse(text).unwrap().check(text).is_ok());
        let text = "[agents]\nisolation = \"auto\"\n";
        let e = parse(text).unwrap().check(text).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("agents.isolation"));
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("expected namespace or none"), "{e}");
    }

    #[test]
    fn agents_ended_kept_is_at_most_the_limit() {
        assert_eq!(
            FileConfig::default().agents.ended_kept,
            limits::SESSIONS_ENDED_KEPT
        );
        let text = "[agents]
ended_kept = 0
";
        assert!(parse(text).unwrap().check(text).is_ok());
        let text = "[agents]
ended_kept = 257
";
        let e = parse(text).unwrap().check(text).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("agents.ended_kept"));
        assert_eq!(e.line, Some(2));
        assert_eq!(e.message, "expected 0 to 256, found 257");
    }

    #[test]
    fn fixed_set_values_are_read_as_enums_and_refused_as_before() {
        let d = FileConfig::default();
        assert_eq!(d.lanes.merge(), MergeMode::FastForward);
        assert_eq!(d.approvals.fallback(), Fallback::Deny);
        assert_eq!(d.agents.isolation(), AgentIsolation::Namespace);
        assert_eq!(d.plugins.isolation(), PluginIsolation::Auto);
        let text = "[lanes]\nmerge = \"merge-commit\"\n\n[approvals]\nfallback = \"withdraw\"\n\n\
                    [agents]\nisolation = \"none\"\n\n[plugins]\nisolation = \"none\"\n\n\
                    [[approvals.rule]]\naction = \"read\"\nanswer = \"deny\"\n";
        let c = parse(text).unwrap();
        c.check(text).unwrap();
        assert_eq!(c.lanes.merge(), MergeMode::MergeCommit);
        assert_eq!(c.approvals.fallback(), Fallback::Withdraw);
        assert_eq!(c.agents.isolation(), AgentIsolation::None);
        assert_eq!(c.plugins.isolation(), PluginIsolation::None);
        assert_eq!(c.approvals.rule[0].answer(), Some(RuleAnswer::Deny));
        // The TOML names come back as written.
        assert!(
            c.to_toml().contains("merge = \"merge-commit\""),
            "{}",
            c.to_toml()
        );
        // Each refusal: the key, its line, and the message of before.
        for (text, key, line, message) in [
            (
                "[lanes]\nmerge = \"squash\"\n",
                "lanes.merge",
                2,
                "expected fast-forward or merge-commit, found \"squash\"",
            ),
            (
                "[approvals]\n\nfallback = \"shrug\"\n",
                "approvals.fallback",
                3,
                "expected deny or withdraw, found \"shrug\"",
            ),
            (
                "[plugins]\nisolation = \"namespace\"\n",
                "plugins.isolation",
                2,
                "expected auto or none, found \"namespace\"",
            ),
            (
                "[agents]\nisolation = \"auto\"\n",
                "agents.isolation",
                2,
                "expected namespace or none, found \"auto\"",
            ),
            (
                "[[approvals.rule]]\naction = \"read\"\nanswer = \"maybe\"\n",
                "approvals.rule.answer",
                3,
                "expected allow or deny, found \"maybe\"",
            ),
        ] {
            let e = parse(text).unwrap().check(text).unwrap_err();
            assert_eq!(
                (e.key.as_deref(), e.line, e.message.as_str()),
                (Some(key), Some(line), message)
            );
        }
        assert_eq!(one_of(&["low", "medium", "high"]), "low, medium or high");
        // A family's config name is the name lanes store and plugins get.
        for name in Family::NAMES {
            let f: Family = name.parse().unwrap();
            assert_eq!(serde_json::to_value(f).unwrap(), *name);
            assert_eq!(f.name(), *name);
        }
        let seat = "[[seat]]\nharness = \"a\"\ncommand = \"a\"\ntransport = \"acp\"\nprovider = \"p\"\nfamily = \"mistral\"\n";
        let e = parse(seat).unwrap().check(seat).unwrap_err();
        assert_eq!(
            (e.key.as_deref(), e.line, e.message.as_str()),
            (
                Some("seat.family"),
                Some(6),
                "expected one of anthropic, openai, google, xai, moonshot, deepseek, local, auto, found \"mistral\""
            )
        );
        assert_eq!(
            parse(&seat.replace("mistral", "local")).unwrap().seat[0].family(),
            Family::Local
        );
    }

    #[test]
    fn paths_follow_precedence() {
        let env = Env {
            home: Some("/home/op".into()),
            xdg_runtime_dir: Some("/run/user/1000".into()),
            uid: 1000,
            ..Env::default()
        };
        let p = Paths::resolve(&PathFlags::default(), &FileConfig::default(), &env);
        assert_eq!(
            p.config,
            PathBuf::from("/home/op/.config/omniconflux/omniconfluxd.toml")
        );
        assert_eq!(
            p.state_dir,
            PathBuf::from("/home/op/.local/state/omniconflux")
        );
        assert_eq!(
            p.socket,
            PathBuf::from("/run/user/1000/omniconflux/omniconfluxd.sock")
        );
        let sys = Env {
            state_directory: Some("/var/lib/omniconflux".into()),
            runtime_directory: Some("/run/omniconflux".into()),
            ..Env::default()
        };
        let p = Paths::resolve(&PathFlags::default(), &FileConfig::default(), &sys);
        assert_eq!(
            p.socket,
            PathBuf::from("/run/omniconflux/omniconfluxd.sock")
        );
        assert_eq!(
            p.ledger,
            PathBuf::from("/var/lib/omniconflux/ledger.sqlite3")
        );
        let flags = PathFlags {
            socket: Some("/x/s.sock".into()),
            ..PathFlags::default()
        };
        let mut cfg = FileConfig::default();
        cfg.daemon.socket = "/cfg/s.sock".into();
        assert_eq!(
            Paths::resolve(&flags, &cfg, &env).socket,
            PathBuf::from("/x/s.sock")
        );
        assert_eq!(
            Paths::resolve(&PathFlags::default(), &cfg, &env).socket,
            PathBuf::from("/cfg/s.sock")
        );
    }

    #[test]
    fn reload_sorts_live_from_restart_keys() {
        let old = FileConfig::default();
        let mut new = old.clone();
        new.daemon.log_level = "debug".into();
        new.daemon.socket = "/elsewhere.sock".into();
        new.plugins.ping_interval_ms += 1;
        new.plugins.isolation = "none".into();
        let r = diff(&old, &new);
        assert_eq!(
            r.applied,
            vec![
                "daemon.log_level".to_string(),
                "plugins.ping_interval_ms".to_string()
            ]
        );
        assert_eq!(
            r.needs_restart,
            vec!["daemon.socket".to_string(), "plugins.isolation".to_string()]
        );
    }

    #[test]
    fn http_section_is_checked() {
        let text = "[http]\nlisten = \"127.0.0.1:7777\"\nallowed_origins = [\"https://app.example:8443\"]\npublic_names = [\"box.lan\", \"box.lan:443\"]\n";
        parse(text).unwrap().check(text).unwrap();
        for (text, key) in [
            ("[http]\nlisten = \"localhost\"\n", "http.listen"),
            (
                "[http]\nallowed_origins = [\"*\"]\n",
                "http.allowed_origins",
            ),
            (
                "[http]\nallowed_origins = [\"https://app.example/\"]\n",
                "http.allowed_origins",
            ),
            (
                "[http]\npublic_names = [\"Box.lan\"]\n",
                "http.public_names",
            ),
            ("[http]\nthreads = 0\n", "http.threads"),
            ("[http]\ntoken_file = \"rel/token\"\n", "http.token_file"),
        ] {
            let e = parse(text).unwrap().check(text).unwrap_err();
            assert_eq!(e.key.as_deref(), Some(key), "{text}");
        }
        assert!(valid_public_name("[::1]:8080"));
        assert!(!valid_public_name("::1"));
    }

    #[test]
    fn gateway_section_is_checked() {
        let text = "[gateway]\nlisten = \"0.0.0.0\"\npublic_url = \"wss://gw.example/base\"\n";
        let cfg = parse(text).unwrap();
        cfg.check(text).unwrap();
        assert_eq!(cfg.gateway.addr(), Some("0.0.0.0:8443".parse().unwrap()));
        assert_eq!(gateway_addr("[::1]"), Some("[::1]:8443".parse().unwrap()));
        assert_eq!(
            gateway_addr("127.0.0.1:0"),
            Some("127.0.0.1:0".parse().unwrap())
        );
        for (text, key) in [
            ("[gateway]\nlisten = \"localhost\"\n", "gateway.listen"),
            (
                "[gateway]\npublic_url = \"https://x\"\n",
                "gateway.public_url",
            ),
            (
                "[gateway]\npublic_url = \"ws://x?token=1\"\n",
                "gateway.public_url",
            ),
            (
                "[gateway]\nmax_connections = 0\n",
                "gateway.max_connections",
            ),
            (
                "[gateway]\nwrite_timeout_ms = 5\n",
                "gateway.write_timeout_ms",
            ),
        ] {
            let e = parse(text).unwrap().check(text).unwrap_err();
            assert_eq!(e.key.as_deref(), Some(key), "{text}");
        }
    }

    #[test]
    fn effective_config_prints_and_parses_back() {
        let cfg = FileConfig::default();
        assert_eq!(parse(&cfg.to_toml()).unwrap(), cfg);
    }
}
