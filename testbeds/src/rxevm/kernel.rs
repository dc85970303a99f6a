//! The guest kernel: Debian's newest `linux-image-amd64` from trixie-backports, resolved at run time
//! (old versions leave the archive), downloaded with a private apt configuration (never installed
//! on the host) and unpacked into `<cache>/kernel/<version>/`.
//!
//! rxe inside network namespaces needs kernel >= 7.2: older kernels create the device but every
//! send fails with "local QP operation error". Once a kernel is cached it is used without touching
//! the network until `--update-kernel` asks for the newest again.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, anyhow, bail};

/// The suite the kernel comes from.
pub const SUITE: &str = "trixie-backports";
/// The oldest kernel whose rxe can send from inside a network namespace.
pub const MIN_VERSION: (u32, u32) = (7, 2);
const META_PACKAGE: &str = "linux-image-amd64";
const HOST_SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";
const HOST_SOURCES_LIST: &str = "/etc/apt/sources.list";

/// An unpacked kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// `uname -r` of the guest, e.g. `7.3.4+deb13-amd64`.
    pub version: String,
    /// What qemu boots: the uncompressed vmlinux when it could be extracted (TCG boots it about
    /// 1.5 s faster, it skips the in-guest decompression), else the vmlinuz.
    pub image: PathBuf,
    /// The `-d` directory of modprobe/depmod: it holds `lib/modules/<version>`.
    pub module_base: PathBuf,
}

impl Kernel {
    /// `<module_base>/lib/modules/<version>`.
    pub fn modules_dir(&self) -> PathBuf {
        self.module_base.join("lib/modules").join(&self.version)
    }
}

/// The cached kernel, or the newest one from [`SUITE`] when there is none or `update` is set.
pub fn ensure(cache: &Path, update: bool) -> anyhow::Result<Kernel> {
    let kernels = cache.join("kernel");
    let current = kernels.join("current");
    if !update && let Ok(version) = std::fs::read_to_string(&current) {
        let version = version.trim();
        if let Some(k) = load(&kernels.join(version), version) {
            return Ok(k);
        }
    }
    let apt = PrivateApt::create(&cache.join("apt").join(SUITE))?;
    let packages = apt.resolve().context("resolving the guest kernel")?;
    let dir = kernels.join(&packages.version);
    let kernel = match load(&dir, &packages.version) {
        Some(k) => k,
        None => {
            eprintln!("rxe-vm: downloading kernel {} from {SUITE}", packages.version);
            fetch(&apt, &packages, &dir)?
        }
    };
    std::fs::write(&current, format!("{}\n", packages.version))
        .with_context(|| format!("writing {}", current.display()))?;
    Ok(kernel)
}

/// A prepared kernel directory: `root/` (the packages' files), `image` (a symlink to vmlinux or
/// vmlinuz) and `ready`, written last.
fn load(dir: &Path, version: &str) -> Option<Kernel> {
    if !dir.join("ready").exists() {
        return None;
    }
    let root = dir.join("root");
    let module_base = module_base(&root, version)?;
    Some(Kernel { version: version.to_string(), image: dir.join("image"), module_base })
}

fn module_base(root: &Path, version: &str) -> Option<PathBuf> {
    // Debian moved the modules (and the vmlinuz) from /lib to /usr/lib.
    [root.join("usr"), root.to_path_buf()].into_iter().find(|b| b.join("lib/modules").join(version).is_dir())
}

