"""A plugin for the benchmarks (Plugin API 1.0, python3 stdlib only).

It subscribes to turn.end at start and records each event's arrival (wall
clock ns) and its `ts`. Commands (input: space-separated numbers):

  get N GAP_MS [RESPONDER]
                    N storage.get round trips, each followed by the same line
                    echoed through a `cat` child on pipes, and, given the
                    path of a responder, the same request answered by that
                    child (started with VALUE, it answers what the daemon
                    does; sent and read with the same functions), each of
                    the three after a pause of GAP_MS; writes
                    "get_ns echo_ns [responder_ns]" lines to get.txt and
                    answers "ok", or how the two answers differed
  set N K [COMMITTER CPU]
                    N storage.set calls with K in flight; answers the
                    elapsed ns and the failed calls. Given the path of a
                    committer, the same calls go to that child instead,
                    put on core CPU and sent and read through the same
                    buffered streams and functions as the daemon's
  count             events seen and dropped so far: "seen dropped"
  dump              writes "ts arrival_ns" per event to events.txt, clears
                    them; answers the count

When its working directory holds a file `autoget` with a number N, it
does at start (once initialize is answered) one storage.set of k0 and N
storage.get round trips (as `get N 0`), then creates `autoget.done`: the
callgrind figure runs it on a daemon whose socket methods it cannot call.
"""
import io
import json
import os
import subprocess
import sys
import time

stdin = sys.stdin.buffer
stdout = sys.stdout.buffer
next_id = 0
events = []
dropped = 0
answers = {}
# What cmd_set stores first under each key (and cmd_get's responder answers).
VALUE = "v" * 100
# What cmd_set last stored under each key.
stored = {}


def send_line(b, out=stdout):
    out.write(b)
    out.flush()


def send(msg, out=stdout):
    send_line((json.dumps(msg, separators=(",", ":")) + "\n").encode(), out)


def note(msg):
    """Handles a line that is not the answer being waited for."""
    global dropped
    m = msg.get("method")
    if m == "event":
        events.append((msg["params"]["ts"], time.time_ns()))
    elif m == "events.dropped":
        dropped += msg["params"]["count"]
    elif m == "ping":
        send({"id": msg["id"], "result": {}})
    elif m is None:
        answers[msg["id"]] = msg
    else:
        handle(msg)


def read(inp=stdin):
    line = inp.readline()
    if not line:
        if inp is stdin:
            sys.exit(0)
        raise EOFError("the child closed its output")
    return json.loads(line)


def new_id():
    global next_id
    next_id += 1
    return "b%d" % next_id


def wait(rid, inp=stdin):
    while rid not in answers:
        note(read(inp))
    return answers.pop(rid)


def pause(gap_ms):
    if gap_ms:
        time.sleep(gap_ms / 1000.0)


