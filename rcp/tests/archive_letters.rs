//! rsync's archive letters one at a time, and their `--no-` forms, held to
//! rsync's result in every mode: `-t` and `--perms` apart (rcp's `-p`
//! keeps both, as scp's), `-l`, `-rlptgoD` spelled out, `-a` with one
//! letter taken back, and what a copy that does not keep modes leaves of
//! a file it replaces (that file's mode, as rsync's receiver does).
//!
//! Without `-t` the times a copy makes are its own, so two copies never
//! match to the nanosecond: entries are compared by kind, mode, owner,
//! contents, and whether the time is the source's.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use test_support::Scratch;

mod common;
use common::modes::*;
use common::trees::*;

fn write(p: &Path, data: &[u8], mode: u32) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree of odd modes (setuid, world-writable, a private directory),
/// times of the past, a symlink and (as root) a file of another owner.
fn source(root: &Path) {
    write(&root.join("plain"), b"plain", 0o644);
    write(&root.join("private"), b"private", 0o600);
    write(
        &root.join("setuid-open"),
        b"setuid, writable by all",
        0o4777,
    );
    write(&root.join("dir/inside"), b"inside", 0o640);
    std::fs::set_permissions(root.join("dir"), std::fs::Permissions::from_mode(0o750)).unwrap();
    symlink("plain", root.join("link")).unwrap();
    if is_root() {
        std::os::unix::fs::lchown(root.join("private"), Some(1234), Some(4321)).unwrap();
    }
    for p in ["plain", "private", "setuid-open", "dir/inside", "dir", ""] {
        set_times(&root.join(p), 1_000_000_000, 500);
    }
}

/// An entry as compared here: all but its time, and whether the time is
/// the source's.
#[derive(Debug, PartialEq)]
struct Kept {
    mode: u32,
    uid: u32,
    gid: u32,
    data: Vec<u8>,
    source_time: bool,
}

/// Each entry beneath `root` by relative path.
fn seen(root: &Path) -> BTreeMap<Vec<u8>, Kept> {
    look(root)
        .0
        .into_iter()
        .map(|(rel, s)| {
            let kept = Kept {
                mode: s.mode,
                uid: s.uid,
                gid: s.gid,
                data: s.data,
                source_time: s.mtime == (1_000_000_000, 500),
            };
            (rel, kept)
        })
        .collect()
}

/// rsync with `flags` into `oracle`, rcp in every mode into `{name}-MODE`,
/// each made ready by `before` first; then each compared with rsync's.
fn as_rsync(
    t: &Scratch,
    modes: &Modes,
    name: &str,
    flags: &[&str],
    src: &Path,
    before: &dyn Fn(&Path),
) {
    let flags: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
    let oracle = t.path(&format!("{name}-rsync"));
    before(&oracle);
    rsync_into(&flags, src, &oracle);
    let expected = seen(&oracle);
    // (Not vacuous: the tree is there.)
    assert!(expected.len() >= 7, "{name}: {expected:?}");
    for mode in EVERY_MODE {
        let into = t.path(&format!("{name}-{}", mode.replace(' ', "-")));
        before(&into);
        let out = modes.run_out(mode, flags.clone(), src, &into);
        assert!(
            out.status.success(),
            "rcp {flags:?} ({mode}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = seen(&into);
        for (rel, want) in &expected {
            assert_eq!(
                got.get(rel),
                Some(want),
                "{name} {flags:?} ({mode}): {}",
                String::from_utf8_lossy(rel)
            );
        }
        assert_eq!(got.len(), expected.len(), "{name} ({mode}): {got:?}");
    }
}

#[test]
fn each_archive_letter_and_its_no_form_keep_what_rsyncs_keep() {
    let t = Scratch::new("letters");
    let src = t.path("src");
    source(&src);
    let modes = Modes::new(&t, &["--allow-owners"]);
    let fresh = |p: &Path| std::fs::create_dir_all(p).unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("times", &["-rlt"]),
        ("perms", &["-rl", "--perms"]),
        ("letters", &["-rlptgoD"]),
        ("no-perms", &["-a", "--no-perms"]),
        ("no-times", &["-a", "--no-times"]),
        ("no-p-then-p", &["-a", "--no-p", "-p", "--no-t"]),
        ("no-owner", &["-a", "--no-o", "--no-g"]),
        ("no-o-then-o", &["-a", "--no-o", "-o"]),
        ("omit-dir-times", &["-a", "-O"]),
    ];
    for (name, flags) in cases {
        as_rsync(&t, &modes, name, flags, &src, &fresh);
    }
}

