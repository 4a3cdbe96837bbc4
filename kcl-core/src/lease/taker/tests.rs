use proptest::prelude::*;

use super::*;

fn w(i: usize) -> WorkerId {
    WorkerId::new(format!("w{i}"))
}

fn k(i: usize) -> ShardId {
    ShardId::new(format!("shardId-{i:012}"))
}

/// The fleet's lease table, reduced to owners and handoff requests.
#[derive(Debug, Clone)]
struct Table {
    owner: Vec<Option<usize>>,
    handoff: Vec<Option<usize>>,
}

impl Table {
    fn view(&self, me: usize) -> Vec<Candidate> {
        (0..self.owner.len())
            .map(|i| Candidate {
                key: k(i),
                holder: match self.owner[i] {
                    Some(o) if o == me => Holder::Me,
                    Some(o) => Holder::Other(w(o)),
                    None => Holder::Unowned,
                },
                handoff_to: self.handoff[i].map(w),
            })
            .collect()
    }

    fn counts(&self, workers: usize) -> Vec<usize> {
        let mut c = vec![0; workers];
        for o in self.owner.iter().flatten() {
            c[*o] += 1;
        }
        c
    }

    fn balanced(&self, workers: usize) -> bool {
        let s = self.owner.len();
        let (lo, hi) = (s / workers, s.div_ceil(workers));
        self.owner.iter().all(Option::is_some)
            && self.counts(workers).iter().all(|c| (lo..=hi).contains(c))
    }

    /// One taker cycle of every worker, then every owner grants what it may.
    fn round(&mut self, workers: usize, max_steal: usize) {
        let limits = Limits {
            max_leases: usize::MAX,
            max_steal,
        };
        for me in 0..workers {
            let plan = plan(&w(me), &self.view(me), limits);
            for key in plan.take {
                let i = self.index(&key);
                self.owner[i] = Some(me);
                self.handoff[i] = None;
            }
            for key in plan.request_handoff {
                let i = self.index(&key);
                self.handoff[i] = Some(me);
            }
        }
        for me in 0..workers {
            let grant = handoffs_to_grant(&w(me), &self.view(me), 0);
            let requested: Vec<usize> = (0..self.owner.len())
                .filter(|i| self.owner[*i] == Some(me) && self.handoff[*i].is_some())
                .collect();
            for i in requested.into_iter().take(grant) {
                self.owner[i] = self.handoff[i].take();
            }
        }
    }

    fn index(&self, key: &ShardId) -> usize {
        (0..self.owner.len())
            .find(|i| &k(*i) == key)
            .unwrap_or_else(|| unreachable!())
    }
}

fn table(workers: usize) -> impl Strategy<Value = Table> {
    proptest::collection::vec(proptest::option::of(0..workers), 0..40).prop_map(|owner| Table {
        handoff: vec![None; owner.len()],
        owner,
    })
}

proptest! {
    #[test]
    fn a_plan_never_overshoots_the_target(
        (workers, t) in (1usize..6).prop_flat_map(|n| (Just(n), table(n))),
        max_steal in 1usize..4,
        max_leases in 1usize..50,
    ) {
        for me in 0..workers {
            let view = t.view(me);
            let p = plan(&w(me), &view, Limits { max_leases, max_steal });
            let mine = view.iter().filter(|c| c.holder == Holder::Me).count();
            prop_assert!(p.target <= max_leases);
            prop_assert!(p.take.is_empty() || mine + p.take.len() <= p.target);
            prop_assert!(p.request_handoff.len() <= max_steal);
            prop_assert!(p.take.is_empty() || p.request_handoff.is_empty());
            for key in &p.take {
                let c = view.iter().find(|c| &c.key == key);
                let available = matches!(c.map(|c| &c.holder), Some(Holder::Unowned | Holder::Released | Holder::Expired { .. } | Holder::Adoptable));
                prop_assert!(available);
            }
            for key in &p.request_handoff {
                let c = view.iter().find(|c| &c.key == key);
                let owned = matches!(c.map(|c| &c.holder), Some(Holder::Other(_)));
                prop_assert!(owned);
            }
        }
    }

    #[test]
    fn the_fleet_converges_to_a_fair_share(
        (workers, mut t) in (1usize..6).prop_flat_map(|n| (Just(n), table(n))),
        max_steal in 1usize..3,
    ) {
        let mut rounds = 0;
        while !t.balanced(workers) {
            t.round(workers, max_steal);
            rounds += 1;
            prop_assert!(rounds <= 2 * t.owner.len() + 2, "no balance after {rounds} rounds: {:?}", t.counts(workers));
        }
        // Once balanced, nobody plans anything more.
        for me in 0..workers {
            let p = plan(&w(me), &t.view(me), Limits { max_leases: usize::MAX, max_steal });
            prop_assert!(p.take.is_empty() && p.request_handoff.is_empty(), "{me} still plans {p:?} at {:?}", t.counts(workers));
        }
    }
}

