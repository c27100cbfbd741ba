//! Locked mode on the node through the real binary (issue 14; seed 004,
//! "Locked mode control"): `lock.*` on the unix socket, the state kept in
//! the ledger and the signer key file across a restart, the command line,
//! and the operator-only rule. The trust log's own rules are tested in
//! memory (tests/trustlog*.rs); here each method is driven as an
//! administrator would, and what it answers is checked against
//! vendor-schemas/daemon-socket/lock.schema.json.

mod schema_check;
mod util;

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use util::{Daemon, TestDir, bwrap_works, run_cli};

const SCHEMA: &str = "lock.schema.json";

fn schemas() -> schema_check::Schemas {
    schema_check::Schemas::load_dir("vendor-schemas/daemon-socket")
}

/// Calls `method` and checks the result against its schema.
fn call(s: &schema_check::Schemas, c: &mut util::Client, method: &str, p: Value) -> Value {
    let r = c.call(method, p.clone());
    s.check(SCHEMA, &format!("/$defs/{method}/params"), &p)
        .unwrap_or_else(|e| panic!("{e}"));
    s.check(SCHEMA, &format!("/$defs/{method}/result"), &r)
        .unwrap_or_else(|e| panic!("{e}"));
    r
}

/// The stable code of a call that must fail, its error checked too.
fn refused(s: &schema_check::Schemas, c: &mut util::Client, method: &str, p: Value) -> String {
    let r = c.request(method, p);
    s.check(SCHEMA, "/$defs/error", &r["error"])
        .unwrap_or_else(|e| panic!("{e}"));
    r["error"]["data"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("{method} did not fail: {r}"))
        .to_string()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn b64(b: &[u8]) -> String {
    omniconfluxd::e2ee::base64::encode(b)
}

fn unb64(v: &Value) -> Vec<u8> {
    omniconfluxd::e2ee::base64::decode(v.as_str().unwrap()).unwrap()
}

/// A fresh Ed25519 public key, as another signer or a device would have.
fn ed_key(seed: u8) -> Vec<u8> {
    ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
        .verifying_key()
        .to_bytes()
        .to_vec()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn an_administrator_runs_a_trust_log_through_its_life_and_a_restart_keeps_it() {
    let dir = TestDir::new("lock-life");
    let s = schemas();
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();

    // Before any log: off, but the signer key exists for lock.init.
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["enabled"], false, "{st}");
    let me = unb64(&st["signer_pubkey"]);
    assert_eq!(me.len(), 32);
    let key_file = d.state.join("lock-signer.key");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", key_file.display());
    let dev_a = ed_key(1);
    assert_eq!(
        refused(&s, &mut c, "lock.sign", json!({"device": b64(&dev_a)})),
        "lock-no-log"
    );

    // lock.init: this node's key by default, one disablement secret.
    let init = call(&s, &mut c, "lock.init", json!({"gen_disablements": 1}));
    assert_eq!(init["signer_count"], 1, "{init}");
    let secrets = strings(&init["disablement_secrets"]);
    assert_eq!(secrets.len(), 1, "{init}");
    assert_eq!(refused(&s, &mut c, "lock.init", json!({})), "lock-exists");
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["enabled"], true, "{st}");
    assert_eq!(st["signer_trusted"], true, "{st}");
    assert_eq!(st["pinned"], true, "{st}");
    assert_eq!(st["length"], 1, "{st}");
    assert_eq!(st["tip"], init["tip"], "{st}");
    // lock.init pins its new genesis: the genesis is the log's first entry.
    let log = call(&s, &mut c, "lock.log", json!({}));
    assert_eq!(st["pin_genesis"], log["entries"][0]["hash"], "{log}");
    let genesis = unb64(&st["pin_genesis"]);

    // Sign two devices, one in its text form; signing again changes nothing.
    let dev_b = ed_key(2);
    let r = call(
        &s,
        &mut c,
        "lock.sign",
        json!({"device": format!("devpub:{}", hex(&dev_a))}),
    );
    assert_eq!(r["changed"], true, "{r}");
    let again = call(&s, &mut c, "lock.sign", json!({"device": b64(&dev_a)}));
    assert_eq!(again, json!({"tip": r["tip"], "changed": false}));
    call(&s, &mut c, "lock.sign", json!({"device": b64(&dev_b)}));
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["device_count"], 2, "{st}");
    assert!(strings(&st["devices"]).contains(&b64(&dev_a)), "{st}");
    // A signer key where a device key belongs is refused by its prefix.
    assert_eq!(
        refused(
            &s,
            &mut c,
            "lock.sign",
            json!({"device": format!("sigpub:{}", hex(&dev_a))})
        ),
        "invalid-params"
    );
    assert_eq!(
        refused(&s, &mut c, "lock.sign", json!({"device": b64(&[7u8; 31])})),
        "invalid-params"
    );

    // Revoke one device.
    let r = call(&s, &mut c, "lock.revoke", json!({"device": b64(&dev_a)}));
    assert_eq!(r["changed"], true, "{r}");
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(strings(&st["devices"]), vec![b64(&dev_b)], "{st}");

    // Signers: add, add again, remove; the last signer stays.
    let other = ed_key(3);
    assert_eq!(
        call(&s, &mut c, "lock.addSigner", json!({"signer": b64(&other)}))["changed"],
        true
    );
    assert_eq!(
        call(&s, &mut c, "lock.addSigner", json!({"signer": b64(&other)}))["changed"],
        false
    );
    assert_eq!(
        call(
            &s,
            &mut c,
            "lock.removeSigner",
            json!({"signer": b64(&other)})
        )["changed"],
        true
    );
    assert_eq!(
        refused(&s, &mut c, "lock.removeSigner", json!({"signer": b64(&me)})),
        "lock-refused"
    );

    // Removing a signer takes the devices it authorized along: this node
    // authorized dev_b, another signer remains.
    call(&s, &mut c, "lock.addSigner", json!({"signer": b64(&other)}));
    call(&s, &mut c, "lock.removeSigner", json!({"signer": b64(&me)}));
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["device_count"], 0, "{st}");
    assert_eq!(strings(&st["signers"]), vec![b64(&other)], "{st}");
    assert_eq!(st["signer_trusted"], false, "{st}");
    // No longer a signer, this node can sign nothing.
    let r = c.request("lock.sign", json!({"device": b64(&dev_a)}));
    assert_eq!(r["error"]["data"]["code"], "lock-refused", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a trusted signer"),
        "{r}"
    );

    // Pin and unpin, with the gen: text form.
    call(&s, &mut c, "lock.unpin", json!({}));
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["pinned"], false, "{st}");
    assert!(st.get("pin_genesis").is_none(), "{st}");
    call(
        &s,
        &mut c,
        "lock.pin",
        json!({"genesis": format!("gen:{}", hex(&genesis))}),
    );
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["pin_genesis"], json!(b64(&genesis)), "{st}");

    // Local disable.
    call(&s, &mut c, "lock.localDisable", json!({}));
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["local_disabled"], true, "{st}");

    // Disable: a wrong secret is refused, the right one disables for good;
    // it needs no trusted signer, only this node's key.
    let wrong = format!("dis:{}", hex(&[9u8; 32]));
    let r = c.request("lock.disable", json!({"secret": wrong}));
    assert_eq!(r["error"]["data"]["code"], "lock-refused", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disablement secret"),
        "{r}"
    );
    assert_eq!(
        call(&s, &mut c, "lock.status", json!({}))["disabled"],
        false
    );
    let r = call(&s, &mut c, "lock.disable", json!({"secret": secrets[0]}));
    assert_eq!(r["disabled"], true, "{r}");
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["disabled"], true, "{st}");
    assert_eq!(st["tip"], r["tip"], "{st}");
    let log = call(&s, &mut c, "lock.log", json!({}));
    let kinds: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "genesis",
            "authorize-device",
            "authorize-device",
            "revoke-device",
            "add-signer",
            "remove-signer",
            "add-signer",
            "remove-signer",
            "disable"
        ]
    );
    assert_eq!(log["entries"][1]["target"], json!(b64(&dev_a)), "{log}");
    assert_eq!(log["tip"], r["tip"], "{log}");

    // A restart keeps everything, read back from the ledger and the key file.
    drop(c);
    d.stop();
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    let after = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(after, st, "the state after a restart");
    assert_eq!(call(&s, &mut c, "lock.log", json!({})), log);

    // The command line shows the same in text forms.
    let sock = d.socket.display().to_string();
    let (code, out, err) = run_cli(&["--socket", &sock, "lock", "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("sigpub:{}", hex(&me))), "{out}");
    assert!(out.contains(&format!("gen:{}", hex(&genesis))), "{out}");
    assert!(out.contains("the trust log is disabled"), "{out}");
    let (code, out, _) = run_cli(&["--socket", &sock, "lock", "log"]);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("devpub:{}", hex(&dev_a))), "{out}");
    let (code, _, err) = run_cli(&["--socket", &sock, "lock", "init"]);
    assert_eq!(code, 1);
    assert!(err.contains("lock-exists"), "{err}");
    d.stop();
}

