"""A child for the conformance tests: logs every line the daemon writes to it (argv[1]) and
answers as argv[2] says: `normal`, `junk` (noise on stdout first), `wrong` (a status for
another action), `exit` (exits in the middle of a batch), `hang` (never answers a batch),
`long-stdout` / `long-stderr` (a 2 MiB line on stdout / stderr in each batch, then carries
on), `deaf` (stops reading its stdin once initialized), `lost-hang` (never answers leaseLost),
`grandchild` (starts a `sleep` that shares its pipes and outlives it) or `raise` (reports an
exception on stderr as amazon_kclpy does, then answers: in `initialize`, and in a batch with a
record whose data is `poison`, which it then does not checkpoint). Lines starting with `#` in
the log are notes, not what the daemon wrote."""
import base64
import json
import os
import subprocess
import sys
import time
import traceback

log_path, mode = sys.argv[1], sys.argv[2]
LONG = 2 << 20


def log(line):
    with open(log_path, "a") as f:
        f.write(line.rstrip("\n") + "\n")


def send(message):
    sys.stdout.write("\n" + json.dumps(message) + "\n")
    sys.stdout.flush()


def report_raised(message):
    """What amazon_kclpy's KCLProcess._perform_action does with what the processor raised."""
    try:
        raise ValueError(message)
    except Exception as ex:
        sys.stderr.write("Caught exception from action dispatch: {ex}".format(ex=str(ex)))
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()


def checkpoint(sequence_number, sub_sequence_number=None):
    send({"action": "checkpoint", "sequenceNumber": sequence_number,
          "subSequenceNumber": sub_sequence_number})
    log(sys.stdin.readline())


for line in sys.stdin:
    log(line)
    action = json.loads(line)["action"]
    if action == "initialize":
        checkpoint(None)  # not possible here: InvalidStateException
        if mode == "raise":
            report_raised("initialize failed")
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
        records = json.loads(line)["records"]
        if mode == "raise" and any(base64.b64decode(r["data"]) == b"poison" for r in records):
            report_raised("poison record")
            send({"action": "status", "responseFor": action})
            continue
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
