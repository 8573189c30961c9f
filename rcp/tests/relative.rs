//! `-R`/`--relative` and a list's copy with `--delete` against rsync's:
//! the same command line through rsync and through rcp in every mode,
//! into destinations made alike, then compared entry by entry. `--delete`
//! cleans only the directories sent with their names, never one a path
//! implies (nor the destination directory itself).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use test_support::Scratch;

mod common;
use common::modes::*;
use common::trees::*;

fn write(p: &Path, data: &[u8], sec: i64) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    set_times(p, sec, 0);
}

/// A tree with files at several depths, and directories with only
/// directories in them (for `-m`).
fn source(src: &Path) {
    write(&src.join("a/b/c/x.c"), b"x", 1_600_000_000);
    write(&src.join("a/b/y.txt"), b"y", 1_600_000_000);
    write(&src.join("a/not-sent"), b"n", 1_600_000_000);
    write(&src.join("e/f/z.c"), b"z", 1_600_000_000);
    write(&src.join("h/top.c"), b"h", 1_600_000_000);
    std::fs::create_dir_all(src.join("e/empty/dirs")).unwrap();
    for d in [
        "a/b/c",
        "a/b",
        "a",
        "e/f",
        "e/empty/dirs",
        "e/empty",
        "e",
        "h",
        "",
    ] {
        set_times(&src.join(d), 1_500_000_000, 0);
    }
}

/// A destination an earlier copy left, with more in it: in the
/// directories the copy sends with their names (which `--delete`
/// cleans), in those it only implies, and beside the copy.
fn stale(into: &Path) {
    stale_beneath(&into.join("src"));
    write(&into.join("outside-the-copy"), b"k", 1_400_000_000);
    set_times(into, 1_300_000_000, 0);
}

/// [`stale`]'s entries beneath `top`, the copy's top.
fn stale_beneath(top: &Path) {
    write(&top.join("a/b/gone.c"), b"g", 1_400_000_000);
    write(&top.join("a/b/c/gone-too"), b"g", 1_400_000_000);
    write(&top.join("e/f/old/deeper"), b"g", 1_400_000_000);
    write(&top.join("a/implied-keeps-this"), b"k", 1_400_000_000);
    write(&top.join("beside-keeps-this"), b"k", 1_400_000_000);
    // (Which the source has only empty: `-m --delete` removes it.)
    std::fs::create_dir_all(top.join("e/empty/dirs")).unwrap();
    for d in [
        "a/b/c",
        "a/b",
        "a",
        "e/empty/dirs",
        "e/empty",
        "e/f/old",
        "e/f",
        "e",
        "",
    ] {
        set_times(&top.join(d), 1_300_000_000, 0);
    }
}

/// The sources, each with the `/./` marker after the scratch directory
/// (so they keep `src/...` beneath the destination in every mode: a
/// daemon serves only beneath its roots).
fn marked(t: &Scratch, names: &[&str]) -> Vec<PathBuf> {
    names
        .iter()
        .map(|n| PathBuf::from(format!("{}/./src/{n}", t.dir().display())))
        .collect()
}

/// `flags` through rsync and through rcp in every mode, from `srcs`,
/// each destination made ready by `before`; rsync's destination.
fn as_rsync(
    t: &Scratch,
    modes: &Modes,
    name: &str,
    flags: &[&str],
    srcs: &[PathBuf],
    before: &dyn Fn(&Path),
) -> PathBuf {
    let oracle = t.path(&format!("{name}-rsync"));
    let flags: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
    let srcs: Vec<&Path> = srcs.iter().map(PathBuf::as_path).collect();
    modes.sources_as_rsync(t, name, &flags, &srcs, &oracle, before);
    oracle
}

#[test]
fn relative_paths_are_rsyncs_in_every_mode() {
    if !rsync_available() {
        eprintln!("skipped: no rsync");
        return;
    }
    let t = Scratch::new("relative-modes");
    source(&t.path("src"));
    let modes = Modes::new(&t, &[]);
    let srcs = marked(&t, &["a/b", "h/top.c", "e"]);
    let made = |into: &Path| std::fs::create_dir_all(into).unwrap();

    let oracle = as_rsync(&t, &modes, "plain", &["-aR"], &srcs, &made);
    assert!(oracle.join("src/a/b/c/x.c").exists() && oracle.join("src/h/top.c").exists());
    assert!(
        !oracle.join("src/a/not-sent").exists(),
        "only what is named"
    );

    // `--delete` cleans a/b and e (sent with their names), not src or a.
    let oracle = as_rsync(
        &t,
        &modes,
        "delete",
        &["-aR", "--delete"],
        &srcs,
        &|into: &Path| {
            made(into);
            stale(into);
        },
    );
    assert!(!oracle.join("src/a/b/gone.c").exists());
    assert!(!oracle.join("src/e/f/old").exists());
    assert!(oracle.join("src/a/implied-keeps-this").exists());
    assert!(oracle.join("src/beside-keeps-this").exists());
    assert!(oracle.join("outside-the-copy").exists());

    // With `-m` too: e/empty goes, and with --delete as rsync's.
    let oracle = as_rsync(
        &t,
        &modes,
        "prune",
        &["-aR", "-m", "--delete"],
        &srcs,
        &|into: &Path| {
            made(into);
            stale(into);
        },
    );
    assert!(!oracle.join("src/e/empty").exists());
    assert!(oracle.join("src/a/implied-keeps-this").exists());
}

