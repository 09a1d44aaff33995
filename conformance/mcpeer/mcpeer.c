// mcpeer: the libibverbs side of the verbs multicast conformance cases
// (conformance/mcast_test.go, TestMulticastVerbs). It runs in a lab
// guest against rdma_rxe with one UD QP (Q_Key 0x01234567) and a
// multicast GID given as an IPv6 address, as ibv_attach_mcast takes it:
// rdma_cm's RoCEv2 join refuses IPv6 groups, so verbs is how an rxe
// peer reaches one.
//
//   mcpeer -m MGID -I IFNAME -x GIDX -C COUNT -S SIZE [-s]
//
// Receiver (no -s): joins the IP group on IFNAME with a socket (rxe's
// attach only programs the NIC's multicast filter; an application joins
// the IP group itself, as rdma_cm does with IGMP for IPv4), attaches the
// QP to MGID, posts COUNT receives of SIZE+40 bytes, prints "attached",
// and waits (30 s at most) for COUNT datagrams: each must be SIZE bytes
// after a GRH whose destination is MGID, carry an immediate, and hold
// the pattern of that immediate (byte i is imm + i*7 + 1). It prints
// "received N" and exits 0 when all came.
//
// Sender (-s): sends COUNT SEND with Immediate datagrams of SIZE bytes
// (the immediate is the sequence number, the bytes its pattern) to MGID,
// QPN 0xFFFFFF, from GID index GIDX, 20 ms apart, each signaled and
// completed before the next, and prints "sent N".
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define QKEY 0x01234567
#define MCAST_QPN 0xFFFFFF
#define GRH 40

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "mcpeer: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static uint8_t pat(uint32_t imm, int i) { return (uint8_t)(imm + i * 7 + 1); }

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// poll1 waits (until deadline) for one completion of cq into wc.
static void poll1(struct ibv_cq *cq, struct ibv_wc *wc, double deadline)
{
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			die("ibv_poll_cq: %d", n);
		if (n == 1)
			return;
		if (now() > deadline)
			die("timed out waiting for a completion");
		usleep(1000);
	}
}

int main(int argc, char **argv)
{
	const char *mgid_s = NULL, *ifname = NULL;
	int gidx = -1, count = 10, size = 100, sender = 0, op;
	while ((op = getopt(argc, argv, "m:I:x:C:S:s")) != -1) {
		switch (op) {
		case 'm': mgid_s = optarg; break;
		case 'I': ifname = optarg; break;
		case 'x': gidx = atoi(optarg); break;
		case 'C': count = atoi(optarg); break;
		case 'S': size = atoi(optarg); break;
		case 's': sender = 1; break;
		default: die("usage: mcpeer -m MGID -I IFNAME -x GIDX -C COUNT -S SIZE [-s]");
		}
	}
	union ibv_gid mgid;
	if (!mgid_s || inet_pton(AF_INET6, mgid_s, &mgid) != 1)
		die("-m: want an IPv6 multicast GID");
	if (!ifname || gidx < 0 || count < 1 || count > 1000 || size < 1 || size > 1024)
		die("bad arguments");
	setvbuf(stdout, NULL, _IOLBF, 0);

	int n;
	struct ibv_device **devs = ibv_get_device_list(&n);
	if (!devs || n < 1)
		die("no RDMA device");
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	if (!ctx)
		die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * count, NULL, NULL, 0);
	size_t slot = size + GRH;
	uint8_t *buf = calloc(count + 1, slot);
	struct ibv_mr *mr = pd && buf ? ibv_reg_mr(pd, buf, (count + 1) * slot, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!pd || !cq || !mr)
		die("PD, CQ or MR: %s", strerror(errno));
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = {.max_send_wr = count, .max_recv_wr = count, .max_send_sge = 1, .max_recv_sge = 1},
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = QKEY};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("INIT: %s", strerror(errno));
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("RTR: %s", strerror(errno));
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .sq_psn = 0};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("RTS: %s", strerror(errno));

	struct ibv_wc wc;
	if (sender) {
		struct ibv_ah_attr aa = {
			.is_global = 1, .port_num = 1,
			.grh = {.dgid = mgid, .sgid_index = gidx, .hop_limit = 64},
		};
		struct ibv_ah *ah = ibv_create_ah(pd, &aa);
		if (!ah)
			die("ibv_create_ah: %s", strerror(errno));
		uint8_t *msg = buf + count * slot;
		for (int k = 0; k < count; k++) {
			for (int i = 0; i < size; i++)
				msg[i] = pat(k, i);
			struct ibv_sge sge = {.addr = (uintptr_t)msg, .length = size, .lkey = mr->lkey};
			struct ibv_send_wr wr = {
				.wr_id = k, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(k),
				.wr = {.ud = {.ah = ah, .remote_qpn = MCAST_QPN, .remote_qkey = QKEY}},
			}, *bad;
			if (ibv_post_send(qp, &wr, &bad))
				die("ibv_post_send: %s", strerror(errno));
			poll1(cq, &wc, now() + 10);
			if (wc.status != IBV_WC_SUCCESS)
				die("send %d: %s", k, ibv_wc_status_str(wc.status));
			usleep(20000);
		}
		printf("sent %d\n", count);
		return 0;
	}

	int s = socket(AF_INET6, SOCK_DGRAM, 0);
	struct ipv6_mreq mreq = {.ipv6mr_interface = if_nametoindex(ifname)};
	memcpy(&mreq.ipv6mr_multiaddr, &mgid, 16);
	if (s < 0 || mreq.ipv6mr_interface == 0 || setsockopt(s, IPPROTO_IPV6, IPV6_JOIN_GROUP, &mreq, sizeof mreq))
		die("joining %s on %s: %s", mgid_s, ifname, strerror(errno));
	if (ibv_attach_mcast(qp, &mgid, 0))
		die("ibv_attach_mcast: %s", strerror(errno));
	for (int k = 0; k < count; k++) {
		struct ibv_sge sge = {.addr = (uintptr_t)(buf + k * slot), .length = slot, .lkey = mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = k, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(qp, &wr, &bad))
			die("ibv_post_recv: %s", strerror(errno));
	}
	printf("attached\n");
	double deadline = now() + 30;
	for (int got = 0; got < count; got++) {
		poll1(cq, &wc, deadline);
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
		    !(wc.wc_flags & IBV_WC_GRH) || wc.byte_len != slot)
			die("datagram %d: status %s, opcode %d, flags %#x, %u bytes", got,
			    ibv_wc_status_str(wc.status), wc.opcode, wc.wc_flags, wc.byte_len);
		uint8_t *d = buf + wc.wr_id * slot;
		if (memcmp(d + 24, &mgid, 16) != 0)
			die("datagram %d: the GRH's destination is not the MGID", got);
		uint32_t imm = ntohl(wc.imm_data);
		for (int i = 0; i < size; i++)
			if (d[GRH + i] != pat(imm, i))
				die("datagram %d (immediate %u): byte %d is %#x, want %#x", got, imm, i, d[GRH + i], pat(imm, i));
	}
	printf("received %d\n", count);
	if (ibv_detach_mcast(qp, &mgid, 0))
		die("ibv_detach_mcast: %s", strerror(errno));
	return 0;
}
