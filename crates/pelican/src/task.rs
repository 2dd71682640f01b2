//! Owned, supervised background tasks. Every task pelican spawns belongs to a `TaskSet`:
//! dropping the set aborts its tasks (none outlives its owner), and a task that panics
//! does not vanish: the panic is logged once and kept as the set's failure, which the
//! owner reports as an [`ErrorKind::Internal`] error from its next call.

use crate::error::{Error, ErrorKind};
use futures_util::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Called once, with the error, when a task of the set panics first.
pub(crate) type OnFailure = Box<dyn Fn(&Error) + Send + Sync>;

pub(crate) struct TaskSet {
    handles: Mutex<Vec<JoinHandle<()>>>,
    failure: Arc<Failure>,
}

#[derive(Default)]
struct Failure {
    error: Mutex<Option<Error>>,
    /// Fires when `error` is set.
    fired: CancellationToken,
    hook: Mutex<Option<OnFailure>>,
}

impl Failure {
    fn record(&self, task: &'static str, panic: &(dyn std::any::Any + Send)) {
        let message = panic_message(panic);
        let err = Error::new(
            ErrorKind::Internal,
            format!("pelican's {task} task panicked: {message}"),
        );
        {
            let mut slot = self.error.lock().unwrap();
            if slot.is_some() {
                // Logged and reported once: the first failure is the cause.
                return;
            }
            *slot = Some(err.clone());
        }
        tracing::error!(task, panic = %message, "a background task panicked");
        self.fired.cancel();
        if let Some(hook) = self.hook.lock().unwrap().as_ref() {
            hook(&err);
        }
    }
}

impl TaskSet {
    pub(crate) fn new() -> Self {
        TaskSet {
            handles: Mutex::default(),
            failure: Arc::default(),
        }
    }

    /// Runs `hook` when a task panics (e.g. to fail every waiting caller at once).
    pub(crate) fn on_failure(&self, hook: OnFailure) {
        *self.failure.hook.lock().unwrap() = Some(hook);
    }

    /// Spawns `fut` as task `name`, owned by this set.
    pub(crate) fn spawn(&self, name: &'static str, fut: impl Future<Output = ()> + Send + 'static) {
        let h = tokio::spawn(supervised(self.failure.clone(), name, fut));
        let mut handles = self.handles.lock().unwrap();
        handles.retain(|h| !h.is_finished());
        handles.push(h);
    }

    /// Spawns `fut` as task `name`, supervised like the others but NOT aborted with the
    /// set: it must end by itself (the consumer's outcome writer, which finishes the
    /// outcomes already handed to it after its consumer is dropped).
    pub(crate) fn spawn_detached(
        &self,
        name: &'static str,
        fut: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        tokio::spawn(supervised(self.failure.clone(), name, fut))
    }

    /// The first panic of a task of the set, if one panicked.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.failure.error.lock().unwrap().clone()
    }

    /// Completes with the first panic of a task of the set.
    pub(crate) async fn failed(&self) -> Error {
        self.failure.fired.cancelled().await;
        self.failure().expect("set before it fires")
    }

    pub(crate) fn abort_all(&self) {
        for h in self.handles.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for TaskSet {
    fn drop(&mut self) {
        self.abort_all();
    }
}

async fn supervised(failure: Arc<Failure>, name: &'static str, fut: impl Future<Output = ()>) {
    if let Err(panic) = AssertUnwindSafe(fut).catch_unwind().await {
        failure.record(name, &*panic);
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_panic_is_kept_reported_once_and_fires_the_hook() {
        let set = TaskSet::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        set.on_failure(Box::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        }));
        set.spawn("quiet", std::future::pending());
        set.spawn("first", async { panic!("boom") });
        let err = set.failed().await;
        assert_eq!(err.kind(), ErrorKind::Internal);
        assert!(err.message().contains("first task panicked: boom"), "{err}");
        set.spawn("second", async { panic!("again") });
        tokio::task::yield_now().await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(set.failure().unwrap().message().contains("boom"));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
