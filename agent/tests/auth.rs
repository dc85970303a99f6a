//! Authenticated probes between real agent processes: forged, replayed, stale, wrong-key,
//! old-key and unauthenticated packets sent as fast as one socket can are never answered (the
//! last two get rate-limited REFUSALs, which carry nothing) and all counted; the agents' own
//! probing loses nothing, through a key rotation too; and a host a key push missed is refused,
//! never lost, both ways.

mod common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{PORT, addr, assert_pair_lossless, final_stat, finish, finish_all, name, records, setup, spawn};
use rocemesh_agent::protocol::{Binding, Kind, MacKey, PACKET_BYTES, Packet};
use rocemesh_formats::keys::{FILE_NAME, FleetKey, FleetKeys};
use rocemesh_formats::record::Outcome;

const CURRENT: [u8; 32] = [0x5c; 32];
const OLD: [u8; 32] = [0x0d; 32];
const NEXT: [u8; 32] = [0x7e; 32];

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64
}

fn write_keys(dir: &Path, keys: &FleetKeys) {
    let tmp = dir.join(".keys.tmp");
    std::fs::write(&tmp, keys.to_toml_string().expect("toml")).expect("write keys");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::rename(&tmp, dir.join(FILE_NAME)).expect("rename");
}

fn key(id: u8, secret: [u8; 32], send_from: u64, until: Option<u64>) -> FleetKey {
    let mut k = FleetKey::new(id, secret, send_from);
    k.accept_until_unix_s = until;
    k
}

const AUTH: &str = "\n[auth]\nkeys = \"fleet-keys.toml\"\nwindow_ms = 10000\n";

/// Packets dropped by the kernel at the socket bound to `at` (its receive buffer was full):
/// the `drops` column of /proc/net/udp.
fn socket_drops(at: SocketAddr) -> u64 {
    let (IpAddr::V4(ip), port) = (at.ip(), at.port()) else { panic!("IPv4 only") };
    let local = format!("{:08X}:{port:04X}", u32::from_le_bytes(ip.octets()));
    let table = std::fs::read_to_string("/proc/net/udp").expect("/proc/net/udp");
    let line = table.lines().find(|l| l.split_whitespace().nth(1) == Some(local.as_str())).expect("the agent's socket");
    line.split_whitespace().last().and_then(|d| d.parse().ok()).expect("drops column")
}

fn probe(seq: u64) -> Packet {
    Packet { kind: Kind::Probe, seq, flow_label: 1, responder_epoch: 0, t3_ns: 0, t4_ns: 0 }
}

/// Answers waiting on `s`, read until it has been quiet for `quiet`: (ACKs, REFUSALs). As root
/// the agent also traces the path of its answers (TTL-limited packets whose last one reaches
/// the prober): those are not answers.
fn drain(s: &UdpSocket, quiet: Duration) -> (usize, usize) {
    s.set_read_timeout(Some(quiet)).expect("timeout");
    let mut buf = [0u8; 128];
    let (mut acks, mut refusals) = (0, 0);
    while let Ok(len) = s.recv(&mut buf) {
        if rocemesh_agent::pathtrace::is_trace_payload(&buf[..len]) {
            continue;
        }
        let (p, _) = Packet::parse(&buf[..len]).expect("an agent sends ACKs, REFUSALs or trace packets only");
        match p.kind {
            Kind::Probe => panic!("an agent never sends a probe to a prober's socket"),
            Kind::Refusal => refusals += 1,
            Kind::Ack1 | Kind::Ack2 => acks += 1,
        }
    }
    (acks, refusals)
}

