// Package cm is rxego's connection manager: the InfiniBand Communication
// Manager protocol (IBA chapter 12) spoken in MADs on the GSI queue pair
// (QP1), with the RDMA CM conventions librdmacm uses on top, so that rxego
// connects with rping, ucmatose, perftest -R and any other rdma_cm
// application on Linux Soft-RoCE (rdma_rxe) or an RNIC.
//
// # Wire
//
// A CM message is a 256-byte MAD (management class 0x07, class version 2,
// method Send) carried in a UD SEND Only packet to QP1 with the GSI Q_Key
// 0x80010000. This package encodes and decodes the connection messages
// (REQ, MRA, REJ, REP, RTU, DREQ, DREP; see Marshal and Unmarshal) and
// the IP private-data header rdma_cm puts at the front of a REQ's private
// data (IPHeader). Service IDs of rdma_cm's TCP port space are
// 0x0000000001060000 | port (ServiceID).
//
// # Protocol
//
// A Manager owns QP1 of one rxego.Device. It listens for connection
// requests (Manager.Listen, Listener.Accept, Request.Accept or Reject),
// makes them (Manager.Dial) and tears them down (Conn.Disconnect, or the
// peer's DREQ). Each side moves the application's RC QP through INIT, RTR
// and RTS at the messages rdma_cm uses: the passive side before it sends
// its REP, the active side when the REP arrives, before its RTU. Messages
// that expect an answer (REQ, REP, DREQ) are retransmitted with the
// timeouts the peer's REQ asks for, up to its Max CM Retries; duplicates
// are answered as the Linux CM answers them (a duplicate REP with the RTU
// again, a duplicate REQ while the application decides with an MRA, a
// duplicate DREQ with the DREP again, a REQ for a port nobody listens on
// with a REJ, reason 8, invalid service ID).
//
// Timeouts follow the IBA encoding 4.096 us * 2^n and the Linux CM's
// arithmetic (cm_convert_to_ms); see Config for the values rxego sends.
package cm
