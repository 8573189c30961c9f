//! An attacker on the path, for the tests: a loopback TCP proxy that
//! understands the tcp backend's framing (an 8-byte preface each way, then
//! frames of a 24-byte header and `len` bytes, none after a read request)
//! and the link's frames inside it, and tampers with what the client sends
//! as `docs/PROTOCOL.md` describes the messages.
//!
//! Std threads and blocking sockets: it runs beside any runtime.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of the tcp backend's preface and frame header.
const PREFACE: usize = 8;
const HEADER: usize = 24;
/// The tcp backend's ops this proxy tells apart.
const OP_SEND: u8 = 1;
const OP_WRITE_NOTIFY: u8 = 3;
const OP_READ_REQUEST: u8 = 4;
/// Where a chunk header keeps its payload length and digest, and its size.
const CHUNK_HEADER: usize = 80;
const CHUNK_DIGEST: std::ops::Range<usize> = 32..64;

/// What the proxy does to the client's stream (the server's passes as is).
#[derive(Debug, Clone)]
pub enum Attack {
    /// Nothing: an honest path, to show the test's copy works without one.
    None,
    /// Flip a byte of the payload of the `nth` chunk (notified write) and
    /// put `rehash` of the new payload into its header's digest field.
    RewriteChunk {
        nth: usize,
        rehash: fn(&[u8]) -> [u8; 32],
    },
    /// Before the client's frame `before`, send a link frame of its own:
    /// an application message carrying `message` (no seal: the proxy has
    /// no keys).
    InjectMessage { before: Nth, message: Vec<u8> },
    /// Leave out the `nth` send.
    DropSend { nth: usize },
    /// Once the client's `nth` chunk went through, pass nothing more either
    /// way, and keep both connections open: a path that went dead without
    /// a word (a cable pulled, a host powered off).
    Stall { nth: usize },
}

/// Which of the client's frames: its `n`th send (control frame), or its
/// `n`th notified write (chunk), counting from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nth {
    Send(usize),
    Chunk(usize),
}

/// A running proxy in front of `127.0.0.1:upstream`.
#[derive(Debug)]
pub struct OnPath {
    pub port: u16,
    /// Everything each client sent, as it arrived, per connection.
    recorded: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl OnPath {
    /// Proxies every connection to `upstream`, attacking the first one.
    pub fn start(upstream: u16, attack: Attack) -> OnPath {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&recorded);
        std::thread::spawn(move || {
            for (i, client) in listener.incoming().enumerate() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    return;
                };
                let attack = if i == 0 { attack.clone() } else { Attack::None };
                let slot = {
                    let mut log = log.lock().unwrap();
                    log.push(Vec::new());
                    log.len() - 1
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let dead = Arc::new(AtomicBool::new(false));
                let path = Path {
                    log: Arc::clone(&log),
                    slot,
                    dead: Arc::clone(&dead),
                };
                std::thread::spawn(move || pump(s2, c2, &dead));
                std::thread::spawn(move || tamper(client, server, attack, &path));
            }
        });
        OnPath { port, recorded }
    }

    /// What the client of connection `i` sent.
    pub fn recorded(&self, i: usize) -> Vec<u8> {
        self.recorded.lock().unwrap()[i].clone()
    }

    /// What the client of connection `i` sent up to and including its
    /// `nth` send (its preface and every frame before).
    pub fn recorded_through_send(&self, i: usize, nth: usize) -> Vec<u8> {
        let all = self.recorded(i);
        let (mut at, mut sends) = (PREFACE, 0);
        while at + HEADER <= all.len() {
            let op = all[at];
            let len = u32::from_le_bytes(all[at + 4..at + 8].try_into().unwrap()) as usize;
            at += HEADER + if op == OP_READ_REQUEST { 0 } else { len };
            if op == OP_SEND {
                if sends == nth {
                    return all[..at.min(all.len())].to_vec();
                }
                sends += 1;
            }
        }
        panic!("connection {i} made no send {nth}");
    }
}