#[test]
fn the_command_line_initialises_signs_and_pins() {
    let dir = TestDir::new("lock-cli");
    let d = Daemon::start(&dir.path);
    let sock = d.socket.display().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["--socket", &sock, "lock"];
        all.extend_from_slice(args);
        let (code, out, err) = run_cli(&all);
        assert_eq!(code, 0, "lock {args:?}: {err}");
        out
    };
    let dev = format!("devpub:{}", hex(&ed_key(4)));
    let out = cli(&["init", "--device", &dev, "--disablements", "2"]);
    assert!(out.starts_with("tip:"), "{out}");
    assert_eq!(out.matches("  dis:").count(), 2, "{out}");
    let st: Value = serde_json::from_str(&cli(&["--json", "status"])).unwrap();
    assert_eq!(st["length"], 2, "{st}");
    assert_eq!(st["device_count"], 1, "{st}");
    let out = cli(&["sign", &dev]);
    assert!(out.contains("already so"), "{out}");
    let out = cli(&["revoke", &dev]);
    assert!(out.ends_with("(changed)\n"), "{out}");
    cli(&["local-disable"]);
    let gen_text = format!("gen:{}", hex(&unb64(&st["pin_genesis"])));
    cli(&["pin", &gen_text]);
    let st: Value = serde_json::from_str(&cli(&["--json", "status"])).unwrap();
    // lock.pin ends a local disable.
    assert_eq!(st["local_disabled"], false, "{st}");
    let (code, _, err) = run_cli(&["--socket", &sock, "lock", "sign", "devpub:12"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("invalid-params"), "{err}");
    d.stop();
}

