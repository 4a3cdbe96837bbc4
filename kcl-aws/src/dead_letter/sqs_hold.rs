//! A queue's letters of one parked key, held for a replay through the holder
//! ([`SinkReader`](super::SinkReader) on SQS).
//!
//! [`Hold::parked`] receives the whole queue (as a listing does), makes every message but the
//! key's letters visible again at once (`ChangeMessageVisibilityBatch` to 0), and keeps the
//! key's letters hidden for the hold's visibility timeout (every copy). Each later call
//! ([`Hold::remove`], another `parked`) first extends the letters held for half that time or
//! more, so a replay that removes a letter at least every half timeout keeps them all hidden.
//!
//! A receipt handle deletes its message only while the message is still hidden by that
//! receipt (after its timeout ends, another reader may receive it, and SQS then takes a delete
//! by the old receipt and deletes nothing). So [`Hold::remove`] deletes with the receipt only
//! if the hold is fresh by its own clock (less than three quarters of the timeout since it was
//! received or extended); otherwise (a letter's replay took longer) it receives the queue again
//! to find the letter's messages by id, with new receipts, and deletes those.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry;
use kcl_core::failure::Kept;
use kcl_core::{BackendError, ErrorKind};
use tokio::time::Instant;

use super::format::LetterId;
use super::sqs_read;
use super::stored::{At, Listing, Stored};
use crate::error::backend_error;

/// How long a listing hides the queue's messages at most (all but the key's are made visible
/// again as soon as it ends).
const LISTING_VISIBILITY: Duration = Duration::from_secs(30);

/// The key's letters held, by message id.
#[derive(Debug)]
pub(crate) struct Hold {
    sqs: Client,
    s3: aws_sdk_s3::Client,
    queue_url: String,
    /// How long a held letter stays hidden between two calls.
    pub(crate) visibility: Duration,
    /// Each receive's long poll.
    pub(crate) wait: Duration,
    held: std::sync::Mutex<HashMap<String, Held>>,
    /// One listing at a time: a listing hides every message from the others.
    listing: tokio::sync::Mutex<()>,
}

/// A message held.
#[derive(Debug, Clone)]
struct Held {
    /// Its letter's id and parked key.
    id: LetterId,
    key: String,
    receipt: String,
    object: Option<(String, String)>,
    /// When its visibility timeout last started (received or extended); `None` once no
    /// longer known to be hidden by `receipt`.
    since: Option<Instant>,
}

impl Held {
    fn at(&self, message_id: &str) -> At {
        At::Sqs {
            message_id: message_id.to_owned(),
            receipt_handle: self.receipt.clone(),
            object: self.object.clone(),
        }
    }
}

impl Hold {
    pub(crate) fn new(sqs: Client, s3: aws_sdk_s3::Client, queue_url: String) -> Self {
        Self {
            sqs,
            s3,
            queue_url,
            visibility: Duration::from_secs(60),
            wait: Duration::from_secs(1),
            held: std::sync::Mutex::default(),
            listing: tokio::sync::Mutex::const_new(()),
        }
    }

