//! `ctl inventory lldp` on LLDP tables taken from real lldpd (1.0.16) in network namespaces: two
//! spines, two ToRs, one host under each, every daemon advertising every interface address
//! (`configure system ip management pattern '*'`, port IDs as interface names). `ok/` was
//! taken cabled as the inventory below says; `swapped/` with tor0's two uplinks swapped
//! (s0 to spine1, s1 to spine0). The hosts tor0-h1 and tor1-h1 ran no lldpd.

use std::path::{Path, PathBuf};
use std::process::Command;

use rocemesh_ctl::lldp::{self, Learned, Table};
use rocemesh_formats::inventory::Inventory;

const INVENTORY: &str = r#"
version = 1
[[tor]]
name = "tor0"
[[tor]]
name = "tor1"
[[spine]]
name = "spine0"
[[spine]]
name = "spine1"
[[link]]
a = "tor0"
b = "spine0"
[[link]]
a = "spine1"
b = "tor0"
[[link]]
a = "tor1"
b = "spine0"
[[link]]
a = "tor1"
b = "spine1"
[[host]]
name = "tor0-h0"
[[host.rnic]]
device = "rxe0"
tor = "tor0"
ip = "10.0.0.1"
[[host]]
name = "tor1-h0"
[[host.rnic]]
device = "rxe0"
tor = "tor1"
ip = "10.0.1.1"
[[host]]
name = "tor0-h1"
[[host.rnic]]
device = "rxe0"
tor = "tor0"
ip = "10.0.0.3"
[[host]]
name = "tor1-h1"
[[host.rnic]]
device = "rxe0"
tor = "tor1"
ip = "10.0.1.3"
"#;

fn data(set: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/lldp").join(set)
}

fn learn(inventory: &str, set: &str) -> Learned {
    let inv = Inventory::parse(inventory, Path::new("inventory.toml")).unwrap();
    let tables = lldp::load_tables(&[data(set)]).unwrap();
    lldp::apply(&inv, Path::new("inventory.toml"), &tables)
}

fn ports(inv: &Inventory) -> Vec<String> {
    let links = inv.links.iter().map(|l| format!("{}:{:?}|{}:{:?}", l.a, l.a_port, l.b, l.b_port));
    let rnics = inv.hosts.iter().flat_map(|h| h.rnics.iter().map(move |r| format!("{}:{:?}", h.name, r.tor_port)));
    links.chain(rnics).collect()
}

#[test]
fn tables_of_a_fabric_cabled_as_described_fill_every_port_and_the_switch_addresses() {
    let l = learn(INVENTORY, "ok");
    assert!(l.problems.is_empty(), "{:?}", l.problems);
    assert_eq!(
        ports(&l.inventory),
        [
            r#"tor0:Some("s0")|spine0:Some("t0")"#,
            r#"spine1:Some("t0")|tor0:Some("s1")"#,
            r#"tor1:Some("s0")|spine0:Some("t1")"#,
            r#"tor1:Some("s1")|spine1:Some("t1")"#,
            r#"tor0-h0:Some("h0")"#,
            r#"tor1-h0:Some("h0")"#,
            "tor0-h1:None",
            "tor1-h1:None",
        ]
    );
    assert_eq!((l.link_ports, l.rnic_ports, l.links_unported, l.rnics_unported), (8, 2, 0, 2));
    let addrs = |name: &str| {
        let inv = &l.inventory;
        let a = inv.tors.iter().find(|t| t.name == name).map(|t| &t.addrs);
        let mut v: Vec<String> = a
            .or(inv.spines.iter().find(|s| s.name == name).map(|s| &s.addrs))
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        v.sort();
        v
    };
    // Each switch's interface addresses, as its neighbours heard them; no link-local ones.
    assert_eq!(addrs("spine0"), ["172.16.0.1", "172.16.0.3"]);
    assert_eq!(addrs("spine1"), ["172.16.1.1", "172.16.1.3"]);
    assert_eq!(addrs("tor0"), ["10.0.0.0", "172.16.0.0", "172.16.1.0"]);
    assert_eq!(addrs("tor1"), ["10.0.1.0", "172.16.0.2", "172.16.1.2"]);
    // What was learned is a valid inventory, and learning again adds nothing.
    let text = l.inventory.to_toml_string().unwrap();
    let again = learn(&text, "ok");
    assert!(again.problems.is_empty(), "{:?}", again.problems);
    assert_eq!((again.link_ports, again.rnic_ports, again.addrs), (0, 0, 0));
    assert_eq!(again.inventory, l.inventory);
}

