//! `rblock serve` against NBD clients nobody here wrote: libnbd's nbdinfo,
//! nbdcopy and nbdsh, qemu-io, qemu-img and fio, over TCP and a unix socket
//! on this machine. (`scripts/setup` installs them.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use test_support::{Scratch, pattern};

mod common;

use common::{RBLOCK, files_equal, fio_verify, free_port, image, ok, run};

/// `rblock serve` with two exports of one scratch image: `disk` (read-write,
/// the default) and `ro`; on a TCP port and a unix socket. Killed on drop.
struct Server {
    child: Child,
    port: u16,
    socket: PathBuf,
}

impl Server {
    /// Its files may grow to `limit` bytes at most (beyond, writes fail
    /// with EFBIG, and the signal that comes with it is ignored); `extra`
    /// options for `rblock serve`.
    fn start_limited(t: &Scratch, image: &Path, limit: u64, extra: &[&str]) -> Server {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(format!(
                "trap '' XFSZ; ulimit -f {}; exec \"$0\" \"$@\"",
                limit / 1024
            ))
            .arg(RBLOCK);
        Server::start_as(t, image, cmd, extra)
    }

    fn start_as(t: &Scratch, image: &Path, mut cmd: Command, extra: &[&str]) -> Server {
        let port = free_port();
        let socket = t.path("nbd.sock");
        let child = cmd
            .arg("serve")
            .arg("--export")
            .arg(format!("disk={}", image.display()))
            .arg("--export")
            .arg(format!("ro={},ro", image.display()))
            .arg("--nbd-listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--nbd-listen")
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            port,
            socket,
        };
        for _ in 0..200 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() && server.socket.exists() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("rblock serve did not start");
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port)
    }

    fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nbdinfo_sees_the_exports_their_flags_and_their_holes() {
    nbdinfo_sees_the_exports_their_flags_and_their_holes_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn nbdinfo_sees_the_exports_their_flags_and_their_holes_on_the_shared_runtime() {
    nbdinfo_sees_the_exports_their_flags_and_their_holes_with(&["--nbd-threads", "0"]);
}

fn nbdinfo_sees_the_exports_their_flags_and_their_holes_with(extra: &[&str]) {
    let t = Scratch::new("info");
    let img = image(&t, 64 << 20);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    let list = ok("nbdinfo", &["--list", &s.uri("")]);
    assert!(
        list.contains("export=\"disk\"") && list.contains("export=\"ro\""),
        "{list}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok("nbdinfo", &["--json", &s.uri("disk")])).unwrap();
    let e = &json["exports"][0];
    assert_eq!(e["export-size"], 64 << 20);
    assert_eq!(e["can_multi_conn"], true);
    assert_eq!(e["is_read_only"], false);
    // Any byte will do, as with nbdkit's file plugin, qemu-nbd and
    // nbd-server: the page cache reads in what a partial page needs.
    assert_eq!(e["block_size_minimum"], 1);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 << 20);
    for can in [
        "fua",
        "trim",
        "zero",
        "cache",
        "multi-conn",
        "flush",
        "fast-zero",
        "df",
    ] {
        let st = run("nbdinfo", &["--can", can, &s.uri("disk")]).status;
        assert_eq!(st.code(), Some(0), "--can {can}");
    }
    assert_eq!(
        run("nbdinfo", &["--is", "read-only", &s.uri("ro")])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        run("nbdinfo", &["--is", "read-only", &s.uri("disk")])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        run("nbdinfo", &["--can", "trim", &s.uri("ro")])
            .status
            .code(),
        Some(2)
    );
    // The unix socket serves the same; the map shows the one data MiB.
    let map = ok("nbdinfo", &["--map", "--totals", &s.unix_uri("disk")]);
    let data: Vec<&str> = map.lines().filter(|l| l.contains("data")).collect();
    assert_eq!(data.len(), 1, "{map}");
    assert!(data[0].trim_start().starts_with("1048576"), "{map}");
}

#[test]
fn nbdcopy_round_trip_with_four_connections_is_identical() {
    nbdcopy_round_trip_with_four_connections_is_identical_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn nbdcopy_round_trip_with_four_connections_is_identical_on_the_shared_runtime() {
    nbdcopy_round_trip_with_four_connections_is_identical_with(&["--nbd-threads", "0"]);
}

fn nbdcopy_round_trip_with_four_connections_is_identical_with(extra: &[&str]) {
    let t = Scratch::new("copy");
    // 64 MiB is 256 of nbdcopy's 256 KiB requests, 64 per connection; the
    // three images together stay small on a test machine's disk.
    let size = 64usize << 20;
    let src = t.path("src.img");
    // Random data with a hole in the middle.
    {
        let mut f = std::fs::File::create(&src).unwrap();
        for i in 0..(size >> 20) {
            if i == 30 {
                f.write_all(&vec![0u8; 1 << 20]).unwrap();
            } else {
                f.write_all(&pattern(1 << 20, i as u64 + 7)).unwrap();
            }
        }
    }
    let target = t.path("target.img");
    std::fs::File::create(&target)
        .unwrap()
        .set_len(size as u64)
        .unwrap();
    let s = Server::start_as(&t, &target, Command::new(RBLOCK), extra);
    ok(
        "nbdcopy",
        &[
            "--connections=4",
            "--flush",
            src.to_str().unwrap(),
            &s.uri("disk"),
        ],
    );
    let back = t.path("back.img");
    ok(
        "nbdcopy",
        &["--connections=4", &s.uri("disk"), back.to_str().unwrap()],
    );
    assert!(files_equal(&src, &back));
    assert!(files_equal(&src, &target));
}

/// Copied reads (`--zero-copy-reads never`) of cached data are read into
/// the server's spare buffers as they go out, and those buffers pass from
/// connection to connection: two rounds of writing an image and reading
/// it back with four connections each, the second round's data different
/// from the first's, must both come back exact (a buffer's old bytes sent
/// would show as the first round's data in the second), on threads and on
/// the shared runtime.
#[test]
fn copied_reads_through_the_servers_spare_buffers_never_send_old_bytes() {
    for threads in ["16", "0"] {
        let t = Scratch::new("copied-reads");
        let size = 64usize << 20;
        let target = t.path("target.img");
        std::fs::File::create(&target)
            .unwrap()
            .set_len(size as u64)
            .unwrap();
        let extra = ["--zero-copy-reads", "never", "--nbd-threads", threads];
        let s = Server::start_as(&t, &target, Command::new(RBLOCK), &extra);
        for round in 0..2u64 {
            let src = t.path(&format!("src-{round}.img"));
            std::fs::write(&src, pattern(size, 1000 + round)).unwrap();
            ok(
                "nbdcopy",
                &["--connections=4", src.to_str().unwrap(), &s.uri("disk")],
            );
            let back = t.path(&format!("back-{round}.img"));
            ok(
                "nbdcopy",
                &["--connections=4", &s.uri("disk"), back.to_str().unwrap()],
            );
            assert!(files_equal(&src, &back), "round {round}, {threads} threads");
        }
    }
}

#[test]
fn qemu_io_patterns_at_odd_offsets_and_qemu_img_convert_and_compare() {
    qemu_io_patterns_at_odd_offsets_and_qemu_img_convert_and_compare_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn qemu_io_patterns_at_odd_offsets_and_qemu_img_convert_and_compare_on_the_shared_runtime() {
    qemu_io_patterns_at_odd_offsets_and_qemu_img_convert_and_compare_with(&["--nbd-threads", "0"]);
}

fn qemu_io_patterns_at_odd_offsets_and_qemu_img_convert_and_compare_with(extra: &[&str]) {
    let t = Scratch::new("qemu");
    let img = image(&t, 32 << 20);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    let uri = s.uri("disk");
    let out = ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 1000 7777",
            "-c",
            "write -P 0xc3 4194303 3",
            "-c",
            "write -z 16384 65536",
            "-c",
            "read -P 0x5a 1000 7777",
            "-c",
            "read -P 0xc3 4194303 3",
            "-c",
            "read -P 0 16384 65536",
            "-c",
            "flush",
            &uri,
        ],
    );
    assert!(!out.contains("fail"), "{out}");
    // The pattern really reached the file, at those offsets.
    let data = std::fs::read(&img).unwrap();
    assert!(data[1000..8777].iter().all(|&b| b == 0x5a));
    assert!(data[4194303..4194306].iter().all(|&b| b == 0xc3));
    let mismatch = run(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x11 1000 10", &uri],
    );
    assert!(String::from_utf8_lossy(&mismatch.stdout).contains("Pattern verification failed"));

    let src = t.path("src.raw");
    std::fs::write(&src, pattern(32 << 20, 9)).unwrap();
    let src = src.to_str().unwrap();
    ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", src, &uri],
    );
    ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", src, &uri],
    );
    // And the other way round, through the read-only export.
    let back = t.path("back.raw");
    ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &s.uri("ro"),
            back.to_str().unwrap(),
        ],
    );
    ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src,
            back.to_str().unwrap(),
        ],
    );
}

