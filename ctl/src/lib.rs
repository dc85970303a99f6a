//! The file-based controller: inventory checks and import, pinglist generation (ToR-mesh,
//! inter-ToR with ECMP flow-label coverage), and pushing pinglists to agents from a bastion.
//!
//! Not built yet (issue 4). Its file formats exist and are validated in
//! `rocemesh_formats::{inventory, pinglist}`.
