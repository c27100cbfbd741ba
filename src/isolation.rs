//! Whether bubblewrap can isolate processes on this machine: plugins (seed
//! 000; issue 4, "Isolation") and lanes' acceptance commands (issue 5) both
//! ask. Installed is not enough: a container or a unit with
//! RestrictNamespaces= can forbid the namespaces bwrap needs, so the probe
//! runs bwrap once with every namespace the daemon uses.
//!
//! The probe starts a process and waits for it, so it runs once on its own
//! thread after the daemon is ready (never on the start path, never on the
//! reactor), and its answer is handed to the reactor.
//!
//! What every process the daemon starts finds programs with lives here
//! too: [`DEFAULT_PATH`] and [`search_path`], the one copy of each.
//!
//! It also builds the namespace agents run in (issue 16, "Agents are
//! contained"; `[agents] isolation`). Unlike a plugin or an acceptance
//! command, an agent keeps the machine as the operator sees it: `/` is bound
//! writable at the same paths (its worktree, the repository's `.git`, the
//! operator's `~/.claude`, `~/.codex`, `~/.gitconfig`, `~/.ssh` and every
//! file a task may name), and the network is shared. What would hand it the
//! operator's powers is mounted over:
//!
//! - the daemon's state directory (ledger, `http.token`, keys) and the
//!   socket's directory, each with an empty tmpfs; the HTTP token file too
//!   when `[http] token_file` puts it elsewhere (an empty file over it). A
//!   directory that holds the operator's home cannot be hidden whole without
//!   hiding the home: then each entry it holds at spawn is covered instead
//!   (the socket file, or the state directory's files);
//! - the user's runtime directory (`$XDG_RUNTIME_DIR`, else
//!   `/run/user/UID`), whole: the session bus (`bus`), the systemd user
//!   manager (`systemd/`), and beside them container engines
//!   (`docker.sock`, `podman/`), the keyring, gpg-agent and the display
//!   server are each a way to run a command outside the daemon's tree or to
//!   act as the operator. The agent gets an empty private one;
//! - the tmux server directories `/tmp/tmux-UID` (and under `$TMUX_TMPDIR`
//!   when the daemon has it): a tmux server runs any command it is sent. When
//!   the directory does not exist yet the daemon creates it, mode 0700 as
//!   tmux itself does, so that the agent cannot create it for the
//!   operator's next server;
//! - `/tmp/.X11-unix`, whose sockets let a client type into the operator's
//!   terminals.
//!
//! Shown but read-only (`Hidden::protected`): the daemon's configuration,
//! its default directory (made when missing, so that no agent makes it
//! first) and a `--config` file elsewhere, since a rule an agent appended
//! there would approve its own requests after the next SIGHUP; and `/sys`,
//! whose cgroupfs and sysfs files are root's by owner and mode, so that
//! the agents of a daemon run as root (uid 0 without capabilities) cannot
//! write them. Every path is resolved (`resolved`) before it is mounted
//! over: bwrap mounts inside its new root, where a symlink on the way
//! (a `/home` that links to another disk) would lead out of it, and every
//! agent would fail to start.
//!
//! The daemon's own git for lanes runs in the same kind of namespace
//! (`namespace`, used by `crate::lanes::git`) while agents are contained.
//!
//! What is hidden (`hidden_for`, `Hidden::mount`) is the same set for the
//! two other sandboxes, acceptance commands (`crate::lanes::check`) and
//! plugins (`crate::plugins::process`), each of which keeps only what it
//! would show in the first place (`Hidden::shown_where`) and binds back
//! what it needs on top: one computation, so that the three cannot drift.
//!
//! A worktree inside a hidden directory is bound back on top. The agent has
//! its own PID namespace (`--unshare-pid`, with a new `/proc`): without it
//! `/proc/PID/root` of any process of the operator's leads back into the
//! unhidden filesystem, socket included. Its own `/dev` (a new devpts, so
//! the operator's terminals are not there), a new session (`--new-session`:
//! no controlling terminal), no capabilities (`--cap-drop ALL`, which
//! matters when the daemon runs as root), no new privileges (bwrap sets
//! PR_SET_NO_NEW_PRIVS for every sandbox) and `--die-with-parent`. Every
//! process the agent starts inherits all of it, and ends with it: the
//! namespace's first process is bwrap's init, and the kernel kills what
//! is left in a PID namespace when its init exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::config::AgentIsolation;

