//! Owned background tasks: every task pelican spawns belongs to a `TaskSet` that
//! aborts it when dropped, so no task outlives its owner.

use std::future::Future;
use std::sync::Mutex;
use tokio::task::JoinHandle;

#[derive(Default)]
pub(crate) struct TaskSet {
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl TaskSet {
    pub(crate) fn new() -> Self {
        TaskSet::default()
    }

    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let h = tokio::spawn(fut);
        self.handles.lock().unwrap().push(h);
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
