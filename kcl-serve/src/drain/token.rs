//! The drain token: a random secret the process writes to a file when it starts serving, and
//! that `POST /drain` must carry (`Authorization: Bearer <token>`).
//!
//! A loopback peer is not proof enough that the caller is the pod's own `preStop` hook: a
//! sidecar forwarding inbound traffic over localhost, `kubectl port-forward`, and other pods on
//! a `hostNetwork` node all arrive from 127.0.0.1. Reading a file in the container's own
//! filesystem is what none of them can do. The file is written with mode 0600, by the process's
//! user, and replaced at each start; its default place is [`default_path`], one per HTTP port,
//! so that several processes on one host (tests, a host running two workers) do not share one.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use rand::{RngCore as _, SeedableRng as _};

/// Where the token of a process whose HTTP server listens on `port` is written and read by
/// default: `/tmp/kcl-drain-<port>.token`.
pub fn default_path(port: u16) -> PathBuf {
    PathBuf::from(format!("/tmp/kcl-drain-{port}.token"))
}

/// A fresh token: 32 random bytes from the operating system, in hex.
fn fresh() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::StdRng::from_os_rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The token of this process, written to its file.
#[derive(Clone)]
pub(crate) struct Token {
    secret: std::sync::Arc<str>,
    path: PathBuf,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// A fresh token written to `path` (mode 0600), replacing what was there: a file a
    /// process of an earlier start left, or one planted by someone else (removed first, so
    /// that the file written is new and this process's own).
    pub(crate) fn write(path: &Path) -> std::io::Result<Self> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let secret = fresh();
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path)?;
        file.write_all(secret.as_bytes())?;
        file.sync_all()?;
        Ok(Self {
            secret: secret.into(),
            path: path.to_owned(),
        })
    }

    /// Whether `given` (an `Authorization` header's value) carries the token. Compares every
    /// byte whatever differs, so that the time taken says nothing of how much of it matched.
    pub(crate) fn admits(&self, given: Option<&str>) -> bool {
        let Some(given) = given.and_then(|g| g.trim().strip_prefix("Bearer ")) else {
            return false;
        };
        let (a, b) = (given.trim().as_bytes(), self.secret.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
    }

    /// Removes the file, if it still holds this token (a later process may have replaced it).
    pub(crate) fn remove(&self) {
        if read(&self.path).ok().as_deref() == Some(&*self.secret) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The token in the file at `path`, as the client sends it.
pub(crate) fn read(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_written_private_and_admits_itself_only() {
        let path =
            std::env::temp_dir().join(format!("kcl-drain-test-{}.token", std::process::id()));
        std::fs::write(&path, "planted").unwrap();
        let token = Token::write(&path).unwrap();
        let secret = read(&path).unwrap();
        assert_eq!(secret.len(), 64);
        assert_ne!(secret, "planted");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(token.admits(Some(&format!("Bearer {secret}"))));
        assert!(!token.admits(Some(&secret)), "without the scheme");
        assert!(!token.admits(Some(&format!("Bearer {}", &secret[1..]))));
        assert!(!token.admits(Some("Bearer ")));
        assert!(!token.admits(None));
        let again = Token::write(&path).unwrap();
        assert_ne!(read(&path).unwrap(), secret, "each start writes a new one");
        token.remove();
        assert!(path.exists(), "not this token's file any more");
        again.remove();
        assert!(!path.exists());
    }
}
