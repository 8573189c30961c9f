use super::*;

fn file(size: u64, chunk: u32) -> Shape {
    Shape::File {
        size,
        chunk,
        sent: None,
    }
}

fn at(entry: u64, offset: u64, len: u32) -> Place {
    Place { entry, offset, len }
}

fn landed(actions: &[Action<u8>]) -> Vec<(u32, u64, u8)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Land { entry, k, chunk } => Some((*entry, *k, *chunk)),
            Action::Finish { .. } | Action::Drop { .. } => None,
        })
        .collect()
}

#[test]
fn a_file_in_order_lands_and_finishes_at_its_end() {
    let mut a = Arrivals::new();
    assert_eq!(a.announce(0, file(250, 100)).unwrap(), vec![]);
    for (i, off) in [0u64, 100, 200].into_iter().enumerate() {
        let len = if off == 200 { 50 } else { 100 };
        let acts = a.chunk(at(0, off, len), i as u8).unwrap();
        assert_eq!(landed(&acts), vec![(0, off / 100, i as u8)]);
        assert_eq!(acts.len(), 1, "no finish before the end");
    }
    assert!(!a.is_over(), "no Done yet");
    assert_eq!(a.end(0, 3).unwrap(), Some(Action::Finish { entry: 0 }));
    assert!(!a.is_over(), "no Done yet");
    a.done().unwrap();
    assert!(a.is_over());
}

#[test]
fn the_end_may_come_before_the_data() {
    let mut a = Arrivals::new();
    a.announce(4, file(200, 100)).unwrap();
    assert_eq!(a.end(4, 2).unwrap(), None);
    assert_eq!(a.chunk(at(4, 100, 100), 1).unwrap().len(), 1);
    let acts = a.chunk(at(4, 0, 100), 0).unwrap();
    assert_eq!(
        acts,
        vec![
            Action::Land {
                entry: 4,
                k: 0,
                chunk: 0
            },
            Action::Finish { entry: 4 }
        ]
    );
}

#[test]
fn chunks_that_overtake_their_entry_are_held_and_landed_in_arrival_order() {
    let mut a = Arrivals::new();
    a.announce(0, Shape::Other).unwrap();
    assert!(a.chunk(at(2, 100, 10), 7).unwrap().is_empty());
    assert!(a.chunk(at(2, 0, 100), 8).unwrap().is_empty());
    a.announce(1, file(0, 100)).unwrap();
    let acts = a
        .announce(
            2,
            Shape::File {
                size: 110,
                chunk: 100,
                sent: Some(2),
            },
        )
        .unwrap();
    assert_eq!(landed(&acts), vec![(2, 1, 7), (2, 0, 8)]);
    assert_eq!(acts.last(), Some(&Action::Finish { entry: 2 }));
}

#[test]
fn a_whole_empty_file_finishes_at_its_announcement() {
    let mut a: Arrivals<u8> = Arrivals::new();
    let acts = a
        .announce(
            0,
            Shape::File {
                size: 0,
                chunk: 100,
                sent: Some(0),
            },
        )
        .unwrap();
    assert_eq!(acts, vec![Action::Finish { entry: 0 }]);
    a.done().unwrap();
    assert!(a.is_over());
}

#[test]
fn entries_must_be_announced_in_growing_order() {
    let mut a: Arrivals<u8> = Arrivals::new();
    a.announce(3, Shape::Other).unwrap();
    assert_eq!(
        a.announce(3, Shape::Other),
        Err(Violation::OutOfOrder { index: 3, after: 3 })
    );
    assert_eq!(
        a.announce(1, file(1, 1)),
        Err(Violation::OutOfOrder { index: 1, after: 3 })
    );
}

#[test]
fn data_for_a_directory_or_a_finished_file_is_stray() {
    let mut a = Arrivals::new();
    a.announce(0, Shape::Other).unwrap();
    assert_eq!(a.chunk(at(0, 0, 1), 0), Err(Violation::StrayData(0)));

    let mut a = Arrivals::new();
    a.chunk(at(1, 0, 1), 0).unwrap();
    assert_eq!(
        a.announce(1, Shape::Other),
        Err(Violation::StrayData(1)),
        "early data for what turned out a directory"
    );

    let mut a = Arrivals::new();
    a.chunk(at(0, 0, 1), 0).unwrap();
    assert_eq!(
        a.announce(1, file(1, 1)),
        Err(Violation::StrayData(0)),
        "early data for an index that was skipped"
    );

    let mut a = Arrivals::new();
    a.announce(
        0,
        Shape::File {
            size: 2,
            chunk: 1,
            sent: Some(1),
        },
    )
    .unwrap();
    a.chunk(at(0, 0, 1), 0).unwrap();
    assert_eq!(a.chunk(at(0, 1, 1), 1), Err(Violation::StrayData(0)));

    let mut a: Arrivals<u8> = Arrivals::new();
    assert_eq!(
        a.chunk(at(u64::from(u32::MAX) + 1, 0, 1), 0),
        Err(Violation::StrayData(u64::from(u32::MAX) + 1))
    );
}

