//! Records delivered again that the table counts already: where a shard's processor resumes
//! when its lease was moved back behind the table's position (`kcl-admin reset` backwards,
//! a lease row deleted and created again).
//!
//! The table's position of a shard is written in the same transaction as every commit of
//! its windows, so the records at or before it are in the table, whatever the lease says
//! now. A processor that finds its lease behind resumes from the later of the two: the
//! records up to the position are skipped, not counted twice, and its first commit after
//! them brings the lease up to the table again (issue 52 makes this a hook of kcl itself).
//! What was skipped is said once per opening of the shard, at WARN (the operator moved the
//! lease on purpose, and the table is exact), and counted
//! ([`ALREADY_COUNTED`](crate::table::step::ALREADY_COUNTED)).

use kcl_core::{Checkpoint, ExtendedSequenceNumber, Record, ShardId};

/// One opening's replay: from the lease's checkpoint up to the table's position.
#[derive(Debug)]
pub(crate) struct Replay {
    shard: ShardId,
    table: String,
    lease: Checkpoint,
    position: Checkpoint,
    skipped: u64,
    first: Option<ExtendedSequenceNumber>,
    last: Option<ExtendedSequenceNumber>,
}

impl Replay {
    /// `shard` opened at `lease`, behind the `position` of `table`.
    pub(crate) fn new(
        shard: &ShardId,
        table: &str,
        lease: &Checkpoint,
        position: &Checkpoint,
    ) -> Self {
        Self {
            shard: shard.clone(),
            table: table.to_owned(),
            lease: lease.clone(),
            position: position.clone(),
            skipped: 0,
            first: None,
            last: None,
        }
    }

    /// `records` were skipped.
    pub(crate) fn skipped(&mut self, records: &[Record]) {
        if let (Some(first), Some(last)) = (records.first(), records.last()) {
            self.first.get_or_insert_with(|| first.position());
            self.last = Some(last.position());
            self.skipped += records.len() as u64;
        }
    }

    /// Says what was skipped, and why it ended (`how`).
    pub(crate) fn done(self, how: &str) {
        let show = |p: Option<ExtendedSequenceNumber>| {
            p.map_or_else(|| "none".to_owned(), |p| p.to_string())
        };
        tracing::warn!(
            shard = %self.shard,
            table = self.table,
            lease_checkpoint = %self.lease,
            table_position = %self.position,
            skipped = self.skipped,
            first_skipped = show(self.first),
            last_skipped = show(self.last),
            "shard {}: its lease's checkpoint {} was behind the position of exactly-once table \
             {} ({}): {} record(s) delivered again were counted in the table already, and \
             skipped rather than counted twice (a kcl-admin reset backwards, or a lease row \
             created again); {how}",
            self.shard,
            self.lease,
            self.table,
            self.position,
            self.skipped,
        );
    }
}
