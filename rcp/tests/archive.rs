//! Archive mode against the oracle: generated trees (seeded) copied once
//! with `rcp -aHAX` and once with `rsync -aHAX`, then compared entry by
//! entry (type, contents, mode, owner, group, times to the nanosecond,
//! device numbers, extended attributes and ACLs, hard-link groups), in
//! local, daemon (push and pull) and remote-shell modes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use test_support::Scratch;

mod common;
use common::trees::*;
use common::xfs::Xfs;
use common::{Daemon, RCP, fake_rsh, secret};

fn rcp_archive(args: &[&OsStr]) {
    run(Command::new(RCP)
        .args(["-q", "-aHAX", "--chunk-size", "64K"])
        .args(args));
}

#[test]
fn archive_copies_match_rsync_in_every_mode() {
    if !rsync_available() {
        panic!("rsync is needed (scripts/setup installs it)");
    }
    let t = Scratch::new("archive");
    let src = t.path("src");
    let made = generate(&src, 0x5eed);
    // The tree has what the comparison is about.
    assert!(made.files >= 10 && made.link_groups >= 2, "{made:?}");
    assert!(
        made.xattrs >= 5 && made.acls >= 5 && made.specials >= 2,
        "{made:?}"
    );
    if is_root() {
        assert!(made.devices >= 1 && made.owned >= 10, "{made:?}");
    }
    let oracle = t.path("rsync");
    rsync_copy(&src, &oracle);
    // rsync itself kept everything (else the oracle proves little).
    assert_eq!(differences(&src, &oracle), Vec::<String>::new());

    let compare = |what: &str, got: &Path| {
        let diff = differences(&oracle, got);
        assert!(
            diff.is_empty(),
            "{what}: {} differences:\n{}",
            diff.len(),
            diff.join("\n")
        );
    };

    // Local.
    let local = t.path("local");
    rcp_archive(&[src.as_os_str(), local.as_os_str()]);
    compare("local", &local);
    // The comparison sees a changed attribute, time or link (it can fail).
    let (seen, groups) = look(&local);
    let (with_xattr, _) = seen
        .iter()
        .find(|(_, e)| e.xattrs.contains_key(&b"user.note"[..]))
        .expect("a copied user.note");
    let changed = local.join(OsStr::from_bytes(with_xattr));
    set_xattr(&changed, "user.note", b"changed");
    assert_eq!(differences(&oracle, &local).len(), 1);
    set_xattr(
        &changed,
        "user.note",
        &xattrs_of(&oracle.join(OsStr::from_bytes(with_xattr)))[&b"user.note"[..]],
    );
    set_times(&changed, 1, 1);
    assert_eq!(differences(&oracle, &local).len(), 1);
    let linked = local.join(OsStr::from_bytes(&groups[0][0]));
    let copy = std::fs::read(&linked).unwrap();
    std::fs::remove_file(&linked).unwrap();
    std::fs::write(&linked, copy).unwrap();
    assert!(!differences(&oracle, &local).is_empty());

    // A re-sync into a copy finds attributes changed there, on entries
    // whose data and times are unchanged (only the attributes compared
    // there tell): a value changed, and one the source has not, on a file
    // without any, goes.
    let into = t.path("resynced");
    std::fs::create_dir(&into).unwrap();
    rcp_archive(&[src.as_os_str(), into.as_os_str()]);
    let copy = into.join(src.file_name().unwrap());
    compare("local, into a directory", &copy);
    set_xattr(
        &copy.join(OsStr::from_bytes(with_xattr)),
        "user.note",
        b"changed",
    );
    let (bare, _) = seen
        .iter()
        .find(|(p, e)| {
            let linked = groups.iter().flatten().any(|g| g == *p);
            e.xattrs.is_empty() && e.mode & 0o170000 == 0o100000 && !linked
        })
        .expect("a copied file without attributes");
    set_xattr(
        &copy.join(OsStr::from_bytes(bare)),
        "user.extra",
        b"not in the source",
    );
    assert_eq!(differences(&oracle, &copy).len(), 2);
    rcp_archive(&[src.as_os_str(), into.as_os_str()]);
    compare("local re-sync after attributes changed there", &copy);

    // Daemon, push and pull (as root with --allow-owners, so owners and
    // device nodes are kept).
    let key = secret(&t, "key");
    let daemon = Daemon::start_with(&[t.dir()], &key, &["--allow-owners"]);
    let pushed = t.path("pushed");
    rcp_archive(&[
        OsStr::new("--secret-file"),
        key.as_os_str(),
        src.as_os_str(),
        OsStr::new(&daemon.url(&pushed)),
    ]);
    compare("daemon push", &pushed);
    let pulled = t.path("pulled");
    rcp_archive(&[
        OsStr::new("--secret-file"),
        key.as_os_str(),
        OsStr::new(&daemon.url(&src)),
        pulled.as_os_str(),
    ]);
    compare("daemon pull", &pulled);

    // Remote shell: a stand-in for ssh that runs the far side here, and
    // three streams.
    let (rsh, path) = fake_rsh(&t);
    let shelled = t.path("shelled");
    run(Command::new(RCP)
        .args([
            "-q",
            "-aHAX",
            "--chunk-size",
            "64K",
            "--streams",
            "3",
            "--rsh",
        ])
        .arg(&rsh)
        .arg(&src)
        .arg(format!("localhost:{}", shelled.display()))
        .env("PATH", &path));
    compare("remote shell", &shelled);
}

