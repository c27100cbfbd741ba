#!/usr/bin/env python3
"""Captures the gateway exchanges shown in omniconfluxd(8), GATEWAY, from the
real binary: `omniconfluxd gateway` on a free port, a fake node on /node and
clients on /client, speaking WebSocket with the standard library only.

usage: man/capture-gateway.py path/to/omniconfluxd
Prints `> sent` and `< received` lines per method."""

import base64, hashlib, json, os, re, socket, struct, subprocess, sys, tempfile

BIN = sys.argv[1]
MASTER = "m" * 64


class Ws:
    def __init__(self, port, path, token):
        self.s = socket.create_connection(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(
            (f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
             f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
             f"Sec-WebSocket-Key: {key}\r\nAuthorization: Bearer {token}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.s.recv(1)
        self.status = int(head.split()[1])
        self.buf = b""
        self.lines = []

    def send(self, obj):
        line = json.dumps(obj, separators=(",", ":"))
        print("> " + line)
        data = (line + "\n").encode()
        mask = os.urandom(4)
        n = len(data)
        hdr = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
        self.s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self, show=True):
        while not self.lines:
            h = self._read(2)
            n = h[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            self.buf += self._read(n)
            *done, self.buf = self.buf.split(b"\n")
            self.lines += [l for l in done if l.strip()]
        line = self.lines.pop(0).decode()
        if show:
            print("< " + line)
        return json.loads(line)

    def _read(self, n):
        out = b""
        while len(out) < n:
            c = self.s.recv(n - len(out))
            if not c:
                raise EOFError
            out += c
        return out


def field(b):
    return struct.pack(">I", len(b)) + b


def genesis_entry():
    """A genesis of one signer, in wire form (seed 004, Entry encoding),
    signed with a fixed key so that the capture is repeatable."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    k = Ed25519PrivateKey.from_private_bytes(b"\x01" * 32)
    pub = k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    signed = (bytes([1]) + field(b"") + struct.pack(">I", 1) + field(pub)
              + struct.pack(">I", 0) + field(b"") + field(pub))
    return signed + field(k.sign(signed))


def section(name):
    print(f"\n.B {name}")


with tempfile.TemporaryDirectory() as d:
    env = dict(os.environ, OMNICONFLUX_GATEWAY_TOKEN=MASTER)
    p = subprocess.Popen(
        [BIN, "--state-dir", d + "/state", "--socket", d + "/run/s.sock", "--config", "/dev/null",
         "gateway", "--listen", "127.0.0.1:0"],
        env=env, stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"gateway listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    admin = Ws(port, "/client", MASTER)
    node = Ws(port, "/node", MASTER)
    section("node.identify (the gateway asks each uplink)")
    req = node.recv()
    node.send({"jsonrpc": "2.0", "id": req["id"], "result": {
        "id": "home", "label": "home", "version": "0.1.0",
        "capabilities": {"spawn_session": True, "terminal": False, "host_wakelock": False},
        "identity_pubkey": "q2Xh0h3Zq0m0b0Vd8S3cJvYl6v0zYbQf1Q1mN7sKpG0="}})
    section("node.event")
    admin.recv()
    section("ping")
    admin.send({"jsonrpc": "2.0", "id": 1, "method": "ping"}); admin.recv()
    section("server.info")
    admin.send({"jsonrpc": "2.0", "id": 2, "method": "server.info"}); admin.recv()
    section("nodes.list")
    admin.send({"jsonrpc": "2.0", "id": 3, "method": "nodes.list"}); admin.recv()
    section("relay.open")
    admin.send({"jsonrpc": "2.0", "id": 4, "method": "relay.open", "params": {"node_id": "home"}})
    chan = admin.recv()["result"]["chan_id"]
    admin.send({"jsonrpc": "2.0", "id": 5, "method": "relay.open", "params": {"node_id": "away"}}); admin.recv()
    section("a relay frame, client to node and back")
    body = base64.b64encode(b"{}").decode()
    admin.send({"jsonrpc": "2.0", "id": 6, "method": "sessions.list",
                "route": {"chan_id": chan, "node_id": "home"}, "body": body})
    node.recv()
    node.send({"jsonrpc": "2.0", "id": 6, "route": {"chan_id": chan},
               "body": base64.b64encode(b'{"result":[]}').decode()})
    admin.recv()
    section("relay.close, and relay.closed to the node")
    admin.send({"jsonrpc": "2.0", "id": 7, "method": "relay.close", "params": {"chan_id": chan}}); admin.recv()
    node.recv()
    section("clients.pairStart")
    admin.send({"jsonrpc": "2.0", "id": 8, "method": "clients.pairStart"})
    tok = admin.recv()["result"]["token"]
    section("clients.pairAwait")
    admin.send({"jsonrpc": "2.0", "id": 9, "method": "clients.pairAwait", "params": {"token": tok}})
    device = Ws(port, "/client", tok)
    admin.recv()
    section("clients.list")
    admin.send({"jsonrpc": "2.0", "id": 10, "method": "clients.list"}); admin.recv()
    section("unauthorized (a device calls clients.list)")
    device.recv(show=False)
    device.send({"jsonrpc": "2.0", "id": 1, "method": "clients.list"}); device.recv()
    section("clients.remove")
    admin.send({"jsonrpc": "2.0", "id": 11, "method": "clients.remove",
                "params": {"token": hashlib.sha256(tok.encode()).hexdigest()}}); admin.recv()
    section("parse error")
    print("> {nope")
    admin.s.sendall(b"\x81\x86" + b"\0\0\0\0" + b"{nope\n"); admin.recv()
    section("trustlog.push (a node), trustlog.changed and trust-changed")
    other = Ws(port, "/node", MASTER)
    req = other.recv(show=False)
    other.send({"jsonrpc": "2.0", "id": req["id"], "result": {
        "id": "away", "label": "away", "version": "0.1.0", "capabilities": {}}})
    admin.recv(show=False)
    entry = genesis_entry()
    h = base64.b64encode(hashlib.blake2s(entry, digest_size=32).digest()).decode()
    node.send({"jsonrpc": "2.0", "id": 2, "method": "trustlog.push",
               "params": {"entries": [base64.b64encode(entry).decode()]}})
    node.recv()
    other.recv()
    admin.recv()
    section("trustlog.sync")
    admin.send({"jsonrpc": "2.0", "id": 12, "method": "trustlog.sync"}); admin.recv()
    node.send({"jsonrpc": "2.0", "id": 3, "method": "trustlog.sync", "params": {"known": [h]}}); node.recv()
    stranger = base64.b64encode(b"\x07" * 32).decode()
    other.send({"jsonrpc": "2.0", "id": 2, "method": "trustlog.sync", "params": {"known": [stranger]}})
    other.recv()
    section("method not found")
    admin.send({"jsonrpc": "2.0", "id": 13, "method": "push.vapidKey"}); admin.recv()
    section("401")
    print("status", Ws(port, "/client", "wrong").status)
    p.terminate()
    p.wait()
