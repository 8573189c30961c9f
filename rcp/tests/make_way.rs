//! An entry whose kind changed at the source since the last copy: what
//! stands under its name at the destination makes way for it as rsync
//! makes way (`rcp/src/tree/way.rs`), in every mode. A file, symlink or
//! directory in the way of a directory goes; an empty directory in the
//! way of anything else goes; a directory with something in it goes only
//! with `--delete` or `--force`, and never with what the rules protect.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;
use std::process::Command;

use test_support::Scratch;

mod common;
use common::modes::*;
use common::trees::*;

fn write(p: &Path, data: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    set_times(p, 1_600_000_000, 0);
}

/// The source: each name of another kind than at the destination
/// ([`before`]), and one that is not.
fn source(root: &Path) {
    write(&root.join("to-dir/in"), b"a file in what was a file");
    write(&root.join("link-to-dir/in"), b"in what was a symlink");
    write(&root.join("from-empty-dir"), b"was an empty directory");
    write(
        &root.join("from-full-dir"),
        b"was a directory with a tree in it",
    );
    write(
        &root.join("from-guarded-dir"),
        b"was a directory holding a.o",
    );
    write(&root.join("same"), b"unchanged kind");
    // (Times of the past: rsync leaves a symlink made within the second
    // of its source's time with its own.)
    for l in ["link-from-empty-dir", "link-from-full-dir"] {
        symlink("same", root.join(l)).unwrap();
        set_times(&root.join(l), 1_600_000_000, 0);
    }
    for d in ["to-dir", "link-to-dir", ""] {
        set_times(&root.join(d), 1_500_000_000, 0);
    }
}

/// The destination as a copy of an older source left it (`into/src`).
fn before(into: &Path) {
    let top = into.join("src");
    write(&top.join("to-dir"), b"a file then");
    symlink("same", top.join("link-to-dir")).unwrap();
    std::fs::create_dir_all(top.join("from-empty-dir")).unwrap();
    write(&top.join("from-full-dir/deep/er/f"), b"x");
    write(&top.join("from-full-dir/g"), b"y");
    // (Only what the rules protect: a removal inside would give the
    // directory the time of each copy's own run.)
    write(&top.join("from-guarded-dir/a.o"), b"kept by *.o");
    std::fs::create_dir_all(top.join("link-from-empty-dir")).unwrap();
    write(&top.join("link-from-full-dir/h"), b"h");
    write(&top.join("same"), b"old");
    // (What stays keeps these times in every copy alike.)
    for e in walk(&top) {
        set_times(&e, 1_400_000_000, 0);
    }
}

/// Every path beneath `dir`, and `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    if std::fs::symlink_metadata(dir).unwrap().is_dir() {
        for e in std::fs::read_dir(dir).unwrap() {
            all.extend(walk(&e.unwrap().path()));
        }
    }
    all
}

/// A scratch directory with the source in it and the four ways to copy,
/// where rsync is there to compare with.
fn with_rsync(name: &str) -> Option<(Scratch, std::path::PathBuf, Modes)> {
    if !rsync_available() {
        eprintln!("skipped: no rsync");
        return None;
    }
    let t = Scratch::new(name);
    let src = t.path("src");
    source(&src);
    let modes = Modes::new(&t, &[]);
    Some((t, src, modes))
}