#[test]
fn a_chunk_must_lie_inside_its_file_on_a_chunk_boundary() {
    let outside = Err(Violation::Outside {
        entry: 0,
        offset: 0,
    });
    for (size, place) in [
        (100, at(0, 0, 101)),                 // longer than a chunk
        (50, at(0, 0, 60)),                   // past the end
        (u64::MAX, at(0, u64::MAX - 10, 20)), // offset + len overflows
    ] {
        let mut a = Arrivals::new();
        a.announce(0, file(size, 100)).unwrap();
        let r = a.chunk(place, 0);
        assert!(
            matches!(r, Err(Violation::Outside { entry: 0, .. })),
            "{place:?}: {r:?}"
        );
    }
    let mut a = Arrivals::new();
    a.announce(0, file(300, 100)).unwrap();
    assert!(matches!(
        a.chunk(at(0, 50, 10), 0),
        Err(Violation::Outside { offset: 50, .. })
    ));
    let mut a = Arrivals::new();
    a.announce(0, file(300, 0)).unwrap();
    assert_eq!(a.chunk(at(0, 0, 0), 0), outside, "a chunk size of 0");
}

#[test]
fn ends_are_checked() {
    let mut a: Arrivals<u8> = Arrivals::new();
    assert_eq!(a.end(0, 0), Err(Violation::EndOfUnknown(0)));
    a.announce(0, file(300, 100)).unwrap();
    a.end(0, 3).unwrap();
    assert_eq!(a.end(0, 3), Err(Violation::EndedTwice(0)));

    let mut a = Arrivals::new();
    a.announce(0, file(300, 100)).unwrap();
    a.chunk(at(0, 0, 100), 0).unwrap();
    a.chunk(at(0, 100, 100), 1).unwrap();
    assert_eq!(
        a.end(0, 1),
        Err(Violation::TooManyChunks { entry: 0, sent: 1 })
    );
}

#[test]
fn after_done_only_data_for_open_files_may_come() {
    let mut a = Arrivals::new();
    a.announce(0, file(100, 100)).unwrap();
    a.end(0, 1).unwrap();
    a.done().unwrap();
    assert!(matches!(
        a.announce(1, Shape::Other),
        Err(Violation::AfterDone { .. })
    ));
    assert!(matches!(a.end(0, 1), Err(Violation::AfterDone { .. })));
    assert!(matches!(a.done(), Err(Violation::AfterDone { .. })));
    assert!(matches!(
        a.chunk(at(5, 0, 1), 0),
        Err(Violation::AfterDone { .. })
    ));
    assert_eq!(
        a.chunk(at(0, 0, 100), 9).unwrap(),
        vec![
            Action::Land {
                entry: 0,
                k: 0,
                chunk: 9
            },
            Action::Finish { entry: 0 }
        ]
    );
    assert!(a.is_over());
}

#[test]
fn chunks_held_when_done_comes_are_stray() {
    let mut a = Arrivals::new();
    a.announce(0, Shape::Other).unwrap();
    a.chunk(at(3, 0, 1), 0).unwrap();
    assert_eq!(a.done(), Err(Violation::StrayData(3)));
}

#[test]
fn unfinished_files_are_listed_for_clean_up() {
    let mut a: Arrivals<u8> = Arrivals::new();
    a.announce(0, file(100, 100)).unwrap();
    a.announce(1, Shape::Other).unwrap();
    a.announce(2, file(100, 100)).unwrap();
    let mut left: Vec<u32> = a.unfinished().collect();
    left.sort_unstable();
    assert_eq!(left, vec![0, 2]);
}

fn passing(size: u64, chunk: u32) -> Shape {
    Shape::Passing { size, chunk }
}

#[test]
fn a_passing_file_checks_and_drops_its_chunks_and_is_never_finished() {
    let mut a = Arrivals::new();
    a.announce(0, passing(250, 100)).unwrap();
    // A chunk that overtook the announcement of a passing file, too.
    a.chunk(at(1, 0, 50), 7).unwrap();
    a.announce(1, passing(50, 100)).unwrap();
    assert_eq!(a.chunk(at(0, 0, 100), 1).unwrap(), vec![]);
    assert_eq!(a.end(0, 3).unwrap(), None);
    assert_eq!(a.chunk(at(0, 200, 50), 3).unwrap(), vec![]);
    assert!(matches!(
        a.chunk(at(0, 250, 100), 9),
        Err(Violation::Outside { entry: 0, .. })
    ));
    assert_eq!(
        a.chunk(at(0, 100, 100), 2).unwrap(),
        vec![],
        "over, and no finish"
    );
    assert_eq!(a.end(1, 1).unwrap(), None, "its one chunk had come");
    a.done().unwrap();
    assert!(a.is_over());
    // Over means over: one more is stray.
    assert!(matches!(
        a.chunk(at(0, 0, 100), 4),
        Err(Violation::StrayData(0))
    ));
}

