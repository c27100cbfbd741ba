//! The process on the other end of a local TCP connection, so that an HTTP
//! caller is classified like a daemon-socket caller (DESIGN.md, "Who is
//! calling"): operator-only operations are refused to agents and plugins
//! even when they hold the token.
//!
//! TCP has no SO_PEERCRED. For a peer on this machine (in this network
//! namespace) its end of the connection is a socket whose local address is
//! our peer address and whose remote address is our local address; that
//! row of /proc/net/tcp (or tcp6) gives the socket's inode, and the
//! processes holding it are found by their /proc/PID/fd links
//! `socket:[INODE]`. Each holder is pinned with a pidfd and re-checked to
//! still hold the inode, so a recycled pid is not mistaken for it; the
//! reactor then classifies each with [`crate::procs::classify`]. A peer not
//! found (a remote host, another user's process we cannot inspect) is
//! `unverified`, which is refused operator-only operations.
//!
//! The scan reads every process's fd table, so it runs on the handler
//! thread, never on the reactor, and once per connection (`Ctx::caller`
//! keeps its result on the connection).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;

/// Parses a /proc/net/tcp{,6} address `HEX:PORT`. The kernel prints each
/// 32-bit word of the address in host byte order.
pub fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
            .ok()
            .map(u32::to_ne_bytes)
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn same(a: SocketAddr, b: SocketAddr) -> bool {
    let canon = |s: SocketAddr| match s.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(|v4| SocketAddr::new(IpAddr::V4(v4), s.port()))
            .unwrap_or(s),
        IpAddr::V4(_) => s,
    };
    canon(a) == canon(b)
}

/// The inode of the socket whose local end is `theirs` and remote end is
/// `ours`, from the text of /proc/net/tcp or tcp6.
pub fn find_inode(table: &str, theirs: SocketAddr, ours: SocketAddr) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let local = parse_addr(f.get(1)?)?;
        let remote = parse_addr(f.get(2)?)?;
        (same(local, theirs) && same(remote, ours))
            .then(|| f.get(9)?.parse().ok())
            .flatten()
    })
}

/// Pids whose fd table holds socket `inode`.
fn holders(inode: u64) -> Vec<i32> {
    let want = format!("socket:[{inode}]");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| holds(pid, &want))
        .collect()
}

fn holds(pid: i32, link: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == link))
}

/// A process holding the peer's socket, pinned.
pub struct Holder {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

/// The processes holding the peer end of a local connection; empty when
/// it cannot be found.
pub fn peer_processes(theirs: SocketAddr, ours: SocketAddr) -> Vec<Holder> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|t| find_inode(&t, theirs, ours));
    let Some(inode) = inode else {
        return Vec::new();
    };
    let link = format!("socket:[{inode}]");
    holders(inode)
        .into_iter()
        .filter_map(|pid| {
            let pidfd = crate::procs::pidfd_open(pid)?;
            // Still the process that holds the socket: the pid was not recycled
            // between the scan and the pidfd.
            holds(pid, &link).then_some(Holder { pid, pidfd })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_addresses() {
        assert_eq!(
            parse_addr("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_addr("00000000000000000000000001000000:0050"),
            Some("[::1]:80".parse().unwrap())
        );
        assert_eq!(
            parse_addr("0000000000000000FFFF00000100007F:0050").map(|a| a.ip().to_string()),
            Some("::ffff:127.0.0.1".into())
        );
        assert_eq!(parse_addr("zz:1"), None);
    }

    #[test]
    fn finds_this_process_as_the_peer_of_its_own_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let ours = server.local_addr().unwrap();
        let found = peer_processes(peer, ours);
        assert!(
            found.iter().any(|h| h.pid == std::process::id() as i32),
            "this process holds the client end"
        );
        drop(client);
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:A000 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 20 4 30 10 -1\n";
        assert_eq!(
            find_inode(
                table,
                "127.0.0.1:40960".parse().unwrap(),
                "127.0.0.1:8080".parse().unwrap()
            ),
            Some(4242)
        );
        assert_eq!(
            find_inode(
                table,
                "127.0.0.1:8080".parse().unwrap(),
                "127.0.0.1:40960".parse().unwrap()
            ),
            None
        );
    }
}