/// Sends `bytes` (a recorded client stream) to `127.0.0.1:port` and
/// returns everything the server answered, once it closed the connection
/// (`None` if it kept it open for 20 seconds).
pub fn replay(port: u16, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect for the replay");
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let _ = s.write_all(bytes);
    // (Then silence, as a replayer that has nothing more would keep.)
    let mut heard = Vec::new();
    match s.read_to_end(&mut heard) {
        Ok(_) => Some(heard),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(heard),
        Err(_) => None,
    }
}

/// What one proxied connection shares between its two directions.
struct Path {
    /// Every connection's record, and which one is this connection's.
    log: Arc<Mutex<Vec<Vec<u8>>>>,
    slot: usize,
    /// Set when the path went dead: nothing passes either way any more.
    dead: Arc<AtomicBool>,
}

/// Passes the server's stream on as it is, until the path goes dead.
fn pump(mut from: TcpStream, mut to: TcpStream, dead: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if dead.load(Ordering::SeqCst) {
            return hold(from, to);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Keeps a dead path's sockets open and silent until the peers give up.
fn hold(mut from: TcpStream, to: TcpStream) {
    let mut sink = [0u8; 4096];
    while matches!(from.read(&mut sink), Ok(n) if n > 0) {}
    drop(to);
}

fn tamper(mut from: TcpStream, mut to: TcpStream, attack: Attack, path: &Path) {
    let mut read = |n: usize| -> Option<Vec<u8>> {
        let mut b = vec![0u8; n];
        from.read_exact(&mut b).ok()?;
        path.log.lock().unwrap()[path.slot].extend_from_slice(&b);
        Some(b)
    };
    let Some(preface) = read(PREFACE) else { return };
    let _ = to.write_all(&preface);
    let (mut sends, mut chunks) = (0usize, 0usize);
    while let Some(header) = read(HEADER) {
        let op = header[0];
        let len = u32::from_le_bytes(header[4..8].try_into().unwrap()) as usize;
        let body = if op == OP_READ_REQUEST {
            Vec::new()
        } else {
            let Some(b) = read(len) else { break };
            b
        };
        let mut out = [header, body].concat();
        match (&attack, op) {
            (Attack::RewriteChunk { nth, rehash }, OP_WRITE_NOTIFY) if chunks == *nth => {
                let payload = &mut out[HEADER + CHUNK_HEADER..];
                if !payload.is_empty() {
                    payload[0] ^= 0xff;
                    let digest = rehash(payload);
                    out[HEADER + CHUNK_DIGEST.start..HEADER + CHUNK_DIGEST.end]
                        .copy_from_slice(&digest);
                }
            }
            (Attack::InjectMessage { before, message }, _)
                if (op == OP_SEND && *before == Nth::Send(sends))
                    || (op == OP_WRITE_NOTIFY && *before == Nth::Chunk(chunks)) =>
            {
                let _ = to.write_all(&send_frame(&app_frame(message)));
            }
            (Attack::DropSend { nth }, OP_SEND) if sends == *nth => out.clear(),
            (Attack::Stall { nth }, _) if chunks > *nth => {
                path.dead.store(true, Ordering::SeqCst);
                // (What the client sends from now on is read and dropped.)
                while read(HEADER).is_some() {}
                return;
            }
            _ => {}
        }
        match op {
            OP_SEND => sends += 1,
            OP_WRITE_NOTIFY => chunks += 1,
            _ => {}
        }
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A link frame carrying an application message, with no credit and no
/// seal (`docs/PROTOCOL.md`, control frames).
fn app_frame(message: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(24 + message.len());
    f.extend_from_slice(b"RF");
    f.extend_from_slice(&[5, 0]);
    f.extend_from_slice(&(message.len() as u32).to_le_bytes());
    f.extend_from_slice(&[0; 16]);
    f.extend_from_slice(message);
    f
}

/// The tcp backend's send frame around `payload`.
fn send_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; HEADER];
    f[0] = OP_SEND;
    f[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}
