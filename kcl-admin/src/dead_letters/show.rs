//! `kcl-admin dead-letters show`, and how letters are printed: a table line each, the whole
//! letter, or JSON.

use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, SecondsFormat, Utc};
use kcl_aws::dead_letter::{LetterId, Stored, to_json};

use super::{FromArgs, LISTING_VISIBILITY, release, report};

/// Arguments of `kcl-admin dead-letters show`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The letter: `shard/sequence/subsequence`, as `list` shows it.
    id: LetterId,
    #[command(flatten)]
    from: FromArgs,
    /// The letter as JSON, in kcl-aws's dead-letter format (the payload in base64).
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    let store = args.from.open(sdk, LISTING_VISIBILITY)?;
    let listing = store.list().await?;
    release(&store, &listing, &Default::default()).await;
    let copies: Vec<&Stored> = listing.letters.iter().filter(|s| s.id == args.id).collect();
    let Some(first) = copies.first() else {
        anyhow::bail!("no letter {} at {}", args.id, store.location());
    };
    if args.json {
        report(&serde_json::to_string_pretty(&json(first))?);
    } else {
        report(&whole(first));
        if copies.len() > 1 {
            report(&format!(
                "\n{} copies of this letter (it was put more than once): {}",
                copies.len(),
                copies
                    .iter()
                    .map(|s| s.place())
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }
    Ok(())
}

/// A letter as `--json` prints it: its id, where it is, and the letter in the wire format.
pub(super) fn json(stored: &Stored) -> serde_json::Value {
    let letter: serde_json::Value =
        serde_json::from_str(&to_json(&stored.letter)).unwrap_or_default();
    serde_json::json!({
        "id": stored.id.to_string(),
        "place": stored.place(),
        "letter": letter,
    })
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// At most `max` characters of `text`, on one line.
fn clip(text: &str, max: usize) -> String {
    let line = text.replace(['\n', '\r', '\t'], " ");
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The letters as a table.
pub(super) fn table(letters: &[&Stored], now: DateTime<Utc>) -> String {
    let rows: Vec<[String; 6]> = letters
        .iter()
        .map(|s| {
            let l = &s.letter;
            let age = now
                .signed_duration_since(l.dead_lettered)
                .to_std()
                .unwrap_or_default();
            // The two largest units: `3years 12days`, `5m 12s`.
            let age = humantime::format_duration(std::time::Duration::from_secs(age.as_secs()))
                .to_string()
                .split(' ')
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            [
                s.id.to_string(),
                clip(&l.record.partition_key, 24),
                clip(&l.reason.to_string(), 28),
                l.attempts.to_string(),
                age,
                clip(&l.last_error, 60),
            ]
        })
        .collect();
    let header = ["ID", "KEY", "REASON", "ATTEMPTS", "AGE", "LAST ERROR"].map(String::from);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    let _ = write!(out, "{} letter(s)", rows.len());
    out
}

/// The whole letter, a field a line, the payload last.
fn whole(stored: &Stored) -> String {
    let l = &stored.letter;
    let r = &l.record;
    let none = || "(none)".to_owned();
    let fields = [
        ("id", stored.id.to_string()),
        ("kept at", stored.place()),
        ("application", l.application.clone().unwrap_or_else(none)),
        ("stream", l.stream.clone().unwrap_or_else(none)),
        ("shard", l.shard.to_string()),
        ("sequence number", r.sequence_number.to_string()),
        ("sub-sequence number", r.sub_sequence_number.to_string()),
        ("partition key", r.partition_key.clone()),
        (
            "explicit hash key",
            r.explicit_hash_key.clone().unwrap_or_else(none),
        ),
        ("arrived", time(r.approximate_arrival)),
        ("worker", l.worker.to_string()),
        ("attempts", l.attempts.to_string()),
        ("first failed", time(l.first_failed)),
        ("dead-lettered", time(l.dead_lettered)),
        ("reason", l.reason.to_string()),
        ("first error", l.first_error.clone()),
        ("last error", l.last_error.clone()),
        ("parked key", l.parked_key.clone().unwrap_or_else(none)),
    ];
    let mut out = String::new();
    for (name, value) in fields {
        let _ = writeln!(out, "{name:<20} {value}");
    }
    match std::str::from_utf8(&r.data) {
        Ok(text) => {
            let _ = write!(out, "payload ({} bytes, UTF-8):\n{text}", r.data.len());
        }
        Err(_) => {
            let _ = write!(
                out,
                "payload ({} bytes, not UTF-8, in base64):\n{}",
                r.data.len(),
                BASE64.encode(&r.data)
            );
        }
    }
    out
}
