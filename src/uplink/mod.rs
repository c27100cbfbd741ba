//! The uplink: the node's side of a gateway (seed 004, "Overview",
//! "Relay channels", "End-to-end encryption", "Connecting a client";
//! issue 13). The node dials the gateway's `/node` route (`[uplink] url`,
//! [`dial`]), or, when it runs the gateway itself (`serve --gateway`),
//! attaches to it in-process ([`link`]); either way it answers the
//! gateway's `node.identify` and serves relay channels as connections
//! ([`channels`]).
//!
//! Threads and ownership (DESIGN.md, "How subsystems talk"): the
//! transports' threads only move lines. They hand every line the gateway
//! sends to the reactor through its inbox, and write the lines the reactor
//! queues on a bounded channel ([`Out`], `UPLINK_OUTBOX_FRAMES`). The
//! reactor owns everything else in [`Uplink`]: the link of the moment,
//! its channels and their Noise cipher states, so that sealing follows the
//! order in which the reactor answers, which is the wire order. A request
//! on a channel is a [`crate::daemon::Req`] whose `ReplyTo::Relay` names
//! the link, the channel and the request id; an answer for a link or a
//! channel that has gone since is dropped.
//!
//! Each connection is a link with a new number. When it closes, every
//! channel of it goes with its state; channel ids are only valid on the
//! connection that made them ("Old channel ids are not valid on a new
//! connection"). When the gateway's writer does not keep up (the outbox
//! is full) the node closes the uplink and dials again: dropping one frame
//! would break a channel's nonce order. The in-process link's writer hands
//! lines to the gateway thread's queue and so keeps up with it; should its
//! outbox fill all the same, the node forgets the link (its channels go)
//! but cannot close it, and stays silent in that roster until a restart.
//!
//! Decisions where the issue is silent, also in omniconfluxd(8), UPLINK:
//! - a node that runs its own gateway attaches to it and does not dial
//!   `[uplink] url` too (its id would replace itself in the roster); the
//!   in-process link is not re-attached once the gateway closes it, since
//!   that happens only when the gateway stops or a second uplink with the
//!   node's id replaced it;
//! - the node's identity key is loaded or made at start whenever the node
//!   has an uplink; when that fails the node serves plaintext channels only
//!   and `node.identify` carries no `identity_pubkey`;
//! - the master token comes from `OMNICONFLUX_UPLINK_TOKEN` or
//!   `[uplink] token_file` (relative to the state directory, mode 0600 or
//!   stricter); a `url` without either is a start-up error.

pub mod channels;
pub mod dial;
pub mod link;
pub mod tls;

use crossbeam_channel::Sender;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::config::{FileConfig, Paths};
use crate::daemon::Daemon;
use crate::e2ee::StaticKey;
use crate::reactor::Inbox;

/// The environment variable that carries the master token.
pub const TOKEN_ENV: &str = "OMNICONFLUX_UPLINK_TOKEN";

/// What a transport's writer sends.
pub enum Out {
    /// One JSON line, `\n` included.
    Line(Vec<u8>),
    /// A `session.event` line of a channel, counted in that channel's event
    /// buffer until the writer takes it ([`channels::EventTicket`]).
    Event(Vec<u8>, channels::EventTicket),
    /// Bytes the WebSocket formatted itself (a pong, the close reply).
    Raw(Vec<u8>),
}

/// What a transport tells the reactor.
pub enum Event {
    /// Connection `link` is up; `out` writes to it; shutting `closer` down
    /// ends it (an in-process link has none: its writer never lags).
    Up {
        link: u64,
        out: Sender<Out>,
        closer: Option<dial::Closer>,
    },
    /// Lines the gateway sent on `link`, in order.
    Lines { link: u64, lines: Vec<Vec<u8>> },
    /// `link` closed (`error` says why), or a dial failed (`link` 0).
    Down { link: u64, error: String },
    /// The transport dials now.
    Dialing,
}

/// The running transport, for the stop.
enum Transport {
    Dial(dial::Dialer),
    /// The in-process link, which the gateway's own stop ends.
    Link,
}

