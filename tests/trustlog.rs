//! The trust log's pure core (seed 004, Locked mode; issue 14): the wire
//! form against vectors computed by an independent implementation (Python's
//! hashlib and `cryptography`), every decoder rejection, chains built here
//! for every chain rule, both sides of each fork-choice rule, assembly from
//! unordered entries, the `trustlog.sync` answer, the key text forms, and a
//! bounded, deterministic mutation test of the decoder.
//!
//! Argon2id at the seed's parameters costs 64 MiB and real time per
//! commitment, so only the disable tests compute it (a handful of times).

use std::cmp::Ordering;

use ed25519_dalek::SigningKey;
use omniconfluxd::trustlog::chain::disablement_commitment;
use omniconfluxd::trustlog::entry::KEY_LEN;
use omniconfluxd::trustlog::sync::{self, SyncRequest};
use omniconfluxd::trustlog::{
    BuildError, Chain, CoSign, Content, DecodeError, Entry, Hash, KeyText, KeyTextError, Kind,
    RuleError, assemble, compare, decode_chain, encode_chain,
};

// ---- building blocks ----

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn public(k: &SigningKey) -> Vec<u8> {
    k.verifying_key().to_bytes().to_vec()
}

fn content(kind: Kind, prev: &Entry) -> Content {
    Content {
        kind,
        prev: prev.hash().0.to_vec(),
        signers: vec![],
        disablements: vec![],
        key: vec![],
        signer: vec![],
        replaces: vec![],
    }
}

fn genesis_content(signers: &[&SigningKey], disablements: Vec<Vec<u8>>) -> Content {
    Content {
        kind: Kind::Genesis,
        prev: vec![],
        signers: signers.iter().map(|k| public(k)).collect(),
        disablements,
        key: vec![],
        signer: vec![],
        replaces: vec![],
    }
}

fn genesis(signers: &[&SigningKey], by: &SigningKey) -> Entry {
    genesis_content(signers, vec![]).sign(by).unwrap()
}

/// An entry of `kind` with Key `target` after `prev`, signed by `by`.
fn op(kind: Kind, prev: &Entry, target: &[u8], by: &SigningKey) -> Entry {
    let mut c = content(kind, prev);
    c.key = target.to_vec();
    c.sign(by).unwrap()
}

fn device(n: u8) -> Vec<u8> {
    vec![n; 32]
}

/// A revoke-signer entry after `prev`, co-signed by `cosigners`.
fn revoke(
    prev: &Entry,
    revoked: &[&SigningKey],
    replaces: &[&SigningKey],
    cosigners: &[&SigningKey],
) -> Entry {
    let mut c = content(Kind::RevokeSigner, prev);
    c.signers = revoked.iter().map(|k| public(k)).collect();
    c.replaces = replaces.iter().map(|k| public(k)).collect();
    let cosigns = cosigners.iter().map(|k| c.cosign(k)).collect();
    Entry::assemble(c, vec![], cosigns).unwrap()
}

fn verify(entries: &[&Entry]) -> Result<Chain, omniconfluxd::trustlog::ChainError> {
    Chain::verify(entries.iter().map(|e| (*e).clone()).collect())
}

