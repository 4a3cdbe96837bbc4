"""A record processor on amazon_kclpy, the library unchanged (its v3 API), for the daemon's
poison-record tests: it raises on a record whose data is `poison` (amazon_kclpy catches that,
reports it on stderr and answers the batch anyway), or with $KCL_POISON = `exit`, exits there
(status 3, a crash); it appends the data of every other record it processes to $KCL_OUT, one a
line, and checkpoints at the end of each batch."""
import os

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

OUT = os.environ["KCL_OUT"]
EXIT = os.environ.get("KCL_POISON") == "exit"


class PoisonProcessor(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id

    def process_records(self, process_records_input):
        for record in process_records_input.records:
            data = record.binary_data
            if data == b"poison":
                if EXIT:
                    os._exit(3)
                raise ValueError("poison record at %s" % record.sequence_number)
            with open(OUT, "a") as out:
                out.write(data.decode() + "\n")
        process_records_input.checkpointer.checkpoint()

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        shutdown_requested_input.checkpointer.checkpoint()


if __name__ == "__main__":
    kcl.KCLProcess(PoisonProcessor()).run()
