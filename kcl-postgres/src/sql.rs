//! The statements, one per operation, each a single conditional statement (see `schema.sql`
//! for the table and why each write is safe under READ COMMITTED).
//!
//! Conditions name the owner with `IS NOT DISTINCT FROM`, so that "unowned" (NULL) is a value
//! like any other, as `attribute_not_exists(leaseOwner)` is on DynamoDB. A statement that
//! matched no row refused the write: the store reports it as a conflict. Every statement is
//! a constant (prepared once per connection, no SQL built from values).

/// The columns read back, in the order `schema::lease` reads them.
macro_rules! columns {
    () => {
        "lease_key, owner, counter, checkpoint, checkpoint_sub, pending_checkpoint, \
         pending_checkpoint_sub, owner_switches, fence, parent_shard_ids, child_shard_ids, \
         starting_hash_key::text AS starting_hash_key, ending_hash_key::text AS ending_hash_key, \
         handoff_to, start_timestamp, endpoint, parked_keys, load_milli, capacity_milli, flow, \
         restart_grace_ms, carrier, signals, acked"
    };
}

/// The row of a holder: owner and counter as it last saw them (`$3`, `$4`).
macro_rules! held {
    () => {
        " WHERE application = $1 AND lease_key = $2 AND owner IS NOT DISTINCT FROM $3 \
          AND counter = $4"
    };
}

/// The holder's load (`$17`–`$19`), written whole when given and left alone when not.
macro_rules! load {
    () => {
        "load_milli = CASE WHEN $17::int8 IS NULL THEN load_milli ELSE $17 END, \
         capacity_milli = CASE WHEN $17::int8 IS NULL THEN capacity_milli ELSE $18 END, \
         flow = CASE WHEN $17::int8 IS NULL THEN flow ELSE $19::text END"
    };
}

/// A checkpoint's writes but the counter, the fence and the restart grace, from `$5`–`$19`
/// (`schema::CheckpointParams`): the checkpoint and the pending one, children and the other
/// attributes when given, parked keys appended (each once, in order), the acked records set
/// or removed with the checkpoint, the owner-switch count reset.
macro_rules! checkpoint_writes {
    () => {
        concat!(
            "owner_switches = 0, checkpoint = $5, checkpoint_sub = $6, \
             pending_checkpoint = $7, pending_checkpoint_sub = $8, \
             child_shard_ids = CASE WHEN cardinality($9::text[]) = 0 THEN child_shard_ids \
             ELSE $9 END, \
             start_timestamp = COALESCE($10, start_timestamp), \
             endpoint = COALESCE($11, endpoint), \
             parked_keys = parked_keys || ARRAY(\
               SELECT e FROM (SELECT DISTINCT ON (e) e, i \
                 FROM unnest($12::text[]) WITH ORDINALITY AS p(e, i) ORDER BY e, i) AS d \
               WHERE e <> ALL(parked_keys) ORDER BY i), \
             carrier = COALESCE($14, carrier), signals = COALESCE($15, signals), \
             acked = $16, ",
            load!(),
            ", updated_at = now()"
        )
    };
}

/// Every lease of the application, by key.
pub(crate) const LIST: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM kcl_leases WHERE application = $1 ORDER BY lease_key"
);

/// One lease.
pub(crate) const GET: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM kcl_leases WHERE application = $1 AND lease_key = $2"
);

/// Checks that the table has every column the store uses (ensure_table).
pub(crate) const PROBE: &str = concat!("SELECT ", columns!(), " FROM kcl_leases LIMIT 0");

/// Whether an index of `kcl_leases` covers `owner`.
pub(crate) const OWNER_INDEX: &str = "SELECT EXISTS (SELECT 1 FROM pg_index i \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
     WHERE i.indrelid = to_regclass('kcl_leases') AND a.attname = 'owner')";

