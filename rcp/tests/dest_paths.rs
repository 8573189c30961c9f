//! How the paths a user types are taken: through symlinked directories and
//! `..` as the system resolves them (a local copy, either side of a remote
//! shell; `rcp serve` keeps to its roots and follows no symlink), a
//! destination written with a trailing `/` is a directory (made if
//! missing, as rsync's; the same layout on every run), and `--mkpath`
//! makes the directories on the way, as `mkdir -p`.

use std::ffi::OsStr;
use std::os::unix::fs::symlink;
use std::path::Path;

use test_support::Scratch;

mod common;
use common::modes::{EVERY_MODE, Modes, rsync_into};
use common::s;
use common::trees::{assert_same, set_times};

/// A file, and it and its directory dated in the past (rsync leaves a
/// directory's time as it made it when that is within the second of the
/// source's: the comparison would then fail for nothing).
fn write(p: &Path, data: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    set_times(p, 1_600_000_000, 0);
    set_times(p.parent().unwrap(), 1_600_000_000, 0);
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Paths through a symlinked directory and through `..`, as sources and
/// as destinations, in the user's own copies: what scp and rsync reach.
#[test]
fn paths_through_symlinks_and_dot_dot_are_the_systems_to_resolve() {
    let t = Scratch::new("dest-symlinked");
    write(&t.path("real/src/f"), b"through a symlink");
    std::fs::create_dir(t.path("real/out")).unwrap();
    symlink(t.path("real"), t.path("via")).unwrap();
    let modes = Modes::new(&t, &[]);
    // (Local, and both ways through a remote shell; `..` after a real
    // directory.)
    let odd = |p: &str| format!("{}/../{}/{p}", s(&t.path("real/out")), "out");
    let cases = [
        ("local", t.path("via/src/f"), t.path("via/out/local")),
        ("remote shell", t.path("via/src/f"), t.path("via/out/push")),
        ("local", t.path("real/src/f"), odd("dots").into()),
    ];
    for (mode, src, dest) in &cases {
        let out = modes.run_out(mode, vec![], src, dest);
        ok(
            &out,
            &format!("{mode} {} {}", src.display(), dest.display()),
        );
        assert_eq!(std::fs::read(dest).unwrap(), b"through a symlink");
    }
    // A pull through a remote shell from a symlinked path, and from `..`.
    let rsh = modes.rsh.as_os_str();
    for (from, to) in [
        (t.path("via/src/f"), t.path("real/out/pulled")),
        (
            format!("{}/../src/f", s(&t.path("real/out"))).into(),
            t.path("real/out/pulled-dots"),
        ),
    ] {
        let from = format!("localhost:{}", from.display());
        let out = common::modes::rcp(
            &[OsStr::new("--rsh"), rsh, OsStr::new(&from), to.as_os_str()],
            &modes.path,
        );
        ok(&out, &from);
        assert_eq!(std::fs::read(&to).unwrap(), b"through a symlink");
    }
    // The daemon follows no symlink beneath its root, and takes no `..`.
    for dest in [t.path("via/out/daemon"), odd("daemon-dots").into()] {
        let out = modes.run_out("push", vec![], &t.path("real/src/f"), &dest);
        assert!(!out.status.success(), "{}", dest.display());
        assert!(!t.path("real/out/daemon").exists());
        assert!(!t.path("real/out/daemon-dots").exists());
    }
}

/// `f dir/` with `dir` missing makes `dir` and puts `f` in it, as rsync
/// (before, a file named `dir` was made); a tree copied to `dir/` twice
/// lands in the same place both times; in every mode.
#[test]
fn a_destination_ending_in_a_slash_is_a_directory_made_if_missing() {
    let t = Scratch::new("dest-slash");
    write(&t.path("src/f"), b"one file");
    write(&t.path("src/tree/g"), b"in a tree");
    let modes = Modes::new(&t, &[]);
    for mode in EVERY_MODE {
        let tag = mode.replace(' ', "-");
        let into = format!("{}/", s(&t.path(&format!("file-{tag}"))));
        let out = modes.run_out(mode, vec![], &t.path("src/f"), Path::new(&into));
        ok(&out, mode);
        assert_eq!(std::fs::read(format!("{into}f")).unwrap(), b"one file");

        let into = format!("{}/", s(&t.path(&format!("tree-{tag}"))));
        for run in 0..2 {
            let args = vec![OsStr::new("-a")];
            let out = modes.run_out(mode, args, &t.path("src/tree"), Path::new(&into));
            ok(&out, &format!("{mode}, run {run}"));
        }
        let oracle = t.path(&format!("tree-rsync-{tag}"));
        rsync_into(&[OsStr::new("-a")], &t.path("src/tree"), &oracle);
        rsync_into(&[OsStr::new("-a")], &t.path("src/tree"), &oracle);
        assert_same(mode, &oracle, Path::new(&into));
    }
    // A missing directory above it is still an error, as rsync's.
    let out = modes.run_out("local", vec![], &t.path("src/f"), &t.path("no/such/"));
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(!t.path("no").exists());
    // A file there under that name is not a directory: refused, left.
    std::fs::write(t.path("plain"), b"a file").unwrap();
    for mode in EVERY_MODE {
        let out = modes.run_out(mode, vec![], &t.path("src/f"), &t.path("plain/"));
        assert!(!out.status.success(), "{mode}");
        assert_eq!(std::fs::read(t.path("plain")).unwrap(), b"a file", "{mode}");
    }
    // A dry run makes nothing, and says what it would send.
    let out = modes.run_out(
        "local",
        ["-n", "-i"].map(OsStr::new).to_vec(),
        &t.path("src/f"),
        &t.path("not-yet/"),
    );
    ok(&out, "dry run");
    assert!(String::from_utf8_lossy(&out.stdout).contains(">f+++++++++"));
    assert!(!t.path("not-yet").exists());
}

/// `--remove-source-files` refuses a copy into the source itself also
/// where `--mkpath` would make the way there.
#[test]
fn mkpath_into_the_source_itself_is_refused_with_remove_source_files() {
    let t = Scratch::new("dest-mkpath-onto");
    write(&t.path("src/f"), b"stays");
    let modes = Modes::new(&t, &[]);
    let args = ["-r", "--remove-source-files", "--mkpath"]
        .map(OsStr::new)
        .to_vec();
    // (Also where a `..` among the names to make leads back into it.)
    for dest in ["src/a/b", "elsewhere/new/../../src/c"] {
        let out = modes.run_out("local", args.clone(), &t.path("src"), &t.path(dest));
        assert_eq!(out.status.code(), Some(2), "{dest}: {out:?}");
        assert_eq!(std::fs::read(t.path("src/f")).unwrap(), b"stays");
        assert!(!t.path("src/a").exists() && !t.path("src/c").exists());
    }
}

/// `--mkpath` makes every missing directory of the destination (all of
/// it with a trailing `/`, all but the last name without), in every
/// mode; a daemon's only beneath its root, never through a symlink.
#[test]
fn mkpath_makes_the_destinations_missing_directories() {
    let t = Scratch::new("dest-mkpath");
    write(&t.path("src/f"), b"deep");
    let modes = Modes::new(&t, &[]);
    for mode in EVERY_MODE {
        let tag = mode.replace(' ', "-");
        let into = t.path(&format!("{tag}/a/b/c"));
        let mkpath = vec![OsStr::new("--mkpath")];
        let out = modes.run_out(mode, vec![], &t.path("src/f"), &into);
        assert!(!out.status.success(), "{mode}: made without --mkpath");
        ok(
            &modes.run_out(mode, mkpath.clone(), &t.path("src/f"), &into),
            mode,
        );
        assert_eq!(std::fs::read(&into).unwrap(), b"deep", "{mode}");
        let dir = format!("{}/", s(&t.path(&format!("{tag}/x/y"))));
        ok(
            &modes.run_out(mode, mkpath, &t.path("src/f"), Path::new(&dir)),
            mode,
        );
        assert_eq!(std::fs::read(format!("{dir}f")).unwrap(), b"deep", "{mode}");
    }
    // The daemon makes nothing through a symlink beneath its root.
    std::fs::create_dir(t.path("elsewhere")).unwrap();
    symlink(t.path("elsewhere"), t.path("link")).unwrap();
    let out = modes.run_out(
        "push",
        vec![OsStr::new("--mkpath")],
        &t.path("src/f"),
        &t.path("link/new/f"),
    );
    assert!(!out.status.success());
    assert!(!t.path("elsewhere/new").exists());
}
