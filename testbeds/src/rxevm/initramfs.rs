//! The initramfs: static busybox, `testbeds/rxe-vm/init.sh` as /init, and the guest kernel's
//! modules, decompressed (busybox's insmod reads plain .ko files). Written as an uncompressed
//! newc cpio into `<cache>/initramfs/`, named after a hash of its inputs (kernel, module lists,
//! busybox, the scripts), so it is rebuilt exactly when one of them changes.
//!
//! The guest has no modules directory of its own (it runs the host's root, whose kernel is a
//! different one). What every run needs is loaded by /init at boot, numbered in dependency order
//! under /modules: virtio and 9p to reach the host's root, rdma_rxe and the verbs user interfaces,
//! veth and bridge for the fabric. All of net/sched (netem, clsact, flower, gact, ...) and what it
//! depends on sit under /lazy and are loaded on first use: the kernel's request_module runs
//! /sbin/modprobe from the initramfs (kernel threads keep it as their root), which is
//! `testbeds/rxe-vm/modprobe.sh`, reading /lazy/map. Under TCG each insmod costs ~70 ms, and the
//! ~90 modules of net/sched and its netfilter dependencies would add 4-5 s to every boot.

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, anyhow, bail};

use super::kernel::Kernel;

const INIT: &str = include_str!("../../rxe-vm/init.sh");
const MODPROBE: &str = include_str!("../../rxe-vm/modprobe.sh");

/// Modules loaded at boot; a kernel lacking one of them is refused.
pub const REQUIRED_MODULES: &[&str] =
    &["virtio_pci", "9pnet_virtio", "9p", "rdma_rxe", "ib_uverbs", "rdma_ucm", "ib_umad", "veth", "bridge"];
/// Loaded at boot when the kernel has them: crc32_generic became part of the built-in crc32
/// library in newer kernels.
pub const OPTIONAL_MODULES: &[&str] = &["crc32_generic"];
/// Every module of these directories of the kernel's tree is available on demand.
pub const ON_DEMAND: &[&str] = &["kernel/net/sched"];
/// Bumped when the archive's layout changes in a way the other hash inputs do not show.
const LAYOUT: u32 = 2;

/// The initramfs for `kernel`, built when the cached one does not match the current inputs.
pub fn ensure(cache: &Path, kernel: &Kernel) -> anyhow::Result<PathBuf> {
    let busybox = find_busybox()?;
    let busybox_bytes = std::fs::read(&busybox).with_context(|| format!("reading {}", busybox.display()))?;
    if !is_static_elf(&busybox_bytes) {
        bail!(
            "{} is dynamically linked; the initramfs needs a static busybox (apt-get install busybox-static)",
            busybox.display()
        );
    }
    // The module closure is fixed by the kernel's modules.dep, so the version stands for it.
    let mut h = DefaultHasher::new();
    (LAYOUT, &kernel.version, &kernel.module_base, INIT, MODPROBE, &busybox_bytes).hash(&mut h);
    (REQUIRED_MODULES, OPTIONAL_MODULES, ON_DEMAND).hash(&mut h);
    let dir = cache.join("initramfs");
    let path = dir.join(format!("{}-{:016x}.cpio", kernel.version, h.finish()));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    let modules = Modules::resolve(kernel)?;
    let mut cpio = Cpio::default();
    for d in ["bin", "sbin", "dev", "proc", "sys", "newroot", "modules", "lazy"] {
        cpio.dir(d);
    }
    // The kernel opens /dev/console for /init's stdio before /init can mount devtmpfs.
    cpio.char_dev("dev/console", 0o600, 5, 1);
    cpio.file("init", 0o755, INIT.as_bytes());
    cpio.file("sbin/modprobe", 0o755, MODPROBE.as_bytes());
    cpio.file("bin/busybox", 0o755, &busybox_bytes);
    for (i, m) in modules.boot.iter().enumerate() {
        cpio.file(&initramfs_module_name(i, m), 0o644, &decompress(m)?);
    }
    for m in &modules.lazy_files {
        cpio.file(&format!("lazy/{}.ko", file_module_name(m)), 0o644, &decompress(m)?);
    }
    cpio.file("lazy/map", 0o644, modules.lazy_map.as_bytes());
    let bytes = cpio.finish();

    let tmp = path.with_extension("cpio.tmp");
    std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("moving {} into place", path.display()))?;
    // Older images of any kernel are dead weight once a new one exists.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            if e.path() != path && e.path().extension().is_some_and(|x| x == "cpio") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    eprintln!(
        "rxe-vm: built {} ({} modules at boot, {} on demand, {:.1} MiB)",
        path.display(),
        modules.boot.len(),
        modules.lazy_files.len(),
        bytes.len() as f64 / 1048576.0
    );
    Ok(path)
}

