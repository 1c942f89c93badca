package tcp

import (
	"bufio"
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A request's ranges move over the socket in vectored calls: the bytes of
// many scattered ranges written with one writev (net.Buffers) and read
// with one readv, ranges that are adjacent in memory joined first.

// joinAdjacent joins buffers that follow each other in memory, in place.
func joinAdjacent(bufs [][]byte) [][]byte {
	out := bufs[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if n := len(out); n > 0 {
			last := out[n-1]
			if uintptr(unsafe.Pointer(unsafe.SliceData(last)))+uintptr(len(last)) == uintptr(unsafe.Pointer(unsafe.SliceData(b))) {
				out[n-1] = unsafe.Slice(unsafe.SliceData(last), len(last)+len(b))
				continue
			}
		}
		out = append(out, b)
	}
	return out
}

// readFullv fills bufs in order from c: the bytes r has buffered first,
// then straight from the socket, as many buffers a readv as the kernel
// has bytes for. A connection without a descriptor of its own is read
// buffer by buffer. The connection's deadline holds as for any read; a
// close before the last byte is io.ErrUnexpectedEOF.
func readFullv(c net.Conn, r *bufio.Reader, bufs [][]byte) error {
	i, off := 0, 0 // the next byte to fill: bufs[i][off]
	advance := func(n int) {
		for n > 0 {
			k := min(n, len(bufs[i])-off)
			n -= k
			if off += k; off == len(bufs[i]) {
				i, off = i+1, 0
			}
		}
		for i < len(bufs) && len(bufs[i]) == 0 {
			i++
		}
	}
	advance(0)
	for i < len(bufs) && r.Buffered() > 0 {
		n, _ := r.Read(bufs[i][off:]) // from the buffer only: it holds bytes
		advance(n)
	}
	if i == len(bufs) {
		return nil
	}
	sc, ok := c.(syscall.Conn)
	var raw syscall.RawConn
	var err error
	if ok {
		raw, err = sc.SyscallConn()
	}
	if !ok || err != nil {
		for ; i < len(bufs); i, off = i+1, 0 {
			if _, err := io.ReadFull(r, bufs[i][off:]); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF // mid-request
				}
				return err
			}
		}
		return nil
	}
	window := make([][]byte, 0, min(len(bufs)-i, maxIOV))
	for i < len(bufs) {
		window = append(window[:0], bufs[i][off:])
		for j := i + 1; j < len(bufs) && len(window) < maxIOV; j++ {
			window = append(window, bufs[j])
		}
		var n int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			n, rerr = unix.Readv(int(fd), window)
			return rerr != unix.EAGAIN
		}); err != nil {
			return err
		}
		switch {
		case rerr == unix.EINTR:
			continue
		case rerr != nil:
			return &net.OpError{Op: "readv", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: rerr}
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		advance(n)
	}
	return nil
}
