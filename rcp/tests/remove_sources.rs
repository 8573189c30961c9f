//! `--remove-source-files` against the oracle: after `rcp -aHAX
//! --remove-source-files` and `rsync -aHAX --remove-source-files` on the
//! same generated tree (every kind of entry, hard-link groups, xattrs,
//! ACLs), the same entries are left in the two sources (directories, and
//! nothing else) and the two destinations are the same, locally, pushed
//! and pulled through a remote shell; and in a re-sync, where files found
//! unchanged go too. What rcp keeps that rsync would also keep: a file
//! `--ignore-existing` left alone. What rcp keeps beyond: a file that
//! failed, everything after a dry run. A daemon and a broadcast refuse the
//! flag.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_support::{Scratch, pattern};

mod common;
use common::trees::{assert_same, generate, rsync_available, run};
use common::{Daemon, RCP, fake_rsh, s, secret};

/// Every entry beneath `root`, by path, with its type.
fn left_in(root: &Path) -> BTreeSet<(PathBuf, String)> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let kind = e.file_type().unwrap();
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            if kind.is_dir() {
                stack.push(e.path());
            }
            let kind = if kind.is_dir() {
                "dir"
            } else if kind.is_file() {
                "file"
            } else if kind.is_symlink() {
                "symlink"
            } else {
                "special"
            };
            out.insert((rel, kind.to_string()));
        }
    }
    out
}

/// rcp with `args`, `from` into `to`, through the fake remote shell.
fn rcp(args: &[&str], from: &str, to: &str, rsh: &Path, path: &str) -> Output {
    Command::new(RCP)
        .args(args)
        .args(["--rsh", s(rsh)])
        .arg(from)
        .arg(to)
        .env("PATH", path)
        .output()
        .unwrap()
}

/// The operands for rcp in `how` ("local", "pushed", "pulled"): `src`
/// into the directory `dest` (as `dest/src`).
fn operands(how: &str, src: &Path, dest: &Path) -> (String, String) {
    match how {
        "local" => (s(src).into(), format!("{}/", dest.display())),
        "pushed" => (s(src).into(), format!("localhost:{}/", dest.display())),
        _ => (
            format!("localhost:{}", src.display()),
            format!("{}/", dest.display()),
        ),
    }
}

