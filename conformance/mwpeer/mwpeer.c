// mwpeer: the libibverbs side of the memory-window conformance cases
// (conformance/mw_test.go). It runs in a lab guest against rdma_rxe and
// faces rxego over one RC QP; the test drives it over TCP.
//
//   mwpeer -p PORT [-d DEV] [-g GIDX] -m bind|access -t 1|2 -i unbind|local|send
//
// It listens on PORT; the peer sends an ibv_rc_pingpong record
// ("LLLL:QQQQQQ:PPPPPP:GID" in hex, NUL-terminated) and gets one back.
//
// -m bind: mwpeer binds a window of type -t over bytes [1024, 2048) of a
// 4096-byte MR that grants no remote access itself (type 2 zero-based),
// sends "W rkey addr len\n", waits for "written\n", checks the peer wrote
// pattern B into exactly the window, invalidates it as -i says (unbind: a
// type 1 bind of length 0; local: LOCAL_INV; send: the peer's SEND with
// Invalidate must have arrived), sends "invalidated\n" and waits for
// "done\n".
//
// -m access: the peer binds a window over its bytes [1024, 2048) holding
// pattern A; mwpeer reads "W rkey addr len\n", READs the window and checks
// it, WRITEs pattern B into it, with -i send sends a SEND with Invalidate
// on the window's rkey, sends "written\n", waits for "invalidated\n", and
// READs again: that must complete with IBV_WC_REM_ACCESS_ERR.
//
// Exit 0 when everything went as described, non-zero with a message
// otherwise. Patterns: A at MR offset j is (j*13+7)&0xff, B at window
// offset i is (i*31+3)&0xff.
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MRSIZE 4096
#define WOFF 1024
#define WLEN 1024

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "mwpeer: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static uint8_t pat_a(size_t j) { return (uint8_t)(j * 13 + 7); }
static uint8_t pat_b(size_t i) { return (uint8_t)(i * 31 + 3); }

static int sock;

// readline reads one '\n'-terminated line (without it) into buf.
static void readline(char *buf, size_t n)
{
	size_t k = 0;
	while (k + 1 < n) {
		char c;
		ssize_t r = read(sock, &c, 1);
		if (r <= 0)
			die("TCP read: %s", r == 0 ? "closed" : strerror(errno));
		if (c == '\n')
			break;
		buf[k++] = c;
	}
	buf[k] = 0;
}

static void expect_line(const char *want)
{
	char line[128];
	readline(line, sizeof line);
	if (strcmp(line, want) != 0)
		die("got line \"%s\", want \"%s\"", line, want);
}

static void writestr(const char *s)
{
	size_t n = strlen(s);
	if (write(sock, s, n) != (ssize_t)n)
		die("TCP write: %s", strerror(errno));
}

static struct ibv_cq *cq;

// poll1 waits (bounded) for one completion.
static struct ibv_wc poll1(void)
{
	struct ibv_wc wc;
	for (long i = 0; i < 20000000L; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1)
			return wc;
		if (i > 1000)
			usleep(100);
	}
	die("no completion");
	return wc;
}

static void want_wc(struct ibv_wc wc, uint64_t id, enum ibv_wc_status st, const char *what)
{
	if (wc.wr_id != id || wc.status != st)
		die("%s: completion wr_id %llu status %s, want wr_id %llu status %s", what,
		    (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), (unsigned long long)id,
		    ibv_wc_status_str(st));
}

