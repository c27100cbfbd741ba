//! The E2EE protocol core in memory (seed 004, "End-to-end encryption";
//! issue 13): a client end and a node end of src/e2ee/ paired directly,
//! with no gateway between them. The full handshake and messages both ways,
//! then every way a handshake or a body is refused, and the identity file.
//! tests/e2ee_interop.rs pairs each end with an implementation no one on the
//! team wrote.

mod util;

use omniconfluxd::e2ee::identity::{self, IDENTITY_FILE};
use omniconfluxd::e2ee::{
    Accepted, Admission, Channel, HandshakeError, Initiator, OpenError, PublicKey, Refusal,
    SealError, StaticKey, base64, handshake, respond,
};
use std::os::unix::fs::PermissionsExt;
use util::TestDir;

const NODE: &str = "home";
const CHAN: &str = "c12";

/// The node's three questions, answered by the test.
#[derive(Default)]
struct Gate {
    existing: Option<&'static str>,
    quarantined: bool,
    /// In locked mode: the only client key the trust log authorizes.
    locked_to: Option<PublicKey>,
}

impl Admission for Gate {
    fn channel_exists(&self, chan_id: &str) -> bool {
        self.existing == Some(chan_id)
    }
    fn quarantined(&self) -> bool {
        self.quarantined
    }
    fn authorizes(&self, client: &PublicKey) -> bool {
        self.locked_to.is_none_or(|k| k == *client)
    }
}

struct Ends {
    node_key: StaticKey,
    client_key: StaticKey,
}

impl Ends {
    fn new() -> Ends {
        Ends {
            node_key: StaticKey::generate().unwrap(),
            client_key: StaticKey::generate().unwrap(),
        }
    }

    fn msg1(&self) -> (Initiator, [u8; 96]) {
        Initiator::start(&self.client_key, &self.node_key.public(), NODE, CHAN).unwrap()
    }

    fn respond(&self, msg1: &[u8], gate: &Gate) -> Result<Accepted, HandshakeError> {
        respond(&self.node_key, NODE, CHAN, msg1, gate)
    }

    /// (client's channel, node's channel)
    fn pair(&self) -> (Channel, Channel) {
        let (init, msg1) = self.msg1();
        let accepted = self.respond(&msg1, &Gate::default()).unwrap();
        (init.finish(&accepted.msg2).unwrap(), accepted.channel)
    }
}

fn code(r: Result<Accepted, HandshakeError>) -> &'static str {
    match r {
        Ok(_) => "accepted",
        Err(e) => e.code(),
    }
}