/// A re-sync that does not keep modes: a file whose contents changed is
/// replaced, and gets the mode of the one it replaces (rsync's rule for
/// existing files); a new file gets the source's bits under the umask.
#[test]
fn a_file_replaced_without_modes_kept_keeps_the_mode_it_had() {
    let t = Scratch::new("letters-replaced");
    let src = t.path("src");
    source(&src);
    let modes = Modes::new(&t, &["--allow-owners"]);
    // An earlier copy, then changed there: other contents, other modes.
    let earlier = |into: &Path| {
        std::fs::create_dir_all(into).unwrap();
        rsync_into(&[OsStr::new("-a")], &src, into);
        write(&into.join("src/plain"), b"changed there", 0o606);
        write(&into.join("src/setuid-open"), b"changed too", 0o2750);
        std::fs::remove_file(into.join("src/private")).unwrap();
    };
    for (name, flags) in [
        ("replaced-times", &["-rlt"][..]),
        ("replaced-plain", &["-rl", "-I"][..]),
    ] {
        as_rsync(&t, &modes, name, flags, &src, &earlier);
    }
}

/// What rcp's `-p` means against rsync's: modes and times both, as scp's;
/// and the `--no-` forms take back what `-a` gives, whatever their order
/// with it.
#[test]
fn the_letters_parse_as_documented() {
    let t = Scratch::new("letters-parse");
    let src = t.path("src");
    source(&src);
    let modes = Modes::new(&t, &[]);
    for (flags, mode_kept, time_kept) in [
        (&["-rp"][..], true, true),
        (&["-rt"][..], false, true),
        (&["-r", "--perms"][..], true, false),
        (&["--no-t", "-a"][..], true, false),
        (&["-a", "--no-perms", "--perms"][..], true, true),
    ] {
        let into = t.path(&format!("parse{}", flags.join("")));
        std::fs::create_dir_all(&into).unwrap();
        let args: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
        let out = modes.run_out("local", args, &src, &into);
        assert!(out.status.success(), "{flags:?}");
        let got = seen(&into);
        let Kept {
            mode, source_time, ..
        } = &got[&b"src/setuid-open".to_vec()];
        assert_eq!(*mode & 0o7777 == 0o4777, mode_kept, "{flags:?}: {mode:o}");
        assert_eq!(*source_time, time_kept, "{flags:?}");
    }
}

/// Without modes kept, a file that replaces a setuid file gets its mode
/// only as far as the receiver may give it: a daemon that may not set
/// owners (no `--allow-owners`) makes no setuid file, as it would not
/// with `-p`; the user's own copy as root keeps the bit, as rsync's.
#[test]
fn a_replaced_setuid_file_gives_its_bit_only_where_the_receiver_may() {
    if !is_root() {
        eprintln!("skipped: needs root (a setuid file of root's)");
        return;
    }
    let t = Scratch::new("letters-setuid");
    write(&t.path("src/tool"), b"new contents", 0o755);
    let modes = Modes::new(&t, &[]);
    for (mode, setuid_kept) in [("push", false), ("local", true)] {
        let into = t.path(mode);
        write(&into.join("tool"), b"old", 0o4755);
        let out = modes.run_out(mode, vec![], &t.path("src/tool"), &into.join("tool"));
        assert!(out.status.success(), "{mode}");
        assert_eq!(std::fs::read(into.join("tool")).unwrap(), b"new contents");
        let got = std::fs::metadata(into.join("tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(got & 0o4000 != 0, setuid_kept, "{mode}: {got:o}");
        assert_eq!(got & 0o777, 0o755, "{mode}: {got:o}");
    }
}