/// The rule entry `index` of the chain breaks.
fn broken(entries: &[&Entry]) -> (usize, RuleError) {
    let e = verify(entries).expect_err("the chain must be refused");
    (e.index, e.rule)
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---- entry encoding: vectors from an independent implementation ----

/// Computed with Python: the seed's layout written out by hand with
/// `struct`, signatures by `cryptography`'s Ed25519, hashes by
/// `hashlib.blake2s`, the commitment by `cryptography`'s Argon2id (salt
/// argus-trustlog-disablement-v1, 1 pass, 65536 KiB, 4 lanes, 32 bytes).
/// Keys: A = seed 01×32, B = 02×32, C = 03×32; secret 07×32.
const V_COMMIT: &str = "23a1f009a6137d1ce78fde21c8a1da1c835cc17cf73c3f93931abff412f6638a";
const V_GENESIS: &str = "010000000000000002000000208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000000208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b394000000010000002023a1f009a6137d1ce78fde21c8a1da1c835cc17cf73c3f93931abff412f6638a00000000000000208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000000407f07cfa3bda2d23f566cf347de1cd763bcaa33898a871c590820aa660d380a052b96767603f764f2636dff0f722f09496bac931810f900460be8f6ffb047a802";
const V_GENESIS_HASH: &str = "0a4ad78a0583626dd34c6a311cfcf2381ccc12894c22eed728c85cbb48706b92";
const V_AUTHORIZE: &str = "04000000200a4ad78a0583626dd34c6a311cfcf2381ccc12894c22eed728c85cbb48706b920000000000000000000000200909090909090909090909090909090909090909090909090909090909090909000000208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39400000040d0624e3a3e3f7259bbf86c62c908eb3fcfd08789f2694698bf4e01576dfc610aa53a8053f5dc9a27bcd39814edee157faba6b8454c5a05354b3818fa042e8e05";
const V_AUTHORIZE_HASH: &str = "dd822c5bd2cf3801cce0cb45494a2744423d944a85d5dd63e02336fa1c01b7ea";
const V_REVOKE: &str = "07000000200a4ad78a0583626dd34c6a311cfcf2381ccc12894c22eed728c85cbb48706b9200000001000000208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b3940000000000000000000000000000000100000020ed4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d10000000000000002000000208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39400000040cfe3abbb87fcf92ee96a0c4bfb192780e7c7547e8a1c854ad1e46dfd3b2a78df7861dfe199b15271cf25420b215c5951ec2bbc4eda53f3f1443b740e14d0c90c000000208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c00000040276aed98f47f794af780f80fde9e6f2bde5a77fc866f3696249c0f782393c51189dc43fb8fb0e3cd5037b08032eebf9d8f3d8341406a0b1879ff3363040ae10c";
const V_REVOKE_HASH: &str = "9b2fbcd5b27450c274123ef7901b762db6fd719e745c4d305d8434efaaffb278";

#[test]
fn wire_form_hash_and_commitment_match_an_independent_implementation() {
    let (a, b, c) = (key(1), key(2), key(3));
    let secret = [7u8; 32];
    let commit = disablement_commitment(&secret);
    assert_eq!(
        hex(&commit),
        V_COMMIT,
        "Argon2id commitment at the seed's parameters"
    );

    let g = genesis_content(&[&a, &b], vec![commit.to_vec()])
        .sign(&a)
        .unwrap();
    assert_eq!(hex(g.wire()), V_GENESIS);
    assert_eq!(hex(&g.hash().0), V_GENESIS_HASH);
    let auth = op(Kind::AuthorizeDevice, &g, &device(9), &b);
    assert_eq!(hex(auth.wire()), V_AUTHORIZE);
    assert_eq!(hex(&auth.hash().0), V_AUTHORIZE_HASH);
    // Co-signs given in the other order are sorted by the encoder.
    let r = revoke(&g, &[&b], &[&c], &[&b, &a]);
    assert_eq!(hex(r.wire()), V_REVOKE);
    assert_eq!(hex(&r.hash().0), V_REVOKE_HASH);

    // The vectors decode to the same entries, field by field.
    for (wire, built) in [(V_GENESIS, &g), (V_AUTHORIZE, &auth), (V_REVOKE, &r)] {
        let d = Entry::decode(&unhex(wire)).unwrap();
        assert_eq!(&d, built);
        assert_eq!(d.content(), built.content());
        assert_eq!(d.cosigns(), built.cosigns());
        assert!(d.wire().starts_with(d.signed_bytes()));
        assert_eq!(d.signed_bytes(), d.content().signed_bytes().as_slice());
    }
    assert_eq!(r.signer(), b"");
    assert_eq!(r.sig(), b"");
    assert_eq!(r.replaces(), &[public(&c)]);
    assert_eq!(r.cosigns()[0].signer, public(&b).min(public(&a)));

    // The chain these make verifies, and yields what it says.
    let chain = verify(&[&g, &auth]).unwrap();
    let s = chain.state();
    assert_eq!(s.genesis_hash(), g.hash());
    assert_eq!(s.tip(), auth.hash());
    assert_eq!(s.len(), 2);
    assert!(s.is_authorized(&device(9)));
    assert_eq!(s.authorized_by(&device(9)), Some(public(&b).as_slice()));
    assert_eq!(s.disablements(), &[commit.to_vec()]);
    assert!(!s.disabled());
}

#[test]
fn every_kind_round_trips_through_entry_and_chain_forms() {
    let (a, b) = (key(1), key(2));
    let g = genesis(&[&a, &b], &a);
    let e2 = op(Kind::AddSigner, &g, &public(&key(3)), &a);
    let e3 = op(Kind::RemoveSigner, &e2, &public(&key(3)), &b);
    let e4 = op(Kind::AuthorizeDevice, &e3, &device(1), &a);
    let e5 = op(Kind::RevokeDevice, &e4, &device(1), &a);
    let e7 = revoke(&e5, &[&b], &[], &[&a, &key(4)]);
    let e6 = op(Kind::Disable, &e5, &[1; 32], &key(9));
    for e in [&g, &e2, &e3, &e4, &e5, &e6, &e7] {
        let d = Entry::decode(e.wire()).unwrap();
        assert_eq!(&d, e);
        assert_eq!(d.kind(), e.kind());
        assert_eq!(d.hash(), e.hash());
    }
    let all = [g, e2, e3, e4, e5, e6, e7];
    let bytes = encode_chain(&all);
    assert_eq!(&bytes[..4], &7u32.to_be_bytes());
    assert_eq!(decode_chain(&bytes).unwrap(), all);
    assert_eq!(
        decode_chain(&encode_chain(&[])).unwrap(),
        Vec::<Entry>::new()
    );
}

#[test]
fn only_revoke_signer_carries_replaces_and_cosigns() {
    let g = genesis(&[&key(1)], &key(1));
    let mut c = content(Kind::AddSigner, &g);
    c.key = public(&key(2));
    c.replaces = vec![public(&key(3))];
    assert_eq!(
        c.clone().sign(&key(1)).unwrap_err(),
        BuildError::NotRevokeSigner {
            kind: Kind::AddSigner
        }
    );
    c.replaces.clear();
    let cs = CoSign {
        signer: public(&key(1)),
        sig: vec![0; 64],
    };
    assert_eq!(
        Entry::assemble(c, vec![0; 64], vec![cs]).unwrap_err(),
        BuildError::NotRevokeSigner {
            kind: Kind::AddSigner
        }
    );
}

// ---- decoder rejections ----

fn u32be(n: u32) -> [u8; 4] {
    n.to_be_bytes()
}

/// A well-formed add-signer entry's bytes with chosen field values.
fn raw_entry(kind: u8) -> Vec<u8> {
    let mut b = vec![kind];
    b.extend(u32be(0)); // prev
    b.extend(u32be(0)); // signers
    b.extend(u32be(0)); // disablements
    b.extend(u32be(1));
    b.push(0xaa); // key
    b.extend(u32be(0)); // signer
    if kind == 7 {
        b.extend(u32be(0)); // replaces
    }
    b.extend(u32be(0)); // sig
    if kind == 7 {
        b.extend(u32be(0)); // co-signs
    }
    b
}

#[test]
fn decoder_accepts_the_grammar_and_zero_length_fields() {
    for kind in 1..=7 {
        let e = Entry::decode(&raw_entry(kind)).unwrap();
        assert_eq!(e.kind() as u8, kind);
        assert_eq!(e.key(), &[0xaa]);
        assert!(e.prev().is_empty() && e.signer().is_empty() && e.sig().is_empty());
    }
}

#[test]
fn decoder_rejects_unknown_kinds() {
    for kind in [0u8, 8, 9, 0x80, 0xff] {
        assert_eq!(
            Entry::decode(&raw_entry(kind)).unwrap_err(),
            DecodeError::UnknownKind { kind }
        );
    }
}

#[test]
fn decoder_rejects_truncation_at_every_length() {
    for kind in [2u8, 7] {
        let full = raw_entry(kind);
        for n in 0..full.len() {
            let err = Entry::decode(&full[..n]).unwrap_err();
            assert!(
                matches!(err, DecodeError::Truncated { .. }),
                "kind {kind} cut at {n}: {err:?}"
            );
        }
    }
    // A field whose length runs past the end.
    let mut b = vec![2u8];
    b.extend(u32be(32));
    b.extend([0; 10]);
    assert_eq!(
        Entry::decode(&b).unwrap_err(),
        DecodeError::Truncated { at: 15 }
    );
}

#[test]
fn decoder_rejects_trailing_bytes() {
    let g = genesis(&[&key(1)], &key(1));
    let mut b = g.wire().to_vec();
    b.push(0);
    assert_eq!(
        Entry::decode(&b).unwrap_err(),
        DecodeError::TrailingBytes { at: g.wire().len() }
    );
    let mut chain = encode_chain([&g]);
    chain.push(0);
    assert!(matches!(
        decode_chain(&chain).unwrap_err(),
        DecodeError::TrailingBytes { .. }
    ));
}

#[test]
fn decoder_limits_fields_lists_entries_and_chains() {
    // A field of 1 MiB + 1 is refused from its length alone.
    let mut b = vec![2u8];
    b.extend(u32be(1024 * 1024 + 1));
    assert_eq!(
        Entry::decode(&b).unwrap_err(),
        DecodeError::FieldTooLong {
            at: 1,
            len: 1024 * 1024 + 1
        }
    );
    // Exactly 1 MiB is a valid field length, but the entry around it is
    // then longer than the 1 MiB a chain field may hold.
    let mut b = vec![2u8];
    b.extend(u32be(1024 * 1024));
    b.extend(vec![0u8; 1024 * 1024]);
    assert!(matches!(
        Entry::decode(&b).unwrap_err(),
        DecodeError::EntryTooLong { .. }
    ));
    let mut b = vec![2u8];
    b.extend(u32be(1024 * 1024 - 64));
    b.extend(vec![0u8; 1024 * 1024 - 64]);
    b.extend(u32be(0));
    b.extend(u32be(0));
    b.extend(u32be(0));
    b.extend(u32be(0));
    b.extend(u32be(0));
    assert_eq!(Entry::decode(&b).unwrap().prev().len(), 1024 * 1024 - 64);
    // 4097 signers, 4097 disablements, replaces, co-signs: refused from the
    // count, before any item is read.
    // Signers at byte 5, disablements at byte 9.
    for zeros_before in 1..=2 {
        let mut b = vec![1u8];
        for _ in 0..zeros_before {
            b.extend(u32be(0));
        }
        let at = b.len();
        b.extend(u32be(4097));
        assert_eq!(
            Entry::decode(&b).unwrap_err(),
            DecodeError::TooManyItems { at, count: 4097 }
        );
    }
    let mut r = raw_entry(7);
    let replaces_at = r.len() - 12;
    r[replaces_at..replaces_at + 4].copy_from_slice(&u32be(4097));
    assert_eq!(
        Entry::decode(&r).unwrap_err(),
        DecodeError::TooManyItems {
            at: replaces_at,
            count: 4097
        }
    );
    let mut r = raw_entry(7);
    let cosigns_at = r.len() - 4;
    r[cosigns_at..].copy_from_slice(&u32be(4097));
    assert_eq!(
        Entry::decode(&r).unwrap_err(),
        DecodeError::TooManyItems {
            at: cosigns_at,
            count: 4097
        }
    );
    // 4096 empty signers is within the limit (a grammar check only).
    let mut b = vec![1u8];
    b.extend(u32be(0));
    b.extend(u32be(4096));
    for _ in 0..4096 {
        b.extend(u32be(0));
    }
    b.extend([0u8; 16]);
    assert_eq!(Entry::decode(&b).unwrap().signers().len(), 4096);

    // Chains: 65537 entries refused from the count; a count larger than
    // the entries present is truncation; an entry that does not decode is
    // named by its index.
    assert_eq!(
        decode_chain(&u32be(65_537)).unwrap_err(),
        DecodeError::TooManyEntries { count: 65_537 }
    );
    assert!(matches!(
        decode_chain(&u32be(65_536)).unwrap_err(),
        DecodeError::Truncated { .. }
    ));
    let g = genesis(&[&key(1)], &key(1));
    let mut chain = encode_chain([&g]);
    chain.extend(u32be(1));
    chain.push(0x09);
    chain[..4].copy_from_slice(&u32be(2));
    let err = decode_chain(&chain).unwrap_err();
    assert_eq!(
        err,
        DecodeError::InChain {
            index: 1,
            error: Box::new(DecodeError::UnknownKind { kind: 9 })
        }
    );
    assert_eq!(err.code(), "trustlog-unknown-kind");
    assert_eq!(
        err.to_string(),
        "trust-log chain entry 1: trust-log entry has unknown kind 9"
    );
}

#[test]
fn decoder_rejects_cosigns_out_of_order_or_repeated() {
    let (a, b) = (key(1), key(2));
    let g = genesis(&[&a, &b, &key(3)], &a);
    let r = revoke(&g, &[&key(3)], &[], &[&a, &b]);
    let (c0, c1) = (&r.cosigns()[0], &r.cosigns()[1]);
    assert!(c0 < c1);
    let write = |first: &CoSign, second: &CoSign| {
        let mut w = r.signed_bytes().to_vec();
        w.extend(u32be(0));
        w.extend(u32be(2));
        for c in [first, second] {
            w.extend(u32be(c.signer.len() as u32));
            w.extend(&c.signer);
            w.extend(u32be(c.sig.len() as u32));
            w.extend(&c.sig);
        }
        w
    };
    assert_eq!(Entry::decode(&write(c0, c1)).unwrap(), r);
    assert_eq!(
        Entry::decode(&write(c1, c0)).unwrap_err(),
        DecodeError::CoSignsUnsorted { index: 1 }
    );
    assert_eq!(
        Entry::decode(&write(c0, c0)).unwrap_err(),
        DecodeError::CoSignsUnsorted { index: 1 }
    );
    // Same signer, signatures in order: sorted, so decodable (the chain
    // rule counts the signer once).
    let mut low = c0.clone();
    low.sig = vec![0; 64];
    assert!(Entry::decode(&write(&low, c0)).is_ok());
}

// ---- chain rules ----

#[test]
fn genesis_rules() {
    let (a, b) = (key(1), key(2));
    assert!(verify(&[&genesis(&[&a], &a)]).is_ok());
    assert!(verify(&[&genesis(&[&a, &b], &b)]).is_ok());

    let mut c = genesis_content(&[&a], vec![]);
    c.prev = vec![1; 32];
    assert_eq!(broken(&[&c.sign(&a).unwrap()]), (0, RuleError::GenesisPrev));
    let c = genesis_content(&[], vec![]);
    assert_eq!(
        broken(&[&c.sign(&a).unwrap()]),
        (0, RuleError::GenesisNoSigners)
    );
    let c = genesis_content(&[&a, &b, &a], vec![]);
    assert_eq!(
        broken(&[&c.sign(&a).unwrap()]),
        (0, RuleError::GenesisDuplicateSigner)
    );
    assert_eq!(
        broken(&[&genesis(&[&a], &b)]),
        (0, RuleError::GenesisSignerNotListed)
    );
    // A's key listed as the signer, but the signature is B's.
    let mut c = genesis_content(&[&a], vec![]);
    c.signer = public(&a);
    let forged = Entry::assemble(c.clone(), b_sign(&b, &c), vec![]).unwrap();
    assert_eq!(broken(&[&forged]), (0, RuleError::BadSignature));
    // Not a genesis first; a genesis second.
    let g = genesis(&[&a], &a);
    let add = op(Kind::AddSigner, &g, &public(&b), &a);
    assert_eq!(broken(&[&add]), (0, RuleError::NotGenesis));
    assert_eq!(
        broken(&[&g, &genesis(&[&b], &b)]),
        (1, RuleError::GenesisNotFirst)
    );
    assert!(Chain::verify(vec![]).is_err());
}

fn b_sign(k: &SigningKey, c: &Content) -> Vec<u8> {
    use ed25519_dalek::Signer;
    k.sign(&c.signed_bytes()).to_bytes().to_vec()
}

#[test]
fn every_entry_extends_the_tip() {
    let a = key(1);
    let g = genesis(&[&a], &a);
    let d1 = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let d2 = op(Kind::AuthorizeDevice, &d1, &device(2), &a);
    assert!(verify(&[&g, &d1, &d2]).is_ok());
    // Skipping an entry, repeating one, or swapping two breaks the link.
    assert_eq!(broken(&[&g, &d2]), (1, RuleError::NotExtendingTip));
    assert_eq!(broken(&[&g, &d1, &d1]), (2, RuleError::NotExtendingTip));
    assert_eq!(broken(&[&g, &d2, &d1]), (1, RuleError::NotExtendingTip));
    // A Prev of the right hash but another length is no link.
    let mut c = content(Kind::AuthorizeDevice, &g);
    c.prev.push(0);
    c.key = device(3);
    assert_eq!(
        broken(&[&g, &c.sign(&a).unwrap()]),
        (1, RuleError::NotExtendingTip)
    );
}

#[test]
fn signed_kinds_need_a_key_and_a_trusted_signer() {
    let (a, b, x) = (key(1), key(2), key(9));
    let g = genesis(&[&a, &b], &a);
    for kind in [
        Kind::AddSigner,
        Kind::RemoveSigner,
        Kind::AuthorizeDevice,
        Kind::RevokeDevice,
    ] {
        let target = if kind == Kind::RemoveSigner {
            public(&b)
        } else {
            device(5)
        };
        assert!(
            verify(&[&g, &op(kind, &g, &target, &a)]).is_ok(),
            "{kind:?}"
        );
        assert_eq!(
            broken(&[&g, &op(kind, &g, &[], &a)]),
            (1, RuleError::EmptyKey),
            "{kind:?}"
        );
        assert_eq!(
            broken(&[&g, &op(kind, &g, &target, &x)]),
            (1, RuleError::UntrustedSigner),
            "{kind:?}"
        );
        // A trusted signer's key with another key's signature.
        let mut c = content(kind, &g);
        c.key = target.clone();
        c.signer = public(&a);
        let forged = Entry::assemble(c.clone(), b_sign(&x, &c), vec![]).unwrap();
        assert_eq!(
            broken(&[&g, &forged]),
            (1, RuleError::BadSignature),
            "{kind:?}"
        );
        // A signature of the wrong length.
        let short = Entry::assemble(c, vec![0; 63], vec![]).unwrap();
        assert_eq!(
            broken(&[&g, &short]),
            (1, RuleError::BadSignature),
            "{kind:?}"
        );
    }
    // A signer added by an entry signs the next ones.
    let add = op(Kind::AddSigner, &g, &public(&x), &a);
    let by_x = op(Kind::AuthorizeDevice, &add, &device(1), &x);
    let chain = verify(&[&g, &add, &by_x]).unwrap();
    assert!(chain.state().is_signer(&public(&x)));
    // Adding a signer twice is valid and changes nothing.
    let again = op(Kind::AddSigner, &by_x, &public(&x), &b);
    let chain = verify(&[&g, &add, &by_x, &again]).unwrap();
    assert_eq!(chain.state().signers().count(), 3);
}

#[test]
fn devices_are_authorized_once_and_revoked() {
    let a = key(1);
    let g = genesis(&[&a], &a);
    let d1 = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let twice = op(Kind::AuthorizeDevice, &d1, &device(1), &a);
    assert_eq!(
        broken(&[&g, &d1, &twice]),
        (2, RuleError::DeviceAlreadyAuthorized)
    );
    let r1 = op(Kind::RevokeDevice, &d1, &device(1), &a);
    let again = op(Kind::AuthorizeDevice, &r1, &device(1), &a);
    let chain = verify(&[&g, &d1, &r1]).unwrap();
    assert!(!chain.state().is_authorized(&device(1)));
    assert_eq!(chain.state().devices().count(), 0);
    let chain = verify(&[&g, &d1, &r1, &again]).unwrap();
    assert!(chain.state().is_authorized(&device(1)));
    // Revoking a device that is not authorized is valid and changes nothing.
    let r2 = op(Kind::RevokeDevice, &again, &device(2), &a);
    let chain = verify(&[&g, &d1, &r1, &again, &r2]).unwrap();
    assert_eq!(
        chain.state().devices().collect::<Vec<_>>(),
        vec![device(1).as_slice()]
    );
    // A device key need only be non-empty in the log.
    let odd = op(Kind::AuthorizeDevice, &r2, b"x", &a);
    assert!(
        verify(&[&g, &d1, &r1, &again, &r2, &odd])
            .unwrap()
            .state()
            .is_authorized(b"x")
    );
}

#[test]
fn remove_signer_rules_and_its_devices_go_with_it() {
    let (a, b, c) = (key(1), key(2), key(3));
    let g = genesis(&[&a, &b], &a);
    let not_signer = op(Kind::RemoveSigner, &g, &public(&c), &a);
    assert_eq!(broken(&[&g, &not_signer]), (1, RuleError::NotASigner));
    let by_a = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let by_b = op(Kind::AuthorizeDevice, &by_a, &device(2), &b);
    let rm_b = op(Kind::RemoveSigner, &by_b, &public(&b), &a);
    let chain = verify(&[&g, &by_a, &by_b, &rm_b]).unwrap();
    let s = chain.state();
    assert!(!s.is_signer(&public(&b)));
    assert!(s.is_authorized(&device(1)), "A's device stays");
    assert!(!s.is_authorized(&device(2)), "B's device goes with B");
    // B signs nothing any more; A is the last signer and cannot go.
    let late = op(Kind::AuthorizeDevice, &rm_b, &device(3), &b);
    assert_eq!(
        broken(&[&g, &by_a, &by_b, &rm_b, &late]),
        (4, RuleError::UntrustedSigner)
    );
    let last = op(Kind::RemoveSigner, &rm_b, &public(&a), &a);
    assert_eq!(
        broken(&[&g, &by_a, &by_b, &rm_b, &last]),
        (4, RuleError::LastSigner)
    );
    // A signer may remove itself while another remains.
    let self_rm = op(Kind::RemoveSigner, &g, &public(&a), &a);
    let chain = verify(&[&g, &self_rm]).unwrap();
    assert_eq!(
        chain.state().signers().collect::<Vec<_>>(),
        vec![public(&b).as_slice()]
    );
}

#[test]
fn disable_needs_a_committed_secret_and_is_permanent() {
    let (a, stranger) = (key(1), key(9));
    let secret = [5u8; 32];
    let g = genesis_content(
        &[&a],
        vec![vec![0; 32], disablement_commitment(&secret).to_vec()],
    )
    .sign(&a)
    .unwrap();
    let d1 = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    // Any key may sign it: here one that is no signer.
    let dis = op(Kind::Disable, &d1, &secret, &stranger);
    let chain = verify(&[&g, &d1, &dis]).unwrap();
    assert!(chain.state().disabled());
    // Nothing follows a disable, not even by a trusted signer.
    let after = op(Kind::AuthorizeDevice, &dis, &device(2), &a);
    assert_eq!(broken(&[&g, &d1, &dis, &after]), (3, RuleError::Disabled));
    // A wrong secret.
    let wrong = op(Kind::Disable, &d1, &[6u8; 32], &a);
    assert_eq!(
        broken(&[&g, &d1, &wrong]),
        (2, RuleError::BadDisablementSecret)
    );
    // A genesis without commitments: refused before any Argon2id.
    let bare = genesis(&[&a], &a);
    let dis = op(Kind::Disable, &bare, &secret, &a);
    assert_eq!(broken(&[&bare, &dis]), (1, RuleError::BadDisablementSecret));
    // The signature is still checked (and first).
    let mut c = content(Kind::Disable, &d1);
    c.key = secret.to_vec();
    c.signer = public(&a);
    let unsigned = Entry::assemble(c, vec![0; 64], vec![]).unwrap();
    assert_eq!(broken(&[&g, &d1, &unsigned]), (2, RuleError::BadSignature));
}

#[test]
fn revoke_signer_rules() {
    let (a, b, c, d, x) = (key(1), key(2), key(3), key(4), key(9));
    let g = genesis(&[&a, &b, &c], &a);
    let by_c = op(Kind::AuthorizeDevice, &g, &device(1), &c);
    let by_a = op(Kind::AuthorizeDevice, &by_c, &device(2), &a);

    // Two trusted co-signers for one revoked key: valid; C's device goes.
    let r = revoke(&by_a, &[&c], &[], &[&a, &b]);
    let chain = verify(&[&g, &by_c, &by_a, &r]).unwrap();
    let s = chain.state();
    assert!(!s.is_signer(&public(&c)));
    assert!(!s.is_authorized(&device(1)));
    assert!(s.is_authorized(&device(2)));
    assert_eq!(s.tip(), r.hash());

    let not_enough = |e: &Entry, counted| {
        assert_eq!(
            broken(&[&g, &by_c, &by_a, e]),
            (3, RuleError::NotEnoughCoSigns { counted, needed: 2 })
        );
    };
    // One co-signer is not more than one revoked key.
    not_enough(&revoke(&by_a, &[&c], &[], &[&a]), 1);
    // The revoked signer's own co-sign does not count without Replaces...
    not_enough(&revoke(&by_a, &[&c], &[], &[&a, &c]), 1);
    // ...and does with them; the replacement becomes a signer.
    let succession = revoke(&by_a, &[&c], &[&d], &[&a, &c]);
    let chain = verify(&[&g, &by_c, &by_a, &succession]).unwrap();
    assert!(chain.state().is_signer(&public(&d)));
    assert!(!chain.state().is_signer(&public(&c)));
    // A co-sign by a key that is not a signer does not count.
    not_enough(&revoke(&by_a, &[&c], &[], &[&a, &x]), 1);
    // Nor does one whose signature is not over these bytes.
    let good = revoke(&by_a, &[&c], &[], &[&a]);
    let bad_b = CoSign {
        signer: public(&b),
        sig: good.cosigns()[0].sig.clone(),
    };
    not_enough(&good.with_cosign(bad_b).unwrap(), 1);
    // Two co-signs from one signer count once.
    let mut twice = good.cosigns()[0].clone();
    twice.sig = vec![0; 64];
    not_enough(&good.with_cosign(twice).unwrap(), 1);
    // The blob path: co-signs added one at a time make the same entry.
    let cs_b = r.content().cosign(&b);
    assert_eq!(good.with_cosign(cs_b).unwrap(), r);

    // Shape rules.
    let rule = |e: &Entry| broken(&[&g, &by_c, &by_a, e]).1;
    let mut signed = r.content().clone();
    signed.signer = public(&a);
    let signed = Entry::assemble(
        signed.clone(),
        vec![],
        vec![signed.cosign(&a), signed.cosign(&b)],
    )
    .unwrap();
    assert_eq!(rule(&signed), RuleError::RevokeSignerSigned);
    let with_sig = Entry::assemble(r.content().clone(), vec![1; 64], r.cosigns().to_vec()).unwrap();
    assert_eq!(rule(&with_sig), RuleError::RevokeSignerSigned);
    assert_eq!(
        rule(&revoke(&by_a, &[], &[&d], &[&a, &b])),
        RuleError::RevokeNothing
    );
    assert_eq!(
        rule(&revoke(&by_a, &[&c, &c], &[], &[&a, &b])),
        RuleError::RevokeDuplicateKey
    );
    assert_eq!(
        rule(&revoke(&by_a, &[&c], &[&d, &d], &[&a, &b])),
        RuleError::RevokeDuplicateKey
    );
    assert_eq!(
        rule(&revoke(&by_a, &[&c], &[&c], &[&a, &b])),
        RuleError::RevokeOverlap
    );
    assert_eq!(
        rule(&revoke(&by_a, &[&a, &b, &c], &[], &[&a, &b])),
        RuleError::NoSignerLeft
    );
    // Every signer revoked but one replacement remains: valid with enough
    // co-signs (revoked signers count because Replaces is not empty).
    let g2 = genesis(&[&a, &b], &a);
    let all = revoke(&g2, &[&a], &[&d], &[&a, &b]);
    let chain = verify(&[&g2, &all]).unwrap();
    assert_eq!(chain.state().signers().collect::<Vec<_>>(), {
        let mut v = vec![public(&b), public(&d)];
        v.sort();
        v
    });
    // It extends the tip like every entry.
    let stale = revoke(&by_c, &[&c], &[], &[&a, &b]);
    assert_eq!(rule(&stale), RuleError::NotExtendingTip);
}

#[test]
fn revoking_a_signer_forks_before_its_first_entry_and_wins() {
    let (a, b, c) = (key(1), key(2), key(3));
    let g = genesis(&[&a, &b, &c], &a);
    let by_a = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let by_c = op(Kind::AuthorizeDevice, &by_a, &device(6), &c); // C's first entry
    let add_by_c = op(Kind::AddSigner, &by_c, &public(&key(7)), &c);
    let later_a = op(Kind::AuthorizeDevice, &add_by_c, &device(2), &a);
    let current = verify(&[&g, &by_a, &by_c, &add_by_c, &later_a]).unwrap();
    // The default fork point is the parent of C's first entry.
    assert_eq!(current.default_fork_point(&[public(&c)]), by_a.hash());
    // A key that signed nothing: the tip.
    assert_eq!(
        current.default_fork_point(&[public(&key(8))]),
        later_a.hash()
    );
    // The revocation extends the prefix that ends at the fork point.
    let prefix = current.prefix_to(&by_a.hash()).unwrap();
    assert_eq!(prefix.state().tip(), by_a.hash());
    let fork = prefix.state().clone();
    let r = revoke(&by_a, &[&c], &[], &[&a, &b]);
    let mut revoked = prefix;
    revoked.push(r.clone()).unwrap();
    // Shorter, but it wins: weight 2 against C's entry's 1.
    assert_eq!(compare(&revoked, &current), Some(Ordering::Greater));
    assert_eq!(compare(&current, &revoked), Some(Ordering::Less));
    assert_eq!(fork.counted_cosigners(&r), 2);
    // Assembly from everything anyone holds picks the same.
    let all = [&g, &by_a, &by_c, &add_by_c, &later_a, &r].map(|e| e.clone());
    let got = assemble(all);
    let chosen = got.chain_for(&g.hash()).unwrap();
    assert_eq!(chosen.state().tip(), r.hash());
    let s = chosen.state();
    assert!(!s.is_signer(&public(&c)) && !s.is_signer(&public(&key(7))));
    assert!(s.is_authorized(&device(1)) && !s.is_authorized(&device(6)));
    assert!(
        !s.is_authorized(&device(2)),
        "A's later entry is on the losing branch"
    );
    assert_eq!(
        got.unplaced, 0,
        "the losing branch is valid, only not chosen"
    );
}

// ---- fork choice: both sides of every rule ----

/// `a` beats `b`, whichever is compared first.
fn beats(a: &Chain, b: &Chain) {
    assert_eq!(compare(a, b), Some(Ordering::Greater));
    assert_eq!(compare(b, a), Some(Ordering::Less));
    // Assembly from the union agrees.
    let union = a.entries().iter().chain(b.entries()).cloned();
    let got = assemble(union);
    assert_eq!(got.chains.len(), 1);
    assert_eq!(got.chains[0].state().tip(), a.state().tip());
}

#[test]
fn rule_1_a_disabled_chain_beats_one_that_is_not() {
    let (a, b) = (key(1), key(2));
    let secret = [3u8; 32];
    let g = genesis_content(&[&a, &b], vec![disablement_commitment(&secret).to_vec()])
        .sign(&a)
        .unwrap();
    let dis = op(Kind::Disable, &g, &secret, &key(9));
    let d1 = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let rm = op(Kind::RemoveSigner, &d1, &public(&b), &a);
    let disabled = verify(&[&g, &dis]).unwrap();
    let longer = verify(&[&g, &d1, &rm]).unwrap();
    // Shorter, weight 0 (its signer is no signer), not a removal, and
    // whatever its hash: the disabled chain wins.
    beats(&disabled, &longer);
    // The other side: the same two branches with neither disabled are
    // decided by the later rules (here rule 3 is a tie and the hash
    // decides).
    let d2 = op(Kind::AuthorizeDevice, &g, &device(2), &b);
    let other = verify(&[&g, &d2]).unwrap();
    let winner = if d1.hash() < d2.hash() {
        &longer
    } else {
        &other
    };
    let loser = if d1.hash() < d2.hash() {
        &other
    } else {
        &longer
    };
    beats(winner, loser);
}

#[test]
fn rule_2_of_a_chain_and_its_prefix_the_longer_wins() {
    let a = key(1);
    let g = genesis(&[&a], &a);
    let d1 = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let d2 = op(Kind::AuthorizeDevice, &d1, &device(2), &a);
    let short = verify(&[&g, &d1]).unwrap();
    let long = verify(&[&g, &d1, &d2]).unwrap();
    beats(&long, &short);
    let only_genesis = verify(&[&g]).unwrap();
    beats(&short, &only_genesis);
    assert_eq!(compare(&long, &long.clone()), Some(Ordering::Equal));
    // Chains of different logs are not ordered.
    let other = verify(&[&genesis(&[&key(2)], &key(2))]).unwrap();
    assert_eq!(compare(&long, &other), None);
}

#[test]
fn rule_3_the_heavier_first_different_entry_wins() {
    let (a, b, c, d) = (key(1), key(2), key(3), key(4));
    let g = genesis(&[&a, &b, &c, &d], &a);
    // Revocations of C by two and by three co-signers: three wins, even
    // where its hash is the higher one.
    let r2 = revoke(&g, &[&c], &[], &[&a, &b]);
    let r3 = revoke(&g, &[&c], &[], &[&a, &b, &d]);
    let two = verify(&[&g, &r2]).unwrap();
    let three = verify(&[&g, &r3]).unwrap();
    beats(&three, &two);
    // A revocation (weight 2) against a longer branch of weight-1 entries.
    let d1 = op(Kind::AuthorizeDevice, &g, &device(1), &c);
    let d2 = op(Kind::AuthorizeDevice, &d1, &device(2), &c);
    let d3 = op(Kind::AuthorizeDevice, &d2, &device(3), &c);
    let long = verify(&[&g, &d1, &d2, &d3]).unwrap();
    beats(&two, &long);
    // The other side: the heavier entry wins even when it is not a removal
    // and the lighter one is. A revocation whose co-signs count 2 against
    // a remove-signer (weight 1, removal): the revoke-signer wins by
    // weight; equal weight would have let the removal rule decide.
    let rm = op(Kind::RemoveSigner, &g, &public(&d), &a);
    beats(&two, &verify(&[&g, &rm]).unwrap());
    // Weight counts only signers trusted at the fork: signers added after
    // the fork co-sign for nothing. With {A, B} at the fork, B adds P and
    // Q, and a revocation of A co-signed by B, P and Q counts 1 at the
    // fork; it could not even be valid without 2 trusted co-signers, so
    // weigh it directly against the fork state.
    let g2 = genesis(&[&a, &b], &a);
    let (p, q) = (key(5), key(6));
    let add_p = op(Kind::AddSigner, &g2, &public(&p), &b);
    let add_q = op(Kind::AddSigner, &add_p, &public(&q), &b);
    let puppet = revoke(&add_q, &[&a], &[], &[&b, &p, &q]);
    let puppets = verify(&[&g2, &add_p, &add_q, &puppet]).unwrap();
    let fork = verify(&[&g2]).unwrap().state().clone();
    assert_eq!(fork.counted_cosigners(&puppet), 1);
    assert_eq!(omniconfluxd::trustlog::fork::weight(&add_p, &fork), 1);
    // A's honest revocation of B at the fork, co-signed by A and B (B's
    // co-sign counts with a replacement): weight 2 against add_p's 1.
    let honest = revoke(&g2, &[&b], &[&d], &[&a, &b]);
    beats(&verify(&[&g2, &honest]).unwrap(), &puppets);
}

#[test]
fn rule_4_on_a_tie_a_removal_wins() {
    let (a, b, c) = (key(1), key(2), key(3));
    let g = genesis(&[&a, &b, &c], &a);
    let rm = op(Kind::RemoveSigner, &g, &public(&c), &a);
    let rm_chain = verify(&[&g, &rm]).unwrap();
    // Against several non-removals of weight 1, whichever hash is lower.
    let mut lower_hash_seen = false;
    for n in 1..=255 {
        let other = op(Kind::AuthorizeDevice, &g, &device(n), &b);
        lower_hash_seen |= other.hash() < rm.hash();
        beats(&rm_chain, &verify(&[&g, &other]).unwrap());
        if lower_hash_seen && n >= 6 {
            break;
        }
    }
    assert!(
        lower_hash_seen,
        "the removal beat an entry with a lower hash"
    );
    // Both sides: two removals tie on rule 4 too, so the hash decides.
    let rm_b = op(Kind::RemoveSigner, &g, &public(&b), &a);
    let rm_b_chain = verify(&[&g, &rm_b]).unwrap();
    if rm.hash() < rm_b.hash() {
        beats(&rm_chain, &rm_b_chain);
    } else {
        beats(&rm_b_chain, &rm_chain);
    }
}

#[test]
fn rule_5_on_a_second_tie_the_lower_hash_wins() {
    let (a, b) = (key(1), key(2));
    let g = genesis(&[&a, &b], &a);
    let x = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let y = op(Kind::AuthorizeDevice, &g, &device(2), &b);
    let (low, high) = if x.hash() < y.hash() { (x, y) } else { (y, x) };
    // The lower hash wins, even against a longer branch.
    let high_more = op(Kind::AuthorizeDevice, &high, &device(3), &a);
    beats(
        &verify(&[&g, &low]).unwrap(),
        &verify(&[&g, &high]).unwrap(),
    );
    beats(
        &verify(&[&g, &low]).unwrap(),
        &verify(&[&g, &high, &high_more]).unwrap(),
    );
}

// ---- assembly ----

/// A small deterministic generator (splitmix64) for shuffles and mutations.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

fn linear(a: &SigningKey, n: u8) -> Vec<Entry> {
    let mut v = vec![genesis(&[a], a)];
    for i in 0..n {
        let e = op(Kind::AuthorizeDevice, v.last().unwrap(), &device(i), a);
        v.push(e);
    }
    v
}

#[test]
fn assembly_from_an_unordered_set_with_duplicates() {
    let a = key(1);
    let entries = linear(&a, 20);
    let mut rng = Rng(7);
    for _ in 0..5 {
        let mut shuffled: Vec<Entry> = entries.iter().chain(&entries[3..9]).cloned().collect();
        rng.shuffle(&mut shuffled);
        let got = assemble(shuffled);
        assert_eq!(got.unplaced, 0);
        assert_eq!(got.chains.len(), 1);
        assert_eq!(got.chains[0].entries(), entries.as_slice());
        assert_eq!(got.chains[0].state().devices().count(), 20);
    }
    assert!(assemble(Vec::new()).chains.is_empty());
}

#[test]
fn assembly_drops_incomplete_branches_and_keeps_what_invalid_entries_claim_to_extend() {
    let a = key(1);
    let entries = linear(&a, 6);
    // Without entry 3, entries 4..6 cannot reach the genesis.
    let holed: Vec<Entry> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(_, e)| e.clone())
        .collect();
    let got = assemble(holed);
    assert_eq!(got.chains[0].entries(), &entries[..3]);
    assert_eq!(got.unplaced, 3);
    // Anyone can make an entry that names the tip as Prev; it does not
    // hide the valid chain, and it is not placed.
    let tip = entries.last().unwrap();
    let junk = op(Kind::AuthorizeDevice, tip, &device(99), &key(66));
    let junk2 = op(Kind::AuthorizeDevice, &junk, &device(98), &a);
    let mut all = entries.clone();
    all.extend([junk, junk2]);
    let got = assemble(all);
    assert_eq!(got.chains[0].entries(), entries.as_slice());
    assert_eq!(got.unplaced, 2);
    // A chain cut at an invalid entry in the middle keeps its valid prefix.
    let bad_mid = op(Kind::AuthorizeDevice, &entries[2], &device(50), &key(66));
    let after_bad = op(Kind::AuthorizeDevice, &bad_mid, &device(51), &a);
    let got = assemble([
        entries[0].clone(),
        entries[1].clone(),
        entries[2].clone(),
        bad_mid,
        after_bad,
    ]);
    assert_eq!(got.chains[0].entries(), &entries[..3]);
}

