//! Sources rcp cannot read: a file that cannot be opened, a directory that
//! cannot be listed, a file whose read fails part way. Each fails alone,
//! named, with exit status 1, as rsync's do (its status 23): everything
//! else arrives and is verified, nothing of what failed is put in place
//! (a copy there from before stays as it was), and `--delete` deletes
//! nothing after a copy that failed. In every mode: local, pushed and
//! pulled through a remote shell.
//!
//! Unreadable sources need a user without root's powers: as root these
//! tests run rcp as `nobody` (`setpriv`), with RHEL's limit on locked
//! memory (64 KiB), under which io_uring refuses a copy's fixed buffers
//! (when the copy has read enough to ask for them).
//! Elsewhere (not root) they say so and check nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_support::{Scratch, pattern};

mod common;
use common::{RCP, s, temporaries_in};

/// The uid and gid the copies run as.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A copy of this build's rcp where `nobody` may run it, and a remote
/// shell that runs the far side here, as the same user, with that rcp.
fn tools(t: &Scratch) -> (PathBuf, PathBuf) {
    let bin = t.path("bin");
    std::fs::create_dir(&bin).unwrap();
    let rcp = bin.join("rcp");
    std::fs::copy(RCP, &rcp).unwrap();
    let rsh = bin.join("rsh");
    std::fs::write(
        &rsh,
        format!(
            "#!/bin/sh\nshift\nPATH={}:$PATH exec sh -c \"$*\"\n",
            bin.display()
        ),
    )
    .unwrap();
    for p in [&bin, &rcp, &rsh] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (rcp, rsh)
}

/// `args` run as `nobody`, with RHEL's 64 KiB limit on locked memory.
fn as_nobody(rcp: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("prlimit")
        .arg("--memlock=65536:65536")
        .args(["setpriv", "--reuid", &NOBODY.to_string()])
        .args(["--regid", &NOBODY.to_string(), "--clear-groups", "--"])
        .arg(rcp)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("prlimit and setpriv run")
}

