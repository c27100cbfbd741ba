//! The trust log's verification figure (issue 14, Figures): verifying a
//! 10,000-entry chain from its file form (decode, BLAKE2s-256 of every
//! entry, every chain rule, strict Ed25519 of every signature) against a
//! bare loop of the same 10,000 `ed25519-dalek` strict verifications over
//! the same signed bytes, keys parsed beforehand. Both run in this process
//! on core 0, alternating round by round. The chain is a genesis of two
//! signers and 9,999 authorize-device entries signed by them in turn, so
//! the state grows to 9,999 devices as a large deployment's would.
//!
//! Extra members: the same chain assembled from its entries in shuffled
//! order (what a node does after `trustlog.sync`), and the gateway's
//! `trustlog.sync` answer to a caller that knows nothing (time, and the
//! bytes of the entries it carries before base64).

use ed25519_dalek::{Signature, SigningKey, VerifyingKey};
use serde_json::json;
use std::time::Instant;

use omniconfluxd::trustlog::sync::{self, SyncRequest};
use omniconfluxd::trustlog::{Chain, Content, Entry, Kind, assemble, decode_chain, encode_chain};

use crate::util::{self, Figure};

pub const FIGURE: &str = "trustlog_verify_vs_dalek";
const ENTRIES: usize = 10_000;

pub fn run() {
    if !util::selected(FIGURE) {
        return;
    }
    util::on_cpu(0, measure);
}

/// The 10,000-entry chain (the module comment); also what the gateway's
/// `trustlog.sync` figure pushes (gateway_bench.rs).
pub fn build() -> Vec<Entry> {
    let keys = [
        SigningKey::from_bytes(&[1; 32]),
        SigningKey::from_bytes(&[2; 32]),
    ];
    let pubs: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| k.verifying_key().to_bytes().to_vec())
        .collect();
    let genesis = Content {
        kind: Kind::Genesis,
        prev: vec![],
        signers: pubs,
        disablements: vec![vec![0; 32]],
        key: vec![],
        signer: vec![],
        replaces: vec![],
    };
    let mut entries = vec![genesis.sign(&keys[0]).expect("genesis encodes")];
    for i in 1..ENTRIES {
        let mut device = [0u8; 32];
        device[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let c = Content {
            kind: Kind::AuthorizeDevice,
            prev: entries[i - 1].hash().0.to_vec(),
            signers: vec![],
            disablements: vec![],
            key: device.to_vec(),
            signer: vec![],
            replaces: vec![],
        };
        entries.push(c.sign(&keys[i % 2]).expect("entry encodes"));
    }
    entries
}

fn measure() {
    let t0 = Instant::now();
    let entries = build();
    let bytes = encode_chain(&entries);
    // The baseline's inputs: the same signed bytes, signatures and keys.
    let triples: Vec<(VerifyingKey, Vec<u8>, Signature)> = entries
        .iter()
        .map(|e| {
            let key: [u8; 32] = e.signer().try_into().expect("32-byte signer");
            let sig: [u8; 64] = e.sig().try_into().expect("64-byte signature");
            (
                VerifyingKey::from_bytes(&key).expect("valid key"),
                e.signed_bytes().to_vec(),
                Signature::from_bytes(&sig),
            )
        })
        .collect();
    eprintln!(
        "bench: {FIGURE}: chain of {ENTRIES} entries, {} bytes, built in {:.1} s",
        bytes.len(),
        t0.elapsed().as_secs_f64()
    );

    let rounds = util::rounds(9, 3);
    let (mut v, mut b, mut decode_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let decoded = decode_chain(&bytes).expect("the chain decodes");
        let d = t.elapsed();
        let chain = Chain::verify(decoded).expect("the chain verifies");
        let total = t.elapsed();
        assert_eq!(chain.state().devices().count(), ENTRIES - 1);
        v.push(ENTRIES as f64 / total.as_secs_f64());
        decode_ms.push(d.as_secs_f64() * 1e3);

        let t = Instant::now();
        let mut ok = 0usize;
        for (k, m, s) in &triples {
            ok += usize::from(k.verify_strict(m, s).is_ok());
        }
        let total = t.elapsed();
        assert_eq!(ok, ENTRIES);
        b.push(ENTRIES as f64 / total.as_secs_f64());
    }

    // Assembly from shuffled entries, and the sync answer.
    let mut shuffled = entries.clone();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for i in (1..shuffled.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        shuffled.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    let t = Instant::now();
    let got = assemble(shuffled.clone());
    let assemble_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(got.chains.len(), 1);
    assert_eq!(got.chains[0].state().len(), ENTRIES);
    let t = Instant::now();
    let answer = sync::answer(&shuffled, &SyncRequest::default()).expect("known is empty");
    let sync_ms = t.elapsed().as_secs_f64() * 1e3;
    let sync_bytes: usize = answer.entries.iter().map(|e| e.wire().len()).sum();
    assert_eq!(answer.entries.len(), ENTRIES);

    let (val, base) = (util::median(&v), util::median(&b));
    let ratio = val / base;
    Figure {
        name: FIGURE,
        placement: Some("pinned"),
        value: val,
        baseline: Some(base),
        baseline_of: "bare loop of ed25519-dalek verify_strict over the same signed bytes, keys parsed beforehand",
        ratio: Some(ratio),
        better: "higher",
        goal: json!("ratio >= 0.8"),
        unit: "entries/s",
        pass: ratio >= 0.8,
        rounds,
        extra: vec![
            ("entries", json!(ENTRIES)),
            ("chain_bytes", json!(bytes.len())),
            ("decode_ms", util::round3(util::median(&decode_ms))),
            ("assemble_shuffled_ms", util::round3(assemble_ms)),
            ("sync_answer_ms", util::round3(sync_ms)),
            ("sync_answer_entry_bytes", json!(sync_bytes)),
            ("value_spread", util::round3(util::spread(&v))),
            ("baseline_spread", util::round3(util::spread(&b))),
        ],
    }
    .emit();
}
