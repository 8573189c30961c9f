//! What the integration tests of every crate share: a scratch directory
//! that cleans up after itself, reproducible pseudo-random bytes, free
//! loopback ports, and an attacker on the path ([`on_path`]).
#![forbid(unsafe_code)]

pub mod on_path;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh directory under the system's temporary directory, removed (with
/// everything in it) when dropped.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// `tag` names the test in the directory's name, for whoever looks.
    pub fn new(tag: &str) -> Scratch {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let p = std::env::temp_dir().join(format!("{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("scratch directory");
        Scratch(p)
    }

    /// The directory itself.
    pub fn dir(&self) -> &std::path::Path {
        &self.0
    }

    /// A path inside the directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `len` pseudo-random bytes (xorshift), the same for the same `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A loopback TCP port nobody listens on right now, and one this process
/// has not handed out before: the tests of one binary run in parallel and
/// would otherwise be given the same port the kernel just freed. (Another
/// process may still take it before the test binds it: a server the test
/// starts should be told the port, and fail clearly if it is taken.)
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().expect("port lock");
    let given = given.get_or_insert_with(HashSet::new);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a loopback port")
            .port();
        if given.insert(port) {
            return port;
        }
    }
}
