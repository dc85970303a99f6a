//! eBPF discovery of service RDMA connections (QP transitions to RTR), so that the agent can
//! probe the paths real traffic takes.
//!
//! Not built yet: it needs libbpf-rs, clang and the soft-RoCE VM's kernel to be exercised
//! (see ../shared/reference/crates.md); no issue schedules it before the verbs transport.