#[test]
fn assembly_keeps_each_genesis_apart() {
    let (a, b) = (key(1), key(2));
    let one = linear(&a, 3);
    let two = linear(&b, 5);
    let bad_genesis = genesis(&[&a], &b);
    let mut all: Vec<Entry> = one.iter().chain(&two).cloned().collect();
    all.push(bad_genesis);
    let got = assemble(all);
    assert_eq!(got.chains.len(), 2);
    assert_eq!(got.unplaced, 1);
    assert_eq!(
        got.chain_for(&one[0].hash()).unwrap().entries(),
        one.as_slice()
    );
    assert_eq!(
        got.chain_for(&two[0].hash()).unwrap().entries(),
        two.as_slice()
    );
    assert!(got.chain_for(&Hash([0; 32])).is_none());
}

#[test]
fn assembly_of_many_branches_picks_what_pairwise_fork_choice_picks() {
    let (a, b, c) = (key(1), key(2), key(3));
    let g = genesis(&[&a, &b, &c], &a);
    let trunk1 = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let trunk2 = op(Kind::AuthorizeDevice, &trunk1, &device(2), &b);
    // Branches at trunk1 and at trunk2, of several kinds and lengths.
    let mut branches: Vec<Vec<Entry>> = Vec::new();
    for (base, n) in [(&trunk1, 10u8), (&trunk2, 20), (&trunk2, 30), (&trunk1, 40)] {
        let first = op(
            Kind::AuthorizeDevice,
            base,
            &device(n),
            if n % 20 == 0 { &b } else { &c },
        );
        let second = op(Kind::AuthorizeDevice, &first, &device(n + 1), &a);
        branches.push(vec![first, second]);
    }
    branches.push(vec![op(Kind::RemoveSigner, &trunk2, &public(&c), &b)]);
    let mut chains = Vec::new();
    let mut all = vec![g.clone(), trunk1.clone(), trunk2.clone()];
    for br in &branches {
        let mut prefix = vec![g.clone(), trunk1.clone()];
        if br[0].prev() == trunk2.hash().0.as_slice() {
            prefix.push(trunk2.clone());
        }
        prefix.extend(br.iter().cloned());
        chains.push(Chain::verify(prefix).unwrap());
        all.extend(br.iter().cloned());
    }
    let best = chains.iter().max_by(|x, y| compare(x, y).unwrap()).unwrap();
    for other in &chains {
        assert_ne!(compare(best, other), Some(Ordering::Less));
    }
    let mut rng = Rng(11);
    rng.shuffle(&mut all);
    assert_eq!(assemble(all).chains[0].entries(), best.entries());
}

