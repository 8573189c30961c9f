//! Incremental re-sync against the oracle: a second run on an unchanged
//! tree sends no data (in every mode), a run after some files changed
//! sends exactly those, `--checksum` sends only the chunks that changed,
//! and `--ignore-existing`, `-u`, `--size-only`, `-I` and `-c` leave the
//! destination as rsync with the same flag leaves its own.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use test_support::{Scratch, pattern};

mod common;
use common::trees::*;
use common::{Daemon, RCP, fake_rsh, s, secret};

/// What one rcp run said in `--json`.
#[derive(Debug)]
struct Sent {
    files: u64,
    skipped: u64,
    bytes: u64,
}

fn rcp_json(args: &[&OsStr], env_path: Option<&str>) -> Sent {
    let path: Vec<(&str, &str)> = env_path.map(|p| ("PATH", p)).into_iter().collect();
    rcp_said(args, &path).0
}

/// One rcp run with `env` set: what it sent (`--json`), and what it said
/// on stderr.
fn rcp_said(args: &[&OsStr], env: &[(&str, &str)]) -> (Sent, String) {
    let mut cmd = Command::new(RCP);
    cmd.args(["--json", "--chunk-size", "64K"])
        .args(args)
        .envs(env.iter().copied());
    let out = cmd.output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{cmd:?} failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    let sent = Sent {
        files: n("files"),
        skipped: n("skipped"),
        bytes: n("bytes"),
    };
    (sent, stderr)
}

/// rsync's run with `flags` from `src` into the directory `into`.
fn rsync_into(flags: &[&str], src: &Path, into: &Path) {
    let out = Command::new("rsync")
        .args(flags)
        .arg(src)
        .arg(format!("{}/", into.display()))
        .output()
        .expect("rsync runs");
    assert!(
        out.status.success(),
        "rsync failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A plain tree of `n` files (sizes around the chunk size, some empty)
/// in a few directories, times in the past: returns the files.
fn plain_tree(root: &Path, n: usize, seed: u64) -> Vec<PathBuf> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let dirs: Vec<PathBuf> = (0..5).map(|d| root.join(format!("d{d}"))).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut files = Vec::new();
    for i in 0..n {
        let p = dirs[rng.random_range(0..dirs.len())].join(format!("f{i}"));
        let len = match rng.random_range(0..4) {
            0 => 0,
            1 => rng.random_range(1..100),
            2 => CHUNK * rng.random_range(1..3),
            _ => rng.random_range(1..3 * CHUNK),
        };
        std::fs::write(&p, pattern(len, rng.random())).unwrap();
        set_times(&p, 1_600_000_000 + i as i64, 5000);
        files.push(p);
    }
    for d in &dirs {
        set_times(d, 1_500_000_000, 1);
    }
    set_times(root, 1_500_000_000, 2);
    files
}

/// Every entry's status-change time beneath `root`, by path.
fn ctimes(root: &Path) -> std::collections::BTreeMap<PathBuf, (i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|d| d.unwrap().path()));
        }
        out.insert(p, (m.ctime(), m.ctime_nsec()));
    }
    assert!(out.len() > 10, "{out:?}");
    out
}

#[test]
fn an_unchanged_tree_sends_nothing_the_second_time_in_every_mode() {
    let t = Scratch::new("resync-modes");
    let src = t.path("src");
    let made = generate(&src, 0x2e5c);
    assert!(made.files >= 10, "{made:?}");
    let key = secret(&t, "key");
    let daemon = Daemon::start_with(&[t.dir()], &key, &["--allow-owners"]);
    let (rsh, path) = fake_rsh(&t);
    let oracle = t.path("oracle");
    std::fs::create_dir(&oracle).unwrap();
    rsync_into(&["-aHAX"], &src, &oracle);

    let secret_args = [OsStr::new("--secret-file"), key.as_os_str()];
    for mode in ["local", "push", "pull", "remote shell"] {
        let into = t.path(&format!("into-{}", mode.replace(' ', "-")));
        std::fs::create_dir(&into).unwrap();
        let (from, to, extra): (String, String, Vec<&OsStr>) = match mode {
            "local" => (s(&src).into(), s(&into).into(), vec![]),
            "push" => (s(&src).into(), daemon.url(&into), secret_args.to_vec()),
            "pull" => (daemon.url(&src), s(&into).into(), secret_args.to_vec()),
            _ => (
                s(&src).into(),
                format!("localhost:{}", into.display()),
                vec![
                    OsStr::new("--streams"),
                    OsStr::new("2"),
                    OsStr::new("--rsh"),
                    rsh.as_os_str(),
                ],
            ),
        };
        let run = || {
            let mut args: Vec<&OsStr> = vec![OsStr::new("-aHAX")];
            args.extend(&extra);
            args.push(OsStr::new(&from));
            args.push(OsStr::new(&to));
            rcp_json(&args, Some(&path))
        };
        let first = run();
        assert!(first.bytes > 0 && first.skipped == 0, "{mode}: {first:?}");
        assert_same(mode, &oracle, &into);
        let before = ctimes(&into);
        let again = run();
        assert_eq!(
            (again.bytes, again.skipped),
            (0, again.files),
            "{mode}: the second run sent data: {again:?}"
        );
        // Nothing was made again or changed (a rename, chmod, chown or
        // attribute set changes a ctime): symlinks, special files and
        // directories are left as they are too.
        let after = ctimes(&into);
        let changed: Vec<_> = before
            .iter()
            .filter(|(p, t)| after.get(*p) != Some(t))
            .map(|(p, _)| p)
            .collect();
        assert!(changed.is_empty(), "{mode}: touched again: {changed:?}");
        assert_eq!(again.files, first.files, "{mode}");
        assert_same(&format!("{mode}, again"), &oracle, &into);
    }
}

