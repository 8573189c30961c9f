//! `--delete`, the filter rules and `--files-from` against the oracle: the
//! same command line through rcp and through rsync, into destinations made
//! alike, then compared entry by entry. A `--delete` run whose copy fails
//! deletes nothing, and deleting never follows a symlink out of the
//! destination.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use test_support::{Scratch, pattern};

mod common;
use common::modes::*;
use common::trees::*;
use common::{Daemon, RCP, fake_rsh, s, secret};

fn write(p: &Path, data: &[u8], sec: i64) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    set_times(p, sec, 0);
}

/// A source tree with names the rules below tell apart.
fn source(root: &Path) {
    let names = [
        "a.c",
        "a.o",
        "b.c",
        "core",
        "notes.txt",
        "x1",
        "x22",
        "]odd",
        "sp ace.o",
    ];
    for (i, dir) in ["", "d0", "d0/sub", "d1", "cache", "d1/cache", "keep"]
        .iter()
        .enumerate()
    {
        for (j, n) in names.iter().enumerate() {
            if (i + j) % 3 != 2 {
                let p = root.join(dir).join(n);
                write(
                    &p,
                    &pattern(10 + i * 7 + j, (i * 31 + j) as u64),
                    1_600_000_000,
                );
            }
        }
    }
    // A file named like a directory rule, to tell `cache/` from `cache`.
    write(&root.join("d0/cache"), b"a file", 1_600_000_000);
    for d in ["d0/sub", "d0", "d1/cache", "d1", "cache", "keep"] {
        set_times(&root.join(d), 1_500_000_000, 0);
    }
    set_times(root, 1_500_000_000, 0);
}

/// A destination as a previous copy left it, with what the source no
/// longer has: files, a directory tree, a symlink to a directory outside
/// the destination (whose contents must survive), files the rules protect.
fn stale(into: &Path, outside: &Path) {
    let top = into.join("src");
    write(&top.join("gone.txt"), b"gone", 1_500_000_000);
    write(&top.join("d0/gone.o"), b"gone", 1_500_000_000);
    write(&top.join("old/deeper/file"), b"gone", 1_500_000_000);
    // (Excluded inside a directory that would go: it stays, and so does
    // the directory that holds it.)
    write(&top.join("kept-dir/kept.o"), b"kept by *.o", 1_500_000_000);
    write(&top.join("cache/stale"), b"kept by cache/", 1_500_000_000);
    write(&top.join("d1/protected.o"), b"kept by *.o", 1_500_000_000);
    std::os::unix::fs::symlink(outside, top.join("escape")).unwrap();
    std::os::unix::fs::symlink(outside, top.join("d1/escape2")).unwrap();
    // (Directories the copy leaves alone keep these times in both.)
    for d in ["d0", "old/deeper", "old", "kept-dir", "cache", "d1", ""] {
        set_times(&top.join(d), 1_400_000_000, 0);
    }
}

#[test]
fn delete_leaves_what_rsync_delete_leaves_in_every_mode() {
    let t = Scratch::new("delete-modes");
    let src = t.path("src");
    source(&src);
    let outside = t.path("outside");
    write(&outside.join("precious"), b"never deleted", 1_500_000_000);
    let modes = Modes::new(&t, &[]);
    let flags: Vec<&OsStr> = ["-a", "--delete", "--exclude", "*.o", "--exclude", "cache/"]
        .iter()
        .map(OsStr::new)
        .collect();
    let oracle = t.path("oracle");
    modes.as_rsync(&t, "into", &flags, &src, &oracle, &|into| {
        stale(into, &outside)
    });
    // rsync removed the stale entries and the symlinks, and kept what the
    // rules protect (else the comparison proves little).
    assert!(!oracle.join("src/old").exists() && !oracle.join("src/gone.txt").exists());
    assert!(oracle.join("src/cache/stale").exists() && oracle.join("src/d1/protected.o").exists());
    assert!(
        oracle.join("src/kept-dir/kept.o").exists(),
        "kept inside what would go"
    );
    assert!(std::fs::symlink_metadata(oracle.join("src/escape")).is_err());
    assert_eq!(
        std::fs::read(outside.join("precious")).unwrap(),
        b"never deleted",
        "deleting followed a symlink out"
    );
}

