//! Where `run` will send its AWS calls, for `--print-config`: the endpoint of each service it
//! uses (the stream, the lease table, the dead-letter sink), as the AWS SDK resolves it from
//! the environment. They are no settings of this binary, so they are printed as comments.
//!
//! The SDK takes `AWS_ENDPOINT_URL_<SERVICE>` first, then `AWS_ENDPOINT_URL`, then a profile's
//! `endpoint_url` (not read here: said as such), else AWS's own endpoint for the region; with
//! `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`, AWS's always. A URL is printed without its user
//! information and query (never a secret), and nothing else of the environment is.

use super::{Backend, Leases, Settings, SourceSpec};

/// One AWS service a run calls: its name, the suffix of its `AWS_ENDPOINT_URL_…` variable,
/// and what it is called for.
struct Service {
    name: &'static str,
    env: &'static str,
    what: &'static str,
}

/// The services a run with `settings` calls, in the order it does.
fn services(settings: &Settings) -> Vec<Service> {
    if settings.backend == Backend::Memory {
        return Vec::new();
    }
    let service = |name, env, what| Service { name, env, what };
    let mut out = match &settings.input {
        SourceSpec::Stream(_) | SourceSpec::Streams { .. } => {
            vec![service("kinesis", "KINESIS", "the stream")]
        }
        SourceSpec::DynamoDbStreams { .. } | SourceSpec::DynamoDb { .. } => vec![service(
            "dynamodbstreams",
            "DYNAMODB_STREAMS",
            "the table's stream",
        )],
    };
    // The leases in Postgres (`lease-store`, printed above) call no DynamoDB; nor does an
    // exactly-once table in Postgres.
    let in_dynamodb =
        settings.exactly_once_table.is_some() && settings.exactly_once_store.is_none();
    if settings.lease_store == Leases::DynamoDb {
        out.push(if in_dynamodb {
            service(
                "dynamodb",
                "DYNAMODB",
                "the lease table and the exactly-once table",
            )
        } else {
            service("dynamodb", "DYNAMODB", "the lease table")
        });
    }
    let sink = settings.dead_letters.as_deref().unwrap_or_default();
    let letters = if sink.starts_with("sqs:") {
        Some(service("sqs", "SQS", "the dead-letter sink"))
    } else if sink.starts_with("s3://") {
        Some(service("s3", "S3", "the dead-letter sink"))
    } else if sink.starts_with("kinesis:") {
        Some(service("kinesis", "KINESIS", "the dead-letter sink"))
    } else {
        None
    };
    out.extend(letters);
    out
}

/// `url` without its user information (`user:password@`) and its query. Everything up to
/// the last `@` goes first (a password may hold `?`, `#` or `/`): hiding too much of an
/// endpoint is harmless, showing part of a password is not.
pub(super) fn shown(url: &str) -> String {
    let url = url.trim();
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    if scheme.is_empty() {
        rest.to_owned()
    } else {
        format!("{scheme}://{rest}")
    }
}

/// The endpoints' lines (comments) for `settings`, the environment read through `env`; empty
/// when the run calls no AWS service.
pub(super) fn section(settings: &Settings, env: &dyn Fn(&str) -> Option<String>) -> String {
    let services = services(settings);
    if services.is_empty() {
        return String::new();
    }
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let ignored = set("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let mut out = String::from(
        "\n# Endpoints the AWS SDK will use (from the environment; not settings of this binary):\n",
    );
    for s in services {
        let own = format!("AWS_ENDPOINT_URL_{}", s.env);
        let (url, from) = match (set(&own), set("AWS_ENDPOINT_URL")) {
            _ if ignored => (
                "AWS's, for the region".to_owned(),
                "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true".to_owned(),
            ),
            (Some(url), _) => (shown(&url), own),
            (None, Some(url)) => (shown(&url), "AWS_ENDPOINT_URL".to_owned()),
            (None, None) => (
                "AWS's, for the region".to_owned(),
                format!(
                    "neither {own} nor AWS_ENDPOINT_URL is set; a profile's endpoint_url would apply"
                ),
            ),
        };
        out.push_str(&format!("# {} ({}): {url}  # {from}\n", s.name, s.what));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn a_url_is_shown_without_credentials_or_query() {
        assert_eq!(shown("http://localhost:4566"), "http://localhost:4566");
        assert_eq!(
            shown("https://user:s3cret@sqs.example.com:443/path?X-Amz-Security-Token=abc"),
            "https://sqs.example.com:443/path"
        );
        assert_eq!(shown(" http://a@b:1 "), "http://b:1");
        assert_eq!(shown("localhost:4566"), "localhost:4566");
        assert_eq!(shown("https://user:p?ss@host/x"), "https://host/x");
        assert_eq!(shown("https://u:p#w@host"), "https://host");
        assert_eq!(shown("https://u:p/w@host:1"), "https://host:1");
    }
}
