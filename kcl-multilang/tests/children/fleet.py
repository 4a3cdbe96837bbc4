"""A record processor on amazon_kclpy, the library unchanged (its v3 API), for the daemon's
fleet tests (tests/daemon/fleet): it raises on a record whose data starts with `poison`
(amazon_kclpy catches that, reports it on stderr and answers the batch anyway), and on every
record while the file $KCL_OUTAGE_FLAG exists (an outage: a dependency down); it appends
`<shard> <sequence number> <data>` for every other record it processes to $KCL_OUT (one line
each, flushed before the next record), and checkpoints at the end of each batch."""
import os

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

OUT = os.environ["KCL_OUT"]
FLAG = os.environ.get("KCL_OUTAGE_FLAG")


class FleetProcessor(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id

    def process_records(self, process_records_input):
        for record in process_records_input.records:
            if FLAG and os.path.exists(FLAG):
                raise RuntimeError("outage: %s exists" % FLAG)
            data = record.binary_data
            if data.startswith(b"poison"):
                raise ValueError("poison record at %s" % record.sequence_number)
            # One write of one line, in append mode: lines of several children never mix.
            with open(OUT, "a") as out:
                out.write("%s %s %s\n" % (self.shard, record.sequence_number, data.decode()))
        process_records_input.checkpointer.checkpoint()

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        shutdown_requested_input.checkpointer.checkpoint()


if __name__ == "__main__":
    kcl.KCLProcess(FleetProcessor()).run()
