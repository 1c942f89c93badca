// Package remote is the data plane between workers: the Transport seam
// through which a worker serves its layouts to peers and reaches theirs,
// and its implementations — Loopback (workers of one process), TCP (any
// two processes, the fallback that always works) and UCX (shared memory,
// TCP and RDMA through libucp, loaded at run time).
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
