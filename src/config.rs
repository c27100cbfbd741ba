//! The configuration file `omniconfluxd.toml`, its defaults, and the paths the
//! daemon uses (DESIGN.md, "Paths"; issue 2, "config check").
//!
//! Parsing is apart from checking: [`parse`] turns TOML into [`FileConfig`]
//! and refuses unknown keys and wrong types (serde's `deny_unknown_fields`);
//! [`FileConfig::check`] then refuses bad values. Both errors name the key,
//! the line and what was expected. Every key has a default, so a missing file
//! and an empty file run the same daemon.
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

/// The file as written, every section optional.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub daemon: DaemonSection,
    pub socket: SocketSection,
    pub plugins: PluginsSection,
    pub lanes: LanesSection,
    /// Repositories lanes may work on, besides those added with repos.add.
    pub repo: Vec<RepoEntry>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LanesSection {
    /// Branch prefix of lane branches: `<prefix>/<name>`.
    pub branch_prefix: String,
    /// Where lane worktrees go. Empty: `<repo>-wt/<name>` beside the repository.
    pub worktree_root: String,
    /// Verify rounds before a lane stops at cap.
    pub max_rounds: u32,
    /// `fast-forward` or `merge-commit`.
    pub merge: String,
    /// Ask the operator in the inbox before any merge.
    pub require_merge_approval: bool,
    /// The acceptance command's time limit, in seconds.
    pub check_timeout_secs: u64,
    /// Refuse tasks whose check cannot run isolated (bubblewrap).
    pub require_isolation: bool,
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

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RepoEntry {
    /// The repository's absolute path.
    pub path: String,
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
    /// `auto` (bubblewrap when it works here) or `none`.
    pub isolation: String,
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
        }
    }
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
        let message = e.message().lines().next().unwrap_or("invalid toml").trim().to_string();
        ConfigError { path: None, key: key_from_message(&message), line, message }
    })
}

