-- kcl's lease table on Postgres (kcl-postgres).
--
-- `PostgresLeaseStore::ensure_table` runs this file as it is, under an advisory lock, unless
-- the store is built with `TableSetup::External`; teams that manage their schema with their
-- own migrations apply it themselves (it only creates what is missing, so it may run again).
-- The table is found through the connection's `search_path`: to keep it in a schema of its
-- own, create the schema and put `?options=-csearch_path%3Dkcl` on the URL.
--
-- One table serves every application (the KCL Java name: one fleet consuming one stream):
-- the key is (application, lease_key). Every field of a lease is a typed column, none a
-- JSON document: the store's conditions compare them (owner, counter, checkpoint and its
-- sub-sequence number, fence), operators read and filter them, and a later column is added
-- here with `ADD COLUMN IF NOT EXISTS` without rewriting rows. The store names every column
-- it reads and writes, so columns a team adds for itself are left alone.
--
-- Writes: one conditional statement each (`UPDATE ... WHERE owner IS NOT DISTINCT FROM $ AND
-- counter = $ ... RETURNING`), autocommitted. Under READ COMMITTED, the default, two
-- concurrent writes of a row are serialised by its row lock and the second re-checks its
-- condition against the row the first committed, so exactly one of two takes wins; under
-- REPEATABLE READ or SERIALIZABLE the second fails with 40001, which the store reports as
-- retryable (and the retry then finds the condition false).
--
-- Exactly-once outputs (`kcl_postgres::Sql`, `PostgresLeaseStore` as `Transact`): a
-- processor's transaction moves the checkpoint of its lease row and runs its statements,
-- the row's update first:
--   UPDATE kcl_leases SET checkpoint = $, checkpoint_sub = $, ...
--    WHERE application = $ AND lease_key = $ AND owner = $ AND fence = $
--      AND checkpoint = $ AND checkpoint_sub = $
-- (never the counter, which renewals move), so a zombie's transaction updates no row and is
-- rolled back before any statement of its own runs. The typed `owner`, `fence`,
-- `checkpoint` and `checkpoint_sub` columns are that condition.

CREATE TABLE IF NOT EXISTS kcl_leases (
    -- The fleet (KCL Java: the application name, which names its DynamoDB table).
    application             text        NOT NULL,
    -- The shard id, or `account:stream:creationEpoch:shardId` for a multi-stream fleet, or a
    -- role, singleton or heartbeat row's key.
    lease_key               text        NOT NULL,
    -- The holder; NULL when released or never taken.
    owner                   text,
    -- Bumped by every write but a handoff request; the fence of every conditional write.
    counter                 bigint      NOT NULL DEFAULT 0 CHECK (counter >= 0),
    -- A sequence number (decimal) or TRIM_HORIZON, LATEST, AT_TIMESTAMP, SHARD_END.
    checkpoint              text        NOT NULL,
    -- The KPL sub-sequence number of the checkpoint.
    checkpoint_sub          bigint      NOT NULL DEFAULT 0 CHECK (checkpoint_sub >= 0),
    -- A prepared, not yet committed checkpoint, and its sub-sequence number.
    pending_checkpoint      text,
    pending_checkpoint_sub  bigint,
    -- Owner changes since the last checkpoint.
    owner_switches          bigint      NOT NULL DEFAULT 0,
    -- The counter the last take (or reset) wrote: the fencing token of the tenure.
    fence                   bigint,
    -- Parents and children of the shard, as lease keys.
    parent_shard_ids        text[]      NOT NULL DEFAULT '{}',
    child_shard_ids         text[]      NOT NULL DEFAULT '{}',
    -- The hash keys the shard serves (0 to 2^128 - 1).
    starting_hash_key       numeric(39, 0),
    ending_hash_key         numeric(39, 0),
    -- A worker that asked the holder to hand the lease over.
    handoff_to              text,
    -- Where a LATEST or AT_TIMESTAMP lease starts reading before its first checkpoint.
    start_timestamp         timestamptz,
    -- Where a singleton's holder takes messages.
    endpoint                text,
    -- Ordering keys parked behind a dead-lettered record, in the order they were parked.
    parked_keys             text[]      NOT NULL DEFAULT '{}',
    -- What the lease costs its holder, and the holder's capacity, in thousandths; how
    -- records arrive (four numbers), for the fleet's signals.
    load_milli              bigint,
    capacity_milli          bigint,
    flow                    text,
    -- Kept through its owner's restart: others wait this much longer than the failover time.
    restart_grace_ms        bigint,
    -- On a role row: the row whose renewals prove its holder alive.
    carrier                 text,
    -- On the fleet-signals row: the leader's figures.
    signals                 text,
    -- Records past the checkpoint that finished already (read only with that checkpoint).
    acked                   text,
    -- When the row was last written (for operators; kcl never reads it).
    updated_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (application, lease_key)
)
-- A renewal rewrites its row every few seconds and changes no indexed column: with room
-- left on each page, Postgres writes the new version beside the old one (a HOT update) and
-- touches no index.
WITH (fillfactor = 70);

-- The owner index: a follower finds its own leases (`owned_by`) without reading the table.
-- Only leases that have an owner are in it; a take changes it, renewals and checkpoints do
-- not.
CREATE INDEX IF NOT EXISTS kcl_leases_owner ON kcl_leases (application, owner)
    WHERE owner IS NOT NULL;

-- kcl_positions: where `PostgresSink` keeps each shard's position beside the outputs, when
-- the leases live elsewhere (DynamoDB). `PostgresSink::ensure_table` runs this file from this
-- comment on (the lease store runs all of it, so this table exists, empty, beside
-- kcl_leases).
--
-- A row names the tenure that opened the shard last (the lease's owner and fence when its
-- processor started): only that tenure commits. A commit locks the row (`SELECT ... FOR
-- UPDATE`), checks the tenure and the position, runs the processor's statements and moves
-- the position, in one transaction; an open (`INSERT ... ON CONFLICT DO UPDATE`) waits for a
-- commit in flight, so a zombie's commit lands before the next tenure reads the position,
-- or is refused.
CREATE TABLE IF NOT EXISTS kcl_positions (
    application             text        NOT NULL,
    lease_key               text        NOT NULL,
    -- The tenure that opened last: the lease's owner and fencing token.
    owner                   text        NOT NULL,
    fence                   bigint      NOT NULL,
    -- The checkpoint of the last commit (as kcl_leases.checkpoint); NULL before the first.
    checkpoint              text,
    checkpoint_sub          bigint      NOT NULL DEFAULT 0 CHECK (checkpoint_sub >= 0),
    -- When the row was last written (for operators; kcl never reads it).
    updated_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (application, lease_key)
)
-- Every commit rewrites its row and no indexed column: room for HOT updates, as kcl_leases.
WITH (fillfactor = 70);
