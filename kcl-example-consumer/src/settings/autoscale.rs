//! The fleet's autoscaling settings: kcl-core's [`Autoscaling`] (how the leader works out
//! `desired_workers`, and whether it publishes it), and where KEDA's external scaler is
//! served.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kcl_core::Autoscaling;

use super::{Origin, RunArgs, SettingsError, Values};

/// How often the leader publishes its figures when the scaler is served and nothing else was
/// asked: every worker answers KEDA, which polls every 30 s by default (its
/// `pollingInterval`), with figures at most this old plus a read.
const PUBLISH_WITH_SCALER: Duration = Duration::from_secs(15);

/// kcl-core's autoscaling of `a` (checked by `WorkerConfig::validate`, whose keys
/// `autoscaling.<key>` are ours without the prefix).
pub(super) fn autoscaling(a: &RunArgs) -> Autoscaling {
    let publish = match a.publish_interval {
        Some(given) => given.0,
        None => a.scaler_port.map(|_| PUBLISH_WITH_SCALER),
    };
    Autoscaling::default()
        .catch_up(a.catch_up.0)
        .utilization(a.utilization)
        .workers(a.min_workers, a.max_workers.0)
        .windows(a.scale_up_window.0, a.scale_down_window.0)
        .publish_interval(publish)
}

/// Where KEDA's external scaler is served: `--scaler-port` on the host of `listen`; `None`
/// when off. The effective `publish-interval` goes into `effective` when it was defaulted.
pub(super) fn scaler(
    a: &RunArgs,
    v: &Values<'_>,
    listen: SocketAddr,
    effective: &mut BTreeMap<String, (String, Origin)>,
) -> Result<Option<SocketAddr>, SettingsError> {
    if a.publish_interval.is_none() {
        let shown = match a.scaler_port {
            Some(_) => humantime::format_duration(PUBLISH_WITH_SCALER).to_string(),
            None => "off".to_owned(),
        };
        effective.insert("publish_interval".into(), (shown, Origin::Default));
    }
    let Some(port) = a.scaler_port else {
        return Ok(None);
    };
    if port != 0 && port == listen.port() {
        return Err(v.fail(
            "scaler_port",
            format!("{port} is the HTTP server's port (listen): pick another"),
        ));
    }
    if !cfg!(feature = "scaler") {
        return Err(v.fail(
            "scaler_port",
            "this build has no scaler: build with `--features scaler`".into(),
        ));
    }
    Ok(Some(SocketAddr::new(listen.ip(), port)))
}
