'use strict';
// A record processor for npm `aws-kcl` laid out as that package's README lays one out (a
// v2 processor: initialize, processRecords, leaseLost, shardEnded), with the README's calls in
// the README's order: processRecords checkpoints the batch's last sequence number and completes
// in the checkpoint's callback; shardEnded checkpoints with no sequence number and calls its
// completeCallback both at once and again in that callback, so the daemon sees a second
// `status` after the shard's end. Its additions: each record, and each call, is appended as
// one JSON line to the file $KCL_OUT names (stdout is the protocol's); and the library's
// optional shutdownRequested hook, which checkpoints.
var fs = require('fs');
var kcl = require('aws-kcl');

var shardId = null;

function note(entry) {
  entry.shardId = shardId;
  entry.pid = process.pid;
  fs.appendFileSync(process.env.KCL_OUT, JSON.stringify(entry) + '\n');
}

kcl({
  initialize: function (initializeInput, completeCallback) {
    shardId = initializeInput.shardId;
    note({ call: 'initialize', from: initializeInput.sequenceNumber });
    completeCallback();
  },

  processRecords: function (processRecordsInput, completeCallback) {
    if (!processRecordsInput || !processRecordsInput.records) {
      completeCallback();
      return;
    }
    var records = processRecordsInput.records;
    var sequenceNumber;
    for (var i = 0; i < records.length; ++i) {
      sequenceNumber = records[i].sequenceNumber;
      note({
        call: 'record',
        sequenceNumber: sequenceNumber,
        partitionKey: records[i].partitionKey,
        data: Buffer.from(records[i].data, 'base64').toString()
      });
    }
    if (!sequenceNumber) {
      completeCallback();
      return;
    }
    processRecordsInput.checkpointer.checkpoint(sequenceNumber, function (err) {
      if (err) {
        note({ call: 'checkpointFailed', error: String(err) });
      }
      completeCallback();
    });
  },

  leaseLost: function (leaseLostInput, completeCallback) {
    note({ call: 'leaseLost' });
    completeCallback();
  },

  shardEnded: function (shardEndedInput, completeCallback) {
    note({ call: 'shardEnded' });
    shardEndedInput.checkpointer.checkpoint(function (err) {
      if (err) {
        note({ call: 'checkpointFailed', error: String(err) });
      }
      completeCallback();
    });
    completeCallback();
  },

  shutdownRequested: function (shutdownRequestedInput, completeCallback) {
    note({ call: 'shutdownRequested' });
    shutdownRequestedInput.checkpointer.checkpoint(function (err) {
      if (err) {
        note({ call: 'checkpointFailed', error: String(err) });
      }
      completeCallback();
    });
  }
}).run();
