//! Who is calling: the caller class of a socket peer (DESIGN.md, "Who is
//! calling"; issue 2, "Every connection is classified").
//!
//! The daemon records the root process of everything it starts (an agent
//! session, a plugin) by pid *and* start time, and makes itself the child
//! subreaper at start. A peer is classified by walking its ancestry through
//! /proc:
//! - it passes a recorded root (same pid and start time): that root's class;
//! - it reaches the daemon itself without passing one: a descendant that
//!   escaped its root by double-forking or setsid, re-parented to the daemon
//!   as subreaper; it is inside something the daemon started, so it is
//!   `agent-session` with no known owner;
//! - it reaches pid 1 first: the operator.
//!
//! A recycled pid cannot fool it: the peer is pinned by a pidfd taken when
//! the connection is accepted (SO_PEERPIDFD where the kernel has it,
//! pidfd_open otherwise), and the walk is trusted only if that pidfd still
//! names a live process after the walk; every hop compares start times (a
//! recorded root must match its recorded start time, and a parent must not
//! have started after its child, which a recycled parent pid would). A
//! peer whose uid is neither the daemon's effective uid nor root is never
//! the operator. A
//! peer that cannot be verified (it exited, lives in another pid namespace,
//! or /proc is unreadable) is `unverified`, which like every class but
//! operator is refused operator-only methods.
//!
//! Another pid namespace is checked, not only inferred from SO_PEERCRED's
//! pid 0 (a namespace the daemon cannot see into): a contained agent of
//! another daemon on the machine runs in a child pid namespace, which the
//! kernel translates into a pid this daemon can see, and its ancestry walk
//! reaches pid 1 outside this daemon's tree. Such a peer would otherwise
//! be the operator of every other daemon. So a peer classified operator
//! whose /proc/PID/ns/pid is not the daemon's own (or cannot be read) is
//! `unverified`; the link is read before the pidfd is asked whether the
//! peer still lives, so a recycled pid cannot lend its namespace. Agents
//! and plugins the daemon started keep their class: their walk passes the
//! roots it recorded. The HTTP API classifies the processes holding a
//! loopback connection with the same walk and the same namespace rule
//! ([`in_own_namespace`]).
//!
//! It also holds the one copy of the process primitives every module that
//! starts or watches a process uses: [`pidfd_open`] and
//! [`pidfd_send_signal`], the only places the daemon makes those system
//! calls, and [`signal_name`], the name an exit by signal is reported with.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The class of a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallerClass {
    Operator,
    /// Inside an agent session; the session id when it is known.
    AgentSession(Option<String>),
    /// Inside a plugin's process tree; the plugin id when it is known.
    Plugin(Option<String>),
    /// Could not be verified; treated as untrusted.
    Unverified,
    /// A client of a gateway on a relay channel of the uplink (issue 13):
    /// the gateway checked its token. `e2ee` when the channel is end to
    /// end encrypted. What it may call is decided in one place,
    /// `socket::methods::remote_gate`.
    RemoteClient {
        e2ee: bool,
    },
}

impl CallerClass {
    pub fn name(&self) -> &'static str {
        match self {
            CallerClass::Operator => "operator",
            CallerClass::AgentSession(_) => "agent-session",
            CallerClass::Plugin(_) => "plugin",
            CallerClass::Unverified => "unverified",
            CallerClass::RemoteClient { .. } => "remote-client",
        }
    }

    pub fn is_operator(&self) -> bool {
        matches!(self, CallerClass::Operator)
    }
}

/// What a recorded root process belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    Session(String),
    Plugin(String),
}

/// The roots of the process trees the daemon started.
#[derive(Default)]
pub struct Roots {
    by_pid: HashMap<i32, (u64, Owner)>,
}

impl Roots {
    /// Records a child the daemon just started. Its start time is read now,
    /// while the daemon is its parent and it cannot have been reaped.
    pub fn add(&mut self, pid: i32, owner: Owner) {
        if let Some(stat) = read_stat(pid) {
            self.by_pid.insert(pid, (stat.start_time, owner));
        }
    }

    pub fn remove(&mut self, pid: i32) {
        self.by_pid.remove(&pid);
    }

    fn owner(&self, pid: i32, start_time: u64) -> Option<&Owner> {
        match self.by_pid.get(&pid) {
            Some((t, o)) if *t == start_time => Some(o),
            _ => None,
        }
    }
}

