// Package rsocket is a net.Conn and net.Listener over RDMA, wire-compatible
// with rdma-core librdmacm's rsocket (protocol version 1, stream mode), so
// that any Go program (net/http, crypto/tls, gRPC, anything taking a
// net.Conn) talks over an rxego device to another Go program or to any
// rsocket C program (rstream, rcopy, riostream, LD_PRELOAD=librspreload.so).
//
// # Protocol (rdma-core librdmacm/rsocket.c and docs/rsocket)
//
// Connections are made by rdma_cm in the TCP port space (package cm); the
// REQ and REP carry struct rs_conn_data (40 bytes, big-endian): version 1,
// flags (IOMAP always, NET on big-endian hosts), the credits (the receive
// queue size), the scaled target iomap size, the target SGL (address,
// rkey, 2 entries) and the first half of the receive buffer.
//
// Every message is an RDMA WRITE with immediate (zero-length when it
// carries nothing); the immediate's top 3 bits are the operation: DATA
// (the lower bits the length, the bytes written at the current target SGE,
// the next free part of the peer's receive buffer), SGL (a credit update:
// the peer may send DATA messages up to the sequence number in the lower
// bits; when the WRITE has 16 bytes, they are a new target SGE for the
// next entry of the peer's target SGL), IOMAP_SGL (an iomap entry was
// written) and CTRL (DISCONNECT, SHUTDOWN, KEEPALIVE). Receives carry no
// buffers; DATA messages use credits, control messages use four control
// slots and rely on RNR retries (infinite) for a free receive. The
// keepalive is a zero-length RDMA WRITE without immediate and rkey 0.
// SGEs and iomap entries are written into the peer in the peer's byte
// order (its NET flag).
//
// # Go semantics
//
// Conn has net's semantics: deadlines that return os.ErrDeadlineExceeded,
// Close that unblocks pending calls with net.ErrClosed, CloseWrite that
// sends SHUTDOWN (the peer reads io.EOF), io.EOF after the peer's SHUTDOWN
// or DISCONNECT once buffered data is read, and ErrReset (matching
// syscall.ECONNRESET) when the connection fails without DISCONNECT or on a
// Write after it. Config sets buffer and queue sizes before connecting.
// Conn implements io.ReaderFrom and io.WriterTo, which fill the send
// buffer and drain the receive buffer directly.
//
// A cm.Manager owns a device's QP1; Dial and Listen take it, so that any
// number of connections share one device.
package rsocket