#[test]
fn after_ten_files_change_exactly_those_are_sent() {
    let t = Scratch::new("resync-ten");
    let src = t.path("src");
    let files = plain_tree(&src, 120, 7);
    let (ours, oracle) = (t.path("ours"), t.path("oracle"));
    for d in [&ours, &oracle] {
        std::fs::create_dir(d).unwrap();
    }
    let copy = || rcp_json(&[OsStr::new("-a"), src.as_os_str(), ours.as_os_str()], None);
    assert_eq!(copy().skipped, 0);
    rsync_into(&["-a"], &src, &oracle);

    // Ten files change: new contents (some of another size), new times.
    let mut rng = SmallRng::seed_from_u64(99);
    let mut changed = Vec::new();
    while changed.len() < 10 {
        let p = &files[rng.random_range(0..files.len())];
        if changed.contains(p) {
            continue;
        }
        let len = if changed.len() % 2 == 0 {
            std::fs::metadata(p).unwrap().len() as usize
        } else {
            rng.random_range(1..2 * CHUNK)
        };
        std::fs::write(p, pattern(len, rng.random())).unwrap();
        set_times(p, 1_700_000_000, changed.len() as i64);
        changed.push(p.clone());
    }
    // And three only in their metadata: sent no data, brought up to date.
    for p in files.iter().filter(|p| !changed.contains(p)).take(3) {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let bytes: u64 = changed
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let again = copy();
    assert_eq!(
        (again.files, again.skipped, again.bytes),
        (120, 110, bytes),
        "exactly the ten changed files are sent"
    );
    rsync_into(&["-a"], &src, &oracle);
    assert_same("after ten changes", &oracle, &ours);
    // The comparison sees a mode left behind (it can fail).
    let one = ours.join("src").join(files[0].strip_prefix(&src).unwrap());
    let mode = std::fs::metadata(&one).unwrap();
    std::fs::set_permissions(
        &one,
        std::os::unix::fs::PermissionsExt::from_mode(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) ^ 0o004,
        ),
    )
    .unwrap();
    assert_eq!(differences(&oracle, &ours).len(), 1);
}

#[test]
fn checksum_sends_only_the_chunks_that_changed() {
    let t = Scratch::new("resync-checksum");
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    let big = src.join("big");
    let data = pattern(20 * CHUNK + 123, 5);
    std::fs::write(&big, &data).unwrap();
    set_times(&big, 1_600_000_000, 77);
    let into = t.path("into");
    std::fs::create_dir(&into).unwrap();
    let run = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec![OsStr::new("-a")];
        args.extend(extra.iter().map(OsStr::new));
        args.extend([src.as_os_str(), into.as_os_str()]);
        rcp_json(&args, None)
    };
    let copied = into.join("src/big");
    assert_eq!(run(&[]).bytes, data.len() as u64);
    // Two bytes in two chunks change; size and time stay.
    let mut changed = data.clone();
    changed[3 * CHUNK + 10] ^= 0xff;
    changed[17 * CHUNK] ^= 0xff;
    std::fs::write(&big, &changed).unwrap();
    set_times(&big, 1_600_000_000, 77);
    // The quick check cannot see it (as rsync's cannot).
    assert_eq!(run(&[]).bytes, 0);
    assert_eq!(std::fs::read(&copied).unwrap(), data);
    let c = run(&["-c"]);
    assert_eq!((c.bytes, c.skipped), (2 * CHUNK as u64, 0), "{c:?}");
    assert_eq!(std::fs::read(&copied).unwrap(), changed);
    // Equal contents: nothing sent, the file left as it is.
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&copied).unwrap());
    let c = run(&["-c"]);
    assert_eq!((c.bytes, c.skipped), (0, 1), "{c:?}");
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&copied).unwrap()),
        ino,
        "an unchanged file is not replaced"
    );
    // A file that grew: its equal chunks stay, the rest is sent.
    let mut grown = changed.clone();
    grown.extend(pattern(CHUNK, 6));
    std::fs::write(&big, &grown).unwrap();
    let c = run(&["-c"]);
    assert_eq!(c.bytes, (grown.len() - 20 * CHUNK) as u64, "{c:?}");
    assert_eq!(std::fs::read(&copied).unwrap(), grown);
    // A file that shrank: every chunk it has left is there already.
    let shrunk = &grown[..5 * CHUNK + 7];
    std::fs::write(&big, shrunk).unwrap();
    let c = run(&["-c"]);
    assert_eq!(c.bytes, 0, "{c:?}");
    assert_eq!(std::fs::read(&copied).unwrap(), shrunk);
    // And one whose short last chunk changed.
    let mut last = shrunk.to_vec();
    last[5 * CHUNK + 6] ^= 1;
    std::fs::write(&big, &last).unwrap();
    let c = run(&["-c"]);
    assert_eq!(c.bytes, 7, "{c:?}");
    assert_eq!(std::fs::read(&copied).unwrap(), last);
}

