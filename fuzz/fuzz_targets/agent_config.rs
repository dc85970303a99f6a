//! The agent's configuration file (`agent run/check-config --config`).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rocemesh_agent::config::AgentConfig;

fuzz_target!(|data: &[u8]| {
    let Some(text) = rocemesh_fuzz::text(data) else { return };
    // Errors are printed to the operator: format them as the agent does.
    match AgentConfig::parse(text, Path::new("/etc/rocemesh/agent.toml")) {
        Ok(cfg) => drop(format!("{cfg:?}")),
        Err(e) => drop(e.to_string()),
    }
});
