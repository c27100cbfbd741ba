//! Who may call, checked before routing (seed 002, "Addressing and
//! authentication"):
//! - the **bearer token**: "Every platform request, including SSE, uses
//!   Authorization: Bearer <daemon-token>." It is generated at first start
//!   (32 random bytes, hex) into a 0600 file, `http.token` in the state
//!   directory unless `http.token_file` names another. It is compared in
//!   constant time (over SHA-256 digests, so the length does not leak
//!   either) and never written to a URL, a log line, a body or an event.
//! - the **origin**: "Browser access uses an operator-configured list of
//!   exact allowed origins. The daemon validates Origin before routing or
//!   reading a body." Allowed origins get CORS headers naming them (never
//!   a wildcard, never credentials); a preflight needs no token.
//! - the **host**: "The daemon validates the requested host against its
//!   listener and configured public addresses", which defeats DNS
//!   rebinding: a page served from a name the operator did not list cannot
//!   reach the API through the victim's browser.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::problem::{Code, Problem};
use super::wire::Head;
use crate::errors::io_cause;
use crate::limits;

/// The bearer token. Its Debug form hides it.
pub struct Token {
    digest: [u8; 32],
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Token {
    pub fn from_secret(secret: &str) -> Token {
        Token {
            digest: sha256(secret.as_bytes()),
        }
    }

    /// Reads the token file, or creates it with a new token when it does
    /// not exist. A file others can read is refused: the token grants
    /// operator access.
    pub fn load_or_create(path: &Path) -> Result<Token, String> {
        let shown = path.display();
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                if !meta.file_type().is_file() {
                    return Err(format!("token file {shown} is not a regular file"));
                }
                if meta.mode() & 0o077 != 0 {
                    return Err(format!(
                        "token file {shown} is readable by others (mode {:o}); chmod 600 it",
                        meta.mode() & 0o777
                    ));
                }
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("unable to read token file {shown}: {}", io_cause(&e)))?;
                let secret = text.trim();
                if !(32..=1024).contains(&secret.len())
                    || !secret.bytes().all(|b| b.is_ascii_graphic())
                {
                    return Err(format!(
                        "token file {shown} must hold one token of 32 to 1024 visible ASCII characters"
                    ));
                }
                Ok(Token::from_secret(secret))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let secret = crate::ids::secret_hex(limits::HTTP_TOKEN_BYTES);
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| {
                        format!("unable to create token file {shown}: {}", io_cause(&e))
                    })?;
                f.write_all(format!("{secret}\n").as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|e| format!("unable to write token file {shown}: {}", io_cause(&e)))?;
                crate::info!("created the HTTP bearer token file {shown}");
                Ok(Token::from_secret(&secret))
            }
            Err(e) => Err(format!(
                "unable to read token file {shown}: {}",
                io_cause(&e)
            )),
        }
    }

    /// Checks an `Authorization` header value in constant time.
    pub fn verify(&self, authorization: Option<&str>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let Some((scheme, given)) = value.split_once(' ') else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return false;
        }
        let given = sha256(given.trim().as_bytes());
        given
            .iter()
            .zip(self.digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// The `Origin` check. `Ok(None)`: no Origin (not a browser's CORS
/// request); `Ok(Some(o))`: an allowed origin to name in CORS headers.
pub fn check_origin<'a>(head: &'a Head, allowed: &[String]) -> Result<Option<&'a str>, Problem> {
    match head.count("origin") {
        0 => Ok(None),
        1 => {
            let o = head.header("origin").unwrap_or_default();
            if allowed.iter().any(|a| a == o) {
                Ok(Some(o))
            } else {
                Err(Problem::new(
                    Code::OriginNotAllowed,
                    "this origin is not in http.allowed_origins",
                ))
            }
        }
        _ => Err(Problem::invalid("more than one Origin header")),
    }
}

/// Which `Host` values name this daemon.
#[derive(Debug, Clone)]
pub struct Hosts {
    port: u16,
    /// `public_names` without a port: any port.
    names: Vec<String>,
    /// `public_names` with a port: exactly.
    exact: Vec<String>,
}

impl Hosts {
    pub fn new(listener: SocketAddr, public_names: &[String]) -> Hosts {
        let (exact, names) = public_names.iter().cloned().partition(|n: &String| {
            // "[v6]:port" or "name:port"; a bracketed literal alone has no port.
            n.rsplit_once(':')
                .is_some_and(|(h, _)| !h.is_empty() && (!h.starts_with('[') || h.ends_with(']')))
        });
        Hosts {
            port: listener.port(),
            names,
            exact,
        }
    }

