//! Loads the QP tracer, counts what it sees for `SECONDS` (default 30), then prints one line:
//! RTR and destroy events read (one per hook call: the copies dropped), the copies dropped and
//! the kernel's counters. For looking at the tracer by hand in
//! the rxe VM (several copies at once show whether each sees every event); needs root.
use std::time::{Duration, Instant};

use rocemesh_bpf::{QpEventKind, Tracer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(30);
    let mut tracer = Tracer::load()?;
    println!("loaded; tracing for {seconds} s");
    let (mut rtr, mut destroyed, mut bad) = (0u64, 0u64, 0u64);
    let until = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < until {
        tracer.poll(Duration::from_millis(100), &mut |ev| match ev {
            Ok(e) if e.kind == QpEventKind::Rtr => rtr += 1,
            Ok(_) => destroyed += 1,
            Err(_) => bad += 1,
        })?;
    }
    let k = tracer.kernel_counters()?;
    println!("rtr={rtr} destroyed={destroyed} malformed={bad} duplicates={} kernel={k:?}", tracer.duplicates());
    Ok(())
}
