//! Standbys ([`SingletonConfig::standbys`]): a short line of candidates reads often, the
//! others seldom.
//!
//! Were every candidate to read the row every poll interval, W candidates would cost W reads
//! a poll, forever. Instead, candidates stand in line on rows of their own: `<name>/standby`,
//! then `<name>/standby/standby` (with two standbys, the default), each a singleton that only
//! candidates holding nothing ahead of it compete for. The holder of a standby row reads the
//! row ahead of it every poll interval; everyone else reads the last standby row every 2 ×
//! the failover time and the rows ahead of it every 6 ×. When a row ahead frees up (released,
//! or observed unchanged for the failover time), the one behind takes it and hands its own
//! row back at once, so the next in line moves up within a poll; the slow readers refill the
//! last row within 2 × the failover time.
//!
//! The bounds that follow, from the holder's loss to the next holder's start:
//! - the holder dies: the failover time plus a poll; it stops (shutdown, an unhealthy task):
//!   a poll. The same a poll later when the standby itself moved up within the last poll (the
//!   next in line took its place);
//! - the holder and the standby die together: the next standby first takes the standby row
//!   (the failover time plus a poll), then the row: about twice the failover time plus
//!   three polls;
//! - only when the holder and every standby are lost within 2 × the failover time do the
//!   slow readers matter: up to about 6 × the failover time.
//!
//! The price: each standby renews its row as a holder does (a write every third of the
//! failover time) and reads the row ahead every poll.

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Singleton, TaskContext};
use crate::error::{ConfigError, Error};
use crate::lease::LeaseStore;
use crate::mutation::{self, Mutation};
use crate::types::WorkerId;

/// The slow candidates' pace: rows ahead of the last standby row every this many failover
/// times.
const ROW_EVERY: u32 = 6;
/// The slow candidates' pace: the last standby row every this many failover times.
const STANDBY_EVERY: u32 = 2;

/// Sets a candidate's fast pace while alive, its slow pace once dropped (however the
/// standby task ends: returned, or dropped at its lease's deadline).
struct Fast<'a, L: LeaseStore>(&'a Singleton<L>);

impl<L: LeaseStore> Fast<'_, L> {
    fn on(ahead: &Singleton<L>) -> Fast<'_, L> {
        ahead.set_poll_interval(ahead.config.poll_interval);
        Fast(ahead)
    }
}

impl<L: LeaseStore> Drop for Fast<'_, L> {
    fn drop(&mut self) {
        self.0
            .set_poll_interval(self.0.config.failover_time * ROW_EVERY);
    }
}

impl<L: LeaseStore> Singleton<L> {
    /// The candidate for the standby row behind this one; it has a line of its own one
    /// shorter. The last row's candidates poll at the slow pace: nobody stands behind them.
    pub(super) fn standby(&self) -> Result<Singleton<L>, ConfigError> {
        let behind = self.config.standbys - 1;
        let config = super::SingletonConfig {
            poll_interval: if behind == 0 {
                self.config.failover_time * STANDBY_EVERY
            } else {
                self.config.poll_interval
            },
            standbys: behind,
            health_timeout: None,
            ..self.config.clone()
        };
        Singleton::sharing(
            &format!("{}/standby", self.name()),
            self.me.clone(),
            self.store.clone(),
            config,
        )
    }

    /// Competes for the standby row while this candidate does not hold its own row, until
    /// `shutdown`; this candidate polls fast only while it holds the standby row.
    pub(super) async fn back_up(&self, standby: &Singleton<L>, shutdown: &CancellationToken) {
        // Not before this candidate has read the row ahead: one about to take it would take
        // the standby rows first, and give them back a moment later.
        let mut polled = self.polled.subscribe();
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            _ = polled.wait_for(|p| *p) => {}
        }
        self.set_poll_interval(self.config.failover_time * ROW_EVERY);
        let mut holder = self.holder.subscribe();
        while !shutdown.is_cancelled() {
            // Not while holding the row ahead.
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = until(&mut holder, &self.me, false) => {}
            }
            let stop = shutdown.child_token();
            let run = standby.stand_by(self, &stop);
            tokio::pin!(run);
            tokio::select! {
                biased;
                result = &mut run => {
                    if let Err(error) = result {
                        tracing::debug!(%error, singleton = %self.key, "standby failed");
                        tokio::select! {
                            biased;
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(self.config.failover_time) => {}
                        }
                    }
                }
                () = until(&mut holder, &self.me, true) => {
                    // Moved up: the standby row goes back at once, for the next in line.
                    stop.cancel();
                    let _ = run.await;
                }
            }
        }
    }

    /// Competes for this standby row (and, behind it, the rest of the line) until `stop`,
    /// keeping `ahead`'s candidate at its fast pace while holding it. Boxed: the line is a
    /// recursion of rows (`contend`, `back_up`, `stand_by`).
    fn stand_by<'a>(
        &'a self,
        ahead: &'a Singleton<L>,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let watched = if mutation::on(Mutation::StandbyWatchesItsOwnRow) {
                self
            } else {
                ahead
            };
            let mut task = |ctx: TaskContext| async move {
                let _fast = Fast::on(watched);
                ctx.cancelled().cancelled().await;
            };
            // `contend`, not `run`: the table exists.
            self.contend(stop, &mut task).await
        })
    }
}

/// Waits until this candidate holds the singleton (`holding`), or does not.
async fn until(holder: &mut watch::Receiver<Option<WorkerId>>, me: &WorkerId, holding: bool) {
    // A closed channel (the singleton dropped) waits forever: shutdown ends the loop.
    if holder
        .wait_for(|h| (h.as_ref() == Some(me)) == holding)
        .await
        .is_err()
    {
        std::future::pending::<()>().await;
    }
}
