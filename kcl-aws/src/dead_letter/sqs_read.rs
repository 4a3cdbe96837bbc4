//! Reading a queue's letters back without deleting them ([`list`]), deleting those redriven
//! ([`delete`]) and showing the others again ([`release`]).
//!
//! A reader holds every message it received (hidden from other readers for its visibility
//! timeout) until it deletes or releases it. On a FIFO queue SQS returns no message of a
//! group while one received of it is neither deleted nor visible again, so a reader holding
//! a group's first messages never sees the rest: [`list`] moves each message it meets that
//! does not have a group of its own (letters an `SqsSink` wrote before each letter had one,
//! grouped by shard; other writers' messages) into one (the same body and attributes, sent again, then the original
//! deleted), and holds it once it comes back. The sink gives each letter a group of its own
//! from the start, so a queue is moved once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, Message, MessageSystemAttributeName,
    QueueAttributeName,
};
use kcl_core::{BackendError, ErrorKind};

use super::s3;
use super::sqs::{OWN_GROUP, own_group};
use super::stored::{At, Listing, Stored, Unreadable};
use crate::error::backend_error;

/// A message held while listing.
struct Held {
    receipt: String,
    body: String,
    /// When its visibility timeout last started (received, or extended).
    since: Instant,
}

/// Receives every message of `queue_url` (each hidden from other readers for `visibility`
/// once received, the timeout extended while the listing goes on, and never deleted),
/// following pointers into S3. On a FIFO queue, a message met in a group shared with others
/// is first moved into a group of its own.
pub(crate) async fn list(
    sqs: &Client,
    s3: &aws_sdk_s3::Client,
    queue_url: &str,
    visibility: Duration,
    wait: Duration,
) -> Result<Listing, BackendError> {
    let fifo = queue_url.ends_with(".fifo");
    // By message id: a message received again (its visibility ran out) keeps its newest
    // receipt handle, which deletes it.
    let mut received: HashMap<String, Held> = HashMap::new();
    loop {
        extend(sqs, queue_url, &mut received, visibility).await?;
        let since = Instant::now();
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(seconds(visibility).max(1))
            .wait_time_seconds(seconds(wait).min(20))
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| backend_error("receive_message", format!("queue {queue_url}"), e))?;
        let mut changed = false;
        for message in out.messages() {
            if fifo && !in_own_group(message) {
                move_to_own_group(sqs, queue_url, message).await?;
                changed = true;
            } else {
                changed |= hold(&mut received, message, since);
            }
        }
        if !changed {
            break;
        }
    }
    let bodies = received
        .into_iter()
        .map(|(id, h)| (id, (h.receipt, h.body)));
    Ok(read(s3, bodies.collect()).await)
}

/// As [`list`], and about how many messages another reader holds
/// ([`Listing::in_flight`]): what an operator's listing says.
pub(crate) async fn list_counted(
    sqs: &Client,
    s3: &aws_sdk_s3::Client,
    queue_url: &str,
    visibility: Duration,
    wait: Duration,
) -> Result<Listing, BackendError> {
    let mut listing = list(sqs, s3, queue_url, visibility, wait).await?;
    let held = listing.letters.len() + listing.unreadable.len();
    let held = u64::try_from(held).unwrap_or(u64::MAX);
    listing.in_flight = not_visible(sqs, queue_url).await?.saturating_sub(held);
    Ok(listing)
}

/// SQS's count of the queue's messages in flight (received and neither deleted nor visible
/// again): approximate, as SQS says.
async fn not_visible(sqs: &Client, queue_url: &str) -> Result<u64, BackendError> {
    let name = QueueAttributeName::ApproximateNumberOfMessagesNotVisible;
    let out = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(name.clone())
        .send()
        .await
        .map_err(|e| backend_error("get_queue_attributes", format!("queue {queue_url}"), e))?;
    let count = out.attributes().and_then(|a| a.get(&name));
    Ok(count.and_then(|v| v.parse().ok()).unwrap_or(0))
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// Holds `message`, received at `since`; whether it is new.
fn hold(received: &mut HashMap<String, Held>, message: &Message, since: Instant) -> bool {
    let (Some(id), Some(receipt)) = (message.message_id(), message.receipt_handle()) else {
        return false;
    };
    let held = Held {
        receipt: receipt.to_owned(),
        body: message.body().unwrap_or_default().to_owned(),
        since,
    };
    received.insert(id.to_owned(), held).is_none()
}

/// Extends the visibility timeout of the messages held for half of it or more, so that a
/// long listing keeps them all (`ChangeMessageVisibilityBatch`, ten at a time). A message
/// whose receipt no longer works is received again, not lost.
async fn extend(
    sqs: &Client,
    queue_url: &str,
    received: &mut HashMap<String, Held>,
    visibility: Duration,
) -> Result<(), BackendError> {
    let mut due: Vec<&mut Held> = received
        .values_mut()
        .filter(|h| h.since.elapsed() >= visibility / 2)
        .collect();
    for chunk in due.chunks_mut(10) {
        let since = Instant::now();
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, h)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(&h.receipt)
                    .visibility_timeout(seconds(visibility).max(1))
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
        sqs.change_message_visibility_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| {
                backend_error(
                    "change_message_visibility_batch",
                    format!("queue {queue_url}"),
                    e,
                )
            })?;
        for held in chunk.iter_mut() {
            held.since = since;
        }
    }
    Ok(())
}

