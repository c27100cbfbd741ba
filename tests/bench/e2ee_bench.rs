//! Issue 13's E2EE figures, on src/e2ee/ in this process (no daemon: the
//! core does no I/O, so its cost is CPU alone).
//!
//! - `e2ee_seal_open_{64b,1k,64k}_vs_ring`: one message sealed by a client
//!   channel and opened by the node's, through the crate's `Channel::seal`
//!   and `Channel::open` (records, associated data, counters, the
//!   allocation of each blob), in MB of message a CPU-second. Baseline, in
//!   the same rounds: a bare loop over ring's ChaCha20-Poly1305 (the very
//!   primitive the records use) sealing and opening one buffer of the same
//!   size in place, with no framing or allocation. Goal at 64 KiB: a
//!   ratio of at least 0.5. A 64 KiB message is two records (65519 + 17 bytes), so the
//!   figure includes the record split. Also reported, when `openssl` is
//!   there: `openssl speed -evp chacha20-poly1305 -bytes N` (encryption
//!   alone, CPU time) halved as `openssl_seal_open_mbps` (ChaCha20 and
//!   Poly1305 do the same work to open as to seal) and `ratio_to_openssl`.
//! - `e2ee_handshakes_per_s`: complete Noise IK handshakes (initiator's
//!   message 1, the node's `respond`, the initiator's finish) a CPU-second
//!   on one core, both ends in this thread. Goal >= 1,000.
//!
//! Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), as openssl
//! speed counts user time: on a shared 2-core machine wall time would
//! measure the other processes. The thread runs on core 0.

use omniconfluxd::e2ee::{Admission, Channel, Initiator, PublicKey, StaticKey, respond};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::util::{self, Figure, Proc, TempDir};

pub const HANDSHAKES: &str = "e2ee_handshakes_per_s";

/// (figure, message size)
const SIZES: [(&str, usize); 3] = [
    ("e2ee_seal_open_64b_vs_ring", 64),
    ("e2ee_seal_open_1k_vs_ring", 1024),
    ("e2ee_seal_open_64k_vs_ring", 64 * 1024),
];