#[test]
fn handshake_then_requests_and_replies_both_ways() {
    let ends = Ends::new();
    assert_eq!(
        handshake::prologue(NODE, CHAN),
        "argus-e2e/v1|home|c12",
        "the seed's example"
    );
    let (init, msg1) = ends.msg1();
    assert_eq!(msg1.len(), 96);
    let accepted = ends.respond(&msg1, &Gate::default()).unwrap();
    assert_eq!(accepted.msg2.len(), 48);
    let mut node = accepted.channel;
    let mut client = init.finish(&accepted.msg2).unwrap();
    // Each end knows the other's static key, proven by the handshake.
    assert_eq!(node.peer(), ends.client_key.public());
    assert_eq!(client.peer(), ends.node_key.public());

    // A request, its reply and a notification, as relay bodies.
    let body = client.seal_body(br#"{"x":1}"#).unwrap();
    assert!(base64::decode(&body).is_some(), "a body is standard base64");
    assert_eq!(node.open_body(&body).unwrap(), br#"{"x":1}"#);
    let reply = node.seal_body(br#"{"result":null}"#).unwrap();
    let event = node.seal_body(br#"{"type":"added"}"#).unwrap();
    assert_eq!(client.open_body(&reply).unwrap(), br#"{"result":null}"#);
    assert_eq!(client.open_body(&event).unwrap(), br#"{"type":"added"}"#);

    // Many messages in wire order, in both directions at once.
    for i in 0..100u32 {
        let up = client.seal(&i.to_be_bytes()).unwrap();
        let down = node.seal(&(!i).to_be_bytes()).unwrap();
        assert_eq!(node.open(up).unwrap(), i.to_be_bytes());
        assert_eq!(client.open(down).unwrap(), (!i).to_be_bytes());
    }
}

#[test]
fn records_split_at_65519_bytes_and_an_empty_message_is_one_empty_record() {
    let (mut client, mut node) = Ends::new().pair();
    // "If a request has no params, seal gets an empty input": one record of
    // the tag alone, marked last.
    let empty = client.seal(b"").unwrap();
    assert_eq!(empty.len(), 2 + 16);
    assert_eq!(&empty[..2], &[0, 16]);
    assert_eq!(node.open(empty).unwrap(), b"");

    for (len, records) in [
        (1, 1),
        (65_519, 1),
        (65_520, 2),
        (3 * 65_519, 3),
        (3 * 65_519 + 1, 4),
    ] {
        let message: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let blob = client.seal(&message).unwrap();
        assert_eq!(blob.len(), len + records * 18, "{len} bytes");
        // Walk the prefixes: full records, then the rest.
        let mut at = 0;
        for r in 0..records {
            let n = u16::from_be_bytes([blob[at], blob[at + 1]]) as usize;
            let plain = if r + 1 < records {
                65_519
            } else {
                len - 65_519 * r
            };
            assert_eq!(n, plain + 16, "record {r} of {len} bytes");
            at += 2 + n;
        }
        assert_eq!(at, blob.len());
        assert_eq!(node.open(blob).unwrap(), message);
    }
}

#[test]
fn the_prologue_binds_node_id_and_channel_id() {
    let ends = Ends::new();
    let (_, msg1) = ends.msg1();
    // The gateway relays message 1 on another channel, or names another
    // node: the node's prologue differs and message 1 does not open.
    for (node_id, chan_id) in [(NODE, "c13"), ("work", CHAN), ("home|c", "12")] {
        let r = respond(&ends.node_key, node_id, chan_id, &msg1, &Gate::default());
        assert_eq!(code(r), "e2e-handshake-rejected", "{node_id} {chan_id}");
    }
    // The same message on the right channel is accepted.
    assert_eq!(code(ends.respond(&msg1, &Gate::default())), "accepted");
}

#[test]
fn a_wrong_node_key_fails_on_both_sides() {
    let ends = Ends::new();
    let impostor = StaticKey::generate().unwrap();
    // The roster's key was swapped: the real node cannot read message 1.
    let (_, msg1) = Initiator::start(&ends.client_key, &impostor.public(), NODE, CHAN).unwrap();
    assert_eq!(
        code(ends.respond(&msg1, &Gate::default())),
        "e2e-handshake-rejected"
    );
    // A message 2 from another handshake (another node key, or a replay of
    // an older one) does not finish this one.
    let (init, msg1) = ends.msg1();
    let other = Ends::new();
    let (_, other_msg1) = other.msg1();
    let other_msg2 = other.respond(&other_msg1, &Gate::default()).unwrap().msg2;
    let _ = ends.respond(&msg1, &Gate::default()).unwrap();
    assert_eq!(
        init.finish(&other_msg2).err().map(|e| e.code()),
        Some("e2e-handshake-rejected")
    );
    // A low-order node key is refused before anything is sent.
    let zero = PublicKey::from_bytes([0; 32]);
    let refused = Initiator::start(&ends.client_key, &zero, NODE, CHAN);
    assert_eq!(refused.err().map(|e| e.code()), Some("e2e-key-low-order"));
}

#[test]
fn truncated_extended_and_altered_handshake_messages_are_rejected() {
    let ends = Ends::new();
    let gate = Gate::default();
    let (_, msg1) = ends.msg1();
    for bad in [&msg1[..95], &[msg1.as_slice(), &[0]].concat()[..], &[][..]] {
        assert_eq!(code(ends.respond(bad, &gate)), "e2e-handshake-length");
    }
    // Every single-bit change of message 1: ephemeral key, encrypted static
    // key and tag (the ephemeral key's top bit, which X25519 ignores, still
    // changes the handshake hash).
    for bit in 0..96 * 8 {
        let mut m = msg1;
        m[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(
            code(ends.respond(&m, &gate)),
            "e2e-handshake-rejected",
            "bit {bit}"
        );
    }
    // Message 2: wrong lengths, then every single-bit change, each against
    // a fresh handshake (a failed finish consumes the initiator).
    let (init, msg1) = ends.msg1();
    let msg2 = ends.respond(&msg1, &gate).unwrap().msg2;
    let extended = [msg2.as_slice(), &[0]].concat();
    assert_eq!(
        init.finish(&extended).err().map(|e| e.code()),
        Some("e2e-handshake-length")
    );
    for bit in 0..48 * 8 {
        let (init, msg1) = ends.msg1();
        let mut m = ends.respond(&msg1, &gate).unwrap().msg2;
        m[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(
            init.finish(&m).err().map(|e| e.code()),
            Some("e2e-handshake-rejected"),
            "bit {bit}"
        );
    }
    let (init, _) = ends.msg1();
    assert_eq!(
        init.finish(&msg2[..47]).err().map(|e| e.code()),
        Some("e2e-handshake-length")
    );
}

#[test]
fn the_three_refusals_of_the_seed() {
    let ends = Ends::new();
    let (_, msg1) = ends.msg1();
    let refused = |gate: Gate| match ends.respond(&msg1, &gate) {
        Err(HandshakeError::Refused(r)) => Some(r),
        _ => None,
    };
    // "A channel with this chan_id already exists": even a valid message 1
    // does not replace it.
    let exists = Gate {
        existing: Some(CHAN),
        ..Gate::default()
    };
    assert_eq!(refused(exists), Some(Refusal::ChannelExists));
    let quarantined = Gate {
        quarantined: true,
        ..Gate::default()
    };
    assert_eq!(refused(quarantined), Some(Refusal::Quarantined));
    // Locked mode: the log authorizes another device.
    let other_device = StaticKey::generate().unwrap().public();
    let locked = Gate {
        locked_to: Some(other_device),
        ..Gate::default()
    };
    assert_eq!(refused(locked), Some(Refusal::Unauthorized));
    // ... and this one once it is authorized; the channel names its key.
    let authorized = Gate {
        locked_to: Some(ends.client_key.public()),
        existing: Some("c11"),
        ..Gate::default()
    };
    let accepted = ends.respond(&msg1, &authorized).unwrap();
    assert_eq!(accepted.channel.peer(), ends.client_key.public());
    for (r, c) in [
        (Refusal::ChannelExists, "e2e-channel-exists"),
        (Refusal::Quarantined, "e2e-node-quarantined"),
        (Refusal::Unauthorized, "e2e-client-unauthorized"),
    ] {
        assert_eq!(HandshakeError::Refused(r).code(), c);
    }
}

#[test]
fn replayed_reordered_and_altered_bodies_are_dropped_without_harm() {
    let (mut client, mut node) = Ends::new().pair();
    let a = client.seal(b"a").unwrap();
    let b = client.seal(b"b").unwrap();
    // Reordered: b arrives first and fails on its first record, so the
    // receive counter stays; a then opens, and so does b after it.
    let e = node.open(b.clone()).unwrap_err();
    assert_eq!((e, e.closes_channel()), (OpenError::Rejected, false));
    assert_eq!(node.open(a.clone()).unwrap(), b"a");
    // Replayed: a again, after the counter moved past it.
    assert_eq!(node.open(a).unwrap_err(), OpenError::Rejected);
    assert_eq!(node.open(b).unwrap(), b"b");

    // Every single-bit change of a body fails its first (only) record.
    let c = client.seal(b"request").unwrap();
    for bit in 16..c.len() * 8 {
        let mut m = c.clone();
        m[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(node.open(m).unwrap_err(), OpenError::Rejected, "bit {bit}");
    }
    // A body sealed by the node itself, or by the client on the other
    // direction's key, does not open either.
    let own = node.seal(b"own").unwrap();
    assert_eq!(node.open(own).unwrap_err(), OpenError::Rejected);
    // None of it moved the counter: the real body still opens.
    assert_eq!(node.open(c).unwrap(), b"request");
}

#[test]
fn empty_truncated_and_oversized_blobs_are_dropped() {
    let (mut client, mut node) = Ends::new().pair();
    let three = client.seal(&vec![7u8; 2 * 65_519 + 5]).unwrap();
    let r1 = 2 + 65_519 + 16;
    // "A receiver rejects an empty blob" (and an empty body).
    assert_eq!(node.open(vec![]).unwrap_err(), OpenError::Empty);
    assert_eq!(node.open_body("").unwrap_err(), OpenError::Empty);
    assert_eq!(
        node.open_body("not base64!").unwrap_err(),
        OpenError::NotBase64
    );
    // Framing that does not add up: a length prefix past the end (an
    // oversized record), half a prefix left over, a record shorter than
    // its tag. Nothing is decrypted, nothing moves.
    let mut past_end = three.clone();
    past_end[2 * r1..2 * r1 + 2].copy_from_slice(&22u16.to_be_bytes());
    let half_prefix = [&three[..], &[0][..]].concat();
    let short = vec![0, 15, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    for bad in [past_end, half_prefix, short, three[..r1 - 1].to_vec()] {
        assert_eq!(node.open(bad).unwrap_err(), OpenError::Malformed);
    }
    // "a blob with a missing last record": the first record alone is not
    // marked last, so it fails as the first record and nothing moves.
    assert_eq!(
        node.open(three[..r1].to_vec()).unwrap_err(),
        OpenError::Rejected
    );
    // Records swapped: the first one is not record 0 under this nonce.
    let swapped = [&three[r1..2 * r1], &three[..r1], &three[2 * r1..]].concat();
    assert_eq!(node.open(swapped).unwrap_err(), OpenError::Rejected);
    assert_eq!(node.open(three).unwrap(), vec![7u8; 2 * 65_519 + 5]);
}

#[test]
fn a_later_record_that_fails_closes_the_channel() {
    let (mut client, mut node) = Ends::new().pair();
    let three = client.seal(&vec![1u8; 2 * 65_519 + 5]).unwrap();
    let r1 = 2 + 65_519 + 16;
    // The last record is cut off: records 0 opens, record 1 is not marked
    // last and fails. The counter moved by one; the channel is out of sync.
    let e = node.open(three[..2 * r1].to_vec()).unwrap_err();
    assert_eq!(e, OpenError::Desynced);
    assert!(e.closes_channel());
    assert_eq!(e.code(), "e2e-channel-desynced");
    // It stays so: nothing opens or seals on it any more.
    assert_eq!(node.open(three).unwrap_err(), OpenError::Desynced);
    let next = client.seal(b"next").unwrap();
    assert_eq!(node.open(next).unwrap_err(), OpenError::Desynced);
    assert_eq!(node.seal(b"reply").unwrap_err(), SealError::Desynced);

    // An altered second record does the same.
    let (mut client, mut node) = Ends::new().pair();
    let mut two = client.seal(&vec![2u8; 65_520]).unwrap();
    let last = two.len() - 1;
    two[last] ^= 1;
    assert_eq!(node.open(two).unwrap_err(), OpenError::Desynced);
}

#[test]
fn the_identity_is_made_once_stored_0600_and_never_replaced() {
    let dir = TestDir::new("identity");
    let path = dir.join(IDENTITY_FILE);
    let first = identity::load_or_create(&dir.path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.len(), 45, "44 base64 characters and a newline");
    // A second start reads the same key; no temporary file is left.
    let again = identity::load_or_create(&dir.path).unwrap();
    assert_eq!(again.public(), first.public());
    assert_eq!(std::fs::read_dir(&dir.path).unwrap().count(), 1);
    // The key the node reports is the key its handshakes prove.
    let client = StaticKey::generate().unwrap();
    let reported = PublicKey::from_base64(&first.public().to_base64()).unwrap();
    let (init, msg1) = Initiator::start(&client, &reported, NODE, CHAN).unwrap();
    let accepted = respond(&again, NODE, CHAN, &msg1, &Gate::default()).unwrap();
    assert!(init.finish(&accepted.msg2).is_ok());

    // Readable by others: refused, not replaced.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = identity::load_or_create(&dir.path).unwrap_err();
    assert_eq!(e.code(), "e2e-identity-permissions");
    assert!(e.to_string().contains("chmod 600"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    // Not one key: refused, not replaced.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    for bad in ["", "short\n", &text[..44], &format!("{text}{text}")] {
        std::fs::write(&path, bad).unwrap();
        let e = identity::load_or_create(&dir.path).unwrap_err();
        assert_eq!(e.code(), "e2e-identity-malformed", "{bad:?}");
    }
    // A symbolic link is not followed.
    std::fs::remove_file(&path).unwrap();
    let elsewhere = dir.join("elsewhere");
    std::fs::write(&elsewhere, &text).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    assert_eq!(
        identity::load_or_create(&dir.path).unwrap_err().code(),
        "e2e-identity-io"
    );
}

#[test]
fn two_starts_at_once_end_with_one_identity() {
    let dir = TestDir::new("identrace");
    let keys: Vec<PublicKey> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| identity::load_or_create(&dir.path).unwrap().public()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
}

/// snow's X25519, but a marked private key's public key is the point 0 (of
/// order 1), which "agrees" on the all-zero secret with every key: a client
/// that claims such a static key authenticates nothing.
struct ZeroPoint {
    inner: Box<dyn snow::types::Dh>,
    zero: bool,
}

const ZERO_MARK: [u8; 32] = [0x42; 32];
static ZERO_POINT: [u8; 32] = [0; 32];

impl snow::types::Dh for ZeroPoint {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn pub_len(&self) -> usize {
        self.inner.pub_len()
    }
    fn priv_len(&self) -> usize {
        self.inner.priv_len()
    }
    fn set(&mut self, privkey: &[u8]) {
        self.zero = privkey == ZERO_MARK;
        self.inner.set(privkey);
    }
    fn generate(&mut self, rng: &mut dyn snow::types::Random) -> Result<(), snow::Error> {
        self.zero = false;
        self.inner.generate(rng)
    }
    fn pubkey(&self) -> &[u8] {
        if self.zero {
            &ZERO_POINT
        } else {
            self.inner.pubkey()
        }
    }
    fn privkey(&self) -> &[u8] {
        self.inner.privkey()
    }
    fn dh(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        if self.zero {
            out[..32].fill(0);
            Ok(())
        } else {
            self.inner.dh(pubkey, out)
        }
    }
}

struct ZeroPointResolver;

impl snow::resolvers::CryptoResolver for ZeroPointResolver {
    fn resolve_rng(&self) -> Option<Box<dyn snow::types::Random>> {
        snow::resolvers::RingResolver.resolve_rng()
    }
    fn resolve_dh(&self, choice: &snow::params::DHChoice) -> Option<Box<dyn snow::types::Dh>> {
        let inner = snow::resolvers::DefaultResolver.resolve_dh(choice)?;
        Some(Box::new(ZeroPoint { inner, zero: false }))
    }
    fn resolve_hash(
        &self,
        choice: &snow::params::HashChoice,
    ) -> Option<Box<dyn snow::types::Hash>> {
        snow::resolvers::DefaultResolver.resolve_hash(choice)
    }
    fn resolve_cipher(
        &self,
        choice: &snow::params::CipherChoice,
    ) -> Option<Box<dyn snow::types::Cipher>> {
        snow::resolvers::RingResolver.resolve_cipher(choice)
    }
}

#[test]
fn a_client_key_of_low_order_is_refused() {
    let ends = Ends::new();
    let node_pub = ends.node_key.public();
    let prologue = handshake::prologue(NODE, CHAN);
    let params = handshake::NOISE_PARAMS.parse().unwrap();
    let mut forged = snow::Builder::with_resolver(params, Box::new(ZeroPointResolver))
        .local_private_key(&ZERO_MARK)
        .and_then(|b| b.remote_public_key(node_pub.as_bytes()))
        .and_then(|b| b.prologue(prologue.as_bytes()))
        .and_then(|b| b.build_initiator())
        .unwrap();
    let mut msg1 = [0u8; 96];
    assert_eq!(forged.write_message(&[], &mut msg1).unwrap(), 96);
    // Message 1 authenticates (both sides computed the zero secret), and
    // only the key check refuses it.
    assert_eq!(
        code(ends.respond(&msg1, &Gate::default())),
        "e2e-key-low-order"
    );
}