/// The result: the bwrap that works, or why there is none.
pub type Probe = Result<PathBuf, String>;

/// The PATH of a process the daemon starts when the daemon's own is unset
/// or empty, and the whole PATH of a plugin, which never gets the daemon's
/// (omniconfluxd(8), ENVIRONMENT; omniconflux-plugin(7)).
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The PATH agents, probes and acceptance commands run with, and where
/// programs named without a slash are looked up: the daemon's own, or
/// [`DEFAULT_PATH`] when it is unset, empty or not UTF-8.
pub fn search_path() -> String {
    std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.into())
}

/// Finds `name` on [`search_path`], or takes it as a path when it has a
/// slash.
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    std::env::split_paths(&search_path())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs bwrap with a read-only root, new /dev and /proc and every
/// namespace unshared. Blocking.
pub fn probe() -> Probe {
    let bwrap = which("bwrap").ok_or_else(|| "bubblewrap (bwrap) is not installed".to_string())?;
    let out = Command::new(&bwrap)
        .args([
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--unshare-all",
            "--die-with-parent",
            "true",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| {
            format!(
                "unable to run {}: {}",
                bwrap.display(),
                crate::errors::io_cause(&e)
            )
        })?;
    if out.status.success() {
        Ok(bwrap)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "bubblewrap cannot create namespaces here: {}",
            err.lines().next().unwrap_or("it failed").trim()
        ))
    }
}

/// Runs the probe on its own thread and calls `done` on the reactor with
/// the answer.
pub fn probe_later(
    inbox: crate::reactor::Inbox,
    done: impl FnOnce(&mut crate::daemon::Daemon, Probe) + Send + 'static,
) -> std::io::Result<()> {
    crate::probe_thread::spawn("isolation-probe", move || {
        let r = probe();
        inbox.run(move |d| done(d, r));
    })?;
    Ok(())
}

/// How agents run, decided from `[agents] isolation` and the probe.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentSandbox {
    /// The probe has not answered yet: spawns wait for it.
    Pending,
    /// In a namespace, through this bwrap.
    Namespace(PathBuf),
    /// Uncontained, and why.
    Uncontained(String),
}

impl AgentSandbox {
    pub fn decide(mode: AgentIsolation, probe: Option<&Probe>) -> AgentSandbox {
        if mode == AgentIsolation::None {
            return AgentSandbox::Uncontained("agents.isolation is none".into());
        }
        match probe {
            None => AgentSandbox::Pending,
            Some(Ok(bwrap)) => AgentSandbox::Namespace(bwrap.clone()),
            Some(Err(why)) => AgentSandbox::Uncontained(why.clone()),
        }
    }

    /// The socket's and the command line's shape: `{"mode", "reason"}`.
    pub fn to_json(&self) -> serde_json::Value {
        let (mode, reason) = match self {
            AgentSandbox::Pending => ("pending", None),
            AgentSandbox::Namespace(_) => ("namespace", None),
            AgentSandbox::Uncontained(why) => ("none", Some(why.as_str())),
        };
        serde_json::json!({"mode": mode, "reason": reason})
    }
}

/// What no process the daemon sandboxes may see (module comment): agents,
/// acceptance commands and plugins alike. Directories are mounted over
/// with an empty tmpfs and files covered by an empty one. The daemon's own
/// directories are read-only as well, so that a write meant for them fails
/// plainly instead of landing in a tmpfs nobody reads; the others (runtime
/// and tmux directories) stay writable, private to the sandbox, so that an
/// agent can run its own tmux or D-Bus.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hidden {
    pub dirs: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
    pub files: Vec<PathBuf>,
    /// Shown but not writable: the daemon's configuration (a rule an agent
    /// wrote there would approve its requests after the next SIGHUP).
    pub protected: Vec<PathBuf>,
}

