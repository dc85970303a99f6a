/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The few kernel types rdma_qp.bpf.c reads, instead of a multi-megabyte vmlinux.h.
 *
 * Every struct is marked preserve_access_index, so clang records each field access as a CO-RE
 * relocation and libbpf rewrites the offsets against the running kernel's BTF at load time:
 * only the fields read are declared, in any order, and the layout here need not match any
 * kernel. Field names and types were checked against the BTF of kernel 7.3.4 (vmlinux for the
 * types; ib_core's module BTF holds the hooked functions).
 *
 * The enum values are not relocated: they are the uverbs ABI (include/uapi/rdma/ib_user_verbs.h
 * mirrors them), so they cannot change without breaking every libibverbs.
 */
#ifndef ROCEMESH_RDMA_TYPES_H
#define ROCEMESH_RDMA_TYPES_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef short __s16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u32 __wsum;

/* The two map types used, from the stable BPF uapi (include/uapi/linux/bpf.h). */
enum bpf_map_type {
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum ib_qp_state {
	IB_QPS_RESET = 0,
	IB_QPS_INIT = 1,
	IB_QPS_RTR = 2,
	IB_QPS_RTS = 3,
};

enum ib_qp_type {
	IB_QPT_RC = 2,
	IB_QPT_UC = 3,
	IB_QPT_UD = 4,
	IB_QPT_XRC_INI = 9,
	IB_QPT_XRC_TGT = 10,
};

/* enum ib_qp_attr_mask bits (the attr_mask argument of ib_modify_qp_with_udata). */
#define IB_QP_STATE (1u << 0)
#define IB_QP_AV (1u << 7)
#define IB_QP_PORT (1u << 8)
#define IB_QP_DEST_QPN (1u << 20)

/* enum ib_ah_flags: the address vector carries a GRH (always so on RoCE). */
#define IB_AH_GRH 1

union ib_gid {
	__u8 raw[16];
} __attribute__((preserve_access_index));

struct ib_gid_attr {
	union ib_gid gid;
} __attribute__((preserve_access_index));

struct ib_device {
	char name[64]; /* IB_DEVICE_NAME_MAX */
} __attribute__((preserve_access_index));

struct ib_qp {
	struct ib_device *device;
	const struct ib_gid_attr *av_sgid_attr;
	__u32 qp_num;
	enum ib_qp_type qp_type;
	__u32 port; /* u8 before Linux 5.13: read with BPF_CORE_READ_BITFIELD_PROBED */
} __attribute__((preserve_access_index));

struct ib_global_route {
	union ib_gid dgid;
	__u32 flow_label;
	__u8 hop_limit;
	__u8 traffic_class;
} __attribute__((preserve_access_index));

struct rdma_ah_attr {
	struct ib_global_route grh;
	__u8 ah_flags;
} __attribute__((preserve_access_index));

struct ib_qp_attr {
	enum ib_qp_state qp_state;
	__u32 dest_qp_num;
	struct rdma_ah_attr ah_attr;
	__u32 port_num; /* u8 before Linux 5.13, as ib_qp.port */
} __attribute__((preserve_access_index));

struct ib_udata;

#endif /* ROCEMESH_RDMA_TYPES_H */
