//! A counting HTTP proxy in front of the DynamoDB endpoint: every request a fleet sends to the
//! lease table (and its stream) passes through it and is recorded with what it read, so that
//! the bill of an idle minute can be read off real requests of unchanged programs (the README's
//! example, or KCL Java with its `dynamoDBEndpoint` pointed here).
//!
//! Units are computed as DynamoDB bills them on demand, from what each request did: a write
//! (`PutItem`, `UpdateItem`, `DeleteItem`) of a lease row (all under 1 KB) is one write unit; a
//! `GetItem` one read unit, half if eventually consistent; a `Scan` or `Query` one unit per 4 KB
//! returned (half if eventually consistent; items sized as DynamoDB sizes them: names plus
//! values, see [`item_bytes`]); a DynamoDB Streams `GetRecords` one streams read request; control-plane
//! calls (`DescribeTable`, `DescribeStream`, `GetShardIterator`) nothing.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// On-demand prices, us-east-1, since November 2024: dollars per million units.
pub const READ_PRICE: f64 = 0.125;
/// Dollars per million write request units.
pub const WRITE_PRICE: f64 = 0.625;
/// DynamoDB Streams: dollars per million `GetRecords` requests ($0.02 per 100,000).
pub const STREAM_PRICE: f64 = 0.20;

/// One request as the meter saw it.
#[derive(Debug, Clone)]
pub struct Call {
    at: Instant,
    /// `UpdateItem`, `GetRecords`, …
    operation: String,
    /// The table, with `/index` or `/stream` where the request named one.
    resource: String,
    consistent: bool,
    /// Bytes of the items a read returned.
    returned: usize,
}

/// What one kind of request cost over a window.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cost {
    /// Requests.
    pub requests: u64,
    /// Read units, as DynamoDB bills them on demand.
    pub read_units: f64,
    /// Write units.
    pub write_units: f64,
    /// DynamoDB Streams `GetRecords` requests.
    pub stream_reads: u64,
}

impl Cost {
    fn add(&mut self, call: &Call) {
        self.requests += 1;
        let factor = if call.consistent { 1.0 } else { 0.5 };
        match call.operation.as_str() {
            "PutItem" | "UpdateItem" | "DeleteItem" => self.write_units += 1.0,
            "GetItem" => self.read_units += factor,
            "Scan" | "Query" => {
                #[allow(clippy::cast_precision_loss)]
                let blocks = call.returned.div_ceil(4096).max(1) as f64;
                self.read_units += blocks * factor;
            }
            "GetRecords" => self.stream_reads += 1,
            _ => {}
        }
    }

    /// Dollars this cost, per month of 730 hours, if it recurred every `window_seconds`.
    pub fn monthly(&self, window_seconds: f64) -> f64 {
        let per_window = self.read_units * READ_PRICE
            + self.write_units * WRITE_PRICE
            + f64::from(u32::try_from(self.stream_reads).unwrap_or(u32::MAX)) * STREAM_PRICE;
        per_window / 1e6 * (730.0 * 3600.0 / window_seconds)
    }
}

/// The proxy: its address, and the calls it has seen.
#[derive(Debug, Clone)]
pub struct Meter {
    /// Where it listens.
    pub addr: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Meter {
    /// Listens on `port` of 127.0.0.1 (0: a free one) and forwards to `upstream`
    /// (`http://host:port`).
    pub async fn start(upstream: &str, port: u16) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let calls = Arc::new(Mutex::new(Vec::new()));
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let upstream: Arc<str> = upstream.trim_end_matches('/').into();
        let recorded = calls.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (client, upstream, calls) =
                    (client.clone(), upstream.clone(), recorded.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        forward(request, client.clone(), upstream.clone(), calls.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, calls })
    }

    /// `http://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The calls seen from `from` on, by (operation, resource, consistent read).
    pub fn since(&self, from: Instant) -> BTreeMap<(String, String, bool), Cost> {
        let calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let mut by = BTreeMap::<_, Cost>::new();
        for call in calls.iter().filter(|c| c.at >= from) {
            let key = (
                call.operation.clone(),
                call.resource.clone(),
                call.consistent,
            );
            by.entry(key).or_default().add(call);
        }
        by
    }
}

