// Package e2e runs DCQCN end to end over real kernel networking: rxego
// devices in two network namespaces joined by a veth pair, an nftables
// rule in the receiver's namespace that marks ECN CE on RoCE packets above
// a byte rate (the bottleneck "switch"), and backlogged RDMA WRITE flows
// whose delivered rate is measured from the receiver's completions. The
// tests in this package check that DCQCN settles at the marking rate,
// shares it fairly, and returns to line rate when marking stops; the same
// runs, with -dcqcn.csv, write the time series behind docs/dcqcn-*.svg.
//
// Everything needs root (network namespaces, nftables). Tests skip without
// it, unless CI=true, where they fail. Addresses are 198.18.2.1 (sender)
// and 198.18.2.2 (receiver) inside namespaces the tests create and delete;
// nothing routes out of them.
package e2e
