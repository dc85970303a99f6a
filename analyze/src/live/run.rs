//! The running analyzer: a receiving thread that only reads datagrams (so that a localisation
//! never leaves the socket unread), a bounded queue to the thread that decodes, takes and
//! localises, the JSON lines' output, the state file, and the view `/metrics` and the page
//! serve ([`super::serve`]).

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::keys::FleetKeys;
use rocemesh_formats::live::{Keys, PushError, decode};

use super::view::Shared;
use super::{Config, Counts, Event, Live};

/// Where and how [`run`] listens and writes.
#[derive(Debug)]
pub struct Listen {
    pub addr: SocketAddr,
    /// Check every push's seal against these keys; `None`: seals are not checked.
    pub keys: Option<FleetKeys>,
    /// Stop after this long (tests, benches); `None`: run until killed.
    pub for_ns: Option<u64>,
    /// Append the JSON lines here, flushed after each tick; `None`: standard output.
    pub output: Option<PathBuf>,
    /// Serve `/metrics`, the page and `/findings.json` here; `None`: not served.
    pub http: Option<SocketAddr>,
    /// Keep the findings open here, rewritten as they change, taken back at start.
    pub state: Option<PathBuf>,
    /// Ask the switches' counters about each finding as it opens and closes ([`super::ask`]).
    pub switches: Option<crate::switches::Judge>,
}

/// Why [`run`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("cannot listen on {addr}: {source} (another analyzer on that port? pick another with --listen)")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot write the findings to {path}: {source} (check the directory exists and is writable)")]
    Output { path: String, source: std::io::Error },
    #[error(transparent)]
    Http(#[from] super::serve::ServeError),
    #[error("cannot take back the open findings from {path}: {why} (move the file away to start without them)")]
    State { path: String, why: String },
    #[error("the receiving thread stopped: {0}")]
    Receiver(String),
    #[error("cannot start the thread that asks Prometheus: {0}")]
    Asker(std::io::Error),
}

/// How often ready windows are looked for.
const TICK_NS: u64 = 200_000_000;
/// Datagrams read and not yet taken, at most, and their bytes at most (the queue holds them
/// before any check, so whoever reaches the port fills it as fast as the agents: it is bounded
/// by what it holds, not by their count). Beyond either a datagram is dropped and counted
/// (`overload`): a fleet's burst at a window's end waits here while a window is localised,
/// instead of overflowing the socket's buffer unseen.
pub const QUEUE_PUSHES: usize = 32_768;
pub const QUEUE_BYTES: usize = 512 << 20;

/// What the receiving thread tells the taking one besides the datagrams.
#[derive(Default)]
struct Inbox {
    queued: AtomicUsize,
    queued_bytes: AtomicUsize,
    overload: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<String>,
    stop: AtomicBool,
}

struct Datagram {
    bytes: Vec<u8>,
    from: SocketAddr,
    /// When it was read (a push's clock is judged against this, not the time it is taken).
    received_ns: u64,
}

/// Receives pushes on `listen.addr` and writes each ready window's lines, until `for_ns` has
/// passed (or forever). Returns what it counted.
pub fn run(cfg: Config, inventory: Option<&Inventory>, listen: &Listen) -> Result<Counts, LiveError> {
    let socket = rocemesh_formats::live::bind_receiver(listen.addr)
        .map_err(|source| LiveError::Listen { addr: listen.addr, source })?;
    socket
        .set_read_timeout(Some(Duration::from_nanos(TICK_NS)))
        .map_err(|source| LiveError::Listen { addr: listen.addr, source })?;
    let mut out = Output::open(listen.output.clone())?;
    let mut live = Live::new(cfg, inventory);
    if let Some(path) = &listen.state {
        restore(&mut live, path)?;
    }
    let shared = Shared::default();
    let mut first = live.view(crate::watch::wall_now_ns());
    first.started_unix_ns = first.now_unix_ns;
    shared.set(first);
    let _server = listen.http.map(|addr| super::serve::start(addr, shared.clone())).transpose()?;
    let inbox = Arc::new(Inbox::default());
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_PUSHES);
    let receiver = {
        let inbox = Arc::clone(&inbox);
        std::thread::Builder::new()
            .name("live-recv".into())
            .spawn(move || receive_loop(&socket, &tx, &inbox))
            .map_err(|e| LiveError::Receiver(e.to_string()))?
    };
    let window_ns = live.cfg.window_ns;
    let mut asker = listen
        .switches
        .clone()
        .map(|j| super::ask::Asker::start(j, window_ns))
        .transpose()
        .map_err(LiveError::Asker)?;
    if let Some(a) = asker.as_mut() {
        // Findings taken back from --state wrote their open line before the restart, and their
        // question may not have been answered then.
        for (kind, entity, since_ns) in live.open_since() {
            a.opened(kind, entity, since_ns);
        }
    }
    let result = take_loop(&mut live, &rx, &inbox, listen, &mut out, &shared, asker.as_mut());
    inbox.stop.store(true, Ordering::Relaxed);
    drop(rx);
    if receiver.join().is_err() {
        eprintln!("analyze live: the receiving thread panicked");
    }
    result.map(|()| live.counts)
}

