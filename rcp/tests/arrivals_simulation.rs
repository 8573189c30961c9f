//! Seeded simulations of rcp's receiver rules ([`rcp::arrivals`]).
//!
//! Each schedule draws a tree of entries (files of random sizes and chunk
//! sizes, some sent only in part as a resume or a sparse file would, some
//! announced whole, some abandoned part way (the source could not be
//! read); files a broadcast node lets pass, with data for the nodes after
//! it or none; directories, some that could not be listed; symlinks) and
//! lets a model sender put its
//! messages and chunks on a random number of streams, as rcp does: stream
//! 0 carries the messages in order and data too, the others data only.
//! Each stream is FIFO; the receiver sees a random merge of them, so chunks
//! overtake their entry's announcement and ends overtake chunks.
//!
//! An honest schedule must never be called a violation, must land every
//! chunk sent exactly once at its own chunk number, must finish every file
//! exactly once and only after all its chunks and its end, must drop
//! every abandoned entry exactly once (a file only after the chunks sent
//! of it) and finish none, must land and finish nothing of a passing
//! file, and must be over
//! exactly when its last item is taken. A schedule with one planted fault
//! the rules can see (an announcement out of order, an end said twice, one
//! chunk too many, data for a directory, a chunk outside its file, a
//! missing `Done`, an end after an entry was abandoned) must be refused, or, for the missing `Done`, never be
//! over.

use std::collections::{HashMap, HashSet, VecDeque};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rcp::arrivals::{Action, Arrivals, Place, Shape};

const SCHEDULES: u64 = 10_000;

#[derive(Debug, Clone)]
enum Item {
    Announce(u32, Shape),
    End(u32, u64),
    /// The sender could not read the entry, after sending that many of
    /// its chunks.
    Abandon(u32, u64),
    Done,
    /// A chunk, with its id (the index into the model's chunk list).
    Data(Place, usize),
}

#[derive(Debug, Clone)]
struct ModelChunk {
    entry: u32,
    k: u64,
}

#[derive(Debug)]
struct Model {
    streams: Vec<VecDeque<Item>>,
    chunks: Vec<ModelChunk>,
    /// Per file finished: how many chunks were sent.
    files: HashMap<u32, u64>,
    /// Per entry abandoned (files and directories): how many chunks were
    /// sent before.
    abandoned: HashMap<u32, u64>,
    /// Files passing through (not in `files`), and their chunks' ids.
    passing: HashSet<u32>,
    passing_chunks: HashSet<usize>,
    dirs: Vec<u32>,
}

fn draw(rng: &mut SmallRng) -> Model {
    let nstreams = rng.random_range(1..=4);
    let mut streams = vec![VecDeque::new(); nstreams];
    let mut chunks = Vec::new();
    let mut files = HashMap::new();
    let mut abandoned = HashMap::new();
    let mut passing = HashSet::new();
    let mut passing_chunks = HashSet::new();
    let mut dirs = Vec::new();
    let entries = rng.random_range(1..=30u32);
    // Indices grow, with gaps (a walk skips what it cannot read).
    let mut index = 0u32;
    for _ in 0..entries {
        index += rng.random_range(1..=2);
        if rng.random_bool(0.3) {
            dirs.push(index);
            streams[0].push_back(Item::Announce(index, Shape::Other));
            // A directory that could not be listed.
            if rng.random_bool(0.2) {
                abandoned.insert(index, 0);
                streams[0].push_back(Item::Abandon(index, 0));
            }
            continue;
        }
        let chunk = rng.random_range(1..=64u32);
        let size = rng.random_range(0..=u64::from(chunk) * 6);
        let count = size.div_ceil(u64::from(chunk));
        // A resumed or sparse file sends only some of its chunks.
        let partial = rng.random_bool(0.3);
        // A file this node needs nothing of: some node after it may need
        // some of it, or none does (then neither data nor end comes).
        let passes = rng.random_bool(0.2);
        let needed = !passes || rng.random_bool(0.7);
        let sent: Vec<u64> = (0..count)
            .filter(|_| needed && (!partial || rng.random_bool(0.6)))
            .collect();
        let whole = !passes && sent.len() <= 1 && rng.random_bool(0.7);
        // A file the sender could not read to its end: what it read of
        // it before went out.
        let mut sent = sent;
        let abandon = !passes && !whole && rng.random_bool(0.2);
        if abandon {
            sent.truncate(rng.random_range(0..=sent.len()));
        }
        let shape = if passes {
            passing.insert(index);
            Shape::Passing { size, chunk }
        } else {
            if abandon {
                abandoned.insert(index, sent.len() as u64);
            } else {
                files.insert(index, sent.len() as u64);
            }
            Shape::File {
                size,
                chunk,
                sent: whole.then_some(sent.len() as u64),
            }
        };
        streams[0].push_back(Item::Announce(index, shape));
        for &k in &sent {
            let offset = k * u64::from(chunk);
            let len = (size - offset).min(u64::from(chunk)) as u32;
            let id = chunks.len();
            chunks.push(ModelChunk { entry: index, k });
            if passes {
                passing_chunks.insert(id);
            }
            let s = rng.random_range(0..nstreams);
            let place = Place {
                entry: u64::from(index),
                offset,
                len,
            };
            streams[s].push_back(Item::Data(place, id));
        }
        if abandon {
            streams[0].push_back(Item::Abandon(index, sent.len() as u64));
        } else if !whole && needed {
            streams[0].push_back(Item::End(index, sent.len() as u64));
        }
    }
    streams[0].push_back(Item::Done);
    Model {
        streams,
        chunks,
        files,
        abandoned,
        passing,
        passing_chunks,
        dirs,
    }
}

