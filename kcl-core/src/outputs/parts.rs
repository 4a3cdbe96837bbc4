//! Splitting a stretch of writes into transactions a store accepts.
//!
//! Greedy, in record order: a part takes whole records while they fit its [`Limits`] and
//! write no item the part writes already; the next record that does not fit starts the next
//! part. Each part but the last checkpoints its last record; the last one checkpoints the
//! position the processor asked for (records with no writes after the last write included).
//!
//! A part the store refuses as invalid without naming the write at fault (DynamoDB's
//! `ValidationException` for an item over 400 KB) is committed again one record at a time
//! ([`Part::by_record`]): the records before the one at fault commit, and the record whose
//! writes fail alone is the one to give up. Each of those parts checkpoints its own record, so
//! outputs and checkpoint stay in step between them as between any two parts.

use std::collections::BTreeSet;

use super::{Limits, Measure};
use crate::types::ExtendedSequenceNumber;

/// One transaction's writes and the record it checkpoints (`None`: the position asked for).
#[derive(Debug)]
pub(crate) struct Part<W> {
    /// The writes, each with its record.
    pub(crate) writes: Vec<(ExtendedSequenceNumber, W)>,
    pub(crate) through: Option<ExtendedSequenceNumber>,
}

impl<W> Part<W> {
    /// Whether its writes belong to more than one record.
    pub(crate) fn several_records(&self) -> bool {
        let mut records = self.writes.iter().map(|(record, _)| record);
        let first = records.next();
        records.any(|record| Some(record) != first)
    }

    /// The same writes, one record's per part (in record order, as [`split`] leaves them):
    /// each part checkpoints its record, the last one what this part checkpoints.
    pub(crate) fn by_record(self) -> Vec<Part<W>> {
        let Part { writes, through } = self;
        let mut parts: Vec<Part<W>> = Vec::new();
        for (record, write) in writes {
            match parts.last_mut() {
                Some(part) if part.through.as_ref() == Some(&record) => {
                    part.writes.push((record, write));
                }
                _ => parts.push(Part {
                    through: Some(record.clone()),
                    writes: vec![(record, write)],
                }),
            }
        }
        match parts.last_mut() {
            Some(last) => last.through = through,
            None => parts.push(Part {
                writes: Vec::new(),
                through,
            }),
        }
        parts
    }
}

/// A record whose writes alone exceed one transaction: nothing can commit them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TooLarge {
    pub(crate) record: ExtendedSequenceNumber,
    pub(crate) writes: usize,
    pub(crate) bytes: usize,
}

/// Splits `writes` (tagged with their records) into parts within `limits`. Fails, before
/// anything commits, if one record's writes exceed a transaction (or write one item twice).
pub(crate) fn split<W>(
    mut writes: Vec<(ExtendedSequenceNumber, W)>,
    measure: impl Fn(&W) -> Measure,
    limits: Limits,
) -> Result<Vec<Part<W>>, TooLarge> {
    // Stable: a record's writes keep the order they were pushed in.
    writes.sort_by(|a, b| a.0.cmp(&b.0));
    let mut parts = Vec::new();
    let mut current = Open::default();
    let mut writes = writes.into_iter().peekable();
    while let Some((record, first)) = writes.next() {
        let mut group = vec![(record.clone(), first)];
        while let Some(w) = writes.next_if(|(p, _)| *p == record) {
            group.push(w);
        }
        let sizes: Vec<Measure> = group.iter().map(|(_, w)| measure(w)).collect();
        let bytes: usize = sizes.iter().map(|m| m.bytes).sum();
        let items: Vec<&String> = sizes.iter().filter_map(|m| m.item.as_ref()).collect();
        let distinct: BTreeSet<&String> = items.iter().copied().collect();
        if group.len() > limits.writes || bytes > limits.bytes || distinct.len() < items.len() {
            return Err(TooLarge {
                record,
                writes: group.len(),
                bytes,
            });
        }
        let fits = current.writes.len() + group.len() <= limits.writes
            && current.bytes + bytes <= limits.bytes
            && distinct.iter().all(|i| !current.items.contains(*i));
        if !fits {
            parts.push(current.close());
        }
        current.bytes += bytes;
        current.items.extend(distinct.into_iter().cloned());
        current.writes.extend(group);
        current.last = Some(record);
    }
    // The last part checkpoints the position asked for.
    parts.push(Part {
        writes: current.writes,
        through: None,
    });
    Ok(parts)
}

struct Open<W> {
    writes: Vec<(ExtendedSequenceNumber, W)>,
    bytes: usize,
    items: BTreeSet<String>,
    last: Option<ExtendedSequenceNumber>,
}

