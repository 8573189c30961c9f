use super::*;

fn read(len: u64) -> Expect {
    Expect::Read { len }
}

#[test]
fn ids_are_fresh_and_a_read_completes_with_its_last_byte() {
    let mut r: Requests<Vec<u8>> = Requests::new();
    let a = r.enlist(read(6), Vec::new()).unwrap();
    let b = r.enlist(Expect::Reply, Vec::new()).unwrap();
    assert_ne!(a, b);
    assert_eq!(r.len(), 2);
    let piece = |w: &mut Vec<u8>| w.extend_from_slice(b"abc");
    assert_eq!(r.data(a, 0, 3, piece).unwrap(), None);
    assert_eq!(r.data(a, 3, 3, piece).unwrap(), Some(b"abcabc".to_vec()));
    assert_eq!(r.len(), 1);
    assert_eq!(
        r.answer(a, Said::Reply { error: 0 }),
        Err(Violation::NotInFlight(a)),
        "a read is answered by its data, once"
    );
}

#[test]
fn replies_and_extents_answer_their_requests() {
    let mut r = Requests::new();
    let w = r.enlist(Expect::Reply, 'w').unwrap();
    let s = r.enlist(Expect::Reply, 's').unwrap();
    let z = r.enlist(read(0), 'z').unwrap();
    let e = vec![Extent {
        length: 4096,
        flags: 1,
    }];
    assert_eq!(
        r.answer(s, Said::Extents(e.clone())),
        Ok(('s', Outcome::Extents(e)))
    );
    assert_eq!(
        r.answer(w, Said::Reply { error: 5 }),
        Ok(('w', Outcome::Done { error: 5 }))
    );
    assert_eq!(
        r.answer(z, Said::Reply { error: 0 }),
        Ok(('z', Outcome::Data)),
        "an empty read is answered by a reply"
    );
    assert!(r.is_empty());
}

#[test]
fn a_read_may_fail_after_part_of_its_data() {
    let mut r = Requests::new();
    let a = r.enlist(read(8), 0u32).unwrap();
    r.data(a, 0, 4, |w| *w += 4).unwrap();
    assert_eq!(
        r.answer(a, Said::Reply { error: 5 }),
        Ok((4, Outcome::Done { error: 5 }))
    );
}

#[test]
fn data_out_of_place_or_for_no_read_is_refused() {
    let mut r = Requests::new();
    let a = r.enlist(read(8), ()).unwrap();
    let w = r.enlist(Expect::Reply, ()).unwrap();
    let mut appended = 0;
    for (offset, len) in [(4, 4), (0, 9)] {
        assert!(matches!(
            r.data(a, offset, len, |()| appended += 1),
            Err(Violation::OutOfPlace { .. })
        ));
    }
    assert_eq!(
        r.data(w, 0, 1, |()| appended += 1),
        Err(Violation::NotARead(w))
    );
    assert_eq!(
        r.data(99, 0, 1, |()| appended += 1),
        Err(Violation::NotARead(99))
    );
    assert_eq!(appended, 0, "nothing refused reaches the waiter");
    r.data(a, 0, 4, |()| appended += 1).unwrap();
    assert!(matches!(
        r.data(a, 0, 4, |()| appended += 1),
        Err(Violation::OutOfPlace { got: 4, .. })
    ));
}

#[test]
fn success_before_the_data_and_extents_for_a_read_are_refused() {
    let mut r = Requests::new();
    let a = r.enlist(read(8), ()).unwrap();
    r.data(a, 0, 4, |()| {}).unwrap();
    assert_eq!(
        r.answer(a, Said::Reply { error: 0 }),
        Err(Violation::DoneBeforeData(a))
    );
    let b = r.enlist(read(8), ()).unwrap();
    assert_eq!(
        r.answer(b, Said::Extents(vec![])),
        Err(Violation::ExtentsForRead(b))
    );
}

#[test]
fn a_failed_link_hands_back_every_waiter_and_takes_no_more() {
    let mut r = Requests::new();
    for w in 0..5u32 {
        r.enlist(if w % 2 == 0 { read(1) } else { Expect::Reply }, w)
            .unwrap();
    }
    let (one, _) = r.answer(2, Said::Reply { error: 0 }).unwrap();
    assert_eq!(one, 1);
    let mut back = r.fail_all();
    back.sort_unstable();
    assert_eq!(back, vec![0, 2, 3, 4]);
    assert_eq!(r.enlist(Expect::Reply, 9), Err(9));
    assert!(r.fail_all().is_empty(), "each waiter comes back once");
    assert_eq!(
        r.answer(1, Said::Reply { error: 0 }),
        Err(Violation::NotInFlight(1))
    );
}