// ---- trustlog.sync ----

#[test]
fn sync_answers_parents_first_with_want_and_disjoint() {
    let a = key(1);
    let chain = linear(&a, 8);
    // The gateway received them in reverse, and one twice.
    let mut held: Vec<Entry> = chain.iter().rev().cloned().collect();
    held.push(chain[4].clone());

    let ans = sync::answer(&held, &SyncRequest::default()).unwrap();
    assert_eq!(
        ans.entries.iter().map(|e| e.hash()).collect::<Vec<_>>(),
        chain.iter().map(Entry::hash).collect::<Vec<_>>()
    );
    assert!(ans.want.is_empty());
    assert!(!ans.disjoint, "an empty known is never disjoint");

    // The caller holds the first 5 and two the gateway lacks.
    let theirs = linear(&key(2), 1);
    let mut known: Vec<Hash> = chain[..5].iter().map(Entry::hash).collect();
    known.extend(theirs.iter().map(Entry::hash));
    known.push(theirs[0].hash());
    let ans = sync::answer(
        &held,
        &SyncRequest {
            known,
            truncated: false,
        },
    )
    .unwrap();
    assert_eq!(ans.entries, chain[5..].iter().collect::<Vec<_>>());
    assert_eq!(ans.want, vec![theirs[0].hash(), theirs[1].hash()]);
    assert!(!ans.disjoint);

    // Nothing in common.
    let known: Vec<Hash> = theirs.iter().map(Entry::hash).collect();
    let ans = sync::answer(
        &held,
        &SyncRequest {
            known: known.clone(),
            truncated: false,
        },
    )
    .unwrap();
    assert!(ans.disjoint);
    assert_eq!(ans.entries.len(), 9);
    let ans = sync::answer(
        &held,
        &SyncRequest {
            known,
            truncated: true,
        },
    )
    .unwrap();
    assert!(
        !ans.disjoint,
        "a truncated known says nothing about disjointness"
    );

    // Parents first also across an entry whose parent the gateway lacks.
    let orphan_parent = op(Kind::AuthorizeDevice, &chain[8], &device(70), &a);
    let orphan = op(Kind::AuthorizeDevice, &orphan_parent, &device(71), &a);
    let held2 = vec![orphan.clone(), chain[1].clone(), chain[0].clone()];
    let ans = sync::answer(&held2, &SyncRequest::default()).unwrap();
    let pos = |h: Hash| ans.entries.iter().position(|e| e.hash() == h).unwrap();
    assert!(pos(chain[0].hash()) < pos(chain[1].hash()));
    assert_eq!(ans.entries.len(), 3);
}

