//! The exactly-once bench's tables: medians over the runs of each mode and shard count, the
//! commit latencies over every call of the runs; what moto reported; the lease store's
//! requests by operation (for Postgres leases, its statements).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kcl_core::lease::usage::Operation;

use super::{BATCH, Measured, Mode};
use crate::latency::percentile;

fn median_f64(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// Every run of one mode and shard count.
#[derive(Debug, Default)]
struct Runs(Vec<Measured>);

impl Runs {
    fn row(&self, mode: Mode, shards: i32) -> String {
        let rates: Vec<f64> = self.0.iter().map(|m| m.records_per_s).collect();
        let mut calls: Vec<Duration> = self.0.iter().flat_map(|m| m.calls.clone()).collect();
        let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
        let list = rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let units: Vec<f64> = self.0.iter().filter_map(|m| m.units_per_1000).collect();
        let units = if units.is_empty() {
            "—".to_owned()
        } else {
            format!("{:.0}", median_f64(&units))
        };
        let rows: Vec<f64> = self.0.iter().map(|m| m.row_writes_per_1000).collect();
        format!(
            "| {} | {shards} | {:.0} | {} ms | {} ms | {} | {units} | {:.1} | {list} |",
            mode.name(),
            median_f64(&rates),
            ms(percentile(&mut calls, 0.5)),
            ms(percentile(&mut calls, 0.99)),
            calls.len(),
            median_f64(&rows),
        )
    }

    /// What moto reported per 1,000 records: for the puts, for the lease-row writes.
    fn reported(&self) -> (f64, f64) {
        let puts: Vec<f64> = self.0.iter().map(|m| m.reported_puts_per_1000).collect();
        let rows: Vec<f64> = self.0.iter().map(|m| m.reported_rows_per_1000).collect();
        (median_f64(&puts), median_f64(&rows))
    }

    /// Medians over the runs of the first and the last quarter's median commit, in ms.
    fn drift(&self) -> (f64, f64) {
        let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
        let early: Vec<f64> = self.0.iter().map(|m| ms(&m.early)).collect();
        let late: Vec<f64> = self.0.iter().map(|m| ms(&m.late)).collect();
        (median_f64(&early), median_f64(&late))
    }

    /// The lease store's requests per 1,000 records, medians over the runs: all of them,
    /// and by operation (those above 0.05).
    fn requests(&self) -> (f64, String) {
        let all: Vec<f64> = (self.0.iter())
            .map(|m| m.requests_per_1000.values().sum())
            .collect();
        let mut by: BTreeMap<Operation, Vec<f64>> = BTreeMap::new();
        for measured in &self.0 {
            for operation in measured.requests_per_1000.keys() {
                by.entry(*operation).or_default();
            }
        }
        for (operation, values) in &mut by {
            for measured in &self.0 {
                values.push(
                    (measured.requests_per_1000.get(operation))
                        .copied()
                        .unwrap_or_default(),
                );
            }
        }
        let parts: Vec<String> = (by.iter())
            .map(|(operation, values)| (operation, median_f64(values)))
            .filter(|(_, median)| *median >= 0.05)
            .map(|(operation, median)| format!("{operation} {median:.1}"))
            .collect();
        (median_f64(&all), parts.join(", "))
    }
}

/// Every run of the sitting, by mode and shard count.
#[derive(Debug, Default)]
pub(super) struct All(HashMap<(Mode, i32), Runs>);

impl All {
    pub(super) fn add(&mut self, mode: Mode, shards: i32, measured: Measured) {
        self.0.entry((mode, shards)).or_default().0.push(measured);
    }

    /// Each of `modes`' rows, 1 shard then 8.
    fn rows<'a>(&'a self, modes: &'a [Mode]) -> impl Iterator<Item = (Mode, i32, &'a Runs)> {
        [1, 8].into_iter().flat_map(move |shards| {
            (modes.iter())
                .filter_map(move |&mode| Some((mode, shards, self.0.get(&(mode, shards))?)))
        })
    }

    /// The three tables.
    pub(super) fn print(&self, modes: &[Mode]) {
        println!();
        println!(
            "| processor's writes, batches of {BATCH} | shards | records/s (median) | commit p50 | commit p99 | commit calls | DynamoDB write units / 1,000 records | lease-row writes / 1,000 records | records/s, each run |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for (mode, shards, runs) in self.rows(modes) {
            println!("{}", runs.row(mode, shards));
        }
        println!();
        println!(
            "| on moto | shards | write units moto reported (`ConsumedCapacity`) / 1,000 records: puts | lease-row writes | commit p50, first quarter of a run's calls | last quarter |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for (mode, shards, runs) in self.rows(modes) {
            let (puts, rows) = runs.reported();
            let (early, late) = runs.drift();
            let (puts, rows) = match mode {
                Mode::PostgresLeases => ("—".to_owned(), "—".to_owned()),
                Mode::PostgresSink => ("—".to_owned(), format!("{rows:.1}")),
                _ => (format!("{puts:.1}"), format!("{rows:.1}")),
            };
            println!(
                "| {} | {shards} | {puts} | {rows} | {early:.1} ms | {late:.1} ms |",
                mode.name()
            );
        }
        println!();
        println!(
            "| lease store's requests (its `usage`) until the last commit | shards | per 1,000 records | by operation |"
        );
        println!("|---|---:|---:|---|");
        for (mode, shards, runs) in self.rows(modes) {
            let (all, by) = runs.requests();
            println!("| {} | {shards} | {all:.1} | {by} |", mode.name());
        }
    }
}
