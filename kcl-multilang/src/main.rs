//! `kcl-multilang`: KCL Java's MultiLangDaemon, on kcl. Reads the daemon's properties file and
//! runs one child process per shard lease; see the crate docs for the protocol and `--help`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use kcl_aws::{DynamoDbLeaseStore, KinesisShardSource};
use kcl_core::failure::{DeadLetters, Exhausted};
use kcl_core::{ShardId, Worker};
use kcl_multilang::{ChildProcessor, FailurePolicy, Properties};
use kcl_multilang::{ClientSettings, Credentials, DaemonConfig, KeyError};
use kcl_serve::{Ended, LogFormat};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Exit status for a bad command line or properties file (the Java daemon's is 1; 2 is what
/// clap and kcl's other binaries use for usage errors).
const EXIT_USAGE: u8 = 2;

/// Runs record processors written for KCL Java's MultiLangDaemon (amazon-kclpy, aws-kcl for
/// Node.js, Ruby, .NET) on kcl, without a JVM. Takes the daemon's properties file.
#[derive(Debug, Parser)]
#[command(version, after_help = AFTER_HELP)]
struct Cli {
    /// The properties file (as `MultiLangDaemon <file>` takes it).
    #[arg(value_name = "FILE", required_unless_present = "properties_file")]
    file: Option<String>,

    /// The properties file.
    #[arg(short = 'p', long, value_name = "FILE", conflicts_with = "file")]
    properties_file: Option<String>,

    /// Accepted for the Java daemon's command lines and ignored (a logback file): use
    /// --log-filter and --log-format.
    #[arg(short = 'l', long, value_name = "FILE")]
    log_configuration: Option<String>,

    /// Address of the health, readiness and metrics HTTP server.
    #[arg(
        long,
        env = "KCL_LISTEN",
        value_name = "ADDR",
        default_value = "0.0.0.0:8080"
    )]
    listen: String,

    /// Serve KEDA's external scaler (gRPC) on this port, on the host of --listen: it answers
    /// with the fleet's desired_workers (docs/autoscaling.md), and the leader publishes its
    /// figures every 15 s so that every worker can answer. Off unless set.
    #[arg(long, env = "KCL_SCALER_PORT", value_name = "PORT")]
    scaler_port: Option<u16>,

    /// Where the drain token is written at start: a random secret that POST /drain must carry
    /// (`kcl-example-consumer drain --drain-token-file FILE` reads and sends it)
    /// [default: /tmp/kcl-drain-<PORT>.token, PORT being --listen's].
    #[arg(long, env = "KCL_DRAIN_TOKEN_FILE", value_name = "FILE")]
    drain_token_file: Option<std::path::PathBuf>,

    /// Log format: pretty (human) or json (one object per line). Logs go to stderr.
    #[arg(
        long,
        env = "KCL_LOG_FORMAT",
        value_name = "FORMAT",
        default_value = "pretty"
    )]
    log_format: String,

    /// Log filter, tracing-subscriber syntax (e.g. `info,kcl_core=debug`). The children's
    /// stderr is logged under the target `kcl_multilang::child`.
    #[arg(
        long,
        env = "KCL_LOG_FILTER",
        value_name = "FILTER",
        default_value = "info,aws_config=error"
    )]
    log_filter: String,

    /// Exit when a child fails, as the Java daemon does, instead of restarting its shard.
    #[arg(long)]
    exit_on_child_failure: bool,

    /// Print how each key of the file is used and what would run, then exit.
    #[arg(long)]
    print_config: bool,
}