/// Whether `message` is alone in its group (the sink's groups, [`own_group`]).
fn in_own_group(message: &Message) -> bool {
    message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .is_some_and(|group| group.starts_with(OWN_GROUP))
}

/// Sends `message` again (body and attributes) in a group of its own, then deletes it: the
/// letter is never in neither. Its deduplication id comes from its message id, so a move
/// done again within SQS's five minutes (after a failure between the two steps) sends no
/// second copy; later, a second copy is a duplicate readers treat as one.
async fn move_to_own_group(
    sqs: &Client,
    queue_url: &str,
    message: &Message,
) -> Result<(), BackendError> {
    let (Some(id), Some(receipt)) = (message.message_id(), message.receipt_handle()) else {
        return Ok(());
    };
    sqs.send_message()
        .queue_url(queue_url)
        .message_body(message.body().unwrap_or_default())
        .set_message_attributes(message.message_attributes().cloned())
        .message_group_id(own_group(id))
        .message_deduplication_id(format!("kcl-moved-{id}"))
        .send()
        .await
        .map_err(|e| backend_error("send_message", format!("queue {queue_url}"), e))?;
    sqs.delete_message()
        .queue_url(queue_url)
        .receipt_handle(receipt)
        .send()
        .await
        .map_err(|e| backend_error("delete_message", format!("queue {queue_url}"), e))?;
    Ok(())
}

/// The letters of the messages held, by message id: their receipt handle and body (read from
/// S3 for pointers); and those that hold none.
async fn read(s3: &aws_sdk_s3::Client, received: HashMap<String, (String, String)>) -> Listing {
    let mut listing = Listing::default();
    for (message_id, (receipt_handle, body)) in received {
        match s3::letter_of(s3, body.as_bytes()).await {
            Ok((letter, object)) => {
                let at = At::Sqs {
                    message_id,
                    receipt_handle,
                    object,
                };
                listing.letters.push(Stored::new(letter, at));
            }
            Err(error) => listing.unreadable.push(Unreadable {
                place: format!("sqs message {message_id}"),
                error,
                at: Some(At::Sqs {
                    message_id,
                    receipt_handle,
                    object: None,
                }),
            }),
        }
    }
    listing
}

/// Deletes a message received by [`list`], then the object it points to, if any.
pub(crate) async fn delete(
    sqs: &Client,
    s3: &aws_sdk_s3::Client,
    queue_url: &str,
    at: &At,
) -> Result<(), BackendError> {
    let At::Sqs {
        receipt_handle,
        object,
        ..
    } = at
    else {
        return Ok(());
    };
    sqs.delete_message()
        .queue_url(queue_url)
        .receipt_handle(receipt_handle)
        .send()
        .await
        .map_err(|e| backend_error("delete_message", format!("queue {queue_url}"), e))?;
    // The object after the message: a failure here leaves an object nothing points to,
    // never a pointer to nothing.
    if let Some((bucket, key)) = object {
        s3::delete(s3, bucket, key).await?;
    }
    Ok(())
}

/// Makes a message received by [`list`] visible to other readers again, at once.
pub(crate) async fn release(sqs: &Client, queue_url: &str, at: &At) -> Result<(), BackendError> {
    let At::Sqs { receipt_handle, .. } = at else {
        return Ok(());
    };
    sqs.change_message_visibility()
        .queue_url(queue_url)
        .receipt_handle(receipt_handle)
        .visibility_timeout(0)
        .send()
        .await
        .map_err(|e| backend_error("change_message_visibility", format!("queue {queue_url}"), e))?;
    Ok(())
}
