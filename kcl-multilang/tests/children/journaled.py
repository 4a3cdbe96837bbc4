"""A child for the daemon's failure tests. Appends what it is given to the journal $KCL_OUT
(one JSON object a line: call, shardId, pid, ppid, t in epoch seconds, sequenceNumber; also
kcl-bench's child under both daemons), checkpoints each batch's last
record, and fails once on the shards $KCL_FAIL names (`<shard>=<how>,…`; how: `crash` exits
in the middle of a batch, `hang` never answers it, `wrong` answers another action,
`stdout-line` / `stderr-line` print a 2 MiB line on stdout / stderr in a batch and carry on,
`deaf` stops reading its stdin once initialized, `grandchild` starts a `sleep` that shares its
pipes and outlives it, `lost-hang` never answers leaseLost). Whether a shard has failed
already is a file in $KCL_FAIL_DIR, so its next child works."""
import json
import os
import subprocess
import sys
import time

LONG = 2 << 20

journal = os.environ["KCL_OUT"]
plan = dict(p.split("=", 1) for p in os.environ.get("KCL_FAIL", "").split(",") if p)
shard = None


def note(call, **fields):
    entry = {"call": call, "shardId": shard, "pid": os.getpid(), "ppid": os.getppid(),
             "t": time.time(), **fields}
    with open(journal, "a") as f:
        f.write(json.dumps(entry) + "\n")


def send(message):
    sys.stdout.write("\n" + json.dumps(message) + "\n")
    sys.stdout.flush()


def checkpoint(sequence_number, sub_sequence_number=None):
    send({"action": "checkpoint", "sequenceNumber": sequence_number,
          "subSequenceNumber": sub_sequence_number})
    reply = json.loads(sys.stdin.readline())
    if reply.get("error"):
        note("checkpointFailed", error=reply["error"])


def fail_once():
    """How this shard fails now, if it is to fail and has not yet."""
    how = plan.get(shard)
    if how is None:
        return None
    marker = os.path.join(os.environ["KCL_FAIL_DIR"], shard)
    if os.path.exists(marker):
        return None
    open(marker, "w").close()
    return how


for line in sys.stdin:
    message = json.loads(line)
    action = message["action"]
    if action == "initialize":
        shard = message["shardId"]
        note("initialize", pgid=os.getpgrp())
        if plan.get(shard) in ("deaf", "grandchild"):
            how = fail_once()
            if how == "grandchild":
                sleeper = subprocess.Popen(["sleep", "3600"])
                note("grandchild", grandchild=sleeper.pid)
            if how == "deaf":
                send({"action": "status", "responseFor": action})
                note("deaf")
                time.sleep(3600)
    elif action == "processRecords":
        records = message["records"]
        for record in records:
            note("record", sequenceNumber=record["sequenceNumber"])
        how = fail_once() if plan.get(shard) not in ("deaf", "grandchild", "lost-hang") else None
        if how == "stdout-line":
            sys.stdout.write("x" * LONG + "\n")
            sys.stdout.flush()
            note("stdout-line")
        if how == "stderr-line":
            sys.stderr.write("y" * LONG + "\n")
            sys.stderr.write("after the long line\n")
            sys.stderr.flush()
            note("stderr-line")
        if how == "crash":
            sys.exit(3)
        if how == "hang":
            time.sleep(3600)
        if how == "wrong":
            send({"action": "status", "responseFor": "wrong"})
            continue
        if records:
            checkpoint(records[-1]["sequenceNumber"], records[-1]["subSequenceNumber"])
    else:
        note(action)
        if action in ("shardEnded", "shutdownRequested"):
            checkpoint(None)
        if action == "leaseLost" and plan.get(shard) == "lost-hang" and fail_once():
            time.sleep(3600)
    send({"action": "status", "responseFor": action})