/// `p` as the kernel finds it, every symlink resolved: bwrap mounts at
/// the resolved path inside its new root, where a symlink on the way
/// leads out of it ("Can't mount tmpfs on /newroot/..."), and a path
/// is compared with another only once both are resolved. A path that does
/// not exist yet is its nearest existing parent resolved, with the rest
/// appended.
pub fn resolved(p: &Path) -> PathBuf {
    for a in p.ancestors() {
        if let Ok(real) = a.canonicalize() {
            return match p.strip_prefix(a) {
                Ok(rest) if !rest.as_os_str().is_empty() => real.join(rest),
                _ => real,
            };
        }
    }
    p.to_path_buf()
}

/// Where the daemon keeps what an agent must not reach.
pub struct DaemonPaths<'a> {
    pub state_dir: &'a Path,
    pub socket: &'a Path,
    /// `[http] token_file` when it is set.
    pub token_file: Option<&'a Path>,
    /// The configuration file the daemon reads (and reads again on SIGHUP).
    pub config: &'a Path,
    /// Where the configuration file is when `--config` does not say:
    /// its directory is the daemon's own.
    pub default_config: &'a Path,
}

/// Whether hiding `dir` whole would hide the operator's home (or all of `/`).
fn holds_home(dir: &Path, home: Option<&Path>) -> bool {
    dir == Path::new("/") || home.is_some_and(|h| h.starts_with(dir))
}

/// The parts of the daemon's environment that say where the user's
/// services listen.
#[derive(Debug, Clone, Default)]
pub struct UserEnv {
    pub home: Option<PathBuf>,
    pub xdg_runtime_dir: Option<PathBuf>,
    pub tmux_tmpdir: Option<PathBuf>,
    pub uid: u32,
}

impl UserEnv {
    pub fn from_process() -> UserEnv {
        let path = |k: &str| {
            std::env::var_os(k)
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        UserEnv {
            home: path("HOME"),
            xdg_runtime_dir: path("XDG_RUNTIME_DIR"),
            tmux_tmpdir: path("TMUX_TMPDIR"),
            // SAFETY: getuid cannot fail and touches no memory.
            uid: unsafe { libc::getuid() },
        }
    }
}

/// Collects what to hide from a sandbox, from the daemon's paths and the
/// daemon's own environment. Creates a missing tmux directory (module
/// comment); a failure to do so leaves it to bwrap, which then refuses to
/// start, so that no agent runs with a tmux directory it could create.
pub fn hidden_paths(daemon: &DaemonPaths, env: &UserEnv) -> Hidden {
    let home = env.home.as_deref().map(resolved);
    let home = home.as_deref();
    let uid = env.uid;
    let state_dir = &resolved(daemon.state_dir);
    let socket = &resolved(daemon.socket);
    let mut h = Hidden::default();
    let hide_dir = |h: &mut Hidden, dir: &Path, files_if_home: &[&Path]| {
        if !holds_home(dir, home) {
            h.dirs.push(dir.to_path_buf());
            h.read_only.push(dir.to_path_buf());
            return;
        }
        for f in files_if_home {
            if f.exists() && !holds_home(f, home) {
                if f.is_dir() {
                    h.dirs.push(f.to_path_buf());
                } else {
                    h.files.push(f.to_path_buf());
                }
            }
        }
    };
    let state_entries: Vec<PathBuf> = if holds_home(state_dir, home) {
        std::fs::read_dir(state_dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let refs: Vec<&Path> = state_entries.iter().map(PathBuf::as_path).collect();
    hide_dir(&mut h, state_dir, &refs);
    if let Some(dir) = socket.parent() {
        hide_dir(&mut h, dir, &[socket.as_path()]);
    }
    if let Some(f) = daemon.token_file.map(resolved) {
        if f.exists() && !h.dirs.iter().any(|d| f.starts_with(d)) {
            h.files.push(f);
        }
    }
    let runtime = resolved(
        &env.xdg_runtime_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/run/user/{uid}"))),
    );
    if runtime.is_dir() && !holds_home(&runtime, home) {
        h.dirs.push(runtime);
    }
    let mut tmux_bases = vec![resolved(Path::new("/tmp"))];
    if let Some(t) = env.tmux_tmpdir.as_deref().map(resolved) {
        if !tmux_bases.contains(&t) && t.is_dir() {
            tmux_bases.push(t);
        }
    }
    for base in tmux_bases {
        let dir = base.join(format!("tmux-{uid}"));
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        }
        h.dirs.push(dir);
    }
    let x11 = Path::new("/tmp/.X11-unix");
    if x11.is_dir() {
        h.dirs.push(x11.to_path_buf());
    }
    // One mount per directory: what lies inside a hidden one is hidden too.
    let all = h.dirs.clone();
    h.dirs = all
        .iter()
        .enumerate()
        .filter(|(i, d)| {
            !all.iter()
                .enumerate()
                .any(|(j, o)| (j < *i && o == *d) || (o != *d && d.starts_with(o)))
        })
        .map(|(_, d)| d.clone())
        .collect();
    let dirs = &h.dirs;
    h.files.retain(|f| !dirs.iter().any(|d| f.starts_with(d)));
    h.files.sort();
    h.files.dedup();
    h.read_only.retain(|r| dirs.contains(r));
    h.read_only.dedup();
    h.protected = protected_config(daemon, home)
        .into_iter()
        .filter(|p| !dirs.iter().any(|d| p.starts_with(d)))
        .collect();
    h
}

/// What of the daemon's configuration a sandbox must not write: the
/// default configuration directory (made when missing, so that no agent
/// makes it first; mode 0755, as the system unit's ConfigurationDirectory
/// has it, since a config holds no secret and a root daemon's
/// /etc/omniconflux must stay readable by the service user that later
/// runs the system unit), and a `--config` file elsewhere, or,
/// while that file does not exist, its directory unless it holds the
/// home (SIGHUP reads the file once it exists).
fn protected_config(daemon: &DaemonPaths, home: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = daemon.default_config.parent() {
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir);
        }
        let dir = resolved(dir);
        if dir.is_dir() && !holds_home(&dir, home) {
            out.push(dir);
        }
    }
    let config = resolved(daemon.config);
    if out.iter().any(|d| config.starts_with(d)) {
        return out;
    }
    if config.exists() {
        out.push(config);
    } else if let Some(dir) = config
        .parent()
        .filter(|d| d.is_dir() && !holds_home(d, home))
    {
        out.push(dir.to_path_buf());
    }
    out
}