#[test]
fn skipping_flags_leave_what_rsync_leaves() {
    let t = Scratch::new("resync-flags");
    // Source and an older copy of it, made alike for rcp and rsync.
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    let put = |dir: &Path, name: &str, data: &[u8], sec: i64| {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        set_times(&p, sec, 0);
    };
    let base = 1_600_000_000;
    put(&src, "newer-here", b"source, newer", base + 100);
    put(&src, "newer-there", b"source, older", base);
    put(&src, "same-size-other-time", b"1234", base);
    put(&src, "same-size-and-time", b"abcd", base);
    put(&src, "other-size", b"longer than there", base);
    put(&src, "missing-there", b"new", base);
    set_times(&src, base, 0);
    let old = |into: &Path| {
        let d = into.join("src");
        std::fs::create_dir_all(&d).unwrap();
        put(&d, "newer-here", b"there, older", base);
        put(&d, "newer-there", b"there, newer", base + 100);
        put(&d, "same-size-other-time", b"5678", base + 5);
        put(&d, "same-size-and-time", b"wxyz", base);
        put(&d, "other-size", b"short", base);
        set_times(&d, base, 0);
    };
    for flags in [
        vec![],
        vec!["--ignore-existing"],
        vec!["-u"],
        vec!["--size-only"],
        vec!["-I"],
        vec!["-c"],
        vec!["-u", "--size-only"],
    ] {
        let shown = format!("{flags:?}");
        let (ours, oracle) = (
            t.path(&format!("ours{shown}")),
            t.path(&format!("rsync{shown}")),
        );
        old(&ours);
        old(&oracle);
        let mut rsync_flags = vec!["-a"];
        rsync_flags.extend(&flags);
        rsync_into(&rsync_flags, &src, &oracle);
        let mut args: Vec<&OsStr> = vec![OsStr::new("-a")];
        args.extend(flags.iter().map(OsStr::new));
        args.extend([src.as_os_str(), ours.as_os_str()]);
        rcp_json(&args, None);
        assert_same(&shown, &oracle, &ours);
    }
    // The comparison tells the flags apart (it can fail).
    let (plain, ignoring) = (t.path("rsync[]"), t.path("rsync[\"-I\"]"));
    assert!(!differences(&plain, &ignoring).is_empty());
    assert!(
        differences(&plain, &ignoring)
            .iter()
            .any(|d| d.contains("same-size-and-time")),
        "-I rewrites what the quick check skips"
    );
}

#[test]
fn a_modify_window_leaves_what_rsyncs_leaves_in_every_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let t = Scratch::new("resync-window");
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    let put = |dir: &Path, name: &str, data: &[u8], (sec, nsec): (i64, i64)| {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        set_times(&p, sec, nsec);
    };
    let base = 1_600_000_000;
    // Each file there has the source's size and other contents, so that
    // which were sent shows in the trees; only its time differs.
    let there = [
        ("nanoseconds-apart", (base, 900)),
        ("one-second-later", (base + 1, 0)),
        ("one-second-earlier", (base - 1, 999_999_999)),
        ("two-seconds-later", (base + 2, 500)),
        ("same-time", (base, 500)),
    ];
    for (name, _) in there {
        put(&src, name, b"source", (base, 500));
    }
    put(&src, "other-size", b"source, longer", (base, 500));
    put(&src, "mode-and-time-within", b"source", (base, 500));
    set_times(&src, base, 0);
    let old = |into: &Path| {
        let d = into.join("src");
        std::fs::create_dir_all(&d).unwrap();
        for (name, time) in there {
            put(&d, name, b"there!", time);
        }
        put(&d, "other-size", b"short", (base + 1, 0));
        // (Within a second, and another mode: with -@1 the mode is set
        // and the time left as it is.)
        let other_mode = d.join("mode-and-time-within");
        put(&d, "mode-and-time-within", b"there!", (base + 1, 0));
        std::fs::set_permissions(&other_mode, std::fs::Permissions::from_mode(0o600)).unwrap();
        set_times(&d, base, 0);
    };
    let modes = Modes::start(&t);
    // rcp's default is to the nanosecond: rsync's negative window.
    let cases: [(&[&str], &[&str]); 6] = [
        (&[], &["--modify-window=-1"]),
        (&["--modify-window", "0"], &[]),
        (&["-@", "1"], &["--modify-window=1"]),
        (&["--modify-window=-1"], &["--modify-window=-1"]),
        (&["-u", "--modify-window=0"], &["-u"]),
        (&["-u", "-@1"], &["-u", "--modify-window=1"]),
    ];
    let oracle_of = |rsync_flags: &[&str]| t.path(&format!("rsync{rsync_flags:?}"));
    for (ours_flags, rsync_flags) in cases {
        let oracle = oracle_of(rsync_flags);
        old(&oracle);
        let mut flags = vec!["-a"];
        flags.extend(rsync_flags);
        rsync_into(&flags, &src, &oracle);
        let mut args = vec!["-a"];
        args.extend(ours_flags);
        for mode in ["local", "push", "pull", "remote shell"] {
            let into = t.path(&format!("ours{ours_flags:?}-{}", mode.replace(' ', "-")));
            old(&into);
            modes.copy(mode, &args, &src, &into);
            assert_same(&format!("{ours_flags:?}, {mode}"), &oracle, &into);
        }
    }
    // The oracles tell the windows apart (the comparison can fail): to
    // the nanosecond all but one file is sent; in whole seconds the one
    // nanoseconds apart is not; within a second, four are not.
    let sent_by = |rsync_flags: &[&str]| {
        let mut sent: Vec<String> = std::fs::read_dir(oracle_of(rsync_flags).join("src"))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| std::fs::read(e.path()).unwrap().starts_with(b"source"))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        sent.sort();
        sent
    };
    let exact = sent_by(&["--modify-window=-1"]);
    assert_eq!(exact.len(), 6, "{exact:?}");
    assert!(!exact.contains(&"same-time".to_string()));
    let seconds = sent_by(&[]);
    assert_eq!(
        seconds,
        [
            "mode-and-time-within",
            "one-second-earlier",
            "one-second-later",
            "other-size",
            "two-seconds-later"
        ]
    );
    assert_eq!(
        sent_by(&["--modify-window=1"]),
        ["other-size", "two-seconds-later"]
    );
    // -u in whole seconds: a file a second later or more there is newer
    // there, and left; one later by nanoseconds is not, and the quick
    // check skips it.
    assert_eq!(sent_by(&["-u"]), ["one-second-earlier"]);
    // -u within a second: a file there not a second older is newer there
    // (rsync's rule), so nothing is sent.
    assert!(sent_by(&["-u", "--modify-window=1"]).is_empty());
    // And -@1 set the mode of the file it left, not its time.
    let left = oracle_of(&["--modify-window=1"]).join("src/mode-and-time-within");
    let m = std::fs::metadata(&left).unwrap();
    assert_eq!((m.mode() & 0o777, m.mtime()), (0o644, base + 1));
}

