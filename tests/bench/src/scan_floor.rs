//! The floor under a `-aHAX` quick-check re-sync of a tree: what any tool
//! must ask the kernel of every entry on both sides (its status, the names
//! of its extended attributes, each attribute), with one thread a side and
//! nothing else — no messages, no comparisons, no answers. rsync asks the
//! same (and more); rcp asks exactly this. A program, not a test: the
//! re-sync section of `rcp-vs-tools` prints it next to both tools' times.
//!
//!   scan-floor TREE [TREE...]   (one thread a tree, all at once)

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::time::Instant;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Asks of every entry beneath directory `path` (NUL-free bytes, grown
/// and shrunk in place: no allocation a file) what a re-sync asks; the
/// count.
fn scan(path: &mut Vec<u8>, buf: &mut Buffers) -> anyhow::Result<u64> {
    let dir = rustix::fs::open(
        &CString::new(path.clone())?,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut entries = 0;
    for e in rustix::fs::Dir::read_from(&dir)? {
        let e = e?;
        let name = e.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        // By path, as both tools reach attributes (there is no
        // "llistxattrat" on the kernels this serves).
        let len = path.len();
        path.push(b'/');
        path.extend_from_slice(name.to_bytes());
        path.push(0);
        let full = CStr::from_bytes_with_nul(path)?;
        // Room for a short answer, as rcp asks first: the kernel
        // allocates the room it is offered, so 64 KiB a call would cost
        // more than the question (most entries have no attribute at all).
        let n = rustix::fs::llistxattr(full, &mut buf.names[..SHORT]).unwrap_or(0);
        for attr in buf.names[..n].split_inclusive(|&b| b == 0) {
            let attr = CStr::from_bytes_with_nul(attr)?;
            let _ = rustix::fs::lgetxattr(full, attr, &mut buf.value[..SHORT]);
        }
        path.pop();
        entries += 1;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            entries += scan(path, buf)?;
        }
        path.truncate(len);
    }
    Ok(entries)
}

/// The room offered for a list of attribute names or one value: rcp's
/// first try (`archive::FIRST_TRY`).
const SHORT: usize = 1024;

/// Room for an entry's attribute names and for one value.
struct Buffers {
    names: Vec<u8>,
    value: Vec<u8>,
}

fn main() -> anyhow::Result<()> {
    let trees: Vec<_> = std::env::args_os().skip(1).collect();
    if trees.is_empty() {
        anyhow::bail!("usage: scan-floor TREE [TREE...]");
    }
    let start = Instant::now();
    let sides: Vec<_> = trees
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let mut buf = Buffers {
                    names: vec![0; SHORT],
                    value: vec![0; SHORT],
                };
                scan(&mut t.as_bytes().to_vec(), &mut buf)
            })
        })
        .collect();
    let mut entries = 0;
    for side in sides {
        entries += side.join().expect("a scan thread panicked")?;
    }
    println!("{entries} entries, {:.3} s", start.elapsed().as_secs_f64());
    Ok(())
}
