//! Standby mode ([`SingletonConfig::standby`]): one candidate reads the row often, the
//! others seldom.
//!
//! Without it every candidate reads the row every poll interval: W candidates cost W reads a
//! poll. With it, besides the row `<name>`, the candidates compete for a second row
//! `<name>/standby`, which only candidates not holding the singleton hold. The standby reads
//! the singleton's row every poll interval, so it takes over within the failover time plus a
//! poll of the holder's death, and within a poll of its graceful release; the others read
//! the standby row every 2 × failover time and the singleton's row every 6 ×: they matter only
//! once the standby has moved up or is gone. The worker's own leader election works the same
//! way. The cost: after the standby moves up, the fleet has no standby for up to 2 × failover
//! time, and a holder that dies or stops then is replaced after up to 6 × failover time.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Singleton, TaskContext};
use crate::error::ConfigError;
use crate::lease::LeaseStore;
use crate::types::WorkerId;

/// The slow candidates' pace: the singleton's row every this many failover times.
const ROW_EVERY: u32 = 6;
/// The slow candidates' pace: the standby row every this many failover times.
const STANDBY_EVERY: u32 = 2;

/// Sets the singleton candidate's fast pace while alive, its slow pace once dropped (however
/// the standby task ends: returned, or dropped at its lease's deadline).
struct Fast<'a, L: LeaseStore>(&'a Singleton<L>);

impl<L: LeaseStore> Fast<'_, L> {
    fn on(main: &Singleton<L>) -> Fast<'_, L> {
        main.set_poll_interval(main.config.poll_interval);
        Fast(main)
    }
}

impl<L: LeaseStore> Drop for Fast<'_, L> {
    fn drop(&mut self) {
        self.0
            .set_poll_interval(self.0.config.failover_time * ROW_EVERY);
    }
}

impl<L: LeaseStore> Singleton<L> {
    /// The standby row's candidate.
    pub(super) fn standby(&self) -> Result<Singleton<std::sync::Arc<L>>, ConfigError> {
        let config = super::SingletonConfig {
            poll_interval: self.config.failover_time * STANDBY_EVERY,
            standby: false,
            health_timeout: None,
            ..self.config.clone()
        };
        Singleton::named(
            &format!("{}/standby", self.name()),
            self.me.clone(),
            self.store.clone(),
            config,
        )
    }

    /// Competes for the standby row while this candidate does not hold the singleton, until
    /// `shutdown`; the singleton's candidate polls fast only while it holds the standby row.
    pub(super) async fn back_up(
        &self,
        standby: &Singleton<std::sync::Arc<L>>,
        shutdown: &CancellationToken,
    ) {
        self.set_poll_interval(self.config.failover_time * ROW_EVERY);
        let mut holder = self.holder.subscribe();
        while !shutdown.is_cancelled() {
            // Not while holding the singleton itself.
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = until(&mut holder, &self.me, false) => {}
            }
            let stop = shutdown.child_token();
            // `compete`, not `run`: the table exists, and `run` would nest standby rows.
            let mut task = |ctx: TaskContext| async move {
                let _fast = Fast::on(self);
                ctx.cancelled().cancelled().await;
            };
            let run = standby.compete(&stop, &mut task);
            tokio::pin!(run);
            tokio::select! {
                result = &mut run => {
                    if let Err(error) = result {
                        tracing::debug!(%error, singleton = %self.key, "standby failed");
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(self.config.failover_time) => {}
                        }
                    }
                }
                () = until(&mut holder, &self.me, true) => {
                    // Moved up: the standby row goes back at once, for another candidate.
                    stop.cancel();
                    let _ = run.await;
                }
            }
        }
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
