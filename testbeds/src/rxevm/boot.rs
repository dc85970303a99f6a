//! The boot: the guest command's run script in the lab, qemu's command line, and watching the
//! serial console (copied to `<lab>/console.log`) for /init's markers until the command's exit
//! status is known, the VM dies, or the timeout kills qemu.
//!
//! /init (testbeds/rxe-vm/init.sh) prints `ROCEMESH-RXE-VM: command-begin` before the command and
//! `ROCEMESH-RXE-VM: command-end <status>` after it, and leaves the status in
//! `<lab>/.rxe-vm/status`. Console lines between the markers (the command's output) are also
//! copied to this process's stdout.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use super::kernel::Kernel;
use super::{PhaseTimes, VmOptions};

const MARK: &str = "ROCEMESH-RXE-VM: ";
/// How long a VM whose command has ended may take to power off before it is killed anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Why `rxe-vm` could not report the command's own exit status: every variant is "could not
/// run" (exit 2), told apart by its message.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("preparing the VM failed: {0:#}")]
    Setup(anyhow::Error),
    #[error("the VM did not boot to the command: {reason} (console: {})", console.display())]
    BootFailed { reason: String, console: PathBuf },
    #[error(
        "timed out after {secs} s {during}; qemu was killed (console: {})",
        console.display()
    )]
    TimedOut { secs: u64, during: &'static str, console: PathBuf },
    #[error("the VM died while the command ran: {reason} (console: {})", console.display())]
    Died { reason: String, console: PathBuf },
}

impl VmError {
    /// The console log worth showing, when the VM got as far as booting.
    pub fn console(&self) -> Option<&Path> {
        match self {
            VmError::Setup(_) => None,
            VmError::BootFailed { console, .. } | VmError::TimedOut { console, .. } | VmError::Died { console, .. } => {
                Some(console)
            }
        }
    }
}

/// The last `n` lines of `path` (empty when it cannot be read).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Boots `kernel` with `initrd`, runs `opts.command` in it and returns its exit status. The boot
/// and command phases go into `times` as far as they got, also on error.
pub fn boot(opts: &VmOptions, kernel: &Kernel, initrd: &Path, times: &mut PhaseTimes) -> Result<i32, VmError> {
    let lab = prepare_lab(opts).map_err(VmError::Setup)?;
    let console = lab.join("console.log");
    let control = lab.join(".rxe-vm");
    let args = qemu_args(&QemuConfig {
        kernel: &kernel.image,
        initrd,
        lab: &lab,
        mem_mb: opts.mem_mb,
        cpus: opts.cpus,
        kernel_args: &opts.kernel_args,
    });
    let qemu_log = control.join("qemu.log");
    let stderr =
        File::create(&qemu_log).with_context(|| format!("creating {}", qemu_log.display())).map_err(VmError::Setup)?;
    let console_file =
        File::create(&console).with_context(|| format!("creating {}", console.display())).map_err(VmError::Setup)?;

    let started = Instant::now();
    let deadline = started + opts.timeout;
    let mut child = Command::new("qemu-system-x86_64")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .context("starting qemu-system-x86_64 (scripts/rxe-vm-setup installs it)")
        .map_err(VmError::Setup)?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        return Err(VmError::Setup(anyhow!("qemu's stdout was not captured")));
    };
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || watch_console(stdout, console_file, tx));

    let mut begun: Option<Instant> = None;
    let mut ended: Option<(Instant, i32)> = None;
    let mut init_failed: Option<String> = None;
    let result = loop {
        let now = Instant::now();
        let limit = match ended {
            Some((at, _)) => deadline.max(at + SHUTDOWN_GRACE),
            None => deadline,
        };
        if now >= limit {
            kill(&mut child);
            if let Some((_, status)) = ended {
                eprintln!("rxe-vm: the VM did not power off after the command; killed it");
                break Ok(status);
            }
            let during = if begun.is_some() {
                "while the command ran (raise --timeout-s if it is just slow)"
            } else {
                "before the command started: the boot hung (try --kernel-arg loglevel=7 to see more of it)"
            };
            break Err(VmError::TimedOut { secs: opts.timeout.as_secs(), during, console: console.clone() });
        }
        match rx.recv_timeout(limit - now) {
            Ok(Event::Begin) => {
                let now = Instant::now();
                begun = Some(now);
                times.boot_to_command = Some(now - started);
            }
            Ok(Event::End(status)) => {
                let now = Instant::now();
                ended = Some((now, status));
                times.command = begun.map(|b| now - b);
            }
            Ok(Event::InitFailed(reason)) => init_failed = Some(reason),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Ok(Event::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let exit = wait_briefly(&mut child);
                if let Some((_, marker_status)) = ended {
                    // The file is what /init wrote first; the marker is the fallback.
                    break Ok(read_status(&control).unwrap_or(marker_status));
                }
                let mut qemu = describe_qemu_exit(exit, &qemu_log);
                if let Some(panic) = panic_line(&console) {
                    qemu = format!("{panic}; {qemu}");
                }
                break Err(match (begun, init_failed.take()) {
                    (_, Some(reason)) => {
                        VmError::BootFailed { reason: format!("/init: {reason}"), console: console.clone() }
                    }
                    (None, None) => VmError::BootFailed { reason: qemu, console: console.clone() },
                    (Some(_), None) => VmError::Died { reason: qemu, console: console.clone() },
                });
            }
        }
    };
    if ended.is_none()
        && let Some(b) = begun
    {
        times.command = Some(b.elapsed());
    }
    let _ = reader.join();
    result
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn wait_briefly(child: &mut Child) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(child);
    None
}

