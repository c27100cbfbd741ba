//! Child processes the daemon starts (agents, plugins): their stdio pipes on
//! the reactor's poll, bounded line reading, a bounded stdin queue, the tail
//! of stderr, signals to the process group (once), and exits routed by pid
//! (DESIGN.md, "Threads and ownership"; "Who is calling").
//!
//! Every child runs in its own process group, with the environment the
//! caller constructs and no descriptor but its three (every descriptor the
//! daemon opens is close-on-exec). Its root pid and start time are recorded
//! in [`Roots`] so that its whole tree is classified as its owner's, and a
//! pidfd pins it so that a signal never reaches a recycled pid (a signal
//! goes to its group, led by its unreaped pid, and through the pidfd only
//! when that group is gone: [`Children::signal`]). Exits are
//! reaped centrally on SIGCHLD (the daemon is child subreaper), and
//! [`Children::exited`] maps the pid back to the child.
//!
//! A child marked [`Children::set_sandboxed`] is bwrap running an agent in
//! its namespace (`crate::isolation`): its signals go to the process group
//! inside the namespace, so that the agent, not bwrap, gets the SIGTERM of
//! a stop and can end cleanly; SIGKILL also reaches bwrap.
//!
//! A child's stdin is watched for room only while bytes wait in its queue:
//! a write the pipe takes at once needs no readiness, and a pipe watched
//! for room all the time wakes the reactor each time the child reads a
//! line the daemon wrote, in the middle of the child's answer (issue 11,
//! the `storage.get` round trip).
//!
//! What the reactor writes to a child during one wake-up is queued and
//! written at its end ([`Children::flush_queued`]), as the socket's replies
//! are: the answers to the sets of one group commit reach a plugin in one
//! write, not one system call and one wake-up of the plugin each (issue 11,
//! `storage.set` with 16 in flight).

use mio::unix::pipe;
use mio::{Interest, Registry, Token};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::errors::io_cause;
use crate::limits;
use crate::procs::{Owner, Roots};
use crate::reactor::IdMap;
use crate::socket::framing::LineBuffer;

/// Tokens at or above this value are child pipes.
pub const FIRST_CHILD_TOKEN: usize = 1 << 40;

pub type ChildId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pipe {
    Stdin,
    Stdout,
    Stderr,
}

/// One thing a child's pipes produced, borrowed from [`Outputs`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Output<'a> {
    /// One complete stdout line, without its `\n`.
    Line(&'a [u8]),
    /// A stdout line went over the limit; the child's stdout is no longer
    /// read (its framing cannot be trusted).
    LineTooLong,
    /// The child closed its stdout.
    StdoutClosed,
    /// Writing to stdin failed: the child closed it or exited.
    StdinClosed,
}

/// What one readiness of a child's pipes produced, in order, its lines in
/// one buffer. The owner hands it back ([`Children::recycle`]) once it has
/// read it, and the next readiness fills it again, so reading a line
/// allocates nothing: a `Vec` a line was a malloc and a free of every
/// streamed chunk and every plugin request (issue 11).
#[derive(Debug, Default)]
pub struct Outputs {
    bytes: Vec<u8>,
    items: Vec<Item>,
}

#[derive(Debug)]
enum Item {
    Line(std::ops::Range<usize>),
    LineTooLong,
    StdoutClosed,
    StdinClosed,
}

