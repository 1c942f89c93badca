package ucx

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// procIdentity names a process on a host: a process reading the memory of
// another on the same host through shared memory keeps reading it after
// that process died (the segment stays mapped) or while it is frozen (its
// CPU takes no part), so liveness is checked from the process table.
type procIdentity struct {
	bootID string // /proc/sys/kernel/random/boot_id
	pidNS  string // the target of /proc/self/ns/pid
	pid    uint32
	start  uint64 // start time in clock ticks after boot (/proc/<pid>/stat field 22)
}

var (
	selfOnce sync.Once
	self     procIdentity
)

// thisProcess is this process's identity (empty fields where /proc does
// not tell).
func thisProcess() procIdentity {
	selfOnce.Do(func() {
		if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
			self.bootID = strings.TrimSpace(string(b))
		}
		self.pidNS, _ = os.Readlink("/proc/self/ns/pid")
		self.pid = uint32(os.Getpid())
		self.start, _, _ = procStat(self.pid)
	})
	return self
}

// procStat reads a process's start time and state from /proc.
func procStat(pid uint32) (start uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	fields := strings.Fields(string(b[i+2:]))
	if len(fields) < 20 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	start, err = strconv.ParseUint(fields[19], 10, 64) // field 22 of the line
	return start, fields[0][0], err
}

// sameHost reports whether p is a process that this one can see in its
// process table: same boot, same pid namespace.
func (p procIdentity) sameHost() bool {
	s := thisProcess()
	return p.bootID != "" && p.pidNS != "" && p.bootID == s.bootID && p.pidNS == s.pidNS && p.start != 0
}

// sameMachine reports whether p may run on this host's kernel, where
// UCX may join them with shared memory: the same boot, or a boot id that
// either side cannot tell.
func (p procIdentity) sameMachine() bool {
	s := thisProcess()
	return p.bootID == "" || s.bootID == "" || p.bootID == s.bootID
}

// gone reports why the process p no longer runs, or "" while it does or
// when this process cannot tell.
func (p procIdentity) gone() string {
	if !p.sameHost() {
		return ""
	}
	start, state, err := procStat(p.pid)
	switch {
	case os.IsNotExist(err):
		return fmt.Sprintf("process %d has exited", p.pid)
	case err != nil:
		return ""
	case start != p.start:
		return fmt.Sprintf("process %d has exited (its pid now names another process)", p.pid)
	case state == 'Z' || state == 'X':
		return fmt.Sprintf("process %d has exited (state %c)", p.pid, state)
	}
	return ""
}