/// The uplink's state, owned by the reactor (module comment).
pub struct Uplink {
    /// Where it goes: the `[uplink] url`, or `in-process`.
    via: String,
    identity: Option<StaticKey>,
    link: Option<channels::Link>,
    transport: Option<Transport>,
    /// `connecting`, `connected`, `waiting` (between dials) or `closed`.
    state: &'static str,
    last_error: Option<String>,
    since: String,
    connects: u64,
    /// The gateway's `node.identify` (link, request id), held until locked
    /// mode is read: the node announces itself only once it can admit
    /// channels ([`channels::lock_loaded`]). The latest link's only.
    identify_waiting: Option<(u64, serde_json::Value)>,
}

/// Starts the uplink when the config or a gateway in the node asks for it.
pub fn start(
    cfg: &FileConfig,
    paths: &Paths,
    inbox: &Inbox,
    gateway: Option<&crate::gateway::Gateway>,
) -> Result<Option<Uplink>, String> {
    let target = cfg
        .uplink
        .target()
        .map_err(|e| format!("invalid [uplink] url: {e}"))?;
    if gateway.is_none() && target.is_none() {
        return Ok(None);
    }
    let identity = match crate::e2ee::identity::load_or_create(&paths.state_dir) {
        Ok(k) => Some(k),
        Err(e) => {
            crate::error!(
                "unable to load or make the node's identity key: {e}; the uplink serves plaintext channels only"
            );
            None
        }
    };
    let links = Arc::new(AtomicU64::new(1));
    let (via, transport) = match (gateway, target) {
        (Some(gw), target) => {
            if target.is_some() {
                crate::warn!(
                    "[uplink] url is not dialed: the node runs its own gateway and is in its roster"
                );
            }
            link::attach(gw, inbox.clone(), links)?;
            ("in-process".to_string(), Transport::Link)
        }
        (None, Some(target)) => {
            let token = master_token(cfg, paths)?;
            let via = cfg.uplink.url.clone();
            let tls = match &target.via {
                crate::config::UplinkVia::Tls { .. } => {
                    let ca = (!cfg.uplink.ca_file.is_empty())
                        .then(|| paths.state_dir.join(&cfg.uplink.ca_file));
                    Some(tls::config(ca.as_deref())?)
                }
                _ => None,
            };
            let dialer = dial::start(target, token, tls, inbox.clone(), links)?;
            (via, Transport::Dial(dialer))
        }
        (None, None) => return Ok(None),
    };
    crate::info!("uplink to {via}");
    Ok(Some(Uplink {
        via,
        identity,
        link: None,
        transport: Some(transport),
        state: "connecting",
        last_error: None,
        since: crate::clock::now_ts(),
        connects: 0,
        identify_waiting: None,
    }))
}

/// The master token: `OMNICONFLUX_UPLINK_TOKEN`, else `[uplink] token_file`.
fn master_token(cfg: &FileConfig, paths: &Paths) -> Result<String, String> {
    if let Ok(t) = std::env::var(TOKEN_ENV)
        && !t.trim().is_empty()
    {
        return Ok(t.trim().to_string());
    }
    if cfg.uplink.token_file.is_empty() {
        return Err(format!(
            "the uplink has no master token: set {TOKEN_ENV} or [uplink] token_file"
        ));
    }
    let path = paths.state_dir.join(&cfg.uplink.token_file);
    read_token_file(&path)
}

/// A token file's token, refusing a file others may read.
fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| {
        format!(
            "unable to read the uplink token file {shown}: {}",
            crate::errors::io_cause(&e)
        )
    })?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "the uplink token file {shown} may be read by others (mode {:o}); make it 0600",
            meta.mode() & 0o777
        ));
    }
    if meta.len() > 4096 {
        return Err(format!(
            "the uplink token file {shown} is longer than 4096 bytes"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "unable to read the uplink token file {shown}: {}",
            crate::errors::io_cause(&e)
        )
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("the uplink token file {shown} is empty"));
    }
    Ok(token.to_string())
}