/// Gives `p` (and what is beneath it) to `nobody`.
fn give(p: &Path) {
    let ok = Command::new("chown")
        .args(["-R", &format!("{NOBODY}:{NOBODY}"), s(p)])
        .status()
        .unwrap()
        .success();
    assert!(ok, "chown {}", p.display());
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A source `src` with files `nobody` can read (`a`, `c`, `d/e`), a
/// root-owned file of mode 000 (`b`, and `lb`, a symlink to it), a
/// root-owned directory of mode 000 (`locked`, holding `x`) and one
/// `nobody` may read and not search (`unsearchable`, mode 444, holding
/// `y`).
fn source(t: &Scratch) -> PathBuf {
    let src = t.path("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::create_dir_all(src.join("locked")).unwrap();
    std::fs::create_dir_all(src.join("unsearchable")).unwrap();
    std::fs::write(src.join("unsearchable/y"), pattern(10, 6)).unwrap();
    std::os::unix::fs::symlink("b", src.join("lb")).unwrap();
    std::fs::write(src.join("a"), pattern(100_000, 1)).unwrap();
    std::fs::write(src.join("c"), pattern(3, 3)).unwrap();
    std::fs::write(src.join("d/e"), pattern(70_000, 5)).unwrap();
    std::fs::write(src.join("b"), pattern(5000, 2)).unwrap();
    std::fs::write(src.join("locked/x"), pattern(10, 4)).unwrap();
    give(&src);
    for p in ["b", "locked"] {
        Command::new("chown")
            .args(["0:0", s(&src.join(p))])
            .status()
            .unwrap();
        set_mode(&src.join(p), 0);
    }
    set_mode(&src.join("unsearchable"), 0o444);
    src
}

/// A destination holding a copy of `src` from before: `b` with other
/// contents, `locked/x` and a file the source does not have.
fn destination_from_before(t: &Scratch, name: &str) -> PathBuf {
    let dest = t.path(name);
    std::fs::create_dir_all(dest.join("src/locked")).unwrap();
    std::fs::write(dest.join("src/b"), b"b from before").unwrap();
    std::fs::write(dest.join("src/locked/x"), b"x from before").unwrap();
    std::fs::write(dest.join("src/extra"), b"only here").unwrap();
    give(&dest);
    dest
}

/// What a copy that met `src`'s unreadable entries must leave and say.
fn check_failed_copy(how: &str, out: &Output, dest: &Path, src: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{how}: exit status; {stderr}");
    assert!(
        stderr.contains("src/b: cannot open b: Permission denied"),
        "{how}: the unreadable file is named: {stderr}"
    );
    assert!(
        stderr.contains("src/locked: cannot list the directory: Permission denied"),
        "{how}: the unlistable directory is named: {stderr}"
    );
    // (Listing it reopens it, which takes the search permission.)
    assert!(
        stderr.contains("src/unsearchable: cannot list the directory: Permission denied"),
        "{how}: a directory that cannot be searched is named: {stderr}"
    );
    for name in ["src/b:", "src/locked:", "src/unsearchable:"] {
        assert_eq!(
            stderr.matches(name).count(),
            1,
            "{how}: each failure is said once: {stderr}"
        );
    }
    for f in ["a", "c", "d/e"] {
        assert_eq!(
            std::fs::read(dest.join("src").join(f)).unwrap(),
            std::fs::read(src.join(f)).unwrap(),
            "{how}: {f} arrived"
        );
    }
    assert!(dest.join("src/locked").is_dir(), "{how}: locked is there");
    let left = temporaries_in(&dest.join("src"));
    assert!(left.is_empty(), "{how}: temporary files left: {left:?}");
}

#[test]
fn sources_that_cannot_be_read_fail_alone_and_everything_else_arrives() {
    if !is_root() {
        eprintln!("not root: no other user to be, nothing checked");
        return;
    }
    let t = Scratch::new("rcp-unreadable");
    let (rcp, rsh) = tools(&t);
    let src = source(&t);
    // Into nothing: `b` and `locked`'s contents do not come.
    for (how, dest, args) in [
        ("local", t.path("local"), vec![]),
        ("pushed", t.path("pushed"), vec!["--rsh", s(&rsh)]),
        ("pulled", t.path("pulled"), vec!["--rsh", s(&rsh)]),
    ] {
        std::fs::create_dir(&dest).unwrap();
        give(&dest);
        let (from, to) = match how {
            "pushed" => (
                s(&src).to_string(),
                format!("localhost:{}/", dest.display()),
            ),
            "pulled" => (
                format!("localhost:{}", src.display()),
                format!("{}/", dest.display()),
            ),
            _ => (s(&src).to_string(), format!("{}/", dest.display())),
        };
        let mut all = vec!["-r"];
        all.extend(args);
        all.extend([from.as_str(), to.as_str()]);
        let out = as_nobody(&rcp, &all, &[]);
        check_failed_copy(how, &out, &dest, &src);
        assert!(!dest.join("src/b").exists(), "{how}: nothing of b");
        assert!(
            !dest.join("src/locked/x").exists(),
            "{how}: nothing of locked's contents"
        );
    }
    // Over a copy from before, with --delete and -a: what could not be
    // read stays as it was there, and a copy that failed deletes nothing.
    for (how, remote) in [("local", false), ("pushed", true)] {
        let dest = destination_from_before(&t, &format!("again-{how}"));
        let to = if remote {
            format!("localhost:{}/", dest.display())
        } else {
            format!("{}/", dest.display())
        };
        let mut all = vec!["-a", "--delete"];
        if remote {
            all.extend(["--rsh", s(&rsh)]);
        }
        all.extend([s(&src), to.as_str()]);
        let out = as_nobody(&rcp, &all, &[]);
        check_failed_copy(how, &out, &dest, &src);
        // (The copy of `locked` gets its mode, 000: root reads it here.)
        assert_eq!(
            std::fs::read(dest.join("src/b")).unwrap(),
            b"b from before",
            "{how}: b as it was"
        );
        assert_eq!(
            std::fs::read(dest.join("src/locked/x")).unwrap(),
            b"x from before",
            "{how}: locked's contents as they were"
        );
        assert!(dest.join("src/extra").exists(), "{how}: nothing deleted");
    }
    // With -L, the symlink to the file that cannot be read fails alone
    // too.
    let dest = t.path("followed");
    std::fs::create_dir(&dest).unwrap();
    give(&dest);
    let to = format!("{}/", dest.display());
    let out = as_nobody(&rcp, &["-rL", s(&src), &to], &[]);
    check_failed_copy("-L", &out, &dest, &src);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("src/lb: cannot open it through the symlink: Permission denied"),
        "-L: {stderr}"
    );
    for p in ["b", "locked", "unsearchable"] {
        set_mode(&src.join(p), 0o755);
    }
}

/// As `nobody`, under RHEL's 64 KiB limit on locked memory, a copy that
/// reads enough to ask for its pool as fixed buffers (twice a pool of
/// four 64 KiB buffers) is refused them part way, and reads on without
/// them: every byte arrives, verified. (Where io_uring is not there, the
/// threads engine never asks.)
#[test]
fn a_copy_refused_fixed_buffers_part_way_reads_on_without_them() {
    if !is_root() {
        eprintln!("not root: no other user to be, nothing checked");
        return;
    }
    let t = Scratch::new("rcp-memlock");
    let (rcp, _) = tools(&t);
    let src = t.path("big");
    let data = pattern(3 << 20, 9);
    std::fs::write(&src, &data).unwrap();
    let dest = t.path("out");
    std::fs::create_dir(&dest).unwrap();
    give(&src);
    give(&dest);
    let to = format!("{}/", dest.display());
    let args = ["--chunk-size", "64K", "--window", "4", "--streams", "1"];
    let out = as_nobody(&rcp, &[&args[..], &[s(&src), &to]].concat(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(dest.join("big")).unwrap() == data, "the copy");
}

#[test]
fn a_file_whose_read_fails_part_way_is_abandoned_and_the_copy_goes_on() {
    let t = Scratch::new("rcp-read-fails");
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    // Files of several 64 KiB chunks, read one after the other: the
    // sixth chunk read is the second of `f1` (as a local copy or a push
    // read them; `f0` has 5).
    std::fs::write(src.join("f0"), pattern(5 * 65536, 10)).unwrap();
    std::fs::write(src.join("f1"), pattern(4 * 65536 + 7, 11)).unwrap();
    std::fs::write(src.join("f2"), pattern(3 * 65536, 12)).unwrap();
    // Another name of f1 (-H): not linked to what f1 was before.
    std::fs::hard_link(src.join("f1"), src.join("g1")).unwrap();
    let (rsh, path) = common::fake_rsh(&t);
    for (how, remote) in [("local", false), ("pushed", true)] {
        let dest = t.path(&format!("dest-{how}"));
        std::fs::create_dir_all(dest.join("src")).unwrap();
        std::fs::write(dest.join("src/f1"), b"f1 from before").unwrap();
        std::fs::write(dest.join("src/g1"), b"g1 from before").unwrap();
        let to = if remote {
            format!("localhost:{}/", dest.display())
        } else {
            format!("{}/", dest.display())
        };
        let mut cmd = Command::new(RCP);
        cmd.args(["-rH", "--chunk-size", "64K", "--streams", "2"]);
        if remote {
            cmd.args(["--rsh", s(&rsh)]).env("PATH", &path);
        }
        let out = cmd
            .arg(&src)
            .arg(&to)
            .env("RCP_TEST_FAIL_READ", "6")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{how}: {stderr}");
        assert!(
            stderr.contains("src/f1: cannot read it at offset")
                && stderr.contains("Input/output error"),
            "{how}: the file and why: {stderr}"
        );
        assert_eq!(
            std::fs::read(dest.join("src/f1")).unwrap(),
            b"f1 from before",
            "{how}: f1 as it was"
        );
        assert!(
            stderr.contains("src/g1: not linked: src/f1 could not be read at the source"),
            "{how}: the other name fails too: {stderr}"
        );
        assert_eq!(
            std::fs::read(dest.join("src/g1")).unwrap(),
            b"g1 from before",
            "{how}: g1 as it was, not linked to f1 from before"
        );
        for f in ["f0", "f2"] {
            assert_eq!(
                std::fs::read(dest.join("src").join(f)).unwrap(),
                std::fs::read(src.join(f)).unwrap(),
                "{how}: {f} arrived"
            );
        }
        let left = temporaries_in(&dest.join("src"));
        assert!(left.is_empty(), "{how}: temporary files left: {left:?}");
    }
}

#[test]
fn a_source_gone_since_the_walk_is_said_to_have_vanished_and_delete_still_runs() {
    // A live tree changes under a copy: a file deleted between the walk
    // and its read, a directory between its entry and its listing. As
    // rsync's "file has vanished", each is named once and fails nothing:
    // the exit status is 0 and `--delete` runs. What the destination
    // holds under those names stays (they were sent, so they are not
    // extraneous).
    let t = Scratch::new("rcp-vanished");
    let src = t.path("src");
    std::fs::create_dir_all(src.join("d/gone")).unwrap();
    std::fs::write(src.join("a"), pattern(100_000, 1)).unwrap();
    std::fs::write(src.join("d/e"), pattern(3, 2)).unwrap();
    let (rsh, path) = common::fake_rsh(&t);
    for how in ["local", "pushed", "pulled"] {
        // (The hook removes each `gone` as the sender comes to it.)
        std::fs::create_dir_all(src.join("d/gone")).unwrap();
        std::fs::write(src.join("gone"), pattern(5000, 3)).unwrap();
        let dest = t.path(&format!("dest-{how}"));
        std::fs::create_dir_all(dest.join("src/d/gone")).unwrap();
        std::fs::write(dest.join("src/gone"), b"gone, from before").unwrap();
        std::fs::write(dest.join("src/d/gone/old"), b"old").unwrap();
        std::fs::write(dest.join("src/extra"), b"only here").unwrap();
        let (from, to) = match how {
            "local" => (s(&src).to_string(), format!("{}/", dest.display())),
            "pushed" => (
                s(&src).to_string(),
                format!("localhost:{}/", dest.display()),
            ),
            _ => (
                format!("localhost:{}", src.display()),
                format!("{}/", dest.display()),
            ),
        };
        let out = Command::new(RCP)
            .args(["-a", "--delete", "--json", "--rsh", s(&rsh)])
            .arg(&from)
            .arg(&to)
            .env("PATH", &path)
            .env("RCP_TEST_VANISH", "gone")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{how}: exit status; {stderr}");
        for name in ["src/gone", "src/d/gone"] {
            let said = format!("rcp: file has vanished: {name}\n");
            assert_eq!(
                stderr.matches(&said).count(),
                1,
                "{how}: {name} said once: {stderr}"
            );
        }
        assert!(
            stdout.contains("\"ok\":true") && stdout.contains("\"vanished\":2"),
            "{how}: the summary: {stdout}"
        );
        assert!(!src.join("gone").exists(), "{how}: the hook removed it");
        assert!(!dest.join("src/extra").exists(), "{how}: --delete ran");
        assert_eq!(
            std::fs::read(dest.join("src/gone")).unwrap(),
            b"gone, from before",
            "{how}: what was there stays"
        );
        assert_eq!(
            std::fs::read(dest.join("src/d/gone/old")).unwrap(),
            b"old",
            "{how}: what the directory held stays"
        );
        for f in ["a", "d/e"] {
            assert_eq!(
                std::fs::read(dest.join("src").join(f)).unwrap(),
                std::fs::read(src.join(f)).unwrap(),
                "{how}: {f} arrived"
            );
        }
        let left = temporaries_in(&dest.join("src"));
        assert!(left.is_empty(), "{how}: temporary files left: {left:?}");
    }
}