/// The receiver's merge of the streams: any non-empty stream next.
fn merge(rng: &mut SmallRng, mut streams: Vec<VecDeque<Item>>) -> Vec<Item> {
    let mut out = Vec::new();
    loop {
        let live: Vec<usize> = (0..streams.len())
            .filter(|&s| !streams[s].is_empty())
            .collect();
        if live.is_empty() {
            return out;
        }
        let s = live[rng.random_range(0..live.len())];
        out.push(streams[s].pop_front().expect("non-empty"));
    }
}

/// What a run of the machine gave: its actions, whether the copy is over,
/// and how many items were left untaken when it was (the receiver reads
/// nothing after that).
type Run = (Vec<Action<usize>>, bool, usize);

/// Feeds `items` to a fresh machine until the copy is over: what it gave,
/// or the first violation (with how many items were taken before it).
fn run(items: &[Item]) -> Result<Run, (usize, String)> {
    let mut a = Arrivals::new();
    let mut actions = Vec::new();
    for (n, item) in items.iter().enumerate() {
        let r = match item.clone() {
            Item::Announce(i, shape) => a.announce(i, shape),
            Item::End(i, sent) => a.end(i, sent).map(|x| x.into_iter().collect()),
            Item::Abandon(i, sent) => a.abandon(i, sent).map(|x| x.into_iter().collect()),
            Item::Done => a.done().map(|()| Vec::new()),
            Item::Data(place, id) => a.chunk(place, id),
        };
        match r {
            Ok(acts) => actions.extend(acts),
            Err(v) => return Err((n, v.to_string())),
        }
        if a.is_over() {
            return Ok((actions, true, items.len() - n - 1));
        }
    }
    Ok((actions, false, 0))
}

#[test]
fn honest_schedules_land_every_chunk_once_and_finish_every_file_once() {
    for seed in 0..SCHEDULES {
        let mut rng = SmallRng::seed_from_u64(seed);
        let model = draw(&mut rng);
        let items = merge(&mut rng, model.streams.clone());
        let (actions, over, rest) =
            run(&items).unwrap_or_else(|(n, v)| panic!("seed {seed}: item {n}: {v}"));
        assert!(over, "seed {seed}: not over after everything arrived");
        assert_eq!(rest, 0, "seed {seed}: over before the last item");
        let mut landed = HashSet::new();
        let mut landed_per_file: HashMap<u32, u64> = HashMap::new();
        let mut finished = HashSet::new();
        let mut dropped = HashSet::new();
        for act in actions {
            match act {
                Action::Land { entry, k, chunk } => {
                    assert!(
                        !model.passing.contains(&entry),
                        "seed {seed}: passing entry {entry} landed"
                    );
                    let m = &model.chunks[chunk];
                    assert_eq!((entry, k), (m.entry, m.k), "seed {seed}: misplaced");
                    assert!(landed.insert(chunk), "seed {seed}: chunk {chunk} twice");
                    assert!(
                        !finished.contains(&entry),
                        "seed {seed}: data after entry {entry} finished"
                    );
                    *landed_per_file.entry(entry).or_default() += 1;
                }
                Action::Finish { entry } => {
                    let sent = model.files[&entry];
                    assert_eq!(
                        landed_per_file.get(&entry).copied().unwrap_or(0),
                        sent,
                        "seed {seed}: entry {entry} finished early"
                    );
                    assert!(finished.insert(entry), "seed {seed}: finished twice");
                }
                Action::Drop { entry } => {
                    let sent = model.abandoned.get(&entry).copied();
                    assert!(sent.is_some(), "seed {seed}: entry {entry} dropped");
                    assert_eq!(
                        landed_per_file.get(&entry).copied().unwrap_or(0),
                        sent.unwrap(),
                        "seed {seed}: entry {entry} dropped early"
                    );
                    assert!(dropped.insert(entry), "seed {seed}: dropped twice");
                }
            }
        }
        assert_eq!(
            dropped.len(),
            model.abandoned.len(),
            "seed {seed}: abandoned entries left"
        );
        assert_eq!(
            landed.len(),
            model.chunks.len() - model.passing_chunks.len(),
            "seed {seed}: lost chunks"
        );
        assert_eq!(finished.len(), model.files.len(), "seed {seed}: files left");
    }
}