#[test]
fn nbdsh_gets_the_exact_errors_for_bad_requests() {
    nbdsh_gets_the_exact_errors_for_bad_requests_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn nbdsh_gets_the_exact_errors_for_bad_requests_on_the_shared_runtime() {
    nbdsh_gets_the_exact_errors_for_bad_requests_with(&["--nbd-threads", "0"]);
}

fn nbdsh_gets_the_exact_errors_for_bad_requests_with(extra: &[&str]) {
    let t = Scratch::new("nbdsh");
    let img = image(&t, 16 << 20);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    // libnbd's own checks relaxed, so the server sees the bad requests.
    let script = r#"
size = 16 << 20
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(os.environ["DISK_URI"])
assert h.get_size() == size
expect(errno.EINVAL, h.pread, 4096, size)
expect(errno.EINVAL, h.pread, 4096, size - 512)
expect(errno.ENOSPC, h.pwrite, b"x" * 4096, size - 512)
expect(errno.ENOSPC, h.zero, 4096, size)
expect(errno.EINVAL, h.trim, 4096, size)
expect(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_REQ_ONE)
expect(errno.EINVAL, h.pwrite, b"x" * 512, 0, nbd.CMD_FLAG_NO_HOLE)
h.pwrite(b"y" * 512, 0, nbd.CMD_FLAG_FUA)
assert h.pread(512, 0) == b"y" * 512
h.zero(1 << 20, 1 << 20, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(4096, 1 << 20) == bytes(4096)
h.flush()
h.shutdown()
r = nbd.NBD()
r.set_strict_mode(0)
r.connect_uri(os.environ["RO_URI"])
expect(errno.EPERM, r.pwrite, b"x" * 512, 0)
expect(errno.EPERM, r.trim, 512, 0)
expect(errno.EPERM, r.zero, 512, 0)
assert r.pread(512, 0) == b"y" * 512
r.shutdown()
print("all errors as expected")
"#;
    let env = [("DISK_URI", s.uri("disk")), ("RO_URI", s.uri("ro"))];
    nbdsh(script, &env, "all errors as expected");
}

/// Requests at any byte, as nbdkit's file plugin, qemu-nbd and nbd-server
/// take them: the export says minimum block size 1 (to nbdinfo too), and a
/// client with libnbd's checks on or off (strict mode 0) gets unaligned
/// reads, writes (FUA too), zeroes, trims, caches and block status done,
/// to the byte.
#[test]
fn unaligned_requests_are_served_to_the_byte() {
    unaligned_requests_are_served_to_the_byte_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn unaligned_requests_are_served_to_the_byte_on_the_shared_runtime() {
    unaligned_requests_are_served_to_the_byte_with(&["--nbd-threads", "0"]);
}

fn unaligned_requests_are_served_to_the_byte_with(extra: &[&str]) {
    let t = Scratch::new("unaligned");
    let img = image(&t, 16 << 20);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    let json: serde_json::Value =
        serde_json::from_str(&ok("nbdinfo", &["--json", &s.uri("disk")])).unwrap();
    assert_eq!(json["exports"][0]["block_size_minimum"], 1, "{json}");
    let script = r#"
at, n = 12345, 70000
for strict in (0, None):
    h = nbd.NBD()
    if strict is not None:
        h.set_strict_mode(strict)
    h.add_meta_context("base:allocation")
    h.connect_uri(os.environ["DISK_URI"])
    assert h.get_block_size(nbd.SIZE_MINIMUM) == 1
    assert h.get_block_size(nbd.SIZE_PREFERRED) == 4096
    assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 << 20
    data = os.urandom(n)
    h.pwrite(data, at)
    assert h.pread(n, at) == data
    # Back in odd pieces, across page boundaries.
    assert h.pread(1, at) == data[:1]
    assert h.pread(4097, at + 3) == data[3:4100]
    assert h.pread(n - 1001, at + 1000) == data[1000:n - 1]
    # A write with FUA, zeroes either way, all unaligned.
    h.pwrite(b"fua", at + 5, nbd.CMD_FLAG_FUA)
    data = data[:5] + b"fua" + data[8:]
    h.zero(1001, at + 20001)
    h.zero(999, at + 30001, nbd.CMD_FLAG_NO_HOLE)
    data = data[:20001] + bytes(1001) + data[21002:30001] + bytes(999) + data[31000:]
    assert h.pread(n, at) == data
    # A trim (a hint: what it leaves reads as anything) and a cache.
    h.trim(3, at + n + 7)
    h.cache(4097, at + 1)
    seen = []
    def extents(context, offset, entries, err):
        seen.append((context, offset, entries))
        return 0
    h.block_status(70001, at + 1, extents)
    assert seen and seen[0][0] == "base:allocation" and seen[0][1] == at + 1, seen
    assert sum(seen[0][2][0::2]) >= 1, seen
    h.flush()
    h.shutdown()
    with open(os.environ["IMAGE"], "rb") as f:
        f.seek(at)
        assert f.read(n) == data, "the file differs"
print("unaligned requests served")
"#;
    let env = [
        ("DISK_URI", s.uri("disk")),
        ("IMAGE", img.display().to_string()),
    ];
    nbdsh(script, &env, "unaligned requests served");
}

/// What every nbdsh script here starts with: `expect(err, f, *args)`
/// calls `f(*args)` and asserts that it fails with exactly `err`.
const NBDSH_EXPECT: &str = r#"
import errno, nbd, os
def expect(err, f, *args):
    shown = [("<%d bytes>" % len(a)) if isinstance(a, bytes) else a for a in args]
    try:
        f(*args)
    except nbd.Error as e:
        # libnbd names the errno (a string in some versions).
        got = getattr(errno, e.errno) if isinstance(e.errno, str) else e.errno
        assert got == err, (f.__name__, shown, e.errno, e.string)
        return
    raise AssertionError(("no error", f.__name__, shown))
"#;

/// Runs `script` (after [`NBDSH_EXPECT`]) in nbdsh with `env` set; it must
/// succeed and print `done`.
fn nbdsh(script: &str, env: &[(&str, String)], done: &str) {
    // nbdsh runs `python3 -m nbd`: the system's Python, which has the
    // binding, whatever else comes first on PATH.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let out = Command::new("nbdsh")
        .args(["-n", "-c", &format!("{NBDSH_EXPECT}{script}")])
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("nbdsh runs (scripts/setup installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(done),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A write the file refuses halfway (past the server's file-size limit)
/// gets ENOSPC, whichever way its data came: moved from the socket into
/// the file (large writes of whole pages on the runtime, through a pipe
/// of 1 MiB, which a 3 MiB write outgrows) or through memory. The rest of
/// its data is still taken in, so the connection goes on: the next
/// requests, over TCP and the unix socket, are served (reads sent from
/// the page cache).
#[test]
fn a_write_refused_halfway_gets_enospc_and_the_connection_goes_on() {
    a_write_refused_halfway_gets_enospc_and_the_connection_goes_on_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn a_write_refused_halfway_gets_enospc_and_the_connection_goes_on_on_the_shared_runtime() {
    a_write_refused_halfway_gets_enospc_and_the_connection_goes_on_with(&["--nbd-threads", "0"]);
}

fn a_write_refused_halfway_gets_enospc_and_the_connection_goes_on_with(extra: &[&str]) {
    let t = Scratch::new("refused");
    let img = image(&t, 16 << 20);
    let s = Server::start_limited(
        &t,
        &img,
        8 << 20,
        &[&["--zero-copy-reads", "always"], extra].concat(),
    );
    let script = r#"
limit = 8 << 20
for uri in (os.environ["TCP_URI"], os.environ["UNIX_URI"]):
    h = nbd.NBD()
    h.connect_uri(uri)
    for offset, length in ((limit - (256 << 10), 1 << 20), (limit - (256 << 10), 3 << 20),
                           (limit - 3584, 512 << 10)):
        expect(errno.ENOSPC, h.pwrite, b"w" * length, offset)
        data = os.urandom(1 << 20)
        h.pwrite(data, 1 << 20)
        assert h.pread(1 << 20, 1 << 20) == data
    h.shutdown()
print("refused and went on")
"#;
    let env = [("TCP_URI", s.uri("disk")), ("UNIX_URI", s.unix_uri("disk"))];
    nbdsh(script, &env, "refused and went on");
}

#[test]
fn fio_random_writes_verify_with_crc32c() {
    fio_random_writes_verify_with_crc32c_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn fio_random_writes_verify_with_crc32c_on_the_shared_runtime() {
    fio_random_writes_verify_with_crc32c_with(&["--nbd-threads", "0"]);
}

fn fio_random_writes_verify_with_crc32c_with(extra: &[&str]) {
    let t = Scratch::new("fio");
    let img = image(&t, 64 << 20);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    let v = fio_verify(&s.uri("disk"), 32, 32, &[]);
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0);
    assert_eq!(job["write"]["io_bytes"], 32 << 20);
    // The verify pass read back everything it wrote.
    assert_eq!(job["read"]["io_bytes"], 32 << 20);
}

/// Large reads of data just written (in the page cache) verify both
/// ways they can go: from the page cache (`sendfile`, the default for
/// every plain client) and copied by the server (`--zero-copy-reads
/// never`), on threads and on the shared runtime; requests from 512
/// bytes to 3 MiB, 16 at once, so that the large ones are sent beside
/// small ones, and odd sizes cross page boundaries.
#[test]
fn large_reads_verify_from_the_page_cache_and_copied() {
    for policy in ["auto", "never"] {
        for threads in ["16", "0"] {
            let t = Scratch::new("large-reads");
            let img = image(&t, 64 << 20);
            let extra = ["--zero-copy-reads", policy, "--nbd-threads", threads];
            let s = Server::start_as(&t, &img, Command::new(RBLOCK), &extra);
            let v = fio_verify(&s.uri("disk"), 48, 16, &["--bsrange=512-3m"]);
            let job = &v["jobs"][0];
            let how = format!("{policy}, {threads} threads");
            assert_eq!(job["error"], 0, "{how}");
            assert_eq!(job["write"]["io_bytes"], 48 << 20, "{how}");
            assert_eq!(job["read"]["io_bytes"], 48 << 20, "{how}");
        }
    }
}

/// Large writes verify both ways their data can go: read into memory
/// (on the connection threads, and any write not of whole pages) and
/// moved from the socket into the file through a pipe (writes of whole
/// pages over 64 KiB on the shared runtime): writes of 4 KiB to 3 MiB,
/// 16 at once, so that some are longer than the pipe and small ones come
/// between; every byte is read back and verified.
#[test]
fn large_writes_verify_read_into_memory_and_spliced() {
    for threads in ["16", "0"] {
        let t = Scratch::new("large-writes");
        let img = image(&t, 64 << 20);
        let s = Server::start_as(&t, &img, Command::new(RBLOCK), &["--nbd-threads", threads]);
        let v = fio_verify(&s.uri("disk"), 48, 16, &["--bsrange=4k-3m"]);
        let job = &v["jobs"][0];
        assert_eq!(job["error"], 0, "{threads} threads");
        assert_eq!(job["write"]["io_bytes"], 48 << 20, "{threads} threads");
        assert_eq!(job["read"]["io_bytes"], 48 << 20, "{threads} threads");
    }
}

/// A raw connection through the handshake (fixed newstyle, no zeroes,
/// EXPORT_NAME "disk"), checking the export's size on the way.
fn raw_attach(port: u16) -> TcpStream {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    c.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&4u32.to_be_bytes());
    opt.extend_from_slice(b"disk");
    c.write_all(&opt).unwrap();
    let mut export = [0u8; 10];
    c.read_exact(&mut export).unwrap();
    assert_eq!(u64::from_be_bytes(export[..8].try_into().unwrap()), 4 << 20);
    c
}

/// A request header as the wire has it.
fn raw_request(kind: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
    r.extend_from_slice(&0u16.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    r
}

/// Everything the server still sends before it closes (it must close).
fn rest_until_closed(c: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    c.read_to_end(&mut rest)
        .expect("the server closes the connection");
    rest
}

/// Bad magic, a write beyond the largest payload, and requests after DISC
/// each end their own connection, unanswered; a connection alongside is
/// served throughout.
#[test]
fn malformed_requests_close_only_their_own_connection() {
    malformed_requests_close_only_their_own_connection_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn malformed_requests_close_only_their_own_connection_on_the_shared_runtime() {
    malformed_requests_close_only_their_own_connection_with(&["--nbd-threads", "0"]);
}

fn malformed_requests_close_only_their_own_connection_with(extra: &[&str]) {
    let t = Scratch::new("malformed");
    let img = image(&t, 4 << 20);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    let mut watcher = raw_attach(s.port);

    let mut bad = raw_attach(s.port);
    let mut header = raw_request(0, 1, 0, 4096);
    header[..4].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    bad.write_all(&header).unwrap();
    assert!(
        rest_until_closed(&mut bad).is_empty(),
        "bad magic is not answered"
    );

    let mut huge = raw_attach(s.port);
    huge.write_all(&raw_request(1, 2, 0, 64 << 20)).unwrap();
    assert!(
        rest_until_closed(&mut huge).is_empty(),
        "a 64 MiB write is not taken"
    );

    let mut late = raw_attach(s.port);
    let mut after = raw_request(2, 3, 0, 0);
    after.extend(raw_request(0, 4, 0, 4096));
    late.write_all(&after).unwrap();
    assert!(
        rest_until_closed(&mut late).is_empty(),
        "nothing after DISC is answered"
    );

    watcher
        .write_all(&raw_request(0, 9, 1 << 20, 4096))
        .unwrap();
    let mut reply = [0u8; 16 + 4096];
    watcher.read_exact(&mut reply).unwrap();
    assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 0);
    assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), 9);
    assert_eq!(&reply[16..], &pattern(1 << 20, 1)[..4096]);
}

/// Speaks NBD by hand where no client will: an unknown command, and a DISC
/// with requests still in flight.
#[test]
fn raw_requests_unknown_commands_and_disconnect() {
    raw_requests_unknown_commands_and_disconnect_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn raw_requests_unknown_commands_and_disconnect_on_the_shared_runtime() {
    raw_requests_unknown_commands_and_disconnect_with(&["--nbd-threads", "0"]);
}

fn raw_requests_unknown_commands_and_disconnect_with(extra: &[&str]) {
    let t = Scratch::new("raw");
    let img = image(&t, 4 << 20);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    let mut c = raw_attach(s.port);
    let request = raw_request;
    // Unknown command 42: EINVAL, and the connection goes on.
    c.write_all(&request(42, 1, 0, 512)).unwrap();
    let mut reply = [0u8; 16];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(
        u32::from_be_bytes(reply[..4].try_into().unwrap()),
        0x6744_6698
    );
    assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 22);
    assert_eq!(u64::from_be_bytes(reply[8..].try_into().unwrap()), 1);
    // Two reads then DISC at once: both are answered before the close.
    let mut burst = request(0, 2, 1 << 19, 4096);
    burst.extend(request(0, 3, 0, 4096));
    burst.extend(request(2, 4, 0, 0));
    c.write_all(&burst).unwrap();
    let rest = rest_until_closed(&mut c);
    assert_eq!(rest.len(), 2 * (16 + 4096));
    let mut cookies: Vec<u64> = [0, 16 + 4096]
        .iter()
        .map(|&at| {
            assert_eq!(
                u32::from_be_bytes(rest[at + 4..at + 8].try_into().unwrap()),
                0
            );
            u64::from_be_bytes(rest[at + 8..at + 16].try_into().unwrap())
        })
        .collect();
    cookies.sort();
    assert_eq!(cookies, [2, 3]);
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    sigterm_stops_the_server_cleanly_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn sigterm_stops_the_server_cleanly_on_the_shared_runtime() {
    sigterm_stops_the_server_cleanly_with(&["--nbd-threads", "0"]);
}

fn sigterm_stops_the_server_cleanly_with(extra: &[&str]) {
    let t = Scratch::new("term");
    let img = image(&t, 4 << 20);
    let mut s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    // An idle client connected through the handshake.
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(s.child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!s.socket.exists(), "the socket file is removed");
}

/// A client that asks for 64 MiB of reads and reads none of the replies
/// holds the connection in a blocked write. A stop still ends the server
/// soon after `--stop-grace`: the connection is given that long, then the
/// process exits (a thread blocked on such a client must not keep it
/// alive, as one did before).
#[test]
fn a_client_that_reads_nothing_does_not_hold_up_a_stop() {
    a_client_that_reads_nothing_does_not_hold_up_a_stop_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn a_client_that_reads_nothing_does_not_hold_up_a_stop_on_the_shared_runtime() {
    a_client_that_reads_nothing_does_not_hold_up_a_stop_with(&["--nbd-threads", "0"]);
}

fn a_client_that_reads_nothing_does_not_hold_up_a_stop_with(mode: &[&str]) {
    let t = Scratch::new("noread");
    let img = image(&t, 4 << 20);
    let mut extra = vec!["--stop-grace", "1"];
    extra.extend_from_slice(mode);
    let mut s = Server::start_as(&t, &img, Command::new(RBLOCK), &extra);
    let mut c = raw_attach(s.port);
    let reads: Vec<u8> = (0..1024u64)
        .flat_map(|i| raw_request(0, i, (i * 65536) % (4 << 20), 65536))
        .collect();
    c.write_all(&reads).unwrap();
    // Time for the server to fill both sockets' buffers and block.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the server ended early"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(s.child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let asked = std::time::Instant::now();
    let status = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(20),
            "the server still runs 20 s after the stop (grace 1 s)"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    // (The client stays connected, reading nothing, until here.)
    drop(c);
}

/// Many requests sent in one go, as a client with many in flight sends
/// them: small reads and writes (served together, answered in one
/// write), a large read among them (handed to another thread) and more
/// small ones behind it. Each is answered once, with its own data, and
/// the writes are in the file.
#[test]
fn a_burst_of_requests_is_answered_whole() {
    a_burst_of_requests_is_answered_whole_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn a_burst_of_requests_is_answered_whole_on_the_shared_runtime() {
    a_burst_of_requests_is_answered_whole_with(&["--nbd-threads", "0"]);
}

fn a_burst_of_requests_is_answered_whole_with(extra: &[&str]) {
    const READ: u16 = 0;
    const WRITE: u16 = 1;
    let t = Scratch::new("burst");
    let img = image(&t, 4 << 20);
    let original = std::fs::read(&img).unwrap();
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), extra);
    let mut c = raw_attach(s.port);
    // Reads from the image's data (1-2 MiB), writes where nothing is read
    // (2-3 MiB), so that no answer depends on the order they are served in.
    let mut burst = Vec::new();
    let mut reads = std::collections::HashMap::new();
    let mut writes = Vec::new();
    for cookie in 0..120u64 {
        let at = (1 << 20) + cookie * 8191;
        if cookie == 60 {
            burst.extend(raw_request(READ, cookie, 1 << 20, 1 << 20));
            reads.insert(cookie, (1 << 20, 1 << 20));
        } else if cookie % 3 == 0 {
            let at = at + (1 << 20);
            let data = pattern(4096 + cookie as usize, cookie);
            burst.extend(raw_request(WRITE, cookie, at, data.len() as u32));
            burst.extend(&data);
            writes.push((at as usize, data));
        } else {
            let len = 1 + (cookie as usize * 577) % 8000;
            burst.extend(raw_request(READ, cookie, at, len as u32));
            reads.insert(cookie, (at as usize, len));
        }
    }
    c.write_all(&burst).unwrap();
    let mut answered = std::collections::HashSet::new();
    for _ in 0..120 {
        let mut head = [0u8; 16];
        c.read_exact(&mut head).unwrap();
        assert_eq!(head[..4], 0x6744_6698u32.to_be_bytes(), "a simple reply");
        assert_eq!(head[4..8], [0; 4], "no error");
        let cookie = u64::from_be_bytes(head[8..16].try_into().unwrap());
        assert!(answered.insert(cookie), "cookie {cookie} answered twice");
        if let Some(&(at, len)) = reads.get(&cookie) {
            let mut data = vec![0u8; len];
            c.read_exact(&mut data).unwrap();
            assert!(data == original[at..at + len], "the data of read {cookie}");
        }
    }
    assert_eq!(answered.len(), 120);
    drop(c);
    let now = std::fs::read(&img).unwrap();
    for (at, data) in &writes {
        assert!(now[*at..*at + data.len()] == data[..], "the write at {at}");
    }
}

/// Threads of a connection's own: there while it is served (so the tests
/// above ran on them), gone after it; a stop with a client connected and
/// nothing in flight closes the connection and lets the server exit.
#[test]
fn connection_threads_serve_their_connection_and_stop_with_the_server() {
    let t = Scratch::new("conn-threads");
    let img = image(&t, 4 << 20);
    let mut s = Server::start_as(&t, &img, Command::new(RBLOCK), &["--nbd-threads", "3"]);
    let pid = s.child.id();
    let named = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter(|e| {
                let comm = e.as_ref().unwrap().path().join("comm");
                std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == "rblock-nbd")
            })
            .count()
    };
    assert_eq!(named(), 0, "none before a connection");
    let mut c = raw_attach(s.port);
    c.write_all(&raw_request(0, 7, 4096, 4096)).unwrap();
    let mut reply = vec![0u8; 16 + 4096];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), 7);
    assert_eq!(&reply[16..], &std::fs::read(&img).unwrap()[4096..8192]);
    // Three threads take turns; the connection's first is the runtime's
    // blocking pool's (named by tokio), the other two its own. (A thread
    // names itself once it runs, which may be after the first reply.)
    let there = (0..100).any(|_| {
        named() == 2 || {
            std::thread::sleep(Duration::from_millis(20));
            false
        }
    });
    assert!(there, "two threads of its own, {} named", named());
    // The client leaves: its threads end.
    drop(c);
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        named() == 0
    });
    assert!(gone, "the threads ended with their connection");

    // A stop while a client is connected, between requests: the server
    // closes it (within the threads' look at the stop) and exits cleanly.
    let mut c = raw_attach(s.port);
    c.write_all(&raw_request(0, 8, 0, 512)).unwrap();
    let mut reply = vec![0u8; 16 + 512];
    c.read_exact(&mut reply).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let waited = std::time::Instant::now();
    assert!(rest_until_closed(&mut c).is_empty(), "nothing unasked");
    assert!(waited.elapsed() < Duration::from_secs(5));
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// An nbdsh script that takes its connection (`URI`) from busy to quiet
/// and back, checking every byte as it goes: rounds of 64 small writes
/// and 64 small reads in flight at once, then one request at a time for
/// a while (past the half second it takes the server to call it quiet),
/// then busy and quiet again; at the end every block written is read
/// back one at a time and compared, and the image (`IMAGE`) holds them.
const BUSY_AND_QUIET: &str = r#"
import os, random, time
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(os.environ["URI"])
bs = 4096
blocks = h.get_size() // bs
rng = random.Random(11)
mine = {}

