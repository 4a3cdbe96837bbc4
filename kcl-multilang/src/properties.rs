//! The `.properties` format as `java.util.Properties.load` reads it, so that a file written
//! for KCL Java's MultiLangDaemon means the same here.
//!
//! - A logical line may run over several natural lines: a line ending in an odd number of
//!   backslashes continues on the next, whose leading white space is dropped.
//! - Lines that are blank, or whose first non-blank character is `#` or `!`, are skipped.
//! - The key runs to the first unescaped `=`, `:` or white space (space, tab, form feed); white
//!   space around the separator is dropped, and one `=` or `:` after white space is part of the
//!   separator. The rest of the line is the value, trailing white space included.
//! - In keys and values, `\t`, `\n`, `\r`, `\f` and `\uXXXX` are escapes, and a backslash before
//!   any other character stands for that character.
//! - A key given twice keeps its last value.
//!
//! One difference: Java reads the file as ISO-8859-1; a file that is valid UTF-8 is read as
//! UTF-8 here (what its author meant), any other as ISO-8859-1, as Java would.

use std::fmt;

/// A parsed file: its entries in file order, a key given twice only once (with its last value
/// and the line of that value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    entries: Vec<Entry>,
}

/// One `key = value` of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key, escapes resolved.
    pub key: String,
    /// The value, escapes resolved.
    pub value: String,
    /// The line (from 1) the entry starts on.
    pub line: usize,
}

/// A file that `Properties.load` would refuse too: a malformed `\uXXXX` escape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: malformed \\uXXXX escape")]
pub struct ParseError {
    /// The line (from 1) of the logical line that holds the escape.
    pub line: usize,
}

impl Properties {
    /// Parses the bytes of a file.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, ParseError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self::parse(text),
            Err(_) => Self::parse(&bytes.iter().map(|&b| char::from(b)).collect::<String>()),
        }
    }

    /// Parses the text of a file.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut properties = Self::default();
        for (line, logical) in logical_lines(text) {
            let (key, value) = split(&logical);
            let key = unescape(key).ok_or(ParseError { line })?;
            let value = unescape(value).ok_or(ParseError { line })?;
            properties.set(key, value, line);
        }
        Ok(properties)
    }

    fn set(&mut self, key: String, value: String, line: usize) {
        self.entries.retain(|e| e.key != key);
        self.entries.push(Entry { key, value, line });
    }

    /// The value of `key`, exactly as spelled.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    }

    /// Every entry, in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

impl fmt::Display for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.entries {
            writeln!(f, "{} = {}", e.key, e.value)?;
        }
        Ok(())
    }
}

/// White space as `Properties` sees it.
fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\u{c}')
}

/// The logical lines of `text` with the natural line each starts on, continuations joined
/// (their backslash and the next line's leading white space dropped), blank and comment lines
/// left out.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, natural) in natural_lines(text).into_iter().enumerate() {
        let line = n + 1;
        let continued = current.is_some();
        let trimmed = natural.trim_start_matches(is_blank);
        if !continued && (trimmed.is_empty() || trimmed.starts_with(['#', '!'])) {
            continue;
        }
        let backslashes = trimmed.chars().rev().take_while(|&c| c == '\\').count();
        let (body, continues) = if backslashes % 2 == 1 {
            (&trimmed[..trimmed.len() - 1], true)
        } else {
            (trimmed, false)
        };
        let (start, mut logical) = current.take().unwrap_or((line, String::new()));
        logical.push_str(body);
        if continues {
            current = Some((start, logical));
        } else {
            out.push((start, logical));
        }
    }
    // A continuation at the end of the file ends the line, as in Java.
    out.extend(current);
    out
}

/// Lines split at `\n`, `\r` or `\r\n`.
fn natural_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find(['\n', '\r']) {
            Some(i) => {
                lines.push(&rest[..i]);
                let skip = if rest[i..].starts_with("\r\n") { 2 } else { 1 };
                rest = &rest[i + skip..];
            }
            None => {
                lines.push(rest);
                rest = "";
            }
        }
    }
    lines
}

/// The raw key and raw value of a logical line (escapes not yet resolved).
fn split(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut key_end = line.len();
    let mut separator = None;
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '=' || c == ':' {
            key_end = i;
            separator = Some(i + 1);
            break;
        } else if is_blank(c) {
            key_end = i;
            break;
        }
    }
    let key = &line[..key_end];
    let rest = match separator {
        Some(after) => &line[after..],
        None => {
            // White space ended the key: it may be followed by one `=` or `:`.
            let rest = line[key_end..].trim_start_matches(is_blank);
            rest.strip_prefix(['=', ':']).unwrap_or(rest)
        }
    };
    (key, rest.trim_start_matches(is_blank))
}

