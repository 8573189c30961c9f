//! Broadcast over a cluster on this host: every "node" a network
//! namespace with its own address on one bridge and its own disk
//! (`tests/broadcast/cluster`), rcp started in each through an `--rsh`
//! that enters the namespace (as ssh would log in). A big file, a sparse
//! file and an archive tree reach all eight nodes byte for byte; a node
//! killed mid-broadcast, a full disk and a wrong token fail only their
//! own node. Needs root (namespaces, bind mounts); says so and passes
//! without it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use test_support::Scratch;

mod common;
use common::RCP;
use common::trees::{differences, generate, is_root};

const CLUSTER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/broadcast/cluster");

/// A cluster of `n` nodes for one test: made on creation, removed on drop.
struct Cluster {
    name: String,
    n: usize,
    octet: u8,
    /// Where the rsh, the hooks and each node's disk (`node-K`) are.
    dir: PathBuf,
    /// The path every node writes to (its own disk is mounted there).
    dest: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Cluster {
    /// `None` (after saying why) where namespaces cannot be made.
    fn new(t: &Scratch, name: &str, n: usize, octet: u8, rate: Option<&str>) -> Option<Cluster> {
        if !is_root() {
            eprintln!("skipped: broadcast tests make network namespaces, which needs root");
            return None;
        }
        let dir = t.path("cluster");
        let dest = t.path("dst");
        std::fs::create_dir_all(&dest).unwrap();
        for k in 1..=n {
            std::fs::create_dir_all(dir.join(format!("node-{k}"))).unwrap();
        }
        // (A cluster a killed run left behind goes first.)
        let _ = Command::new(CLUSTER)
            .args(["down", name, &n.to_string()])
            .output();
        let mut up = Command::new(CLUSTER);
        up.args(["up", name, &n.to_string(), &octet.to_string()]);
        up.args(rate);
        ok(&mut up);
        let cluster = Cluster {
            name: name.into(),
            n,
            octet,
            dir,
            dest,
            mounts: Vec::new(),
        };
        ok(Command::new(CLUSTER).args([
            "rsh",
            name,
            cluster.dir.to_str().unwrap(),
            cluster.dest.to_str().unwrap(),
        ]));
        Some(cluster)
    }

    /// `10.OCTET.0.[1-N]:DEST/rel`.
    fn operand(&self, rel: &str) -> String {
        format!(
            "10.{}.0.[1-{}]:{}/{rel}",
            self.octet,
            self.n,
            self.dest.display()
        )
    }

    /// Node `k`'s address, `10.OCTET.0.k`.
    fn addr(&self, k: usize) -> String {
        format!("10.{}.0.{k}", self.octet)
    }

    fn disk(&self, k: usize) -> PathBuf {
        self.dir.join(format!("node-{k}"))
    }

    /// Node `k`'s disk holds only `bytes` (a tmpfs that size).
    fn small_disk(&mut self, k: usize, bytes: usize) {
        let disk = self.disk(k);
        ok(Command::new("mount").args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={bytes}"),
            "tmpfs",
            disk.to_str().unwrap(),
        ]));
        self.mounts.push(disk);
    }

    /// rcp broadcasting `args` through this cluster's rsh.
    fn rcp(&self, args: &[&str]) -> Command {
        let mut c = Command::new(RCP);
        let bin = Path::new(RCP).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        c.env("PATH", path)
            .args(["--rsh", self.dir.join("rsh").to_str().unwrap()])
            .args(["--timeout", "10", "--json"])
            .args(args);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &self.mounts {
            let _ = Command::new("umount").arg(m).output();
        }
        let _ = Command::new(CLUSTER)
            .args(["down", &self.name, &self.n.to_string()])
            .output();
    }
}

fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The run ended with exit status 1: it ran, and something failed.
fn some_failed(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn summary(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The nodes' results by name: (ok, reason).
fn nodes(v: &serde_json::Value) -> Vec<(String, bool, String)> {
    v["nodes"]
        .as_array()
        .expect("a broadcast names its nodes")
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["ok"].as_bool().unwrap(),
                n["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn random_file(path: &Path, len: usize, seed: u64) {
    std::fs::write(path, test_support::pattern(len, seed)).unwrap();
}

/// Fails, saying `what`, unless `copy` holds what `original` does (not
/// printing either: they are large).
fn assert_copy(copy: &Path, original: &Path, what: &str) {
    assert!(
        std::fs::read(copy).unwrap() == std::fs::read(original).unwrap(),
        "{what} differs"
    );
}

#[test]
fn a_file_a_sparse_file_and_a_tree_reach_all_eight_nodes() {
    let t = Scratch::new("bcast-all");
    let Some(c) = Cluster::new(&t, "rbca", 8, 201, None) else {
        return;
    };
    let big = t.path("big");
    random_file(&big, 5 * 1024 * 1024 + 4321, 1);
    // The issue's shape: one data chunk that is not the first.
    let sparse = t.path("sparse");
    let f = std::fs::File::create(&sparse).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let data = test_support::pattern(1 << 20, 2);
    std::os::unix::fs::FileExt::write_at(
        &std::fs::File::options().write(true).open(&sparse).unwrap(),
        &data,
        40 << 20,
    )
    .unwrap();
    let tree = t.path("tree");
    let made = generate(&tree, 7);
    assert!(made.files > 3, "{made:?}");

    let out = ok(c
        .rcp(&["--chunk-size", "256K"])
        .args([big.to_str().unwrap(), sparse.to_str().unwrap()])
        .arg(c.operand("")));
    let v = summary(&out);
    let all = nodes(&v);
    assert_eq!(all.len(), 8, "{v}");
    for (k, (name, good, why)) in all.iter().enumerate() {
        assert_eq!(name, &c.addr(k + 1));
        assert!(good, "{name}: {why}");
        for f in ["big", "sparse"] {
            let there = std::fs::read(c.disk(k + 1).join(f)).unwrap();
            assert!(
                there == std::fs::read(t.path(f)).unwrap(),
                "{name}: {f} differs"
            );
        }
        // Holes stay holes: the sparse file takes about its one chunk.
        let meta = std::fs::metadata(c.disk(k + 1).join("sparse")).unwrap();
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < 8 << 20,
            "{name}: the sparse file was filled in"
        );
    }
    assert_eq!(v["ok"], true);

    // An archive tree, as rsync -aHAX would copy it, to every node.
    let out = ok(c.rcp(&["-aHAX"]).arg(&tree).arg(c.operand("")));
    let v = summary(&out);
    assert!(nodes(&v).iter().all(|(_, good, _)| *good), "{v}");
    for k in 1..=8 {
        let diff = differences(&tree, &c.disk(k).join("tree"));
        assert!(diff.is_empty(), "node {k}: {diff:#?}");
    }
}

#[test]
fn a_node_killed_mid_broadcast_is_cut_out_and_the_others_finish() {
    let t = Scratch::new("bcast-kill");
    // Slow links (a node's disk fills in seconds, not milliseconds), so
    // that the kill lands mid-copy.
    let Some(c) = Cluster::new(&t, "rbck", 8, 202, Some("200mbit")) else {
        return;
    };
    let big = t.path("big");
    random_file(&big, 24 << 20, 3);
    std::fs::write(c.dir.join("kill-4"), b"").unwrap();
    // Unencrypted: node 3 sends its chunks on from its landing slots, so
    // its onward link holds them (and their credits) when node 4 dies;
    // they must come back for node 3 to finish. (The --resume runs below
    // are encrypted: copies.)
    let child = c
        .rcp(&["--chunk-size", "256K", "--encrypt", "never"])
        .arg(&big)
        .arg(c.operand(""))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Node 4 is killed once a fifth of the file reached it.
    let part = c.disk(4).join(".rcp-big.part");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let landed = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        if landed > 5 << 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 4 never got a fifth of the file"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = std::fs::read_to_string(c.dir.join("pid-4")).unwrap();
    ok(Command::new("kill").args(["-9", pid.trim()]));
    std::fs::remove_file(c.dir.join("kill-4")).unwrap();
    let out = child.wait_with_output().unwrap();
    some_failed(&out);
    let v = summary(&out);
    let all = nodes(&v);
    assert_eq!(all.len(), 8);
    let want = std::fs::read(&big).unwrap();
    for (k, (name, good, why)) in all.iter().enumerate() {
        let k = k + 1;
        if k == 4 {
            assert!(!good, "the killed node reported ok");
            assert!(
                why.contains("forwarding to it failed") || why.contains("lost"),
                "{why}"
            );
            assert!(
                !c.disk(4).join("big").exists(),
                "a partial copy under the final name"
            );
            continue;
        }
        assert!(good, "{name}: {why}");
        assert!(
            std::fs::read(c.disk(k).join("big")).unwrap() == want,
            "{name} differs"
        );
    }
    assert_eq!(v["ok"], false);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("{}: FAILED", c.addr(4))));

    // The same broadcast again with --resume completes the failed node:
    // what it had is kept, the others (which have it all) only pass on
    // what it lacks, in one round.
    let out = ok(c
        .rcp(&["--resume", "--chunk-size", "256K"])
        .arg(&big)
        .arg(c.operand("")));
    let v = summary(&out);
    assert!(nodes(&v).iter().all(|(_, good, _)| *good), "{v}");
    assert_eq!(v["rounds"].as_array().unwrap().len(), 1, "{v}");
    let sent = v["bytes"].as_u64().unwrap();
    assert!(
        sent > 0 && sent <= (24 << 20) - (4 << 20),
        "{sent} bytes sent: node 4 had more than 5 MiB"
    );
    for k in 1..=8 {
        assert!(
            std::fs::read(c.disk(k).join("big")).unwrap() == want,
            "node {k} differs"
        );
    }
    // Once more: every node has every chunk, nothing is sent.
    let v = summary(&ok(c
        .rcp(&["--resume", "--chunk-size", "256K"])
        .arg(&big)
        .arg(c.operand(""))));
    assert_eq!(v["bytes"], 0, "{v}");
}

