//! The daemon socket's locked-mode methods (seed 004, "Locked mode
//! control"; issue 14). Served on the unix socket only ("On any other
//! path, the node returns -32601") and to the operator only: whoever
//! signs the log decides which devices reach every session of the node.
//!
//! | method                 | params                               | result                                   |
//! |------------------------|--------------------------------------|------------------------------------------|
//! | lock.init              | {signers?, devices?, gen_disablements?} | {tip, signer_count, disablement_secrets?} |
//! | lock.sign, lock.revoke | {device}                             | {tip, changed}                           |
//! | lock.addSigner, lock.removeSigner | {signer}                  | {tip, changed}                           |
//! | lock.disable           | {secret}                             | {tip, disabled}                          |
//! | lock.pin               | {genesis}                            | null                                     |
//! | lock.unpin, lock.localDisable | none                          | null                                     |
//! | lock.status            | none                                 | LockStatusResult                         |
//! | lock.log               | none                                 | {entries, tip?, signers?}                |
//! | lock.revokeSignerStart | {revoked, replaces?, fork_from?}     | {blob}                                   |
//! | lock.revokeSignerCosign| {blob}                               | {blob}                                   |
//! | lock.revokeSignerFinish| {blob}                               | {tip}                                    |
//!
//! Bytes are standard base64 in JSON (seed 004, Method reference). A key,
//! hash or secret may also be given in its text form (`sigpub:`,
//! `devpub:`, `gen:`, `dis:`, `tip:` and 64 hex digits), which is what
//! the command line prints; a text form with the wrong prefix is refused,
//! so a device key is never taken for a signer's.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{NoParams, params, require_operator};
use crate::daemon::{Daemon, Req};
use crate::e2ee::base64;
use crate::errors::{Code, RpcError};
use crate::lock::{Answer, Error, Lock, Op};
use crate::trustlog::{Entry, Hash, KeyText, Kind};

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let op = match decode(&req, method, p) {
        Ok(op) => op,
        Err(e) => return d.answer(req, Err(e)),
    };
    let to = req.clone();
    let then: crate::daemon::router::lock::Then = Box::new(move |d: &mut Daemon, r| {
        let v = r.map(|a| view(&d.lock.lock, a)).map_err(error);
        d.answer(to, v);
    });
    if let Err(e) = crate::daemon::router::lock::submit(d, op, then) {
        d.answer(req, Err(e));
    }
}