#[test]
fn a_daemon_without_allow_owners_keeps_what_it_receives_its_own() {
    if !is_root() {
        eprintln!("skipped: needs root (owners and device nodes)");
        return;
    }
    let t = Scratch::new("archive-owners");
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"data").unwrap();
    std::os::unix::fs::lchown(src.join("f"), Some(4242), Some(4343)).unwrap();
    std::fs::set_permissions(src.join("f"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    set_xattr(&src.join("f"), "trusted.rcp", b"not for a client");
    set_xattr(
        &src.join("f"),
        "security.capability",
        &[
            1, 0, 0, 2, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ],
    );
    let key = secret(&t, "key");
    let daemon = Daemon::start(&[t.dir()], &key);
    let dst = t.path("dst");
    rcp_archive(&[
        OsStr::new("--secret-file"),
        key.as_os_str(),
        src.as_os_str(),
        OsStr::new(&daemon.url(&dst)),
    ]);
    // Owner and group are the daemon's; no setuid file of root's, no
    // file capability.
    let m = std::fs::metadata(dst.join("f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (0, 0));
    assert_eq!(m.mode() & 0o7777, 0o755, "setuid and setgid cleared");
    assert!(
        xattrs_of(&dst.join("f")).is_empty(),
        "{:?}",
        xattrs_of(&dst.join("f"))
    );
    // A device node is refused, with the reason, and the rest is copied.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("null"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o600),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    let out = Command::new(RCP)
        .args(["-aq", "--secret-file"])
        .arg(&key)
        .arg(&src)
        .arg(daemon.url(&t.path("dst2")))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "partial copy");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("device node") && err.contains("--allow-owners"),
        "{err}"
    );
    assert_eq!(std::fs::read(t.path("dst2/f")).unwrap(), b"data");
    assert!(!t.path("dst2/null").exists());
}

#[test]
fn trees_of_many_seeds_match_rsync_locally() {
    for seed in 1..=8u64 {
        let t = Scratch::new("archive-seeds");
        let src = t.path("src");
        generate(&src, seed);
        let (oracle, local) = (t.path("rsync"), t.path("local"));
        rsync_copy(&src, &oracle);
        rcp_archive(&[src.as_os_str(), local.as_os_str()]);
        let diff = differences(&oracle, &local);
        assert!(diff.is_empty(), "seed {seed}:\n{}", diff.join("\n"));
    }
}

/// Into XFS, RHEL's default filesystem, where received files are made
/// durable in rounds of one `syncfs` (`tree/together.rs`) and made
/// unnamed first, and where root sees each POSIX ACL twice (also as
/// `trusted.SGI_ACL_*`, whose removal removes the ACL): the copy matches
/// rsync's copy of the same tree beside the source. (Not rsync's copy
/// into XFS: rsync (3.5.0 here) `-aHAX` as root removes those names there, and
/// with them every ACL it copied, as rcp did before `acl_alias`.)
#[test]
fn an_archive_copy_into_xfs_matches_rsync() {
    let t = Scratch::new("archive-xfs");
    let Some(xfs) = Xfs::mount(&t) else { return };
    // (A seed whose tree has files and directories with access and
    // default ACLs, some inherited.)
    let (src, oracle, ours) = (t.path("src"), t.path("rsync"), xfs.path().join("rcp"));
    generate(&src, 3);
    rsync_copy(&src, &oracle);
    rcp_archive(&[src.as_os_str(), ours.as_os_str()]);
    let diff = differences(&oracle, &ours);
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}

/// Files made in a setgid directory get its group from the kernel, and
/// rcp leaves the chown out only where what the kernel gave is the
/// source's: into a setgid destination (whose new directories are setgid
/// too while the copy fills them), and again on a re-sync into the copy's
/// own setgid directory, owners, groups and modes are rsync's.
#[test]
fn files_made_in_setgid_directories_end_with_the_sources_owners_as_rsyncs() {
    if !is_root() {
        eprintln!("skipped: needs root (setting owners)");
        return;
    }
    let t = Scratch::new("archive-setgid");
    let src = t.path("src");
    owned_tree(&src);
    let modes = [0o644, 0o600, 0o640, 0o444, 0o755, 0o2755];
    for (i, mode) in modes.iter().enumerate() {
        let f = src.join(format!("m{i}"));
        std::fs::write(&f, format!("mode {mode:o}")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    // The source's own directory is setgid too, with a group of its own.
    std::os::unix::fs::lchown(&src, Some(0), Some(4343)).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o2755)).unwrap();
    set_times(&src, 1_600_000_000, 5);
    let (ours, oracle) = (t.path("rcp"), t.path("rsync"));
    for d in [&ours, &oracle] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::lchown(d, None, Some(4242)).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o2775)).unwrap();
    }
    let copy = || {
        run(Command::new("rsync").arg("-aHAX").arg(&src).arg(&oracle));
        rcp_archive(&[src.as_os_str(), ours.as_os_str()]);
        let diff = differences(&oracle, &ours);
        assert!(diff.is_empty(), "{}", diff.join("\n"));
    };
    copy();
    // (The case arose: a file of group 0 made under a directory of 4242.)
    let f0 = std::fs::symlink_metadata(ours.join("src/f0")).unwrap();
    assert_eq!((f0.uid(), f0.gid()), (0, 0));
    // A re-sync makes its files in the copy's directory, now setgid with
    // the source's group 4343.
    for name in ["f0", "m0", "m2"] {
        let f = src.join(name);
        let mode = std::fs::symlink_metadata(&f).unwrap().mode();
        std::fs::write(&f, "changed, and longer than before").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        set_times(&f, 1_700_000_000, 7);
    }
    copy();
}

