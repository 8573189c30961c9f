//! What rcp's end-to-end test crates share: the binary, `rcp serve` on
//! loopback, its secret, and a stand-in for ssh.
// Each test crate uses a part of it.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use test_support::{Scratch, free_port};

pub mod modes;
pub mod trees;
pub mod xfs;

pub const RCP: &str = env!("CARGO_BIN_EXE_rcp");

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The temporary files (`.rcp-*`) rcp left in directory `dir` itself.
pub fn temporaries_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".rcp-"))
        .collect()
}

/// `rcp serve` on loopback, stopped on drop.
pub struct Daemon {
    pub child: Child,
    pub port: u16,
    /// Where its stderr goes.
    log: PathBuf,
}

impl Daemon {
    pub fn start(roots: &[&Path], secret: &Path) -> Daemon {
        Daemon::start_with(roots, secret, &[])
    }

    /// With `extra` arguments for `rcp serve`.
    pub fn start_with(roots: &[&Path], secret: &Path, extra: &[&str]) -> Daemon {
        let port = free_port();
        let mut cmd = Command::new(RCP);
        cmd.args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--transport",
            "tcp",
        ]);
        cmd.args(["--secret-file", s(secret)]).args(extra);
        for r in roots {
            cmd.args(["--root", s(r)]);
        }
        let log =
            std::env::temp_dir().join(format!("rcp-daemon-{}-{port}.log", std::process::id()));
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .env_remove("RUST_LOG")
            .spawn()
            .unwrap();
        // Owned by the guard from here on: killed and reaped on drop.
        let daemon = Daemon { child, port, log };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return daemon;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("rcp serve did not start");
    }

    pub fn url(&self, path: &Path) -> String {
        format!("rcp://127.0.0.1:{}{}", self.port, path.display())
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What it logged once `done` says so of it, or when `within` is up
    /// (the caller's assertions then say what is missing).
    pub fn log_when(&self, within: Duration, done: impl Fn(&str) -> bool) -> String {
        let until = std::time::Instant::now() + within;
        loop {
            let log = self.log();
            if done(&log) || std::time::Instant::now() >= until {
                return log;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

pub fn secret(t: &Scratch, name: &str) -> PathBuf {
    let p = t.path(name);
    std::fs::write(&p, format!("{name}-0123456789abcdef-secret")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// A stand-in for ssh that drops the host and runs the command here, and
/// a PATH on which the far side finds this build's rcp.
pub fn fake_rsh(t: &Scratch) -> (PathBuf, String) {
    let rsh = t.path("fake-rsh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin_dir = Path::new(RCP).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (rsh, path)
}
