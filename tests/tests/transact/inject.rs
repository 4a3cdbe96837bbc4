//! An SDK interceptor on the worker's DynamoDB client that records every
//! `TransactWriteItems` attempt and injects what moto cannot produce: a transaction
//! cancelled by a `TransactionConflict` (nothing applied), a transaction applied whose answer
//! is lost (a 504 instead of moto's answer), and a renewal cancelled by a
//! `TransactionConflictException`.
//!
//! A request to cancel is turned, before it is sent, into a harmless `ListTables`, so that
//! moto applies nothing; its answer is then replaced by the injected error. The hooks of one
//! call share the call's config bag: the call's mark is kept there as an `AppName` (a type
//! the SDK re-exports and the bag stores; nothing reads it after signing).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeDeserializationInterceptorContextMut,
    BeforeTransmitInterceptorContextMut,
};
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{AppName, ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::{BoxError, ProvideErrorMetadata};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use serde_json::Value;

/// What happens to one `TransactWriteItems` attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Cancelled by a conflict on the lease row (the last action); nothing applied.
    Conflict,
    /// Applied by moto, answered with a 504 (a lost answer).
    LoseAnswer,
}

/// How an attempt ended, as the SDK read the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Not answered yet.
    Pending,
    /// Success.
    Applied,
    /// `TransactionCanceledException`, with the reasons' codes.
    Cancelled(Vec<String>),
    /// Any other error, by its code.
    Failed(String),
}

/// One `TransactWriteItems` attempt.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    /// Its actions, the lease row's included.
    pub(crate) actions: usize,
    /// The `id` of every item it writes, in order (the lease row's `leaseKey` last).
    pub(crate) ids: Vec<String>,
    /// The lease row's update: its expression, the checkpoint it writes and its fence.
    pub(crate) lease_update: String,
    /// The checkpoint written.
    pub(crate) checkpoint: String,
    /// The fence the lease row's condition asks for.
    pub(crate) fence: String,
    /// `ClientRequestToken`.
    pub(crate) token: String,
    /// What was injected.
    pub(crate) fault: Option<Fault>,
    /// How it ended.
    pub(crate) answer: Answer,
}

