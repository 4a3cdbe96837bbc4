//! What the docs promise by version matches what a user gets: no page speaks of a kcl version
//! the crates have not reached (docs once said "kcl 0.2 or later" of 0.1.0 crates), and the
//! changelog's newest heading is the crates' version.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use kcl_integration_tests::repo_root;

/// `(major, minor)` of a `0.1`- or `0.1.0`-style version.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The repository's Markdown and Rust files, build output and installed emulators left out.
fn sources(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                sources(&path, into);
            }
        } else if name.ends_with(".md") || name.ends_with(".rs") {
            into.push(path);
        }
    }
}

/// Every `kcl X.Y` in `text`.
fn mentions(text: &str) -> Vec<String> {
    text.match_indices("kcl ")
        .filter_map(|(at, _)| {
            let rest = &text[at + 4..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let version = rest[..end].trim_end_matches('.');
            major_minor(version).map(|_| version.to_owned())
        })
        .collect()
}

#[test]
fn no_doc_speaks_of_a_version_the_crates_have_not_reached() {
    let ours = major_minor(env!("CARGO_PKG_VERSION")).unwrap();
    let root = repo_root();
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 50, "found {} files", files.len());
    let mut ahead = Vec::new();
    // This file names a version ahead on purpose, to show the check sees one.
    for file in files.iter().filter(|f| !f.ends_with(file!())) {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for version in mentions(&text) {
            if major_minor(&version).is_some_and(|v| v > ours) {
                ahead.push(format!("{}: kcl {version}", file.display()));
            }
        }
    }
    assert!(
        ahead.is_empty(),
        "docs speak of versions after {}: {ahead:#?}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        mentions("needs kcl 0.2 or later"),
        ["0.2"],
        "the check sees them"
    );
}

#[test]
fn the_changelogs_newest_heading_is_the_crates_version() {
    let changelog = std::fs::read_to_string(repo_root().join("CHANGELOG.md")).unwrap();
    let newest = changelog
        .lines()
        .find_map(|line| line.strip_prefix("## "))
        .expect("a version heading");
    assert!(
        newest.starts_with(env!("CARGO_PKG_VERSION")),
        "CHANGELOG.md's newest heading `{newest}` is not the crates' version {}",
        env!("CARGO_PKG_VERSION")
    );
}