/// Process facts from /proc/PID/stat.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    pub ppid: i32,
    pub start_time: u64,
}

/// Parses /proc/PID/stat. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last ')'.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... starttime(22), so index 1 and 19.
    Some(Stat {
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

pub fn read_stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The longest ancestry walked; a real process tree is far shallower.
const MAX_DEPTH: usize = 4096;

/// Classifies `pid` by its ancestry. `alive` is asked after the walk whether
/// the peer is still the process the walk started from.
pub fn classify(pid: i32, daemon_pid: i32, roots: &Roots, alive: impl Fn() -> bool) -> CallerClass {
    classify_with(pid, daemon_pid, roots, alive, read_stat)
}

/// `classify` with the /proc reader given, so tests can feed a made-up tree.
fn classify_with(
    pid: i32,
    daemon_pid: i32,
    roots: &Roots,
    alive: impl Fn() -> bool,
    read: impl Fn(i32) -> Option<Stat>,
) -> CallerClass {
    if pid <= 0 {
        return CallerClass::Unverified;
    }
    let mut cur = pid;
    let mut class = CallerClass::Unverified;
    // The start time of the process whose parent `cur` is said to be.
    let mut child_start: Option<u64> = None;
    for _ in 0..MAX_DEPTH {
        if cur == daemon_pid {
            // Reached the daemon without passing a recorded root: an escaped
            // descendant (see the module comment). The daemon itself calling
            // its own socket is not a case: it never does.
            class = CallerClass::AgentSession(None);
            break;
        }
        if cur <= 1 {
            class = CallerClass::Operator;
            break;
        }
        let Some(stat) = read(cur) else { break };
        if child_start.is_some_and(|c| stat.start_time > c) {
            // The pid was recycled: this process started after its supposed
            // child, so it is not the parent the child had.
            break;
        }
        child_start = Some(stat.start_time);
        if let Some(owner) = roots.owner(cur, stat.start_time) {
            class = match owner {
                Owner::Session(s) => CallerClass::AgentSession(Some(s.clone())),
                Owner::Plugin(p) => CallerClass::Plugin(Some(p.clone())),
            };
            break;
        }
        cur = stat.ppid;
    }
    if alive() {
        class
    } else {
        CallerClass::Unverified
    }
}

/// Peer credentials of a connected unix socket.
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    /// A pidfd pinning the peer process, when the kernel provides one.
    pub pidfd: Option<OwnedFd>,
}

const SO_PEERPIDFD: libc::c_int = 77;

/// Reads SO_PEERCRED and pins the peer with a pidfd.
pub fn peer_of(fd: RawFd) -> Option<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid, writable ucred and `len` holds its size, as
    // getsockopt(SO_PEERCRED) requires; `fd` is a socket the caller owns.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as above, with an int-sized buffer for SO_PEERPIDFD (Linux 6.5+);
    // older kernels fail with ENOPROTOOPT and leave it untouched.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    let pidfd = if r == 0 && pidfd >= 0 {
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        Some(unsafe { OwnedFd::from_raw_fd(pidfd) })
    } else if cred.pid > 0 {
        pidfd_open(cred.pid)
    } else {
        None
    };
    Some(Peer {
        pid: cred.pid,
        uid: cred.uid,
        pidfd,
    })
}

