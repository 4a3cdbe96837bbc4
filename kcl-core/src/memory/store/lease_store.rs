//! [`LeaseStore`] for [`MemoryLeaseStore`]: each operation as one conditional write (or a
//! read) of the table, with the condition DynamoDB's store uses.

use tokio::time::Instant;

use super::{Logged, MemoryLeaseStore, Table};
use crate::error::{BackendError, ErrorKind};
use crate::lease::feed::{FeedPosition, FeedRead};
use crate::lease::usage::{self, Operation, Usage};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore, LeaseStoreExtras, TableFeatures};
use crate::mutation::{self, Mutation};
use crate::types::{FencingToken, ShardId, WorkerId};

/// The whole table, for `list` and `snapshot`.
fn whole_table(t: &mut Table) -> (Vec<Lease>, u64, usize) {
    let bytes = t.rows.values().map(usage::item_size).sum();
    let rows = t.rows.values().cloned().collect();
    (rows, t.rows.len() as u64, bytes)
}

/// The fence of writes by a holder: owner and counter as the holder last saw them.
fn held_by(expected: &Lease) -> impl Fn(Option<&Lease>) -> bool + Send + 'static {
    let (owner, counter) = (expected.owner.clone(), expected.counter);
    move |row| row.is_some_and(|r| r.owner == owner && r.counter == counter)
}

/// `update` written into `r`, as a checkpoint writes it: the owner-switch count reset, the
/// counter bumped.
fn checkpointed(r: &mut Lease, update: &CheckpointUpdate) {
    update.apply_to(r);
    r.counter += 1;
}

fn missing(operation: &'static str) -> BackendError {
    BackendError::new(
        ErrorKind::Fatal,
        operation,
        "row vanished during a conditional write",
    )
}

impl LeaseStore for MemoryLeaseStore {
    /// The owner index is always there; the feed unless [`set_feed(None)`](Self::set_feed).
    async fn ensure_table(&self, wanted: TableFeatures) -> Result<TableFeatures, BackendError> {
        self.faults
            .enter(&self.client, Operation::EnsureTable.as_str(), true)
            .await?;
        let mut t = self.lock();
        t.exists = true;
        self.count(&t, Operation::EnsureTable, 0, 0.0, 0.0);
        Ok(wanted.and(TableFeatures::ALL.with_change_feed(!t.no_feed)))
    }

    async fn list(&self) -> Result<Vec<Lease>, BackendError> {
        self.read(Operation::List, whole_table).await
    }

    async fn snapshot(&self) -> Result<Vec<Lease>, BackendError> {
        self.read(Operation::Snapshot, whole_table).await
    }

    async fn get(&self, key: &ShardId) -> Result<Option<Lease>, BackendError> {
        self.read(Operation::Get, |t| {
            let row = t.rows.get(key).cloned();
            let (found, bytes) = (row.is_some(), row.as_ref().map_or(0, usage::item_size));
            (row, u64::from(found), bytes)
        })
        .await
    }

    /// The row as it was up to the owner index's lag ago (see
    /// [`set_index_lag`](MemoryLeaseStore::set_index_lag)): an eventually consistent read.
    async fn peek(&self, key: &ShardId) -> Result<Option<Lease>, BackendError> {
        self.read(Operation::Peek, |t| {
            let row = t.stale_row(key);
            let (found, bytes) = (row.is_some(), row.as_ref().map_or(0, usage::item_size));
            (row, u64::from(found), bytes)
        })
        .await
    }

