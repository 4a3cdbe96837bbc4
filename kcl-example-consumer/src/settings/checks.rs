//! Checks across keys about the source and the dead letters: which backend reads what, and
//! where the letters may go.

use kcl_core::{Retrieval, WorkerConfig};

use super::{Backend, RunArgs, SettingsError, SourceSpec, Values};

/// Where dead letters go: required by `--on-failure dead-letter`, read by kcl-aws.
pub(super) fn dead_letters(a: &RunArgs, v: &Values<'_>) -> Result<Option<String>, SettingsError> {
    let Some(location) = &a.dead_letters else {
        if a.on_failure == kcl_core::failure::Exhausted::DeadLetter {
            return Err(v.fail(
                "dead_letters",
                "required with on-failure dead-letter (sqs:QUEUE-URL, s3://BUCKET/PREFIX, \
                 kinesis:STREAM or file:PATH)"
                    .into(),
            ));
        }
        return Ok(None);
    };
    if a.on_failure != kcl_core::failure::Exhausted::DeadLetter {
        return Err(v.fail(
            "dead_letters",
            "given, but on-failure is not dead-letter: no letter would ever be written".into(),
        ));
    }
    #[cfg(feature = "aws")]
    match location.parse::<kcl_aws::dead_letter::Location>() {
        Err(e) => return Err(v.fail("dead_letters", e.to_string())),
        Ok(kcl_aws::dead_letter::Location::File(path)) => {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
            if folder.is_some_and(|f| !f.is_dir()) {
                return Err(v.fail(
                    "dead_letters",
                    format!("{}: its folder does not exist", path.display()),
                ));
            }
        }
        Ok(_) if a.backend == Backend::Memory => {
            return Err(v.fail(
                "dead_letters",
                "backend memory writes dead letters to a file only (file:PATH)".into(),
            ));
        }
        Ok(_) => {}
    }
    #[cfg(not(feature = "aws"))]
    return Err(v.fail(
        "dead_letters",
        format!("{location:?}: this build has no dead-letter sinks (build with `--features aws`)"),
    ));
    #[cfg(feature = "aws")]
    Ok(Some(location.clone()))
}

/// A DynamoDB table's stream is read through AWS, by polling.
pub(super) fn fits_dynamodb(
    v: &Values<'_>,
    input: &SourceSpec,
    backend: Backend,
    worker: &WorkerConfig,
) -> Result<(), SettingsError> {
    if !matches!(
        input,
        SourceSpec::DynamoDb { .. } | SourceSpec::DynamoDbStreams { .. }
    ) {
        return Ok(());
    }
    if backend == Backend::Memory {
        return Err(v.fail(
            "backend",
            "source dynamodb-streams needs backend aws (the memory backend has in-process \
             Kinesis-like streams only)"
                .into(),
        ));
    }
    if matches!(worker.retrieval, Retrieval::FanOut { .. }) {
        return Err(v.fail(
            "retrieval",
            "DynamoDB Streams has no enhanced fan-out: use polling".into(),
        ));
    }
    Ok(())
}
