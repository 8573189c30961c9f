//! `--backup`, `--backup-dir`, `--suffix` against rsync's: two runs of
//! the same command line (the second after more changes at the source,
//! so backups are replaced and, beside their files, left by `--delete`)
//! through rsync and through rcp in every mode, the destinations and the
//! backups compared entry by entry after each run.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, symlink};
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

/// Every path beneath `dir`, and `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    if std::fs::symlink_metadata(dir).unwrap().is_dir() {
        for e in std::fs::read_dir(dir).unwrap() {
            all.extend(walk(&e.unwrap().path()));
        }
    }
    all
}

/// Directory times are the run's own where backups are made in them
/// (and rsync leaves them so without `--backup-dir`): set alike before
/// comparing.
fn same_dir_times(root: &Path) {
    for p in walk(root) {
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            set_times(&p, 1_400_000_000, 0);
        }
    }
}

/// The source the first run copies: a file changed, one unchanged, one
/// new, a symlink pointing elsewhere, a directory where a file was.
fn first_source(src: &Path) {
    write(&src.join("changed"), b"new contents, longer", 1_700_000_000);
    write(&src.join("same"), b"same", 1_500_000_000);
    write(&src.join("new"), b"new", 1_700_000_000);
    write(
        &src.join("d/deeper/changed"),
        b"new deep contents",
        1_700_000_000,
    );
    write(&src.join("was-a-file/in"), b"in", 1_700_000_000);
    symlink("same", src.join("link")).unwrap();
    set_times(&src.join("link"), 1_700_000_000, 0);
}

