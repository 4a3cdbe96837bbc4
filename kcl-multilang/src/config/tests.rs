#![allow(clippy::unwrap_used)]

use kcl_core::{Coordination, Liveness};

use super::*;

/// The config `text` gives, or its first error.
fn config(text: &str) -> Result<DaemonConfig, KeyError> {
    DaemonConfig::from_properties(&Properties::parse(text).unwrap(), "host-1")
        .map_err(|errors| errors.0.into_iter().next().unwrap())
}

const MINIMAL: &str =
    "executableName = python3 app.py\nstreamName = orders\napplicationName = app\n";

#[test]
fn the_java_daemons_defaults() {
    let c = config(MINIMAL).unwrap();
    assert_eq!(c.command.program, "python3");
    assert_eq!(c.command.args, ["app.py"]);
    assert_eq!(c.command.timeout, None);
    assert_eq!(c.stream, "orders");
    assert_eq!(c.table_name, "app");
    assert_eq!(c.worker_id, "host-1");
    assert_eq!(c.credentials, Credentials::DefaultChain);
    assert_eq!(c.worker.initial_position, InitialPosition::Latest);
    assert_eq!(
        c.worker.retrieval,
        Retrieval::FanOut {
            consumer_name: "app".to_owned()
        }
    );
    assert_eq!(c.worker.failover_time, Duration::from_secs(10));
    assert_eq!(c.worker.max_records, 10_000);
    assert_eq!(
        c.worker.idle_time_between_reads,
        Duration::from_millis(1500)
    );
    assert_eq!(c.table_setup, TableSetup::Managed);
    assert!(c.ignored.is_empty() && c.unknown.is_empty());
}

#[test]
fn keys_map_onto_the_worker() {
    let text = format!(
        "{MINIMAL}\
         failoverTimeMillis = 20000\n\
         maxRecords = 500\n\
         idleTimeBetweenReadsInMillis = 250\n\
         callProcessRecordsEvenForEmptyRecordList = true\n\
         shardSyncIntervalMillis = 30000\n\
         maxLeasesForWorker = 8\n\
         maxLeasesToStealAtOneTime = 2\n\
         shutdownGraceMillis = 25000\n\
         timeoutInSeconds = 7\n\
         retrievalMode = polling\n\
         initialPositionInStream = TRIM_HORIZON\n\
         tableName = leases\n\
         workerId = w-9\n\
         coordination = every-worker\n\
         liveness = heartbeat\n\
         awsCredentialsProvider = ProfileCredentialsProvider|dev\n"
    );
    let c = config(&text).unwrap();
    let w = &c.worker;
    assert_eq!(w.failover_time, Duration::from_secs(20));
    assert_eq!(w.max_records, 500);
    assert_eq!(w.idle_time_between_reads, Duration::from_millis(250));
    assert_eq!(w.empty_batch_interval, Some(Duration::from_millis(250)));
    assert_eq!(w.shard_sync_interval, Duration::from_secs(30));
    assert_eq!((w.max_leases, w.max_leases_to_steal), (8, 2));
    assert_eq!(w.shutdown_timeout, Duration::from_secs(25));
    assert_eq!(w.retrieval, Retrieval::Polling);
    assert_eq!(w.initial_position, InitialPosition::TrimHorizon);
    assert_eq!(w.coordination, Coordination::EveryWorker);
    assert_eq!(w.liveness, Liveness::Heartbeat);
    assert_eq!(c.command.timeout, Some(Duration::from_secs(7)));
    assert_eq!(c.table_name, "leases");
    assert_eq!(c.worker_id, "w-9");
    assert_eq!(c.credentials, Credentials::Profile(Some("dev".to_owned())));
}

