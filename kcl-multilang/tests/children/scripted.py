"""A child for the conformance tests: logs every line the daemon writes to it (argv[1]) and
answers as argv[2] says: `normal`, `junk` (noise on stdout first), `wrong` (a status for
another action), `exit` (exits in the middle of a batch), `hang` (never answers a batch),
`long-stdout` / `long-stderr` (a 2 MiB line on stdout / stderr in each batch, then carries
on), `deaf` (stops reading its stdin once initialized), `lost-hang` (never answers leaseLost)
or `grandchild` (starts a `sleep` that shares its pipes and outlives it). Lines starting with
`#` in the log are notes, not what the daemon wrote."""
import json
import os
import subprocess
import sys
import time

log_path, mode = sys.argv[1], sys.argv[2]
LONG = 2 << 20


def log(line):
    with open(log_path, "a") as f:
        f.write(line.rstrip("\n") + "\n")


def send(message):
    sys.stdout.write("\n" + json.dumps(message) + "\n")
    sys.stdout.flush()


def checkpoint(sequence_number, sub_sequence_number=None):
    send({"action": "checkpoint", "sequenceNumber": sequence_number,
          "subSequenceNumber": sub_sequence_number})
    log(sys.stdin.readline())


for line in sys.stdin:
    log(line)
    action = json.loads(line)["action"]
    if action == "initialize":
        checkpoint(None)  # not possible here: InvalidStateException
        if mode == "grandchild":
            sleeper = subprocess.Popen(["sleep", "3600"])
            log("# grandchild %d of %d in group %d" % (sleeper.pid, os.getpid(), os.getpgrp()))
        if mode == "deaf":
            send({"action": "status", "responseFor": action})
            log("# deaf %d" % os.getpid())
            time.sleep(3600)
    elif action == "processRecords":
        if mode == "exit":
            sys.exit(3)
        if mode == "hang":
            time.sleep(3600)
        if mode == "wrong":
            send({"action": "status", "responseFor": "wrong"})
            continue
        if mode == "junk":
            print("a line that is not a message")
            print('{"action": "initialize", "shardId": "x"}')
        if mode == "long-stdout":
            sys.stdout.write("x" * LONG + "\n")
            sys.stdout.flush()
        if mode == "long-stderr":
            sys.stderr.write("y" * LONG + "\n")
            sys.stderr.write("after the long line\n")
            sys.stderr.flush()
            log("# stderr still open")
        last = json.loads(line)["records"][-1]
        checkpoint("not-a-number")
        checkpoint("9" * 40)  # never delivered
        checkpoint(last["sequenceNumber"], last["subSequenceNumber"])
    elif action in ("shardEnded", "shutdownRequested"):
        checkpoint(None)
    elif action == "leaseLost" and mode == "lost-hang":
        log("# lost-hang %d" % os.getpid())
        time.sleep(3600)
    send({"action": "status", "responseFor": action})
