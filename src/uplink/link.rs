//! The uplink of a node that runs the gateway itself (`serve --gateway`,
//! `[gateway] listen`; issue 13: "in that gateway's roster without
//! dialing, with the same channel semantics"): a
//! [`crate::gateway::NodeLink`] instead of a WebSocket, the same lines.
//!
//! Two threads: `uplink-link` waits on the link and hands the gateway's
//! lines to the reactor; `uplink-link-write` writes the reactor's lines.
//! No pings: nothing lies between the two ends that could go silent.

use crossbeam_channel::bounded;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Event, Out};
use crate::gateway::Gateway;
use crate::limits;
use crate::reactor::Inbox;

/// Attaches the node to `gw` and starts the link's threads. They need no
/// stop of their own: the gateway's stop closes the link, which ends both.
pub fn attach(gw: &Gateway, inbox: Inbox, links: Arc<AtomicU64>) -> Result<(), String> {
    let mut node = gw.attach_node()?;
    let mut sender = node.sender();
    let link = links.fetch_add(1, Ordering::AcqRel);
    let (tx, rx) = bounded::<Out>(limits::UPLINK_OUTBOX_FRAMES);
    std::thread::Builder::new()
        .name("uplink-link-write".into())
        .spawn(move || {
            for out in rx {
                let sent = match out {
                    Out::Line(l) | Out::Event(l, _) => sender.send(&l).is_ok(),
                    Out::Raw(_) => true,
                };
                if !sent {
                    return;
                }
            }
        })
        .map_err(|e| format!("unable to start the uplink's writer thread: {e}"))?;
    std::thread::Builder::new()
        .name("uplink-link".into())
        .spawn(move || {
            let up = Event::Up {
                link,
                out: tx,
                closer: None,
            };
            if !inbox.run(move |d| super::on_event(d, up)) {
                return;
            }
            // The wait is only how often the thread looks at the flag; a
            // closing gateway wakes it at once.
            let wait = Duration::from_secs(3600);
            loop {
                match node.recv(wait) {
                    Some(line) => {
                        let ev = Event::Lines {
                            link,
                            lines: vec![line],
                        };
                        if !inbox.run(move |d| super::on_event(d, ev)) {
                            return;
                        }
                    }
                    None if node.is_closed() => break,
                    None => {}
                }
            }
            let down = Event::Down {
                link,
                error: "the gateway closed the in-process link".into(),
            };
            inbox.run(move |d| super::on_event(d, down));
        })
        .map_err(|e| format!("unable to start the uplink's link thread: {e}"))?;
    Ok(())
}