/// One fault the rules must see.
#[derive(Debug, Clone, Copy)]
enum Fault {
    SwapAnnouncements,
    EndTwice,
    ChunkTooMany,
    DataForDirectory,
    Outside,
    NoDone,
    EndAfterAbandon,
}

const FAULTS: [Fault; 7] = [
    Fault::SwapAnnouncements,
    Fault::EndTwice,
    Fault::ChunkTooMany,
    Fault::DataForDirectory,
    Fault::Outside,
    Fault::NoDone,
    Fault::EndAfterAbandon,
];

/// Plants `fault` in the model's streams; false if this model has no room
/// for it (no directory, say).
fn plant(rng: &mut SmallRng, model: &mut Model, fault: Fault) -> bool {
    let s0 = &mut model.streams[0];
    let announcements: Vec<usize> = (0..s0.len())
        .filter(|&i| matches!(s0[i], Item::Announce(..)))
        .collect();
    match fault {
        Fault::SwapAnnouncements => {
            if announcements.len() < 2 {
                return false;
            }
            let i = rng.random_range(0..announcements.len() - 1);
            s0.swap(announcements[i], announcements[i + 1]);
        }
        Fault::EndTwice => {
            let ends: Vec<usize> = (0..s0.len())
                .filter(|&i| matches!(s0[i], Item::End(..)))
                .collect();
            let Some(&at) = ends.get(rng.random_range(0..ends.len().max(1))) else {
                return false;
            };
            let again = s0[at].clone();
            s0.insert(at + 1, again);
        }
        Fault::ChunkTooMany => {
            // A copy of a file's chunk, right after the original on the
            // same stream.
            let Some((s, at)) = (0..model.streams.len())
                .flat_map(|s| (0..model.streams[s].len()).map(move |i| (s, i)))
                .find(|&(s, i)| matches!(model.streams[s][i], Item::Data(..)))
            else {
                return false;
            };
            let again = model.streams[s][at].clone();
            model.streams[s].insert(at + 1, again);
        }
        Fault::DataForDirectory => {
            let Some(&dir) = model.dirs.first() else {
                return false;
            };
            let place = Place {
                entry: u64::from(dir),
                offset: 0,
                len: 1,
            };
            let s = rng.random_range(0..model.streams.len());
            let at = rng.random_range(0..=model.streams[s].len());
            model.streams[s].insert(at, Item::Data(place, usize::MAX));
        }
        Fault::Outside => {
            let Some(item) = model
                .streams
                .iter_mut()
                .flat_map(|s| s.iter_mut())
                .find(|i| matches!(i, Item::Data(..)))
            else {
                return false;
            };
            let Item::Data(place, _) = item else {
                unreachable!()
            };
            if rng.random_bool(0.5) {
                place.offset = u64::MAX - rng.random_range(0..64); // past any end
            } else {
                place.len = u32::MAX; // longer than any chunk
            }
        }
        Fault::NoDone => {
            s0.pop_back();
        }
        Fault::EndAfterAbandon => {
            // An entry abandoned, then ended as if it had not been.
            let Some(at) = (0..s0.len()).find(|&i| matches!(s0[i], Item::Abandon(..))) else {
                return false;
            };
            let Item::Abandon(index, sent) = s0[at] else {
                unreachable!()
            };
            s0.insert(at + 1, Item::End(index, sent));
        }
    }
    true
}

