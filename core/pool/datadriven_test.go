package pool

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/internal/datadriven"
)

// TestData runs the policy scripts in testdata/. Commands (keys are words,
// block ids numbers):
//
//	new blocks=N [admit=N] [max-events=N] [writeback]
//	allocate N
//	store KEY...             PrepareStore: one line per key
//	register KEY:ID...
//	release ID...  pin ID...  unpin ID...
//	touch KEY...  remove KEY...  clear  acquire KEY  lookup KEY...
//	lru                      evictable blocks, least recently used first
//	events                   drains the events
//	stats
//
// With writeback, blocks the pool evicts are printed as "evict KEY from ID"
// (the OnEvict hook) before the command's own output.
func TestData(t *testing.T) {
	datadriven.RunScripts(t, "testdata", func() *script { return &script{} }, map[string]func(*script, *testing.T, datadriven.Command) string{
		"new":      (*script).new,
		"allocate": (*script).allocate,
		"store":    (*script).store,
		"register": (*script).register,
		"release":  idsOp((*Pool).Release),
		"pin":      idsOp((*Pool).Pin),
		"unpin":    idsOp((*Pool).Unpin),
		"touch":    func(s *script, t *testing.T, c datadriven.Command) string { return fmt.Sprint(s.p.Touch(keys(t, c))) },
		"remove":   func(s *script, t *testing.T, c datadriven.Command) string { return fmt.Sprint(s.p.Remove(keys(t, c))) },
		"clear":    func(s *script, t *testing.T, c datadriven.Command) string { return fmt.Sprint(s.p.Clear()) },
		"acquire":  (*script).acquire,
		"lookup":   (*script).lookup,
		"lru":      (*script).lru,
		"events":   (*script).events,
		"stats":    (*script).stats,
	})
}

type script struct {
	p       *Pool
	evicted []string
}

func (s *script) out(lines ...string) string {
	all := append(s.evicted, lines...)
	s.evicted = nil
	return strings.Join(all, "\n")
}

func intArg(t *testing.T, c datadriven.Command, key string) int {
	v, ok := c.Arg(key)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, c.Line)
	return n
}

func keys(t *testing.T, c datadriven.Command) []Key {
	var ks []Key
	for _, w := range c.Words() {
		k, err := KeyOf(strings.TrimSuffix(w, "!")) // "!" only marks a key in a script
		if w == "-" {
			k = Key{}
		} else {
			require.NoError(t, err, c.Line)
		}
		ks = append(ks, k)
	}
	return ks
}

func ids(t *testing.T, words []string) []int {
	out := make([]int, len(words))
	for i, w := range words {
		n, err := strconv.Atoi(w)
		require.NoError(t, err, w)
		out[i] = n
	}
	return out
}

func errLine(err error) string { return "error: " + err.Error() }

func (s *script) new(t *testing.T, c datadriven.Command) string {
	cfg := Config{Blocks: intArg(t, c, "blocks"), AdmitAfter: intArg(t, c, "admit"), MaxEvents: intArg(t, c, "max-events")}
	for _, w := range c.Words() {
		require.Equal(t, "writeback", w, c.Line)
		cfg.OnEvict = func(k Key, id int) { s.evicted = append(s.evicted, fmt.Sprintf("evict %s from %d", name(k), id)) }
	}
	p, err := New(cfg)
	if err != nil {
		return errLine(err)
	}
	s.p = p
	return "ok"
}

// name prints a key as the word it was made from.
func name(k Key) string { return string(k.Bytes()) }

func (s *script) allocate(t *testing.T, c datadriven.Command) string {
	n, err := strconv.Atoi(c.Word(t, 0))
	require.NoError(t, err)
	got, err := s.p.Allocate(n, nil)
	if err != nil {
		return s.out(errLine(err))
	}
	return s.out(fmt.Sprint(got))
}

func (s *script) store(t *testing.T, c datadriven.Command) string {
	ks := keys(t, c)
	got, ds, err := s.p.PrepareStore(ks)
	if err != nil {
		return s.out(errLine(err))
	}
	var lines []string
	for i, k := range ks {
		line := name(k) + " " + ds[i].String()
		if got[i] >= 0 {
			line += fmt.Sprintf(" %d", got[i])
		}
		lines = append(lines, line)
	}
	return s.out(lines...)
}

func (s *script) register(t *testing.T, c datadriven.Command) string {
	var ks []Key
	var is []int
	for _, w := range c.Words() {
		kw, iw, ok := strings.Cut(w, ":")
		require.True(t, ok, "register KEY:ID, not %q", w)
		k, err := KeyOf(kw)
		require.NoError(t, err)
		ks = append(ks, k)
		is = append(is, ids(t, []string{iw})...)
	}
	if err := s.p.Register(ks, is); err != nil {
		return s.out(errLine(err))
	}
	return s.out("ok")
}

func idsOp(op func(*Pool, []int) error) func(*script, *testing.T, datadriven.Command) string {
	return func(s *script, t *testing.T, c datadriven.Command) string {
		if err := op(s.p, ids(t, c.Words())); err != nil {
			return s.out(errLine(err))
		}
		return s.out("ok")
	}
}

func (s *script) acquire(t *testing.T, c datadriven.Command) string {
	id, ok := s.p.Acquire(keys(t, c)[0])
	if !ok {
		return "miss"
	}
	return fmt.Sprintf("hit %d", id)
}

func (s *script) lookup(t *testing.T, c datadriven.Command) string {
	got := s.p.Lookup(keys(t, c), nil)
	return fmt.Sprintf("%d %v", len(got), got)
}

func (s *script) lru(_ *testing.T, _ datadriven.Command) string {
	var words []string
	for _, id := range s.p.LRU() {
		words = append(words, fmt.Sprintf("%s:%d", name(s.p.blocks[id].key), id))
	}
	return "[" + strings.Join(words, " ") + "]"
}

func (s *script) events(_ *testing.T, _ datadriven.Command) string {
	var lines []string
	for _, e := range s.p.DrainEvents(nil, 0) {
		lines = append(lines, fmt.Sprintf("%v %s", e.Kind, name(e.Key)))
	}
	if lines == nil {
		return "none"
	}
	return strings.Join(lines, "\n")
}

func (s *script) stats(_ *testing.T, _ datadriven.Command) string {
	st := s.p.Stats()
	return fmt.Sprintf("free=%d allocated=%d storing=%d registered=%d pinned=%d removing=%d\n"+
		"hits=%d misses=%d evictions=%d stored=%d removed=%d admitted=%d rejected=%d deduped=%d no-space=%d dropped=%d",
		st.Free, st.Allocated, st.Storing, st.Registered, st.Pinned, st.Removing,
		st.Hits, st.Misses, st.Evictions, st.Stored, st.Removed, st.Admitted, st.Rejected, st.Deduped, st.NoSpace, st.EventsDropped)
}