fn rsync_removing(extra: &[&str], src: &Path, dest: &Path) {
    run(Command::new("rsync")
        .args(["-aHAX", "--remove-source-files"])
        .args(extra)
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", dest.display())));
}

#[test]
fn what_is_removed_from_the_source_is_what_rsync_removes_in_every_mode() {
    if !rsync_available() {
        eprintln!("rsync is not installed: skipped");
        return;
    }
    let t = Scratch::new("rcp-remove-sources");
    let (rsh, path) = fake_rsh(&t);
    for (k, how) in ["local", "pushed", "pulled"].into_iter().enumerate() {
        for resync in [false, true] {
            let seed = 40 + k as u64 * 2 + u64::from(resync);
            let case = format!("{how}, {}", if resync { "re-sync" } else { "fresh" });
            // (Short names: the tree holds sockets, whose paths are short.)
            let src = t.path(&format!("s{seed}"));
            let oracle_src = t.path(&format!("o{seed}"));
            let made = generate(&src, seed);
            generate(&oracle_src, seed);
            assert!(made.files > 0 && made.link_groups > 0, "{case}: {made:?}");
            let dest = t.path(&format!("d{seed}"));
            let oracle = t.path(&format!("r{seed}"));
            std::fs::create_dir_all(&dest).unwrap();
            if resync {
                // The destinations hold the tree already, but for one
                // file changed since at the source: the rest is found
                // unchanged, and goes from the source too.
                common::trees::rsync_copy(&src, &dest.join(src.file_name().unwrap()));
                common::trees::rsync_copy(&oracle_src, &oracle);
                for root in [&src, &oracle_src] {
                    std::fs::write(root.join("changed-since"), b"new").unwrap();
                    common::trees::set_times(&root.join("changed-since"), 1_700_000_000, 7);
                }
            }
            let (from, to) = operands(how, &src, &dest);
            let out = rcp(&["-aHAX", "--remove-source-files"], &from, &to, &rsh, &path);
            assert!(
                out.status.success(),
                "{case}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            rsync_removing(&[], &oracle_src, &oracle);
            let (left, oracle_left) = (left_in(&src), left_in(&oracle_src));
            assert_eq!(left, oracle_left, "{case}: what is left in the source");
            assert!(
                left.iter().all(|(_, kind)| kind == "dir"),
                "{case}: only directories are left: {left:?}"
            );
            assert_same(&case, &dest.join(src.file_name().unwrap()), &oracle);
        }
    }
}

#[test]
fn what_ignore_existing_leaves_alone_and_what_failed_stay_in_the_source() {
    if !rsync_available() {
        eprintln!("rsync is not installed: skipped");
        return;
    }
    let t = Scratch::new("rcp-remove-kept");
    let (rsh, path) = fake_rsh(&t);
    // --ignore-existing: `a` is there with other contents, so it stays at
    // both ends, as with rsync; `b` is new, and goes from the source.
    for how in ["local", "pushed", "pulled"] {
        let src = t.path(&format!("src-{how}"));
        let oracle_src = t.path(&format!("oracle-src-{how}"));
        let dest = t.path(&format!("dest-{how}"));
        let oracle = t.path(&format!("oracle-{how}"));
        for (root, there) in [
            (&src, dest.join(format!("src-{how}"))),
            (&oracle_src, oracle.clone()),
        ] {
            std::fs::create_dir_all(root).unwrap();
            std::fs::write(root.join("a"), b"a at the source").unwrap();
            std::fs::write(root.join("b"), b"b").unwrap();
            std::fs::create_dir_all(&there).unwrap();
            std::fs::write(there.join("a"), b"a there").unwrap();
        }
        let (from, to) = operands(how, &src, &dest);
        let args = ["-a", "--ignore-existing", "--remove-source-files"];
        let out = rcp(&args, &from, &to, &rsh, &path);
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        rsync_removing(&["--ignore-existing"], &oracle_src, &oracle);
        assert_eq!(left_in(&src), left_in(&oracle_src), "{how}");
        assert_eq!(std::fs::read(src.join("a")).unwrap(), b"a at the source");
        assert!(!src.join("b").exists(), "{how}: b went");
    }

    // A file whose read fails part way (the test hook fails the sixth
    // chunk read, the second of `f1`) stays in the source; the others go.
    // And a dry run removes nothing.
    for how in ["local", "pushed", "pulled"] {
        let src = t.path(&format!("failing-{how}"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("f0"), pattern(5 * 65536, 10)).unwrap();
        std::fs::write(src.join("f1"), pattern(4 * 65536 + 7, 11)).unwrap();
        std::fs::write(src.join("f2"), pattern(3 * 65536, 12)).unwrap();
        let dest = t.path(&format!("failing-dest-{how}"));
        std::fs::create_dir_all(&dest).unwrap();
        let (from, to) = operands(how, &src, &dest);
        let dry = rcp(
            &["-r", "-n", "--remove-source-files"],
            &from,
            &to,
            &rsh,
            &path,
        );
        assert!(
            dry.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&dry.stderr)
        );
        assert_eq!(left_in(&src).len(), 3, "{how}: a dry run removes nothing");
        let out = Command::new(RCP)
            .args(["-r", "--chunk-size", "64K", "--remove-source-files"])
            .args(["--rsh", s(&rsh)])
            .arg(&from)
            .arg(&to)
            .env("PATH", &path)
            .env("RCP_TEST_FAIL_READ", "6")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{how}: {stderr}");
        let left: Vec<_> = left_in(&src).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            left,
            [PathBuf::from("f1")],
            "{how}: only f1 stays: {stderr}"
        );
        let copied = dest.join(src.file_name().unwrap());
        assert_eq!(
            std::fs::read(copied.join("f2")).unwrap(),
            pattern(3 * 65536, 12),
            "{how}"
        );
        assert!(!copied.join("f1").exists(), "{how}: nothing of f1 there");
    }
}

#[test]
fn a_file_that_arrives_corrupted_stays_with_its_other_names_and_nothing_is_linked_to_it() {
    let t = Scratch::new("rcp-remove-corrupt");
    let (rsh, path) = fake_rsh(&t);
    for how in ["local", "pushed", "pulled"] {
        let src = t.path(&format!("src-{how}"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("f1"), pattern(3 * 65536, 21)).unwrap();
        std::fs::hard_link(src.join("f1"), src.join("g1")).unwrap();
        std::fs::write(src.join("small"), b"small").unwrap();
        let dest = t.path(&format!("dest-{how}"));
        let copied = dest.join(src.file_name().unwrap());
        std::fs::create_dir_all(&copied).unwrap();
        std::fs::write(copied.join("f1"), b"f1 from before").unwrap();
        let (from, to) = operands(how, &src, &dest);
        // (The second chunk sent, f1's, is damaged on its way.)
        let out = Command::new(RCP)
            .args(["-rH", "--chunk-size", "64K", "--remove-source-files"])
            .args(["--rsh", s(&rsh)])
            .arg(&from)
            .arg(&to)
            .env("PATH", &path)
            .env("RCP_TEST_CORRUPT_CHUNK", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{how}: {stderr}");
        let left: Vec<_> = left_in(&src).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            left,
            [PathBuf::from("f1"), PathBuf::from("g1")],
            "{how}: both names stay: {stderr}"
        );
        assert_eq!(std::fs::read(copied.join("f1")).unwrap(), b"f1 from before");
        assert!(
            !copied.join("g1").exists(),
            "{how}: the other name is not linked to f1 from before"
        );
    }
}

#[test]
fn a_daemon_and_a_broadcast_refuse_to_remove_sources() {
    let t = Scratch::new("rcp-remove-refused");
    let root = t.path("root");
    std::fs::create_dir_all(root.join("served")).unwrap();
    std::fs::write(root.join("served/f"), b"kept").unwrap();
    let key = secret(&t, "secret");
    let daemon = Daemon::start(&[&root], &key);
    let dest = t.path("dest");
    let out = Command::new(RCP)
        .args(["-r", "--remove-source-files", "--secret-file", s(&key)])
        .arg(daemon.url(&root.join("served")))
        .arg(&dest)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "refused: {stderr}");
    assert!(stderr.contains("removes nothing it serves"), "{stderr}");
    assert_eq!(std::fs::read(root.join("served/f")).unwrap(), b"kept");

    let out = Command::new(RCP)
        .args(["--remove-source-files", s(&root.join("served/f"))])
        .arg("node[1-2]:/tmp/")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "usage: {stderr}");
    assert!(
        stderr.contains("not supported with a broadcast"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(root.join("served/f")).unwrap(), b"kept");

    // A copy onto the source itself (each file would be found unchanged,
    // then removed: the only copy), or into it; and two sources arriving
    // under one name (which of them an entry came from cannot be told).
    let served = root.join("served");
    std::fs::create_dir_all(t.path("other")).unwrap();
    std::fs::write(t.path("other/f"), b"other f").unwrap();
    let (f, other_f, inside) = (served.join("f"), t.path("other/f"), served.join("inside"));
    for (args, what) in [
        (vec![&served, &root], "would be copied onto or into itself"),
        (vec![&served, &inside], "onto or into itself"),
        (vec![&f, &served], "onto or into itself"),
        (vec![&f, &other_f, &dest], "two sources arrive as \"f\""),
    ] {
        let out = Command::new(RCP)
            .args(["-r", "--remove-source-files"])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(what), "{args:?}: {stderr}");
        assert_eq!(std::fs::read(&f).unwrap(), b"kept");
        assert_eq!(std::fs::read(&other_f).unwrap(), b"other f");
    }
}
