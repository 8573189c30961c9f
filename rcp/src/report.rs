//! What the user sees: a progress bar on a terminal, a summary at the end
//! (human or `--json`), and how the run ended, for the exit status.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use rfabric::link::seal::Protection;
use rfabric::storage::Kind;
use serde::Serialize;

use crate::digest::{self, Algorithm};
use crate::exit::Exit;
use crate::proto::{FailKind, NodeResult};

/// Totals of one copy.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub bytes: u64,
    pub files: u64,
    /// Files whose data was not sent: there already (re-sync).
    pub skipped: u64,
    /// Entries removed from the destination (`--delete`).
    pub deleted: u64,
    /// Data bytes carried by each stream (link) of the session.
    pub stream_bytes: Vec<u64>,
    /// Some entry failed.
    pub failed: bool,
}

/// The result of a copy, for the summary.
#[derive(Debug)]
pub struct Report {
    pub stats: Stats,
    pub seconds: f64,
    pub transport: &'static str,
    /// How the session was sealed (None: a local copy's in-process link,
    /// which no path crosses; see `session::sealing`).
    pub protection: Option<Protection>,
    /// This side's storage engine.
    pub io_engine: Kind,
    /// Links the data went over.
    pub streams: usize,
    /// What the data was verified with (None: `--no-verify`).
    pub algorithm: Option<Algorithm>,
    /// Digest of the one file copied, when exactly one was and it was
    /// verified.
    pub digest: Option<[u8; 32]>,
    /// Entries that failed.
    pub failed: Vec<Failure>,
    /// A broadcast's: every node's end, in the order the user named them
    /// (empty for any other copy).
    pub nodes: Vec<NodeResult>,
    /// A broadcast's: the nodes of each round's chain, in chain order.
    pub rounds: Vec<Vec<String>>,
    /// This side received the data (a pull): `stats.bytes` came in.
    pub received: bool,
    /// `-n`: nothing was sent, and every file was answered as if there.
    pub dry_run: bool,
}

impl Report {
    /// A copy that sent nothing (a broadcast none of whose nodes started).
    pub fn nothing(io_engine: Kind) -> Report {
        Report {
            stats: Stats::default(),
            seconds: 0.0,
            transport: "none",
            protection: None,
            io_engine,
            streams: 0,
            algorithm: None,
            digest: None,
            failed: Vec::new(),
            nodes: Vec::new(),
            rounds: Vec::new(),
            received: false,
            dry_run: false,
        }
    }
}

/// Files and bytes so far, shown as a line on stderr when it is a
/// terminal: `1204 files (1180 there already), 18.2 MiB sent, 210 MiB/s,
/// 3s`. The tree is walked as it is sent, so there is no total to show a
/// share of; the bytes are those sent (what a skipped file or a resumed
/// chunk holds already does not count), the files those announced.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: Option<ProgressBar>,
    files: Arc<AtomicU64>,
    there: Arc<AtomicU64>,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::hidden()
    }
}

impl Progress {
    pub fn new(show: bool) -> Progress {
        use std::io::IsTerminal;
        if !show || !std::io::stderr().is_terminal() {
            return Progress::hidden();
        }
        Progress::drawn_to(ProgressDrawTarget::stderr())
    }