#[test]
fn forged_replayed_stale_and_old_key_packets_at_line_rate_are_never_answered_and_all_counted() {
    let root = tempfile::tempdir().expect("tempdir");
    let net = 41;
    let now = now_s();
    // An old key past its grace (still in the file, no longer accepted) and the key in force.
    let mut keys = FleetKeys::new();
    keys.keys.push(key(1, OLD, now - 3600, Some(now - 60)));
    keys.keys.push(key(2, CURRENT, now - 60, None));
    let configs: Vec<_> = (0..2).map(|i| setup(root.path(), net, i, 2, 50.0, "event", AUTH)).collect();
    for c in &configs {
        write_keys(c.parent().expect("dir"), &keys);
    }
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 9)).collect();
    std::thread::sleep(Duration::from_millis(1500));

    let attacker = UdpSocket::bind((addr(net, 9), 0)).expect("bind");
    let target = SocketAddr::new(addr(net, 0), PORT);
    attacker.connect(target).expect("connect");
    let current = MacKey::new(2, CURRENT);
    // Sealed for agent 0's socket, as its peers seal for it.
    let to = Binding::of_socket(target);

    // A fleet member's probes (valid seals): each answered with ACK1 and ACK2, once.
    let valid: Vec<[u8; PACKET_BYTES]> = (0..50u64)
        .map(|i| {
            let mut b = [0u8; PACKET_BYTES];
            probe(0x7777_0000_0000_0001 + i).seal(&mut b, &current, now_ns(), &to);
            b
        })
        .collect();
    for b in &valid {
        attacker.send(b).expect("send");
        std::thread::sleep(Duration::from_millis(2));
    }
    let answers = drain(&attacker, Duration::from_millis(500));
    assert_eq!(answers, (2 * valid.len(), 0), "each valid probe gets ACK1 and ACK2");

    // Then the attack, as fast as the socket goes, for 2 s: six kinds in turn.
    let drops_before = socket_drops(target);
    let old = MacKey::new(1, OLD);
    let wrong_secret = MacKey::new(2, [0x5d; 32]);
    let mut sent = [0u64; 6];
    let mut b = [0u8; PACKET_BYTES];
    let until = Instant::now() + Duration::from_secs(2);
    let mut i = 0u64;
    while Instant::now() < until {
        let kind = (i % 6) as usize;
        match kind {
            0 => b = valid[(i / 6) as usize % valid.len()],           // replay
            1 => probe(i).seal(&mut b, &old, now_ns(), &to),          // old key
            2 => probe(i).seal(&mut b, &wrong_secret, now_ns(), &to), // wrong secret
            3 => probe(i).seal(&mut b, &current, now_ns() - 60_000_000_000, &to), // stale
            4 => probe(i).encode(&mut b),                             // unauthenticated
            _ => {
                // forged: a keyed header, the current key's id, a made-up tag
                probe(i).seal(&mut b, &current, now_ns(), &to);
                b[48..].copy_from_slice(&i.to_le_bytes().repeat(2));
            }
        }
        if attacker.send(&b).is_ok() {
            sent[kind] += 1;
        }
        i += 1;
    }
    let total: u64 = sent.iter().sum();
    let (answered_during_attack, refusals) = drain(&attacker, Duration::from_millis(1000));
    let dropped = socket_drops(target) - drops_before;

    let errs = finish_all(children);
    assert_eq!(answered_during_attack, 0, "nothing of the attack is answered ({total} sent)");
    // Old-key and unauthenticated probes are refused aloud, at most at the REFUSAL rate (a
    // burst of one second's, then 2 s of it); the forged, stale and replayed ones silently.
    // (The attacker reads them only after the attack: its socket buffer keeps the first few.)
    let most = 3 * u64::from(rocemesh_agent::auth::REFUSALS_PER_S);
    let refusals_sent = final_stat(&errs[0], "refusals_sent");
    assert!(refusals > 0 && refusals as u64 <= refusals_sent, "{refusals} REFUSALs arrived, {refusals_sent} sent");
    assert!(refusals_sent <= most, "{refusals_sent} REFUSALs sent for {total} packets: the rate limit holds");
    let refused = final_stat(&errs[0], "auth_refused");
    eprintln!("attack: {total} packets in 2 s ({sent:?}), refused {refused}, dropped by the kernel {dropped}");
    assert!(total > 20_000, "line rate means many packets: {total}");
    assert_eq!(refused + dropped, total, "every packet counted: refused by the agent or dropped by the kernel");
    let line = errs[0].lines().rev().find(|l| l.contains("final_=true")).expect("final stats");
    for (reason, n) in [
        ("replay", sent[0]),
        ("unknown_key", sent[1]),
        ("bad_mac", sent[2] + sent[5]),
        ("stale", sent[3]),
        ("unauthenticated", sent[4]),
    ] {
        let got = line
            .split(&format!("{reason}="))
            .nth(1)
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        assert!(got > 0 && got <= n, "{reason}: {got} counted of {n} sent\n{line}");
        if dropped == 0 {
            assert_eq!(got, n, "{reason}, with no kernel drops every one is counted\n{line}");
        }
    }
    // Agent 0 answered the 50 valid probes and agent 1's, nothing of the attack: at least every
    // probe agent 1 completed, at most every one it sent (its last may meet agent 0 stopping).
    let answered = final_stat(&errs[0], "answered") - valid.len() as u64;
    let (ok1, sent1) = (final_stat(&errs[1], "ok"), final_stat(&errs[1], "sent"));
    assert!((ok1..=sent1).contains(&answered), "answered {answered} of agent 1's {sent1} sent, {ok1} ok");
    // The agents' own authenticated probing lost nothing under attack.
    for err in &errs {
        assert!(err.contains("fleet keys in force") && err.contains("sending=2"), "{err}");
    }
    assert_pair_lossless(root.path(), &errs, 200);
}

