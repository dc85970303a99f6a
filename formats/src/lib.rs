//! The contracts between rocemesh's parts.
//!
//! Everything that crosses a crate or a machine boundary is defined here and nowhere else:
//! the probe and path records an agent writes ([`record`]), the segment files they live in
//! ([`segment`]), the per-host pinglist `ctl` pushes ([`pinglist`]), the fabric inventory
//! it is generated from ([`inventory`]), the fleet's probe keys ([`keys`]), what an agent reports about its host ([`describe`]), and
//! how an address becomes a RoCE GID ([`gid`]), the live view a collector reads from an
//! agent's memory with RDMA READ ([`view`]), the window summaries a segment carries beside its
//! records ([`window`]), and the pushes that carry them to the live analyzer as windows close
//! ([`live`]).
//! Each is versioned; a reader refuses what it does not understand with an error that names the
//! file and what to do about it. [`time`] turns the records' Unix timestamps into dates for the
//! tables operators read.

pub mod describe;
#[cfg(feature = "docs")]
pub mod docs;
pub mod gid;
pub mod inventory;
pub mod keys;
pub mod live;
pub mod pinglist;
pub mod record;
pub mod scenario;
pub mod segment;
pub mod time;
pub mod view;
pub mod window;

mod tomlfile;
