//! The writes of a held lease, object-safe so that [`Checkpointer`](crate::Checkpointer) and
//! a [`Tenure`](super::tenure::Tenure) need not be generic over the store.

use std::future::Future;
use std::pin::Pin;

use super::{CheckpointUpdate, Lease, LeaseStore, LeaseStoreExtras};
use crate::error::BackendError;
use crate::types::{ShardId, WorkerId};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub(crate) trait HeldLeaseStore: Send + Sync {
    fn renew<'a>(&'a self, held: &'a Lease) -> BoxFuture<'a, Result<Lease, BackendError>>;
    fn checkpoint<'a>(
        &'a self,
        held: &'a Lease,
        update: &'a CheckpointUpdate,
    ) -> BoxFuture<'a, Result<Lease, BackendError>>;
    fn take<'a>(
        &'a self,
        held: &'a Lease,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, BackendError>>;
    fn release<'a>(&'a self, held: &'a Lease) -> BoxFuture<'a, Result<(), BackendError>>;
    fn get<'a>(&'a self, key: &'a ShardId) -> BoxFuture<'a, Result<Option<Lease>, BackendError>>;
    fn unpark<'a>(
        &'a self,
        key: &'a ShardId,
        entries: &'a [String],
    ) -> BoxFuture<'a, Result<(), BackendError>>;
    fn request_redrive<'a>(
        &'a self,
        key: &'a ShardId,
        parked: &'a str,
        request: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;
}

impl<L: LeaseStore> HeldLeaseStore for L {
    fn renew<'a>(&'a self, held: &'a Lease) -> BoxFuture<'a, Result<Lease, BackendError>> {
        Box::pin(LeaseStore::renew(self, held))
    }
    fn checkpoint<'a>(
        &'a self,
        held: &'a Lease,
        update: &'a CheckpointUpdate,
    ) -> BoxFuture<'a, Result<Lease, BackendError>> {
        Box::pin(LeaseStore::checkpoint(self, held, update))
    }
    fn take<'a>(
        &'a self,
        held: &'a Lease,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, BackendError>> {
        Box::pin(LeaseStore::take(self, held, to))
    }
    fn release<'a>(&'a self, held: &'a Lease) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(LeaseStore::release(self, held))
    }
    fn get<'a>(&'a self, key: &'a ShardId) -> BoxFuture<'a, Result<Option<Lease>, BackendError>> {
        Box::pin(LeaseStore::get(self, key))
    }
    fn unpark<'a>(
        &'a self,
        key: &'a ShardId,
        entries: &'a [String],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(LeaseStoreExtras::unpark(self, key, entries))
    }
    fn request_redrive<'a>(
        &'a self,
        key: &'a ShardId,
        parked: &'a str,
        request: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(LeaseStoreExtras::request_redrive(
            self, key, parked, request,
        ))
    }
}
