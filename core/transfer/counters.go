package transfer

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvbm/kvbm/cuda"
)

// Path is one way blocks move, for counters.
type Path uint8

// The paths, in the order Counters reports them. The values are stable:
// the C ABI mirrors them.
const (
	PathHostCopy    Path = iota // host ↔ host memcpy
	PathH2D                     // pinned → device
	PathD2H                     // device → pinned
	PathD2D                     // device → device
	PathDiskWrite               // host → disk
	PathDiskRead                // disk → host
	PathTwoHop                  // disk ↔ device, disk ↔ disk, peer ↔ device or disk, through a bounce buffer
	PathRemoteRead              // a peer's memory → host, through the transport
	PathRemoteWrite             // host → a peer's memory
	NumPaths
)

func (p Path) String() string {
	names := [...]string{"host-copy", "h2d", "d2h", "d2d", "disk-write", "disk-read", "two-hop", "remote-read", "remote-write"}
	if int(p) < len(names) {
		return names[p]
	}
	return fmt.Sprintf("Path(%d)", uint8(p))
}

// PathCounters are the totals of one path since the manager started.
type PathCounters struct {
	// Transfers is the number of completed transfers, failed or not.
	Transfers uint64
	// Blocks and Bytes are what completed transfers moved or tried to.
	Blocks, Bytes uint64
	// FailedBlocks is the number of destination blocks reported failed.
	FailedBlocks uint64
	// Nanoseconds is the time transfers spent in flight, from the call to
	// completion, summed.
	Nanoseconds uint64
}

type pathCounters struct{ transfers, blocks, bytes, failed, ns atomic.Uint64 }

// counters counts every path; updated once per completed transfer.
type counters [NumPaths]pathCounters

func pathOf(s strategy, kind cuda.CopyKind) Path {
	switch s {
	case hostCopy:
		return PathHostCopy
	case diskWrite:
		return PathDiskWrite
	case diskRead:
		return PathDiskRead
	case twoHop:
		return PathTwoHop
	case remoteRead:
		return PathRemoteRead
	case remoteWrite:
		return PathRemoteWrite
	}
	switch kind {
	case cuda.HostToDevice:
		return PathH2D
	case cuda.DeviceToHost:
		return PathD2H
	}
	return PathD2D
}

// finish counts a transfer, then completes n with the plan's result, so
// that whoever waits on n sees the counters include it.
func (m *Manager) finish(n *Notification, p *plan, path Path, start time.Duration, err error) {
	res := p.result(err)
	var failed []int
	if res != nil {
		failed = failedBlocks(res)
	}
	c := &m.counters[path]
	c.transfers.Add(1)
	c.blocks.Add(uint64(len(p.srcIDs)))
	c.bytes.Add(p.bytes())
	if len(failed) > 0 {
		c.failed.Add(uint64(len(failed)))
	}
	c.ns.Add(uint64(monotonic() - start))
	n.completeWith(res, failed)
}

// epoch is the origin of monotonic: a reading of the monotonic clock
// alone, one clock read where time.Now takes two (wall and monotonic).
var epoch = time.Now()

// monotonic is the time since epoch, for the counters' durations.
func monotonic() time.Duration { return time.Since(epoch) }

// Counters returns the totals of every path, indexed by Path.
func (m *Manager) Counters() [NumPaths]PathCounters {
	var out [NumPaths]PathCounters
	for i := range m.counters {
		c := &m.counters[i]
		out[i] = PathCounters{Transfers: c.transfers.Load(), Blocks: c.blocks.Load(), Bytes: c.bytes.Load(),
			FailedBlocks: c.failed.Load(), Nanoseconds: c.ns.Load()}
	}
	return out
}
