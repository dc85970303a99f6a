//! eBPF discovery of service RDMA connections (QP transitions to RTR), so that the agent can
//! probe the paths real traffic takes.
//!
//! Not built yet: it needs libbpf-rs and libbpf-cargo, hence clang, libelf-dev, zlib1g-dev and
//! pkg-config to build (aya is not an option: its BPF side needs nightly Rust and bpf-linker),
//! and the soft-RoCE VM's kernel to exercise the RDMA hooks, as the host's kernel has no RDMA;
//! no issue schedules it before the verbs transport.