/// The destination a copy of an older source left (`into/src`).
fn older_copy(into: &Path) {
    let top = into.join("src");
    write(&top.join("changed"), b"old", 1_500_000_000);
    write(&top.join("same"), b"same", 1_500_000_000);
    write(&top.join("d/deeper/changed"), b"old deep", 1_500_000_000);
    write(&top.join("gone"), b"the source lost it", 1_500_000_000);
    write(
        &top.join("gone-dir/sub/f"),
        b"in a directory gone",
        1_500_000_000,
    );
    write(&top.join("was-a-file"), b"a file then", 1_500_000_000);
    symlink("changed", top.join("link")).unwrap();
    set_times(&top.join("link"), 1_500_000_000, 0);
    std::fs::set_permissions(
        top.join("gone-dir"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
}

/// What changes at the source before the second run: the changed file
/// again (its backup is replaced), another gone.
fn second_source(src: &Path) {
    write(
        &src.join("changed"),
        b"newer still, and longer again",
        1_800_000_000,
    );
    std::fs::remove_file(src.join("same")).unwrap();
}

fn backups_as_rsyncs(name: &str, flags: &[&str], backup_dir: Option<&str>) {
    if !rsync_available() {
        eprintln!("skipped: no rsync");
        return;
    }
    let t = Scratch::new(name);
    let src = t.path("src");
    first_source(&src);
    let modes = Modes::new(&t, &[]);
    let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    // (`{}` in the directory: each destination's own, beside it.)
    let with = |into: &Path| -> Vec<String> {
        let mut f = flags.clone();
        if let Some(d) = backup_dir {
            let at = into.display().to_string();
            f.push(format!("--backup-dir={}", d.replace("{}", &at)));
        }
        f
    };
    let oracle = t.path("oracle");
    let intos: Vec<PathBuf> = EVERY_MODE
        .iter()
        .map(|m| t.path(&format!("into-{}", m.replace(' ', "-"))))
        .collect();
    older_copy(&oracle);
    for into in &intos {
        older_copy(into);
    }
    for run in 1..=2 {
        let f = with(&oracle);
        rsync_into(&f.iter().map(OsStr::new).collect::<Vec<_>>(), &src, &oracle);
        // (rsync made backups, else the comparison proves little.)
        let made = walk(&oracle)
            .iter()
            .filter(|p| std::fs::read(p).is_ok_and(|d| d == b"old"))
            .count();
        assert!(
            run == 2 || made >= 1,
            "run {run}: the first contents of `changed` not backed up"
        );
        same_dir_times(&oracle);
        for (mode, into) in EVERY_MODE.iter().zip(&intos) {
            let f = with(into);
            modes.run(mode, f.iter().map(OsStr::new).collect(), &src, into);
            same_dir_times(into);
            assert_same(&format!("run {run}, {mode} {f:?}"), &oracle, into);
        }
        if run == 1 {
            second_source(&src);
        }
    }
}

/// The backups rsync made are there, else the comparison proves little.
fn backed_up(root: &Path, names: &[&str]) {
    for n in names {
        assert!(
            std::fs::symlink_metadata(root.join(n)).is_ok(),
            "no backup {n} in {}",
            root.display()
        );
    }
}

#[test]
fn backups_beside_their_files_are_rsyncs_in_every_mode() {
    backups_as_rsyncs("backup-beside", &["-a", "--delete", "-b"], None);
}

#[test]
fn backups_with_a_suffix_in_a_directory_of_their_own_are_rsyncs_in_every_mode() {
    // (Relative to the destination directory: beside the copied tree.)
    backups_as_rsyncs(
        "backup-dir",
        &["-a", "--delete", "--suffix=.old"],
        Some("bak"),
    );
}

#[test]
fn backups_in_an_absolute_directory_are_rsyncs_in_every_mode() {
    backups_as_rsyncs("backup-dir-abs", &["-a", "--delete"], Some("{}/abs/bak"));
}

/// What each run backed up, by hand (rsync's result is the oracle above:
/// this says the oracle is not empty).
#[test]
fn the_backups_hold_what_was_replaced_and_removed() {
    let t = Scratch::new("backup-what");
    let src = t.path("src");
    first_source(&src);
    let into = t.path("into");
    older_copy(&into);
    let (_rsh, path) = common::fake_rsh(&t);
    let run = |args: &[&str]| {
        let mut a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        a.extend([src.as_os_str(), into.as_os_str()]);
        rcp_ok(&a, &path);
    };
    run(&["-a", "--delete", "-b"]);
    let top = into.join("src");
    backed_up(
        &top,
        &[
            "changed~",
            "d/deeper/changed~",
            "gone~",
            "gone-dir/sub/f~",
            "was-a-file~",
            "link~",
        ],
    );
    assert_eq!(std::fs::read(top.join("changed~")).unwrap(), b"old");
    assert_eq!(
        std::fs::read_link(top.join("link~")).unwrap(),
        Path::new("changed")
    );
    // (The directory stays, holding the backup of what was in it.)
    assert!(top.join("gone-dir/sub").is_dir());
    second_source(&src);
    run(&["-a", "--delete", "-b"]);
    assert_eq!(
        std::fs::read(top.join("changed~")).unwrap(),
        b"new contents, longer",
        "the backup is the file the run replaced"
    );
    // `--delete` left the backups of the first run (rsync's `P *~`).
    backed_up(&top, &["gone~", "same~", "was-a-file~"]);
    // A backup is the file itself, renamed: its inode, not a copy.
    let ino = std::fs::metadata(top.join("changed")).unwrap().ino();
    second_source_again(&src);
    run(&["-a", "--backup-dir=../bak"]);
    assert_eq!(
        std::fs::metadata(t.path("bak/src/changed")).unwrap().ino(),
        ino
    );
}

fn second_source_again(src: &Path) {
    write(&src.join("changed"), b"a third time", 1_900_000_000);
}

#[test]
fn a_bad_suffix_or_a_backup_dir_outside_a_daemons_roots_is_refused() {
    let t = Scratch::new("backup-refused");
    let src = t.path("src");
    first_source(&src);
    let into = t.path("into");
    std::fs::create_dir_all(&into).unwrap();
    let (_rsh, path) = common::fake_rsh(&t);
    for (args, says) in [
        (
            &["-b", "--suffix="][..],
            "--suffix may be empty only with --backup-dir",
        ),
        (&["-b", "--suffix=a/b"][..], "--suffix may not hold a '/'"),
    ] {
        let mut a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        a.extend([OsStr::new("-a"), src.as_os_str(), into.as_os_str()]);
        let out = rcp(&a, &path);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    // A daemon serving `into` only: its backups stay beneath it.
    let served = Scratch::new("backup-refused-served");
    let key = common::secret(&t, "key2");
    let daemon = common::Daemon::start(&[served.dir()], &key);
    let outside = t.path("outside-bak");
    // (A copy there first: the backup directory is opened only when a
    // backup is made.)
    let url = daemon.url(served.dir());
    let secret = [OsStr::new("--secret-file"), key.as_os_str()];
    let mut first = vec![OsStr::new("-a")];
    first.extend(secret);
    first.extend([src.as_os_str(), OsStr::new(&url)]);
    rcp_ok(&first, &path);
    write(
        &src.join("changed"),
        b"changed again, so backed up",
        1_750_000_000,
    );
    let out = rcp(
        &[
            OsStr::new("-a"),
            OsStr::new("--backup-dir"),
            outside.as_os_str(),
            OsStr::new("--secret-file"),
            key.as_os_str(),
            src.as_os_str(),
            OsStr::new(&daemon.url(served.dir())),
        ],
        &path,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("outside the served roots"), "{err}");
    assert!(!outside.exists(), "made outside the roots");
}

/// The mistakes a backup must survive: a `--backup-dir` that is the
/// file's own directory without a suffix (the backup would be the file
/// itself: it fails, and the file stays), a dry run (nothing made), a
/// file copied under a new name (a relative DIR is beside it, as
/// rsync's), backups beside their files under `--delete-excluded` (gone,
/// not backed up again), a symlink whose time alone changes (made again,
/// not backed up).
#[test]
fn backups_survive_the_mistakes() {
    let t = Scratch::new("backup-mistakes");
    let (_rsh, path) = common::fake_rsh(&t);
    let run = |args: &[&OsStr]| rcp(args, &path);
    let src = t.path("src");
    write(&src.join("f"), b"new", 1_700_000_000);
    let into = t.path("into");
    write(&into.join("src/f"), b"old", 1_500_000_000);
    let out = run(&[
        OsStr::new("-a"),
        OsStr::new("--backup-dir=."),
        src.as_os_str(),
        into.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("would be itself"),
        "{err}"
    );
    assert_eq!(std::fs::read(into.join("src/f")).unwrap(), b"old");
    // A dry run makes no backup directory.
    rcp_ok(
        &[
            OsStr::new("-an"),
            OsStr::new("--backup-dir=../dry-bak"),
            src.as_os_str(),
            into.as_os_str(),
        ],
        &path,
    );
    assert!(!t.path("dry-bak").exists(), "a dry run made it");
    // One file under a new name: DIR beside it.
    let one = t.path("one");
    write(&one, b"one, new", 1_700_000_000);
    let renamed = t.path("out/g");
    write(&renamed, b"g, old", 1_500_000_000);
    rcp_ok(
        &[
            OsStr::new("-a"),
            OsStr::new("--backup-dir=old"),
            one.as_os_str(),
            renamed.as_os_str(),
        ],
        &path,
    );
    assert_eq!(std::fs::read(t.path("out/old/g")).unwrap(), b"g, old");
    // `--delete-excluded` beside the files: a backup goes, and is not
    // backed up again (rsync's).
    write(&into.join("src/x.tmp"), b"excluded", 1_500_000_000);
    for _ in 0..2 {
        let args = [
            OsStr::new("-a"),
            OsStr::new("-b"),
            OsStr::new("--delete"),
            OsStr::new("--delete-excluded"),
            OsStr::new("--exclude=*.tmp"),
            src.as_os_str(),
            into.as_os_str(),
        ];
        rcp_ok(&args, &path);
    }
    let mut names: Vec<String> = std::fs::read_dir(into.join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["f"], "backups piled up or stayed");
    // A symlink whose time alone changed is made again, not backed up.
    let links = t.path("links");
    std::fs::create_dir_all(&links).unwrap();
    symlink("f", links.join("l")).unwrap();
    set_times(&links.join("l"), 1_700_000_000, 0);
    let at = t.path("links-into");
    std::fs::create_dir_all(at.join("links")).unwrap();
    symlink("f", at.join("links/l")).unwrap();
    set_times(&at.join("links/l"), 1_500_000_000, 0);
    rcp_ok(
        &[
            OsStr::new("-a"),
            OsStr::new("-b"),
            links.as_os_str(),
            at.as_os_str(),
        ],
        &path,
    );
    assert!(
        std::fs::symlink_metadata(at.join("links/l~")).is_err(),
        "backed up"
    );
    assert_eq!(
        std::fs::symlink_metadata(at.join("links/l"))
            .unwrap()
            .mtime(),
        1_700_000_000
    );
    // Nor is a FIFO.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        links.join("p"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    set_times(&links.join("p"), 1_700_000_000, 0);
    let again = |args: &[&OsStr]| {
        let mut a = args.to_vec();
        a.extend([links.as_os_str(), at.as_os_str()]);
        rcp_ok(&a, &path);
    };
    again(&[OsStr::new("-aD"), OsStr::new("-b")]);
    set_times(&links.join("p"), 1_800_000_000, 0);
    again(&[OsStr::new("-aD"), OsStr::new("-b")]);
    assert!(
        std::fs::symlink_metadata(at.join("links/p~")).is_err(),
        "backed up"
    );
    // `--delete` beside the files: a file whose backup would take the
    // name of one the copy sent stays, and the copy's file is kept.
    let pair = t.path("pair");
    write(&pair.join("x~"), b"the source's x~", 1_700_000_000);
    let at = t.path("pair-into");
    write(&at.join("pair/x"), b"gone from the source", 1_500_000_000);
    let out = run(&[
        OsStr::new("-a"),
        OsStr::new("-b"),
        OsStr::new("--delete"),
        pair.as_os_str(),
        at.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not deleting pair/x"), "{err}");
    assert_eq!(
        std::fs::read(at.join("pair/x~")).unwrap(),
        b"the source's x~"
    );
    assert_eq!(
        std::fs::read(at.join("pair/x")).unwrap(),
        b"gone from the source"
    );
}
