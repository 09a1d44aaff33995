// rspoll: a poll-driven TCP client for the lab's rsocket cases, run in a
// guest under LD_PRELOAD=librspreload.so, which turns its sockets into
// rsockets and its poll() into rpoll(). It connects without blocking,
// then sends an HTTP POST of n bytes (byte i is (i*131 + (i>>8)) & 0xff)
// to /sha256 while reading the answer, every step waiting in poll() for
// POLLIN and POLLOUT at once, and prints the answer's body.
//
//	rspoll host port n
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define POLL_MS 30000

static int fail(const char *what)
{
	fprintf(stderr, "rspoll: %s: %s\n", what, strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	char head[256], resp[4096];
	size_t rlen = 0;
	long n;
	int fd, err = 0;
	socklen_t elen = sizeof err;

	if (argc != 4 || inet_pton(AF_INET, argv[1], &sin.sin_addr) != 1 || (n = atol(argv[3])) < 0) {
		fprintf(stderr, "usage: rspoll ipv4-address port bytes\n");
		return 2;
	}
	sin.sin_port = htons(atoi(argv[2]));
	int hlen = snprintf(head, sizeof head,
			    "POST /sha256 HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/octet-stream\r\n"
			    "Content-Length: %ld\r\nConnection: close\r\n\r\n", argv[1], argv[2], n);
	size_t total = hlen + n, sent = 0;
	unsigned char *req = malloc(total);
	if (!req)
		return fail("malloc");
	memcpy(req, head, hlen);
	for (long i = 0; i < n; i++)
		req[hlen + i] = (i * 131 + (i >> 8)) & 0xff;

	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return fail("socket");
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
		return fail("fcntl");
	if (connect(fd, (struct sockaddr *)&sin, sizeof sin) && errno != EINPROGRESS)
		return fail("connect");
	struct pollfd p = {.fd = fd, .events = POLLOUT};
	if (poll(&p, 1, POLL_MS) != 1)
		return fail("poll for the connection");
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) || err) {
		errno = err;
		return fail("connect (SO_ERROR)");
	}
	for (;;) {
		p.events = POLLIN | (sent < total ? POLLOUT : 0);
		int r = poll(&p, 1, POLL_MS);
		if (r != 1)
			return fail(r ? "poll" : "poll timed out");
		if (p.revents & POLLOUT) {
			ssize_t w = write(fd, req + sent, total - sent);
			if (w < 0 && errno != EAGAIN)
				return fail("write");
			if (w > 0)
				sent += w;
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			if (rlen == sizeof resp - 1) {
				fprintf(stderr, "rspoll: answer longer than %zu bytes\n", sizeof resp - 1);
				return 1;
			}
			ssize_t m = read(fd, resp + rlen, sizeof resp - 1 - rlen);
			if (m < 0 && errno != EAGAIN)
				return fail("read");
			if (m == 0)
				break;
			if (m > 0)
				rlen += m;
		}
	}
	close(fd);
	resp[rlen] = 0;
	char *body = strstr(resp, "\r\n\r\n");
	if (sent != total || !body || strncmp(resp, "HTTP/1.1 200", 12)) {
		fprintf(stderr, "rspoll: sent %zu of %zu bytes; answer:\n%s\n", sent, total, resp);
		return 1;
	}
	fputs(body + 4, stdout);
	return 0;
}
