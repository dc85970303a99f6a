//! Profile the append path alone: `perf record cargo run --release --example append_profile`.
use std::time::Instant;

use rocemesh_bench::synth::ShardStream;
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity};

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(8_000_000);
    let age_s: u64 = std::env::args().nth(2).map(|s| s.parse()).transpose()?.unwrap_or(600);
    let records = ShardStream::new(42, 1_700_000_000_000_000_000).take_vec(n);
    let dir = tempfile::tempdir()?;
    let mut cfg = WriterConfig::new(dir.path());
    cfg.max_age_ns = age_s * 1_000_000_000;
    let mut w = SegmentWriter::new(cfg, WriterIdentity::default())?;
    let t = Instant::now();
    for r in &records {
        w.append(r)?;
    }
    let appended = t.elapsed().as_secs_f64();
    let closed = w.finish()?;
    let total = t.elapsed().as_secs_f64();
    println!(
        "{n} records, {} segments: append loop {:.1} M/s, with finish {:.1} M/s",
        closed.len(),
        n as f64 / appended / 1e6,
        n as f64 / total / 1e6
    );
    Ok(())
}