#[test]
fn swapped_uplinks_are_named_with_the_table_line_and_left_as_the_inventory_says() {
    let ported = learn(INVENTORY, "ok").inventory.to_toml_string().unwrap();
    let l = learn(&ported, "swapped");
    let said: Vec<String> = l.problems.iter().map(ToString::to_string).collect();
    // tor0's table and both spines' see each swapped cable: each on its port and line.
    for expect in [
        "link tor0|spine1 is on tor0 port s0, but inventory.toml puts it on tor0 port s1 (cables swapped?)",
        "link tor0|spine0 is on tor0 port s1, but inventory.toml puts it on tor0 port s0 (cables swapped?)",
    ] {
        assert!(said.iter().any(|s| s.contains(expect) && s.contains("tor0.json:")), "{expect}\n{said:#?}");
    }
    assert!(said.iter().all(|s| s.contains("(fix: ")), "{said:#?}");
    let line =
        |s: &str| s.split(".json:").nth(1).and_then(|r| r.split(':').next()).and_then(|n| n.parse::<usize>().ok());
    assert!(said.iter().all(|s| line(s).is_some_and(|n| n > 1)), "{said:#?}");
    // Nothing that disagrees is written.
    assert_eq!(ports(&l.inventory), ports(&Inventory::parse(&ported, Path::new("i")).unwrap()));
}

#[test]
fn a_host_under_another_tor_and_a_missing_or_extra_link_are_each_named() {
    // The inventory puts tor0-h0 under tor1, lacks tor1|spine1 and links tor0 to a spine2.
    let wrong = INVENTORY
        .replacen("tor = \"tor0\"", "tor = \"tor1\"", 1)
        .replace("[[link]]\na = \"tor1\"\nb = \"spine1\"\n", "[[link]]\na = \"tor0\"\nb = \"spine2\"\n")
        .replace("[[spine]]\nname = \"spine1\"\n", "[[spine]]\nname = \"spine1\"\n[[spine]]\nname = \"spine2\"\n");
    let l = learn(&wrong, "ok");
    let said: Vec<String> = l.problems.iter().map(ToString::to_string).collect();
    for expect in [
        "RNIC tor0-h0/rxe0 is cabled to tor0 port h0, but inventory.toml puts it under tor1",
        "tor1 port s1 reaches spine1 port t1, but inventory.toml has no link tor1|spine1 (tor1 is linked to spine0)",
        "link[3] tor0|spine2 is in no LLDP table (tor0 read)",
    ] {
        assert!(said.iter().any(|s| s.contains(expect)), "{expect}\n{said:#?}");
    }
    assert_eq!(l.inventory.hosts[0].rnics[0].tor_port, None);
}

