//! src/e2ee/ against a Noise implementation no one on the team wrote (issue
//! 13, Interop): PyPI noiseprotocol in tests/fixtures/noise_peer.py, driven
//! over its stdin and stdout, as the node (our client end initiates) and as
//! the client (our node end responds). Both directions carry sealed bodies:
//! empty, small, exactly one full record, and several records, so that the
//! prologue, the split's order, the nonce layout, the records' associated
//! data and the empty-message rule all have to agree byte for byte.
//!
//! The venv comes from tests/fixtures/install-noiseprotocol.sh (.ci/run's
//! step noiseprotocol); without it the test stops early, or fails under CI
//! (tests/util/need.rs).

mod util;

use omniconfluxd::e2ee::{
    Admission, Channel, HandshakeError, Initiator, PublicKey, StaticKey, base64, respond,
};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use util::PATIENCE;

const NODE: &str = "home";
const CHAN: &str = "c7";

/// The python3 of the venv install-noiseprotocol.sh makes.
fn noise_python() -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(".."));
    let python = target.join("noiseprotocol/bin/python3");
    if python.exists() {
        Ok(python)
    } else {
        Err(format!(
            "noiseprotocol's venv is not in {}",
            python.display()
        ))
    }
}

const INSTALL: &str = "PyPI noiseprotocol: sh tests/fixtures/install-noiseprotocol.sh (needs the Debian package python3-venv)";

/// noise_peer.py, one line in and one line out; killed when dropped.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    fn start(python: &PathBuf, args: &[&str]) -> Peer {
        let mut child = Command::new(python)
            .arg(util::fixture("noise_peer.py"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start noise_peer.py");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Peer {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to noise_peer.py");
        self.stdin.flush().expect("flush");
    }

    /// The next line's words; fails the test if the peer says nothing.
    fn expect(&mut self, word: &str) -> Vec<String> {
        let line = self
            .lines
            .recv_timeout(PATIENCE)
            .expect("noise_peer.py answered nothing");
        let mut words = line.split(' ').map(str::to_string);
        assert_eq!(
            words.next().as_deref(),
            Some(word),
            "noise_peer.py said {line:?}"
        );
        words.collect()
    }

    /// A body sealed by the peer.
    fn seal(&mut self, message: &[u8]) -> String {
        self.send(&format!("seal {}", base64::encode(message)));
        self.expect("sealed").remove(0)
    }

    /// What the peer opened from `body`, or the word `rejected`.
    fn open(&mut self, body: &str) -> Result<Vec<u8>, String> {
        self.send(&format!("open {body}"));
        let line = self
            .lines
            .recv_timeout(PATIENCE)
            .expect("noise_peer.py answered nothing");
        match line.split_once(' ') {
            Some(("opened", m)) => Ok(base64::decode(m).expect("base64 from noise_peer.py")),
            _ => Err(line),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Open;

impl Admission for Open {
    fn channel_exists(&self, _: &str) -> bool {
        false
    }
    fn quarantined(&self) -> bool {
        false
    }
    fn authorizes(&self, _: &PublicKey) -> bool {
        true
    }
}

/// Messages that exercise every rule of the record layer.
fn messages() -> Vec<Vec<u8>> {
    vec![
        b"".to_vec(),
        br#"{"jsonrpc":"2.0","id":1,"method":"sessions.list"}"#.to_vec(),
        vec![b'a'; 65_519],
        (0..200_000u32).map(|i| (i % 253) as u8).collect(),
    ]
}

/// Sealed bodies both ways, interleaved, between our channel and the peer.
fn exchange(ours: &mut Channel, peer: &mut Peer) {
    for m in messages() {
        let body = ours.seal_body(&m).unwrap();
        assert_eq!(
            peer.open(&body),
            Ok(m.clone()),
            "{} bytes to the peer",
            m.len()
        );
        let back = peer.seal(&m);
        assert_eq!(
            base64::decode(&back).map(|b| b.len()),
            base64::decode(&body).map(|b| b.len()),
            "the same records for {} bytes",
            m.len()
        );
        assert_eq!(
            ours.open_body(&back).unwrap(),
            m,
            "{} bytes from the peer",
            m.len()
        );
    }
    // A body the peer opened already does not open twice there: the nonce
    // order holds on its side too.
    let body = ours.seal_body(b"once").unwrap();
    assert_eq!(peer.open(&body), Ok(b"once".to_vec()));
    assert!(peer.open(&body).is_err());
}

#[test]
fn our_client_end_with_a_noiseprotocol_node() {
    let Some(python) = util::need::have(noise_python(), INSTALL) else {
        return;
    };
    let mut node = Peer::start(&python, &["responder", NODE, CHAN]);
    let node_key = PublicKey::from_base64(&node.expect("pubkey")[0]).unwrap();
    let client = StaticKey::generate().unwrap();
    let (init, msg1) = Initiator::start(&client, &node_key, NODE, CHAN).unwrap();
    node.send(&format!("msg1 {}", base64::encode(&msg1)));
    let answer = node.expect("msg2");
    // The node read our static key out of message 1.
    assert_eq!(answer[1], client.public().to_base64());
    let msg2 = base64::decode(&answer[0]).unwrap();
    assert_eq!(msg2.len(), 48);
    let mut channel = init.finish(&msg2).unwrap();
    assert_eq!(channel.peer(), node_key);
    exchange(&mut channel, &mut node);
}

#[test]
fn our_node_end_with_a_noiseprotocol_client() {
    let Some(python) = util::need::have(noise_python(), INSTALL) else {
        return;
    };
    let identity = StaticKey::generate().unwrap();
    let pubkey = identity.public().to_base64();
    let mut client = Peer::start(&python, &["initiator", NODE, CHAN, &pubkey]);
    let hello = client.expect("msg1");
    let msg1 = base64::decode(&hello[0]).unwrap();
    assert_eq!(msg1.len(), 96);
    let accepted = respond(&identity, NODE, CHAN, &msg1, &Open).unwrap();
    // The channel names the client by the key it holds.
    assert_eq!(accepted.channel.peer().to_base64(), hello[1]);
    client.send(&format!("msg2 {}", base64::encode(&accepted.msg2)));
    client.expect("ready");
    let mut channel = accepted.channel;
    exchange(&mut channel, &mut client);
}

#[test]
fn a_noiseprotocol_client_on_another_channel_is_dropped() {
    let Some(python) = util::need::have(noise_python(), INSTALL) else {
        return;
    };
    let identity = StaticKey::generate().unwrap();
    let pubkey = identity.public().to_base64();
    // The client built its prologue for c8; the gateway delivered it on c7.
    let mut client = Peer::start(&python, &["initiator", NODE, "c8", &pubkey]);
    let msg1 = base64::decode(&client.expect("msg1")[0]).unwrap();
    let refused = respond(&identity, NODE, CHAN, &msg1, &Open);
    assert!(
        matches!(refused, Err(HandshakeError::Rejected)),
        "{refused:?}"
    );
    // And a node with another identity cannot read it on the right one.
    let other = StaticKey::generate().unwrap();
    let refused = respond(&other, NODE, "c8", &msg1, &Open);
    assert!(
        matches!(refused, Err(HandshakeError::Rejected)),
        "{refused:?}"
    );
    assert!(respond(&identity, NODE, "c8", &msg1, &Open).is_ok());
}