#[test]
fn the_revoke_signer_ceremony_needs_more_cosigners_than_revoked_keys() {
    let dir = TestDir::new("lock-rvk");
    let s = schemas();
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    let other = ed_key(5);
    let me = unb64(&call(&s, &mut c, "lock.status", json!({}))["signer_pubkey"]);
    call(
        &s,
        &mut c,
        "lock.init",
        json!({"signers": [b64(&me), b64(&other)]}),
    );
    let tip = call(&s, &mut c, "lock.status", json!({}))["tip"].clone();
    let start = call(
        &s,
        &mut c,
        "lock.revokeSignerStart",
        json!({"revoked": [format!("sigpub:{}", hex(&other))]}),
    );
    // The blob forks at the tip (the revoked key signed nothing) and holds
    // this node's co-sign; this node cannot co-sign twice, and one co-sign
    // does not revoke one key.
    assert_eq!(
        refused(
            &s,
            &mut c,
            "lock.revokeSignerCosign",
            json!({"blob": start["blob"]})
        ),
        "lock-refused"
    );
    let r = c.request("lock.revokeSignerFinish", json!({"blob": start["blob"]}));
    assert_eq!(r["error"]["data"]["code"], "lock-refused", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 counted co-signers, 2 needed"),
        "{r}"
    );
    assert_eq!(
        refused(
            &s,
            &mut c,
            "lock.revokeSignerFinish",
            json!({"blob": "AAAA"})
        ),
        "invalid-params"
    );
    // Nothing changed.
    assert_eq!(call(&s, &mut c, "lock.status", json!({}))["tip"], tip);
    d.stop();
}

