//! Seeded simulations of the forwarding side's two machines: the table of
//! requests in flight on a link ([`rblock::fabric::requests`]) and a lane's
//! redial and give-up clock ([`rblock::fabric::redial`]).
//!
//! The table: a model server answers a random workload (reads cut into
//! random pieces, writes, flushes, block status) in a random order, and
//! the link fails at random moments; what was in flight is asked again on
//! the next link, as `rblock connect` does. Every request must end exactly
//! once, with what the server answered it (a read with exactly its bytes),
//! however many links it took. With one planted fault (an answer twice,
//! read data out of place or for no read, success before a read's data,
//! extents for a read, an answer to no request) the table must refuse, and
//! must not have handed the fault to a waiter.
//!
//! The clock: a lane's link fails at random times, dials take random
//! times and fail at random, requests come at random times. Checked
//! against a reference computed from the outages alone: a request fails
//! exactly when its outage lasts `give_up` from its start (and then at
//! that moment, or at once if it came later), is served when the link
//! comes back otherwise, and never fails while the lane is up; the waits
//! between dials of one outage are 100 ms, doubling, at most 5 s.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rblock::fabric::redial::{LaneClock, Wait};
use rblock::fabric::requests::{Expect, Outcome, Requests, Said};
use rblock::nbd::transmission::Extent;

const SCHEDULES: u64 = 10_000;

/// One request of the workload and what the server answers it.
#[derive(Debug, Clone)]
enum Job {
    Read { len: u64, pieces: Vec<u64> },
    Reply { error: u32 },
    Status { extents: Vec<Extent> },
}

/// The bytes a read of request `r` carries: a pattern of its own.
fn byte(r: usize, at: u64) -> u8 {
    (r as u64 * 31 + at * 7) as u8
}

fn workload(rng: &mut SmallRng) -> Vec<Job> {
    (0..rng.random_range(1..=24))
        .map(|_| match rng.random_range(0..4) {
            0 | 1 => {
                let len = rng.random_range(0..=64u64);
                let mut pieces = Vec::new();
                let mut left = len;
                while left > 0 {
                    let p = rng.random_range(1..=left);
                    pieces.push(p);
                    left -= p;
                }
                Job::Read { len, pieces }
            }
            2 => Job::Reply {
                error: if rng.random_bool(0.2) { 5 } else { 0 },
            },
            _ => Job::Status {
                extents: vec![Extent {
                    length: rng.random_range(1..=1 << 20),
                    flags: rng.random_range(0..4),
                }],
            },
        })
        .collect()
}

/// What the server sends for one request: its read pieces, then (for an
/// empty read, or anything but a read) its answer.
#[derive(Debug, Clone)]
enum Send {
    Data { id: u64, offset: u64, len: u64 },
    Answer { id: u64, said: Said },
}

fn sends_for(job: &Job, id: u64) -> VecDeque<Send> {
    let mut out = VecDeque::new();
    match job {
        Job::Read { len, pieces } => {
            let mut offset = 0;
            for &p in pieces {
                out.push_back(Send::Data { id, offset, len: p });
                offset += p;
            }
            if *len == 0 {
                out.push_back(Send::Answer {
                    id,
                    said: Said::Reply { error: 0 },
                });
            }
        }
        Job::Reply { error } => out.push_back(Send::Answer {
            id,
            said: Said::Reply { error: *error },
        }),
        Job::Status { extents } => out.push_back(Send::Answer {
            id,
            said: Said::Extents(extents.clone()),
        }),
    }
    out
}

/// The waiter: which request, and the read bytes in so far.
#[derive(Debug)]
struct Waiter {
    job: usize,
    bytes: Vec<u8>,
}

fn expect(job: &Job) -> Expect {
    match job {
        Job::Read { len, .. } => Expect::Read { len: *len },
        _ => Expect::Reply,
    }
}

