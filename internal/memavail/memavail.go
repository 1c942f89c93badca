// Package memavail says how much host memory this process may still make
// resident, so that an allocation that cannot fit is refused before a page
// of it is touched.
//
// Why: making memory resident beyond what the machine holds does not fail.
// MADV_POPULATE_WRITE, a page fault or cuMemHostAlloc's pinning go on
// until the kernel's OOM killer runs, and a global OOM may kill any
// process of the host (the engine next door), not the one that asked.
//
// Available memory is the least of the host's MemAvailable (/proc/meminfo)
// and, for each memory cgroup this process is in and each of its
// ancestors that this process can see, the cgroup's limit less its usage
// (cgroup v2 memory.max and memory.current, v1 memory.limit_in_bytes and
// memory.usage_in_bytes; shared memory files are shmem and count there).
// The usage leaves out the cgroup's page cache, active and inactive
// (memory.stat's active_file and inactive_file, v1's total_active_file and
// total_inactive_file): the kernel reclaims both before it runs the OOM
// killer, and MemAvailable counts them available too. (The kubelet's
// working set leaves out only inactive_file; a container that has just
// read its model weights holds them as active page cache, and counting
// that used would refuse a G2 that fits.) Dirty or locked file pages
// cannot be dropped at once, but they are written back or few. Swap is not counted: host memory for
// KV blocks in swap is worth nothing, and pinned memory cannot swap.
package memavail

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/kvbmerr"
)

// ErrInsufficient is wrapped by Reserve's and Check's refusals. Its kind is
// IO, that of the ENOMEM the kernel would give; allocators that stand in for
// the driver's report a CUDA out of memory instead.
var ErrInsufficient = kvbmerr.New(kvbmerr.IO, "not enough host memory")

// Reading is what the kernel said about memory, at one moment.
type Reading struct {
	// MemTotal and MemAvailable are /proc/meminfo's, in bytes.
	MemTotal, MemAvailable uint64
	// Cgroup is the memory cgroup directory whose limit leaves least room,
	// "" where no cgroup limits this process (or none could be read).
	Cgroup string
	// CgroupLimit and CgroupUsage are that cgroup's limit and its usage
	// less its page cache (active and inactive file pages), in bytes.
	CgroupLimit, CgroupUsage uint64
}

// Available is the memory that can still be made resident: MemAvailable,
// or less where a cgroup's limit leaves less.
func (r Reading) Available() uint64 {
	a := r.MemAvailable
	if r.Cgroup != "" {
		a = min(a, r.CgroupLimit-min(r.CgroupLimit, r.CgroupUsage))
	}
	return a
}

// Margin is the memory Reserve leaves free, for the rest of this process
// (an engine's own allocations, Python, the Go heap), for the kernel and
// for MemAvailable being an estimate: 1/32 of the memory that binds (the
// cgroup's limit where one is below MemTotal, else MemTotal), at least
// 1 GiB but never more than 1/8 of it. 1 GiB on a 24 GiB machine, 8 GiB
// on a 256 GiB one, 256 MiB in a 2 GiB container.
func (r Reading) Margin() uint64 {
	total := r.MemTotal
	if r.Cgroup != "" && (total == 0 || r.CgroupLimit < total) {
		total = r.CgroupLimit
	}
	return min(max(total/32, 1<<30), total/8)
}

// Usable is Available less Margin: the most Reserve grants.
func (r Reading) Usable() uint64 {
	a, m := r.Available(), r.Margin()
	return a - min(a, m)
}

// String names the figures the reading came from.
func (r Reading) String() string {
	s := fmt.Sprintf("MemAvailable %d of MemTotal %d", r.MemAvailable, r.MemTotal)
	if r.Cgroup != "" {
		s += fmt.Sprintf(", cgroup %s: limit %d, in use %d", r.Cgroup, r.CgroupLimit, r.CgroupUsage)
	}
	return s + fmt.Sprintf(", %d kept free", r.Margin())
}

// Source reads the kernel's files under Root: "" for this machine's /proc
// and /sys, a directory holding proc/meminfo, proc/self/cgroup,
// proc/self/mountinfo and the cgroup files at the mount points mountinfo
// names for tests.
type Source struct {
	Root string
}

