//! rblock connect's table of requests in flight
//! ([`rblock::fabric::requests`]) and its lane clock
//! ([`rblock::fabric::redial`]), driven by whatever a server and the
//! network could do: never a panic; every waiter comes back exactly once
//! (answered, or handed back when the link fails); a read is answered
//! with data only once all its bytes came, in order; the clock never
//! lets a request wait past the moment its outage began plus give-up.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use rblock::fabric::redial::{LaneClock, Wait};
use rblock::fabric::requests::{Expect, Outcome, Requests, Said};

fuzz_target!(|data: &[u8]| {
    let mut table: Requests<usize> = Requests::new();
    // Per waiter: the read's length (None: not a read), bytes in.
    let mut reads: Vec<(Option<u64>, u64)> = Vec::new();
    let mut back = Vec::<u32>::new();
    let mut ids = Vec::new();
    let t0 = Instant::now();
    let give_up = Duration::from_millis(500);
    let mut clock = LaneClock::up(give_up);
    let mut now = t0;
    let mut down_since: Option<Instant> = None;
    let mut it = data.chunks_exact(3);
    for op in &mut it {
        let (a, b) = (u64::from(op[1]), u64::from(op[2]));
        match op[0] % 8 {
            0 | 1 => {
                let w = reads.len();
                let expect = if op[0] % 8 == 0 {
                    reads.push((Some(a), 0));
                    Expect::Read { len: a }
                } else {
                    reads.push((None, 0));
                    Expect::Reply
                };
                back.push(0);
                match table.enlist(expect, w) {
                    Ok(id) => ids.push(id),
                    Err(w) => back[w] += 1,
                }
            }
            2 => {
                let id = ids.get(a as usize % ids.len().max(1)).copied().unwrap_or(a);
                let r = table.data(id, b, a % 17, |w| reads[*w].1 += a % 17);
                if let Ok(Some(w)) = r {
                    assert_eq!(Some(reads[w].1), reads[w].0, "a read done early");
                    back[w] += 1;
                }
            }
            3 | 4 => {
                let id = ids.get(a as usize % ids.len().max(1)).copied().unwrap_or(a);
                let said = if op[0] % 8 == 3 {
                    Said::Reply {
                        error: (b % 3) as u32,
                    }
                } else {
                    Said::Extents(Vec::new())
                };
                if let Ok((w, outcome)) = table.answer(id, said) {
                    if outcome == Outcome::Data {
                        assert_eq!(Some(reads[w].1), reads[w].0, "a read done early");
                    }
                    back[w] += 1;
                }
            }
            5 => {
                for w in table.fail_all() {
                    back[w] += 1;
                }
                // The next link.
                table = Requests::new();
                ids.clear();
                clock.lost(now);
                down_since.get_or_insert(now);
            }
            6 => {
                now += Duration::from_millis(a * 8);
                match clock.wait(now) {
                    Wait::Up => assert!(down_since.is_none()),
                    Wait::Until(deadline) => {
                        let since = down_since.expect("down");
                        assert_eq!(deadline, since + give_up);
                        assert!(now < deadline);
                    }
                    Wait::GiveUp => assert!(now >= down_since.expect("down") + give_up),
                }
            }
            _ => {
                if b % 2 == 0 {
                    clock.connected();
                    down_since = None;
                } else {
                    let next = clock.dial_failed(now);
                    assert!(next > now && next <= now + Duration::from_secs(5));
                }
            }
        }
    }
    for w in table.fail_all() {
        back[w] += 1;
    }
    assert!(
        back.iter().all(|&n| n == 1),
        "a waiter lost or doubled: {back:?}"
    );
});
