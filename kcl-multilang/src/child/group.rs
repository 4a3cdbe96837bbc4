//! A child and its process group, as one: killed and reaped together.

use std::process::ExitStatus;

use process_wrap::tokio::ChildWrapper;

use super::{AFTER_KILL, CHILDREN_FAILED};

/// A child and its process group, killed and reaped as one: when dropped unreaped, killed
/// and reaped in the background.
#[derive(Debug)]
pub(super) struct Group {
    child: Option<Box<dyn ChildWrapper>>,
    /// The child itself was reaped, and what was left of its group killed then. The group is
    /// not signalled again: its id (the child's pid) is free to be given out again once
    /// nothing of the group is left.
    exited: bool,
}

impl Group {
    pub(super) fn new(child: Box<dyn ChildWrapper>) -> Self {
        Self {
            child: Some(child),
            exited: false,
        }
    }

    pub(super) fn id(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Kills the whole group (SIGKILL), unless its child has exited (it was killed then).
    pub(super) fn kill(&mut self) {
        if let Some(child) = self.child.as_mut()
            && !self.exited
        {
            let _ = child.start_kill();
        }
    }

    /// Waits for the child itself to exit; then kills what is left of its group at once, while
    /// a grandchild still in it keeps its id from being given out again. The first time, a
    /// status other than success is counted in [`CHILDREN_FAILED`] (once a child, however
    /// often its exit is asked for).
    pub(super) async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            return Err(std::io::Error::other("already reaped"));
        };
        // The inner child is the leader alone (the wrapper's wait also reaps the group, which
        // would wait for a grandchild still running).
        let status = child.inner_mut().wait().await?;
        if !self.exited {
            let _ = child.start_kill();
            self.exited = true;
            if !status.success() {
                ::metrics::counter!(CHILDREN_FAILED).increment(1);
            }
        }
        Ok(status)
    }

    /// Kills the group and reaps it: the child, and the group's zombies that are this
    /// process's (its orphans, where the daemon is PID 1 or a subreaper). What cannot be
    /// reaped at once is left to [`Drop`].
    pub(super) async fn reap(&mut self) {
        self.kill();
        let Some(child) = self.child.as_mut() else {
            return;
        };
        match tokio::time::timeout(AFTER_KILL, child.wait()).await {
            Ok(Ok(_)) => self.child = None,
            Ok(Err(error)) => {
                tracing::warn!(%error, "reaping the child's process group failed");
                self.child = None;
            }
            Err(_) => tracing::warn!("the child's process group is not gone yet after SIGKILL"),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Outside a runtime, tokio's kill_on_drop still reaps the child itself.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = child.wait().await;
            });
        }
    }
}