// Read reads meminfo and the limits of this process's memory cgroups.
// Only meminfo is required: a cgroup whose files are missing or unreadable
// limits nothing.
func (s Source) Read() (Reading, error) {
	var r Reading
	b, err := os.ReadFile(s.path("/proc/meminfo"))
	if err != nil {
		return r, err
	}
	fields := meminfo(b)
	var ok bool
	if r.MemTotal, ok = fields["MemTotal"]; !ok {
		return r, fmt.Errorf("%s: no MemTotal", s.path("/proc/meminfo"))
	}
	if r.MemAvailable, ok = fields["MemAvailable"]; !ok {
		r.MemAvailable = fields["MemFree"] // before Linux 3.14
	}
	for _, dir := range s.cgroupDirs() {
		limit, usage, ok := readCgroup(dir)
		if !ok {
			continue
		}
		if r.Cgroup == "" || limit-min(limit, usage) < r.CgroupLimit-min(r.CgroupLimit, r.CgroupUsage) {
			r.Cgroup, r.CgroupLimit, r.CgroupUsage = strings.TrimPrefix(dir, s.Root), limit, usage
		}
	}
	return r, nil
}

func (s Source) path(p string) string { return s.Root + p }

// meminfo parses /proc/meminfo's "Name: N kB" lines into bytes.
func meminfo(b []byte) map[string]uint64 {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		out[name] = n
	}
	return out
}

// noLimit is the least v1 limit that means none (v1 writes "no limit" as
// the largest page-aligned int64, 9223372036854771712).
const noLimit = 1 << 62

// readCgroup reads one cgroup directory's limit and usage (less page
// cache, active and inactive), v2 files first, then v1's; ok is false
// where the directory sets no limit.
func readCgroup(dir string) (limit, usage uint64, ok bool) {
	for _, v := range []struct{ limit, usage, active, inactive string }{
		{"memory.max", "memory.current", "active_file", "inactive_file"},
		{"memory.limit_in_bytes", "memory.usage_in_bytes", "total_active_file", "total_inactive_file"},
	} {
		l, err := os.ReadFile(filepath.Join(dir, v.limit))
		if err != nil {
			continue
		}
		ls := strings.TrimSpace(string(l))
		if ls == "max" {
			return 0, 0, false
		}
		limit, err := strconv.ParseUint(ls, 10, 64)
		if err != nil || limit >= noLimit {
			return 0, 0, false
		}
		u, err := os.ReadFile(filepath.Join(dir, v.usage))
		if err != nil {
			return 0, 0, false
		}
		usage, err := strconv.ParseUint(strings.TrimSpace(string(u)), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if st, err := os.ReadFile(filepath.Join(dir, "memory.stat")); err == nil {
			usage -= min(usage, statField(st, v.active)+statField(st, v.inactive))
		}
		return limit, usage, true
	}
	return 0, 0, false
}

// statField is the value of name in a memory.stat file, 0 if absent.
func statField(b []byte, name string) uint64 {
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == name {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// cgroupDirs lists the directories of this process's memory cgroups (v1's
// memory controller and v2's unified hierarchy, whichever are mounted) and
// of their ancestors up to each mount's root: a parent's limit binds its
// children too.
func (s Source) cgroupDirs() []string {
	cg, err := os.ReadFile(s.path("/proc/self/cgroup"))
	if err != nil {
		return nil
	}
	mi, _ := os.ReadFile(s.path("/proc/self/mountinfo"))
	var dirs []string
	for line := range strings.Lines(string(cg)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		v2 := parts[0] == "0" && parts[1] == ""
		if !v2 && !containsField(parts[1], "memory") {
			continue
		}
		root, mount, ok := cgroupMount(mi, v2)
		if !ok {
			root, mount = "/", "/sys/fs/cgroup/memory"
			if v2 {
				mount = "/sys/fs/cgroup"
			}
		}
		// The path is relative to the hierarchy's root; the mount shows
		// the subtree from root (a container's own cgroup, often).
		rel := parts[2]
		if root != "/" {
			if r, ok := strings.CutPrefix(rel, root); ok && (r == "" || r[0] == '/') {
				rel = r
			} else {
				rel = "/" // another namespace's path: the mount is all we see
			}
		}
		base := s.path(mount)
		for dir := filepath.Join(base, rel); ; dir = filepath.Dir(dir) {
			dirs = append(dirs, dir)
			if len(dir) <= len(base) {
				break
			}
		}
	}
	return dirs
}

// cgroupMount finds in mountinfo the mount of the cgroup v2 hierarchy (v2)
// or of v1's memory controller: the root of the hierarchy it shows and its
// mount point.
func cgroupMount(mountinfo []byte, v2 bool) (root, mount string, ok bool) {
	for line := range strings.Lines(string(mountinfo)) {
		pre, post, found := strings.Cut(line, " - ")
		if !found {
			continue
		}
		f, p := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(p) < 1 {
			continue
		}
		switch {
		case v2 && p[0] == "cgroup2":
		case !v2 && p[0] == "cgroup" && len(p) >= 3 && containsField(p[2], "memory"):
		default:
			continue
		}
		return UnescapeMountinfo(f[3]), UnescapeMountinfo(f[4]), true
	}
	return "", "", false
}

func containsField(list, name string) bool {
	for f := range strings.SplitSeq(list, ",") {
		if f == name {
			return true
		}
	}
	return false
}

// UnescapeMountinfo undoes /proc/self/mountinfo's octal escapes (\040 for
// a space); kvbm info reads mountinfo too.
func UnescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

var (
	mu      sync.Mutex
	pending uint64 // bytes reserved and not yet released: being made resident
	read    = Source{}.Read
)

// Override makes Reserve and Check use fn's readings until restore is
// called. For tests.
func Override(fn func() (Reading, error)) (restore func()) {
	mu.Lock()
	defer mu.Unlock()
	prev := read
	read = fn
	return func() {
		mu.Lock()
		defer mu.Unlock()
		read = prev
	}
}

// Reserve grants size bytes to be made resident, or refuses them with an
// error wrapping ErrInsufficient that names the bytes requested and
// available. The caller releases the grant once the memory is resident
// (or freed): the kernel's figures count it from then on. Until then
// other reservations of this process see it taken, so that two
// allocations at once cannot each count the same free memory; and other
// processes of this host wait (the host lock, lockHost) before they read
// the kernel's figures, so that tensor-parallel ranks allocating G2 at
// the same moment do not each count the same MemAvailable either. Where
// the kernel's figures cannot be read (no /proc), everything is granted.
//
// The cost of the host lock: a process's reservation waits for another
// process's allocations being made resident to end (seconds for tens of
// GiB), and a process that always has one in progress holds the others
// off meanwhile. Memory of a process that does not use this package (or
// a kvbm whose lock file is elsewhere: another TMPDIR, no /dev/shm) is
// not waited for.
func Reserve(size uint64) (release func(), err error) {
	unlockHost := lockHost()
	mu.Lock()
	defer mu.Unlock()
	r, err := read()
	if err != nil {
		unlockHost()
		return func() {}, nil
	}
	usable := r.Usable()
	usable -= min(usable, pending)
	if size > usable {
		detail := r.String()
		if pending > 0 {
			detail += fmt.Sprintf(", %d being allocated by this process", pending)
		}
		unlockHost()
		return nil, fmt.Errorf("%w: %d bytes requested, %d available (%s)", ErrInsufficient, size, usable, detail)
	}
	pending += size
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			pending -= size
			mu.Unlock()
			unlockHost()
		})
	}, nil
}

