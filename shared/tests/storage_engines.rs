//! The storage engines' conformance suite: every test body runs against
//! the threads engine and, where this kernel allows it, io_uring (under a
//! kernel profile that refuses io_uring the io_uring half says why it is
//! not run; the threads half always runs).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use rfabric::memory::BufferPool;
use rfabric::storage::{self, Engine, EngineChoice, Kind};
use test_support::{Scratch, pattern};

/// The engines to hold to the same contract, each with a ring of its own
/// (with `fixed`'s buffers, registered once twice the pool was read into
/// them) and, for io_uring, also the per-thread rings servers use.
fn engines(fixed: Option<&Arc<BufferPool>>) -> Vec<Engine> {
    let mut out = vec![Engine::start(Kind::Threads, fixed).unwrap()];
    match storage::select(EngineChoice::IoUring) {
        Ok(_) => {
            out.push(Engine::start(Kind::IoUring, fixed).unwrap());
            out.push(Engine::per_thread(Kind::IoUring).unwrap());
        }
        Err(e) => eprintln!("io_uring half not run: {e}"),
    }
    out
}

fn file_with(t: &Scratch, name: &str, data: &[u8]) -> Arc<File> {
    let path = t.path(name);
    std::fs::write(&path, data).unwrap();
    Arc::new(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_into_pool_buffers_land_where_asked_and_stop_at_the_end() {
    let t = Scratch::new("engine-read");
    let data = pattern(300_000, 1);
    let file = file_with(&t, "f", &data);
    let pool = BufferPool::new(2, 128 * 1024).unwrap();
    let other = BufferPool::new(1, 128 * 1024).unwrap();
    for engine in engines(Some(&pool)) {
        let kind = engine.kind();
        // From byte `at` of the buffer on, in a buffer of the ring's pool
        // (not yet registered: `uring.rs`' own test reads into registered
        // ones) and in one of a pool the ring does not know.
        for p in [&pool, &other] {
            let mut buf = p.acquire().await;
            buf.spare().fill(0xee);
            let (mut buf, r) = engine.read(&file, 1000, buf, 10, 50_000).await;
            let n = r.unwrap();
            assert!(n > 0 && n <= 50_000, "{kind}: {n}");
            buf.set_len(10 + n);
            assert!(buf.data()[..10].iter().all(|&b| b == 0xee), "{kind}");
            assert_eq!(&buf.data()[10..], &data[1000..1000 + n], "{kind}");
        }
        // Near the end: short; at the end: nothing.
        let buf = pool.acquire().await;
        let (buf, r) = engine.read(&file, 299_000, buf, 0, 100_000).await;
        assert_eq!(r.unwrap(), 1000, "{kind}");
        let (_, r) = engine.read(&file, 300_000, buf, 0, 4096).await;
        assert_eq!(r.unwrap(), 0, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reads_appends_each_to_its_own_buffer() {
    let t = Scratch::new("engine-burst");
    let data = pattern(1 << 20, 2);
    let file = file_with(&t, "f", &data);
    // A hole past the data reads as zeros.
    file.set_len(2 << 20).unwrap();
    let mut whole = data.clone();
    whole.resize(2 << 20, 0);
    for engine in engines(None) {
        let kind = engine.kind();
        let reads: Vec<(u64, Vec<u8>, usize)> = (0..200u64)
            .map(|i| (i * 9973, format!("head{i}").into_bytes(), 4096 + i as usize))
            .chain([((1 << 20) + 5, b"hole".to_vec(), 70_000)])
            .collect();
        let wanted: Vec<_> = reads.iter().map(|(o, b, l)| (*o, b.clone(), *l)).collect();
        let started = engine.read_append_many(&file, reads).await;
        assert_eq!(started.len(), wanted.len());
        for (read, (offset, head, len)) in started.into_iter().zip(wanted) {
            let (buf, r) = read.finish().await;
            assert_eq!(r.unwrap(), len, "{kind} at {offset}");
            assert_eq!(&buf[..head.len()], &head[..], "{kind}");
            let o = offset as usize;
            assert_eq!(&buf[head.len()..], &whole[o..o + len], "{kind} at {offset}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_every_owned_buffer_kind_reach_the_file() {
    let t = Scratch::new("engine-write");
    let pool = BufferPool::new(1, 64 * 1024).unwrap();
    for (i, engine) in engines(Some(&pool)).into_iter().enumerate() {
        let kind = engine.kind();
        let file = file_with(&t, &format!("f{i}"), &[]);
        let a = pattern(200_000, 3);
        // A vector, from byte `at` on, durable and not.
        let (back, r) = engine
            .write_all(&file, 5, a.clone(), 100, 150_000, true)
            .await;
        r.unwrap();
        assert_eq!(back, a, "{kind}: the buffer comes back as it went");
        let w = engine
            .write(&file, 500_000, vec![7u8; 10], 0, 10, false)
            .await;
        assert_eq!(w.result.unwrap(), 10, "{kind}");
        // A pool buffer: its data part.
        let mut buf = pool.acquire().await;
        buf.fill_from(&a[..4000]);
        let (_, r) = engine.write_all(&file, 300_000, buf, 0, 4000, false).await;
        r.unwrap();
        engine.sync(&file, true).await.unwrap();
        engine.sync(&file, false).await.unwrap();
        let mut got = vec![0u8; 500_010];
        file.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got[5..150_005], &a[100..150_100], "{kind}");
        assert!(got[150_005..300_000].iter().all(|&b| b == 0), "{kind}");
        assert_eq!(&got[300_000..304_000], &a[..4000], "{kind}");
        assert_eq!(&got[500_000..], &[7u8; 10], "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallocate_punches_holes_and_reports_refusals() {
    let t = Scratch::new("engine-fallocate");
    for (i, engine) in engines(None).into_iter().enumerate() {
        let kind = engine.kind();
        let file = file_with(&t, &format!("f{i}"), &pattern(1 << 20, 4));
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        match engine.fallocate(&file, punch, 4096, 8192).await {
            Ok(()) => {
                let mut got = vec![1u8; 8192];
                file.read_exact_at(&mut got, 4096).unwrap();
                assert!(got.iter().all(|&b| b == 0), "{kind}: punched");
                assert_eq!(file.metadata().unwrap().len(), 1 << 20, "{kind}: kept size");
            }
            // A filesystem without holes (the temporary directory's).
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{kind}"),
        }
        // Preallocation grows the file.
        engine.fallocate(&file, 0, 0, 2 << 20).await.unwrap();
        assert_eq!(file.metadata().unwrap().len(), 2 << 20, "{kind}");
        // An fd open read-only cannot be changed: the kernel's error.
        let ro = Arc::new(File::open(t.path(&format!("f{i}"))).unwrap());
        let e = engine.fallocate(&ro, 0, 0, 4 << 20).await.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{kind}");
        let w = engine.write(&ro, 0, vec![1u8; 8], 0, 8, false).await;
        assert_eq!(
            w.result.unwrap_err().raw_os_error(),
            Some(libc::EBADF),
            "{kind}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_syncs_then_renames_and_says_which_step_failed() {
    let t = Scratch::new("engine-commit");
    let dir: Arc<OwnedFd> = Arc::new(File::open(t.dir()).unwrap().into());
    for (i, engine) in engines(None).into_iter().enumerate() {
        let kind = engine.kind();
        let temp = format!(".part{i}");
        let file = file_with(&t, &temp, b"contents");
        let name = format!("final{i}");
        engine
            .sync_and_rename(
                &file,
                &dir,
                CString::new(temp.clone()).unwrap(),
                CString::new(name.clone()).unwrap(),
            )
            .await
            .unwrap();
        assert!(!t.path(&temp).exists(), "{kind}");
        assert_eq!(std::fs::read(t.path(&name)).unwrap(), b"contents", "{kind}");
        // Renaming what is not there: the rename's error, named.
        let e = engine
            .sync_and_rename(
                &file,
                &dir,
                CString::new("missing").unwrap(),
                CString::new("other").unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.raw_os_error(), None, "{kind}: explained, {e}");
        assert!(
            e.to_string().starts_with("cannot rename into place"),
            "{kind}: {e}"
        );
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{kind}");
    }
}

/// Futures dropped while their operations run leave the buffer and the
/// file with the operation: a buffer that came back early would be
/// refilled for the next write while the kernel or a pool thread still
/// copies from it, and the file would show the later pattern.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_operation_keeps_its_buffer_and_file_until_done() {
    let t = Scratch::new("engine-drop");
    let size = 256 * 1024;
    let rounds = 48;
    let pool = BufferPool::new(3, size).unwrap();
    for (i, engine) in engines(Some(&pool)).into_iter().enumerate() {
        let kind = engine.kind();
        let file = file_with(&t, &format!("f{i}"), &[]);
        for r in 0..rounds {
            // Waits until the engine gave a buffer back.
            let mut buf = pool.acquire().await;
            buf.fill_from(&pattern(size, 100 + r));
            let write = engine.write(&file, r * size as u64, buf, 0, size, false);
            // Polled once (started), then dropped.
            let _ = tokio::time::timeout(Duration::ZERO, write).await;
        }
        // Every buffer and every hold on the file comes back.
        for _ in 0..1000 {
            if pool.available() == 3 && Arc::strong_count(&file) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(pool.available(), 3, "{kind}: buffers returned");
        assert_eq!(Arc::strong_count(&file), 1, "{kind}: file let go");
        let mut got = vec![0u8; size];
        for r in 0..rounds {
            file.read_exact_at(&mut got, r * size as u64).unwrap();
            assert!(got == pattern(size, 100 + r), "{kind}: round {r} intact");
        }
    }
}

#[test]
fn the_choice_is_reported_by_name() {
    let threads = storage::select(EngineChoice::Threads).unwrap();
    assert_eq!(threads.kind, Kind::Threads);
    assert_eq!(threads.fallback, None);
    assert_eq!(threads.notice("rcp"), None);
    let auto = storage::select(EngineChoice::Auto).unwrap();
    match storage::select(EngineChoice::IoUring) {
        Ok(s) => {
            assert_eq!(s.kind, Kind::IoUring);
            assert_eq!(auto.kind, Kind::IoUring);
            assert_eq!(auto.notice("rcp"), None);
        }
        Err(e) => {
            // What auto says and what the explicit choice refuses agree.
            assert_eq!(auto.kind, Kind::Threads);
            let why = auto.fallback.clone().expect("a reason");
            assert!(e.to_string().contains(&why), "{e} / {why}");
            let notice = auto.notice("rcp").unwrap();
            assert!(notice.starts_with("rcp: using the threads storage engine: "));
            assert!(notice.contains("io_uring on RHEL"), "{notice}");
        }
    }
    assert_eq!(Kind::IoUring.to_string(), "io_uring");
    assert_eq!(Kind::Threads.name(), "threads");
    assert_eq!(EngineChoice::IoUring.name(), "io_uring");
}

/// Small buffered writes: done on the calling thread exactly when the
/// engine says it does them there (threads always; io_uring once its ring
/// kept handing them to kernel workers), never when too large; and a run
/// of them lands whole whichever way each one went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_land_whole_here_or_through_the_engine() {
    let t = Scratch::new("engine-small-writes");
    for (i, engine) in engines(None).into_iter().enumerate() {
        let kind = engine.kind();
        let file = file_with(&t, &format!("f{i}"), &[]);
        let big = vec![1u8; storage::INLINE_WRITE + 1];
        assert!(
            engine.write_now(&*file, 0, &big).is_none(),
            "{kind}: too large"
        );
        let data = pattern(5000, 7);
        match engine.write_now(&*file, 100, &data) {
            Some(r) => {
                assert!(engine.writes_small_here(), "{kind}");
                assert_eq!(r.unwrap(), 5000, "{kind}");
                let mut got = vec![0u8; 5000];
                file.read_exact_at(&mut got, 100).unwrap();
                assert_eq!(got, data, "{kind}");
            }
            // io_uring before it switched, or a write RWF_NOWAIT refused.
            None => assert!(
                kind == Kind::IoUring || engine.writes_small_here(),
                "{kind}"
            ),
        }
        for r in 0..200u64 {
            let (_, w) = engine
                .write_all(&file, r * 4096, pattern(4096, r), 0, 4096, false)
                .await;
            w.unwrap();
        }
        let mut got = vec![0u8; 4096];
        for r in 0..200u64 {
            file.read_exact_at(&mut got, r * 4096).unwrap();
            assert!(got == pattern(4096, r), "{kind}: write {r}");
        }
    }
}
