//! The completion queue of the software backends (tcp, in-process): work
//! completions in the order they happened, the waker of whoever polls,
//! and why the connection went down. Verbs has the device's queue instead.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use super::{Completion, Op, TransportError, WcError};

/// One connection's completions.
pub(super) struct Completions {
    state: Mutex<State>,
    /// Tasks that may still complete work after the connection went down
    /// (tcp's reader and writer); with none, the queue ends when the
    /// connection goes down and what it holds has been taken.
    workers: u32,
}

/// No workers: the in-process backend's.
impl Default for Completions {
    fn default() -> Completions {
        Completions::new(0)
    }
}

#[derive(Default)]
struct State {
    done: VecDeque<Completion>,
    waker: Option<Waker>,
    /// Why the connection went down, once it has (the first reason wins).
    down: Option<TransportError>,
    /// Workers that have stopped.
    stopped: u32,
}

impl Completions {
    pub(super) fn new(workers: u32) -> Completions {
        Completions {
            state: Mutex::new(State::default()),
            workers,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("completion queue lock")
    }

    /// Wakes whoever polls (with the lock held, so no wake is lost).
    fn wake(state: &mut State) {
        if let Some(w) = state.waker.take() {
            w.wake();
        }
    }

    pub(super) fn push(&self, completion: Completion) {
        let mut s = self.state();
        s.done.push_back(completion);
        Self::wake(&mut s);
    }

    /// A completion of a local work request (no note, nothing landed).
    pub(super) fn complete(
        &self,
        wr_id: u64,
        op: Op,
        status: Result<(), WcError>,
        byte_len: usize,
    ) {
        self.push(Completion {
            wr_id,
            op,
            status,
            byte_len: byte_len as u32,
            note: None,
            landed_at: None,
        });
    }

    /// Records why the connection went down (the first reason wins).
    pub(super) fn go_down(&self, why: TransportError) {
        let mut s = self.state();
        s.down.get_or_insert(why);
        Self::wake(&mut s);
    }

    pub(super) fn down_reason(&self) -> Option<TransportError> {
        self.state().down.clone()
    }

    /// One of the workers has stopped: it completes nothing more.
    pub(super) fn worker_stopped(&self) {
        let mut s = self.state();
        s.stopped += 1;
        Self::wake(&mut s);
    }

    /// Whether it is down with nothing left to take (a backend may have
    /// work to flush into it then).
    pub(super) fn down_and_empty(&self) -> bool {
        let s = self.state();
        s.down.is_some() && s.done.is_empty()
    }

    /// The completions so far into `out`; once nothing more can come, why
    /// the connection ended.
    pub(super) fn poll(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
    ) -> Poll<Result<(), TransportError>> {
        let mut s = self.state();
        if !s.done.is_empty() {
            out.extend(s.done.drain(..));
            return Poll::Ready(Ok(()));
        }
        let ended = if self.workers > 0 {
            s.stopped >= self.workers
        } else {
            s.down.is_some()
        };
        if ended {
            let why = s
                .down
                .clone()
                .unwrap_or_else(|| TransportError::Closed("connection closed".into()));
            return Poll::Ready(Err(why));
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::Wake;

    use super::*;

    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn woken(c: &Arc<Count>) -> usize {
        c.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn completions_come_in_order_then_the_reason_once_the_workers_stopped() {
        let q = Completions::new(2);
        let count = Arc::new(Count(0.into()));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut out = vec![];
        assert!(q.poll(&mut cx, &mut out).is_pending());
        q.complete(1, Op::Send, Ok(()), 10);
        q.complete(2, Op::Send, Ok(()), 20);
        assert_eq!(woken(&count), 1, "the poller was woken once");
        assert!(matches!(q.poll(&mut cx, &mut out), Poll::Ready(Ok(()))));
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2]);
        q.go_down(TransportError::Closed("first".into()));
        q.go_down(TransportError::Closed("second".into()));
        assert!(q.down_and_empty());
        // Down, but a worker may still complete something.
        assert!(q.poll(&mut cx, &mut out).is_pending());
        q.worker_stopped();
        assert!(q.poll(&mut cx, &mut out).is_pending());
        q.worker_stopped();
        match q.poll(&mut cx, &mut out) {
            Poll::Ready(Err(e)) => assert!(e.to_string().contains("first"), "{e}"),
            other => panic!("expected the first reason, got {other:?}"),
        }
    }

    #[test]
    fn without_workers_the_queue_ends_when_down_and_taken() {
        let q = Completions::new(0);
        let waker = Waker::from(Arc::new(Count(0.into())));
        let mut cx = Context::from_waker(&waker);
        let mut out = vec![];
        q.complete(7, Op::Write, Ok(()), 0);
        q.go_down(TransportError::Closed("gone".into()));
        assert!(!q.down_and_empty(), "one completion still to take");
        assert!(matches!(q.poll(&mut cx, &mut out), Poll::Ready(Ok(()))));
        assert!(matches!(q.poll(&mut cx, &mut out), Poll::Ready(Err(_))));
        // With workers that stopped and no reason given: closed.
        let q = Completions::new(1);
        q.worker_stopped();
        match q.poll(&mut cx, &mut out) {
            Poll::Ready(Err(e)) => assert!(e.to_string().contains("connection closed"), "{e}"),
            other => panic!("expected closed, got {other:?}"),
        }
    }
}