/// Whether every object `schema.sql` creates exists already: then `ensure_table` runs none
/// of it, so that a role without ownership of the table (or CREATE on the schema) starts on a
/// schema another role made (`CREATE INDEX IF NOT EXISTS` needs ownership even when the index
/// exists).
pub(crate) const SCHEMA_PRESENT: &str = "SELECT to_regclass('kcl_leases') IS NOT NULL \
     AND to_regclass('kcl_leases_owner') IS NOT NULL \
     AND to_regclass('kcl_positions') IS NOT NULL";

/// Whether `kcl_positions` exists already: then a sink's `ensure_table` creates nothing.
pub(crate) const POSITIONS_PRESENT: &str = "SELECT to_regclass('kcl_positions') IS NOT NULL";

/// Serialises `schema.sql` between workers starting at once (concurrent `CREATE ... IF NOT
/// EXISTS` of one table can fail with a duplicate key).
pub(crate) const SCHEMA_LOCK: &str = "SELECT pg_advisory_xact_lock(7301962853390521163)";

/// The keys of the leases an owner holds (the owner index).
pub(crate) const OWNED_BY: &str = "SELECT lease_key FROM kcl_leases \
     WHERE application = $1 AND owner = $2 ORDER BY lease_key";

/// `create`: the whole row, unless one with its key exists.
pub(crate) const CREATE: &str = "INSERT INTO kcl_leases (application, lease_key, owner, \
     counter, checkpoint, checkpoint_sub, pending_checkpoint, pending_checkpoint_sub, \
     owner_switches, fence, parent_shard_ids, child_shard_ids, starting_hash_key, \
     ending_hash_key, handoff_to, start_timestamp, endpoint, parked_keys, load_milli, \
     capacity_milli, flow, restart_grace_ms, carrier, signals, acked) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::text::numeric, \
     $14::text::numeric, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25) \
     ON CONFLICT (application, lease_key) DO NOTHING";

/// `renew`: the counter bumped, the load written if given (`$5`–`$7`).
pub(crate) const RENEW: &str = concat!(
    "UPDATE kcl_leases SET counter = counter + 1, \
     load_milli = CASE WHEN $5::int8 IS NULL THEN load_milli ELSE $5 END, \
     capacity_milli = CASE WHEN $5::int8 IS NULL THEN capacity_milli ELSE $6 END, \
     flow = CASE WHEN $5::int8 IS NULL THEN flow ELSE $7::text END, updated_at = now()",
    held!(),
    " RETURNING ",
    columns!()
);

/// `take` by `$5`: the fence is the counter written; an owner switch is counted and a
/// handoff request cleared unless the row names `$5` already (an adoption).
pub(crate) const TAKE: &str = concat!(
    "UPDATE kcl_leases SET owner = $5, counter = counter + 1, fence = counter + 1, \
     restart_grace_ms = NULL, \
     owner_switches = owner_switches + CASE WHEN owner IS DISTINCT FROM $5 THEN 1 ELSE 0 END, \
     handoff_to = CASE WHEN owner IS DISTINCT FROM $5 THEN NULL ELSE handoff_to END, \
     updated_at = now()",
    held!(),
    " RETURNING ",
    columns!()
);

/// `release`: no owner, no handoff request, no restart grace; the counter bumped.
pub(crate) const RELEASE: &str = concat!(
    "UPDATE kcl_leases SET owner = NULL, counter = counter + 1, handoff_to = NULL, \
     restart_grace_ms = NULL, updated_at = now()",
    held!()
);

/// `request_handoff` to `$4` (NULL withdraws): on the owner alone, the counter left alone.
pub(crate) const REQUEST_HANDOFF: &str = "UPDATE kcl_leases SET handoff_to = $4, \
     updated_at = now() \
     WHERE application = $1 AND lease_key = $2 AND owner IS NOT DISTINCT FROM $3";

/// `checkpoint`: held as owner and counter, and still at checkpoint `$20`/`$21`.
pub(crate) const CHECKPOINT: &str = concat!(
    "UPDATE kcl_leases SET counter = counter + 1, \
     restart_grace_ms = COALESCE($13, restart_grace_ms), ",
    checkpoint_writes!(),
    held!(),
    " AND checkpoint = $20 AND checkpoint_sub = $21 RETURNING ",
    columns!()
);

