//! [`FileSink`]: letters as JSON lines in a local file, for development; reading the file
//! back and rewriting it without the letters redriven.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
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
///
/// A letter always starts a line: after a torn append (a process killed while writing,
/// leaving part of a line without its newline), the next letter starts on a new line, and
/// readers report the torn part as unreadable and read every whole letter.
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

    /// The file's folder exists and a file may be created there (the lock beside the file),
    /// and the file, if there, may be appended to.
    async fn check(&self) -> Result<Vec<String>, BackendError> {
        let path = self.path.clone();
        let checked = tokio::task::spawn_blocking(move || check(&path)).await;
        let message = match checked {
            Ok(Ok(())) => return Ok(Vec::new()),
            Ok(Err(message)) => message,
            Err(e) => format!("{}: {e}", self.path.display()),
        };
        Err(BackendError::new(ErrorKind::Fatal, "check", message))
    }
}

/// [`FileSink::check`]: what is wrong with appending to `path`, said with what to fix.
fn check(path: &Path) -> Result<(), String> {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let fix = "create it, or fix the dead-letter sink's file";
    match fs::metadata(folder) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a folder: {fix}", folder.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format!(
                "the folder {} of the dead-letter file does not exist: {fix}",
                folder.display()
            ));
        }
        Err(e) => return Err(format!("{}: {e}", folder.display())),
    }
    let cannot =
        |e: io::Error| format!("cannot write the dead-letter file {}: {e}", path.display());
    drop(lock(path).map_err(cannot)?);
    if path.exists() {
        OpenOptions::new().append(true).open(path).map_err(cannot)?;
    }
    Ok(())
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

/// Appends `line` and a newline to `path`, synced to disk, under the lock; on a line of its
/// own, after a newline if the file does not end in one (a torn append).
fn append(path: &Path, line: &str) -> io::Result<()> {
    let _lock = lock(path)?;
    let existed = path.exists();
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    let mut bytes = Vec::with_capacity(line.len() + 2);
    if !ends_a_line(&mut file)? {
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    file.write_all(&bytes)?;
    file.sync_all()?;
    if !existed {
        sync_folder(path)?;
    }
    Ok(())
}

/// Whether `file` is empty or ends in a newline.
fn ends_a_line(file: &mut File) -> io::Result<bool> {
    if file.metadata()?.len() == 0 {
        return Ok(true);
    }
    file.seek(SeekFrom::End(-1))?;
    let mut last = [0u8];
    file.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

/// The lines of a file's bytes, split on `\n` (a last line without one included), each
/// decoded on its own: a torn append in the middle of a multi-byte character spoils its own
/// line, not the file.
fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let empty = bytes.is_empty();
    bytes.split(|b| *b == b'\n').filter(move |_| !empty)
}

/// The parts of a line that may each be a letter: the line, or, where a letter was appended
/// to a torn one (before appends began on a line of their own), the torn part and the
/// letter. A letter's JSON starts `{"version":`, which cannot appear inside it (a string
/// escapes its quotes). Bytes, not text: a torn part may end inside a UTF-8 character.
fn pieces(line: &[u8]) -> Vec<&[u8]> {
    const START: &[u8] = b"{\"version\":";
    let mut starts: Vec<usize> = (0..line.len())
        .filter(|i| line[*i..].starts_with(START))
        .collect();
    if starts.first() != Some(&0) {
        starts.insert(0, 0);
    }
    starts.push(line.len());
    starts
        .windows(2)
        .map(|w| &line[w[0]..w[1]])
        .filter(|p| !p.trim_ascii().is_empty())
        .collect()
}

/// The letter a piece of a line holds, or why it holds none (not UTF-8: a torn append).
fn letter_of(piece: &[u8]) -> Result<DeadLetter, String> {
    if let Err(e) = std::str::from_utf8(piece) {
        return Err(format!("not UTF-8 text (a torn append?): {e}"));
    }
    from_json(piece).map_err(|e| e.to_string())
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

/// Every letter of the file at `path` (none if there is no file); a line that holds none
/// (not a letter, or not UTF-8) is reported unreadable, and the other lines are read.
pub(crate) fn list(path: &Path) -> Result<Listing, ReadError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_error(path)(e)),
    };
    let mut listing = Listing::default();
    for (index, line) in lines(&bytes).enumerate() {
        for piece in pieces(line) {
            let at = At::File {
                path: path.to_owned(),
                line: index + 1,
            };
            match letter_of(piece) {
                Ok(letter) => listing.letters.push(Stored::new(letter, at)),
                Err(error) => listing.unreadable.push(Unreadable {
                    place: at.to_string(),
                    error,
                    at: None,
                }),
            }
        }
    }
    Ok(listing)
}

