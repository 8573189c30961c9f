use std::path::PathBuf;

use tokio::net::UnixListener;

use super::*;
use crate::nbd::handshake::{ExportInfo, Handshake};

/// A server that runs our handshake machine on each connection, then
/// holds the socket open.
fn serve_handshakes(dir: &Path) -> PathBuf {
    let path = dir.join("nbd.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut h = Handshake::new(vec![ExportInfo {
                    name: "disk".into(),
                    description: String::new(),
                    size: 3 << 20,
                    read_only: false,
                    can_trim: true,
                }]);
                let mut input = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    let out = h.take_output();
                    if s.write_all(&out).await.is_err() {
                        return;
                    }
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    input.extend_from_slice(&chunk[..n]);
                    let (used, _) = h.advance(&input).unwrap();
                    input.drain(..used);
                }
            });
        }
    });
    path
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "rblock-kernel-socket-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_socket_comes_back_blocking_and_past_the_handshake() {
    let dir = scratch_dir();
    let sock = serve_handshakes(&dir);
    let (s, export) = open(&sock, "disk").await.unwrap();
    assert_eq!(export.size, 3 << 20);
    assert_ne!(export.flags & crate::nbd::consts::tflags::HAS_FLAGS, 0);
    // The kernel is handed a plain blocking socket.
    let flags = rustix::fs::fcntl_getfl(&s).unwrap();
    assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK));
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn an_unknown_export_names_the_socket_and_the_export() {
    let dir = scratch_dir();
    let sock = serve_handshakes(&dir);
    let e = format!("{:#}", open(&sock, "nope").await.unwrap_err());
    assert!(e.contains(&sock.display().to_string()), "{e}");
    assert!(e.contains("\"nope\": no such export"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn nothing_listening_is_an_error() {
    let dir = scratch_dir();
    let e = format!(
        "{:#}",
        open(&dir.join("none.sock"), "disk").await.unwrap_err()
    );
    assert!(e.contains("cannot connect"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}
