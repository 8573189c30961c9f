//! The threads tcp fabric links are served on: one single-threaded runtime
//! per core, and each link wholly on one of them (its transport's reader
//! and writer, its driver, its requests and their storage calls).
//!
//! On the server's shared runtime a link's request crossed threads at its
//! hand-offs: the transport's reader wakes the link's driver, the driver
//! the request's task, the task the writer, and tokio wakes an idle worker
//! for each task it finds woken. On the machines measured here a
//! cross-thread wake-up costs more than the forwarding of a 4 KiB request
//! (docs/rblock.md, "The gateway"). Links spread over the threads in turn;
//! NBD clients stay on the shared runtime, where one connection's large
//! requests run on several cores at once.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub(crate) struct LinkThreads {
    runtimes: Vec<Handle>,
    turn: AtomicUsize,
    /// Dropped, each thread ends (what still runs on it is cancelled).
    _stops: Vec<oneshot::Sender<()>>,
}

impl LinkThreads {
    /// `n` threads (at least one), each with a runtime of its own.
    pub(crate) fn start(n: usize) -> std::io::Result<LinkThreads> {
        let mut runtimes = Vec::new();
        let mut stops = Vec::new();
        for i in 0..n.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtimes.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("rblock-link-{i}"))
                .spawn(move || {
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                })?;
            stops.push(stop);
        }
        Ok(LinkThreads {
            runtimes,
            turn: AtomicUsize::new(0),
            _stops: stops,
        })
    }

    /// The runtime the next link goes to.
    pub(crate) fn next(&self) -> &Handle {
        let i = self.turn.fetch_add(1, Ordering::Relaxed) % self.runtimes.len();
        &self.runtimes[i]
    }
}