/// Rewrites the file at `path` without the lines of the letters `ids` (lines that are not
/// letters stay, byte for byte), through a file beside it renamed over it, under the lock.
/// Returns how many lines went.
pub(crate) fn remove(path: &Path, ids: &HashSet<LetterId>) -> Result<usize, ReadError> {
    let _lock = lock(path).map_err(io_error(path))?;
    let bytes = fs::read(path).map_err(io_error(path))?;
    let mut kept = Vec::with_capacity(bytes.len());
    let mut removed = 0;
    for piece in lines(&bytes).flat_map(pieces) {
        let redriven = letter_of(piece).is_ok_and(|l| ids.contains(&LetterId::of(&l)));
        if redriven {
            removed += 1;
        } else {
            kept.extend_from_slice(piece);
            kept.push(b'\n');
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
        file.write_all(&kept)?;
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

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kcl-file-sink-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A process killed mid-append leaves part of a line: the next letter still starts a
    /// line of its own, and readers name the torn part and read every whole letter.
    #[tokio::test]
    async fn a_torn_append_hides_no_letter() {
        let dir = folder("torn");
        let path = dir.join("letters.jsonl");
        let sink = FileSink::new(&path);
        let (a, mut b, mut c) = (
            sample(Reason::Attempts),
            sample(Reason::Permanent),
            sample(Reason::Age),
        );
        b.record = b.record.clone().with_sub_sequence_number(1);
        c.record = c.record.clone().with_sub_sequence_number(2);
        sink.put(&a).await.unwrap();
        let torn = &to_json(&b)[..40];
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(torn.as_bytes()).unwrap();
        drop(file);
        sink.put(&c).await.unwrap();
        let listing = list(&path).unwrap();
        let letters: Vec<_> = listing.letters.iter().map(|s| &s.letter).collect();
        assert_eq!(letters, [&a, &c]);
        assert_eq!(listing.unreadable.len(), 1, "{:?}", listing.unreadable);
        assert_eq!(
            listing.unreadable[0].place,
            format!("line 2 of {}", path.display())
        );

        // A file torn before appends began on a line of their own: the letter glued to the
        // torn part is read, and removing it leaves the torn part alone.
        let glued = dir.join("glued.jsonl");
        fs::write(&glued, format!("{}\n{torn}{}\n", to_json(&a), to_json(&c))).unwrap();
        let listing = list(&glued).unwrap();
        let letters: Vec<_> = listing.letters.iter().map(|s| &s.letter).collect();
        assert_eq!(letters, [&a, &c]);
        assert_eq!(listing.unreadable.len(), 1);
        assert_eq!(
            remove(&glued, &HashSet::from([LetterId::of(&c)])).unwrap(),
            1
        );
        let after = list(&glued).unwrap();
        assert_eq!(after.letters.len(), 1);
        assert_eq!(after.unreadable.len(), 1, "the torn part stays");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A torn append that ends inside a multi-byte UTF-8 character spoils its own line only:
    /// the letters on either side are listed, the fragment is reported unreadable, and
    /// removing a letter keeps the fragment's bytes as they were.
    #[tokio::test]
    async fn a_torn_multi_byte_character_hides_no_letter() {
        let dir = folder("torn-utf8");
        let path = dir.join("letters.jsonl");
        let sink = FileSink::new(&path);
        let (a, mut b, mut c) = (
            sample(Reason::Attempts),
            sample(Reason::Permanent),
            sample(Reason::Age),
        );
        b.record = b.record.clone().with_sub_sequence_number(1);
        c.record = c.record.clone().with_sub_sequence_number(2);
        b.last_error = "refusé ✓".into();
        sink.put(&a).await.unwrap();
        // b's line torn after the first byte of `✓` (three bytes in UTF-8).
        let json = to_json(&b);
        let at = json.find('✓').unwrap() + 1;
        let torn = json.as_bytes()[..at].to_vec();
        assert!(std::str::from_utf8(&torn).is_err());
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&torn).unwrap();
        drop(file);
        sink.put(&c).await.unwrap();
        let listing = list(&path).unwrap();
        let letters: Vec<_> = listing.letters.iter().map(|s| &s.letter).collect();
        assert_eq!(letters, [&a, &c]);
        assert_eq!(listing.unreadable.len(), 1, "{:?}", listing.unreadable);
        assert_eq!(
            listing.unreadable[0].place,
            format!("line 2 of {}", path.display())
        );
        assert!(
            listing.unreadable[0].error.contains("not UTF-8"),
            "{:?}",
            listing.unreadable[0]
        );
        assert_eq!(
            remove(&path, &HashSet::from([LetterId::of(&a)])).unwrap(),
            1
        );
        let mut expected = torn.clone();
        expected.push(b'\n');
        expected.extend_from_slice(to_json(&c).as_bytes());
        expected.push(b'\n');
        assert_eq!(
            fs::read(&path).unwrap(),
            expected,
            "the fragment kept verbatim"
        );
        let after = list(&path).unwrap();
        assert_eq!(after.letters.len(), 1);
        assert_eq!(after.letters[0].letter, c);
        assert_eq!(after.unreadable.len(), 1);

        // Glued: a letter appended to a torn multi-byte character on the same line is read.
        let glued = dir.join("glued.jsonl");
        let mut bytes = to_json(&a).into_bytes();
        bytes.push(b'\n');
        bytes.extend_from_slice(&torn);
        bytes.extend_from_slice(to_json(&c).as_bytes());
        bytes.push(b'\n');
        fs::write(&glued, &bytes).unwrap();
        let listing = list(&glued).unwrap();
        let letters: Vec<_> = listing.letters.iter().map(|s| &s.letter).collect();
        assert_eq!(letters, [&a, &c]);
        assert_eq!(listing.unreadable.len(), 1);
        assert_eq!(
            remove(&glued, &HashSet::from([LetterId::of(&c)])).unwrap(),
            1
        );
        let mut expected = to_json(&a).into_bytes();
        expected.push(b'\n');
        expected.extend_from_slice(&torn);
        expected.push(b'\n');
        assert_eq!(fs::read(&glued).unwrap(), expected, "the torn part stays");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_check_names_a_missing_folder() {
        let dir = folder("check");
        let ok = FileSink::new(dir.join("letters.jsonl"));
        assert_eq!(ok.check().await.unwrap(), Vec::<String>::new());
        let missing = FileSink::new(dir.join("nowhere").join("letters.jsonl"));
        let e = missing.check().await.unwrap_err().to_string();
        assert!(
            e.contains("nowhere of the dead-letter file does not exist"),
            "{e}"
        );
        assert!(
            !dir.join("letters.jsonl").exists(),
            "the check creates no file"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