#[test]
fn dry_run_and_itemize_say_what_rsync_says_and_change_nothing() {
    let t = Scratch::new("resync-itemize");
    let src = t.path("src");
    let files = plain_tree(&src, 40, 11);
    let modes = ["local", "push", "pull", "remote shell"];
    let ours: Vec<PathBuf> = modes
        .iter()
        .map(|m| t.path(&format!("ours-{}", m.replace(' ', "-"))))
        .collect();
    let theirs = t.path("theirs");
    for d in ours.iter().chain([&theirs]) {
        std::fs::create_dir(d).unwrap();
        rsync_into(&["-a"], &src, d);
    }
    // Changes of every kind: contents and time, mode only, a new file, a
    // new directory, and an extraneous file for --delete.
    std::fs::write(&files[0], b"new contents").unwrap();
    set_times(&files[0], 1_650_000_000, 0);
    std::fs::set_permissions(
        &files[1],
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(src.join("d0/brand-new"), b"x").unwrap();
    set_times(&src.join("d0/brand-new"), 1_650_000_000, 0);
    std::fs::create_dir(src.join("fresh-dir")).unwrap();
    set_times(&src.join("fresh-dir"), 1_650_000_000, 0);
    for d in ours.iter().chain([&theirs]) {
        std::fs::write(d.join("src/d1/extra"), b"x").unwrap();
        set_times(&d.join("src/d1/extra"), 1_650_000_000, 0);
        // An extraneous directory with contents: rsync names each entry
        // it removes, a directory's contents first, a directory with a
        // `/` after it.
        std::fs::create_dir_all(d.join("src/d1/extra-dir/sub")).unwrap();
        std::fs::write(d.join("src/d1/extra-dir/sub/y"), b"y").unwrap();
        std::fs::write(d.join("src/d1/extra-dir/x"), b"x").unwrap();
        for p in [
            "extra-dir/sub/y",
            "extra-dir/x",
            "extra-dir/sub",
            "extra-dir",
        ] {
            set_times(&d.join("src/d1").join(p), 1_650_000_000, 0);
        }
        // (In the past: rsync leaves a time of the current second alone.)
        set_times(&d.join("src/d1"), 1_500_000_000, 0);
    }
    let before = t.path("before");
    std::fs::create_dir(&before).unwrap();
    rsync_into(&["-a"], &theirs, &before);
    let before = before.join("theirs");

    let rsync_lines = Command::new("rsync")
        .args(["-ain", "--delete"])
        .arg(&src)
        .arg(format!("{}/", theirs.display()))
        .output()
        .unwrap();
    // rsync leaves out a directory whose time differs when its contents
    // change too; rcp names it (`.d..t......`): those lines aside, the
    // same lines.
    let lines = |out: &[u8]| {
        let mut l: Vec<String> = String::from_utf8_lossy(out)
            .lines()
            .filter(|l| !l.starts_with(".d"))
            .map(str::to_string)
            .collect();
        l.sort();
        l
    };
    let rsyncs = lines(&rsync_lines.stdout);
    for want in [
        ">f.st",
        ".f...p",
        ">f+++++++++",
        "cd+++++++++",
        "*deleting   src/d1/extra-dir/sub/y",
        "*deleting   src/d1/extra-dir/sub/",
    ] {
        assert!(
            rsyncs.iter().any(|l| l.starts_with(want)),
            "the oracle has no {want} line: {rsyncs:?}"
        );
    }

    let modes_here = Modes::start(&t);
    for (mode, ours) in modes.iter().zip(&ours) {
        // In every mode the lines are printed where the user typed rcp,
        // whichever side compares.
        let out = modes_here.copy(mode, &["-ain", "--delete"], &src, ours);
        assert_eq!(lines(&out.stdout), rsyncs, "{mode}");
        // Nothing changed, nothing was sent.
        assert_same(&format!("{mode}, after -n"), &before, ours);
    }
    // `-v` names what `-i` codes, as rsync's `-v` does: what is sent,
    // made or removed, not a change of attributes alone.
    let rsync_names = Command::new("rsync")
        .args(["-avn", "--delete"])
        .arg(&src)
        .arg(format!("{}/", theirs.display()))
        .output()
        .unwrap();
    // (Directories aside, made or changed, as for `-i`: rcp names one
    // whose time differs when its contents change too.)
    let names = |out: &[u8]| {
        let mut l: Vec<String> = String::from_utf8_lossy(out)
            .lines()
            .filter(|l| {
                !l.is_empty()
                    && !l.starts_with("sending incremental file list")
                    && !l.starts_with("sent ")
                    && !l.starts_with("total size is")
                    && (l.starts_with("deleting ") || !l.ends_with('/'))
            })
            .map(str::to_string)
            .collect();
        l.sort();
        l
    };
    let rsync_names = names(&rsync_names.stdout);
    let mode_only = files[1]
        .strip_prefix(src.parent().unwrap())
        .unwrap()
        .display()
        .to_string();
    assert!(
        rsync_names
            .iter()
            .any(|l| l.starts_with("deleting src/d1/extra-dir/"))
            && rsync_names.iter().any(|l| l.ends_with("brand-new"))
            && !rsync_names.contains(&mode_only),
        "the oracle: {rsync_names:?}"
    );
    for (mode, ours) in modes.iter().zip(&ours) {
        let out = modes_here.copy(mode, &["-avn", "--delete"], &src, ours);
        assert_eq!(names(&out.stdout), rsync_names, "-v {mode}");
        let all = String::from_utf8_lossy(&out.stdout);
        assert!(
            all.lines().any(|l| l == "src/fresh-dir/"),
            "-v {mode}: {all}"
        );
    }
    let n = rcp_json(
        &[
            OsStr::new("-an"),
            OsStr::new("--delete"),
            src.as_os_str(),
            ours[0].as_os_str(),
        ],
        None,
    );
    assert_eq!(n.bytes, 0);
    assert_same("after -n --json", &before, &ours[0]);
    // And for real (the receiver's checking threads clear what is
    // unchanged, and name nothing of it): the same lines.
    for (mode, ours) in modes.iter().zip(&ours) {
        let out = modes_here.copy(mode, &["-ai", "--delete"], &src, ours);
        assert_eq!(lines(&out.stdout), rsyncs, "-i {mode}, for real");
    }
}

/// The four ways to run a copy from `src` into `dest` (local, push and
/// pull through a daemon serving the scratch directory, remote shell).
struct Modes {
    key: PathBuf,
    daemon: Daemon,
    rsh: PathBuf,
    path: String,
}

impl Modes {
    fn start(t: &Scratch) -> Modes {
        let key = secret(t, "key");
        let daemon = Daemon::start(&[t.dir()], &key);
        let (rsh, path) = fake_rsh(t);
        Modes {
            key,
            daemon,
            rsh,
            path,
        }
    }

    /// `rcp ARGS` in `mode` ("local", "push", "pull", "remote shell"),
    /// which must succeed.
    fn copy(&self, mode: &str, args: &[&str], src: &Path, dest: &Path) -> std::process::Output {
        let mut cmd = Command::new(RCP);
        cmd.args(args).env("PATH", &self.path);
        match mode {
            "local" => cmd.arg(src).arg(dest),
            "push" => cmd
                .arg("--secret-file")
                .arg(&self.key)
                .arg(src)
                .arg(self.daemon.url(dest)),
            "pull" => cmd
                .arg("--secret-file")
                .arg(&self.key)
                .arg(self.daemon.url(src))
                .arg(dest),
            _ => cmd
                .arg("--rsh")
                .arg(&self.rsh)
                .arg(src)
                .arg(format!("localhost:{}", dest.display())),
        };
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// `-i` names a symlink with its target and another name of a file with
/// the name it links to, as rsync's `%n%L` does (` -> `, ` => `), in
/// every mode: the lines of a push and a remote shell travel back to the
/// side the user typed rcp on, and may be longer than a path.
#[test]
fn itemize_names_link_targets_as_rsync_does() {
    let t = Scratch::new("resync-itemize-links");
    let src = t.path("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/first"), b"data").unwrap();
    std::fs::hard_link(src.join("d/first"), src.join("other")).unwrap();
    // A target of 4,090 bytes (a symlink's may be 4,095): its line is
    // longer than any path.
    let far = "t/".repeat(2045);
    std::os::unix::fs::symlink(&far, src.join("far")).unwrap();
    std::os::unix::fs::symlink("d/first", src.join("near")).unwrap();

    // Lines of links: the symlinks' as they are, the hard link's as the
    // pair of names it joins (which of them rsync makes first depends on
    // its order of the file list).
    let links = |out: &[u8]| {
        let mut symlinks = Vec::new();
        let mut pairs = Vec::new();
        for l in String::from_utf8_lossy(out).lines() {
            if l.starts_with("cL") {
                symlinks.push(l.to_string());
            } else if let Some((code, rest)) = l.split_once(' ')
                && code.starts_with("hf")
            {
                let (a, b) = rest
                    .split_once(" => ")
                    .expect("a hard link line names both");
                let mut pair = [a.to_string(), b.to_string()];
                pair.sort();
                pairs.push(pair);
            }
        }
        symlinks.sort();
        (symlinks, pairs)
    };
    let theirs = t.path("theirs");
    std::fs::create_dir(&theirs).unwrap();
    let rsync = Command::new("rsync")
        .arg("-aHi")
        .arg(&src)
        .arg(format!("{}/", theirs.display()))
        .output()
        .unwrap();
    assert!(rsync.status.success());
    let want = links(&rsync.stdout);
    assert_eq!(want.0.len(), 2, "the oracle names both symlinks: {want:?}");
    assert!(
        want.0
            .iter()
            .any(|l| l.ends_with(&format!("src/far -> {far}")))
    );
    assert_eq!(
        want.1,
        vec![["src/d/first".to_string(), "src/other".to_string()]]
    );

    let modes = Modes::start(&t);
    for mode in ["local", "push", "pull", "remote shell"] {
        let ours = t.path(&format!("ours-{}", mode.replace(' ', "-")));
        std::fs::create_dir(&ours).unwrap();
        let out = modes.copy(mode, &["-aHi"], &src, &ours);
        assert_eq!(links(&out.stdout), want, "{mode}");
    }
}

/// The count a run with `RCP_TEST_PRECHECK=every-batch` said on stderr
/// in its line `rcp test: BEFORE<count>AFTER` (`None`: not said).
fn said_by_checks(said: &str, before: &str, after: &str) -> Option<u64> {
    said.lines().find_map(|l| {
        l.strip_prefix("rcp test: ")?
            .strip_prefix(before)?
            .strip_suffix(after)?
            .parse()
            .ok()
    })
}

/// How many entries the receiver's checks cleared.
fn cleared_by_checks(said: &str) -> Option<u64> {
    said_by_checks(said, "the checks cleared ", " entries")
}

/// The modes a re-sync's checks are tried in: locally and through a
/// remote shell with every batch checked, and locally with none (the
/// loop's own way alone).
const CHECKED_MODES: [&str; 3] = ["local", "remote shell", "loop only"];

/// A destination's path for each of [`CHECKED_MODES`], in their order.
fn into_each_mode(t: &Scratch) -> Vec<PathBuf> {
    CHECKED_MODES
        .iter()
        .map(|m| t.path(&format!("into-{}", m.replace(' ', "-"))))
        .collect()
}

/// `rcp FLAG src into` in `mode` (one of [`CHECKED_MODES`]), through
/// the fake remote shell `rsh` found on `path`: what it sent and said.
fn resync_in_mode(
    mode: &str,
    flag: &str,
    src: &Path,
    into: &Path,
    rsh: &Path,
    path: &str,
) -> (Sent, String) {
    let to = match mode {
        "remote shell" => format!("localhost:{}", into.display()),
        _ => s(into).into(),
    };
    let mut args: Vec<&OsStr> = vec![OsStr::new(flag)];
    if mode == "remote shell" {
        args.extend([OsStr::new("--rsh"), rsh.as_os_str()]);
    }
    args.extend([src.as_os_str(), OsStr::new(&to)]);
    let hook = if mode == "loop only" {
        "off"
    } else {
        "every-batch"
    };
    rcp_said(&args, &[("PATH", path), ("RCP_TEST_PRECHECK", hook)])
}

#[test]
fn files_checked_ahead_on_threads_are_skipped_or_refreshed_as_rsync_does() {
    let t = Scratch::new("resync-checked");
    let src = t.path("src");
    let files = plain_tree(&src, 300, 21);
    for (i, p) in files.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        set_xattr(p, "user.tag", format!("v{i}").as_bytes());
    }
    // Symlinks, checked too: two will point elsewhere.
    let links: Vec<PathBuf> = (0..20)
        .map(|i| {
            let p = src.join(format!("d{}", i % 5)).join(format!("link{i}"));
            std::os::unix::fs::symlink(format!("f{i}"), &p).unwrap();
            set_times(&p, 1_600_000_000, i);
            p
        })
        .collect();
    let (rsh, path) = fake_rsh(&t);
    let modes = CHECKED_MODES;
    let into = into_each_mode(&t);
    let oracle = t.path("oracle");
    for d in into.iter().chain([&oracle]) {
        std::fs::create_dir(d).unwrap();
        rsync_into(&["-aX"], &src, d);
    }

    // Changes at the source, each of a kind the checks must not clear:
    // contents (sent), and metadata only (not sent; set on the file
    // there): mode, an attribute's value, one attribute more, one fewer.
    let mut rng = SmallRng::seed_from_u64(5);
    let mut picked = std::collections::BTreeSet::new();
    while picked.len() < 40 {
        picked.insert(rng.random_range(0..files.len()));
    }
    let picked: Vec<usize> = picked.into_iter().collect();
    let mut bytes = 0;
    for (n, &i) in picked.iter().enumerate() {
        let p = &files[i];
        match n % 5 {
            0 => {
                let len = std::fs::metadata(p).unwrap().len() as usize;
                std::fs::write(p, pattern(len.max(1), rng.random())).unwrap();
                set_times(p, 1_700_000_000, n as i64);
                bytes += len.max(1) as u64;
            }
            1 => std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o640))
                .unwrap(),
            2 => set_xattr(p, "user.tag", b"changed"),
            3 => set_xattr(p, "user.more", b"more"),
            _ => {
                if i % 3 == 0 {
                    rustix::fs::lremovexattr(p, "user.tag").unwrap();
                } else {
                    set_xattr(p, "user.other", b"x");
                }
            }
        }
    }
    // And at the destinations, an attribute the source never had.
    let extra = (0..files.len()).find(|i| !picked.contains(i)).unwrap();
    let rel = files[extra].strip_prefix(t.dir()).unwrap();
    for d in into.iter().chain([&oracle]) {
        set_xattr(&d.join(rel), "user.stray", b"x");
    }
    for p in &links[..2] {
        std::fs::remove_file(p).unwrap();
        std::os::unix::fs::symlink("elsewhere", p).unwrap();
        set_times(p, 1_600_000_000, 0);
    }
    // (Times in the past: rsync leaves a time of the current second alone.)
    for d in 0..5 {
        set_times(&src.join(format!("d{d}")), 1_500_000_000, d);
    }
    let untouched = files.len() - picked.len() - 1 + links.len() - 2;
    rsync_into(&["-aX"], &src, &oracle);

    for (mode, into) in modes.iter().zip(&into) {
        let before = ctimes(into);
        let (sent, said) = resync_in_mode(mode, "-aX", &src, into, &rsh, &path);
        let cleared = cleared_by_checks(&said);
        assert_eq!(
            (sent.files, sent.skipped, sent.bytes),
            (300, 300 - 8, bytes),
            "{mode}: only the changed contents are sent"
        );
        let expected = (*mode != "loop only").then_some(untouched as u64);
        assert_eq!(cleared, expected, "{mode}: the files the checks cleared");
        assert_same(mode, &oracle, into);
        // What the checks cleared was left alone.
        let after = ctimes(into);
        let untouched_left = files
            .iter()
            .enumerate()
            .filter(|(i, _)| !picked.contains(i) && *i != extra)
            .map(|(_, f)| f)
            .chain(&links[2..])
            .all(|f| {
                let p = into.join(f.strip_prefix(t.dir()).unwrap());
                before.get(&p) == after.get(&p)
            });
        assert!(untouched_left, "{mode}: an unchanged file was touched");
    }
}

