//! One leader always (`Coordination::Leader`), judged from each worker's `Status::leading`
//! as sampled while it changed: whatever dies, and whatever an operator does to the role
//! rows (deleted, deleted and created again; `schedule`'s operator), two workers do not lead
//! at once past the failover time, and a fleet with a live worker is not without a leader
//! past [`leaderless_bound`].

use std::time::Duration;

use tokio::time::Instant;

use super::Evidence;
use crate::sim::problems::Running;

/// How long a fleet with a live, undisturbed worker may be without a leader: three failover
/// times and four taker intervals. A role carried by a heartbeat row is judged by its own
/// counter only from the consistent read that shows that row released (a failover time
/// after the holder's death), and then for the failover time; the follower reads it every
/// failover time; and the take, the first cycle and scheduling take a few intervals. Without
/// a heartbeat carrier it is two failover times. Documented in docs/guarantees.md.
fn leaderless_bound(failover: Duration, taker: Duration) -> Duration {
    failover * 3 + taker * 4
}

/// Whether `worker` was frozen or cut off from the store at some point in `[a, b]`: a frozen
/// process still shows the role it had, and acts on nothing.
fn disturbed(e: &Evidence<'_>, worker: &str, a: Instant, b: Instant) -> bool {
    let hit = |x: &Instant, y: &Instant| *x <= b && *y >= a;
    (e.journal.worker_disturbed.iter()).any(|(w, x, y)| w == worker && hit(x, y))
}

fn end_of(span: &Running, end: Instant) -> Instant {
    span.until.unwrap_or(end).min(end)
}

/// one-leader: two workers lead at once for at most the failover time, unless one of them
/// was frozen or partitioned meanwhile (it steps down as it resumes).
pub(super) fn one_leader(e: &Evidence<'_>, v: &mut Vec<String>) {
    let end = e.quiet.1;
    let spans = &e.journal.problems.leading;
    for (i, a) in spans.iter().enumerate() {
        for b in spans.iter().skip(i + 1).filter(|b| b.worker != a.worker) {
            let from = a.from.max(b.from);
            let until = end_of(a, end).min(end_of(b, end));
            let both = until.saturating_duration_since(from);
            if both <= e.failover
                || disturbed(e, &a.worker, from, until)
                || disturbed(e, &b.worker, from, until)
            {
                continue;
            }
            v.push(format!(
                "one-leader: {} and {} both led for {both:?} from {:?}",
                a.worker,
                b.worker,
                from.saturating_duration_since(e.start.instant)
            ));
        }
    }
}

/// leaderless: from the first time a worker led until the fleet is stopped, no stretch
/// without a leader lasts past [`leaderless_bound`] while some worker runs undisturbed all
/// through it and the store answers.
pub(super) fn leaderless(e: &Evidence<'_>, v: &mut Vec<String>) {
    let bound = leaderless_bound(e.failover, e.poll);
    let end = e.quiet.1;
    let mut spans: Vec<(Instant, Instant)> = (e.journal.problems.leading.iter())
        .map(|s| (s.from, end_of(s, end)))
        .collect();
    spans.sort();
    let Some(&(first, _)) = spans.first() else {
        return;
    };
    let mut covered = first;
    let mut gaps = Vec::new();
    for (from, until) in spans {
        if from > covered {
            gaps.push((covered, from));
        }
        covered = covered.max(until);
    }
    if covered < end {
        gaps.push((covered, end));
    }
    for (a, b) in gaps {
        let judged = a + bound;
        if b <= judged || store_faulted(e, a, judged) {
            continue;
        }
        let witness = e.journal.problems.running.iter().find(|r| {
            r.from <= a
                && r.until.is_none_or(|u| u >= judged)
                && !disturbed(e, &r.worker, a, judged)
        });
        if let Some(w) = witness {
            v.push(format!(
                "leaderless: no worker led for {:?} from {:?} while {} ran (bound {bound:?})",
                b - a,
                a.saturating_duration_since(e.start.instant),
                w.worker
            ));
        }
    }
}

fn store_faulted(e: &Evidence<'_>, a: Instant, b: Instant) -> bool {
    (e.journal.store_faulted.iter()).any(|(x, y)| *x <= b && *y >= a)
}