/// Checks that request `w.job` ended as its job says it must.
fn check_outcome(seed: u64, jobs: &[Job], w: &Waiter, outcome: &Outcome) {
    match (&jobs[w.job], outcome) {
        (Job::Read { len, .. }, Outcome::Data) => {
            let want: Vec<u8> = (0..*len).map(|at| byte(w.job, at)).collect();
            assert_eq!(w.bytes, want, "seed {seed}: read {} bytes", w.job);
        }
        (Job::Reply { error }, Outcome::Done { error: e }) => {
            assert_eq!(error, e, "seed {seed}")
        }
        (Job::Status { extents }, Outcome::Extents(e)) => assert_eq!(extents, e, "seed {seed}"),
        (job, o) => panic!("seed {seed}: {job:?} ended {o:?}"),
    }
}

#[test]
fn every_request_ends_once_with_its_answer_across_failing_links() {
    for seed in 0..SCHEDULES {
        let mut rng = SmallRng::seed_from_u64(seed);
        let jobs = workload(&mut rng);
        let mut ended = vec![false; jobs.len()];
        let mut to_ask: Vec<usize> = (0..jobs.len()).collect();
        let mut links = 0;
        while !to_ask.is_empty() {
            links += 1;
            assert!(links < 100, "seed {seed}: no progress");
            let mut table = Requests::new();
            // The server's queue per request; it answers the requests in a
            // random interleaving.
            let mut queues = Vec::new();
            for job in to_ask.drain(..) {
                let w = Waiter {
                    job,
                    bytes: Vec::new(),
                };
                let id = table.enlist(expect(&jobs[job]), w).expect("a live link");
                queues.push(sends_for(&jobs[job], id));
            }
            // The link fails after a random number of sends (or never).
            let fail_after = rng
                .random_bool(0.5)
                .then(|| rng.random_range(0..=jobs.len() * 2));
            let mut sent = 0;
            loop {
                let live: Vec<usize> = (0..queues.len())
                    .filter(|&q| !queues[q].is_empty())
                    .collect();
                if live.is_empty() || fail_after == Some(sent) {
                    break;
                }
                let q = live[rng.random_range(0..live.len())];
                let send = queues[q].pop_front().expect("non-empty");
                sent += 1;
                let done = match send {
                    Send::Data { id, offset, len } => table
                        .data(id, offset, len, |w: &mut Waiter| {
                            let job = w.job;
                            w.bytes
                                .extend((offset..offset + len).map(|at| byte(job, at)));
                        })
                        .unwrap_or_else(|v| panic!("seed {seed}: {v}"))
                        .map(|w| (w, Outcome::Data)),
                    Send::Answer { id, said } => Some(
                        table
                            .answer(id, said)
                            .unwrap_or_else(|v| panic!("seed {seed}: {v}")),
                    ),
                };
                if let Some((w, outcome)) = done {
                    check_outcome(seed, &jobs, &w, &outcome);
                    assert!(!ended[w.job], "seed {seed}: request {} twice", w.job);
                    ended[w.job] = true;
                }
            }
            // Whatever is unanswered is asked again on the next link.
            let back = table.fail_all();
            assert!(
                table
                    .enlist(
                        Expect::Reply,
                        Waiter {
                            job: 0,
                            bytes: vec![]
                        }
                    )
                    .is_err()
            );
            to_ask.extend(back.into_iter().map(|w| w.job));
        }
        assert!(ended.iter().all(|&e| e), "seed {seed}: requests lost");
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    AnswerTwice,
    DataOutOfPlace,
    DataForNoRead,
    DoneBeforeData,
    ExtentsForRead,
    AnswerToNobody,
}

const FAULTS: [Fault; 6] = [
    Fault::AnswerTwice,
    Fault::DataOutOfPlace,
    Fault::DataForNoRead,
    Fault::DoneBeforeData,
    Fault::ExtentsForRead,
    Fault::AnswerToNobody,
];

#[test]
fn a_server_breaking_a_rule_is_refused_before_any_waiter_sees_it() {
    let mut planted = [0u32; FAULTS.len()];
    for seed in 0..SCHEDULES {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0xfa17);
        let jobs = workload(&mut rng);
        let f = seed as usize % FAULTS.len();
        let mut table = Requests::new();
        let mut queues = Vec::new();
        let mut ids = Vec::new();
        for (job, j) in jobs.iter().enumerate() {
            let w = Waiter {
                job,
                bytes: Vec::new(),
            };
            let id = table.enlist(expect(j), w).expect("a live link");
            ids.push(id);
            queues.push(sends_for(j, id));
        }
        let reads: Vec<usize> = (0..jobs.len())
            .filter(|&j| matches!(jobs[j], Job::Read { len, .. } if len > 1))
            .collect();
        let others: Vec<usize> = (0..jobs.len())
            .filter(|&j| !matches!(jobs[j], Job::Read { .. }))
            .collect();
        let pick =
            |rng: &mut SmallRng, v: &[usize]| v.get(rng.random_range(0..v.len().max(1))).copied();
        let ok = match FAULTS[f] {
            Fault::AnswerTwice => pick(&mut rng, &others).map(|j| {
                let again = queues[j].back().expect("an answer").clone();
                queues[j].push_back(again);
            }),
            Fault::DataOutOfPlace => pick(&mut rng, &reads).map(|j| {
                if let Some(Send::Data { offset, len, .. }) = queues[j].front_mut() {
                    if rng.random_bool(0.5) {
                        *offset += 1;
                    } else {
                        *len += 1000;
                    }
                }
            }),
            Fault::DataForNoRead => pick(&mut rng, &others).map(|j| {
                queues[j].push_front(Send::Data {
                    id: ids[j],
                    offset: 0,
                    len: 1,
                });
            }),
            Fault::DoneBeforeData => pick(&mut rng, &reads).map(|j| {
                queues[j].push_front(Send::Answer {
                    id: ids[j],
                    said: Said::Reply { error: 0 },
                });
            }),
            Fault::ExtentsForRead => pick(&mut rng, &reads).map(|j| {
                let at = rng.random_range(0..=queues[j].len() - 1);
                queues[j].insert(
                    at,
                    Send::Answer {
                        id: ids[j],
                        said: Said::Extents(vec![]),
                    },
                );
            }),
            Fault::AnswerToNobody => {
                queues[0].push_back(Send::Answer {
                    id: 1_000_000,
                    said: Said::Reply { error: 0 },
                });
                Some(())
            }
        };
        if ok.is_none() {
            continue;
        }
        planted[f] += 1;
        let mut refused = false;
        let mut ended = vec![false; jobs.len()];
        loop {
            let live: Vec<usize> = (0..queues.len())
                .filter(|&q| !queues[q].is_empty())
                .collect();
            if live.is_empty() {
                break;
            }
            let q = live[rng.random_range(0..live.len())];
            let r = match queues[q].pop_front().expect("non-empty") {
                Send::Data { id, offset, len } => table
                    .data(id, offset, len, |w: &mut Waiter| {
                        let job = w.job;
                        w.bytes
                            .extend((offset..offset + len).map(|at| byte(job, at)));
                    })
                    .map(|d| d.map(|w| (w, Outcome::Data))),
                Send::Answer { id, said } => table.answer(id, said).map(Some),
            };
            match r {
                Ok(Some((w, outcome))) => {
                    check_outcome(seed, &jobs, &w, &outcome);
                    ended[w.job] = true;
                }
                Ok(None) => {}
                Err(_) => {
                    refused = true;
                    break;
                }
            }
        }
        assert!(refused, "seed {seed}: {:?} went unnoticed", FAULTS[f]);
        // The link is given up: every request not answered comes back.
        for w in table.fail_all() {
            assert!(!ended[w.job], "seed {seed}: request {} back twice", w.job);
            ended[w.job] = true;
        }
        assert!(ended.iter().all(|&e| e), "seed {seed}: a waiter lost");
    }
    for (f, n) in FAULTS.iter().zip(planted) {
        assert!(n > 500, "{f:?} planted only {n} times");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// (Order at one moment: the link's news before a deadline.)
    LinkFails,
    DialDone {
        ok: bool,
    },
    DialStart,
    Request(usize),
    Deadline(usize),
}

#[test]
fn requests_give_up_exactly_when_an_outage_outlasts_give_up() {
    for seed in 0..SCHEDULES {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0xc10c);
        let t0 = Instant::now();
        let ms = |m: u64| t0 + Duration::from_millis(m);
        let give_up_ms = rng.random_range(50..=8000u64);
        let give_up = Duration::from_millis(give_up_ms);
        let dial_ok = rng.random_range(0.05..0.9);
        let mut clock = LaneClock::up(give_up);
        let mut up = true;
        let mut queue = BinaryHeap::new();
        let at = |q: &mut BinaryHeap<_>, t: u64, e: Event| q.push(Reverse((t, e)));
        at(&mut queue, rng.random_range(1..3000), Event::LinkFails);
        let requests = rng.random_range(1..=40);
        for r in 0..requests {
            at(&mut queue, rng.random_range(0..60_000), Event::Request(r));
        }
        // Outages as [start, end); a request's (arrival, how it ended).
        let mut outages: Vec<(u64, Option<u64>)> = Vec::new();
        let mut failures_this_outage = 0u32;
        let mut waiting: HashMap<usize, u64> = HashMap::new();
        let mut ended: Vec<Option<(u64, bool)>> = vec![None; requests];
        let mut arrived = vec![0u64; requests];
        while let Some(Reverse((t, e))) = queue.pop() {
            if t > 120_000 {
                break;
            }
            match e {
                Event::LinkFails => {
                    assert!(up);
                    up = false;
                    clock.lost(ms(t));
                    outages.push((t, None));
                    failures_this_outage = 0;
                    at(&mut queue, t, Event::DialStart);
                }
                Event::DialStart => {
                    at(
                        &mut queue,
                        t + rng.random_range(0..300),
                        Event::DialDone {
                            ok: rng.random_bool(dial_ok),
                        },
                    );
                }
                Event::DialDone { ok: true } => {
                    up = true;
                    clock.connected();
                    outages.last_mut().expect("an outage").1 = Some(t);
                    for (r, _) in waiting.drain() {
                        ended[r] = Some((t, true));
                    }
                    at(&mut queue, t + rng.random_range(1..5000), Event::LinkFails);
                }
                Event::DialDone { ok: false } => {
                    let next = clock.dial_failed(ms(t));
                    let want = (100u64 << failures_this_outage.min(6)).min(5000);
                    assert_eq!(next, ms(t + want), "seed {seed}: backoff");
                    failures_this_outage += 1;
                    at(&mut queue, t + want, Event::DialStart);
                }
                Event::Request(r) => {
                    arrived[r] = t;
                    match clock.wait(ms(t)) {
                        Wait::Up => {
                            assert!(up, "seed {seed}: up while down");
                            ended[r] = Some((t, true));
                        }
                        Wait::Until(deadline) => {
                            assert!(!up, "seed {seed}: waiting while up");
                            let d = (deadline - t0).as_millis() as u64;
                            waiting.insert(r, d);
                            at(&mut queue, d, Event::Deadline(r));
                        }
                        Wait::GiveUp => {
                            assert!(!up, "seed {seed}: gave up while up");
                            ended[r] = Some((t, false));
                        }
                    }
                }
                Event::Deadline(r) => {
                    if waiting.remove(&r).is_some() {
                        // The waiter looks again, as `session()` does.
                        assert_eq!(clock.wait(ms(t)), Wait::GiveUp, "seed {seed}");
                        ended[r] = Some((t, false));
                    }
                }
            }
        }
        // The reference: from the outages alone.
        for r in 0..requests {
            let Some((when, served)) = ended[r] else {
                continue; // still waiting when the simulation stopped
            };
            let t = arrived[r];
            let outage = outages
                .iter()
                .find(|&&(s, e)| s <= t && e.is_none_or(|e| t < e));
            match outage {
                None => assert!(served && when == t, "seed {seed}: request {r} while up"),
                Some(&(s, e)) => {
                    let deadline = s + give_up_ms;
                    let lasted = e.is_none_or(|e| e > deadline);
                    if served {
                        let e = e.expect("served by a link");
                        assert!(e <= deadline, "seed {seed}: served after give-up");
                        assert_eq!(when, e, "seed {seed}: served late");
                    } else {
                        assert!(
                            lasted || e == Some(deadline),
                            "seed {seed}: request {r} gave up in a short outage"
                        );
                        assert_eq!(
                            when,
                            t.max(deadline),
                            "seed {seed}: gave up at the wrong time"
                        );
                    }
                }
            }
        }
    }
}
