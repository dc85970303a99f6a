//! Switch counters beside live findings (`analyze live --prometheus`): each finding that
//! involves switch ports is asked about twice, on a thread of its own so that a slow or absent
//! Prometheus never holds a window's localisation.
//!
//! A switch's counters over a span are known once a sample past its end was scraped, and
//! `--counters-lookback-s` bounds the scrape interval: so a question waits that long after its
//! span's end. At open the span is the finding's first window (the `switches` line comes a
//! lookback after the `open` line, which never waits for it); at close it is the whole finding.
//! The judgement is batch `localize --prometheus`'s ([`crate::switches::Judge`]).
//!
//! Bounded: at most [`MAX_PENDING`] questions wait; beyond it one is dropped and counted. The
//! first failure (Prometheus unreachable, a query refused) is said in one `problem` line, later
//! ones are counted, and the findings stand as they are.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use crate::switches::{FindingCounters, Judge};

use super::Event;

/// Questions waiting (to be due, or for the asking thread), at most.
pub const MAX_PENDING: usize = 1024;

#[derive(Debug)]
struct Question {
    kind: String,
    entity: String,
    at: &'static str,
    from_ns: u64,
    to_ns: u64,
}

type Answer = (Question, Result<FindingCounters, String>);

/// Asks the switches about the findings the analyzer opens and closes.
#[derive(Debug)]
pub struct Asker {
    tx: SyncSender<Question>,
    rx: Receiver<Answer>,
    /// Questions not yet due, with the time they are.
    due: Vec<(u64, Question)>,
    lookback_ns: u64,
    window_ns: u64,
    url: String,
    failure_said: bool,
    open: BTreeSet<(String, String)>,
    /// The latest answer's line for each open finding.
    lines: HashMap<(String, String), String>,
    /// Answers by verdict, and `failed`, `dropped`.
    pub counts: BTreeMap<&'static str, u64>,
}

impl Asker {
    /// Starts the asking thread; findings are judged as `judge` judges them, over windows of
    /// `window_ns`.
    pub fn start(judge: Judge, window_ns: u64) -> std::io::Result<Asker> {
        let (tx, questions) = std::sync::mpsc::sync_channel::<Question>(MAX_PENDING);
        let (answers, rx) = std::sync::mpsc::sync_channel::<Answer>(MAX_PENDING);
        let url = judge.options().prometheus.url().to_string();
        let lookback_ns = judge.options().lookback_s.saturating_mul(1_000_000_000);
        // Not joined: a question in flight may take Prometheus's deadline, and the analyzer's
        // end must not wait for it (the thread ends at its next answer, the channel gone).
        std::thread::Builder::new().name("live-switches".into()).spawn(move || {
            for q in questions {
                let span_s = (q.from_ns / 1_000_000_000, q.to_ns.div_ceil(1_000_000_000));
                let Some(result) = judge.finding(&q.kind, &q.entity, span_s) else { continue };
                if answers.send((q, result.map_err(|e| e.to_string()))).is_err() {
                    return;
                }
            }
        })?;
        Ok(Asker {
            tx,
            rx,
            due: Vec::new(),
            lookback_ns,
            window_ns,
            url,
            failure_said: false,
            open: BTreeSet::new(),
            lines: HashMap::new(),
            counts: BTreeMap::new(),
        })
    }

    /// Takes note of the `open` and `close` lines among `events`: each is asked about a
    /// lookback after its span ends.
    pub fn note(&mut self, events: &[Event]) {
        for e in events {
            let q = match e {
                Event::Open { kind, entity, window_start_ns: from_ns, .. } => {
                    self.open.insert((kind.clone(), entity.clone()));
                    let to_ns = from_ns.saturating_add(self.window_ns);
                    Question { kind: kind.clone(), entity: entity.clone(), at: "open", from_ns: *from_ns, to_ns }
                }
                Event::Close { kind, entity, start_ns, end_ns, .. } => {
                    let key = (kind.clone(), entity.clone());
                    self.open.remove(&key);
                    self.lines.remove(&key);
                    Question { kind: key.0, entity: key.1, at: "close", from_ns: *start_ns, to_ns: *end_ns }
                }
                _ => continue,
            };
            if self.due.len() >= MAX_PENDING {
                *self.counts.entry("dropped").or_default() += 1;
                continue;
            }
            self.due.push((q.to_ns.saturating_add(self.lookback_ns), q));
        }
    }

    /// Hands the questions due at `now_ns` to the asking thread, and writes the answers that
    /// came back as `switches` lines (a failure: the first as a `problem` line).
    pub fn poll(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        let mut i = 0;
        while i < self.due.len() {
            if self.due[i].0 > now_ns {
                i += 1;
                continue;
            }
            let (_, q) = self.due.swap_remove(i);
            match self.tx.try_send(q) {
                Ok(()) => {}
                Err(TrySendError::Full(q)) => {
                    // The thread is behind (a slow Prometheus): the question waits a tick.
                    self.due.push((now_ns, q));
                    break;
                }
                Err(TrySendError::Disconnected(_)) => {
                    *self.counts.entry("dropped").or_default() += 1;
                }
            }
        }
        while let Ok((q, result)) = self.rx.try_recv() {
            match result {
                Ok(counters) => {
                    *self.counts.entry(counters.verdict.name()).or_default() += 1;
                    let line = counters.line();
                    let key = (q.kind.clone(), q.entity.clone());
                    if q.at == "open" && self.open.contains(&key) {
                        self.lines.insert(key, line.clone());
                    }
                    out.push(Event::Switches {
                        kind: q.kind,
                        entity: q.entity,
                        at: q.at,
                        from_ns: q.from_ns,
                        to_ns: q.to_ns,
                        summary: line,
                        counters,
                    });
                }
                Err(e) => {
                    *self.counts.entry("failed").or_default() += 1;
                    if !self.failure_said {
                        self.failure_said = true;
                        out.push(Event::Problem {
                            reason: "prometheus".into(),
                            from: self.url.clone(),
                            detail: format!(
                                "switch counters of {} {}: {e}; the findings stand without them (later failures \
                                 are counted: rocemesh_live_switch_checks_total{{result=\"failed\"}})",
                                q.kind, q.entity
                            ),
                        });
                    }
                }
            }
        }
    }

    /// The latest `switches` line of an open finding.
    pub fn line_of(&self, kind: &str, entity: &str) -> Option<&String> {
        self.lines.get(&(kind.to_string(), entity.to_string()))
    }
}