    /// Whether a `Host` header value names this daemon: an IP literal or
    /// `localhost` with the listener's port (literals cannot be rebound), or
    /// a configured public name.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        if self.exact.contains(&host) {
            return true;
        }
        let (name, port) = match host.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((v6, "")) => (v6.to_string(), None),
                Some((v6, p)) => match p.strip_prefix(':') {
                    Some(p) => (v6.to_string(), Some(p)),
                    None => return false,
                },
                None => return false,
            },
            None => match host.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (host.clone(), None),
            },
        };
        let port_ok = match port {
            None => self.port == 80,
            Some(p) => p.parse::<u16>().is_ok_and(|p| p == self.port),
        };
        if self.names.contains(&name)
            && (port.is_none() || port.is_some_and(|p| p.parse::<u16>().is_ok()))
        {
            return true;
        }
        port_ok && (name == "localhost" || name.parse::<IpAddr>().is_ok())
    }

    pub fn check(&self, head: &Head) -> Result<(), Problem> {
        // [`super::wire::parse_head`] already refused a request without
        // exactly one non-empty Host, HTTP/1.0 included.
        match head.header("host") {
            Some(h) if self.allows(h) => Ok(()),
            _ => Err(Problem::new(
                Code::HostNotAllowed,
                "the Host header names neither this listener nor a configured public name",
            )),
        }
    }
}

/// Headers every answer to an allowed cross-origin request carries.
pub fn cors_headers(origin: &str) -> Vec<(&'static str, String)> {
    vec![
        ("Access-Control-Allow-Origin", origin.to_string()),
        (
            "Access-Control-Expose-Headers",
            "ETag, Location, Retry-After".into(),
        ),
    ]
}

/// The request headers a preflight may ask for.
pub const ALLOWED_REQUEST_HEADERS: &str =
    "Authorization, Content-Type, If-Match, If-None-Match, Accept";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::parse_head;

    #[test]
    fn bearer_is_checked() {
        let t = Token::from_secret("abc123abc123abc123abc123abc123abc123");
        assert!(t.verify(Some("Bearer abc123abc123abc123abc123abc123abc123")));
        assert!(t.verify(Some("bearer abc123abc123abc123abc123abc123abc123")));
        for bad in [
            "Bearer abc",
            "Basic abc123abc123abc123abc123abc123abc123",
            "abc123abc123abc123abc123abc123abc123",
            "",
        ] {
            assert!(!t.verify(Some(bad)), "{bad}");
        }
        assert!(!t.verify(None));
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn token_file_is_created_private_and_refused_when_shared() {
        let dir = crate::testutil::TempDir::new("tok");
        let p = dir.path().join("http.token");
        let t = Token::load_or_create(&p).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.trim().len(), 64);
        assert!(t.verify(Some(&format!("Bearer {}", text.trim()))));
        assert!(
            Token::load_or_create(&p)
                .unwrap()
                .verify(Some(&format!("Bearer {}", text.trim())))
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            Token::load_or_create(&p)
                .unwrap_err()
                .contains("readable by others")
        );
    }

    fn head(extra: &str) -> Head {
        parse_head(format!("GET /server HTTP/1.1\r\n{extra}").as_bytes()).unwrap()
    }

    #[test]
    fn origins_are_exact() {
        let allowed = vec!["https://app.example".to_string()];
        assert_eq!(check_origin(&head("Host: a"), &allowed).unwrap(), None);
        assert_eq!(
            check_origin(&head("Host: a\r\nOrigin: https://app.example"), &allowed).unwrap(),
            Some("https://app.example")
        );
        for o in [
            "https://app.example.evil",
            "http://app.example",
            "null",
            "https://APP.example",
        ] {
            assert_eq!(
                check_origin(&head(&format!("Host: a\r\nOrigin: {o}")), &allowed)
                    .unwrap_err()
                    .status(),
                403,
                "{o}"
            );
        }
    }

    #[test]
    fn hosts_are_the_listener_or_public_names() {
        let h = Hosts::new(
            "127.0.0.1:7777".parse().unwrap(),
            &["box.lan".into(), "proxy.example:443".into()],
        );
        for ok in [
            "127.0.0.1:7777",
            "localhost:7777",
            "LOCALHOST:7777",
            "[::1]:7777",
            "box.lan",
            "box.lan:9",
            "proxy.example:443",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example:7777",
            "127.0.0.1:7778",
            "127.0.0.1",
            "proxy.example",
            "proxy.example:444",
            "[::1",
            "[::1]x",
            "localhost:x",
        ] {
            assert!(!h.allows(bad), "{bad}");
        }
    }
}
