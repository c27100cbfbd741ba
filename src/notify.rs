//! The sd_notify datagram protocol (sd_notify(3)): when the service manager
//! sets NOTIFY_SOCKET, the daemon sends `READY=1` once its socket accepts and
//! `STOPPING=1` when it begins to stop. A path starting with '@' names an
//! abstract socket. Without NOTIFY_SOCKET this does nothing.

use std::os::unix::net::UnixDatagram;

pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let sent = if let Some(name) = target.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|addr| sock.send_to_addr(state.as_bytes(), &addr))
    } else {
        sock.send_to(state.as_bytes(), &target)
    };
    if let Err(e) = sent {
        crate::warn!(
            "unable to notify the service manager at {target}: {}",
            crate::errors::io_cause(&e)
        );
    }
}
