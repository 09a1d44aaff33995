// Package dcqcn runs DCQCN end to end over real kernel networking: rxego
// devices in two network namespaces joined by a veth pair, an nftables
// rule in the receiver's namespace that marks ECN CE on RoCE packets above
// a packet rate (the bottleneck "switch", see Marker), and backlogged RDMA
// WRITE flows whose delivered rate is measured from the receiver's
// completions while a Recorder samples every flow's DCQCN state. The tests
// check that one flow settles at the marking rate and returns to line
// rate when marking stops, that flows share the bottleneck fairly and a
// late one gets its share, that an idle paced endpoint costs no CPU, and
// what a CNP looks like on the wire; with -dcqcn.csv DIR they write the
// time series behind docs/dcqcn-*.svg (see docs/dcqcn.md).
//
// Everything needs root (network namespaces, nftables, ethtool). Tests
// skip without it, unless CI=true, where they fail. Addresses are
// 198.18.2.1 (sender) and 198.18.2.2 (receiver) inside namespaces the
// tests create and delete; nothing routes out of them.
package dcqcn
