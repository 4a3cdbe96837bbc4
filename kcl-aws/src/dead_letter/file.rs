//! [`FileSink`]: letters as JSON lines in a local file, for development; reading the file
//! back and rewriting it without the letters redriven.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use kcl_core::failure::{DeadLetter, DeadLetterSink};
use kcl_core::{BackendError, ErrorKind};

use super::format::{LetterId, from_json, to_json};
use super::stored::{At, Listing, ReadError, Stored, Unreadable};

/// A [`DeadLetterSink`] that appends each letter to a local file, one JSON line each, and
/// returns once the line is written and synced to disk (`fsync`). For development and tests:
/// the file is on one machine, and gone with it.
///
/// Writers and `kcl-admin dead-letters redrive` (which rewrites the file without the letters
/// it redrove) take turns through a lock on a file beside it, `PATH.lock`, so that no letter
/// appended during a rewrite is lost. A letter put twice is two lines with the same id.
#[derive(Debug, Clone)]
pub struct FileSink {
    path: PathBuf,
}

impl FileSink {
    /// A sink appending to `path`, created (not its folder) at the first letter.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl DeadLetterSink for FileSink {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        let path = self.path.clone();
        let line = to_json(letter);
        let failed = |e: &dyn std::fmt::Display| {
            BackendError::new(
                ErrorKind::Retryable,
                "append",
                format!("{}: {e}", path.display()),
            )
        };
        let written = tokio::task::spawn_blocking({
            let path = self.path.clone();
            move || append(&path, &line)
        })
        .await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(failed(&e)),
            Err(e) => Err(failed(&e)),
        }
    }
}

/// The lock beside `path` that writers and rewriters take.
fn lock(path: &Path) -> io::Result<File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(PathBuf::from(name))?;
    lock.lock()?;
    Ok(lock)
}

/// Appends `line` and a newline to `path`, synced to disk, under the lock.
fn append(path: &Path, line: &str) -> io::Result<()> {
    let _lock = lock(path)?;
    let existed = path.exists();
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    file.write_all(&bytes)?;
    file.sync_all()?;
    if !existed {
        sync_folder(path)?;
    }
    Ok(())
}

/// Syncs the folder of `path`, so that a file created or renamed in it stays (Unix).
fn sync_folder(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(folder)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> ReadError + '_ {
    move |source| ReadError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Every letter of the file at `path` (none if there is no file).
pub(crate) fn list(path: &Path) -> Result<Listing, ReadError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_error(path)(e)),
    };
    let mut listing = Listing::default();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = At::File {
            path: path.to_owned(),
            line: index + 1,
        };
        match from_json(line.as_bytes()) {
            Ok(letter) => listing.letters.push(Stored::new(letter, at)),
            Err(e) => listing.unreadable.push(Unreadable {
                place: at.to_string(),
                error: e.to_string(),
                at: None,
            }),
        }
    }
    Ok(listing)
}

/// Rewrites the file at `path` without the lines of the letters `ids` (lines that are not
/// letters stay), through a file beside it renamed over it, under the lock. Returns how many
/// lines went.
pub(crate) fn remove(path: &Path, ids: &HashSet<LetterId>) -> Result<usize, ReadError> {
    let _lock = lock(path).map_err(io_error(path))?;
    let text = fs::read_to_string(path).map_err(io_error(path))?;
    let mut kept = String::with_capacity(text.len());
    let mut removed = 0;
    for line in text.lines() {
        let redriven = from_json(line.as_bytes()).is_ok_and(|l| ids.contains(&LetterId::of(&l)));
        if redriven {
            removed += 1;
        } else if !line.trim().is_empty() {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    if removed == 0 {
        return Ok(0);
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    let temporary = PathBuf::from(name);
    let write = || -> io::Result<()> {
        let mut file = File::create(&temporary)?;
        file.write_all(kept.as_bytes())?;
        file.sync_all()?;
        fs::rename(&temporary, path)?;
        sync_folder(path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&temporary);
        io_error(path)(e)
    })?;
    Ok(removed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kcl_core::failure::Reason;

    use super::super::format::tests::sample;
    use super::*;

    #[tokio::test]
    async fn lines_go_in_and_come_out() {
        let dir = std::env::temp_dir().join(format!("kcl-file-sink-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("letters.jsonl");
        let _ = fs::remove_file(&path);
        let sink = FileSink::new(&path);
        let (a, mut b) = (sample(Reason::Attempts), sample(Reason::Permanent));
        b.record = b.record.clone().with_sub_sequence_number(4);
        sink.put(&a).await.unwrap();
        sink.put(&b).await.unwrap();
        fs::write(&path, fs::read_to_string(&path).unwrap() + "not json\n").unwrap();
        let listing = list(&path).unwrap();
        assert_eq!(listing.letters.len(), 2);
        assert_eq!(listing.letters[0].letter, a);
        assert_eq!(listing.unreadable.len(), 1);
        assert_eq!(
            listing.unreadable[0].place,
            format!("line 3 of {}", path.display())
        );
        let gone = HashSet::from([LetterId::of(&a)]);
        assert_eq!(remove(&path, &gone).unwrap(), 1);
        let after = list(&path).unwrap();
        assert_eq!(after.letters.len(), 1);
        assert_eq!(after.letters[0].letter, b);
        assert_eq!(after.unreadable.len(), 1, "lines that are not letters stay");
        fs::remove_dir_all(&dir).unwrap();
    }
}
