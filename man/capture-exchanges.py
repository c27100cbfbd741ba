#!/usr/bin/env python3
"""Prints real exchanges with the daemon socket, as quoted in omniconfluxd(8).

Starts the built binary on a temporary state directory and socket, sends one
request per method and one per error code it can provoke, and prints each
request line (>) and every line the daemon sent back (<). Run it after a
change to the socket methods and update the EXCHANGES section to match:

    python3 man/capture-exchanges.py target/release/omniconfluxd

The plugin.* exchanges install the sample plugins of tests/fixtures/plugins,
so they need node and python3, as the tests do.
"""
import json, os, shutil, socket, subprocess, sys, tempfile, time

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
        got = []
        for _ in range(replies if replies is not None else len(lines)):
            got.append(self.f.readline().decode().rstrip("\n"))
            print("<", got[-1])
        print()
        return [json.loads(g) for g in got]

    def quiet(self, method, params=None):
        """Calls a method without printing it; returns the result."""
        self.f.write(req(0, method, params).encode() + b"\n")
        self.f.flush()
        while True:
            o = json.loads(self.f.readline())
            if o.get("id") == 0:
                return o.get("result", o.get("error"))

    def wait_state(self, plugin, state, exited=False):
        """Polls plugin.get until the plugin is in `state`."""
        for _ in range(300):
            got = self.quiet("plugin.get", {"plugin": plugin})
            if got.get("state") == state and (not exited or got.get("lastExit")):
                return got
            time.sleep(0.1)
        sys.exit(f"{plugin} never reached {state}: {got}")


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

    plugins()


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "plugins")
# The interpreters as the tests name them: a python3 on PATH may be a shim
# (pyenv) that cannot run inside the sandbox.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
PLUGINS_CONFIG = f'[plugins]\nnode = "node"\npython = "{PYTHON}"\n'


def fixture(name):
    return os.path.realpath(os.path.join(FIXTURES, name))


def folder(tmp, name, manifest, main="main.py"):
    """Writes a plugin folder with `manifest` and an empty main."""
    path = os.path.join(tmp, name)
    os.makedirs(path, exist_ok=True)
    if manifest is not None:
        with open(os.path.join(path, "omniconflux-plugin.json"), "w") as f:
            json.dump(manifest, f)
    open(os.path.join(path, main), "w").close()
    return path


def manifest(id, api="1.0"):
    return {"manifestVersion": 1, "api": api, "id": id, "name": id, "version": "1.0.0",
            "description": "Captured for omniconfluxd(8).", "main": "main.py",
            "permissions": [], "commands": []}


def approve_params(c, plugin, snapshot, operator="alice"):
    got = c.quiet("plugin.get", {"plugin": plugin})
    m = got["waiting"]["manifest"]
    order = ["events.read", "lists.read", "commands.add", "storage.own", "tasks.create"]
    return {"plugin": plugin, "snapshotHash": snapshot,
            "permissions": sorted(m["permissions"], key=order.index),
            "commands": [x["id"] for x in m.get("commands", [])], "operator": operator}


def plugins():
    with tempfile.TemporaryDirectory() as tmp:
        print("# plugin methods, with the sample plugins of tests/fixtures/plugins")
        proc, sock = start(tmp, config=PLUGINS_CONFIG)
        c = Conn(sock)
        node = fixture("sample-node")
        inst = c.send(req(1, "plugin.install", {"path": node}))[0]["result"]
        c.send(req(2, "plugin.list"))
        c.send(req(3, "plugin.get", {"plugin": "sample-node"}))
        c.send(req(4, "plugin.approve", approve_params(c, "sample-node", inst["snapshotHash"])))
        c.wait_state("sample-node", "running")
        c.send(req(5, "plugin.commands"))
        c.send(req(6, "plugin.command.run", {"command": "sample-node.note", "input": "check the flaky login test"}))
        c.send(req(7, "plugin.disable", {"plugin": "sample-node"}))
        c.wait_state("sample-node", "disabled", exited=True)
        c.send(req(8, "plugin.enable", {"plugin": "sample-node"}))
        c.wait_state("sample-node", "running")
        print("# a changed copy, installed and discarded")
        changed = os.path.join(tmp, "sample-node-1.0.1")
        shutil.copytree(node, changed)
        with open(os.path.join(changed, "omniconflux-plugin.json")) as f:
            m = json.load(f)
        m["version"] = "1.0.1"
        with open(os.path.join(changed, "omniconflux-plugin.json"), "w") as f:
            json.dump(m, f, indent=2)
        c.send(req(9, "plugin.install", {"path": changed}))
        c.send(req(10, "plugin.discard", {"plugin": "sample-node"}))
        c.send(req(11, "plugin.remove", {"plugin": "sample-node"}))
        print("# a task request of sample-py (API 1.1), asked for and withdrawn")
        py = c.quiet("plugin.install", {"path": fixture("sample-py")})
        c.quiet("plugin.approve", approve_params(c, "sample-py", py["snapshotHash"]))
        c.wait_state("sample-py", "running")
        asked = json.loads(c.quiet("plugin.command.run", {"command": "sample-py.ask"})["text"])
        c.send(req(12, "plugin.request.get", {"requestId": asked["cancel"]["result"]["requestId"]}))
        print("# plugin errors")
        c.send(req(13, "plugin.get", {"plugin": "no-such-plugin"}))
        c.send(req(14, "plugin.install", {"path": folder(tmp, "no-manifest", None)}))
        c.send(req(15, "plugin.install", {"path": folder(tmp, "api-two", manifest("api-two", api="2.0"))}))
        c.quiet("plugin.install", {"path": folder(tmp, "stale", manifest("stale-one"))})
        c.send(req(16, "plugin.approve", {"plugin": "stale-one", "snapshotHash": "0" * 64,
                                           "permissions": [], "commands": [], "operator": "alice"}))
        c.send(req(17, "plugin.command.run", {"command": "sample-py.nope"}))
        for i in range(18):
            c.quiet("plugin.install", {"path": folder(tmp, f"filler-{i:02}", manifest(f"filler-{i:02}"))})
        c.send(req(18, "plugin.install", {"path": folder(tmp, "one-too-many", manifest("one-too-many"))}))
        c.send(req(19, "server.stop"))
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
