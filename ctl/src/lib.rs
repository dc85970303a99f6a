//! The file-based controller, run by operators from a bastion host.
//!
//! ```text
//! agent describe ──▶ host descriptions ─┐
//!                    ToR map / rule ────┴─ inventory::import ─▶ inventory.toml ─ inventory::check
//!                                                                     │
//!                                            generation::Generator (seed, G)
//!                                                                     ▼
//!                                          DIR/<host>.toml ── push (ssh or shared dir, atomic)
//!                                                │                     │
//!                                   diff::diff ──┴── status::status ◀──┘ (what the hosts hold)
//! ```
//!
//! - [`describe`]: the self-description an agent prints (`agent describe`): host name and RNICs.
//! - [`import`]: host descriptions plus a ToR map (file, host-name rule, or rails) → inventory.
//! - [`check`]: what ctl needs of an inventory beyond the format's own validation.
//! - [`switch_addrs`]: the switches' own addresses (how path traces see them) into an inventory,
//!   from a `switch,addr` list.
//! - [`generation`]: per-host pinglists: ToR-mesh, inter-ToR with a rotation that covers every ToR pair
//!   (within a rail on rail-optimised fabrics) in a computed number of generations, and flow
//!   labels sized by the ECMP coverage formula.
//! - [`collect`]: the agents' sealed segments into a collection directory, verified on arrival.
//! - [`keys`]: the fleet key file that authenticates probes, rotated without a probing gap.
//! - [`push`]: copy pinglists to hosts with the system `ssh` (or into a shared directory),
//!   atomically, in parallel; [`status`] and [`diff`] read back what the hosts hold.
//! - [`scrape`]: the agents' live views, read with RDMA READ (the agents do nothing).
//! - [`doctor`]: `agent doctor` on every host over ssh, and what the fleet's answers add up to.
//! - [`cli`]: the `ctl` command line's arguments (the binary runs them).

pub mod check;
pub mod cli;
pub mod collect;
/// The host description format, which lives in `formats` with the other contracts.
pub use rocemesh_formats::describe;
pub mod diff;
pub mod doctor;
mod error;
pub mod generation;
pub mod import;
pub mod keys;
pub mod lldp;
pub mod pinglist_dir;
pub mod push;
pub mod remote;
mod rng;
pub mod scrape;
pub mod status;
pub mod switch_addrs;

pub use error::{Error, host_name_problem};
pub use pinglist_dir::write_file_atomically;
