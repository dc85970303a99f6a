// SPDX-License-Identifier: GPL-2.0
/*
 * Sees every user-space RDMA QP reach RTR and be destroyed, and sends each to user space.
 *
 * Hooks (drivers/infiniband/core/verbs.c; the rationale is in bpf/src/lib.rs):
 *  - fexit/ib_modify_qp_with_udata: every uverbs modify_qp goes through it. fexit, because
 *    the source GID is only known after the call: _ib_modify_qp resolves
 *    attr->ah_attr.grh.sgid_attr, stores it in qp->av_sgid_attr, and puts the attr's
 *    reference back before returning.
 *  - fentry/ib_destroy_qp_user: uverbs destroy and process exit. fentry, because the QP is
 *    freed by the time fexit runs.
 *
 * Each hook has two identical programs. The kernel runs a fentry/fexit program with migration,
 * not preemption, disabled, and skips it (counting a recursion miss) when a run of the same
 * program is already in progress on that CPU: a process preempted inside the program, then a
 * second process reaching the hook on that CPU, and the second call goes unseen. In the rxe VM
 * this lost one end of a perftest connection in about one run in three (both ends are
 * SCHED_IDLE, so preempted often). With two programs the second process's call finds the
 * other one free unless two processes are preempted inside both. Every call is thus reported
 * twice; user space (bpf/src/tracer.rs, Dedup) keeps the first.
 *
 * Ring buffer sizing: a record takes RQ_EVENT_SIZE (160) bytes plus the ring's 8-byte header,
 * so 512 KiB hold 3120 records, two per QP event (see below). Polled every 100 ms, that
 * absorbs 15,600 QP events/s, or a burst of 1560 between two polls (a job start on a large
 * node: a few QPs per peer per channel). Beyond that records are dropped and counted
 * (RQ_CNT_DROPPED), never blocked on.
 */
#include "rdma_types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "rdma_qp.h"

#define OFF_OK(field, off) _Static_assert(__builtin_offsetof(struct rq_event, field) == (off), #field)
OFF_OK(version, RQ_OFF_VERSION);
OFF_OK(size, RQ_OFF_SIZE);
OFF_OK(kind, RQ_OFF_KIND);
OFF_OK(flags, RQ_OFF_FLAGS);
OFF_OK(qp_type, RQ_OFF_QP_TYPE);
OFF_OK(traffic_class, RQ_OFF_TRAFFIC_CLASS);
OFF_OK(time_mono_ns, RQ_OFF_TIME_MONO_NS);
OFF_OK(pid, RQ_OFF_PID);
OFF_OK(port, RQ_OFF_PORT);
OFF_OK(local_qpn, RQ_OFF_LOCAL_QPN);
OFF_OK(remote_qpn, RQ_OFF_REMOTE_QPN);
OFF_OK(flow_label, RQ_OFF_FLOW_LABEL);
OFF_OK(attr_mask, RQ_OFF_ATTR_MASK);
OFF_OK(hop_limit, RQ_OFF_HOP_LIMIT);
OFF_OK(local_gid, RQ_OFF_LOCAL_GID);
OFF_OK(remote_gid, RQ_OFF_REMOTE_GID);
OFF_OK(comm, RQ_OFF_COMM);
OFF_OK(device, RQ_OFF_DEVICE);
_Static_assert(sizeof(struct rq_event) == RQ_EVENT_SIZE, "RQ_EVENT_SIZE");
_Static_assert(sizeof(((struct rq_event *)0)->comm) == RQ_COMM_LEN, "RQ_COMM_LEN");
_Static_assert(sizeof(((struct rq_event *)0)->device) == RQ_DEVICE_LEN, "RQ_DEVICE_LEN");
_Static_assert(sizeof(((struct rq_event *)0)->local_gid) == RQ_GID_LEN, "RQ_GID_LEN");

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RQ_RINGBUF_BYTES);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RQ_CNT_NR);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &idx);

	/* Per-CPU, but two programs can still nest on one CPU: keep the add atomic. */
	if (c)
		__sync_fetch_and_add(c, 1);
}

/* RC, UC and XRC carry a peer. UD does not (and the monitoring agent's own QPs are UD). */
static __always_inline int connected(__u32 qp_type)
{
	return qp_type == IB_QPT_RC || qp_type == IB_QPT_UC || qp_type == IB_QPT_XRC_INI ||
	       qp_type == IB_QPT_XRC_TGT;
}

