use super::*;

fn update(grant_limit: u64, control_return: u32) -> CreditUpdate {
    CreditUpdate {
        grant_limit,
        control_return,
    }
}

#[test]
fn sender_stops_at_the_ring_and_resumes_on_grant() {
    let mut out = Outbound::new(4, 8);
    let tickets: Vec<_> = std::iter::from_fn(|| out.try_slot()).collect();
    assert_eq!(
        tickets.iter().map(|t| t.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert_eq!(
        tickets.iter().map(|t| t.index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert_eq!(out.try_slot(), None);
    out.on_update(update(6, 0)).unwrap();
    assert_eq!(out.slots_available(), 2);
    let t = out.try_slot().unwrap();
    assert_eq!((t.seq, t.index, t.note), (4, 0, 4));
}

#[test]
fn sender_rejects_grants_that_go_backwards_or_too_far() {
    let mut out = Outbound::new(4, 8);
    assert_eq!(
        out.on_update(update(3, 0)),
        Err(CreditError::GrantBackwards { old: 4, new: 3 })
    );
    // Nothing sent yet: the peer cannot have consumed anything.
    assert_eq!(
        out.on_update(update(5, 0)),
        Err(CreditError::GrantTooFar {
            limit: 5,
            sent: 0,
            ring: 4
        })
    );
    out.try_slot().unwrap();
    out.on_update(update(5, 0)).unwrap();
}

#[test]
fn sender_rejects_control_credits_it_never_spent() {
    let mut out = Outbound::new(4, 8);
    // The hello spent one.
    assert_eq!(
        out.on_update(update(4, 2)),
        Err(CreditError::ControlOverReturn {
            returned: 2,
            outstanding: 1
        })
    );
    out.on_update(update(4, 1)).unwrap();
    assert_eq!(out.control_available(), 8);
}

#[test]
fn control_credits_run_out_and_come_back() {
    let mut out = Outbound::new(1, 4);
    // 3 left after the hello.
    assert!(out.try_control());
    assert!(out.try_control());
    assert!(out.try_control());
    assert!(!out.try_control());
    out.on_update(update(1, 2)).unwrap();
    assert!(out.try_control());
}

#[test]
fn receiver_accepts_each_granted_slot_once_in_place() {
    let mut inb = Inbound::new(4, 100, 8);
    assert_eq!(
        inb.on_landed(1, Some(100), 100),
        Ok(Landing { seq: 1, index: 1 })
    );
    assert_eq!(
        inb.on_landed(1, Some(100), 10),
        Err(CreditError::SlotBusy { seq: 1 })
    );
    assert_eq!(
        inb.on_landed(2, Some(100), 10),
        Err(CreditError::WrongPlace {
            seq: 2,
            offset: 100,
            len: 10
        })
    );
    assert_eq!(
        inb.on_landed(3, Some(300), 101),
        Err(CreditError::WrongPlace {
            seq: 3,
            offset: 300,
            len: 101
        })
    );
    assert_eq!(
        inb.on_landed(4, Some(0), 10),
        Err(CreditError::NoCredit {
            note: 4,
            base: 0,
            limit: 4
        })
    );
    // A note from before the window wraps to far ahead: refused too.
    assert!(matches!(
        inb.on_landed(u32::MAX, Some(0), 1),
        Err(CreditError::NoCredit { .. })
    ));
}

#[test]
fn out_of_order_consumption_grants_only_the_contiguous_prefix() {
    let mut inb = Inbound::new(4, 10, 8);
    for note in 0..4 {
        inb.on_landed(note, Some(u64::from(note) * 10), 10).unwrap();
    }
    inb.on_consumed(2);
    inb.on_consumed(1);
    assert_eq!(inb.base(), 0);
    assert_eq!(inb.take_update().grant_limit, 4);
    inb.on_consumed(0);
    assert_eq!(inb.base(), 3);
    let up = inb.take_update();
    assert_eq!(up.grant_limit, 7);
    // Slot 0 is open again for chunk 4; slot 3 still holds chunk 3.
    assert_eq!(
        inb.on_landed(4, Some(0), 10),
        Ok(Landing { seq: 4, index: 0 })
    );
    assert_eq!(
        inb.on_landed(7, Some(30), 10).unwrap_err(),
        CreditError::NoCredit {
            note: 7,
            base: 3,
            limit: 7
        }
    );
}

#[test]
fn standalone_update_is_due_at_half_a_ring() {
    let mut inb = Inbound::new(8, 10, 8);
    inb.take_update(); // return the hello's credit
    assert!(!inb.wants_standalone());
    for note in 0..4 {
        inb.on_landed(note, Some(u64::from(note) * 10), 10).unwrap();
    }
    for seq in 0..3 {
        inb.on_consumed(seq);
    }
    assert!(!inb.wants_standalone());
    inb.on_consumed(3);
    assert!(inb.wants_standalone());
    assert_eq!(inb.take_update(), update(12, 0));
    assert!(!inb.wants_standalone());
}

#[test]
fn control_credits_are_counted_and_returned() {
    let mut inb = Inbound::new(0, 0, 4);
    // The hello is owed back: one of four.
    assert!(!inb.wants_standalone());
    inb.on_control_received().unwrap();
    inb.on_control_received().unwrap();
    inb.on_control_received().unwrap();
    assert_eq!(
        inb.on_control_received(),
        Err(CreditError::ControlOverrun { depth: 4 })
    );
    inb.on_control_consumed();
    // Held 2, owed 2 = half the depth.
    assert!(inb.wants_standalone());
    assert_eq!(inb.take_update(), update(0, 2));
    inb.on_control_consumed();
    inb.on_control_consumed();
    assert_eq!(inb.take_update(), update(0, 2));
}

#[test]
fn a_starved_peer_gets_even_a_single_credit_back() {
    let mut inb = Inbound::new(0, 0, 8);
    inb.take_update();
    for _ in 0..7 {
        inb.on_control_received().unwrap();
    }
    inb.on_control_received().unwrap();
    assert!(
        !inb.wants_standalone(),
        "nothing consumed, nothing to return"
    );
    inb.on_control_consumed();
    assert!(inb.wants_standalone());
}

#[test]
fn without_an_offset_the_note_alone_names_the_slot() {
    let mut inb = Inbound::new(4, 100, 8);
    assert_eq!(
        inb.on_landed(2, None, 100),
        Ok(Landing { seq: 2, index: 2 })
    );
    assert_eq!(
        inb.on_landed(2, None, 100),
        Err(CreditError::SlotBusy { seq: 2 })
    );
    assert!(matches!(
        inb.on_landed(3, None, 101),
        Err(CreditError::WrongPlace { .. })
    ));
}

#[test]
fn zero_slot_ring_refuses_every_note() {
    let mut inb = Inbound::new(0, 0, 4);
    assert!(matches!(
        inb.on_landed(0, Some(0), 0),
        Err(CreditError::NoCredit { .. })
    ));
}