impl Outputs {
    pub fn iter(&self) -> impl Iterator<Item = Output<'_>> {
        self.items.iter().map(|i| match i {
            Item::Line(r) => Output::Line(&self.bytes[r.clone()]),
            Item::LineTooLong => Output::LineTooLong,
            Item::StdoutClosed => Output::StdoutClosed,
            Item::StdinClosed => Output::StdinClosed,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Appends `o`, copying a line's bytes.
    #[cfg(test)]
    pub fn push(&mut self, o: Output<'_>) {
        self.items.push(match o {
            Output::Line(l) => {
                let at = self.bytes.len();
                self.bytes.extend_from_slice(l);
                Item::Line(at..self.bytes.len())
            }
            Output::LineTooLong => Item::LineTooLong,
            Output::StdoutClosed => Item::StdoutClosed,
            Output::StdinClosed => Item::StdinClosed,
        });
    }
}

/// Bounds of one child's pipes.
#[derive(Clone, Copy, Debug)]
pub struct PipeLimits {
    pub max_line: usize,
    pub max_queued: usize,
    pub stderr_tail: usize,
}

struct Child {
    pid: i32,
    owner: Owner,
    pidfd: Option<OwnedFd>,
    stdin: Option<(pipe::Sender, Token)>,
    stdout: Option<(pipe::Receiver, Token)>,
    stderr: Option<(pipe::Receiver, Token)>,
    lines: LineBuffer,
    err_tail: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    close_stdin_when_flushed: bool,
    /// Whether the child is in [`Children::unflushed`].
    flush_queued: bool,
    /// Whether stdin is registered for writable readiness: only while its
    /// queue holds bytes (module comment).
    stdin_watched: bool,
    limits: PipeLimits,
    exited: bool,
    sandboxed: bool,
}

/// Bytes read from a child's stdout at once.
const READ_BUF: usize = 64 * 1024;
/// Bytes read from a child's stderr at once (only its tail is kept).
const STDERR_READ: usize = 16 * 1024;

/// Every child the daemon started, by id, token and pid.
#[derive(Default)]
pub struct Children {
    map: IdMap<ChildId, Child>,
    by_token: IdMap<Token, (ChildId, Pipe)>,
    by_pid: HashMap<i32, ChildId>,
    next_token: usize,
    next_id: ChildId,
    /// The buffer every pipe read goes through, allocated on the first read
    /// and kept: a fresh zeroed 64 KiB array per readiness cost a memset
    /// larger than the L1 cache on every plugin request (seen as a third of
    /// the host's time for a storage.get).
    read_buf: Vec<u8>,
    /// The last [`Outputs`] handed back, filled by the next readiness.
    spare: Outputs,
    /// Children with bytes for [`Children::flush_queued`], each once, in the
    /// order of their first write of this wake-up (a child watched for room
    /// is written by its readiness instead).
    unflushed: Vec<ChildId>,
}

/// How a child ended, from waitpid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// What bwrap reports for its command: it exits with the command's
    /// code, or with 128+N when a signal N killed it, as a shell does. The
    /// signal is given back its name, so that a contained agent's end reads
    /// as an uncontained one's.
    pub fn through_bwrap(self) -> ExitStatus {
        match self.code {
            Some(c) if (129..=128 + 64).contains(&c) => ExitStatus {
                code: None,
                signal: Some(c - 128),
            },
            _ => self,
        }
    }

    pub fn from_wait(status: libc::c_int) -> ExitStatus {
        if libc::WIFEXITED(status) {
            ExitStatus {
                code: Some(libc::WEXITSTATUS(status)),
                signal: None,
            }
        } else if libc::WIFSIGNALED(status) {
            ExitStatus {
                code: None,
                signal: Some(libc::WTERMSIG(status)),
            }
        } else {
            ExitStatus {
                code: None,
                signal: None,
            }
        }
    }
}

impl Children {
    /// Starts `cmd` with piped stdio in its own process group, registers its
    /// pipes and records it as a root of `owner`'s process tree.
    pub fn spawn(
        &mut self,
        registry: &Registry,
        roots: &mut Roots,
        mut cmd: Command,
        owner: Owner,
        limits: PipeLimits,
    ) -> std::io::Result<(ChildId, i32)> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A new session, not only a new process group: the child then has no
        // controlling terminal, so it cannot TIOCSTI keystrokes into the
        // daemon's one. setsid also makes it a group leader (pgid == pid),
        // which `signal`'s killpg relies on.
        // The child starts with no signal blocked, whatever the daemon
        // blocks for its signal thread (`crate::signals`).
        // SAFETY: the closure runs between fork and exec and calls only
        // setsid and `unblock_in_child`, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                crate::signals::unblock_in_child()
            });
        }
        let mut child = cmd.spawn()?;
        let pid = child.id() as i32;
        roots.add(pid, owner.clone());
        // The child cannot have been reaped yet (only we reap, on SIGCHLD,
        // on this same thread), so the pid is still its own.
        let pidfd = crate::procs::pidfd_open(pid);
        self.next_id += 1;
        let id = self.next_id;
        let mut tok = || {
            self.next_token += 1;
            Token(FIRST_CHILD_TOKEN + self.next_token)
        };
        let (t_in, t_out, t_err) = (tok(), tok(), tok());
        let mut stdin = child.stdin.take().map(pipe::Sender::from);
        let mut stdout = child.stdout.take().map(pipe::Receiver::from);
        let mut stderr = child.stderr.take().map(pipe::Receiver::from);
        // The std handle is dropped without waiting: exits are reaped on
        // SIGCHLD by pid.
        drop(child);
        if let Some(s) = &mut stdin {
            s.set_nonblocking(true)?;
            self.by_token.insert(t_in, (id, Pipe::Stdin));
        }
        for (r, t, p) in [
            (&mut stdout, t_out, Pipe::Stdout),
            (&mut stderr, t_err, Pipe::Stderr),
        ] {
            if let Some(r) = r {
                r.set_nonblocking(true)?;
                registry.register(r, t, Interest::READABLE)?;
                self.by_token.insert(t, (id, p));
            }
        }
        self.by_pid.insert(pid, id);
        self.map.insert(
            id,
            Child {
                pid,
                owner,
                pidfd,
                stdin: stdin.map(|s| (s, t_in)),
                stdout: stdout.map(|s| (s, t_out)),
                stderr: stderr.map(|s| (s, t_err)),
                lines: LineBuffer::new(limits.max_line),
                err_tail: Vec::new(),
                out: Vec::new(),
                out_pos: 0,
                close_stdin_when_flushed: false,
                flush_queued: false,
                stdin_watched: false,
                limits,
                exited: false,
                sandboxed: false,
            },
        );
        Ok((id, pid))
    }

    pub fn owns_token(token: Token) -> bool {
        token.0 >= FIRST_CHILD_TOKEN
    }

    pub fn owner(&self, id: ChildId) -> Option<&Owner> {
        self.map.get(&id).map(|c| &c.owner)
    }

    pub fn pid(&self, id: ChildId) -> Option<i32> {
        self.map.get(&id).map(|c| c.pid)
    }

    pub fn is_sandboxed(&self, id: ChildId) -> bool {
        self.map.get(&id).is_some_and(|c| c.sandboxed)
    }

    /// Marks the child as bwrap running an agent (module comment).
    pub fn set_sandboxed(&mut self, id: ChildId) {
        if let Some(c) = self.map.get_mut(&id) {
            c.sandboxed = true;
        }
    }

    /// Handles readiness of one of a child's pipes; returns the child and
    /// what it produced. Reads until the pipe is drained, so that a child
    /// writing many lines is served in one wake-up. A read shorter than the
    /// buffer drained the pipe: the registration is edge-triggered and a
    /// pipe signals every later write (and its close) as a new edge, so the
    /// extra read that would only return WouldBlock is skipped, one system
    /// call of every plugin request. `closed` is the event's read-closed or
    /// error flag: then the writer may already be gone, no edge follows, and
    /// the pipe is read to its end.
    pub fn on_ready(
        &mut self,
        registry: &Registry,
        token: Token,
        closed: bool,
    ) -> Option<(ChildId, Outputs)> {
        let (id, pipe) = *self.by_token.get(&token)?;
        let child = self.map.get_mut(&id)?;
        if self.read_buf.is_empty() {
            self.read_buf = vec![0u8; READ_BUF];
        }
        let mut out = std::mem::take(&mut self.spare);
        match pipe {
            Pipe::Stdin => {
                if Self::send_queued(&mut self.by_token, registry, child).is_err() {
                    out.items.push(Item::StdinClosed);
                }
            }
            Pipe::Stdout => {
                let buf = &mut self.read_buf[..];
                while let Some((r, _)) = &mut child.stdout {
                    match r.read(buf) {
                        Ok(0) => {
                            // A partial last line is still a line to judge.
                            child.lines.extend(b"\n");
                            Self::take_lines(child, &mut out);
                            Self::drop_reader(&mut self.by_token, registry, &mut child.stdout);
                            out.items.push(Item::StdoutClosed);
                            break;
                        }
                        Ok(n) => {
                            child.lines.extend(&buf[..n]);
                            if !Self::take_lines(child, &mut out) {
                                Self::drop_reader(&mut self.by_token, registry, &mut child.stdout);
                                break;
                            }
                            if n < buf.len() && !closed {
                                break;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => {
                            Self::drop_reader(&mut self.by_token, registry, &mut child.stdout);
                            out.items.push(Item::StdoutClosed);
                            break;
                        }
                    }
                }
            }
            Pipe::Stderr => {
                let buf = &mut self.read_buf[..STDERR_READ];
                while let Some((r, _)) = &mut child.stderr {
                    match r.read(buf) {
                        Ok(0) => {
                            Self::drop_reader(&mut self.by_token, registry, &mut child.stderr);
                            break;
                        }
                        Ok(n) => {
                            child.err_tail.extend_from_slice(&buf[..n]);
                            let max = child.limits.stderr_tail;
                            if child.err_tail.len() > max * 2 {
                                let cut = child.err_tail.len() - max;
                                child.err_tail.drain(..cut);
                            }
                            if n < buf.len() && !closed {
                                break;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => {
                            Self::drop_reader(&mut self.by_token, registry, &mut child.stderr);
                            break;
                        }
                    }
                }
            }
        }
        Some((id, out))
    }

    /// Moves complete lines to `out`; false when a line went over the limit.
    fn take_lines(child: &mut Child, out: &mut Outputs) -> bool {
        loop {
            match child.lines.next_line_into(&mut out.bytes) {
                Ok(Some(r)) => out.items.push(Item::Line(r)),
                Ok(None) => return true,
                Err(_) => {
                    out.items.push(Item::LineTooLong);
                    return false;
                }
            }
        }
    }

    /// Takes back what [`Children::on_ready`] handed out, for the next
    /// readiness to fill; a buffer grown by an unusually long line is let
    /// go rather than kept.
    pub fn recycle(&mut self, mut out: Outputs) {
        if out.bytes.capacity() <= READ_BUF {
            out.bytes.clear();
            out.items.clear();
            self.spare = out;
        }
    }

    fn drop_reader(
        by_token: &mut IdMap<Token, (ChildId, Pipe)>,
        registry: &Registry,
        slot: &mut Option<(pipe::Receiver, Token)>,
    ) {
        if let Some((mut r, t)) = slot.take() {
            let _ = registry.deregister(&mut r);
            by_token.remove(&t);
        }
    }

    fn drop_stdin(
        by_token: &mut IdMap<Token, (ChildId, Pipe)>,
        registry: &Registry,
        child: &mut Child,
    ) {
        if let Some((mut s, t)) = child.stdin.take() {
            if std::mem::take(&mut child.stdin_watched) {
                let _ = registry.deregister(&mut s);
            }
            by_token.remove(&t);
        }
        child.out.clear();
        child.out_pos = 0;
    }

    /// Watches stdin for room while its queue holds bytes, and stops
    /// watching once it is empty (module comment). Registering a pipe that
    /// has room already reports it at once, so no edge is missed.
    fn watch_stdin(registry: &Registry, child: &mut Child) -> std::io::Result<()> {
        let waiting = child.out_pos < child.out.len();
        let Some((s, t)) = &mut child.stdin else {
            return Ok(());
        };
        if waiting && !child.stdin_watched {
            registry.register(s, *t, Interest::WRITABLE)?;
            child.stdin_watched = true;
        } else if !waiting && child.stdin_watched {
            registry.deregister(s)?;
            child.stdin_watched = false;
        }
        Ok(())
    }

    /// Writes what the pipe takes of the child's queue, watches for room
    /// where bytes are left, and closes a stdin whose close waited for its
    /// queue. Err when the pipe could not be written: its stdin is dropped.
    fn send_queued(
        by_token: &mut IdMap<Token, (ChildId, Pipe)>,
        registry: &Registry,
        child: &mut Child,
    ) -> Result<(), ()> {
        if Self::flush_child(child).is_err() || Self::watch_stdin(registry, child).is_err() {
            Self::drop_stdin(by_token, registry, child);
            return Err(());
        }
        if child.close_stdin_when_flushed && child.out_pos >= child.out.len() {
            Self::drop_stdin(by_token, registry, child);
        }
        Ok(())
    }

    fn flush_child(child: &mut Child) -> Result<(), ()> {
        let Some((s, _)) = &mut child.stdin else {
            return Err(());
        };
        while child.out_pos < child.out.len() {
            match s.write(&child.out[child.out_pos..]) {
                Ok(0) => return Err(()),
                Ok(n) => child.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
        child.out.clear();
        child.out_pos = 0;
        Ok(())
    }

    /// Queues bytes for the child's stdin, to be written at the end of this
    /// wake-up ([`Children::flush_queued`]), or at once when more than a
    /// pipe holds waits. Err(Full) when the child is not reading and the
    /// queue is at its bound; Err(Closed) when its stdin is gone.
    pub fn write(
        &mut self,
        registry: &Registry,
        id: ChildId,
        bytes: &[u8],
    ) -> Result<(), WriteRefused> {
        let child = self.map.get_mut(&id).ok_or(WriteRefused::Closed)?;
        if child.stdin.is_none() || child.close_stdin_when_flushed {
            return Err(WriteRefused::Closed);
        }
        if child.out.len() - child.out_pos + bytes.len() > child.limits.max_queued {
            return Err(WriteRefused::Full);
        }
        child.out.extend_from_slice(bytes);
        if child.stdin_watched {
            // The pipe is full: its readiness writes the rest.
            return Ok(());
        }
        if child.out.len() - child.out_pos >= limits::CHILD_STDIN_WRITE_THROUGH_BYTES {
            // Written now, so that the queue's bound measures a child that
            // does not read, not the size of one wake-up's output.
            return Self::send_queued(&mut self.by_token, registry, child)
                .map_err(|()| WriteRefused::Closed);
        }
        if !child.flush_queued {
            child.flush_queued = true;
            self.unflushed.push(id);
        }
        Ok(())
    }

    /// Writes what this wake-up queued to each child, as much as its pipe
    /// takes, watching for room where bytes are left, and closes a stdin
    /// whose close waited for its queue. The children whose stdin could
    /// not be written come back with [`Output::StdinClosed`], as from a
    /// readiness.
    pub fn flush_queued(&mut self, registry: &Registry) -> Vec<(ChildId, Outputs)> {
        let mut closed = Vec::new();
        // Taken and given back with its capacity: a list left empty by
        // `take` would allocate again on the next wake-up's first write.
        let mut ids = std::mem::take(&mut self.unflushed);
        for &id in &ids {
            let Some(child) = self.map.get_mut(&id) else {
                continue;
            };
            child.flush_queued = false;
            if child.stdin.is_none() {
                // Closed since the write, and reported where it closed.
                continue;
            }
            if Self::send_queued(&mut self.by_token, registry, child).is_err() {
                let mut out = Outputs::default();
                out.items.push(Item::StdinClosed);
                closed.push((id, out));
            }
        }
        ids.clear();
        self.unflushed = ids;
        closed
    }

    /// Whether bytes wait for [`Children::flush_queued`].
    pub fn has_unflushed(&self) -> bool {
        !self.unflushed.is_empty()
    }

    /// Closes the child's stdin once what is queued has been written: the
    /// signal to a well-behaved child that no more input comes. What this
    /// wake-up queued is written first, as it was written before the close
    /// (a stop's SIGTERM follows at once).
    pub fn close_stdin(&mut self, registry: &Registry, id: ChildId) {
        let Some(child) = self.map.get_mut(&id) else {
            return;
        };
        if child.stdin.is_none() {
            return;
        }
        child.close_stdin_when_flushed = true;
        // A watched stdin closes when its readiness has written the rest.
        if !child.stdin_watched {
            let _ = Self::send_queued(&mut self.by_token, registry, child);
        }
    }

    /// Sends `sig` to the child's whole process group, once: every child
    /// leads its own group, so the group signal reaches the child and what
    /// it started in its group. Only when that group is gone (the child
    /// moved itself into another one with setsid or setpgid, so killpg
    /// finds no member) does the signal go to the child alone, through its
    /// pidfd, so a recycled pid is never signalled. Sending both, as this
    /// once did, made a plugin see each SIGTERM twice. A sandboxed child's
    /// signal goes to the group inside its namespace, and only SIGKILL also
    /// to bwrap (module comment); before bwrap has started its namespace
    /// there is no such group, and bwrap is signalled as any child (its
    /// `--die-with-parent` then ends what it started). A child already
    /// reaped is not signalled.
    pub fn signal(&self, id: ChildId, sig: libc::c_int) {
        let Some(child) = self.map.get(&id) else {
            return;
        };
        if child.exited {
            return;
        }
        if child.sandboxed {
            if let Some(group) = crate::isolation::inner_group(child.pid) {
                // SAFETY: killpg takes a group id and a valid signal. The
                // group was read just now as led by bwrap's own child, which
                // only bwrap (ours, not reaped) can reap; reaching another
                // group would need that leader to exit and its pid to come
                // round again between the read and this call.
                unsafe { libc::killpg(group, sig) };
                if sig != libc::SIGKILL {
                    return;
                }
            }
        }
        // SAFETY: the group id is the leader's pid, which is still ours
        // (not reaped), so the group cannot have been recycled.
        let r = unsafe { libc::killpg(child.pid, sig) };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
            return;
        }
        if let Some(fd) = &child.pidfd {
            // A process already gone is no error here: the group below,
            // or the reaping, finishes the job.
            let _ = crate::procs::pidfd_send_signal(fd, sig);
        }
    }

    /// Reads whatever stderr still holds. Called once the child is reaped:
    /// everything it wrote is in the pipe by then, so the tail is complete
    /// whatever order the pipes' readiness arrived in.
    pub fn drain_stderr(&mut self, registry: &Registry, id: ChildId) {
        let token = self
            .map
            .get(&id)
            .and_then(|c| c.stderr.as_ref().map(|(_, t)| *t));
        if let Some(t) = token {
            self.on_ready(registry, t, true);
        }
    }

    /// The last bytes the child wrote to stderr (the caller cuts it at a
    /// character boundary as its surface requires).
    pub fn stderr_tail(&self, id: ChildId) -> Vec<u8> {
        self.map
            .get(&id)
            .map(|c| {
                let max = c.limits.stderr_tail;
                let start = c.err_tail.len().saturating_sub(max);
                c.err_tail[start..].to_vec()
            })
            .unwrap_or_default()
    }

    /// Records that `pid` was reaped; returns its child id if it was one of
    /// ours. The pipes stay registered until they report their close, so no
    /// output the child wrote before exiting is lost; [`Children::remove`]
    /// drops everything.
    pub fn exited(&mut self, pid: i32) -> Option<ChildId> {
        let id = self.by_pid.remove(&pid)?;
        if let Some(c) = self.map.get_mut(&id) {
            c.exited = true;
        }
        Some(id)
    }

    /// Forgets a child and deregisters its pipes.
    pub fn remove(&mut self, registry: &Registry, id: ChildId) {
        let Some(mut child) = self.map.remove(&id) else {
            return;
        };
        Self::drop_stdin(&mut self.by_token, registry, &mut child);
        Self::drop_reader(&mut self.by_token, registry, &mut child.stdout);
        Self::drop_reader(&mut self.by_token, registry, &mut child.stderr);
        self.by_pid.remove(&child.pid);
    }

    /// Bytes queued for the child's stdin and not yet written.
    pub fn queued(&self, id: ChildId) -> usize {
        self.map.get(&id).map_or(0, |c| c.out.len() - c.out_pos)
    }

    /// Whether the child's stdout is still open.
    pub fn stdout_open(&self, id: ChildId) -> bool {
        self.map.get(&id).is_some_and(|c| c.stdout.is_some())
    }

    /// The pids of children not yet reaped.
    pub fn pids(&self) -> Vec<i32> {
        self.by_pid.keys().copied().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every live child, for a stop that must signal them all.
    pub fn ids(&self) -> Vec<ChildId> {
        self.map.keys().copied().collect()
    }
}

/// Why bytes were not queued to a child.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteRefused {
    Full,
    Closed,
}

/// Describes a spawn failure in one line.
pub fn spawn_error(program: &str, e: &std::io::Error) -> String {
    format!("unable to start {program}: {}", io_cause(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};

    /// Starts `cmd` as a plugin's child of `ch`, watched by `poll`.
    fn spawn(
        poll: &Poll,
        ch: &mut Children,
        roots: &mut Roots,
        cmd: Command,
    ) -> (ChildId, libc::pid_t) {
        spawn_with(poll, ch, roots, cmd, limits())
    }

    fn spawn_with(
        poll: &Poll,
        ch: &mut Children,
        roots: &mut Roots,
        cmd: Command,
        limits: PipeLimits,
    ) -> (ChildId, libc::pid_t) {
        ch.spawn(
            poll.registry(),
            roots,
            cmd,
            Owner::Plugin("t".into()),
            limits,
        )
        .unwrap()
    }

    fn limits() -> PipeLimits {
        PipeLimits {
            max_line: 64,
            max_queued: 1024,
            stderr_tail: 8,
        }
    }

    /// An owned copy of an [`Output`], to collect across readinesses.
    #[derive(Debug, PartialEq)]
    enum Got {
        Line(Vec<u8>),
        LineTooLong,
        StdoutClosed,
        StdinClosed,
    }

    impl From<Output<'_>> for Got {
        fn from(o: Output<'_>) -> Got {
            match o {
                Output::Line(l) => Got::Line(l.to_vec()),
                Output::LineTooLong => Got::LineTooLong,
                Output::StdoutClosed => Got::StdoutClosed,
                Output::StdinClosed => Got::StdinClosed,
            }
        }
    }

    /// `lines`, then the close of stdout.
    fn lines_then_closed(lines: &[&str]) -> Vec<Got> {
        let mut v: Vec<Got> = lines
            .iter()
            .map(|l| Got::Line(l.as_bytes().to_vec()))
            .collect();
        v.push(Got::StdoutClosed);
        v
    }

    /// Polls until `done` says the collected output is complete.
    fn collect(poll: &mut Poll, ch: &mut Children, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let mut events = Events::with_capacity(16);
        let mut got = Vec::new();
        while !done(&got) {
            poll.poll(&mut events, Some(std::time::Duration::from_secs(30)))
                .unwrap();
            assert!(!events.is_empty(), "no output within 30 s: {got:?}");
            for ev in events.iter() {
                if let Some((_, out)) = ch.on_ready(
                    poll.registry(),
                    ev.token(),
                    ev.is_read_closed() || ev.is_error(),
                ) {
                    got.extend(out.iter().map(Got::from));
                    ch.recycle(out);
                }
            }
        }
        got
    }

    #[test]
    fn lines_in_order_then_close_and_the_stderr_tail() {
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "read x; echo \"got $x\"; echo second; printf 'abcdefghijkl' >&2; printf partial",
        ]);
        let (id, _) = spawn(&poll, &mut ch, &mut roots, cmd);
        ch.write(poll.registry(), id, b"hello\n").unwrap();
        assert!(ch.flush_queued(poll.registry()).is_empty());
        let got = collect(&mut poll, &mut ch, |g| g.contains(&Got::StdoutClosed));
        assert_eq!(got, lines_then_closed(&["got hello", "second", "partial"]));
        // stderr may still be arriving; wait for its close via the tail.
        while ch.stderr_tail(id) != b"efghijkl" {
            let mut events = Events::with_capacity(4);
            poll.poll(&mut events, Some(std::time::Duration::from_secs(30)))
                .unwrap();
            for ev in events.iter() {
                ch.on_ready(
                    poll.registry(),
                    ev.token(),
                    ev.is_read_closed() || ev.is_error(),
                );
            }
        }
    }

    #[test]
    fn writes_of_one_wake_up_leave_at_its_end_and_a_closed_stdin_is_told() {
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "read a; read b; echo \"$a $b\"; exec 0<&-; echo closed",
        ]);
        let (id, _) = spawn(&poll, &mut ch, &mut roots, cmd);
        ch.write(poll.registry(), id, b"one\n").unwrap();
        ch.write(poll.registry(), id, b"two\n").unwrap();
        // Queued, not written, until the wake-up ends.
        assert_eq!(ch.queued(id), 8);
        assert!(ch.has_unflushed());
        assert!(ch.flush_queued(poll.registry()).is_empty());
        assert_eq!(ch.queued(id), 0);
        assert!(!ch.has_unflushed());
        let got = collect(&mut poll, &mut ch, |g| {
            g.contains(&Got::Line(b"closed".to_vec()))
        });
        // The close of stdout may come in the same readiness.
        assert_eq!(
            got[..2],
            [
                Got::Line(b"one two".to_vec()),
                Got::Line(b"closed".to_vec())
            ]
        );
        // The child closed its stdin before saying so: the next flush
        // finds no reader and tells the owner once.
        ch.write(poll.registry(), id, b"three\n").unwrap();
        let closed: Vec<(ChildId, Vec<Got>)> = ch
            .flush_queued(poll.registry())
            .into_iter()
            .map(|(c, out)| (c, out.iter().map(Got::from).collect()))
            .collect();
        assert_eq!(closed, vec![(id, vec![Got::StdinClosed])]);
        assert_eq!(
            ch.write(poll.registry(), id, b"four\n"),
            Err(WriteRefused::Closed)
        );
        assert!(ch.flush_queued(poll.registry()).is_empty());
    }

    #[test]
    fn a_close_after_a_write_of_the_same_wake_up_sends_the_write_first() {
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "cat; echo eof"]);
        let (id, _) = spawn(&poll, &mut ch, &mut roots, cmd);
        ch.write(poll.registry(), id, b"last\n").unwrap();
        ch.close_stdin(poll.registry(), id);
        assert_eq!(ch.queued(id), 0);
        assert_eq!(
            ch.write(poll.registry(), id, b"late\n"),
            Err(WriteRefused::Closed)
        );
        assert!(ch.flush_queued(poll.registry()).is_empty());
        let got = collect(&mut poll, &mut ch, |g| g.contains(&Got::StdoutClosed));
        assert_eq!(got, lines_then_closed(&["last", "eof"]));
    }

    #[test]
    fn more_than_a_pipe_holds_is_written_at_once_and_the_rest_on_readiness() {
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("wc");
        cmd.arg("-c");
        let mut limits = limits();
        limits.max_queued = 1 << 20;
        let (id, _) = spawn_with(&poll, &mut ch, &mut roots, cmd, limits);
        let chunk = vec![b'x'; crate::limits::CHILD_STDIN_WRITE_THROUGH_BYTES / 4];
        for _ in 0..3 {
            ch.write(poll.registry(), id, &chunk).unwrap();
        }
        assert_eq!(ch.queued(id), 3 * chunk.len());
        // The fourth makes a pipe's worth: written at once, as much as the
        // empty pipe takes, before the wake-up ends.
        ch.write(poll.registry(), id, &chunk).unwrap();
        assert!(ch.queued(id) < 4 * chunk.len());
        for _ in 0..12 {
            ch.write(poll.registry(), id, &chunk).unwrap();
        }
        assert!(ch.flush_queued(poll.registry()).is_empty());
        // Whatever the pipe did not take goes on its readiness, then the
        // close.
        ch.close_stdin(poll.registry(), id);
        let got = collect(&mut poll, &mut ch, |g| g.contains(&Got::StdoutClosed));
        assert_eq!(
            got,
            vec![
                Got::Line(format!("{}", 16 * chunk.len()).into_bytes()),
                Got::StdoutClosed
            ]
        );
    }

    #[test]
    fn a_child_leads_its_own_session_without_a_terminal_and_killpg_reaches_it() {
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("sh");
        // Field 5 of stat is the pgrp, 6 the session, 7 the controlling tty.
        cmd.args(["-c", "cut -d' ' -f5-7 /proc/$$/stat; sleep 30"]);
        let (id, pid) = spawn(&poll, &mut ch, &mut roots, cmd);
        let got = collect(&mut poll, &mut ch, |g| !g.is_empty());
        assert_eq!(got[0], Got::Line(format!("{pid} {pid} 0").into_bytes()));
        // SAFETY: getpgid on a pid we spawned and have not reaped.
        assert_eq!(unsafe { libc::getpgid(pid) }, pid);
        ch.signal(id, libc::SIGKILL);
        let got = collect(&mut poll, &mut ch, |g| g.contains(&Got::StdoutClosed));
        assert!(got.contains(&Got::StdoutClosed));
    }

    /// A signal reaches an unsandboxed child once, not through its pidfd
    /// and its group both. Real-time signals queue instead of merging, so
    /// the child, waiting for them with sigwaitinfo, counts every copy; the
    /// next real-time signal, delivered after all lower ones, ends the count.
    #[test]
    fn a_signal_reaches_the_child_once() {
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let (first, last) = (libc::SIGRTMIN(), libc::SIGRTMIN() + 1);
        let script = format!(
            "import signal, sys\n\
             sigs = {{{first}, {last}}}\n\
             signal.pthread_sigmask(signal.SIG_BLOCK, sigs)\n\
             print('ready', flush=True)\n\
             n = 0\n\
             while signal.sigwaitinfo(sigs).si_signo == {first}:\n    n += 1\n\
             print(n, flush=True)\n"
        );
        let mut cmd = Command::new("python3");
        cmd.args(["-c", &script]);
        let (id, _) = spawn(&poll, &mut ch, &mut roots, cmd);
        let got = collect(&mut poll, &mut ch, |g| !g.is_empty());
        assert_eq!(got[0], Got::Line(b"ready".to_vec()));
        ch.signal(id, first);
        ch.signal(id, last);
        let got = collect(&mut poll, &mut ch, |g| !g.is_empty());
        assert_eq!(got[0], Got::Line(b"1".to_vec()));
    }

    #[test]
    fn a_child_starts_with_no_signal_blocked_whatever_the_daemon_blocks() {
        // SAFETY: blocks SIGTERM in this test's own thread only, with an
        // initialised set.
        unsafe {
            let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(set.as_mut_ptr());
            libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
        }
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "grep SigBlk /proc/self/status"]);
        spawn(&poll, &mut ch, &mut roots, cmd);
        let got = collect(&mut poll, &mut ch, |g| !g.is_empty());
        assert_eq!(got[0], Got::Line(b"SigBlk:\t0000000000000000".to_vec()));
    }

    #[test]
    fn lines_written_apart_and_the_close_each_wake_the_reader() {
        // Each readiness stops at a short read: what the child writes later,
        // and its close, must still arrive.
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo one; sleep 0.1; echo two; sleep 0.1; printf three; sleep 0.1",
        ]);
        let (_, _) = spawn(&poll, &mut ch, &mut roots, cmd);
        let got = collect(&mut poll, &mut ch, |g| g.contains(&Got::StdoutClosed));
        assert_eq!(got, lines_then_closed(&["one", "two", "three"]));
    }

    #[test]
    fn an_oversized_line_stops_reading() {
        let mut poll = Poll::new().unwrap();
        let mut ch = Children::default();
        let mut roots = Roots::default();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "head -c 200 /dev/zero | tr '\\0' x; echo"]);
        let (id, _) = spawn(&poll, &mut ch, &mut roots, cmd);
        let got = collect(&mut poll, &mut ch, |g| g.contains(&Got::LineTooLong));
        assert_eq!(got, vec![Got::LineTooLong]);
        assert!(!ch.stdout_open(id));
    }
}
