//! Shutdown, as mini-redis does it: a broadcast signal that every task listens to, and a
//! completion wait (an mpsc whose senders the tasks hold; when all are dropped, all
//! tasks are done).

use tokio::sync::{broadcast, mpsc};

/// Sends the shutdown signal and waits for every task holding a [`Shutdown`] to finish.
pub struct ShutdownController {
    notify: broadcast::Sender<()>,
    done_tx: Option<mpsc::Sender<()>>,
    done_rx: mpsc::Receiver<()>,
}

impl Default for ShutdownController {
    fn default() -> Self {
        Self::new()
    }
}

impl ShutdownController {
    pub fn new() -> Self {
        let (notify, _) = broadcast::channel(1);
        let (done_tx, done_rx) = mpsc::channel(1);
        Self {
            notify,
            done_tx: Some(done_tx),
            done_rx,
        }
    }

    /// A listener for one task; the task holds it until it has finished.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            notify: self.notify.subscribe(),
            is_shutdown: false,
            _done: self.done_tx.clone(),
        }
    }

    /// Signals every task to stop.
    pub fn trigger(&self) {
        let _ = self.notify.send(());
    }

    /// Signals and waits until every [`Shutdown`] has been dropped.
    pub async fn shutdown(mut self) {
        self.trigger();
        self.done_tx.take();
        let _ = self.done_rx.recv().await;
    }
}

/// One task's view of the shutdown signal.
pub struct Shutdown {
    notify: broadcast::Receiver<()>,
    is_shutdown: bool,
    _done: Option<mpsc::Sender<()>>,
}

impl Shutdown {
    pub fn is_shutdown(&self) -> bool {
        self.is_shutdown
    }

    /// Polls without waiting (for loops on plain threads).
    pub fn poll_now(&mut self) -> bool {
        if !self.is_shutdown
            && !matches!(
                self.notify.try_recv(),
                Err(broadcast::error::TryRecvError::Empty)
            )
        {
            self.is_shutdown = true;
        }
        self.is_shutdown
    }

    /// Waits for the signal.
    pub async fn recv(&mut self) {
        if self.is_shutdown {
            return;
        }
        let _ = self.notify.recv().await;
        self.is_shutdown = true;
    }
}
