//! The gateway in the node (`[gateway] listen`, `serve --gateway ADDR`;
//! issue 12, "Where it runs"): started by `serve` beside the other
//! surfaces, stopped with them. It shares nothing with the reactor but the
//! operator's requests: `clients.*` on the node socket reach the gateway
//! thread through [`super::Caller`] and come back through the reactor's
//! inbox (src/socket/methods/gateway.rs). Paired devices are kept in the
//! ledger's table `gateway_clients` ([`super::tokens`] says why through
//! the gateway's own connection); the master token is
//! `STATE/gateway.token` or `OMNICONFLUX_GATEWAY_TOKEN`.

use super::{Gateway, tokens};
use crate::config::{FileConfig, Paths};

/// Starts the gateway when the config asks for it.
pub fn start(cfg: &FileConfig, paths: &Paths) -> Result<Option<Gateway>, String> {
    let Some(addr) = cfg.gateway.addr() else {
        return Ok(None);
    };
    let from_env = std::env::var(tokens::TOKEN_ENV).ok();
    let origin = if from_env.is_some() {
        tokens::TOKEN_ENV.to_string()
    } else {
        paths.state_dir.join("gateway.token").display().to_string()
    };
    let master = tokens::master(&paths.state_dir, from_env)?;
    let store = tokens::Store::open(&paths.ledger, false)?;
    let gw = Gateway::start(&cfg.gateway, addr, master, store)?;
    crate::info!(
        "gateway listening on {} (master token from {origin})",
        gw.addr()
    );
    Ok(Some(gw))
}

/// The gateway's row of the daemon's surfaces: it hears no events; the
/// stop closes its connections and answers pending pairing waits.
pub const HOOKS: crate::daemon::Hooks = crate::daemon::Hooks {
    events: |_, _| {},
    session: |_, _, _| {},
    stop: |d| {
        if let Some(g) = d.gateway.take() {
            g.stop(false);
        }
    },
    busy: |_| false,
};
