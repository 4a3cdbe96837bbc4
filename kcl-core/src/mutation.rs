//! Deliberate bugs, for kcl's own mutation check (feature `mutation-testing`).
//!
//! A checker that never fails proves nothing. The simulation's mutation mode turns these on
//! one at a time and must report a violation for each; a mutation nothing catches is a hole
//! in the checker. Without the feature every check is a constant `false` and the compiler removes
//! every branch that asks it, so production builds carry none of this.

/// One deliberate bug.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The in-memory store commits a processor's outputs without checking the lease row's
    /// owner, fence and checkpoint.
    CommitUnfenced,
    /// A stretch of outputs too large for one transaction commits in parts that each
    /// checkpoint the whole stretch's position, not their own last record.
    PartsCheckpointTheStretch,
    /// A role holder ignores its row deleted, or deleted and created again, by another
    /// process (it leads on beside the new holder).
    StepDownIgnored,
    /// Placing by load, a lease nobody holds goes to the worker it leaves the most loaded.
    PlacedOnMostLoaded,
    /// The in-memory store writes checkpoints without checking owner and counter.
    CheckpointUnconditional,
    /// The in-memory store renews without checking owner and counter.
    RenewUnconditional,
    /// A shard consumer ignores its lease's validity: it delivers without checking it, and
    /// hooks run on past it.
    SkipValidityCheck,
    /// A processor hook runs on after the lease's validity ran out.
    HooksOutliveLease,
    /// A handoff passes the lease on without calling `shutdown_requested`.
    HandoffWithoutShutdownRequested,
    /// Leases are taken once their counter stood still for half the failover time.
    TakeAtHalfFailover,
    /// Children are taken and processed whether or not their parents finished.
    ForgetLineage,
    /// A singleton task is neither cancelled nor dropped when its lease is lost.
    SingletonNeverStopped,
    /// A singleton task is cancelled but awaited without limit (not dropped at the deadline).
    SingletonNotDropped,
    /// A `LATEST` start is not pinned: every reopen is at `LATEST` again.
    LatestUnpinned,
    /// On a fresh table, closed shards get `LATEST` leases and their children start at
    /// `TRIM_HORIZON`.
    ClosedShardsLeasedAtLatest,
    /// Children of tracked shards start at `LATEST` instead of their beginning.
    ChildrenAtLatest,
    /// After an uncertain write, a tenure adopts whatever row it reads back.
    ReconcileAnyRow,
    /// A shard the stream no longer has is retried forever instead of ended.
    VanishedShardRetried,
    /// Rebalancing takes leases from live owners instead of asking for a handoff.
    StealWithoutHandoff,
    /// A leader gives leases to every known worker, active or not (dead ones included).
    LeaderIgnoresActivity,
    /// Leases of an owner with a heartbeat row are taken without deleting that row first.
    TakeWithoutFence,
    /// A periodic job runs without recording its period in the singleton's row.
    PeriodNotRecorded,
    /// A singleton's fencing token is not the row's counter but a constant.
    FenceConstant,
    /// A singleton instance's inbox takes messages whether or not its lease is valid.
    InboxIgnoresLease,
    /// The checkpoint watermark ignores unfinished records: checkpoints go to the last
    /// delivered record.
    CheckpointPastUnfinished,
    /// [`Parallel`](crate::Parallel) runs records of one key at the same time.
    KeysOverlap,
    /// A singleton's standby reads its own row fast instead of the row ahead of it.
    StandbyWatchesItsOwnRow,
    /// `checkpoint_at` accepts a position past the watermark.
    CheckpointAtPastWatermark,
    /// [`Parallel`](crate::Parallel) starts the newest ready key first.
    ReadyKeysNewestFirst,
    /// Reading pauses on unfinished records only, however many finished ones wait behind an
    /// unfinished one.
    HeldCountsUnfinishedOnly,
    /// Work is stopped at the lease's validity only once its timer fires, not whenever it is
    /// polled past it.
    ValidityByTimerOnly,
    /// `admin::reset` moves a finished (`SHARD_END`) lease back.
    ResetFinished,
    /// A singleton candidate polls with a sighting of its row however old it is.
    SightingTrustedHoweverOld,
    /// A restarted processor reads the lease as its tenure last knew it, even after a write
    /// whose outcome is unknown.
    UncertainWriteIgnored,
    /// A shard's stall age starts again at every batch handed over, not when records begin
    /// to wait.
    StallAgeFromLastDelivery,
    /// A shard's stall age is not reset by its checkpoint moving, only by the checkpoint
    /// covering everything delivered.
    StallAgeIgnoresMoves,
    /// Shards are reported stalled (or failing) whether or not their lease is still valid.
    StalledPastValidity,
    /// No worker reports a lease unowned (nobody with room for it).
    UnownedNeverReported,
    /// The leader sees a refusal only while its move to the refusing worker is under way.
    RefusalSeenOnlyWhileMoving,
    /// A leader's read from before it took a lease hands it to the worker named in a
    /// refusal, as if asked to.
    RefusalTakenForRequest,
    /// A shard's checkpoint moves are seen by its task only (between batches), not by the
    /// coordinator as it publishes the stall age.
    StallAgeSeenByTaskOnly,
    /// The leader balances onto a worker that refused a lease lately, again and again.
    LeaderBalancesOntoRefusers,
    /// A worker seen releasing rows is active again if another of its rows moved in the same
    /// read or after (its last checkpoints while it shuts down).
    ReleaseOutweighedByRenewals,
    /// The failure policy gives a record up one try early.
    DeadLetterEarly,
    /// A bisect delivers a failed part again whole, its good half included.
    BisectRedeliversSucceeded,
    /// A record counts as dead-lettered (finished) though the sink refused it.
    SinkRefusalIgnored,
    /// Under `Parallel::park_keys`, a parked key's later records run.
    ParkedKeyRuns,
    /// A bisect delivers again the record standing at the processor's checkpoint (an
    /// off-by-one in what counts as checkpointed).
    BisectRedeliversCheckpointed,
    /// A parked key's entry is written with a checkpoint that stops short of the record that
    /// parked it.
    ParkingBeforeItsRecord,
    /// A parked key parks any record of the key, the one that parked it and earlier ones
    /// included (no comparison of positions).
    ParkedMatchIgnoresPosition,
    /// A failure policy gives up on records during an outage (every record failing) as it
    /// does on a lone poison record.
    OutageGivenUp,
    /// A redrive's replay runs while the key's later records run too (the key not held).
    ReplayWithoutHold,
    /// The outage run is counted per processor (each restart within a tenure anew), not per
    /// tenure.
    OutageRunPerProcessor,
    /// The load balancer's band is relative (10 % of the mean, as KCL Java's), not absolute.
    RelativeBand,
    /// The load balancer moves without a budget.
    NoMoveBudget,
    /// The load balancer moves leases it moved lately.
    NoStickiness,
    /// The leader balances counts whatever the loads.
    LoadIgnored,
    /// The load balancer acts on figures still moving (a change of load not yet smoothed
    /// in, a burst).
    FluxIgnored,
    /// The leader scales figures by a heartbeat row's total written before the worker's
    /// leases last changed, and takes a moved row's capacity for its new holder's.
    StaleTotals,
    /// A lease kept through its owner's restart (`restart_grace`) expires after the failover
    /// time alone: its grace is ignored.
    RestartGraceIgnored,
    /// A rolling replace as before issue 38: the leader takes released leases itself, then
    /// balances them on (two moves each), and a new follower asks for the leases naming it
    /// at the usual pace.
    ReleasedViaLeader,
    /// A role candidate poked because it was handed its row polls on its sighting of the row
    /// rather than reading it.
    PokeTrustsSighting,
    /// Between moves for load that fix the source alike, the balancer picks without
    /// looking at the move that would come next.
    NoLookAhead,
    /// A worker judges a role row by its own counter alone, as if it named no carrier.
    RoleCarrierIgnored,
    /// A carrier's write proves its role even when answered after the role's validity ran
    /// out (a lapsed role comes back).
    CarrierProvesAfterLapse,
    /// An adoption (a take that names the owner again) clears the handoff request written on
    /// the row while the lease was on its way to the adopter (as before stop 48).
    AdoptionDropsHandoff,
    /// A worker that gave a lease for load is spread small leases by count once the
    /// stickiness window is over, however hot the fleet still is.
    CountsFollowLoadMoves,
    /// A worker that just arrived is balanced onto at once (a surge pod takes leases from
    /// the others before the worker it replaces releases its own).
    ArrivalsBalancedOnto,
    /// The damper follows a rise at once, whatever `scale_up_window` is configured.
    ScaleUpWindowIgnored,
    /// A processor opening a shard ignores the records its lease row says finished past the
    /// checkpoint (`kclAcked`): it is handed them again.
    AckedIgnoredOnOpen,
    /// A shard opening on a worker whose sink keeps positions resumes from the lease's
    /// checkpoint even when the sink's position is ahead of it.
    SinkPositionIgnored,
    /// The in-memory sink that keeps positions commits without checking that its row names
    /// the committing tenure.
    SinkUnfenced,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: &'static [Self] = &[
        Self::CommitUnfenced,
        Self::PartsCheckpointTheStretch,
        Self::CheckpointUnconditional,
        Self::RenewUnconditional,
        Self::SkipValidityCheck,
        Self::HooksOutliveLease,
        Self::HandoffWithoutShutdownRequested,
        Self::TakeAtHalfFailover,
        Self::ForgetLineage,
        Self::SingletonNeverStopped,
        Self::SingletonNotDropped,
        Self::LatestUnpinned,
        Self::ClosedShardsLeasedAtLatest,
        Self::ChildrenAtLatest,
        Self::ReconcileAnyRow,
        Self::VanishedShardRetried,
        Self::StealWithoutHandoff,
        Self::LeaderIgnoresActivity,
        Self::TakeWithoutFence,
        Self::PeriodNotRecorded,
        Self::FenceConstant,
        Self::InboxIgnoresLease,
        Self::CheckpointPastUnfinished,
        Self::KeysOverlap,
        Self::StandbyWatchesItsOwnRow,
        Self::CheckpointAtPastWatermark,
        Self::ReadyKeysNewestFirst,
        Self::HeldCountsUnfinishedOnly,
        Self::ValidityByTimerOnly,
        Self::ResetFinished,
        Self::SightingTrustedHoweverOld,
        Self::UncertainWriteIgnored,
        Self::StallAgeFromLastDelivery,
        Self::StallAgeIgnoresMoves,
        Self::StalledPastValidity,
        Self::UnownedNeverReported,
        Self::RefusalSeenOnlyWhileMoving,
        Self::RefusalTakenForRequest,
        Self::StallAgeSeenByTaskOnly,
        Self::LeaderBalancesOntoRefusers,
        Self::ReleaseOutweighedByRenewals,
        Self::DeadLetterEarly,
        Self::BisectRedeliversSucceeded,
        Self::SinkRefusalIgnored,
        Self::ParkedKeyRuns,
        Self::BisectRedeliversCheckpointed,
        Self::ParkingBeforeItsRecord,
        Self::ParkedMatchIgnoresPosition,
        Self::OutageGivenUp,
        Self::OutageRunPerProcessor,
        Self::ReplayWithoutHold,
        Self::RelativeBand,
        Self::NoMoveBudget,
        Self::NoStickiness,
        Self::LoadIgnored,
        Self::FluxIgnored,
        Self::StaleTotals,
        Self::RestartGraceIgnored,
        Self::ReleasedViaLeader,
        Self::NoLookAhead,
        Self::PokeTrustsSighting,
        Self::RoleCarrierIgnored,
        Self::CarrierProvesAfterLapse,
        Self::AdoptionDropsHandoff,
        Self::CountsFollowLoadMoves,
        Self::ArrivalsBalancedOnto,
        Self::StepDownIgnored,
        Self::ScaleUpWindowIgnored,
        Self::PlacedOnMostLoaded,
        Self::AckedIgnoredOnOpen,
        Self::SinkPositionIgnored,
        Self::SinkUnfenced,
    ];
}

