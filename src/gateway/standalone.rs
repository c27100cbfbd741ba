//! `omniconfluxd gateway [--listen ADDR]`: the gateway without a node (seed
//! 004, "Transports"; issue 12, "Where it runs").
//!
//! It listens where `--listen` or `[gateway] listen` says, else on
//! `127.0.0.1:8443`: loopback unless deliberately otherwise, because the
//! gateway does not terminate TLS and a token sent in clear over a network
//! is a token given away (put a tunnel or a TLS proxy in front). Its state:
//! the master token `STATE/gateway.token` (or `OMNICONFLUX_GATEWAY_TOKEN`)
//! and the paired devices in `STATE/gateway.sqlite3`. No ledger is opened.
//!
//! Its own socket, `omniconfluxd-gateway.sock` beside the node socket
//! (mode 0600: only its owner connects), serves `ping`, `server.info` with
//! no nodes, `server.stop` (answered, then the gateway stops) and the
//! operator's `clients.*` (what `omniconfluxd pair` and `omniconfluxd
//! clients` use); `server.checkUpgrade`, `server.upgrade` and
//! `server.restart` answer -32601, which the seed allows. Each connection
//! has a thread, at most `GATEWAY_SOCKET_CONNECTIONS`, and its requests
//! are answered in order.
//!
//! The ready line the log prints names the address bound (port 0 picks a
//! free port); SIGTERM or SIGINT stops it as `server.stop` does.

use crossbeam_channel::{Sender, bounded};
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::wire::{self, Frame, GwError};
use super::{Caller, Gateway, tokens};
use crate::config::{self, PathFlags};
use crate::limits;
use crate::socket::framing::LineBuffer;

/// Why the gateway could not run: a usage or config problem (exit 2) or a
/// failure at start (exit 1).
pub enum RunError {
    Config(String),
    Startup(String),
}

/// The standalone gateway's socket, beside the node socket.
pub fn socket_path(node_socket: &Path) -> PathBuf {
    node_socket.with_file_name("omniconfluxd-gateway.sock")
}

/// Runs until SIGTERM, SIGINT or `server.stop`.
pub fn run(flags: &PathFlags) -> Result<(), RunError> {
    crate::isolation::close_inherited_on_exec().map_err(|e| {
        RunError::Startup(format!(
            "unable to keep inherited descriptors from child processes: {}",
            crate::errors::io_cause(&e)
        ))
    })?;
    crate::signals::block()
        .map_err(|e| RunError::Startup(format!("unable to block signals: {e}")))?;
    let env = config::Env::from_process();
    let (mut cfg, paths) = config::load_effective(flags, &env)
        .map_err(|e| RunError::Config(format!("invalid configuration: {e}")))?;
    crate::log::set_level(cfg.log_level());
    if cfg.gateway.listen.is_empty() {
        cfg.gateway.listen = format!("127.0.0.1:{}", limits::GATEWAY_PORT);
    }
    let addr = cfg
        .gateway
        .addr()
        .ok_or_else(|| RunError::Config(format!("invalid address {}", cfg.gateway.listen)))?;
    crate::secret_file::create_private_dir(&paths.state_dir).map_err(|e| {
        RunError::Startup(format!(
            "unable to create state directory {}: {}",
            paths.state_dir.display(),
            crate::errors::io_cause(&e)
        ))
    })?;
    let from_env = std::env::var(tokens::TOKEN_ENV).ok();
    let token_origin = if from_env.is_some() {
        tokens::TOKEN_ENV.to_string()
    } else {
        paths.state_dir.join("gateway.token").display().to_string()
    };
    let master = tokens::master(&paths.state_dir, from_env).map_err(RunError::Startup)?;
    let store = tokens::Store::open(&paths.state_dir.join("gateway.sqlite3"), true)
        .map_err(RunError::Startup)?;
    let sock_path = socket_path(&paths.socket);
    let listener = bind_socket(&sock_path).map_err(RunError::Startup)?;
    let gw = Gateway::start(&cfg.gateway, addr, master, store).map_err(RunError::Startup)?;
    let (stop_tx, stop_rx) = bounded::<&'static str>(4);
    let sig_tx = stop_tx.clone();
    crate::signals::spawn(move |sig| {
        if sig == libc::SIGTERM || sig == libc::SIGINT {
            let _ = sig_tx.try_send(if sig == libc::SIGTERM {
                "SIGTERM"
            } else {
                "SIGINT"
            });
        }
    })
    .map_err(|e| RunError::Startup(format!("unable to start the signal thread: {e}")))?;
    let caller = gw.caller();
    std::thread::Builder::new()
        .name("gw-socket".into())
        .spawn(move || accept_socket(listener, caller, stop_tx))
        .map_err(|e| RunError::Startup(format!("unable to start the socket thread: {e}")))?;
    crate::info!(
        "omniconfluxd {} gateway listening on {} (socket {}, master token from {})",
        env!("CARGO_PKG_VERSION"),
        gw.addr(),
        sock_path.display(),
        token_origin
    );
    crate::notify::notify("READY=1");
    let why = stop_rx.recv().unwrap_or("the stop channel closed");
    crate::info!("stopping ({why})");
    crate::notify::notify("STOPPING=1");
    gw.stop(true);
    let _ = std::fs::remove_file(&sock_path);
    crate::info!("stopped");
    Ok(())
}

