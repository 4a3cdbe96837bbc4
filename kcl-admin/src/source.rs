//! Which stream a lease table's leases are of: a Kinesis stream, or a DynamoDB table's stream
//! (`--source dynamodb-streams`), by the rules every kcl binary shares
//! ([`kcl_serve::source`]), read the way the fleet reads it.

use kcl_aws::AnySource;
use kcl_serve::{SourceKeys, SourceKind, SourceSpec};

/// The stream flags shared by the commands that read it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StreamArgs {
    /// `kinesis` or `dynamodb-streams`.
    #[arg(long, env = "KCL_SOURCE", default_value = "kinesis")]
    source: SourceKind,
    /// The stream: a Kinesis stream's name or ARN; with `--source dynamodb-streams`, a DynamoDB
    /// stream ARN.
    #[arg(long, env = "KCL_STREAM")]
    stream: Option<String>,
    /// With `--source dynamodb-streams`: the table whose current stream it is.
    #[arg(long, env = "KCL_TABLE")]
    table: Option<String>,
    /// Go on even though the lease table does not look like the stream's (its lease keys,
    /// hash keys or checkpoints are of another stream): for a stream deleted and made again
    /// under its name, whose table still holds the old stream's checkpoints.
    #[arg(long)]
    force_stream: bool,
}

impl StreamArgs {
    /// The stream named, checked; `None` if none was named.
    pub(crate) fn spec(&self) -> anyhow::Result<Option<SourceSpec>> {
        let keys = SourceKeys {
            source: self.source,
            stream: self.stream.as_deref(),
            table: self.table.as_deref(),
            ..SourceKeys::default()
        };
        SourceSpec::from_keys(&keys)
            .map_err(|e| anyhow::anyhow!("invalid --{}: {}", e.key.name(), e.reason))
    }

    /// Whether a stream was named.
    pub(crate) fn given(&self) -> bool {
        self.stream.is_some() || self.table.is_some()
    }

    /// The stream, as the fleet reads it; `None` if none was named.
    pub(crate) async fn open(
        &self,
        sdk: &aws_config::SdkConfig,
    ) -> anyhow::Result<Option<AnySource>> {
        match self.spec()? {
            Some(spec) => Ok(spec.open_one(sdk).await?),
            None => Ok(None),
        }
    }

    /// Whether `name` (a multi-stream lease key's stream name) is the stream named: a Kinesis
    /// stream's name, or the name in its ARN (`arn:…:stream/NAME`). A DynamoDB stream's
    /// multi-stream id is not matched.
    pub(crate) fn names(&self, name: &str) -> bool {
        self.spec()
            .ok()
            .flatten()
            .is_some_and(|spec| spec.names(name))
    }

    /// Whether the stream is a Kinesis stream's.
    pub(crate) fn is_kinesis(&self) -> bool {
        self.source == SourceKind::Kinesis
    }

    /// Whether `--force-stream` was given.
    pub(crate) fn forced(&self) -> bool {
        self.force_stream
    }

    /// What names the stream in messages.
    pub(crate) fn name(&self) -> &str {
        self.stream
            .as_deref()
            .or(self.table.as_deref())
            .unwrap_or("(none)")
    }
}
