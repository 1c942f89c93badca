package handoff

// HandoffID names one hand-off: 16 bytes, usually a UUID chosen by whoever
// routes the request. Every Fact carries it so that a fact meant for another
// hand-off is caught instead of applied.
type HandoffID [16]byte

// String formats the id as a UUID: 8-4-4-4-12 lowercase hex digits.
func (id HandoffID) String() string {
	const digits = "0123456789abcdef"
	var b [36]byte
	j := 0
	for i, c := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = digits[c>>4], digits[c&0xf]
		j += 2
	}
	return string(b[:])
}

// ActionID names one action issued by a Coordinator. A coordinator numbers
// its actions 1, 2, 3, … in the order it issues them, so 0 is never an
// action's id. Ids are per coordinator: two hand-offs both have an action 1.
type ActionID uint64