// LockName is the host lock's file, in /dev/shm (or os.TempDir() where
// there is none): every process of the host that reserves memory shares
// it, whatever its user (the file is left behind, world-writable).
const LockName = "kvbm-memavail.lock"

var (
	hostMu      sync.Mutex
	hostHolders int      // this process's reservations holding the host lock
	hostFile    *os.File // open, and flocked, while hostHolders > 0
)

// lockHost takes the host lock for one reservation, waiting while another
// process holds it, and returns its release. The reservations of this
// process share one lock (the in-process accounting keeps them apart):
// the flock is taken by the first and let go by the last. Where the lock
// file cannot be opened or locked, it locks nothing.
func lockHost() (unlock func()) {
	hostMu.Lock()
	defer hostMu.Unlock()
	if hostHolders == 0 {
		hostFile = openHostLock()
	}
	hostHolders++
	return func() {
		hostMu.Lock()
		defer hostMu.Unlock()
		if hostHolders--; hostHolders == 0 && hostFile != nil {
			hostFile.Close() // lets the flock go
			hostFile = nil
		}
	}
}

func openHostLock() *os.File {
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = os.TempDir()
	}
	f, err := os.OpenFile(filepath.Join(dir, LockName), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil
	}
	_ = f.Chmod(0o666) // for other users' processes too, whatever the umask (fails if not ours: fine)
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil
	}
	return f
}

// Check is Reserve for memory that is not made resident now (lazily
// faulted pages): it refuses what could not fit, and holds nothing.
func Check(size uint64) error {
	release, err := Reserve(size)
	if err != nil {
		return err
	}
	release()
	return nil
}
