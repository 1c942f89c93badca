package handoff

// journal remembers the actions a coordinator issued and the outcome reported
// for each, so that a repeated report is recognised and a conflicting one
// refused. A coordinator issues each action kind at most once, so a fixed
// array indexed by id-1 holds them all and nothing is allocated.
type journal struct {
	last    ActionID // id of the latest action; ids start at 1
	entries [maxActions]journalEntry
}

type journalEntry struct {
	kind     ActionKind // zero when the slot is unused or cleared
	reported bool
	outcome  Outcome
}

// issue records an action of the given kind and returns its id.
func (j *journal) issue(kind ActionKind) ActionID {
	if int(j.last) >= maxActions {
		// Each kind is issued at most once; more is a bug in this package.
		panic("handoff: more actions issued than there are action kinds")
	}
	j.last++
	j.entries[j.last-1] = journalEntry{kind: kind}
	return j.last
}

// lookup returns the entry of action id, or false when no such action is on
// record.
func (j *journal) lookup(id ActionID) (*journalEntry, bool) {
	if id == 0 || id > j.last {
		return nil, false
	}
	e := &j.entries[id-1]
	return e, e.kind != 0
}

// clear forgets every action and outcome; ids keep counting from where they
// were.
func (j *journal) clear() {
	j.entries = [maxActions]journalEntry{}
}