/// `--remove-source-files` with `-R`: a source whose kept path lands on
/// itself is refused before anything is copied or removed; elsewhere
/// each source goes once its copy is in place.
#[test]
fn relative_copies_never_remove_a_source_onto_itself() {
    let t = Scratch::new("relative-remove");
    source(&t.path("src"));
    let dir = t.dir().display().to_string();
    for (srcs, dest) in [
        (vec!["src/a/b".to_string()], ".".to_string()),
        (vec!["src/h/top.c".to_string()], ".".to_string()),
        (vec![format!("{dir}/./src/e")], dir.clone()),
        (vec![format!("{dir}/src/./e/f")], format!("{dir}/src")),
    ] {
        let out = std::process::Command::new(common::RCP)
            .current_dir(t.dir())
            .args(["-q", "-aR", "--remove-source-files"])
            .args(&srcs)
            .arg(&dest)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{srcs:?} into {dest}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("onto or into itself"), "{srcs:?}: {err}");
    }
    assert_eq!(std::fs::read(t.path("src/a/b/c/x.c")).unwrap(), b"x");
    assert_eq!(std::fs::read(t.path("src/e/f/z.c")).unwrap(), b"z");
    let out = std::process::Command::new(common::RCP)
        .current_dir(t.dir())
        .args(["-q", "-aR", "--remove-source-files", "src/a/b", "moved"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(t.path("moved/src/a/b/c/x.c")).unwrap(), b"x");
    assert!(!t.path("src/a/b/c/x.c").exists() && t.path("src/a/not-sent").exists());
}

/// A path without the marker is kept whole (a relative one from the
/// working directory), and the destination is made if missing.
#[test]
fn without_a_marker_the_whole_path_is_kept() {
    let t = Scratch::new("relative-whole");
    source(&t.path("src"));
    let into = t.path("new/into");
    std::fs::create_dir(t.path("new")).unwrap();
    let out = std::process::Command::new(common::RCP)
        .current_dir(t.dir())
        .args(["-q", "-aR", "src/a/b/c", "src/h"])
        .arg(&into)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(into.join("src/a/b/c/x.c")).unwrap(), b"x");
    assert_eq!(std::fs::read(into.join("src/h/top.c")).unwrap(), b"h");
    assert!(!into.join("src/a/b/y.txt").exists());
    // The directories above keep their source's times.
    let times = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(times(&into.join("src/a")), times(&t.path("src/a")));
}