fn fetch(apt: &PrivateApt, packages: &KernelPackages, dir: &Path) -> anyhow::Result<Kernel> {
    let partial = dir.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    let debs = partial.join("debs");
    let root = partial.join("root");
    for d in [&debs, &root] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    apt.download(&packages.all(), &debs)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&debs)
        .with_context(|| format!("listing {}", debs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    files.sort();
    for deb in &files {
        run(Command::new("dpkg").arg("-x").arg(deb).arg(&root), "unpacking the kernel package")?;
    }
    // The packages leave modules.dep to their postinst; modprobe needs it to find dependencies.
    let base = module_base(&root, &packages.version).ok_or_else(|| {
        anyhow!("the kernel packages of {} hold no lib/modules/{} directory", packages.version, packages.version)
    })?;
    run(Command::new("depmod").arg("-b").arg(&base).arg(&packages.version), "depmod of the guest kernel's modules")?;

    let modules = base.join("lib/modules").join(&packages.version);
    let vmlinuz = [modules.join("vmlinuz"), root.join("boot").join(format!("vmlinuz-{}", packages.version))]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("no vmlinuz in the kernel packages of {}", packages.version))?;
    let image_target = match extract_vmlinux(&vmlinuz) {
        Ok(Some(elf)) => {
            let out = partial.join("vmlinux");
            std::fs::write(&out, elf).with_context(|| format!("writing {}", out.display()))?;
            PathBuf::from("vmlinux")
        }
        Ok(None) => {
            eprintln!("rxe-vm: the vmlinuz payload is not zstd; booting the compressed kernel");
            vmlinuz.strip_prefix(&partial).unwrap_or(&vmlinuz).to_path_buf()
        }
        Err(e) => {
            eprintln!("rxe-vm: extracting vmlinux failed ({e:#}); booting the compressed kernel");
            vmlinuz.strip_prefix(&partial).unwrap_or(&vmlinuz).to_path_buf()
        }
    };
    std::os::unix::fs::symlink(&image_target, partial.join("image")).context("linking the kernel image")?;
    // The .debs are 122 MB and re-downloadable; the unpacked tree is what the cache is for.
    std::fs::remove_dir_all(&debs).with_context(|| format!("removing {}", debs.display()))?;
    std::fs::write(partial.join("ready"), "").context("marking the kernel ready")?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing the incomplete {}", dir.display()))?;
    }
    std::fs::rename(&partial, dir).with_context(|| format!("moving the kernel into {}", dir.display()))?;
    load(dir, &packages.version).ok_or_else(|| anyhow!("the kernel in {} is incomplete after unpacking", dir.display()))
}

/// The ELF inside a zstd-compressed bzImage, or `None` when the payload is not zstd (Debian's
/// kernels have used zstd since 6.x; other compressors fall back to booting the vmlinuz).
pub fn extract_vmlinux(vmlinuz: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    let data = std::fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    // The setup code before the payload could contain the magic by chance: try every match.
    let mut from = 0;
    while let Some(pos) = data[from..].windows(4).position(|w| w == ZSTD_MAGIC) {
        let at = from + pos;
        from = at + 1;
        let Ok(decoder) = zstd::stream::read::Decoder::with_buffer(&data[at..]) else { continue };
        let mut out = Vec::new();
        if decoder.single_frame().read_to_end(&mut out).is_ok() && out.starts_with(b"\x7fELF") {
            return Ok(Some(out));
        }
    }
    Ok(None)
}

/// The concrete packages behind `linux-image-amd64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPackages {
    pub version: String,
    /// `linux-image-<version>`: only dependencies in the newer split layout, the kernel itself
    /// in the older one.
    pub image: String,
    /// Its `linux-binary-*`, `linux-modules-*` and `linux-base-*` dependencies of the same version.
    pub parts: Vec<String>,
}

impl KernelPackages {
    fn all(&self) -> Vec<String> {
        std::iter::once(self.image.clone()).chain(self.parts.iter().cloned()).collect()
    }
}

