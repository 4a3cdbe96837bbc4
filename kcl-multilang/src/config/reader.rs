//! Reading the keys' values, every error kept.

use std::time::Duration;

use super::{KeyError, canonical, key_error};
use crate::properties::Properties;

/// Reads properties for the keys of `KEYS`, keeping every error met on the way.
pub(super) struct Reader<'a> {
    properties: &'a Properties,
    /// The errors met so far, in the order the keys were read.
    pub(super) errors: std::cell::RefCell<Vec<KeyError>>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(properties: &'a Properties) -> Self {
        Self {
            properties,
            errors: std::cell::RefCell::default(),
        }
    }

    /// `result`'s value, or `None` with its error kept.
    pub(super) fn keep<T>(&self, result: Result<T, KeyError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                self.errors.borrow_mut().push(error);
                None
            }
        }
    }

    /// A key's parsed value, if given and valid (its error kept otherwise).
    pub(super) fn optional<T>(&self, result: Result<Option<T>, KeyError>) -> Option<T> {
        self.keep(result).flatten()
    }

    pub(super) fn get(&self, key: &'static str) -> Option<&str> {
        self.properties
            .entries()
            .iter()
            .rev()
            .find(|e| canonical(&e.key).is_some_and(|(k, _)| k == key))
            .map(|e| e.value.trim())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn required(&self, key: &'static str) -> Result<&str, KeyError> {
        self.get(key)
            .ok_or_else(|| key_error(key, "missing, and it has no default"))
    }

    pub(super) fn number<T: std::str::FromStr>(
        &self,
        key: &'static str,
    ) -> Result<Option<T>, KeyError>
    where
        T::Err: std::fmt::Display,
    {
        self.get(key)
            .map(|v| {
                v.parse::<T>()
                    .map_err(|e| key_error(key, format!("`{v}` is not a whole number: {e}")))
            })
            .transpose()
    }

    /// A key's value read by its type ([`FromStr`](std::str::FromStr)): a mode of kcl-core
    /// or kcl-aws, whose error says what was given and what is accepted.
    pub(super) fn parsed<T: std::str::FromStr>(
        &self,
        key: &'static str,
    ) -> Result<Option<T>, KeyError>
    where
        T::Err: std::fmt::Display,
    {
        self.get(key)
            .map(|v| v.parse::<T>().map_err(|e| key_error(key, e.to_string())))
            .transpose()
    }

    pub(super) fn millis(&self, key: &'static str) -> Result<Option<Duration>, KeyError> {
        Ok(self.number::<u64>(key)?.map(Duration::from_millis))
    }

    pub(super) fn boolean(&self, key: &'static str) -> Result<Option<bool>, KeyError> {
        self.get(key)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(key_error(key, format!("`{v}` is neither true nor false"))),
            })
            .transpose()
    }
}