/// A symlink to a directory above a kept path (`/lib` leading to
/// `usr/lib`) is followed in a user's own copy, as rsync follows the
/// directories a path implies: it arrives as a directory. A daemon
/// follows none (a symlink could lead outside its roots), and says so.
#[test]
fn a_symlink_above_a_kept_path_is_followed_as_rsync_follows_it() {
    if !rsync_available() {
        eprintln!("skipped: no rsync");
        return;
    }
    let t = Scratch::new("relative-dirlink");
    source(&t.path("src"));
    std::os::unix::fs::symlink("a", t.path("src/alias")).unwrap();
    set_times(&t.path("src/alias"), 1_500_000_000, 0);
    set_times(&t.path("src"), 1_500_000_000, 0);
    let modes = Modes::new(&t, &[]);
    let srcs = marked(&t, &["alias/b/c", "h/top.c"]);
    let srcs: Vec<&Path> = srcs.iter().map(PathBuf::as_path).collect();
    let flags = [OsStr::new("-aR")];
    let oracle = t.path("oracle");
    std::fs::create_dir(&oracle).unwrap();
    rsync_sources_into(&flags, &srcs, &oracle);
    assert!(
        std::fs::symlink_metadata(oracle.join("src/alias"))
            .unwrap()
            .is_dir()
    );
    assert!(oracle.join("src/alias/b/c/x.c").is_file());
    for mode in ["local", "push", "remote shell"] {
        let into = t.path(&format!("into-{}", mode.replace(' ', "-")));
        std::fs::create_dir(&into).unwrap();
        let out = modes.run_sources_out(mode, flags.to_vec(), &srcs, &into);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_same(mode, &oracle, &into);
    }
    // The far side of a remote shell is the user's own too.
    let into = t.path("into-shell-pull");
    let mut args: Vec<OsString> = vec!["-aR".into(), "--rsh".into(), modes.rsh.clone().into()];
    args.extend(
        srcs.iter()
            .map(|s| OsString::from(format!("localhost:{}", s.display()))),
    );
    args.push(into.clone().into());
    let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    let out = rcp(&args, &modes.path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same("remote shell pull", &oracle, &into);
    // A daemon follows none: it stops at the symlink, saying so.
    let into = t.path("into-pull");
    std::fs::create_dir(&into).unwrap();
    let out = modes.run_sources_out("pull", flags.to_vec(), &srcs, &into);
    assert!(!out.status.success(), "a daemon followed a symlink");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot open directory \"alias\"") && err.contains("a symlink"),
        "{err}"
    );
    assert!(!into.join("src/alias/b").exists());
    // A list's names, the same way.
    let list = t.path("list");
    std::fs::write(&list, "alias/b/y.txt\n").unwrap();
    let (ours, theirs) = (t.path("listed-ours"), t.path("listed-rsync"));
    let src = t.path("src");
    let args = [
        OsStr::new("-a"),
        OsStr::new("--files-from"),
        list.as_os_str(),
    ];
    rsync_sources_into(&args, &[&src], &theirs);
    let mut ours_args = args.to_vec();
    ours_args.extend([src.as_os_str(), ours.as_os_str()]);
    rcp_ok(&ours_args, "");
    assert_same("--files-from", &theirs, &ours);
    assert!(
        std::fs::symlink_metadata(ours.join("alias"))
            .unwrap()
            .is_dir()
    );
}

#[test]
fn relative_operands_that_cannot_be_kept_are_refused_clearly() {
    let t = Scratch::new("relative-bad");
    source(&t.path("src"));
    let dir = t.dir().display().to_string();
    for (srcs, says) in [
        (
            vec![format!("{dir}/./src/a"), format!("{dir}/src/./h")],
            "keep their paths from different directories",
        ),
        (vec![format!("{dir}/src/../src/a")], "a .. component"),
        (
            vec![format!("{dir}/src/./")],
            "names the directory the path is kept from",
        ),
        (vec![format!("{dir}/./src/./a")], "more than one /./ marker"),
    ] {
        let into = t.path("into");
        let mut args: Vec<OsString> = vec!["-aR".into()];
        args.extend(srcs.iter().map(OsString::from));
        args.push(into.clone().into());
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let out = rcp(&args, "");
        assert_eq!(out.status.code(), Some(2), "{srcs:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{srcs:?}: {err}");
        assert!(!into.exists(), "{srcs:?}: the destination was made");
    }
}

/// `--files-from` with `--delete`: the listed directories copied with
/// their names are cleaned (with `-r`, or listed with a trailing `/`),
/// the ones listed or implied without them are not.
#[test]
fn a_lists_delete_is_rsyncs_in_every_mode() {
    if !rsync_available() {
        eprintln!("skipped: no rsync");
        return;
    }
    let t = Scratch::new("files-from-delete");
    let src = t.path("src");
    source(&src);
    let list = t.path("list");
    std::fs::write(&list, "a/b/\ne/f\nh/top.c\n").unwrap();
    let modes = Modes::new(&t, &[]);
    for (name, recurse) in [("listed", "-a"), ("listed-r", "-ar")] {
        let words = [recurse, "--delete", "--files-from"];
        let flags: Vec<&OsStr> = words
            .iter()
            .map(OsStr::new)
            .chain([list.as_os_str()])
            .collect();
        let oracle = t.path(&format!("{name}-rsync"));
        // (The list's names are relative to the source directory: the
        // destination gets them without `src/`.)
        let before = |into: &Path| {
            std::fs::create_dir_all(into).unwrap();
            stale_beneath(into);
        };
        before(&oracle);
        let out = std::process::Command::new("rsync")
            .args(&flags)
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", oracle.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for mode in EVERY_MODE {
            let into = t.path(&format!("{name}-{}", mode.replace(' ', "-")));
            before(&into);
            let out = modes.run_out(mode, flags.clone(), &src, &into);
            assert!(
                out.status.success(),
                "{mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_same(&format!("{mode} {name}"), &oracle, &into);
        }
        assert!(!oracle.join("a/b/gone.c").exists(), "a/b/ was cleaned");
        assert!(oracle.join("a/implied-keeps-this").exists());
        assert!(oracle.join("beside-keeps-this").exists());
        assert_eq!(
            oracle.join("e/f/old/deeper").exists(),
            recurse == "-a",
            "e/f is cleaned only when copied with its names"
        );
    }
}
