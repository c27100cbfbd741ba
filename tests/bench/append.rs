//! Figure 4, ledger appends with synchronous=FULL: events a second through
//! the library's writer thread with group commit, with 64 batches of 16
//! events kept in flight (a reactor's worth of producers), against a plain
//! loop of INSERT transactions in rusqlite on the same settings and table,
//! each transaction as large as the writer's groups turned out to be.
//!
//! The writer thread runs on core 0; the producer on core 0 (pinned) or core
//! 1 (spread). The baseline has one thread and runs on core 0.

use serde_json::json;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use omniconfluxd::ledger::{Batch, Committed, Ledger, Op};
use rusqlite::{Connection, params};

use crate::util::{self, Figure, Placement, TempDir};

pub const FIGURE: &str = "ledger_append_vs_insert";

const IN_FLIGHT: usize = 64;
const BATCH_EVENTS: usize = 16;
const STREAMS: usize = 64;
const TS: &str = "2026-01-01T00:00:00.000Z";

/// The ledger's `events` table, as migration 1 of src/ledger/schema.rs
/// creates it.
const EVENTS_DDL: &str = "CREATE TABLE events (
    stream TEXT NOT NULL,
    seq    INTEGER NOT NULL CHECK (seq >= 1),
    kind   TEXT NOT NULL,
    ts     TEXT NOT NULL,
    data   TEXT NOT NULL,
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;";

pub fn run() {
    if !util::selected(FIGURE) {
        return;
    }
    let rounds = util::rounds(7, 2);
    let window = if util::quick() {
        Duration::from_millis(600)
    } else {
        Duration::from_millis(1500)
    };
    for placement in util::placements() {
        let (mut v, mut b, mut groups) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let r = (|| -> Result<(), String> {
                let (rate, g) = ledger_round(placement, window)?;
                v.push(rate);
                groups.extend(g);
                let txn = (util::median(&groups).round() as usize).max(1);
                b.push(util::on_cpu(0, || insert_round(txn, window))?);
                Ok(())
            })();
            if let Err(e) = r {
                util::skipped(FIGURE, Some(placement.name()), &format!("error: {e}"));
                return;
            }
        }
        let (val, base) = (util::median(&v), util::median(&b));
        let ratio = val / base;
        Figure {
            name: FIGURE,
            placement: Some(placement.name()),
            value: val,
            baseline: Some(base),
            baseline_of: "rusqlite INSERT loop, WAL, synchronous=FULL, transactions of the writer's median group",
            ratio: Some(ratio),
            better: "higher",
            goal: json!("ratio >= 0.7"),
            unit: "events/s",
            pass: ratio >= 0.7,
            rounds,
            extra: vec![
                ("group_events_median", json!(util::median(&groups))),
                ("in_flight", json!(format!("{IN_FLIGHT} batches of {BATCH_EVENTS} events"))),
                ("value_spread", util::round3(util::spread(&v))),
                ("baseline_spread", util::round3(util::spread(&b))),
            ],
        }
        .emit();
    }
}

fn event(batch_no: usize, i: usize) -> (String, String) {
    (
        format!("x-bench-{:02}", batch_no % STREAMS),
        format!("{{\"batch\":{batch_no},\"i\":{i},\"text\":\"a small benchmark event\"}}"),
    )
}

/// Events a second committed through the writer for `window`, and the
/// events of each commit group.
fn ledger_round(placement: Placement, window: Duration) -> Result<(f64, Vec<f64>), String> {
    let tmp = TempDir::new("append");
    let (tx, rx) = mpsc::channel::<(usize, usize, usize)>();
    // Opened on core 0 so that the writer thread it starts stays there.
    let ledger = util::on_cpu(0, || {
        Ledger::open(
            &tmp.path().join("ledger.sqlite3"),
            Box::new(move |cs: Vec<Committed>| {
                let ok: usize = cs
                    .iter()
                    .map(|c| c.result.as_ref().map_or(0, Vec::len))
                    .sum();
                let failed = cs.iter().filter(|c| c.result.is_err()).count();
                let _ = tx.send((cs.len(), ok, failed));
            }),
        )
    })
    .map_err(|e| e.0)?;
    let result = util::on_cpu(
        placement.client_cpu(),
        || -> Result<(f64, Vec<f64>), String> {
            let mut groups = Vec::new();
            let (mut in_flight, mut batch_no, mut events) = (0usize, 0usize, 0usize);
            let t0 = Instant::now();
            loop {
                if t0.elapsed() < window {
                    while in_flight < IN_FLIGHT {
                        let ops = (0..BATCH_EVENTS)
                            .map(|i| {
                                let (stream, data) = event(batch_no, i);
                                Op::Event {
                                    stream,
                                    kind: "tool.call".into(),
                                    ts: TS.into(),
                                    data,
                                }
                            })
                            .collect();
                        ledger
                            .submit(Batch {
                                ticket: batch_no as u64,
                                ops,
                            })
                            .map_err(|e| format!("submit: {e:?}"))?;
                        batch_no += 1;
                        in_flight += 1;
                    }
                }
                if in_flight == 0 {
                    break;
                }
                let (batches, ok, failed) = rx.recv().map_err(|e| e.to_string())?;
                if failed > 0 {
                    return Err(format!("{failed} batches failed to commit"));
                }
                in_flight -= batches;
                events += ok;
                groups.push(ok as f64);
            }
            Ok((events as f64 / t0.elapsed().as_secs_f64(), groups))
        },
    );
    ledger.close();
    result
}

/// Events a second of a plain INSERT loop in transactions of `txn` events.
fn insert_round(txn: usize, window: Duration) -> Result<f64, String> {
    let tmp = TempDir::new("insert");
    let e = |e: rusqlite::Error| e.to_string();
    let mut conn = Connection::open(tmp.path().join("plain.sqlite3")).map_err(e)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(e)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("journal_mode is {mode}"));
    }
    conn.execute_batch("PRAGMA synchronous = FULL;")
        .map_err(e)?;
    conn.execute_batch(EVENTS_DDL).map_err(e)?;
    let mut seqs = [0i64; STREAMS];
    let (mut n, mut events) = (0usize, 0usize);
    let t0 = Instant::now();
    while t0.elapsed() < window {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(e)?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO events (stream, seq, kind, ts, data) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(e)?;
            for _ in 0..txn {
                let (batch_no, i) = (n / BATCH_EVENTS, n % BATCH_EVENTS);
                let (stream, data) = event(batch_no, i);
                let s = &mut seqs[batch_no % STREAMS];
                *s += 1;
                stmt.execute(params![stream, *s, "tool.call", TS, data])
                    .map_err(e)?;
                n += 1;
            }
        }
        tx.commit().map_err(e)?;
        events += txn;
    }
    Ok(events as f64 / t0.elapsed().as_secs_f64())
}
