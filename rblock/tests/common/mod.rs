//! What the NBD client tests share: running the clients, images, ports.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use test_support::{Scratch, pattern};

pub const RBLOCK: &str = env!("CARGO_BIN_EXE_rblock");

pub use test_support::free_port;

pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} cannot run ({e}); scripts/setup installs it"))
}

pub fn ok(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A sparse image of `size` bytes (at least 2 MiB) with data only in its
/// second MiB.
pub fn image(t: &Scratch, size: u64) -> PathBuf {
    assert!(size >= 2 << 20);
    let p = t.path("disk.img");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&pattern(1 << 20, 1), 1 << 20).unwrap();
    p
}

pub fn files_equal(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba).unwrap();
        let mut nb = 0;
        while nb < na {
            let k = fb.read(&mut bb[nb..na]).unwrap();
            if k == 0 {
                return false;
            }
            nb += k;
        }
        if na == 0 {
            return fb.read(&mut bb).unwrap() == 0;
        }
        if ba[..na] != bb[..na] {
            return false;
        }
    }
}

/// fio's nbd engine at `uri`: 4 KiB random writes over `size_mib` MiB at
/// `iodepth` with crc32c verify headers, then the verify pass (fatal on
/// the first mismatch); `extra` options after those. Its JSON report.
pub fn fio_verify(uri: &str, size_mib: u32, iodepth: u32, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "--name=verify".to_string(),
        "--ioengine=nbd".to_string(),
        format!("--uri={uri}"),
        "--rw=randwrite".to_string(),
        "--bs=4k".to_string(),
        format!("--size={size_mib}m"),
        format!("--iodepth={iodepth}"),
        "--verify=crc32c".to_string(),
        "--do_verify=1".to_string(),
        "--verify_fatal=1".to_string(),
        // No state file left in the working directory.
        "--verify_state_save=0".to_string(),
        "--output-format=json".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = Command::new("fio").args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "fio failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let start = text.find('{').expect("fio json");
    serde_json::from_str(&text[start..]).unwrap()
}
