//! Update expressions: the clauses of one conditional write, with the attribute names and
//! values they use.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::{Checkpoint, CheckpointUpdate, Lease, LeaseLoad};

use super::schema::{
    self, CARRIER, CHECKPOINT, CHECKPOINT_SUB_SEQUENCE_NUMBER, CHILD_SHARD_IDS, COND_NO_OWNER,
    COND_OWNER, ENDPOINT, LEASE_COUNTER, LEASE_OWNER, OWNER_SWITCHES_SINCE_CHECKPOINT, PARKED_KEYS,
    PENDING_CHECKPOINT, PENDING_CHECKPOINT_STATE, PENDING_CHECKPOINT_SUB_SEQUENCE_NUMBER,
    START_TIMESTAMP, VAL_OWNER,
};
use kcl_core::ShardId;

/// An update expression under construction: clauses plus the names and values they use
/// (DynamoDB rejects unused names and values, so only used ones are registered).
#[derive(Debug, Default)]
pub(super) struct Expr {
    set: Vec<String>,
    remove: Vec<String>,
    add: Vec<String>,
    pub(super) condition: String,
    pub(super) names: HashMap<String, String>,
    pub(super) values: HashMap<String, AttributeValue>,
}

impl Expr {
    /// Starts with the condition that the row is as `observed` (owner and counter).
    pub(super) fn held(observed: &Lease) -> Self {
        let (condition, values) = schema::held_condition(observed);
        let mut e = Self {
            condition: condition.to_owned(),
            ..Self::default()
        };
        // Both held conditions name the counter and the owner.
        e.name(LEASE_COUNTER);
        e.name(LEASE_OWNER);
        for (placeholder, value) in values {
            e.values.insert(placeholder.to_owned(), value);
        }
        e
    }

    /// Conditional on the owner alone, as `observed` saw it.
    pub(super) fn owner_as(observed: &Lease) -> Self {
        let mut e = Self::default();
        e.name(LEASE_OWNER);
        match &observed.owner {
            Some(owner) => {
                e.condition = COND_OWNER.to_owned();
                e.values.insert(
                    VAL_OWNER.to_owned(),
                    AttributeValue::S(owner.as_str().to_owned()),
                );
            }
            None => e.condition = COND_NO_OWNER.to_owned(),
        }
        e
    }

    pub(super) fn name(&mut self, attribute: &str) -> String {
        let p = schema::placeholder(attribute);
        self.names.insert(p.clone(), attribute.to_owned());
        p
    }

    /// The clause that the row still holds checkpoint `at`, with its values (`:before`,
    /// `:beforeSub`). A row written before sub-sequence numbers were stored holds none:
    /// that is 0.
    pub(super) fn checkpoint_is(&mut self, at: &Checkpoint) -> String {
        let checkpoint = self.name(CHECKPOINT);
        let sub = self.name(CHECKPOINT_SUB_SEQUENCE_NUMBER);
        self.values.insert(
            ":before".to_owned(),
            AttributeValue::S(at.as_str().to_owned()),
        );
        self.values
            .insert(":beforeSub".to_owned(), schema::number(at.sub_sequence()));
        if at.sub_sequence() == 0 {
            format!(
                "{checkpoint} = :before AND ({sub} = :beforeSub OR attribute_not_exists({sub}))"
            )
        } else {
            format!("{checkpoint} = :before AND {sub} = :beforeSub")
        }
    }

    /// Adds `clause` to the condition, with `AND`.
    pub(super) fn and(&mut self, clause: &str) -> &mut Self {
        self.condition = if self.condition.is_empty() {
            clause.to_owned()
        } else {
            format!("{} AND {clause}", self.condition)
        };
        self
    }

    /// `SET #attribute = :attribute`.
    pub(super) fn set(&mut self, attribute: &str, value: AttributeValue) -> &mut Self {
        let name = self.name(attribute);
        let placeholder = format!(":{attribute}");
        self.set.push(format!("{name} = {placeholder}"));
        self.values.insert(placeholder, value);
        self
    }

    /// `SET #attribute = if_not_exists(#attribute, :zero) + :one`.
    pub(super) fn increment(&mut self, attribute: &str) -> &mut Self {
        let name = self.name(attribute);
        self.values.insert(":zero".to_owned(), schema::number(0));
        self.values.insert(":one".to_owned(), schema::number(1));
        self.set
            .push(format!("{name} = if_not_exists({name}, :zero) + :one"));
        self
    }