#[test]
fn a_polling_key_makes_the_default_retrieval_polling_as_in_java() {
    let c = config(&format!("{MINIMAL}maxRecords = 500\n")).unwrap();
    assert_eq!(c.worker.retrieval, Retrieval::Polling);
    let c = config(&format!(
        "{MINIMAL}maxRecords = 500\nretrievalMode = FANOUT\n"
    ))
    .unwrap();
    assert!(matches!(c.worker.retrieval, Retrieval::FanOut { .. }));
    let c = config(&format!(
        "{MINIMAL}AwsCredentialsProvider = EnvironmentVariableCredentialsProvider,DefaultCredentialsProvider\n"
    ))
    .unwrap();
    assert_eq!(c.credentials, Credentials::Environment);
}

#[test]
fn a_stream_arn_gives_the_region_and_at_timestamp_its_time() {
    let text = "executableName = node app.js\n\
                streamArn = arn:aws:kinesis:eu-west-1:123456789012:stream/orders\n\
                streamName = ignored-when-an-arn-is-given\n\
                applicationName = app\n\
                initialPositionInStream = AT_TIMESTAMP\n\
                initialPositionInStreamExtended = 1700000000\n";
    let c = config(text).unwrap();
    assert_eq!(
        c.stream,
        "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
    );
    assert_eq!(c.region.as_deref(), Some("eu-west-1"));
    let InitialPosition::AtTimestamp(at) = c.worker.initial_position else {
        unreachable!("{:?}", c.worker.initial_position);
    };
    assert_eq!(at.timestamp(), 1_700_000_000);
}

#[test]
fn bad_input_names_the_key() {
    let cases = [
        ("streamName = s\napplicationName = a\n", "executableName"),
        ("executableName = x\napplicationName = a\n", "streamName"),
        ("executableName = x\nstreamName = s\n", "applicationName"),
        (
            &format!("{MINIMAL}failoverTimeMillis = ten\n") as &str,
            "failoverTimeMillis",
        ),
        (
            &format!("{MINIMAL}failoverTimeMillis = 0\n"),
            "failoverTimeMillis",
        ),
        (&format!("{MINIMAL}maxRecords = -1\n"), "maxRecords"),
        (
            &format!("{MINIMAL}AwsCredentialsProvider = com.example.MyProvider\n"),
            "AwsCredentialsProvider",
        ),
        (
            &format!("{MINIMAL}initialPositionInStream = EARLIEST\n"),
            "initialPositionInStream",
        ),
        (
            &format!("{MINIMAL}initialPositionInStream = AT_TIMESTAMP\n"),
            "initialPositionInStreamExtended",
        ),
        (&format!("{MINIMAL}retrievalMode = PUSH\n"), "retrievalMode"),
        (
            &format!("{MINIMAL}callProcessRecordsEvenForEmptyRecordList = yes\n"),
            "callProcessRecordsEvenForEmptyRecordList",
        ),
    ];
    for (text, key) in cases {
        let error = config(text).unwrap_err();
        assert_eq!(error.key, key, "{text:?}: {error}");
        assert!(error.to_string().contains(key));
    }
}

#[test]
fn keys_without_an_equivalent_and_unknown_keys_are_reported() {
    let text = format!(
        "{MINIMAL}metricsLevel = NONE\nprocessingLanguage = python/3.11\n\
         workerMetricsTableConfig.tableName = x\nexecutablename2 = typo\nMaxRecords = 5\n"
    );
    let c = config(&text).unwrap();
    let ignored: Vec<&str> = c.ignored.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        ignored,
        [
            "metricsLevel",
            "processingLanguage",
            "workerMetricsTableConfig.tableName"
        ]
    );
    assert_eq!(
        c.unknown,
        [
            ("executablename2".to_owned(), None),
            ("MaxRecords".to_owned(), Some("maxRecords"))
        ]
    );
    // As in the Java daemon, a key in other capitals sets nothing.
    assert_eq!(c.worker.max_records, 10_000);
    let described = c.describe(&Properties::parse(&text).unwrap(), &|_| None);
    assert!(described.contains("executablename2 = typo    # unknown"));
    assert!(
        described.contains("case-sensitive: `maxRecords`?"),
        "{described}"
    );
    assert!(described.contains("metricsLevel = NONE    # no equivalent, ignored"));
    assert!(described.contains("streamName = orders    # mapped"));
}

