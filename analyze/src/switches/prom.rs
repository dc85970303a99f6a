//! A Prometheus HTTP API client for one kind of question: the raw samples of the series a
//! selector matches over a time range (`/api/v1/query` of a range vector), so increases are
//! taken from the samples themselves, reset-aware, without `increase()`'s extrapolation.
//!
//! Plain HTTP, one request per connection (HTTP/1.0: no chunked replies to decode), bounded in
//! time and size; a Prometheus behind TLS or authentication is reached through a local proxy.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one query may take, answer included.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read: a selector narrowed to a finding's ports stays far below.
const MAX_ANSWER_BYTES: u64 = 64 << 20;

/// Why a query got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("{url}: not an http://host[:port][/path] address (fix: e.g. --prometheus http://prometheus:9090)")]
    Url { url: String },
    #[error("{url}: {source} (fix: check the address and that Prometheus is up)")]
    Connect { url: String, source: std::io::Error },
    #[error("{url}: {message}")]
    Answer { url: String, message: String },
}

/// One series: its labels and its samples, (Unix seconds, value), in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub samples: Vec<(f64, f64)>,
}

/// A Prometheus server's address.
#[derive(Debug, Clone)]
pub struct Prometheus {
    url: String,
    host: String,
    port: u16,
    /// The path prefix Prometheus is served under (`--web.route-prefix`), without the final `/`.
    prefix: String,
}

impl Prometheus {
    /// Checks the address's form; nothing is connected yet.
    pub fn new(url: &str) -> Result<Prometheus, PromError> {
        let bad = || PromError::Url { url: url.to_string() };
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        // `[v6]:port`, `[v6]`, `host:port` or `host`.
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(bad)?;
                match after.strip_prefix(':') {
                    Some(p) => (host, p.parse::<u16>().map_err(|_| bad())?),
                    None if after.is_empty() => (host, 80),
                    None => return Err(bad()),
                }
            }
            None => match authority.split_once(':') {
                Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
                None => (authority, 80),
            },
        };
        if host.is_empty() || host.contains(['/', '?', '#', '@', '[', ']']) {
            return Err(bad());
        }
        let prefix = path.trim_end_matches('/');
        let prefix = if prefix.is_empty() { String::new() } else { format!("/{prefix}") };
        Ok(Prometheus { url: url.to_string(), host: host.to_string(), port, prefix })
    }

    /// The address as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The raw samples of every series `selector` matches over the `range_s` seconds up to
    /// `at_s` (Unix seconds).
    pub fn samples(&self, selector: &str, at_s: u64, range_s: u64) -> Result<Vec<Series>, PromError> {
        let query = format!("{selector}[{range_s}s]");
        let target = format!("{}/api/v1/query?query={}&time={at_s}", self.prefix, encode(&query));
        let body = self.get(&target)?;
        parse_matrix(&body).map_err(|message| self.answer(format!("query {query}: {message}")))
    }

    /// The labels of every series `selector` matches over all the time Prometheus holds
    /// (`/api/v1/series`: the index only, no samples).
    pub fn series(&self, selector: &str) -> Result<Vec<BTreeMap<String, String>>, PromError> {
        let target = format!("{}/api/v1/series?match%5B%5D={}", self.prefix, encode(selector));
        let body = self.get(&target)?;
        parse_series(&body).map_err(|message| self.answer(format!("series {selector}: {message}")))
    }

    fn answer(&self, message: String) -> PromError {
        PromError::Answer { url: self.url.clone(), message }
    }

    /// GET `target`; the body of a 2xx answer, or the error Prometheus gave.
    fn get(&self, target: &str) -> Result<String, PromError> {
        let connect = |source| PromError::Connect { url: self.url.clone(), source };
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port).to_socket_addrs().map_err(connect)?.collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the host resolves to no address");
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let mut stream = stream.ok_or_else(|| connect(last))?;
        let io = |e: std::io::Error| self.answer(format!("asking: {e} (a query may take {QUERY_TIMEOUT:?})"));
        let deadline = Instant::now() + QUERY_TIMEOUT;
        stream.set_write_timeout(Some(QUERY_TIMEOUT)).map_err(io)?;
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let request =
            format!("GET {target} HTTP/1.0\r\nHost: {host}:{}\r\nAccept: application/json\r\n\r\n", self.port);
        stream.write_all(request.as_bytes()).map_err(io)?;
        // Read until the server closes, within the deadline for the whole answer: a server that
        // trickles bytes cannot hold the run.
        let mut raw = Vec::new();
        let mut chunk = [0u8; 64 << 10];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io(std::io::ErrorKind::TimedOut.into()));
            }
            stream.set_read_timeout(Some(left)).map_err(io)?;
            match stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
            if raw.len() as u64 > MAX_ANSWER_BYTES {
                break;
            }
        }
        if raw.len() as u64 > MAX_ANSWER_BYTES {
            return Err(self.answer(format!(
                "the answer is over {} MiB: narrow the counter map's selectors",
                MAX_ANSWER_BYTES >> 20
            )));
        }
        let text = String::from_utf8_lossy(&raw);
        let (head, body) =
            text.split_once("\r\n\r\n").ok_or_else(|| self.answer("an answer without HTTP headers".into()))?;
        let status = head.lines().next().unwrap_or_default();
        let code: u16 = status.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        if !(200..300).contains(&code) {
            // Prometheus says why in its JSON error.
            let why = serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
                .unwrap_or_else(|| body.chars().take(200).collect());
            return Err(self.answer(format!("{status}: {why}")));
        }
        Ok(body.to_string())
    }
}

