package pool

import (
	"math"
	"math/bits"
	"strconv"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Config configures a Pool.
type Config struct {
	// Blocks is the number of block ids the pool covers, [0, Blocks).
	Blocks int
	// Tier labels the pool's events (its owner's tier number).
	Tier int
	// AdmitAfter is the offload admission policy: PrepareStore admits a key
	// once it has been seen this many times, counting the offer itself;
	// Acquire and PrepareStore see keys (Dynamo's frequency filter). 0 or
	// 1 admits every key.
	AdmitAfter int
	// OnEvict, when set, is called for each registered block that Allocate
	// or PrepareStore evicts, after its key left the pool and before the
	// block is handed out, so that the owner can write the block down to
	// the next tier before it reuses it (write-back). It must not call the
	// pool.
	OnEvict func(k Key, id int)
	// MaxEvents bounds the events not yet drained; beyond it new events are
	// dropped and counted in Stats.EventsDropped. 0 means 65,536; a
	// negative value records no events.
	MaxEvents int
}

type state uint8

const (
	stateFree state = iota
	stateAllocated
	stateStoring
	stateRegistered
	// stateRemoved: the key was removed while the block was pinned; the
	// block is free once its last pin is released.
	stateRemoved
)

var stateNames = [...]string{"free", "allocated", "storing", "registered", "removed"}

func (s state) String() string { return stateNames[s] }

type block struct {
	// state and the key come first, so that a lookup of a key of up to 62
	// bytes reads one cache line of the block.
	state state
	key   Key
	// mark detects an id repeated within one call (see Pool.epoch).
	mark uint32
	// prev and next link the block into the LRU list while it is
	// evictable: registered and unpinned.
	prev, next int32
	pins       int32
	_          [44]byte // pads to 128 bytes: blocks start on a cache line
}

// Pool is the block pool of one tier. It is not safe for concurrent use:
// its owner serializes calls.
type Pool struct {
	cfg    Config
	blocks []block // cfg.Blocks blocks, then the LRU list's sentinel
	index  index
	free   []int32 // a stack of free ids
	// evictable is the length of the LRU list; count the blocks by state;
	// pinned the registered blocks with pins.
	evictable int
	count     [len(stateNames)]int
	pinned    int
	seen      map[Key]uint32
	seenLimit int
	events    EventQueue
	stats     Stats
	// epoch, hashes and seenIn check a call's ids and keys for repeats without
	// allocating.
	epoch  uint32
	hashes []uint32
	seenIn []int32
}

// New makes a pool of cfg.Blocks free blocks.
func New(cfg Config) (*Pool, error) {
	if cfg.Blocks < 1 || cfg.Blocks >= math.MaxInt32 {
		return nil, kvbmerr.Detail(ErrInvalidArgument, "pool of "+strconv.Itoa(cfg.Blocks)+" blocks, want 1 to "+strconv.Itoa(math.MaxInt32-1))
	}
	if cfg.AdmitAfter < 0 {
		return nil, kvbmerr.Detail(ErrInvalidArgument, "AdmitAfter "+strconv.Itoa(cfg.AdmitAfter)+" is negative")
	}
	p := &Pool{
		cfg:       cfg,
		blocks:    make([]block, cfg.Blocks+1),
		free:      make([]int32, cfg.Blocks),
		seenLimit: max(1024, 4*cfg.Blocks),
		events:    NewEventQueue(cfg.MaxEvents),
	}
	p.index = newIndex(p.blocks, cfg.Blocks)
	if cfg.AdmitAfter > 1 {
		p.seen = make(map[Key]uint32)
	}
	p.count[stateFree] = cfg.Blocks
	for i := range p.free {
		p.free[i] = int32(cfg.Blocks - 1 - i) // pop hands out 0, 1, 2, …
	}
	s := p.sentinel()
	p.blocks[s].prev, p.blocks[s].next = s, s
	return p, nil
}

// Blocks is the number of block ids the pool covers.
func (p *Pool) Blocks() int { return p.cfg.Blocks }

// Tier is the pool's tier label.
func (p *Pool) Tier() int { return p.cfg.Tier }

// Get returns the block holding k, if k is registered. It changes nothing.
func (p *Pool) Get(k Key) (id int, ok bool) { return p.get(&k) }

// get is Get without copying the key.
func (p *Pool) get(k *Key) (int, bool) {
	s := p.index.find(k)
	if s < 0 {
		return -1, false
	}
	i := uint32(p.index.slots[s]) - 1
	if p.blocks[i].state != stateRegistered {
		return -1, false
	}
	return int(i), true
}

// Lookup appends to dst the blocks of the longest prefix of keys that is
// registered, stopping at the first key that is not (absent, or still
// being stored). It changes nothing: a scheduler may ask repeatedly.
func (p *Pool) Lookup(keys []Key, dst []int) []int {
	for i := range keys {
		id, ok := p.get(&keys[i])
		if !ok {
			break
		}
		dst = append(dst, id)
	}
	return dst
}

// Acquire looks k up for a transfer that will read it: a registered block
// is pinned (Unpin it when the transfer ends) and counted as a hit;
// otherwise a miss. Either way the key is seen by the admission filter.
func (p *Pool) Acquire(k Key) (id int, ok bool) {
	p.see(k)
	id, ok = p.Get(k)
	if !ok {
		p.stats.Misses++
		return -1, false
	}
	p.pin(int32(id))
	p.stats.Hits++
	return id, true
}

// Allocate appends n blocks to dst: free ones first, then registered
// unpinned ones evicted in least-recently-used order. The blocks are
// allocated: Register or Release each. When fewer than n can be had it
// returns ErrNoSpace and changes nothing.
func (p *Pool) Allocate(n int, dst []int) ([]int, error) {
	if n < 0 {
		return dst, kvbmerr.Detail(ErrInvalidArgument, "allocate "+strconv.Itoa(n)+" blocks")
	}
	if avail := p.Available(); n > avail {
		return dst, kvbmerr.Detail(ErrNoSpace, strconv.Itoa(n)+" blocks wanted, "+strconv.Itoa(avail)+" free or evictable of "+strconv.Itoa(p.cfg.Blocks))
	}
	for range n {
		dst = append(dst, int(p.take(stateAllocated, Key{})))
	}
	return dst, nil
}

// Claim takes the free blocks ids as allocated, as Allocate would hand
// them out (Register or Release each): the blocks a restored tier's
// journal names, kept from new stores until each is vouched for. A block
// that is not free fails the call, which then changes nothing.
func (p *Pool) Claim(ids []int) error {
	if err := p.checkIDs("claim", ids); err != nil {
		return err
	}
	for _, id := range ids {
		if s := p.blocks[id].state; s != stateFree {
			return kvbmerr.Detail(ErrState, "claim block "+strconv.Itoa(id)+", which is "+s.String()+", not free")
		}
	}
	claimed := p.epoch // checkIDs marked each id of the call with it
	free := p.free[:0]
	for _, id := range p.free {
		if p.blocks[id].mark != claimed {
			free = append(free, id)
		}
	}
	p.free = free
	for _, id := range ids {
		p.set(int32(id), stateAllocated, Key{})
		p.blocks[id].pins = 0
	}
	return nil
}

// Register makes keys[i] present in block ids[i], once its data has
// landed. Each block must be allocated, or storing keys[i]; no key may be
// present already. The blocks become evictable, most recently used last.
func (p *Pool) Register(keys []Key, ids []int) error {
	if len(keys) != len(ids) {
		return kvbmerr.Detail(ErrInvalidArgument, "register "+strconv.Itoa(len(keys))+" keys with "+strconv.Itoa(len(ids))+" block ids")
	}
	if err := p.checkIDs("register", ids); err != nil {
		return err
	}
	if err := p.checkKeys("register", keys); err != nil {
		return err
	}
	for i, id := range ids {
		b := &p.blocks[id]
		switch b.state {
		case stateAllocated:
			if p.index.findH(&keys[i], p.hashes[i]) >= 0 {
				return kvbmerr.Detail(ErrAlreadyExists, "register keys["+strconv.Itoa(i)+"] "+keys[i].String()+": the pool holds it already")
			}
		case stateStoring:
			if b.key != keys[i] {
				return kvbmerr.Detail(ErrInvalidArgument, "register keys["+strconv.Itoa(i)+"] "+keys[i].String()+
					" in block "+strconv.Itoa(id)+", which is storing key "+b.key.String())
			}
		default:
			return kvbmerr.Detail(ErrState, "register in block "+strconv.Itoa(id)+", which is "+b.state.String()+", not allocated or storing")
		}
	}
	for i, id := range ids {
		if p.blocks[id].state == stateAllocated {
			p.index.putH(int32(id), p.hashes[i])
		}
		p.set(int32(id), stateRegistered, keys[i])
		p.blocks[id].pins = 0
		p.lruPushBack(int32(id))
		p.record(Stored, &keys[i])
		p.stats.Stored++
	}
	return nil
}

// Release frees blocks that were allocated and never registered (a store
// whose transfer failed); a storing key is dropped with its block.
func (p *Pool) Release(ids []int) error {
	if err := p.checkIDs("release", ids); err != nil {
		return err
	}
	for _, id := range ids {
		if s := p.blocks[id].state; s != stateAllocated && s != stateStoring {
			return kvbmerr.Detail(ErrState, "release block "+strconv.Itoa(id)+", which is "+s.String()+", not allocated or storing")
		}
	}
	for _, id := range ids {
		b := &p.blocks[id]
		if b.state == stateStoring {
			p.index.del(&b.key)
		}
		p.setFree(int32(id))
	}
	return nil
}

// Pin adds a reference to each registered block, for a transfer that reads
// it; a pinned block is never evicted. Ids may not repeat in one call.
func (p *Pool) Pin(ids []int) error {
	if err := p.checkIDs("pin", ids); err != nil {
		return err
	}
	for _, id := range ids {
		if s := p.blocks[id].state; s != stateRegistered {
			return kvbmerr.Detail(ErrState, "pin block "+strconv.Itoa(id)+", which is "+s.String()+", not registered")
		}
	}
	for _, id := range ids {
		p.pin(int32(id))
	}
	return nil
}

// Unpin drops a reference from each block. A registered block whose last
// pin goes becomes the most recently used; a block removed while pinned
// becomes free. Ids may not repeat in one call.
func (p *Pool) Unpin(ids []int) error {
	if err := p.checkIDs("unpin", ids); err != nil {
		return err
	}
	for _, id := range ids {
		if b := &p.blocks[id]; b.pins == 0 {
			return kvbmerr.Detail(ErrState, "unpin block "+strconv.Itoa(id)+", which is "+b.state.String()+" and not pinned")
		}
	}
	for _, id := range ids {
		p.unpin(int32(id))
	}
	return nil
}

// Touch makes the registered blocks of keys the most recently used, in
// order; keys not present are ignored. It returns how many were touched.
func (p *Pool) Touch(keys []Key) int {
	n := 0
	for _, k := range keys {
		id, ok := p.Get(k)
		if !ok {
			continue
		}
		if p.blocks[id].pins == 0 {
			p.lruRemove(int32(id))
			p.lruPushBack(int32(id))
		}
		n++
	}
	return n
}

// Remove takes registered keys out of the pool (found corrupt, or dropped
// by the owner); absent keys and keys still storing are ignored. A pinned
// block loses its key at once and is freed at its last Unpin. It returns
// how many keys were removed.
func (p *Pool) Remove(keys []Key) int {
	n := 0
	for _, k := range keys {
		id, ok := p.Get(k)
		if !ok {
			continue
		}
		b := &p.blocks[id]
		p.index.del(&k)
		p.record(Removed, &k)
		p.stats.Removed++
		n++
		if b.pins > 0 {
			p.set(int32(id), stateRemoved, Key{})
			p.pinned--
			continue
		}
		p.lruRemove(int32(id))
		p.setFree(int32(id))
	}
	return n
}

// Clear removes every registered key, as Remove does (a pinned block loses
// its key at once and is freed at its last Unpin); keys still storing are
// left to land. It returns how many keys were removed.
func (p *Pool) Clear() int {
	var keys []Key
	for i := range p.blocks {
		if p.blocks[i].state == stateRegistered {
			keys = append(keys, p.blocks[i].key)
		}
	}
	return p.Remove(keys)
}

// Decision is what PrepareStore decided for one key.
type Decision uint8

const (
	// Store: a block was allocated for the key, which is now storing.
	Store Decision = iota
	// Present: the key is registered already; nothing to store (its block
	// was touched).
	Present
	// InFlight: the key is being stored already; nothing to store.
	InFlight
	// NotAdmitted: the admission policy has not seen the key often enough.
	NotAdmitted
	// NoSpace: no free or evictable block was left for the key.
	NoSpace
)

var decisionNames = [...]string{"store", "present", "in-flight", "not-admitted", "no-space"}

func (d Decision) String() string {
	if int(d) < len(decisionNames) {
		return decisionNames[d]
	}
	return "Decision(" + strconv.Itoa(int(d)) + ")"
}

// PrepareStore decides, for each key to offload, whether to store it, and
// allocates a block for each key stored (ids[i] is -1 for the others).
// Storing a key that is present or in flight is a no-op that says so
// (dedupe). Keys are stored in order while blocks last; blocks of keys of
// the same call are never evicted for it. Each stored block is storing:
// Register it once its data landed, or Release it. Keys may not repeat.
func (p *Pool) PrepareStore(keys []Key) (ids []int, decisions []Decision, err error) {
	if err := p.checkKeys("store", keys); err != nil {
		return nil, nil, err
	}
	ids = make([]int, len(keys))
	decisions = make([]Decision, len(keys))
	// Pin present keys while blocks are found, so that the call never
	// evicts its own keys; they end most recently used, in order.
	var held int
	for i, k := range keys {
		ids[i] = -1
		id, ok := p.index.get(k)
		switch {
		case !ok:
			if p.admit(k) {
				decisions[i] = Store
			} else {
				decisions[i] = NotAdmitted
				p.stats.Rejected++
			}
		case p.blocks[id].state == stateStoring:
			decisions[i] = InFlight
			p.stats.Deduped++
		default:
			decisions[i] = Present
			p.stats.Deduped++
			p.pin(id)
			held++
		}
	}
	for i, k := range keys {
		if decisions[i] != Store {
			continue
		}
		if p.Available() == 0 {
			decisions[i] = NoSpace
			p.stats.NoSpace++
			continue
		}
		ids[i] = int(p.take(stateStoring, k))
		p.index.put(k, int32(ids[i]))
		p.stats.Admitted++
	}
	if held > 0 {
		for i, k := range keys {
			if decisions[i] == Present {
				id, _ := p.index.get(k)
				p.unpin(id)
			}
		}
	}
	return ids, decisions, nil
}

// admit applies the admission policy to a key being offered for storage.
func (p *Pool) admit(k Key) bool {
	if p.seen == nil {
		return true
	}
	return p.see(k) >= uint32(p.cfg.AdmitAfter)
}

// see counts a sighting of k for the admission filter and returns the
// count. The counts are bounded: when the table is full they are halved
// and those that reach zero are dropped, so old sightings fade.
func (p *Pool) see(k Key) uint32 {
	if p.seen == nil {
		return 0
	}
	c, ok := p.seen[k]
	if !ok && len(p.seen) >= p.seenLimit {
		for sk, sc := range p.seen {
			if sc /= 2; sc == 0 {
				delete(p.seen, sk)
			} else {
				p.seen[sk] = sc
			}
		}
	}
	c++
	p.seen[k] = c
	return c
}

// take hands out one block: a free one, else the least recently used
// evictable one. The caller checked that one exists.
func (p *Pool) take(s state, k Key) int32 {
	var id int32
	if n := len(p.free); n > 0 {
		id = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		id = p.blocks[p.sentinel()].next
		b := &p.blocks[id]
		victim := b.key
		p.lruRemove(id)
		p.index.del(&victim)
		p.set(id, stateFree, Key{})
		p.record(Removed, &victim)
		p.stats.Evictions++
		if p.cfg.OnEvict != nil {
			p.cfg.OnEvict(victim, int(id))
		}
	}
	p.set(id, s, k)
	p.blocks[id].pins = 0
	return id
}

func (p *Pool) pin(id int32) {
	b := &p.blocks[id]
	if b.pins == 0 {
		p.lruRemove(id)
		p.pinned++
	}
	b.pins++
}

func (p *Pool) unpin(id int32) {
	b := &p.blocks[id]
	if b.pins--; b.pins > 0 {
		return
	}
	if b.state == stateRemoved {
		p.setFree(id)
		return
	}
	p.pinned--
	p.lruPushBack(id)
}

// set moves block id to state s with key k, keeping the counts by state.
func (p *Pool) set(id int32, s state, k Key) {
	b := &p.blocks[id]
	p.count[b.state]--
	p.count[s]++
	b.state, b.key = s, k
}

func (p *Pool) setFree(id int32) {
	p.set(id, stateFree, Key{})
	p.blocks[id].pins = 0
	p.free = append(p.free, id)
}

// checkIDs checks that ids are in range and distinct.
func (p *Pool) checkIDs(op string, ids []int) error {
	p.epoch++
	if p.epoch == 0 { // wrapped: old marks could match
		for i := range p.blocks {
			p.blocks[i].mark = 0
		}
		p.epoch = 1
	}
	for i, id := range ids {
		if id < 0 || id >= p.cfg.Blocks {
			return kvbmerr.Detail(ErrOutOfRange, op+": ids["+strconv.Itoa(i)+"] = "+strconv.Itoa(id)+", the pool has blocks [0, "+strconv.Itoa(p.cfg.Blocks)+")")
		}
		if b := &p.blocks[id]; b.mark == p.epoch {
			return kvbmerr.Detail(ErrInvalidArgument, op+": block id "+strconv.Itoa(id)+" repeated (ids["+strconv.Itoa(i)+"])")
		} else {
			b.mark = p.epoch
		}
	}
	return nil
}

// checkKeys checks that keys are valid and distinct, and leaves their
// hashes in p.hashes. Repeats are found with a small open-addressing table
// of the call's own (p.seenIn), which costs far less than a map.
func (p *Pool) checkKeys(op string, keys []Key) error {
	p.hashes = p.hashes[:0]
	size := 1 << bits.Len(uint(2*len(keys)))
	if cap(p.seenIn) < size {
		p.seenIn = make([]int32, size)
	}
	table := p.seenIn[:size]
	clear(table)
	mask := uint32(size - 1)
	for i := range keys {
		k := &keys[i]
		if k.IsZero() {
			return kvbmerr.Detail(ErrInvalidArgument, op+": keys["+strconv.Itoa(i)+"] is empty")
		}
		h := p.index.hash(k)
		p.hashes = append(p.hashes, h)
		for j := h & mask; ; j = (j + 1) & mask {
			if table[j] == 0 {
				table[j] = int32(i + 1)
				break
			}
			if o := table[j] - 1; p.hashes[o] == h && keys[o].equal(k) {
				return kvbmerr.Detail(ErrInvalidArgument, op+": key "+k.String()+" repeated (keys["+strconv.Itoa(i)+"])")
			}
		}
	}
	return nil
}

// Available is how many blocks Allocate could hand out now: the free ones
// and the evictable (registered, unpinned) ones.
func (p *Pool) Available() int { return len(p.free) + p.evictable }
