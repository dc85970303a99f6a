//! `bench collect`: `ctl collect` from one host against plain `scp` of the same files, in one
//! run, over the same throwaway sshd on loopback (so both pay the same ssh cipher and the same
//! disk; what differs is ctl's listing, verification, fsync and rename).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rocemesh_formats::record::{EndpointRole, ProbeRecord};
use rocemesh_formats::segment::{SegmentWriter, WriterConfig, WriterIdentity, seal};

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Line {
    pub what: String,
    pub mib_per_s: f64,
    pub note: String,
}

struct Sshd(std::process::Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// An sshd on 127.0.0.1 with fresh keys, reachable as host `bench` through `dir/ssh_config`.
fn sshd(dir: &Path) -> Result<Sshd> {
    for k in ["host_key", "id"] {
        run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(dir.join(k)))?;
    }
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys"))?;
    let host_pub = std::fs::read_to_string(dir.join("host_key.pub"))?;
    std::fs::write(dir.join("known_hosts"), format!("rocemesh-bench-sshd {host_pub}"))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let root = String::from_utf8(Command::new("id").arg("-u").output()?.stdout)?.trim() == "0";
    if root {
        std::fs::create_dir_all("/run/sshd")?;
    }
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {}\nPidFile none\nUsePAM no\nStrictModes no\n\
             AuthorizedKeysFile {}\nSubsystem sftp /usr/lib/openssh/sftp-server\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n{}LogLevel ERROR\n",
            dir.join("host_key").display(),
            dir.join("authorized_keys").display(),
            if root { "PermitRootLogin prohibit-password\n" } else { "" }
        ),
    )?;
    let user = String::from_utf8(Command::new("id").arg("-un").output()?.stdout)?;
    std::fs::write(
        dir.join("ssh_config"),
        format!(
            "Host bench\n  HostName 127.0.0.1\n  Port {port}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
             IdentityAgent none\n  UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  HostKeyAlias \
             rocemesh-bench-sshd\n  LogLevel ERROR\n",
            user.trim(),
            dir.join("id").display(),
            dir.join("known_hosts").display()
        ),
    )?;
    let child = Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting /usr/sbin/sshd (scripts/setup installs openssh-server)")?;
    let guard = Sshd(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        ensure!(Instant::now() < deadline, "sshd did not listen within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(guard)
}

/// Sealed segments of about `mib` MiB in all under `dir/lo0`; (files, bytes).
fn segments(dir: &Path, mib: u64) -> Result<(usize, u64)> {
    let mut wc = WriterConfig::new(dir.join("lo0"));
    wc.segment_bytes = 8 << 20;
    let identity = WriterIdentity {
        host: "bench".into(),
        device: "lo0".into(),
        tor: "tor0".into(),
        agent_epoch: 1,
        tool: "bench collect".into(),
    };
    let mut w = SegmentWriter::new(wc, identity)?;
    let me = w.endpoint(EndpointRole::Rnic, "bench/lo0", "tor0", [0; 16]);
    let (mut files, mut bytes, mut i) = (0usize, 0u64, 0u64);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    while bytes < mib << 20 {
        // Probe-like records (varying RTTs): compressible as real ones are, not trivially.
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            i += 1;
            w.append(&ProbeRecord {
                t1_unix_ns: 1_795_500_000_000_000_000 + i * 100_000,
                seq: i,
                prober: me,
                target: me,
                network_rtt_ns: (x % 50_000) as i32,
                prober_delay_ns: (x >> 20) as i32 & 0xffff,
                responder_delay_ns: (x >> 40) as i32 & 0xffff,
                ..ProbeRecord::default()
            })?;
        }
        for p in w.take_closed() {
            let r = seal(&p, 3)?;
            files += 1;
            bytes += r.sealed_bytes;
        }
    }
    for p in w.finish()? {
        let r = seal(&p, 3)?;
        files += 1;
        bytes += r.sealed_bytes;
    }
    Ok((files, bytes))
}

/// `ctl collect` (`ctl` the binary) against `scp -r`, about `mib` MiB of sealed segments.
pub fn run_bench(ctl: &Path, mib: u64) -> Result<Vec<Line>> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let _sshd = sshd(dir)?;
    let remote = dir.join("host/segments");
    let (files, bytes) = segments(&remote, mib)?;
    let cfg = dir.join("ssh_config");
    let mib_of = |b: u64| b as f64 / (1 << 20) as f64;

    let out = dir.join("collection");
    let t = Instant::now();
    let o = Command::new(ctl)
        .args(["collect", "--hosts", "bench", "--remote-dir"])
        .arg(&remote)
        .arg("--out")
        .arg(&out)
        .arg("--ssh-option")
        .arg(format!("-F {}", cfg.display()))
        .output()
        .with_context(|| format!("running {}", ctl.display()))?;
    let collect_s = t.elapsed().as_secs_f64();
    if !o.status.success() {
        bail!("ctl collect failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }

    let scp_out = dir.join("scp");
    std::fs::create_dir_all(&scp_out)?;
    let t = Instant::now();
    run(Command::new("scp")
        .arg("-q")
        .arg("-r")
        .arg("-F")
        .arg(&cfg)
        .arg(format!("bench:{}", remote.join("lo0").display()))
        .arg(&scp_out))?;
    let scp_s = t.elapsed().as_secs_f64();
    let scp_bytes: u64 = dir_bytes(&scp_out.join("lo0"))?;
    ensure!(scp_bytes == bytes, "scp copied {scp_bytes} bytes of {bytes}");

    let collect_rate = mib_of(bytes) / collect_s;
    let scp_rate = mib_of(bytes) / scp_s;
    Ok(vec![
        Line {
            what: "scp -r of the sealed segments (baseline)".into(),
            mib_per_s: scp_rate,
            note: format!("{files} files, {:.1} MiB in {scp_s:.2} s", mib_of(bytes)),
        },
        Line {
            what: "ctl collect of the same files (listed, verified, fsynced)".into(),
            mib_per_s: collect_rate,
            note: format!("{:.2}x scp; {:.2} s", collect_rate / scp_rate, collect_s),
        },
    ])
}

fn dir_bytes(d: &Path) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(d)? {
        let e = e?;
        n += e.metadata()?.len();
    }
    Ok(n)
}

/// `ctl` next to this binary.
pub fn default_ctl() -> Result<PathBuf> {
    Ok(std::env::current_exe()?.with_file_name("ctl"))
}