fn flags(f: &[&'static str]) -> Vec<&'static OsStr> {
    f.iter().map(|a| OsStr::new(*a)).collect()
}

#[test]
fn with_delete_or_force_what_is_in_the_way_goes_as_with_rsync_in_every_mode() {
    let Some((t, src, modes)) = with_rsync("make-way") else {
        return;
    };
    for (name, f) in [
        ("delete", flags(&["-a", "--delete"])),
        ("force", flags(&["-a", "--force"])),
    ] {
        let oracle = t.path(&format!("oracle-{name}"));
        modes.as_rsync(&t, name, &f, &src, &oracle, &|into| before(into));
        // (rsync made way for each, else the comparison proves little.)
        let top = oracle.join("src");
        assert!(top.join("to-dir/in").is_file() && top.join("from-full-dir").is_file());
        assert!(std::fs::read_link(top.join("link-from-full-dir")).is_ok());
    }
}

/// Without `--delete` or `--force`, and with what the rules protect in
/// the way, the entry fails as rsync's does, and what was there stays
/// whole; the rest of the copy goes on.
#[test]
fn a_directory_holding_what_may_not_go_stays_and_its_entry_fails_in_every_mode() {
    let Some((t, src, modes)) = with_rsync("make-way-refused") else {
        return;
    };
    for (name, f, refused) in [
        (
            "plain",
            flags(&["-a"]),
            &["from-full-dir", "from-guarded-dir", "link-from-full-dir"][..],
        ),
        (
            "guarded",
            flags(&["-a", "--delete", "--exclude", "*.o"]),
            &["from-guarded-dir"][..],
        ),
    ] {
        let oracle = t.path(&format!("oracle-{name}"));
        before(&oracle);
        let out = rsync_out(&f, &src, &oracle);
        assert_eq!(out.status.code(), Some(23), "rsync {f:?}: a partial copy");
        for mode in EVERY_MODE {
            let into = t.path(&format!("{name}-{}", mode.replace(' ', "-")));
            before(&into);
            let out = modes.run_out(mode, f.clone(), &src, &into);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{mode} {f:?} succeeded");
            for n in refused {
                assert!(
                    err.contains(&format!("src/{n}: could not make way for new")),
                    "{mode} {f:?}: {n} not said: {err}"
                );
            }
            assert_same(&format!("{mode} {f:?}"), &oracle, &into);
        }
        // (What was in the way is there whole.)
        assert!(oracle.join("src/from-guarded-dir/a.o").is_file());
    }
}

/// `-n -i --delete` names what a run would remove to make way, and each
/// entry, with rsync's lines, and changes nothing.
#[test]
fn a_dry_run_names_what_would_make_way_as_rsync_in_every_mode() {
    let Some((t, src, modes)) = with_rsync("make-way-dry") else {
        return;
    };
    let f = flags(&["-a", "-n", "-i", "--delete"]);
    let lines = |out: &[u8]| {
        let mut l: Vec<String> = String::from_utf8_lossy(out)
            .lines()
            .map(str::to_string)
            .collect();
        l.sort();
        l
    };
    let oracle = t.path("oracle");
    before(&oracle);
    let out = rsync_out(&f, &src, &oracle);
    assert!(out.status.success());
    let want = lines(&out.stdout);
    assert!(want.contains(&"*deleting   src/from-full-dir/deep/er/f".to_string()));
    for mode in EVERY_MODE {
        let into = t.path(&format!("dry-{}", mode.replace(' ', "-")));
        before(&into);
        let out = modes.run_out(mode, f.clone(), &src, &into);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(lines(&out.stdout), want, "{mode}");
        assert_same(&format!("{mode} dry run"), &oracle, &into);
    }
}

/// Another name of a file (`-H`) makes way as the file does. (rsync
/// 3.5 is no oracle here: with `-H` and a directory in the way of the
/// other name it never ends.)
#[test]
fn another_name_of_a_file_makes_way_for_itself() {
    let t = Scratch::new("make-way-links");
    let src = t.path("src");
    write(&src.join("a"), b"one file, two names");
    std::fs::hard_link(src.join("a"), src.join("b")).unwrap();
    let modes = Modes::new(&t, &[]);
    for mode in EVERY_MODE {
        let into = t.path(&format!("links-{}", mode.replace(' ', "-")));
        write(&into.join("src/b/inside"), b"in the way");
        let out = modes.run_out(mode, flags(&["-aH"]), &src, &into);
        assert!(!out.status.success(), "{mode}: made way without --force");
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains("src/b: could not make way for new regular file"),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(into.join("src/b/inside").is_file(), "{mode}");
        modes.run(mode, flags(&["-aH", "--force"]), &src, &into);
        let (a, b) = (into.join("src/a"), into.join("src/b"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(&a).unwrap().ino(),
            std::fs::metadata(&b).unwrap().ino(),
            "{mode}: not one file"
        );
    }
}

/// A file of several chunks (received under a temporary name, not
/// unnamed) makes way as a small one does, on both storage engines and
/// with a sync of each file's own (the rename linked to it); one that
/// cannot leaves no temporary file.
#[test]
fn a_file_of_several_chunks_makes_way_on_every_path() {
    let t = Scratch::new("make-way-big");
    let src = t.path("src");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    write(&src.join("big"), &big);
    let (_rsh, path) = common::fake_rsh(&t);
    for engine in ["threads", "io_uring"] {
        for durability in ["", "each-file"] {
            let into = t.path(&format!("into-{engine}-{durability}"));
            write(&into.join("src/big/inside"), b"in the way");
            let run = |force: bool| {
                let mut cmd = Command::new(common::RCP);
                cmd.args(["-q", "--chunk-size", "64K", "-a", "--io-engine", engine]);
                if force {
                    cmd.arg("--force");
                }
                cmd.arg(&src).arg(&into).env("PATH", &path);
                if !durability.is_empty() {
                    cmd.env("RCP_TEST_DURABILITY", durability);
                }
                cmd.output().unwrap()
            };
            let out = run(false);
            let what = format!("{engine} {durability}");
            if !out.status.success()
                && String::from_utf8_lossy(&out.stderr).contains("io_uring")
                && engine == "io_uring"
            {
                eprintln!("skipped: no io_uring here");
                continue;
            }
            assert!(!out.status.success(), "{what}: made way without --force");
            assert!(into.join("src/big/inside").is_file(), "{what}");
            assert_eq!(
                common::temporaries_in(&into.join("src")),
                Vec::<String>::new(),
                "{what}: a temporary file left"
            );
            let out = run(true);
            assert!(
                out.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(std::fs::read(into.join("src/big")).unwrap(), big, "{what}");
        }
    }
}

/// `--ignore-existing` leaves a name that is there whatever it holds,
/// unless both are directories, as rsync's: nothing makes way.
#[test]
fn ignore_existing_makes_no_way_as_rsync_in_every_mode() {
    let Some((t, src, modes)) = with_rsync("make-way-ignore") else {
        return;
    };
    let f = flags(&["-a", "--delete", "--ignore-existing"]);
    let oracle = t.path("oracle");
    before(&oracle);
    // (rsync then fails each file in a directory it did not make, 23;
    // rcp leaves them out with their directory, as `--existing` does.)
    let out = rsync_out(&f, &src, &oracle);
    assert_eq!(out.status.code(), Some(23));
    // (rsync then gives the file and the symlink left where a directory
    // comes that directory's time, as if they were it; rcp leaves them
    // as they were.)
    let untimed = |root: &Path| {
        for n in ["src/to-dir", "src/link-to-dir"] {
            set_times(&root.join(n), 1_400_000_000, 0);
        }
    };
    untimed(&oracle);
    for mode in EVERY_MODE {
        let into = t.path(&format!("ignore-{}", mode.replace(' ', "-")));
        before(&into);
        modes.run(mode, f.clone(), &src, &into);
        assert_eq!(
            std::fs::symlink_metadata(into.join("src/to-dir"))
                .unwrap()
                .mtime(),
            1_400_000_000,
            "{mode}: left as it was"
        );
        untimed(&into);
        assert_same(&format!("{mode} {f:?}"), &oracle, &into);
    }
    // (rsync left each, else the comparison proves little.)
    let top = oracle.join("src");
    assert!(top.join("to-dir").is_file() && top.join("from-full-dir/g").is_file());
    assert!(top.join("link-from-empty-dir").is_dir());
}

/// The destination itself, named as a copy's new name, is never made way
/// for: a directory copied onto a file fails, and the file stays.
#[test]
fn a_directory_copied_onto_a_file_fails_and_leaves_it() {
    let t = Scratch::new("make-way-top");
    let src = t.path("src");
    source(&src);
    let file = t.path("a-file");
    write(&file, b"precious");
    let (_rsh, path) = common::fake_rsh(&t);
    for extra in [&[][..], &["--force", "--delete"][..]] {
        let mut args: Vec<&OsStr> = vec![OsStr::new("-a")];
        args.extend(extra.iter().map(OsStr::new));
        args.extend([src.as_os_str(), file.as_os_str()]);
        let out = rcp(&args, &path);
        assert!(!out.status.success(), "{extra:?}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious", "{extra:?}");
    }
}