fn decode(req: &Req, method: &str, p: Map<String, Value>) -> Result<Op, RpcError> {
    if req.conn().is_none() {
        return Err(RpcError::new(
            Code::MethodNotFound,
            format!("{method} is served on the daemon's unix socket only"),
        ));
    }
    let op = match method {
        "lock.init" => {
            let InitParams {
                signers,
                devices,
                gen_disablements,
            } = params(p)?;
            Op::Init {
                signers: signers
                    .map(|s| keys(&s, KeyText::SignerPub, "signers"))
                    .transpose()?,
                devices: keys(&devices.unwrap_or_default(), KeyText::DevicePub, "devices")?,
                disablements: gen_disablements.unwrap_or(0),
            }
        }
        "lock.sign" | "lock.revoke" => {
            let DeviceParams { device } = params(p)?;
            let kind = if method == "lock.sign" {
                Kind::AuthorizeDevice
            } else {
                Kind::RevokeDevice
            };
            Op::Entry(kind, bytes(&device, KeyText::DevicePub, "device")?)
        }
        "lock.addSigner" | "lock.removeSigner" => {
            let SignerParams { signer } = params(p)?;
            let kind = if method == "lock.addSigner" {
                Kind::AddSigner
            } else {
                Kind::RemoveSigner
            };
            Op::Entry(kind, bytes(&signer, KeyText::SignerPub, "signer")?)
        }
        "lock.disable" => {
            let SecretParams { secret } = params(p)?;
            Op::Disable(bytes(&secret, KeyText::Disablement, "secret")?)
        }
        "lock.pin" => {
            let PinParams { genesis } = params(p)?;
            Op::Pin(hash(&genesis, KeyText::Genesis, "genesis")?)
        }
        "lock.unpin" | "lock.localDisable" | "lock.status" | "lock.log" => {
            let NoParams {} = params(p)?;
            match method {
                "lock.unpin" => Op::Unpin,
                "lock.localDisable" => Op::LocalDisable,
                "lock.status" => Op::Status,
                _ => Op::Log,
            }
        }
        "lock.revokeSignerStart" => {
            let StartParams {
                revoked,
                replaces,
                fork_from,
            } = params(p)?;
            Op::RevokeStart {
                revoked: keys(&revoked, KeyText::SignerPub, "revoked")?,
                replaces: keys(
                    &replaces.unwrap_or_default(),
                    KeyText::SignerPub,
                    "replaces",
                )?,
                fork_from: fork_from
                    .map(|f| hash(&f, KeyText::Tip, "fork_from"))
                    .transpose()?,
            }
        }
        "lock.revokeSignerCosign" | "lock.revokeSignerFinish" => {
            let BlobParams { blob } = params(p)?;
            let blob = base64::decode(&blob)
                .ok_or_else(|| RpcError::invalid_params("blob must be standard base64"))?;
            if method == "lock.revokeSignerCosign" {
                Op::RevokeCosign(blob)
            } else {
                Op::RevokeFinish(blob)
            }
        }
        other => {
            return Err(RpcError::new(
                Code::MethodNotFound,
                format!("unknown method {other}"),
            ));
        }
    };
    require_operator(req)?;
    Ok(op)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InitParams {
    signers: Option<Vec<String>>,
    devices: Option<Vec<String>>,
    gen_disablements: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceParams {
    device: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignerParams {
    signer: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretParams {
    secret: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PinParams {
    genesis: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartParams {
    revoked: Vec<String>,
    replaces: Option<Vec<String>>,
    fork_from: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlobParams {
    blob: String,
}

/// Bytes from base64, or from the text form `form` when the text has a
/// prefix (a `:`; base64 has none).
fn bytes(text: &str, form: KeyText, what: &str) -> Result<Vec<u8>, RpcError> {
    if text.contains(':') {
        return form
            .parse(text)
            .map(|b| b.to_vec())
            .map_err(|e| RpcError::invalid_params(format!("{what}: {e}")));
    }
    base64::decode(text).ok_or_else(|| {
        RpcError::invalid_params(format!(
            "{what} must be standard base64 or {}<64 hex digits>",
            form.prefix()
        ))
    })
}

fn keys(list: &[String], form: KeyText, what: &str) -> Result<Vec<Vec<u8>>, RpcError> {
    if list.len() > crate::limits::LOCK_MAX_KEYS {
        return Err(RpcError::invalid_params(format!(
            "{what} must hold at most {} keys",
            crate::limits::LOCK_MAX_KEYS
        )));
    }
    list.iter().map(|k| bytes(k, form, what)).collect()
}

fn hash(text: &str, form: KeyText, what: &str) -> Result<Hash, RpcError> {
    let b = bytes(text, form, what)?;
    Hash::from_slice(&b)
        .ok_or_else(|| RpcError::invalid_params(format!("{what} is {} bytes, not 32", b.len())))
}

fn error(e: Error) -> RpcError {
    let code = match &e {
        Error::NoLog => Code::LockNoLog,
        Error::Exists => Code::LockExists,
        Error::NoSigner(_) => Code::LockNoSignerKey,
        Error::Invalid(_) => Code::InvalidParams,
        Error::Refused(_) => Code::LockRefused,
        Error::Unavailable(_) => Code::Unavailable,
        Error::Ledger(w) => return RpcError::from(w.clone()),
    };
    RpcError::new(code, e.to_string())
}

fn b64(h: &[u8]) -> Value {
    Value::String(base64::encode(h))
}

fn view(l: &Lock, a: Answer) -> Value {
    match a {
        Answer::Init {
            tip,
            signer_count,
            secrets,
        } => {
            let mut v = json!({"tip": b64(&tip.0), "signer_count": signer_count});
            if !secrets.is_empty() {
                v["disablement_secrets"] = secrets.iter().map(|s| b64(s)).collect();
            }
            v
        }
        Answer::Changed { tip, changed } => json!({"tip": b64(&tip.0), "changed": changed}),
        Answer::Disabled { tip } => json!({"tip": b64(&tip.0), "disabled": true}),
        Answer::Done => Value::Null,
        Answer::Blob(b) => json!({"blob": b64(&b)}),
        Answer::Tip(tip) => json!({"tip": b64(&tip.0)}),
        Answer::Status => status(l),
        Answer::Log => log(l),
    }
}

/// LockStatusResult (seed 004).
fn status(l: &Lock) -> Value {
    let mut v = json!({
        "enabled": l.locked(),
        "device_count": 0,
        "signer_trusted": l.signer_trusted(),
        "authorized": l.authorized(),
        "disabled": l.chain().is_some_and(|c| c.state().disabled()),
        "local_disabled": l.local_disabled(),
        "pinned": l.pin().is_some(),
        "quarantined": l.quarantined(),
    });
    if let Some(c) = l.chain() {
        let s = c.state();
        v["tip"] = b64(&s.tip().0);
        v["signers"] = s.signers().map(b64).collect();
        v["devices"] = s.devices().map(b64).collect();
        v["device_count"] = json!(s.devices().count());
        v["length"] = json!(s.len());
    }
    if let Some(k) = l.signer_pubkey() {
        v["signer_pubkey"] = b64(&k);
    }
    if let Some(k) = l.identity_pubkey() {
        v["identity_pubkey"] = b64(&k);
    }
    if let Some(g) = l.pin() {
        v["pin_genesis"] = b64(&g.0);
        v["pin_source"] = json!("file");
    }
    if let Some(g) = l.seen_genesis() {
        v["seen_genesis"] = b64(&g.0);
    }
    v
}

/// `lock.log`: every entry of the log held, genesis first.
fn log(l: &Lock) -> Value {
    let Some(c) = l.chain() else {
        return json!({"entries": []});
    };
    let entries: Vec<Value> = c
        .entries()
        .iter()
        .enumerate()
        .map(|(i, e)| log_entry(i, e))
        .collect();
    json!({
        "entries": entries,
        "tip": b64(&c.state().tip().0),
        "signers": c.state().signers().map(b64).collect::<Vec<_>>(),
    })
}

/// LockLogEntry (seed 004).
fn log_entry(index: usize, e: &Entry) -> Value {
    let mut v = json!({"index": index, "kind": e.kind().name(), "hash": b64(&e.hash().0)});
    let list = |l: &[Vec<u8>]| l.iter().map(|k| b64(k)).collect::<Vec<_>>();
    match e.kind() {
        Kind::Genesis => v["signers"] = json!(list(e.signers())),
        Kind::RevokeSigner => {
            v["revoked"] = json!(list(e.signers()));
            v["replaces"] = json!(list(e.replaces()));
            v["cosign_count"] = json!(e.cosigns().len());
        }
        Kind::Disable => {}
        _ => v["target"] = b64(e.key()),
    }
    v
}