#[test]
fn sync_heads_are_the_entries_no_other_names() {
    let (a, b) = (key(1), key(2));
    let g = genesis(&[&a, &b], &a);
    let x = op(Kind::AuthorizeDevice, &g, &device(1), &a);
    let y = op(Kind::AuthorizeDevice, &g, &device(2), &b);
    let y2 = op(Kind::AuthorizeDevice, &y, &device(3), &b);
    let held = vec![y2.clone(), g.clone(), x.clone(), y.clone(), x.clone()];
    assert_eq!(sync::heads(&held), vec![y2.hash(), x.hash()]);
    assert_eq!(sync::heads(std::slice::from_ref(&g)), vec![g.hash()]);
    assert!(sync::heads(&[]).is_empty());
}

#[test]
fn sync_known_is_cut_at_4096_newest_kept() {
    let a = key(1);
    let g = genesis(&[&a], &a);
    // Entries need not verify for the request: 5000 distinct entries.
    let mut held = vec![g.clone()];
    for i in 0..4999u32 {
        let e = op(
            Kind::AuthorizeDevice,
            held.last().unwrap(),
            &i.to_be_bytes(),
            &a,
        );
        held.push(e);
    }
    let req = sync::request(&held);
    assert!(req.truncated);
    assert_eq!(req.known.len(), 4096);
    assert_eq!(req.known[0], held[5000 - 4096].hash());
    assert_eq!(*req.known.last().unwrap(), held[4999].hash());
    let small = sync::request(&held[..10]);
    assert!(!small.truncated);
    assert_eq!(small.known.len(), 10);
    // The gateway refuses an uncut list.
    let mut too_long = req.clone();
    too_long.known.push(g.hash());
    let err = sync::answer(&held, &too_long).unwrap_err();
    assert_eq!(err.code(), "trustlog-known-too-long");
    // Cut and truncated: everything the caller did not name comes back.
    let ans = sync::answer(&held, &req).unwrap();
    assert_eq!(ans.entries.len(), 5000 - 4096);
    assert_eq!(ans.entries[0].hash(), g.hash());
}

