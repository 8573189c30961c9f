//! `-m`/`--prune-empty-dirs` against rsync's: the same command line
//! through rsync and through rcp in every mode, into destinations made
//! alike, then compared entry by entry; with the filter idiom it is for
//! (`--include='*/' --include='*.c' --exclude='*'`), alone, and with
//! `--delete` over a destination that has directories the source now has
//! only empty.

use std::ffi::OsStr;
use std::os::unix::fs::symlink;
use std::path::Path;

use test_support::Scratch;

mod common;
use common::modes::*;
use common::trees::*;

fn write(p: &Path, data: &[u8], sec: i64) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    set_times(p, sec, 0);
}

fn dirs(root: &Path, paths: &[&str]) {
    for d in paths {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
}

/// Directories with files deep down, with only directories beneath
/// them, with only files the idiom leaves out, with only a symlink, and
/// hard links across them.
fn source(src: &Path) {
    dirs(src, &["chain/of/empty/dirs", "mixed/empty", "bare"]);
    write(&src.join("top.c"), b"top", 1_600_000_000);
    write(&src.join("deep/down/in/here/x.c"), b"deep", 1_600_000_000);
    write(&src.join("mixed/keep.c"), b"kept", 1_600_000_000);
    write(&src.join("mixed/notes.txt"), b"notes", 1_600_000_000);
    write(&src.join("only-txt/a/b.txt"), b"txt", 1_600_000_000);
    write(&src.join("linked/one.c"), b"linked", 1_600_000_000);
    std::fs::hard_link(src.join("linked/one.c"), src.join("mixed/two.c")).unwrap();
    std::fs::create_dir_all(src.join("link-only")).unwrap();
    symlink("../top.c", src.join("link-only/to-top.c")).unwrap();
    set_times(&src.join("link-only/to-top.c"), 1_600_000_000, 0);
    for d in [
        "chain/of/empty/dirs",
        "chain/of/empty",
        "chain/of",
        "chain",
        "mixed/empty",
        "mixed",
        "bare",
        "deep/down/in/here",
        "deep/down/in",
        "deep/down",
        "deep",
        "only-txt/a",
        "only-txt",
        "linked",
        "link-only",
        "",
    ] {
        set_times(&src.join(d), 1_500_000_000, 0);
    }
}

/// A destination a copy without `-m` left, with more in it since: what
/// `--delete -m` removes (the directories the source has only empty,
/// and what is in them) and what it keeps (what the rules protect).
fn stale(into: &Path) {
    let top = into.join("src");
    dirs(&top, &["chain/of/empty/dirs", "bare", "only-txt/a"]);
    write(&top.join("chain/of/gone.c"), b"gone", 1_500_000_000);
    write(&top.join("only-txt/a/b.txt"), b"protected", 1_500_000_000);
    write(&top.join("bare/old.c"), b"gone", 1_500_000_000);
    for d in [
        "chain/of/empty/dirs",
        "chain/of",
        "bare",
        "only-txt/a",
        "only-txt",
        "",
    ] {
        set_times(&top.join(d), 1_400_000_000, 0);
    }
}

fn flags<'a>(list: &'a [&'a str]) -> Vec<&'a OsStr> {
    list.iter().map(OsStr::new).collect()
}

const IDIOM: [&str; 6] = ["--include", "*/", "--include", "*.c", "--exclude", "*"];

#[test]
fn pruned_copies_are_rsyncs_in_every_mode() {
    if !rsync_available() {
        eprintln!("skipped: no rsync");
        return;
    }
    let t = Scratch::new("prune-modes");
    let src = t.path("src");
    source(&src);
    let modes = Modes::new(&t, &[]);
    let made = |into: &Path| std::fs::create_dir_all(into).unwrap();

    let idiom = [&["-aH", "-m"][..], &IDIOM].concat();
    let oracle = t.path("oracle-idiom");
    modes.as_rsync(&t, "idiom", &flags(&idiom), &src, &oracle, &made);
    // What rsync left out and kept (else the comparison proves little).
    for gone in [
        "chain",
        "bare",
        "only-txt",
        "mixed/empty",
        "mixed/notes.txt",
    ] {
        assert!(!oracle.join("src").join(gone).exists(), "{gone} pruned");
    }
    for kept in [
        "top.c",
        "deep/down/in/here/x.c",
        "mixed/two.c",
        "link-only/to-top.c",
    ] {
        assert!(
            std::fs::symlink_metadata(oracle.join("src").join(kept)).is_ok(),
            "{kept} kept"
        );
    }

    // Without rules: only the directories with nothing but directories.
    let oracle = t.path("oracle-alone");
    modes.as_rsync(&t, "alone", &flags(&["-a", "-m"]), &src, &oracle, &made);
    assert!(oracle.join("src/only-txt/a/b.txt").exists());
    assert!(!oracle.join("src/chain").exists() && !oracle.join("src/mixed/empty").exists());

    // With --delete: what the source has only empty goes there too,
    // except what the rules protect (and the directories holding it).
    let delete = [&["-a", "-m", "--delete"][..], &IDIOM].concat();
    let oracle = t.path("oracle-delete");
    modes.as_rsync(&t, "delete", &flags(&delete), &src, &oracle, &|into| {
        made(into);
        stale(into);
    });
    assert!(!oracle.join("src/chain").exists() && !oracle.join("src/bare").exists());
    assert!(oracle.join("src/only-txt/a/b.txt").exists(), "protected");
}

/// A second run over its own copy changes nothing, and without `-m` the
/// same run makes the directories `-m` left out.
#[test]
fn a_pruned_copy_is_in_sync_with_itself() {
    let t = Scratch::new("prune-again");
    let src = t.path("src");
    source(&src);
    let into = t.path("into");
    std::fs::create_dir(&into).unwrap();
    let run = |extra: &[&str]| {
        let args = [&["-a", "-m", "--delete", "-i"][..], extra, &IDIOM].concat();
        let mut args: Vec<&OsStr> = flags(&args);
        args.extend([src.as_os_str(), into.as_os_str()]);
        let out = rcp(&args, "");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let first = run(&[]);
    assert!(
        first.contains("cd+++++++++ src/deep/down/in/here/"),
        "{first}"
    );
    assert!(!first.contains("src/chain"), "{first}");
    let second = run(&[]);
    assert!(
        second.lines().all(|l| !l.starts_with(['>', 'c', '*'])),
        "nothing made or removed again: {second}"
    );
    let mut args = flags(&["-a", "-i"]);
    args.extend([src.as_os_str(), into.as_os_str()]);
    let out = rcp(&args, "");
    let unpruned = String::from_utf8(out.stdout).unwrap();
    assert!(
        unpruned.contains("cd+++++++++ src/chain/of/empty/dirs/"),
        "{unpruned}"
    );
}

/// With `--files-from`: a listed directory with nothing beneath it is
/// left out, and the directories a listed file implies are made.
#[test]
fn files_from_lists_are_pruned_too() {
    let t = Scratch::new("prune-listed");
    let src = t.path("src");
    source(&src);
    let list = t.path("list");
    std::fs::write(&list, "chain/of\ndeep/down/in/here/x.c\nbare\n").unwrap();
    let into = t.path("into");
    let mut args = flags(&["-a", "-m", "-r", "--files-from"]);
    args.extend([list.as_os_str(), src.as_os_str(), into.as_os_str()]);
    rcp_ok(&args, "");
    assert!(into.join("deep/down/in/here/x.c").exists());
    assert!(!into.join("chain").exists() && !into.join("bare").exists());
}
