package pool

import (
	"slices"
)

// model is the reference the property test holds the pool to: the same
// contract written the plainest way (maps, linear scans, timestamps for
// recency instead of a list).
type model struct {
	n          int
	blocks     []mblock
	free       []int // a stack, as the pool's
	clock      int
	admitAfter int
	seen       map[Key]int
	events     []Event
}

type mblock struct {
	state state
	key   Key
	pins  int
	last  int // recency: higher is more recent
}

func newModel(n, admitAfter int) *model {
	m := &model{n: n, blocks: make([]mblock, n), admitAfter: admitAfter, seen: map[Key]int{}}
	for i := n - 1; i >= 0; i-- {
		m.free = append(m.free, i)
	}
	return m
}

func (m *model) tick() int { m.clock++; return m.clock }

func (m *model) find(k Key) (int, bool) {
	for i, b := range m.blocks {
		if (b.state == stateRegistered || b.state == stateStoring) && b.key == k {
			return i, true
		}
	}
	return -1, false
}

func (m *model) get(k Key) (int, bool) {
	i, ok := m.find(k)
	if ok && m.blocks[i].state == stateRegistered {
		return i, true
	}
	return -1, false
}

func (m *model) evictable(exclude map[int]bool) []int {
	var ids []int
	for i, b := range m.blocks {
		if b.state == stateRegistered && b.pins == 0 && !exclude[i] {
			ids = append(ids, i)
		}
	}
	slices.SortFunc(ids, func(a, b int) int { return m.blocks[a].last - m.blocks[b].last })
	return ids
}

func (m *model) take(s state, k Key, exclude map[int]bool) int {
	var id int
	if len(m.free) > 0 {
		id = m.free[len(m.free)-1]
		m.free = m.free[:len(m.free)-1]
	} else {
		id = m.evictable(exclude)[0]
		m.events = append(m.events, Event{Removed, 0, m.blocks[id].key})
	}
	m.blocks[id] = mblock{state: s, key: k}
	return id
}

func (m *model) setFree(id int) {
	m.blocks[id] = mblock{}
	m.free = append(m.free, id)
}

func distinctIDs(ids []int, n int) bool {
	seen := map[int]bool{}
	for _, id := range ids {
		if id < 0 || id >= n || seen[id] {
			return false
		}
		seen[id] = true
	}
	return true
}

func distinctKeys(keys []Key) bool {
	seen := map[Key]bool{}
	for _, k := range keys {
		if k.IsZero() || seen[k] {
			return false
		}
		seen[k] = true
	}
	return true
}

func (m *model) allocate(n int) ([]int, bool) {
	if n < 0 || n > len(m.free)+len(m.evictable(nil)) {
		return nil, false
	}
	var ids []int
	for range n {
		ids = append(ids, m.take(stateAllocated, Key{}, nil))
	}
	return ids, true
}

func (m *model) register(keys []Key, ids []int) bool {
	if len(keys) != len(ids) || !distinctIDs(ids, m.n) || !distinctKeys(keys) {
		return false
	}
	for i, id := range ids {
		b := m.blocks[id]
		switch b.state {
		case stateAllocated:
			if _, ok := m.find(keys[i]); ok {
				return false
			}
		case stateStoring:
			if b.key != keys[i] {
				return false
			}
		default:
			return false
		}
	}
	for i, id := range ids {
		m.blocks[id] = mblock{state: stateRegistered, key: keys[i], last: m.tick()}
		m.events = append(m.events, Event{Stored, 0, keys[i]})
	}
	return true
}

func (m *model) release(ids []int) bool {
	if !distinctIDs(ids, m.n) {
		return false
	}
	for _, id := range ids {
		if s := m.blocks[id].state; s != stateAllocated && s != stateStoring {
			return false
		}
	}
	for _, id := range ids {
		m.setFree(id)
	}
	return true
}

func (m *model) pin(ids []int) bool {
	if !distinctIDs(ids, m.n) {
		return false
	}
	for _, id := range ids {
		if m.blocks[id].state != stateRegistered {
			return false
		}
	}
	for _, id := range ids {
		m.blocks[id].pins++
	}
	return true
}

func (m *model) unpin1(id int) {
	b := &m.blocks[id]
	b.pins--
	if b.pins > 0 {
		return
	}
	if b.state == stateRemoved {
		m.setFree(id)
		return
	}
	b.last = m.tick()
}

func (m *model) unpin(ids []int) bool {
	if !distinctIDs(ids, m.n) {
		return false
	}
	for _, id := range ids {
		if m.blocks[id].pins == 0 {
			return false
		}
	}
	for _, id := range ids {
		m.unpin1(id)
	}
	return true
}

func (m *model) touch(keys []Key) int {
	n := 0
	for _, k := range keys {
		if id, ok := m.get(k); ok {
			if m.blocks[id].pins == 0 {
				m.blocks[id].last = m.tick()
			}
			n++
		}
	}
	return n
}

func (m *model) remove(keys []Key) int {
	n := 0
	for _, k := range keys {
		id, ok := m.get(k)
		if !ok {
			continue
		}
		m.events = append(m.events, Event{Removed, 0, k})
		n++
		if m.blocks[id].pins > 0 {
			m.blocks[id].state, m.blocks[id].key = stateRemoved, Key{}
			continue
		}
		m.setFree(id)
	}
	return n
}

func (m *model) see(k Key) int {
	if m.admitAfter <= 1 {
		return 0
	}
	m.seen[k]++
	return m.seen[k]
}

func (m *model) acquire(k Key) (int, bool) {
	m.see(k)
	id, ok := m.get(k)
	if !ok {
		return -1, false
	}
	m.blocks[id].pins++
	return id, true
}

func (m *model) lookup(keys []Key) []int {
	var ids []int
	for _, k := range keys {
		id, ok := m.get(k)
		if !ok {
			break
		}
		ids = append(ids, id)
	}
	return ids
}

func (m *model) prepareStore(keys []Key) ([]int, []Decision, bool) {
	if !distinctKeys(keys) {
		return nil, nil, false
	}
	ids := make([]int, len(keys))
	ds := make([]Decision, len(keys))
	held := map[int]bool{}
	for i, k := range keys {
		ids[i] = -1
		id, ok := m.find(k)
		switch {
		case !ok:
			if m.admitAfter <= 1 || m.see(k) >= m.admitAfter {
				ds[i] = Store
			} else {
				ds[i] = NotAdmitted
			}
		case m.blocks[id].state == stateStoring:
			ds[i] = InFlight
		default:
			ds[i] = Present
			held[id] = true
			m.blocks[id].pins++
		}
	}
	for i, k := range keys {
		if ds[i] != Store {
			continue
		}
		if len(m.free)+len(m.evictable(held)) == 0 {
			ds[i] = NoSpace
			continue
		}
		ids[i] = m.take(stateStoring, k, held)
	}
	for i, k := range keys {
		if ds[i] == Present {
			id, _ := m.find(k)
			m.unpin1(id)
		}
	}
	return ids, ds, true
}