/// A rotation pushed to one agent 2 s after the other, within the grace: the new key is
/// accepted on arrival and sent from its time, the old one accepted through its grace; no probe
/// is lost, and both agents end sending with the new key.
#[test]
fn a_key_rotation_pushed_unevenly_within_the_grace_loses_no_probe() {
    let root = tempfile::tempdir().expect("tempdir");
    let net = 42;
    let now = now_s();
    let mut keys = FleetKeys::new();
    keys.keys.push(key(1, CURRENT, now - 60, None));
    let configs: Vec<_> = (0..2).map(|i| setup(root.path(), net, i, 2, 50.0, "event", AUTH)).collect();
    let dirs: Vec<_> = configs.iter().map(|c| c.parent().expect("dir").to_path_buf()).collect();
    for d in &dirs {
        write_keys(d, &keys);
    }
    let children: Vec<_> = configs.iter().map(|c| spawn(c, 10)).collect();
    std::thread::sleep(Duration::from_secs(2));
    // Key 2 is sent from 4 s from now; key 1 accepted until 4 s after that.
    let t = now_s();
    keys.keys[0].accept_until_unix_s = Some(t + 8);
    keys.keys.push(key(2, NEXT, t + 4, None));
    write_keys(&dirs[0], &keys);
    std::thread::sleep(Duration::from_secs(2));
    write_keys(&dirs[1], &keys);
    let errs = finish_all(children);
    for (i, err) in errs.iter().enumerate() {
        assert!(err.contains("fleet keys reloaded"), "agent {i} took the new file:\n{err}");
        assert_eq!(final_stat(err, "send_key"), 2, "agent {i} ends sending with the new key");
        assert_eq!(final_stat(err, "auth_refused"), 0, "agent {i}:\n{err}");
    }
    assert_pair_lossless(root.path(), &errs, 300);
}

/// A key file others can read stops the agent at start, naming the file and the chmod.
#[test]
fn a_world_readable_key_file_is_refused_at_start() {
    let root = tempfile::tempdir().expect("tempdir");
    let config = setup(root.path(), 43, 0, 1, 10.0, "event", AUTH);
    let dir = config.parent().expect("dir");
    let mut keys = FleetKeys::new();
    keys.rotate(now_s(), 0, CURRENT).expect("key");
    write_keys(dir, &keys);
    std::fs::set_permissions(dir.join(FILE_NAME), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let (code, err) = finish(spawn(&config, 1));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("fleet-keys.toml") && err.contains("chmod 600"), "{err}");
}

/// Issue 33, item 7: a host the key push missed (agent 1 runs without keys while agent 0 seals
/// with the fleet key) is alive but keyed otherwise. Each refuses the other's probes for their
/// keying alone and says so with a REFUSAL: both record those probes `auth_refused` (the
/// `refused` class: never loss, never evidence), none lost. They had recorded every such probe
/// lost, both ways: a dead RNIC to localisation.
#[test]
fn a_host_the_key_push_missed_is_refused_never_lost_both_ways() {
    let root = tempfile::tempdir().expect("tempdir");
    let net = 45;
    let mut keys = FleetKeys::new();
    keys.keys.push(key(1, CURRENT, now_s() - 60, None));
    let keyed = setup(root.path(), net, 0, 2, 50.0, "event", AUTH);
    write_keys(keyed.parent().expect("dir"), &keys);
    let missed = setup(root.path(), net, 1, 2, 50.0, "event", "");
    let children = vec![spawn(&keyed, 4), spawn(&missed, 4)];
    let errs = finish_all(children);
    for (i, err) in errs.iter().enumerate() {
        let recs = records(root.path(), i);
        let to_peer: Vec<u8> = recs.iter().filter(|(t, _)| *t == name(1 - i)).map(|(_, r)| r.outcome).collect();
        let count = |o: Outcome| to_peer.iter().filter(|&&x| x == o as u8).count();
        assert!(
            count(Outcome::AuthRefused) > 100,
            "agent {i}: {} auth_refused of {}\n{err}",
            count(Outcome::AuthRefused),
            to_peer.len()
        );
        assert_eq!(count(Outcome::Lost), 0, "agent {i}: nothing lost\n{err}");
        assert_eq!(count(Outcome::Ok), 0, "agent {i}: nothing answered across the keys");
        assert_eq!(final_stat(err, "lost"), 0, "agent {i}:\n{err}");
        assert!(final_stat(err, "refusals_sent") > 100, "agent {i} refused its peer aloud:\n{err}");
    }
    assert!(final_stat(&errs[0], "probes_auth_refused") > 100, "{}", errs[0]);
}