/// How many other names of files (`-H`) the receiver left as they are by
/// what its checks found.
fn linked_by_checks(said: &str) -> Option<u64> {
    said_by_checks(said, "", " other names were there linked")
}

#[test]
fn other_names_checked_ahead_are_linked_as_rsync_links_them() {
    let t = Scratch::new("resync-other-names");
    let src = t.path("src");
    let files = plain_tree(&src, 200, 31);
    // Six files of three names each: the first in d0 (so met first),
    // two more in other directories.
    let firsts: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.parent() == Some(&src.join("d0")))
        .take(6)
        .collect();
    assert_eq!(firsts.len(), 6);
    let others: Vec<[PathBuf; 2]> = firsts
        .iter()
        .enumerate()
        .map(|(g, first)| {
            [0, 1].map(|k| {
                let p = src
                    .join(format!("d{}", 1 + (g + k) % 4))
                    .join(format!("g{g}-{k}"));
                std::fs::hard_link(first, &p).unwrap();
                p
            })
        })
        .collect();
    let (rsh, path) = fake_rsh(&t);
    let modes = CHECKED_MODES;
    let into = into_each_mode(&t);
    let oracle = t.path("oracle");
    let rel = |p: &Path| p.strip_prefix(t.dir()).unwrap().to_path_buf();
    for d in into.iter().chain([&oracle]) {
        std::fs::create_dir(d).unwrap();
        rsync_into(&["-aH"], &src, d);
        // There: group 2's first other name a file of its own, group 3's
        // second linked to group 4's file, group 4's first gone.
        let copy = d.join(rel(&others[2][0]));
        std::fs::remove_file(&copy).unwrap();
        std::fs::copy(firsts[2], &copy).unwrap();
        let meta = std::fs::metadata(firsts[2]).unwrap();
        std::fs::set_permissions(&copy, meta.permissions()).unwrap();
        let mtime = std::os::unix::fs::MetadataExt::mtime(&meta);
        set_times(&copy, mtime, 5000);
        let moved = d.join(rel(&others[3][1]));
        std::fs::remove_file(&moved).unwrap();
        std::fs::hard_link(d.join(rel(firsts[4])), &moved).unwrap();
        std::fs::remove_file(d.join(rel(&others[4][0]))).unwrap();
    }
    // At the source: group 1's contents (its first name is sent again,
    // its other names must follow), group 5's mode (set where it is).
    std::fs::write(firsts[1], pattern(1000, 7)).unwrap();
    set_times(firsts[1], 1_700_000_000, 1);
    std::fs::set_permissions(
        firsts[5],
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    for d in 0..5 {
        set_times(&src.join(format!("d{d}")), 1_500_000_000, d);
    }
    rsync_into(&["-aH"], &src, &oracle);

    for (mode, into) in modes.iter().zip(&into) {
        let before = ctimes(into);
        let (_, said) = resync_in_mode(mode, "-aH", &src, into, &rsh, &path);
        // Left as they are: group 0's two other names, and the one other
        // name of groups 2, 3 and 4 that was not touched there.
        let expected = (*mode != "loop only").then_some(5);
        assert_eq!(linked_by_checks(&said), expected, "{mode}: {said}");
        assert_same(mode, &oracle, into);
        let after = ctimes(into);
        for p in std::iter::once(firsts[0]).chain(&others[0]) {
            let p = into.join(rel(p));
            assert_eq!(
                before.get(&p),
                after.get(&p),
                "{mode}: {} touched",
                p.display()
            );
        }
    }
}

