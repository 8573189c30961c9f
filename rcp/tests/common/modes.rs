//! A copy run the four ways it runs (locally, pushed to and pulled from
//! `rcp serve`, through a remote shell), beside rsync run the same way.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use test_support::Scratch;

use super::trees::assert_same;
use super::{Daemon, RCP, fake_rsh, s, secret};

pub fn rcp(args: &[&OsStr], path: &str) -> std::process::Output {
    command(args, path).output().expect("rcp runs")
}

/// `rcp -q --chunk-size 64K ARGS` with `path` as `PATH`, not yet started.
fn command(args: &[&OsStr], path: &str) -> Command {
    let mut cmd = Command::new(RCP);
    cmd.args(["-q", "--chunk-size", "64K"])
        .args(args)
        .env("PATH", path);
    cmd
}

pub fn rcp_ok(args: &[&OsStr], path: &str) {
    let out = rcp(args, path);
    assert!(
        out.status.success(),
        "rcp {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `rsync FLAGS src into/`: its output, whatever its status.
pub fn rsync_out(flags: &[&OsStr], src: &Path, into: &Path) -> std::process::Output {
    rsync_sources_out(flags, &[src], into)
}

/// `rsync FLAGS src... into/`: its output, whatever its status.
pub fn rsync_sources_out(flags: &[&OsStr], srcs: &[&Path], into: &Path) -> std::process::Output {
    Command::new("rsync")
        .args(flags)
        .args(srcs)
        .arg(format!("{}/", into.display()))
        .output()
        .expect("rsync runs")
}

/// [`rsync_out`], which must succeed.
pub fn rsync_into(flags: &[&OsStr], src: &Path, into: &Path) {
    rsync_sources_into(flags, &[src], into)
}

/// [`rsync_sources_out`], which must succeed.
pub fn rsync_sources_into(flags: &[&OsStr], srcs: &[&Path], into: &Path) {
    let out = rsync_sources_out(flags, srcs, into);
    assert!(
        out.status.success(),
        "rsync {flags:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a copy needs to run in each mode: the daemon of push and pull,
/// its secret, and the stand-in for ssh of remote-shell mode.
pub struct Modes {
    pub daemon: Daemon,
    pub key: PathBuf,
    pub rsh: PathBuf,
    /// `PATH` with this build's rcp first (the remote shell finds it).
    pub path: String,
}

/// The four ways a copy runs.
pub const EVERY_MODE: [&str; 4] = ["local", "push", "pull", "remote shell"];

impl Modes {
    /// A daemon serving `t` (with `daemon_args`), its secret, a remote
    /// shell.
    pub fn new(t: &Scratch, daemon_args: &[&str]) -> Modes {
        let key = secret(t, "key");
        let daemon = Daemon::start_with(&[t.dir()], &key, daemon_args);
        let (rsh, path) = fake_rsh(t);
        Modes {
            daemon,
            key,
            rsh,
            path,
        }
    }

    /// `rcp ARGS src into` in `mode` (local, push, pull or remote shell):
    /// its output.
    pub fn run_out(
        &self,
        mode: &str,
        args: Vec<&OsStr>,
        src: &Path,
        into: &Path,
    ) -> std::process::Output {
        self.run_sources_out(mode, args, &[src], into)
    }

    /// [`Modes::run_out`] with several sources (a pull's all from the
    /// daemon).
    pub fn run_sources_out(
        &self,
        mode: &str,
        args: Vec<&OsStr>,
        srcs: &[&Path],
        into: &Path,
    ) -> std::process::Output {
        self.command(mode, args, srcs, into)
            .output()
            .expect("rcp runs")
    }

    /// The command of [`Modes::run_sources_out`], not yet started.
    pub fn command(&self, mode: &str, args: Vec<&OsStr>, srcs: &[&Path], into: &Path) -> Command {
        let mut args: Vec<OsString> = args.into_iter().map(OsStr::to_os_string).collect();
        let local = |p: &&Path| s(p).to_string();
        let (from, to): (Vec<String>, String) = match mode {
            "local" => (srcs.iter().map(local).collect(), s(into).to_string()),
            "push" => (srcs.iter().map(local).collect(), self.daemon.url(into)),
            "pull" => (
                srcs.iter().map(|p| self.daemon.url(p)).collect(),
                s(into).to_string(),
            ),
            _ => {
                args.extend(["--rsh".into(), self.rsh.as_os_str().to_os_string()]);
                (
                    srcs.iter().map(local).collect(),
                    format!("localhost:{}", into.display()),
                )
            }
        };
        if mode == "push" || mode == "pull" {
            args.extend(["--secret-file".into(), self.key.as_os_str().to_os_string()]);
        }
        args.extend(from.into_iter().map(OsString::from));
        args.push(to.into());
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        command(&args, &self.path)
    }

    /// [`Modes::run_out`], which must succeed.
    pub fn run(&self, mode: &str, args: Vec<&OsStr>, src: &Path, into: &Path) {
        let out = self.run_out(mode, args.clone(), src, into);
        assert!(
            out.status.success(),
            "rcp {args:?} ({mode}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `flags` through rsync from `src` into `oracle` and through rcp in
    /// every mode into destinations named after `name`, each made ready by
    /// `before` first, then compared with rsync's entry by entry.
    pub fn as_rsync(
        &self,
        t: &Scratch,
        name: &str,
        flags: &[&OsStr],
        src: &Path,
        oracle: &Path,
        before: &dyn Fn(&Path),
    ) {
        self.sources_as_rsync(t, name, flags, &[src], oracle, before)
    }

    /// [`Modes::as_rsync`] with several sources (a pull's all from the
    /// daemon).
    pub fn sources_as_rsync(
        &self,
        t: &Scratch,
        name: &str,
        flags: &[&OsStr],
        srcs: &[&Path],
        oracle: &Path,
        before: &dyn Fn(&Path),
    ) {
        before(oracle);
        rsync_sources_into(flags, srcs, oracle);
        for mode in EVERY_MODE {
            let into = t.path(&format!("{name}-{}", mode.replace(' ', "-")));
            before(&into);
            let out = self.run_sources_out(mode, flags.to_vec(), srcs, &into);
            assert!(
                out.status.success(),
                "rcp {flags:?} ({mode}) failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_same(&format!("{mode} {flags:?}"), oracle, &into);
        }
    }
}