def busy(rounds):
    for _ in range(rounds):
        picked = rng.sample(range(blocks), 128)
        writes, reads = picked[:64], [b for b in picked[64:] if b in mine]
        for b in writes:
            mine[b] = rng.randbytes(bs)
            h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(mine[b])), b * bs)
        bufs = [(b, nbd.Buffer(bs)) for b in reads]
        for b, buf in bufs:
            h.aio_pread(buf, b * bs)
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for b, buf in bufs:
            assert buf.to_bytearray() == mine[b], ("busy read", b)

def quiet(seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        b = rng.randrange(blocks)
        if b in mine and rng.random() < 0.5:
            assert h.pread(bs, b * bs) == mine[b], ("quiet read", b)
        else:
            mine[b] = rng.randbytes(bs)
            h.pwrite(mine[b], b * bs)

busy(40)
quiet(0.5)
busy(40)
quiet(0.5)
for b, data in mine.items():
    assert h.pread(bs, b * bs) == data, ("last read", b)
h.flush()
with open(os.environ["IMAGE"], "rb") as f:
    for b, data in mine.items():
        f.seek(b * bs)
        assert f.read(bs) == data, ("image", b)
print("kept", len(mine), "blocks")
"#;

/// A connection to a local export starts on its threads, moves to the
/// runtime once it has many small requests in flight, and back once it
/// asks one at a time again, over a unix socket and under TLS, without a
/// byte lost or out of place on the way (`serve/pace.rs`). The server's
/// debug log must show each move.
#[test]
fn a_connection_moves_to_the_runtime_when_busy_and_back_when_quiet_keeping_every_byte() {
    let t = Scratch::new("pace");
    let img = image(&t, 16 << 20);
    let pki = certificates(&t);
    let mut cmd = Command::new(RBLOCK);
    cmd.env("RUST_LOG", "rblock=debug");
    let extra = ["--tls", "on", "--tls-certificates", pki.to_str().unwrap()];
    let mut s = Server::start_as(&t, &img, cmd, &extra);
    let tls_uri = format!(
        "nbds://localhost:{}/disk?tls-certificates={}",
        s.port,
        pki.display()
    );
    for uri in [s.unix_uri("disk"), tls_uri] {
        let env = [("URI", uri.clone()), ("IMAGE", img.display().to_string())];
        nbdsh(BUSY_AND_QUIET, &env, "kept");
    }
    let (moves, log) = moves_logged(&mut s);
    // Twice each way per connection.
    assert_eq!(moves, (4, 4), "{log}");
    // Busy with 4 KiB requests: on a runtime of one thread, each time.
    assert_eq!(on_one_thread(&log), 4, "{log}");
    // No connection ended in trouble (the start's probes of the port
    // connect and leave at once), and nothing failed. (Other warnings may
    // come: no io_uring under the kernel profiles.)
    let troubled = log
        .lines()
        .filter(|l| l.contains("ended:") || l.contains("error:"))
        .filter(|l| !l.contains("Connection reset by peer"));
    assert_eq!(troubled.count(), 0, "{log}");
}

/// A raw client that sends each batch of requests in one write, so that
/// the server holds the next requests read ahead when the connection
/// moves: from its threads to the runtime in the middle of a burst of
/// small requests, and back in the middle of a run of large writes; then
/// to the runtime at a large read, and back after small requests one at
/// a time. Every reply must come, with the data the image held, and the
/// image must hold every write at the end. The server's debug log must
/// show the moves.
#[test]
fn requests_read_ahead_go_with_a_connection_that_moves() {
    let t = Scratch::new("pace-raw");
    let img = image(&t, 4 << 20);
    let mut cmd = Command::new(RBLOCK);
    cmd.env("RUST_LOG", "rblock=debug");
    let mut s = Server::start_as(&t, &img, cmd, &[]);
    let mut c = raw_attach(s.port);
    let mut client = RawClient {
        model: std::fs::read(&img).unwrap(),
        cookie: 0,
        seed: 0,
    };
    let small = |k: usize| -> Vec<(u64, usize)> {
        // (Distinct blocks: no two writes of a batch meet.)
        (0..64)
            .map(|i| (((i * 9 + k) % 512) as u64 * 4096, 4096))
            .collect()
    };
    let large = |k: usize| -> Vec<(u64, usize)> {
        // Whole pages (moved through a pipe) and odd lengths (copied).
        (0..4)
            .map(|i| ((i * 400_000 + k * 4096) as u64, 307_200 + (i % 2) * 1_001))
            .collect()
    };
    let for_a_while = |ms| {
        let until = std::time::Instant::now() + Duration::from_millis(ms);
        move || std::time::Instant::now() < until
    };
    for round in 0..2 {
        // Small writes and reads, 128 in one go: to the runtime.
        for k in 0..3 {
            client.batch(&mut c, &small(k), &small(k + 7), k % 2 == 0);
        }
        // Large writes only, four in one go, for longer than the
        // runtime's quiet span: back to the threads, mid-batch.
        let (mut k, going) = (0, for_a_while(400));
        while going() {
            client.batch(&mut c, &large(k), &[], k % 2 == 1);
            k += 1;
        }
        // Large reads, one at a time: to the runtime at once.
        for k in 0..8 {
            client.batch(&mut c, &[], &large(k)[k % 4..][..1], k % 2 == 0);
        }
        // Small writes and reads one at a time, for longer than the
        // quiet span: back to the threads.
        let (mut k, going) = (0, for_a_while(300));
        while going() {
            let one = [small(k + round)[k % 64]];
            client.batch(&mut c, &one, &[], k % 2 == 0);
            client.batch(&mut c, &[], &one, k % 2 == 0);
            k += 1;
        }
    }
    drop(c);
    assert!(std::fs::read(&img).unwrap() == client.model, "the image");
    let (moves, log) = moves_logged(&mut s);
    assert_eq!(moves, (4, 4), "{log}");
    // Each round once for small requests (to a runtime of one thread),
    // once for a large read (to the shared one).
    assert_eq!(on_one_thread(&log), 2, "{log}");
}

/// How many moves `log` shows to a single-threaded runtime.
fn on_one_thread(log: &str) -> usize {
    log.matches("serving it on the runtime (single-threaded)")
        .count()
}

/// Stops `s` (started with `RUST_LOG=rblock=debug`) and reads its log:
/// the moves it logged to the runtime and back to the threads, and the
/// log.
fn moves_logged(s: &mut Server) -> ((usize, usize), String) {
    let _ = s.child.kill();
    let mut log = String::new();
    let mut stderr = s.child.stderr.take().unwrap();
    stderr.read_to_string(&mut log).unwrap();
    let busy = log.matches("a busy connection: serving it on the runtime");
    let quiet = log.matches("a quiet connection: serving it on its threads");
    ((busy.count(), quiet.count()), log)
}

/// The raw client of the test above: what the image should hold, and the
/// next cookie and data seed.
struct RawClient {
    model: Vec<u8>,
    cookie: u64,
    seed: u64,
}

impl RawClient {
    /// Sends reads and writes (`at`, `len`) in one write, then takes every
    /// reply in whatever order it comes and checks it. The writes go to
    /// one half of the image and the reads come from the other (`upper`
    /// says which half gets the writes), so no reply depends on the order
    /// the server serves them in.
    fn batch(
        &mut self,
        c: &mut TcpStream,
        writes: &[(u64, usize)],
        reads: &[(u64, usize)],
        upper: bool,
    ) {
        const HALF: u64 = 2 << 20;
        let (w_base, r_base) = if upper { (HALF, 0) } else { (0, HALF) };
        let mut out = Vec::new();
        let mut expected = std::collections::HashMap::new();
        let mut written = Vec::new();
        for &(at, len) in reads {
            let at = (r_base + (at % HALF).min(HALF - len as u64)) as usize;
            out.extend(raw_request(0, self.cookie, at as u64, len as u32));
            expected.insert(self.cookie, Some(self.model[at..at + len].to_vec()));
            self.cookie += 1;
        }
        for &(at, len) in writes {
            let at = w_base + (at % HALF).min(HALF - len as u64);
            self.seed += 1;
            let data = pattern(len, self.seed);
            out.extend(raw_request(1, self.cookie, at, len as u32));
            out.extend(&data);
            expected.insert(self.cookie, None);
            written.push((at as usize, data));
            self.cookie += 1;
        }
        c.write_all(&out).unwrap();
        while !expected.is_empty() {
            let mut head = [0u8; 16];
            c.read_exact(&mut head).unwrap();
            assert_eq!(
                head[..8],
                [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0],
                "a simple reply, no error"
            );
            let cookie = u64::from_be_bytes(head[8..16].try_into().unwrap());
            let wanted = expected.remove(&cookie).expect("a cookie asked once");
            if let Some(wanted) = wanted {
                let mut data = vec![0u8; wanted.len()];
                c.read_exact(&mut data).unwrap();
                assert!(data == wanted, "the data of read {cookie}");
            }
        }
        for (at, data) in written {
            self.model[at..at + data.len()].copy_from_slice(&data);
        }
    }
}

/// A CA and a server certificate for localhost in `dir`, in the layout
/// nbdkit, qemu and `rblock serve --tls-certificates` use (made with the
/// openssl tool; libnbd and qemu check them with GnuTLS).
fn certificates(t: &Scratch) -> PathBuf {
    let dir = t.path("pki");
    std::fs::create_dir(&dir).unwrap();
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let ext = t.path("san.cnf");
    std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    let openssl = |args: &[&str]| {
        ok("openssl", args);
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=rblock test CA",
        "-keyout",
        &p("ca-key.pem"),
        "-out",
        &p("ca-cert.pem"),
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &p("server-key.pem"),
        "-out",
        &p("server.csr"),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("server.csr"),
        "-CA",
        &p("ca-cert.pem"),
        "-CAkey",
        &p("ca-key.pem"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        ext.to_str().unwrap(),
        "-out",
        &p("server-cert.pem"),
    ]);
    dir
}

/// `qemu-img info` of the export `disk` on `port` through qemu's TLS
/// credentials object `creds` (its id must be `tls0`).
fn qemu_img_info_over_tls(port: u16, creds: &str) -> String {
    let opts = format!("driver=nbd,host=localhost,port={port},export=disk,tls-creds=tls0");
    ok(
        "qemu-img",
        &["info", "--object", creds, "--image-opts", &opts],
    )
}

/// A psktool-style key file: `user:hexkey`.
fn psk_file(t: &Scratch, name: &str, user: &str, key: &str) -> PathBuf {
    let p = t.path(name);
    std::fs::write(&p, format!("{user}:{key}\n")).unwrap();
    p
}

#[test]
fn tls_with_certificates_serves_nbdinfo_nbdcopy_and_qemu_img_and_refuses_plain_clients() {
    tls_with_certificates_serves_nbdinfo_nbdcopy_and_qemu_img_and_refuses_plain_clients_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn tls_with_certificates_serves_nbdinfo_nbdcopy_and_qemu_img_and_refuses_plain_clients_on_the_shared_runtime()
 {
    tls_with_certificates_serves_nbdinfo_nbdcopy_and_qemu_img_and_refuses_plain_clients_with(&[
        "--nbd-threads",
        "0",
    ]);
}

fn tls_with_certificates_serves_nbdinfo_nbdcopy_and_qemu_img_and_refuses_plain_clients_with(
    mode: &[&str],
) {
    let t = Scratch::new("tls-x509");
    let img = image(&t, 4 << 20);
    let pki = certificates(&t);
    let mut extra = vec![
        "--tls",
        "require",
        "--tls-certificates",
        pki.to_str().unwrap(),
    ];
    extra.extend_from_slice(mode);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), &extra);
    let tls_uri = format!(
        "nbds://localhost:{}/disk?tls-certificates={}",
        s.port,
        pki.display()
    );
    assert_eq!(
        ok("nbdinfo", &["--size", &tls_uri]).trim(),
        (4u64 << 20).to_string()
    );
    // Data both ways over TLS, checked byte for byte.
    let data = t.path("data");
    std::fs::write(&data, pattern(4 << 20, 9)).unwrap();
    ok("nbdcopy", &[data.to_str().unwrap(), &tls_uri]);
    let back = t.path("back");
    ok("nbdcopy", &[&tls_uri, back.to_str().unwrap()]);
    assert!(files_equal(&data, &back), "what came back over TLS differs");
    assert!(
        files_equal(&data, &img),
        "what was written over TLS differs"
    );
    // qemu-img with qemu's own X.509 credentials object.
    let creds = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        pki.display()
    );
    let info = qemu_img_info_over_tls(s.port, &creds);
    assert!(info.contains("virtual size: 4 MiB"), "{info}");
    // A plain client is told TLS is required and gets nothing.
    let plain = run(
        "nbdinfo",
        &["--size", &format!("nbd://localhost:{}/disk", s.port)],
    );
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(!plain.status.success(), "a plain client was served");
    assert!(err.to_lowercase().contains("tls"), "{err}");
}

