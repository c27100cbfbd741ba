//! Admission at the end of a handshake and the decision after a trust
//! sync (seed 004, "Enforcement", "Pinning and quarantine"), from the trust
//! log's pure core: every branch of each, with logs built here.

use ed25519_dalek::SigningKey;
use omniconfluxd::trustlog::author;
use omniconfluxd::trustlog::enforce::{Gate, Outcome, Refusal, after_sync};
use omniconfluxd::trustlog::{Chain, Kind, assemble, disablement_commitment};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn public(k: &SigningKey) -> Vec<u8> {
    k.verifying_key().to_bytes().to_vec()
}

fn device(n: u8) -> Vec<u8> {
    vec![n; 32]
}

fn log_with(signer: &SigningKey, devices: &[Vec<u8>]) -> Chain {
    author::init(vec![public(signer)], devices, vec![], signer).unwrap()
}

fn gate(locked: bool, log: Option<&Chain>, local_disabled: bool, quarantined: bool) -> Gate<'_> {
    Gate {
        locked,
        log: log.map(Chain::state),
        local_disabled,
        quarantined,
    }
}

#[test]
fn admission_follows_the_seed_and_refuses_plaintext_when_locked() {
    let log = log_with(&key(1), &[device(1)]);
    let (ok, other) = (device(1), device(2));
    // Locked: only authorized client keys, never plaintext.
    let g = gate(true, Some(&log), false, false);
    assert_eq!(g.admit(Some(&ok)), Ok(()));
    assert_eq!(g.admit(Some(&other)), Err(Refusal::NotAuthorized));
    assert_eq!(g.admit(None), Err(Refusal::Plaintext));
    // An empty log authorizes no device.
    let g = gate(true, None, false, false);
    assert_eq!(g.admit(Some(&ok)), Err(Refusal::NotAuthorized));
    // Not locked: everyone, plaintext too.
    let g = gate(false, None, false, false);
    assert_eq!(g.admit(Some(&other)), Ok(()));
    assert_eq!(g.admit(None), Ok(()));
    // Quarantined: no one, authorized or not, locked or not.
    for locked in [true, false] {
        let g = gate(locked, Some(&log), false, true);
        assert_eq!(g.admit(Some(&ok)), Err(Refusal::Quarantined));
        assert_eq!(g.admit(None), Err(Refusal::Quarantined));
    }
    // Local disable: everyone, even when quarantined.
    for quarantined in [true, false] {
        let g = gate(true, Some(&log), true, quarantined);
        assert_eq!(g.admit(Some(&other)), Ok(()));
        assert_eq!(g.admit(None), Ok(()));
    }
    assert_eq!(Refusal::Plaintext.code(), "lock-plaintext");
}

#[test]
fn a_disabled_log_admits_everyone_and_revocation_closes_channels() {
    let a = key(1);
    let secret = [8u8; 32];
    let mut log = author::init(
        vec![public(&a)],
        &[device(1)],
        vec![disablement_commitment(&secret).to_vec()],
        &a,
    )
    .unwrap();
    assert_eq!(
        gate(true, Some(&log), false, false).admit(Some(&device(1))),
        Ok(())
    );
    // The log changes: the open channel's client is re-checked and refused.
    let revoke = author::sign_op(&log, Kind::RevokeDevice, &device(1), &a)
        .unwrap()
        .unwrap();
    log.push(revoke).unwrap();
    assert_eq!(
        gate(true, Some(&log), false, false).admit(Some(&device(1))),
        Err(Refusal::NotAuthorized)
    );
    let dis = author::disable(&log, &secret, &a).unwrap();
    log.push(dis).unwrap();
    let g = gate(true, Some(&log), false, false);
    assert_eq!(g.admit(Some(&device(9))), Ok(()));
    assert_eq!(g.admit(None), Ok(()));
}

#[test]
fn a_node_without_a_root_is_quarantined_by_any_valid_chain() {
    let (one, two) = (log_with(&key(1), &[]), log_with(&key(2), &[]));
    let found = assemble(one.entries().iter().chain(two.entries()).cloned());
    let lowest = found.chains[0].state().genesis_hash();
    assert!(lowest <= one.state().genesis_hash() && lowest <= two.state().genesis_hash());
    match after_sync(None, None, &found) {
        Outcome::Quarantine { seen_genesis } => assert_eq!(seen_genesis, lowest),
        o => panic!("{o:?}"),
    }
    // Nothing valid on the gateway: nothing happens.
    assert!(matches!(
        after_sync(None, None, &assemble(vec![])),
        Outcome::Keep
    ));
    // A pin without a log adopts the pinned chain and ignores the other.
    match after_sync(Some(two.state().genesis_hash()), None, &found) {
        Outcome::Adopt(c) => assert_eq!(c.state().genesis_hash(), two.state().genesis_hash()),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_node_with_a_log_adopts_only_what_fork_choice_prefers() {
    let a = key(1);
    let held = log_with(&a, &[device(1)]);
    let genesis = held.state().genesis_hash();
    let mut longer = held.clone();
    let e = author::sign_op(&longer, Kind::AuthorizeDevice, &device(2), &a)
        .unwrap()
        .unwrap();
    longer.push(e).unwrap();
    let foreign = log_with(&key(5), &[]);
    let all = longer.entries().iter().chain(foreign.entries()).cloned();
    let found = assemble(all);
    for pin in [Some(genesis), None] {
        match after_sync(pin, Some(&held), &found) {
            Outcome::Adopt(c) => assert_eq!(c.state().tip(), longer.state().tip()),
            o => panic!("{o:?}"),
        }
        // Holding the winner already: keep it; a foreign chain changes nothing.
        assert!(matches!(
            after_sync(pin, Some(&longer), &found),
            Outcome::Keep
        ));
    }
    // An operator who pins another genesis moves the node to that log.
    match after_sync(Some(foreign.state().genesis_hash()), Some(&held), &found) {
        Outcome::Adopt(c) => assert_eq!(c.state().genesis_hash(), foreign.state().genesis_hash()),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_disabled_log_superseded_by_another_root_quarantines() {
    let a = key(1);
    let secret = [6u8; 32];
    let mut held = author::init(
        vec![public(&a)],
        &[],
        vec![disablement_commitment(&secret).to_vec()],
        &a,
    )
    .unwrap();
    let dis = author::disable(&held, &secret, &a).unwrap();
    held.push(dis).unwrap();
    let genesis = held.state().genesis_hash();
    // Only the disabled log itself: keep it.
    let same = assemble(held.entries().to_vec());
    assert!(matches!(
        after_sync(Some(genesis), Some(&held), &same),
        Outcome::Keep
    ));
    // A new root appears: quarantine until the operator pins it.
    let fresh = log_with(&key(2), &[]);
    let both = assemble(held.entries().iter().chain(fresh.entries()).cloned());
    match after_sync(Some(genesis), Some(&held), &both) {
        Outcome::Quarantine { seen_genesis } => {
            assert_eq!(seen_genesis, fresh.state().genesis_hash())
        }
        o => panic!("{o:?}"),
    }
    // Once pinned, the new log is adopted.
    match after_sync(Some(fresh.state().genesis_hash()), Some(&held), &both) {
        Outcome::Adopt(c) => assert_eq!(c.state().genesis_hash(), fresh.state().genesis_hash()),
        o => panic!("{o:?}"),
    }
}