// ---- key text forms ----

#[test]
fn key_text_forms() {
    let bytes: [u8; KEY_LEN] = core::array::from_fn(|i| (i * 8) as u8);
    for (kind, prefix) in [
        (KeyText::SignerPub, "sigpub:"),
        (KeyText::DevicePub, "devpub:"),
        (KeyText::Genesis, "gen:"),
        (KeyText::Disablement, "dis:"),
        (KeyText::Tip, "tip:"),
    ] {
        let text = kind.format(&bytes);
        assert_eq!(text, format!("{prefix}{}", hex(&bytes)));
        assert_eq!(kind.parse(&text).unwrap(), bytes);
        assert_eq!(
            kind.parse(
                &text
                    .to_uppercase()
                    .replacen(&prefix.to_uppercase(), prefix, 1)
            )
            .unwrap(),
            bytes
        );
    }
    let sig = KeyText::SignerPub.format(&bytes);
    assert_eq!(
        KeyText::DevicePub.parse(&sig).unwrap_err(),
        KeyTextError::Prefix {
            expected: KeyText::DevicePub
        }
    );
    assert_eq!(
        KeyText::SignerPub.parse(&sig[..sig.len() - 1]).unwrap_err(),
        KeyTextError::Length {
            expected: KeyText::SignerPub,
            len: 63
        }
    );
    assert_eq!(
        KeyText::SignerPub.parse(&format!("{sig}0")).unwrap_err(),
        KeyTextError::Length {
            expected: KeyText::SignerPub,
            len: 65
        }
    );
    let not_hex = format!("sigpub:{}", "g".repeat(64));
    assert_eq!(
        KeyText::SignerPub.parse(&not_hex).unwrap_err(),
        KeyTextError::NotHex {
            expected: KeyText::SignerPub
        }
    );
    // 64 bytes of which some are multi-byte characters: refused, no panic.
    let wide = format!("sigpub:{}é", "0".repeat(62));
    assert!(KeyText::SignerPub.parse(&wide).is_err());
    assert_eq!(
        KeyText::Tip.parse(" tip:00").unwrap_err().to_string(),
        "key text does not start with tip:"
    );
}

