// Package remote is the data plane between workers: the Transport seam
// through which a worker serves its layouts to peers and reaches theirs,
// Loopback (workers of one process), and the selection of a network
// transport by name (Register, Choice, Open). The network transports are
// packages of their own that register themselves when linked in: tcp
// (any two processes, the fallback that always works, with its same-host
// route) and ucx (shared memory, TCP and RDMA through libucp, loaded at
// run time).
//
// A worker serves its layouts on every transport it has and publishes each
// transport's endpoint in its exported metadata; a peer that imports the
// metadata connects over the first transport both sides have and attaches
// the layouts, after which the transfer manager moves their blocks like
// local ones. Every remote operation has a deadline (the manager's
// RemoteDeadline): a dead, frozen or unreachable peer fails the pending
// transfers' blocks within it, and later calls fail at once until the
// peer's metadata is imported again.
package remote