impl Mutation {
    /// The unit test that catches this one, for the few the simulation cannot reach (a fault
    /// too rare for random schedules); `None`: the simulation catches it. `scripts/test`
    /// runs each such test with `KCL_MUTATION` naming the mutation and expects it to fail.
    pub fn unit_test(self) -> Option<&'static str> {
        UNIT_TESTS
            .iter()
            .find(|(m, _)| *m == self)
            .map(|(_, test)| *test)
    }
}

/// The mutations a unit test catches (see [`Mutation::unit_test`]), each with why the
/// simulation does not.
const UNIT_TESTS: &[(Mutation, &str)] = &[
    // An operator's reset behind a sink's position: a commit the sink then refuses brings
    // the lease up too (`Tenure::sink_refused`), so the simulation's invariants hold
    // without the open's own move; only what is handed again tells them apart.
    (
        Mutation::SinkPositionIgnored,
        "worker::shard_consumer::sink::tests::a_lease_behind_the_sink_resumes_after_the_sinks_position",
    ),
    (
        Mutation::SightingTrustedHoweverOld,
        "singleton::tests::a_candidate_whose_sightings_stopped_reads_the_row_itself",
    ),
    // Seen in 1,000 seeds (408, 441, 638: a graceful handoff waiting on records in
    // flight), not in the 200 the mutation check once ran.
    (
        Mutation::StallAgeSeenByTaskOnly,
        "worker::report::tests::a_checkpoint_moved_in_a_hook_that_runs_on_ends_the_stall",
    ),
    // Churn, not loss: no invariant of the simulation is broken by it.
    (
        Mutation::LeaderBalancesOntoRefusers,
        "lease::leader::tests::a_worker_that_refused_is_not_balanced_onto",
    ),
    // Churn, not loss: the balancer moves a lease later, within its budget.
    (
        Mutation::PlacedOnMostLoaded,
        "lease::leader::tests::a_lease_nobody_holds_is_placed_where_it_leaves_the_most_headroom",
    ),
    // Churn, not loss: two moves of a released lease instead of one.
    (
        Mutation::ReleasedViaLeader,
        "lease::leader::tests::released_leases_go_straight_to_the_least_loaded_worker",
    ),
    // Churn, not loss, and only where a tie between moves decides (seed 687 of the
    // 1,000 load seeds).
    (
        Mutation::NoLookAhead,
        "lease::balance::tests::a_move_that_fits_alike_goes_where_it_leaves_room_for_the_next",
    ),
    // A new standby that takes its role a sighting's age late (15 s in a surge deploy):
    // the simulation's leader kills do not line that up.
    (
        Mutation::PokeTrustsSighting,
        "singleton::tests::a_candidate_poked_reads_the_row_not_its_sighting",
    ),
    (
        Mutation::ReleaseOutweighedByRenewals,
        "lease::observer::tests::a_worker_seen_releasing_is_leaving_whatever_else_of_its_rows_moves",
    ),
    // A holder whose carrier's renewals stalled past its validity and then resumed:
    // no random schedule of the simulation lined that up in 1,000 seeds.
    (
        Mutation::CarrierProvesAfterLapse,
        "singleton::carried::tests::a_carrier_answered_after_the_role_lapsed_proves_nothing",
    ),
    // An unanswered `SHARD_END` followed by a restart of the same processor: seed 183
    // lined it up until issue 38 changed the schedules; 200 seeds no longer do.
    (
        Mutation::UncertainWriteIgnored,
        "checkpoint::tests::a_restart_after_an_unanswered_shard_end_sees_the_shard_ended",
    ),
    // Churn, not loss, and only where figures move (a change of load, a burst): the
    // load seeds of the first 200 settle alike either way.
    (
        Mutation::FluxIgnored,
        "lease::balance::tests::figures_still_moving_are_not_acted_on",
    ),
    // Churn, not loss: a heartbeat worker's move lands on a misjudged worker.
    (
        Mutation::StaleTotals,
        "lease::weigh::tests::a_moved_rows_capacity_is_its_new_holders_only_once_it_wrote_it",
    ),
    // Churn, not loss: a lease the leader moves on before its target adopted it stays
    // on the target until the leader asks again (seed 403 of 1,000).
    (
        Mutation::AdoptionDropsHandoff,
        "memory::store::lease_store::tests::an_adoption_keeps_a_handoff_request_a_take_clears_it",
    ),
    // Churn, not loss, and only after a move for load at steady load (seed 975 of the
    // 1,000 load seeds).
    (
        Mutation::CountsFollowLoadMoves,
        "worker::cycle::leader::tests::a_giver_gets_no_small_leases_while_leases_are_hot",
    ),
    // Churn, not loss: a surge pod balanced onto before its predecessor leaves.
    (
        Mutation::ArrivalsBalancedOnto,
        "lease::leader::tests::a_worker_that_just_arrived_is_placed_leases_but_not_balanced_onto",
    ),
    // A crash between a parking and the checkpoint that passes it, and a parked
    // key's record replayed: unit tests state the rules exactly.
    (
        Mutation::ParkingBeforeItsRecord,
        "checkpoint::tests::a_parked_key_is_written_only_with_a_checkpoint_that_passes_its_record",
    ),
    (
        Mutation::ParkedMatchIgnoresPosition,
        "parallel::dispatch::tests::only_records_after_the_one_that_parked_a_key_are_parked_behind_it",
    ),
    // Autoscaling figures, not records: the simulation checks no figure.
    (
        Mutation::ScaleUpWindowIgnored,
        "autoscale::damping::tests::a_configured_scale_up_window_holds_a_rise_back",
    ),
];

#[cfg(feature = "mutation-testing")]
static ACTIVE: std::sync::Mutex<Option<Mutation>> = std::sync::Mutex::new(None);

/// Turns `mutation` on (or every mutation off), process-wide.
#[doc(hidden)]
#[cfg(feature = "mutation-testing")]
pub fn set(mutation: Option<Mutation>) {
    *ACTIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = mutation;
}

/// In a unit test named by [`Mutation::unit_test`]: turns on the mutation `KCL_MUTATION`
/// names (the mutation check runs the test so and expects it to fail); nothing otherwise.
#[cfg(test)]
pub(crate) fn set_from_env() {
    #[cfg(feature = "mutation-testing")]
    if let Ok(name) = std::env::var("KCL_MUTATION") {
        set(Mutation::ALL
            .iter()
            .find(|m| format!("{m:?}") == name)
            .copied());
    }
}

/// True while `mutation` is on.
#[inline]
pub(crate) fn on(mutation: Mutation) -> bool {
    #[cfg(feature = "mutation-testing")]
    {
        *ACTIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            == Some(mutation)
    }
    #[cfg(not(feature = "mutation-testing"))]
    {
        let _ = mutation;
        false
    }
}
