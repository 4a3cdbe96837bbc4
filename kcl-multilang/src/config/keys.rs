//! Every key KCL Java 3.x's MultiLangDaemon reads (3.1.3, and the three 3.5.0 added), with
//! what becomes of it here; kcl's own keys; and the keys of older KCLs that users still carry.
//!
//! The Java daemon hands each key to commons-beanutils on its configuration bean, so a key is
//! a bean property, case-sensitive, and a dotted key reaches into a nested bean
//! (`pollingConfig.maxRecords`, `fanoutConfig.consumerName`, `kinesisClient.region`). The
//! nested forms that only repeat a flat key (`pollingConfig.<key>`, `…ConfigBean.<key>`) are
//! read as that key; `workerIdentifier` is `workerId`, and a client's `endpointOverride` is
//! that client's endpoint key, as in Java.

/// What becomes of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// Read; the text says into what.
    Mapped(&'static str),
    /// Not read; the text says why.
    Ignored(&'static str),
}

const NO_CLOUDWATCH: Use = Use::Ignored("no CloudWatch: Prometheus metrics are served on --listen");
const NO_WORKER_METRICS: Use = Use::Ignored(
    "kcl balances by lease count, or (balanceBy = load, workerCapacity) by what each lease costs \
     its holder, measured by the worker and written with its renewals, not by host metrics: \
     no WorkerMetricStats table",
);
const NO_COORDINATOR_TABLE: Use = Use::Ignored(
    "kcl keeps its coordination (leader, standby) in the lease table: no CoordinatorState table",
);
const KCL_BACKOFF: Use = Use::Ignored("retried with kcl's backoff (taskBackoffTimeMillis)");

/// Every key, with what becomes of it. Dotted keys are matched whole first, then by their
/// first part.
pub(crate) const KEYS: &[(&str, Use)] = &[
    // The child processes.
    (
        "executableName",
        Use::Mapped(
            "the child process: program and arguments, split at spaces; a program without a `/` \
             is looked up in PATH (not in the working directory), checked at start",
        ),
    ),
    (
        "timeoutInSeconds",
        Use::Mapped(
            "how long each hook may take with its child: writing the message, the checkpoints \
             it asks for, its answer, and after its last message its exit",
        ),
    ),
    (
        "processingLanguage",
        Use::Ignored("only names the language in KCL Java's user agent"),
    ),
    (
        "maxActiveThreads",
        Use::Ignored("kcl runs each shard as a task, not on a thread pool"),
    ),
    // Stream, application, AWS.
    (
        "streamName",
        Use::Mapped("the stream (`streamArn` wins when both are given)"),
    ),
    (
        "streamArn",
        Use::Mapped("the stream; its region is the default region"),
    ),
    (
        "applicationName",
        Use::Mapped("the lease table's name, and the fan-out consumer's"),
    ),
    (
        "tableName",
        Use::Mapped("the lease table's name (default: applicationName)"),
    ),
    ("regionName", Use::Mapped("the AWS region of every client")),
    ("kinesisEndpoint", Use::Mapped("the Kinesis endpoint")),
    (
        "dynamoDBEndpoint",
        Use::Mapped("the DynamoDB endpoint (and DynamoDB Streams', off AWS)"),
    ),
    (
        "kinesisClient.region",
        Use::Mapped("the Kinesis client's region (default: regionName)"),
    ),
    (
        "dynamoDbClient.region",
        Use::Mapped("the DynamoDB client's region (default: regionName)"),
    ),
    (
        "kinesisClient",
        Use::Ignored("of the Kinesis client's settings, only region and endpointOverride are read"),
    ),
    (
        "dynamoDbClient",
        Use::Ignored(
            "of the DynamoDB client's settings, only region and endpointOverride are read",
        ),
    ),
    ("cloudWatchClient", NO_CLOUDWATCH),
    ("cloudWatchEndpoint", NO_CLOUDWATCH),
    (
        "AwsCredentialsProvider",
        Use::Mapped("where credentials come from"),
    ),
    (
        "AwsCredentialsProviderDynamoDB",
        Use::Ignored("kcl uses one credentials provider: AwsCredentialsProvider"),
    ),
    ("AwsCredentialsProviderCloudWatch", NO_CLOUDWATCH),
    (
        "kinesisCredentialsProvider",
        Use::Ignored("kcl uses one credentials provider: AwsCredentialsProvider"),
    ),
    (
        "dynamoDBCredentialsProvider",
        Use::Ignored("kcl uses one credentials provider: AwsCredentialsProvider"),
    ),
    ("cloudWatchCredentialsProvider", NO_CLOUDWATCH),
    (
        "workerId",
        Use::Mapped("the worker id (default: $POD_NAME, else <hostname>-<pid>)"),
    ),
    // Where to start, how to read.
    (
        "initialPositionInStream",
        Use::Mapped("where a shard without a checkpoint starts (default LATEST)"),
    ),
    (
        "initialPositionInStreamExtended",
        Use::Mapped("AT_TIMESTAMP's timestamp, epoch seconds (as Java) or RFC 3339"),
    ),
    (
        "retrievalMode",
        Use::Mapped("FANOUT or POLLING; DEFAULT: fan-out, but polling when a polling key is given"),
    ),
    ("maxRecords", Use::Mapped("max_records (a polling key)")),
    (
        "idleTimeBetweenReadsInMillis",
        Use::Mapped("idle_time_between_reads (a polling key; default 1.5 s, as Java)"),
    ),
    (
        "millisBehindLatestThresholdForReducedTps",
        Use::Ignored(
            "a polling key; kcl pauses idleTimeBetweenReadsInMillis after an empty read only",
        ),
    ),
    (
        "retryGetRecordsInSeconds",
        Use::Ignored("a polling key, unused by KCL Java 3.x too; reads retry with kcl's backoff"),
    ),
    (
        "maxGetRecordsThreadPool",
        Use::Ignored("a polling key, unused by KCL Java 3.x too; reads are tasks, not threads"),
    ),
    (
        "pollingConfig",
        Use::Ignored("not one of KCL Java's polling settings"),
    ),
    (
        "fanoutConfig.consumerName",
        Use::Mapped("the fan-out consumer's name (default: applicationName)"),
    ),
    (
        "fanoutConfig.consumerArn",
        Use::Mapped("the fan-out consumer, by the name in its ARN (wins over consumerName)"),
    ),
    ("fanoutConfig", KCL_BACKOFF),
    (
        "callProcessRecordsEvenForEmptyRecordList",
        Use::Mapped("empty_batch_interval = idleTimeBetweenReadsInMillis"),
    ),
    // Leases.
    ("failoverTimeMillis", Use::Mapped("failover_time")),
    (
        "shardSyncIntervalMillis",
        Use::Mapped("shard_sync_interval"),
    ),
    (
        "parentShardPollIntervalMillis",
        Use::Mapped("parent_poll_interval"),
    ),
    ("maxLeasesForWorker", Use::Mapped("max_leases")),
    (
        "maxLeasesToStealAtOneTime",
        Use::Mapped("max_leases_to_steal"),
    ),
    (
        "leaseAssignmentIntervalMillis",
        Use::Ignored("leases are taken and balanced every second (kcl's taker_interval)"),
    ),
    (
        "enablePriorityLeaseAssignment",
        Use::Ignored("always: own, unowned, then the longest-expired leases are taken first"),
    ),
    (
        "gracefulLeaseHandoffTimeoutMillis",
        Use::Ignored(
            "a handoff waits for the child's shutdownRequested, bounded by the lease's validity",
        ),
    ),
    (
        "isGracefulLeaseHandoffEnabled",
        Use::Ignored("handoffs are always graceful: shutdownRequested, then the lease moves"),
    ),
    (
        "cleanupLeasesUponShardCompletion",
        Use::Ignored("finished leases are always deleted, 5 minutes after their children started"),
    ),
    (
        "ignoreUnexpectedChildShards",
        Use::Ignored("every shard ListShards returns gets a lease, its parents served first"),
    ),
    (
        "skipShardSyncAtWorkerInitializationIfLeasesExist",
        Use::Ignored("the shard sync at start is one ListShards call"),
    ),
    (
        "skipShardSyncAtStartupIfLeasesExist",
        Use::Ignored("KCL 1.x's name; the shard sync at start is one ListShards call"),
    ),
    (
        "maxLeaseRenewalThreads",
        Use::Ignored("renewals are tasks, not threads"),
    ),
    ("listShardsBackoffTimeInMillis", KCL_BACKOFF),
    ("maxListShardsRetryAttempts", KCL_BACKOFF),
    (
        "leaseTableScanTotalSegments",
        Use::Ignored("the lease table is read in one scan, or followed through its stream"),
    ),
    // The lease table.
    (
        "billingMode",
        Use::Mapped(
            "kcl (not a KCL Java key: its tables are PAY_PER_REQUEST): \
             how a lease table the daemon creates is billed",
        ),
    ),
    (
        "initialLeaseTableReadCapacity",
        Use::Mapped("read capacity of a PROVISIONED lease table (billingMode)"),
    ),
    (
        "initialLeaseTableWriteCapacity",
        Use::Mapped("write capacity of a PROVISIONED lease table (billingMode)"),
    ),
    (
        "leaseTableDeletionProtectionEnabled",
        Use::Ignored("set table protection where the table is managed (tableSetup = external)"),
    ),
    (
        "leaseTablePitrEnabled",
        Use::Ignored("set table backups where the table is managed (tableSetup = external)"),
    ),
    (
        "tags",
        Use::Ignored(
            "not a KCL Java key; tag the table where it is managed (tableSetup = external)",
        ),
    ),
    // kcl's own.
    (
        "failureExhausted",
        Use::Mapped(
            "kcl: what a record the child keeps failing on costs once its tries are spent: \
             block (default: the shard restarts from its checkpoint, as the Java daemon), \
             dead-letter (to deadLetterSink) or skip",
        ),
    ),
    (
        "failureAttempts",
        Use::Mapped(
            "kcl: tries of a failing record, the first included (default 3); a batch the \
             child fails on is bisected to find it",
        ),
    ),
    (
        "failureBackoffMillis",
        Use::Mapped(
            "kcl: the wait before a failing record's second try, doubled each time (default 1000)",
        ),
    ),
    (
        "failureMaxBackoffMillis",
        Use::Mapped("kcl: the longest wait between tries (default 30000)"),
    ),
    (
        "failureMaxRecordAgeSeconds",
        Use::Mapped("kcl: no more tries once a record is older than this (default: none)"),
    ),
    (
        "failureOutageAfter",
        Use::Mapped(
            "kcl: records of a shard given up in a row, none succeeding, after which the \
             shard is taken to be in an outage: it gives up no more, blocks until a record \
             succeeds and fails readiness (default 10; 0: never)",
        ),
    ),
    (
        "deadLetterSink",
        Use::Mapped(
            "kcl: where records go once failureExhausted = dead-letter gives them up: \
             sqs:QUEUE-URL, s3://BUCKET/PREFIX, kinesis:STREAM or file:PATH (see dead-letters.md)",
        ),
    ),
    (
        "deadLetterOverflowS3",
        Use::Mapped(
            "kcl: s3://BUCKET/PREFIX for letters too large for an sqs: or kinesis: \
             deadLetterSink (256 KiB, 1 MiB); without it such a letter is refused, and retried",
        ),
    ),
    (
        "balanceBy",
        Use::Mapped(
            "kcl: what the leader balances: count (default: lease counts only, as KCL Java \
             2.x) or, opt-in, load (each worker's load per unit of capacity, from what each \
             lease costs its holder); coordination = every-worker balances counts",
        ),
    ),
    (
        "workerCapacity",
        Use::Mapped(
            "kcl: this worker's capacity relative to a standard worker (default 1, between \
             0.001 and 1000): a worker of capacity 2 is given twice the load",
        ),
    ),
    (
        "childErrorsFailBatch",
        Use::Mapped(
            "kcl: true (default): a batch fails when the child reports on stderr that its \
             processor raised (amazon_kclpy's `Caught exception from action dispatch`), though \
             it answered; false: such a batch counts as processed, as in the Java daemon",
        ),
    ),
    (
        "coordination",
        Use::Mapped("kcl: leader (default) or every-worker"),
    ),
    (
        "liveness",
        Use::Mapped("kcl: per-lease (default) or heartbeat"),
    ),
    (
        "tableSetup",
        Use::Mapped("kcl: managed (default) or external"),
    ),
    (
        "stalledAfterSeconds",
        Use::Mapped(
            "kcl: stalled_after, seconds (default 600) or off: a shard whose checkpoint stands \
             still this long while records wait is reported stalled",
        ),
    ),
    (
        "restartGraceSeconds",
        Use::Mapped(
            "kcl: restart_grace, seconds or off (default): with a workerId stable across \
             restarts, leases stay this worker's this long beyond the failover time on \
             shutdown, and are resumed at once when it comes back",
        ),
    ),
    // The worker's lifecycle.
    (
        "taskBackoffTimeMillis",
        Use::Mapped("min_backoff (a failed shard's first retry)"),
    ),
    (
        "shutdownGraceMillis",
        Use::Mapped("shutdown_timeout, when above 0 (else kcl's 30 s)"),
    ),
    ("schedulerInitializationBackoffTimeMillis", KCL_BACKOFF),
    (
        "logWarningForTaskAfterMillis",
        Use::Ignored("slow hooks are bounded by the lease's validity"),
    ),
    (
        "validateSequenceNumberBeforeCheckpointing",
        Use::Ignored("a checkpoint is always checked against what was delivered"),
    ),
    (
        "shardPrioritization",
        Use::Ignored("shards are served concurrently, parents before children"),
    ),
    (
        "clientVersionConfig",
        Use::Ignored("no KCL 2.x to 3.x migration state: kcl reads both tables as they are"),
    ),
    ("migrateAllEntitiesToLeaseTable", NO_COORDINATOR_TABLE),
    (
        "tableMigrationCompleteBakeTimeSeconds",
        NO_COORDINATOR_TABLE,
    ),
    // Metrics.
    ("metricsLevel", NO_CLOUDWATCH),
    ("metricsEnabledDimensions", NO_CLOUDWATCH),
    ("metricsBufferTimeMillis", NO_CLOUDWATCH),
    ("metricsMaxQueueSize", NO_CLOUDWATCH),
    // KCL Java 3.x's worker-utilization-aware assignment and its tables.
    (
        "inMemoryWorkerMetricsCaptureFrequencyMillis",
        NO_WORKER_METRICS,
    ),
    ("workerMetricsReporterFreqInMillis", NO_WORKER_METRICS),
    ("noOfPersistedMetricsPerWorkerMetrics", NO_WORKER_METRICS),
    ("disableWorkerMetrics", NO_WORKER_METRICS),
    ("maxThroughputPerHostKBps", NO_WORKER_METRICS),
    ("dampeningPercentage", NO_WORKER_METRICS),
    ("reBalanceThresholdPercentage", NO_WORKER_METRICS),
    ("allowThroughputOvershoot", NO_WORKER_METRICS),
    ("varianceBalancingFrequency", NO_WORKER_METRICS),
    ("workerMetricsEMAAlpha", NO_WORKER_METRICS),
    ("staleWorkerMetricsEntryCleanupDuration", NO_WORKER_METRICS),
    ("workerMetricsTableName", NO_WORKER_METRICS),
    ("workerMetricsBillingMode", NO_WORKER_METRICS),
    ("workerMetricsReadCapacity", NO_WORKER_METRICS),
    ("workerMetricsWriteCapacity", NO_WORKER_METRICS),
    ("workerMetricsPointInTimeRecoveryEnabled", NO_WORKER_METRICS),
    ("workerMetricsDeletionProtectionEnabled", NO_WORKER_METRICS),
    ("workerMetricsTags", NO_WORKER_METRICS),
    ("coordinatorStateTableName", NO_COORDINATOR_TABLE),
    ("coordinatorStateBillingMode", NO_COORDINATOR_TABLE),
    ("coordinatorStateReadCapacity", NO_COORDINATOR_TABLE),
    ("coordinatorStateWriteCapacity", NO_COORDINATOR_TABLE),
    (
        "coordinatorStatePointInTimeRecoveryEnabled",
        NO_COORDINATOR_TABLE,
    ),
    (
        "coordinatorStateDeletionProtectionEnabled",
        NO_COORDINATOR_TABLE,
    ),
    ("coordinatorStateTags", NO_COORDINATOR_TABLE),
    // Nested forms KCL Java ignores (its flat keys above are read instead).
    ("coordinatorStateTableConfig", NO_COORDINATOR_TABLE),
    ("workerMetricsTableConfig", NO_WORKER_METRICS),
    ("workerUtilizationAwareAssignmentConfig", NO_WORKER_METRICS),
    (
        "gracefulLeaseHandoffConfig",
        Use::Ignored("handoffs are always graceful: shutdownRequested, then the lease moves"),
    ),
    // Older KCLs' keys, still found in properties files.
    (
        "maxCacheByteSize",
        Use::Ignored("prefetch is bounded by max_prefetch_bytes (8 MiB)"),
    ),
    (
        "maxRecordsCount",
        Use::Ignored("prefetch is bounded by max_prefetch_batches (3)"),
    ),
    (
        "cacheMaxByteSize",
        Use::Ignored("prefetch is bounded by max_prefetch_bytes (8 MiB)"),
    ),
    (
        "userAgent",
        Use::Ignored("the AWS SDK for Rust sets its own"),
    ),
];

/// Keys that are another key under a second name, as the Java daemon reads them.
const ALIASES: &[(&str, &str)] = &[
    ("workerIdentifier", "workerId"),
    ("kinesisClient.endpointOverride", "kinesisEndpoint"),
    ("dynamoDbClient.endpointOverride", "dynamoDBEndpoint"),
];

/// Nested beans whose properties are flat keys too (`pollingConfig.maxRecords` is
/// `maxRecords`).
const BEANS: &[&str] = &[
    "pollingConfig.",
    "gracefulLeaseHandoffConfigBean.",
    "workerUtilizationAwareAssignmentConfigBean.",
    "workerMetricStatsTableConfigBean.",
    "coordinatorStateTableConfigBean.",
];

/// The keys that make the Java daemon's `DEFAULT` retrieval mode polling.
pub(super) const POLLING_KEYS: &[&str] = &[
    "maxRecords",
    "idleTimeBetweenReadsInMillis",
    "millisBehindLatestThresholdForReducedTps",
    "retryGetRecordsInSeconds",
    "maxGetRecordsThreadPool",
];

fn lookup(key: &str) -> Option<(&'static str, Use)> {
    KEYS.iter().find(|(k, _)| *k == key).map(|&(k, u)| (k, u))
}

/// The key of [`KEYS`] that `key` is: exact, as the Java daemon's bean properties are, but
/// `AwsCredentialsProvider…` in any case (the Java daemon rewrites that prefix), an alias or a
/// nested bean's property as its flat key, and another nested key by its first part.
pub(super) fn canonical(key: &str) -> Option<(&'static str, Use)> {
    let credentials = "AwsCredentialsProvider";
    let key = match key.get(..credentials.len()) {
        Some(prefix) if prefix.eq_ignore_ascii_case(credentials) => {
            format!("{credentials}{}", &key[credentials.len()..])
        }
        _ => key.to_owned(),
    };
    if let Some(&(_, to)) = ALIASES.iter().find(|(alias, _)| *alias == key) {
        return lookup(to);
    }
    let flat = BEANS
        .iter()
        .find_map(|bean| key.strip_prefix(bean))
        .and_then(lookup);
    flat.or_else(|| lookup(&key)).or_else(|| {
        let (first, _) = key.split_once('.')?;
        lookup(first)
    })
}

/// A known key spelled with other capitals, for the warning about an unknown one.
pub(super) fn near(key: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|(k, _)| *k)
        .chain(ALIASES.iter().map(|(alias, _)| *alias))
        .find(|k| k.eq_ignore_ascii_case(key))
}