fn describe_qemu_exit(exit: Option<std::process::ExitStatus>, qemu_log: &Path) -> String {
    let log = std::fs::read_to_string(qemu_log).unwrap_or_default();
    let log = log.trim();
    let how = match exit {
        Some(s) => format!("qemu exited ({s})"),
        None => "qemu closed its console".to_string(),
    };
    if log.is_empty() { how } else { format!("{how}; qemu said: {log}") }
}

/// The guest kernel's panic message, when the console has one (with panic=-1 a panic ends qemu).
fn panic_line(console: &Path) -> Option<String> {
    let text = String::from_utf8_lossy(&std::fs::read(console).ok()?).into_owned();
    let line = text.lines().find(|l| l.contains("Kernel panic"))?;
    Some(line[line.find("Kernel panic")?..].trim().to_string())
}

fn read_status(control: &Path) -> Option<i32> {
    std::fs::read_to_string(control.join("status")).ok()?.trim().parse().ok()
}

#[derive(Debug)]
enum Event {
    Begin,
    End(i32),
    InitFailed(String),
    Eof,
}

fn watch_console(stdout: impl std::io::Read, mut log: File, tx: mpsc::Sender<Event>) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let mut in_command = false;
    let out = std::io::stdout();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // The serial line discipline turns \n into \r\n.
        let text = String::from_utf8_lossy(&line).replace('\r', "");
        let _ = log.write_all(text.as_bytes());
        match parse_marker(&text) {
            Some(Event::Begin) => {
                in_command = true;
                let _ = tx.send(Event::Begin);
            }
            Some(ev @ Event::End(_)) => {
                in_command = false;
                let _ = tx.send(ev);
            }
            Some(ev) => {
                let _ = tx.send(ev);
            }
            None if in_command => {
                let mut o = out.lock();
                let _ = o.write_all(text.as_bytes());
                let _ = o.flush();
            }
            None => {}
        }
    }
    let _ = log.flush();
    let _ = tx.send(Event::Eof);
}

fn parse_marker(line: &str) -> Option<Event> {
    // Firmware output without a newline can precede the first marker on its line.
    let rest = &line.trim_end()[line.find(MARK)? + MARK.len()..];
    if rest == "command-begin" {
        Some(Event::Begin)
    } else if let Some(status) = rest.strip_prefix("command-end ") {
        status.trim().parse().ok().map(Event::End)
    } else {
        rest.strip_prefix("init-failed ").map(|r| Event::InitFailed(r.to_string()))
    }
}

