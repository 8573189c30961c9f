//! A received file is on disk before it gets its name, by whichever way
//! its filesystem allows (`tree/together.rs`): in rounds of one `syncfs`
//! with each file's own writeback errors asked; by an `fdatasync` of its
//! own where the filesystem has no rounds; and by its own `fdatasync`
//! again when its round fails. A healthy XFS only ever takes the first,
//! so a test hook (`RCP_TEST_DURABILITY`, test builds only) sends copies
//! down the other two. Each way is checked twice: the copy arrives whole,
//! and strace shows the calls of that way and not those of another.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use test_support::Scratch;

mod common;
use common::xfs::Xfs;
use common::{RCP, s};

/// Files in the tree, each made durable before its name.
const FILES: usize = 120;

fn tree(src: &Path) {
    for i in 0..FILES {
        let dir = src.join(format!("d{}", i % 4));
        std::fs::create_dir_all(&dir).unwrap();
        // Empty, small, and past the chunk (several chunks to assemble).
        let len = [0, 1, 4096, 70_000, 5 << 20][i % 5];
        let bytes: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
        std::fs::write(dir.join(format!("f{i}")), bytes).unwrap();
    }
}

/// Copies `src` to `dst` under `hook` with the threads engine (whose
/// syncs are system calls strace sees), and counts the sync calls made.
fn copy_counting(t: &Scratch, hook: Option<&str>, src: &Path, dst: &Path) -> HashMap<String, u64> {
    let counts = t.path("strace.out");
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-c", "-U", "name,calls", "-o"])
        .arg(&counts)
        .args(["-e", "trace=fdatasync,fsync,syncfs,sync_file_range"])
        .args([RCP, "-q", "-a", "--io-engine", "threads", s(src), s(dst)]);
    if let Some(hook) = hook {
        cmd.env("RCP_TEST_DURABILITY", hook);
    }
    let out = cmd.output().expect("strace (scripts/setup installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&counts).unwrap();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, calls) = (w.next()?, w.next()?.parse().ok()?);
            Some((name.to_string(), calls))
        })
        .collect()
}

fn assert_arrived(src: &Path, dst: &Path) {
    for i in 0..FILES {
        let rel = format!("d{}/f{i}", i % 4);
        assert_eq!(
            std::fs::read(src.join(&rel)).unwrap(),
            std::fs::read(dst.join(&rel)).unwrap(),
            "{rel}"
        );
    }
}

#[test]
fn every_way_a_file_is_made_durable_delivers_the_copy() {
    let t = Scratch::new("durability");
    let Some(xfs) = Xfs::mount(&t) else { return };
    let src = t.path("src");
    tree(&src);
    let calls = |counts: &HashMap<String, u64>, name: &str| counts.get(name).copied().unwrap_or(0);
    let files = FILES as u64;

    // Rounds: fewer `syncfs` than files, no `fdatasync`, every file's own
    // writeback errors asked.
    let dst = xfs.path().join("rounds");
    let c = copy_counting(&t, None, &src, &dst);
    assert_arrived(&src, &dst);
    assert!((1..files).contains(&calls(&c, "syncfs")), "{c:?}");
    assert_eq!(calls(&c, "fdatasync"), 0, "{c:?}");
    assert!(calls(&c, "sync_file_range") >= files, "{c:?}");

    // A filesystem without rounds: an `fdatasync` a file, no round.
    let dst = xfs.path().join("each-file");
    let c = copy_counting(&t, Some("each-file"), &src, &dst);
    assert_arrived(&src, &dst);
    assert_eq!(calls(&c, "syncfs"), 0, "{c:?}");
    assert!(calls(&c, "fdatasync") >= files, "{c:?}");

    // Every round fails (the hook stands in for `syncfs`, which is then
    // not called): each file falls back to its own `fdatasync`, and the
    // copy still arrives whole.
    let dst = xfs.path().join("rounds-fail");
    let c = copy_counting(&t, Some("rounds-fail"), &src, &dst);
    assert_arrived(&src, &dst);
    assert!(calls(&c, "fdatasync") >= files, "{c:?}");
    assert_eq!(calls(&c, "sync_file_range"), 0, "{c:?}");
}
