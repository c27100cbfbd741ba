//! The command line's `lock` command (issue 14): one subcommand per
//! `lock.*` method of the daemon socket (src/socket/methods/lock.rs).
//! Keys, hashes and secrets are printed in their text forms (`sigpub:`,
//! `devpub:`, `gen:`, `dis:`, `tip:` and 64 hex digits) and taken in them
//! or in base64; `--json` prints the method's result unchanged.

use serde_json::{Value, json};

use super::Failure;
use super::args::{arg, done, s, usage};
use super::client::Client;
use crate::e2ee::base64;
use crate::trustlog::KeyText;

/// The lines `omniconfluxd help` shows for this command.
pub const USAGE: &str = "\
  lock [status|log]           locked mode: the trust log this node holds
  lock init [--signer KEY]... [--device KEY]... [--disablements N]
                              start a trust log signed by this node
  lock sign|revoke DEVICE     authorize a device key, or revoke it
  lock add-signer|remove-signer SIGNER
                              trust another signer key, or stop trusting one
  lock disable SECRET         turn locked mode off for good with a dis: secret
  lock pin GENESIS | lock unpin | lock local-disable
                              pin a log, unpin, accept any device on this node
  lock revoke-signer-start SIGNER... [--replace KEY]... [--fork-from TIP]
  lock revoke-signer-cosign BLOB | lock revoke-signer-finish BLOB
                              revoke a lost signer key with the others' co-signs";

/// A 32-byte value of a result in its text form; `-` when absent.
fn text(form: KeyText, v: &Value) -> String {
    v.as_str()
        .and_then(base64::decode)
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .map_or_else(|| s(v), |b| form.format(&b))
}

fn print_result(
    json_out: bool,
    r: &Value,
    f: impl FnOnce(&Value) -> Result<(), Failure>,
) -> Result<(), Failure> {
    if json_out { outln!("{r}") } else { f(r) }
}

/// `tip T (changed|unchanged)`.
fn changed(r: &Value) -> Result<(), Failure> {
    let what = if r["changed"] == json!(true) {
        "changed"
    } else {
        "already so; nothing written"
    };
    outln!("{} ({what})", text(KeyText::Tip, &r["tip"]))
}

pub fn lock(
    mut c: impl FnMut() -> Result<Client, Failure>,
    json_out: bool,
    rest: &[String],
) -> Result<(), Failure> {
    let sub = rest.first().map(String::as_str).unwrap_or("status");
    let one = |name: &str, what: &str| -> Result<Value, Failure> {
        done(rest, 2)?;
        Ok(json!({name: arg(rest, 1, what)?}))
    };
    match sub {
        "status" => {
            done(rest, 1)?;
            let r = c()?.call("lock.status", json!({}))?;
            print_result(json_out, &r, print_status)
        }
        "log" => {
            done(rest, 1)?;
            let r = c()?.call("lock.log", json!({}))?;
            print_result(json_out, &r, print_log)
        }
        "init" => {
            let p = init_params(&rest[1..])?;
            let r = c()?.call("lock.init", p)?;
            print_result(json_out, &r, |r| {
                outln!(
                    "{}  {} signers",
                    text(KeyText::Tip, &r["tip"]),
                    s(&r["signer_count"])
                )?;
                let secrets = r["disablement_secrets"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if !secrets.is_empty() {
                    outln!("disablement secrets (shown this once; keep them offline):")?;
                    for d in &secrets {
                        outln!("  {}", text(KeyText::Disablement, d))?;
                    }
                }
                Ok(())
            })
        }
        "sign" | "revoke" => {
            let p = one("device", "device key")?;
            let r = c()?.call(&format!("lock.{sub}"), p)?;
            print_result(json_out, &r, changed)
        }
        "add-signer" | "remove-signer" => {
            let p = one("signer", "signer key")?;
            let m = if sub == "add-signer" {
                "lock.addSigner"
            } else {
                "lock.removeSigner"
            };
            let r = c()?.call(m, p)?;
            print_result(json_out, &r, changed)
        }
        "disable" => {
            let p = one("secret", "disablement secret")?;
            let r = c()?.call("lock.disable", p)?;
            print_result(json_out, &r, |r| {
                outln!(
                    "{} (the trust log is disabled)",
                    text(KeyText::Tip, &r["tip"])
                )
            })
        }
        "pin" => {
            let p = one("genesis", "genesis hash")?;
            let r = c()?.call("lock.pin", p)?;
            print_result(json_out, &r, |_| outln!("pinned"))
        }
        "unpin" | "local-disable" => {
            done(rest, 1)?;
            let m = if sub == "unpin" {
                "lock.unpin"
            } else {
                "lock.localDisable"
            };
            let r = c()?.call(m, json!({}))?;
            print_result(json_out, &r, |_| {
                outln!(
                    "{}",
                    if sub == "unpin" {
                        "unpinned"
                    } else {
                        "locked mode is off on this node"
                    }
                )
            })
        }
        "revoke-signer-start" => {
            let p = start_params(&rest[1..])?;
            let r = c()?.call("lock.revokeSignerStart", p)?;
            print_result(json_out, &r, |r| outln!("{}", s(&r["blob"])))
        }
        "revoke-signer-cosign" => {
            let p = one("blob", "blob")?;
            let r = c()?.call("lock.revokeSignerCosign", p)?;
            print_result(json_out, &r, |r| outln!("{}", s(&r["blob"])))
        }
        "revoke-signer-finish" => {
            let p = one("blob", "blob")?;
            let r = c()?.call("lock.revokeSignerFinish", p)?;
            print_result(json_out, &r, |r| {
                outln!("{}", text(KeyText::Tip, &r["tip"]))
            })
        }
        other => Err(usage(&format!("unknown lock command {other}"))),
    }
}

fn init_params(args: &[String]) -> Result<Value, Failure> {
    let (mut signers, mut devices, mut n) = (Vec::new(), Vec::new(), None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| usage(&format!("{a} needs {what}")))
        };
        match a.as_str() {
            "--signer" => signers.push(value("a signer key")?),
            "--device" => devices.push(value("a device key")?),
            "--disablements" => {
                let v = value("a number")?;
                n = Some(
                    v.parse::<u32>()
                        .map_err(|_| usage(&format!("--disablements needs a number, not {v}")))?,
                );
            }
            other => return Err(usage(&format!("unexpected argument {other}"))),
        }
    }
    let mut p = json!({});
    if !signers.is_empty() {
        p["signers"] = json!(signers);
    }
    if !devices.is_empty() {
        p["devices"] = json!(devices);
    }
    if let Some(n) = n {
        p["gen_disablements"] = json!(n);
    }
    Ok(p)
}

