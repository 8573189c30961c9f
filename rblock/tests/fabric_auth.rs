//! rblock's fabric authenticates its clients: `rblock serve --listen
//! --secret-file F` opens nothing for a client that cannot prove it knows
//! the secret (none, a wrong one, an answer replayed from another
//! session), `rblock connect --secret-file F` refuses a server that
//! cannot prove it, and `--listen` beyond loopback without a secret does
//! not start. Over the tcp backend on loopback (the VM tier runs the
//! authenticated gateway over RDMA).

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rblock::fabric::proto::{Msg, VERSION, open_tag};
use rfabric::auth;
use rfabric::endpoint::{Transport, connect};
use rfabric::link::seal::{Before, Protection};
use rfabric::link::{Incoming, Link};
use rfabric::wire::Role;
use test_support::Scratch;

mod common;

use common::{RBLOCK, free_port, image, run};

fn secret(t: &Scratch, name: &str, text: &str) -> PathBuf {
    let p = t.path(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// `rblock serve` with export `disk` on `fabric` (tcp), with `extra`
/// options. Killed on drop.
struct Serve(Child);

impl Serve {
    fn start(image: &Path, fabric: u16, extra: &[&str]) -> Serve {
        let export = format!("disk={}", image.display());
        Serve::exporting(&[&export], fabric, extra)
    }

    /// The same with these `--export` arguments.
    fn exporting(exports: &[&str], fabric: u16, extra: &[&str]) -> Serve {
        let nbd = free_port();
        let mut cmd = Command::new(RBLOCK);
        cmd.arg("serve");
        for e in exports {
            cmd.args(["--export", e]);
        }
        let child = cmd
            .args(["--nbd-listen", &format!("127.0.0.1:{nbd}")])
            .args(["--listen", &format!("127.0.0.1:{fabric}")])
            .args(["--transport", "tcp"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", nbd)).is_err() {
            assert!(Instant::now() < deadline, "rblock serve did not start");
            std::thread::sleep(Duration::from_millis(25));
        }
        Serve(child)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rblock connect` to export `disk` with `extra` options, run until it
/// has either failed (its status and output) or served nbdinfo (the size).
fn connect_and_size(t: &Scratch, fabric: u16, extra: &[&str]) -> Result<String, (i32, String)> {
    connect_export(t, fabric, "disk", extra)
}

/// The same for `export`.
fn connect_export(
    t: &Scratch,
    fabric: u16,
    export: &str,
    extra: &[&str],
) -> Result<String, (i32, String)> {
    let sock = t.path(&format!("gw-{}.sock", free_port()));
    let log = t.path("gw.log");
    let mut child = Command::new(RBLOCK)
        .arg("connect")
        .arg(format!("127.0.0.1:{fabric}/{export}"))
        .args(["--transport", "tcp"])
        .args(["--nbd-listen", &format!("unix:{}", sock.display())])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            return Err((status.code().unwrap_or(-1), err));
        }
        if sock.exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rblock connect neither failed nor served: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let uri = format!("nbd+unix:///{export}?socket={}", sock.display());
    let out = run("nbdinfo", &["--size", &uri]);
    let _ = child.kill();
    let _ = child.wait();
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn only_a_client_with_the_servers_secret_opens_an_export() {
    let t = Scratch::new("fabric-auth");
    let img = image(&t, 4 << 20);
    let key = secret(&t, "key", "0123456789abcdef0123456789abcdef");
    let wrong = secret(&t, "wrong", "fedcba9876543210fedcba9876543210");
    let fabric = free_port();
    let _s = Serve::start(&img, fabric, &["--secret-file", key.to_str().unwrap()]);

    let size = connect_and_size(&t, fabric, &["--secret-file", key.to_str().unwrap()]);
    assert_eq!(size, Ok((4u64 << 20).to_string()), "the right secret");

    let (code, err) = connect_and_size(&t, fabric, &[]).unwrap_err();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("authentication failed"), "{err}");

    let (code, err) =
        connect_and_size(&t, fabric, &["--secret-file", wrong.to_str().unwrap()]).unwrap_err();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("authentication failed"), "{err}");
}

#[test]
fn a_client_with_a_secret_refuses_a_server_without_one() {
    let t = Scratch::new("fabric-noauth");
    let img = image(&t, 4 << 20);
    let key = secret(&t, "key", "0123456789abcdef0123456789abcdef");
    let fabric = free_port();
    let _s = Serve::start(&img, fabric, &[]);
    let (code, err) =
        connect_and_size(&t, fabric, &["--secret-file", key.to_str().unwrap()]).unwrap_err();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("does not authenticate"), "{err}");
    // Without a secret on either side (loopback): served.
    assert_eq!(
        connect_and_size(&t, fabric, &[]),
        Ok((4u64 << 20).to_string())
    );
}

#[test]
fn an_export_with_a_secret_of_its_own_needs_it_and_the_others_do_not() {
    let t = Scratch::new("fabric-per-export");
    let img = image(&t, 4 << 20);
    let vm = image(&t, 4 << 20);
    let key = secret(&t, "vm.key", "0123456789abcdef0123456789abcdef");
    let fabric = free_port();
    let disk = format!("disk={}", img.display());
    let vm = format!("vm={},secret-file={}", vm.display(), key.display());
    let _s = Serve::exporting(&[&disk, &vm], fabric, &[]);
    let size = (4u64 << 20).to_string();
    assert_eq!(connect_export(&t, fabric, "disk", &[]), Ok(size.clone()));
    let (code, err) = connect_export(&t, fabric, "vm", &[]).unwrap_err();
    assert_eq!(
        (code, err.contains("authentication failed")),
        (3, true),
        "{err}"
    );
    let with_key = ["--secret-file", key.to_str().unwrap()];
    assert_eq!(connect_export(&t, fabric, "vm", &with_key), Ok(size));
}

/// A raw client: the link, and the server's challenge.
async fn raw(fabric: u16) -> (Link, [u8; 32], bool) {
    let addr = format!("127.0.0.1:{fabric}").parse().unwrap();
    let conn = connect(addr, Transport::Tcp).await.unwrap();
    let config = rblock::fabric::link_config(Role::Client, &conn.limits());
    let link = Link::establish(conn, config).await.unwrap();
    let Msg::Challenge {
        nonce, required, ..
    } = next(&link).await.expect("a challenge")
    else {
        panic!("no challenge first");
    };
    (link, nonce, required)
}

/// The next message, or None once the server ended the link.
async fn next(link: &Link) -> Option<Msg> {
    match link.recv().await {
        Ok(Some(Incoming::Message(m))) => Some(Msg::decode(&m).unwrap()),
        Ok(Some(Incoming::Chunk(_))) => panic!("data during the opening"),
        Ok(None) | Err(_) => None,
    }
}

#[tokio::test]
async fn an_answer_replayed_from_another_session_is_refused_and_nothing_is_opened() {
    let t = Scratch::new("fabric-replay");
    let img = image(&t, 4 << 20);
    let text = "0123456789abcdef0123456789abcdef";
    let key = secret(&t, "key", text);
    let fabric = free_port();
    let _s = Serve::start(&img, fabric, &["--secret-file", key.to_str().unwrap()]);
    let opening = |link: &Link, nonce: &[u8; 32], name: &str, tagged: &str| {
        let client_nonce = auth::nonce();
        let proof = auth::RBLOCK.client_proof(text.as_bytes(), nonce, &client_nonce);
        let keys = auth::RBLOCK.session_keys(text.as_bytes(), nonce, &client_nonce);
        link.seal_incoming(
            Protection::Encrypt,
            &keys.server_to_client,
            Before::Anything,
        )
        .unwrap();
        let answer = Msg::Auth {
            nonce: client_nonce,
            proof,
            encrypt: true,
        }
        .encode();
        let open = Msg::Open {
            version: VERSION,
            name: name.into(),
            tag: open_tag(&keys.client_to_server, VERSION, true, tagged),
        }
        .encode();
        (client_nonce, answer, open)
    };

    // An honest session, overheard: its answer and its opening.
    let (link, nonce, required) = raw(fabric).await;
    assert!(required);
    let (client_nonce, answer, open) = opening(&link, &nonce, "disk", "disk");
    link.send_message(&answer).await.unwrap();
    link.send_message(&open).await.unwrap();
    let Some(Msg::AuthOk { proof: sp }) = next(&link).await else {
        panic!("the honest answer was refused");
    };
    assert!(auth::RBLOCK.check_server(text.as_bytes(), &nonce, &client_nonce, &sp));
    assert!(matches!(next(&link).await, Some(Msg::Opened { .. })));
    let _ = link.finish().await;

    // The same answer on a new session, to a new challenge.
    let (link, nonce2, _) = raw(fabric).await;
    assert_ne!(nonce, nonce2, "every challenge is fresh");
    link.send_message(&answer).await.unwrap();
    let _ = link.send_message(&open).await;
    match next(&link).await {
        Some(Msg::Refused { text }) => assert!(text.contains("authentication failed"), "{text}"),
        other => panic!("a replayed answer got {other:?}"),
    }
    assert!(
        next(&link).await.is_none(),
        "nothing follows a refusal: no export was opened"
    );

    // An rcp proof with the same secret is no rblock proof.
    let (link, nonce3, _) = raw(fabric).await;
    let cn = auth::nonce();
    let rcp_proof = auth::RCP.client_proof(text.as_bytes(), &nonce3, &cn);
    let answer = Msg::Auth {
        nonce: cn,
        proof: rcp_proof,
        encrypt: true,
    };
    link.send_message(&answer.encode()).await.unwrap();
    let _ = link.send_message(&open).await;
    assert!(matches!(next(&link).await, Some(Msg::Refused { .. })));

    // An honest proof whose Open was changed on the path (another
    // export's name than the one the client bound).
    let (link, nonce4, _) = raw(fabric).await;
    let (_, answer, open) = opening(&link, &nonce4, "", "disk");
    link.send_message(&answer).await.unwrap();
    let _ = link.send_message(&open).await;
    match next(&link).await {
        Some(Msg::Refused { text }) => assert!(text.contains("changed on the path"), "{text}"),
        other => panic!("a changed open got {other:?}"),
    }
    assert!(next(&link).await.is_none(), "no export was opened");
}

#[test]
fn listen_beyond_loopback_needs_a_secret_or_no_auth() {
    let t = Scratch::new("fabric-open");
    let img = image(&t, 4 << 20);
    // 192.0.2.1 (TEST-NET-1) is no address of this machine: the check must
    // refuse before any bind, and a bind would fail anyway.
    let out = run(
        RBLOCK,
        &[
            "serve",
            "--export",
            &format!("disk={}", img.display()),
            "--nbd-listen",
            &format!("127.0.0.1:{}", free_port()),
            "--listen",
            "192.0.2.1",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("refusing to serve --listen 192.0.2.1:10810 without a secret"),
        "{err}"
    );
    // Every export with a secret of its own is enough: the start goes on
    // to the bind (which fails: no such address here).
    let key = secret(&t, "key", "0123456789abcdef0123456789abcdef");
    let out = run(
        RBLOCK,
        &[
            "serve",
            "--export",
            &format!("disk={},secret-file={}", img.display(), key.display()),
            "--nbd-listen",
            &format!("127.0.0.1:{}", free_port()),
            "--listen",
            "192.0.2.1",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on 192.0.2.1"), "{err}");
    assert!(!err.contains("refusing"), "{err}");
    let out = run(
        RBLOCK,
        &[
            "serve",
            "--export",
            "d=/x",
            "--secret-file",
            "/x",
            "--no-auth",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "--no-auth with a secret is a usage error"
    );
}