#[test]
fn every_key_is_listed_once() {
    let mut keys: Vec<String> = KEYS.iter().map(|(k, _)| k.to_ascii_lowercase()).collect();
    keys.sort();
    let before = keys.len();
    keys.dedup();
    assert_eq!(before, keys.len());
}

/// The bean properties of KCL Java 3.1.3's `MultiLangDaemonConfiguration` (its setters, listed
/// with `javap` from amazon-kinesis-client-multilang-3.1.3.jar), those 3.5.0 added, the keys
/// its daemon reads itself, and the nested keys its beans take.
const JAVA_KEYS: &[&str] = &[
    "allowThroughputOvershoot",
    "applicationName",
    "awsCredentialsProvider",
    "awsCredentialsProviderCloudWatch",
    "awsCredentialsProviderDynamoDB",
    "callProcessRecordsEvenForEmptyRecordList",
    "cleanupLeasesUponShardCompletion",
    "clientVersionConfig",
    "coordinatorStateBillingMode",
    "coordinatorStateDeletionProtectionEnabled",
    "coordinatorStatePointInTimeRecoveryEnabled",
    "coordinatorStateReadCapacity",
    "coordinatorStateTableName",
    "coordinatorStateTags",
    "coordinatorStateWriteCapacity",
    "dampeningPercentage",
    "disableWorkerMetrics",
    "dynamoDBEndpoint",
    "enablePriorityLeaseAssignment",
    "failoverTimeMillis",
    "gracefulLeaseHandoffTimeoutMillis",
    "idleTimeBetweenReadsInMillis",
    "ignoreUnexpectedChildShards",
    "inMemoryWorkerMetricsCaptureFrequencyMillis",
    "initialLeaseTableReadCapacity",
    "initialLeaseTableWriteCapacity",
    "initialPositionInStream",
    "initialPositionInStreamExtended",
    "isGracefulLeaseHandoffEnabled",
    "kinesisEndpoint",
    "leaseAssignmentIntervalMillis",
    "leaseTableDeletionProtectionEnabled",
    "leaseTablePitrEnabled",
    "listShardsBackoffTimeInMillis",
    "logWarningForTaskAfterMillis",
    "maxGetRecordsThreadPool",
    "maxLeaseRenewalThreads",
    "maxLeasesForWorker",
    "maxLeasesToStealAtOneTime",
    "maxListShardsRetryAttempts",
    "maxRecords",
    "maxThroughputPerHostKBps",
    "metricsBufferTimeMillis",
    "metricsEnabledDimensions",
    "metricsLevel",
    "metricsMaxQueueSize",
    "millisBehindLatestThresholdForReducedTps",
    "noOfPersistedMetricsPerWorkerMetrics",
    "parentShardPollIntervalMillis",
    "reBalanceThresholdPercentage",
    "regionName",
    "retrievalMode",
    "retryGetRecordsInSeconds",
    "schedulerInitializationBackoffTimeMillis",
    "shardPrioritization",
    "shardSyncIntervalMillis",
    "shutdownGraceMillis",
    "skipShardSyncAtWorkerInitializationIfLeasesExist",
    "staleWorkerMetricsEntryCleanupDuration",
    "streamArn",
    "streamName",
    "tableName",
    "taskBackoffTimeMillis",
    "timeoutInSeconds",
    "validateSequenceNumberBeforeCheckpointing",
    "varianceBalancingFrequency",
    "workerId",
    "workerIdentifier",
    "workerMetricsBillingMode",
    "workerMetricsDeletionProtectionEnabled",
    "workerMetricsEMAAlpha",
    "workerMetricsPointInTimeRecoveryEnabled",
    "workerMetricsReadCapacity",
    "workerMetricsReporterFreqInMillis",
    "workerMetricsTableName",
    "workerMetricsTags",
    "workerMetricsWriteCapacity",
    // 3.5.0
    "leaseTableScanTotalSegments",
    "migrateAllEntitiesToLeaseTable",
    "tableMigrationCompleteBakeTimeSeconds",
    // read by the daemon itself
    "executableName",
    "processingLanguage",
    "maxActiveThreads",
    // nested
    "fanoutConfig.consumerArn",
    "fanoutConfig.consumerName",
    "fanoutConfig.retryBackoffMillis",
    "fanoutConfig.maxDescribeStreamSummaryRetries",
    "fanoutConfig.registerStreamConsumerRetries",
    "fanoutConfig.maxDescribeStreamConsumerRetries",
    "pollingConfig.maxRecords",
    "pollingConfig.idleTimeBetweenReadsInMillis",
    "kinesisClient.region",
    "kinesisClient.endpointOverride",
    "dynamoDbClient.region",
    "dynamoDbClient.endpointOverride",
    "cloudWatchClient.region",
    "cloudWatchClient.endpointOverride",
    "gracefulLeaseHandoffConfigBean.gracefulLeaseHandoffTimeoutMillis",
    "coordinatorStateTableConfigBean.coordinatorStateTableName",
];

