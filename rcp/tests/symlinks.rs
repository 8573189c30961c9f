//! Symlink choices against the oracle: `-L`, `--copy-unsafe-links` and
//! `--safe-links` copy what rsync with the same flag copies (and with
//! `--delete` keep and delete what it does), locally and pushed and
//! pulled through a remote shell, and with `--files-from`. rcp copies the directory
//! named, so its tree is rsync's `SRC/` (a link's `..` may climb to the
//! directory copied, not above it). Where rsync loops or gives up, rcp
//! says why for each symlink and copies the rest: a symlink with no
//! referent, or one that leads to a directory it is in, fails alone
//! (exit status 1). `rcp serve` follows no symlink out of its roots.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_support::{Scratch, pattern};

mod common;
use common::trees::run;
use common::{Daemon, RCP, fake_rsh, s, secret};

/// Each entry beneath `root` (type, mode, contents or symlink target,
/// and a regular file's time) by its path. Not the times of directories
/// and symlinks: rsync 3.5 leaves them unset with --copy-unsafe-links
/// (without it, it sets them, as rcp does with every choice).
fn entries(root: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if m.file_type().is_symlink() {
                format!("symlink to {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("directory {:o}", m.mode())
            } else {
                let data = std::fs::read(&p).unwrap();
                format!(
                    "file {:o} of {} bytes ({:x}), time {}.{}",
                    m.mode(),
                    data.len(),
                    data.iter()
                        .fold(0u64, |h, &b| h.rotate_left(5) ^ u64::from(b)),
                    m.mtime(),
                    m.mtime_nsec()
                )
            };
            out.insert(p.strip_prefix(root).unwrap().to_path_buf(), what);
        }
    }
    out
}

fn assert_same(what: &str, a: &Path, b: &Path) {
    assert_eq!(entries(a), entries(b), "{what}");
}

/// `top/src` holding every kind of symlink the rules tell apart, and
/// `top/outside` beside it, which some of them point into. With
/// `dangling`, a symlink to nothing as well.
fn tree(top: &Path, dangling: bool) -> PathBuf {
    let src = top.join("src");
    let outside = top.join("outside");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(outside.join("odir")).unwrap();
    std::fs::write(outside.join("o.txt"), pattern(3000, 1)).unwrap();
    std::fs::write(outside.join("odir/x"), pattern(70_000, 2)).unwrap();
    std::fs::write(src.join("in.txt"), pattern(500, 3)).unwrap();
    std::fs::write(src.join("sub/s"), pattern(10, 4)).unwrap();
    let links: [(&str, String); 9] = [
        // Inside the tree.
        ("rel-in", "in.txt".into()),
        ("dir-in", "sub".into()),
        ("sub/up-in", "../in.txt".into()),
        ("sub/deeper/up-twice", "../../in.txt".into()),
        // Outside it: climbing above src, or absolute.
        ("rel-out", "../outside/o.txt".into()),
        ("dir-out", "../outside/odir".into()),
        ("sub/climbs", "../../src/in.txt".into()),
        ("abs-out", outside.join("o.txt").display().to_string()),
        ("abs-dir", outside.join("odir").display().to_string()),
    ];
    for (name, target) in links {
        symlink(target, src.join(name)).unwrap();
    }
    if dangling {
        symlink("nowhere", src.join("dangling")).unwrap();
    }
    src
}

/// rcp with `args`, its output.
fn rcp(args: &[&str], env_path: Option<&str>) -> Output {
    let mut cmd = Command::new(RCP);
    cmd.args(args);
    if let Some(p) = env_path {
        cmd.env("PATH", p);
    }
    cmd.output().expect("rcp runs")
}

