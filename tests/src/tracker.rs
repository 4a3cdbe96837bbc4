//! A [`StreamTracker`] that reads the streams to consume from a file at every shard sync, so
//! that a test adds a stream to a running worker process by appending a line.

use std::collections::BTreeMap;
use std::path::PathBuf;

use aws_config::SdkConfig;
use kcl_aws::KinesisShardSource;
use kcl_core::multi_stream::{StreamConfig, StreamId, StreamTracker};
use kcl_core::{BackendError, ErrorKind, InitialPosition};
use tokio::sync::Mutex;

/// Lines of `stream-name` or `stream-name LATEST`; ids looked up once per name.
#[derive(Debug)]
pub struct FileTracker {
    path: PathBuf,
    sdk: SdkConfig,
    ids: Mutex<BTreeMap<String, StreamId>>,
}

impl FileTracker {
    /// A tracker reading `path`, resolving names with `sdk`'s Kinesis endpoint.
    pub fn new(path: PathBuf, sdk: SdkConfig) -> Self {
        Self {
            path,
            sdk,
            ids: Mutex::default(),
        }
    }
}

impl StreamTracker for FileTracker {
    async fn streams(&self) -> Result<Vec<StreamConfig>, BackendError> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| {
            BackendError::new(
                ErrorKind::Retryable,
                "streams",
                format!("{}: {e}", self.path.display()),
            )
        })?;
        let mut configs = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (name, position) = line.split_once(' ').unwrap_or((line, ""));
            let initial_position = match position.trim() {
                "LATEST" => InitialPosition::Latest,
                _ => InitialPosition::TrimHorizon,
            };
            let mut ids = self.ids.lock().await;
            let id = match ids.get(name) {
                Some(id) => id.clone(),
                None => {
                    let id = KinesisShardSource::new(&self.sdk, name).stream_id().await?;
                    ids.insert(name.to_owned(), id.clone());
                    id
                }
            };
            configs.push(StreamConfig {
                id,
                initial_position,
            });
        }
        Ok(configs)
    }
}