/// Binds the socket: a stale file no one answers on is replaced; one a
/// running gateway answers on is an error.
fn bind_socket(path: &Path) -> Result<UnixListener, String> {
    if let Some(dir) = path.parent() {
        crate::secret_file::create_private_dir(dir).map_err(|e| {
            format!(
                "unable to create socket directory {}: {}",
                dir.display(),
                crate::errors::io_cause(&e)
            )
        })?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "another gateway is already serving on {}",
                path.display()
            ));
        }
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(|e| {
        format!(
            "unable to bind the gateway socket {}: {}",
            path.display(),
            crate::errors::io_cause(&e)
        )
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
        format!(
            "unable to make the gateway socket {} private: {}",
            path.display(),
            crate::errors::io_cause(&e)
        )
    })?;
    Ok(l)
}

fn accept_socket(listener: UnixListener, caller: Caller, stop: Sender<&'static str>) {
    let live = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if live.fetch_add(1, Ordering::AcqRel) >= limits::GATEWAY_SOCKET_CONNECTIONS {
            live.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (caller, stop, live) = (caller.clone(), stop.clone(), live.clone());
        let spawned = std::thread::Builder::new()
            .name("gw-socket-conn".into())
            .stack_size(limits::GATEWAY_THREAD_STACK)
            .spawn(move || {
                serve_socket(stream, &caller, &stop);
                live.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            crate::warn!("gateway: unable to start a socket connection thread");
        }
    }
}

/// One operator connection: each request answered before the next is read.
fn serve_socket(mut stream: UnixStream, caller: &Caller, stop: &Sender<&'static str>) {
    let mut lines = LineBuffer::new(limits::SOCKET_MAX_LINE);
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        lines.extend(&buf[..n]);
        loop {
            let line = match lines.next_line() {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(_) => return,
            };
            let answer = match wire::classify(line) {
                Frame::Ping { id } => wire::reply(&id, &Value::Null),
                Frame::Refused(a) => a,
                Frame::Request { id, method, .. } if method == "server.stop" => {
                    let _ = stream.write_all(&wire::reply(&id, &Value::Null));
                    let _ = stop.try_send("server.stop");
                    return;
                }
                Frame::Request { id, method, params } => {
                    let (tx, rx) = bounded(1);
                    caller.call(
                        &method,
                        params,
                        Box::new(move |r| {
                            let _ = tx.send(r);
                        }),
                    );
                    let r = rx.recv().unwrap_or_else(|_| {
                        Err(GwError::internal("the gateway stopped before answering"))
                    });
                    wire::answer(&id, &r)
                }
                Frame::Relay { .. } => wire::error(
                    &Value::Null,
                    &GwError::invalid_request("relay frames are not served on the gateway socket"),
                ),
                Frame::Notification | Frame::Response { .. } | Frame::Unroutable => continue,
            };
            if stream.write_all(&answer).is_err() {
                return;
            }
        }
    }
}