#[test]
fn tls_with_pre_shared_keys_takes_the_right_key_only() {
    tls_with_pre_shared_keys_takes_the_right_key_only_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn tls_with_pre_shared_keys_takes_the_right_key_only_on_the_shared_runtime() {
    tls_with_pre_shared_keys_takes_the_right_key_only_with(&["--nbd-threads", "0"]);
}

fn tls_with_pre_shared_keys_takes_the_right_key_only_with(mode: &[&str]) {
    let t = Scratch::new("tls-psk");
    let img = image(&t, 4 << 20);
    let key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let server_keys = psk_file(&t, "keys.psk", "alice", key);
    let mut extra = vec![
        "--tls",
        "require",
        "--tls-psk",
        server_keys.to_str().unwrap(),
    ];
    extra.extend_from_slice(mode);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), &extra);
    let uri = |file: &Path| {
        format!(
            "nbds://alice@localhost:{}/disk?tls-psk-file={}",
            s.port,
            file.display()
        )
    };
    assert_eq!(
        ok("nbdinfo", &["--size", &uri(&server_keys)]).trim(),
        (4u64 << 20).to_string()
    );
    let data = t.path("data");
    std::fs::write(&data, pattern(4 << 20, 5)).unwrap();
    ok("nbdcopy", &[data.to_str().unwrap(), &uri(&server_keys)]);
    assert!(
        files_equal(&data, &img),
        "what was written over TLS-PSK differs"
    );
    // qemu's PSK object reads keys.psk from a directory.
    let qemu_dir = t.path("qemu-psk");
    std::fs::create_dir(&qemu_dir).unwrap();
    std::fs::copy(&server_keys, qemu_dir.join("keys.psk")).unwrap();
    let creds = format!(
        "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
        qemu_dir.display()
    );
    let info = qemu_img_info_over_tls(s.port, &creds);
    assert!(info.contains("virtual size: 4 MiB"), "{info}");
    // The wrong key, and the right key under another name: refused.
    let wrong = psk_file(&t, "wrong.psk", "alice", &key.replace('0', "f"));
    let out = run("nbdinfo", &["--size", &uri(&wrong)]);
    assert!(!out.status.success(), "a wrong key was taken");
    let mallory = psk_file(&t, "mallory.psk", "mallory", key);
    let out = run(
        "nbdinfo",
        &[
            "--size",
            &format!(
                "nbds://mallory@localhost:{}/disk?tls-psk-file={}",
                s.port,
                mallory.display()
            ),
        ],
    );
    assert!(!out.status.success(), "an unknown user was taken");
}

