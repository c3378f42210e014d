// C helpers for package verbs. Everything is static inline: the header is
// included by several cgo files, and each keeps its own copy.
//
// The helpers exist for three reasons: libibverbs exposes several calls only
// as macros or inline functions (ibv_query_port, ibv_reg_mr, ibv_poll_cq ...);
// ibv_send_wr and ibv_wc hold unions that Go cannot name; and one C crossing
// per chain or per batch is much cheaper than one per element.

#ifndef GOXRC_VERBS_H
#define GOXRC_VERBS_H

#include <errno.h>
#include <endian.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>
#include <unistd.h>
#include <time.h>

// goxrc_swr is a send work request in a flat layout Go can fill; the chain
// helper below turns it into an ibv_send_wr.
struct goxrc_swr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	struct ibv_ah *ah;
	uint32_t opcode;
	uint32_t flags;
	uint32_t imm; // host order
	uint32_t rkey;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t remote_srqn;
	uint32_t num_sge;
	uint32_t sge_off; // index of the first SGE in the QP's SGE array
};

// goxrc_wc is ibv_wc without the union, imm already in host order.
struct goxrc_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
	uint16_t slid;
	uint8_t sl;
	uint8_t pad;
};

// goxrc_async is a copied ibv_async_event, and the event itself until it is
// acked (goxrc_ack_async).
struct goxrc_async {
	uint32_t type;
	uint32_t qp_num;
	struct ibv_srq *srq;
	struct ibv_cq *cq;
	uint32_t port;
	struct ibv_async_event ev;
};

// The post helpers take the QP (or SRQ) and the work-request arrays as
// integers, like goxrc_poll: all are C memory, and as pointers to structs
// that hold pointers, cgo would check each of them for Go memory on every
// post.
static inline int goxrc_post_send(uintptr_t qpp, uintptr_t inp, uintptr_t wrp,
				  struct ibv_sge *sge, int n, int *bad) {
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	const struct goxrc_swr *in = (const struct goxrc_swr *)inp;
	struct ibv_send_wr *wr = (struct ibv_send_wr *)wrp;
	int i;
	for (i = 0; i < n; i++) {
		const struct goxrc_swr *s = &in[i];
		struct ibv_send_wr *w = &wr[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = s->wr_id;
		w->next = i + 1 < n ? &wr[i + 1] : NULL;
		w->sg_list = s->num_sge ? &sge[s->sge_off] : NULL;
		w->num_sge = (int)s->num_sge;
		w->opcode = (enum ibv_wr_opcode)s->opcode;
		w->send_flags = s->flags;
		w->imm_data = htobe32(s->imm);
		switch (w->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = s->remote_addr;
			w->wr.rdma.rkey = s->rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w->wr.atomic.remote_addr = s->remote_addr;
			w->wr.atomic.compare_add = s->compare_add;
			w->wr.atomic.swap = s->swap;
			w->wr.atomic.rkey = s->rkey;
			break;
		default:
			break;
		}
		if (qp->qp_type == IBV_QPT_UD) {
			w->wr.ud.ah = s->ah;
			w->wr.ud.remote_qpn = s->remote_qpn;
			w->wr.ud.remote_qkey = s->remote_qkey;
		} else if (qp->qp_type == IBV_QPT_XRC_SEND) {
			w->qp_type.xrc.remote_srqn = s->remote_srqn;
		}
	}
	struct ibv_send_wr *badwr = NULL;
	int rc = ibv_post_send(qp, wr, &badwr);
	*bad = (rc && badwr) ? (int)(badwr - wr) : -1;
	return rc;
}

static inline int goxrc_post_recv(uintptr_t qpp, uintptr_t wrp, int *bad) {
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	struct ibv_recv_wr *wr = (struct ibv_recv_wr *)wrp;
	struct ibv_recv_wr *badwr = NULL;
	int rc = ibv_post_recv(qp, wr, &badwr);
	*bad = (rc && badwr) ? (int)(badwr - wr) : -1;
	return rc;
}

static inline int goxrc_post_srq_recv(uintptr_t srqp, uintptr_t wrp, int *bad) {
	struct ibv_srq *srq = (struct ibv_srq *)srqp;
	struct ibv_recv_wr *wr = (struct ibv_recv_wr *)wrp;
	struct ibv_recv_wr *badwr = NULL;
	int rc = ibv_post_srq_recv(srq, wr, &badwr);
	*bad = (rc && badwr) ? (int)(badwr - wr) : -1;
	return rc;
}

// goxrc_poll polls up to n completions into tmp and flattens them into out.
// The CQ comes as an integer: cgo checks every pointer argument to a struct
// that holds pointers (ibv_cq does) for Go memory on each call, which was a
// fifth of a busy-polling loop's CPU; this one is always C memory.
static inline int goxrc_poll(uintptr_t cqp, int n, struct ibv_wc *tmp, struct goxrc_wc *out) {
	int got = ibv_poll_cq((struct ibv_cq *)cqp, n, tmp);
	int i;
	for (i = 0; i < got; i++) {
		out[i].wr_id = tmp[i].wr_id;
		out[i].status = tmp[i].status;
		out[i].opcode = tmp[i].opcode;
		out[i].vendor_err = tmp[i].vendor_err;
		out[i].byte_len = tmp[i].byte_len;
		out[i].imm = be32toh(tmp[i].imm_data);
		out[i].qp_num = tmp[i].qp_num;
		out[i].src_qp = tmp[i].src_qp;
		out[i].wc_flags = tmp[i].wc_flags;
		out[i].slid = tmp[i].slid;
		out[i].sl = tmp[i].sl;
	}
	return got;
}

// goxrc_poll_spin is goxrc_poll repeated until it finds a completion or
// spin_ns have passed: a busy-polling loop pays one cgo transition per
// spin instead of one per poll. With spin_ns <= 0 it is one goxrc_poll and
// reads no clock.
static inline int goxrc_poll_spin(uintptr_t cqp, int n, struct ibv_wc *tmp, struct goxrc_wc *out, int64_t spin_ns) {
	struct timespec t0, t;
	int i, got;
	got = goxrc_poll(cqp, n, tmp, out);
	if (got != 0 || spin_ns <= 0)
		return got;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 1;; i++) {
		got = goxrc_poll(cqp, n, tmp, out);
		if (got != 0)
			return got;
		if ((i & 15) == 0) { // the clock costs more than an empty poll
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((int64_t)(t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec) >= spin_ns)
				return 0;
		}
	}
}