/// A copy into a local destination that holds nothing (not there, or an
/// empty directory), by a local copy or a pull, sends every file unasked:
/// nothing is answered, so the receiver's checks never start (they serve
/// the answers); the copy is rsync's all the same. Into a destination that
/// holds anything, or a remote one (a push), the files are asked about as
/// in any re-sync.
#[test]
fn a_copy_into_nothing_here_sends_every_file_unasked() {
    let t = Scratch::new("resync-into-nothing");
    let src = t.path("src");
    let files = plain_tree(&src, 120, 8);
    let oracle = t.path("oracle");
    std::fs::create_dir(&oracle).unwrap();
    rsync_into(&["-aX"], &src, &oracle);
    let bytes: u64 = files.iter().map(|p| p.metadata().unwrap().len()).sum();
    let (rsh, path) = fake_rsh(&t);
    let remote = |p: &Path| format!("localhost:{}", p.display());

    let empty = t.path("empty");
    let pulled = t.path("pulled");
    let pushed = t.path("pushed");
    for d in [&empty, &pulled, &pushed] {
        std::fs::create_dir(d).unwrap();
    }
    let missing = t.path("missing");
    let some = t.path("some");
    std::fs::create_dir(&some).unwrap();
    std::fs::write(some.join("kept"), b"not the copy's").unwrap();
    let cases = [
        ("empty", s(&src).to_string(), s(&empty).to_string(), false),
        ("missing", s(&src).into(), s(&missing).into(), false),
        ("holding a file", s(&src).into(), s(&some).into(), true),
        (
            "pulled into an empty one",
            remote(&src),
            s(&pulled).into(),
            false,
        ),
        (
            "pushed into an empty one",
            s(&src).into(),
            remote(&pushed),
            true,
        ),
    ];
    for (what, from, into, asked) in cases {
        let args = ["-aX", "--rsh", s(&rsh), &from, &into].map(OsStr::new);
        let env = [
            ("PATH", path.as_str()),
            ("RCP_TEST_PRECHECK", "every-batch"),
        ];
        let (sent, said) = rcp_said(&args, &env);
        assert_eq!(
            (sent.files, sent.skipped, sent.bytes),
            (120, 0, bytes),
            "{what}: every file is sent whole"
        );
        assert_eq!(
            cleared_by_checks(&said).is_some(),
            asked,
            "{what}: whether the files were asked about ({said})"
        );
    }
    assert_same("into an empty directory", &oracle, &empty);
    assert_same("into a new name", &oracle.join("src"), &missing);
    assert_eq!(std::fs::read(some.join("kept")).unwrap(), b"not the copy's");
    assert_same("beside a file", &oracle.join("src"), &some.join("src"));
    assert_same("pulled", &oracle, &pulled);
    assert_same("pushed", &oracle, &pushed);
}

