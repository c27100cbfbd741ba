//! How a plugin process is started and watched: the interpreter its `main`
//! names, the bubblewrap sandbox where it works, the reduced environment,
//! the memory limit, and the count of its process tree (issue 4, "Processes
//! and containment").
//!
//! - `.mjs` and `.js` run with `plugins.node`, `.py` with `plugins.python`;
//!   any other `main` must be an executable file and runs directly.
//! - Isolation: when `plugins.isolation` is `auto` and `bwrap` is on PATH,
//!   the host tries it once at start (`bwrap --unshare-all true`). If that
//!   works, every plugin runs in its own namespaces: the system folders
//!   (`/usr`, `/etc`, `/opt` and the `/bin`, `/lib` links) read-only, its
//!   installed copy read-only at the same path, its working directory
//!   writable, a private `/tmp`, a new `/proc` and `/dev`, no network, and
//!   nothing else of the machine: no home, no state directory, no daemon
//!   socket, no runtime directory. What the daemon hides from agents
//!   (`crate::isolation::hidden_for`) is hidden here too where it lies in
//!   a bound folder (a state directory under `/opt`, a token file under
//!   `/etc`): an empty tmpfs over it, its copy and working directory bound
//!   back on top. No capabilities (`--cap-drop ALL`, which matters when the
//!   daemon runs as root: bwrap keeps root's otherwise, enough to unmount
//!   what covers a secret), a new session, and `--die-with-parent` and the
//!   pid namespace end every process of the plugin with it. Where bwrap is missing or cannot create namespaces
//!   the plugin runs unisolated; the log says so at start and each
//!   plugin's stderrTail starts with one line saying so.
//! - Environment: PATH, HOME (the working directory), TMPDIR, LANG; nothing
//!   of the daemon's. Descriptors: its three pipes only (every other
//!   descriptor of the daemon is close-on-exec).
//! - Memory: RLIMIT_AS of `plugins.memory_mb` on the plugin's processes
//!   (cgroup v2 is used by no code here: this host runs where no delegated v2
//!   subtree exists, see omniconflux-plugin(7)), and the resident memory of
//!   the whole tree read from /proc every `plugins.watch_interval_ms`.
//! - Processes: RLIMIT_NPROC counts every process of the user, so the host
//!   counts the plugin's own tree (its descendants and its process group)
//!   from /proc on the same watch.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::config::PluginsSection;
use crate::isolation::{Access, Hidden};

/// Whether plugins run sandboxed, decided once at start.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The bwrap program, when it works here.
    pub bwrap: Option<PathBuf>,
    /// Why plugins run unisolated, when they do.
    pub missing: Option<String>,
    /// False until the machine's probe has answered: no plugin starts
    /// before the host knows whether it can isolate it.
    pub probed: bool,
}

pub use crate::isolation::which;

impl Isolation {
    /// Before the probe has answered: plugins wait to start.
    pub fn pending() -> Isolation {
        Isolation {
            bwrap: None,
            missing: Some("isolation is still being probed".into()),
            probed: false,
        }
    }

    /// Decides isolation for this run of the daemon from the config and the
    /// machine's probe (module comment).
    pub fn decide(cfg: &PluginsSection, probe: &crate::isolation::Probe) -> Isolation {
        if cfg.isolation() == crate::config::PluginIsolation::None {
            return Isolation {
                bwrap: None,
                missing: Some("plugins.isolation is none".into()),
                probed: true,
            };
        }
        match probe {
            Ok(bwrap) => Isolation {
                bwrap: Some(bwrap.clone()),
                missing: None,
                probed: true,
            },
            Err(why) => Isolation {
                bwrap: None,
                missing: Some(why.clone()),
                probed: true,
            },
        }
    }
}

/// What the host needs to start one plugin.
pub struct Spec<'a> {
    pub copy: &'a Path,
    pub work: &'a Path,
    pub main: &'a str,
    /// What the daemon hides from every sandbox (`crate::isolation`).
    pub hidden: &'a Hidden,
}

