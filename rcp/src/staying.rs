//! Helper threads for the system calls of many names, each staying in the
//! directory of its last call (`rfabric::thread_dir::stay`): the receiver's
//! checks of what is there ([`crate::recv`]) and the walk's look-ahead
//! ([`crate::tree`]). Each thread takes jobs from a queue of its own, in
//! order; a job answers through whatever channel it carries.

use std::sync::mpsc;

/// Work for one of the threads.
pub type Job = Box<dyn FnOnce() + Send>;

/// Helper threads that resolve no relative path: every job goes by
/// descriptors, and by bare names in a directory it was moved to.
#[derive(Debug)]
pub struct Staying {
    queues: Vec<mpsc::Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Staying {
    /// `count` threads (at least one), named `name`.
    pub fn start(name: &str, count: usize) -> std::io::Result<Staying> {
        let mut queues = Vec::with_capacity(count.max(1));
        let mut threads = Vec::with_capacity(count.max(1));
        for _ in 0..count.max(1) {
            let (tx, rx) = mpsc::channel::<Job>();
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let _stay = rfabric::thread_dir::stay();
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })?;
            queues.push(tx);
            threads.push(thread);
        }
        Ok(Staying { queues, threads })
    }

    /// How many threads there are.
    pub fn count(&self) -> usize {
        self.queues.len()
    }

    /// Queues `job` on thread `i` (modulo their number); `false` if that
    /// thread is gone (a job panicked), and then the job was dropped.
    pub fn run(&self, i: usize, job: Job) -> bool {
        self.queues[i % self.queues.len()].send(job).is_ok()
    }
}

impl Drop for Staying {
    fn drop(&mut self) {
        self.queues.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_on_their_thread_and_a_panicking_one_is_contained() {
        let threads = Staying::start("rcp-test", 2).unwrap();
        assert_eq!(threads.count(), 2);
        let (tx, rx) = mpsc::channel();
        for n in 0..10 {
            let tx = tx.clone();
            let job: Job = Box::new(move || {
                let me = std::thread::current().name().map(str::to_string);
                tx.send((n, me)).unwrap();
            });
            assert!(threads.run(n, job));
        }
        drop(tx);
        let got: Vec<(usize, Option<String>)> = rx.iter().collect();
        assert_eq!(got.len(), 10);
        for parity in 0..2 {
            let mine: Vec<usize> = got
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| n % 2 == parity)
                .collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        }
        assert!(
            got.iter()
                .all(|(_, name)| name.as_deref() == Some("rcp-test"))
        );
        // A job that panics ends its thread: later jobs there are refused.
        assert!(threads.run(0, Box::new(|| panic!("a job's bug"))));
        let refused = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            !threads.run(0, Box::new(|| {}))
        });
        assert!(refused);
        assert!(threads.run(1, Box::new(|| {})));
    }
}