fn find_busybox() -> anyhow::Result<PathBuf> {
    ["/usr/bin/busybox", "/bin/busybox", "/usr/sbin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("no busybox on the host; apt-get install busybox-static"))
}

/// The modules of the initramfs.
#[derive(Debug)]
struct Modules {
    /// Loaded by /init, dependencies first, each once.
    boot: Vec<PathBuf>,
    /// Loadable on demand.
    lazy_files: Vec<PathBuf>,
    /// /lazy/map: `<name or alias> <module> <module>...`, the modules to insmod in order.
    lazy_map: String,
}

impl Modules {
    fn resolve(kernel: &Kernel) -> anyhow::Result<Modules> {
        let wanted: Vec<String> = REQUIRED_MODULES.iter().map(|s| s.to_string()).collect();
        let mut boot = insmod_order(&show_depends(kernel, &wanted).context("resolving the modules the VM needs")?);
        for optional in OPTIONAL_MODULES {
            match show_depends(kernel, &[optional.to_string()]) {
                Ok(out) => {
                    boot.extend(insmod_order(&out).into_iter().filter(|m| !boot.contains(m)).collect::<Vec<_>>())
                }
                Err(_) => eprintln!("rxe-vm: kernel {} has no {optional} module; skipped", kernel.version),
            }
        }

        let mut chains: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for dir in ON_DEMAND {
            let dir = kernel.modules_dir().join(dir);
            let entries = std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?;
            for name in entries.filter_map(|e| e.ok()).filter_map(|e| module_name(&e.file_name().to_string_lossy())) {
                let out = show_depends(kernel, std::slice::from_ref(&name))?;
                let chain: Vec<PathBuf> = insmod_order(&out).into_iter().filter(|m| !boot.contains(m)).collect();
                chains.insert(name, chain);
            }
        }
        let alias_file = kernel.modules_dir().join("modules.alias");
        let aliases =
            std::fs::read_to_string(&alias_file).with_context(|| format!("reading {}", alias_file.display()))?;
        let lazy_map = lazy_map(&chains, &parse_aliases(&aliases));
        let mut lazy_files: Vec<PathBuf> = chains.into_values().flatten().collect();
        lazy_files.sort();
        lazy_files.dedup();
        Ok(Modules { boot, lazy_files, lazy_map })
    }
}

fn show_depends(kernel: &Kernel, modules: &[String]) -> anyhow::Result<String> {
    let out = Command::new("modprobe")
        .arg("-d")
        .arg(&kernel.module_base)
        .arg("-S")
        .arg(&kernel.version)
        .args(["--show-depends", "-a"])
        .args(modules)
        .output()
        .context("running modprobe (apt-get install kmod)")?;
    if !out.status.success() {
        bail!(
            "modprobe --show-depends for kernel {} failed: {}",
            kernel.version,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `alias <name> <module>` lines of modules.alias without wildcards (device-ID patterns are for
/// hardware this VM does not have), as alias -> module.
pub fn parse_aliases(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "alias").then_some(())?;
            let (alias, module) = (w.next()?, w.next()?);
            (!alias.contains(['*', '?', '['])).then(|| (alias.to_string(), module.to_string()))
        })
        .collect()
}

/// The on-demand loader's table: one line per name a module can be requested by (its own name,
/// with `-` or `_`, and its aliases), followed by the modules to load, dependencies first.
pub fn lazy_map(chains: &BTreeMap<String, Vec<PathBuf>>, aliases: &[(String, String)]) -> String {
    let mut out = String::new();
    let line = |out: &mut String, key: &str, chain: &[PathBuf]| {
        out.push_str(key);
        for m in chain {
            out.push(' ');
            out.push_str(&file_module_name(m));
        }
        out.push('\n');
    };
    for (name, chain) in chains {
        line(&mut out, name, chain);
        let dashed = name.replace('_', "-");
        if dashed != *name {
            line(&mut out, &dashed, chain);
        }
    }
    for (alias, module) in aliases {
        if let Some(chain) = chains.get(&module.replace('-', "_")) {
            line(&mut out, alias, chain);
        }
    }
    out
}

fn file_module_name(path: &Path) -> String {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    module_name(&file).unwrap_or(file)
}

/// Module files in `modprobe --show-depends` output, in order, each once; built-in modules
/// (`builtin virtio_pci`) need no file.
pub fn insmod_order(show_depends: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in show_depends.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("insmod") {
            continue;
        }
        if let Some(path) = words.next().map(PathBuf::from)
            && !out.contains(&path)
        {
            out.push(path);
        }
    }
    out
}

/// `sch_netem.ko.xz` -> `sch_netem`; `None` for files that are not modules.
pub fn module_name(file: &str) -> Option<String> {
    let stem = file
        .strip_suffix(".xz")
        .or_else(|| file.strip_suffix(".zst"))
        .or_else(|| file.strip_suffix(".gz"))
        .unwrap_or(file);
    stem.strip_suffix(".ko").filter(|s| !s.is_empty()).map(str::to_string)
}

/// `modules/007-rdma_rxe.ko`: the number keeps /init's glob in load order.
pub fn initramfs_module_name(index: usize, path: &Path) -> String {
    format!("modules/{index:03}-{}.ko", file_module_name(path))
}

fn decompress(path: &Path) -> anyhow::Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    if let Some(tool) = tool {
        let out = Command::new(tool)
            .arg("-dc")
            .arg(path)
            .output()
            .with_context(|| format!("running {tool} to decompress {}", path.display()))?;
        if !out.status.success() {
            bail!("{tool} -dc {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
        }
        return Ok(out.stdout);
    }
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if name.ends_with(".zst") {
        let mut out = Vec::new();
        zstd::stream::read::Decoder::new(&data[..])
            .and_then(|mut d| d.read_to_end(&mut out))
            .with_context(|| format!("decompressing {}", path.display()))?;
        return Ok(out);
    }
    Ok(data)
}

/// True for a 64-bit ELF without a program interpreter, i.e. one that runs without ld.so.
pub fn is_static_elf(b: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as usize);
    let u32_at = |o: usize| b.get(o..o + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])));
    let u64_at = |o: usize| b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])) as usize);
    if !b.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..phnum).all(|i| u32_at(phoff + i * phentsize).is_some_and(|t| t != PT_INTERP))
}

