//! Host packages of the VM: `scripts/rxe-vm-setup`, compiled into the binary so that `rxe-vm` works
//! from any directory and the script can still be run by hand (or by CI) on its own.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

const SETUP: &str = include_str!("../../../scripts/rxe-vm-setup");

/// Installs what is missing; a no-op costing a few dpkg queries when everything is there.
pub fn ensure(cache: &Path) -> anyhow::Result<()> {
    let status = Command::new("bash")
        .arg("-c")
        .arg(SETUP)
        .arg("rxe-vm-setup")
        .arg(cache)
        .status()
        .context("running bash for scripts/rxe-vm-setup (is bash installed?)")?;
    if !status.success() {
        bail!(
            "installing the VM's host packages failed ({status}); see rxe-vm-setup's messages above, \
             fix apt (network, mirror, dpkg state) and run again"
        );
    }
    Ok(())
}