    /// `ADD #attribute :attribute`: elements added to a set.
    pub(super) fn add(&mut self, attribute: &str, value: AttributeValue) -> &mut Self {
        let name = self.name(attribute);
        let placeholder = format!(":{attribute}");
        self.add.push(format!("{name} {placeholder}"));
        self.values.insert(placeholder, value);
        self
    }

    /// `SET` the holder's load figure, if it has one (see `kcl_core::lease::load`).
    pub(super) fn load(&mut self, load: Option<LeaseLoad>) -> &mut Self {
        if let Some(load) = load {
            self.set(schema::LOAD, schema::number(load.milli.into()))
                .set(schema::CAPACITY, schema::number(load.capacity_milli.into()));
            if let Some(flow) = load.flow {
                self.set(schema::FLOW, AttributeValue::S(flow.encode()));
            }
        }
        self
    }

    /// `REMOVE #attribute`.
    pub(super) fn remove(&mut self, attribute: &str) -> &mut Self {
        let name = self.name(attribute);
        self.remove.push(name);
        self
    }

    /// Writes `update` into the row of `key` as a checkpoint does: the owner-switch count
    /// reset, the counter past `counter`.
    pub(super) fn checkpoint(
        &mut self,
        key: &ShardId,
        update: &CheckpointUpdate,
        counter: u64,
    ) -> &mut Self {
        self.write_checkpoint(key, update, Some(counter))
    }

    /// Writes `update` as [`checkpoint`](Self::checkpoint) does, the counter left alone: a
    /// transactional commit is fenced by owner, fence and checkpoint, and the counter is the
    /// renewals' (see `kcl_core::outputs`).
    pub(super) fn checkpoint_uncounted(
        &mut self,
        key: &ShardId,
        update: &CheckpointUpdate,
    ) -> &mut Self {
        self.write_checkpoint(key, update, None)
    }

    fn write_checkpoint(
        &mut self,
        key: &ShardId,
        update: &CheckpointUpdate,
        counter: Option<u64>,
    ) -> &mut Self {
        self.set(
            CHECKPOINT,
            AttributeValue::S(update.checkpoint.as_str().to_owned()),
        )
        .set(
            CHECKPOINT_SUB_SEQUENCE_NUMBER,
            schema::number(update.checkpoint.sub_sequence()),
        )
        .set(OWNER_SWITCHES_SINCE_CHECKPOINT, schema::number(0));
        if let Some(counter) = counter {
            self.set(LEASE_COUNTER, schema::number(counter + 1));
        }
        match &update.pending {
            Some(pending) => {
                self.set(
                    PENDING_CHECKPOINT,
                    AttributeValue::S(pending.as_str().to_owned()),
                )
                .set(
                    PENDING_CHECKPOINT_SUB_SEQUENCE_NUMBER,
                    schema::number(pending.sub_sequence()),
                );
            }
            None => {
                self.remove(PENDING_CHECKPOINT)
                    .remove(PENDING_CHECKPOINT_SUB_SEQUENCE_NUMBER)
                    .remove(PENDING_CHECKPOINT_STATE);
            }
        }
        if let Some(children) = schema::related_set(key, &update.child_shard_ids) {
            self.set(CHILD_SHARD_IDS, children);
        }
        if let Some(at) = update.start_timestamp {
            self.set(START_TIMESTAMP, schema::timestamp(at));
        }
        if let Some(endpoint) = &update.endpoint {
            self.set(ENDPOINT, AttributeValue::S(endpoint.clone()));
        }
        if !update.park.is_empty() {
            self.add(PARKED_KEYS, AttributeValue::Ss(update.park.clone()));
        }
        if let Some(grace) = update.restart_grace {
            self.set(schema::RESTART_GRACE, schema::millis(grace));
        }
        if let Some(signals) = &update.signals {
            self.set(schema::SIGNALS, AttributeValue::S(signals.clone()));
        }
        if let Some(carrier) = &update.carrier {
            self.set(CARRIER, AttributeValue::S(carrier.as_str().to_owned()));
        }
        // Goes with the checkpoint written here, or goes (see `kcl_core::ack::SparseAcks`).
        match &update.acked {
            Some(acked) => self.set(schema::ACKED, AttributeValue::S(acked.clone())),
            None => self.remove(schema::ACKED),
        };
        self
    }

    pub(super) fn update_expression(&self) -> String {
        let mut out = String::new();
        if !self.set.is_empty() {
            out.push_str("SET ");
            out.push_str(&self.set.join(", "));
        }
        if !self.remove.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str("REMOVE ");
            out.push_str(&self.remove.join(", "));
        }
        if !self.add.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str("ADD ");
            out.push_str(&self.add.join(", "));
        }
        out
    }
}