/* The fields both kinds share: who, when, which QP, which device. */
static __always_inline void fill_common(struct rq_event *e, struct ib_qp *qp, __u8 kind,
					__u32 qp_type)
{
	const struct ib_gid_attr *sgid;
	struct ib_device *dev;

	__builtin_memset(e, 0, sizeof(*e));
	e->version = RQ_VERSION;
	e->size = RQ_EVENT_SIZE;
	e->kind = kind;
	e->qp_type = qp_type;
	e->time_mono_ns = bpf_ktime_get_ns();
	e->pid = bpf_get_current_pid_tgid() >> 32;
	e->local_qpn = BPF_CORE_READ(qp, qp_num);
	e->port = BPF_CORE_READ_BITFIELD_PROBED(qp, port);
	bpf_get_current_comm(e->comm, sizeof(e->comm));

	dev = BPF_CORE_READ(qp, device);
	if (dev)
		bpf_probe_read_kernel_str(e->device, sizeof(e->device), &dev->name);

	/* Holds a reference while the QP has an address vector, so the GID stays valid. */
	sgid = BPF_CORE_READ(qp, av_sgid_attr);
	if (sgid)
		bpf_probe_read_kernel(e->local_gid, sizeof(e->local_gid), &sgid->gid.raw);
	else
		e->flags |= RQ_FLAG_NO_SGID;
}

static __always_inline void submit(struct rq_event *e)
{
	bpf_ringbuf_submit(e, 0);
	count(RQ_CNT_EMITTED);
}

static __always_inline int handle_modify(struct ib_qp *qp, struct ib_qp_attr *attr, int attr_mask,
					 int ret)
{
	struct rq_event *e;
	__u32 mask = attr_mask;
	__u32 qp_type;

	if (ret != 0 || !(mask & IB_QP_STATE))
		return 0;
	if (BPF_CORE_READ(attr, qp_state) != IB_QPS_RTR)
		return 0;
	qp_type = BPF_CORE_READ(qp, qp_type);
	if (!connected(qp_type))
		return 0;

	if (!(mask & IB_QP_AV))
		count(RQ_CNT_RTR_NO_AV);
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(RQ_CNT_DROPPED);
		return 0;
	}
	fill_common(e, qp, RQ_KIND_RTR, qp_type);
	e->attr_mask = mask;
	if (mask & IB_QP_PORT)
		e->port = BPF_CORE_READ_BITFIELD_PROBED(attr, port_num);
	if (mask & IB_QP_DEST_QPN)
		e->remote_qpn = BPF_CORE_READ(attr, dest_qp_num);

	if (!(mask & IB_QP_AV)) {
		e->flags |= RQ_FLAG_NO_AV;
	} else if (!(BPF_CORE_READ(attr, ah_attr.ah_flags) & IB_AH_GRH)) {
		e->flags |= RQ_FLAG_NO_GRH;
	} else {
		bpf_probe_read_kernel(e->remote_gid, sizeof(e->remote_gid),
				      &attr->ah_attr.grh.dgid.raw);
		e->flow_label = BPF_CORE_READ(attr, ah_attr.grh.flow_label);
		e->traffic_class = BPF_CORE_READ(attr, ah_attr.grh.traffic_class);
		e->hop_limit = BPF_CORE_READ(attr, ah_attr.grh.hop_limit);
	}
	submit(e);
	return 0;
}

static __always_inline int handle_destroy(struct ib_qp *qp, struct ib_udata *udata)
{
	struct rq_event *e;
	__u32 qp_type;

	/* Kernel consumers call ib_destroy_qp(), i.e. this with udata NULL: their QPs' RTR is
	 * not reported (they use ib_modify_qp), so neither is their destruction. */
	if (!udata)
		return 0;
	qp_type = BPF_CORE_READ(qp, qp_type);
	if (!connected(qp_type))
		return 0;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(RQ_CNT_DROPPED);
		return 0;
	}
	fill_common(e, qp, RQ_KIND_DESTROY, qp_type);
	submit(e);
	return 0;
}

SEC("fexit/ib_modify_qp_with_udata")
int BPF_PROG(on_modify, struct ib_qp *qp, struct ib_qp_attr *attr, int attr_mask,
	     struct ib_udata *udata, int ret)
{
	return handle_modify(qp, attr, attr_mask, ret);
}

SEC("fexit/ib_modify_qp_with_udata")
int BPF_PROG(on_modify_copy, struct ib_qp *qp, struct ib_qp_attr *attr, int attr_mask,
	     struct ib_udata *udata, int ret)
{
	return handle_modify(qp, attr, attr_mask, ret);
}

SEC("fentry/ib_destroy_qp_user")
int BPF_PROG(on_destroy, struct ib_qp *qp, struct ib_udata *udata)
{
	return handle_destroy(qp, udata);
}

SEC("fentry/ib_destroy_qp_user")
int BPF_PROG(on_destroy_copy, struct ib_qp *qp, struct ib_udata *udata)
{
	return handle_destroy(qp, udata);
}