fn line_of(text: &str, byte: usize) -> usize {
    text.as_bytes()[..byte.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
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
            current = rest.trim_start_matches('[').split(']').next().unwrap_or("").trim().to_string();
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
            return Err(bad("daemon", "log_level", format!("expected one of error, warn, info, debug, found {:?}", d.log_level)));
        }
        for (key, value) in [("state_dir", &d.state_dir), ("socket", &d.socket)] {
            if !value.is_empty() && !Path::new(value).is_absolute() {
                return Err(bad("daemon", key, format!("expected an absolute path, found {value:?}")));
            }
        }
        if !d.socket.is_empty() && d.socket.len() >= SUN_PATH_MAX {
            return Err(bad("daemon", "socket", format!("expected a path shorter than {SUN_PATH_MAX} bytes")));
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
                format!("expected 1 to {}, found {}", limits::SOCKET_MAX_CONNECTIONS_CEILING, s.max_connections),
            ));
        }
        if !(1..=1024).contains(&s.max_in_flight) {
            return Err(bad("socket", "max_in_flight", format!("expected 1 to 1024, found {}", s.max_in_flight)));
        }
        if !(64 * 1024..=1024 * 1024 * 1024).contains(&s.max_queued_bytes) {
            return Err(bad(
                "socket",
                "max_queued_bytes",
                format!("expected 65536 to 1073741824, found {}", s.max_queued_bytes),
            ));
        }
        let l = &self.lanes;
        if l.branch_prefix.is_empty()
            || l.branch_prefix.len() > 64
            || !l.branch_prefix.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
            || l.branch_prefix.starts_with(['/', '.', '-'])
            || l.branch_prefix.ends_with('/')
        {
            return Err(bad("lanes", "branch_prefix", "expected 1 to 64 letters, digits, '-', '_', '.' or '/', not starting with '/', '.' or '-'".into()));
        }
        if !l.worktree_root.is_empty() && !Path::new(&l.worktree_root).is_absolute() {
            return Err(bad("lanes", "worktree_root", format!("expected an absolute path, found {:?}", l.worktree_root)));
        }
        if !(1..=50).contains(&l.max_rounds) {
            return Err(bad("lanes", "max_rounds", format!("expected 1 to 50, found {}", l.max_rounds)));
        }
        if !matches!(l.merge.as_str(), "fast-forward" | "merge-commit") {
            return Err(bad("lanes", "merge", format!("expected fast-forward or merge-commit, found {:?}", l.merge)));
        }
        if !(1..=86_400).contains(&l.check_timeout_secs) {
            return Err(bad("lanes", "check_timeout_secs", format!("expected 1 to 86400, found {}", l.check_timeout_secs)));
        }
        for r in &self.repo {
            if !Path::new(&r.path).is_absolute() {
                return Err(ConfigError {
                    path: None,
                    key: Some("repo.path".into()),
                    line: locate(text, "repo", "path"),
                    message: format!("expected an absolute path, found {:?}", r.path),
                });
            }
        }
        let p = &self.plugins;
        if p.isolation != "auto" && p.isolation != "none" {
            return Err(bad("plugins", "isolation", format!("expected auto or none, found {:?}", p.isolation)));
        }
        for (key, value) in [("node", &p.node), ("python", &p.python)] {
            if value.is_empty() || value.contains('\0') {
                return Err(bad("plugins", key, "expected a program name or an absolute path".into()));
            }
        }
        for (key, value, min) in [
            ("ping_interval_ms", p.ping_interval_ms, 10),
            ("ping_timeout_ms", p.ping_timeout_ms, 10),
            ("initialize_timeout_ms", p.initialize_timeout_ms, 10),
            ("restart_backoff_ms", p.restart_backoff_ms, 1),
            ("watch_interval_ms", p.watch_interval_ms, 10),
        ] {
            if !(min..=3_600_000).contains(&value) {
                return Err(bad("plugins", key, format!("expected {min} to 3600000, found {value}")));
            }
        }
        if !(1..=1000).contains(&p.crash_limit) {
            return Err(bad("plugins", "crash_limit", format!("expected 1 to 1000, found {}", p.crash_limit)));
        }
        if !(1..=limits::PLUGIN_MAX_INSTALLED).contains(&p.max_running) {
            return Err(bad("plugins", "max_running", format!("expected 1 to {}, found {}", limits::PLUGIN_MAX_INSTALLED, p.max_running)));
        }
        if !(64..=65_536).contains(&p.memory_mb) {
            return Err(bad("plugins", "memory_mb", format!("expected 64 to 65536, found {}", p.memory_mb)));
        }
        if !(1..=4096).contains(&p.max_processes) {
            return Err(bad("plugins", "max_processes", format!("expected 1 to 4096, found {}", p.max_processes)));
        }
        Ok(())
    }

    pub fn log_level(&self) -> Level {
        Level::parse(&self.daemon.log_level).unwrap_or(Level::Info)
    }

    /// The effective configuration as TOML, defaults filled in.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# unable to print the configuration: {e}\n"))
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
        && b[1..].iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
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
        let abs = |k: &str| std::env::var_os(k).map(PathBuf::from).filter(|p| p.is_absolute());
        // systemd may hand over several directories separated by ':'; ours is the first.
        let first = |k: &str| {
            abs(k).map(|p| PathBuf::from(p.to_string_lossy().split(':').next().unwrap_or_default().to_string()))
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
        let base = self.xdg_config_home.clone().unwrap_or_else(|| self.home_dir().join(".config"));
        base.join("omniconflux/omniconfluxd.toml")
    }

    fn default_state_dir(&self) -> PathBuf {
        if let Some(d) = &self.state_directory {
            return d.clone();
        }
        if self.uid == 0 && self.xdg_state_home.is_none() {
            return PathBuf::from("/var/lib/omniconflux");
        }
        let base = self.xdg_state_home.clone().unwrap_or_else(|| self.home_dir().join(".local/state"));
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
        let config = flags.config.clone().unwrap_or_else(|| env.default_config_path());
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
        Paths { config, state_dir, socket, ledger }
    }
}