def cmd_get(n, gap_ms, responder=None):
    cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    resp = None
    if responder:
        # It answers with the value cmd_set stored, so that its answer is
        # the daemon's byte for byte.
        resp = subprocess.Popen([responder, VALUE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        # Buffered like sys.stdout.buffer and sys.stdin.buffer, which the
        # daemon's requests and answers go on: the responder's call goes
        # through the same send_line and wait as the daemon's.
        resp_in = io.BufferedWriter(resp.stdin)
        resp_out = io.BufferedReader(resp.stdout)
    out = []
    mismatch = None
    for _ in range(n):
        rid = new_id()
        line = (json.dumps({"id": rid, "method": "storage.get", "params": {"key": "k0"}}, separators=(",", ":")) + "\n").encode()
        # Each call comes after the same gap, so that none of the three
        # finds the caches and the core warmed by the one before it.
        pause(gap_ms)
        t0 = time.perf_counter_ns()
        send_line(line)
        got = wait(rid)
        t1 = time.perf_counter_ns()
        pause(gap_ms)
        t2 = time.perf_counter_ns()
        cat.stdin.write(line)
        echoed = b""
        while not echoed.endswith(b"\n"):
            echoed += os.read(cat.stdout.fileno(), 65536)
        t3 = time.perf_counter_ns()
        if resp is None:
            out.append("%d %d" % (t1 - t0, t3 - t2))
        else:
            pause(gap_ms)
            t4 = time.perf_counter_ns()
            send_line(line, resp_in)
            answered = wait(rid, resp_out)
            t5 = time.perf_counter_ns()
            if answered != got:
                mismatch = "the responder answered %s, the daemon %s" % (json.dumps(answered), json.dumps(got))
            out.append("%d %d %d" % (t1 - t0, t3 - t2, t5 - t4))
    cat.stdin.close()
    cat.wait()
    if resp is not None:
        resp_in.close()
        resp.wait()
    with open("get.txt", "w") as f:
        f.write("\n".join(out) + "\n")
    return mismatch or "ok"


def cmd_set(n, k, committer=None, cpu=None):
    """Answers "elapsed_ns failed", or why the committer could not answer."""
    if committer is None:
        return sets(n, k, stdout, stdin)
    try:
        child = subprocess.Popen([committer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    except OSError as e:
        return "the committer did not start: %s" % e
    try:
        os.sched_setaffinity(child.pid, {cpu})
        out, inp = io.BufferedWriter(child.stdin), io.BufferedReader(child.stdout)
        if inp.readline() != b"ready\n":
            raise EOFError("it did not say ready")
        return sets(n, k, out, inp)
    except (OSError, EOFError, ValueError) as e:
        child.kill()
        return "the committer failed (exit %s): %s" % (child.wait(), e)
    finally:
        child.stdin.close()
        child.wait()


def sets(n, k, out, inp):
    t0 = time.perf_counter_ns()
    sent = 0
    inflight = []
    failed = 0
    while sent < n or inflight:
        while sent < n and len(inflight) < k:
            rid = new_id()
            key = "k%d" % (sent % 16)
            # Never the value the key holds: SQLite writes and syncs nothing
            # when a row is replaced by the same bytes, so such a set would
            # time a commit that is not one. A key's first value is VALUE,
            # which cmd_get's responder answers.
            value = VALUE if key not in stored else "%08d" % next_id + VALUE[8:]
            stored[key] = value
            send({"id": rid, "method": "storage.set", "params": {"key": key, "value": value}}, out)
            inflight.append(rid)
            sent += 1
        a = wait(inflight.pop(0), inp)
        if "error" in a:
            failed += 1
    return "%d %d" % (time.perf_counter_ns() - t0, failed)


def handle(msg):
    m, mid = msg.get("method"), msg.get("id")
    if mid is None:
        return
    if m == "initialize":
        send({"id": mid, "result": {"api": "1.0"}})
        rid = new_id()
        send({"id": rid, "method": "events.subscribe", "params": {"kinds": ["turn.end"]}})
        if os.path.exists("autoget"):
            with open("autoget") as f:
                n = int(f.read().split()[0])
            cmd_set(1, 1)
            cmd_get(n, 0)
            open("autoget.done", "w").close()
    elif m == "command.run":
        args = (msg["params"].get("input") or "").split()
        c = msg["params"]["command"]
        if c == "get":
            text = cmd_get(int(args[0]), float(args[1]), args[2] if len(args) > 2 else None)
        elif c == "set":
            text = cmd_set(int(args[0]), int(args[1]), *(args[2:3] + [int(a) for a in args[3:4]]))
        elif c == "count":
            text = "%d %d" % (len(events), dropped)
        elif c == "dump":
            with open("events.txt", "w") as f:
                for ts, at in events:
                    f.write("%s %d\n" % (ts, at))
            text = str(len(events))
            events.clear()
        else:
            text = "unknown"
        send({"id": mid, "result": {"text": text}})
    elif m == "shutdown":
        send({"id": mid, "result": {}})
        sys.exit(0)
    else:
        send({"id": mid, "error": {"code": "method-not-found", "message": "Unknown method: %s" % m}})


while True:
    note(read())