/// A processor's commit (`outputs`): the checkpoint's writes, while the row is the tenure
/// of owner `$3` and fence `$4` and still at checkpoint `$20`/`$21`. The counter is left
/// alone (renewals move it; see `kcl_core::outputs`). The first statement of the commit's
/// transaction: it locks the row, so a second commit of the shard waits here for the first
/// and then finds the checkpoint moved.
pub(crate) const COMMIT: &str = concat!(
    "UPDATE kcl_leases SET restart_grace_ms = COALESCE($13, restart_grace_ms), ",
    checkpoint_writes!(),
    " WHERE application = $1 AND lease_key = $2 AND owner = $3 AND fence = $4 \
     AND checkpoint = $20 AND checkpoint_sub = $21"
);

/// `reset` to owner `$20`: a take and a checkpoint in one write (the restart grace is the
/// update's, or none).
pub(crate) const RESET: &str = concat!(
    "UPDATE kcl_leases SET owner = $20, counter = counter + 1, fence = counter + 1, \
     handoff_to = NULL, restart_grace_ms = $13, ",
    checkpoint_writes!(),
    held!(),
    " RETURNING ",
    columns!()
);

/// `delete`: nobody wrote the row since it was read.
pub(crate) const DELETE: &str =
    "DELETE FROM kcl_leases WHERE application = $1 AND lease_key = $2 AND counter = $3";

/// `unpark`: entries `$3` removed, the order of the others kept, whoever holds the row.
pub(crate) const UNPARK: &str = "UPDATE kcl_leases SET parked_keys = ARRAY(\
       SELECT e FROM unnest(parked_keys) WITH ORDINALITY AS p(e, i) \
       WHERE e <> ALL($3::text[]) ORDER BY i), updated_at = now() \
     WHERE application = $1 AND lease_key = $2";

/// `request_redrive`: entry `$4` added (once) while the row parks `$3`.
pub(crate) const REQUEST_REDRIVE: &str = "UPDATE kcl_leases SET parked_keys = \
       CASE WHEN $4::text = ANY(parked_keys) THEN parked_keys ELSE parked_keys || $4::text END, \
       updated_at = now() \
     WHERE application = $1 AND lease_key = $2 AND $3::text = ANY(parked_keys)";

/// `PostgresSink::open`: the shard's position row made, or handed to the tenure of owner `$3`
/// and fence `$4` whatever it named (a lease table made again starts its fences over); its
/// position returned. Waits on the lock of a commit in flight, so that commit lands first
/// (and its position is returned) or finds the row handed over and is refused.
pub(crate) const OPEN_POSITION: &str = "INSERT INTO kcl_positions (application, lease_key, \
     owner, fence) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (application, lease_key) DO UPDATE SET owner = EXCLUDED.owner, \
     fence = EXCLUDED.fence, updated_at = now() \
     RETURNING checkpoint, checkpoint_sub";

/// A sink's commit, first: the position row, locked until the commit ends.
pub(crate) const LOCK_POSITION: &str = "SELECT owner, fence, checkpoint, checkpoint_sub \
     FROM kcl_positions WHERE application = $1 AND lease_key = $2 FOR UPDATE";

/// A sink's commit, last: the position moved to the commit's checkpoint `$3`/`$4` (the row
/// is locked, and was found to be the committing tenure's).
pub(crate) const ADVANCE_POSITION: &str = "UPDATE kcl_positions SET checkpoint = $3, \
     checkpoint_sub = $4, updated_at = now() WHERE application = $1 AND lease_key = $2";

/// Checks that `kcl_positions` has every column the sink uses.
pub(crate) const PROBE_POSITIONS: &str = "SELECT application, lease_key, owner, fence, \
     checkpoint, checkpoint_sub, updated_at FROM kcl_positions LIMIT 0";
