//! `bench gen-pinglists`: `ctl gen-pinglists` on a 100,000-RNIC fabric, in memory and to files
//! (in /dev/shm and in the chosen or temporary directory), beside the cost of merely cloning
//! and serialising the inventory it starts from and of writing as many files of the same
//! sizes without generating anything; then the `ctl` binary itself, end to end, when it
//! has been built beside the bench.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use rocemesh_ctl::generation::{GenOptions, Generator};
use rocemesh_ctl::pinglist_dir::{Manifest, serialise, write_generated};
use rocemesh_formats::inventory::{self, Host, Inventory, Rnic, Spine, Tor};

/// The fabric and the generation options.
#[derive(Debug, Clone)]
pub struct Options {
    pub tors: usize,
    pub hosts_per_tor: usize,
    /// Spines, and so ECMP paths (flow labels per inter-ToR target follow from it).
    pub spines: usize,
    /// Other ToRs each RNIC probes (K).
    pub inter_tor_peers: usize,
    /// Where to write the files (a temporary directory is made in it); default: the system's
    /// temporary directory. Its filesystem decides the write figure: tmpfs measures ctl,
    /// a disk measures the disk; /dev/shm is measured as well when it is another filesystem.
    pub dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options { tors: 3125, hosts_per_tor: 32, spines: 4, inter_tor_peers: 5, dir: None }
    }
}

/// One measured step.
#[derive(Debug, Clone)]
pub struct Line {
    pub what: String,
    pub seconds: f64,
    pub note: String,
}

/// The measurements, in report order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    fn push(&mut self, what: &str, seconds: f64, note: String) {
        self.lines.push(Line { what: what.to_owned(), seconds, note });
    }

    /// Seconds of the line whose `what` starts with `prefix`.
    pub fn seconds(&self, prefix: &str) -> Option<f64> {
        self.lines.iter().find(|l| l.what.starts_with(prefix)).map(|l| l.seconds)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for l in &self.lines {
            writeln!(f, "{:<58} {:>8.3} s  {}", l.what, l.seconds, l.note)?;
        }
        Ok(())
    }
}

/// A fabric of `tors` ToRs with `hosts_per_tor` one-RNIC hosts each (one RNIC per host: the
/// brief's 100,000 RNICs are 100,000 pinglists, the file-count worst case).
pub fn fabric(opt: &Options) -> Inventory {
    let mut hosts = Vec::with_capacity(opt.tors * opt.hosts_per_tor);
    for t in 0..opt.tors {
        for h in 0..opt.hosts_per_tor {
            let n = (t * opt.hosts_per_tor + h) as u32;
            hosts.push(Host {
                name: format!("t{t}-h{h}"),
                rnics: vec![Rnic {
                    device: "mlx5_0".to_owned(),
                    tor: format!("tor{t}"),
                    ip: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)),
                    gid: None,
                    port: 1,
                    gid_index: Some(3),
                    tor_port: None,
                    netdev: None,
                }],
            });
        }
    }
    Inventory {
        version: inventory::VERSION,
        tors: (0..opt.tors).map(|t| Tor { name: format!("tor{t}"), rail: None, addrs: Vec::new() }).collect(),
        spines: (0..opt.spines).map(|s| Spine { name: format!("spine{s}"), addrs: Vec::new() }).collect(),
        links: Vec::new(),
        hosts,
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64())
}