// ---- mutations: the decoder never panics and never accepts a change ----

/// Every kind, in chains the verifier accepts, with revoke-signer entries
/// carrying exactly the co-signs they need (so losing one must fail).
fn corpus() -> Vec<(Vec<Entry>, usize)> {
    let (a, b, c, d) = (key(1), key(2), key(3), key(4));
    let g = genesis_content(&[&a, &b, &c], vec![vec![1; 32]])
        .sign(&a)
        .unwrap();
    let add = op(Kind::AddSigner, &g, &public(&d), &a);
    let auth = op(Kind::AuthorizeDevice, &add, &device(1), &d);
    let rdev = op(Kind::RevokeDevice, &auth, &device(1), &b);
    let rm = op(Kind::RemoveSigner, &rdev, &public(&d), &c);
    let rs = revoke(&rm, &[&c], &[&d], &[&a, &b]);
    let dis = op(Kind::Disable, &rs, &[2; 32], &a);
    let all = [g, add, auth, rdev, rm, rs, dis];
    // (the prefix the entry extends, its index); the disable entry's
    // secret is not committed, but every mutation of it fails its
    // signature before Argon2id is reached.
    (0..all.len()).map(|i| (all[..=i].to_vec(), i)).collect()
}

#[test]
fn mutated_encodings_never_panic_and_never_pass_as_the_entry() {
    let cases = corpus();
    let valid_prefix = |entries: &[Entry]| Chain::verify(entries.to_vec());
    // The last (disable) entry is in the corpus for the decoder; its
    // prefix check stops at its signature, never at Argon2id.
    for (entries, i) in &cases[..cases.len() - 1] {
        assert!(
            valid_prefix(entries).is_ok(),
            "corpus entry {i} must verify"
        );
    }
    let mut rng = Rng(0x5eed);
    let mut decoded_changes = 0usize;
    let mut tried = 0usize;
    for (entries, i) in &cases {
        let original = &entries[*i];
        let wire = original.wire();
        let parent = if *i == 0 {
            None
        } else {
            Some(Chain::verify(entries[..*i].to_vec()).unwrap())
        };
        let accepts = |e: &Entry| match &parent {
            None => Chain::verify(vec![e.clone()]).is_ok(),
            Some(p) => p.state().check(e).is_ok(),
        };
        let mut mutants: Vec<Vec<u8>> = Vec::new();
        // Every truncation.
        for n in 0..wire.len() {
            mutants.push(wire[..n].to_vec());
        }
        // Extensions by 1 to 64 random bytes.
        for _ in 0..200 {
            let mut m = wire.to_vec();
            for _ in 0..=rng.below(64) {
                m.push(rng.next() as u8);
            }
            mutants.push(m);
        }
        // Every single bit flipped, then random multi-bit flips.
        for bit in 0..wire.len() * 8 {
            let mut m = wire.to_vec();
            m[bit / 8] ^= 1 << (bit % 8);
            mutants.push(m);
        }
        for _ in 0..1000 {
            let mut m = wire.to_vec();
            for _ in 0..=rng.below(4) {
                let at = rng.below(m.len());
                m[at] ^= 1 << rng.below(8);
            }
            mutants.push(m);
        }
        for m in mutants {
            if m == wire {
                continue;
            }
            tried += 1;
            if let Ok(e) = Entry::decode(&m) {
                decoded_changes += 1;
                assert_ne!(e.hash(), original.hash());
                assert!(
                    !accepts(&e),
                    "entry {i}: a changed encoding was accepted: {}",
                    hex(&m)
                );
            }
        }
        // The chain form: a mutated chain either fails to decode, decodes
        // to the same entries, or fails verification.
        if *i + 1 < cases.len() {
            let chain = encode_chain(entries);
            for _ in 0..300 {
                let mut m = chain.clone();
                match rng.below(3) {
                    0 => m.truncate(rng.below(m.len())),
                    1 => m.push(rng.next() as u8),
                    _ => {
                        let at = rng.below(m.len());
                        m[at] ^= 1 << rng.below(8);
                    }
                }
                tried += 1;
                if let Ok(d) = decode_chain(&m) {
                    assert!(d == *entries || Chain::verify(d).is_err());
                }
            }
        }
    }
    // The test exercised the decoder past its grammar, not only its
    // length checks: many flips decode and are then refused by the rules.
    assert!(tried > 20_000, "{tried} mutants");
    assert!(
        decoded_changes > 1_000,
        "{decoded_changes} decodable mutants"
    );
}

#[test]
fn error_codes_and_messages() {
    let e = RuleError::NotEnoughCoSigns {
        counted: 1,
        needed: 2,
    };
    assert_eq!(e.code(), "trustlog-not-enough-cosigns");
    assert_eq!(
        e.to_string(),
        "the revoke-signer entry has 1 counted co-signers, 2 needed"
    );
    let a = key(1);
    let err = Chain::verify(vec![op(Kind::AddSigner, &genesis(&[&a], &a), &[1], &a)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "trust-log entry 0: the first entry is not a genesis"
    );
    assert_eq!(
        DecodeError::Truncated { at: 3 }.to_string(),
        "trust-log entry ends early at byte 3"
    );
}
