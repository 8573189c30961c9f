//! The single-threaded runtimes, one per core: each tcp fabric link is
//! served wholly on one of them (its transport's reader and writer, its
//! driver, its requests and their storage calls), and so is an NBD
//! connection while it keeps many small requests in flight (`pace.rs`).
//!
//! On the server's shared runtime such a connection's requests cross
//! threads at their hand-offs: the transport's reader wakes the link's
//! driver, the driver the request's task, the task the writer, and tokio
//! wakes an idle worker for each task it finds woken, which then steals
//! work from the busy one. On the machines measured here a cross-thread
//! wake-up costs more than the forwarding of a 4 KiB request
//! (docs/rblock.md, "The gateway"), and two NBD clients with 32 small
//! reads in flight each got 1.3x the IOPS with their connections on two
//! of these runtimes instead of the shared one (docs/rblock.md,
//! "Connection threads"). Links and connections spread over the threads
//! in turn. A connection reading large requests stays on the shared
//! runtime, where its reads run on several cores at once: on a runtime
//! of its own, nbdcopy's four connections read 0.8x as fast.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub(crate) struct SingleThreaded {
    runtimes: Vec<Handle>,
    turn: AtomicUsize,
    /// Dropped, each thread ends (what still runs on it is cancelled).
    _stops: Vec<oneshot::Sender<()>>,
}

impl SingleThreaded {
    /// `n` threads (at least one), each with a runtime of its own.
    pub(crate) fn start(n: usize) -> std::io::Result<SingleThreaded> {
        let mut runtimes = Vec::new();
        let mut stops = Vec::new();
        for i in 0..n.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtimes.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("rblock-rt-{i}"))
                .spawn(move || {
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                })?;
            stops.push(stop);
        }
        Ok(SingleThreaded {
            runtimes,
            turn: AtomicUsize::new(0),
            _stops: stops,
        })
    }

    /// The runtime the next link or connection goes to.
    pub(crate) fn next(&self) -> &Handle {
        let i = self.turn.fetch_add(1, Ordering::Relaxed) % self.runtimes.len();
        &self.runtimes[i]
    }
}