/// The files the receiver asked for go out from a loop of their own
/// (`send/data.rs`): a chunk damaged there after it was hashed is caught
/// as any other, locally and over a remote shell, and no file ends up
/// with anything but its old contents or its new ones.
#[test]
fn a_chunk_corrupted_in_a_resync_fails_it_and_spoils_no_file() {
    let t = Scratch::new("resync-corrupt");
    let src = t.path("src");
    let files = plain_tree(&src, 60, 11);
    let (rsh, path) = fake_rsh(&t);
    // Every file of at least two chunks gets new contents and a new time.
    let big: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.metadata().unwrap().len() > CHUNK as u64)
        .collect();
    assert!(big.len() >= 5, "{} files of two chunks", big.len());
    for (what, remote) in [("local", false), ("pushed", true)] {
        let into = t.path(what);
        std::fs::create_dir(&into).unwrap();
        let dest = |p: &Path| into.join("src").join(p.strip_prefix(&src).unwrap());
        let into_arg = if remote {
            format!("localhost:{}", into.display())
        } else {
            s(&into).to_string()
        };
        let args = ["-a", "--rsh", s(&rsh), s(&src), &into_arg].map(OsStr::new);
        rcp_json(&args, Some(&path));
        let old: Vec<Vec<u8>> = big.iter().map(|p| std::fs::read(p).unwrap()).collect();
        for (i, p) in big.iter().enumerate() {
            std::fs::write(p, pattern(old[i].len(), 1000 + i as u64)).unwrap();
            set_times(p, 1_700_000_000, i as i64);
        }
        let out = Command::new(RCP)
            .args(["--chunk-size", "64K"])
            .args(args)
            .env("PATH", &path)
            .env("RCP_TEST_CORRUPT_CHUNK", "3")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // Exit status 4: verification failed.
        assert_eq!(out.status.code(), Some(4), "{what}: {err}");
        assert!(err.contains("corrupted"), "{what}: {err}");
        let mut kept = 0;
        for (i, p) in big.iter().enumerate() {
            let now = std::fs::read(dest(p)).unwrap();
            if now == old[i] {
                kept += 1;
            } else {
                assert_eq!(now, std::fs::read(p).unwrap(), "{what}: {p:?} spoiled");
            }
        }
        assert!(kept >= 1, "{what}: the damaged file kept its old contents");
        let leftovers: Vec<_> = walk_names(&into)
            .into_iter()
            .filter(|n| n.starts_with(".rcp-"))
            .collect();
        assert!(leftovers.is_empty(), "{what}: {leftovers:?}");
        // Put back for the next mode.
        for (i, p) in big.iter().enumerate() {
            std::fs::write(p, &old[i]).unwrap();
        }
    }
}