int main(int argc, char **argv)
{
	const char *devname = "rxe0", *mode = NULL, *inv = "local";
	int port = 0, gidx = 1, type = 1, c;
	while ((c = getopt(argc, argv, "d:g:p:m:t:i:")) != -1) {
		switch (c) {
		case 'd': devname = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 'm': mode = optarg; break;
		case 't': type = atoi(optarg); break;
		case 'i': inv = optarg; break;
		default: die("usage: mwpeer -p PORT [-d DEV] [-g GIDX] -m bind|access -t 1|2 -i unbind|local|send");
		}
	}
	int bind_role = mode && strcmp(mode, "bind") == 0;
	if (!port || !mode || (!bind_role && strcmp(mode, "access") != 0) || (type != 1 && type != 2))
		die("usage: mwpeer -p PORT [-d DEV] [-g GIDX] -m bind|access -t 1|2 -i unbind|local|send");
	int inv_send = strcmp(inv, "send") == 0;

	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && list[i]; i++)
		if (strcmp(ibv_get_device_name(list[i]), devname) == 0)
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("no device %s", devname);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	uint8_t *buf = aligned_alloc(4096, MRSIZE), *rbuf = aligned_alloc(64, 64);
	int mracc = IBV_ACCESS_LOCAL_WRITE | (bind_role ? IBV_ACCESS_MW_BIND : 0);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, MRSIZE, mracc);
	struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!pd || !cq || !mr || !rmr)
		die("verbs set-up failed: %s", strerror(errno));
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	struct ibv_mw *mw = NULL;
	if (bind_role && !(mw = ibv_alloc_mw(pd, type == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2)))
		die("ibv_alloc_mw: %s", strerror(errno));
	for (size_t j = 0; j < MRSIZE; j++)
		buf[j] = bind_role ? pat_a(j) : (j < WLEN ? pat_b(j) : 0);

	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify INIT");
	struct ibv_sge rsge = {.addr = (uintptr_t)rbuf, .length = 64, .lkey = rmr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 100, .sg_list = &rsge, .num_sge = 1}, *badr;
	if (ibv_post_recv(qp, &rwr, &badr))
		die("ibv_post_recv");

	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1))
		die("listen on %d: %s", port, strerror(errno));
	if ((sock = accept(ls, NULL, NULL)) < 0)
		die("accept: %s", strerror(errno));

	char rec[64] = {0};
	size_t got = 0;
	while (got < 52) {
		ssize_t r = read(sock, rec + got, 52 - got);
		if (r <= 0)
			die("reading the peer's record");
		got += r;
	}
	unsigned lid, rqpn, rpsn;
	char ghex[33] = {0};
	if (sscanf(rec, "%x:%x:%x:%32s", &lid, &rqpn, &rpsn, ghex) != 4 || strlen(ghex) != 32)
		die("bad record \"%s\"", rec);
	union ibv_gid dgid, sgid;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(ghex + 2 * i, "%2x", &v);
		dgid.raw[i] = v;
	}
	if (ibv_query_gid(ctx, 1, gidx, &sgid))
		die("ibv_query_gid %d", gidx);
	unsigned psn = (unsigned)getpid() & 0xffffff;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = dgid;
	a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				      IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify RTS");
	char out[64];
	int n = snprintf(out, sizeof out, "%04x:%06x:%06x:", 0, qp->qp_num, psn);
	for (int i = 0; i < 16; i++)
		n += snprintf(out + n, sizeof out - n, "%02x", sgid.raw[i]);
	if (write(sock, out, n + 1) != n + 1)
		die("TCP write");

	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	char line[128];
	if (bind_role) {
		uint32_t rkey;
		uint64_t waddr;
		struct ibv_mw_bind_info bi = {.mr = mr, .addr = (uintptr_t)buf + WOFF, .length = WLEN,
					      .mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
		if (type == 1) {
			struct ibv_mw_bind mb = {.wr_id = 1, .send_flags = IBV_SEND_SIGNALED, .bind_info = bi};
			if (ibv_bind_mw(qp, mw, &mb))
				die("ibv_bind_mw: %s", strerror(errno));
			rkey = mw->rkey;
			waddr = bi.addr;
		} else {
			bi.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
			memset(&wr, 0, sizeof wr);
			wr.wr_id = 1;
			wr.opcode = IBV_WR_BIND_MW;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.bind_mw.mw = mw;
			wr.bind_mw.rkey = rkey = ibv_inc_rkey(mw->rkey);
			wr.bind_mw.bind_info = bi;
			if (ibv_post_send(qp, &wr, &bad))
				die("post BIND_MW: %s", strerror(errno));
			waddr = 0;
		}
		struct ibv_wc wc = poll1();
		want_wc(wc, 1, IBV_WC_SUCCESS, "bind");
		if (wc.opcode != IBV_WC_BIND_MW)
			die("bind completion opcode %d", wc.opcode);
		snprintf(line, sizeof line, "W %x %llx %d\n", rkey, (unsigned long long)waddr, WLEN);
		writestr(line);
		expect_line("written");
		for (size_t j = 0; j < MRSIZE; j++) {
			uint8_t want = (j >= WOFF && j < WOFF + WLEN) ? pat_b(j - WOFF) : pat_a(j);
			if (buf[j] != want)
				die("MR byte %zu = %#x, want %#x", j, buf[j], want);
		}
		if (inv_send) {
			wc = poll1();
			want_wc(wc, 100, IBV_WC_SUCCESS, "receive");
			// rxe hands libibverbs the kernel's flag bits, where
			// IB_WC_WITH_INVALIDATE is 1<<2 (IBV_WC_IP_CSUM_OK's bit):
			// accept either bit, and the key must match.
			if (!(wc.wc_flags & (IBV_WC_WITH_INV | IBV_WC_IP_CSUM_OK)) || wc.invalidated_rkey != rkey)
				die("receive flags %#x invalidated rkey %#x, want %#x", wc.wc_flags, wc.invalidated_rkey, rkey);
		} else if (strcmp(inv, "unbind") == 0) {
			struct ibv_mw_bind mb = {.wr_id = 2, .send_flags = IBV_SEND_SIGNALED,
						 .bind_info = {.mr = mr, .addr = (uintptr_t)buf, .length = 0}};
			if (ibv_bind_mw(qp, mw, &mb))
				die("ibv_bind_mw (unbind): %s", strerror(errno));
			want_wc(poll1(), 2, IBV_WC_SUCCESS, "unbind");
		} else {
			memset(&wr, 0, sizeof wr);
			wr.wr_id = 2;
			wr.opcode = IBV_WR_LOCAL_INV;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.invalidate_rkey = rkey;
			if (ibv_post_send(qp, &wr, &bad))
				die("post LOCAL_INV: %s", strerror(errno));
			want_wc(poll1(), 2, IBV_WC_SUCCESS, "local invalidate");
		}
		writestr("invalidated\n");
		expect_line("done");
		printf("mwpeer: bound type %d window %#x, peer wrote it, invalidated by %s\n", type, rkey, inv);
		return 0;
	}

	unsigned rkey, len;
	unsigned long long waddr;
	readline(line, sizeof line);
	if (sscanf(line, "W %x %llx %u", &rkey, &waddr, &len) != 3 || len != WLEN)
		die("bad window line \"%s\"", line);
	memset(&wr, 0, sizeof wr);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.rkey = rkey;
	wr.wr.rdma.remote_addr = waddr;
	sge = (struct ibv_sge){.addr = (uintptr_t)buf + 2048, .length = WLEN, .lkey = mr->lkey};
	wr.wr_id = 11;
	wr.opcode = IBV_WR_RDMA_READ;
	if (ibv_post_send(qp, &wr, &bad))
		die("post READ");
	want_wc(poll1(), 11, IBV_WC_SUCCESS, "READ through the window");
	for (size_t i = 0; i < WLEN; i++)
		if (buf[2048 + i] != pat_a(WOFF + i))
			die("window byte %zu = %#x, want %#x", i, buf[2048 + i], pat_a(WOFF + i));
	sge = (struct ibv_sge){.addr = (uintptr_t)buf, .length = WLEN, .lkey = mr->lkey};
	wr.wr_id = 12;
	wr.opcode = IBV_WR_RDMA_WRITE;
	if (ibv_post_send(qp, &wr, &bad))
		die("post WRITE");
	want_wc(poll1(), 12, IBV_WC_SUCCESS, "WRITE through the window");
	if (inv_send) {
		sge.length = 4;
		wr.wr_id = 13;
		wr.opcode = IBV_WR_SEND_WITH_INV;
		wr.invalidate_rkey = rkey;
		if (ibv_post_send(qp, &wr, &bad))
			die("post SEND_WITH_INV");
		want_wc(poll1(), 13, IBV_WC_SUCCESS, "SEND with Invalidate");
	}
	writestr("written\n");
	expect_line("invalidated");
	sge = (struct ibv_sge){.addr = (uintptr_t)buf + 2048, .length = 8, .lkey = mr->lkey};
	wr.wr_id = 14;
	wr.opcode = IBV_WR_RDMA_READ;
	if (ibv_post_send(qp, &wr, &bad))
		die("post READ after invalidation");
	want_wc(poll1(), 14, IBV_WC_REM_ACCESS_ERR, "READ after invalidation");
	printf("mwpeer: READ and WRITE through window %#x, then remote access error after invalidation by %s\n", rkey, inv);
	return 0;
}