/// A caller in another pid namespace cannot be verified as the operator
/// (omniconfluxd(8), CALLERS): every lock method refuses it, the status
/// too, since the log decides who reaches every session of the node.
#[test]
fn lock_methods_refuse_a_caller_that_is_not_the_operator() {
    if !bwrap_works() {
        return;
    }
    let dir = TestDir::new("lock-op");
    let d = Daemon::start(&dir.path);
    let script = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
out = {}
for i, m in enumerate(["lock.status", "lock.init", "lock.localDisable", "lock.log"]):
    f.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": {}}) + "\n")
    f.flush()
    out[m] = json.loads(f.readline())
print(json.dumps(out))
"#;
    let out = Command::new("bwrap")
        .args(["--dev-bind", "/", "/", "--unshare-pid", "--die-with-parent"])
        .args(["python3", "-c", script])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    for m in ["lock.status", "lock.init", "lock.localDisable", "lock.log"] {
        assert_eq!(
            seen[m]["error"]["data"]["code"], "operator-only",
            "{m}: {seen}"
        );
    }
    // Nothing changed for the operator.
    let st = d.connect().call("lock.status", json!({}));
    assert_eq!(st["enabled"], false, "{st}");
    assert_eq!(st["local_disabled"], false, "{st}");
    d.stop();
}

/// A stored log that no longer verifies (the ledger edited behind the
/// daemon's back) is not used: the node starts quarantined, and the
/// operator's pin ends the quarantine and drops the entries.
#[test]
fn a_stored_log_that_does_not_verify_quarantines_the_node() {
    let dir = TestDir::new("lock-tamp");
    let s = schemas();
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    call(&s, &mut c, "lock.init", json!({}));
    call(&s, &mut c, "lock.sign", json!({"device": b64(&ed_key(6))}));
    let genesis = call(&s, &mut c, "lock.status", json!({}))["pin_genesis"].clone();
    drop(c);
    d.stop();
    // Flip the last byte of the device entry's signature.
    let ledger = dir.join("state/ledger.sqlite3");
    let py = "import sqlite3, sys\n\
        c = sqlite3.connect(sys.argv[1])\n\
        w = bytearray(c.execute('SELECT wire FROM trustlog_entries WHERE idx = 1').fetchone()[0])\n\
        w[-1] ^= 1\n\
        c.execute('UPDATE trustlog_entries SET wire = ? WHERE idx = 1', (bytes(w),))\n\
        c.commit()\n";
    let out = Command::new("python3")
        .args(["-c", py])
        .arg(&ledger)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["quarantined"], true, "{st}");
    assert!(st.get("tip").is_none(), "{st}");
    d.wait_log("the stored trust log is not used");
    assert_eq!(
        refused(&s, &mut c, "lock.sign", json!({"device": b64(&ed_key(7))})),
        "lock-no-log"
    );
    call(&s, &mut c, "lock.pin", json!({"genesis": genesis}));
    let st = call(&s, &mut c, "lock.status", json!({}));
    assert_eq!(st["quarantined"], false, "{st}");
    assert_eq!(st["enabled"], true, "{st}");
    // The pin dropped the entries that did not verify: the next start is
    // pinned, holds no log, and is not quarantined again.
    drop(c);
    d.stop();
    let d = Daemon::start(&dir.path);
    let st = d.connect().call("lock.status", json!({}));
    assert_eq!(st["quarantined"], false, "{st}");
    assert_eq!(st["pin_genesis"], genesis, "{st}");
    assert!(st.get("tip").is_none(), "{st}");
    d.stop();
}

