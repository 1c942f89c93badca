package cuda

import (
	"cmp"
	"slices"
	"sort"
)

// deviceRanges is the real driver's index of device memory the copy kernel
// may touch: MemAlloc allocations and RegisterDeviceRange ranges, per
// device. Ranges may overlap and repeat (an engine may register views of
// one tensor, or one range twice); each add is undone by one remove. It
// answers whether a range lies wholly inside one known range of a device.
// Not safe for concurrent use (the driver's mutex guards it).
type deviceRanges struct {
	count map[devRange]int
	index map[int][]indexedRange // per device, by start; rebuilt when stale
	stale map[int]bool
}

type devRange struct {
	dev         int
	start, size uint64
}

// indexedRange is one range of the sorted index with the furthest end of
// it and every range before it.
type indexedRange struct {
	start, maxEnd uint64
}

func (d *deviceRanges) add(dev int, start, size uint64) {
	if size == 0 || start+size < start {
		return
	}
	if d.count == nil {
		d.count, d.index, d.stale = map[devRange]int{}, map[int][]indexedRange{}, map[int]bool{}
	}
	d.count[devRange{dev, start, size}]++
	d.stale[dev] = true
}

// remove undoes one add of the same range; false when there is none.
func (d *deviceRanges) remove(dev int, start, size uint64) bool {
	k := devRange{dev, start, size}
	n := d.count[k]
	switch {
	case n == 0:
		return false
	case n == 1:
		delete(d.count, k)
	default:
		d.count[k] = n - 1
	}
	d.stale[dev] = true
	return true
}

// contains reports whether [p, p+n) lies inside one range of dev.
func (d *deviceRanges) contains(dev int, p, n uint64) bool {
	end := p + n
	if end < p {
		return false
	}
	if d.stale[dev] {
		d.rebuild(dev)
	}
	idx := d.index[dev]
	// The ranges starting at or before p are idx[:i]; one of them holds
	// [p, end) exactly when the furthest end among them reaches end.
	i := sort.Search(len(idx), func(i int) bool { return idx[i].start > p })
	return i > 0 && idx[i-1].maxEnd >= end
}

func (d *deviceRanges) rebuild(dev int) {
	var idx []indexedRange
	for k := range d.count {
		if k.dev == dev {
			idx = append(idx, indexedRange{k.start, k.start + k.size})
		}
	}
	slices.SortFunc(idx, func(a, b indexedRange) int { return cmp.Compare(a.start, b.start) })
	for i := 1; i < len(idx); i++ {
		idx[i].maxEnd = max(idx[i].maxEnd, idx[i-1].maxEnd)
	}
	d.index[dev] = idx
	delete(d.stale, dev)
}
