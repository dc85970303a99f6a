//! Switch counters beside live findings (`analyze live --prometheus`): each finding that
//! involves switch ports is asked about twice, on a thread of its own so that a slow or absent
//! Prometheus never holds a window's localisation.
//!
//! A switch's counters over a span are known once a sample past its end was scraped, and
//! `--counters-lookback-s` bounds the scrape interval: so a question waits that long after its
//! span's end. At open the span is the finding's first window (the `switches` line comes a
//! lookback after the `open` line, which never waits for it); at close it is the whole finding.
//! An answer whose counters have no sample at or after the span's end yet (the scrape past it
//! was late, or not yet stored) is asked once more a lookback later, and only the last answer is
//! written (the first, when [`MAX_PENDING`] questions already wait). The judgement is batch `localize --prometheus`'s ([`crate::switches::Judge`]).
//!
//! Bounded: at most [`MAX_PENDING`] questions wait to be due, [`MAX_PENDING`] more for the
//! asking thread and as many answers; beyond that a question is dropped and counted. The first
//! failure (Prometheus unreachable, a query refused, the asking thread gone) is said in one
//! `problem` line, later ones are counted, and the findings stand as they are.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use crate::switches::{FindingCounters, Judge, Verdict};

use super::Event;

/// Questions waiting to be due, at most (and as many for the asking thread).
pub const MAX_PENDING: usize = 1024;

/// A question is asked this many times at most, a lookback apart, while its answer is not
/// settled.
const MAX_TRIES: u8 = 2;

#[derive(Debug)]
struct Question {
    kind: String,
    entity: String,
    at: &'static str,
    from_ns: u64,
    to_ns: u64,
    tries: u8,
}

type Answer = (Question, Result<FindingCounters, String>);
type Key = (String, String);

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
    /// Each open finding and the start of the occurrence open now: an answer about an earlier
    /// occurrence (closed and opened again before it came) is not shown as this one's.
    open: HashMap<Key, u64>,
    /// What the page says of each open finding's switches: the latest answer, or why there is
    /// none.
    lines: HashMap<Key, String>,
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
                // An entity whose ports cannot even be looked up (a link named without `|`) is
                // one with none known, as batch `localize` says of it.
                let result = match judge.finding(&q.kind, &q.entity, span_s) {
                    Some(r) => r.map_err(|e| e.to_string()),
                    None => Ok(FindingCounters {
                        verdict: Verdict::NoPorts,
                        ports: Vec::new(),
                        without_port: vec![format!("{} {}", q.kind, q.entity)],
                    }),
                };
                if answers.send((q, result)).is_err() {
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
            open: HashMap::new(),
            lines: HashMap::new(),
            counts: BTreeMap::new(),
        })
    }

    /// Takes note of the `open` and `close` lines among `events`: each is asked about a
    /// lookback after its span ends.
    pub fn note(&mut self, events: &[Event]) {
        for e in events {
            match e {
                Event::Open { kind, entity, window_start_ns, .. } => self.opened(kind, entity, *window_start_ns),
                Event::Close { kind, entity, start_ns, end_ns, .. } => {
                    let key = (kind.clone(), entity.clone());
                    self.open.remove(&key);
                    self.lines.remove(&key);
                    if crate::switches::involves_ports(kind) {
                        self.ask(Question {
                            kind: key.0,
                            entity: key.1,
                            at: "close",
                            from_ns: *start_ns,
                            to_ns: *end_ns,
                            tries: 0,
                        });
                    }
                }
                _ => {}
            }
        }
    }

    /// A finding open since the window starting at `from_ns`: one just opened, or one taken
    /// back from `--state` at start (its open line was written before the restart, its
    /// question may not have been answered).
    pub fn opened(&mut self, kind: &str, entity: &str, from_ns: u64) {
        let key = (kind.to_string(), entity.to_string());
        self.open.insert(key.clone(), from_ns);
        if !crate::switches::involves_ports(kind) {
            self.lines.insert(key, format!("not asked: a {kind} finding involves no switch port"));
            return;
        }
        self.lines.insert(key.clone(), "not answered yet (asked a lookback after its first window)".into());
        let to_ns = from_ns.saturating_add(self.window_ns);
        self.ask(Question { kind: key.0, entity: key.1, at: "open", from_ns, to_ns, tries: 0 });
    }

    fn ask(&mut self, q: Question) {
        if self.due.len() >= MAX_PENDING {
            self.dropped(&q, "not asked: too many questions were waiting");
            return;
        }
        self.due.push((q.to_ns.saturating_add(self.lookback_ns), q));
    }

    fn dropped(&mut self, q: &Question, why: &str) {
        *self.counts.entry("dropped").or_default() += 1;
        self.say_of_open(q, why.to_string());
    }

    /// What the page shows of `q`'s finding, if `q` asked about the occurrence open now.
    fn say_of_open(&mut self, q: &Question, line: String) {
        let key = (q.kind.clone(), q.entity.clone());
        if q.at == "open" && self.open.get(&key) == Some(&q.from_ns) {
            self.lines.insert(key, line);
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
                Err(TrySendError::Disconnected(q)) => {
                    self.dropped(&q, "not asked: the thread asking Prometheus ended");
                    self.fail(&q, "the thread asking Prometheus ended", out);
                }
            }
        }
        while let Ok((mut q, result)) = self.rx.try_recv() {
            match result {
                Ok(counters) if !counters.settled() && q.tries + 1 < MAX_TRIES && self.due.len() < MAX_PENDING => {
                    q.tries += 1;
                    self.due.push((now_ns.saturating_add(self.lookback_ns), q));
                }
                Ok(counters) => {
                    *self.counts.entry(counters.verdict.name()).or_default() += 1;
                    let line = counters.line();
                    self.say_of_open(&q, line.clone());
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
                    self.say_of_open(&q, format!("not answered: {e}"));
                    self.fail(&q, &e, out);
                }
            }
        }
    }

    /// The first failure, as a `problem` line.
    fn fail(&mut self, q: &Question, why: &str, out: &mut Vec<Event>) {
        if self.failure_said {
            return;
        }
        self.failure_said = true;
        out.push(Event::Problem {
            reason: "prometheus".into(),
            from: self.url.clone(),
            detail: format!(
                "switch counters of {} {}: {why}; the findings stand without them (later failures are counted: \
                 rocemesh_live_switch_checks_total{{result=\"failed\"}} or {{result=\"dropped\"}})",
                q.kind, q.entity
            ),
        });
    }

    /// What the switches said of an open finding, or why they said nothing.
    pub fn line_of(&self, kind: &str, entity: &str) -> Option<&String> {
        self.lines.get(&(kind.to_string(), entity.to_string()))
    }
}
