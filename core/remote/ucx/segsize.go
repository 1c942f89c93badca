package ucx

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kvbm/kvbm/kvbmerr"
)

// UCX's shared-memory transports (posix, sysv, xpmem) move an active
// message's fragment through a FIFO element whose length is 16 bits
// (mm_iface.h, 1.13 to 1.22), up to the segment size, unchecked: with a
// segment over 65,535 bytes a fragment's length wraps, and a rendezvous
// message over shared memory never completes (its pull fails at its
// deadline). A transport is refused where the environment, or
// Config.Options, sets one too large, or one kvbm cannot read as UCX
// does, naming it (a ucx.conf's is not seen).
//
// The sender packs a fragment of up to its own segment into a receive
// descriptor of the receiver's (mm_ep.c, 1.13.1), unchecked too: two
// processes of one host must run with the same segments. An endpoint
// carries its context's (shmSegs), and an importer refuses an exporter of
// its host whose segments differ before it makes a UCX endpoint, so
// nothing moves between them in either direction (Connect).

// maxSegSize is the largest segment whose fragments' lengths fit 16 bits.
const maxSegSize = 1<<16 - 1

// ucxSegSize is UCX's own default segment (mm_iface.c, 1.13 to 1.22).
const ucxSegSize = 8256

// kvbm's own context takes the largest segment the FIFO carries, where
// neither the environment nor Config.Options sets one: fewer, larger
// fragments per message (BenchmarkPull over shared memory, 2 MiB blocks:
// 5.78 and 6.02 GB/s against 5.00 and 5.72 with UCX's default,
// docs/data-plane.md). MM_SEG_SIZE reaches the three transports through
// ucp_config_modify in every version (their tables nest UCX's mm table
// under "MM_"), and is applied after the environment, so kvbm sets it
// only where the environment names none. The receive pool then grows 64
// descriptors at a time, not UCX's 512: UCX 1.13's 4 MiB a growth with
// its default segment (512 of 8,256 bytes), not 32 MiB; kvbm leaves the
// growth to an operator who sets one.
const (
	defaultSegSize    = maxSegSize
	defaultRxBufsGrow = 64
	optSegSize        = "MM_SEG_SIZE"
	optRxBufsGrow     = "MM_RX_BUFS_GROW"
)

// shmTransports are UCX's shared-memory transports, by the prefix of
// their settings; shmSegs follows this order.
var shmTransports = [...]string{"POSIX_", "SYSV_", "XPMEM_"}

// shmSettings are the names of a shared-memory transports' setting:
// MM_<name> for all three, then each transport's own (UCX's parser reads
// both, the one of a transport over MM_'s).
func shmSettings(name string) []string {
	names := []string{"MM_" + name}
	for _, tl := range shmTransports {
		names = append(names, tl+name)
	}
	return names
}

// segSizeVars are the variables that set the segment, UCX_MM_SEG_SIZE
// first.
var segSizeVars = envNames(shmSettings("SEG_SIZE"))

// envNames are UCX's environment variables for settings.
func envNames(settings []string) []string {
	for i, s := range settings {
		settings[i] = "UCX_" + s
	}
	return settings
}

// shmSegs are the segment sizes a context's posix, sysv and xpmem
// transports run with, in bytes.
type shmSegs [len(shmTransports)]uint32

