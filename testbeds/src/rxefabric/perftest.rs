//! Reading the results of the verbs tools run over the fabric: perftest's `ib_send_lat` and
//! `ib_send_bw` result tables and `ibv_ud_pingpong`'s summary line. Pure functions, tested on
//! output captured in the rxe VM.

use serde::Serialize;

/// `ib_send_lat`'s result row, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    pub bytes: u64,
    pub iterations: u64,
    pub min_us: f64,
    pub max_us: f64,
    /// perftest's "typical" latency (its median).
    pub typical_us: f64,
    pub avg_us: f64,
    pub stdev_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

/// `ib_send_bw`'s result row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bandwidth {
    pub bytes: u64,
    pub iterations: u64,
    pub peak_mb_s: f64,
    pub avg_mb_s: f64,
    /// Millions of messages per second.
    pub msg_rate_mpps: f64,
}

impl Bandwidth {
    pub fn msgs_per_s(&self) -> f64 {
        self.msg_rate_mpps * 1e6
    }
}

/// `ibv_ud_pingpong`'s "N iters in S seconds = U usec/iter".
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pingpong {
    pub iterations: u64,
    pub seconds: f64,
    pub usec_per_iter: f64,
}

/// The `#bytes ...` table of perftest output as (column, value) pairs of its first data row.
/// Column names are the header's, multi-word ones joined (`99% percentile[usec]`, `BW peak[MB/sec]`).
pub fn result_row(output: &str) -> Option<Vec<(String, f64)>> {
    let mut lines = output.lines();
    let header = lines.find(|l| l.split_whitespace().next() == Some("#bytes"))?;
    let mut names = Vec::new();
    let mut pending = String::new();
    for token in header.split_whitespace() {
        if !pending.is_empty() {
            pending.push(' ');
        }
        pending.push_str(token);
        // A unit in brackets or a `#` name closes a column; "99%" or "BW" continue into the next word.
        if token.contains('[') || token.starts_with('#') {
            names.push(std::mem::take(&mut pending));
        }
    }
    if !pending.is_empty() {
        names.push(pending);
    }
    let row = lines.find(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<f64>().is_ok()))?;
    let values: Vec<f64> = row.split_whitespace().map_while(|w| w.parse().ok()).collect();
    (values.len() == names.len()).then(|| names.into_iter().zip(values).collect())
}

fn column(row: &[(String, f64)], name: &str) -> Option<f64> {
    row.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
}

/// The result of `ib_send_lat` (the client's output; the server prints the same table).
pub fn parse_send_lat(output: &str) -> Option<Latency> {
    let row = result_row(output)?;
    let c = |n: &str| column(&row, n);
    Some(Latency {
        bytes: c("#bytes")? as u64,
        iterations: c("#iterations")? as u64,
        min_us: c("t_min[usec]")?,
        max_us: c("t_max[usec]")?,
        typical_us: c("t_typical[usec]")?,
        avg_us: c("t_avg[usec]")?,
        stdev_us: c("t_stdev[usec]")?,
        p99_us: c("99% percentile[usec]")?,
        p999_us: c("99.9% percentile[usec]")?,
    })
}

/// The result of `ib_send_bw`.
pub fn parse_send_bw(output: &str) -> Option<Bandwidth> {
    let row = result_row(output)?;
    let c = |n: &str| column(&row, n);
    Some(Bandwidth {
        bytes: c("#bytes")? as u64,
        iterations: c("#iterations")? as u64,
        peak_mb_s: c("BW peak[MB/sec]")?,
        avg_mb_s: c("BW average[MB/sec]")?,
        msg_rate_mpps: c("MsgRate[Mpps]")?,
    })
}

/// The summary line of `ibv_ud_pingpong` (and the other ibv_*_pingpong examples).
pub fn parse_pingpong(output: &str) -> Option<Pingpong> {
    output.lines().find_map(|line| {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            [iters, "iters", "in", secs, "seconds", "=", usec, "usec/iter"] => Some(Pingpong {
                iterations: iters.parse().ok()?,
                seconds: secs.parse().ok()?,
                usec_per_iter: usec.parse().ok()?,
            }),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured in the rxe VM (kernel 7.3.4, rdma-core 44, perftest 4.5), tor1-h0 -> tor0-h0.
    const LAT: &str = include_str!("testdata/ib_send_lat-ud.client.txt");
    const BW_CLIENT: &str = include_str!("testdata/ib_send_bw-ud.client.txt");
    const BW_SERVER: &str = include_str!("testdata/ib_send_bw-ud.server.txt");
    const PINGPONG: &str = include_str!("testdata/ibv_ud_pingpong.client.txt");

    #[test]
    fn send_lat_ud_table_is_read_including_tab_separated_columns() {
        let l = parse_send_lat(LAT).unwrap();
        assert_eq!(
            l,
            Latency {
                bytes: 64,
                iterations: 1000,
                min_us: 174.95,
                max_us: 4176.89,
                typical_us: 245.08,
                avg_us: 298.68,
                stdev_us: 191.38,
                p99_us: 1445.81,
                p999_us: 4176.89,
            }
        );
    }

    #[test]
    fn send_bw_ud_table_is_read_on_both_sides() {
        let c = parse_send_bw(BW_CLIENT).unwrap();
        assert_eq!(
            c,
            Bandwidth { bytes: 64, iterations: 1000, peak_mb_s: 0.39, avg_mb_s: 0.26, msg_rate_mpps: 0.004209 }
        );
        assert!((c.msgs_per_s() - 4209.0).abs() < 1e-6);
        assert_eq!(parse_send_bw(BW_SERVER).unwrap().msg_rate_mpps, 0.004223);
    }

    #[test]
    fn multi_word_columns_are_joined() {
        let row = result_row(LAT).unwrap();
        let names: Vec<&str> = row.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[7..], ["99% percentile[usec]", "99.9% percentile[usec]"]);
        let names: Vec<String> = result_row(BW_CLIENT).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["#bytes", "#iterations", "BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]"]);
    }

    #[test]
    fn output_without_a_result_is_none() {
        assert_eq!(parse_send_lat("Couldn't connect to 10.0.0.1:18515\n"), None);
        // A latency table is not a bandwidth table.
        assert_eq!(parse_send_bw(LAT), None);
        // The header without its row (the tool died mid-test).
        let cut: String = LAT.lines().take_while(|l| !l.starts_with(" 64")).collect::<Vec<_>>().join("\n");
        assert_eq!(parse_send_lat(&cut), None);
    }

    #[test]
    fn pingpong_summary_is_read() {
        assert_eq!(parse_pingpong(PINGPONG), Some(Pingpong { iterations: 500, seconds: 0.42, usec_per_iter: 831.28 }));
        assert_eq!(parse_pingpong("Couldn't get local address\n"), None);
    }
}
