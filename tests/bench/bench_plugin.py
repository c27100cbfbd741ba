"""A plugin for the benchmarks (Plugin API 1.0, python3 stdlib only).

It subscribes to turn.end at start and records each event's arrival (wall
clock ns) and its `ts`. Commands (input: space-separated numbers):

  get N GAP_MS [RESPONDER]
                    N storage.get round trips, each followed by the same line
                    echoed through a `cat` child on pipes, and, given the
                    path of a responder, the same request answered by that
                    child (read and parsed as the daemon's answer is),
                    each of the three after a pause of GAP_MS; writes
                    "get_ns echo_ns [responder_ns]" lines to get.txt
  set N K           N storage.set calls with K in flight; answers the
                    elapsed ns
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


def send_line(b):
    stdout.write(b)
    stdout.flush()


def send(msg):
    send_line((json.dumps(msg, separators=(",", ":")) + "\n").encode())


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


def read():
    line = stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def new_id():
    global next_id
    next_id += 1
    return "b%d" % next_id


def wait(rid):
    while rid not in answers:
        note(read())
    return answers.pop(rid)


def pause(gap_ms):
    if gap_ms:
        time.sleep(gap_ms / 1000.0)


def cmd_get(n, gap_ms, responder=None):
    cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    resp = None
    if responder:
        resp = subprocess.Popen([responder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        # Buffered like sys.stdin.buffer, which the daemon's answers come on.
        resp_out = io.BufferedReader(resp.stdout)
    out = []
    for _ in range(n):
        rid = new_id()
        line = (json.dumps({"id": rid, "method": "storage.get", "params": {"key": "k0"}}, separators=(",", ":")) + "\n").encode()
        # Each call comes after the same gap, so that none of the three
        # finds the caches and the core warmed by the one before it.
        pause(gap_ms)
        t0 = time.perf_counter_ns()
        send_line(line)
        wait(rid)
        t1 = time.perf_counter_ns()
        pause(gap_ms)
        t2 = time.perf_counter_ns()
        cat.stdin.write(line)
        got = b""
        while not got.endswith(b"\n"):
            got += os.read(cat.stdout.fileno(), 65536)
        t3 = time.perf_counter_ns()
        if resp is None:
            out.append("%d %d" % (t1 - t0, t3 - t2))
        else:
            pause(gap_ms)
            t4 = time.perf_counter_ns()
            resp.stdin.write(line)
            json.loads(resp_out.readline())
            t5 = time.perf_counter_ns()
            out.append("%d %d %d" % (t1 - t0, t3 - t2, t5 - t4))
    cat.stdin.close()
    cat.wait()
    if resp is not None:
        resp.stdin.close()
        resp.wait()
    with open("get.txt", "w") as f:
        f.write("\n".join(out) + "\n")
    return "ok"


def cmd_set(n, k):
    value = "v" * 100
    t0 = time.perf_counter_ns()
    sent = 0
    inflight = []
    failed = 0
    while sent < n or inflight:
        while sent < n and len(inflight) < k:
            rid = new_id()
            send({"id": rid, "method": "storage.set", "params": {"key": "k%d" % (sent % 16), "value": value}})
            inflight.append(rid)
            sent += 1
        a = wait(inflight.pop(0))
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
            text = cmd_set(int(args[0]), int(args[1]))
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
