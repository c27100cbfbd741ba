#!/usr/bin/env python3
"""A fast ACP v1 agent for the benchmarks (python3, stdlib only).

It answers initialize and session/new like tests/fixtures/fake_acp_agent.py
and, for every session/prompt, writes FAST_CHUNKS agent_message_chunk
session/update lines as fast as it can, FAST_BATCH lines per write (no
flush per line), then answers the prompt end_turn. Each chunk's text is
`[<seq>@<wall clock ns>]` followed by FAST_PAD 'x's, so a reader of the
daemon's output can tell the delay from the agent's line. The lines of
one write share one stamp, taken when the write is put together: they
leave together. The lines are built from pieces made once, so that the
agent's own work stays small beside the daemon's on the core they share
(formatting each line whole, with a clock read each, took 1.4 us a chunk,
as much as the daemon's reactor; now 0.7). With FAST_RATE
set (chunks a second), each write of FAST_BATCH lines first waits for its
time at that rate, and its lines are stamped after the wait: a load below
what readers can take. Without prompts it only waits on stdin: an idle
agent.
"""

import json
import os
import random
import sys
import time

CHUNKS = int(os.environ.get("FAST_CHUNKS", "256"))
PAD = "x" * int(os.environ.get("FAST_PAD", "64"))
BATCH = int(os.environ.get("FAST_BATCH", "16"))
RATE = float(os.environ.get("FAST_RATE", "0"))
out = sys.stdout.buffer
session = None
seq = 0


def send(obj):
    out.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())
    out.flush()


due = 0.0


def pace(lines):
    """Waits until a write of `lines` chunks is due at RATE a second."""
    global due
    now = time.monotonic()
    if due > now:
        time.sleep(due - now)
    due = max(due, now) + lines / RATE


def stream():
    global seq
    pre = ('{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"%s","update":'
           '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"[' % session)
    post = ']%s"}}}}\n' % PAD
    left = CHUNKS
    while left:
        n = min(BATCH, left)
        left -= n
        if RATE:
            pace(n)
        at = "@%d" % time.time_ns()
        out.write("".join([pre + str(i) + at + post for i in range(seq + 1, seq + n + 1)]).encode())
        out.flush()
        seq += n


for raw in sys.stdin.buffer:
    raw = raw.strip()
    if not raw:
        continue
    msg = json.loads(raw)
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": False}}})
    elif method == "session/new":
        session = "fast%08x" % random.getrandbits(32)
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": session}})
    elif method == "session/prompt":
        stream()
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
    elif method is not None and mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})