/// Builds the command of a plugin (module comment); `Err` says why it
/// cannot start (the fault `spawn-failed`).
pub fn command(cfg: &PluginsSection, iso: &Isolation, spec: &Spec) -> Result<Command, String> {
    let main = spec.copy.join(spec.main);
    let ext = Path::new(spec.main)
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("");
    let interpreter = match ext {
        "mjs" | "js" => Some(
            which(&cfg.node)
                .ok_or_else(|| format!("the node interpreter {:?} was not found", cfg.node))?,
        ),
        "py" => Some(
            which(&cfg.python)
                .ok_or_else(|| format!("the python interpreter {:?} was not found", cfg.python))?,
        ),
        _ => None,
    };
    if interpreter.is_none() {
        use std::os::unix::fs::PermissionsExt;
        let exec = std::fs::metadata(&main)
            .map(|m| m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        if !exec {
            return Err("main is not .mjs, .js or .py and not an executable file".into());
        }
    }
    let interpreter = interpreter.map(|p| std::fs::canonicalize(&p).unwrap_or(p));
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if let Some(i) = &interpreter {
        argv.push(i.clone().into());
    }
    argv.push(main.clone().into());
    let mut cmd = match &iso.bwrap {
        Some(bwrap) => {
            let mut c = Command::new(bwrap);
            c.args([
                "--die-with-parent",
                "--new-session",
                "--unshare-all",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--tmpfs",
                "/tmp",
            ]);
            // What of the machine the plugin sees, to cover what of it the
            // daemon hides.
            let mut shown: Vec<PathBuf> = Vec::new();
            for d in ["/usr", "/etc", "/opt"] {
                if Path::new(d).is_dir() {
                    c.args(["--ro-bind", d, d]);
                    shown.push(d.into());
                }
            }
            for d in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
                match std::fs::read_link(d) {
                    Ok(target) => {
                        c.arg("--symlink").arg(target).arg(d);
                    }
                    Err(_) if Path::new(d).is_dir() => {
                        c.args(["--ro-bind", d, d]);
                        shown.push(d.into());
                    }
                    Err(_) => {}
                }
            }
            if let Some(i) = &interpreter {
                if !["/usr/", "/etc/", "/opt/", "/bin/", "/lib"]
                    .iter()
                    .any(|p| i.starts_with(p))
                {
                    c.arg("--ro-bind").arg(i).arg(i);
                    shown.push(i.clone());
                }
            }
            spec.hidden
                .shown_where(|p| shown.iter().any(|s| p.starts_with(s) || s.starts_with(p)))
                .mount(
                    &mut c,
                    &[(spec.copy, Access::ReadOnly), (spec.work, Access::Writable)],
                );
            c.args(["--cap-drop", "ALL"]);
            c.arg("--chdir").arg(spec.work);
            c.arg("--");
            c.args(&argv);
            c
        }
        None => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    cmd.current_dir(spec.work)
        .env_clear()
        .env("PATH", crate::isolation::DEFAULT_PATH)
        .env("HOME", spec.work)
        .env("TMPDIR", "/tmp")
        .env("LANG", "C.UTF-8");
    let bytes = cfg.memory_mb.saturating_mul(1024 * 1024);
    // The host starts this command through `Children::spawn`, which gives
    // it a session of its own and an empty signal mask (signals.rs).
    // SAFETY: the closure runs between fork and exec and calls only
    // setrlimit, which is async-signal-safe, on its own stack values.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes as libc::rlim_t,
                rlim_max: bytes as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            Ok(())
        });
    }
    Ok(cmd)
}

/// What one plugin's process tree uses now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub processes: usize,
    pub rss_bytes: u64,
}

struct Proc {
    ppid: i32,
    pgrp: i32,
    rss_pages: u64,
}

fn read_proc(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) pgrp(2) ... rss(21).
    Some(Proc {
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        rss_pages: f.get(21)?.parse().ok()?,
    })
}

/// Counts each root's tree (its descendants and its process group) in one
/// walk of /proc.
pub fn sample(roots: &[i32]) -> HashMap<i32, Usage> {
    let mut procs: HashMap<i32, Proc> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                if let Some(p) = read_proc(pid) {
                    procs.insert(pid, p);
                }
            }
        }
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let mut out = HashMap::new();
    for &root in roots {
        let mut usage = Usage::default();
        for (&pid, p) in &procs {
            let mut inside = p.pgrp == root || pid == root;
            let mut cur = p.ppid;
            let mut depth = 0;
            while !inside && cur > 1 && depth < 4096 {
                if cur == root {
                    inside = true;
                    break;
                }
                cur = procs.get(&cur).map(|x| x.ppid).unwrap_or(0);
                depth += 1;
            }
            if inside {
                usage.processes += 1;
                usage.rss_bytes += p.rss_pages * page;
            }
        }
        out.insert(root, usage);
    }
    out
}

/// Words a runtime writes when an allocation failed under the memory limit:
/// node's "heap out of memory" and "Allocation failed", python's
/// MemoryError, the C library's "Cannot allocate memory" and C++'s
/// bad_alloc. An exit with one of them in the error output is the fault
/// `memory`.
pub fn looks_out_of_memory(stderr_tail: &str) -> bool {
    [
        "out of memory",
        "MemoryError",
        "Allocation failed",
        "Cannot allocate memory",
        "bad_alloc",
    ]
    .iter()
    .any(|w| stderr_tail.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_in_a_bound_folder_is_covered_and_the_copy_bound_back() {
        let tmp = crate::testutil::TempDir::new("plugcmd");
        let copy = tmp.path().join("copy");
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        // A main that runs directly: no interpreter to look up.
        let main = copy.join("main");
        std::fs::write(&main, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&main, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A state directory under /opt, as a system service might have it,
        // and a runtime directory the plugin never sees anyway.
        let hidden = Hidden {
            dirs: vec![PathBuf::from("/opt/omni"), PathBuf::from("/run/user/7")],
            read_only: vec![PathBuf::from("/opt/omni")],
            files: vec![],
            protected: vec![],
        };
        let iso = Isolation {
            bwrap: Some(PathBuf::from("/usr/bin/bwrap")),
            missing: None,
            probed: true,
        };
        let spec = Spec {
            copy: &copy,
            work: &work,
            main: "main",
            hidden: &hidden,
        };
        let cmd = command(&PluginsSection::default(), &iso, &spec).unwrap();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = |needle: &[&str]| {
            args.windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} not in {args:?}"))
        };
        let (c, w) = (copy.to_str().unwrap(), work.to_str().unwrap());
        if Path::new("/opt").is_dir() {
            let opt = at(&["--ro-bind", "/opt", "/opt"]);
            let tmpfs = at(&["--tmpfs", "/opt/omni"]);
            let ro = at(&["--remount-ro", "/opt/omni"]);
            assert!(opt < tmpfs && tmpfs < at(&["--ro-bind", c, c]) && tmpfs < ro);
        } else {
            assert!(!args.iter().any(|a| a == "/opt/omni"), "{args:?}");
        }
        assert!(!args.iter().any(|a| a == "/run/user/7"), "{args:?}");
        at(&["--bind", w, w]);
        at(&["--cap-drop", "ALL"]);
        at(&["--new-session"]);
        at(&["--unshare-all"]);
    }
}
