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