/// The lab, canonical, with a fresh `.rxe-vm/run.sh` and no status of an earlier run.
fn prepare_lab(opts: &VmOptions) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(&opts.lab).with_context(|| format!("creating the lab {}", opts.lab.display()))?;
    let lab = opts.lab.canonicalize().with_context(|| format!("resolving {}", opts.lab.display()))?;
    check_guest_path(&lab)?;
    let control = lab.join(".rxe-vm");
    std::fs::create_dir_all(&control).with_context(|| format!("creating {}", control.display()))?;
    for stale in ["status", "dmesg.log"] {
        let _ = std::fs::remove_file(control.join(stale));
    }
    if let Some(bad) =
        opts.kernel_args.iter().find(|a| a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '"'))
    {
        bail!("kernel argument {bad:?} is not one word");
    }
    let script = run_script(&opts.env, &opts.cwd, &opts.command)?;
    let path = control.join("run.sh");
    std::fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
    Ok(lab)
}

/// The lab path travels on the kernel command line and in qemu's `-virtfs` option, which have
/// no quoting worth relying on: refuse what they cannot carry.
pub fn check_guest_path(path: &Path) -> anyhow::Result<()> {
    let s = path.to_str().ok_or_else(|| anyhow!("the lab path {} is not UTF-8", path.display()))?;
    if !s.starts_with('/') {
        bail!("the lab path {s} is not absolute");
    }
    if s == "/" {
        bail!("the lab cannot be the root directory: it is shared read-write with the guest");
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || "/._-+@:=~".contains(*c))) {
        bail!("the lab path {s:?} contains {c:?}; use a directory whose path has only letters, digits and /._-+@:=~");
    }
    Ok(())
}

/// The guest's /bin/sh script: the environment, the working directory, then `exec` the command.
pub fn run_script(env: &[(String, String)], cwd: &Path, command: &[String]) -> anyhow::Result<String> {
    if command.is_empty() {
        bail!("no command to run in the VM; give it after `--`");
    }
    let mut s = String::from("# Written by `testbeds rxe-vm`; /init runs it chrooted into the host's root.\n");
    for (k, v) in env {
        if k.is_empty()
            || k.starts_with(|c: char| c.is_ascii_digit())
            || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            bail!("{k:?} is not a valid environment variable name");
        }
        s.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    let cwd = cwd.to_string_lossy();
    let q = shell_quote(&cwd);
    s.push_str(&format!(
        "cd {q} 2>/dev/null || {{ echo \"rxe-vm: \"{q}\" is not visible in the guest; running in /\" >&2; cd /; }}\n"
    ));
    s.push_str("exec");
    for word in command {
        s.push(' ');
        s.push_str(&shell_quote(word));
    }
    s.push('\n');
    Ok(s)
}

/// `word` as one POSIX shell word.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c)) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// What qemu's command line is built from.
#[derive(Debug)]
pub struct QemuConfig<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub lab: &'a Path,
    pub mem_mb: u32,
    pub cpus: u32,
    /// Extra kernel command-line arguments, one word each.
    pub kernel_args: &'a [String],
}

