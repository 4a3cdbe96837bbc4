//! A setting that is a duration or `"off"` (`None`), in a configuration file:
//! [`WorkerConfig::stalled_after`](super::WorkerConfig::stalled_after) and
//! [`WorkerConfig::restart_grace`](super::WorkerConfig::restart_grace). Durations are
//! humantime strings (`"10m"`), as every other duration of the file; `null` is off too.

use std::time::Duration;

use humantime_serde::re::humantime;
use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

/// The word for `None`.
const OFF: &str = "off";

pub(super) fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        None => s.serialize_str(OFF),
        Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
    }
}

pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let text = text.trim();
    if text.eq_ignore_ascii_case(OFF) {
        return Ok(None);
    }
    humantime::parse_duration(text).map(Some).map_err(|e| {
        D::Error::custom(format!(
            "expected a duration such as \"10m\", or \"off\", got {text:?} ({e})"
        ))
    })
}

#[cfg(test)]
mod tests {
    use crate::WorkerConfig;

    fn stalled_after(json: &str) -> Result<Option<std::time::Duration>, String> {
        let config: Result<WorkerConfig, _> = serde_json::from_str(json);
        config.map(|c| c.stalled_after).map_err(|e| e.to_string())
    }

    #[test]
    fn a_duration_or_off_and_written_back_as_read() {
        let minute = Some(std::time::Duration::from_secs(60));
        assert_eq!(stalled_after(r#"{"stalled_after": "1m"}"#), Ok(minute));
        assert_eq!(stalled_after(r#"{"stalled_after": "OFF"}"#), Ok(None));
        assert_eq!(stalled_after(r#"{"stalled_after": null}"#), Ok(None));
        assert_eq!(
            stalled_after("{}"),
            Ok(WorkerConfig::default().stalled_after)
        );
        let bad = stalled_after(r#"{"stalled_after": "soon"}"#);
        assert!(bad.is_err_and(|e| e.contains("or \"off\"")));
        for value in [minute, None] {
            let config = WorkerConfig::default().stalled_after(value);
            let text = serde_json::to_string(&config).unwrap_or_default();
            assert_eq!(stalled_after(&text), Ok(value), "{text}");
        }
    }

    #[test]
    fn a_restart_grace_is_off_unless_given() {
        let grace = |json: &str| {
            let config: Result<WorkerConfig, _> = serde_json::from_str(json);
            config.map(|c| c.restart_grace).map_err(|e| e.to_string())
        };
        assert_eq!(grace("{}"), Ok(None));
        assert_eq!(grace(r#"{"restart_grace": "off"}"#), Ok(None));
        let minute = Some(std::time::Duration::from_secs(60));
        assert_eq!(grace(r#"{"restart_grace": "1m"}"#), Ok(minute));
    }
}