/// Many requests in flight over one TLS session, sent back to back by
/// libnbd: small writes of odd lengths, then small reads of odd lengths
/// with 1 MiB reads among them and a flush. The server takes several from
/// one decrypted burst (on connection threads, `take_buffered`) and
/// answers several in one write, gathered into records. Every read is
/// checked against what the client wrote, and the file against the same.
#[test]
fn tls_serves_a_pipelined_mix_of_requests() {
    tls_serves_a_pipelined_mix_of_requests_with(&[]);
}

/// The same on the shared runtime (`--nbd-threads 0`).
#[test]
fn tls_serves_a_pipelined_mix_of_requests_on_the_shared_runtime() {
    tls_serves_a_pipelined_mix_of_requests_with(&["--nbd-threads", "0"]);
}

fn tls_serves_a_pipelined_mix_of_requests_with(mode: &[&str]) {
    let t = Scratch::new("tls-mix");
    let img = t.path("disk.img");
    std::fs::write(&img, pattern(8 << 20, 3)).unwrap();
    let key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let keys = psk_file(&t, "keys.psk", "alice", key);
    let mut extra = vec!["--tls", "require", "--tls-psk", keys.to_str().unwrap()];
    extra.extend_from_slice(mode);
    let s = Server::start_as(&t, &img, Command::new(RBLOCK), &extra);
    let expected = t.path("expected.img");
    let script = r#"
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(os.environ["TLS_URI"])
image = bytearray(open(os.environ["IMAGE"], "rb").read())
def wait_all():
    while h.aio_in_flight() > 0:
        h.poll(-1)
# Writes, all in flight at once: odd lengths at odd offsets.
for i in range(96):
    off = (i * 83011) % (len(image) - 70000)
    data = bytes((i * 7 + j) % 251 for j in range(1 + (i * 997) % 66000))
    h.aio_pwrite(data, off)
    image[off:off + len(data)] = data
wait_all()
h.aio_flush()
wait_all()
# Reads, all in flight at once; 1 MiB ones among the small ones.
reads = []
for i in range(120):
    n = (1 << 20) if i % 40 == 17 else 1 + (i * 4099) % 70000
    off = (i * 61417) % (len(image) - n)
    buf = nbd.Buffer(n)
    h.aio_pread(buf, off)
    reads.append((off, n, buf))
wait_all()
for off, n, buf in reads:
    assert buf.to_bytearray() == image[off:off + n], "read at %d of %d bytes differs" % (off, n)
open(os.environ["EXPECTED"], "wb").write(image)
h.shutdown()
print("pipelined requests served over TLS")
"#;
    let env = [
        (
            "TLS_URI",
            format!(
                "nbds://alice@localhost:{}/disk?tls-psk-file={}",
                s.port,
                keys.display()
            ),
        ),
        ("IMAGE", img.display().to_string()),
        ("EXPECTED", expected.display().to_string()),
    ];
    nbdsh(script, &env, "pipelined requests served over TLS");
    assert!(
        files_equal(&img, &expected),
        "the file differs from what was written over TLS"
    );
}