/// What the daemon `d` hides from every sandbox, from its paths, its
/// `[http] token_file` and its environment: the one computation agents,
/// acceptance commands and plugins share. On the reactor: it reads at most
/// the state directory's listing.
pub fn hidden_for(d: &crate::daemon::Daemon) -> Hidden {
    let token = Path::new(&d.cfg.http.token_file);
    hidden_paths(
        &DaemonPaths {
            state_dir: &d.paths.state_dir,
            socket: &d.paths.socket,
            token_file: token.is_absolute().then_some(token),
            config: &d.paths.config,
            default_config: &crate::config::Env::from_process().default_config_path(),
        },
        &UserEnv::from_process(),
    )
}

/// Whether a path bound back into a sandbox may be written there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    Writable,
}

impl Hidden {
    /// Only what a sandbox shows in the first place, as `shown` says: a
    /// sandbox that binds a few system folders need not cover what it
    /// never binds, and one with a private `/tmp` need not cover what lies
    /// there.
    pub fn shown_where(&self, shown: impl Fn(&Path) -> bool) -> Hidden {
        let keep = |v: &Vec<PathBuf>| v.iter().filter(|p| shown(p)).cloned().collect();
        Hidden {
            dirs: keep(&self.dirs),
            read_only: keep(&self.read_only),
            files: keep(&self.files),
            protected: keep(&self.protected),
        }
    }

    /// Appends to a bwrap command line, after what the sandbox binds of the
    /// machine: an empty tmpfs over each hidden directory, `/dev/null` over
    /// each hidden file, then each of `back` bound again at its own path
    /// (parents before what they hold, so that a deeper bind is not covered
    /// by a shallower one), then the daemon's configuration bound
    /// read-only over itself, then the daemon's own directories remounted
    /// read-only. That remount is bwrap's non-recursive one: what `back`
    /// bound inside keeps its own access.
    pub fn mount(&self, c: &mut Command, back: &[(&Path, Access)]) {
        for d in &self.dirs {
            // 0700 as the directories it covers are, and as tmux requires
            // of an agent's own tmux directory.
            c.args(["--perms", "0700", "--tmpfs"]).arg(d);
        }
        for f in &self.files {
            c.arg("--ro-bind").arg("/dev/null").arg(f);
        }
        let mut back = back.to_vec();
        back.sort_by_key(|(p, _)| p.components().count());
        for (p, access) in back {
            let how = match access {
                Access::ReadOnly => "--ro-bind",
                Access::Writable => "--bind",
            };
            c.arg(how).arg(p).arg(p);
        }
        for p in &self.protected {
            c.arg("--ro-bind").arg(p).arg(p);
        }
        for d in &self.read_only {
            c.arg("--remount-ro").arg(d);
        }
    }
}