#[test]
fn takes_adoptable_then_unowned_then_longest_expired() {
    let me = w(0);
    let leases = vec![
        Candidate {
            key: k(0),
            holder: Holder::Expired {
                idle: Duration::from_secs(11),
                owner: w(5),
            },
            handoff_to: None,
        },
        Candidate {
            key: k(1),
            holder: Holder::Expired {
                idle: Duration::from_secs(50),
                owner: w(6),
            },
            handoff_to: None,
        },
        Candidate {
            key: k(2),
            holder: Holder::Unowned,
            handoff_to: None,
        },
        Candidate {
            key: k(3),
            holder: Holder::Adoptable,
            handoff_to: None,
        },
    ];
    let p = plan(
        &me,
        &leases,
        Limits {
            max_leases: 10,
            max_steal: 1,
        },
    );
    assert_eq!(p.take, vec![k(3), k(2), k(1), k(0)]);
    let p = plan(
        &me,
        &leases,
        Limits {
            max_leases: 2,
            max_steal: 1,
        },
    );
    assert_eq!(p.take, vec![k(3), k(2)]);
}

#[test]
fn steals_only_from_the_most_loaded_and_only_when_nothing_is_free() {
    let me = w(0);
    let mut leases: Vec<Candidate> = (0..6)
        .map(|i| Candidate {
            key: k(i),
            holder: Holder::Other(w(if i < 5 { 1 } else { 2 })),
            handoff_to: None,
        })
        .collect();
    let p = plan(
        &me,
        &leases,
        Limits {
            max_leases: 10,
            max_steal: 5,
        },
    );
    assert_eq!(p.target, 2);
    assert_eq!(p.request_handoff.len(), 2);
    assert!(
        p.request_handoff
            .iter()
            .all(|key| key.as_str() < k(5).as_str())
    );
    // A pending request counts as incoming: no second request for the same share.
    for key in &p.request_handoff {
        let i = leases
            .iter()
            .position(|c| &c.key == key)
            .unwrap_or_else(|| unreachable!());
        leases[i].handoff_to = Some(me.clone());
    }
    let again = plan(
        &me,
        &leases,
        Limits {
            max_leases: 10,
            max_steal: 5,
        },
    );
    assert!(again.request_handoff.is_empty());
}

#[test]
fn grants_keep_the_owner_at_its_floor() {
    let me = w(0);
    let mut leases: Vec<Candidate> = (0..4)
        .map(|i| Candidate {
            key: k(i),
            holder: Holder::Me,
            handoff_to: None,
        })
        .collect();
    leases[0].handoff_to = Some(w(1));
    leases[1].handoff_to = Some(w(2));
    // Three workers known (me and two requesters): floor(4 / 3) = 1, so three may go.
    assert_eq!(handoffs_to_grant(&me, &leases, 0), 3);
    assert_eq!(handoffs_to_grant(&me, &leases, 3), 0);
}