#[test]
fn tls_on_serves_plain_clients_too_and_bad_credentials_stop_the_start() {
    let t = Scratch::new("tls-on");
    let img = image(&t, 4 << 20);
    let pki = certificates(&t);
    let s = Server::start_as(
        &t,
        &img,
        Command::new(RBLOCK),
        &["--tls", "on", "--tls-certificates", pki.to_str().unwrap()],
    );
    let size = (4u64 << 20).to_string();
    let plain = format!("nbd://localhost:{}/disk", s.port);
    assert_eq!(ok("nbdinfo", &["--size", &plain]).trim(), size);
    let tls = format!(
        "nbds://localhost:{}/disk?tls-certificates={}",
        s.port,
        pki.display()
    );
    assert_eq!(ok("nbdinfo", &["--size", &tls]).trim(), size);
    drop(s);
    let export = format!("disk={}", img.display());
    for bad in [
        vec!["--tls", "require"],
        vec!["--tls-certificates", pki.to_str().unwrap()],
        vec!["--tls", "on", "--tls-certificates", "/nonexistent"],
    ] {
        let mut args = vec!["serve", "--export", &export, "--nbd-listen", "127.0.0.1:1"];
        args.extend_from_slice(&bad);
        let out = run(RBLOCK, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains("tls") || err.contains("TLS"), "{bad:?}: {err}");
    }
}
