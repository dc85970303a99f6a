//! The soft-RoCE VM: `testbeds rxe-vm -- CMD` runs one command as root inside a qemu (TCG) guest
//! whose kernel has rdma_rxe, because the CI machines' own kernel has no RDMA at all.
//!
//! This module owns the host side, phase by phase: host packages ([`packages`]), a Debian
//! backports kernel cached under the cache directory ([`kernel`]), an initramfs of static busybox
//! and the kernel's module closure ([`initramfs`]), and the boot itself ([`boot`]). The guest's
//! root is the host's root, read-only over virtio-9p, so every binary of the host (rdma-core,
//! perftest, anything under CARGO_TARGET_DIR) runs in the guest at the same path; the "lab"
//! directory is shared read-write at the same absolute path too, so paths to results are the same
//! inside and outside. What runs inside, the testbed network, is [`crate::rxefabric`].
//!
//! Why each step is the way it is: each phase's module doc, and docs/design/testbeds.md#the-soft-roce-vm-testbeds-rxe-vm.

pub mod boot;
pub mod initramfs;
pub mod kernel;
pub mod packages;

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

pub use boot::VmError;

/// The environment variable that overrides the cache directory.
pub const CACHE_ENV: &str = "ROCEMESH_RXE_VM_CACHE";

/// Variables passed from the host's environment to the guest command when set; `--env` adds more.
pub const PASSED_ENV: &[&str] =
    &["PATH", "HOME", "LANG", "RUST_LOG", "RUST_BACKTRACE", "CARGO_TARGET_DIR", "ROCEMESH_RXE_VM_CACHE"];

/// The cache directory: `$ROCEMESH_RXE_VM_CACHE`, else `~/.cache/rocemesh/rxe-vm`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(CACHE_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/rocemesh/rxe-vm")
}

/// The guest command's environment: [`PASSED_ENV`] as this process has them, this executable's
/// directory first on PATH (so `testbeds` itself is found in the guest, also under `cargo run`),
/// then `extra`: `KEY=VALUE`, or `KEY` for this process's value.
pub fn guest_env(extra: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut env: Vec<(String, String)> =
        PASSED_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
    let sbin = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    let host_path = std::env::var("PATH").unwrap_or_else(|_| sbin.to_string());
    let exe_dir = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf));
    // /usr/sbin holds ip, tc and rdma; a user's PATH does not always have it.
    let path = match exe_dir {
        Some(dir) => format!("{}:{host_path}:/usr/sbin:/sbin", dir.display()),
        None => format!("{host_path}:/usr/sbin:/sbin"),
    };
    set(&mut env, "PATH", path);
    for e in extra {
        match e.split_once('=') {
            Some((k, v)) => set(&mut env, k, v.to_string()),
            None => {
                let v = std::env::var(e).with_context(|| format!("--env {e}: {e} is not set here"))?;
                set(&mut env, e, v);
            }
        }
    }
    Ok(env)
}

fn set(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value));
}

/// One `rxe-vm` run.
#[derive(Debug, Clone)]
pub struct VmOptions {
    /// Downloads, the extracted kernel and initramfs images.
    pub cache: PathBuf,
    /// Shared read-write with the guest at the same absolute path; gets console.log.
    pub lab: PathBuf,
    /// Whole-VM limit (boot, command, shutdown); qemu is killed when it passes.
    pub timeout: Duration,
    pub mem_mb: u32,
    pub cpus: u32,
    /// Extra kernel command-line arguments (`loglevel=7` to see the boot).
    pub kernel_args: Vec<String>,
    /// Resolve the newest backports kernel again instead of using the cached one.
    pub update_kernel: bool,
    /// The guest command's environment.
    pub env: Vec<(String, String)>,
    /// The guest command's working directory (it must exist on the host's root or in the lab).
    pub cwd: PathBuf,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// How long each phase took; printed to stderr at the end of a run.
#[derive(Debug, Default, Clone)]
pub struct PhaseTimes {
    pub packages: Option<Duration>,
    pub kernel: Option<Duration>,
    pub initramfs: Option<Duration>,
    pub boot_to_command: Option<Duration>,
    pub command: Option<Duration>,
    pub total: Option<Duration>,
}

impl fmt::Display for PhaseTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phases = [
            ("packages", self.packages),
            ("kernel", self.kernel),
            ("initramfs", self.initramfs),
            ("boot-to-command", self.boot_to_command),
            ("command", self.command),
            ("total", self.total),
        ];
        let mut first = true;
        for (name, d) in phases {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            match d {
                Some(d) => write!(f, "{name} {:.1} s", d.as_secs_f64())?,
                None => write!(f, "{name} -")?,
            }
        }
        Ok(())
    }
}

/// `rxe-vm`'s exit code for the guest command's exit status, by the README's policy: the command
/// ran and failed is 1 ("found problems"), whatever its status, so that 2 keeps meaning the VM
/// itself could not run it (a [`VmError`]).
pub fn exit_code(status: i32) -> i32 {
    if status == 0 { 0 } else { 1 }
}

/// Prepares everything (packages, kernel, initramfs), boots the VM, runs the command and returns
/// its exit status. Errors are [`VmError`]s: the VM's own failures, never the command's status. `times` is filled in as phases complete, also on error.
pub fn run(opts: &VmOptions, times: &mut PhaseTimes) -> Result<i32, VmError> {
    let started = Instant::now();
    let result = run_phases(opts, times);
    times.total = Some(started.elapsed());
    result
}

fn run_phases(opts: &VmOptions, times: &mut PhaseTimes) -> Result<i32, VmError> {
    std::fs::create_dir_all(&opts.cache)
        .with_context(|| format!("creating the cache directory {}", opts.cache.display()))
        .map_err(VmError::Setup)?;
    // Two runs sharing a cache would extract the same kernel into the same place; the second
    // waits here and then finds everything ready.
    let lock = lock_cache(&opts.cache).map_err(VmError::Setup)?;

    let t = Instant::now();
    packages::ensure(&opts.cache).map_err(VmError::Setup)?;
    times.packages = Some(t.elapsed());

    let t = Instant::now();
    let kernel = kernel::ensure(&opts.cache, opts.update_kernel).map_err(VmError::Setup)?;
    times.kernel = Some(t.elapsed());

    let t = Instant::now();
    let initrd = initramfs::ensure(&opts.cache, &kernel).map_err(VmError::Setup)?;
    times.initramfs = Some(t.elapsed());
    drop(lock);

    boot::boot(opts, &kernel, &initrd, times)
}

fn lock_cache(cache: &Path) -> anyhow::Result<File> {
    let path = cache.join("lock");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    file.lock().with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_guest_command_exits_1_whatever_its_status() {
        assert_eq!(exit_code(0), 0);
        // 2 and 124/125 included: only a VmError may mean "could not run".
        for status in [1, 2, 3, 124, 125, 255] {
            assert_eq!(exit_code(status), 1, "{status}");
        }
    }

    #[test]
    fn phase_times_print_missing_phases_as_dashes() {
        let t = PhaseTimes {
            packages: Some(Duration::from_millis(120)),
            kernel: Some(Duration::from_secs(3)),
            total: Some(Duration::from_millis(3150)),
            ..PhaseTimes::default()
        };
        assert_eq!(
            t.to_string(),
            "packages 0.1 s, kernel 3.0 s, initramfs -, boot-to-command -, command -, total 3.1 s"
        );
    }
}