/// Runs the benchmark.
pub fn run(opt: &Options) -> Result<Report> {
    let inventory = fabric(opt);
    let rnics = inventory.hosts.len();
    let mut report = Report::default();

    let (copy, clone_s) = timed(|| inventory.clone());
    drop(copy);
    report.push("baseline: clone the inventory", clone_s, format!("{rnics} RNICs, {} ToRs", opt.tors));
    let (text, ser_s) = timed(|| inventory.to_toml_string());
    let text = text.context("serialising the inventory")?;
    report.push("baseline: serialise the inventory to TOML", ser_s, format!("{:.1} MiB", mib(text.len())));

    // First, while the page cache and tmpfs hold nothing of this run's.
    ctl_binary(&text, opt, &mut report)?;

    let opts = GenOptions { seed: 1, inter_tor_peers: opt.inter_tor_peers, ..GenOptions::default() };
    let (loaded, load_s) = timed(|| Inventory::parse(&text, Path::new("inventory.toml")));
    anyhow::ensure!(loaded? == inventory, "the inventory read back differs from the one written");
    report.push(
        "gen: load the inventory (Inventory::parse, all cores)",
        load_s,
        format!("{:.2}x serialising it", load_s / ser_s),
    );
    let (generator, index_s) = timed(|| Generator::new(&inventory, &opts));
    let generator = generator?;
    report.push("gen: index the inventory (Generator::new)", index_s, format!("{:.2}x the clone", index_s / clone_s));
    let cov = generator.coverage();
    let manifest = Manifest {
        generation: 1,
        generated_unix_ns: 1_700_000_000_000_000_000,
        seed: 1,
        hosts: generator.hosts(),
        generations_to_cover: cov.generations_to_cover,
    };

    // Written before the in-memory lines are measured: building and freeing 100,000 pinglists
    // first leaves glibc's thread arenas full of scattered free chunks, which the writers'
    // threads inherit and which made the write ~0.5 s slower than in `ctl gen-pinglists`,
    // whose writers start on fresh arenas.
    let mut written = Vec::new();
    // Removed only once every figure is taken: removing 100,000 files from a disk leaves the
    // kernel busy for a while after, which slowed the next measurement by 15-30%. Their
    // pages are not written back meanwhile (dirty pages wait ~30 s), and are then discarded.
    let mut outputs = Vec::new();
    for (d, dir) in output_dirs(opt.dir.as_deref()).into_iter().enumerate() {
        let tmp = tempfile::tempdir_in(&dir).with_context(|| format!("temporary directory in {}", dir.display()))?;
        let write = || {
            write_generated(
                tmp.path(),
                generator.hosts(),
                |i, text, host| generator.render_toml(i, 1, manifest.generated_unix_ns, text, host),
                &manifest,
            )
        };
        let (w, first_s) = timed(write);
        let w = w?;
        // What an operator's every refresh does: the same files again, over the last ones.
        let (again, again_s) = timed(write);
        again?;
        let sizes: Vec<usize> = (0..generator.hosts())
            .map(|i| {
                std::fs::metadata(tmp.path().join(format!(
                    "t{}-h{}.toml",
                    i / opt.hosts_per_tor,
                    i % opt.hosts_per_tor
                )))
            })
            .map(|m| m.map(|m| m.len() as usize))
            .collect::<Result<_, _>>()
            .context("sizing the written pinglists")?;
        // The rename floors on the first directory only (tmpfs when there is /dev/shm): on
        // this VM's ext4 they took over a minute.
        let floors = file_floors(&dir, &sizes, d == 0)?;
        outputs.push(tmp);
        written.push((format!("{} ({})", dir.display(), fs_type(&dir)), w, first_s, again_s, floors));
    }

    let (pinglists, gen_s) = timed(|| generator.generate(1, manifest.generated_unix_ns));
    let targets: usize = pinglists.iter().map(|p| p.targets.len()).sum();
    report.push(
        "gen: all pinglists in memory (Generator::generate)",
        gen_s,
        format!(
            "{} pinglists, {targets} targets, {} labels per inter-ToR target; {:.2}x the clone",
            pinglists.len(),
            cov.inter_tor_flow_labels,
            gen_s / clone_s
        ),
    );

    let (bytes, to_toml_s) =
        timed(|| pinglists.iter().map(|p| serialise(p).map(|s| s.len())).sum::<Result<usize, _>>());
    let bytes = bytes?;
    report.push(
        "gen: serialise every pinglist to TOML, one core",
        to_toml_s,
        format!("{:.1} MiB; {:.2}x serialising the inventory", mib(bytes), to_toml_s / ser_s),
    );
    drop(pinglists);

    for (dir, w, first_s, again_s, floors) in written {
        let files = w.written;
        let Floors { create, rewrite, renames } = floors;
        report.push(
            "baseline: create and write as many files, all cores",
            create,
            format!("same sizes, {:.1} MiB in all, in {dir}; no generation", mib(w.bytes as usize)),
        );
        report.push("baseline: rewrite them in place", rewrite, String::new());
        if let Some((fresh_rename, over_rename)) = renames {
            report.push("baseline: replace by temporary file + rename, new names", fresh_rename, String::new());
            report.push(
                "baseline: replace by temporary file + rename, over the files",
                over_rename,
                format!("{:.2}x rewriting in place", over_rename / rewrite),
            );
        }
        let vs_create = format!("; {:.2}x the create baseline", first_s / create);
        let vs_rewrite = format!("{:.2}x the rewrite baseline, ", again_s / rewrite);
        report.push(
            "gen: generate and write all files (as ctl does), first time",
            first_s,
            format!("{files} files in {dir}{vs_create}"),
        );
        report.push(
            "gen: generate and write all files, over the last ones",
            again_s,
            format!("{vs_rewrite}{:.2}x the in-memory generation", again_s / gen_s),
        );
        report.push(
            "gen-pinglists end to end (load + index + write over)",
            load_s + index_s + again_s,
            format!("in {dir}; every ToR pair in {} generation(s)", cov.generations_to_cover),
        );
    }
    drop(outputs);
    Ok(report)
}

/// Seconds to create, to rewrite, and to replace by rename (new names, then over the files).
struct Floors {
    create: f64,
    rewrite: f64,
    renames: Option<(f64, f64)>,
}