    async fn create(&self, lease: &Lease) -> Result<bool, BackendError> {
        let new = lease.clone();
        let result = self
            .write(
                Operation::Create,
                &lease.key,
                |row: Option<&Lease>| row.is_none(),
                move |_| Some(new),
            )
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::Conflict => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn renew(&self, held: &Lease) -> Result<Lease, BackendError> {
        let (fence, load) = (held_by(held), held.load);
        let condition = move |row: Option<&Lease>| {
            row.is_some() && (mutation::on(Mutation::RenewUnconditional) || fence(row))
        };
        let row = self
            .write(Operation::Renew, &held.key, condition, move |row| {
                row.map(|mut r| {
                    r.counter += 1;
                    if load.is_some() {
                        r.load = load;
                    }
                    r
                })
            })
            .await?;
        row.ok_or_else(|| missing("renew"))
    }

    async fn take(&self, observed: &Lease, new_owner: &WorkerId) -> Result<Lease, BackendError> {
        let new_owner = new_owner.clone();
        let row = self
            .write(
                Operation::Take,
                &observed.key,
                held_by(observed),
                move |row| {
                    row.map(|mut r| {
                        let adoption = r.owner.as_ref() == Some(&new_owner);
                        if !adoption {
                            r.owner_switches_since_checkpoint += 1;
                        }
                        if !adoption || mutation::on(Mutation::AdoptionDropsHandoff) {
                            r.handoff_to = None;
                        }
                        r.owner = Some(new_owner);
                        r.counter += 1;
                        r.fence = Some(FencingToken(r.counter));
                        r.restart_grace = None;
                        r
                    })
                },
            )
            .await?;
        row.ok_or_else(|| missing("take"))
    }

    async fn release(&self, held: &Lease) -> Result<(), BackendError> {
        self.write(Operation::Release, &held.key, held_by(held), |row| {
            row.map(|mut r| {
                r.owner = None;
                r.counter += 1;
                r.handoff_to = None;
                r.restart_grace = None;
                r
            })
        })
        .await
        .map(drop)
    }

    async fn request_handoff(
        &self,
        observed: &Lease,
        to: Option<&WorkerId>,
    ) -> Result<(), BackendError> {
        let (expected, to) = (observed.owner.clone(), to.cloned());
        let owner = move |row: Option<&Lease>| row.is_some_and(|r| r.owner == expected);
        self.write(
            Operation::RequestHandoff,
            &observed.key,
            owner,
            move |row| {
                row.map(|mut r| {
                    r.handoff_to = to;
                    r
                })
            },
        )
        .await
        .map(drop)
    }

    async fn checkpoint(
        &self,
        held: &Lease,
        update: &CheckpointUpdate,
    ) -> Result<Lease, BackendError> {
        let fence = held_by(held);
        let at = held.checkpoint.clone();
        let condition = move |row: Option<&Lease>| {
            row.is_some()
                && (mutation::on(Mutation::CheckpointUnconditional)
                    || (fence(row) && row.is_some_and(|r| r.checkpoint == at)))
        };
        let (update, load) = (update.clone(), held.load);
        let row = self
            .write(Operation::Checkpoint, &held.key, condition, move |row| {
                row.map(|mut r| {
                    checkpointed(&mut r, &update);
                    if load.is_some() {
                        r.load = load;
                    }
                    r
                })
            })
            .await?;
        row.ok_or_else(|| missing("checkpoint"))
    }

    async fn reset(
        &self,
        observed: &Lease,
        owner: &WorkerId,
        update: &CheckpointUpdate,
    ) -> Result<Lease, BackendError> {
        let (owner, update) = (owner.clone(), update.clone());
        // One write; journaled as its two effects, a `take` then a
        // `checkpoint` by the reset's client, at one instant (the feed serves them together),
        // as the simulation's checks read a reset.
        let row = self
            .write_logged(
                Operation::Reset,
                Logged::TakeThenCheckpoint,
                &observed.key,
                held_by(observed),
                move |row| {
                    row.map(|mut r| {
                        r.owner = Some(owner);
                        r.handoff_to = None;
                        r.restart_grace = None;
                        checkpointed(&mut r, &update);
                        r.fence = Some(FencingToken(r.counter));
                        r
                    })
                },
            )
            .await?;
        row.ok_or_else(|| missing("reset"))
    }

    async fn delete(&self, lease: &Lease) -> Result<(), BackendError> {
        let counter = lease.counter;
        self.write(
            Operation::Delete,
            &lease.key,
            move |row| row.is_some_and(|r| r.counter == counter),
            |_| None,
        )
        .await
        .map(drop)
    }

    /// The index of owners, as DynamoDB would keep it: keys only, about 60 bytes an entry.
    async fn owned_by(&self, owner: &WorkerId) -> Result<Vec<ShardId>, BackendError> {
        let now = Instant::now();
        self.read(Operation::OwnedBy, |t| {
            let stale = t
                .index
                .as_ref()
                .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= t.index_lag);
            if stale {
                let entries = t.rows.values().map(|l| (l.key.clone(), l.owner.clone()));
                t.index = Some((now, entries.collect()));
            }
            let keys: Vec<ShardId> = t
                .index
                .iter()
                .flat_map(|(_, entries)| entries)
                .filter(|(_, o)| o.as_ref() == Some(owner))
                .map(|(key, _)| key.clone())
                .collect();
            let (rows, bytes) = (keys.len() as u64, keys.len() * 60);
            (keys, rows, bytes)
        })
        .await
    }
}

