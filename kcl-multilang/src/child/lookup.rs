//! Where `executableName`'s program is: checked at start, looked up as the child's start
//! will look it up (`execvp`), so that a program that cannot be run stops the daemon with
//! the reason rather than fail every shard's child, over and over.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::ChildCommand;

/// What `execvp` searches when `PATH` is not set (glibc's default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

impl ChildCommand {
    /// Where the program is. A name with a `/` is a path, relative to the working directory;
    /// a name without one is looked for in each directory of `PATH` in turn (an empty entry
    /// meaning the working directory), and nowhere else: not in the working directory. The
    /// error says what was looked at and what would do.
    pub fn locate(&self) -> Result<PathBuf, String> {
        let cwd = std::env::current_dir().unwrap_or_default();
        locate(&self.program, std::env::var_os("PATH").as_deref(), &cwd)
    }
}

/// What a candidate path is.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Executable,
    NotExecutable,
    Directory,
    Missing,
}

fn check(path: &Path) -> Found {
    match std::fs::metadata(path) {
        Err(_) => Found::Missing,
        Ok(meta) if meta.is_dir() => Found::Directory,
        Ok(_) if executable(path) => Found::Executable,
        Ok(_) => Found::NotExecutable,
    }
}

/// Whether this process may execute `path` (access(2), as exec will judge it).
#[cfg(unix)]
fn executable(path: &Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
}

#[cfg(not(unix))]
fn executable(path: &Path) -> bool {
    path.is_file()
}

/// [`ChildCommand::locate`] with the environment given.
fn locate(program: &str, path: Option<&OsStr>, cwd: &Path) -> Result<PathBuf, String> {
    if program.contains('/') {
        let full = cwd.join(program);
        let from = if Path::new(program).is_absolute() {
            String::new()
        } else {
            format!(
                " (a path with a `/` is taken from the working directory, {})",
                cwd.display()
            )
        };
        return match check(&full) {
            Found::Executable => Ok(full),
            Found::Missing => Err(format!("`{program}` does not exist{from}")),
            Found::Directory => Err(format!("`{program}` is a directory{from}")),
            Found::NotExecutable => Err(format!(
                "`{program}` is not executable{from}: make it executable (chmod +x), or name \
                 its interpreter first (`python3 {program}`)"
            )),
        };
    }
    let (searched, shown) = match path {
        Some(path) => (path.to_owned(), format!("PATH={}", path.to_string_lossy())),
        None => (
            OsString::from(DEFAULT_PATH),
            format!("PATH is not set: {DEFAULT_PATH}"),
        ),
    };
    let mut not_executable = Vec::new();
    for dir in std::env::split_paths(&searched) {
        let dir = if dir.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else {
            cwd.join(dir)
        };
        let candidate = dir.join(program);
        match check(&candidate) {
            Found::Executable => return Ok(candidate),
            Found::NotExecutable => not_executable.push(candidate.display().to_string()),
            Found::Directory | Found::Missing => {}
        }
    }
    let mut message = format!(
        "`{program}` was not found in PATH ({shown}): a program named without a `/` is looked \
         up in each directory of PATH, not in the working directory ({})",
        cwd.display()
    );
    if !not_executable.is_empty() {
        message.push_str(&format!(
            "; in PATH but not executable: {}",
            not_executable.join(", ")
        ));
    }
    if check(&cwd.join(program)) != Found::Missing {
        message.push_str(&format!(
            "; there is a `{program}` in the working directory: name it `./{program}`, or by \
             its full path"
        ));
    }
    Err(message)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A directory of its own under the system's temporary one, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "kcl-multilang-lookup-{name}-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        #[cfg(unix)]
        fn file(&self, name: &str, mode: u32) -> PathBuf {
            use std::os::unix::fs::PermissionsExt as _;
            let path = self.0.join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_name_without_a_slash_is_looked_up_in_path_only() {
        let bin = Dir::new("bin");
        let app = Dir::new("app");
        let tool = bin.file("tool", 0o755);
        app.file("app.py", 0o755);
        let path = OsString::from(format!("/nonexistent:{}", bin.0.display()));
        assert_eq!(locate("tool", Some(&path), &app.0), Ok(tool));
        let error = locate("app.py", Some(&path), &app.0).unwrap_err();
        assert!(error.contains("not found in PATH"), "{error}");
        assert!(
            error.contains(&format!("PATH={}", path.to_string_lossy())),
            "{error}"
        );
        assert!(error.contains("name it `./app.py`"), "{error}");
        // An empty entry of PATH is the working directory, as for execvp.
        let with_cwd = OsString::from(format!("{}:", bin.0.display()));
        assert_eq!(
            locate("app.py", Some(&with_cwd), &app.0),
            Ok(app.0.join("app.py"))
        );
        // Not executable: skipped, and named.
        bin.file("plain", 0o644);
        let error = locate("plain", Some(&path), &app.0).unwrap_err();
        assert!(error.contains("in PATH but not executable"), "{error}");
    }

    #[cfg(unix)]
    #[test]
    fn a_name_with_a_slash_is_a_path_from_the_working_directory() {
        let app = Dir::new("paths");
        let script = app.file("run.sh", 0o755);
        app.file("plain.py", 0o600);
        assert_eq!(locate("./run.sh", None, &app.0), Ok(app.0.join("./run.sh")));
        let absolute = script.display().to_string();
        assert_eq!(locate(&absolute, None, Path::new("/")), Ok(script));
        let error = locate("./missing.sh", None, &app.0).unwrap_err();
        assert!(error.contains("does not exist"), "{error}");
        assert!(error.contains(&app.0.display().to_string()), "{error}");
        let error = locate("./plain.py", None, &app.0).unwrap_err();
        assert!(error.contains("is not executable"), "{error}");
        let error = locate(&format!("{}/", app.0.display()), None, &app.0).unwrap_err();
        assert!(error.contains("is a directory"), "{error}");
    }
}
