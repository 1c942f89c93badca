package object

import (
	"fmt"

	"github.com/kvbm/kvbm/internal/crc32c"
)

// pieceSize is how much of a payload a get reads before folding it into the
// running CRC32C: small enough that the bytes just read are still in the
// CPU's cache when they are checksummed, large enough that the reads stay
// few (eight for a 2 MiB block).
const pieceSize = 256 << 10

// loadPayload reads the payload of key's object, whose header h has been
// checked (format, key, and a length equal to dst's block size), into block
// id of dst, computing its CRC32C as the bytes land. read fills its
// argument with the next bytes of the payload, exactly, or returns the
// error to report (already naming the object).
//
// A destination that lends its memory (HostBlockIO, host memory) is read
// into in place: no buffer, no second copy. Its bytes are then whatever
// arrived when the check fails, which is why a failed block may hold any
// bytes; the caller reports it failed and it is never reported loaded.
// Other destinations (device or disk memory) are read into buf and
// written with WriteBlock only once the payload checks.
func loadPayload(key Key, h header, dst BlockIO, id int, buf func() []byte, read func([]byte) error) error {
	if hb, ok := dst.(HostBlockIO); ok {
		spans, release, ok, err := hb.HostBlock(id)
		if err != nil {
			return fmt.Errorf("object %s: destination block %d: %w", key, id, err)
		}
		if ok {
			defer release()
			return readChecked(key, h, spans, read)
		}
	}
	b := buf()
	if err := readChecked(key, h, [][]byte{b}, read); err != nil {
		return err
	}
	if err := dst.WriteBlock(id, b); err != nil {
		return fmt.Errorf("object %s: write destination block %d: %w", key, id, err)
	}
	return nil
}

// readChecked fills spans from read, in pieces of at most pieceSize, and
// checks the CRC32C of all of it against h.
func readChecked(key Key, h header, spans [][]byte, read func([]byte) error) error {
	total := 0
	for _, s := range spans {
		total += len(s)
	}
	if uint64(total) != h.length {
		return fmt.Errorf("object %s: %w", key,
			corruptf("length mismatch: object holds %d bytes, destination block is %d bytes", h.length, total))
	}
	var crc uint32
	for _, s := range spans {
		for len(s) > 0 {
			p := s[:min(len(s), pieceSize)]
			if err := read(p); err != nil {
				return err
			}
			crc = crc32c.Update(crc, p)
			s = s[len(p):]
		}
	}
	if crc != h.crc {
		return fmt.Errorf("object %s: %w", key, corruptf("crc32c mismatch: stored 0x%08x computed 0x%08x", h.crc, crc))
	}
	return nil
}
