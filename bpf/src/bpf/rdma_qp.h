/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The record rdma_qp.bpf.c sends to user space, shared by the BPF program and the Rust decoder.
 *
 * Single source of truth: the BPF program static-asserts that struct rq_event sits at the
 * RQ_OFF_* offsets and has RQ_EVENT_SIZE bytes, and bpf/build.rs turns every `#define RQ_*`
 * integer below into a Rust constant that decode() reads at. So the two sides cannot drift
 * apart silently: a field moved here without its offset fails the BPF build.
 *
 * Layout: little-endian (the host's: BPF runs in the host's byte order, and rocemesh builds
 * for x86_64 and aarch64), every field naturally aligned, padding explicit, size a multiple
 * of 8. Keep the `#define RQ_NAME value` lines plain decimal or hex integers: build.rs parses
 * them.
 */
#ifndef ROCEMESH_RDMA_QP_H
#define ROCEMESH_RDMA_QP_H

/* Bumped on any change of the layout or of a field's meaning; user space refuses others. */
#define RQ_VERSION 1

/* Record kinds. */
#define RQ_KIND_RTR 1       /* a connected QP reached RTR: its peer is now known */
#define RQ_KIND_DESTROY 2   /* a connected QP is being destroyed (fentry: before the call) */

/* Flags. */
#define RQ_FLAG_NO_AV 0x1   /* RTR without IB_QP_AV in attr_mask: remote GID and GRH fields unset */
#define RQ_FLAG_NO_GRH 0x2  /* the address vector has no GRH (IB without routing): GIDs unset */
#define RQ_FLAG_NO_SGID 0x4 /* the QP has no source GID attribute: local_gid is zero */

/* Indices into the per-CPU `counters` array. */
#define RQ_CNT_EMITTED 0       /* records submitted to the ring buffer */
#define RQ_CNT_DROPPED 1       /* records lost: bpf_ringbuf_reserve found the ring full */
#define RQ_CNT_RTR_NO_AV 2     /* RTR transitions without an address vector (RQ_FLAG_NO_AV) */
#define RQ_CNT_NR 3

/* Sizes. */
#define RQ_COMM_LEN 16         /* TASK_COMM_LEN */
#define RQ_DEVICE_LEN 64       /* IB_DEVICE_NAME_MAX */
#define RQ_GID_LEN 16
#define RQ_RINGBUF_BYTES 524288 /* 512 KiB: see the sizing note in rdma_qp.bpf.c */

/* Offsets of struct rq_event's fields, in bytes. */
#define RQ_OFF_VERSION 0
#define RQ_OFF_SIZE 2
#define RQ_OFF_KIND 4
#define RQ_OFF_FLAGS 5
#define RQ_OFF_QP_TYPE 6
#define RQ_OFF_TRAFFIC_CLASS 7
#define RQ_OFF_TIME_MONO_NS 8
#define RQ_OFF_PID 16
#define RQ_OFF_PORT 20
#define RQ_OFF_LOCAL_QPN 24
#define RQ_OFF_REMOTE_QPN 28
#define RQ_OFF_FLOW_LABEL 32
#define RQ_OFF_ATTR_MASK 36
#define RQ_OFF_HOP_LIMIT 40
#define RQ_OFF_LOCAL_GID 48
#define RQ_OFF_REMOTE_GID 64
#define RQ_OFF_COMM 80
#define RQ_OFF_DEVICE 96
#define RQ_EVENT_SIZE 160

struct rq_event {
	__u16 version;        /* RQ_VERSION */
	__u16 size;           /* RQ_EVENT_SIZE: a reader refuses records of another size */
	__u8 kind;            /* RQ_KIND_* */
	__u8 flags;           /* RQ_FLAG_* */
	__u8 qp_type;         /* enum ib_qp_type: 2 RC, 3 UC, 9 XRC_INI, 10 XRC_TGT */
	__u8 traffic_class;   /* GRH traffic class (DSCP << 2 | ECN) */
	__u64 time_mono_ns;   /* bpf_ktime_get_ns(): CLOCK_MONOTONIC, ns */
	__u32 pid;            /* tgid of the task that made the call */
	__u32 port;           /* RDMA port number (1-based) */
	__u32 local_qpn;      /* this QP's number */
	__u32 remote_qpn;     /* the peer's QP number (dest_qp_num); 0 on destroy */
	__u32 flow_label;     /* GRH flow label (20 bits); 0 = let the driver derive it */
	__u32 attr_mask;      /* the modify call's enum ib_qp_attr_mask; 0 on destroy */
	__u8 hop_limit;       /* GRH hop limit */
	__u8 pad[7];          /* zero */
	__u8 local_gid[16];   /* source GID (from qp->av_sgid_attr); zero if RQ_FLAG_NO_SGID */
	__u8 remote_gid[16];  /* destination GID (ah_attr.grh.dgid); zero on destroy */
	char comm[16];        /* task comm, NUL-padded */
	char device[64];      /* RDMA device name (ib_device.name), NUL-terminated */
};

#endif /* ROCEMESH_RDMA_QP_H */