// goxrc_poll_arm is goxrc_poll that, finding nothing, arms the CQ and polls
// once more (a completion may have come before the arming): a wait's three
// calls before it sleeps, in one cgo transition. *arm_rc gets
// ibv_req_notify_cq's result, or GOXRC_NOT_ARMED when the first poll found
// something; on failure nothing more is polled.
#define GOXRC_NOT_ARMED (-1000)
static inline int goxrc_poll_arm(uintptr_t cqp, int n, struct ibv_wc *tmp, struct goxrc_wc *out, int *arm_rc) {
	int got = goxrc_poll(cqp, n, tmp, out);
	*arm_rc = GOXRC_NOT_ARMED;
	if (got != 0)
		return got;
	*arm_rc = ibv_req_notify_cq((struct ibv_cq *)cqp, 0);
	if (*arm_rc != 0)
		return 0;
	return goxrc_poll(cqp, n, tmp, out);
}

static inline int goxrc_req_notify(struct ibv_cq *cq, int solicited) {
	return ibv_req_notify_cq(cq, solicited);
}

// goxrc_get_cq_events reads every queued event of a non-blocking channel.
// It returns the number read, or -1 with errno set on a real error; events
// for a CQ other than want are counted in *other.
static inline int goxrc_get_cq_events(struct ibv_comp_channel *ch, struct ibv_cq *want, int *other) {
	int n = 0;
	*other = 0;
	for (;;) {
		struct ibv_cq *cq;
		void *cqctx;
		if (ibv_get_cq_event(ch, &cq, &cqctx)) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return n;
			return n ? n : -1;
		}
		if (cq == want)
			n++;
		else {
			ibv_ack_cq_events(cq, 1);
			(*other)++;
		}
	}
}

// goxrc_get_any_cq_events reads up to n queued events of a non-blocking
// channel that serves many CQs, acks each at once and stores its CQ in cqs.
// It returns the number read (0 when none is queued), or -1 with errno set.
// Acking at once means a CQ can be destroyed whatever its events' readers do.
static inline int goxrc_get_any_cq_events(struct ibv_comp_channel *ch, struct ibv_cq **cqs, int n) {
	int got = 0;
	while (got < n) {
		struct ibv_cq *cq;
		void *cqctx;
		if (ibv_get_cq_event(ch, &cq, &cqctx)) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return got;
			return got ? got : -1;
		}
		ibv_ack_cq_events(cq, 1);
		cqs[got++] = cq;
	}
	return got;
}

