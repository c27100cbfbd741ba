#!/usr/bin/env python3
"""Prints real exchanges with the daemon socket, as quoted in omniconfluxd(8).

Starts the built binary on a temporary state directory and socket, sends one
request per method and one per error code it can provoke, and prints each
request line (>) and every line the daemon sent back (<). Run it after a
change to the socket methods and update the EXCHANGES section to match:

    python3 man/capture-exchanges.py target/release/omniconfluxd

The plugin.* exchanges install the sample plugins of tests/fixtures/plugins,
so they need node and python3, as the tests do. The seats.*, sessions.*,
session.*, transcript.* and approvals.* exchanges drive a seat that runs the
scripted fake ACP agent tests/fixtures/fake_acp_agent.py (python3 only).
The repos.*, task.dispatch, verify.list and lanes.* exchanges run lanes on a
new git repository with a fake builder and a fake verifier of two provider
families (git, and bwrap able to create namespaces, as tests/lanes.rs needs).
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
    sessions()
    lanes()


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


FAKE_ACP = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "fake_acp_agent.py"))


def acp_seat(harness, script, command=None, family="local"):
    """A [[seat]] that runs the fake ACP agent with `script` (its turns)."""
    cmd = command or PYTHON
    args = "[]" if command else json.dumps([FAKE_ACP])
    return (f'[[seat]]\nharness = "{harness}"\ncommand = "{cmd}"\nargs = {args}\n'
            f'transport = "acp"\nprovider = "test"\nfamily = "{family}"\n'
            f"env = {{ FAKE_SCRIPT = '{json.dumps(script)}' }}\n\n")


def wait_for(c, method, params, ok, what):
    for _ in range(300):
        got = c.quiet(method, params)
        if ok(got):
            return got
        time.sleep(0.1)
    sys.exit(f"never {what}: {got}")


def sessions():
    with tempfile.TemporaryDirectory() as tmp:
        print("# seats, sessions, transcripts and approvals, with the fake ACP agent")
        wt = os.path.realpath(os.path.join(tmp, "wt"))
        os.makedirs(wt)
        script = [
            [{"text": "I will list the files."},
             {"permission": {"id": "c1", "title": "ls -la", "kind": "execute", "input": {"command": "ls -la"}}}],
            [{"text": "Done."}],
            [{"stall": 30}],
            [{"permission": {"id": "c2", "title": "rm -rf build", "kind": "execute", "input": {"command": "rm -rf build"}}}],
            [{"stall": 30}],
        ]
        config = acp_seat("fake", script) + acp_seat("gone", [], command="/nonexistent/agent")
        proc, sock = start(tmp, config=config)
        c = Conn(sock)
        wait_for(c, "seats.list", None, lambda r: r["seats"][0].get("status") == "ready", "ready")
        c.send(req(1, "seats.list"))
        c.send(req(2, "seats.probe"))
        c.send(req(3, "sessions.subscribe"))
        c.send(req(4, "sessions.unsubscribe"))
        got = c.send(req(5, "sessions.spawn", {"harness": "fake", "cwd": wt, "prompt": "list the files", "name": "tidy"}))
        sid = got[0]["result"]["session_id"]
        aid = f"{sid}-a1"
        wait_for(c, "approvals.list", None, lambda r: len(r["approvals"]) == 1, "an approval")
        c.send(req(6, "approvals.list"))
        c.send(req(7, "approvals.get", {"request_id": aid}))
        c.send(req(8, "approvals.answer", {"request_id": aid, "decision": "allow", "reason": "read-only"}))
        wait_for(c, "sessions.get", {"session_id": sid}, lambda r: r.get("state") == "idle", "idle")
        c.send(req(9, "sessions.list"))
        c.send(req(10, "sessions.get", {"session_id": sid}))
        c.send(req(11, "session.rename", {"session_id": sid, "name": "tidy up"}))
        c.send(req(12, "sessions.transcriptView", {"session_id": sid}))
        c.send(req(13, "sessions.toolDetail", {"session_id": sid, "tool_id": "c1"}))
        have = len(c.quiet("sessions.transcriptView", {"session_id": sid})["entries"])
        c.send(req(14, "transcript.subscribe", {"sub_id": "t1", "session_id": sid, "have_entries": have}))
        c.send(req(15, "sessions.input", {"session_id": sid, "text": "thanks"}))
        # The deltas of the second turn, as they come.
        for _ in range(40):
            line = c.f.readline().decode().rstrip("\n")
            print("<", line)
            o = json.loads(line)
            if o.get("method") == "transcript.delta" and any(
                    e.get("kind") == "turn_end" for e in o["params"].get("entries", [])):
                break
        print()
        c.send(req(16, "transcript.unsubscribe", {"sub_id": "t1"}))
        wait_for(c, "sessions.get", {"session_id": sid}, lambda r: r.get("state") == "idle", "idle")
        c.quiet("sessions.input", {"session_id": sid, "text": "wait"})
        wait_for(c, "sessions.get", {"session_id": sid}, lambda r: r.get("state") == "running", "running")
        c.send(req(17, "sessions.interrupt", {"session_id": sid}))
        wait_for(c, "sessions.get", {"session_id": sid}, lambda r: r.get("state") == "idle", "idle")
        print("# session and approval errors")
        c.quiet("sessions.input", {"session_id": sid, "text": "clean the build"})
        wait_for(c, "approvals.list", None, lambda r: len(r["approvals"]) == 1, "an approval")
        a2 = f"{sid}-a2"
        c.send(req(18, "approvals.answer", {"request_id": a2, "decision": "allow", "digest": "0" * 64}))
        c.send(req(19, "approvals.answer", {"request_id": a2, "decision": "deny", "reason": "not now"}))
        c.send(req(20, "approvals.answer", {"request_id": a2, "decision": "allow"}))
        wait_for(c, "sessions.get", {"session_id": sid}, lambda r: r.get("state") == "idle", "idle")
        c.send(req(21, "sessions.spawn", {"harness": "nope", "cwd": wt}))
        c.send(req(22, "sessions.spawn", {"harness": "gone", "cwd": wt}))
        c.send(req(23, "sessions.get", {"session_id": "no-such-session"}))
        c.quiet("sessions.input", {"session_id": sid, "text": "wait"})
        wait_for(c, "sessions.get", {"session_id": sid}, lambda r: r.get("state") == "running", "running")
        for i in range(32):
            c.quiet("sessions.input", {"session_id": sid, "text": f"queued {i}"})
        c.send(req(24, "sessions.input", {"session_id": sid, "text": "one more"}))
        c.send(req(25, "sessions.kill", {"session_id": sid}))
        wait_for(c, "sessions.get", {"session_id": sid}, lambda r: r.get("state") == "ended", "ended")
        c.send(req(26, "sessions.input", {"session_id": sid, "text": "hello?"}))
        c.send(req(27, "server.stop"))
        proc.wait(timeout=30)


def git(repo, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "-C", repo, *args], env=env, check=True, stdout=subprocess.DEVNULL)


def new_repo(path):
    os.makedirs(path)
    git(path, "init", "-q", "-b", "main")
    with open(os.path.join(path, "a.txt"), "w") as f:
        f.write("one\n")
    git(path, "add", "a.txt")
    git(path, "commit", "-q", "-m", "first")
    return path


def lanes():
    with tempfile.TemporaryDirectory() as tmp:
        print("# lanes: a repository, a fake builder (anthropic) and verifier (openai)")
        shop = new_repo(os.path.realpath(os.path.join(tmp, "shop")))
        other = new_repo(os.path.realpath(os.path.join(tmp, "tools")))
        build = [[{"run": ["sh", "-c", "echo feature > feature.txt"]}, {"text": "Added feature.txt."}],
                 [{"text": "Looked again."}]]
        judge = [[{"text": "I read the diff.\n```omniconflux-verdict\n{\"verdict\":\"pass\"}\n```\n"}]]
        config = ("[lanes]\nrequire_merge_approval = true\nmax_rounds = 1\n\n"
                  f'[[repo]]\npath = "{shop}"\n\n'
                  + acp_seat("builder", build, family="anthropic")
                  + acp_seat("verifier", judge, family="openai")
                  + acp_seat("twin", [], family="anthropic"))
        proc, sock = start(tmp, config=config)
        c = Conn(sock)
        wait_for(c, "seats.list", None, lambda r: all(s.get("status") == "ready" for s in r["seats"]), "ready")
        c.send(req(1, "repos.add", {"path": other}))
        c.send(req(2, "repos.list"))
        task = {"repo": shop, "task": "Add feature.txt with the word feature.", "builder": "builder",
                "verifier": "verifier", "acceptance": {"name": "feature exists", "command": "test -f feature.txt"},
                "name": "add feature"}
        # Isolation is probed once after start; dispatch refuses until it is known.
        for _ in range(300):
            if c.quiet("task.dispatch", {**task, "repo": "/nonexistent"}).get("data", {}).get("code") == "repo-unknown":
                break
            time.sleep(0.1)
        lane = c.send(req(3, "task.dispatch", task))[0]["result"]["lane"]
        wait_for(c, "lanes.get", {"lane": lane}, lambda r: r.get("stage") == "pass", "pass")
        c.send(req(4, "verify.list", {"limit": 10}))
        c.send(req(5, "lanes.get", {"lane": lane}))
        c.send(req(6, "lanes.merge", {"lane": lane}))
        wait_for(c, "lanes.get", {"lane": lane}, lambda r: r.get("stage") == "merged", "merged")
        print("# a lane whose acceptance check fails, at the cap of one round")
        failing = {**task, "name": "add readme", "acceptance": {"name": "readme exists", "command": "test -f README"}}
        lane2 = c.quiet("task.dispatch", failing)["lane"]
        wait_for(c, "lanes.get", {"lane": lane2}, lambda r: r.get("stage") == "cap", "cap")
        c.send(req(7, "lanes.rework", {"lane": lane2, "notes": "Add a README file as well."}))
        wait_for(c, "lanes.get", {"lane": lane2}, lambda r: r.get("stage") == "cap", "cap")
        c.send(req(8, "lanes.close", {"lane": lane2, "remove_worktree": True}))
        print("# lane errors")
        c.send(req(9, "task.dispatch", {**task, "repo": "/srv/src/unknown"}))
        c.send(req(10, "task.dispatch", {**task, "verifier": "twin"}))
        c.send(req(11, "task.dispatch", {**task, "name": "add docs", "base": "release"}))
        git(shop, "branch", "omni/add-tests")
        c.send(req(12, "task.dispatch", {**task, "name": "add tests"}))
        c.send(req(13, "lanes.get", {"lane": "t-000000000000"}))
        c.send(req(14, "lanes.merge", {"lane": lane}))
        c.send(req(15, "server.stop"))
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