/// A pidfd pinning `pid` (pidfd_open(2), Linux 5.3+): signals through it
/// can never reach a process that took the pid over later. `None` when the
/// process is gone or the kernel has no pidfds. For a child of the daemon,
/// call it before the child can be reaped (the daemon reaps only on its
/// reactor thread, on SIGCHLD), so the pid is still the child's.
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    if pid <= 0 {
        return None;
    }
    // SAFETY: pidfd_open takes a pid and flags (none), touches no memory of
    // ours, and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a non-negative return is a descriptor the kernel just opened
    // for us, owned by nothing else; a descriptor number fits a c_int.
    Some(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Sends `sig` (0 only checks that it could be delivered) to the process a
/// pidfd names.
pub fn pidfd_send_signal(pidfd: &OwnedFd, sig: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for as long as the borrow; the siginfo
    // pointer is null, which pidfd_send_signal allows (the kernel fills it
    // as for kill(2)); no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether the process a pidfd names is still running.
pub fn pidfd_alive(pidfd: &OwnedFd) -> bool {
    match pidfd_send_signal(pidfd, 0) {
        Ok(()) => true,
        // EPERM: the process lives but belongs to another user (root calling
        // a daemon that runs as its own user). Only ESRCH means it is gone.
        Err(e) => e.raw_os_error() == Some(libc::EPERM),
    }
}

/// The name an exit by signal is reported with (`exit.signal` of sessions,
/// `lastExit.signal` of plugins, the log): the signals a process can die
/// of on Linux by name, any other as `SIG` and its number, which still
/// matches the event schema's `^SIG[A-Z0-9]{1,16}$`.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}

/// Classifies a connected peer: the public entry point other surfaces use.
pub fn classify_peer(peer: &Peer, roots: &Roots) -> CallerClass {
    // SAFETY: geteuid takes nothing and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let class = restrict_by_uid(classify_pid_of(peer, roots), peer.uid, euid);
    in_own_namespace(class, peer.pid, || {
        peer.pidfd.as_ref().is_none_or(pidfd_alive)
    })
}

/// `class`, unless it is operator and `pid` lives in another pid namespace
/// than the daemon (module comment): then `unverified`. `alive` is asked
/// after the namespace is read whether `pid` is still the process the
/// class was found for. Every surface that classifies a process (the
/// socket, the HTTP API) passes its class through here.
pub fn in_own_namespace(class: CallerClass, pid: i32, alive: impl Fn() -> bool) -> CallerClass {
    if !class.is_operator() {
        return class;
    }
    let same = same_pid_namespace(pid_namespace(pid), pid_namespace_of_self());
    restrict_by_namespace(class, same && alive())
}

/// The pid namespace of `pid`, as the target of /proc/PID/ns/pid
/// (`pid:[INODE]`).
fn pid_namespace(pid: i32) -> Option<std::path::PathBuf> {
    if pid <= 0 {
        return None;
    }
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

fn pid_namespace_of_self() -> Option<std::path::PathBuf> {
    std::fs::read_link("/proc/self/ns/pid").ok()
}

/// Both namespaces are known and equal; an unreadable one is not the same.
fn same_pid_namespace(peer: Option<std::path::PathBuf>, own: Option<std::path::PathBuf>) -> bool {
    matches!((peer, own), (Some(p), Some(o)) if p == o)
}

/// Operator only for a peer in the daemon's own pid namespace.
fn restrict_by_namespace(class: CallerClass, same_namespace: bool) -> CallerClass {
    if class.is_operator() && !same_namespace {
        CallerClass::Unverified
    } else {
        class
    }
}

/// Operator only for a peer running as the daemon's user or as root.
fn restrict_by_uid(class: CallerClass, uid: u32, euid: u32) -> CallerClass {
    if class.is_operator() && uid != euid && uid != 0 {
        CallerClass::Unverified
    } else {
        class
    }
}

fn classify_pid_of(peer: &Peer, roots: &Roots) -> CallerClass {
    let daemon_pid = std::process::id() as i32;
    match &peer.pidfd {
        Some(fd) => classify(peer.pid, daemon_pid, roots, || pidfd_alive(fd)),
        // Without a pidfd (a kernel before 5.3) the walk cannot be pinned;
        // re-reading the peer's start time is the best remaining check.
        None => {
            let before = read_stat(peer.pid);
            classify(peer.pid, daemon_pid, roots, || {
                before.is_some() && read_stat(peer.pid) == before
            })
        }
    }
}

/// Makes the daemon the child subreaper of everything it starts, so that an
/// orphaned descendant is re-parented to it rather than to init.
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes plain integers.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_names() {
        let line =
            "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                ppid: 17,
                start_time: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_test_process_is_the_operator_and_a_recorded_root_is_its_owner() {
        let me = std::process::id() as i32;
        let roots = Roots::default();
        // A daemon pid that is not in our ancestry: we reach init.
        assert_eq!(classify(me, -5, &roots, || true), CallerClass::Operator);
        // A dead peer is never trusted.
        assert_eq!(classify(me, -5, &roots, || false), CallerClass::Unverified);
        // Our parent as the daemon: we are an escaped descendant.
        let parent = read_stat(me).unwrap().ppid;
        assert_eq!(
            classify(me, parent, &roots, || true),
            CallerClass::AgentSession(None)
        );
        // Ourselves recorded as a plugin root.
        let mut roots = Roots::default();
        roots.add(me, Owner::Plugin("p".into()));
        assert_eq!(
            classify(me, -5, &roots, || true),
            CallerClass::Plugin(Some("p".into()))
        );
        // A root recorded with another start time (a recycled pid) is not ours.
        let mut stale = Roots::default();
        stale.by_pid.insert(me, (1, Owner::Plugin("p".into())));
        assert_eq!(classify(me, -5, &stale, || true), CallerClass::Operator);
    }

    #[test]
    fn a_parent_that_started_after_its_child_is_a_recycled_pid() {
        let tree = |starts: [(i32, i32, u64); 3]| {
            move |pid: i32| {
                starts
                    .iter()
                    .find(|(p, _, _)| *p == pid)
                    .map(|&(_, ppid, start_time)| Stat { ppid, start_time })
            }
        };
        let roots = Roots::default();
        // 30 -> 20 -> 10 -> 1, each parent older than its child.
        let good = tree([(30, 20, 300), (20, 10, 200), (10, 1, 100)]);
        assert_eq!(
            classify_with(30, -5, &roots, || true, good),
            CallerClass::Operator
        );
        // 20 was recycled after 30 started: not the operator.
        let bad = tree([(30, 20, 300), (20, 10, 400), (10, 1, 100)]);
        assert_eq!(
            classify_with(30, -5, &roots, || true, bad),
            CallerClass::Unverified
        );
        // The same recycled pid in front of the daemon: not an escapee either.
        let bad = tree([(30, 20, 300), (20, 7, 400), (10, 1, 100)]);
        assert_eq!(
            classify_with(30, 7, &roots, || true, bad),
            CallerClass::Unverified
        );
        // Equal start times (same clock tick) are allowed.
        let tick = tree([(30, 20, 300), (20, 10, 300), (10, 1, 100)]);
        assert_eq!(
            classify_with(30, -5, &roots, || true, tick),
            CallerClass::Operator
        );
    }

    #[test]
    fn only_the_daemons_user_or_root_is_the_operator() {
        assert_eq!(
            restrict_by_uid(CallerClass::Operator, 1000, 1000),
            CallerClass::Operator
        );
        assert_eq!(
            restrict_by_uid(CallerClass::Operator, 0, 1000),
            CallerClass::Operator
        );
        assert_eq!(
            restrict_by_uid(CallerClass::Operator, 1001, 1000),
            CallerClass::Unverified
        );
        let p = CallerClass::Plugin(Some("p".into()));
        assert_eq!(restrict_by_uid(p.clone(), 1001, 1000), p);
    }

    #[test]
    fn a_pidfd_signals_its_process_and_sees_it_go() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id() as i32).expect("a pidfd for our own child");
        assert!(pidfd_alive(&fd));
        pidfd_send_signal(&fd, libc::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(!pidfd_alive(&fd));
        assert!(pidfd_open(0).is_none());
        assert!(pidfd_open(-1).is_none());
    }

    #[test]
    fn signals_are_named_as_the_event_schema_allows() {
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(libc::SIGTRAP), "SIGTRAP");
        assert_eq!(signal_name(libc::SIGUSR1), "SIGUSR1");
        assert_eq!(signal_name(libc::SIGSYS), "SIGSYS");
        assert_eq!(signal_name(40), "SIG40");
        for sig in 1..=64 {
            let n = signal_name(sig);
            let rest = n.strip_prefix("SIG").unwrap();
            assert!((1..=16).contains(&rest.len()), "{n}");
            assert!(
                rest.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()),
                "{n}"
            );
        }
    }

    #[test]
    fn only_a_peer_in_the_daemons_pid_namespace_is_the_operator() {
        let me = std::process::id() as i32;
        assert!(same_pid_namespace(
            pid_namespace(me),
            pid_namespace_of_self()
        ));
        let a = Some(std::path::PathBuf::from("pid:[1]"));
        let b = Some(std::path::PathBuf::from("pid:[2]"));
        assert!(!same_pid_namespace(a.clone(), b));
        assert!(!same_pid_namespace(None, a.clone()));
        assert!(!same_pid_namespace(None, None));
        assert_eq!(
            restrict_by_namespace(CallerClass::Operator, false),
            CallerClass::Unverified
        );
        assert_eq!(
            restrict_by_namespace(CallerClass::Operator, true),
            CallerClass::Operator
        );
        let s = CallerClass::AgentSession(Some("s".into()));
        assert_eq!(restrict_by_namespace(s.clone(), false), s);
    }
}