/// Reads datagrams into the queue until told to stop or the queue is gone.
fn receive_loop(socket: &UdpSocket, tx: &SyncSender<Datagram>, inbox: &Inbox) {
    let mut buf = vec![0u8; 65_536];
    while !inbox.stop.load(Ordering::Relaxed) {
        match socket.recv_from(&mut buf) {
            Ok((n, from)) => {
                // Counted before it is sent, so that the taker never takes more than was counted.
                if inbox.queued_bytes.fetch_add(n, Ordering::Relaxed) + n > QUEUE_BYTES {
                    inbox.queued_bytes.fetch_sub(n, Ordering::Relaxed);
                    inbox.overload.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                inbox.queued.fetch_add(1, Ordering::Relaxed);
                let d = Datagram { bytes: buf[..n].to_vec(), from, received_ns: crate::watch::wall_now_ns() };
                match tx.try_send(d) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        inbox.queued.fetch_sub(1, Ordering::Relaxed);
                        inbox.queued_bytes.fetch_sub(n, Ordering::Relaxed);
                        inbox.overload.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TrySendError::Disconnected(_)) => return,
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => {
                inbox.errors.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut last) = inbox.last_error.lock() {
                    *last = e.to_string();
                }
            }
        }
    }
}

/// Takes what the queue holds and localises what is ready, tick by tick.
fn take_loop(
    live: &mut Live,
    rx: &Receiver<Datagram>,
    inbox: &Inbox,
    listen: &Listen,
    out: &mut Output,
    shared: &Shared,
    mut asker: Option<&mut super::ask::Asker>,
) -> Result<(), LiveError> {
    let started = crate::watch::wall_now_ns();
    let mut next_tick = started;
    let mut events = Vec::new();
    let (mut overload_seen, mut errors_seen) = (0, 0);
    let kernel_base = kernel_drops(listen.addr.port()).unwrap_or(0);
    let mut kernel_seen = kernel_base;
    let mut saved_state = live.open_state();
    loop {
        let now = crate::watch::wall_now_ns();
        if listen.for_ns.is_some_and(|f| now >= started.saturating_add(f)) {
            return Ok(());
        }
        match rx.recv_timeout(Duration::from_nanos(next_tick.saturating_sub(now).max(1_000_000))) {
            Ok(d) => take(live, &d, inbox, listen, &mut events),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Err(LiveError::Receiver("it ended".into())),
        }
        let now = crate::watch::wall_now_ns();
        if now < next_tick {
            continue;
        }
        // What arrived before this tick is taken before windows are judged ready: after a long
        // localisation the queue holds pushes that came in time. Only those: a flood must not
        // keep the tick from running.
        for _ in 0..inbox.queued.load(Ordering::Relaxed) {
            match rx.try_recv() {
                Ok(d) => take(live, &d, inbox, listen, &mut events),
                Err(_) => break,
            }
        }
        next_tick = now + TICK_NS;
        let overload = inbox.overload.load(Ordering::Relaxed);
        if overload > overload_seen {
            let detail = format!(
                "{} datagrams dropped: {QUEUE_PUSHES} datagrams or {} MiB waited to be taken (this machine is too \
                 slow for the fleet's pushes, or something floods the port: give the analyzer more cores, a \
                 longer --window-s, or firewall the port to the agents)",
                overload - overload_seen,
                QUEUE_BYTES >> 20
            );
            live.refuse_many("overload", overload - overload_seen, "", detail, &mut events);
            overload_seen = overload;
        }
        if let Some(dropped) = kernel_drops(listen.addr.port()).filter(|&d| d > kernel_seen) {
            let detail = format!(
                "the kernel dropped {} datagrams at this socket, its receive buffer full: raise \
                 net.core.rmem_max (the analyzer asks for {} MiB) and restart the analyzer",
                dropped - kernel_base,
                rocemesh_formats::live::RECEIVE_BUFFER_BYTES >> 20
            );
            live.refuse_many("kernel_drop", dropped - kernel_seen, "", detail, &mut events);
            kernel_seen = dropped;
        }
        let errors = inbox.errors.load(Ordering::Relaxed);
        if errors > errors_seen {
            let detail = inbox.last_error.lock().map(|e| e.clone()).unwrap_or_default();
            live.refuse_many("receive", errors - errors_seen, "", detail, &mut events);
            errors_seen = errors;
        }
        live.tick(now, &mut events);
        if let Some(a) = asker.as_deref_mut() {
            a.note(&events);
            a.poll(now, &mut events);
        }
        out.write(&events);
        events.clear();
        let mut view = live.view(now);
        if let Some(a) = asker.as_deref() {
            view.switch_checks = Some(a.counts.iter().map(|(&k, &n)| (k.to_owned(), n)).collect());
            for f in &mut view.open {
                f.switches = a.line_of(&f.kind, &f.entity).cloned();
            }
        }
        (view.started_unix_ns, view.lines_lost) = (started, out.lost);
        (view.queued, view.queue_capacity) = (inbox.queued.load(Ordering::Relaxed), QUEUE_PUSHES);
        shared.set(view);
        if let Some(path) = &listen.state {
            let state = live.open_state();
            if state != saved_state {
                save_state(path, &state);
                saved_state = state;
            }
        }
    }
}