/// qemu's arguments. /dev/kvm on these machines is a nested device that aborts or crawls, so
/// the guest always runs under TCG, multi-threaded.
pub fn qemu_args(c: &QemuConfig<'_>) -> Vec<String> {
    let mut append = "console=ttyS0 panic=-1 quiet mitigations=off".to_string();
    for arg in c.kernel_args {
        append.push(' ');
        append.push_str(arg);
    }
    // Last, so that /init's parsing of it cannot be overridden by an extra argument.
    append.push_str(&format!(" rocemesh.lab={}", c.lab.display()));
    let mut a: Vec<String> = [
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-M",
        "q35",
        "-nodefaults",
        "-nographic",
        "-serial",
        "stdio",
        "-no-reboot",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(["-m".into(), c.mem_mb.to_string(), "-smp".into(), c.cpus.to_string()]);
    a.extend(["-kernel".into(), c.kernel.display().to_string(), "-initrd".into(), c.initrd.display().to_string()]);
    a.extend(["-append".into(), append]);
    a.extend([
        "-virtfs".into(),
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap".into(),
        "-virtfs".into(),
        format!("local,path={},mount_tag=lab,security_model=none,multidevs=remap", c.lab.display()),
    ]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_leaves_plain_words_and_quotes_the_rest() {
        assert_eq!(shell_quote("ib_send_lat"), "ib_send_lat");
        assert_eq!(shell_quote("--size=64"), "--size=64");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's $HOME"), r"'it'\''s $HOME'");
    }

    #[test]
    fn run_script_exports_changes_directory_and_execs() {
        let env = vec![("RUST_LOG".to_string(), "debug,x=trace".to_string()), ("P".to_string(), "a b".to_string())];
        let s = run_script(&env, Path::new("/work/main"), &["testbeds".into(), "rxe-fabric".into(), "it's".into()])
            .unwrap();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[1], "export RUST_LOG=debug,x=trace");
        assert_eq!(lines[2], "export P='a b'");
        assert!(lines[3].starts_with("cd /work/main 2>/dev/null || "), "{}", lines[3]);
        assert_eq!(lines[4], r"exec testbeds rxe-fabric 'it'\''s'");
    }

    #[test]
    fn run_script_refuses_bad_names_and_no_command() {
        assert!(run_script(&[("A-B".into(), "x".into())], Path::new("/"), &["true".into()]).is_err());
        assert!(run_script(&[("1A".into(), "x".into())], Path::new("/"), &["true".into()]).is_err());
        assert!(run_script(&[], Path::new("/"), &[]).is_err());
    }

    #[test]
    fn lab_paths_the_command_line_cannot_carry_are_refused() {
        check_guest_path(Path::new("/root/.cache/rocemesh/rxe-vm/lab")).unwrap();
        check_guest_path(Path::new("/tmp/lab-1_x")).unwrap();
        for bad in ["/tmp/a b", "/tmp/a,b", "/tmp/a\"b", "relative", "/"] {
            assert!(check_guest_path(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn qemu_args_share_both_roots_and_use_tcg() {
        let a = qemu_args(&QemuConfig {
            kernel: Path::new("/c/vmlinux"),
            initrd: Path::new("/c/i.cpio"),
            lab: Path::new("/w/lab"),
            mem_mb: 2048,
            cpus: 2,
            kernel_args: &["loglevel=7".to_string()],
        });
        let after = |flag: &str| -> Vec<&str> {
            a.iter().enumerate().filter(|(_, x)| *x == flag).map(|(i, _)| a[i + 1].as_str()).collect()
        };
        assert_eq!(after("-accel"), ["tcg,thread=multi"]);
        assert_eq!(after("-m"), ["2048"]);
        assert_eq!(after("-smp"), ["2"]);
        assert_eq!(after("-kernel"), ["/c/vmlinux"]);
        assert_eq!(
            after("-virtfs"),
            [
                "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
                "local,path=/w/lab,mount_tag=lab,security_model=none,multidevs=remap"
            ]
        );
        let append = after("-append")[0];
        assert!(append.contains("console=ttyS0") && append.contains("panic=-1"), "{append}");
        assert!(append.ends_with("quiet mitigations=off loglevel=7 rocemesh.lab=/w/lab"), "{append}");
        assert!(a.contains(&"-no-reboot".to_string()));
    }

    #[test]
    fn markers_are_recognised() {
        assert!(matches!(parse_marker("ROCEMESH-RXE-VM: command-begin\n"), Some(Event::Begin)));
        assert!(matches!(parse_marker("ROCEMESH-RXE-VM: command-end 3\n"), Some(Event::End(3))));
        assert!(
            matches!(parse_marker("ROCEMESH-RXE-VM: init-failed mounting x"), Some(Event::InitFailed(r)) if r == "mounting x")
        );
        assert!(matches!(
            parse_marker("\x1b[0mBooting from ROM..ROCEMESH-RXE-VM: command-begin\r"),
            Some(Event::Begin)
        ));
        assert!(parse_marker("ROCEMESH-RXE-VM: command-end x").is_none());
    }
}