/// The command that runs `program` in the agent namespace of the module
/// comment, in `cwd`. The caller sets the environment (bwrap hands it on
/// unchanged).
pub fn contain(bwrap: &Path, hidden: &Hidden, cwd: &Path, program: &Path) -> Command {
    let cwd = resolved(cwd);
    let mut c = namespace(bwrap, hidden, &[(&cwd, Access::Writable)]);
    c.arg("--chdir").arg(&cwd).arg("--").arg(program);
    c.current_dir(&cwd);
    c
}

/// bwrap with the agent namespace set up, the program still to be named:
/// agents (`contain`) and the daemon's own git for lanes
/// (`crate::lanes::git`) run in the same kind. Of `back`, what lies in a
/// hidden directory is bound again on top; the rest is in sight already.
/// `/sys` is read-only: with the daemon running as root, an agent (uid 0,
/// without capabilities) could otherwise write cgroupfs and sysfs files,
/// which are root's by owner and mode.
pub fn namespace(bwrap: &Path, hidden: &Hidden, back: &[(&Path, Access)]) -> Command {
    let mut c = Command::new(bwrap);
    c.args([
        "--bind",
        "/",
        "/",
        "--ro-bind",
        "/sys",
        "/sys",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-pid",
        "--new-session",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]);
    let back: Vec<(&Path, Access)> = back
        .iter()
        .filter(|(p, _)| hidden.dirs.iter().any(|d| p.starts_with(d)))
        .copied()
        .collect();
    hidden.mount(&mut c, &back);
    c
}

/// Whether the daemon runs as root: its agents then do too, without
/// capabilities but owning every root-owned file the namespace leaves
/// writable (`/etc`, `/usr`), which the daemon says once at start.
pub fn runs_as_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Marks every descriptor above 2 the daemon inherited close-on-exec, at
/// the very start of `serve`: an open file its starter left it (`exec
/// 7>file; omniconfluxd serve`) would otherwise reach every agent, check
/// and plugin, inside their sandboxes too, since a descriptor is not a
/// path a mount can hide. The daemon keeps none of them: it takes no
/// sockets from its service manager (no LISTEN_FDS), and `sd_notify`
/// opens a socket of its own. `close_range(2)` does it in one call; where
/// the kernel is older than 5.11 or a filter refuses it, each descriptor
/// `/proc/self/fd` lists is marked in turn.
pub fn close_inherited_on_exec() -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on
    // the process's descriptors; it reads and writes no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let fds: Vec<libc::c_int> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_GETFD and F_SETFD read and set the descriptor's flags
        // only; one closed meanwhile (the listing's own) fails with EBADF.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// The process group of what runs inside an agent's namespace: bwrap's
