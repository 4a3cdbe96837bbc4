"""A child for the daemon's failure tests. Appends what it is given to the journal $KCL_OUT
(one JSON object a line: call, shardId, pid, ppid, t in epoch seconds, sequenceNumber; also
kcl-bench's child under both daemons), checkpoints each batch's last
record, and fails once on the shards $KCL_FAIL names (`<shard>=<how>,…`; how: `crash` exits
in the middle of a batch, `hang` never answers it, `wrong` answers another action). Whether
a shard has failed already is a file in $KCL_FAIL_DIR, so its next child works."""
import json
import os
import sys
import time

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
        note("initialize")
    elif action == "processRecords":
        records = message["records"]
        for record in records:
            note("record", sequenceNumber=record["sequenceNumber"])
        how = fail_once()
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
    send({"action": "status", "responseFor": action})