/// A newc ("070701") cpio archive, the format the kernel unpacks into its initial rootfs.
#[derive(Debug, Default)]
pub struct Cpio {
    out: Vec<u8>,
    inode: u32,
}

impl Cpio {
    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, 2, (0, 0), &[]);
    }

    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, 1, (0, 0), data);
    }

    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) {
        self.entry(name, 0o020_000 | perm, 1, (major, minor), &[]);
    }

    /// The archive, closed by its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[]);
        self.out
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) {
        self.inode += 1;
        let fields = [
            self.inode,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: fixed, so the same inputs give the same bytes
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // What `modprobe --show-depends -a 9p rdma_rxe virtio_pci veth` printed for 7.3.4+deb13-amd64.
    const SHOW_DEPENDS: &str = "\
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/fs/netfs/netfs.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/net/9p/9pnet.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/fs/9p/9p.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/net/ipv4/udp_tunnel.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/net/ipv6/ip6_udp_tunnel.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/drivers/infiniband/core/ib_core.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz 
builtin virtio_pci
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/fs/netfs/netfs.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/drivers/infiniband/core/ib_core.ko.xz 
insmod /c/usr/lib/modules/7.3.4+deb13-amd64/kernel/drivers/net/veth.ko.xz 
";

    #[test]
    fn insmod_order_keeps_dependencies_first_and_each_module_once() {
        let names: Vec<String> = insmod_order(SHOW_DEPENDS)
            .iter()
            .map(|p| module_name(&p.file_name().unwrap().to_string_lossy()).unwrap())
            .collect();
        assert_eq!(names, ["netfs", "9pnet", "9p", "udp_tunnel", "ip6_udp_tunnel", "ib_core", "rdma_rxe", "veth"]);
    }

    #[test]
    fn the_lazy_map_answers_names_and_aliases_with_dependency_chains() {
        let p = |s: &str| PathBuf::from(format!("/k/kernel/{s}.ko.xz"));
        let mut chains = BTreeMap::new();
        chains.insert("sch_netem".to_string(), vec![p("sch_netem")]);
        chains.insert("act_ct".to_string(), vec![p("nf_conntrack"), p("nf_nat"), p("act_ct")]);
        let aliases = parse_aliases(
            "# Aliases extracted from modules themselves.\n\
             alias net-sch-netem sch_netem\n\
             alias net-act-ct act_ct\n\
             alias pci:v00008086d*sv*sd*bc*sc*i* e1000e\n\
             alias net-sch-fq sch_fq\n",
        );
        assert_eq!(aliases.len(), 3, "{aliases:?}");
        let map = lazy_map(&chains, &aliases);
        let lines: Vec<&str> = map.lines().collect();
        assert_eq!(
            lines,
            [
                "act_ct nf_conntrack nf_nat act_ct",
                "act-ct nf_conntrack nf_nat act_ct",
                "sch_netem sch_netem",
                "sch-netem sch_netem",
                "net-sch-netem sch_netem",
                "net-act-ct nf_conntrack nf_nat act_ct",
            ]
        );
    }

    #[test]
    fn module_names_and_numbered_initramfs_names() {
        assert_eq!(module_name("sch_netem.ko.xz").as_deref(), Some("sch_netem"));
        assert_eq!(module_name("cls_u32.ko.zst").as_deref(), Some("cls_u32"));
        assert_eq!(module_name("act_gact.ko").as_deref(), Some("act_gact"));
        assert_eq!(module_name("modules.order"), None);
        assert_eq!(module_name(".ko"), None);
        let p = Path::new("/k/lib/modules/v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz");
        assert_eq!(initramfs_module_name(7, p), "modules/007-rdma_rxe.ko");
        // The shell's glob sorts names: the number must sort numerically too.
        let mut names: Vec<String> = [100, 9, 10].iter().map(|&i| initramfs_module_name(i, p)).collect();
        names.sort();
        assert_eq!(names[0], "modules/009-rdma_rxe.ko");
    }

    /// name, mode, (rdev major, minor), data
    type Entry = (String, u32, (u32, u32), Vec<u8>);

    /// Reads a newc archive back.
    fn parse(mut b: &[u8]) -> Vec<Entry> {
        let mut out = Vec::new();
        let total = b.len();
        loop {
            assert_eq!(&b[..6], b"070701");
            let f =
                |i: usize| u32::from_str_radix(std::str::from_utf8(&b[6 + 8 * i..14 + 8 * i]).unwrap(), 16).unwrap();
            let (mode, size, rdev, namesize) = (f(1), f(6) as usize, (f(9), f(10)), f(11) as usize);
            let name = std::str::from_utf8(&b[110..110 + namesize - 1]).unwrap().to_string();
            assert_eq!(b[110 + namesize - 1], 0);
            let data_at = (110 + namesize).next_multiple_of(4);
            let data = b[data_at..data_at + size].to_vec();
            let next = (data_at + size).next_multiple_of(4);
            assert_eq!((total - b.len() + next) % 4, 0);
            if name == "TRAILER!!!" {
                assert_eq!(next, b.len());
                return out;
            }
            out.push((name, mode, rdev, data));
            b = &b[next..];
        }
    }

    #[test]
    fn cpio_entries_read_back_aligned() {
        let mut c = Cpio::default();
        c.dir("dev");
        c.char_dev("dev/console", 0o600, 5, 1);
        c.file("init", 0o755, b"#!/bin/sh\n");
        c.file("bin/x", 0o644, b"abcde");
        let bytes = c.finish();
        assert_eq!(bytes.len() % 4, 0);
        let entries = parse(&bytes);
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].0, "dev");
        assert_eq!(entries[0].1, 0o040_755);
        assert_eq!((entries[1].1, entries[1].2), (0o020_600, (5, 1)));
        assert_eq!(
            (entries[2].0.as_str(), entries[2].1, entries[2].3.as_slice()),
            ("init", 0o100_755, &b"#!/bin/sh\n"[..])
        );
        assert_eq!(entries[3].3, b"abcde");
    }

    fn elf_with_phdrs(types: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56 * types.len()];
        b[..6].copy_from_slice(b"\x7fELF\x02\x01");
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            b[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        b
    }

    #[test]
    fn static_elf_detection_looks_for_an_interpreter() {
        assert!(is_static_elf(&elf_with_phdrs(&[1, 1, 4])));
        assert!(!is_static_elf(&elf_with_phdrs(&[6, 3, 1])));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        // Program headers cut off: not trusted as static.
        let mut cut = elf_with_phdrs(&[1, 1]);
        cut.truncate(100);
        assert!(!is_static_elf(&cut));
    }
}
