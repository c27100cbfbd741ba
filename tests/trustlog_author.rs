//! The entries the `lock.*` methods write (seed 004, "Locked mode
//! control"), from the trust log's pure core: `lock.init`, the signed
//! operations with their `changed: false` case, `lock.disable`, and the
//! revoke-signer ceremony passed between three signers as blobs, with each
//! refusal a signer or the finish can meet.

use std::cmp::Ordering;

use ed25519_dalek::SigningKey;
use omniconfluxd::trustlog::author::{self, AuthorError};
use omniconfluxd::trustlog::{Chain, Entry, Kind, RuleError, compare, disablement_commitment};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn public(k: &SigningKey) -> Vec<u8> {
    k.verifying_key().to_bytes().to_vec()
}

fn device(n: u8) -> Vec<u8> {
    vec![n; 32]
}

/// The same log as three nodes hold it: signers A, B, C; C authorized a
/// device, then A did.
fn three_signers() -> (Chain, [SigningKey; 3]) {
    let (a, b, c) = (key(1), key(2), key(3));
    let mut chain = author::init(
        vec![public(&a), public(&b), public(&c)],
        &[device(1)],
        vec![],
        &a,
    )
    .unwrap();
    let by_c = author::sign_op(&chain, Kind::AuthorizeDevice, &device(3), &c)
        .unwrap()
        .unwrap();
    chain.push(by_c).unwrap();
    let by_a = author::sign_op(&chain, Kind::AuthorizeDevice, &device(4), &a)
        .unwrap()
        .unwrap();
    chain.push(by_a).unwrap();
    (chain, [a, b, c])
}

#[test]
fn init_makes_a_genesis_and_authorizes_devices() {
    let a = key(1);
    let secret = [4u8; 32];
    let commitment = disablement_commitment(&secret).to_vec();
    let chain = author::init(
        vec![public(&a), public(&key(2))],
        &[device(7), device(8)],
        vec![commitment.clone()],
        &a,
    )
    .unwrap();
    assert_eq!(chain.entries().len(), 3);
    assert_eq!(chain.entries()[0].kind(), Kind::Genesis);
    let s = chain.state();
    assert_eq!(s.signers().count(), 2);
    assert!(s.is_authorized(&device(7)) && s.is_authorized(&device(8)));
    assert_eq!(s.disablements(), &[commitment]);
    // The secret disables it (one Argon2id here, one in the check).
    let dis = author::disable(&chain, &secret, &a).unwrap();
    let mut disabled = chain.clone();
    disabled.push(dis).unwrap();
    assert!(disabled.state().disabled());
    assert_eq!(
        author::sign_op(&disabled, Kind::AuthorizeDevice, &device(9), &a).unwrap_err(),
        AuthorError::Rule(RuleError::Disabled)
    );

    assert_eq!(
        author::init(vec![public(&key(2))], &[], vec![], &a).unwrap_err(),
        AuthorError::SignerNotListed
    );
    assert_eq!(
        author::init(vec![public(&a), vec![1; 31]], &[], vec![], &a).unwrap_err(),
        AuthorError::KeyLength { len: 31 }
    );
    assert_eq!(
        author::init(vec![public(&a)], &[vec![1; 33]], vec![], &a).unwrap_err(),
        AuthorError::KeyLength { len: 33 }
    );
    let bare = author::init(vec![public(&a)], &[], vec![], &a).unwrap();
    assert_eq!(
        author::disable(&bare, &secret, &a).unwrap_err(),
        AuthorError::Rule(RuleError::BadDisablementSecret)
    );
}

#[test]
fn operations_report_no_change_when_already_in_the_state() {
    let (mut chain, [a, b, _c]) = three_signers();
    // Already authorized, not authorized, already a signer, not a signer.
    assert_eq!(
        author::sign_op(&chain, Kind::AuthorizeDevice, &device(1), &a),
        Ok(None)
    );
    assert_eq!(
        author::sign_op(&chain, Kind::RevokeDevice, &device(9), &a),
        Ok(None)
    );
    assert_eq!(
        author::sign_op(&chain, Kind::AddSigner, &public(&b), &a),
        Ok(None)
    );
    assert_eq!(
        author::sign_op(&chain, Kind::RemoveSigner, &public(&key(9)), &a),
        Ok(None)
    );
    // And an entry extending the tip when it changes something.
    let tip = chain.state().tip();
    let e = author::sign_op(&chain, Kind::RevokeDevice, &device(1), &b)
        .unwrap()
        .unwrap();
    assert_eq!(e.prev(), tip.0.as_slice());
    chain.push(e).unwrap();
    assert!(!chain.state().is_authorized(&device(1)));
    // A key that signs nothing here, a key of the wrong length, a kind that
    // is no operation.
    assert_eq!(
        author::sign_op(&chain, Kind::AuthorizeDevice, &device(5), &key(9)).unwrap_err(),
        AuthorError::Rule(RuleError::UntrustedSigner)
    );
    assert_eq!(
        author::sign_op(&chain, Kind::AuthorizeDevice, &[1; 5], &a).unwrap_err(),
        AuthorError::KeyLength { len: 5 }
    );
    assert_eq!(
        author::sign_op(&chain, Kind::Disable, &device(5), &a).unwrap_err(),
        AuthorError::NotAnOperation {
            kind: Kind::Disable
        }
    );
}

