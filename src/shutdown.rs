//! The worker's shutdown: one [`CancellationToken`] tree, cancelled a phase at a time so
//! that nothing is lost, and a [`TaskTracker`] for the tasks of the first phase.
//!
//! The phases nest: `intake` is a child of `flush`, itself a child of the root. So
//! cancelling one phase leaves the later ones running, and dropping [`Phases`] (a worker
//! dropped without its shutdown, or one that failed to start) cancels them all.

use std::future::Future;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The worker's stop signal, in the order its parts stop.
pub struct Phases {
    root: CancellationToken,
    flush: CancellationToken,
    intake: CancellationToken,
    tasks: TaskTracker,
}

impl Default for Phases {
    fn default() -> Self {
        Self::new()
    }
}

impl Phases {
    pub fn new() -> Self {
        let root = CancellationToken::new();
        let flush = root.child_token();
        let intake = flush.child_token();
        Self {
            root,
            flush,
            intake,
            tasks: TaskTracker::new(),
        }
    }

    /// First: fetching and dispatching stop (the consumer, the scheduler and the tasks
    /// spawned with [`Phases::spawn`]).
    pub fn intake(&self) -> &CancellationToken {
        &self.intake
    }

    /// Then the stats flusher makes its final flush.
    pub fn flush(&self) -> &CancellationToken {
        &self.flush
    }

    /// Last: the campaign watcher.
    pub fn root(&self) -> &CancellationToken {
        &self.root
    }

    /// Spawns a task that ends on [`Phases::intake`], tracked for [`Phases::intake_done`].
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(task)
    }

    /// Waits for every task spawned with [`Phases::spawn`].
    pub async fn intake_done(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        self.root.cancel();
    }
}
