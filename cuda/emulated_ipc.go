package cuda

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/internal/hugepage"
	"github.com/kvbm/kvbm/internal/memfd"
)

// CUDA IPC on the emulated device. Its device allocations live in sealed
// shared memory files (ipcFile); a handle names the exporting process and
// its file (pid, descriptor, inode), and the importer opens the file
// through /proc/<pid>/fd — as cuIpcOpenMemHandle does, only another
// process of the same host (and user) can — and maps the same pages. The
// inode tells a file the exporter freed from one that took its descriptor
// number since.

const ipcMagic = "KVBMEMU1"

// ipcFile makes a sealed shared memory file of size bytes, or nil where
// the kernel refuses (the allocation is then private and not exportable).
func ipcFile(size uint64) *os.File {
	f, err := memfd.New("kvbm-emulated-device", size)
	if err != nil {
		return nil
	}
	return f
}

type ipcName struct {
	pid, fd, device uint32
	ino, size       uint64
}

func (n ipcName) handle() IPCHandle {
	var h IPCHandle
	copy(h[:], ipcMagic)
	binary.LittleEndian.PutUint32(h[8:], n.pid)
	binary.LittleEndian.PutUint32(h[12:], n.fd)
	binary.LittleEndian.PutUint32(h[16:], n.device)
	binary.LittleEndian.PutUint64(h[20:], n.ino)
	binary.LittleEndian.PutUint64(h[28:], n.size)
	return h
}

func parseIPCHandle(h IPCHandle) (ipcName, bool) {
	if string(h[:8]) != ipcMagic {
		return ipcName{}, false
	}
	return ipcName{pid: binary.LittleEndian.Uint32(h[8:]), fd: binary.LittleEndian.Uint32(h[12:]),
		device: binary.LittleEndian.Uint32(h[16:]), ino: binary.LittleEndian.Uint64(h[20:]),
		size: binary.LittleEndian.Uint64(h[28:])}, true
}

// IPCExport names the MemAlloc allocation holding [ptr, ptr+size).
// Registered memory (an engine's buffer adopted as device memory) and
// memory opened from another process are not exportable, as CUDA refuses
// memory that is not its own allocation.
func (e *Emulated) IPCExport(ptr, size uint64) (IPCHandle, uint64, uint64, error) {
	const op = "cuIpcGetMemHandle"
	if err := e.checkOpen(op); err != nil {
		return IPCHandle{}, 0, 0, err
	}
	r := e.devs.lookup(ptr, size)
	if r == nil || r.kind != regionDeviceAlloc {
		return IPCHandle{}, 0, 0, NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
			"%#x+%d is not inside one device allocation of this process (registered or imported memory cannot be exported)", ptr, size))
	}
	if r.file == nil {
		return IPCHandle{}, 0, 0, NewError(op, ErrCodeNotSupported, "this allocation has no shared memory file (memfd_create was refused)")
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(r.file.Fd()), &st); err != nil {
		return IPCHandle{}, 0, 0, NewError(op, ErrCodeUnknown, fmt.Sprintf("fstat: %v", err))
	}
	n := ipcName{pid: uint32(os.Getpid()), fd: uint32(r.file.Fd()), device: uint32(r.device), ino: st.Ino, size: r.end - r.start}
	return n.handle(), r.start, r.end - r.start, nil
}

// IPCOpen maps another process's exported allocation as device memory of
// device here; a handle open already gives the same address, counted.
func (e *Emulated) IPCOpen(device int, h IPCHandle) (uint64, uint64, error) {
	const op = "cuIpcOpenMemHandle"
	if err := e.checkDevice(op, device); err != nil {
		return 0, 0, err
	}
	n, ok := parseIPCHandle(h)
	if !ok {
		return 0, 0, NewError(op, ErrCodeInvalidValue, "not an IPC handle of the emulated device")
	}
	if int(n.pid) == os.Getpid() {
		return 0, 0, NewError(op, ErrCodeInvalidContext, "the handle was exported by this process; open it in another one")
	}
	key := ipcName{pid: n.pid, fd: n.fd, ino: n.ino, size: n.size, device: uint32(device)} // counted per device, as CUDA counts per context
	e.ipcMu.Lock()
	defer e.ipcMu.Unlock()
	if o, ok := e.ipcOpen[key]; ok {
		o.refs++
		return o.addr, n.size, nil
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", n.pid, n.fd), os.O_RDWR, 0)
	if err != nil {
		return 0, 0, NewError(op, ErrCodeInvalidValue, fmt.Sprintf("the exporting process freed that allocation or exited (or is out of reach): %v", err))
	}
	defer f.Close()
	if ino, err := memfd.Check(f, n.size); err != nil || ino != n.ino {
		return 0, 0, NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
			"the exporting process freed that allocation (the file at its descriptor is other memory: %v)", err))
	}
	mem, err := hugepage.Map(n.size, int(f.Fd())) // released by the region table, with hugepage.Unmap
	if err != nil {
		return 0, 0, NewError(op, ErrCodeOutOfMemory, fmt.Sprintf("map %d bytes: %v", n.size, err))
	}
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	if err := e.devs.insertMapped(op, region{start: addr, end: addr + n.size, kind: regionDeviceIPC, device: device, mem: mem}); err != nil {
		_ = hugepage.Unmap(mem)
		return 0, 0, err
	}
	if e.ipcOpen == nil {
		e.ipcOpen = map[ipcName]*emuIPCOpen{}
	}
	e.ipcOpen[key] = &emuIPCOpen{addr: addr, refs: 1}
	return addr, n.size, nil
}

// emuIPCOpen is an allocation IPCOpen mapped, and how many opens it has.
type emuIPCOpen struct {
	addr uint64
	refs int
}

// IPCClose undoes one IPCOpen; the last unmaps the memory.
func (e *Emulated) IPCClose(ptr uint64) error {
	const op = "cuIpcCloseMemHandle"
	e.ipcMu.Lock()
	defer e.ipcMu.Unlock()
	for key, o := range e.ipcOpen {
		if o.addr != ptr {
			continue
		}
		if o.refs--; o.refs > 0 {
			return nil
		}
		delete(e.ipcOpen, key)
		return e.devs.free(op, regionDeviceIPC, ptr)
	}
	return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("%#x is not memory opened with IPCOpen", ptr))
}
