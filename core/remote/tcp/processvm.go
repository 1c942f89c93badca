package tcp

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
)

// Host memory a peer on this host did not allocate as shared memory (the
// engine's own) cannot be mapped here, nor device memory it cannot export
// that is host memory there all the same (the emulated device's registered
// memory: vLLM's KV cache on the CPU). It is lent all the same, and copied
// with process_vm_readv/process_vm_writev:
// one kernel copy straight between the two processes, all of a request's
// ranges in a few calls, where the socket costs a copy into the kernel
// and one out of it. The kernel allows this only where this process may
// ptrace the peer (the same user, and Yama's ptrace_scope permitting);
// where it does not, the layout goes through the socket, as real device
// memory does (a CPU read of it faults). Nothing is granted to the peer
// that the kernel did not already allow it.

// maxIOV is IOV_MAX: the most ranges on either side of one call.
const maxIOV = 1024

// vmCallBytes bounds one call's bytes, so that a lend's deadline is
// looked at between calls.
const vmCallBytes = 16 << 20

// reachProcess reports whether this process may copy process pid's memory
// at addr (it reads one byte there); a variable for tests.
var reachProcess = func(pid int, addr uint64) error {
	var b [1]byte
	_, err := unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &b[0], Len: 1}}, []unix.RemoteIovec{{Base: uintptr(addr), Len: 1}}, 0)
	return err
}

// processMaps is how layout d, memory process pid did not share, is
// reached here: its regions, copied with process_vm_readv/writev; nil (the
// socket) when the kernel does not let this process read that one's
// memory there.
func processMaps(pid int, d transfer.Descriptor) []sharedMap {
	if pid <= 0 || (!d.Kind.IsHost() && d.Kind != storage.Device) || len(d.Bases) == 0 {
		return nil
	}
	sizes, err := layout.RegionSizes(d.Config, d.Shape.Kind, d.Shape.BlockDim)
	if err != nil || len(sizes) != len(d.Bases) {
		return nil
	}
	if reachProcess(pid, d.Bases[0]) != nil {
		return nil
	}
	maps := make([]sharedMap, len(sizes))
	for i, s := range sizes {
		maps[i] = sharedMap{addr: d.Bases[i], size: s, pid: pid}
	}
	return maps
}

// span is a range of memory: here (Local) or in the peer (Remote).
type span struct{ addr, size uint64 }

// vmCopy copies ops between host memory here (Local) and process pid's
// (Remote): the peer's memory into ours, or ours into it when write.
// Adjacent ranges are joined on each side, and each call carries up to
// maxIOV ranges a side. It stops, between calls, once deadline passes.
func vmCopy(pid int, write bool, ops []transfer.RemoteOp, deadline time.Time) error {
	var local, remote []span
	var bytes uint64
	flush := func() error {
		if bytes == 0 {
			return nil
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return fmt.Errorf("%w: the lend's deadline passed mid-copy", os.ErrDeadlineExceeded)
		}
		err := vmCall(pid, write, local, remote, bytes)
		local, remote, bytes = local[:0], remote[:0], 0
		return err
	}
	for _, o := range ops {
		nl, nr := len(local), len(remote)
		joinL := nl > 0 && local[nl-1].addr+local[nl-1].size == o.Local
		joinR := nr > 0 && remote[nr-1].addr+remote[nr-1].size == o.Remote
		if (!joinL && nl == maxIOV) || (!joinR && nr == maxIOV) || bytes >= vmCallBytes {
			if err := flush(); err != nil {
				return err
			}
			joinL, joinR = false, false
		}
		if joinL {
			local[len(local)-1].size += o.Size
		} else {
			local = append(local, span{o.Local, o.Size})
		}
		if joinR {
			remote[len(remote)-1].size += o.Size
		} else {
			remote = append(remote, span{o.Remote, o.Size})
		}
		bytes += o.Size
	}
	return flush()
}

// vmCall moves bytes between local and remote, both that many bytes, in
// as many calls as the kernel needs (it stops short at a fault).
func vmCall(pid int, write bool, local, remote []span, bytes uint64) error {
	name := "process_vm_readv"
	if write {
		name = "process_vm_writev"
	}
	liov := make([]unix.Iovec, 0, len(local))
	riov := make([]unix.RemoteIovec, 0, len(remote))
	for done := uint64(0); done < bytes; {
		liov, riov = liov[:0], riov[:0]
		for _, s := range local {
			v := unix.Iovec{Base: &storage.HostBytes(s.addr, s.size)[0]}
			v.SetLen(int(s.size))
			liov = append(liov, v)
		}
		for _, s := range remote {
			riov = append(riov, unix.RemoteIovec{Base: uintptr(s.addr), Len: int(s.size)})
		}
		var n int
		var err error
		if write {
			n, err = unix.ProcessVMWritev(pid, liov, riov, 0)
		} else {
			n, err = unix.ProcessVMReadv(pid, liov, riov, 0)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s of process %d after %d of %d bytes: %w", name, pid, done, bytes, err)
		}
		if n <= 0 {
			return fmt.Errorf("%s of process %d moved nothing after %d of %d bytes", name, pid, done, bytes)
		}
		done += uint64(n)
		local, remote = skip(local, uint64(n)), skip(remote, uint64(n))
	}
	return nil
}

// skip drops the first n bytes of spans (what a short call moved).
func skip(spans []span, n uint64) []span {
	for len(spans) > 0 && n >= spans[0].size {
		n -= spans[0].size
		spans = spans[1:]
	}
	if n > 0 {
		spans[0] = span{spans[0].addr + n, spans[0].size - n}
	}
	return spans
}