#[test]
fn every_key_of_the_java_daemon_is_mapped_or_ignored_with_a_reason() {
    for key in JAVA_KEYS {
        assert!(canonical(key).is_some(), "`{key}` is not in KEYS");
    }
}

#[test]
fn nested_keys_and_aliases_are_read_as_java_reads_them() {
    let text = format!(
        "{MINIMAL}\
         workerIdentifier = w-7\n\
         pollingConfig.maxRecords = 300\n\
         kinesisClient.endpointOverride = http://localhost:4567\n\
         kinesisClient.region = eu-west-1\n\
         dynamoDbClient.region = eu-central-1\n\
         regionName = us-east-2\n\
         gracefulLeaseHandoffConfigBean.isGracefulLeaseHandoffEnabled = false\n"
    );
    let c = config(&text).unwrap();
    assert_eq!(c.worker_id, "w-7");
    assert_eq!(c.worker.max_records, 300);
    assert_eq!(c.worker.retrieval, Retrieval::Polling, "a polling key");
    assert_eq!(c.region.as_deref(), Some("us-east-2"));
    assert_eq!(
        c.kinesis,
        ClientSettings {
            region: Some("eu-west-1".to_owned()),
            endpoint: Some("http://localhost:4567".to_owned()),
        }
    );
    assert_eq!(c.dynamodb.region.as_deref(), Some("eu-central-1"));
    let ignored: Vec<&str> = c.ignored.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        ignored,
        ["gracefulLeaseHandoffConfigBean.isGracefulLeaseHandoffEnabled"]
    );
    assert!(c.unknown.is_empty(), "{:?}", c.unknown);

    let polling = config(&format!(
        "{MINIMAL}millisBehindLatestThresholdForReducedTps = 1000\n"
    ))
    .unwrap();
    assert_eq!(polling.worker.retrieval, Retrieval::Polling);
}

#[test]
fn the_fan_out_consumer_is_named_by_its_arn_or_its_name() {
    let named = |extra: &str| match config(&format!("{MINIMAL}{extra}"))
        .unwrap()
        .worker
        .retrieval
    {
        Retrieval::FanOut { consumer_name } => consumer_name,
        other => unreachable!("{other:?}"),
    };
    assert_eq!(named(""), "app");
    assert_eq!(named("fanoutConfig.consumerName = reader\n"), "reader");
    assert_eq!(
        named(
            "fanoutConfig.consumerName = reader\n\
             fanoutConfig.consumerArn = \
             arn:aws:kinesis:us-east-1:123456789012:stream/orders/consumer/billing:1525898737\n"
        ),
        "billing"
    );
    for (arn, key) in [
        (
            "arn:aws:kinesis:us-east-1:1:stream/orders",
            "fanoutConfig.consumerArn",
        ),
        ("billing", "fanoutConfig.consumerArn"),
    ] {
        let error = config(&format!("{MINIMAL}fanoutConfig.consumerArn = {arn}\n")).unwrap_err();
        assert_eq!(error.key, key, "{error}");
    }
    let error = config(&format!("{MINIMAL}fanoutConfig.consumerName = a b\n")).unwrap_err();
    assert_eq!(error.key, "fanoutConfig.consumerName", "{error}");
}

