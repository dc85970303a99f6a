//! A throwaway OpenSSH server on loopback for the ssh tests: `/usr/sbin/sshd` as the current
//! user with a fresh host key and user key, reached through an ssh config with five host aliases
//! (host0..host3 reach sshd, host4 a closed port).
#![allow(dead_code)]

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// Kills sshd when the test ends, however it ends.
struct SshdGuard(Child);

impl Drop for SshdGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

pub fn free_port() -> u16 {
    // Bound and released: nothing listens on it afterwards (sshd binds it right after).
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap()
}

pub fn keygen(path: &Path) {
    run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "rocemesh-test", "-f"]).arg(path));
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub port: u16,
    _sshd: SshdGuard,
}

impl Fixture {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Host aliases host0..host3 reach sshd; host4 reaches `host4_port`.
    pub fn write_ssh_config(&self, host4_port: u16) {
        let user = String::from_utf8(run(Command::new("id").arg("-un")).stdout).unwrap();
        let config = format!(
            "Host host0 host1 host2 host3\n  HostName 127.0.0.1\n  Port {port}\n\
             Host host4\n  HostName 127.0.0.1\n  Port {host4_port}\n\
             Host *\n  User {user}\n  IdentityFile {id}\n  IdentitiesOnly yes\n  IdentityAgent none\n  \
             UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  \
             HostKeyAlias rocemesh-test-sshd\n  LogLevel ERROR\n  ControlMaster no\n",
            port = self.port,
            user = user.trim(),
            id = self.path("id").display(),
            known = self.path("known_hosts").display(),
        );
        std::fs::write(self.path("ssh_config"), config).unwrap();
    }

    pub fn ssh_option(&self) -> String {
        format!("-F {}", self.path("ssh_config").display())
    }
}

pub fn start_sshd() -> Fixture {
    assert!(
        Path::new(SSHD).exists(),
        "{SSHD} is missing: run scripts/setup (it installs openssh-server, which this test needs)"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    keygen(&p("host_key"));
    keygen(&p("id"));
    std::fs::copy(p("id.pub"), p("authorized_keys")).unwrap();
    let host_pub = std::fs::read_to_string(p("host_key.pub")).unwrap();
    std::fs::write(p("known_hosts"), format!("rocemesh-test-sshd {host_pub}")).unwrap();
    // sshd running as root insists on its privilege-separation directory, which a container may
    // not have created at boot.
    let is_root = String::from_utf8(run(Command::new("id").arg("-u")).stdout).unwrap().trim() == "0";
    if is_root {
        std::fs::create_dir_all("/run/sshd").unwrap();
    }
    let port = free_port();
    let config = format!(
        "ListenAddress 127.0.0.1:{port}\nHostKey {host_key}\nPidFile none\nUsePAM no\nStrictModes no\n\
         AuthorizedKeysFile {keys}\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n{root}MaxStartups 64\nMaxSessions 64\nLogLevel ERROR\n",
        host_key = p("host_key").display(),
        keys = p("authorized_keys").display(),
        root = if is_root { "PermitRootLogin prohibit-password\n" } else { "" },
    );
    std::fs::write(p("sshd_config"), config).unwrap();
    let child = Command::new(SSHD)
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(p("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {SSHD}: {e}"));
    let mut guard = SshdGuard(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = guard.0.try_wait() {
            let mut log = String::new();
            if let Some(mut e) = guard.0.stderr.take() {
                let _ = e.read_to_string(&mut log);
            }
            panic!("sshd exited with {status} before listening: {log}");
        }
        assert!(Instant::now() < deadline, "sshd did not listen on 127.0.0.1:{port} within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let fixture = Fixture { dir, port, _sshd: guard };
    fixture.write_ssh_config(free_port());
    fixture
}