#[test]
fn planted_faults_are_refused() {
    let mut planted = [0u32; FAULTS.len()];
    for seed in 0..SCHEDULES {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
        let mut model = draw(&mut rng);
        let f = (seed as usize) % FAULTS.len();
        if !plant(&mut rng, &mut model, FAULTS[f]) {
            continue;
        }
        planted[f] += 1;
        let items = merge(&mut rng, model.streams);
        match (FAULTS[f], run(&items)) {
            (Fault::NoDone, Ok((_, over, _))) => {
                assert!(!over, "seed {seed}: over without Done")
            }
            // A stray chunk that comes after the copy is over is never
            // read: it changes nothing.
            (Fault::ChunkTooMany | Fault::DataForDirectory, Ok((_, true, rest))) if rest > 0 => {}
            (fault, Ok(_)) => panic!("seed {seed}: {fault:?} went unnoticed"),
            (_, Err(_)) => {}
        }
    }
    for (f, n) in FAULTS.iter().zip(planted) {
        assert!(n > 500, "{f:?} planted only {n} times");
    }
}

/// Resume's `Have` batches ([`rcp::resume`]): for several files at once,
/// with random digest counts around the batch size, the batches of the
/// files interleaved at random (each file's in order, as one stream keeps
/// them), the sender's collection gives back exactly each file's digests,
/// once, at its last batch. With one batch dropped or sent twice, the
/// collection refuses or never completes that file; it never completes it
/// with the wrong digests.
#[test]
fn have_batches_are_collected_exactly_in_any_interleaving() {
    use rcp::proto::Msg;
    use rcp::resume::{HAVE_BATCH, Haves, have_batches};
    for seed in 0..SCHEDULES {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x4a7e);
        let files = rng.random_range(1..=4u32);
        let mut want = HashMap::new();
        let mut queues: Vec<VecDeque<Msg>> = Vec::new();
        let mut h = Haves::new();
        for f in 0..files {
            let n = match rng.random_range(0..4) {
                0 => 0,
                1 => HAVE_BATCH * rng.random_range(1..=3),
                _ => rng.random_range(0..=3 * HAVE_BATCH + 1),
            };
            let digests: Vec<[u8; 32]> = (0..n).map(|_| rng.random()).collect();
            queues.push(have_batches(f, &digests).collect());
            want.insert(f, digests);
            h.ask(f);
        }
        // 0: honest; 1: one batch dropped; 2: one batch twice.
        let fault = seed % 3;
        let victim = rng.random_range(0..files) as usize;
        let at = rng.random_range(0..queues[victim].len());
        match fault {
            1 => drop(queues[victim].remove(at)),
            2 => {
                let again = queues[victim][at].clone();
                queues[victim].insert(at, again);
            }
            _ => {}
        }
        let mut got = HashMap::new();
        let mut refused = false;
        let items = {
            let mut streams: Vec<VecDeque<Msg>> = queues;
            let mut out = Vec::new();
            while let Some(s) = {
                let live: Vec<usize> = (0..streams.len())
                    .filter(|&s| !streams[s].is_empty())
                    .collect();
                (!live.is_empty()).then(|| live[rng.random_range(0..live.len())])
            } {
                out.push(streams[s].pop_front().expect("non-empty"));
            }
            out
        };
        for m in items {
            let Msg::Have {
                index,
                first,
                digests,
            } = m
            else {
                unreachable!()
            };
            match h.on_have(index, first, digests) {
                Ok(Some(all)) => assert!(got.insert(index, all).is_none(), "seed {seed}"),
                Ok(None) => {}
                Err(_) => {
                    refused = true;
                    break;
                }
            }
        }
        for (f, digests) in &got {
            assert_eq!(digests, &want[f], "seed {seed}: file {f} collected wrong");
        }
        if fault == 0 {
            assert!(!refused, "seed {seed}: honest batches refused");
            assert_eq!(got.len(), files as usize, "seed {seed}: files left waiting");
        } else {
            assert!(
                refused || !got.contains_key(&(victim as u32)),
                "seed {seed}: fault {fault} in file {victim} went unnoticed"
            );
        }
    }
}
