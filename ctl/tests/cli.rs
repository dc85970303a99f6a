//! The `ctl` binary on real files: import from host descriptions, inventory check, switch
//! addresses from a list, and deterministic pinglist generation.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use rocemesh_ctl::describe::{HostDescription, RnicDescription};
use rocemesh_formats::inventory::Inventory;
use rocemesh_formats::pinglist::Pinglist;

fn ctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ctl")).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// What `agent describe` would print on 2 scalable units × 3 hosts × 4 rails.
fn describe_cluster(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for su in 0..2 {
        for n in 1..=3 {
            let d = HostDescription {
                version: 1,
                host: format!("su{su}-n{n:02}"),
                rnics: (0..4)
                    .map(|k| RnicDescription {
                        device: format!("mlx5_{k}"),
                        ip: format!("10.{k}.{su}.{n}").parse().unwrap(),
                        gid: Some(format!("::ffff:10.{k}.{su}.{n}").parse().unwrap()),
                        port: 1,
                        gid_index: Some(3),
                        netdev: Some(format!("ens{k}f0np0")),
                    })
                    .collect(),
            };
            std::fs::write(dir.join(format!("{}.toml", d.host)), d.to_toml_string().unwrap()).unwrap();
        }
    }
}

/// A scratch directory whose `described/` holds [`describe_cluster`]'s hosts.
fn described_cluster() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    describe_cluster(&tmp.path().join("described"));
    tmp
}

/// A ToR map placing every host of [`describe_cluster`] under `rack<su>`, except su1-n03.
fn map_without_su1_n03() -> String {
    let mut map = String::from("host,device,tor\n");
    for su in 0..2 {
        for n in 1..=3 {
            if (su, n) != (1, 3) {
                map.push_str(&format!("su{su}-n{n:02},*,rack{su}\n"));
            }
        }
    }
    map
}

/// `ctl inventory import` of the hosts in `dir/described` into `dir/inv.toml`, with `args`.
fn import(dir: &Path, args: &[&str]) -> Output {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let (described, out) = (p("described"), p("inv.toml"));
    let mut all = vec!["inventory", "import", &described, "--output", &out];
    all.extend_from_slice(args);
    ctl(&all)
}

/// [`import`] with `map` as the ToR map (`dir/map.csv`).
fn import_with_map(dir: &Path, map: &str) -> Output {
    let path = dir.join("map.csv");
    std::fs::write(&path, map).unwrap();
    import(dir, &["--tor-map", path.to_str().unwrap()])
}

fn read_dir(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect()
}

