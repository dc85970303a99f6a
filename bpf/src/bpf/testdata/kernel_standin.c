// SPDX-License-Identifier: GPL-2.0
/*
 * Stand-in kernel BTF for the root-only verifier test (tracer.rs): the RDMA types as kernel
 * 7.3.4 declares them (fields the program does not read reduced to same-sized padding), for a
 * host whose kernel has no RDMA types. Compiled by the test with `clang -g -target bpf`; libbpf
 * then takes CO-RE relocations from it (btf_custom_path) instead of the kernel's BTF.
 */
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

enum ib_qp_state { IB_QPS_RESET, IB_QPS_INIT, IB_QPS_RTR, IB_QPS_RTS };
enum ib_qp_type { IB_QPT_SMI, IB_QPT_GSI, IB_QPT_RC, IB_QPT_UC, IB_QPT_UD };

union ib_gid {
	u8 raw[16];
	struct {
		u64 subnet_prefix;
		u64 interface_id;
	} global;
};

struct ib_device;

struct ib_gid_attr {
	void *ndev;
	struct ib_device *device;
	union ib_gid gid;
	u32 gid_type;
	u16 index;
	u32 port_num;
};

struct ib_device {
	void *dma_device;
	u8 ops[1024];
	char name[64];
};

struct ib_qp {
	struct ib_device *device;
	void *pd, *send_cq, *recv_cq;
	u8 locks_and_lists[88];
	const struct ib_gid_attr *av_sgid_attr;
	const struct ib_gid_attr *alt_path_sgid_attr;
	u8 more[40];
	u32 qp_num;
	u32 max_write_sge;
	u32 max_read_sge;
	enum ib_qp_type qp_type;
	u8 even_more[24];
	u32 port;
};

struct ib_global_route {
	const struct ib_gid_attr *sgid_attr;
	union ib_gid dgid;
	u32 flow_label;
	u8 sgid_index;
	u8 hop_limit;
	u8 traffic_class;
};

struct rdma_ah_attr {
	struct ib_global_route grh;
	u8 sl;
	u8 static_rate;
	u32 port_num;
	u8 ah_flags;
	u32 type;
	u8 roce_or_ib[16];
};

struct ib_qp_cap {
	u32 max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, max_rdma_ctxs;
};

struct ib_qp_attr {
	enum ib_qp_state qp_state;
	enum ib_qp_state cur_qp_state;
	u32 path_mtu;
	u32 path_mig_state;
	u32 qkey;
	u32 rq_psn;
	u32 sq_psn;
	u32 dest_qp_num;
	int qp_access_flags;
	struct ib_qp_cap cap;
	struct rdma_ah_attr ah_attr;
	struct rdma_ah_attr alt_ah_attr;
	u16 pkey_index;
	u16 alt_pkey_index;
	u8 en_sqd_async_notify;
	u8 sq_draining;
	u8 max_rd_atomic;
	u8 max_dest_rd_atomic;
	u8 min_rnr_timer;
	u32 port_num;
};

/* Instances, so that clang emits full BTF for each type (pointees alone become forwards). */
struct ib_qp standin_qp;
struct ib_qp_attr standin_attr;
struct ib_device standin_device;
struct ib_gid_attr standin_gid_attr;