/// Datagrams the kernel dropped at the UDP sockets bound to `port` (their receive buffer
/// full): the `drops` column of /proc/net/udp and udp6, summed; `None` where neither is
/// readable. Read once a tick: a few hundred lines on a collector.
fn kernel_drops(port: u16) -> Option<u64> {
    let port = format!(":{port:04X}");
    let tables: Vec<String> =
        ["/proc/net/udp", "/proc/net/udp6"].iter().filter_map(|p| std::fs::read_to_string(p).ok()).collect();
    if tables.is_empty() {
        return None;
    }
    let drops = |line: &str| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local = fields.get(1)?;
        if local.ends_with(&port) { fields.last()?.parse::<u64>().ok() } else { None }
    };
    Some(tables.iter().flat_map(|t| t.lines().skip(1).filter_map(drops)).sum())
}

/// Takes one datagram off the queue.
fn take(live: &mut Live, d: &Datagram, inbox: &Inbox, listen: &Listen, events: &mut Vec<Event>) {
    inbox.queued.fetch_sub(1, Ordering::Relaxed);
    inbox.queued_bytes.fetch_sub(d.bytes.len(), Ordering::Relaxed);
    receive(live, &d.bytes, &d.from.to_string(), listen.keys.as_ref(), d.received_ns, events);
}

/// Decodes one datagram received at `now` (ns) and hands it to `live` (or counts why not).
pub fn receive(live: &mut Live, bytes: &[u8], from: &str, keys: Option<&FleetKeys>, now: u64, out: &mut Vec<Event>) {
    let now_s = now / 1_000_000_000;
    let accepted = |id: u8| {
        keys?
            .keys
            .iter()
            .find(|k| k.id == id && k.accepted_at(now_s))
            .and_then(|k| Some(rocemesh_formats::live::Seal { id, secret: k.secret_bytes()? }))
    };
    let check = match keys {
        Some(_) => Keys::Checked(&accepted),
        None => Keys::Unchecked,
    };
    match decode(bytes, &check) {
        Ok(r) => live.add(r, from, now, out),
        Err(e) => {
            let reason = match e {
                PushError::Unsealed | PushError::UnknownKey(_) | PushError::BadMac => "seal",
                _ => "malformed",
            };
            live.refuse(reason, from, e.to_string(), out);
        }
    }
}