#[test]
fn restart_grace_is_off_by_default_and_a_number_of_seconds_or_off() {
    let grace = |extra: &str| config(&format!("{MINIMAL}{extra}")).map(|c| c.worker.restart_grace);
    assert_eq!(grace("").unwrap(), None);
    assert_eq!(
        grace("restartGraceSeconds = 60\n").unwrap(),
        Some(Duration::from_secs(60))
    );
    assert_eq!(grace("restartGraceSeconds = off\n").unwrap(), None);
    for bad in ["soon", "0"] {
        let e = grace(&format!("restartGraceSeconds = {bad}\n")).unwrap_err();
        assert_eq!(e.key, "restartGraceSeconds", "{e}");
    }
}

#[test]
fn stalled_after_is_a_number_of_seconds_or_off() {
    let stalled_after =
        |extra: &str| config(&format!("{MINIMAL}{extra}")).map(|c| c.worker.stalled_after);
    assert_eq!(
        stalled_after("").unwrap(),
        WorkerConfig::default().stalled_after
    );
    let two_minutes = Some(Duration::from_secs(120));
    assert_eq!(
        stalled_after("stalledAfterSeconds = 120\n").unwrap(),
        two_minutes
    );
    assert_eq!(stalled_after("stalledAfterSeconds = off\n").unwrap(), None);
    for bad in ["0", "soon"] {
        let e = stalled_after(&format!("stalledAfterSeconds = {bad}\n")).unwrap_err();
        assert_eq!(e.key, "stalledAfterSeconds", "{e}");
    }
}

/// A file with several mistakes is reported whole: every wrong or missing key, once each, in
/// one run (not one per run).
#[test]
fn every_mistake_of_a_file_is_reported_at_once() {
    let text = "executableName = python3 app.py\n\
                applicationName = app\n\
                failoverTimeMillis = 10s\n\
                maxRecords = many\n\
                initialPositionInStream = OLDEST\n\
                liveness = sometimes\n\
                billingMode = FREE\n";
    let errors =
        DaemonConfig::from_properties(&Properties::parse(text).unwrap(), "host-1").unwrap_err();
    let keys: Vec<&str> = errors.0.iter().map(|e| e.key).collect();
    assert_eq!(
        keys,
        [
            "streamName",
            "failoverTimeMillis",
            "initialPositionInStream",
            "maxRecords",
            "liveness",
            "billingMode",
        ],
        "{errors}"
    );
    assert_eq!(errors.to_string().lines().count(), 6, "{errors}");
}

/// `--print-config` says what the environment adds (region, endpoints, the credentials'
/// source by name, never a secret) and "unlimited" for a limit not given.
#[test]
fn print_config_shows_what_the_environment_adds() {
    let c = config(MINIMAL).unwrap();
    let env = |name: &str| {
        let value = match name {
            "AWS_REGION" => "eu-west-1",
            "AWS_ENDPOINT_URL_KINESIS" => "http://127.0.0.1:4568",
            "AWS_ENDPOINT_URL" => "http://127.0.0.1:5000",
            "AWS_ACCESS_KEY_ID" => "AKIASECRETLOOKING",
            "AWS_SECRET_ACCESS_KEY" => "very-secret",
            _ => return None,
        };
        Some(value.to_owned())
    };
    let described = c.describe(&Properties::parse(MINIMAL).unwrap(), &env);
    assert!(
        described.contains("region = eu-west-1 (from AWS_REGION)"),
        "{described}"
    );
    assert!(
        described
            .contains("kinesis endpoint = http://127.0.0.1:4568 (from AWS_ENDPOINT_URL_KINESIS)"),
        "{described}"
    );
    assert!(
        described.contains("dynamodb endpoint = http://127.0.0.1:5000 (from AWS_ENDPOINT_URL)"),
        "{described}"
    );
    assert!(
        described.contains(
            "credentials = the standard chain; here: the environment (AWS_ACCESS_KEY_ID is set)"
        ),
        "{described}"
    );
    assert!(described.contains("max_leases: unlimited"), "{described}");
    assert!(!described.contains(&usize::MAX.to_string()), "{described}");
    assert!(!described.contains("AKIASECRETLOOKING") && !described.contains("very-secret"));
    let bare = c.describe(&Properties::parse(MINIMAL).unwrap(), &|_| None);
    assert!(bare.contains("kinesis endpoint = AWS's"), "{bare}");
    assert!(bare.contains("set regionName or AWS_REGION"), "{bare}");
}