// goxrc_get_async reads one async event and copies it, unacked: until
// goxrc_ack_async, the destroy of its CQ or SRQ waits, so their addresses
// cannot be taken by new ones. Returns 1 when an event was copied, 0 when
// none is queued, -1 on error.
static inline int goxrc_get_async(struct ibv_context *ctx, struct goxrc_async *out) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return -1;
	}
	memset(out, 0, sizeof(*out));
	out->ev = ev;
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
		break;
	case IBV_EVENT_CQ_ERR:
		out->cq = ev.element.cq;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		out->srq = ev.element.srq;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = (uint32_t)ev.element.port_num;
		break;
	default:
		break;
	}
	return 1;
}

static inline void goxrc_ack_async(struct goxrc_async *a) { ibv_ack_async_event(&a->ev); }

static inline int goxrc_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}

static inline ssize_t goxrc_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *e, size_t max) {
	return ibv_query_gid_table(ctx, e, max, 0);
}

static inline struct ibv_mr *goxrc_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	return ibv_reg_mr(pd, addr, len, access);
}

static inline int goxrc_get_srq_num(struct ibv_srq *srq, uint32_t *num) {
	return ibv_get_srq_num(srq, num);
}

static inline struct ibv_qp *goxrc_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr) {
	return ibv_create_qp_ex(ctx, attr);
}

static inline struct ibv_srq *goxrc_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr) {
	return ibv_create_srq_ex(ctx, attr);
}

static inline struct ibv_xrcd *goxrc_open_xrcd(struct ibv_context *ctx, int fd, int oflags) {
	struct ibv_xrcd_init_attr a;
	memset(&a, 0, sizeof(a));
	a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	a.fd = fd;
	a.oflags = oflags;
	return ibv_open_xrcd(ctx, &a);
}

static inline int goxrc_close_xrcd(struct ibv_xrcd *x) { return ibv_close_xrcd(x); }

static inline struct ibv_qp *goxrc_open_qp(struct ibv_context *ctx, struct ibv_xrcd *xrcd, uint32_t qpn) {
	struct ibv_qp_open_attr a;
	memset(&a, 0, sizeof(a));
	a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	a.qp_num = qpn;
	a.xrcd = xrcd;
	a.qp_type = IBV_QPT_XRC_RECV;
	return ibv_open_qp(ctx, &a);
}

// goxrc_destroy_qp_handle destroys the kernel's QP handle qp by the uverbs
// write command (a stable kernel ABI), without the provider, whose struct
// is left allocated: mlx5_destroy_qp frees a doorbell record that an opened
// XRC target handle never had (see QP.Close). The asynchronous events of
// the QP are acknowledged as they are read (goxrc_get_async), so there is
// no count to wait for, as ibv_destroy_qp waits.
static inline int goxrc_destroy_qp_handle(struct ibv_qp *qp) {
	struct {
		struct ib_uverbs_cmd_hdr hdr;
		struct ib_uverbs_destroy_qp cmd;
	} req;
	struct ib_uverbs_destroy_qp_resp resp;
	memset(&req, 0, sizeof(req));
	memset(&resp, 0, sizeof(resp));
	req.hdr.command = IB_USER_VERBS_CMD_DESTROY_QP;
	req.hdr.in_words = sizeof(req) / 4;
	req.hdr.out_words = sizeof(resp) / 4;
	req.cmd.response = (uintptr_t)&resp;
	req.cmd.qp_handle = qp->handle;
	ssize_t n = write(qp->context->cmd_fd, &req, sizeof(req));
	if (n == (ssize_t)sizeof(req))
		return 0;
	return n < 0 ? -errno : -EIO;
}

static inline int goxrc_async_fd(struct ibv_context *ctx) { return ctx->async_fd; }
static inline int goxrc_channel_fd(struct ibv_comp_channel *ch) { return ch->fd; }
static inline uint32_t goxrc_qp_num(struct ibv_qp *qp) { return qp->qp_num; }
static inline int goxrc_cq_cqe(struct ibv_cq *cq) { return cq->cqe; }

#endif