/// Each node's data bytes, in the order named.
fn node_bytes(v: &serde_json::Value) -> Vec<u64> {
    let all = v["nodes"].as_array().expect("a broadcast names its nodes");
    all.iter().map(|n| n["bytes"].as_u64().unwrap()).collect()
}

#[test]
fn a_re_broadcast_sends_what_any_node_lacks_once_and_the_others_let_it_pass() {
    let t = Scratch::new("bcast-resync");
    let Some(c) = Cluster::new(&t, "rbcr", 5, 205, None) else {
        return;
    };
    let big = t.path("big");
    random_file(&big, (3 << 20) + 777, 6);
    let small = t.path("small");
    random_file(&small, 1000, 7);
    // Every node checks what it has on threads of its own, however few
    // the files (`RCP_TEST_PRECHECK`: the receiver's checks, as on a large
    // tree), so that passing files, `-c` and `--ignore-existing` go that
    // way too.
    let run = |args: &[&str]| {
        let v = summary(&ok(c
            .rcp(&[&["--chunk-size", "256K"], args].concat())
            .env("RCP_TEST_PRECHECK", "every-batch")
            .args([&big, &small])
            .arg(c.operand(""))));
        assert!(nodes(&v).iter().all(|(_, good, _)| *good), "{v}");
        v
    };
    let same_everywhere = || {
        for k in 1..=5 {
            for f in [&big, &small] {
                let name = f.file_name().unwrap();
                assert!(
                    std::fs::read(c.disk(k).join(name)).unwrap() == std::fs::read(f).unwrap(),
                    "node {k}: {name:?} differs"
                );
            }
        }
    };
    // Unencrypted, so that each node sends the chunks on straight from
    // its landing slots (the digest vouches for them: the seal leaves the
    // payload alone).
    let v = run(&["-p", "--encrypt", "never"]);
    assert_eq!(v["bytes"], (3 << 20) + 777 + 1000, "{v}");
    assert_eq!(v["encrypted"], false, "{v}");
    same_everywhere();

    // Unchanged: the quick check skips both files on every node, and
    // each node's checks found both there.
    let out = ok(c
        .rcp(&["--chunk-size", "256K", "-p"])
        .env("RCP_TEST_PRECHECK", "every-batch")
        .args([&big, &small])
        .arg(c.operand("")));
    let said = String::from_utf8_lossy(&out.stderr);
    let cleared = said
        .matches("rcp test: the checks cleared 2 entries")
        .count();
    assert_eq!(cleared, 5, "{said}");
    let v = summary(&out);
    assert!(nodes(&v).iter().all(|(_, good, _)| *good), "{v}");
    assert_eq!(v["bytes"], 0, "{v}");
    assert_eq!(v["skipped"], 2, "{v}");
    assert_eq!(node_bytes(&v), vec![0; 5], "{v}");

    // Node 2 lost big: it is sent once, and the nodes that have it (the
    // first before node 2, the last after it) let it pass.
    std::fs::remove_file(c.disk(2).join("big")).unwrap();
    let v = run(&["-p"]);
    assert_eq!(v["bytes"], (3 << 20) + 777, "{v}");
    assert_eq!(node_bytes(&v), vec![0, (3 << 20) + 777, 0, 0, 0], "{v}");
    same_everywhere();

    // One chunk of node 3's big changed behind the quick check's back
    // (same size, same time): -c sends that chunk alone, once; the merged
    // digests cannot say which node differs, so every node writes it
    // (the same bytes, for all but node 3).
    let theirs = c.disk(3).join("big");
    let mtime = std::fs::metadata(&theirs).unwrap().modified().unwrap();
    let f = std::fs::File::options().write(true).open(&theirs).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"changed", (1 << 20) + 5).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(run(&["-p"])["bytes"], 0, "the quick check cannot see it");
    let v = run(&["-p", "-c"]);
    assert_eq!(v["bytes"], 256 * 1024, "{v}");
    assert_eq!(node_bytes(&v), vec![256 * 1024; 5], "{v}");
    same_everywhere();

    // --ignore-existing leaves a changed source file alone everywhere.
    random_file(&small, 1200, 8);
    let v = run(&["-p", "--ignore-existing"]);
    assert_eq!(v["bytes"], 0, "{v}");
    for k in 1..=5 {
        assert_eq!(
            std::fs::metadata(c.disk(k).join("small")).unwrap().len(),
            1000
        );
    }
    // And the default sends it to all.
    let v = run(&["-p"]);
    assert_eq!(v["bytes"], 1200, "{v}");
    same_everywhere();
}