#[test]
fn every_field_a_property_sets_is_a_worker_config_field_and_its_key_is_read() {
    // kcl-core's own names of the fields, as its configuration file spells them.
    let fields = serde_json::to_value(WorkerConfig::default());
    assert!(fields.is_ok(), "{fields:?}");
    let fields = fields.unwrap_or_default();
    for &(key, field) in FIELDS {
        let top = field.split('.').next().unwrap_or(field);
        assert!(
            fields.get(top).is_some(),
            "{key}: no WorkerConfig field {field}"
        );
        assert!(
            KEYS.iter()
                .any(|&(k, used)| k == key && matches!(used, Use::Mapped(_))),
            "{key} ({field}) is not a key read"
        );
    }
}

#[test]
fn failure_keys_and_the_dead_letter_sink() {
    use kcl_aws::dead_letter::Location;
    use kcl_core::failure::Exhausted;

    let c = config(MINIMAL).unwrap();
    assert_eq!(c.worker.failure.exhausted, Exhausted::Block);
    assert_eq!(c.dead_letters, None);
    assert!(
        c.command.errors_fail_batch,
        "childErrorsFailBatch defaults to true"
    );

    let text = format!(
        "{MINIMAL}failureExhausted = dead-letter\nfailureAttempts = 2\n\
         failureBackoffMillis = 50\nfailureMaxBackoffMillis = 10\n\
         failureMaxRecordAgeSeconds = 60\nfailureOutageAfter = 4\n\
         deadLetterSink = sqs:https://sqs.eu-west-1.amazonaws.com/123456789012/dlq\n\
         deadLetterOverflowS3 = s3://big-letters/orders/\nchildErrorsFailBatch = false\n"
    );
    let c = config(&text).unwrap();
    let policy = &c.worker.failure;
    assert_eq!(policy.exhausted, Exhausted::DeadLetter);
    assert_eq!(policy.attempts, 2);
    assert_eq!(policy.backoff, Duration::from_millis(50));
    assert_eq!(
        policy.max_backoff,
        Duration::from_millis(50),
        "never below the backoff"
    );
    assert_eq!(policy.max_record_age, Some(Duration::from_secs(60)));
    assert_eq!(policy.outage_after, Some(4));
    let never = config(&format!("{MINIMAL}failureOutageAfter = 0\n")).unwrap();
    assert_eq!(never.worker.failure.outage_after, None, "0: never");
    let letters = c.dead_letters.unwrap();
    assert_eq!(
        letters.sink,
        Location::Sqs {
            queue_url: "https://sqs.eu-west-1.amazonaws.com/123456789012/dlq".to_owned()
        }
    );
    assert_eq!(
        letters.overflow,
        Some(("big-letters".to_owned(), "orders/".to_owned()))
    );
    assert!(!c.command.errors_fail_batch);
    assert!(c.unused.is_empty(), "{:?}", c.unused);

    let c = config(&format!(
        "{MINIMAL}failureExhausted = dead-letter\ndeadLetterSink = file:/tmp/letters.jsonl\n"
    ))
    .unwrap();
    assert_eq!(
        c.dead_letters.map(|l| l.sink),
        Some(Location::File("/tmp/letters.jsonl".into()))
    );
}