/// A tree whose entries belong to named and nameless users and groups
/// (root, daemon, bin, man; ids no name has), directories and a symlink
/// among them.
fn owned_tree(src: &Path) {
    let owners: [(u32, u32); 8] = [
        (0, 0),
        (1, 1),
        (2, 2),
        (6, 12),
        (1000, 1000),
        (1042, 7),
        (60000, 60001),
        (2, 60001),
    ];
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for (i, (uid, gid)) in owners.iter().enumerate() {
        let dir = if i % 2 == 0 {
            src.to_path_buf()
        } else {
            src.join("sub")
        };
        let f = dir.join(format!("f{i}"));
        std::fs::write(&f, format!("file {i}")).unwrap();
        std::os::unix::fs::lchown(&f, Some(*uid), Some(*gid)).unwrap();
    }
    std::os::unix::fs::symlink("f0", src.join("link")).unwrap();
    std::os::unix::fs::lchown(src.join("link"), Some(1), Some(60001)).unwrap();
    std::os::unix::fs::lchown(src.join("sub"), Some(1000), Some(2)).unwrap();
    // Times seconds in the past: rsync leaves the time of what it made
    // in the source's second as it is (it compares whole seconds).
    for name in ["link", "sub"] {
        set_times(&src.join(name), 1_600_000_000, 123_456_789);
    }
}