#[test]
fn import_a_rail_optimised_cluster_then_check_and_generate() {
    let tmp = described_cluster();
    let p = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();

    let out = import(
        tmp.path(),
        &[
            "--rail-optimised",
            "--host-regex",
            "^su(?P<su>[0-9]+)-",
            "--tor-name",
            "su{su}-rail{rail}",
            "--spines",
            "4",
            "--link-all",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("rail 3: mlx5_3"), "{}", text(&out));
    let inv = Inventory::load(p("inv.toml")).unwrap();
    assert_eq!((inv.hosts.len(), inv.tors.len(), inv.spines.len(), inv.links.len()), (6, 8, 4, 32));
    let h = &inv.hosts[4];
    assert_eq!((h.name.as_str(), h.rnics[2].tor.as_str(), h.rnics[2].gid_index), ("su1-n02", "su1-rail2", Some(3)));
    // The GID the agent reported is the derived one, so the inventory leaves it out.
    assert_eq!(h.rnics[2].gid, None);

    // Importing again over the file needs --force.
    let again = import(tmp.path(), &["--rail-optimised"]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("--force"), "{}", text(&again));

    let out = ctl(&["inventory", "check", "--inventory", &p("inv.toml")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for needle in [
        "hosts          6",
        "RNICs         24",
        "ToRs           8",
        "rails          4",
        "spines         4",
        "links         32",
    ] {
        assert!(text(&out).contains(needle), "{needle}: {}", text(&out));
    }

    let gen_args = |out_dir: &str, seed: &str| {
        vec![
            "gen-pinglists".to_owned(),
            "--inventory".to_owned(),
            p("inv.toml"),
            "--out".to_owned(),
            p(out_dir),
            "--seed".to_owned(),
            seed.to_owned(),
            "--generation".to_owned(),
            "7".to_owned(),
            "--now-unix-ns".to_owned(),
            "1700000000000000000".to_owned(),
        ]
    };
    let run = |args: Vec<String>| ctl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = run(gen_args("a", "42"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("flow labels per inter-ToR target: 21 (m = 4 ECMP paths, the inventory's spines"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("within a rail is probed in any 1 consecutive generation"), "{}", text(&out));
    assert_eq!(run(gen_args("b", "42")).status.code(), Some(0));
    assert_eq!(run(gen_args("c", "43")).status.code(), Some(0));
    let (a, b, c) = (read_dir(&tmp.path().join("a")), read_dir(&tmp.path().join("b")), read_dir(&tmp.path().join("c")));
    // Six pinglists, the manifest and the (empty) generation lock; no incomplete marker.
    assert_eq!(a.len(), 8, "{:?}", a.keys());
    assert!(a.contains_key(".gen-pinglists.lock") && !a.contains_key(".gen-pinglists.incomplete"), "{:?}", a.keys());
    assert_eq!(a, b, "same seed, same inventory: byte-identical output");
    assert_ne!(a, c);
    for name in a.keys().filter(|n| n.ends_with(".toml")) {
        let pl = Pinglist::load(tmp.path().join("a").join(name)).unwrap();
        assert_eq!((pl.generation, format!("{}.toml", pl.host)), (7, name.clone()));
        // 4 RNICs × (2 ToR-mesh + 1 inter-ToR in the rail's other ToR).
        assert_eq!(pl.targets.len(), 12, "{name}");
    }

    // Without --generation the next one is taken; an older one is refused.
    let mut next = gen_args("a", "42");
    next.truncate(7);
    let out = run(next);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).starts_with("generation 8:"), "{}", text(&out));
    let mut older = gen_args("a", "42");
    older[8] = "3".to_owned();
    let out = run(older);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("older than generation 8"), "{}", text(&out));
}

#[test]
fn import_with_a_tor_map_names_what_is_missing() {
    let tmp = described_cluster();
    let p = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();
    let mut map = map_without_su1_n03();
    let out = import_with_map(tmp.path(), &map);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("does not place su1-n03/mlx5_0"), "{}", text(&out));
    assert!(text(&out).contains("su1-n03.toml"), "{}", text(&out));

    map.push_str("su1-n03,*,rack1\n");
    let out = import_with_map(tmp.path(), &map);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let inv = Inventory::load(p("inv.toml")).unwrap();
    assert_eq!(inv.tors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["rack0", "rack1"]);
    assert!(inv.tors.iter().all(|t| t.rail.is_none()));
}

#[test]
fn check_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("inv.toml");
    // tor1 has one RNIC: a problem, exit 1.
    std::fs::write(
        &path,
        "version = 1\n[[tor]]\nname = \"tor0\"\n[[tor]]\nname = \"tor1\"\n\
         [[host]]\nname = \"h0\"\n[[host.rnic]]\ndevice = \"d\"\ntor = \"tor0\"\nip = \"10.0.0.1\"\n\
         [[host]]\nname = \"h1\"\n[[host.rnic]]\ndevice = \"d\"\ntor = \"tor0\"\nip = \"10.0.0.2\"\n\
         [[host]]\nname = \"h2\"\n[[host.rnic]]\ndevice = \"d\"\ntor = \"tor1\"\nip = \"10.0.0.3\"\n",
    )
    .unwrap();
    let out = ctl(&["inventory", "check", "--inventory", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("problem: ToR \"tor1\" has a single RNIC (h2/d)"), "{}", text(&out));

    // Invalid: the format's error with file, line and field; exit 2.
    std::fs::write(&path, "version = 1\n[[tor]]\nname = \"tor0\"\n[[host]]\nname = \"h0\"\n[[host.rnic]]\ndevice = \"d\"\ntor = \"tor9\"\nip = \"10.0.0.1\"\n").unwrap();
    let out = ctl(&["inventory", "check", "--inventory", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains(&format!("{}:8: host[0].rnic[0].tor", path.display())), "{}", text(&out));
}

/// Import checks what it wrote as `inventory check` does, and exits as it does: 1 when the
/// check finds problems, with the problems printed (it exited 0 and printed only the summary).
#[test]
fn import_exits_1_when_its_check_finds_problems() {
    let tmp = described_cluster();
    let p = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();
    // One RNIC alone under its ToR: no ToR-mesh probing there.
    let mut map = map_without_su1_n03();
    map.push_str("su1-n03,mlx5_0,lonely\n");
    for k in 1..4 {
        map.push_str(&format!("su1-n03,mlx5_{k},rack1\n"));
    }
    let out = import_with_map(tmp.path(), &map);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("problem: ToR \"lonely\" has a single RNIC (su1-n03/mlx5_0)"), "{}", text(&out));
    // Written all the same, and `check` agrees.
    let out = ctl(&["inventory", "check", "--inventory", &p("inv.toml")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

/// Names are refused by the one rule of `formats` (`inventory::name_problem`), with its fix.
#[test]
fn import_refuses_unusable_tor_names_with_the_formats_rule() {
    let tmp = described_cluster();
    let out = import_with_map(tmp.path(), "host,device,tor\nsu0-n01,*,rack 0\n");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let expected = rocemesh_formats::inventory::name_problem("rack 0").unwrap();
    assert!(text(&out).contains(&format!("map.csv:2: tor: {expected}")), "{}", text(&out));
    assert!(text(&out).contains(rocemesh_formats::inventory::NAME_FIX), "{}", text(&out));

    let out = import(tmp.path(), &["--host-regex", "^(?P<su>su[0-9]+)-", "--tor-name", "{su}|{device}"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("the ToR name for su0-n01/mlx5_0 is unusable"), "{}", text(&out));
    assert!(text(&out).contains(rocemesh_formats::inventory::NAME_FIX), "{}", text(&out));
}

/// `inventory switch-addrs`: addresses from a `switch,addr` list into the inventory (to
/// --output, or in place with --force), counted by `inventory check`; list errors name the
/// list's line.
#[test]
fn switch_addrs_from_a_list_then_check() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();
    let mut inv = String::from("# the lab\nversion = 1\n[[spine]]\nname = \"spine0\"\n");
    for t in 0..2 {
        inv += &format!("[[tor]]\nname = \"tor{t}\"\n[[link]]\na = \"tor{t}\"\nb = \"spine0\"\n");
        for h in 0..3 {
            inv += &format!(
                "[[host]]\nname = \"tor{t}-h{h}\"\n[[host.rnic]]\ndevice = \"mlx5_0\"\ntor = \"tor{t}\"\nip = \"10.0.{t}.{}\"\n",
                h + 1
            );
        }
    }
    std::fs::write(p("inv.toml"), &inv).unwrap();
    let list = "switch,addr\n# loopbacks\nspine0,172.16.255.1\nspine0, fd00:ff::1\n\ntor0,172.16.0.1  # vlan 10\ntor1,172.16.1.1\n";
    std::fs::write(p("addrs.csv"), list).unwrap();
    let (inv_path, list_path) = (p("inv.toml"), p("addrs.csv"));
    let set = |extra: &[&str]| {
        let mut args = vec!["inventory", "switch-addrs", "--inventory", &inv_path, "--map", &list_path];
        args.extend_from_slice(extra);
        ctl(&args)
    };

    let out = set(&["--output", &p("with-addrs.toml")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("4 addresses of 3 switches set from"), "{}", text(&out));
    assert!(text(&out).contains("the comments of"), "{}", text(&out));
    let written = Inventory::load(p("with-addrs.toml")).unwrap();
    assert_eq!(
        written.spines[0].addrs,
        ["172.16.255.1".parse::<std::net::IpAddr>().unwrap(), "fd00:ff::1".parse().unwrap()]
    );
    assert_eq!(written.switch_addrs().len(), 4);
    let check = ctl(&["inventory", "check", "--inventory", &p("with-addrs.toml")]);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
    assert!(
        text(&check).contains("addrs          4   switch addresses (name path-trace hops), on 3 of 3 switches"),
        "{}",
        text(&check)
    );
    // The untouched input still counts none.
    // The positional inventory of earlier releases still works (a hidden spelling).
    let check = ctl(&["inventory", "check", &p("inv.toml")]);
    assert!(text(&check).contains("addrs          0"), "{}", text(&check));

    // In place only with --force; an existing --output too (here spelt --out, as earlier
    // releases did: a hidden alias).
    let out = set(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("in place (fix: pass --force"), "{}", text(&out));
    let out = set(&["--out", &p("with-addrs.toml")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = set(&["--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(Inventory::load(p("inv.toml")).unwrap(), written);

    // A corrected list replaces the addresses of the switches it names, and says what went.
    std::fs::write(p("addrs.csv"), "tor0,172.16.0.2\n").unwrap();
    let out = set(&["--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("removed (not in the list): tor0 172.16.0.1"), "{}", text(&out));
    assert!(!text(&out).contains("the comments of"), "ctl's own header is no comment to lose: {}", text(&out));
    assert_eq!(Inventory::load(p("inv.toml")).unwrap().switch_addrs().len(), 4);

    // Errors name the list, the line, the field and the fix; nothing is written.
    let before = std::fs::read(p("inv.toml")).unwrap();
    for (list, expected) in [
        ("tor0,172.16.0.3\nspine7,172.16.7.1\n", "addrs.csv:2: switch: there is no tor or spine named \"spine7\""),
        ("# x\ntor0,172.16.0.256\n", "addrs.csv:2: addr: \"172.16.0.256\" is not an IP address"),
        (
            "tor0,172.16.0.3\ntor1,172.16.0.3\n",
            "addrs.csv:2: addr: address 172.16.0.3 is also given at line 1 (for tor0)",
        ),
        ("tor0,10.0.1.2\n", "addrs.csv:1: addr: address 10.0.1.2 is the address of RNIC tor1-h1/mlx5_0"),
        ("tor0,172.16.255.1\n", "is an address of spine \"spine0\", which the list does not name"),
    ] {
        std::fs::write(p("addrs.csv"), list).unwrap();
        let out = set(&["--force"]);
        assert_eq!(out.status.code(), Some(2), "{list}: {}", text(&out));
        assert!(text(&out).contains(expected), "{list}: {}", text(&out));
        assert!(text(&out).contains("(fix: "), "{list}: {}", text(&out));
        assert_eq!(std::fs::read(p("inv.toml")).unwrap(), before, "{list}: the inventory was changed");
    }
}
