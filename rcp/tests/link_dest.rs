//! `--link-dest` against the oracle: a snapshot of a generated tree (every
//! kind of entry, hard-link groups, xattrs, ACLs) taken after some of its
//! files changed (contents, a mode, an attribute), with the snapshot
//! before as `--link-dest=../prev`, through rcp and through rsync. The two
//! new snapshots are the same entry by entry, and the same files in each
//! are links to the snapshot before, in every mode (local, push and pull
//! through `rcp serve`, remote shell).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use test_support::Scratch;

mod common;
use common::trees::{assert_same, generate, rsync_available, run, set_times, set_xattr};
use common::{Daemon, RCP, fake_rsh, s, secret};

/// The files beneath `new` that are the same file as the one under their
/// name beneath `prev`.
fn linked_to(new: &Path, prev: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![new.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(new).unwrap().to_path_buf();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file()
                && std::fs::symlink_metadata(prev.join(&rel))
                    .is_ok_and(|o| (o.dev(), o.ino()) == (m.dev(), m.ino()))
            {
                out.insert(rel);
            }
        }
    }
    out
}

/// Changes some of `root`'s files as a day's work would: contents (size
/// and time), a mode, an attribute; the rest stay as they were.
fn change(root: &Path) -> usize {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() && m.nlink() == 1 {
                files.push(p);
            }
        }
    }
    use std::os::unix::fs::PermissionsExt;
    for (k, f) in files.iter().enumerate() {
        match k % 6 {
            0 => {
                std::fs::write(f, b"changed today").unwrap();
                set_times(f, 1_800_000_000, 5);
            }
            1 => {
                let mode = std::fs::metadata(f).unwrap().permissions().mode();
                std::fs::set_permissions(f, std::fs::Permissions::from_mode(mode ^ 0o004)).unwrap();
            }
            2 => set_xattr(f, "user.today", b"new"),
            _ => {}
        }
    }
    files.len()
}

#[test]
fn link_dest_links_what_rsync_links_in_every_mode() {
    if !rsync_available() {
        eprintln!("rsync is not installed: skipped");
        return;
    }
    let t = Scratch::new("rcp-link-dest");
    let key = secret(&t, "key");
    // (Owners and device nodes, as the tree has them.)
    let daemon = Daemon::start_with(&[t.dir()], &key, &["--allow-owners"]);
    let (rsh, path) = fake_rsh(&t);
    for (k, how) in ["local", "push", "pull", "remote shell"]
        .into_iter()
        .enumerate()
    {
        // (Short names: the tree holds sockets, whose paths are short.)
        let case = t.path(&format!("c{k}"));
        let src = case.join("s");
        generate(&src, 60 + k as u64);
        // Yesterday's snapshots, one for each tool: the same tree.
        for prev in ["p", "rp"] {
            run(Command::new("rsync")
                .arg("-aHAX")
                .arg(format!("{}/", src.display()))
                .arg(format!("{}/", case.join(prev).display())));
        }
        let files = change(&src);
        assert!(files >= 6, "{how}: {files} files to change");
        // Today's: rsync's, then rcp's (`s` copied as the new name `n`).
        run(Command::new("rsync")
            .args(["-aHAX", "--link-dest=../rp"])
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", case.join("rn").display())));
        let new = case.join("n");
        let (from, to) = match how {
            "local" => (s(&src).to_string(), s(&new).to_string()),
            "push" => (s(&src).to_string(), daemon.url(&new)),
            "pull" => (daemon.url(&src), s(&new).to_string()),
            _ => (s(&src).to_string(), format!("localhost:{}", new.display())),
        };
        let out = Command::new(RCP)
            .args(["-aHAX", "--link-dest=../p", "--secret-file", s(&key)])
            .args(["--rsh", s(&rsh)])
            .arg(&from)
            .arg(&to)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (ours, theirs) = (
            linked_to(&new, &case.join("p")),
            linked_to(&case.join("rn"), &case.join("rp")),
        );
        assert_eq!(
            (
                ours.difference(&theirs).collect::<Vec<_>>(),
                theirs.difference(&ours).collect::<Vec<_>>()
            ),
            (vec![], vec![]),
            "{how}: the files linked to the snapshot before, by rcp only and by rsync only"
        );
        assert_same(how, &case.join("rn"), &new);
        let regular = common::trees::look(&new)
            .0
            .values()
            .filter(|seen| seen.mode & 0o170000 == 0o100000)
            .count();
        assert!(
            !ours.is_empty() && ours.len() < regular,
            "{how}: some files linked, not all ({} of {regular})",
            ours.len()
        );
    }
}

#[test]
fn a_link_dest_that_is_not_there_is_said_and_the_copy_goes_on() {
    let t = Scratch::new("rcp-link-dest-missing");
    let src = t.path("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"data").unwrap();
    let out = Command::new(RCP)
        .args(["-a", "--link-dest=../nowhere"])
        .arg(&src)
        .arg(t.path("new"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--link-dest") && stderr.contains("nowhere"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(t.path("new/f")).unwrap(), b"data");
    let many: Vec<String> = (0..21).map(|k| format!("--link-dest=d{k}")).collect();
    let out = Command::new(RCP)
        .args(&many)
        .arg(&src)
        .arg(t.path("other"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 20"));
}