/// The maps of `--usermap`, `--groupmap` and `--chown` give what rsync
/// gives with the same options (names, wildcards, ranges, nameless ids,
/// `--numeric-ids`), locally, to and from a daemon and through a remote
/// shell; a re-sync without the map puts the owners back, as rsync's.
#[test]
fn owner_and_group_maps_match_rsync_in_every_mode() {
    assert!(
        rsync_available(),
        "rsync is needed (scripts/setup installs it)"
    );
    if !is_root() {
        eprintln!("skipped: needs root (setting owners)");
        return;
    }
    let t = Scratch::new("archive-maps");
    let src = t.path("src");
    owned_tree(&src);
    let rsync = |opts: &[&str], dst: &Path| {
        run(Command::new("rsync")
            .arg("-a")
            .args(opts)
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", dst.display())));
    };
    let rcp = |opts: &[&str], from: &OsStr, to: &OsStr| {
        run(Command::new(RCP)
            .args(["-q", "-a"])
            .args(opts)
            .arg(from)
            .arg(to));
    };
    let compare = |what: &str, oracle: &Path, got: &Path| {
        let diff = differences(oracle, got);
        assert!(diff.is_empty(), "{what}: {}", diff.join("\n"));
    };
    let sets: [&[&str]; 5] = [
        &[
            "--usermap=d*:bin,1000-1040:sys,:nobody,root:games",
            "--groupmap=*:daemon",
        ],
        &[
            "--numeric-ids",
            "--usermap=daemon:bin,:man",
            "--groupmap=0-10:60,7:1",
        ],
        &["--usermap=man:0,2:1042,[ab]*:3", "--groupmap=:tty,12:mail"],
        &["--chown=bin:mail"],
        &["--chown=:60001"],
    ];
    for (i, opts) in sets.iter().enumerate() {
        let (oracle, local) = (t.path(&format!("rsync{i}")), t.path(&format!("local{i}")));
        rsync(opts, &oracle);
        rcp(opts, src.as_os_str(), local.as_os_str());
        compare(&format!("local {opts:?}"), &oracle, &local);
        // The maps changed something (else the comparison proves little).
        assert!(!differences(&src, &oracle).is_empty(), "{opts:?}");
    }

    // The receiver compares what it was sent, mapped: a re-sync with the
    // same map sends nothing, one without it puts the owners back (no
    // data sent: only metadata differs).
    let into = t.path("resynced");
    std::fs::create_dir(&into).unwrap();
    let resync = |opts: &[&str]| {
        let out = Command::new(RCP)
            .args(["-a", "--json"])
            .args(opts)
            .arg(&src)
            .arg(&into)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["bytes"].as_u64().unwrap()
    };
    let copy = into.join("src");
    assert!(resync(sets[0]) > 0);
    compare("local, into a directory", &t.path("rsync0"), &copy);
    assert_eq!(resync(sets[0]), 0, "unchanged");
    compare("re-sync with the map", &t.path("rsync0"), &copy);
    assert_eq!(resync(&[]), 0, "only owners differ");
    let plain = t.path("rsync-plain");
    rsync(&[], &plain);
    compare("re-sync without the map", &plain, &copy);

    // Daemon push (the client maps what it sends) and pull (the client
    // maps what arrives); remote shell, both ways.
    let key = secret(&t, "key");
    let daemon = Daemon::start_with(&[t.dir()], &key, &["--allow-owners"]);
    for (i, opts) in sets.iter().enumerate().take(3) {
        let oracle = t.path(&format!("rsync{i}"));
        let with_key = [&["--secret-file", key.to_str().unwrap()], *opts].concat();
        let pushed = t.path(&format!("pushed{i}"));
        rcp(&with_key, src.as_os_str(), OsStr::new(&daemon.url(&pushed)));
        compare(&format!("daemon push {opts:?}"), &oracle, &pushed);
        let pulled = t.path(&format!("pulled{i}"));
        rcp(&with_key, OsStr::new(&daemon.url(&src)), pulled.as_os_str());
        compare(&format!("daemon pull {opts:?}"), &oracle, &pulled);
    }
    let (rsh, path) = fake_rsh(&t);
    for (i, far_is_dest) in [(0, true), (1, false)] {
        let oracle = t.path(&format!("rsync{i}"));
        let shelled = t.path(&format!("shelled{i}"));
        let (from, to) = if far_is_dest {
            (
                src.display().to_string(),
                format!("localhost:{}", shelled.display()),
            )
        } else {
            (
                format!("localhost:{}", src.display()),
                shelled.display().to_string(),
            )
        };
        run(Command::new(RCP)
            .args(["-q", "-a", "--rsh"])
            .arg(&rsh)
            .args(sets[i])
            .arg(from)
            .arg(to)
            .env("PATH", &path));
        compare(&format!("remote shell {:?}", sets[i]), &oracle, &shelled);
    }
}

/// A map that cannot be used stops the copy before anything is made.
#[test]
fn bad_owner_maps_are_refused_before_anything_is_copied() {
    let t = Scratch::new("archive-bad-maps");
    std::fs::write(t.path("f"), b"x").unwrap();
    for (opts, says) in [
        (&["--usermap=*:no-such-user-here"][..], "no user called"),
        (&["--groupmap=1:no-such-group-here"][..], "no group called"),
        (&["--usermap=1000"][..], "no colon"),
        (&["--usermap=9-5:0"][..], "runs backwards"),
        (&["--groupmap=[a:0"][..], "not closed"),
        (&["--chown=:"][..], "neither a user nor a group"),
        (&["--chown=bin", "--usermap=1:2"][..], "cannot be used with"),
    ] {
        let out = Command::new(RCP)
            .arg("-a")
            .args(opts)
            .arg(t.path("f"))
            .arg(t.path("g"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{opts:?}: {err}");
        assert!(err.contains(says), "{opts:?}: {err}");
        assert!(!t.path("g").exists(), "{opts:?}");
    }
}
