"""A child for the conformance tests: logs every line the daemon writes to it (argv[1]) and
answers as argv[2] says: `normal`, `junk` (noise on stdout first), `wrong` (a status for
another action), `exit` (exits in the middle of a batch) or `hang` (never answers a batch)."""
import json
import sys
import time

log_path, mode = sys.argv[1], sys.argv[2]


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
        last = json.loads(line)["records"][-1]
        checkpoint("not-a-number")
        checkpoint("9" * 40)  # never delivered
        checkpoint(last["sequenceNumber"], last["subSequenceNumber"])
    elif action in ("shardEnded", "shutdownRequested"):
        checkpoint(None)
    send({"action": "status", "responseFor": action})