#[test]
fn a_passing_file_nobody_needed_is_closed_by_done() {
    let mut a: Arrivals<u8> = Arrivals::new();
    a.announce(0, passing(100, 100)).unwrap();
    a.announce(1, file(100, 100)).unwrap();
    a.end(1, 0).unwrap();
    a.done().unwrap();
    assert!(a.is_over(), "no end and no data: nothing was sent");
}

#[test]
fn a_passing_file_with_data_and_no_end_at_done_is_a_violation() {
    let mut a = Arrivals::new();
    a.announce(0, passing(200, 100)).unwrap();
    a.chunk(at(0, 0, 100), 1).unwrap();
    assert_eq!(a.done(), Err(Violation::PassingUnended(0)));
    // More chunks than sent, as for any file.
    let mut a = Arrivals::new();
    a.announce(0, passing(200, 100)).unwrap();
    a.end(0, 1).unwrap();
    a.chunk(at(0, 0, 100), 1).unwrap();
    assert!(matches!(
        a.chunk(at(0, 100, 100), 2),
        Err(Violation::StrayData(0))
    ));
}

#[test]
fn an_abandoned_file_is_dropped_once_the_chunks_sent_have_landed() {
    let mut a = Arrivals::new();
    a.announce(0, file(300, 100)).unwrap();
    a.chunk(at(0, 0, 100), 1).unwrap();
    // Two of its chunks went before the source failed; one is still on
    // its way.
    assert_eq!(a.abandon(0, 2).unwrap(), None);
    let acts = a.chunk(at(0, 100, 100), 2).unwrap();
    assert_eq!(landed(&acts), vec![(0, 1, 2)]);
    assert_eq!(acts.last(), Some(&Action::Drop { entry: 0 }));
    // Nothing of it may come after: it is no open file any more.
    assert!(matches!(
        a.chunk(at(0, 200, 100), 3),
        Err(Violation::StrayData(0))
    ));
    a.done().unwrap();
    assert!(a.is_over());
}

#[test]
fn an_abandoned_file_with_nothing_sent_or_landed_is_dropped_at_once() {
    let mut a: Arrivals<u8> = Arrivals::new();
    a.announce(0, file(300, 100)).unwrap();
    assert_eq!(a.abandon(0, 0).unwrap(), Some(Action::Drop { entry: 0 }));
    // A directory that could not be listed: nothing open, dropped at once.
    a.announce(1, Shape::Other).unwrap();
    assert_eq!(a.abandon(1, 0).unwrap(), Some(Action::Drop { entry: 1 }));
    a.done().unwrap();
    assert!(a.is_over());
}

#[test]
fn an_abandon_the_rules_do_not_allow_is_a_violation() {
    // Of an entry never announced.
    let mut a: Arrivals<u8> = Arrivals::new();
    a.announce(0, file(100, 100)).unwrap();
    assert_eq!(a.abandon(1, 0), Err(Violation::EndOfUnknown(1)));
    // Of a file ended already, or abandoned twice.
    assert_eq!(a.end(0, 1).unwrap(), None);
    assert_eq!(a.abandon(0, 0), Err(Violation::EndedTwice(0)));
    let mut a: Arrivals<u8> = Arrivals::new();
    a.announce(0, file(100, 100)).unwrap();
    a.abandon(0, 1).unwrap();
    assert_eq!(a.abandon(0, 1), Err(Violation::EndedTwice(0)));
    // Chunks sent of an entry that holds no data.
    a.announce(1, Shape::Other).unwrap();
    assert!(matches!(
        a.abandon(1, 2),
        Err(Violation::TooManyChunks { entry: 1, .. })
    ));
    // With nothing open, only the entry announced last, and once.
    a.announce(2, Shape::Other).unwrap();
    assert_eq!(a.abandon(1, 0), Err(Violation::EndOfUnknown(1)));
    assert_eq!(a.abandon(2, 0).unwrap(), Some(Action::Drop { entry: 2 }));
    assert_eq!(a.abandon(2, 0), Err(Violation::EndedTwice(2)));
    // Not a file that finished at its announcement (found by fuzzing:
    // it was finished, then dropped).
    let whole = Shape::File {
        size: 0,
        chunk: 100,
        sent: Some(0),
    };
    assert_eq!(
        a.announce(3, whole).unwrap(),
        vec![Action::Finish { entry: 3 }]
    );
    assert_eq!(a.abandon(3, 0), Err(Violation::EndOfUnknown(3)));
    // A passing file abandoned: closed without a word once its chunks
    // landed (the nodes that wanted it say it failed).
    let mut a = Arrivals::new();
    a.announce(
        0,
        Shape::Passing {
            size: 200,
            chunk: 100,
        },
    )
    .unwrap();
    assert_eq!(a.abandon(0, 1).unwrap(), None);
    assert_eq!(a.chunk(at(0, 0, 100), 1).unwrap(), vec![]);
    a.done().unwrap();
    assert!(a.is_over());
    // After the sender's Done.
    let mut a: Arrivals<u8> = Arrivals::new();
    a.announce(0, file(100, 100)).unwrap();
    a.done().unwrap();
    assert!(matches!(a.abandon(0, 0), Err(Violation::AfterDone { .. })));
}
