package ucx

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kvbm/kvbm/kvbmerr"
)

// UCX's shared-memory transports (posix, sysv, xpmem) move an active
// message's fragment through a FIFO element whose length is 16 bits
// (mm_iface.h, 1.13 to 1.22), up to the segment size, unchecked: with a
// segment over 65,535 bytes a fragment's length wraps, and a rendezvous
// message over shared memory never completes (its pull fails at its
// deadline). The segment is set only in UCX's environment (or a ucx.conf,
// which kvbm cannot read back); a transport is refused where the
// environment sets one too large, naming it.

// maxSegSize is the largest segment whose fragments' lengths fit 16 bits.
const maxSegSize = 1<<16 - 1

// segSizeVars are the variables that set the segment: UCX_MM_SEG_SIZE for
// all three, the others for one (UCX's parser reads both).
var segSizeVars = []string{"UCX_MM_SEG_SIZE", "UCX_POSIX_SEG_SIZE", "UCX_SYSV_SEG_SIZE", "UCX_XPMEM_SEG_SIZE"}

// checkSegSize refuses a shared-memory segment size in the environment
// that UCX's FIFO cannot carry.
func checkSegSize() error {
	for _, name := range segSizeVars {
		v, ok := os.LookupEnv(name)
		if !ok {
			continue
		}
		n, ok := parseMemunits(v)
		if ok && n > maxSegSize {
			return fmt.Errorf("%w: ucx: %s=%s is more than %d bytes: UCX's shared-memory transports keep a fragment's "+
				"length in 16 bits and do not check, so a rendezvous message over shared memory would never complete; "+
				"set it to at most %d (UCX's default is 8256), or unset it", kvbmerr.ErrInvalidArgument, name, v, maxSegSize, maxSegSize)
		}
	}
	return nil
}

// parseMemunits reads a size as UCX does (ucs_str_to_memunits): a number
// of bytes, with an optional b, k, m, g, t, p or e (powers of 1,024),
// itself optionally followed by b; "inf" is the largest size. ok is false
// for "auto" and for what UCX would refuse itself.
func parseMemunits(s string) (n uint64, ok bool) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "inf":
		return ^uint64(0), true
	case "auto", "":
		return 0, false
	}
	digits := strings.TrimLeft(s, "0123456789")
	num, unit := s[:len(s)-len(digits)], strings.ToLower(digits)
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, false
	}
	switch {
	case unit == "":
		return v, true
	case len(unit) > 2 || len(unit) == 2 && unit[1] != 'b':
		return 0, false
	}
	shift := strings.IndexByte("bkmgtpe", unit[0])
	switch {
	case shift < 0:
		return 0, false
	case v > ^uint64(0)>>(10*shift):
		return ^uint64(0), true
	}
	return v << (10 * shift), true
}