#[test]
fn tables_are_read_in_both_of_lldpcli_json_shapes_and_bad_ones_are_refused_by_file() {
    // One neighbour: `interface` is an object; several: an array of one-key objects.
    let host = Table::load(&data("ok").join("tor0-h0.json")).unwrap();
    assert_eq!((host.node.as_str(), host.seen.len()), ("tor0-h0", 1));
    let s = &host.seen[0];
    assert_eq!((s.port.as_str(), s.peer.as_deref(), s.peer_port.as_deref()), ("eth0", Some("tor0"), Some("h0")));
    let tor = Table::load(&data("ok").join("tor0.json")).unwrap();
    let ports: Vec<&str> = tor.seen.iter().map(|s| s.port.as_str()).collect();
    assert_eq!(ports, ["s0", "s1", "h0"]);
    let text = std::fs::read_to_string(data("ok").join("tor0.json")).unwrap();
    for s in &tor.seen {
        assert_eq!(text.lines().nth(s.line - 1).map(str::trim), Some(format!("\"{}\": {{", s.port).as_str()));
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("tor9.json");
    std::fs::write(&bad, "{\"lldp\": {\"interface\": 7}}").unwrap();
    let e = Table::load(&bad).unwrap_err().to_string();
    assert!(e.contains("tor9.json") && e.contains("lldpcli -f json show neighbors"), "{e}");
    std::fs::write(&bad, r#"{"lldp": [{"interface": [{"name": "eth0"}]}]}"#).unwrap();
    let e = Table::load(&bad).unwrap_err().to_string();
    assert!(e.contains("`json0`"), "lldpcli -f json0 is refused, not read as empty: {e}");
    std::fs::write(&bad, "{\"lldp\": \n[").unwrap();
    let e = Table::load(&bad).unwrap_err().to_string();
    assert!(e.contains("tor9.json") && e.contains("line 2"), "{e}");
    // A table of a node the inventory does not have.
    std::fs::write(&bad, "{\"lldp\": {}}").unwrap();
    let inv = Inventory::parse(INVENTORY, Path::new("inventory.toml")).unwrap();
    let l = lldp::apply(&inv, Path::new("inventory.toml"), &[Table::load(&bad).unwrap()]);
    assert!(l.problems[0].to_string().contains("no tor, spine or host is named \"tor9\""), "{:?}", l.problems);
}

#[test]
fn the_command_writes_what_agrees_and_exits_1_on_cabling_that_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("inventory.toml");
    std::fs::write(&inv, INVENTORY).unwrap();
    let ctl = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_ctl")).args(args).output().unwrap();
    let (i, ok, swapped) = (inv.to_str().unwrap(), data("ok"), data("swapped"));
    let out = ctl(&["inventory", "lldp", "--inventory", i, ok.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "in place needs --force: {out:?}");
    let out = ctl(&["inventory", "lldp", "--inventory", i, "--force", ok.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("8 link ends and 2 RNIC ports set, 10 switch addresses added, from 6 LLDP tables; still without ports: 0 links, 2 RNICs"), "{said}");
    let ported = Inventory::load(&inv).unwrap();
    assert_eq!(ported.links[0].port_at("tor0"), Some("s0"));
    let out = ctl(&["inventory", "lldp", "--inventory", i, "--force", swapped.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("(cables swapped?)"), "{said}");
    assert_eq!(Inventory::load(&inv).unwrap(), ported);
}

fn seen(line: usize, port: &str, peer: &str, peer_port: &str, mgmt: &[&str]) -> lldp::Seen {
    lldp::Seen {
        line,
        port: port.into(),
        peer: Some(peer.into()),
        peer_port: Some(peer_port.into()),
        mgmt: mgmt.iter().map(|a| a.parse().unwrap()).collect(),
    }
}

fn table(node: &str, seen: Vec<lldp::Seen>) -> Table {
    Table { file: PathBuf::from(format!("{node}.json")), node: node.into(), seen }
}

#[test]
fn hosts_with_several_rnics_advertising_every_address_get_each_rnic_its_own_port() {
    // A two-rail host (one RNIC under each ToR) and a host with two RNICs under one ToR, each
    // advertising all its addresses on every port, as lldpd's pattern '*' does.
    let inv = Inventory::parse(
        r#"
version = 1
[[tor]]
name = "tor0"
[[tor]]
name = "tor1"
[[host]]
name = "a"
[[host.rnic]]
device = "r0"
tor = "tor0"
ip = "10.0.0.1"
[[host.rnic]]
device = "r1"
tor = "tor1"
ip = "10.0.1.1"
[[host]]
name = "b"
[[host.rnic]]
device = "r0"
tor = "tor0"
ip = "10.0.0.3"
[[host.rnic]]
device = "r1"
tor = "tor0"
ip = "10.0.0.5"
"#,
        Path::new("i.toml"),
    )
    .unwrap();
    let a = ["10.0.0.1", "10.0.1.1"];
    let b = ["10.0.0.3", "10.0.0.5"];
    let tables = [
        table(
            "tor0",
            vec![seen(3, "p1", "a", "eth0", &a), seen(9, "p2", "b", "eth0", &b), seen(15, "p3", "b", "eth1", &b)],
        ),
        table("tor1", vec![seen(3, "p1", "a", "eth1", &a)]),
        table("b", vec![seen(3, "eth0", "tor0", "p2", &[]), seen(9, "eth1", "tor0", "p3", &[])]),
    ];
    let l = lldp::apply(&inv, Path::new("i.toml"), &tables);
    assert!(l.problems.is_empty(), "{:#?}", l.problems);
    let ports: Vec<Option<&str>> =
        l.inventory.hosts.iter().flat_map(|h| &h.rnics).map(|r| r.tor_port.as_deref()).collect();
    // Host b's two RNICs under tor0 cannot be told apart by what LLDP says: left without ports.
    assert_eq!(ports, [Some("p1"), Some("p1"), None, None]);
    assert_eq!(l.rnics_unported, 2);

    // With the netdevs `agent describe` found (kept by `inventory import`), the interface each
    // table names tells them apart: from the ToR's table and the host's alike, or either alone.
    let mut with_netdevs = inv.clone();
    for (r, netdev) in with_netdevs.hosts[1].rnics.iter_mut().zip(["eth0", "eth1"]) {
        r.netdev = Some(netdev.into());
    }
    for tables in [&tables[..], &tables[..1], &tables[2..]] {
        let l = lldp::apply(&with_netdevs, Path::new("i.toml"), tables);
        assert!(l.problems.is_empty(), "{:#?}", l.problems);
        let b_ports: Vec<Option<&str>> = l.inventory.hosts[1].rnics.iter().map(|r| r.tor_port.as_deref()).collect();
        assert_eq!(b_ports, [Some("p2"), Some("p3")], "from {} tables", tables.len());
    }
    // Host a's two rails swapped at the host (eth0, r0's, into tor1; eth1 into tor0): each
    // named as a miscabling, no port given; a management port on tor0 is no RNIC's cable.
    let mut rails = with_netdevs.clone();
    for (r, netdev) in rails.hosts[0].rnics.iter_mut().zip(["eth0", "eth1"]) {
        r.netdev = Some(netdev.into());
    }
    let swapped = [table(
        "a",
        vec![
            seen(3, "eth0", "tor1", "p1", &[]),
            seen(9, "eth1", "tor0", "p1", &[]),
            seen(15, "eno1", "tor0", "p9", &[]),
        ],
    )];
    let l = lldp::apply(&rails, Path::new("i.toml"), &swapped);
    let said: Vec<String> = l.problems.iter().map(ToString::to_string).collect();
    assert_eq!(said.len(), 2, "{said:#?}");
    assert!(said[0].contains("RNIC a/r0 is cabled to tor1 port p1, but i.toml puts it under tor0"), "{said:#?}");
    assert!(said[1].contains("RNIC a/r1 is cabled to tor0 port p1, but i.toml puts it under tor1"), "{said:#?}");
    assert!(l.inventory.hosts[0].rnics.iter().all(|r| r.tor_port.is_none()));
    assert!(l.ignored.iter().any(|i| i.contains("a eno1 to tor0 port p9")), "{:?}", l.ignored);

    // Written and read back, the inventory keeps them.
    let text = with_netdevs.to_toml_string().unwrap();
    assert!(text.contains("netdev = \"eth1\""), "{text}");
    assert_eq!(Inventory::parse(&text, Path::new("i.toml")).unwrap(), with_netdevs);
}

#[test]
fn a_port_already_given_is_never_given_twice_and_a_parallel_cable_is_a_note() {
    // tor0-h0 is on h0 in the inventory; the tables see tor0-h1 on h0 (the two hosts' cables
    // swapped), and tor0|spine0 with a second cable (s4/t4) beside the inventory's s0/t0.
    let ported = learn(INVENTORY, "ok").inventory.to_toml_string().unwrap();
    let inv = Inventory::parse(&ported, Path::new("i.toml")).unwrap();
    let tables = [table(
        "tor0",
        vec![
            seen(3, "h0", "tor0-h1", "eth0", &["10.0.0.3"]),
            seen(9, "s0", "spine0", "t0", &[]),
            seen(15, "s4", "spine0", "t4", &[]),
        ],
    )];
    let l = lldp::apply(&inv, Path::new("i.toml"), &tables);
    let said: Vec<String> = l.problems.iter().map(ToString::to_string).collect();
    assert!(
        said.iter().any(|s| s
            .contains("tor0 port h0 is RNIC tor0-h0/rxe0's in the inventory, and LLDP sees RNIC tor0-h1/rxe0 on it")),
        "{said:#?}"
    );
    assert!(!said.iter().any(|s| s.contains("swapped")), "a parallel cable is not a swap: {said:#?}");
    assert!(l.ignored.iter().any(|s| s.contains("a second cable of tor0|spine0")), "{:?}", l.ignored);
    assert_eq!(l.inventory.hosts[2].rnics[0].tor_port, None);
    // Whatever was learned loads.
    Inventory::parse(&l.inventory.to_toml_string().unwrap(), Path::new("i.toml")).unwrap();
}
