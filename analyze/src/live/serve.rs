//! The live analyzer's HTTP side (`--http`): `/metrics` ([`super::metrics`]), the page
//! ([`super::page`]) and `/findings.json`, each rendered from the latest [`super::view::View`]
//! when asked. Plain std: one request per connection, `GET` and `HEAD` only, no TLS and no
//! authentication (bind it to the management network or firewall it).
//!
//! Nobody on the network can stall the analyzer through it: the analyzer only swaps views in
//! ([`Shared::set`]), and this side only takes the latest one. Nor can a few clients stall the
//! server for long: a connection has [`IO_TIMEOUT`] from its accept to send its request head
//! (at most [`MAX_HEAD`] bytes), and as long again to take the answer, however it trickles.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::metrics::render_metrics;
use super::page::render_page;
use super::view::{HTTP_ERRORS, Shared};

/// Time a connection has to send its request head (from its accept), and again to take the
/// answer (from the first byte written).
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// A request head longer than this is answered 431.
pub const MAX_HEAD: usize = 8192;
/// Connections served at once. A worker per connection rather than one inline loop: a browser
/// opens speculative connections it sends nothing on, and behind each of those an inline loop
/// would hold a scrape for the whole [`IO_TIMEOUT`]. Four cover a Prometheus pair and a few
/// browsers; more would only let more silent clients hold threads.
const WORKERS: usize = 4;
/// Accepted connections waiting for a worker; beyond them a connection is answered 503 at
/// once. Their time runs from the accept, so a flood of silent clients clears within
/// [`IO_TIMEOUT`] and a scrape behind it waits at most that long.
const QUEUE: usize = 8;
/// A connection that spent its time waiting for a worker is still read this long: its request
/// may have come meanwhile.
const LAST_LOOK: Duration = Duration::from_millis(50);
/// Bytes of an unread request (a body, the rest of an over-long head) read and dropped after
/// an error answer, so that closing does not reset the connection before the client reads it.
const DRAIN_BYTES: usize = 65_536;
const DRAIN_TIME: Duration = Duration::from_millis(250);

const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const HTML_TYPE: &str = "text/html; charset=utf-8";
const JSON_TYPE: &str = "application/json";
const TEXT_TYPE: &str = "text/plain; charset=utf-8";
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
Content-Length: 5\r\nRetry-After: 2\r\nConnection: close\r\n\r\nbusy\n";

/// Why [`start`] could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot serve on {addr}: {source} (another process on that port? pick another with --http)")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot start the HTTP server's threads: {0}")]
    Spawn(std::io::Error),
}

/// The listening thread's handle: dropping it stops accepting and closes the port.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// The address served (the port resolved where `0` was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The accept blocks until a connection comes: ours. Where none can be made (a host
        // firewall), the thread is left to end with the process rather than waited for.
        if TcpStream::connect_timeout(&wake_addr(self.addr), Duration::from_millis(200)).is_ok()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
    }
}

/// An address that reaches `addr` from this host (the loopback where it is a wildcard).
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    }
}

/// Binds `addr` and serves `view` from a thread named `live-http` (and its workers).
pub fn start(addr: SocketAddr, view: Shared) -> Result<Server, ServeError> {
    let bind = |source: std::io::Error| ServeError::Bind { addr, source };
    let listener = TcpListener::bind(addr).map_err(bind)?;
    let local = listener.local_addr().map_err(bind)?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Conn>(QUEUE);
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..WORKERS {
        let (rx, view) = (Arc::clone(&rx), view.clone());
        // A failure here drops `tx` on return, which ends the workers already started.
        std::thread::Builder::new()
            .name(format!("live-http-{i}"))
            .spawn(move || work(&rx, &view))
            .map_err(ServeError::Spawn)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("live-http".into())
            .spawn(move || accept_loop(&listener, &tx, &stop))
            .map_err(ServeError::Spawn)?
    };
    Ok(Server { addr: local, stop, thread: Some(thread) })
}

/// A connection and when it was accepted (its time to send the request runs from there).
type Conn = (TcpStream, Instant);

