//! `--partial` and `-P`, as rsync's: a copy cut off keeps what arrived of
//! a file (as `.rcp-NAME.part` beside it, never under its final name), and
//! the next copy with `--partial` sends only what that lacks. In every
//! mode, cut off from the side that does not receive; and what rcp
//! refuses of rsync's other ways of writing, with the reason.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use test_support::{Scratch, pattern};

mod common;
use common::modes::{EVERY_MODE, Modes};
use common::{RCP, s};

const SIZE: usize = 16 << 20;

/// Waits until `part` holds at least `bytes` (the copy is under way).
fn until_part_holds(part: &Path, bytes: u64, copy: &mut Child) {
    for _ in 0..10_000 {
        if std::fs::metadata(part).is_ok_and(|m| m.len() >= bytes) {
            return;
        }
        if let Some(status) = copy.try_wait().unwrap() {
            panic!("the copy ended ({status}) before it could be cut off");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("{} never held {bytes} bytes", part.display());
}

/// What became of `part` once the copy that wrote it let go of it (it
/// holds a lock on it until it removed or kept it): its size if kept.
fn settled(part: &Path) -> Option<u64> {
    use rustix::fs::{FlockOperation, flock};
    use std::os::unix::fs::MetadataExt;
    for _ in 0..1000 {
        let Ok(file) = std::fs::File::open(part) else {
            return None;
        };
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
            // (Removed while held: the file opened is no longer the name.)
            let held = file.metadata().unwrap();
            return match std::fs::metadata(part) {
                Ok(m) if m.ino() == held.ino() => Some(m.len()),
                _ => None,
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} still held after 10 s", part.display());
}

/// One mode's cut-off copy, `--partial` or not: the part kept (its size)
/// or `None` once it is gone.
fn cut_off(t: &Scratch, modes: &mut Modes, mode: &str, partial: bool) -> Option<u64> {
    let src = t.path("src/big");
    let into = t.path(&format!("{mode}-{partial}"));
    std::fs::create_dir_all(&into).unwrap();
    let dest = into.join("big");
    let part = into.join(".rcp-big.part");
    // Slow enough to be cut off midway: 4 MiB a second, paced by the
    // side the user started.
    let mut args: Vec<&OsStr> = ["--bwlimit", "4M"].map(OsStr::new).to_vec();
    if partial {
        args.push(OsStr::new("--partial"));
    }
    let mut copy = modes
        .command(mode, args, &[&src], &dest)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until_part_holds(&part, 1 << 20, &mut copy);
    // Cut off from the side that does not receive: the daemon of a pull,
    // else the copy the user started (both ends, locally).
    if mode == "pull" {
        modes.daemon.child.kill().unwrap();
        modes.daemon.child.wait().unwrap();
    } else {
        copy.kill().unwrap();
    }
    let out = copy.wait_with_output().unwrap();
    assert!(!out.status.success(), "{mode}: a copy cut off succeeded");
    if mode == "pull" {
        *modes = Modes::new(t, &[]);
    }
    assert!(!dest.exists(), "{mode}: a file cut off has its final name");
    settled(&part)
}

#[test]
fn a_copy_cut_off_keeps_its_part_with_partial_and_the_next_sends_only_the_rest() {
    let t = Scratch::new("partial");
    let data = pattern(SIZE, 41);
    std::fs::create_dir(t.path("src")).unwrap();
    std::fs::write(t.path("src/big"), &data).unwrap();
    let mut modes = Modes::new(&t, &[]);
    for mode in EVERY_MODE {
        // Without --partial what arrived goes, except where the receiver
        // itself was killed (a local copy): then the next copy without
        // --partial starts it again.
        let kept = cut_off(&t, &mut modes, mode, false);
        assert_eq!(kept.is_some(), mode == "local", "{mode}: {kept:?}");

        let kept = cut_off(&t, &mut modes, mode, true)
            .unwrap_or_else(|| panic!("{mode}: --partial kept nothing"));
        assert!(kept >= 1 << 20, "{mode}: {kept} bytes kept");
        let into = t.path(&format!("{mode}-true"));
        let out = modes.run_out(
            mode,
            ["-P", "--json"].map(OsStr::new).to_vec(),
            &t.path("src/big"),
            &into.join("big"),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let sent = v["bytes"].as_u64().unwrap();
        // (Whole chunks of what was kept are not sent again.)
        assert!(
            sent <= SIZE as u64 - (kept / (64 << 10)) * (64 << 10) && sent < SIZE as u64,
            "{mode}: sent {sent} of {SIZE}, {kept} kept"
        );
        assert!(
            std::fs::read(into.join("big")).unwrap() == data,
            "{mode}: not the source's"
        );
        assert!(!into.join(".rcp-big.part").exists(), "{mode}: part left");
    }
}

/// What `--partial` kept is checked chunk by chunk like a `--resume`: a
/// kept part whose bytes were changed since (or a source changed since)
/// ends as the source, never as the part.
#[test]
fn a_kept_part_that_differs_from_the_source_is_mended() {
    let t = Scratch::new("partial-differs");
    let data = pattern(SIZE, 42);
    std::fs::write(t.path("big"), &data).unwrap();
    std::fs::create_dir(t.path("out")).unwrap();
    // What a copy cut off would have kept, with a byte wrong in its
    // second chunk and a hole where its fourth should be.
    let mut part = data[..6 << 16].to_vec();
    part[(1 << 16) + 7] ^= 0xff;
    part[3 << 16..4 << 16].fill(0);
    std::fs::write(t.path("out/.rcp-big.part"), &part).unwrap();
    let out = Command::new(RCP)
        .args(["-q", "--json", "--chunk-size", "64K", "--partial"])
        .args([s(&t.path("big")), s(&t.path("out/big"))])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    // Four good chunks were kept; the two bad ones and the rest were sent.
    assert_eq!(v["bytes"].as_u64().unwrap(), SIZE as u64 - (4 << 16));
    assert!(std::fs::read(t.path("out/big")).unwrap() == data);
    assert!(!t.path("out/.rcp-big.part").exists());
}

/// rsync's ways of writing into the destination file itself, and its
/// `--partial-dir`, are refused with the reason and what to use instead;
/// so is `--partial` with a broadcast.
#[test]
fn writing_in_place_and_a_partial_dir_are_refused_with_the_reason() {
    let t = Scratch::new("partial-refused");
    std::fs::write(t.path("f"), b"x").unwrap();
    let refused = |args: &[&str], says: &[&str]| {
        let out = Command::new(RCP)
            .args(args)
            .args([s(&t.path("f")), s(&t.path("g"))])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        for said in says {
            assert!(err.contains(said), "{args:?}: {err}");
        }
        assert!(!t.path("g").exists());
    };
    for flag in ["--inplace", "--append", "--append-verify"] {
        refused(
            &[flag],
            &[
                flag,
                "never writes into a file under its final name",
                "--partial",
            ],
        );
    }
    refused(&["--partial-dir", "x"], &[".rcp-NAME.part", "--partial"]);
    std::fs::write(t.path("nodes"), "node1\nnode2\n").unwrap();
    let out = Command::new(RCP)
        .args([
            "-aP",
            "--hosts",
            s(&t.path("nodes")),
            s(&t.path("f")),
            ":/tmp",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--partial is not supported with a broadcast") && err.contains("--resume"),
        "{err}"
    );
}

/// A file that replaces one closed to others is no more open while it
/// arrives: what `--partial` keeps of it, cut off, has no bits the file
/// it replaces lacks (the source's are 0644, the file there 0600).
#[test]
fn a_part_replacing_a_private_file_is_private_too() {
    use std::os::unix::fs::PermissionsExt;
    let t = Scratch::new("partial-private");
    std::fs::create_dir(t.path("src")).unwrap();
    std::fs::write(t.path("src/big"), pattern(SIZE, 43)).unwrap();
    let modes = Modes::new(&t, &[]);
    let into = t.path("push-private");
    std::fs::create_dir(&into).unwrap();
    std::fs::write(into.join("big"), b"the old, private contents").unwrap();
    std::fs::set_permissions(into.join("big"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let args = ["--bwlimit", "4M", "--partial"].map(OsStr::new).to_vec();
    let mut copy = modes
        .command("push", args, &[&t.path("src/big")], &into.join("big"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let part = into.join(".rcp-big.part");
    until_part_holds(&part, 1 << 20, &mut copy);
    let mode = std::fs::metadata(&part).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o} while it arrives");
    copy.kill().unwrap();
    let _ = copy.wait();
    let kept = settled(&part).expect("kept");
    assert!(kept >= 1 << 20);
    let mode = std::fs::metadata(&part).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o} kept");
    // Taken up, it ends with the mode of the file it replaced (no -p).
    let out = modes.run_out(
        "push",
        vec![OsStr::new("-P")],
        &t.path("src/big"),
        &into.join("big"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(into.join("big"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
}