/// The names of every entry beneath `dir`.
fn walk_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        out.push(p.file_name().unwrap().to_string_lossy().into_owned());
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            out.extend(walk_names(&p));
        }
    }
    out
}

/// `--stats` says, in rsync's words, how many files a re-sync sent again
/// and how many entries it deleted: what scripts read of rsync's.
#[test]
fn stats_count_the_files_a_resync_sends_and_deletes() {
    let t = Scratch::new("resync-stats");
    let src = t.path("src");
    for i in 0..5 {
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join(format!("f{i}")), format!("file {i}")).unwrap();
        set_times(&src.join(format!("f{i}")), 1_600_000_000, 0);
    }
    let modes = common::modes::Modes::new(&t, &[]);
    for mode in ["local", "push", "pull"] {
        let into = t.path(mode);
        std::fs::create_dir(&into).unwrap();
        let run = || {
            let args = ["-a", "--delete", "--stats"].map(OsStr::new).to_vec();
            let out = modes.run_out(mode, args, &src, &into);
            assert!(out.status.success(), "{mode}");
            String::from_utf8(out.stdout).unwrap()
        };
        let first = run();
        assert!(
            first.contains("Number of regular files transferred: 5\n"),
            "{first}"
        );
        std::fs::write(src.join("f1"), "changed").unwrap();
        std::fs::write(into.join("src/extra"), "not in the source").unwrap();
        let again = run();
        for line in [
            "Number of regular files: 5\n",
            "Number of regular files transferred: 1\n",
            "Number of deleted files: 1\n",
            "Literal data: 7 bytes\n",
        ] {
            assert!(again.contains(line), "{mode}: {line:?} in {again}");
        }
        // (A pull received the data.)
        let line = match mode {
            "pull" => "sent 0 bytes  received 7 bytes",
            _ => "sent 7 bytes  received 0 bytes",
        };
        assert!(again.contains(line), "{mode}: {line:?} in {again}");
    }
}
