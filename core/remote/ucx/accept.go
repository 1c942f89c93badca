package ucx

import (
	"cmp"
	"fmt"
	"slices"
)

// What a pull accepts of the exporter's data messages. Each one that
// arrives by rendezvous holds a receive and a sink (sink.go) on the
// importer until UCX completes it, so an exporter that sent data messages
// without end, or the same bytes again and again, would hold the
// importer's memory without end: a pull takes each byte it asked for
// once, and at most maxDataMessages messages. A kvbm exporter sends a
// message per op at most, plus one per half of its device staging buffer
// (2 MiB) and per chunkBytes (serve.go's chunk); the bound allows four
// times as many, so that an exporter of another version with a smaller
// stage is not refused.

// chunkBytes bounds a data message, each a rendezvous of its own: the
// sends of a read complete message by message, and the importer's sink
// for one is small.
const chunkBytes = 4 << 20

// msgBytesAllowed is the bytes a pull allows per data message beyond its
// ops' one each.
const msgBytesAllowed = 256 << 10

// maxDataMessages is how many data messages a read of ops ops and total
// bytes accepts.
func maxDataMessages(ops int, total uint64) int {
	return ops + int(total/msgBytesAllowed) + 1
}

// span is bytes [from, to) of a read's data.
type span struct{ from, to uint64 }

// accepted is what a pull took of its data messages: the bytes (spans in
// order, none touching another) and how many messages.
type accepted struct {
	spans []span
	msgs  int
}

// take accepts a data message of size bytes at offset off of a read of
// total bytes allowing limit messages, or says why not: bytes the read did
// not ask for, bytes already taken, or one message too many.
func (a *accepted) take(off, size, total uint64, limit int) error {
	switch {
	case size == 0:
		return fmt.Errorf("a data message of no bytes, at offset %d", off)
	case off > total || size > total-off:
		return fmt.Errorf("bytes [%d, +%d) of a read of %d bytes", off, size, total)
	case a.msgs >= limit:
		return fmt.Errorf("more than %d data messages for a read of %d bytes", limit, total)
	}
	end := off + size
	// i: the first span that starts at or after off.
	i, _ := slices.BinarySearchFunc(a.spans, off, func(s span, off uint64) int { return cmp.Compare(s.from, off) })
	if i > 0 && a.spans[i-1].to > off || i < len(a.spans) && a.spans[i].from < end {
		return fmt.Errorf("bytes [%d, +%d) of the read again", off, size)
	}
	a.msgs++
	left := i > 0 && a.spans[i-1].to == off
	right := i < len(a.spans) && a.spans[i].from == end
	switch {
	case left && right:
		a.spans[i-1].to = a.spans[i].to
		a.spans = slices.Delete(a.spans, i, i+1)
	case left:
		a.spans[i-1].to = end
	case right:
		a.spans[i].from = off
	default:
		a.spans = slices.Insert(a.spans, i, span{off, end})
	}
	return nil
}
