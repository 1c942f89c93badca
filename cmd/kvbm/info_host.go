package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/internal/memavail"
)

// numaNode is one of the host's NUMA nodes, from sysfs.
type numaNode struct {
	ID          int    `json:"id"`
	CPUs        string `json:"cpus"` // as cpulist has it, e.g. "0-31,64-95"; "" for a memory-only node
	MemoryTotal uint64 `json:"memory_total_bytes"`
}

// hostNUMANodes lists <sysfs>/devices/system/node/node*: the NUMA nodes,
// their CPUs and memory. An error when sysfs has no NUMA nodes.
func hostNUMANodes(sysfs string) ([]numaNode, error) {
	dirs, err := filepath.Glob(filepath.Join(sysfs, "devices/system/node/node[0-9]*"))
	if err != nil || len(dirs) == 0 {
		return nil, fmt.Errorf("no NUMA nodes under %s", filepath.Join(sysfs, "devices/system/node"))
	}
	var nodes []numaNode
	for _, d := range dirs {
		id, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "node"))
		if err != nil {
			continue
		}
		n := numaNode{ID: id}
		if b, err := os.ReadFile(filepath.Join(d, "cpulist")); err == nil {
			n.CPUs = strings.TrimSpace(string(b))
		}
		n.MemoryTotal = nodeMemTotal(filepath.Join(d, "meminfo"))
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes, nil
}

// nodeMemTotal reads "Node N MemTotal: X kB" from a node's meminfo; 0 when
// it is not there.
func nodeMemTotal(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 4 && f[2] == "MemTotal:" {
			kb, _ := strconv.ParseUint(f[3], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// diskReport is what the disk tier (G3) would find in a directory.
type diskReport struct {
	Dir        string `json:"dir"`
	Filesystem string `json:"filesystem"`            // ext4, xfs, tmpfs, overlay, …
	Device     string `json:"device,omitempty"`      // the mount's source
	MountPoint string `json:"mount_point,omitempty"` // where that filesystem is mounted
	FreeBytes  uint64 `json:"free_bytes"`
	Direct     bool   `json:"o_direct"`
	// DirectError says why O_DIRECT does not work here (the disk tier
	// then uses buffered I/O).
	DirectError string `json:"o_direct_error,omitempty"`
	Error       string `json:"error,omitempty"`
}

// probeDisk finds dir's filesystem in /proc/self/mountinfo and tries
// O_DIRECT there for real: a 4 KiB-aligned write and read of a temporary
// file, opened as the disk tier opens its files.
func probeDisk(dir string) diskReport {
	r := diskReport{Dir: dir}
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		r.Error = fmt.Sprintf("-dir %q: %v", dir, err)
		return r
	}
	r.Dir = abs
	var st syscall.Statfs_t
	if err := syscall.Statfs(abs, &st); err != nil {
		r.Error = fmt.Sprintf("statfs %s: %v", abs, err)
		return r
	}
	r.FreeBytes = st.Bavail * uint64(st.Bsize)
	r.Filesystem, r.Device, r.MountPoint = mountOf(abs)
	if r.Filesystem == "" {
		r.Filesystem = fmt.Sprintf("unknown (statfs type %#x)", st.Type)
	}
	if err := tryDirect(abs); err != nil {
		r.DirectError = err.Error()
	} else {
		r.Direct = true
	}
	return r
}

// mountOf is the filesystem type, source and mount point of the mount that
// holds path (the longest mount point that is a prefix of it).
func mountOf(path string) (fstype, source, mountPoint string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", ""
	}
	best := -1
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 {
			continue
		}
		mp := unescapeMount(f[4])
		if !(path == mp || mp == "/" || strings.HasPrefix(path, mp+"/")) || len(mp) < best {
			continue
		}
		best, fstype, source, mountPoint = len(mp), g[0], g[1], mp
	}
	return fstype, source, mountPoint
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
var unescapeMount = memavail.UnescapeMountinfo

// tryDirect writes and reads back 4 KiB through O_DIRECT in a temporary
// file in dir, from memory aligned as the disk tier's (an mmap).
func tryDirect(dir string) (err error) {
	f, err := os.CreateTemp(dir, ".kvbm-odirect-*")
	if err != nil {
		return fmt.Errorf("create a file in %s: %w", dir, err)
	}
	path := f.Name()
	f.Close()
	defer func() { err = errors.Join(err, os.Remove(path)) }()
	d, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		return fmt.Errorf("open with O_DIRECT: %w", err)
	}
	defer d.Close()
	const n = storage.DirectIOAlignment
	mem, err := storage.AllocSystem(2 * n)
	if err != nil {
		return err
	}
	defer mem.Close()
	b, err := mem.Bytes()
	if err != nil {
		return err
	}
	w, rd := b[:n], b[n:]
	for i := range w {
		w[i] = byte(i*7 + 1)
	}
	if _, err := d.WriteAt(w, 0); err != nil {
		return fmt.Errorf("O_DIRECT write of %d bytes: %w", n, err)
	}
	if _, err := d.ReadAt(rd, 0); err != nil {
		return fmt.Errorf("O_DIRECT read of %d bytes: %w", n, err)
	}
	if !bytes.Equal(w, rd) {
		return fmt.Errorf("O_DIRECT read back differs from what was written")
	}
	return nil
}
