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
    pub http: HttpSection,
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
            return Err(("listen", format!("expected IP:PORT such as 127.0.0.1:7777, found {:?}", self.listen)));
        }
        if !self.token_file.is_empty() && !Path::new(&self.token_file).is_absolute() {
            return Err(("token_file", format!("expected an absolute path, found {:?}", self.token_file)));
        }
        for o in &self.allowed_origins {
            if !valid_origin(o) {
                return Err(("allowed_origins", format!("expected exact origins like https://app.example:8443, found {o:?}")));
            }
        }
        for n in &self.public_names {
            if !valid_public_name(n) {
                return Err(("public_names", format!("expected host names or name:port, found {n:?}")));
            }
        }
        if !(1..=limits::HTTP_MAX_CONNECTIONS_CEILING).contains(&self.max_connections) {
            return Err((
                "max_connections",
                format!("expected 1 to {}, found {}", limits::HTTP_MAX_CONNECTIONS_CEILING, self.max_connections),
            ));
        }
        if !(1..=limits::HTTP_THREADS_CEILING).contains(&self.threads) {
            return Err(("threads", format!("expected 1 to {}, found {}", limits::HTTP_THREADS_CEILING, self.threads)));
        }
        Ok(())
    }
}

/// `scheme://host[:port]` with scheme http or https, lowercase, nothing after.
pub fn valid_origin(o: &str) -> bool {
    let Some(rest) = o.strip_prefix("https://").or_else(|| o.strip_prefix("http://")) else { return false };
    !rest.is_empty() && valid_public_name(rest)
}

/// A lowercase host name, IPv4 literal or bracketed IPv6 literal, with an
/// optional `:port`.
pub fn valid_public_name(n: &str) -> bool {
    let (host_ok, port) = if let Some(rest) = n.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else { return false };
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
            && host.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
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
        if let Err((key, message)) = self.http.check() {
            return Err(bad("http", key, message));
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
    /// `serve --http ADDR`: turns the HTTP listener on for this run.
    pub http_listen: Option<String>,
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
    let mut cfg = if flags.config.is_none() && !path.exists() { FileConfig::default() } else { load(&path)? };
    if let Some(listen) = &flags.http_listen {
        cfg.http.listen = listen.clone();
        cfg.http.check().map_err(|(key, message)| ConfigError { path: None, key: Some(format!("--http ({key})")), line: None, message })?;
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
    // The listener, its token and its checks are fixed when it starts.
    note(old.http != new.http, "http", false);
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
    fn http_section_is_checked() {
        let text = "[http]\nlisten = \"127.0.0.1:7777\"\nallowed_origins = [\"https://app.example:8443\"]\npublic_names = [\"box.lan\", \"box.lan:443\"]\n";
        parse(text).unwrap().check(text).unwrap();
        for (text, key) in [
            ("[http]\nlisten = \"localhost\"\n", "http.listen"),
            ("[http]\nallowed_origins = [\"*\"]\n", "http.allowed_origins"),
            ("[http]\nallowed_origins = [\"https://app.example/\"]\n", "http.allowed_origins"),
            ("[http]\npublic_names = [\"Box.lan\"]\n", "http.public_names"),
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
    fn effective_config_prints_and_parses_back() {
        let cfg = FileConfig::default();
        assert_eq!(parse(&cfg.to_toml()).unwrap(), cfg);
    }
}