/// The JSON lines' destination. A line that cannot be written (a full disk, a closed pipe)
/// is counted as lost, the first failure said on standard error; the file is opened again on
/// the next write, so that the analyzer goes on once there is room.
struct Output {
    path: Option<PathBuf>,
    file: Option<std::io::BufWriter<std::fs::File>>,
    lost: u64,
    said: bool,
}

impl Output {
    fn open(path: Option<PathBuf>) -> Result<Output, LiveError> {
        let mut out = Output { path, file: None, lost: 0, said: false };
        if let Some(p) = &out.path {
            out.file =
                Some(Self::append(p).map_err(|source| LiveError::Output { path: p.display().to_string(), source })?);
        }
        Ok(out)
    }

    fn append(p: &std::path::Path) -> std::io::Result<std::io::BufWriter<std::fs::File>> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(p)?;
        Ok(std::io::BufWriter::new(f))
    }

    fn write(&mut self, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        let result = match &self.path {
            None => write_events(&mut std::io::stdout().lock(), events),
            Some(p) => {
                let opened = match self.file.take() {
                    Some(f) => Ok(f),
                    None => Self::append(p),
                };
                opened.and_then(|mut f| {
                    let written = write_events(&mut f, events);
                    self.file = Some(f);
                    written
                })
            }
        };
        if let Err(e) = result {
            self.lost += events.len() as u64;
            // Its buffer is thrown away, not flushed again on drop: a half-written line must
            // not land before the next one.
            if let Some(f) = self.file.take() {
                let _ = f.into_parts();
            }
            if !self.said {
                self.said = true;
                let to = self.path.as_ref().map_or("standard output".to_owned(), |p| p.display().to_string());
                eprintln!(
                    "analyze live: cannot write the findings to {to}: {e}; lines are counted as lost \
                     (rocemesh_live_lines_lost_total) until it can"
                );
            }
        }
    }
}

fn write_events(out: &mut dyn Write, events: &[Event]) -> std::io::Result<()> {
    for e in events {
        serde_json::to_writer(&mut *out, e)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

fn restore(live: &mut Live, path: &std::path::Path) -> Result<(), LiveError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LiveError::State { path: path.display().to_string(), why: e.to_string() }),
    };
    let n =
        live.restore(&text).map_err(|e| LiveError::State { path: path.display().to_string(), why: e.to_string() })?;
    eprintln!("analyze live: {n} findings open at the last stop taken back from {}", path.display());
    Ok(())
}

/// Writes the state beside its path and renames it over: a crash leaves the old or the new.
fn save_state(path: &std::path::Path, state: &str) {
    let tmp = path.with_extension("tmp");
    let result = std::fs::write(&tmp, state).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        eprintln!("analyze live: cannot keep the open findings in {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem_line() -> Event {
        Event::Problem { reason: "late".into(), from: "a".into(), detail: "b".into() }
    }

    /// A full disk (/dev/full answers every write with ENOSPC): the lines are counted as lost,
    /// nothing panics, and each later write is tried again.
    #[test]
    fn a_full_disk_counts_the_lines_lost_and_goes_on() {
        let mut out = Output::open(Some(PathBuf::from("/dev/full"))).unwrap();
        // More than BufWriter's 8 KiB, so that the first write reaches the device.
        let many = vec![problem_line(); 400];
        out.write(&many);
        assert_eq!(out.lost, 400);
        out.write(&many);
        assert_eq!(out.lost, 800, "tried again, and lost again");
        assert!(out.said);
    }

    /// A writable file takes every line once the disk has room again.
    #[test]
    fn lines_go_out_whole_once_the_file_can_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.jsonl");
        let mut out = Output::open(Some(path.clone())).unwrap();
        out.write(&[problem_line(), problem_line()]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
        assert_eq!(out.lost, 0);
    }
}
