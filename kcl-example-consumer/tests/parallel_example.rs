//! `examples/parallel.rs` as a user runs it: every record handled once, each partition key's
//! records in order. (How much faster it is than one at a time is measured by
//! `cargo bench -p kcl-core --bench parallel`, not here.)

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context as _, ensure};

#[test]
fn the_parallel_example_handles_every_record_in_order_per_key() -> anyhow::Result<()> {
    let binary = common::example::binary("parallel")?;
    let out = Command::new(binary).output()?;
    let stdout = String::from_utf8(out.stdout)?;
    ensure!(out.status.success(), "the example failed:\n{stdout}");
    // Lines `user-K: order I`, I increasing within each key.
    let mut last: BTreeMap<&str, u32> = BTreeMap::new();
    let mut count = 0;
    for line in stdout.lines() {
        let Some((key, order)) = line.split_once(": order ") else {
            continue;
        };
        let order: u32 = order.parse()?;
        if let Some(previous) = last.insert(key, order) {
            ensure!(previous < order, "{key}: order {order} after {previous}");
        }
        count += 1;
    }
    ensure!(
        count == 200,
        "200 records handled once each, not {count}:\n{stdout}"
    );
    stdout
        .lines()
        .find(|l| l.starts_with("200 records handled in "))
        .context("the example reports when the last record was handled")?;
    Ok(())
}
