//! The daemon socket: a unix socket speaking line-framed JSON-RPC 2.0 (seed
//! 004, "Wire format") to the command line, shell scripts and local apps.
//!
//! This module owns the listener and the connections: binding with mode 0600
//! in a 0700 directory, refusing to start over a live daemon, replacing a
//! stale socket file, reading lines with the per-connection bounds, and
//! queueing replies. The reactor thread drives it; the method table lives in
//! [`methods`], the views of domain types in [`views`], the session watches
//! in [`watches`].

pub mod framing;
pub mod methods;
pub mod rpc;
pub mod views;
pub mod watches;

use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Registry, Token};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::SocketSection;
use crate::errors::io_cause;
use crate::limits;
use crate::procs::CallerClass;
use framing::LineBuffer;

/// Connections take tokens from here up to `children::FIRST_CHILD_TOKEN`;
/// below are fixed sources (the waker, the listener).
pub const FIRST_CONN_TOKEN: usize = 1 << 20;

/// One client connection.
pub struct Conn {
    stream: UnixStream,
    rbuf: LineBuffer,
    out: Vec<u8>,
    out_pos: usize,
    /// Requests read but not yet answered.
    pub in_flight: usize,
    pub class: CallerClass,
    pub peer_pid: i32,
    /// The socket may hold unread bytes (mio is edge-triggered): set when a
    /// read stopped for back-pressure rather than at WouldBlock.
    may_read: bool,
    read_closed: bool,
}

/// Why a connection is closed; logged at debug level.
#[derive(Debug)]
pub enum CloseReason {
    Eof,
    LineTooLong,
    SlowReader,
    Io(String),
}

/// The listener and every open connection.
pub struct Server {
    listener: Option<UnixListener>,
    path: PathBuf,
    /// Device and inode of the socket file we bound, so that we remove only
    /// our own file at exit.
    bound: Option<(u64, u64)>,
    pub conns: HashMap<Token, Conn>,
    next_token: usize,
    pub limits: SocketSection,
    /// One read buffer for every connection, allocated once: a fresh zeroed
    /// array per read cost more than the rest of a ping.
    scratch: Vec<u8>,
    /// The connections' watches of sessions and transcripts.
    pub watches: watches::Watches,
}

/// Starting the socket failed.
#[derive(Debug)]
pub enum BindError {
    /// Another daemon answers on the path.
    InUse(PathBuf),
    Other(String),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::InUse(p) => write!(f, "another daemon answers on {}", p.display()),
            BindError::Other(s) => f.write_str(s),
        }
    }
}

