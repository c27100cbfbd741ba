//! The trust log as the gateway carries it (seed 004, Locked mode,
//! "Distribution", and the `trustlog.*` methods; issue 14): entries held in
//! memory, deduplicated by hash and never verified, the `trustlog.sync`
//! answer (from [`crate::trustlog::sync`]) and `trustlog.push`. Owned by
//! the gateway thread ([`super::state`]); pure: params in, values out.
//!
//! Why unverified: "It does not verify signatures, but it cannot forge or
//! reorder entries, because every entry is signed and linked by hash". An
//! entry must still decode (the seed's encoding and decoder limits), so
//! the gateway never hands on bytes no client could read.
//!
//! Wire form of `bytes`: standard base64 with padding, as every byte
//! string of the protocol (relay bodies, keys); `known` and `want` items are
//! 32-byte hashes. Empty lists and a false `disjoint` are left out of the
//! answer, as the seed's `?` fields allow.
//!
//! Bounds (where the seed is silent): at most `GATEWAY_TRUSTLOG_ENTRIES`
//! entries and `GATEWAY_TRUSTLOG_BYTES` bytes of wire form are held, so
//! that a `trustlog.sync` answer to a caller that knows nothing fits in one
//! 16 MiB line. A push that would pass either is refused whole (nothing of
//! it is kept) with `-32600` code `trustlog-full`: only nodes push, with
//! the master token, so a full gateway is an operator's matter, and
//! dropping old entries could lose a chain's genesis. A push that holds an
//! entry that does not decode is refused whole as well (`invalid params:
//! entry N: ...`). Nothing is kept across a restart: nodes push again when
//! `trustlog.sync` answers them `want`.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::HashSet;

use super::wire::GwError;
use crate::e2ee::base64;
use crate::limits;
use crate::trustlog::sync::{self, SyncRequest};
use crate::trustlog::{Entry, Hash};

/// The entries the gateway holds, in the order received.
#[derive(Default)]
pub struct Held {
    entries: Vec<Entry>,
    hashes: HashSet<Hash>,
    bytes: usize,
}

impl Held {
    /// `trustlog.sync {known?, truncated?}` → `{entries?, want?, disjoint?}`.
    pub fn sync(&self, params: Value) -> Result<Value, GwError> {
        #[derive(Deserialize)]
        struct P {
            #[serde(default)]
            known: Option<Vec<String>>,
            #[serde(default)]
            truncated: Option<bool>,
        }
        let p: P = from_params(params)?;
        let known = p.known.unwrap_or_default();
        if known.len() > limits::TRUSTLOG_SYNC_KNOWN_MAX {
            // Checked before decoding a single hash.
            let e = sync::SyncError::KnownTooLong { len: known.len() };
            return Err(GwError::refused(e.code(), e.to_string()));
        }
        let known = known
            .iter()
            .enumerate()
            .map(|(i, k)| {
                base64::decode(k)
                    .and_then(|b| Hash::from_slice(&b))
                    .ok_or_else(|| {
                        GwError::invalid_params(format!(
                            "known[{i}] is not the base64 of a 32-byte hash"
                        ))
                    })
            })
            .collect::<Result<Vec<Hash>, GwError>>()?;
        let req = SyncRequest {
            known,
            truncated: p.truncated.unwrap_or(false),
        };
        let a = sync::answer(&self.entries, &req)
            .map_err(|e| GwError::refused(e.code(), e.to_string()))?;
        let mut out = Map::new();
        if !a.entries.is_empty() {
            let list = a
                .entries
                .iter()
                .map(|e| Value::String(base64::encode(e.wire())))
                .collect();
            out.insert("entries".into(), Value::Array(list));
        }
        if !a.want.is_empty() {
            let list = a.want.iter().map(|h| json!(base64::encode(&h.0))).collect();
            out.insert("want".into(), Value::Array(list));
        }
        if a.disjoint {
            out.insert("disjoint".into(), Value::Bool(true));
        }
        Ok(Value::Object(out))
    }

    /// `trustlog.push {entries?}`: keeps the entries not held yet; how
    /// many those were.
    pub fn push(&mut self, params: Value) -> Result<usize, GwError> {
        #[derive(Deserialize)]
        struct P {
            #[serde(default)]
            entries: Option<Vec<String>>,
        }
        let p: P = from_params(params)?;
        let mut new = Vec::new();
        let mut seen = HashSet::new();
        let mut bytes = 0;
        for (i, text) in p.entries.unwrap_or_default().iter().enumerate() {
            let wire = base64::decode(text).ok_or_else(|| {
                GwError::invalid_params(format!("entry {i} is not standard base64"))
            })?;
            let e = Entry::decode(&wire)
                .map_err(|e| GwError::invalid_params(format!("entry {i}: {e}")))?;
            if self.hashes.contains(&e.hash()) || !seen.insert(e.hash()) {
                continue;
            }
            bytes += e.wire().len();
            new.push(e);
        }
        if self.entries.len() + new.len() > limits::GATEWAY_TRUSTLOG_ENTRIES
            || self.bytes + bytes > limits::GATEWAY_TRUSTLOG_BYTES
        {
            return Err(GwError::refused(
                "trustlog-full",
                format!(
                    "the gateway holds {} trust-log entries ({} bytes) and {} more ({bytes} bytes) would pass its limit of {} entries or {} bytes",
                    self.entries.len(),
                    self.bytes,
                    new.len(),
                    limits::GATEWAY_TRUSTLOG_ENTRIES,
                    limits::GATEWAY_TRUSTLOG_BYTES
                ),
            ));
        }
        let added = new.len();
        for e in new {
            self.hashes.insert(e.hash());
            self.entries.push(e);
        }
        self.bytes += bytes;
        Ok(added)
    }

    /// The heads of what is held, for `trustlog.changed {heads}`.
    pub fn heads(&self) -> Vec<Value> {
        sync::heads(&self.entries)
            .iter()
            .map(|h| json!(base64::encode(&h.0)))
            .collect()
    }
}

/// Params that must be an object or absent.
fn from_params<T: for<'de> Deserialize<'de>>(params: Value) -> Result<T, GwError> {
    let params = if params.is_null() { json!({}) } else { params };
    serde_json::from_value(params).map_err(GwError::invalid_params)
}