impl Attempt {
    fn of(body: &Value, fault: Option<Fault>) -> Self {
        let items = body["TransactItems"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ids = items
            .iter()
            .map(|item| {
                let action = item.as_object().and_then(|o| o.values().next()).cloned();
                let action = action.unwrap_or_default();
                let key = if action["Item"].is_object() {
                    &action["Item"]
                } else {
                    &action["Key"]
                };
                let id = key["id"]["S"]
                    .as_str()
                    .or_else(|| key["leaseKey"]["S"].as_str());
                id.unwrap_or("?").to_owned()
            })
            .collect();
        let lease = items
            .last()
            .map(|i| i["Update"].clone())
            .unwrap_or_default();
        let value = |name: &str, ty: &str| {
            lease["ExpressionAttributeValues"][name][ty]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        Self {
            actions: items.len(),
            ids,
            lease_update: lease["UpdateExpression"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            checkpoint: value(":checkpoint", "S"),
            fence: value(":fence", "N"),
            token: body["ClientRequestToken"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            fault,
            answer: Answer::Pending,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    script: VecDeque<Fault>,
    renewals_to_cancel: usize,
    renewals_cancelled: usize,
    attempts: Vec<Attempt>,
}

/// The interceptor; clones share its state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults(Arc<Mutex<State>>);

/// A call's mark: `kcl-t<attempt>-<fault>` or `kcl-renewal`.
fn mark(attempt: Option<usize>, fault: Option<Fault>) -> String {
    match (attempt, fault) {
        (None, _) => "kcl-renewal".to_owned(),
        (Some(i), None) => format!("kcl-t{i}-none"),
        (Some(i), Some(Fault::Conflict)) => format!("kcl-t{i}-conflict"),
        (Some(i), Some(Fault::LoseAnswer)) => format!("kcl-t{i}-lose"),
    }
}

fn attempt_of(mark: &str) -> Option<usize> {
    mark.strip_prefix("kcl-t")?.split('-').next()?.parse().ok()
}

impl Faults {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A client like `base`, through this interceptor, without the SDK's own retries (the
    /// core retries a commit).
    pub(crate) fn client(&self, base: &aws_sdk_dynamodb::Client) -> aws_sdk_dynamodb::Client {
        let config = base
            .config()
            .to_builder()
            .retry_config(RetryConfig::disabled())
            .interceptor(self.clone())
            .build();
        aws_sdk_dynamodb::Client::from_conf(config)
    }

    /// The next attempts' faults, in order (attempts past them go through).
    pub(crate) fn script(&self, faults: &[Fault]) {
        self.state().script.extend(faults);
    }

    /// Cancels the next `n` renewals with a `TransactionConflictException`.
    pub(crate) fn cancel_renewals(&self, n: usize) {
        self.state().renewals_to_cancel += n;
    }

    /// Renewals cancelled so far.
    pub(crate) fn renewals_cancelled(&self) -> usize {
        self.state().renewals_cancelled
    }

    /// Every `TransactWriteItems` attempt so far.
    pub(crate) fn attempts(&self) -> Vec<Attempt> {
        self.state().attempts.clone()
    }
}

/// A renewal: an `UpdateItem` that moves the counter and nothing but the load.
fn is_renewal(body: &Value) -> bool {
    let expr = body["UpdateExpression"].as_str().unwrap_or_default();
    expr.starts_with("SET #leaseCounter = :leaseCounter")
        && !expr.contains("#checkpoint")
        && !expr.contains("REMOVE")
}

fn error(status: u16, body: String) -> Result<HttpResponse, BoxError> {
    let mut response = HttpResponse::new(status.try_into()?, body.into());
    response
        .headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    Ok(response)
}

fn cancelled(actions: usize) -> String {
    let mut reasons = vec![r#"{"Code":"None"}"#.to_owned(); actions.saturating_sub(1)];
    reasons.push(
        r#"{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"}"#
            .to_owned(),
    );
    format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","Message":"Transaction cancelled (injected)","CancellationReasons":[{}]}}"#,
        reasons.join(",")
    )
}

impl Intercept for Faults {
    fn name(&self) -> &'static str {
        "kcl-test-faults"
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let target = request
            .headers()
            .get("x-amz-target")
            .unwrap_or_default()
            .to_owned();
        let body: Value = request
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default();
        let mut state = self.state();
        let (name, neutralize) = if target.ends_with(".TransactWriteItems") {
            let fault = state.script.pop_front();
            state.attempts.push(Attempt::of(&body, fault));
            let index = state.attempts.len() - 1;
            (mark(Some(index), fault), fault == Some(Fault::Conflict))
        } else if target.ends_with(".UpdateItem")
            && is_renewal(&body)
            && state.renewals_to_cancel > 0
        {
            state.renewals_to_cancel -= 1;
            state.renewals_cancelled += 1;
            (mark(None, None), true)
        } else {
            return Ok(());
        };
        drop(state);
        cfg.interceptor_state().store_put(AppName::new(name)?);
        if neutralize {
            let request = context.request_mut();
            request
                .headers_mut()
                .insert("x-amz-target", "DynamoDB_20120810.ListTables");
            request.headers_mut().insert("content-length", "2");
            *request.body_mut() = "{}".into();
        }
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(name) = cfg.load::<AppName>().map(|a| a.as_ref().to_owned()) else {
            return Ok(());
        };
        let replaced = if name == "kcl-renewal" {
            let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","message":"Transaction is ongoing for the item (injected)"}"#;
            error(400, body.to_owned())?
        } else if name.ends_with("-conflict") {
            let attempt = attempt_of(&name).ok_or("unmarked attempt")?;
            let actions = self.state().attempts.get(attempt).map_or(1, |a| a.actions);
            error(400, cancelled(actions))?
        } else if name.ends_with("-lose") {
            error(504, String::new())?
        } else {
            return Ok(());
        };
        *context.response_mut() = replaced;
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(attempt) = cfg.load::<AppName>().and_then(|a| attempt_of(a.as_ref())) else {
            return Ok(());
        };
        let answer = match context.output_or_error() {
            Ok(_) => Answer::Applied,
            Err(e) => match e
                .as_operation_error()
                .and_then(|e| e.downcast_ref::<TransactWriteItemsError>())
            {
                Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                    Answer::Cancelled(
                        c.cancellation_reasons()
                            .iter()
                            .map(|r| r.code().unwrap_or("?").to_owned())
                            .collect(),
                    )
                }
                Some(other) => Answer::Failed(other.code().unwrap_or("?").to_owned()),
                None => Answer::Failed(format!("{e:?}")),
            },
        };
        if let Some(a) = self.state().attempts.get_mut(attempt) {
            a.answer = answer;
        }
        Ok(())
    }
}
