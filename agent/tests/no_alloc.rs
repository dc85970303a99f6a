//! No allocation per probe: two shards over real loopback sockets, one probing the other at
//! ~50k probes/s, stepped in one thread under a counting allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rocemesh_agent::shard::{Shard, ShardParams, UdpResolver};
use rocemesh_agent::udp::{UdpTransport, unspecified_like};
use rocemesh_formats::pinglist::{Pinglist, ProbeKind, Target};
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity};

struct Counting;
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn shard(dir: &std::path::Path, device: &str, epoch: u32) -> Shard<UdpTransport> {
    // With source ports: epoll and the per-socket grouping must not allocate either.
    let t = UdpTransport::bind_with_source_ports("127.0.0.1:0".parse().expect("addr"), 8).expect("bind");
    let w = SegmentWriter::new(WriterConfig::new(dir.join(device)), WriterIdentity::default()).expect("writer");
    let params = ShardParams {
        host: "h".into(),
        device: device.into(),
        tor: "t".into(),
        epoch,
        default_port: 0,
        flush_interval_ns: 50_000_000,
        ignore_probe_fraction: 0.0,
        send_ahead_ns: 0,
    };
    Shard::new(params, t, w, unspecified_like(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

#[test]
fn probing_and_answering_do_not_allocate_after_warm_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut prober = shard(dir.path(), "a", 0xA);
    let mut responder = shard(dir.path(), "b", 0xB);
    let target_port = responder.transport().local_addr().port();
    let targets = (0..50)
        .map(|i| Target {
            from: "a".into(),
            to: format!("t{i}/b"),
            kind: ProbeKind::TorMesh,
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: Some(target_port),
            qpn: None,
            rate_pps: 1000.0,
            flow_labels: vec![1, 2, 3, 4],
        })
        .collect();
    let pl = Pinglist { version: 1, host: "h".into(), generation: 1, generated_unix_ns: 0, timeout_ms: 500, targets };
    prober.load(&pl, &UdpResolver);
    let run = |prober: &mut Shard<UdpTransport>, responder: &mut Shard<UdpTransport>, d: Duration| {
        let until = Instant::now() + d;
        while Instant::now() < until {
            prober.step().expect("step");
            responder.step().expect("step");
        }
    };
    run(&mut prober, &mut responder, Duration::from_millis(700));
    let ok_before = prober.stats().ok;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    run(&mut prober, &mut responder, Duration::from_millis(1500));
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let completed = prober.stats().ok - ok_before;
    assert!(completed > 20_000, "the measured span must see real traffic: {completed} probes, {:?}", prober.stats());
    assert_eq!(prober.stats().lost, 0, "{:?}", prober.stats());
    assert_eq!(allocations, 0, "allocations over {completed} completed probes");
}