    fn drawn_to(target: ProgressDrawTarget) -> Progress {
        let (files, there) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counts = {
            let (files, there) = (Arc::clone(&files), Arc::clone(&there));
            move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&files_text(
                    files.load(Ordering::Relaxed),
                    there.load(Ordering::Relaxed),
                ));
            }
        };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template(
                "{files}, {bytes} sent, {binary_bytes_per_sec}, {elapsed} {msg}",
            )
            .expect("valid template")
            .with_key("files", counts),
        );
        Progress {
            bar: Some(bar),
            files,
            there,
        }
    }

    pub fn hidden() -> Progress {
        Progress {
            bar: None,
            files: Arc::default(),
            there: Arc::default(),
        }
    }

    /// Data bytes sent.
    pub fn add(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// One more file announced.
    pub fn file(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` more files found there already: none of their data travels.
    pub fn there_already(&self, n: u64) {
        self.there.fetch_add(n, Ordering::Relaxed);
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The files part of the progress line.
fn files_text(files: u64, there: u64) -> String {
    let noun = if files == 1 { "file" } else { "files" };
    if there == 0 {
        format!("{files} {noun}")
    } else {
        format!("{files} {noun} ({there} there already)")
    }
}

/// An entry that failed: nothing of it is under its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The entry's path, as shown.
    pub path: String,
    pub kind: FailKind,
    pub reason: String,
}

/// The `--json` summary, one object on stdout. Scripts read these keys:
/// keep them. The fields are in the order of their names because that is
/// the order the summary has always had (it was a `serde_json::Value`,
/// whose map sorts its keys).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The digest of the one file copied, as `sha256` below.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    pub bytes: u64,
    pub bytes_per_second: f64,
    /// Entries removed from the destination (`--delete`).
    pub deleted: u64,
    /// What the data was verified with: "blake3", "sha256" or "none".
    pub digest: &'static str,
    /// Whether the session was encrypted (it was authenticated in any
    /// case).
    pub encrypted: bool,
    pub files: u64,
    pub io_engine: &'static str,
    /// A broadcast's nodes, in the order named: each node's own end.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeSummary>,
    pub ok: bool,
    /// A broadcast's chains, one a round: the nodes in the order the data
    /// went through them (a further round serves the nodes a failure cut
    /// off).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<Vec<String>>,
    pub seconds: f64,
    /// The digest of the one file copied, only when it was verified and
    /// nothing failed: a digest next to a failure would read as a promise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Files whose data was not sent, as they were there already.
    pub skipped: u64,
    /// Data bytes carried by each stream.
    pub stream_bytes: Vec<u64>,
    pub streams: usize,
    pub transport: &'static str,
    /// Source entries gone since the walk found them (named on stderr
    /// as vanished; not failures).
    pub vanished: u64,
}

impl Summary {
    pub fn new(r: &Report) -> Summary {
        let ok = !failed(r);
        let shown = |alg| {
            r.digest
                .as_ref()
                .filter(|_| ok && r.algorithm == Some(alg))
                .map(|d| digest::hex(d))
        };
        Summary {
            blake3: shown(Algorithm::Blake3),
            bytes: r.stats.bytes,
            bytes_per_second: rate(r),
            deleted: r.stats.deleted,
            digest: r.algorithm.map_or("none", Algorithm::name),
            encrypted: r.protection == Some(Protection::Encrypt),
            files: r.stats.files,
            io_engine: r.io_engine.name(),
            nodes: r.nodes.iter().map(NodeSummary::of).collect(),
            ok,
            rounds: r.rounds.clone(),
            seconds: r.seconds,
            sha256: shown(Algorithm::Sha256),
            skipped: r.stats.skipped,
            stream_bytes: r.stats.stream_bytes.clone(),
            streams: r.streams,
            transport: r.transport,
            vanished: r.failed.iter().filter(|f| !f.kind.is_failure()).count() as u64,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a summary is plain data")
    }
}

/// One node of a broadcast in the `--json` summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeSummary {
    pub bytes: u64,
    /// Entries that failed there.
    pub failed: u32,
    pub files: u64,
    pub name: String,
    pub ok: bool,
    /// Why it failed (absent when `ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub seconds: f64,
}

impl NodeSummary {
    fn of(n: &NodeResult) -> NodeSummary {
        NodeSummary {
            bytes: n.bytes,
            failed: n.failed,
            files: n.files,
            name: n.name.clone(),
            ok: n.ok,
            reason: (!n.ok).then(|| n.reason.clone()),
            seconds: n.micros as f64 / 1e6,
        }
    }
}

fn failed(r: &Report) -> bool {
    r.failed.iter().any(|f| f.kind.is_failure()) || r.stats.failed || r.nodes.iter().any(|n| !n.ok)
}

fn rate(r: &Report) -> f64 {
    r.stats.bytes as f64 / r.seconds.max(1e-9)
}

/// The line a person reads on stderr at the end of a copy.
pub fn human_line(r: &Report) -> String {
    if !r.nodes.is_empty() {
        return broadcast_line(r);
    }
    let skipped = match (r.stats.skipped, r.stats.deleted) {
        (0, 0) => String::new(),
        (n, 0) => format!(" ({n} there already)"),
        (0, d) => format!(" ({d} deleted)"),
        (n, d) => format!(" ({n} there already, {d} deleted)"),
    };
    let line = format!(
        "{} file(s){skipped}, {} bytes in {:.2} s ({:.1} MB/s) over {}",
        r.stats.files,
        r.stats.bytes,
        r.seconds,
        rate(r) / 1e6,
        over(r)
    );
    match (&r.digest, r.algorithm, failed(r)) {
        (_, _, true) => format!("FAILED: {line}; see the errors above"),
        (Some(d), Some(alg), false) => {
            format!("{line}, verified, {} {}", alg.name(), digest::hex(d))
        }
        (None, Some(alg), false) => format!("{line}, verified with {}", alg.name()),
        (_, None, false) => line,
    }
}

/// What the data went over, and how it was sealed: "tcp, encrypted";
/// a local copy's link, sealed only if asked, is just "in-process".
fn over(r: &Report) -> String {
    match r.protection {
        Some(p) => format!("{}, {}", r.transport, p.name()),
        None => r.transport.to_string(),
    }
}

/// A broadcast's last line: the nodes, how many ended well, the data
/// each received.
fn broadcast_line(r: &Report) -> String {
    let names: Vec<String> = r.nodes.iter().map(|n| n.name.clone()).collect();
    let bad = r.nodes.iter().filter(|n| !n.ok).count();
    let files = r.nodes.iter().map(|n| n.files).max().unwrap_or(0);
    let bytes = r
        .nodes
        .iter()
        .filter(|n| n.ok)
        .map(|n| n.bytes)
        .max()
        .unwrap_or(0);
    let line = format!(
        "{} file(s), {bytes} bytes to each of {} node(s) ({}) in {:.2} s ({:.1} MB/s per node) over {}",
        files,
        r.nodes.len(),
        crate::hostlist::compress(&names),
        r.seconds,
        bytes as f64 / r.seconds.max(1e-9) / 1e6,
        over(r)
    );
    match (bad, r.algorithm) {
        (0, Some(alg)) => format!("{line}, verified with {} on every node", alg.name()),
        (0, None) => line,
        (n, _) => format!("FAILED on {n} of {} node(s): {line}", r.nodes.len()),
    }
}

/// rsync's `--stats` lines, as far as rcp counts what they say (rsync's
/// others, the total size, the entries of each kind and the file list's,
/// are left out rather than made up; `Number of regular files` is rcp's
/// own, rsync's `reg:` count). **Sans I/O.**
pub fn stats_lines(r: &Report) -> String {
    let s = &r.stats;
    // (A dry run answers every file as there: what it would send is
    // named by -i, not counted.)
    let transferred = match r.dry_run {
        true => String::new(),
        false => format!(
            "Number of regular files transferred: {}\n",
            commas(s.files.saturating_sub(s.skipped))
        ),
    };
    // (Data bytes only: rcp does not count its messages.)
    let (sent, received) = match r.received {
        true => (0, s.bytes),
        false => (s.bytes, 0),
    };
    format!(
        "\nNumber of regular files: {}\n\
         {transferred}\
         Number of deleted files: {}\n\
         Literal data: {} bytes\n\n\
         sent {} bytes  received {} bytes  {:.2} bytes/sec\n",
        commas(s.files),
        commas(s.deleted),
        commas(s.bytes),
        commas(sent),
        commas(received),
        rate(r),
    )
}

/// `n` with a comma between each three digits, as rsync prints numbers.
fn commas(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Ends a copy: names each failed entry on stderr, then the summary as
/// JSON on stdout (`json`), or as the human line on stderr (unless
/// `quiet`).
pub fn summarize(r: &Report, json: bool, quiet: bool) -> Exit {
    for f in &r.failed {
        if f.kind.is_failure() {
            eprintln!("rcp: {}: {}", f.path, f.reason);
        } else {
            eprintln!("rcp: file has vanished: {}", f.path);
        }
    }
    for n in r.nodes.iter().filter(|n| !n.ok) {
        eprintln!("rcp: {}: FAILED: {}", n.name, n.reason);
    }
    if json {
        // (A closed stdout is no reason to fail a copy that is done.)
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), "{}", Summary::new(r).to_json());
    } else if !quiet {
        eprintln!("{}", human_line(r));
    }
    match Exit::of_failures(r.failed.iter().map(|f| &f.kind)) {
        // (An entry the other side failed without naming it here.)
        Exit::Complete if failed(r) => Exit::Partial,
        exit => exit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal that keeps the last line drawn.
    #[derive(Debug, Default, Clone)]
    struct Screen(Arc<std::sync::Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            200
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            *self.0.lock().unwrap() = s.to_string();
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            // (The padding after a line is not a line.)
            if !s.trim().is_empty() {
                self.write_line(s)?;
            }
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_progress_line_counts_files_there_already_apart_and_bytes_sent() {
        let screen = Screen::default();
        let p = Progress::drawn_to(ProgressDrawTarget::term_like(Box::new(screen.clone())));
        for _ in 0..5 {
            p.file();
        }
        p.there_already(3);
        p.add(2048);
        p.bar.as_ref().unwrap().tick();
        let line = screen.0.lock().unwrap().clone();
        assert!(
            line.starts_with("5 files (3 there already), 2.00 KiB sent, "),
            "{line:?}"
        );
        assert_eq!(files_text(1, 0), "1 file");
        // Hidden, it counts and draws nothing.
        let quiet = Progress::hidden();
        quiet.file();
        quiet.add(1);
        assert!(quiet.bar.is_none());
    }

    fn report(alg: Option<Algorithm>, digest: Option<[u8; 32]>, failed: Vec<Failure>) -> Report {
        Report {
            stats: Stats {
                bytes: 300_000,
                files: 1,
                skipped: 0,
                deleted: 0,
                stream_bytes: vec![200_000, 100_000],
                failed: false,
            },
            seconds: 0.5,
            transport: "tcp",
            protection: Some(Protection::Encrypt),
            io_engine: Kind::Threads,
            streams: 2,
            algorithm: alg,
            digest,
            failed,
            nodes: Vec::new(),
            rounds: Vec::new(),
            received: false,
            dry_run: false,
        }
    }

    /// rsync's `--stats` lines, the ones scripts read, with rsync's
    /// commas.
    #[test]
    fn stats_lines_say_what_rcp_counts_as_rsync_says_it() {
        let mut r = report(None, None, Vec::new());
        r.stats.files = 1_204;
        r.stats.skipped = 1_180;
        r.stats.deleted = 3;
        r.stats.bytes = 18_874_368;
        r.seconds = 2.0;
        let lines = stats_lines(&r);
        for line in [
            "Number of regular files: 1,204\n",
            "Number of regular files transferred: 24\n",
            "Number of deleted files: 3\n",
            "Literal data: 18,874,368 bytes\n",
            "sent 18,874,368 bytes  received 0 bytes  9437184.00 bytes/sec\n",
        ] {
            assert!(lines.contains(line), "{line:?} in {lines}");
        }
        // A pull received the data; a dry run counts no transfers.
        r.received = true;
        r.dry_run = true;
        let lines = stats_lines(&r);
        assert!(
            lines.contains("sent 0 bytes  received 18,874,368 bytes"),
            "{lines}"
        );
        assert!(!lines.contains("transferred"), "{lines}");
        assert_eq!(commas(0), "0");
        assert_eq!(commas(999), "999");
        assert_eq!(commas(1_000), "1,000");
    }

    fn node(name: &str, reason: &str) -> NodeResult {
        NodeResult {
            name: name.into(),
            ok: reason.is_empty(),
            files: 1,
            bytes: if reason.is_empty() { 300_000 } else { 0 },
            micros: 400_000,
            failed: u32::from(!reason.is_empty()),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_broadcast_summary_names_every_node_and_fails_if_one_did() {
        let mut r = report(Some(Algorithm::Blake3), Some([2; 32]), vec![]);
        r.nodes = vec![node("n1", ""), node("n2", ""), node("n3", "")];
        assert_eq!(
            human_line(&r),
            "1 file(s), 300000 bytes to each of 3 node(s) (n[1-3]) in 0.50 s (0.6 MB/s per node) \
             over tcp, encrypted, verified with blake3 on every node"
        );
        let v: serde_json::Value = serde_json::from_str(&Summary::new(&r).to_json()).unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(v["nodes"][2]["name"], "n3");
        assert_eq!(v["nodes"][2]["seconds"], 0.4);
        assert!(v["nodes"][2].get("reason").is_none());
        r.nodes[1] = node("n2", "big: No space left on device");
        assert!(
            human_line(&r).starts_with("FAILED on 1 of 3 node(s): "),
            "{}",
            human_line(&r)
        );
        let v: serde_json::Value = serde_json::from_str(&Summary::new(&r).to_json()).unwrap();
        assert_eq!(v["ok"], false);
        assert!(v.get("blake3").is_none(), "no digest next to a failure");
        assert_eq!(v["nodes"][1]["ok"], false);
        assert_eq!(v["nodes"][1]["reason"], "big: No space left on device");
        assert_eq!(summarize(&r, true, true), Exit::Partial);
    }

    #[test]
    fn the_json_summary_keeps_its_keys_and_names_the_digest() {
        let r = report(Some(Algorithm::Sha256), Some([0xab; 32]), vec![]);
        let expected = format!(
            concat!(
                r#"{{"bytes":300000,"bytes_per_second":600000.0,"deleted":0,"digest":"sha256","encrypted":true,"#,
                r#""files":1,"#,
                r#""io_engine":"threads","ok":true,"seconds":0.5,"sha256":"{}","skipped":0,"#,
                r#""stream_bytes":[200000,100000],"streams":2,"transport":"tcp","vanished":0}}"#
            ),
            "ab".repeat(32)
        );
        assert_eq!(Summary::new(&r).to_json(), expected);
        let r = report(Some(Algorithm::Blake3), Some([0xcd; 32]), vec![]);
        let v: serde_json::Value = serde_json::from_str(&Summary::new(&r).to_json()).unwrap();
        assert_eq!(v["digest"], "blake3");
        assert_eq!(v["blake3"], "cd".repeat(32));
        assert!(v.get("sha256").is_none(), "a digest is under its own name");
    }

    #[test]
    fn the_json_summary_has_no_digest_when_something_failed_or_none_was_made() {
        let failed = report(Some(Algorithm::Blake3), Some([1; 32]), vec![failure()]);
        let v: serde_json::Value = serde_json::from_str(&Summary::new(&failed).to_json()).unwrap();
        assert_eq!(v["ok"], false);
        assert!(v.get("blake3").is_none());
        let unverified = report(None, None, vec![]);
        let v: serde_json::Value =
            serde_json::from_str(&Summary::new(&unverified).to_json()).unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(v["digest"], "none");
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "bytes",
                "bytes_per_second",
                "deleted",
                "digest",
                "encrypted",
                "files",
                "io_engine",
                "ok",
                "seconds",
                "skipped",
                "stream_bytes",
                "streams",
                "transport",
                "vanished"
            ]
        );
    }

    #[test]
    fn a_source_that_vanished_is_counted_and_fails_nothing() {
        let gone = Failure {
            kind: FailKind::Vanished,
            ..failure()
        };
        let r = report(Some(Algorithm::Blake3), Some([1; 32]), vec![gone.clone()]);
        let v: serde_json::Value = serde_json::from_str(&Summary::new(&r).to_json()).unwrap();
        assert_eq!(
            (v["ok"].clone(), v["vanished"].clone()),
            (true.into(), 1.into())
        );
        assert_eq!(summarize(&r, false, true), Exit::Complete);
        let both = report(None, None, vec![gone, failure()]);
        assert_eq!(summarize(&both, false, true), Exit::Partial);
    }

    #[test]
    fn the_human_line_says_verified_with_what_or_failed() {
        let r = report(Some(Algorithm::Blake3), Some([0; 32]), vec![]);
        assert_eq!(
            human_line(&r),
            format!(
                "1 file(s), 300000 bytes in 0.50 s (0.6 MB/s) over tcp, encrypted, verified, blake3 {}",
                "0".repeat(64)
            )
        );
        let r = report(Some(Algorithm::Sha256), None, vec![]);
        assert!(human_line(&r).ends_with("over tcp, encrypted, verified with sha256"));
        let mut r = report(None, None, vec![]);
        assert!(human_line(&r).ends_with("over tcp, encrypted"));
        r.stats.skipped = 1;
        assert!(human_line(&r).starts_with("1 file(s) (1 there already), 300000 bytes"));
        r.stats.deleted = 2;
        assert!(human_line(&r).starts_with("1 file(s) (1 there already, 2 deleted), 300000"));
        let r = report(Some(Algorithm::Blake3), Some([0; 32]), vec![failure()]);
        assert_eq!(
            human_line(&r),
            "FAILED: 1 file(s), 300000 bytes in 0.50 s (0.6 MB/s) over tcp, encrypted; see the errors above"
        );
    }

    fn failure() -> Failure {
        Failure {
            path: "f".into(),
            kind: FailKind::Io,
            reason: "why".into(),
        }
    }
}