impl<W> Default for Open<W> {
    fn default() -> Self {
        Self {
            writes: Vec::new(),
            bytes: 0,
            items: BTreeSet::new(),
            last: None,
        }
    }
}

impl<W> Open<W> {
    fn close(&mut self) -> Part<W> {
        let open = std::mem::take(self);
        Part {
            writes: open.writes,
            through: open.last,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    fn at(n: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber::new(SequenceNumber::from(u128::from(n)))
    }

    fn measure(w: &(u64, &'static str)) -> Measure {
        Measure {
            bytes: 10,
            item: (!w.1.is_empty()).then(|| w.1.to_owned()),
        }
    }

    const LIMITS: Limits = Limits {
        writes: 4,
        bytes: 1_000,
    };

    #[test]
    fn records_stay_whole_and_parts_checkpoint_their_last_record() {
        let writes = (1..=5)
            .flat_map(|r| [(at(r), (r, "")), (at(r), (r, ""))])
            .collect();
        let parts = split(writes, measure, LIMITS).unwrap();
        let shapes: Vec<(Vec<u64>, Option<ExtendedSequenceNumber>)> = parts
            .iter()
            .map(|p| (p.writes.iter().map(|w| w.1.0).collect(), p.through.clone()))
            .collect();
        assert_eq!(
            shapes,
            vec![
                (vec![1, 1, 2, 2], Some(at(2))),
                (vec![3, 3, 4, 4], Some(at(4))),
                (vec![5, 5], None),
            ]
        );
    }

    #[test]
    fn a_second_write_of_an_item_starts_a_part() {
        let writes = vec![(at(2), (2, "k")), (at(1), (1, "k")), (at(1), (1, "j"))];
        let parts = split(writes, measure, LIMITS).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].through, Some(at(1)));
        let writes =
            |p: &Part<(u64, &'static str)>| p.writes.iter().map(|w| w.1).collect::<Vec<_>>();
        assert_eq!(writes(&parts[0]), vec![(1, "k"), (1, "j")]);
        assert_eq!(writes(&parts[1]), vec![(2, "k")]);
    }

    #[test]
    fn bytes_split_too_and_a_record_too_large_is_refused_before_anything() {
        let small = Limits {
            writes: 100,
            bytes: 25,
        };
        let writes = vec![(at(1), (1, "")), (at(2), (2, "")), (at(3), (3, ""))];
        assert_eq!(split(writes, measure, small).unwrap().len(), 2);
        let writes = vec![
            (at(1), (1, "")),
            (at(2), (2, "")),
            (at(2), (2, "")),
            (at(2), (2, "")),
        ];
        let refused = split(writes, measure, small).unwrap_err();
        assert_eq!(
            (refused.record, refused.writes, refused.bytes),
            (at(2), 3, 30)
        );
        let twice = vec![(at(1), (1, "k")), (at(1), (1, "k"))];
        assert!(split(twice, measure, LIMITS).is_err());
    }

    #[test]
    fn a_part_by_record_checkpoints_each_record_and_the_last_as_the_part_did() {
        let shapes = |parts: Vec<Part<(u64, &'static str)>>| -> Vec<_> {
            parts
                .into_iter()
                .map(|p| {
                    (
                        p.writes.iter().map(|w| w.1.0).collect::<Vec<_>>(),
                        p.through,
                    )
                })
                .collect()
        };
        let writes = vec![
            (at(1), (1, "a")),
            (at(1), (1, "b")),
            (at(2), (2, "c")),
            (at(3), (3, "d")),
        ];
        let part = split(writes, measure, LIMITS).unwrap().remove(0);
        assert!(part.several_records());
        let parts = part.by_record();
        assert_eq!(
            shapes(parts),
            vec![
                (vec![1, 1], Some(at(1))),
                (vec![2], Some(at(2))),
                (vec![3], None),
            ]
        );
        // A part that checkpoints its last record keeps that checkpoint.
        let one = Part {
            writes: vec![(at(4), (4, "")), (at(4), (4, ""))],
            through: Some(at(4)),
        };
        assert!(!one.several_records());
        assert_eq!(shapes(one.by_record()), vec![(vec![4, 4], Some(at(4)))]);
    }

    #[test]
    fn no_writes_is_one_part_at_the_position_asked_for() {
        let parts = split(
            Vec::<(ExtendedSequenceNumber, (u64, &str))>::new(),
            measure,
            LIMITS,
        )
        .unwrap();
        assert_eq!(parts.len(), 1);
        assert!(parts[0].writes.is_empty() && parts[0].through.is_none());
    }
}