/// The revoke-signer ceremony across two nodes: node A starts it, node B
/// (which holds the same log, copied into its ledger as a sync would
/// bring it) co-signs, A finishes, and the revoked key is no signer.
#[test]
fn two_nodes_revoke_a_lost_signer_together() {
    let (dir_a, dir_b) = (TestDir::new("lock-cer-a"), TestDir::new("lock-cer-b"));
    let s = schemas();
    let a = Daemon::start(&dir_a.path);
    let b = Daemon::start(&dir_b.path);
    let mut ca = a.connect();
    let key_a = call(&s, &mut ca, "lock.status", json!({}))["signer_pubkey"].clone();
    let key_b = call(&s, &mut b.connect(), "lock.status", json!({}))["signer_pubkey"].clone();
    let lost = b64(&ed_key(8));
    // lock.init needs this node's own key among the signers.
    let r = ca.request("lock.init", json!({"signers": [key_b, lost]}));
    assert_eq!(r["error"]["data"]["code"], "invalid-params", "{r}");
    call(
        &s,
        &mut ca,
        "lock.init",
        json!({"signers": [key_a, key_b, lost]}),
    );
    call(&s, &mut ca, "lock.sign", json!({"device": b64(&ed_key(9))}));
    let tip = call(&s, &mut ca, "lock.status", json!({}))["tip"].clone();
    b.stop();
    let py = "import sqlite3, sys\n\
        a = sqlite3.connect(sys.argv[1]); b = sqlite3.connect(sys.argv[2])\n\
        b.executemany('INSERT INTO trustlog_entries (idx, hash, wire) VALUES (?, ?, ?)',\n\
            a.execute('SELECT idx, hash, wire FROM trustlog_entries ORDER BY idx').fetchall())\n\
        b.commit()\n";
    let out = Command::new("python3")
        .args(["-c", py])
        .arg(dir_a.join("state/ledger.sqlite3"))
        .arg(dir_b.join("state/ledger.sqlite3"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = Daemon::start(&dir_b.path);
    let mut cb = b.connect();
    assert_eq!(call(&s, &mut cb, "lock.status", json!({}))["tip"], tip);

    let start = call(
        &s,
        &mut ca,
        "lock.revokeSignerStart",
        json!({"revoked": [lost]}),
    );
    let cosigned = call(
        &s,
        &mut cb,
        "lock.revokeSignerCosign",
        json!({"blob": start["blob"]}),
    );
    let done = call(
        &s,
        &mut ca,
        "lock.revokeSignerFinish",
        json!({"blob": cosigned["blob"]}),
    );
    let st = call(&s, &mut ca, "lock.status", json!({}));
    assert_eq!(st["tip"], done["tip"], "{st}");
    let signers = strings(&st["signers"]);
    assert_eq!(signers.len(), 2, "{st}");
    assert!(!signers.contains(&lost), "{st}");
    let log = call(&s, &mut ca, "lock.log", json!({}));
    let last = log["entries"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["kind"], "revoke-signer", "{log}");
    assert_eq!(last["cosign_count"], 2, "{log}");
    assert_eq!(strings(&last["revoked"]), vec![lost], "{log}");
    // The same blob cannot be appended twice.
    // The fork is what the ledger keeps: a restart reads the same log.
    drop(ca);
    a.stop();
    let a = Daemon::start(&dir_a.path);
    let mut ca = a.connect();
    assert_eq!(call(&s, &mut ca, "lock.log", json!({})), log);
    let again = ca.request("lock.revokeSignerFinish", json!({"blob": cosigned["blob"]}));
    assert_eq!(again["error"]["data"]["code"], "lock-refused", "{again}");
    assert_eq!(
        again["error"]["message"], "the revoke-signer entry is in the log already",
        "{again}"
    );
    a.stop();
    b.stop();
}

/// Operations sent together run one at a time, each against the tip the
/// one before it committed: twenty pipelined signatures make twenty
/// entries in a row, none refused for extending a stale tip.
#[test]
fn pipelined_operations_each_extend_the_tip_before_them() {
    let dir = TestDir::new("lock-pipe");
    let d = Daemon::start(&dir.path);
    let mut c = d.connect();
    c.call("lock.init", json!({}));
    let mut batch = String::new();
    for i in 0..20u8 {
        let req = json!({"jsonrpc": "2.0", "id": 100 + u32::from(i), "method": "lock.sign",
            "params": {"device": b64(&ed_key(20 + i))}});
        batch.push_str(&format!("{req}\n"));
    }
    c.send_raw(batch.as_bytes());
    let mut tips = std::collections::HashSet::new();
    for _ in 0..20 {
        let r = c.read_line().expect("an answer");
        assert_eq!(r["result"]["changed"], true, "{r}");
        tips.insert(r["result"]["tip"].as_str().unwrap().to_string());
    }
    assert_eq!(tips.len(), 20);
    let st = c.call("lock.status", json!({}));
    assert_eq!(st["length"], 21, "{st}");
    assert_eq!(st["device_count"], 20, "{st}");
    d.stop();
}