/// Forwards one request unchanged (the `Host` header too: the emulators do not check
/// signatures) and records it.
async fn forward(
    request: Request<Incoming>,
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: Arc<str>,
    calls: Arc<Mutex<Vec<Call>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    match relay(request, &client, &upstream).await {
        Ok((call, response)) => {
            calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(call);
            Ok(response)
        }
        Err(error) => {
            let mut response = Response::new(Full::new(Bytes::from(error.to_string())));
            *response.status_mut() = hyper::StatusCode::BAD_GATEWAY;
            Ok(response)
        }
    }
}

async fn relay(
    request: Request<Incoming>,
    client: &Client<HttpConnector, Full<Bytes>>,
    upstream: &str,
) -> anyhow::Result<(Call, Response<Full<Bytes>>)> {
    let at = Instant::now();
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{upstream}{path}").parse()?;
    let operation = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.rsplit('.').next())
        .unwrap_or("?")
        .to_owned();
    let sent: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let response = client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
        .context("upstream")?;
    let (mut parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    // Sent again whole: the length is the new body's.
    parts.headers.remove(hyper::header::TRANSFER_ENCODING);
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let returned = match (answer.get("Items"), answer.get("Item")) {
        (Some(serde_json::Value::Array(items)), _) => items.iter().map(item_bytes).sum(),
        (_, Some(item)) => item_bytes(item),
        _ => 0,
    };
    let call = Call {
        at,
        resource: resource(&sent),
        consistent: sent.get("ConsistentRead") == Some(&serde_json::Value::Bool(true)),
        operation,
        returned,
    };
    Ok((call, Response::from_parts(parts, Full::new(body))))
}

/// The table a request names, with its index, or `stream` for DynamoDB Streams requests.
fn resource(sent: &serde_json::Value) -> String {
    let table = sent.get("TableName").and_then(|t| t.as_str());
    let index = sent.get("IndexName").and_then(|t| t.as_str());
    let stream = ["StreamArn", "ShardIterator"]
        .iter()
        .any(|field| sent.get(field).is_some());
    match (table, index) {
        (Some(table), Some(index)) => format!("{table}/{index}"),
        (Some(table), None) => table.to_owned(),
        (None, _) if stream => "stream".to_owned(),
        (None, _) => "-".to_owned(),
    }
}

/// The size DynamoDB bills for an item in its wire JSON (`{"name": {"S": "…"}, …}`): each
/// attribute's name plus its value (strings and binaries their length, numbers about a byte per
/// two digits plus one, sets their members, lists and maps 3 bytes plus their members and a
/// byte each).
pub fn item_bytes(item: &serde_json::Value) -> usize {
    let Some(attributes) = item.as_object() else {
        return 0;
    };
    attributes
        .iter()
        .map(|(name, value)| name.len() + value_bytes(value))
        .sum()
}

fn value_bytes(typed: &serde_json::Value) -> usize {
    let Some((kind, value)) = typed.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    fn text(v: &serde_json::Value) -> usize {
        v.as_str().map_or(0, str::len)
    }
    fn number(v: &serde_json::Value) -> usize {
        v.as_str().map_or(1, |n| n.len().div_ceil(2) + 1)
    }
    fn members(v: &serde_json::Value) -> &[serde_json::Value] {
        v.as_array().map_or(&[][..], Vec::as_slice)
    }
    match kind.as_str() {
        "S" | "B" => text(value),
        "N" => number(value),
        "BOOL" | "NULL" => 1,
        "SS" | "BS" => members(value).iter().map(text).sum(),
        "NS" => members(value).iter().map(number).sum(),
        "L" => {
            3 + members(value)
                .iter()
                .map(|v| value_bytes(v) + 1)
                .sum::<usize>()
        }
        "M" => {
            let entries = value.as_object().into_iter().flatten();
            3 + entries
                .map(|(name, v)| name.len() + value_bytes(v) + 1)
                .sum::<usize>()
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_sized_as_dynamodb_sizes_them() {
        let item = serde_json::json!({
            "leaseKey": {"S": "shardId-000000000000"},
            "leaseCounter": {"N": "1234"},
            "parentShardId": {"SS": ["shardId-1", "shardId-2"]},
        });
        // 8 + 20, 12 + 3, 13 + 18.
        assert_eq!(item_bytes(&item), 74);
    }
}