#[test]
fn a_source_file_whose_read_fails_fails_on_every_node_and_the_rest_arrives() {
    let t = Scratch::new("bcast-unread");
    let Some(c) = Cluster::new(&t, "rbcu", 3, 206, None) else {
        return;
    };
    let tree = t.path("tree");
    std::fs::create_dir(&tree).unwrap();
    // Files of several 256 KiB chunks, read in turn: the sixth read is
    // the second chunk of `f1` (`f0` has five), which fails as a bad
    // sector would (the test hook): f1 is abandoned with a chunk on its
    // way down the chain.
    random_file(&tree.join("f0"), 5 * (256 << 10), 20);
    random_file(&tree.join("f1"), 3 * (256 << 10) + 9, 21);
    random_file(&tree.join("f2"), 2 * (256 << 10), 22);
    let out = c
        .rcp(&["-r", "--chunk-size", "256K"])
        .env("RCP_TEST_FAIL_READ", "6")
        .arg(&tree)
        .arg(c.operand(""))
        .output()
        .unwrap();
    some_failed(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tree/f1"), "the file is named: {stderr}");
    let v = summary(&out);
    let all = nodes(&v);
    assert_eq!(all.len(), 3, "{v}");
    for (k, (name, good, why)) in all.iter().enumerate() {
        let disk = c.disk(k + 1).join("tree");
        assert!(!good, "{name}: f1 failed there too");
        assert!(
            why.contains("f1") || why.contains("Input/output"),
            "{name}: {why}"
        );
        assert!(!disk.join("f1").exists(), "{name}: nothing of f1 in place");
        for f in ["f0", "f2"] {
            assert!(
                std::fs::read(disk.join(f)).unwrap() == std::fs::read(tree.join(f)).unwrap(),
                "{name}: {f} differs"
            );
        }
        let left = common::temporaries_in(&disk);
        assert!(left.is_empty(), "{name}: temporary files left: {left:?}");
    }
}

#[test]
fn a_source_file_that_vanishes_is_said_once_and_every_node_is_ok() {
    let t = Scratch::new("bcast-vanish");
    let Some(c) = Cluster::new(&t, "rbcv", 2, 207, None) else {
        return;
    };
    let tree = t.path("tree");
    std::fs::create_dir(&tree).unwrap();
    random_file(&tree.join("f0"), 300_000, 30);
    random_file(&tree.join("gone"), 1000, 31);
    // (The test hook deletes `gone` just before the sender opens it.)
    let out = c
        .rcp(&["-r"])
        .env("RCP_TEST_VANISH", "gone")
        .arg(&tree)
        .arg(c.operand(""))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr.matches("file has vanished: tree/gone").count(),
        1,
        "said once: {stderr}"
    );
    let v = summary(&out);
    for (k, (name, good, why)) in nodes(&v).iter().enumerate() {
        let disk = c.disk(k + 1).join("tree");
        assert!(good, "{name}: {why}");
        assert!(!disk.join("gone").exists(), "{name}: nothing of it");
        assert_copy(&disk.join("f0"), &tree.join("f0"), &format!("{name}: f0"));
    }
}