fn start_params(args: &[String]) -> Result<Value, Failure> {
    let (mut revoked, mut replaces, mut fork) = (Vec::new(), Vec::new(), None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--replace" => replaces.push(
                it.next()
                    .cloned()
                    .ok_or_else(|| usage("--replace needs a signer key"))?,
            ),
            "--fork-from" => {
                fork = Some(
                    it.next()
                        .cloned()
                        .ok_or_else(|| usage("--fork-from needs a tip"))?,
                )
            }
            k if k.starts_with("--") => return Err(usage(&format!("unexpected argument {k}"))),
            k => revoked.push(k.to_string()),
        }
    }
    if revoked.is_empty() {
        return Err(usage("missing signer key to revoke"));
    }
    let mut p = json!({"revoked": revoked});
    if !replaces.is_empty() {
        p["replaces"] = json!(replaces);
    }
    if let Some(f) = fork {
        p["fork_from"] = json!(f);
    }
    Ok(p)
}

fn print_status(r: &Value) -> Result<(), Failure> {
    let row = |k: &str, v: String| outln!("{k:<14}{v}");
    let flag = |k: &str| r[k] == json!(true);
    let mode = if !flag("enabled") {
        "off (no trust log, no pin)"
    } else if flag("disabled") {
        "off: the trust log is disabled"
    } else if flag("local_disabled") {
        "off on this node (lock local-disable)"
    } else if flag("quarantined") {
        "quarantined: every channel is refused"
    } else {
        "on"
    };
    row("locked mode", mode.into())?;
    let trusted = if flag("signer_trusted") {
        "trusted"
    } else {
        "not a signer of the log"
    };
    row(
        "signer",
        format!(
            "{} ({trusted})",
            text(KeyText::SignerPub, &r["signer_pubkey"])
        ),
    )?;
    let authorized = if flag("authorized") {
        "authorized"
    } else {
        "not authorized"
    };
    row(
        "identity",
        format!("{} ({authorized})", s(&r["identity_pubkey"])),
    )?;
    if r.get("tip").is_some() {
        row(
            "tip",
            format!(
                "{}  ({} entries)",
                text(KeyText::Tip, &r["tip"]),
                s(&r["length"])
            ),
        )?;
        for k in r["signers"].as_array().into_iter().flatten() {
            row("signers", text(KeyText::SignerPub, k))?;
        }
        row("devices", s(&r["device_count"]))?;
        for k in r["devices"].as_array().into_iter().flatten() {
            outln!("  {}", text(KeyText::DevicePub, k))?;
        }
    }
    match r.get("pin_genesis") {
        Some(g) => row("pin", text(KeyText::Genesis, g))?,
        None => row("pin", "none".into())?,
    }
    if let Some(g) = r.get("seen_genesis") {
        row("seen", text(KeyText::Genesis, g))?;
    }
    Ok(())
}

fn print_log(r: &Value) -> Result<(), Failure> {
    let entries = r["entries"].as_array().cloned().unwrap_or_default();
    if entries.is_empty() {
        return outln!("no trust log");
    }
    for e in &entries {
        let detail = match e["kind"].as_str() {
            Some("genesis") => format!("{} signers", e["signers"].as_array().map_or(0, Vec::len)),
            Some("authorize-device" | "revoke-device") => text(KeyText::DevicePub, &e["target"]),
            Some("add-signer" | "remove-signer") => text(KeyText::SignerPub, &e["target"]),
            Some("revoke-signer") => format!(
                "{} revoked, {} co-signs",
                e["revoked"].as_array().map_or(0, Vec::len),
                s(&e["cosign_count"])
            ),
            _ => String::new(),
        };
        outln!("{:>5}  {:<17} {detail}", s(&e["index"]), s(&e["kind"]))?;
    }
    Ok(())
}