#[test]
fn the_revoke_signer_ceremony_across_three_signers() {
    let (chain, [a, b, c]) = three_signers();
    // A starts revoking C; the default fork point is before C's entry.
    let blob = author::revoke_start(&chain, vec![public(&c)], vec![], None, &a).unwrap();
    assert_eq!(blob.prev(), chain.entries()[1].hash().0.as_slice());
    assert_eq!(blob.cosigns().len(), 1);
    // Not enough co-signs yet.
    assert_eq!(
        author::revoke_finish(&chain, blob.wire()).unwrap_err(),
        AuthorError::Rule(RuleError::NotEnoughCoSigns {
            counted: 1,
            needed: 2
        })
    );
    // B co-signs the wire form it was handed.
    let blob = author::revoke_cosign(&chain, blob.wire(), &b).unwrap();
    assert_eq!(blob.cosigns().len(), 2);
    // C, revoked without a replacement, may not co-sign; A not twice.
    assert_eq!(
        author::revoke_cosign(&chain, blob.wire(), &c).unwrap_err(),
        AuthorError::RevokedCannotCoSign
    );
    assert_eq!(
        author::revoke_cosign(&chain, blob.wire(), &a).unwrap_err(),
        AuthorError::AlreadyCoSigned
    );
    let revoked = author::revoke_finish(&chain, blob.wire()).unwrap();
    assert_eq!(revoked.state().tip(), blob.hash());
    assert_eq!(revoked.entries().last(), Some(&blob));
    assert!(!revoked.state().is_signer(&public(&c)));
    assert!(!revoked.state().is_authorized(&device(3)));
    // Fork choice adopts it over the chain the node held.
    assert_eq!(compare(&revoked, &chain), Some(Ordering::Greater));
}

#[test]
fn the_ceremony_with_a_replacement_and_a_chosen_fork_point() {
    let (chain, [_, b, c]) = three_signers();
    let d = key(4);
    // C hands its place to D: its own co-sign counts with a replacement.
    // Fork at the tip, so nothing is erased.
    let tip = chain.state().tip();
    let blob =
        author::revoke_start(&chain, vec![public(&c)], vec![public(&d)], Some(tip), &c).unwrap();
    let blob = author::revoke_cosign(&chain, blob.wire(), &b).unwrap();
    let next = author::revoke_finish(&chain, blob.wire()).unwrap();
    assert_eq!(next.entries().len(), chain.entries().len() + 1);
    assert!(next.state().is_signer(&public(&d)));
    assert!(next.state().is_authorized(&device(4)), "A's device stays");
    assert!(!next.state().is_authorized(&device(3)), "C's device goes");
    assert_eq!(compare(&next, &chain), Some(Ordering::Greater));
}

#[test]
fn the_ceremony_refuses_what_would_not_count() {
    let (mut chain, [a, b, c]) = three_signers();
    // A signer added after the fork point co-signs for nothing.
    let e = author::sign_op(&chain, Kind::AddSigner, &public(&key(5)), &a)
        .unwrap()
        .unwrap();
    chain.push(e).unwrap();
    let fork = chain.entries()[1].hash();
    let blob = author::revoke_start(&chain, vec![public(&c)], vec![], Some(fork), &a).unwrap();
    assert_eq!(
        author::revoke_cosign(&chain, blob.wire(), &key(5)).unwrap_err(),
        AuthorError::NotTrustedAtFork
    );
    assert_eq!(
        author::revoke_start(&chain, vec![public(&c)], vec![], Some(fork), &key(5)).unwrap_err(),
        AuthorError::NotTrustedAtFork
    );
    // A fork point this node's log does not hold.
    let other = author::init(vec![public(&a)], &[], vec![], &a).unwrap();
    assert_eq!(
        author::revoke_cosign(&other, blob.wire(), &b).unwrap_err(),
        AuthorError::ForkPointUnknown
    );
    assert_eq!(
        author::revoke_finish(&other, blob.wire()).unwrap_err(),
        AuthorError::ForkPointUnknown
    );
    assert_eq!(
        author::revoke_start(
            &chain,
            vec![public(&c)],
            vec![],
            Some(other.state().tip()),
            &a
        )
        .unwrap_err(),
        AuthorError::ForkPointUnknown
    );
    // A co-sign altered in transit is refused by the next signer.
    let mut wire = blob.wire().to_vec();
    let last = wire.len() - 1;
    wire[last] ^= 1;
    assert_eq!(
        author::revoke_cosign(&chain, &wire, &b).unwrap_err(),
        AuthorError::BadCoSign
    );
    // Shapes the rules refuse are refused at the start.
    assert_eq!(
        author::revoke_start(&chain, vec![], vec![], None, &a).unwrap_err(),
        AuthorError::Rule(RuleError::RevokeNothing)
    );
    assert_eq!(
        author::revoke_start(&chain, vec![public(&c)], vec![public(&c)], None, &a).unwrap_err(),
        AuthorError::Rule(RuleError::RevokeOverlap)
    );
    assert_eq!(
        author::revoke_start(&chain, vec![public(&c)], vec![], None, &c).unwrap_err(),
        AuthorError::RevokedCannotCoSign
    );
    // Blobs that are not revoke-signer entries, or not entries at all.
    let not_blob: &Entry = &chain.entries()[1];
    assert_eq!(
        author::revoke_cosign(&chain, not_blob.wire(), &b).unwrap_err(),
        AuthorError::NotRevokeSigner {
            kind: Kind::AuthorizeDevice
        }
    );
    let err = author::revoke_finish(&chain, &[7, 0]).unwrap_err();
    assert_eq!(err.code(), "trustlog-truncated");
    assert_eq!(
        err.to_string(),
        "blob: trust-log entry ends early at byte 1"
    );
}