#[test]
fn min_and_max_size_leave_out_what_rsync_leaves_out_in_every_mode() {
    let t = Scratch::new("sizes-modes");
    let src = t.path("src");
    // Sizes on both sides of each bound, and bounds themselves (both are
    // inclusive), another name of a file left out (`-H`) and of one sent.
    for (name, len) in [
        ("empty", 0),
        ("nine", 9),
        ("ten", 10),
        ("d/mid", 500),
        ("exact-1k", 1024),
        ("over-1k", 1025),
        ("d/big", 70_000),
    ] {
        write(&src.join(name), &pattern(len, len as u64), 1_600_000_000);
    }
    std::fs::hard_link(src.join("d/big"), src.join("big-name")).unwrap();
    std::fs::hard_link(src.join("d/mid"), src.join("mid-name")).unwrap();
    for d in ["d", ""] {
        set_times(&src.join(d), 1_500_000_000, 0);
    }
    // What a previous copy left: files under the names left out (kept,
    // even with --delete), and one the source no longer has (deleted).
    let before = |into: &Path| {
        for name in ["nine", "d/big", "big-name", "gone"] {
            write(&into.join("src").join(name), b"from before", 1_500_000_000);
        }
        for d in ["src/d", "src"] {
            set_times(&into.join(d), 1_400_000_000, 0);
        }
    };
    let modes = Modes::new(&t, &[]);
    let flags: Vec<&OsStr> = ["-aH", "--delete", "--min-size=10", "--max-size=1K"]
        .iter()
        .map(OsStr::new)
        .collect();
    let oracle = t.path("oracle");
    modes.as_rsync(&t, "into", &flags, &src, &oracle, &before);
    // (Else the comparison proves little.)
    assert_eq!(
        std::fs::read(oracle.join("src/d/big")).unwrap(),
        b"from before"
    );
    assert!(!oracle.join("src/over-1k").exists() && !oracle.join("src/gone").exists());
    assert!(oracle.join("src/exact-1k").exists() && oracle.join("src/ten").exists());
    // Crossed bounds would send nothing: refused as a usage error.
    let out = rcp(
        &[
            OsStr::new("--min-size=2K"),
            OsStr::new("--max-size=1K"),
            src.as_os_str(),
            t.path("nowhere").as_os_str(),
        ],
        &modes.path,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is above --max-size"));
}

#[test]
fn delete_excluded_removes_what_rsync_removes_in_every_mode() {
    let t = Scratch::new("delete-excluded");
    let src = t.path("src");
    source(&src);
    let outside = t.path("outside");
    write(&outside.join("precious"), b"never deleted", 1_500_000_000);
    let modes = Modes::new(&t, &[]);
    let flags: Vec<&OsStr> = ["-a", "--delete", "--delete-excluded", "--exclude", "*.o"]
        .iter()
        .map(OsStr::new)
        .collect();
    let oracle = t.path("oracle");
    modes.as_rsync(&t, "into", &flags, &src, &oracle, &|into| {
        stale(into, &outside)
    });
    // What the rule protects without --delete-excluded went.
    assert!(!oracle.join("src/d1/protected.o").exists());
    assert_eq!(
        std::fs::read(outside.join("precious")).unwrap(),
        b"never deleted",
        "deleting followed a symlink out"
    );
}

#[test]
fn existing_makes_nothing_new_as_rsync_in_every_mode() {
    let t = Scratch::new("existing");
    let src = t.path("src");
    source(&src);
    std::os::unix::fs::symlink("a.c", src.join("d0/link")).unwrap();
    // A destination with some of the source's names (older), none of
    // others (a directory among them), and one the source has not.
    let before = |into: &Path| {
        for name in ["a.c", "d0/sub/b.c", "keep/x1"] {
            write(&into.join("src").join(name), b"older", 1_400_000_000);
        }
        write(&into.join("src/gone.txt"), b"gone", 1_400_000_000);
        for d in ["d0/sub", "d0", "keep", ""] {
            set_times(&into.join("src").join(d), 1_400_000_000, 0);
        }
    };
    let modes = Modes::new(&t, &[]);
    for extra in [&["--existing"][..], &["--existing", "--ignore-existing"]] {
        let mut flags: Vec<&OsStr> = vec![OsStr::new("-a"), OsStr::new("--delete")];
        flags.extend(extra.iter().map(OsStr::new));
        let oracle = t.path(&format!("oracle{}", extra.len()));
        let name = format!("into{}", extra.len());
        modes.as_rsync(&t, &name, &flags, &src, &oracle, &before);
        // (Else the comparison proves little.)
        assert!(!oracle.join("src/d1").exists() && !oracle.join("src/b.c").exists());
        assert!(!oracle.join("src/gone.txt").exists());
    }
}

#[test]
fn chmod_changes_modes_as_rsyncs_in_every_mode() {
    use std::os::unix::fs::PermissionsExt;
    let t = Scratch::new("chmod");
    let src = t.path("src");
    source(&src);
    for (p, mode) in [
        ("a.c", 0o600),
        ("d0/b.c", 0o755),
        ("d1", 0o700),
        ("core", 0o640),
    ] {
        std::fs::set_permissions(src.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    set_times(&src.join("d1"), 1_500_000_000, 0);
    // (Setgid bits are kept by a daemon that may set owners.)
    let modes = Modes::new(&t, &["--allow-owners"]);
    // The rules' modes are set (-p). Rules naming no one keep the umask's
    // bits (022 here); a second --chmod adds its rules to the first's.
    for (k, flags) in [
        &["-a", "--chmod=Dg+s,ug+rwX,Fo-rwx"][..],
        &["-a", "--chmod", "u=rwX,go=rX", "--chmod", "+w"],
    ]
    .into_iter()
    .enumerate()
    {
        let flags: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
        let oracle = t.path(&format!("oracle{k}"));
        rsync_into(&flags, &src, &oracle);
        for mode in ["local", "push", "pull", "remote shell"] {
            let into = t.path(&format!("into{k}-{}", mode.replace(' ', "-")));
            std::fs::create_dir_all(&into).unwrap();
            modes.run(mode, flags.clone(), &src, &into);
            assert_same(&format!("{mode} {flags:?}"), &oracle, &into);
            // Again: unchanged, nothing sent (the modes sent are the
            // rules', and the destination has them).
            let out = rcp(
                &[
                    &flags[..],
                    &[OsStr::new("--json"), src.as_os_str(), into.as_os_str()],
                ]
                .concat(),
                &modes.path,
            );
            let json = String::from_utf8_lossy(&out.stdout);
            assert!(json.contains("\"bytes\":0,"), "{mode} {flags:?}: {json}");
        }
    }
}

#[test]
fn existing_with_hard_links_does_what_rsync_does() {
    let t = Scratch::new("existing-links");
    let src = t.path("src");
    write(&src.join("h1"), b"new", 1_600_000_000);
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::hard_link(src.join("h1"), src.join("d/h2")).unwrap();
    set_times(&src.join("d"), 1_500_000_000, 0);
    set_times(&src, 1_500_000_000, 0);
    // Both names there, each its own file, with --existing
    // --ignore-existing: both stay as they are, not one linked to the
    // other. One name there with --existing: the other is not made, and
    // the copy fails for nothing.
    let both = |into: &Path| {
        write(&into.join("src/h1"), b"old h1", 1_500_000_000);
        write(&into.join("src/d/h2"), b"old h2", 1_500_000_000);
    };
    let one = |into: &Path| write(&into.join("src/d/h2"), b"old h2", 1_500_000_000);
    let (rsh, path) = fake_rsh(&t);
    for (k, (before, extra)) in [
        (
            &both as &dyn Fn(&Path),
            &["--existing", "--ignore-existing"][..],
        ),
        (&one, &["--existing", "--delete"]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut flags: Vec<&OsStr> = vec![OsStr::new("-aH")];
        flags.extend(extra.iter().map(OsStr::new));
        let oracle = t.path(&format!("oracle{k}"));
        before(&oracle);
        set_times(&oracle.join("src/d"), 1_500_000_000, 0);
        set_times(&oracle.join("src"), 1_500_000_000, 0);
        rsync_into(&flags, &src, &oracle);
        for how in ["local", "remote shell"] {
            let into = t.path(&format!("into{k}-{}", how.replace(' ', "-")));
            before(&into);
            set_times(&into.join("src/d"), 1_500_000_000, 0);
            set_times(&into.join("src"), 1_500_000_000, 0);
            let to = match how {
                "local" => format!("{}/", into.display()),
                _ => format!("localhost:{}/", into.display()),
            };
            let mut args = flags.clone();
            args.extend([
                OsStr::new("--rsh"),
                rsh.as_os_str(),
                src.as_os_str(),
                OsStr::new(&to),
            ]);
            rcp_ok(&args, &path);
            assert_same(&format!("{how} {extra:?}"), &oracle, &into);
        }
    }
    // Only a name other than the first (as rcp walks: `d/h2`) there, with
    // --existing: the copy fails for nothing, and --delete runs. rsync
    // makes that name the first and updates it; rcp, which sent nothing
    // for the first, leaves it as it was.
    let into = t.path("only-h1");
    write(&into.join("src/h1"), b"old h1", 1_500_000_000);
    write(&into.join("src/gone"), b"gone", 1_500_000_000);
    let args = [
        OsStr::new("-aH"),
        OsStr::new("--existing"),
        OsStr::new("--delete"),
    ];
    rcp_ok(
        &[
            &args[..],
            &[src.as_os_str(), OsStr::new(&format!("{}/", into.display()))],
        ]
        .concat(),
        &path,
    );
    assert_eq!(std::fs::read(into.join("src/h1")).unwrap(), b"old h1");
    assert!(!into.join("src/d").exists() && !into.join("src/gone").exists());
}

#[test]
fn max_delete_stops_where_rsync_stops_in_every_mode() {
    let t = Scratch::new("max-delete");
    let src = t.path("src");
    write(&src.join("keep"), b"kept", 1_600_000_000);
    set_times(&src, 1_500_000_000, 0);
    // Five files and a directory of two and a directory of one the
    // source does not have: three go (in rsync's order: a directory's
    // contents, the directory, then the files last name first), the rest
    // is counted as rsync counts it (not the directory kept non-empty).
    let stale = |into: &Path| {
        for name in ["a", "b", "c", "d", "e", "dd/p", "dd/q", "dd/sub/s"] {
            write(&into.join("src").join(name), name.as_bytes(), 1_500_000_000);
        }
        set_times(&into.join("src/dd"), 1_400_000_000, 0);
        set_times(&into.join("src"), 1_400_000_000, 0);
    };
    let oracle = t.path("oracle");
    stale(&oracle);
    let out = Command::new("rsync")
        .args(["-ai", "--delete", "--max-delete=3"])
        .arg(&src)
        .arg(format!("{}/", oracle.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(25), "rsync's status for it");
    let count = |stderr: &[u8]| -> String {
        let text = String::from_utf8_lossy(stderr);
        let at = text.find("--max-delete limit (").expect("the count");
        text[at..].split(')').next().unwrap().to_string()
    };
    let theirs_count = count(&out.stderr);
    let deleting = |out: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(out)
            .lines()
            .filter(|l| l.starts_with("*deleting"))
            .map(str::to_string)
            .collect()
    };
    let theirs = deleting(&out.stdout);
    assert_eq!(theirs.len(), 3, "{theirs:?}");
    let key = secret(&t, "key");
    let daemon = Daemon::start(&[t.dir()], &key);
    let (rsh, path) = fake_rsh(&t);
    for mode in ["local", "push", "pull", "remote shell"] {
        let into = t.path(&format!("into-{}", mode.replace(' ', "-")));
        stale(&into);
        let (from, to) = match mode {
            "local" => (s(&src).to_string(), format!("{}/", into.display())),
            "push" => (s(&src).to_string(), format!("{}/", daemon.url(&into))),
            "pull" => (daemon.url(&src), format!("{}/", into.display())),
            _ => (
                s(&src).to_string(),
                format!("localhost:{}/", into.display()),
            ),
        };
        let out = Command::new(RCP)
            .args([
                "-ai",
                "--delete",
                "--max-delete=3",
                "--secret-file",
                s(&key),
            ])
            .args(["--rsh", s(&rsh)])
            .arg(&from)
            .arg(&to)
            .env("PATH", &path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mode}: {stderr}");
        assert_eq!(count(&out.stderr), theirs_count, "{mode}: {stderr}");
        // (A daemon's receiver says it in its log.)
        assert!(
            mode == "push" || stderr.contains("cannot delete non-empty directory: src/dd"),
            "{mode}: {stderr}"
        );
        assert_eq!(deleting(&out.stdout), theirs, "{mode}: what went, in order");
        // (What went from inside `dd` dated it now, in each at its own
        // moment.)
        for root in [&oracle, &into] {
            set_times(&root.join("src/dd"), 1_400_000_000, 0);
        }
        assert_same(mode, &oracle, &into);
    }
}

#[test]
fn a_delete_run_whose_copy_fails_deletes_nothing() {
    let t = Scratch::new("delete-fails");
    let src = t.path("src");
    source(&src);
    let into = t.path("into");
    let outside = t.path("outside");
    stale(&into, &outside);
    // A read that fails at the source (a bad sector: the test hook), so
    // that one file cannot be copied. (A directory in the way of a file
    // was the obstacle once; `--delete` now clears it, as rsync's does.)
    let out = Command::new(RCP)
        .args(["-q", "--chunk-size", "64K", "-a", "--delete"])
        .arg(&src)
        .arg(&into)
        .env("RCP_TEST_FAIL_READ", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("Input/output error"), "{err}");
    for stale in ["gone.txt", "d0/gone.o", "old/deeper/file", "escape"] {
        assert!(
            std::fs::symlink_metadata(into.join("src").join(stale)).is_ok(),
            "{stale} was deleted by a copy that failed"
        );
    }
    // Once the source reads, the same command deletes them.
    let out = rcp(
        &[
            OsStr::new("-a"),
            OsStr::new("--delete"),
            src.as_os_str(),
            into.as_os_str(),
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::symlink_metadata(into.join("src/gone.txt")).is_err());
    assert!(std::fs::symlink_metadata(into.join("src/escape")).is_err());
}

/// Rule lists: each is (option, value) pairs in order.
fn rule_sets(rng: &mut SmallRng, exclude_from: &Path) -> Vec<Vec<(&'static str, String)>> {
    let ex = |p: &str| ("--exclude", p.to_string());
    let inc = |p: &str| ("--include", p.to_string());
    let mut sets = vec![
        vec![ex("*.o")],
        vec![ex("/src/d0")],
        vec![ex("d0")],
        vec![ex("cache/")],
        vec![ex("cache")],
        vec![ex("src/d1/cache")],
        vec![ex("/src/d1/**")],
        vec![ex("d0/***")],
        vec![ex("x?")],
        vec![ex("x*")],
        vec![ex("[a-b].*")],
        vec![ex("[!a-c]*")],
        vec![ex("\\]odd")],
        vec![ex("sp ace.o")],
        vec![ex("**/sub/*")],
        vec![ex("*ore")],
        vec![inc("*/"), inc("*.c"), ex("*")],
        vec![inc("a.o"), ex("*.o")],
        vec![ex("*.o"), inc("a.o")],
        vec![inc("/src/keep/***"), ex("/src/*")],
        vec![("--exclude-from", exclude_from.display().to_string())],
    ];
    // And random lists from a pool of patterns, in random order.
    let pool = [
        "*.c",
        "*.o",
        "core",
        "d0/",
        "d1",
        "/src/cache",
        "**/x*",
        "sub/",
        "[ax]*",
        "*.txt",
        "keep/***",
        "/src/d0/sub/*",
        "?.c",
        "**1",
    ];
    for _ in 0..15 {
        let n = rng.random_range(1..5);
        let set = (0..n)
            .map(|_| {
                let p = pool[rng.random_range(0..pool.len())];
                if rng.random_bool(0.3) { inc(p) } else { ex(p) }
            })
            .collect();
        sets.push(set);
    }
    sets
}

#[test]
fn filters_select_what_rsync_selects() {
    let t = Scratch::new("filters");
    let src = t.path("src");
    source(&src);
    let list = t.path("rules.list");
    std::fs::write(
        &list,
        "# a comment\n; another\n\n+ *.c\n+ */\n- /src/d1/**\n- *.o\nx22\n",
    )
    .unwrap();
    let mut rng = SmallRng::seed_from_u64(0xf117);
    let mut told_apart = 0;
    let everything = t.path("everything");
    std::fs::create_dir(&everything).unwrap();
    rsync_into(&[OsStr::new("-a")], &src, &everything);
    for (i, set) in rule_sets(&mut rng, &list).into_iter().enumerate() {
        let (ours, oracle) = (t.path(&format!("ours{i}")), t.path(&format!("rsync{i}")));
        std::fs::create_dir(&ours).unwrap();
        std::fs::create_dir(&oracle).unwrap();
        let mut flags: Vec<&OsStr> = vec![OsStr::new("-a")];
        for (opt, value) in &set {
            flags.extend([OsStr::new(opt), OsStr::new(value)]);
        }
        rsync_into(&flags, &src, &oracle);
        let mut args = flags.clone();
        args.extend([src.as_os_str(), ours.as_os_str()]);
        rcp_ok(&args, "");
        assert_same(&format!("rules {set:?}"), &oracle, &ours);
        told_apart += usize::from(!differences(&everything, &oracle).is_empty());
    }
    // Most rule sets leave something out (the comparisons are not of
    // whole copies only).
    assert!(
        told_apart >= 30,
        "only {told_apart} rule sets left anything out"
    );
}

#[test]
fn bad_rules_are_refused_clearly() {
    let t = Scratch::new("filters-bad");
    let src = t.path("src");
    write(&src.join("f"), b"x", 1_600_000_000);
    let dest = t.path("out");
    for (args, says) in [
        (vec!["--exclude", "a[bc"], "unclosed [ class"),
        (vec!["--exclude", ""], "empty pattern"),
        (
            vec!["--exclude-from", "/nonexistent/list"],
            "cannot read --exclude-from",
        ),
    ] {
        let mut a: Vec<&OsStr> = vec![OsStr::new("-r")];
        a.extend(args.iter().map(OsStr::new));
        a.extend([src.as_os_str(), dest.as_os_str()]);
        let out = rcp(&a, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
        assert!(!dest.exists(), "{args:?}: copied anyway");
    }
}

#[test]
fn files_from_sends_what_rsync_files_from_sends_in_every_mode() {
    let t = Scratch::new("files-from");
    let src = t.path("src");
    source(&src);
    std::os::unix::fs::symlink("a.c", src.join("d0/link")).unwrap();
    // (In the past: rsync leaves a time of the current second alone.)
    set_times(&src.join("d0/link"), 1_500_000_000, 0);
    set_times(&src.join("d0"), 1_500_000_000, 0);
    let list = t.path("list");
    // Out of order, repeated, with comments, a leading / and ./ inside,
    // directories listed and implied, a symlink.
    std::fs::write(
        &list,
        "d0/sub/b.c\n# a comment\n; another\n\nd1\n/keep/a.c\n./d0//link\ncache/\nd0/sub/b.c\nd0/sub/a.o\nnotes.txt\n",
    )
    .unwrap();
    let modes = Modes::new(&t, &[]);
    let files_from = format!("--files-from={}", list.display());
    let cases: [&[&str]; 3] = [&["-a"], &["-a", "-r"], &["-a", "-r", "--exclude", "*.o"]];
    for (n, flags) in cases.iter().enumerate() {
        let oracle = t.path(&format!("oracle-{n}"));
        let mut rsync = Command::new("rsync");
        rsync
            .args(*flags)
            .arg(&files_from)
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", oracle.display()));
        run(&mut rsync);
        // The implied directories are there, a listed one with its
        // contents only with -r (else the comparison proves little).
        assert!(oracle.join("d0/sub/b.c").is_file() && oracle.join("keep/a.c").is_file());
        assert!(
            std::fs::symlink_metadata(oracle.join("d0/link"))
                .unwrap()
                .is_symlink()
        );
        assert!(!oracle.join("d0/a.c").exists() && oracle.join("d1").is_dir());
        let recursive = flags.contains(&"-r");
        assert_eq!(oracle.join("d1/a.c").exists(), recursive, "{flags:?}");
        for mode in ["local", "push", "pull", "remote shell"] {
            let into = t.path(&format!("into-{n}-{}", mode.replace(' ', "-")));
            let mut args: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
            args.extend(["--files-from", s(&list)].map(OsStr::new));
            modes.run(mode, args, &src, &into);
            assert_same(&format!("{mode} {flags:?}"), &oracle, &into);
        }
    }
    // An empty list (comments only) in a pull: nothing to send, at once.
    let empty = t.path("empty-list");
    std::fs::write(&empty, "# nothing\n").unwrap();
    let into = t.path("into-empty");
    let started = std::time::Instant::now();
    let args = [
        "-a",
        "--files-from",
        s(&empty),
        "--secret-file",
        s(&modes.key),
    ]
    .map(OsStr::new);
    let mut args = args.to_vec();
    let from = modes.daemon.url(&src);
    args.extend([OsStr::new(&from), into.as_os_str()]);
    rcp_ok(&args, &modes.path);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(std::fs::read_dir(&into).unwrap().count(), 0);
    // The list from stdin, NUL-separated.
    let into = t.path("into-stdin");
    let mut child = Command::new(RCP)
        .args(["-q", "-a", "--from0", "--files-from", "-"])
        .arg(&src)
        .arg(&into)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"d0/sub/b.c\0keep/a.c\0")
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(into.join("d0/sub/b.c").is_file() && into.join("keep/a.c").is_file());
    assert!(!into.join("d1").exists());
}

#[test]
fn bad_lists_are_refused_clearly() {
    let t = Scratch::new("files-from-bad");
    let src = t.path("src");
    source(&src);
    let path = std::env::var("PATH").unwrap();
    for (text, says) in [
        ("d0/../../etc/passwd\n", "has a .. component"),
        ("./\n", "names the source directory itself"),
        ("d0/./a.c\n", "marker is not supported"),
    ] {
        let list = t.path("list");
        std::fs::write(&list, text).unwrap();
        let into = t.path("into");
        let out = rcp(
            &[
                OsStr::new("-a"),
                OsStr::new("--files-from"),
                list.as_os_str(),
                src.as_os_str(),
                into.as_os_str(),
            ],
            &path,
        );
        assert_eq!(out.status.code(), Some(2), "{text:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{text:?}: {err}");
        assert!(!into.exists(), "{text:?}: the destination was made");
    }
    // A listed name that is not there: the copy fails, saying which.
    std::fs::write(t.path("list"), "d0/a.c\nno-such-file\n").unwrap();
    let out = rcp(
        &[
            OsStr::new("-a"),
            OsStr::new("--files-from"),
            t.path("list").as_os_str(),
            src.as_os_str(),
            t.path("into").as_os_str(),
        ],
        &path,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-file"), "{err}");
    // Several sources are a usage error.
    let list = t.path("list");
    let into = t.path("into2");
    let args = [
        OsStr::new("-a"),
        OsStr::new("--files-from"),
        list.as_os_str(),
        src.as_os_str(),
        src.as_os_str(),
        into.as_os_str(),
    ];
    let out = rcp(&args, &path);
    assert_ne!(out.status.code(), Some(0), "several sources");
    assert!(!into.exists(), "several sources: the destination was made");
}