/// The files' floor on `dir`'s filesystem, on all cores as ctl, in seconds: create and write;
/// rewrite in place; with `renames`, temporary file + rename to new names and the same over
/// existing files (what ctl did before it wrote in place).
fn file_floors(dir: &Path, sizes: &[usize], renames: bool) -> Result<Floors> {
    let tmp = tempfile::tempdir_in(dir).with_context(|| format!("temporary directory in {}", dir.display()))?;
    let bytes = vec![b'#'; sizes.iter().copied().max().unwrap_or(0)];
    let pass = |rename: bool| -> Result<f64> {
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let start = Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|k| {
                    let (tmp, bytes) = (tmp.path(), &bytes);
                    s.spawn(move || -> std::io::Result<()> {
                        for (i, &n) in sizes.iter().enumerate().skip(k).step_by(threads) {
                            let path = tmp.join(format!("h{i}.toml"));
                            if rename {
                                let t = tmp.join(format!(".h{i}.toml.tmp"));
                                std::fs::File::create(&t)?.write_all(&bytes[..n])?;
                                std::fs::rename(&t, &path)?;
                            } else {
                                std::fs::File::create(&path)?.write_all(&bytes[..n])?;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        })?;
        Ok(start.elapsed().as_secs_f64())
    };
    let create = pass(false)?;
    let rewrite = pass(false)?;
    if !renames {
        return Ok(Floors { create, rewrite, renames: None });
    }
    for entry in std::fs::read_dir(tmp.path())? {
        std::fs::remove_file(entry?.path())?;
    }
    let fresh_rename = pass(true)?;
    let over_rename = pass(true)?;
    Ok(Floors { create, rewrite, renames: Some((fresh_rename, over_rename)) })
}

/// `ctl gen-pinglists` as an operator runs it, when `ctl` was built beside this bench
/// (`cargo build --release -p rocemesh-ctl`): the inventory file in /dev/shm (or the temporary
/// directory), twice into one directory, so the second run writes over the first.
fn ctl_binary(inventory_toml: &str, opt: &Options, report: &mut Report) -> Result<()> {
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let ctl = exe.with_file_name("ctl");
    if !ctl.is_file() {
        report.push(
            "ctl binary: not measured",
            0.0,
            format!("{} is missing; build it with: cargo build --release -p rocemesh-ctl", ctl.display()),
        );
        return Ok(());
    }
    let dir = output_dirs(opt.dir.as_deref()).remove(0);
    let tmp = tempfile::tempdir_in(&dir).with_context(|| format!("temporary directory in {}", dir.display()))?;
    let inventory = tmp.path().join("inventory.toml");
    std::fs::write(&inventory, inventory_toml).with_context(|| format!("writing {}", inventory.display()))?;
    let out = tmp.path().join("pinglists");
    let run = || -> Result<(f64, String)> {
        let start = Instant::now();
        let run = Command::new(&ctl)
            .args(["gen-pinglists", "--seed", "1", "--inventory"])
            .arg(&inventory)
            .arg("--out")
            .arg(&out)
            .args(["--inter-tor-peers", &opt.inter_tor_peers.to_string()])
            .output()
            .with_context(|| format!("running {}", ctl.display()))?;
        let seconds = start.elapsed().as_secs_f64();
        anyhow::ensure!(run.status.success(), "ctl failed: {}", String::from_utf8_lossy(&run.stderr));
        let said = String::from_utf8_lossy(&run.stdout);
        let phases = said.lines().next().and_then(|l| l.rsplit_once(" in ").map(|(_, rest)| rest.to_owned()));
        Ok((seconds, phases.unwrap_or_default()))
    };
    let (first_s, phases) = run()?;
    report.push(
        "ctl gen-pinglists binary, first time",
        first_s,
        format!("{} (ctl's own account: {phases})", fs_type(&dir)),
    );
    // The steady state an operator sees at every refresh, and this VM's spread over 5 runs.
    let mut again = (0..5).map(|_| run()).collect::<Result<Vec<_>>>()?;
    again.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (median_s, phases) = again[again.len() / 2].clone();
    report.push(
        "ctl gen-pinglists binary, over the last (median of 5)",
        median_s,
        format!("{:.3}-{:.3} s over the 5; the median's own account: {phases}", again[0].0, again[again.len() - 1].0),
    );
    Ok(())
}

/// `dir` (default: the system's temporary directory), and /dev/shm when it is another
/// filesystem: tmpfs measures ctl, a disk measures ctl plus the disk, so both are reported.
fn output_dirs(dir: Option<&Path>) -> Vec<PathBuf> {
    let chosen = dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let shm = Path::new("/dev/shm");
    let device = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let mut dirs = Vec::new();
    if shm.is_dir() && device(shm) != device(&chosen) {
        dirs.push(shm.to_path_buf());
    }
    dirs.push(chosen);
    dirs
}

/// The type of the filesystem holding `dir`, from /proc/mounts (the longest mount point
/// above it); "?" when that cannot be read.
fn fs_type(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else { return "?".to_owned() };
    mounts
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(point).then(|| (point.len(), kind.to_owned()))
        })
        .max_by_key(|&(len, _)| len)
        .map_or_else(|| "?".to_owned(), |(_, kind)| kind)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}