const AFTER_HELP: &str = "\
Switching from KCL Java: replace `java … software.amazon.kinesis.multilang.MultiLangDaemon
--properties-file app.properties` with `kcl-multilang --properties-file app.properties`.

AWS access uses the standard AWS configuration chain unless AwsCredentialsProvider says
otherwise; kinesisEndpoint and dynamoDBEndpoint (or AWS_ENDPOINT_URL_KINESIS and
AWS_ENDPOINT_URL_DYNAMODB) point at emulators.

Signals: SIGTERM or SIGINT asks every child to checkpoint (shutdownRequested), then hands the
leases back at once; a second one forces. POST /drain on --listen (from this host only, with
the token written to --drain-token-file: a preStop hook's `kcl-example-consumer drain`) does the
same, even under restartGraceSeconds, and answers once no lease is held.

Exit status: 0 after a graceful shutdown, 1 when the worker fails (or a child, with
--exit-on-child-failure), 2 for a bad command line or properties file, 130 when forced.";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(path) = cli.properties_file.as_ref().or(cli.file.as_ref()) else {
        return fail("no properties file given", EXIT_USAGE);
    };
    let properties = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| Properties::parse_bytes(&bytes).map_err(|e| e.to_string()))
    {
        Ok(p) => p,
        Err(e) => return fail(&format!("cannot read {path}: {e}"), EXIT_USAGE),
    };
    let config = match DaemonConfig::from_properties(
        &properties,
        &kcl_serve::default_worker_id(|name| std::env::var(name).ok()),
    ) {
        Ok(c) => c,
        Err(errors) => {
            // Every mistake of the file, one line each.
            for error in &errors.0 {
                fail(&format!("{path}: {error}"), EXIT_USAGE);
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if cli.print_config {
        print(&config.describe(&properties, &|name| std::env::var(name).ok()));
    }
    // A child that cannot be started would fail every shard's, over and over.
    let program = match config.command.locate() {
        Ok(program) => program,
        Err(reason) => {
            let error = KeyError {
                key: "executableName",
                reason,
            };
            return fail(&format!("{path}: {error}"), EXIT_USAGE);
        }
    };
    if cli.print_config {
        return print(&format!("child program = {}\n", program.display()));
    }
    let logging = LogFormat::parse(&cli.log_format)
        .map_err(|e| format!("invalid setting `log-format`: {e}"))
        .and_then(|format| kcl_serve::init_logging(format, &cli.log_filter));
    if let Err(e) = logging {
        return fail(&e, EXIT_USAGE);
    }
    let listen: SocketAddr = match cli.listen.trim().parse() {
        Ok(addr) => addr,
        Err(e) => return fail(&format!("invalid setting `listen`: {e}"), EXIT_USAGE),
    };
    let mut config = config;
    let scaler = cli
        .scaler_port
        .map(|port| scaler(&mut config, listen, port));
    if let Some(file) = &cli.log_configuration {
        tracing::warn!(%file, "--log-configuration is ignored: use --log-filter and --log-format");
    }
    report_keys(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}"), 1),
    };
    tracing::info!(program = %program.display(), "executableName found");
    let served = (listen, scaler, cli.drain_token_file);
    match runtime.block_on(run(config, served, cli.exit_on_child_failure)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "kcl-multilang failed");
            ExitCode::from(1)
        }
    }
}

#[allow(clippy::print_stderr)]
fn fail(message: &str, code: u8) -> ExitCode {
    eprintln!("kcl-multilang: {message}");
    ExitCode::from(code)
}

#[allow(clippy::print_stdout)]
fn print(text: &str) -> ExitCode {
    print!("{text}");
    ExitCode::SUCCESS
}

/// Each key with no effect here, and each unknown key, once.
fn report_keys(config: &DaemonConfig) {
    for (key, why) in &config.ignored {
        tracing::info!(%key, "no equivalent, ignored: {why}");
    }
    for (key, why) in &config.unused {
        tracing::warn!(%key, "no effect: {why}");
    }
    for (key, near) in &config.unknown {
        match near {
            Some(known) => {
                tracing::warn!(%key, "unknown property, ignored: keys are case-sensitive; `{known}`?");
            }
            None => tracing::warn!(%key, "unknown property, ignored (a typo?)"),
        }
    }
}

/// The AWS configuration the properties describe, for one service's endpoint.
async fn sdk_config(config: &DaemonConfig) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &config.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    match &config.credentials {
        Credentials::DefaultChain => {}
        Credentials::Environment => {
            loader = loader.credentials_provider(
                aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
            );
        }
        Credentials::Profile(Some(profile)) => loader = loader.profile_name(profile),
        Credentials::Profile(None) => {}
    }
    loader.load().await
}

/// `sdk` with one client's own region and endpoint.
fn for_client(sdk: &aws_config::SdkConfig, client: &ClientSettings) -> aws_config::SdkConfig {
    let mut builder = sdk.to_builder();
    if let Some(region) = &client.region {
        builder = builder.region(aws_config::Region::new(region.clone()));
    }
    if let Some(url) = &client.endpoint {
        builder = builder.endpoint_url(url.clone());
    }
    builder.build()
}

/// Where the worker's dead letters go (`deadLetterSink`): a `kinesis:` stream through the
/// Kinesis client's settings (`kinesisEndpoint`, `kinesisClient.region`), the others and the
/// S3 overflow (`deadLetterOverflowS3`) through the daemon's.
fn dead_letters(config: &DaemonConfig, sdk: &aws_config::SdkConfig) -> Option<DeadLetters> {
    use kcl_aws::dead_letter::{Location, S3Sink};
    let settings = config.dead_letters.as_ref()?;
    let mut sink = match &settings.sink {
        kinesis @ Location::Kinesis(_) => kinesis.sink(&for_client(sdk, &config.kinesis)),
        other => other.sink(sdk),
    };
    if let Some((bucket, prefix)) = &settings.overflow {
        sink = sink.with_overflow(S3Sink::new(sdk, bucket.clone(), prefix.clone()));
    }
    tracing::info!(sink = %settings.sink, "dead letters go to deadLetterSink");
    let mut letters = DeadLetters::new(sink)
        .application(config.application_name.clone())
        .stream(config.stream.clone());
    // Replays a parked key's letters when `kcl-admin dead-letters redrive` asks (every sink
    // but a Kinesis stream).
    if let Some(reader) = settings.sink.reader(sdk) {
        letters = letters.reader(reader);
    }
    Some(letters)
}

/// Where KEDA's external scaler is served: `port` on `listen`'s host. Every worker answers
/// KEDA, the others from the row the leader publishes: every 15 s unless set otherwise.
fn scaler(config: &mut DaemonConfig, listen: SocketAddr, port: u16) -> SocketAddr {
    let autoscaling = &mut config.worker.autoscaling;
    autoscaling.publish_interval = autoscaling
        .publish_interval
        .or(Some(Duration::from_secs(15)));
    SocketAddr::new(listen.ip(), port)
}

/// Runs the daemon, serving HTTP on `listen` (and KEDA's scaler on `scaler`, if given; the
/// drain token written to `drain_token`, if given, else to its default place).
async fn run(
    config: DaemonConfig,
    (listen, scaler, drain_token): (SocketAddr, Option<SocketAddr>, Option<std::path::PathBuf>),
    exit_on_failure: bool,
) -> anyhow::Result<ExitCode> {
    let sdk = sdk_config(&config).await;
    let kinesis = for_client(&sdk, &config.kinesis);
    let source = KinesisShardSource::new(&kinesis, config.stream.clone());
    // DynamoDB Streams shares the DynamoDB endpoint off AWS (an emulator serves both); an AWS
    // endpoint is DynamoDB's alone.
    let aws_endpoint = config
        .dynamodb
        .endpoint
        .as_ref()
        .is_some_and(|url| url.contains("amazonaws.com"));
    let dynamodb = for_client(&sdk, &config.dynamodb);
    let mut store = DynamoDbLeaseStore::new(&dynamodb, config.table_name.clone());
    if aws_endpoint {
        // DynamoDB's region, AWS's DynamoDB Streams endpoint.
        let streams = ClientSettings {
            region: config.dynamodb.region.clone(),
            endpoint: None,
        };
        store = store.with_change_feed_client(aws_sdk_dynamodbstreams::Client::new(&for_client(
            &sdk, &streams,
        )));
    }
    let store = store
        .with_table_setup(config.table_setup)
        .with_billing(config.billing);

    let exit = CancellationToken::new();
    let policy = FailurePolicy {
        exit: exit_on_failure.then(|| exit.clone()),
        in_place: config.worker.failure.exhausted != Exhausted::Block,
    };
    let command = Arc::new(config.command.clone());
    let factory = move |_: &ShardId| ChildProcessor::new(command.clone(), policy.clone());

    let mut serving = kcl_serve::Serving::start(listen, &config.worker).await?;
    let _fresh = keep_fresh(config.worker.taker_interval);
    if let Some(scaler) = scaler {
        serving = serving.with_scaler(scaler).await?;
    }
    if let Some(path) = drain_token {
        serving = serving.with_drain_token(path);
    }
    let mut builder = Worker::builder(source, store)
        .id(config.worker_id.clone())
        .config(config.worker.clone());
    if let Some(letters) = dead_letters(&config, &sdk) {
        builder = builder.dead_letters(letters);
    }
    let worker = builder.build(factory).map_err(|e| {
        let key = DaemonConfig::property(e.key);
        anyhow::anyhow!("invalid property `{key}`: {}", e.reason)
    })?;
    tracing::info!(
        worker_id = %config.worker_id,
        stream = %config.stream,
        application = %config.application_name,
        child = %config.command.program,
        "starting"
    );
    let options = kcl_serve::Options {
        exit,
        summary: SUMMARY.to_vec(),
        ..kcl_serve::Options::default()
    };
    match serving.run(worker, config.worker_id.clone(), options).await {
        Ended::Stopped => Ok(ExitCode::SUCCESS),
        Ended::Forced => Ok(ExitCode::from(130)),
        Ended::Exited => Ok(ExitCode::from(1)),
        Ended::Failed(e) => Err(anyhow::Error::new(e)).context("the worker failed"),
    }
}

/// The daemon's own counts in the line logged at the end of a run: each a metric, and what one
/// and several count.
const SUMMARY: [(&str, &str, &str); 2] = [
    (
        kcl_multilang::CHILDREN_FAILED,
        "child exited non-zero",
        "children exited non-zero",
    ),
    (
        kcl_multilang::CHILD_RESTARTS,
        "child restarted",
        "children restarted",
    ),
];

/// The daemon's own counters, at zero from the start and kept fresh every `every` (the taker
/// interval, as kcl-core's), until dropped.
fn keep_fresh(every: Duration) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            kcl_multilang::refresh_series();
        }
    }))
}