/// Resolves escapes; `None` for a malformed `\uXXXX`.
fn unescape(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    // UTF-16 code units from `\u` escapes, joined so that surrogate pairs make one character.
    let mut units: Vec<u16> = Vec::new();
    while let Some(c) = chars.next() {
        if c != '\\' {
            flush(&mut units, &mut out);
            out.push(c);
            continue;
        }
        let Some(next) = chars.next() else {
            break;
        };
        if next == 'u' {
            let hex: String = chars.by_ref().take(4).collect();
            if hex.len() != 4 {
                return None;
            }
            units.push(u16::from_str_radix(&hex, 16).ok()?);
            continue;
        }
        flush(&mut units, &mut out);
        out.push(match next {
            't' => '\t',
            'n' => '\n',
            'r' => '\r',
            'f' => '\u{c}',
            other => other,
        });
    }
    flush(&mut units, &mut out);
    Some(out)
}

fn flush(units: &mut Vec<u16>, out: &mut String) {
    out.extend(char::decode_utf16(units.drain(..)).map(|c| c.unwrap_or('\u{fffd}')));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        Properties::parse(text)
            .unwrap()
            .entries()
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect()
    }

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    #[test]
    fn separators_are_equals_colon_or_white_space() {
        assert_eq!(
            pairs("a=1\nb: 2\nc 3\nd  =  4\ne\t:\t5 \nf\n"),
            [
                pair("a", "1"),
                pair("b", "2"),
                pair("c", "3"),
                pair("d", "4"),
                pair("e", "5 "),
                pair("f", "")
            ]
        );
        // Only the first separator counts; later ones are part of the value.
        assert_eq!(
            pairs("url = http://h:1/x=y"),
            [pair("url", "http://h:1/x=y")]
        );
        assert_eq!(pairs("k = = v"), [pair("k", "= v")]);
    }

    #[test]
    fn comments_blank_lines_and_line_endings() {
        let text = "# a comment\r\n  ! another\r\n\n   \nkey = value # not a comment\rnext=1";
        assert_eq!(
            pairs(text),
            [pair("key", "value # not a comment"), pair("next", "1")]
        );
    }

    #[test]
    fn continuations_join_lines_and_drop_leading_white_space() {
        let text = "executableName = python \\\n    app.py \\\n\t--flag\nother = x\\\\\nlast = y\\";
        assert_eq!(
            pairs(text),
            [
                pair("executableName", "python app.py --flag"),
                pair("other", "x\\"),
                pair("last", "y")
            ]
        );
        // A comment marker on a continuation line is text.
        assert_eq!(pairs("a = 1\\\n# 2"), [pair("a", "1# 2")]);
        let parsed = Properties::parse("\n\na = 1\\\n 2\nb = 3").unwrap();
        assert_eq!(parsed.entries()[0].line, 3);
        assert_eq!(parsed.entries()[1].line, 5);
    }

    #[test]
    fn escapes_in_keys_and_values() {
        assert_eq!(
            pairs(r"a\ key\=x = tab\there\u00e9\n\q"),
            [pair("a key=x", "tab\there\u{e9}\nq")]
        );
        // A surrogate pair in two escapes is one character.
        assert_eq!(pairs(r"k = \ud83d\ude00"), [pair("k", "\u{1f600}")]);
        assert_eq!(
            Properties::parse("ok = 1\nk = \\u12").unwrap_err(),
            ParseError { line: 2 }
        );
        assert!(Properties::parse(r"k = \uzzzz").is_err());
    }

    #[test]
    fn the_last_of_a_repeated_key_wins_and_encodings() {
        let parsed = Properties::parse("a = 1\nb = 2\na = 3").unwrap();
        assert_eq!(parsed.get("a"), Some("3"));
        assert_eq!(parsed.entries().len(), 2);
        assert_eq!(
            Properties::parse_bytes("k = caf\u{e9}".as_bytes())
                .unwrap()
                .get("k"),
            Some("caf\u{e9}")
        );
        // Not UTF-8: ISO-8859-1, as Java reads it.
        assert_eq!(
            Properties::parse_bytes(b"k = caf\xe9").unwrap().get("k"),
            Some("caf\u{e9}")
        );
    }
}
