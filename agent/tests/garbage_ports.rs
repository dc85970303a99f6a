//! Garbage to every port a running agent listens on, found from its own open sockets (so a
//! port added later is covered without touching this test): UDP datagrams of every awkward
//! size to each UDP socket (the probe port and every source port), and junk, a stall and a
//! flood to each TCP listener (`/metrics`). The agent must count what it refuses, answer
//! nothing, keep probing without loss, and exit cleanly.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use common::{addr, assert_pair_lossless, final_stat, finish_all, setup, spawn};

/// Local addresses of the sockets process `pid` holds, from /proc: (udp, tcp listeners).
fn listening(pid: u32) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the agent's fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
        .collect();
    let table = |file: &str, tcp: bool| -> Vec<SocketAddr> {
        let text = std::fs::read_to_string(file).expect("proc net table");
        text.lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // local_address, st (0A = LISTEN for TCP), inode
                if !inodes.iter().any(|i| i == f[9]) || (tcp && f[3] != "0A") {
                    return None;
                }
                let (ip, port) = f[1].split_once(':')?;
                let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_le_bytes());
                Some(SocketAddr::new(ip.into(), u16::from_str_radix(port, 16).ok()?))
            })
            .collect()
    };
    (table("/proc/net/udp", false), table("/proc/net/tcp", true))
}

#[test]
fn garbage_to_every_port_the_agent_listens_on_is_counted_and_never_answered() {
    let root = tempfile::tempdir().expect("tempdir");
    let net = 44;
    let metrics = format!("\n[metrics]\nlisten = \"{}:18699\"\n", addr(net, 0));
    let configs: Vec<_> = (0..2)
        .map(|i| {
            setup(
                root.path(),
                net,
                i,
                2,
                50.0,
                "event",
                &format!("source_ports = 4\n{}", if i == 0 { &metrics } else { "" }),
            )
        })
        .collect();
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 7)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let (udp, tcp) = listening(children[0].id());
    assert_eq!(udp.len(), 5, "the probe port and 4 source ports: {udp:?}");
    assert_eq!(tcp.len(), 1, "the /metrics listener: {tcp:?}");

    let s = UdpSocket::bind((addr(net, 9), 0)).expect("bind");
    let mut datagrams = 0u64;
    let mut header = [0u8; 64];
    header[0..4].copy_from_slice(b"RMPB");
    for to in &udp {
        let to = SocketAddr::new(addr(net, 0), to.port());
        for len in [0usize, 1, 7, 63, 65, 200, 1472, 8000] {
            s.send_to(&vec![0x5a; len], to).expect("send");
            datagrams += 1;
        }
        // Our magic with every version byte and a zero checksum.
        for version in 0..=255u8 {
            header[4] = version;
            s.send_to(&header, to).expect("send");
            datagrams += 1;
        }
    }
    for to in &tcp {
        // Junk, then a client that connects and says nothing, then a request that never ends.
        let mut junk = TcpStream::connect(to).expect("connect");
        junk.write_all(&[0xff; 4096]).expect("write");
        let mut reply = String::new();
        let _ = junk.read_to_string(&mut reply);
        assert!(reply.starts_with("HTTP/1.1 400"), "junk gets a 400: {reply:?}");
        let _idle = TcpStream::connect(to).expect("connect");
        let mut endless = TcpStream::connect(to).expect("connect");
        let _ = endless.write_all(&vec![b'a'; 64 * 1024]);
        // The endpoint still serves a real scrape afterwards.
        std::thread::sleep(Duration::from_millis(2500));
        let page = common::http_get(*to, "/metrics").expect("a scrape after the abuse");
        assert!(page.contains("rocemesh_packets_ignored_total"), "{page}");
    }
    let mut buf = [0u8; 128];
    s.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
    assert!(s.recv(&mut buf).is_err(), "nothing is ever answered to garbage");

    let errs = finish_all(children);
    assert_eq!(final_stat(&errs[0], "malformed"), datagrams, "every datagram counted, on every socket");
    assert_pair_lossless(root.path(), &errs, 150);
}