#[test]
fn dead_letters_without_a_sink_and_bad_failure_keys_name_the_key() {
    for (lines, key, says) in [
        (
            "failureExhausted = dead-letter\n",
            "failureExhausted",
            "deadLetterSink",
        ),
        ("failureExhausted = later\n", "failureExhausted", "later"),
        ("failureAttempts = many\n", "failureAttempts", "many"),
        ("failureAttempts = 0\n", "failureAttempts", ""),
        (
            "failureExhausted = dead-letter\ndeadLetterSink = queue\n",
            "deadLetterSink",
            "sqs:QUEUE-URL",
        ),
        (
            "deadLetterSink = sqs:https://q\ndeadLetterOverflowS3 = file:big\n",
            "deadLetterOverflowS3",
            "s3://BUCKET/PREFIX",
        ),
        (
            "childErrorsFailBatch = sometimes\n",
            "childErrorsFailBatch",
            "sometimes",
        ),
    ] {
        let error = config(&format!("{MINIMAL}{lines}")).unwrap_err();
        assert_eq!(error.key, key, "{lines}: {error}");
        assert!(error.reason.contains(says), "{lines}: {error}");
    }
    // Only one error for a sink given wrong: not also "dead-letter needs deadLetterSink".
    let text = format!("{MINIMAL}failureExhausted = dead-letter\ndeadLetterSink = queue\n");
    let errors = DaemonConfig::from_properties(&Properties::parse(&text).unwrap(), "h");
    assert_eq!(errors.unwrap_err().0.len(), 1);
    // kcl's worker names the same mistake by its field; the daemon by the property.
    assert_eq!(
        DaemonConfig::property("failure.exhausted"),
        "failureExhausted"
    );
}

#[test]
fn dead_letter_keys_to_no_effect_are_said_once() {
    let c = config(&format!(
        "{MINIMAL}deadLetterSink = file:letters.jsonl\ndeadLetterOverflowS3 = s3://b/p\n"
    ))
    .unwrap();
    let keys: Vec<&str> = c.unused.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        ["deadLetterSink", "deadLetterOverflowS3"],
        "{:?}",
        c.unused
    );
    let c = config(&format!("{MINIMAL}deadLetterOverflowS3 = s3://b/p\n")).unwrap();
    assert_eq!(
        c.unused,
        [("deadLetterOverflowS3", "no deadLetterSink is given")]
    );
    assert_eq!(c.dead_letters, None);
    let described = c.describe(&Properties::parse(MINIMAL).unwrap(), &|_| None);
    assert!(described.contains("dead letters = none"), "{described}");
    assert!(
        described.contains("child errors fail the batch (childErrorsFailBatch) = true"),
        "{described}"
    );
}

#[test]
fn balance_by_and_worker_capacity() {
    use kcl_core::{BalanceBy, Balancing};

    assert_eq!(
        config(MINIMAL).unwrap().worker.balancing,
        Balancing::default()
    );
    assert_eq!(
        config(MINIMAL).unwrap().worker.balancing.by,
        BalanceBy::Count
    );
    let c = config(&format!(
        "{MINIMAL}balanceBy = LOAD\nworkerCapacity = 2.5\n"
    ))
    .unwrap();
    assert_eq!(c.worker.balancing.by, BalanceBy::Load);
    assert!((c.worker.balancing.capacity - 2.5).abs() < 1e-9);
    let c = config(&format!("{MINIMAL}balanceBy = load\nbalanceBy = count\n")).unwrap();
    assert_eq!(
        c.worker.balancing.by,
        BalanceBy::Count,
        "the last one given"
    );
    for (lines, key, says) in [
        ("balanceBy = cpu\n", "balanceBy", "cpu"),
        ("workerCapacity = big\n", "workerCapacity", "big"),
        ("workerCapacity = NaN\n", "workerCapacity", "NaN"),
        ("workerCapacity = 0\n", "workerCapacity", "between"),
        ("workerCapacity = 5000\n", "workerCapacity", "between"),
    ] {
        let error = config(&format!("{MINIMAL}{lines}")).unwrap_err();
        assert_eq!(error.key, key, "{lines}: {error}");
        assert!(error.reason.contains(says), "{lines}: {error}");
    }
}
