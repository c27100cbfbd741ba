//! `omniconfluxd pair` and `omniconfluxd clients` (issue 12; seed 004,
//! "Pairing a new device"): the operator's side of pairing a device with
//! the gateway, and the paired devices. Both speak to the node socket when
//! a node answers there (its gateway, `[gateway] listen`), else to the
//! standalone gateway's socket beside it; both sockets take the operator
//! as an admin caller.
//!
//! `pair` starts a pairing (`clients.pairStart`), prints the URI
//! `argus://pair?url=<url>&token=<token>[&e2e=true]` (the seed's literal
//! scheme, so that its app reads it) and the same URI as a QR code, then
//! waits (`clients.pairAwait`, at most 60 s) and says whether the device
//! connected; status 1 when none did. `url` is `--url`, else the gateway's
//! `[gateway] public_url`; with neither, the URI carries an empty url and
//! a warning says the device will not know where to connect.

use serde_json::json;

use super::Failure;
use super::args::s;
use super::client::Client;

pub const USAGE: &str = "\
  pair [--url URL] [--e2e]    pair a device with the gateway: print a URI and
                              its QR code, wait up to 60 s for the device
  clients [list|remove ID]    the paired devices, by token id (SHA-256)";

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
fn query_value(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The pairing URI of seed 004.
pub fn pair_uri(url: &str, token: &str, e2e: bool) -> String {
    format!(
        "argus://pair?url={}&token={token}{}",
        query_value(url),
        if e2e { "&e2e=true" } else { "" }
    )
}

/// The QR code of `text` for a terminal: two rows of modules a line.
fn qr(text: &str) -> Option<String> {
    use qrcode::render::unicode::Dense1x2;
    let code = qrcode::QrCode::new(text.as_bytes()).ok()?;
    Some(code.render::<Dense1x2>().quiet_zone(true).build())
}

pub fn pair(
    c: impl FnOnce() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    let mut url = None;
    let mut e2e = false;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--url" => {
                url = Some(
                    it.next()
                        .ok_or_else(|| Failure::usage("--url needs a ws:// or wss:// URL"))?
                        .clone(),
                )
            }
            "--e2e" => e2e = true,
            other => return Err(Failure::usage(format!("unexpected argument {other}"))),
        }
    }
    let mut client = c()?;
    let started = client.call("clients.pairStart", json!({}))?;
    let token = s(&started["token"]);
    let url = url.unwrap_or_else(|| s(&started["url"]));
    let uri = pair_uri(&url, &token, e2e);
    if json_out {
        outln!("{}", json!({"uri": uri, "url": url}))?;
    } else {
        if url.is_empty() {
            eprintln!(
                "omniconfluxd: the gateway has no public URL ([gateway] public_url); \
                 give one with --url, or the device will not know where to connect"
            );
        }
        outln!("{uri}")?;
        if let Some(code) = qr(&uri) {
            outln!("{code}")?;
        }
        outln!("waiting up to 60 s for the device to connect...")?;
    }
    let r = client.call("clients.pairAwait", json!({"token": token}))?;
    let connected = r["connected"] == json!(true);
    if json_out {
        outln!("{}", json!({"connected": connected}))?;
    } else if connected {
        outln!("paired: the device connected")?;
    }
    if connected {
        Ok(())
    } else {
        Err(Failure {
            status: super::EXIT_ERROR,
            message: "no device connected within 60 s; run pair again".into(),
        })
    }
}

pub fn clients(
    c: impl FnOnce() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    match rest.first().map(String::as_str).unwrap_or("list") {
        "list" => {
            super::args::done(rest, 1)?;
            let list = c()?.call("clients.list", json!({}))?;
            if json_out {
                return outln!("{list}");
            }
            let items = list.as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                return outln!("no paired devices");
            }
            for d in &items {
                outln!("{}  paired {}", s(&d["token"]), s(&d["created_at"]))?;
            }
            Ok(())
        }
        "remove" => {
            let id = rest
                .get(1)
                .ok_or_else(|| Failure::usage("clients remove needs a token ID"))?;
            super::args::done(rest, 2)?;
            c()?.call("clients.remove", json!({"token": id}))?;
            outln!(
                "{}",
                if json_out {
                    "null".into()
                } else {
                    format!("removed {id}")
                }
            )
        }
        other => Err(Failure::usage(format!(
            "unknown clients command {other}; expected list or remove"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uri_is_the_seeds() {
        assert_eq!(
            pair_uri("wss://gw.example/base", "ab", true),
            "argus://pair?url=wss%3A%2F%2Fgw.example%2Fbase&token=ab&e2e=true"
        );
        assert!(qr("argus://pair?url=&token=00").is_some());
    }
}