impl Server {
    /// Binds the socket at `path`: the directory is created with mode 0700,
    /// a file nobody answers on is replaced, and a live daemon is refused.
    pub fn bind(path: &Path, limits: SocketSection) -> Result<Server, BindError> {
        let shown = path.display();
        let dir = path
            .parent()
            .ok_or_else(|| BindError::Other(format!("socket path {shown} has no directory")))?;
        if !dir.exists() {
            crate::secret_file::create_private_dir(dir).map_err(|e| {
                BindError::Other(format!(
                    "unable to create socket directory {}: {}",
                    dir.display(),
                    io_cause(&e)
                ))
            })?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
                BindError::Other(format!(
                    "unable to set mode 0700 on {}: {}",
                    dir.display(),
                    io_cause(&e)
                ))
            })?;
        } else if let Ok(meta) = std::fs::metadata(dir) {
            // An existing directory of ours is narrowed to 0700; one of
            // another user is left alone (the socket's own 0600 still holds).
            // SAFETY: geteuid has no preconditions.
            if meta.uid() == unsafe { libc::geteuid() } && meta.mode() & 0o077 != 0 {
                let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
            }
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(BindError::Other(format!(
                        "{shown} exists and is not a socket; refusing to replace it"
                    )));
                }
                match std::os::unix::net::UnixStream::connect(path) {
                    Ok(_) => return Err(BindError::InUse(path.to_path_buf())),
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        crate::info!("replacing stale socket file {shown}");
                        std::fs::remove_file(path).map_err(|e| {
                            BindError::Other(format!(
                                "unable to remove stale socket {shown}: {}",
                                io_cause(&e)
                            ))
                        })?;
                    }
                    Err(e) => {
                        return Err(BindError::Other(format!(
                            "unable to probe socket {shown}: {}",
                            io_cause(&e)
                        )));
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                return Err(BindError::Other(format!(
                    "unable to inspect {shown}: {}",
                    io_cause(&e)
                )));
            }
        }
        let listener = UnixListener::bind(path).map_err(|e| {
            BindError::Other(format!("unable to bind socket {shown}: {}", io_cause(&e)))
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
            BindError::Other(format!(
                "unable to set mode 0600 on {shown}: {}",
                io_cause(&e)
            ))
        })?;
        let bound = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        Ok(Server {
            listener: Some(listener),
            path: path.to_path_buf(),
            bound,
            conns: HashMap::new(),
            next_token: FIRST_CONN_TOKEN,
            limits,
            scratch: vec![0; limits::SOCKET_READ_CHUNK],
            watches: watches::Watches::default(),
        })
    }

    pub fn register(&mut self, registry: &Registry, token: Token) -> std::io::Result<()> {
        match &mut self.listener {
            Some(l) => registry.register(l, token, Interest::READABLE),
            None => Ok(()),
        }
    }

    /// Stops accepting and removes the socket file if it is still ours.
    pub fn stop_listening(&mut self, registry: &Registry) {
        if let Some(mut l) = self.listener.take() {
            let _ = registry.deregister(&mut l);
        }
        if let Some((dev, ino)) = self.bound.take() {
            if let Ok(m) = std::fs::symlink_metadata(&self.path) {
                if m.dev() == dev && m.ino() == ino {
                    let _ = std::fs::remove_file(&self.path);
                }
            }
        }
    }

    /// Accepts every pending connection. `classify` names each caller;
    /// connections beyond the limit get one error line and are closed.
    pub fn accept_all(
        &mut self,
        registry: &Registry,
        classify: impl Fn(&UnixStream) -> (CallerClass, i32),
    ) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((mut stream, _)) => {
                    if self.conns.len() >= self.limits.max_connections {
                        let e = crate::errors::RpcError::new(
                            crate::errors::Code::TooManyConnections,
                            format!(
                                "the daemon's connection limit ({}) is reached",
                                self.limits.max_connections
                            ),
                        );
                        let _ = stream.write(&rpc::error(&serde_json::Value::Null, &e, None));
                        continue;
                    }
                    let (class, peer_pid) = classify(&stream);
                    let token = Token(self.next_token);
                    self.next_token += 1;
                    if let Err(e) = registry.register(
                        &mut stream,
                        token,
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        crate::warn!("unable to watch a new connection: {}", io_cause(&e));
                        continue;
                    }
                    self.conns.insert(
                        token,
                        Conn {
                            stream,
                            rbuf: LineBuffer::new(limits::SOCKET_MAX_LINE),
                            out: Vec::new(),
                            out_pos: 0,
                            in_flight: 0,
                            class,
                            peer_pid,
                            may_read: true,
                            read_closed: false,
                        },
                    );
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: stop accepting for this wake-up; the
                    // listener stays readable and is tried again later.
                    crate::warn!(
                        "unable to accept a connection on {}: {}",
                        self.path.display(),
                        io_cause(&e)
                    );
                    return;
                }
            }
        }
    }

    /// Reads what the connection has and returns its complete lines, at most
    /// as many as its in-flight allowance leaves room for. `Err` means the
    /// connection must be closed.
    pub fn read_lines(&mut self, token: Token) -> Result<Vec<Vec<u8>>, CloseReason> {
        let max_in_flight = self.limits.max_in_flight;
        let Server { conns, scratch, .. } = self;
        let Some(conn) = conns.get_mut(&token) else {
            return Ok(Vec::new());
        };
        let mut lines = Vec::new();
        let chunk = scratch.as_mut_slice();
        loop {
            // Lines already buffered go first.
            while conn.in_flight + lines.len() < max_in_flight {
                match conn.rbuf.next_line() {
                    Ok(Some(l)) => lines.push(l),
                    Ok(None) => break,
                    Err(_) => return Err(CloseReason::LineTooLong),
                }
            }
            if conn.in_flight + lines.len() >= max_in_flight {
                // Back-pressure: leave the rest in the kernel's buffer.
                conn.may_read = true;
                return Ok(lines);
            }
            if conn.read_closed {
                // A client that half-closed still gets every answer: the
                // connection is closed once they are written (`finished`).
                return Ok(lines);
            }
            match conn.stream.read(chunk) {
                Ok(0) => {
                    conn.read_closed = true;
                    conn.may_read = false;
                }
                Ok(n) => conn.rbuf.extend(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    conn.may_read = false;
                    return Ok(lines);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(CloseReason::Io(io_cause(&e))),
            }
        }
    }

    /// Whether a client that closed its sending side has had every answer
    /// written, so the connection can be closed.
    pub fn finished(&self, token: Token) -> bool {
        self.conns
            .get(&token)
            .is_some_and(|c| c.read_closed && c.in_flight == 0 && c.out_pos >= c.out.len())
    }

    /// Requests read and not yet answered, on every connection.
    pub fn in_flight(&self) -> usize {
        self.conns.values().map(|c| c.in_flight).sum()
    }

    /// Whether the connection stopped reading for back-pressure and has room
    /// again.
    pub fn wants_pump(&self, token: Token) -> bool {
        self.conns.get(&token).is_some_and(|c| {
            (c.may_read || c.rbuf.pending() > 0)
                && !c.read_closed
                && c.in_flight < self.limits.max_in_flight
        })
    }

    /// Queues bytes to a connection. Past the queue bound the client is not
    /// reading: the connection is closed rather than allowed to grow memory.
    pub fn queue(&mut self, token: Token, bytes: &[u8]) -> Result<(), CloseReason> {
        self.queue_parts(token, &[bytes])
    }

    /// [`queue`](Self::queue) of the concatenation of `parts`, under the
    /// same bound, without building it first.
    pub fn queue_parts(&mut self, token: Token, parts: &[&[u8]]) -> Result<(), CloseReason> {
        let max = self.limits.max_queued_bytes;
        let Some(conn) = self.conns.get_mut(&token) else {
            return Ok(());
        };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if conn.out.len() - conn.out_pos + len > max {
            return Err(CloseReason::SlowReader);
        }
        conn.out.reserve(len);
        for p in parts {
            conn.out.extend_from_slice(p);
        }
        Ok(())
    }

    /// Writes as much of the queue as the socket takes.
    pub fn flush(&mut self, token: Token) -> Result<(), CloseReason> {
        let Some(conn) = self.conns.get_mut(&token) else {
            return Ok(());
        };
        while conn.out_pos < conn.out.len() {
            match conn.stream.write(&conn.out[conn.out_pos..]) {
                Ok(0) => return Err(CloseReason::Io("write returned zero".into())),
                Ok(n) => conn.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(CloseReason::Io(io_cause(&e))),
            }
        }
        if conn.out_pos == conn.out.len() {
            conn.out.clear();
            conn.out_pos = 0;
            // Give back the memory a burst made the queue take.
            if conn.out.capacity() > limits::SOCKET_READ_CHUNK {
                conn.out.shrink_to(limits::SOCKET_READ_CHUNK);
            }
        } else if conn.out_pos > conn.out.len() / 2 {
            conn.out.drain(..conn.out_pos);
            conn.out_pos = 0;
        }
        Ok(())
    }

    /// Bytes waiting to be written to any connection.
    pub fn queued_bytes(&self) -> usize {
        self.conns.values().map(|c| c.out.len() - c.out_pos).sum()
    }

    pub fn close(&mut self, registry: &Registry, token: Token) -> Option<Conn> {
        let mut conn = self.conns.remove(&token)?;
        let _ = registry.deregister(&mut conn.stream);
        self.watches.forget_conn(token);
        Some(conn)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_listening(&self) -> bool {
        self.listener.is_some()
    }
}

/// The peer's class and pid, for `accept_all`.
pub fn classify_stream(stream: &UnixStream, roots: &crate::procs::Roots) -> (CallerClass, i32) {
    match crate::procs::peer_of(stream.as_raw_fd()) {
        Some(peer) => (crate::procs::classify_peer(&peer, roots), peer.pid),
        None => (CallerClass::Unverified, 0),
    }
}
