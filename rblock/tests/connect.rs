//! `rblock connect` → `rblock serve --listen` over the fabric's tcp
//! backend on this machine, with NBD clients nobody here wrote (nbdinfo,
//! nbdcopy, qemu-io, qemu-img, fio) talking to the gateway; and the
//! gateway riding out a server restart. (The same over RDMA runs in the
//! VM tier.)

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{Scratch, pattern};

mod common;

use common::{RBLOCK, files_equal, fio_verify, free_port, image, ok, run};

/// `rblock serve` with `disk` and a read-only `ro` of one image, for the
/// fabric on `fabric` (tcp). Killed on drop.
struct Serve {
    child: Child,
}

impl Serve {
    fn start(image: &Path, fabric: u16) -> Serve {
        Serve::start_with(image, fabric, &[])
    }

    fn start_with(image: &Path, fabric: u16, extra: &[&str]) -> Serve {
        let nbd = free_port();
        let child = Command::new(RBLOCK)
            .arg("serve")
            .arg("--export")
            .arg(format!("disk={}", image.display()))
            .arg("--export")
            .arg(format!("ro={},ro", image.display()))
            .args(["--nbd-listen", &format!("127.0.0.1:{nbd}")])
            .args(["--listen", &format!("127.0.0.1:{fabric}")])
            .args(["--transport", "tcp"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Its NBD port is up once its fabric listener is.
        wait_for(
            || TcpStream::connect(("127.0.0.1", nbd)).is_ok(),
            "rblock serve",
        );
        Serve { child }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rblock connect` to `export` on the server at `fabric`, serving NBD on
/// a unix socket. Killed on drop.
struct Gateway {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Gateway {
    fn start(t: &Scratch, fabric: u16, export: &str, extra: &[&str]) -> Gateway {
        let socket = t.path(&format!("{export}.sock"));
        let log = t.path(&format!("{export}.log"));
        let child = Command::new(RBLOCK)
            .arg("connect")
            .arg(format!("127.0.0.1:{fabric}/{export}"))
            .args(["--transport", "tcp"])
            .args(["--nbd-listen", &format!("unix:{}", socket.display())])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let g = Gateway { child, socket, log };
        wait_for(|| g.socket.exists(), "rblock connect");
        g
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(mut ready: impl FnMut() -> bool, what: &str) {
    for _ in 0..400 {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{what} did not start");
}

#[test]
fn nbdinfo_through_the_gateway_sees_the_remote_export() {
    let t = Scratch::new("gw-info");
    let img = image(&t, 64 << 20);
    let fabric = free_port();
    let _s = Serve::start(&img, fabric);
    let g = Gateway::start(&t, fabric, "disk", &["--connections", "2"]);
    let json: serde_json::Value =
        serde_json::from_str(&ok("nbdinfo", &["--json", &g.uri("disk")])).unwrap();
    let e = &json["exports"][0];
    assert_eq!(e["export-size"], 64 << 20);
    assert_eq!(e["is_read_only"], false);
    for can in [
        "can_multi_conn",
        "can_trim",
        "can_fua",
        "can_flush",
        "can_zero",
    ] {
        assert_eq!(e[can], true, "{can}");
    }
    // Holes and data as the server's file has them, asked across the fabric.
    let map = ok("nbdinfo", &["--map", &g.uri("disk")]);
    let rows: Vec<Vec<&str>> = map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..3], ["0", "1048576", "3"], "{map}");
    assert_eq!(rows[1][..3], ["1048576", "1048576", "0"], "{map}");

    let ro = Gateway::start(&t, fabric, "ro", &[]);
    let out = run("nbdinfo", &["--is", "read-only", &ro.uri("ro")]);
    assert!(
        out.status.success(),
        "the ro export is read-only through the gateway"
    );
    let w = run(
        "qemu-io",
        &["-f", "raw", &ro.uri("ro"), "-c", "write -P 1 0 4096"],
    );
    let said = String::from_utf8_lossy(&w.stdout).to_string() + &String::from_utf8_lossy(&w.stderr);
    assert!(
        !w.status.success() || said.contains("failed"),
        "a write to the ro export is refused: {said}"
    );
}

#[test]
fn nbdcopy_round_trip_through_the_gateway_is_identical() {
    let t = Scratch::new("gw-copy");
    let size = 64usize << 20;
    let src = t.path("src.img");
    let mut data = Vec::with_capacity(size);
    for i in 0..(size >> 20) {
        if i == 20 {
            data.extend_from_slice(&vec![0u8; 1 << 20]);
        } else {
            data.extend_from_slice(&pattern(1 << 20, i as u64 + 3));
        }
    }
    std::fs::write(&src, &data).unwrap();
    let target = t.path("target.img");
    std::fs::File::create(&target)
        .unwrap()
        .set_len(size as u64)
        .unwrap();
    let fabric = free_port();
    let _s = Serve::start(&target, fabric);
    let g = Gateway::start(&t, fabric, "disk", &["--connections", "2"]);
    ok(
        "nbdcopy",
        &[
            "--connections=4",
            "--flush",
            src.to_str().unwrap(),
            &g.uri("disk"),
        ],
    );
    assert!(files_equal(&src, &target), "the server's file has the data");
    let back = t.path("back.img");
    ok(
        "nbdcopy",
        &["--connections=4", &g.uri("disk"), back.to_str().unwrap()],
    );
    assert!(files_equal(&src, &back), "and it reads back the same");
}

#[test]
fn qemu_io_patterns_across_pieces_and_qemu_img_compare() {
    let t = Scratch::new("gw-qemu");
    let img = image(&t, 32 << 20);
    let fabric = free_port();
    let _s = Serve::start(&img, fabric);
    let g = Gateway::start(&t, fabric, "disk", &[]);
    let uri = g.uri("disk");
    // Odd offsets and sizes; 3 MiB + 1000 crosses many 256 KiB pieces.
    let cmds = [
        "write -P 0x11 1000 3146728",
        "write -P 0x22 7340033 4095",
        "write -z 9437184 1048576",
        "write -P 0x33 16777215 1",
        "flush",
        "read -P 0x11 1000 3146728",
        "read -P 0x22 7340033 4095",
        "read -P 0 9437184 1048576",
        "read -P 0x33 16777215 1",
    ];
    let mut args = vec!["-f", "raw", uri.as_str()];
    for c in &cmds {
        args.extend(["-c", c]);
    }
    let out = ok("qemu-io", &args);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // What the gateway shows is exactly the server's file.
    ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &uri,
            img.to_str().unwrap(),
        ],
    );
}

#[test]
fn fio_random_writes_through_the_gateway_verify() {
    let t = Scratch::new("gw-fio");
    let img = image(&t, 32 << 20);
    let fabric = free_port();
    let _s = Serve::start(&img, fabric);
    let g = Gateway::start(&t, fabric, "disk", &["--connections", "2"]);
    let v = fio_verify(&g.uri("disk"), 16, 16, &[]);
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0);
    assert_eq!(job["write"]["io_bytes"], 16 << 20);
    assert_eq!(job["read"]["io_bytes"], 16 << 20);
}

/// Requests from 512 bytes to 3 MiB (up to 12 pieces of a link), 16 at
/// once: write data received straight into the link's buffers and sent
/// from there, read data written to the client from the slots it landed
/// in, pieces of many reads interleaved in one landing ring. Unsealed
/// (both copy-free paths) and encrypted (writes copied to be sealed,
/// reads decrypted where they landed and sent from there).
#[test]
fn large_and_odd_sized_requests_through_the_gateway_verify() {
    let t = Scratch::new("gw-fio-large");
    let img = image(&t, 64 << 20);
    let key = t.path("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    // (A secret others may read is refused.)
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let sealed = ["--secret-file", key.to_str().unwrap()];
    for extra in [&[][..], &sealed[..]] {
        let fabric = free_port();
        let _s = Serve::start_with(&img, fabric, extra);
        let g = Gateway::start(
            &t,
            fabric,
            "disk",
            &[&["--connections", "2"], extra].concat(),
        );
        let v = fio_verify(&g.uri("disk"), 48, 16, &["--bsrange=512-3m"]);
        let job = &v["jobs"][0];
        assert_eq!(job["error"], 0, "{extra:?}");
        assert_eq!(job["write"]["io_bytes"], 48 << 20, "{extra:?}");
        assert_eq!(job["read"]["io_bytes"], 48 << 20, "{extra:?}");
    }
}

#[test]
fn a_server_restart_is_ridden_out_and_nothing_is_lost() {
    let t = Scratch::new("gw-restart");
    let img = image(&t, 32 << 20);
    let fabric = free_port();
    let mut s = Serve::start(&img, fabric);
    let g = Gateway::start(&t, fabric, "disk", &["--connections", "2"]);
    let uri = g.uri("disk");
    // A verify job slowed down so that it is mid-way when the server dies.
    // Requests up to 1 MiB: writes staged in the old link's buffers go
    // again from a copy on the new one.
    let job =
        std::thread::spawn(move || fio_verify(&uri, 16, 16, &["--rate=4m", "--bsrange=4k-1m"]));
    std::thread::sleep(Duration::from_millis(1500));
    let _ = s.child.kill();
    let _ = s.child.wait();
    std::thread::sleep(Duration::from_millis(500));
    s = Serve::start(&img, fabric);
    let v = job.join().expect("fio finished");
    let j = &v["jobs"][0];
    assert_eq!(j["error"], 0, "every write acknowledged reads back intact");
    assert_eq!(j["read"]["io_bytes"], 16 << 20);
    let log = g.log();
    assert!(log.contains("connected again"), "{log}");
    drop(s);
}

#[test]
fn requests_fail_loudly_when_the_server_stays_away() {
    let t = Scratch::new("gw-gone");
    let img = image(&t, 4 << 20);
    let fabric = free_port();
    let s = Serve::start(&img, fabric);
    let g = Gateway::start(&t, fabric, "disk", &["--give-up-after", "1"]);
    ok(
        "qemu-io",
        &["-f", "raw", &g.uri("disk"), "-c", "read 0 4096"],
    );
    drop(s);
    let began = Instant::now();
    let out = run(
        "qemu-io",
        &["-f", "raw", &g.uri("disk"), "-c", "read 0 4096"],
    );
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() || said.contains("failed"),
        "the read fails: {said}"
    );
    assert!(said.contains("Input/output error"), "{said}");
    assert!(began.elapsed() < Duration::from_secs(20));
}

#[test]
fn connect_says_clearly_what_is_wrong() {
    let t = Scratch::new("gw-errors");
    let nobody = free_port();
    let out = run(
        RBLOCK,
        &[
            "connect",
            &format!("127.0.0.1:{nobody}/disk"),
            "--transport",
            "tcp",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to 127.0.0.1"), "{err}");
    assert_eq!(out.status.code(), Some(6), "unreachable: {err}");

    let img = image(&t, 4 << 20);
    let fabric = free_port();
    let _s = Serve::start(&img, fabric);
    let out = run(
        RBLOCK,
        &[
            "connect",
            &format!("127.0.0.1:{fabric}/nosuch"),
            "--transport",
            "tcp",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no export named \"nosuch\""), "{err}");
    assert_eq!(out.status.code(), Some(3), "refused: {err}");

    let out = run(RBLOCK, &["connect", "no-slash-here"]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("HOST[:PORT]/NAME"));

    // An export that cannot be opened here is a local I/O error.
    let missing = t.path("missing.img");
    let out = run(
        RBLOCK,
        &["serve", "--export", &format!("disk={}", missing.display())],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "I/O: {err}");
}

/// A raw client of the fabric protocol: a link with the export opened.
async fn open_raw(fabric: u16, export: &str) -> rfabric::link::Link {
    use rblock::fabric::proto::{Msg, VERSION};
    use rfabric::endpoint::{Transport, connect};
    use rfabric::link::{Incoming, Link};
    use rfabric::wire::Role;
    let addr = format!("127.0.0.1:{fabric}").parse().unwrap();
    let conn = connect(addr, Transport::Tcp).await.unwrap();
    let config = rblock::fabric::link_config(Role::Client, &conn.limits());
    let link = Link::establish(conn, config).await.unwrap();
    let next = || async {
        match link.recv().await.unwrap() {
            Some(Incoming::Message(m)) => Msg::decode(&m).unwrap(),
            other => panic!("no answer: {other:?}"),
        }
    };
    // The server (without a secret) challenges first; any answer does.
    assert!(matches!(
        next().await,
        Msg::Challenge {
            required: false,
            ..
        }
    ));
    let auth = Msg::Auth {
        nonce: [0; 32],
        proof: [0; 32],
        encrypt: false,
    };
    link.send_message(&auth.encode()).await.unwrap();
    let open = Msg::Open {
        version: VERSION,
        name: export.into(),
        tag: [0; 32],
    };
    link.send_message(&open.encode()).await.unwrap();
    assert!(matches!(next().await, Msg::AuthOk { .. }));
    let opened = next().await;
    assert!(matches!(opened, Msg::Opened { .. }), "{opened:?}");
    link
}

#[tokio::test]
async fn the_server_checks_requests_and_cuts_off_a_peer_that_breaks_the_protocol() {
    use rblock::fabric::proto::{Msg, write_tag};
    use rblock::nbd::consts::cmd;
    use rblock::nbd::transmission::Request;
    use rfabric::link::{ChunkMeta, Incoming, LinkError};
    use rfabric::memory::BufferPool;

    let t = Scratch::new("gw-breach");
    let img = image(&t, 4 << 20);
    let fabric = free_port();
    let _s = Serve::start(&img, fabric);

    // A read past the end gets the NBD error, and the link goes on.
    let link = open_raw(fabric, "disk").await;
    let past = Request {
        flags: 0,
        kind: cmd::READ,
        cookie: 1,
        offset: 4 << 20,
        length: 4096,
    };
    link.send_message(&Msg::Request(past).encode())
        .await
        .unwrap();
    match link.recv().await.unwrap() {
        Some(Incoming::Message(m)) => match Msg::decode(&m).unwrap() {
            Msg::Reply { id: 1, error, .. } => assert_eq!(error, libc::EINVAL as u32),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }

    // A write piece whose header names another request ends the link.
    let pool = BufferPool::new(1, link.max_chunk()).unwrap();
    let region = link.register(pool.memory()).unwrap();
    let mut buf = pool.acquire().await;
    buf.fill_from(&[7u8; 4096]);
    let write = Request {
        flags: 0,
        kind: cmd::WRITE,
        cookie: 5,
        offset: 0,
        length: 4096,
    };
    let meta = ChunkMeta {
        owner: 6,
        offset: 0,
        flags: 0,
        digest: write_tag(&write),
    };
    link.send_chunk(meta, &region, buf).await.unwrap();
    let end = link.recv().await;
    assert!(
        matches!(&end, Err(LinkError::Peer { text, .. }) if text.contains("carries the header of 5")),
        "{end:?}"
    );

    // Others are served as before, and the refused piece changed nothing.
    let g = Gateway::start(&t, fabric, "disk", &[]);
    let out = ok(
        "qemu-io",
        &["-f", "raw", &g.uri("disk"), "-c", "read -P 0 0 4096"],
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

#[test]
fn sigterm_stops_the_gateway_cleanly() {
    let t = Scratch::new("gw-term");
    let img = image(&t, 4 << 20);
    let fabric = free_port();
    let _s = Serve::start(&img, fabric);
    let mut g = Gateway::start(&t, fabric, "disk", &["--connections", "2"]);
    ok(
        "qemu-io",
        &["-f", "raw", &g.uri("disk"), "-c", "read 0 4096"],
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(g.child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = g.child.wait().unwrap();
    assert!(status.success(), "{status}: {}", g.log());
    assert!(!g.socket.exists(), "the socket file is removed");
    assert!(!g.log().contains("dialling again"), "{}", g.log());
}
