//! `--print-config`: every key given and what it became, then what runs, with what the
//! environment adds (region, endpoints, the credentials' source, by name only).

use std::fmt::Write as _;

use super::{ClientSettings, Credentials, DaemonConfig, Use, canonical, near};
use crate::properties::Properties;

impl DaemonConfig {
    /// The mapping, for `--print-config`: every key given and what it became, then the
    /// resulting settings, with what `env` (the binary's environment) adds: the region,
    /// endpoints and credentials' source (names only, never a secret's value).
    pub fn describe(
        &self,
        properties: &Properties,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> String {
        let mut out = String::from("# keys given\n");
        for entry in properties.entries() {
            let what = match canonical(&entry.key) {
                Some((known, Use::Mapped(to))) if known != entry.key => {
                    format!("mapped as `{known}`: {to}")
                }
                Some((_, Use::Mapped(to))) => format!("mapped: {to}"),
                Some((_, Use::Ignored(why))) => format!("no equivalent, ignored: {why}"),
                None => match near(&entry.key) {
                    Some(known) => {
                        format!("unknown: ignored (keys are case-sensitive: `{known}`?)")
                    }
                    None => "unknown: ignored".to_owned(),
                },
            };
            let _ = writeln!(out, "{} = {}    # {what}", entry.key, entry.value);
        }
        let _ = writeln!(out, "\n# what runs");
        let _ = writeln!(
            out,
            "child = {:?} {:?}",
            self.command.program, self.command.args
        );
        let _ = match self.command.timeout {
            Some(limit) => writeln!(out, "child hook timeout (timeoutInSeconds) = {limit:?}"),
            None => writeln!(
                out,
                "child hook timeout (timeoutInSeconds) = {:?} (default; leaseLost {:?})",
                crate::DEFAULT_HOOK_BOUND,
                crate::child::LEASE_LOST_BOUND
            ),
        };
        let _ = writeln!(
            out,
            "child errors fail the batch (childErrorsFailBatch) = {}",
            self.command.errors_fail_batch
        );
        let _ = writeln!(out, "dead letters = {}", self.dead_letters_text());
        let _ = writeln!(out, "stream = {}", self.stream);
        let _ = writeln!(
            out,
            "lease table = {} ({:?}, {:?})",
            self.table_name, self.table_setup, self.billing
        );
        let _ = writeln!(out, "worker id = {}", self.worker_id);
        let _ = writeln!(out, "region = {}", self.region_source(env));
        for (what, client) in [("kinesis", &self.kinesis), ("dynamodb", &self.dynamodb)] {
            if let Some(region) = &client.region {
                let _ = writeln!(out, "{what} region = {region}");
            }
            let _ = writeln!(
                out,
                "{what} endpoint = {}",
                endpoint_source(what, client, env)
            );
        }
        let _ = writeln!(out, "credentials = {}", self.credentials_source(env));
        // usize::MAX is "no limit" (`maxLeasesForWorker` absent).
        let worker = format!("{:#?}", self.worker).replace(&usize::MAX.to_string(), "unlimited");
        let _ = writeln!(out, "worker = {worker}");
        out
    }

    /// Where dead letters go.
    fn dead_letters_text(&self) -> String {
        let Some(letters) = &self.dead_letters else {
            return "none (deadLetterSink not given)".to_owned();
        };
        match &letters.overflow {
            Some((bucket, prefix)) => {
                format!("{}, too large: s3://{bucket}/{prefix}", letters.sink)
            }
            None => letters.sink.to_string(),
        }
    }

    /// Where the region comes from: the file, the stream's ARN, or the environment.
    fn region_source(&self, env: &dyn Fn(&str) -> Option<String>) -> String {
        if let Some(region) = &self.region {
            return format!("{region} (the properties file)");
        }
        for name in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
            if let Some(region) = env(name).filter(|v| !v.is_empty()) {
                return format!("{region} (from {name})");
            }
        }
        match env("AWS_PROFILE") {
            Some(profile) => {
                format!("the region of profile {profile} (AWS_PROFILE), if it has one")
            }
            None => "none given: the default profile's, else instance metadata's; \
                     set regionName or AWS_REGION"
                .to_owned(),
        }
    }

    /// Where credentials come from, by the names of what is set (never a value).
    fn credentials_source(&self, env: &dyn Fn(&str) -> Option<String>) -> String {
        let set = |name: &str| env(name).is_some_and(|v| !v.is_empty());
        match &self.credentials {
            Credentials::Environment => {
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY only (EnvironmentVariableCredentialsProvider)"
                    .to_owned()
            }
            Credentials::Profile(profile) => format!(
                "profile {} of the shared config files (ProfileCredentialsProvider)",
                profile.as_deref().unwrap_or("default")
            ),
            Credentials::DefaultChain => {
                let first = if set("AWS_ACCESS_KEY_ID") {
                    "the environment (AWS_ACCESS_KEY_ID is set)".to_owned()
                } else if let Some(profile) = env("AWS_PROFILE") {
                    format!("profile {profile} (AWS_PROFILE)")
                } else if set("AWS_WEB_IDENTITY_TOKEN_FILE") {
                    "web identity (AWS_WEB_IDENTITY_TOKEN_FILE: IRSA)".to_owned()
                } else if set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                    || set("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                {
                    "the container's role (AWS_CONTAINER_CREDENTIALS_*: ECS, EKS Pod Identity)"
                        .to_owned()
                } else {
                    "the default profile, else the instance profile".to_owned()
                };
                format!("the standard chain; here: {first}")
            }
        }
    }
}

/// Where a client's endpoint comes from: the file, the environment, or AWS's.
fn endpoint_source(
    what: &str,
    client: &ClientSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> String {
    if let Some(endpoint) = &client.endpoint {
        return format!("{endpoint} (the properties file)");
    }
    let own = format!("AWS_ENDPOINT_URL_{}", what.to_ascii_uppercase());
    for name in [own.as_str(), "AWS_ENDPOINT_URL"] {
        if let Some(endpoint) = env(name).filter(|v| !v.is_empty()) {
            return format!("{endpoint} (from {name})");
        }
    }
    "AWS's".to_owned()
}