fn non_empty(s: &str) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// The config in force: the file when there is one, the defaults when the
/// default path has none. A file named by `--config` must exist.
pub fn load_effective(flags: &PathFlags, env: &Env) -> Result<(FileConfig, Paths), ConfigError> {
    let path = flags.config.clone().unwrap_or_else(|| env.default_config_path());
    let cfg = if flags.config.is_none() && !path.exists() { FileConfig::default() } else { load(&path)? };
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

/// Compares the running config with a newly read one. Paths are fixed for the
/// life of the process; levels and bounds for new connections apply at once.
pub fn diff(old: &FileConfig, new: &FileConfig) -> ReloadReport {
    let mut r = ReloadReport::default();
    let mut note = |changed: bool, key: &str, live: bool| {
        if changed {
            if live { r.applied.push(key.into()) } else { r.needs_restart.push(key.into()) }
        }
    };
    note(old.daemon.state_dir != new.daemon.state_dir, "daemon.state_dir", false);
    note(old.daemon.socket != new.daemon.socket, "daemon.socket", false);
    note(old.daemon.node_name != new.daemon.node_name, "daemon.node_name", false);
    note(old.daemon.log_level != new.daemon.log_level, "daemon.log_level", true);
    note(old.socket.max_connections != new.socket.max_connections, "socket.max_connections", true);
    note(old.socket.max_in_flight != new.socket.max_in_flight, "socket.max_in_flight", true);
    note(old.socket.max_queued_bytes != new.socket.max_queued_bytes, "socket.max_queued_bytes", true);
    // Lane settings apply to the next step of every lane; repositories to
    // the next dispatch.
    note(old.lanes != new.lanes, "lanes", true);
    note(old.repo != new.repo, "repo", true);
    // Plugin settings apply to the next start of each plugin.
    note(old.plugins != new.plugins, "plugins", true);
    r
}

#[cfg(test)]
mod tests {
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
    fn paths_follow_precedence() {
        let env = Env {
            home: Some("/home/op".into()),
            xdg_runtime_dir: Some("/run/user/1000".into()),
            uid: 1000,
            ..Env::default()
        };
        let p = Paths::resolve(&PathFlags::default(), &FileConfig::default(), &env);
        assert_eq!(p.config, PathBuf::from("/home/op/.config/omniconflux/omniconfluxd.toml"));
        assert_eq!(p.state_dir, PathBuf::from("/home/op/.local/state/omniconflux"));
        assert_eq!(p.socket, PathBuf::from("/run/user/1000/omniconflux/omniconfluxd.sock"));
        let sys = Env { state_directory: Some("/var/lib/omniconflux".into()), runtime_directory: Some("/run/omniconflux".into()), ..Env::default() };
        let p = Paths::resolve(&PathFlags::default(), &FileConfig::default(), &sys);
        assert_eq!(p.socket, PathBuf::from("/run/omniconflux/omniconfluxd.sock"));
        assert_eq!(p.ledger, PathBuf::from("/var/lib/omniconflux/ledger.sqlite3"));
        let flags = PathFlags { socket: Some("/x/s.sock".into()), ..PathFlags::default() };
        let mut cfg = FileConfig::default();
        cfg.daemon.socket = "/cfg/s.sock".into();
        assert_eq!(Paths::resolve(&flags, &cfg, &env).socket, PathBuf::from("/x/s.sock"));
        assert_eq!(Paths::resolve(&PathFlags::default(), &cfg, &env).socket, PathBuf::from("/cfg/s.sock"));
    }

    #[test]
    fn reload_sorts_live_from_restart_keys() {
        let old = FileConfig::default();
        let mut new = old.clone();
        new.daemon.log_level = "debug".into();
        new.daemon.socket = "/elsewhere.sock".into();
        let r = diff(&old, &new);
        assert_eq!(r.applied, vec!["daemon.log_level".to_string()]);
        assert_eq!(r.needs_restart, vec!["daemon.socket".to_string()]);
    }

    #[test]
    fn effective_config_prints_and_parses_back() {
        let cfg = FileConfig::default();
        assert_eq!(parse(&cfg.to_toml()).unwrap(), cfg);
    }
}