/// An apt configuration of its own (sources, lists, status) under the cache, so that the host's
/// apt setup never sees trixie.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn create(dir: &Path) -> anyhow::Result<PrivateApt> {
        let uri = host_archive_uri()?;
        for d in ["sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial"] {
            let d = dir.join(d);
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        let write = |name: &str, text: String| {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
        };
        write("sources.list.d/rocemesh-kernel.sources", sources_stanza(&uri, SUITE))?;
        write("sources.list", String::new())?;
        write("preferences", String::new())?;
        // An empty dpkg status: the host's installed packages must not influence resolution.
        write("status", String::new())?;
        Ok(PrivateApt { dir: dir.to_path_buf() })
    }

    fn options(&self) -> Vec<String> {
        let d = |s: &str| self.dir.join(s).display().to_string();
        [
            format!("Dir::Etc::SourceList={}", d("sources.list")),
            format!("Dir::Etc::SourceParts={}", d("sources.list.d")),
            format!("Dir::Etc::Preferences={}", d("preferences")),
            format!("Dir::Etc::PreferencesParts={}", d("preferences.d")),
            format!("Dir::State::Lists={}", d("lists")),
            format!("Dir::State::status={}", d("status")),
            format!("Dir::Cache={}", d("cache")),
            // The cache is usually under root's 0700 home, where apt's _apt user cannot write.
            "APT::Sandbox::User=root".to_string(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect()
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.args(self.options()).env("DEBIAN_FRONTEND", "noninteractive");
        c
    }

    fn resolve(&self) -> anyhow::Result<KernelPackages> {
        run(self.command("apt-get").args(["-q", "update"]), &format!("apt-get update of {SUITE}"))?;
        let meta = self.show(META_PACKAGE).map_err(|e| {
            anyhow!("no {SUITE} {META_PACKAGE} in the mirror: {e:#}; check that the mirror in {HOST_SOURCES} carries {SUITE}")
        })?;
        let deps = depends(&meta);
        let image = concrete_image(&deps).ok_or_else(|| {
            anyhow!(
                "{META_PACKAGE} in {SUITE} depends on no concrete linux-image-<version> package (its dependencies: {}); \
                 Debian's kernel packaging changed: adapt testbeds/src/rxevm/kernel.rs",
                deps.join(", ")
            )
        })?;
        let version = image.trim_start_matches("linux-image-").to_string();
        check_version(&version)?;
        let image_show = self.show(&image)?;
        let parts = parts(&depends(&image_show), &version);
        Ok(KernelPackages { version, image, parts })
    }

    fn show(&self, package: &str) -> anyhow::Result<String> {
        let out = self
            .command("apt-cache")
            .args(["show", "--no-all-versions", package])
            .output()
            .context("running apt-cache")?;
        if !out.status.success() || out.stdout.is_empty() {
            bail!("apt-cache show {package}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn download(&self, packages: &[String], into: &Path) -> anyhow::Result<()> {
        run(
            self.command("apt-get").args(["-q", "download"]).args(packages).current_dir(into),
            &format!("apt-get download {}", packages.join(" ")),
        )
    }
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}

fn host_archive_uri() -> anyhow::Result<String> {
    if let Ok(text) = std::fs::read_to_string(HOST_SOURCES)
        && let Some(uri) = archive_uri_deb822(&text)
    {
        return Ok(uri);
    }
    if let Ok(text) = std::fs::read_to_string(HOST_SOURCES_LIST)
        && let Some(uri) = archive_uri_one_line(&text)
    {
        return Ok(uri);
    }
    bail!(
        "found no Debian archive mirror in {HOST_SOURCES} or {HOST_SOURCES_LIST}; \
         the kernel is downloaded from the machine's own mirror, so configure one for apt"
    )
}

fn sources_stanza(uri: &str, suite: &str) -> String {
    format!(
        "Types: deb\nURIs: {uri}\nSuites: {suite}\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
}

/// The URI of the first enabled deb822 stanza serving a release suite (not `-security`, whose
/// archive has no backports).
pub fn archive_uri_deb822(text: &str) -> Option<String> {
    let mut stanza: Vec<(String, String)> = Vec::new();
    let pick = |stanza: &[(String, String)]| -> Option<String> {
        let field = |k: &str| stanza.iter().find(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str());
        let enabled = field("Enabled").is_none_or(|v| !v.trim().eq_ignore_ascii_case("no"));
        let deb = field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        let release = field("Suites").is_some_and(|s| s.split_whitespace().any(|s| !s.ends_with("-security")));
        let uri = field("URIs").and_then(|u| u.split_whitespace().next());
        (enabled && deb && release).then_some(uri?.trim_end_matches('/').to_string())
    };
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let Some(uri) = pick(&stanza) {
                return Some(uri);
            }
            stanza.clear();
        } else if line.starts_with('#') {
        } else if line.starts_with([' ', '\t']) {
            if let Some(last) = stanza.last_mut() {
                last.1.push(' ');
                last.1.push_str(line.trim());
            }
        } else if let Some((k, v)) = line.split_once(':') {
            stanza.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    None
}

/// The same from a one-line-style sources.list: `deb [options] URI suite components...`.
pub fn archive_uri_one_line(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "deb" {
            return None;
        }
        let mut w = words.next()?;
        if w.starts_with('[') {
            while !w.ends_with(']') {
                w = words.next()?;
            }
            w = words.next()?;
        }
        let suite = words.next()?;
        (!suite.ends_with("-security")).then(|| w.trim_end_matches('/').to_string())
    })
}

/// Package names in the `Depends:` and `Pre-Depends:` fields of `apt-cache show` output, every
/// alternative included, without versions or architecture qualifiers.
pub fn depends(show: &str) -> Vec<String> {
    let mut names = Vec::new();
    // Only the first stanza: --no-all-versions prints the candidate first.
    for line in show.lines().take_while(|l| !l.trim().is_empty()) {
        let Some(list) = line.strip_prefix("Depends:").or_else(|| line.strip_prefix("Pre-Depends:")) else {
            continue;
        };
        for alt in list.split([',', '|']) {
            let name = alt.trim().split([' ', '(', ':']).next().unwrap_or("");
            if !name.is_empty() && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// The versioned image package among the meta package's dependencies.
pub fn concrete_image(deps: &[String]) -> Option<String> {
    deps.iter()
        .find(|d| {
            d.starts_with("linux-image-")
                && d.as_str() != META_PACKAGE
                && d.as_bytes().get(12).is_some_and(u8::is_ascii_digit)
        })
        .cloned()
}

/// The image's parts of the same kernel version.
pub fn parts(deps: &[String], version: &str) -> Vec<String> {
    deps.iter()
        .filter(|d| {
            ["linux-binary-", "linux-modules-", "linux-base-"].iter().any(|p| d.strip_prefix(p) == Some(version))
        })
        .cloned()
        .collect()
}

/// Refuses kernels older than [`MIN_VERSION`].
pub fn check_version(version: &str) -> anyhow::Result<()> {
    let mut nums = version.split(['.', '-', '+']).map(|n| n.parse::<u32>());
    let parsed = match (nums.next(), nums.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => bail!("cannot read the kernel version {version:?}"),
    };
    if parsed < MIN_VERSION {
        bail!(
            "{SUITE} offers kernel {version}, but rxe in network namespaces needs >= {}.{} \
             (older kernels fail every send with \"local QP operation error\")",
            MIN_VERSION.0,
            MIN_VERSION.1
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The meta package and image as trixie-backports had them (apt-cache show, trimmed).
    const META: &str = "Package: linux-image-amd64
Source: linux-signed-amd64 (7.3.4+1~bpo13+1)
Version: 7.3.4-1~bpo13+1
Installed-Size: 11
Depends: linux-base-amd64, linux-image-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-amd64
Description: Linux for 64-bit PCs (meta-package)
";
    const IMAGE: &str = "Package: linux-image-7.3.4+deb13-amd64
Version: 7.3.4-1~bpo13+1
Depends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-binary-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1)
Pre-Depends: linux-base (>= 4.17~)
Recommends: apparmor
";

    #[test]
    fn the_concrete_image_and_its_parts_are_found() {
        let image = concrete_image(&depends(META)).unwrap();
        assert_eq!(image, "linux-image-7.3.4+deb13-amd64");
        assert_eq!(
            parts(&depends(IMAGE), "7.3.4+deb13-amd64"),
            ["linux-base-7.3.4+deb13-amd64", "linux-binary-7.3.4+deb13-amd64", "linux-modules-7.3.4+deb13-amd64"]
        );
    }

    #[test]
    fn depends_reads_alternatives_and_pre_depends() {
        let d = depends(IMAGE);
        assert!(d.contains(&"initramfs-tools".to_string()), "{d:?}");
        assert!(d.contains(&"linux-base".to_string()), "{d:?}");
        assert!(!d.contains(&"apparmor".to_string()), "{d:?}");
    }

    #[test]
    fn a_meta_package_without_a_versioned_image_is_none() {
        let deps = depends("Depends: linux-image-amd64-signed-template, linux-base\n");
        assert_eq!(concrete_image(&deps), None);
    }

    #[test]
    fn kernels_older_than_7_2_are_refused() {
        check_version("7.3.4+deb13-amd64").unwrap();
        check_version("7.2.0-1-amd64").unwrap();
        let e = check_version("6.18.3+deb13-amd64").unwrap_err().to_string();
        assert!(e.contains("needs >= 7.2"), "{e}");
        assert!(check_version("amd64").is_err());
    }

    #[test]
    fn the_archive_uri_comes_from_the_release_stanza() {
        let text = "Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
";
        assert_eq!(archive_uri_deb822(text).as_deref(), Some("http://mirror.example/debian"));
        // The security stanza first, or a disabled one, is skipped.
        let text = "Types: deb\nURIs: http://s.example/debian-security\nSuites: trixie-security\n\n\
                    Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: trixie\n\n\
                    Types: deb-src deb\nURIs:\n http://m.example/debian\nSuites: trixie\n";
        assert_eq!(archive_uri_deb822(text).as_deref(), Some("http://m.example/debian"));
        assert_eq!(archive_uri_deb822("Types: deb-src\nURIs: http://x/\nSuites: trixie\n"), None);
    }

    #[test]
    fn the_archive_uri_comes_from_a_one_line_sources_list() {
        let text = "# comment\ndeb-src http://src.example/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://sec.example/debian-security bookworm-security main\n\
                    deb [ arch=amd64 ] http://m.example/debian/ bookworm main\n";
        assert_eq!(archive_uri_one_line(text).as_deref(), Some("http://m.example/debian"));
    }
}
