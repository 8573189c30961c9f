//! `-x` / `--one-file-system` against the oracle, with real mount points
//! (tmpfs mounted inside the trees; root only, and not under a
//! container's seccomp profile, which refuses `mount`: this suite is not
//! among those the kernel profiles run).
//!
//! - `-x` copies a directory on another file system as an empty one, and
//!   `--delete` leaves what the destination's copy of it holds; `-xx`
//!   leaves it out. Locally, pushed and pulled through a remote shell,
//!   each compared entry by entry with `rsync -a -x` (or `-xx`).
//! - `--delete -x` does not go into another file system mounted inside a
//!   directory it removes: that stays, with a warning, as with rsync.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use test_support::Scratch;

mod common;
use common::trees::*;
use common::{RCP, fake_rsh, s};

/// A tmpfs mounted at a path, detached when dropped (a failed test
/// leaves no mount behind).
struct Mount(PathBuf);

impl Mount {
    fn at(path: &Path) -> Mount {
        std::fs::create_dir_all(path).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "rcp-test"])
            .arg(path));
        Mount(path.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The source: two directories, one with a tmpfs mounted in it holding
/// files and a directory of its own.
fn source(t: &Scratch) -> (PathBuf, Mount) {
    let src = t.path("src");
    write(&src.join("a/f"), "top file");
    write(&src.join("b/g"), "another");
    let mount = Mount::at(&src.join("a/mnt"));
    write(&src.join("a/mnt/inner"), "on the other file system");
    write(&src.join("a/mnt/deeper/x"), "deeper");
    // Times in the past everywhere, the mount's root too, so that the
    // comparison sees the copies' times and not the clock.
    for p in [
        "a/mnt/deeper/x",
        "a/mnt/deeper",
        "a/mnt/inner",
        "a/mnt",
        "a/f",
        "b/g",
        "a",
        "b",
        "",
    ] {
        set_times(&src.join(p), 1_600_000_000, 17);
    }
    (src, mount)
}

/// Whether this run can mount tmpfs and has the oracle (else the test
/// says why it is skipped).
fn can_mount() -> bool {
    let can = is_root() && rsync_available();
    if !can {
        eprintln!("skipped: needs root (mounting tmpfs) and rsync");
    }
    can
}

/// `rsync -a -x --delete` from `src` into the scratch directory's
/// `rsync`, and `rcp -a -x --delete` into its `rcp-local` (a local copy)
/// and `rcp-pushed` (pushed through a remote shell): what rcp said on
/// stderr each time.
fn delete_x_into_each(t: &Scratch, src: &Path) -> Vec<(&'static str, String)> {
    run(Command::new("rsync")
        .args(["-a", "-x", "--delete"])
        .arg(src)
        .arg(format!("{}/", t.path("rsync").display())));
    let (rsh, path) = fake_rsh(t);
    ["rcp-local", "rcp-pushed"]
        .into_iter()
        .map(|who| {
            let into = t.path(who);
            let to = match who {
                "rcp-local" => s(&into).to_string(),
                _ => format!("localhost:{}", into.display()),
            };
            let args = ["-a", "-x", "--delete", "--rsh", s(&rsh), s(src), &to].map(OsStr::new);
            (who, rcp_ok(&args, &path))
        })
        .collect()
}

fn rcp_ok(args: &[&OsStr], path: &str) -> String {
    let out = Command::new(RCP)
        .args(args)
        .env("PATH", path)
        .output()
        .expect("rcp runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rcp {args:?} failed: {stderr}");
    stderr
}

#[test]
fn one_file_system_copies_what_rsync_x_copies_in_every_mode() {
    if !can_mount() {
        return;
    }
    let t = Scratch::new("mounts-x");
    let (src, _mount) = source(&t);
    let (rsh, path) = fake_rsh(&t);
    for flag in ["-x", "-xx"] {
        let oracle = t.path(&format!("oracle{flag}"));
        std::fs::create_dir(&oracle).unwrap();
        run(Command::new("rsync")
            .args(["-a", flag])
            .arg(&src)
            .arg(format!("{}/", oracle.display())));
        // What the flags mean, seen in the oracle itself.
        let mnt = oracle.join("src/a/mnt");
        match flag {
            "-x" => assert!(mnt.is_dir() && std::fs::read_dir(&mnt).unwrap().next().is_none()),
            _ => assert!(!mnt.exists()),
        }
        for mode in ["local", "pushed", "pulled"] {
            let into = t.path(&format!("{mode}{flag}"));
            std::fs::create_dir(&into).unwrap();
            let (from, to) = match mode {
                "local" => (s(&src).to_string(), s(&into).to_string()),
                "pushed" => (s(&src).to_string(), format!("localhost:{}", into.display())),
                _ => (format!("localhost:{}", src.display()), s(&into).to_string()),
            };
            let args = ["-q", "-a", flag, "--rsh", s(&rsh), &from, &to].map(OsStr::new);
            rcp_ok(&args, &path);
            assert_same(&format!("{mode} {flag}"), &oracle, &into);
        }
    }

    // With -x --delete, what the destination's copy of a mount point
    // holds stays (the sender did not say what is in it); what is
    // extraneous elsewhere goes. With -xx the mount point is not sent,
    // so the destination's copy of it is extraneous and goes. The same as
    // rsync leaves.
    for flag in ["-x", "-xx"] {
        let oracle = t.path(&format!("oracle{flag}-delete"));
        for mode in ["local", "pushed", "pulled"] {
            let into = t.path(&format!("{mode}{flag}-delete"));
            for d in [&into, &oracle] {
                write(&d.join("src/a/mnt/kept"), "the destination's own");
                set_times(&d.join("src/a/mnt/kept"), 1_500_000_000, 3);
                write(&d.join("src/a/gone"), "extraneous");
            }
            let (from, to) = match mode {
                "local" => (s(&src).to_string(), s(&into).to_string()),
                "pushed" => (s(&src).to_string(), format!("localhost:{}", into.display())),
                _ => (format!("localhost:{}", src.display()), s(&into).to_string()),
            };
            let args = ["-q", "-a", flag, "--delete", "--rsh", s(&rsh), &from, &to].map(OsStr::new);
            rcp_ok(&args, &path);
            run(Command::new("rsync")
                .args(["-a", flag, "--delete"])
                .arg(&src)
                .arg(format!("{}/", oracle.display())));
            assert_eq!(
                into.join("src/a/mnt/kept").exists(),
                flag == "-x",
                "{mode} {flag}"
            );
            assert!(!into.join("src/a/gone").exists(), "{mode} {flag}");
            assert_same(&format!("{mode} {flag} --delete"), &oracle, &into);
        }
    }
    // Without -x the walk goes into the mount, as rsync's.
    let whole = t.path("whole");
    std::fs::create_dir(&whole).unwrap();
    rcp_ok(
        &[
            OsStr::new("-q"),
            OsStr::new("-a"),
            src.as_os_str(),
            whole.as_os_str(),
        ],
        &path,
    );
    assert_eq!(
        std::fs::read_to_string(whole.join("src/a/mnt/deeper/x")).unwrap(),
        "deeper"
    );
}

#[test]
fn delete_x_does_not_go_into_a_file_system_mounted_at_the_destination() {
    if !can_mount() {
        return;
    }
    let t = Scratch::new("mounts-delete");
    let src = t.path("src");
    write(&src.join("a/f"), "kept");
    let mut mounts = Vec::new();
    for who in ["rcp-local", "rcp-pushed", "rsync"] {
        let into = t.path(who);
        write(&into.join("src/a/gone/plain"), "extraneous");
        mounts.push(Mount::at(&into.join("src/a/gone/m")));
        write(&into.join("src/a/gone/m/inmount"), "another file system's");
        // A destination directory that is itself another file system:
        // not cleaned.
        mounts.push(Mount::at(&into.join("src/b")));
        write(&into.join("src/b/other"), "the mount's own");
    }
    write(&src.join("b/new"), "sent");
    // A dry run says what the run will do, as rsync's: the file beside
    // the mount goes, the directory holding the mount stays (with the
    // warning), and nothing is said of the mount point itself.
    let dry = |cmd: &mut Command| {
        let out = cmd.output().expect("runs");
        assert!(out.status.success(), "{cmd:?}");
        // (What is deleted and sent: directories' lines differ where
        // rcp names a time rsync leaves out, `docs/rcp.md`; rsync's
        // warning goes to its stdout, rcp's to stderr.)
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("*deleting") || l.starts_with(">f"))
            .map(str::to_string)
            .collect();
        lines.sort();
        (lines, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ours, said) = dry(Command::new(RCP)
        .args(["-a", "-x", "-n", "-i", "--delete"])
        .arg(&src)
        .arg(t.path("rcp-local")));
    let (theirs, _) = dry(Command::new("rsync")
        .args(["-a", "-x", "-n", "-i", "--delete"])
        .arg(&src)
        .arg(format!("{}/", t.path("rsync").display())));
    assert_eq!(ours, theirs, "rcp -n -i against rsync -n -i");
    assert!(
        ours.iter().any(|l| l == "*deleting   src/a/gone/plain"),
        "{ours:?}"
    );
    assert!(
        said.contains("cannot delete non-empty directory: src/a/gone"),
        "{said}"
    );
    assert!(
        t.path("rcp-local/src/a/gone/plain").exists(),
        "a dry run removed it"
    );
    for (who, said) in delete_x_into_each(&t, &src) {
        assert!(
            said.contains("cannot delete non-empty directory") && said.contains("src/a/gone"),
            "{who}: {said}"
        );
    }
    for who in ["rsync", "rcp-local", "rcp-pushed"] {
        let into = t.path(who).join("src");
        assert!(!into.join("a/gone/plain").exists(), "{who}: plain removed");
        assert_eq!(
            std::fs::read_to_string(into.join("a/gone/m/inmount")).unwrap(),
            "another file system's",
            "{who}: the mounted file system untouched"
        );
        assert_eq!(
            std::fs::read_to_string(into.join("b/other")).unwrap(),
            "the mount's own",
            "{who}: a destination directory on another file system is not cleaned"
        );
        assert_eq!(std::fs::read_to_string(into.join("b/new")).unwrap(), "sent");
        assert_eq!(std::fs::read_to_string(into.join("a/f")).unwrap(), "kept");
    }
    // Without -x, removal goes through: the mount point itself is busy,
    // and the failure is reported.
    let out = Command::new(RCP)
        .args(["-a", "--delete"])
        .arg(&src)
        .arg(t.path("rcp-local"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!t.path("rcp-local/src/a/gone/m/inmount").exists());
    drop(mounts);
}

/// rsync keeps each top-level entry's cleaning to the file system the
/// destination's copy of it is on, not the destination directory's: a
/// top-level directory that is a mount point of its own is cleaned.
#[test]
fn delete_x_cleans_a_top_level_directory_that_is_a_mount_of_its_own() {
    if !can_mount() {
        return;
    }
    let t = Scratch::new("mounts-top");
    let src = t.path("src");
    write(&src.join("f"), "sent");
    let mut mounts = Vec::new();
    for who in ["rcp-local", "rcp-pushed", "rsync"] {
        mounts.push(Mount::at(&t.path(who).join("src")));
        write(&t.path(who).join("src/extra"), "extraneous");
    }
    delete_x_into_each(&t, &src);
    for who in ["rsync", "rcp-local", "rcp-pushed"] {
        let into = t.path(who).join("src");
        assert!(!into.join("extra").exists(), "{who}: cleaned");
        assert_eq!(
            std::fs::read_to_string(into.join("f")).unwrap(),
            "sent",
            "{who}"
        );
    }
    drop(mounts);
}
