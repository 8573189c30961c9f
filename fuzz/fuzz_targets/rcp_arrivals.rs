//! rcp's receiver rules ([`rcp::arrivals`]) driven by whatever sequence of
//! announcements, chunks, ends, abandons and `Done` a sender could send:
//! never a panic; every chunk handed in is landed at most once, at the
//! chunk number its offset names, only in an announced file, never after
//! that file finished or was dropped; each file finishes or is dropped
//! at most once, never both; after a violation the copy is over for good
//! (the receiver stops there).
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use rcp::arrivals::{Action, Arrivals, Place, Shape};

/// Reads little numbers off the input.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn small(&mut self) -> Option<u64> {
        self.u8().map(u64::from)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Bytes(data);
    let mut a: Arrivals<(u64, u64)> = Arrivals::new();
    let mut chunk_sizes = std::collections::HashMap::new();
    let mut landed = HashSet::new();
    let mut finished = HashSet::new();
    let mut next_id = 0u64;
    while let Some(op) = input.u8() {
        let result = match op % 5 {
            0 => {
                let (Some(index), Some(kind), Some(size), Some(chunk), Some(whole)) = (
                    input.small(),
                    input.u8(),
                    input.small(),
                    input.small(),
                    input.u8(),
                ) else {
                    break;
                };
                let shape = if kind % 3 == 0 {
                    Shape::Other
                } else {
                    chunk_sizes.insert(index as u32, chunk);
                    Shape::File {
                        size: size * 3,
                        chunk: chunk as u32,
                        sent: (whole % 2 == 0).then_some(u64::from(whole / 2 % 4)),
                    }
                };
                a.announce(index as u32, shape)
            }
            1 => {
                let (Some(entry), Some(offset), Some(len)) =
                    (input.small(), input.small(), input.small())
                else {
                    break;
                };
                next_id += 1;
                a.chunk(
                    Place {
                        entry,
                        offset,
                        len: len as u32,
                    },
                    (next_id, offset),
                )
            }
            2 => {
                let (Some(index), Some(sent)) = (input.small(), input.small()) else {
                    break;
                };
                a.end(index as u32, sent % 8)
                    .map(|f| f.into_iter().collect())
            }
            3 => {
                let (Some(index), Some(sent)) = (input.small(), input.small()) else {
                    break;
                };
                a.abandon(index as u32, sent % 8)
                    .map(|f| f.into_iter().collect())
            }
            _ => a.done().map(|()| Vec::new()),
        };
        let Ok(actions) = result else {
            // A violation ends the copy.
            return;
        };
        for act in actions {
            match act {
                Action::Land {
                    entry,
                    k,
                    chunk: (id, offset),
                } => {
                    assert!(landed.insert(id), "chunk {id} landed twice");
                    assert!(
                        !finished.contains(&entry),
                        "data after entry {entry} finished or dropped"
                    );
                    let c = chunk_sizes[&entry];
                    assert_eq!(k * c, offset, "chunk number and offset disagree");
                }
                Action::Finish { entry } | Action::Drop { entry } => {
                    assert!(
                        finished.insert(entry),
                        "entry {entry} finished or dropped twice"
                    );
                }
            }
        }
        if a.is_over() {
            return;
        }
    }
});