/// A query answer's result of `kind` (matrix, vector).
fn result_of(body: &str, kind: &str) -> Result<Vec<serde_json::Value>, String> {
    let mut v: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    if v.get("status").and_then(|s| s.as_str()) != Some("success") {
        return Err(format!("status {:?}", v.get("status")));
    }
    let mut data = v.get_mut("data").map(serde_json::Value::take).ok_or("no data")?;
    match data.get("resultType").and_then(|t| t.as_str()) {
        Some(k) if k == kind => {}
        other => return Err(format!("a {other:?} result where a {kind} was asked for")),
    }
    match data.get_mut("result").map(serde_json::Value::take) {
        Some(serde_json::Value::Array(a)) => Ok(a),
        _ => Err("no result".into()),
    }
}

fn labels_of(s: &serde_json::Value) -> BTreeMap<String, String> {
    s.get("metric").map(label_map).unwrap_or_default()
}

/// A series answer: each series' labels.
fn parse_series(body: &str) -> Result<Vec<BTreeMap<String, String>>, String> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    if v.get("status").and_then(|s| s.as_str()) != Some("success") {
        return Err(format!("status {:?}", v.get("status")));
    }
    let all = v.get("data").and_then(|d| d.as_array()).ok_or("no data")?;
    Ok(all.iter().map(label_map).collect())
}

/// A JSON object of label values.
fn label_map(m: &serde_json::Value) -> BTreeMap<String, String> {
    m.as_object()
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
        .unwrap_or_default()
}

/// A query answer's matrix.
fn parse_matrix(body: &str) -> Result<Vec<Series>, String> {
    let mut out = Vec::new();
    for s in &result_of(body, "matrix")? {
        let labels = labels_of(s);
        let mut samples = Vec::new();
        for pair in s.get("values").and_then(|v| v.as_array()).ok_or("a series without values")? {
            let t = pair.get(0).and_then(|t| t.as_f64());
            let x = pair.get(1).and_then(|x| x.as_str()).and_then(|x| x.parse::<f64>().ok());
            match (t, x) {
                (Some(t), Some(x)) if x.is_finite() => samples.push((t, x)),
                (Some(_), Some(_)) => {}
                _ => return Err(format!("a sample that is not [time, \"value\"]: {pair}")),
            }
        }
        out.push(Series { labels, samples });
    }
    Ok(out)
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked_for_their_form() {
        let p = Prometheus::new("http://prom.example:9090/prometheus/").unwrap();
        assert_eq!((p.host.as_str(), p.port, p.prefix.as_str()), ("prom.example", 9090, "/prometheus"));
        let p = Prometheus::new("http://[::1]:9090").unwrap();
        assert_eq!((p.host.as_str(), p.port), ("::1", 9090));
        assert_eq!(Prometheus::new("http://10.0.0.1").unwrap().port, 80);
        for bad in ["https://p:9090", "p:9090", "http://:9090", "http://p:x", "http://u@p:9090"] {
            assert!(Prometheus::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_matrix_answer_is_read_and_anything_else_refused() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"ifInDiscards","instance":"tor1","ifName":"s0"},"values":[[100,"1"],[115.5,"7"]]}]}}"#;
        let s = parse_matrix(body).unwrap();
        assert_eq!(s[0].labels["ifName"], "s0");
        assert_eq!(s[0].samples, vec![(100.0, 1.0), (115.5, 7.0)]);
        assert!(parse_matrix(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#).is_err());
        let v =
            r#"{"status":"success","data":[{"__name__":"ipAdEntIfIndex","instance":"tor1","ipAdEntAddr":"10.0.0.1"}]}"#;
        assert_eq!(parse_series(v).unwrap()[0]["ipAdEntAddr"], "10.0.0.1");
        assert!(parse_series(body).is_err(), "a matrix is no series list");
        assert!(parse_matrix("<html>").is_err());
        assert_eq!(encode("a{b=\"c\"}[60s]"), "a%7Bb%3D%22c%22%7D%5B60s%5D");
    }

    #[test]
    fn nothing_listening_is_a_connect_error_naming_the_address() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let p = Prometheus::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let e = p.samples("up", 1, 60).unwrap_err();
        assert!(matches!(e, PromError::Connect { .. }) && e.to_string().contains(&port.to_string()), "{e}");
    }
}