// checkSegSize refuses a shared-memory segment in the environment or in
// opts that UCX's FIFO cannot carry, or that kvbm cannot read as UCX
// does, and options whose effect on the segment depends on UCX's version:
// a transport's prefixed name (UCX 1.17 and later apply it, earlier ones
// do not) and a wildcard (UCX 1.22 matches option names as patterns).
func checkSegSize(opts map[string]string) error {
	for _, name := range segSizeVars {
		if v, ok := os.LookupEnv(name); ok {
			if err := checkSeg(name, v); err != nil {
				return err
			}
		}
	}
	for k, v := range opts {
		switch {
		case strings.ContainsAny(k, "*?["):
			return fmt.Errorf("%w: ucx: option %q: a name with a wildcard, which UCX 1.22 matches against every "+
				"setting, so kvbm cannot tell what it sets; name each setting", kvbmerr.ErrInvalidArgument, k)
		case k != optSegSize && slices.Contains(segSizeVars, "UCX_"+k):
			return fmt.Errorf("%w: ucx: option %s: UCX before 1.17 ignores a transport's prefix in a context's options, later "+
				"ones apply it, so kvbm cannot tell the segment; set %s in the options (or %s in the environment)",
				kvbmerr.ErrInvalidArgument, k, optSegSize, "UCX_"+k)
		case k == optSegSize:
			if err := checkSeg("option "+k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkSeg(name, v string) error {
	n, ok := parseMemunits(v)
	switch {
	case !ok:
		return fmt.Errorf("%w: ucx: %s=%q is not a size kvbm reads as UCX does (a number of bytes, with k, m or g "+
			"and an optional b): peers of a host must run the same segment, and kvbm compares them; "+
			"set it to at most %d (kvbm's default), or unset it", kvbmerr.ErrInvalidArgument, name, v, maxSegSize)
	case n > maxSegSize:
		return fmt.Errorf("%w: ucx: %s=%s is more than %d bytes: UCX's shared-memory transports keep a fragment's "+
			"length in 16 bits and do not check, so a rendezvous message over shared memory would never complete; "+
			"set it to at most %d (kvbm's default), or unset it", kvbmerr.ErrInvalidArgument, name, v, maxSegSize, maxSegSize)
	}
	return nil
}

// addSegDefaults sets kvbm's segment in opts where neither opts nor the
// environment sets one (checkSegSize: opts set it by MM_SEG_SIZE only),
// and the pool's growth where neither sets that.
func addSegDefaults(opts map[string]string) {
	if _, ok := opts[optSegSize]; ok {
		return
	}
	for _, name := range segSizeVars {
		if _, ok := os.LookupEnv(name); ok {
			return
		}
	}
	opts[optSegSize] = strconv.Itoa(defaultSegSize)
	for _, name := range shmSettings("RX_BUFS_GROW") {
		if _, ok := opts[name]; ok {
			return
		}
		if _, ok := os.LookupEnv("UCX_" + name); ok {
			return
		}
	}
	opts[optRxBufsGrow] = strconv.Itoa(defaultRxBufsGrow)
}

// segsOf gives the segments of a context made with opts (checked by
// checkSegSize): MM_SEG_SIZE in opts for all (applied last), else a
// transport's own variable, else UCX_MM_SEG_SIZE, else UCX's default.
func segsOf(opts map[string]string) shmSegs {
	var s shmSegs
	for i, tl := range shmTransports {
		v, ok := opts[optSegSize]
		if !ok {
			v, ok = os.LookupEnv("UCX_" + tl + "SEG_SIZE")
		}
		if !ok {
			v, ok = os.LookupEnv("UCX_MM_SEG_SIZE")
		}
		if !ok {
			s[i] = ucxSegSize
			continue
		}
		if n, ok := parseMemunits(v); ok && n <= maxSegSize {
			s[i] = uint32(n) // else 0, which checkSegs never takes as a match
		}
	}
	return s
}

// checkSegs refuses an exporter that may share memory with this host
// (sameMachine) and runs segments other than own, this transport's
// (Connect, before it makes an endpoint).
func checkSegs(info *endpointInfo, own shmSegs) error {
	if !info.proc.sameMachine() || info.segs == own && !slices.Contains(own[:], 0) {
		return nil
	}
	return fmt.Errorf("%w: ucx: the exporting worker %x runs on this host with shared-memory segments (bytes) %v, "+
		"this transport with %v: UCX's sender packs a fragment of up to its own segment into the receiver's, unchecked, "+
		"so both must be the same (set UCX_MM_SEG_SIZE, UCX_POSIX_SEG_SIZE, UCX_SYSV_SEG_SIZE and UCX_XPMEM_SEG_SIZE, "+
		"and the transport's MM_SEG_SIZE option, alike for every kvbm process of a host, or leave them unset)",
		kvbmerr.ErrUnsupported, info.worker, info.segs, own)
}

// String names the segments as an operator sets them.
func (s shmSegs) String() string {
	parts := make([]string, len(s))
	for i, tl := range shmTransports {
		v := "unknown"
		if s[i] != 0 {
			v = strconv.FormatUint(uint64(s[i]), 10)
		}
		parts[i] = strings.ToLower(strings.TrimSuffix(tl, "_")) + " " + v
	}
	return strings.Join(parts, ", ")
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