/// first child there leads a session of its own (`--new-session`), and the
/// agent and its processes are in it. None before bwrap has forked, after
/// it is gone, or where the kernel has no `/proc/PID/task/PID/children`.
///
/// A signal for the agent goes to this group, not to bwrap: bwrap does
/// not pass signals on and dies of SIGTERM, and its child then gets the
/// SIGKILL of `--die-with-parent`, so the agent would never get to end its
/// turn cleanly. The namespace's init ignores what it has no handler for,
/// so only the agent and its processes see the signal.
pub fn inner_group(bwrap_pid: i32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{bwrap_pid}/task/{bwrap_pid}/children")).ok()?;
    let inner: i32 = children.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{inner}/stat")).ok()?;
    // After the command name (which may hold spaces and parentheses):
    // state, ppid, pgrp.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let (_state, ppid, pgrp) = (f.next()?, f.next()?, f.next()?);
    (ppid.parse::<i32>().ok()? == bwrap_pid && pgrp.parse::<i32>().ok()? == inner).then_some(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temp dir, removed after.
    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            let p = std::env::temp_dir().join(format!(
                "omni-iso-{tag}-{}-{}",
                std::process::id(),
                crate::ids::prefixed_id("")
            ));
            std::fs::create_dir_all(&p).unwrap();
            Tmp(p.canonicalize().unwrap())
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_daemons_dirs_the_runtime_dir_and_tmux_are_hidden_once_each() {
        let t = Tmp::new("dirs");
        let (state, run, rt, tmx) = (
            t.0.join("state"),
            t.0.join("state/run"),
            t.0.join("rt"),
            t.0.join("tmx"),
        );
        for d in [&state, &run, &rt, &tmx] {
            std::fs::create_dir_all(d).unwrap();
        }
        let env = UserEnv {
            home: Some(t.0.join("home")),
            xdg_runtime_dir: Some(rt.clone()),
            tmux_tmpdir: Some(tmx.clone()),
            uid: 4242,
        };
        let h = hidden_paths(
            &DaemonPaths {
                state_dir: &state,
                socket: &run.join("d.sock"),
                token_file: None,
                config: &t.0.join("conf/omniconfluxd.toml"),
                default_config: &t.0.join("conf/omniconfluxd.toml"),
            },
            &env,
        );
        // The socket's directory lies in the state directory: one mount.
        assert_eq!(
            &h.dirs[..4],
            &[
                state.clone(),
                rt,
                PathBuf::from("/tmp/tmux-4242"),
                tmx.join("tmux-4242")
            ]
        );
        assert_eq!(h.read_only, vec![state]);
        assert!(h.files.is_empty());
        // The tmux directory was made as tmux makes it.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tmx.join("tmux-4242"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let _ = std::fs::remove_dir("/tmp/tmux-4242");
    }

    #[test]
    fn a_dir_holding_the_home_is_covered_entry_by_entry_never_the_home() {
        let t = Tmp::new("home");
        let home = t.0.join("op");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(t.0.join("http.token"), "secret").unwrap();
        std::fs::create_dir_all(t.0.join("plugins")).unwrap();
        std::fs::write(t.0.join("d.sock"), "").unwrap();
        let env = UserEnv {
            home: Some(home.clone()),
            uid: 4243,
            ..UserEnv::default()
        };
        let h = hidden_paths(
            &DaemonPaths {
                state_dir: &t.0,
                socket: &t.0.join("d.sock"),
                token_file: None,
                config: &t.0.join("conf/omniconfluxd.toml"),
                default_config: &t.0.join("conf/omniconfluxd.toml"),
            },
            &env,
        );
        assert!(!h.dirs.contains(&t.0) && !h.dirs.contains(&home), "{h:?}");
        assert!(h.dirs.contains(&t.0.join("plugins")), "{h:?}");
        assert!(h.files.contains(&t.0.join("http.token")), "{h:?}");
        assert!(h.files.contains(&t.0.join("d.sock")), "{h:?}");
        assert!(h.read_only.is_empty());
        let _ = std::fs::remove_dir("/tmp/tmux-4243");
    }

    #[test]
    fn a_worktree_inside_a_hidden_dir_is_bound_back_before_the_read_only_remount() {
        let h = Hidden {
            dirs: vec![PathBuf::from("/s"), PathBuf::from("/r")],
            read_only: vec![PathBuf::from("/s")],
            files: vec![PathBuf::from("/t/token")],
            protected: vec![],
        };
        let c = contain(
            Path::new("/usr/bin/bwrap"),
            &h,
            Path::new("/s/wt"),
            Path::new("agent"),
        );
        let args = args(&c);
        let at = |needle: &[&str]| {
            args.windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} not in {args:?}"))
        };
        let tmpfs = at(&["--perms", "0700", "--tmpfs", "/s"]);
        let bind = at(&["--bind", "/s/wt", "/s/wt"]);
        let ro = at(&["--remount-ro", "/s"]);
        assert!(tmpfs < bind && bind < ro, "{args:?}");
        at(&["--ro-bind", "/dev/null", "/t/token"]);
        at(&["--unshare-pid", "--new-session", "--die-with-parent"]);
        at(&["--cap-drop", "ALL"]);
        assert_eq!(&args[args.len() - 4..], ["--chdir", "/s/wt", "--", "agent"]);
    }

    fn args(c: &Command) -> Vec<String> {
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_sandbox_covers_only_what_it_shows_and_binds_parents_first() {
        let h = Hidden {
            dirs: vec![PathBuf::from("/opt/s"), PathBuf::from("/run/user/7")],
            read_only: vec![PathBuf::from("/opt/s")],
            files: vec![PathBuf::from("/etc/t/token"), PathBuf::from("/tmp/x")],
            protected: vec![PathBuf::from("/etc/o"), PathBuf::from("/tmp/o")],
        };
        let shown = h.shown_where(|p| p.starts_with("/opt") || p.starts_with("/etc"));
        assert_eq!(
            shown,
            Hidden {
                dirs: vec![PathBuf::from("/opt/s")],
                read_only: vec![PathBuf::from("/opt/s")],
                files: vec![PathBuf::from("/etc/t/token")],
                protected: vec![PathBuf::from("/etc/o")],
            }
        );
        let mut c = Command::new("bwrap");
        shown.mount(
            &mut c,
            &[
                (Path::new("/opt/s/lanes/co-1"), Access::Writable),
                (Path::new("/opt/s"), Access::ReadOnly),
            ],
        );
        assert_eq!(
            args(&c),
            [
                "--perms",
                "0700",
                "--tmpfs",
                "/opt/s",
                "--ro-bind",
                "/dev/null",
                "/etc/t/token",
                "--ro-bind",
                "/opt/s",
                "/opt/s",
                "--bind",
                "/opt/s/lanes/co-1",
                "/opt/s/lanes/co-1",
                "--ro-bind",
                "/etc/o",
                "/etc/o",
                "--remount-ro",
                "/opt/s"
            ]
        );
    }

    #[test]
    fn paths_behind_symlinks_are_hidden_where_they_lead_and_the_config_protected() {
        let t = Tmp::new("link");
        let real = t.0.join("real");
        std::fs::create_dir_all(real.join("state")).unwrap();
        std::fs::create_dir_all(real.join("op")).unwrap();
        std::os::unix::fs::symlink(&real, t.0.join("link")).unwrap();
        let link = t.0.join("link");
        // A path that does not exist yet resolves through its parent.
        assert_eq!(
            resolved(&link.join("state/run/d.sock")),
            real.join("state/run/d.sock")
        );
        std::fs::write(t.0.join("elsewhere.toml"), "").unwrap();
        let env = UserEnv {
            home: Some(link.join("op")),
            uid: 4244,
            ..UserEnv::default()
        };
        let h = hidden_paths(
            &DaemonPaths {
                state_dir: &link.join("state"),
                socket: &link.join("state/run/d.sock"),
                token_file: None,
                config: &t.0.join("elsewhere.toml"),
                default_config: &link.join("op/.config/omniconflux/omniconfluxd.toml"),
            },
            &env,
        );
        assert!(h.dirs.contains(&real.join("state")), "{h:?}");
        assert_eq!(h.read_only, vec![real.join("state")]);
        assert_eq!(
            h.protected,
            vec![
                real.join("op/.config/omniconflux"),
                t.0.join("elsewhere.toml")
            ]
        );
        assert!(real.join("op/.config/omniconflux").is_dir());
        let _ = std::fs::remove_dir("/tmp/tmux-4244");
    }

    #[test]
    fn the_decision_follows_the_setting_then_the_probe() {
        let ok: Probe = Ok(PathBuf::from("/usr/bin/bwrap"));
        let no: Probe = Err("bubblewrap (bwrap) is not installed".into());
        assert_eq!(
            AgentSandbox::decide(AgentIsolation::None, Some(&ok)),
            AgentSandbox::Uncontained("agents.isolation is none".into())
        );
        assert_eq!(
            AgentSandbox::decide(AgentIsolation::Namespace, None),
            AgentSandbox::Pending
        );
        assert_eq!(
            AgentSandbox::decide(AgentIsolation::Namespace, Some(&ok)),
            AgentSandbox::Namespace(PathBuf::from("/usr/bin/bwrap"))
        );
        assert_eq!(
            AgentSandbox::decide(AgentIsolation::Namespace, Some(&no)).to_json(),
            serde_json::json!({"mode": "none", "reason": "bubblewrap (bwrap) is not installed"})
        );
    }
}
