//! The contracts between rocemesh's parts.
//!
//! Everything that crosses a crate or a machine boundary is defined here and nowhere else:
//! the probe and path records an agent writes ([`record`]), the segment files they live in
//! ([`segment`]), the per-host pinglist `ctl` pushes ([`pinglist`]) and the fabric inventory
//! it is generated from ([`inventory`]). Each is versioned; a reader refuses what it does not
//! understand with an error that names the file and what to do about it.

pub mod inventory;
pub mod pinglist;
pub mod record;
pub mod segment;

mod tomlfile;
