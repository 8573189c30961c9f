//! How the kernel's scheduler treats the calling thread.
#![allow(unsafe_code)]

/// Marks the calling thread as a batch thread (`SCHED_BATCH`, at the same
/// weight as any other): the scheduler no longer lets it preempt a thread
/// that is running when it wakes, so a thread that hands it work keeps
/// its core. Any user may ask it; `false` where the kernel refused.
pub fn batch_this_thread() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised `sched_param` that outlives
    // the call, which only reads it; pid 0 names the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    r == 0
}

/// The calling thread's scheduling policy as the kernel reports it
/// (`/proc/thread-self/stat`, field 41: 0 ordinary, 3 batch), for tests.
pub fn policy_of_this_thread() -> std::io::Result<u32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    // (Fields 3 on come after the name, which may hold anything but ends
    // at the last parenthesis.)
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after_name
        .split_whitespace()
        .nth(41 - 3)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| std::io::Error::other("no policy in /proc/thread-self/stat"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_made_a_batch_thread_is_one_and_others_are_not() {
        let (before, made, after) = std::thread::spawn(|| {
            let before = policy_of_this_thread().unwrap();
            let made = batch_this_thread();
            (before, made, policy_of_this_thread().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(before, 0, "an ordinary thread first");
        assert!(made, "any user may ask for SCHED_BATCH");
        assert_eq!(after, libc::SCHED_BATCH as u32);
        // (Only that thread: this one is as it was.)
        assert_eq!(policy_of_this_thread().unwrap(), 0);
    }
}