fn succeeded(how: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{how}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn symlink_choices_copy_what_rsync_copies_in_every_mode() {
    let t = Scratch::new("rcp-symlinks");
    let src = tree(t.dir(), true);
    let (rsh, path) = fake_rsh(&t);
    let choices: [&[&str]; 5] = [
        // (A symlink to a directory, inside the tree or out, walked as
        // that directory; the others stay symlinks.)
        &["-k"],
        &["--copy-unsafe-links"],
        &["--safe-links"],
        &["--copy-unsafe-links", "--safe-links"],
        // (rsync gives up on a symlink to nothing: -L without it.)
        &["-L", "--exclude", "dangling"],
    ];
    // Both destinations hold a file under the name of a symlink that
    // leads outside, and one the source does not have: with --delete,
    // --safe-links keeps the first (rsync's receiver ignores the symlink
    // and keeps the name), the others replace it, and the second goes.
    let from_before = |dest: &Path| {
        std::fs::create_dir_all(dest.join("src")).unwrap();
        std::fs::write(dest.join("src/abs-out"), b"from before").unwrap();
        std::fs::write(dest.join("src/gone"), b"not in the source").unwrap();
        let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000);
        let f = std::fs::File::options()
            .write(true)
            .open(dest.join("src/abs-out"))
            .unwrap();
        f.set_modified(then).unwrap();
    };
    for (n, flags) in choices.iter().enumerate() {
        let oracle = t.path(&format!("rsync-{n}"));
        from_before(&oracle);
        run(Command::new("rsync")
            .args(["-a", "--delete"])
            .args(*flags)
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", oracle.join("src").display())));
        assert!(!oracle.join("src/gone").exists());
        for how in ["local", "pushed", "pulled"] {
            let dest = t.path(&format!("rcp-{n}-{how}"));
            from_before(&dest);
            let mut args = vec!["-a", "--delete"];
            args.extend(*flags);
            let (from, to) = match how {
                "local" => (s(&src).to_string(), format!("{}/", dest.display())),
                "pushed" => (
                    s(&src).to_string(),
                    format!("localhost:{}/", dest.display()),
                ),
                _ => (
                    format!("localhost:{}", src.display()),
                    format!("{}/", dest.display()),
                ),
            };
            if how != "local" {
                args.extend(["--rsh", s(&rsh)]);
            }
            args.extend([from.as_str(), to.as_str()]);
            let out = rcp(&args, (how != "local").then_some(path.as_str()));
            succeeded(&format!("{flags:?} {how}"), &out);
            assert_same(&format!("{flags:?} {how}"), &oracle, &dest);
        }
    }
}

/// A `--files-from` walk's names are below the directory copied: a
/// symlink in `sub` may climb once and stay inside.
#[test]
fn symlinks_listed_with_files_from_are_judged_from_the_directory_copied() {
    let t = Scratch::new("rcp-symlinks-listed");
    let src = tree(t.dir(), false);
    let list = t.path("list");
    std::fs::write(&list, "in.txt\nsub/up-in\nsub/climbs\nrel-out\ndir-in\n").unwrap();
    for (n, flag) in ["--copy-unsafe-links", "--safe-links"].iter().enumerate() {
        let oracle = t.path(&format!("rsync-{n}"));
        let dest = t.path(&format!("rcp-{n}"));
        for d in [&oracle, &dest] {
            std::fs::create_dir(d).unwrap();
        }
        run(Command::new("rsync")
            .args(["-a", flag, "--files-from", s(&list)])
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", oracle.display())));
        let out = rcp(
            &[
                "-a",
                flag,
                "--files-from",
                s(&list),
                s(&src),
                &format!("{}/", dest.display()),
            ],
            None,
        );
        succeeded(flag, &out);
        assert_same(flag, &oracle, &dest);
    }
}

#[test]
fn a_symlink_to_nothing_or_to_a_directory_it_is_in_fails_alone_with_copy_links() {
    let t = Scratch::new("rcp-symlink-fails");
    let src = tree(t.dir(), true);
    symlink("..", src.join("sub/loop")).unwrap();
    let (rsh, path) = fake_rsh(&t);
    for how in ["local", "pulled"] {
        let dest = t.path(&format!("dest-{how}"));
        std::fs::create_dir(&dest).unwrap();
        let mut args = vec!["-rL"];
        let from = match how {
            "local" => s(&src).to_string(),
            _ => {
                args.extend(["--rsh", s(&rsh)]);
                format!("localhost:{}", src.display())
            }
        };
        let to = format!("{}/", dest.display());
        args.extend([from.as_str(), to.as_str()]);
        let out = rcp(&args, Some(path.as_str()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{how}: {stderr}");
        // Said once each, on the side the user started.
        for said in [
            "src/dangling: symlink has no referent: No such file or directory",
            "src/sub/loop: symlink loop: it leads to a directory this one is in",
            "src/dir-in/loop: symlink loop",
        ] {
            assert_eq!(stderr.matches(said).count(), 1, "{how}: {said}: {stderr}");
        }
        // The rest arrived, what the symlinks point to in their place.
        let copy = dest.join("src");
        assert!(!copy.join("dangling").exists() && !copy.join("sub/loop").exists());
        assert_eq!(
            std::fs::read(copy.join("abs-out")).unwrap(),
            pattern(3000, 1),
            "{how}"
        );
        assert_eq!(
            std::fs::read(copy.join("dir-out/x")).unwrap(),
            pattern(70_000, 2),
            "{how}"
        );
        assert_eq!(
            std::fs::read(copy.join("dir-in/deeper/up-twice")).unwrap(),
            pattern(500, 3),
            "{how}"
        );
        assert!(
            !std::fs::symlink_metadata(copy.join("rel-in"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
}

#[test]
fn a_daemon_follows_no_symlink_out_of_its_roots() {
    let t = Scratch::new("rcp-symlink-daemon");
    let src = tree(t.dir(), false);
    let dest = t.path("dest");
    std::fs::create_dir(&dest).unwrap();
    let key = secret(&t, "s");
    let daemon = Daemon::start(&[t.dir()], &key);
    std::fs::create_dir(t.path("pulled")).unwrap();
    for flag in ["-L", "--copy-unsafe-links", "-k"] {
        let out = rcp(
            &[
                "-r",
                flag,
                "--secret-file",
                s(&key),
                &daemon.url(&src),
                &format!("{}/", t.path("pulled").display()),
            ],
            None,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{flag}: {stderr}");
        assert!(
            stderr.contains("rcp serve follows no symlinks"),
            "{flag}: {stderr}"
        );
        assert!(!t.path("pulled/src").exists(), "{flag}: nothing pulled");
    }
    // Leaving out what leads outside is the daemon's to do; and a push
    // follows on the client's side, which is the user's own.
    let out = rcp(
        &[
            "-r",
            "--safe-links",
            "--secret-file",
            s(&key),
            &daemon.url(&src),
            &format!("{}/", t.path("pulled").display()),
        ],
        None,
    );
    succeeded("--safe-links pull", &out);
    assert!(!t.path("pulled/src/abs-out").exists());
    assert!(std::fs::symlink_metadata(t.path("pulled/src/rel-in")).is_ok());
    let out = rcp(
        &["-rL", "--secret-file", s(&key), s(&src), &daemon.url(&dest)],
        None,
    );
    succeeded("-L push", &out);
    assert_eq!(
        std::fs::read(dest.join("src/dir-out/x")).unwrap(),
        pattern(70_000, 2)
    );
}