/// A transport's event, on the reactor.
pub fn on_event(d: &mut Daemon, ev: Event) {
    if let Event::Down { link, .. } = &ev {
        // What is kept for the link's channels goes with them.
        channels::link_gone(d, *link);
    }
    let Some(u) = d.uplink.as_mut() else { return };
    match ev {
        Event::Dialing => {
            u.state = "connecting";
        }
        Event::Up { link, out, closer } => {
            u.link = Some(channels::Link::new(link, out, closer));
            u.state = "connected";
            u.since = crate::clock::now_ts();
            u.connects += 1;
            crate::info!("uplink to {} is connected", u.via);
        }
        Event::Lines { link, lines } => {
            for line in lines {
                channels::on_line(d, link, &line);
            }
        }
        Event::Down { link, error } => {
            if link != 0 && u.link.as_ref().is_some_and(|l| l.id == link) {
                // Every channel goes with its state (seed 004, Limits and
                // teardown: "The node also frees every channel when its
                // uplink closes").
                u.link = None;
                crate::warn!("uplink to {} closed: {error}", u.via);
            } else if link == 0 && u.last_error.as_ref() != Some(&error) {
                // Once per new reason, not at every dial of the backoff.
                crate::warn!("uplink to {}: {error}; dialing again", u.via);
            }
            u.state = match u.transport {
                Some(Transport::Dial(_)) => "waiting",
                _ => "closed",
            };
            u.since = crate::clock::now_ts();
            u.last_error = Some(error);
        }
    }
}

/// The `uplink` member of `server.info`, `null` without an uplink.
pub fn status(d: &Daemon) -> Value {
    let Some(u) = &d.uplink else {
        return Value::Null;
    };
    json!({
        "via": u.via,
        "state": u.state,
        "since": u.since,
        "last_error": u.last_error,
        "connects": u.connects,
        "channels": u.link.as_ref().map_or(0, |l| l.chans.len()),
        "e2ee_mode": d.cfg.uplink.e2ee,
        "identity_pubkey": u.identity.as_ref().map(|k| k.public().to_base64()),
    })
}

/// `node.identify`: who this node is, for the gateway's roster (seed 004,
/// Roster events) and for a client on a channel. The capabilities say
/// what this node really serves, on the socket and on channels alike:
/// sessions it can spawn when it has a seat or tmux; live and persistent
/// terminals (`terminal.*`, served on channels too) when it has tmux; the
/// wakelock (`host.setWakelock`) when systemd-inhibit works.
pub fn identify(d: &Daemon) -> Value {
    // Spawning into tmux and persistent terminals, which live in the
    // daemon's tmux server, need tmux (issue 15); a seat spawns without it.
    // The wakelock is what the start-up probe of systemd-inhibit found.
    let tmux = crate::isolation::which("tmux").is_some();
    let mut v = json!({
        "id": d.node_name,
        "label": d.node_name,
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {
            "spawn_session": tmux || !d.core.seats.list.is_empty(),
            "terminal": tmux,
            "host_wakelock": crate::daemon::router::tmux::wakelock_supported(d),
        },
    });
    if let Some(k) = d.uplink.as_ref().and_then(|u| u.identity.as_ref()) {
        v["identity_pubkey"] = json!(k.public().to_base64());
    }
    // Locked mode (issue 14; seed 004, node.identify).
    let lock = &d.lock.lock;
    if let Some(k) = lock.signer_pubkey() {
        v["signer_pubkey"] = json!(crate::e2ee::base64::encode(&k));
    }
    if let Some(c) = lock.chain() {
        v["tip"] = json!(crate::e2ee::base64::encode(&c.state().tip().0));
    }
    // "accepts channels from any device": a local disable, or a disabled log.
    if lock.local_disabled() || lock.chain().is_some_and(|c| c.state().disabled()) {
        v["lock_disabled"] = json!(true);
    }
    v
}

/// The uplink's row of the daemon's surfaces: it hears no events yet; the
/// stop ends its transport and frees its channels.
pub const HOOKS: crate::daemon::Hooks = crate::daemon::Hooks {
    events: |_, _| {},
    session: |_, _, _| {},
    stop: |d| {
        if let Some(u) = d.uplink.as_mut() {
            if let Some(l) = u.link.take() {
                channels::link_gone(d, l.id);
            }
            let Some(u) = d.uplink.as_mut() else { return };
            u.state = "closed";
            if let Some(Transport::Dial(t)) = u.transport.take() {
                t.stop();
            }
        }
    },
    busy: |_| false,
};

/// The channels of a link, for [`channels`].
pub(crate) type Chans = HashMap<String, channels::Chan>;
