#!/usr/bin/env python3
"""Prints real exchanges with the daemon socket, as quoted in omniconfluxd(8).

Starts the built binary on a temporary state directory and socket, sends one
request per method and one per error code it can provoke, and prints each
request line (>) and every line the daemon sent back (<). Run it after a
change to the socket methods and update the EXCHANGES section to match:

    python3 man/capture-exchanges.py target/release/omniconfluxd
"""
import json, os, socket, subprocess, sys, tempfile, time

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/omniconfluxd")


def start(tmp, config=None, ledger_bytes=None):
    state = os.path.join(tmp, "state")
    os.makedirs(state, exist_ok=True)
    if ledger_bytes is not None:
        with open(os.path.join(state, "ledger.sqlite3"), "wb") as f:
            f.write(ledger_bytes)
    sock = os.path.join(tmp, "d.sock")
    args = [BIN, "--state-dir", state, "--socket", sock]
    if config is not None:
        path = os.path.join(tmp, "omniconfluxd.toml")
        with open(path, "w") as f:
            f.write(config)
        args += ["--config", path]
    proc = subprocess.Popen(args + ["serve"], stderr=subprocess.PIPE, text=True)
    # The daemon logs "serving on" once its socket accepts.
    for line in proc.stderr:
        if "serving on" in line:
            break
    return proc, sock


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rwb")

    def send(self, *lines, replies=None):
        text = b"".join(l.encode() + b"\n" for l in lines)
        for l in lines:
            print(">", l)
        self.f.write(text)
        self.f.flush()
        for _ in range(replies if replies is not None else len(lines)):
            print("<", self.f.readline().decode().rstrip("\n"))
        print()


def req(id, method, params=None):
    o = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        o["params"] = params
    return json.dumps(o, separators=(",", ":"))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        proc, sock = start(tmp)
        c = Conn(sock)
        print("# methods")
        c.send(req(1, "ping"))
        c.send(req(2, "server.info"))
        c.send(req(3, "events.subscribe", {"streams": ["x-notes"]}))
        c.send(req(4, "events.append", {"stream": "x-notes", "kind": "note", "data": {"text": "deploy started"}}), replies=2)
        c.send(req(5, "events.list", {"stream": "x-notes", "after_seq": 0, "limit": 10}))
        c.send(req(6, "events.unsubscribe"))
        print("# errors")
        c.send('{"jsonrpc":"2.0","id":7,"method":"ping"')
        c.send('{"jsonrpc":"1.0","id":8,"method":"ping"}')
        c.send(req(9, "events.lst"))
        c.send(req(10, "events.list", {"stream": "x-notes", "limit": 0, "extra": 1}))
        print("# stop, and a request behind it")
        c.send(req(11, "server.stop"), req(12, "events.list", {"stream": "x-notes"}))
        proc.wait(timeout=30)

    with tempfile.TemporaryDirectory() as tmp:
        print("# too-many-connections, with socket.max_connections = 1")
        proc, sock = start(tmp, config="[socket]\nmax_connections = 1\n")
        first = Conn(sock)
        first.send(req(1, "ping"))
        Conn(sock).send(req(1, "ping"))
        first.send(req(2, "server.stop"))
        proc.wait(timeout=30)

    with tempfile.TemporaryDirectory() as tmp:
        print("# ledger-corrupt: a ledger file that is not a database")
        proc, sock = start(tmp, ledger_bytes=b"this is not a database" * 256)
        c = Conn(sock)
        c.send(req(1, "events.append", {"stream": "x-notes", "kind": "note"}))
        c.send(req(2, "server.stop"))
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