pub fn run() {
    let cpu = util::placements().first().map(|p| p.server_cpu());
    let go = || {
        for (figure, size) in SIZES {
            if util::selected(figure) {
                if let Err(e) = seal_open(figure, size) {
                    util::skipped(figure, None, &format!("error: {e}"));
                }
            }
        }
        if util::selected(HANDSHAKES) {
            handshakes();
        }
    };
    match cpu {
        Some(c) => util::on_cpu(c, go),
        None => go(),
    }
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `step` until `budget` of CPU time is spent; returns steps per
/// CPU-second.
fn rate(budget: Duration, mut step: impl FnMut()) -> f64 {
    let t0 = thread_cpu();
    let mut n = 0u64;
    loop {
        // Check the clock every few steps only: a step may take 100 ns.
        for _ in 0..16 {
            step();
        }
        n += 16;
        let spent = thread_cpu() - t0;
        if spent >= budget {
            return n as f64 / spent.as_secs_f64();
        }
    }
}

fn budget() -> Duration {
    Duration::from_millis(if util::quick() { 100 } else { 300 })
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

/// A client channel and the node channel it talks to.
fn pair() -> Result<(Channel, Channel), String> {
    let node = StaticKey::generate().map_err(|e| e.to_string())?;
    let client = StaticKey::generate().map_err(|e| e.to_string())?;
    let (init, msg1) =
        Initiator::start(&client, &node.public(), "bench", "c1").map_err(|e| e.to_string())?;
    let accepted = respond(&node, "bench", "c1", &msg1, &Open).map_err(|e| e.to_string())?;
    let ours = init.finish(&accepted.msg2).map_err(|e| e.to_string())?;
    Ok((ours, accepted.channel))
}

fn seal_open(figure: &str, size: usize) -> Result<(), String> {
    let rounds = util::rounds(5, 2);
    let message: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let (mut client, mut node) = pair()?;
    // A channel has 2^64 nonces; a failed open here is a defect, not noise.
    let mut failed = false;
    let mut ours = || match client.seal(&message).map(|b| node.open(b)) {
        Ok(Ok(m)) if m.len() == size => {}
        _ => failed = true,
    };
    let key = LessSafeKey::new(
        UnboundKey::new(&CHACHA20_POLY1305, &[7u8; 32]).map_err(|_| "ring refused a key")?,
    );
    let mut buf = Vec::with_capacity(size + 16);
    let mut counter = 0u64;
    let mut bare = || {
        buf.clear();
        buf.extend_from_slice(&message);
        let ad = [0, 0, 0, 0, 1];
        let sealed = key.seal_in_place_append_tag(nonce(counter), Aad::from(ad), &mut buf);
        let opened =
            sealed.and_then(|()| key.open_in_place(nonce(counter), Aad::from(ad), &mut buf));
        std::hint::black_box(opened.map(|p| p.len()).ok());
        counter += 1;
    };
    let mb = size as f64 / 1e6;
    // Warm both loops (caches, the allocator's free lists).
    rate(budget() / 3, &mut ours);
    rate(budget() / 3, &mut bare);
    let (mut v, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        v.push(rate(budget(), &mut ours) * mb);
        b.push(rate(budget(), &mut bare) * mb);
    }
    if failed {
        return Err("a sealed message did not open".into());
    }
    let (value, base) = (util::median(&v), util::median(&b));
    let ratio = value / base;
    let gated = size == 64 * 1024;
    let mut extra = vec![
        ("message_bytes", json!(size)),
        (
            "records",
            json!(
                size.div_ceil(omniconfluxd::limits::E2EE_RECORD_MAX_PLAINTEXT)
                    .max(1)
            ),
        ),
        ("value_spread", util::round3(util::spread(&v))),
        ("baseline_spread", util::round3(util::spread(&b))),
    ];
    match openssl_mbps(size, rounds) {
        Ok(enc) => {
            let both = enc / 2.0;
            extra.push(("openssl_encrypt_mbps", util::round3(enc)));
            extra.push(("openssl_seal_open_mbps", util::round3(both)));
            extra.push(("ratio_to_openssl", util::round3(value / both)));
        }
        Err(e) => extra.push(("openssl", Value::from(e))),
    }
    Figure {
        name: figure,
        placement: None,
        value,
        baseline: Some(base),
        baseline_of: "a bare loop over ring's ChaCha20-Poly1305 sealing and opening the same bytes in place",
        ratio: Some(ratio),
        better: "higher",
        goal: if gated {
            json!("ratio >= 0.5")
        } else {
            json!("report")
        },
        unit: "MB/s (message bytes sealed and opened a CPU-second)",
        pass: !gated || ratio >= 0.5,
        rounds,
        extra,
    }
    .emit();
    Ok(())
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The median of `rounds` runs of `openssl speed` on `size`-byte buffers,
/// MB/s of encryption (its own CPU-time rate).
fn openssl_mbps(size: usize, rounds: usize) -> Result<f64, String> {
    let openssl = util::find_tool("openssl").ok_or("openssl not found; apt-get install openssl")?;
    let tmp = TempDir::new("e2ee-openssl");
    let mut rates = Vec::new();
    for r in 0..rounds {
        let out = tmp.path().join(format!("speed-{r}"));
        rates.push(openssl_once(&openssl, size, &out)? / 1e6);
    }
    Ok(util::median(&rates))
}

fn openssl_once(openssl: &Path, size: usize, out: &Path) -> Result<f64, String> {
    let mut cmd = Command::new(openssl);
    cmd.args(["speed", "-evp", "chacha20-poly1305", "-seconds", "1", "-mr"])
        .arg("-bytes")
        .arg(size.to_string());
    let mut p = Proc::spawn("openssl", cmd, Some(0), Some(out)).map_err(|e| e.to_string())?;
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !p.exited() {
        if std::time::Instant::now() >= end {
            return Err("openssl speed ran past 30 s".into());
        }
        std::thread::sleep(util::PROBE_INTERVAL);
    }
    let text = std::fs::read_to_string(out).map_err(|e| e.to_string())?;
    // "+F:<n>:ChaCha20-Poly1305:<bytes per second>" in -mr output.
    text.lines()
        .find(|l| l.starts_with("+F:"))
        .and_then(|l| l.rsplit(':').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no +F line in openssl speed's output: {}", text.trim()))
}

fn handshakes() {
    let rounds = util::rounds(5, 2);
    let node = StaticKey::generate();
    let client = StaticKey::generate();
    let (Ok(node), Ok(client)) = (node, client) else {
        util::skipped(HANDSHAKES, None, "no key could be generated");
        return;
    };
    let node_pub = node.public();
    let mut failed = false;
    let mut one = || {
        let done = Initiator::start(&client, &node_pub, "bench", "c1").and_then(|(init, msg1)| {
            let accepted = respond(&node, "bench", "c1", &msg1, &Open)?;
            init.finish(&accepted.msg2)
        });
        failed |= done.is_err();
    };
    rate(budget() / 3, &mut one);
    let per_s: Vec<f64> = (0..rounds).map(|_| rate(budget(), &mut one)).collect();
    if failed {
        util::skipped(HANDSHAKES, None, "error: a handshake failed");
        return;
    }
    let value = util::median(&per_s);
    Figure {
        name: HANDSHAKES,
        placement: None,
        value,
        baseline: None,
        baseline_of: "",
        ratio: Some(value / 1000.0),
        better: "higher",
        goal: json!(">= 1000"),
        unit: "handshakes a CPU-second (initiator and responder in one thread)",
        pass: value >= 1000.0,
        rounds,
        extra: vec![
            ("us_per_handshake", util::round3(1e6 / value)),
            ("value_spread", util::round3(util::spread(&per_s))),
        ],
    }
    .emit();
}
