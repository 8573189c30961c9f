//! How `rblock serve` logs: readable lines on a terminal that follow
//! `RUST_LOG`, and, started by systemd (`JOURNAL_STREAM` set), native
//! journal entries whose fields are journal fields. The journal is a
//! datagram socket of the test's own at journald's path, inside a private
//! mount namespace (needs root and `unshare`; skipped, saying why,
//! otherwise).

use std::io::Read;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use test_support::{Scratch, free_port};

const RBLOCK: &str = env!("CARGO_BIN_EXE_rblock");

/// Runs `rblock serve` on a fresh port with `RUST_LOG` = `level` until it
/// accepts a connection and one more has been turned away (at most one
/// connection: the second is refused with a warning); its stderr.
fn serve_and_log(level: Option<&str>) -> String {
    let t = Scratch::new("daemon-log");
    let image = t.path("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let port = free_port();
    let mut cmd = Command::new(RBLOCK);
    cmd.args(["serve", "--max-connections", "1", "--export"])
        .arg(format!("disk={}", image.display()))
        .arg("--nbd-listen")
        .arg(format!("127.0.0.1:{port}"))
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match level {
        Some(l) => cmd.env("RUST_LOG", l),
        None => cmd.env_remove("RUST_LOG"),
    };
    let mut child = cmd.spawn().unwrap();
    let first = (0..200)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(25));
            TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .expect("rblock serve did not start");
    // The first holds the one place; the second is refused.
    let mut second = TcpStream::connect(("127.0.0.1", port)).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = second.read(&mut [0u8; 1]);
    drop(first);
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn terminal_lines_name_the_tool_and_follow_rust_log() {
    let info = serve_and_log(None);
    assert!(
        info.contains("rblock serve: listening on 127.0.0.1:"),
        "{info}"
    );
    assert!(info.contains("rblock serve: export \"disk\": "), "{info}");
    let refused = info
        .lines()
        .find(|l| l.contains("refusing a connection"))
        .unwrap_or_else(|| panic!("no refusal in: {info}"));
    assert!(
        refused.starts_with(
            "rblock serve: warning: refusing a connection: too many open (client=127.0.0.1:"
        ),
        "{refused}"
    );
    let warn = serve_and_log(Some("warn"));
    assert!(!warn.contains("listening on"), "info shown at warn: {warn}");
    assert!(warn.contains("refusing a connection"), "{warn}");
}

#[test]
fn under_systemd_the_entries_go_to_the_journal_with_their_fields() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root (a private mount namespace)");
        return;
    }
    if Command::new("unshare").arg("--help").output().is_err() {
        eprintln!("skipped: no unshare");
        return;
    }
    let t = Scratch::new("daemon-journal");
    let image = t.path("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let got = t.path("journal.txt");
    let port = free_port();
    // A journal of our own: every datagram that reaches journald's socket
    // path, appended to a file, until the server has started.
    let script = format!(
        r#"set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal
python3 -c '
import socket, sys
# The native protocol: KEY=VALUE lines, or KEY, a newline, a 64-bit
# little-endian length and the value (for values with newlines); written
# out as KEY=VALUE lines.
def fields(d):
    out, i = [], 0
    while i < len(d):
        j = d.index(b"\n", i)
        key = d[i:j]
        if b"=" in key:
            out.append(key)
            i = j + 1
        else:
            n = int.from_bytes(d[j + 1:j + 9], "little")
            out.append(key + b"=" + d[j + 9:j + 9 + n])
            i = j + 9 + n + 1
    return b"\n".join(out)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/run/systemd/journal/socket")
open(sys.argv[1] + ".ready", "w").close()
s.settimeout(20)
with open(sys.argv[1], "ab") as f:
    while True:
        try:
            d = s.recv(1 << 20)
        except socket.timeout:
            break
        f.write(b"\n" + fields(d) + b"\n--\n")
        f.flush()
' {got} &
for i in $(seq 200); do [ -e {got}.ready ] && break; sleep 0.05; done
JOURNAL_STREAM=8:12345 {rblock} serve --export disk={image} --nbd-listen 127.0.0.1:{port} 2>{got}.stderr &
server=$!
for i in $(seq 200); do grep -q "listening on" {got} 2>/dev/null && break; sleep 0.05; done
kill $server
wait $server || true
kill %1 || true
"#,
        got = got.display(),
        rblock = RBLOCK,
        image = image.display(),
    );
    let status = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash", "-c", &script])
        .status()
        .unwrap();
    assert!(status.success(), "the namespace script failed");
    let journal = std::fs::read_to_string(&got).unwrap_or_default();
    let stderr = std::fs::read_to_string(t.path("journal.txt.stderr")).unwrap_or_default();
    let entry = |needle: &str| {
        journal
            .split("\n--\n")
            .find(|e| e.contains(needle))
            .unwrap_or_else(|| panic!("no entry with {needle:?} in {journal:?}"))
            .to_string()
    };
    let listening = entry("MESSAGE=listening on 127.0.0.1:");
    assert!(
        listening.contains("SYSLOG_IDENTIFIER=rblock-serve"),
        "{listening}"
    );
    assert!(
        listening.contains("PRIORITY=5"),
        "info is the journal's notice: {listening}"
    );
    let export = entry("MESSAGE=export \"disk\"");
    let has = |e: &str, f: &str| e.lines().any(|l| l.starts_with(f));
    assert!(
        has(&export, "EXPORT=disk"),
        "the field is a journal field: {export}"
    );
    let engine = entry("storage engine");
    assert!(has(&engine, "IO_ENGINE="), "{engine}");
    assert!(
        !stderr.contains("listening on"),
        "the entries went to the journal, not stderr: {stderr}"
    );
}