    /// The queue.
    pub(crate) fn queue_url(&self) -> &str {
        &self.queue_url
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every letter of the queue parked behind `key` (every copy), held; every other message
    /// made visible again.
    pub(crate) async fn parked(&self, key: &str) -> Result<Vec<Kept>, BackendError> {
        let _listing = self.listing.lock().await;
        // What an earlier call for the key still holds: a listing would not see it.
        let earlier: Vec<Held> = {
            let mut held = self.held();
            let ids: Vec<String> = held
                .iter()
                .filter(|(_, h)| h.key == key)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        let receipts: Vec<&str> = earlier.iter().map(|h| h.receipt.as_str()).collect();
        // A receipt that expired meanwhile cannot be changed: its message is visible anyway.
        let _ = self.set_visibility(&receipts, Duration::ZERO).await;
        let listing = self.list().await?;
        let (mine, others): (Vec<&Stored>, Vec<&Stored>) = listing
            .letters
            .iter()
            .partition(|s| s.letter.parked_key.as_deref() == Some(key));
        self.release(&others, &listing).await;
        let kept = mine
            .iter()
            .filter_map(|s| match &s.at {
                At::Sqs { message_id, .. } => Some(Kept::new(s.letter.clone(), message_id)),
                _ => None,
            })
            .collect();
        self.keep(&mine, key).await?;
        Ok(kept)
    }

    /// Deletes every message of `kept`'s letter held (and the objects they point to).
    pub(crate) async fn remove(&self, kept: &Kept) -> Result<(), BackendError> {
        if let Some(key) = &kept.letter.parked_key {
            self.extend_due(key).await?;
        }
        let id = LetterId::of(&kept.letter);
        let fresh_for = self.visibility.saturating_mul(3) / 4;
        let (copies, stale) = {
            let held = self.held();
            let copies: Vec<(String, Held)> = held
                .iter()
                .filter(|(_, h)| h.id == id)
                .map(|(m, h)| (m.clone(), h.clone()))
                .collect();
            let stale = copies
                .iter()
                .any(|(_, h)| h.since.is_none_or(|s| s.elapsed() >= fresh_for));
            (copies, stale)
        };
        if copies.is_empty() {
            // Removed already.
            return Ok(());
        }
        let copies = if stale {
            self.receive_again(&id).await?
        } else {
            copies
        };
        for (message_id, held) in copies {
            sqs_read::delete(&self.sqs, &self.s3, &self.queue_url, &held.at(&message_id)).await?;
            self.held().remove(&message_id);
        }
        Ok(())
    }

    /// The queue received whole, every message hidden for [`LISTING_VISIBILITY`].
    async fn list(&self) -> Result<Listing, BackendError> {
        let (sqs, s3, url) = (&self.sqs, &self.s3, &self.queue_url);
        sqs_read::list(sqs, s3, url, LISTING_VISIBILITY, self.wait).await
    }

    /// Makes `others` and the listing's unreadable messages visible again; a failure is only
    /// logged (they come back when the listing's timeout ends).
    async fn release(&self, others: &[&Stored], listing: &Listing) {
        let receipts: Vec<&str> = others
            .iter()
            .map(|s| &s.at)
            .chain(listing.unreadable.iter().filter_map(|u| u.at.as_ref()))
            .filter_map(|at| match at {
                At::Sqs { receipt_handle, .. } => Some(receipt_handle.as_str()),
                _ => None,
            })
            .collect();
        if let Err(error) = self.set_visibility(&receipts, Duration::ZERO).await {
            tracing::warn!(queue = %self.queue_url, %error, "dead letters read for a redrive stay hidden from other readers until their visibility timeout ends ({} s)", LISTING_VISIBILITY.as_secs());
        }
    }

    /// Holds `letters` (of `key`) for the hold's timeout.
    async fn keep(&self, letters: &[&Stored], key: &str) -> Result<(), BackendError> {
        let receipts: Vec<&str> = letters
            .iter()
            .filter_map(|s| match &s.at {
                At::Sqs { receipt_handle, .. } => Some(receipt_handle.as_str()),
                _ => None,
            })
            .collect();
        let since = Instant::now();
        let failed = self.set_visibility(&receipts, self.visibility).await?;
        let mut held = self.held();
        for (i, stored) in letters.iter().enumerate() {
            if let At::Sqs {
                message_id,
                receipt_handle,
                object,
            } = &stored.at
            {
                let entry = Held {
                    id: stored.id.clone(),
                    key: key.to_owned(),
                    receipt: receipt_handle.clone(),
                    object: object.clone(),
                    since: (!failed.contains(&i)).then_some(since),
                };
                held.insert(message_id.clone(), entry);
            }
        }
        Ok(())
    }

    /// Extends the timeout of the letters of `key` held for half of it or more (and still
    /// hidden): only the key being replayed, so that letters of a replay that stopped are
    /// visible again once their timeout ends.
    async fn extend_due(&self, key: &str) -> Result<(), BackendError> {
        let half = self.visibility / 2;
        let fresh_for = self.visibility.saturating_mul(3) / 4;
        let due: Vec<(String, String)> = self
            .held()
            .iter()
            .filter(|(_, h)| {
                h.key == key
                    && h.since
                        .is_some_and(|s| s.elapsed() >= half && s.elapsed() < fresh_for)
            })
            .map(|(m, h)| (m.clone(), h.receipt.clone()))
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let since = Instant::now();
        let receipts: Vec<&str> = due.iter().map(|(_, r)| r.as_str()).collect();
        let failed = self.set_visibility(&receipts, self.visibility).await?;
        let mut held = self.held();
        for (i, (message_id, _)) in due.iter().enumerate() {
            if let Some(h) = held.get_mut(message_id) {
                h.since = (!failed.contains(&i)).then_some(since);
            }
        }
        Ok(())
    }

    /// Receives the queue again for the messages of the letter `id`, whose receipts are no
    /// longer known to work: once its messages are visible again by any clock (their timeout
    /// ended: at most a quarter of it, and a second, from now), holds them and the other
    /// letters held whose timeout ended under new receipts, and makes every other message
    /// visible again. Returns the letter's messages now held; none found (another reader
    /// holds them, or they were deleted) is a retryable error.
    async fn receive_again(&self, id: &LetterId) -> Result<Vec<(String, Held)>, BackendError> {
        let _listing = self.listing.lock().await;
        let hidden_until = |h: &Held| {
            h.since
                .map(|s| s + self.visibility + Duration::from_secs(1))
        };
        let (key, until) = {
            let held = self.held();
            let mut copies = held.values().filter(|h| h.id == *id).peekable();
            let key = copies.peek().map(|h| h.key.clone()).unwrap_or_default();
            (key, copies.filter_map(hidden_until).max())
        };
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
        // The key's letters held whose timeout ended: visible to this listing, their receipts
        // void.
        let now = Instant::now();
        let visible: HashSet<LetterId> = {
            let mut held = self.held();
            let ended = held
                .values_mut()
                .filter(|h| h.key == key && hidden_until(h).is_none_or(|until| until <= now));
            ended
                .map(|h| {
                    h.since = None;
                    h.id.clone()
                })
                .collect()
        };
        let listing = self.list().await?;
        let (ours, others): (Vec<&Stored>, Vec<&Stored>) = listing
            .letters
            .iter()
            .partition(|s| visible.contains(&s.id));
        self.release(&others, &listing).await;
        self.keep(&ours, &key).await?;
        let mut held = self.held();
        let found: Vec<(String, Held)> = held
            .iter()
            .filter(|(_, h)| h.id == *id && h.since.is_some())
            .map(|(m, h)| (m.clone(), h.clone()))
            .collect();
        if found.is_empty() {
            return Err(BackendError::new(
                ErrorKind::Retryable,
                "receive_message",
                format!(
                    "the dead letter {id} is not in the queue {} now: another reader holds it \
                     (`kcl-admin dead-letters list` hides letters for 30 s), or it was deleted",
                    self.queue_url
                ),
            ));
        }
        // Copies not received again were deleted, or another reader holds them.
        held.retain(|_, h| h.id != *id || h.since.is_some());
        Ok(found)
    }

    /// Sets the visibility timeout of the messages received under `receipts`
    /// (`ChangeMessageVisibilityBatch`, ten at a time); the indexes of those SQS refused
    /// (their receipt no longer works).
    async fn set_visibility(
        &self,
        receipts: &[&str],
        timeout: Duration,
    ) -> Result<HashSet<usize>, BackendError> {
        let seconds = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
        let mut failed = HashSet::new();
        for (chunk_index, chunk) in receipts.chunks(10).enumerate() {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, receipt)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(*receipt)
                        .visibility_timeout(seconds)
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    BackendError::new(
                        ErrorKind::Fatal,
                        "change_message_visibility_batch",
                        e.to_string(),
                    )
                })?;
            let out = self
                .sqs
                .change_message_visibility_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| {
                    let what = format!("queue {}", self.queue_url);
                    backend_error("change_message_visibility_batch", what, e)
                })?;
            for entry in out.failed() {
                if let Ok(i) = entry.id().parse::<usize>() {
                    failed.insert(chunk_index * 10 + i);
                }
            }
        }
        Ok(failed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use aws_sdk_sqs::config::retry::RetryConfig;
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_sqs::operation::change_message_visibility_batch::ChangeMessageVisibilityBatchOutput;
    use aws_sdk_sqs::operation::delete_message::DeleteMessageOutput;
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
    use aws_sdk_sqs::types::Message;
    use aws_smithy_mocks::{
        MockResponseInterceptor, Rule, RuleMode, create_mock_http_client, mock,
    };
    use kcl_core::failure::Reason;

    use super::super::format::tests::sample;
    use super::super::format::to_json;
    use super::*;

    const KEY: &str = "00000000000000aa";

    fn client(rules: &[&Rule]) -> Client {
        let mut interceptor = MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
        for rule in rules {
            interceptor = interceptor.with_rule(rule);
        }
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .retry_config(RetryConfig::disabled())
            .http_client(create_mock_http_client())
            .interceptor(interceptor)
            .build();
        Client::from_conf(config)
    }

    fn s3() -> aws_sdk_s3::Client {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .http_client(create_mock_http_client())
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    fn received(receipt: &'static str, body: &str) -> ReceiveMessageOutput {
        let message = Message::builder()
            .message_id("m1")
            .receipt_handle(receipt)
            .body(body)
            .build();
        ReceiveMessageOutput::builder().messages(message).build()
    }

    /// A letter held past three quarters of the visibility timeout (a slow replay) is not
    /// deleted with its old receipt (which deletes nothing once another reader received the
    /// message): the queue is received again once the old timeout surely ended, and the
    /// letter deleted with its new receipt.
    #[tokio::test(start_paused = true)]
    async fn a_letter_held_too_long_is_received_again_and_deleted_by_its_new_receipt() {
        let mut letter = sample(Reason::Attempts);
        letter.parked_key = Some(KEY.to_owned());
        let body = to_json(&letter);
        let (first, again) = (body.clone(), body.clone());
        let receive = mock!(Client::receive_message)
            .sequence()
            .output(move || received("r1", &first))
            .output(|| ReceiveMessageOutput::builder().build())
            .output(move || received("r2", &again))
            .output(|| ReceiveMessageOutput::builder().build())
            .build();
        let hide = mock!(Client::change_message_visibility_batch).then_output(|| {
            ChangeMessageVisibilityBatchOutput::builder()
                .set_successful(Some(Vec::new()))
                .set_failed(Some(Vec::new()))
                .build()
                .unwrap()
        });
        let delete = mock!(Client::delete_message)
            .match_requests(|req| req.receipt_handle() == Some("r2"))
            .then_output(|| DeleteMessageOutput::builder().build());
        let sqs = client(&[&receive, &hide, &delete]);
        let hold = Hold::new(sqs, s3(), "https://sqs.example/q".to_owned());

        let kept = hold.parked(KEY).await.unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].letter, letter);
        tokio::time::advance(Duration::from_secs(50)).await;
        hold.remove(&kept[0]).await.unwrap();
        assert_eq!(receive.num_calls(), 4, "received again");
        assert_eq!(delete.num_calls(), 1, "deleted by its new receipt");
        hold.remove(&kept[0]).await.unwrap();
        assert_eq!(delete.num_calls(), 1, "removed once");
    }
}