#[test]
fn size_limits_reach_every_node() {
    let t = Scratch::new("bcast-sizes");
    let Some(c) = Cluster::new(&t, "rbcz", 3, 208, None) else {
        return;
    };
    let tree = t.path("tree");
    std::fs::create_dir(&tree).unwrap();
    random_file(&tree.join("small"), 100, 40);
    random_file(&tree.join("big"), 300_000, 41);
    let out = c
        .rcp(&["-r", "--max-size=1K"])
        .arg(&tree)
        .arg(c.operand(""))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in 1..=3 {
        let disk = c.disk(k).join("tree");
        assert!(!disk.join("big").exists(), "node {k}: big left out");
        assert_copy(
            &disk.join("small"),
            &tree.join("small"),
            &format!("node {k}: small"),
        );
    }
}

#[test]
fn link_dest_links_where_a_node_has_the_snapshot_and_the_data_goes_on_to_one_without() {
    use std::os::unix::fs::MetadataExt;
    let t = Scratch::new("bcast-linkdest");
    let Some(c) = Cluster::new(&t, "rbcl", 2, 209, None) else {
        return;
    };
    let tree = t.path("tree");
    std::fs::create_dir(&tree).unwrap();
    random_file(&tree.join("f"), 300_000, 50);
    random_file(&tree.join("g"), 1000, 51);
    // Node 1 has yesterday's snapshot; node 2, after it in the chain, has
    // none: node 1 links, and the data passes through it to node 2.
    ok(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", tree.display()))
        .arg(format!("{}/", c.disk(1).join("prev").display())));
    let out = c
        .rcp(&["-a", "--link-dest=../prev"])
        .arg(&tree)
        .arg(c.operand("new"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in 1..=2 {
        let new = c.disk(k).join("new");
        for f in ["f", "g"] {
            assert_copy(&new.join(f), &tree.join(f), &format!("node {k}: {f}"));
        }
    }
    let linked = |f: &str| {
        let (a, b) = (
            std::fs::metadata(c.disk(1).join("new").join(f)).unwrap(),
            std::fs::metadata(c.disk(1).join("prev").join(f)).unwrap(),
        );
        a.ino() == b.ino()
    };
    assert!(
        linked("f") && linked("g"),
        "node 1 linked from its snapshot"
    );
}

#[test]
fn a_full_disk_and_a_wrong_token_fail_only_their_own_node() {
    let t = Scratch::new("bcast-faults");
    let Some(mut c) = Cluster::new(&t, "rbcf", 5, 203, None) else {
        return;
    };
    c.small_disk(2, 1 << 20);
    std::fs::write(c.dir.join("bad-token-4"), b"").unwrap();
    let big = t.path("big");
    random_file(&big, 3 << 20, 4);
    let small = t.path("small");
    random_file(&small, 1000, 5);
    std::fs::set_permissions(&small, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = c
        .rcp(&["-p"])
        .args([&small, &big])
        .arg(c.operand(""))
        .output()
        .unwrap();
    some_failed(&out);
    let v = summary(&out);
    let all = nodes(&v);
    for (k, (name, good, why)) in all.iter().enumerate() {
        let k = k + 1;
        match k {
            2 => {
                assert!(!good);
                assert!(why.contains("No space left on device"), "{why}");
                assert!(!c.disk(2).join("big").exists());
                // What fits arrived whole.
                assert!(
                    std::fs::read(c.disk(2).join("small")).unwrap()
                        == std::fs::read(&small).unwrap()
                );
            }
            4 => {
                assert!(!good);
                assert!(why.contains("authentication failed"), "{why}");
                assert!(!c.disk(4).join("big").exists() && !c.disk(4).join("small").exists());
            }
            _ => {
                assert!(good, "{name}: {why}");
                assert!(
                    std::fs::read(c.disk(k).join("big")).unwrap() == std::fs::read(&big).unwrap()
                );
                let mode = std::fs::metadata(c.disk(k).join("small"))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o640, "{name}: -p kept the mode");
            }
        }
    }
}

#[test]
fn bad_broadcast_command_lines_are_refused_with_the_reason() {
    let t = Scratch::new("bcast-usage");
    let f = t.path("f");
    std::fs::write(&f, b"x").unwrap();
    let refused = |args: &[&str], why: &str| {
        let out = Command::new(RCP).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
    };
    let fs = f.to_str().unwrap();
    refused(&[fs, "node[3-1]:/x"], "goes down");
    refused(&[fs, "node[1-2,2]:/x"], "named twice");
    refused(&[fs, "n[1-3:/x"], "unclosed");
    refused(&["n[1-2]:/x", "here"], "can only be a destination");
    refused(
        &["-r", "--delete", fs, "n[1-2]:/x"],
        "--delete is not supported with a broadcast",
    );
    refused(
        &["--streams", "2", fs, "n[1-2]:/x"],
        "--streams does not apply",
    );
    refused(&["--hosts", fs, fs, "/x"], "the destination is :PATH");
    refused(
        &["--launcher", "srun", fs, "me@n[1-2]:/x"],
        "--launcher srun starts nodes as this user",
    );
    refused(
        &["--order", "topology", fs, "n[1-2]:/x"],
        "--order topology needs --launcher srun",
    );
    let out = Command::new(RCP)
        .env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .args(["--slurm", fs, ":/x"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SLURM_JOB_NODELIST is not set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Slurm's own launch: a cluster of four slurmd nodes (and a controller
/// and a login node, each in a namespace of its own), and `rcp --slurm
/// --launcher srun` run inside an allocation of the four made with
/// salloc on the login node.
#[test]
fn srun_starts_the_nodes_of_a_slurm_allocation() {
    const SLURM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/broadcast/slurm");
    if Command::new("slurmd").arg("-V").output().is_err() {
        eprintln!("skipped: no slurmd here (scripts/setup installs it)");
        return;
    }
    let t = Scratch::new("bcast-slurm");
    // Four nodes, then the controller and the login node.
    let Some(c) = Cluster::new(&t, "rbcs", 6, 204, None) else {
        return;
    };
    let state = t.path("slurm");
    std::fs::create_dir_all(&state).unwrap();
    struct Down(PathBuf);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = Command::new(SLURM).arg("down").arg(&self.0).output();
        }
    }
    let _down = Down(state.clone());
    ok(Command::new(SLURM).args([
        "up",
        "rbcs",
        "4",
        "204",
        state.to_str().unwrap(),
        c.dir.to_str().unwrap(),
        c.dest.to_str().unwrap(),
    ]));
    let big = t.path("big");
    random_file(&big, 3 << 20, 6);
    let bin = Path::new(RCP).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let broadcast = |order: &str| {
        for k in 1..=4 {
            let _ = std::fs::remove_file(c.disk(k).join("big"));
        }
        let out = Command::new(SLURM)
            .args(["login", "rbcs", "4", state.to_str().unwrap()])
            .args([
                "env",
                &format!("PATH={path}"),
                "salloc",
                "--nodes=4",
                "--quiet",
            ])
            .args([RCP, "--slurm", "--launcher", "srun", "--order", order])
            .args(["--json", "--timeout", "10"])
            .arg(&big)
            .arg(format!(":{}/", c.dest.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v = summary(&out);
        let names: Vec<String> = nodes(&v)
            .into_iter()
            .map(|(name, good, why)| {
                assert!(good, "{name}: {why}");
                name
            })
            .collect();
        assert_eq!(
            names,
            ["n1", "n2", "n3", "n4"],
            "results in the order named"
        );
        let want = std::fs::read(&big).unwrap();
        for k in 1..=4 {
            assert!(
                std::fs::read(c.disk(k).join("big")).unwrap() == want,
                "node {k}"
            );
        }
        v["rounds"][0].clone()
    };
    assert_eq!(
        broadcast("named"),
        serde_json::json!(["n1", "n2", "n3", "n4"])
    );
    // Slurm's topology: n1 and n3 under one switch, n2 and n4 under another.
    assert_eq!(
        broadcast("topology"),
        serde_json::json!(["n1", "n3", "n2", "n4"])
    );
    // The controller and login nodes are no nodes of the allocation.
    assert!(!c.disk(5).join("big").exists() && !c.disk(6).join("big").exists());
}

/// Daemons need no launcher: `rcp serve` on each node (in its namespace,
/// on its own address), the source and every node proving the same
/// shared secret to the next. A daemon that holds another secret fails
/// its own node only ("authentication failed" from the node before it),
/// and the node after it is served in a second round.
#[test]
fn daemons_take_a_broadcast_with_their_shared_secret() {
    let t = Scratch::new("bcast-daemons");
    let Some(c) = Cluster::new(&t, "rbcd", 4, 206, None) else {
        return;
    };
    let secret = common::secret(&t, "secret");
    let other = common::secret(&t, "other");
    struct Daemons(Vec<std::process::Child>);
    impl Drop for Daemons {
        fn drop(&mut self) {
            for d in &mut self.0 {
                let _ = d.kill();
                let _ = d.wait();
            }
        }
    }
    let mut daemons = Daemons(Vec::new());
    for k in 1..=4 {
        let key = if k == 3 { &other } else { &secret };
        let log = std::fs::File::create(c.dir.join(format!("serve-{k}.log"))).unwrap();
        daemons.0.push(
            Command::new("ip")
                .args(["netns", "exec", &format!("rbcd-{k}"), "sh", "-c"])
                .arg(r#"mount --bind "$0" "$1" && exec "$2" serve --listen "$3" --root "$1" --secret-file "$4""#)
                .arg(c.disk(k))
                .arg(&c.dest)
                .arg(RCP)
                .arg(format!("{}:7470", c.addr(k)))
                .arg(key)
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }
    // Each daemon says it listens before the copy starts.
    for k in 1..=4 {
        let log = c.dir.join(format!("serve-{k}.log"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("listening")
        {
            assert!(Instant::now() < deadline, "daemon {k} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let big = t.path("big");
    random_file(&big, 2 << 20, 8);
    let out = Command::new(RCP)
        .args(["--json", "--timeout", "10", "--secret-file"])
        .arg(&secret)
        .arg(&big)
        .arg(format!(
            "rcp://10.{}.0.[1-4]/{}/",
            c.octet,
            c.dest.display()
        ))
        .output()
        .unwrap();
    some_failed(&out);
    let v = summary(&out);
    let want = std::fs::read(&big).unwrap();
    for (k, (name, good, why)) in nodes(&v).into_iter().enumerate() {
        let k = k + 1;
        if k == 3 {
            assert!(
                !good && why.contains("authentication failed"),
                "{name}: {why}"
            );
            assert!(!c.disk(3).join("big").exists());
        } else {
            assert!(good, "{name}: {why}");
            assert!(
                std::fs::read(c.disk(k).join("big")).unwrap() == want,
                "{name}"
            );
        }
    }
    assert_eq!(
        v["rounds"],
        serde_json::json!([[c.addr(1), c.addr(2), c.addr(3), c.addr(4)], [c.addr(4)]])
    );
}