fn accept_loop(listener: &TcpListener, tx: &SyncSender<Conn>, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok(stream) => match tx.try_send((stream, Instant::now())) {
                Ok(()) => {}
                Err(TrySendError::Full((stream, _))) => refuse_busy(&stream),
                Err(TrySendError::Disconnected(_)) => return,
            },
            Err(_) => {
                HTTP_ERRORS.fetch_add(1, Ordering::Relaxed);
                // Out of file descriptors and the like: do not spin on it.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Answers 503 without waiting: a fresh socket's buffer takes the few bytes, or they are lost.
fn refuse_busy(mut stream: &TcpStream) {
    HTTP_ERRORS.fetch_add(1, Ordering::Relaxed);
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write(BUSY);
    }
}

fn work(rx: &Mutex<Receiver<Conn>>, view: &Shared) {
    loop {
        let next = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok((stream, accepted)) = next else { return };
        // A bug in a renderer costs that one answer, not a worker.
        let served = std::panic::catch_unwind(AssertUnwindSafe(|| handle(stream, accepted, view)));
        if !matches!(served, Ok(true)) {
            HTTP_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the request head came to.
enum Head {
    /// It ends at this byte.
    Complete(usize),
    /// [`MAX_HEAD`] bytes and no end.
    TooLong,
    /// The client stopped (closed, failed or ran out of time) after this many bytes.
    Cut(usize),
}

/// Answers one connection; false when it ended in an error.
fn handle(mut stream: TcpStream, accepted: Instant, view: &Shared) -> bool {
    let mut buf = [0u8; MAX_HEAD];
    let deadline = (accepted + IO_TIMEOUT).max(Instant::now() + LAST_LOOK);
    let reply = match read_head(&mut stream, &mut buf, deadline) {
        Head::Complete(end) => match request_line(&buf[..end]) {
            Some((method, target)) => answer(method, target, view),
            None => Reply::text(400, "bad request\n"),
        },
        Head::TooLong => Reply::text(431, "request head over 8 KiB\n"),
        Head::Cut(0) => return false,
        Head::Cut(_) => Reply::text(400, "incomplete request\n"),
    };
    let sent = write_by(&mut stream, &reply.bytes(), Instant::now() + IO_TIMEOUT);
    if matches!(reply.code, 400 | 405 | 431) {
        drain(&mut stream);
    }
    sent && !matches!(reply.code, 400 | 431 | 500)
}

/// Reads until the blank line that ends the head, the buffer is full, or `deadline`.
fn read_head(stream: &mut TcpStream, buf: &mut [u8; MAX_HEAD], deadline: Instant) -> Head {
    let mut len = 0;
    loop {
        if let Some(end) = head_end(&buf[..len]) {
            return Head::Complete(end);
        }
        if len == buf.len() {
            return Head::TooLong;
        }
        if !time_left(stream, deadline, TcpStream::set_read_timeout) {
            return Head::Cut(len);
        }
        match stream.read(&mut buf[len..]) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return Head::Cut(len),
            Ok(n) => len += n,
        }
    }
}

/// Where the head ends: after `\r\n\r\n`, or `\n\n` from a client that sends bare newlines.
fn head_end(b: &[u8]) -> Option<usize> {
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    crlf.into_iter().chain(lf).min()
}

/// The method and target of `METHOD TARGET HTTP/1.x`.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    let valid = !method.is_empty() && target.starts_with('/') && version.starts_with("HTTP/1.");
    (valid && parts.next().is_none()).then_some((method, target))
}

fn answer(method: &str, target: &str, view: &Shared) -> Reply {
    if method != "GET" && method != "HEAD" {
        return Reply::text(405, "only GET and HEAD\n");
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let mut reply = match path {
        "/metrics" => Reply::ok(METRICS_TYPE, render_metrics(&view.get()).into_bytes()),
        "/" => Reply::ok(HTML_TYPE, render_page(&view.get()).into_bytes()),
        "/findings.json" => match serde_json::to_vec(&*view.get()) {
            Ok(body) => Reply::ok(JSON_TYPE, body),
            Err(_) => Reply::text(500, "cannot write the view as JSON\n"),
        },
        _ => Reply::text(404, "not found: this serves /, /metrics and /findings.json\n"),
    };
    reply.head_only = method == "HEAD";
    reply
}

/// An answer: its status, type and body (left out for `HEAD`, its length still said).
#[derive(Debug)]
struct Reply {
    code: u16,
    ctype: &'static str,
    body: Vec<u8>,
    head_only: bool,
}

impl Reply {
    fn ok(ctype: &'static str, body: Vec<u8>) -> Reply {
        Reply { code: 200, ctype, body, head_only: false }
    }

    fn text(code: u16, body: &str) -> Reply {
        Reply { code, ctype: TEXT_TYPE, body: body.as_bytes().to_vec(), head_only: false }
    }

    /// The status line, headers and body. The page loads nothing and runs no script: the
    /// policy says so, in case a name from the network ever got past the escaping.
    fn bytes(&self) -> Vec<u8> {
        let reason = match self.code {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            _ => "Internal Server Error",
        };
        let allow = if self.code == 405 { "Allow: GET, HEAD\r\n" } else { "" };
        let head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\
             Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
             Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n{allow}\r\n",
            self.code,
            self.ctype,
            self.body.len()
        );
        let mut out = head.into_bytes();
        if !self.head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

/// Sets the socket's timeout (`set`: read or write) to what is left before `deadline`; false
/// when nothing is.
fn time_left(
    stream: &TcpStream,
    deadline: Instant,
    set: fn(&TcpStream, Option<Duration>) -> std::io::Result<()>,
) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    !left.is_zero() && set(stream, Some(left)).is_ok()
}

/// Writes all of `bytes` before `deadline`; false when the client did not take them in time.
fn write_by(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> bool {
    while !bytes.is_empty() {
        if !time_left(stream, deadline, TcpStream::set_write_timeout) {
            return false;
        }
        match stream.write(bytes) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return false,
            Ok(n) => bytes = &bytes[n..],
        }
    }
    true
}

/// Ends our side, then reads what the client still sends (briefly) and drops it.
fn drain(stream: &mut TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + DRAIN_TIME;
    let mut buf = [0u8; 4096];
    let mut read = 0;
    while read < DRAIN_BYTES && time_left(stream, deadline, TcpStream::set_read_timeout) {
        match stream.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return,
            Ok(n) => read += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::metrics::tests::sample_view;

    fn serve() -> Server {
        let shared = Shared::default();
        shared.set(sample_view());
        start("127.0.0.1:0".parse().expect("addr"), shared).expect("start")
    }

    /// Sends `request` and reads the answer to its end: (status line, headers, body).
    fn ask(addr: SocketAddr, request: &[u8]) -> (String, String, String) {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        s.write_all(request).expect("send");
        let mut out = Vec::new();
        // An error answer may be followed by a reset; what came before it counts.
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head end in {text:?}"));
        let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        (status.to_owned(), headers.to_owned(), body.to_owned())
    }

    fn header<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
        headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then_some(v.trim())
        })
    }

    /// A 200 with its type, the length said and `Connection: close`; the body.
    fn get_ok(addr: SocketAddr, path: &str, ctype: &str) -> String {
        let (status, headers, body) = ask(addr, format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        assert_eq!(status, "HTTP/1.1 200 OK", "{path}: {headers}\n{body}");
        assert_eq!(header(&headers, "content-type"), Some(ctype), "{path}");
        assert_eq!(header(&headers, "content-length"), Some(body.len().to_string().as_str()), "{path}");
        assert_eq!(header(&headers, "connection"), Some("close"));
        body
    }

    #[test]
    fn serves_metrics_the_page_and_the_json() {
        let server = serve();
        let addr = server.local_addr();
        let metrics = get_ok(addr, "/metrics", METRICS_TYPE);
        assert!(metrics.contains("rocemesh_live_finding_open{kind=\"rnic\",entity=\"h1/mlx5_0\"} 1\n"), "{metrics}");
        assert!(get_ok(addr, "/metrics?x=1", METRICS_TYPE).contains("rocemesh_live_findings_open 2\n"));
        let page = get_ok(addr, "/", HTML_TYPE);
        assert!(page.starts_with("<!DOCTYPE html>") && page.contains("h1/mlx5_0"), "{page}");
        let json = get_ok(addr, "/findings.json", JSON_TYPE);
        let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(v["open"][0]["entity"], "h1/mlx5_0", "{json}");
        assert_eq!(v["refused"]["clock_skew"], 2, "{json}");
        // HEAD: the length of what GET would send, and no body.
        let (status, headers, body) = ask(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.is_empty() && header(&headers, "content-length").is_some_and(|n| n != "0"), "{headers}");
    }

    #[test]
    fn wrong_paths_methods_and_heads_get_their_error() {
        let server = serve();
        let addr = server.local_addr();
        let (status, _, _) = ask(addr, b"GET /etc/passwd HTTP/1.1\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        let (status, headers, _) = ask(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        assert_eq!(header(&headers, "allow"), Some("GET, HEAD"));
        let mut long = b"GET / HTTP/1.1\r\nX-Long: ".to_vec();
        long.resize(MAX_HEAD + 2000, b'a');
        long.extend_from_slice(b"\r\n\r\n");
        let (status, _, _) = ask(addr, &long);
        assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
        let (status, _, _) = ask(addr, b"\x00\xff garbage\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 400 Bad Request");
        // Bare newlines end a head too.
        let (status, _, _) = ask(addr, b"GET /metrics HTTP/1.0\n\n");
        assert_eq!(status, "HTTP/1.1 200 OK");
    }

    /// A client that connects and says nothing holds one worker until its time is up, and is
    /// then closed; the next client is answered meanwhile.
    #[test]
    fn a_silent_client_does_not_hold_up_the_next() {
        let server = serve();
        let addr = server.local_addr();
        let mut silent = TcpStream::connect(addr).expect("connect");
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        get_ok(addr, "/metrics", METRICS_TYPE);
        assert!(t.elapsed() < IO_TIMEOUT, "the scrape waited {:?} behind a silent client", t.elapsed());
        silent.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut rest = Vec::new();
        let closed = silent.read_to_end(&mut rest).map(|_| ()).or_else(|e| {
            // A reset is a close too.
            if e.kind() == std::io::ErrorKind::ConnectionReset { Ok(()) } else { Err(e) }
        });
        assert!(closed.is_ok() && rest.is_empty(), "{closed:?} {rest:?}");
        assert!(t.elapsed() < IO_TIMEOUT + Duration::from_secs(2), "closed after {:?}", t.elapsed());
    }

    /// More silent clients than workers and queue: the excess is refused at once, and once
    /// their time is up a scrape is served again.
    #[test]
    fn a_flood_of_silent_clients_is_bounded() {
        let server = serve();
        let addr = server.local_addr();
        let silent: Vec<TcpStream> =
            (0..WORKERS + QUEUE + 4).map(|_| TcpStream::connect(addr).expect("connect")).collect();
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 503") || out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(t.elapsed() < IO_TIMEOUT + Duration::from_secs(1), "answered after {:?}", t.elapsed());
        std::thread::sleep(IO_TIMEOUT + Duration::from_millis(500));
        get_ok(addr, "/metrics", METRICS_TYPE);
        drop(silent);
    }

    #[test]
    fn dropping_the_server_closes_its_port() {
        let server = serve();
        let addr = server.local_addr();
        get_ok(addr, "/metrics", METRICS_TYPE);
        drop(server);
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "{addr} still open");
    }

    #[test]
    fn a_taken_port_names_the_address_and_the_flag() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().expect("addr");
        let e = start(addr, Shared::default()).map(|_| ()).expect_err("in use").to_string();
        assert!(e.contains(&addr.to_string()) && e.contains("--http"), "{e}");
    }

    #[test]
    fn request_lines() {
        assert_eq!(request_line(b"GET /metrics HTTP/1.1\r\n\r\n"), Some(("GET", "/metrics")));
        assert_eq!(request_line(b"GET /metrics\r\n\r\n"), None, "HTTP/0.9");
        assert_eq!(request_line(b"GET  /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_line(b"GET http://x/metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(head_end(b"GET / HTTP/1.0\r\n\r\nbody"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.0\r\nHost: x\r\n"), None);
    }
}