impl LeaseStoreExtras for MemoryLeaseStore {
    fn offers_change_feed(&self) -> bool {
        true
    }

    async fn request_redrive(
        &self,
        key: &ShardId,
        parked: &str,
        request: &str,
    ) -> Result<bool, BackendError> {
        let (parked, request) = (parked.to_owned(), request.to_owned());
        let written = self
            .write(
                Operation::RequestRedrive,
                key,
                move |row| row.is_some_and(|r| r.parked_keys.contains(&parked)),
                move |row| {
                    row.map(|mut r| {
                        if !r.parked_keys.contains(&request) {
                            r.parked_keys.push(request);
                        }
                        r
                    })
                },
            )
            .await;
        match written {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == crate::ErrorKind::Conflict => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn unpark(&self, key: &ShardId, entries: &[String]) -> Result<(), BackendError> {
        let entries = entries.to_vec();
        self.write(
            Operation::Unpark,
            key,
            |row| row.is_some(),
            move |row| {
                row.map(|mut r| {
                    r.parked_keys.retain(|e| !entries.contains(e));
                    r
                })
            },
        )
        .await
        .map(drop)
    }

    /// The journal, each write visible once it is the feed's lag old.
    async fn changes(&self, from: Option<&FeedPosition>) -> Result<FeedRead, BackendError> {
        let now = Instant::now();
        self.read(Operation::ReadChanges, |t| {
            if t.no_feed {
                return (FeedRead::Unavailable, 0, 0);
            }
            let read = crate::memory::feed::read(&t.journal, from, t.feed_lag, now);
            let rows = match &read {
                FeedRead::Changes(changes, _) => changes.len() as u64,
                _ => 0,
            };
            (read, rows, 0)
        })
        .await
    }

    fn usage(&self) -> Option<Usage> {
        Some(self.usage.clone())
    }

    fn unreadable(&self) -> Vec<crate::lease::UnreadableRow> {
        let t = self.lock();
        let rows = t.unreadable.iter();
        rows.map(|(key, why)| crate::lease::UnreadableRow::new(Some(key.to_string()), why.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::types::Checkpoint;

    /// The leader writes a lease to `b` and, before `b` adopted it, asks `b` to hand it on to
    /// `c` (a balancing move). `b`'s adoption is a take that names `b` again: it keeps the
    /// request, so `b` hands the lease on at once. A take by anyone else clears it.
    #[tokio::test]
    async fn an_adoption_keeps_a_handoff_request_a_take_clears_it() {
        crate::mutation::set_from_env();
        let store = MemoryLeaseStore::new();
        store.ensure_table(TableFeatures::NONE).await.unwrap();
        let (a, b, c) = (WorkerId::new("a"), WorkerId::new("b"), WorkerId::new("c"));
        let mut lease = Lease::new(ShardId::new("shard-1"), Checkpoint::TrimHorizon);
        lease.owner = Some(a.clone());
        assert!(store.create(&lease).await.unwrap());
        let assigned = store.take(&lease, &b).await.unwrap();
        store.request_handoff(&assigned, Some(&c)).await.unwrap();
        let asked = store.get(&lease.key).await.unwrap().unwrap();

        let adopted = store.take(&asked, &b).await.unwrap();
        assert_eq!(
            adopted.handoff_to,
            Some(c.clone()),
            "the adoption kept the request"
        );
        assert_eq!(
            adopted.owner_switches_since_checkpoint, 1,
            "an adoption is no switch"
        );

        let taken = store.take(&adopted, &a).await.unwrap();
        assert_eq!(
            taken.handoff_to, None,
            "a take by another worker clears the request"
        );
    }
}
