//! The config file: TOML, or YAML for `.yaml`/`.yml`, whose keys are `run`'s options
//! (`failover-time` or `failover_time`); an unknown key, a key given twice (in both spellings)
//! or a value that is not a single one is refused, naming it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::RunArgs;
use super::{Origin, SettingsError, kebab};

/// Values read from a config file, by snake-case key.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileValues {
    pub(super) path: PathBuf,
    pub(crate) values: BTreeMap<String, String>,
}

impl FileValues {
    /// Reads `path`: YAML if it ends in `.yaml` or `.yml`, TOML otherwise.
    pub(crate) fn load(path: &Path) -> Result<Self, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|e| SettingsError {
            key: "config".into(),
            origin: None,
            reason: format!("cannot read {}: {e}", path.display()),
        })?;
        let yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
        Self::parse(path, &text, yaml)
    }

    /// Parses file contents.
    pub(crate) fn parse(path: &Path, text: &str, yaml: bool) -> Result<Self, SettingsError> {
        let syntax = |reason: String| SettingsError {
            key: "config".into(),
            origin: None,
            reason: format!("{}: {}", path.display(), one_line(&reason)),
        };
        let map: serde_json::Map<String, serde_json::Value> = if yaml {
            if text.trim().is_empty() {
                serde_json::Map::new()
            } else {
                serde_norway::from_str(text).map_err(|e| syntax(e.to_string()))?
            }
        } else {
            toml::from_str(text).map_err(|e| syntax(e.to_string()))?
        };
        let keys = keys();
        let mut values = BTreeMap::new();
        for (raw_key, value) in map {
            let key = raw_key.replace('-', "_");
            if !keys.contains(&key) {
                return Err(SettingsError {
                    key: raw_key,
                    origin: Some(Origin::File(path.to_owned())),
                    reason: format!("unknown key; known keys: {}", known_keys(&keys)),
                });
            }
            let text = scalar(&value).ok_or_else(|| SettingsError {
                key: key.clone(),
                origin: Some(Origin::File(path.to_owned())),
                reason: format!("expected a single value, got {value}"),
            })?;
            // `failover-time` and `failover_time` are one key: written twice, which one wins
            // would be the map's order, so neither does.
            if values.insert(key.clone(), text).is_some() {
                return Err(SettingsError {
                    key: raw_key,
                    origin: Some(Origin::File(path.to_owned())),
                    reason: format!("given twice (as `{}` and `{key}`): keep one", kebab(&key)),
                });
            }
        }
        Ok(Self {
            path: path.to_owned(),
            values,
        })
    }
}

/// Every setting key, as the clap argument id (snake case): `run`'s options but `config`
/// and `print_config`. Flags and file keys are the kebab-case form; file keys may also be
/// written in snake case.
pub(crate) fn keys() -> Vec<String> {
    <RunArgs as clap::Args>::augment_args(clap::Command::new("run"))
        .get_arguments()
        .map(|a| a.get_id().as_str().to_owned())
        .filter(|id| !matches!(id.as_str(), "config" | "print_config"))
        .collect()
}

fn known_keys(keys: &[String]) -> String {
    keys.iter().map(|k| kebab(k)).collect::<Vec<_>>().join(", ")
}

/// A file value as text: strings as they are, numbers and booleans printed, a list of
/// strings joined by commas, a TOML datetime (which serde sees as a one-entry map) as its
/// string.
fn scalar(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        // A list (of streams): joined as it is written on the command line.
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(|items| items.join(",")),
        Value::Object(m) if m.len() == 1 => match m.values().next() {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
