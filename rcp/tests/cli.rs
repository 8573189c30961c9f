//! rcp end to end: the real binary, real processes, loopback only.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use rfabric::link::seal::{Before, Protection};
use sha2::{Digest, Sha256};
use test_support::{Scratch, pattern};

mod common;
use common::{Daemon, RCP, fake_rsh, s, secret};

fn rcp(args: &[&str]) -> Output {
    Command::new(RCP).args(args).output().expect("rcp runs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "rcp failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The digest rcp defines by default: BLAKE3 over the BLAKE3 of each
/// chunk (computed here with the blake3 crate directly).
fn file_digest(data: &[u8], chunk: usize) -> String {
    let mut h = blake3::Hasher::new();
    for c in data.chunks(chunk) {
        h.update(blake3::hash(c).as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// The digest with `--digest sha256`: SHA-256 over the SHA-256 of each
/// chunk.
fn sha256_file_digest(data: &[u8], chunk: usize) -> String {
    let mut h = Sha256::new();
    for c in data.chunks(chunk) {
        h.update(Sha256::digest(c));
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).expect("one JSON object")
}

/// No temporary `.rcp-*.part` files anywhere under `dir`.
fn no_leftovers(dir: &Path) -> bool {
    walk(dir).iter().all(|p| {
        !p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".rcp-")
    })
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn sizes_around_the_chunk_arrive_identical_with_the_documented_digest() {
    let t = Scratch::new("sizes");
    let chunk = 64 * 1024;
    for (i, size) in [0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 17]
        .into_iter()
        .enumerate()
    {
        let src = t.path(&format!("src{i}"));
        let data = pattern(size, i as u64 + 1);
        std::fs::write(&src, &data).unwrap();
        let dst = t.path(&format!("dst{i}"));
        let out = ok(&rcp(&["--json", "--chunk-size", "64K", s(&src), s(&dst)]));
        let v = json(&out);
        assert_eq!(std::fs::read(&dst).unwrap(), data, "size {size}");
        assert_eq!(v["bytes"], size as u64);
        assert_eq!(v["files"], 1);
        assert_eq!(
            v["transport"], "in-process",
            "a local copy crosses no socket"
        );
        assert_eq!(v["blake3"], file_digest(&data, chunk), "size {size}");
        assert!(v["seconds"].as_f64().unwrap() >= 0.0);
    }
    assert!(no_leftovers(t.dir()));
}

/// A local copy's two ends talk through this process's memory: its link
/// is sealed only when encryption is asked for, and the summary says so.
#[test]
fn a_local_copy_is_sealed_only_when_encryption_is_asked_for() {
    let t = Scratch::new("localseal");
    let data = pattern(300_000, 5);
    let src = t.path("src");
    std::fs::write(&src, &data).unwrap();
    for (i, encrypt) in ["tcp", "always"].into_iter().enumerate() {
        // Unverified (the seal, where there is one, covers the payload),
        // and verified (the default) in several chunks.
        for verify in ["--no-verify", "--chunk-size=64K"] {
            let dst = t.path(&format!("dst{i}{verify}"));
            let args = ["--json", "--encrypt", encrypt, verify, s(&src), s(&dst)];
            let v = json(&ok(&rcp(&args)));
            assert_eq!(std::fs::read(&dst).unwrap(), data, "{encrypt} {verify}");
            assert_eq!(v["encrypted"], encrypt == "always", "{v}");
            let dst = t.path(&format!("line{i}{verify}"));
            // (The summary goes to stderr: stdout is for --json.)
            let out = rcp(&["--encrypt", encrypt, verify, s(&src), s(&dst)]);
            assert!(out.status.success());
            let line = String::from_utf8(out.stderr).unwrap();
            let said = if encrypt == "always" {
                "over in-process, encrypted"
            } else {
                "over in-process"
            };
            assert!(
                line.contains(said) && !line.contains("authenticated"),
                "{line}"
            );
        }
    }
    assert!(no_leftovers(t.dir()));
}

#[test]
fn sha256_on_request_and_in_fips_mode_where_blake3_is_refused() {
    let t = Scratch::new("digests");
    let chunk = 64 * 1024;
    let data = pattern(3 * chunk + 5, 77);
    let src = t.path("src");
    std::fs::write(&src, &data).unwrap();
    let copy = |dst: &str, extra: &[&str], fips: &str| {
        let flag = t.path("fips_enabled");
        std::fs::write(&flag, fips).unwrap();
        Command::new(RCP)
            .args(["--json", "--chunk-size", "64K"])
            .args(extra)
            .args([s(&src), s(&t.path(dst))])
            .env("RCP_TEST_FIPS_FILE", &flag)
            .output()
            .unwrap()
    };
    // Asked for: SHA-256, under its own key.
    let v = json(&ok(&copy("a", &["--digest", "sha256"], "0")));
    assert_eq!(v["digest"], "sha256");
    assert_eq!(v["sha256"], sha256_file_digest(&data, chunk));
    assert!(v.get("blake3").is_none());
    // The default: BLAKE3, unless the host is in FIPS mode.
    let v = json(&ok(&copy("b", &[], "0")));
    assert_eq!(v["digest"], "blake3");
    assert_eq!(v["blake3"], file_digest(&data, chunk));
    let v = json(&ok(&copy("c", &[], "1\n")));
    assert_eq!(v["digest"], "sha256", "FIPS mode picks SHA-256");
    assert_eq!(v["sha256"], sha256_file_digest(&data, chunk));
    // BLAKE3 asked for in FIPS mode: refused, nothing copied.
    let out = copy("d", &["--digest", "blake3"], "1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("FIPS mode"), "{err}");
    assert!(!t.path("d").exists());
    for f in ["a", "b", "c"] {
        assert_eq!(std::fs::read(t.path(f)).unwrap(), data);
    }
}

#[test]
fn into_an_existing_directory_and_several_sources() {
    let t = Scratch::new("dirs");
    std::fs::write(t.path("a"), b"aaa").unwrap();
    std::fs::write(t.path("b"), b"bb").unwrap();
    std::fs::create_dir(t.path("d")).unwrap();
    ok(&rcp(&[
        "-q",
        s(&t.path("a")),
        s(&t.path("b")),
        s(&t.path("d")),
    ]));
    assert_eq!(std::fs::read(t.path("d/a")).unwrap(), b"aaa");
    assert_eq!(std::fs::read(t.path("d/b")).unwrap(), b"bb");
    // Several sources into something that is not a directory: refused.
    let out = rcp(&[s(&t.path("a")), s(&t.path("b")), s(&t.path("nodir"))]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    // A directory without -r: refused with a hint.
    let out = rcp(&[s(&t.path("d")), s(&t.path("e"))]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("use -r"));
}

#[test]
fn sparse_files_stay_sparse() {
    let t = Scratch::new("sparse");
    let src = t.path("sparse");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(64 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"middle", 32 << 20).unwrap();
    f.write_all_at(b"end", (64 << 20) - 3).unwrap();
    drop(f);
    let dst = t.path("copy");
    let v = json(&ok(&rcp(&["--json", s(&src), s(&dst)])));
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    // Only the chunks with data travelled, and the copy has holes.
    assert!(v["bytes"].as_u64().unwrap() <= 2 << 20, "{v}");
    assert!(std::fs::metadata(&dst).unwrap().blocks() * 512 < 8 << 20);
    // A hole at the very end: the copy still has the whole size.
    let tail = t.path("tail-hole");
    let f = std::fs::File::create(&tail).unwrap();
    f.set_len(8 << 20).unwrap();
    f.write_all_at(b"start", 0).unwrap();
    drop(f);
    let dst = t.path("tail-copy");
    ok(&rcp(&[s(&tail), s(&dst)]));
    assert_eq!(std::fs::read(&tail).unwrap(), std::fs::read(&dst).unwrap());
}

#[test]
fn a_leftover_temporary_file_is_replaced_with_the_right_mode() {
    let t = Scratch::new("leftover");
    let src = t.path("src");
    let data = pattern(10_000, 4);
    std::fs::write(&src, &data).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o640)).unwrap();
    // An earlier copy's leftover: longer, other bytes, other mode.
    let part = t.path(".rcp-dst.part");
    std::fs::write(&part, pattern(100_000, 5)).unwrap();
    std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(&rcp(&[s(&src), s(&t.path("dst"))]));
    assert_eq!(std::fs::read(t.path("dst")).unwrap(), data);
    assert!(!part.exists());
    // A fresh copy gets the same mode (through the same umask) either way.
    ok(&rcp(&[s(&src), s(&t.path("fresh"))]));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&t.path("dst")), mode(&t.path("fresh")));
    assert_eq!(mode(&t.path("fresh")) & !0o640, 0);
}

#[test]
fn a_tree_of_ten_thousand_files_with_odd_names_and_symlinks() {
    let t = Scratch::new("tree");
    let src = t.path("src");
    for i in 0..10_000 {
        let d = src
            .join(format!("d{} sp", i % 40))
            .join(format!("ü{}", i % 7));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f {i} ☃.txt")), pattern(i % 500, i as u64)).unwrap();
    }
    std::os::unix::fs::symlink("d0 sp/ü0", src.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("abs-link")).unwrap();
    let dst = t.path("dst");
    let v = json(&ok(&rcp(&["-r", "--json", s(&src), s(&dst)])));
    assert_eq!(v["files"], 10_000);
    assert_same_tree(&src, &dst);
}

/// The copy went over `n` streams and each of them carried data.
fn assert_every_stream_carried_data(v: &serde_json::Value, n: usize) {
    assert_eq!(v["streams"], n);
    let per = v["stream_bytes"].as_array().expect("stream_bytes");
    assert_eq!(per.len(), n);
    assert!(per.iter().all(|b| b.as_u64().unwrap() > 0), "{per:?}");
    let sum: u64 = per.iter().map(|b| b.as_u64().unwrap()).sum();
    assert_eq!(v["bytes"].as_u64(), Some(sum));
}

/// `dst` holds what `src` holds: the same names, types, bytes and link
/// targets, and no temporary files.
fn assert_same_tree(src: &Path, dst: &Path) {
    let (a, b) = (walk(src), walk(dst));
    assert_eq!(a.len(), b.len());
    for p in a {
        let q = dst.join(p.strip_prefix(src).unwrap());
        let (m, n) = (
            std::fs::symlink_metadata(&p).unwrap(),
            std::fs::symlink_metadata(&q).unwrap(),
        );
        assert_eq!(m.file_type(), n.file_type(), "{}", q.display());
        if m.is_symlink() {
            assert_eq!(
                std::fs::read_link(&p).unwrap(),
                std::fs::read_link(&q).unwrap()
            );
        } else if m.is_file() {
            assert!(
                std::fs::read(&p).unwrap() == std::fs::read(&q).unwrap(),
                "{} differs",
                q.display()
            );
        }
    }
    assert!(no_leftovers(dst));
}

#[test]
fn preserve_keeps_modes_and_times() {
    let t = Scratch::new("preserve");
    std::fs::create_dir_all(t.path("src/sub")).unwrap();
    std::fs::write(t.path("src/sub/f"), b"data").unwrap();
    std::fs::set_permissions(t.path("src/sub/f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::set_permissions(t.path("src/sub"), std::fs::Permissions::from_mode(0o710)).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    std::fs::File::options()
        .write(true)
        .open(t.path("src/sub/f"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    ok(&rcp(&[
        "-r",
        "-p",
        "-q",
        s(&t.path("src")),
        s(&t.path("dst")),
    ]));
    let f = std::fs::metadata(t.path("dst/sub/f")).unwrap();
    assert_eq!(f.mode() & 0o7777, 0o640);
    assert_eq!(f.modified().unwrap(), when);
    assert_eq!(
        std::fs::metadata(t.path("dst/sub")).unwrap().mode() & 0o7777,
        0o710
    );
}

#[test]
fn a_chunk_corrupted_in_flight_fails_the_copy_and_leaves_nothing() {
    let t = Scratch::new("corrupt");
    let src = t.path("src");
    std::fs::write(&src, pattern(300_000, 9)).unwrap();
    let dst = t.path("dst");
    let out = Command::new(RCP)
        .args(["--chunk-size", "64K", s(&src), s(&dst)])
        .env("RCP_TEST_CORRUPT_CHUNK", "2")
        .output()
        .unwrap();
    // Exit status 4: verification failed (1 before statuses had kinds).
    assert_eq!(out.status.code(), Some(4));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("offset 131072") && err.contains("corrupted"),
        "{err}"
    );
    assert!(
        !dst.exists(),
        "a corrupted copy appeared under its final name"
    );
    assert!(no_leftovers(t.dir()));
    // Without verification nobody notices: the documented trade-off.
    let out = Command::new(RCP)
        .args(["--no-verify", "-q", "--chunk-size", "64K", s(&src), s(&dst)])
        .env("RCP_TEST_CORRUPT_CHUNK", "2")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_ne!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
}

/// What an attacker on a TCP path can do to a push into a daemon, played
/// by a real proxy (test_support::on_path): rewrite a chunk and put the
/// plain digest of the new bytes in its header, inject a message, drop
/// one, replay the whole recorded session. Each is refused with a clear
/// error, and nothing appears under the final name.
#[test]
fn attacks_on_the_path_are_refused_and_leave_nothing() {
    use test_support::on_path::{Attack, Nth, OnPath, replay};
    let t = Scratch::new("onpath");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    // (--encrypt never lets the rewriter see the plain chunk; the default
    // daemon is tried below.)
    let d = Daemon::start_with(&[&root], &key, &["--encrypt", "never"]);
    let src = t.path("src");
    std::fs::write(&src, pattern(300_000, 11)).unwrap();
    let tree = t.path("tree");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..8 {
        std::fs::write(tree.join(format!("empty{i}")), b"").unwrap();
    }
    let sha = |b: &[u8]| -> [u8; 32] { Sha256::digest(b).into() };
    let push = |proxy: &OnPath, what: &Path, name: &str, extra: &[&str]| -> Output {
        let dest = format!(
            "rcp://127.0.0.1:{}{}",
            proxy.port,
            root.join(name).display()
        );
        let mut args = vec!["-r", "--chunk-size", "64K", "--secret-file", s(&key)];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[s(what), &dest]);
        Command::new(RCP).args(&args).output().unwrap()
    };
    let refused = |out: &Output, what: &str, says: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
    };
    let never = ["--digest", "sha256", "--encrypt", "never"];
    // An honest path first: the same copy works through the proxy.
    let honest = OnPath::start(d.port, Attack::None);
    assert!(push(&honest, &src, "honest", &never).status.success());
    assert_eq!(
        std::fs::read(root.join("honest")).unwrap(),
        std::fs::read(&src).unwrap()
    );

    let rewrite = Attack::RewriteChunk {
        nth: 1,
        rehash: sha,
    };
    let out = push(
        &OnPath::start(d.port, rewrite.clone()),
        &src,
        "rewritten",
        &never,
    );
    refused(
        &out,
        "a rewritten chunk",
        "chunk 1 failed its session check",
    );
    // Encrypted (the client's default on tcp), the rewriter flips bits of
    // ciphertext: refused the same way.
    let out = push(&OnPath::start(d.port, rewrite), &src, "rewritten", &[]);
    refused(
        &out,
        "a rewritten encrypted chunk",
        "chunk 1 failed its session check",
    );

    // Sends of a push: 0 hello, 1 proof, 2 request, then the entries. A
    // request injected right behind the proof, before the client could
    // seal anything, and a Done injected mid-file, which would end the
    // copy early.
    let done = rcp::proto::Msg::Done { entries: 0 }.encode();
    let planted = rcp::proto::Msg::Push {
        flags: 0,
        streams: 1,
        sources: 1,
        dest: root.join("planted").into_os_string().into_encoded_bytes(),
    }
    .encode();
    for (before, message, what, name) in [
        (Nth::Send(2), planted, &tree, "injected-early"),
        (Nth::Chunk(2), done, &src, "injected-late"),
    ] {
        let inject = Attack::InjectMessage { before, message };
        let out = push(&OnPath::start(d.port, inject), what, name, &never);
        refused(&out, "an injected message", "unsealed");
    }
    // A message left out mid-tree fails the check of the next one. Left
    // out last (send 5 of a one-file push is its Done, after which the
    // client waits for the server's answer), no message follows it: the
    // next heartbeat is what fails the check.
    for (nth, what, name) in [(4, &tree, "dropped"), (5, &src, "dropped-last")] {
        let started = std::time::Instant::now();
        let out = push(
            &OnPath::start(d.port, Attack::DropSend { nth }),
            what,
            name,
            &never,
        );
        refused(&out, "a dropped message", "failed its session check");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "a dropped message {nth} took {:?} to be noticed",
            started.elapsed()
        );
    }
    // (The one file's end came before the lost Done: it arrived whole and
    // verified, and stays.)
    assert_eq!(
        std::fs::read(root.join("dropped-last")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    std::fs::remove_file(root.join("dropped-last")).unwrap();

    // The honest session, replayed to the daemon: turned away, whichever
    // check its frames meet first (the fresh challenge makes the proof
    // worthless; frames that come before the challenge went out carry
    // wrong credits, or a seal this side never set up). The proof alone,
    // replayed: `unauthenticated_and_replayed_answers_are_refused`.
    std::fs::remove_file(root.join("honest")).unwrap();
    for replayed in [honest.recorded_through_send(0, 1), honest.recorded(0)] {
        assert!(
            replay(d.port, &replayed).is_some(),
            "the daemon kept a replayed session open"
        );
    }
    // (The tree's directory may be there: the honest client sent it
    // before the dropped message. No file arrived.)
    let arrived = Command::new("find")
        .args([s(&root), "-type", "f"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&arrived.stdout),
        "",
        "files arrived"
    );
}

/// A peer that goes silent, a stopped server or a path gone dead with
/// both connections left open, ends the copy within `--timeout` with
/// status 6, and leaves nothing half-written under a final name.
#[test]
fn a_silent_peer_is_given_up_within_the_timeout() {
    use test_support::on_path::{Attack, OnPath};
    let t = Scratch::new("silent");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let d = Daemon::start_with(&[&root], &key, &["--timeout", "2"]);
    let src = t.path("src");
    std::fs::write(&src, pattern(4_000_000, 3)).unwrap();
    let push = |port: u16, name: &str| -> (Output, Duration) {
        let started = std::time::Instant::now();
        let dest = format!("rcp://127.0.0.1:{port}{}", root.join(name).display());
        let out = Command::new(RCP)
            .args(["--chunk-size", "64K", "--timeout", "2", "--secret-file"])
            .args([s(&key), s(&src), &dest])
            .output()
            .unwrap();
        (out, started.elapsed())
    };
    let lost = |(out, took): &(Output, Duration), says: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(6), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(*took < Duration::from_secs(15), "given up after {took:?}");
    };

    // The path dies after a few chunks: both ends hear nothing more.
    let dead = OnPath::start(d.port, Attack::Stall { nth: 3 });
    lost(
        &push(dead.port, "cut"),
        "the peer sent nothing for 2 s: it stopped, or the path to it is gone",
    );
    let log = d.log_when(Duration::from_secs(10), |l| l.contains("session failed"));
    assert!(log.contains("the peer sent nothing for 2 s"), "{log}");

    // A server that is stopped: the kernel still accepts the connection.
    let pid = d.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let stopped = push(d.port, "stopped");
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    lost(&stopped, "did not set up a session within 2 s");

    // Neither copy left anything in the root (the server cleans up its
    // temporary file when its session fails).
    let mut left = String::new();
    for _ in 0..400 {
        let found = Command::new("find")
            .arg(s(&root))
            .args(["-mindepth", "1"])
            .output()
            .unwrap();
        left = String::from_utf8_lossy(&found.stdout).into_owned();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(left, "", "left in the root");
}

#[test]
fn daemon_push_and_pull_with_a_shared_secret() {
    let t = Scratch::new("daemon");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let d = Daemon::start(&[&root], &key);
    let data = pattern(3_000_000, 5);
    std::fs::write(t.path("up"), &data).unwrap();
    let v = json(&ok(&rcp(&[
        "--json",
        "--secret-file",
        s(&key),
        s(&t.path("up")),
        &d.url(&root),
    ])));
    assert_eq!(std::fs::read(root.join("up")).unwrap(), data);
    assert_eq!(v["blake3"], file_digest(&data, 1 << 20));
    let v = json(&ok(&rcp(&[
        "--json",
        "--secret-file",
        s(&key),
        &d.url(&root.join("up")),
        s(&t.path("down")),
    ])));
    assert_eq!(std::fs::read(t.path("down")).unwrap(), data);
    assert_eq!(v["blake3"], file_digest(&data, 1 << 20));
    // Each session is logged with its client when it is done.
    let log = d.log_when(Duration::from_secs(5), |l| {
        l.matches("session done").count() >= 2
    });
    assert!(log.contains("rcp serve: listening on 127.0.0.1:"), "{log}");
    let done: Vec<&str> = log.lines().filter(|l| l.contains("session done")).collect();
    assert_eq!(done.len(), 2, "{log}");
    for line in done {
        assert!(
            line.starts_with(
                "rcp serve: session done: 1 file(s), 3000000 bytes (client=127.0.0.1:"
            ),
            "{line}"
        );
    }
}

#[test]
fn streams_stripe_trees_both_ways_through_the_daemon_and_locally() {
    let t = Scratch::new("streams");
    let src = t.path("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    // Files of many chunks (they spread over every stream), small ones,
    // empty ones, a symlink.
    for i in 0..6 {
        std::fs::write(
            src.join(format!("big{i}")),
            pattern(700_000 + i * 4099, i as u64),
        )
        .unwrap();
    }
    for i in 0..300 {
        let d = if i % 2 == 0 { "sub" } else { "sub/deeper" };
        std::fs::write(src.join(d).join(format!("s{i}")), pattern(i * 37, i as u64)).unwrap();
    }
    std::fs::write(src.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("sub/s2", src.join("link")).unwrap();
    let chunked = ["--chunk-size", "16K", "--window", "4"];

    let local = t.path("local");
    let mut args = vec!["-r", "--json", "--streams", "4"];
    args.extend(chunked);
    args.extend([s(&src), s(&local)]);
    let v = json(&ok(&rcp(&args)));
    assert_every_stream_carried_data(&v, 4);
    assert_same_tree(&src, &local);

    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let d = Daemon::start(&[&root], &key);
    let up = d.url(&root.join("up"));
    let mut args = vec!["-r", "--json", "--streams", "5", "--secret-file", s(&key)];
    args.extend(chunked);
    args.extend([s(&src), &up]);
    let v = json(&ok(&rcp(&args)));
    assert_every_stream_carried_data(&v, 5);
    assert_same_tree(&src, &root.join("up"));

    let down = t.path("down");
    let mut args = vec!["-r", "--json", "--streams", "3", "--secret-file", s(&key)];
    args.extend(chunked);
    args.extend([&up, s(&down)]);
    let v = json(&ok(&rcp(&args)));
    assert_every_stream_carried_data(&v, 3);
    assert_same_tree(&src, &down);

    // A corrupted chunk is caught whichever stream carried it.
    let bad = t.path("bad");
    let out = Command::new(RCP)
        .args(["--streams", "4", "--chunk-size", "16K"])
        .args([s(&src.join("big3")), s(&bad)])
        .env("RCP_TEST_CORRUPT_CHUNK", "30")
        .output()
        .unwrap();
    // Exit status 4: verification failed (1 before statuses had kinds).
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("corrupted"));
    assert!(!bad.exists());
}

#[test]
fn the_daemon_refuses_wrong_secrets_and_escapes() {
    let t = Scratch::new("refuse");
    let root = t.path("root");
    let outside = t.path("outside");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), b"private").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    let key = secret(&t, "key");
    let wrong = secret(&t, "wrong");
    let d = Daemon::start(&[&root], &key);
    std::fs::write(t.path("f"), b"payload").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--secret-file".into(),
                s(&wrong).into(),
                s(&t.path("f")).into(),
                d.url(&root),
            ],
            "authentication failed",
        ),
        (
            vec![
                "--secret-file".into(),
                s(&key).into(),
                s(&t.path("f")).into(),
                d.url(&outside),
            ],
            "outside the served roots",
        ),
        (
            vec![
                "--secret-file".into(),
                s(&key).into(),
                s(&t.path("f")).into(),
                format!(
                    "rcp://127.0.0.1:{}{}/sub/../../outside",
                    d.port,
                    root.display()
                ),
            ],
            "`..`",
        ),
        (
            vec![
                "--secret-file".into(),
                s(&key).into(),
                s(&t.path("f")).into(),
                d.url(&root.join("escape/planted")),
            ],
            "symlink",
        ),
        (
            vec![
                "--secret-file".into(),
                s(&key).into(),
                d.url(&root.join("escape/secret.txt")),
                s(&t.path("stolen")).into(),
            ],
            "symlink",
        ),
    ];
    for (args, says) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = rcp(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(3), "refused: {args:?}: {err}");
    }
    assert!(!outside.join("planted").exists());
    assert!(!t.path("stolen").exists());
    // And no secret file readable by others is accepted.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = rcp(&["--secret-file", s(&key), s(&t.path("f")), &d.url(&root)]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("readable by others"));
    // A missing one is named, with its cause said once.
    let missing = t.path("no-such-key");
    let out = rcp(&["--secret-file", s(&missing), s(&t.path("f")), &d.url(&root)]);
    let err = String::from_utf8_lossy(&out.stderr);
    let says = format!(
        "rcp: cannot read secret file {}: No such file or directory (os error 2)\n",
        missing.display()
    );
    assert!(err.ends_with(&says), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

#[test]
fn remote_shell_mode_push_and_pull() {
    let t = Scratch::new("rsh");
    let (rsh, path) = fake_rsh(&t);
    let data = pattern(2_500_000, 3);
    std::fs::write(t.path("src"), &data).unwrap();
    let run = |args: &[&str]| {
        Command::new(RCP)
            .args(["--rsh", s(&rsh), "--json"])
            .args(args)
            .env("PATH", &path)
            .output()
            .unwrap()
    };
    let dest = format!("localhost:{}", t.path("pushed").display());
    let v = json(&ok(&run(&[s(&t.path("src")), &dest])));
    assert_eq!(std::fs::read(t.path("pushed")).unwrap(), data);
    assert_eq!(v["blake3"], file_digest(&data, 1 << 20));
    let src = format!("me@localhost:{}", t.path("src").display());
    // Further streams join the one-session server too.
    let v = json(&ok(&run(&[
        "--streams",
        "3",
        "--chunk-size",
        "64K",
        &src,
        s(&t.path("pulled")),
    ])));
    assert_eq!(std::fs::read(t.path("pulled")).unwrap(), data);
    assert_eq!(v["streams"], 3);
}

/// Every directory that received a file is synced before the copy
/// succeeds, and each used to stay open until then: a tree of more
/// directories than the limit on open files failed with `EMFILE` (3,000
/// directories under 1,024). Now at most a few wait open and the others
/// are synced early, so 3,000 directories of one file each arrive under a
/// limit of 512, locally (both ends in one process) and through a shell.
#[test]
fn a_tree_of_more_directories_than_open_files_arrives() {
    // On the disk the tests run on, where directories are synced.
    let t = Scratch::new("many-dirs");
    let src = t.path("src");
    one_file_directories(&src, 3000);
    let (rsh, path) = fake_rsh(&t);
    for (dest, remote) in [(t.path("local"), false), (t.path("pushed"), true)] {
        let target = if remote {
            format!(
                "--rsh {} {} localhost:{}",
                rsh.display(),
                src.display(),
                dest.display()
            )
        } else {
            format!("{} {}", src.display(), dest.display())
        };
        let out = with_open_files(512, &target, &path).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_same_tree(&src, &dest);
    }
}

/// `rcp -q -r ARGS` (words, through `sh`) under a limit of `nofile` open
/// files, `path` its `PATH`.
fn with_open_files(nofile: u32, args: &str, path: &str) -> Command {
    let mut sh = Command::new("sh");
    sh.args([
        "-c",
        &format!("ulimit -n {nofile} && exec {RCP} -q -r {args}"),
    ])
    .env("PATH", path);
    sh
}

/// `count` directories in `src` of one file each: the tree that holds
/// the most descriptors a file (its directory's too, on both sides).
fn one_file_directories(src: &Path, count: usize) {
    for i in 0..count {
        let dir = src.join(format!("d{i:04}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), format!("file {i}")).unwrap();
    }
}

/// A push through a remote shell walks its sources while the far side
/// logs in (`send/walk.rs`), as far as its room allows: under a limit of
/// 256 open files the walk of 200 directories waits for room after 16.
/// A login that fails must stop that walk (the process ends with the
/// shell's error rather than waiting on it), and one that succeeds late
/// must let it go on: the whole tree arrives.
#[test]
fn a_push_walks_during_the_login_and_stops_if_the_login_fails() {
    let t = Scratch::new("rsh-early");
    let src = t.path("src");
    one_file_directories(&src, 200);
    let (_, path) = fake_rsh(&t);
    // A slow login, then the far side as usual or a refusal.
    let shell = |name: &str, then: &str| {
        let rsh = t.path(name);
        std::fs::write(&rsh, format!("#!/bin/sh\nsleep 1\nshift\n{then}\n")).unwrap();
        std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).unwrap();
        rsh
    };
    let push = |rsh: &Path, dest: &Path| {
        let args = format!(
            "--rsh {} {} localhost:{}",
            rsh.display(),
            src.display(),
            dest.display()
        );
        // Waited for a while at most: a walk that kept waiting for room
        // would keep the process from ending.
        ended_within(
            with_open_files(256, &args, &path),
            Duration::from_secs(30),
            "rcp did not end: its walk still waits for room",
        )
    };

    let refused = shell(
        "refusing-rsh",
        "echo 'Permission denied (publickey).' >&2; exit 255",
    );
    let (status, err) = push(&refused, &t.path("never"));
    assert!(!status.success());
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!t.path("never").exists());

    let late = shell("late-rsh", "exec \"$@\"");
    let (status, err) = push(&late, &t.path("dst"));
    assert!(status.success(), "{err}");
    assert_same_tree(&src, &t.path("dst"));
}

#[test]
fn a_full_destination_is_a_clear_error_and_leaves_nothing() {
    let t = Scratch::new("full");
    let mnt = t.path("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs", s(&mnt)])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        mounted,
        "this test mounts a small tmpfs: run the suite as root"
    );
    std::fs::write(t.path("big"), pattern(3_000_000, 1)).unwrap();
    let out = rcp(&[s(&t.path("big")), s(&mnt.join("big"))]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let listing = walk(&mnt);
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(!out.status.success());
    assert!(err.contains("No space left on device"), "{err}");
    assert!(listing.is_empty(), "left behind: {listing:?}");
}

#[test]
fn usage_errors_exit_two() {
    let out = rcp(&["only-one"]);
    assert_eq!(out.status.code(), Some(2));
    // No operands at all: a usage error, not an internal one.
    let out = rcp(&[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SRC... DEST"), "{stderr}");
    assert!(!stderr.contains("internal error"), "{stderr}");
    let out = rcp(&["--chunk-size", "1", "a", "b"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("chunk size"));
}

/// A temporary file another copy holds (as a daemon still ending the
/// session of a client killed a moment ago holds its files while the
/// client's `--resume` asks for them): the new copy waits, and takes it
/// over only once the other let go, never writing into it while held.
#[test]
fn a_temporary_file_another_copy_holds_is_waited_for() {
    use rustix::fs::{FlockOperation, flock};
    let t = Scratch::new("part-held");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let data = pattern(3 << 20, 23);
    std::fs::write(t.path("f"), &data).unwrap();
    let part = root.join(".rcp-f.part");
    let theirs = pattern(1 << 20, 24);
    let hold = || {
        std::fs::write(&part, &theirs).unwrap();
        let file = std::fs::File::open(&part).unwrap();
        flock(&file, FlockOperation::NonBlockingLockExclusive).unwrap();
        file
    };
    let d = Daemon::start_with(&[&root], &key, &["--timeout", "4"]);
    let push = || {
        Command::new(RCP)
            .args(["-q", "--resume", "--secret-file", s(&key)])
            .args([s(&t.path("f")), &d.url(&root)])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    // Let go within the daemon's --timeout: the copy goes on and is whole.
    let held = hold();
    let mut copy = push();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(copy.try_wait().unwrap().is_none(), "did not wait");
    assert_eq!(std::fs::read(&part).unwrap(), theirs, "written while held");
    // The other copy removes its file as it lets go.
    std::fs::remove_file(&part).unwrap();
    drop(held);
    let out = copy.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(root.join("f")).unwrap(), data);
    assert!(!part.exists());

    // Held past it: this file fails with the reason, the other's stays as
    // it was.
    std::fs::remove_file(root.join("f")).unwrap();
    let held = hold();
    let out = push().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("another copy is still writing to its temporary file after 4 s"),
        "{err}"
    );
    assert_eq!(std::fs::read(&part).unwrap(), theirs);
    assert!(!root.join("f").exists());
    drop(held);
}

#[test]
fn resume_after_the_receiver_is_killed_sends_less_and_ends_identical() {
    let t = Scratch::new("resume");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let data = pattern(24 << 20, 11);
    std::fs::write(t.path("big"), &data).unwrap();
    let part = root.join(".rcp-big.part");
    let mut d = Daemon::start(&[&root], &key);
    let client = Command::new(RCP)
        .args([
            "-q",
            "--chunk-size",
            "256K",
            "--window",
            "4",
            "--secret-file",
            s(&key),
        ])
        .args([s(&t.path("big")), &d.url(&root)])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the receiving daemon once a few MiB reached its disk.
    let mut killed = false;
    for _ in 0..5000 {
        if std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0) >= 4 << 20 {
            d.child.kill().unwrap();
            d.child.wait().unwrap();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let out = client.wait_with_output().unwrap();
    assert!(
        killed,
        "the copy finished before the daemon could be killed"
    );
    assert!(
        !out.status.success(),
        "a copy whose receiver died reported success"
    );
    assert_eq!(
        out.status.code(),
        Some(6),
        "the peer was lost: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !root.join("big").exists(),
        "an interrupted copy has the final name"
    );
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(kept >= 4 << 20);

    let d2 = Daemon::start(&[&root], &key);
    let v = json(&ok(&rcp(&[
        "--json",
        "--resume",
        "--chunk-size",
        "256K",
        "--secret-file",
        s(&key),
        s(&t.path("big")),
        &d2.url(&root),
    ])));
    assert_eq!(std::fs::read(root.join("big")).unwrap(), data);
    assert_eq!(v["blake3"], file_digest(&data, 256 << 10));
    let sent = v["bytes"].as_u64().unwrap();
    assert!(sent < data.len() as u64, "sent {sent} of {}", data.len());
    assert!(!part.exists());
    // Resuming onto an identical file sends nothing at all.
    let v = json(&ok(&rcp(&[
        "--json",
        "--resume",
        "--chunk-size",
        "256K",
        "--secret-file",
        s(&key),
        s(&t.path("big")),
        &d2.url(&root),
    ])));
    assert_eq!(v["bytes"], 0);
    assert_eq!(std::fs::read(root.join("big")).unwrap(), data);
}

/// A raw client of the daemon: a link, and the daemon's challenge.
async fn raw_session(port: u16) -> (rfabric::link::Link, [u8; 32]) {
    use rcp::proto::Msg;
    use rfabric::endpoint::{Transport, connect};
    use rfabric::link::{Incoming, Link};
    use rfabric::wire::Role;
    let conn = connect(format!("127.0.0.1:{port}").parse().unwrap(), Transport::Tcp)
        .await
        .unwrap();
    let shape = rcp::connect::link_config(Role::Client, 16, 1 << 20, None, &conn.limits());
    let link = Link::establish(conn, shape).await.unwrap();
    let Some(Incoming::Message(m)) = link.recv().await.unwrap() else {
        panic!("no challenge");
    };
    let Msg::Challenge { nonce, encrypt } = Msg::decode(&m).unwrap() else {
        panic!("not a challenge: {m:?}");
    };
    assert!(encrypt, "a daemon requires encryption on tcp by default");
    (link, nonce)
}

/// An honest client's answer to the daemon's challenge, with its nonce:
/// its incoming half is sealed first, as the real client's is.
fn honest_answer(
    link: &rfabric::link::Link,
    secret: &[u8],
    server_nonce: &[u8; 32],
    client_nonce: [u8; 32],
    encrypt: bool,
) -> rcp::proto::Msg {
    let auth = rfabric::auth::RCP;
    let keys = auth.session_keys(secret, server_nonce, &client_nonce);
    link.seal_incoming(
        Protection::of(encrypt),
        &keys.server_to_client,
        Before::Anything,
    )
    .unwrap();
    rcp::proto::Msg::Auth {
        nonce: client_nonce,
        mac: auth.client_proof(secret, server_nonce, &client_nonce),
        encrypt,
    }
}

async fn answer(link: &rfabric::link::Link) -> rcp::proto::Msg {
    use rfabric::link::Incoming;
    let Some(Incoming::Message(m)) = link.recv().await.unwrap() else {
        panic!("no answer");
    };
    rcp::proto::Msg::decode(&m).unwrap()
}

#[tokio::test]
async fn unauthenticated_and_replayed_answers_are_refused() {
    use rcp::proto::Msg;
    let t = Scratch::new("replay");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let d = Daemon::start(&[&root], &key);
    let secret = rfabric::auth::read_secret(&key).unwrap();
    // An honest session, overheard.
    let (first, server_nonce) = raw_session(d.port).await;
    let heard = honest_answer(&first, &secret, &server_nonce, [7u8; 32], true);
    first.send_message(&heard.encode()).await.unwrap();
    assert!(matches!(answer(&first).await, Msg::AuthOk { .. }));
    first.abort("done");
    // A request with no answer to the challenge at all.
    let (bold, _) = raw_session(d.port).await;
    let push = Msg::Push {
        flags: 0,
        streams: 1,
        sources: 1,
        dest: root.join("planted").into_os_string().into_encoded_bytes(),
    };
    bold.send_message(&push.encode()).await.unwrap();
    match answer(&bold).await {
        Msg::Fail { reason } => assert!(reason.contains("authentication failed"), "{reason}"),
        other => panic!("an unauthenticated request was taken: {other:?}"),
    }
    assert!(!root.join("planted").exists());
    // The same answer, replayed to a fresh challenge.
    let (second, fresh) = raw_session(d.port).await;
    assert_ne!(fresh, server_nonce, "every challenge is new");
    second.send_message(&heard.encode()).await.unwrap();
    match answer(&second).await {
        Msg::Fail { reason } => assert!(reason.contains("authentication failed"), "{reason}"),
        other => panic!("a replayed answer was taken: {other:?}"),
    }
}

/// What a path without the session's keys can do after an honest proof:
/// append messages it cannot seal. The daemon acts on none of them.
#[tokio::test]
async fn a_request_injected_after_an_honest_proof_is_refused() {
    use rcp::proto::Msg;
    let t = Scratch::new("inject");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let d = Daemon::start(&[&root], &key);
    let secret = rfabric::auth::read_secret(&key).unwrap();
    for encrypt in [true, false] {
        let (link, server_nonce) = raw_session(d.port).await;
        let auth = honest_answer(
            &link,
            &secret,
            &server_nonce,
            rfabric::auth::nonce(),
            encrypt,
        );
        link.send_message(&auth.encode()).await.unwrap();
        if !encrypt {
            // Asking for less than the daemon requires is refused first.
            match answer(&link).await {
                Msg::Fail { reason } => assert!(reason.contains("requires encrypted"), "{reason}"),
                other => panic!("a downgrade was taken: {other:?}"),
            }
            continue;
        }
        assert!(matches!(answer(&link).await, Msg::AuthOk { .. }));
        // The honest client would seal from here; the injector cannot.
        let push = Msg::Push {
            flags: 0,
            streams: 1,
            sources: 1,
            dest: root.join("planted").into_os_string().into_encoded_bytes(),
        };
        link.send_message(&push.encode()).await.unwrap();
        let err = link.recv().await.expect_err("the daemon ended the session");
        assert!(err.to_string().contains("unsealed"), "{err}");
    }
    assert!(!root.join("planted").exists());
}

#[test]
fn a_destination_swapped_for_a_symlink_mid_copy_writes_nothing_outside() {
    let t = Scratch::new("swap");
    let root = t.path("root");
    let outside = t.path("outside");
    std::fs::create_dir_all(root.join("dst")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..300 {
        std::fs::write(src.join(format!("f{i}")), pattern(16 << 10, i)).unwrap();
    }
    let key = secret(&t, "key");
    let d = Daemon::start(&[&root], &key);
    let client = Command::new(RCP)
        .args(["-q", "-r", "--chunk-size", "4K", "--window", "1"])
        .args(["--secret-file", s(&key), s(&src), &d.url(&root.join("dst"))])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Mid-copy, the destination directory becomes a symlink out of the root.
    std::fs::rename(root.join("dst"), root.join("moved")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("dst")).unwrap();
    let _ = client.wait_with_output().unwrap();
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "the copy followed the swapped symlink out of the root"
    );
}

#[test]
fn an_over_long_destination_is_refused_and_the_daemon_goes_on() {
    let t = Scratch::new("long");
    let root = t.path("root");
    std::fs::create_dir(&root).unwrap();
    let key = secret(&t, "key");
    let d = Daemon::start(&[&root], &key);
    std::fs::write(t.path("f"), b"payload").unwrap();
    let long = root.join("x".repeat(300)).join("y".repeat(5000));
    let out = rcp(&["--secret-file", s(&key), s(&t.path("f")), &d.url(&long)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rcp:"), "a clear error: {err}");
    ok(&rcp(&[
        "--secret-file",
        s(&key),
        s(&t.path("f")),
        &d.url(&root.join("f")),
    ]));
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"payload");
}

/// `--io-engine`: threads always works; auto takes io_uring where the
/// kernel allows it and otherwise says once why not; an explicit io_uring
/// the kernel refuses is a clear error that writes nothing. (Under the
/// kernel profiles that refuse io_uring, the refusing half is what runs.)
#[test]
fn the_storage_engine_is_chosen_reported_and_refused_clearly() {
    let t = Scratch::new("io-engine");
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    for (i, size) in [0usize, 1, 4095, 65_537, 1 << 20, 3_000_001]
        .into_iter()
        .enumerate()
    {
        std::fs::write(src.join(format!("f{i}")), pattern(size, i as u64)).unwrap();
    }
    // A sparse file: data at 5 MiB in a 9 MiB file.
    // Sparse files whose one data chunk is not the first (their digest
    // once counted it as chunk 0): data at 5 MiB in 9 MiB, and a 10 MiB
    // file whose only data is its last byte.
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(9 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &pattern(70_000, 9), 5 << 20).unwrap();
    let last = std::fs::File::create(src.join("last-byte")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&last, b"x", (10 << 20) - 1).unwrap();
    let notice = "using the threads storage engine";

    let out = rcp(&[
        "-r",
        "--json",
        "--io-engine",
        "threads",
        s(&src),
        s(&t.path("a")),
    ]);
    let v = json(&ok(&out));
    assert_eq!(v["io_engine"], "threads");
    assert!(!String::from_utf8_lossy(&out.stderr).contains(notice));
    assert_same_tree(&src, &t.path("a"));

    let out = rcp(&["-r", "--json", s(&src), s(&t.path("b"))]);
    let v = json(&ok(&out));
    assert_same_tree(&src, &t.path("b"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let uring = rcp(&[
        "-r",
        "--json",
        "--io-engine",
        "io_uring",
        s(&src),
        s(&t.path("c")),
    ]);
    match v["io_engine"].as_str() {
        Some("io_uring") => {
            assert!(!stderr.contains(notice), "{stderr}");
            assert_eq!(json(&ok(&uring))["io_engine"], "io_uring");
            assert_same_tree(&src, &t.path("c"));
        }
        Some("threads") => {
            // Said once, though sender and receiver both started engines.
            assert_eq!(stderr.matches(notice).count(), 1, "{stderr}");
            assert!(stderr.contains("io_uring on RHEL"), "{stderr}");
            assert_eq!(uring.status.code(), Some(1));
            let why = String::from_utf8_lossy(&uring.stderr);
            assert!(
                why.contains("--io-engine io_uring: io_uring_setup: "),
                "{why}"
            );
            assert!(!t.path("c").exists(), "nothing written");
        }
        other => panic!("io_engine {other:?}"),
    }
}

/// Files waiting for their commit hold their descriptors, and nothing but
/// the receiver bounds how many wait: a local copy of 3,000 small files to
/// a disk under a limit of 256 files failed with `EMFILE` before it did.
#[test]
fn a_copy_to_disk_under_a_low_open_file_limit_finishes() {
    // On the disk the tests run on (a temporary directory), not tmpfs:
    // files there are synced before they are placed, which is when they
    // pile up.
    let t = Scratch::new("low-nofile");
    let src = t.path("src");
    for i in 0..3000 {
        let dir = src.join(format!("d{}", i % 30));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}")), vec![(i % 251) as u8; 3000]).unwrap();
    }
    let script = format!(
        "ulimit -n 256 && exec {} -q -a {} {}",
        RCP,
        src.display(),
        t.path("dst").display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same_tree(&src, &t.path("dst"));
}

#[test]
fn running_out_of_open_files_is_a_clear_error_not_a_hang() {
    let t = Scratch::new("emfile");
    let src = t.path("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..400 {
        std::fs::write(src.join(format!("f{i}")), b"x").unwrap();
    }
    // Soft and hard limit low, so that rcp cannot raise it: the receiver
    // runs out of descriptors for its temporary files. (Into a destination
    // that holds something, where every file is answered before its data
    // and the window of files answered holds them open.)
    let dst = t.path("dst");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("there"), b"y").unwrap();
    let copy = |into: &std::path::Path| {
        let script = format!(
            "ulimit -n 60 && exec {} -q -a {} {}",
            RCP,
            src.display(),
            into.display()
        );
        let mut sh = Command::new("sh");
        sh.args(["-c", &script]);
        ended_within(
            sh,
            Duration::from_secs(60),
            "rcp hung when it ran out of open files",
        )
    };
    let (status, err) = copy(&dst);
    assert!(!status.success(), "{err}");
    assert!(err.contains("Too many open files"), "{err}");
    // Into nothing the files go unasked and fewer are open at once: the
    // copy may get through; where it does not, it says why, and never hangs.
    let (status, err) = copy(&t.path("new"));
    assert!(
        status.success() || err.contains("Too many open files"),
        "{err}"
    );
}

/// Runs `cmd` and waits for it `within` so long at most (it is killed
/// then, and the test fails with `hung`): its exit status and stderr.
fn ended_within(
    mut cmd: Command,
    within: Duration,
    hung: &str,
) -> (std::process::ExitStatus, String) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{hung}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

/// `--bwlimit` holds the data to its rate in each mode: the side the user
/// started paces (a push and a local copy what they send, a pull what it
/// takes in). Only a lower bound on the time is asserted: what a correct
/// limiter guarantees, whatever the machine's speed (unpaced, this copy
/// takes a fraction of it).
#[test]
fn bwlimit_holds_the_data_to_its_rate_in_every_mode() {
    let t = Scratch::new("bwlimit");
    let src = t.path("src");
    std::fs::write(&src, pattern(3 << 20, 77)).unwrap();
    let (rsh, path) = fake_rsh(&t);
    for how in ["local", "pushed", "pulled"] {
        let dst = t.path(&format!("dst-{how}"));
        let (from, to) = match how {
            "local" => (s(&src).to_string(), s(&dst).to_string()),
            "pushed" => (s(&src).to_string(), format!("localhost:{}", dst.display())),
            _ => (format!("localhost:{}", src.display()), s(&dst).to_string()),
        };
        let started = std::time::Instant::now();
        let out = Command::new(RCP)
            .args([
                "-q",
                "--chunk-size",
                "256K",
                "--bwlimit",
                "1M",
                "--rsh",
                s(&rsh),
            ])
            .arg(&from)
            .arg(&to)
            .env("PATH", &path)
            .output()
            .unwrap();
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read(&dst).unwrap(),
            std::fs::read(&src).unwrap(),
            "{how}"
        );
        // 3 MiB at 1 MiB/s, less the first burst (128 KiB) and a chunk.
        assert!(
            took >= Duration::from_millis(2600),
            "{how}: 3 MiB at 1 MiB/s took only {took:?}"
        );
    }
}

/// Without -p, as rsync: a directory the copy makes gets the source's
/// mode less the umask (and the setgid bit of its parent), and one that
/// was there keeps its own. (Every directory was made 0755 less the
/// umask: a private directory's copy, and one there already, were opened
/// to all.) Compared with rsync's modes, locally and through a remote
/// shell.
#[test]
fn without_p_directories_keep_their_privacy_as_with_rsync() {
    use std::os::unix::fs::PermissionsExt;
    let t = Scratch::new("dir-modes");
    let src = t.path("src");
    for (d, mode) in [("priv", 0o700), ("pub", 0o775), ("old", 0o777)] {
        std::fs::create_dir_all(src.join(d)).unwrap();
        std::fs::set_permissions(src.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::write(src.join("priv/f"), b"secret").unwrap();
    let made = |root: &Path| {
        std::fs::create_dir_all(root.join("src/old")).unwrap();
        std::fs::set_permissions(root.join("src/old"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::fs::set_permissions(root.join("src"), std::fs::Permissions::from_mode(0o2775))
            .unwrap();
    };
    let oracle = t.path("oracle");
    made(&oracle);
    let ok = Command::new("rsync")
        .arg("-r")
        .arg(&src)
        .arg(format!("{}/", oracle.display()))
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let (rsh, path) = fake_rsh(&t);
    for how in ["local", "remote shell"] {
        let into = t.path(&format!("into-{}", how.replace(' ', "-")));
        made(&into);
        let to = match how {
            "local" => format!("{}/", into.display()),
            _ => format!("localhost:{}/", into.display()),
        };
        let out = Command::new(RCP)
            .args(["-r", "-q", "--rsh", s(&rsh)])
            .arg(&src)
            .arg(&to)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for d in ["src", "src/old", "src/priv", "src/pub"] {
            let mode = |root: &Path| std::fs::metadata(root.join(d)).unwrap().mode() & 0o7777;
            assert_eq!(mode(&into), mode(&oracle), "{how}: {d}: {:o}", mode(&into));
        }
    }
}
