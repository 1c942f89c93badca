package handoff

import "encoding/hex"

// HandoffID names one hand-off: 16 bytes, usually a UUID chosen by whoever
// routes the request. Every Fact carries it so that a fact meant for another
// hand-off is caught instead of applied.
type HandoffID [16]byte

// String formats the id as a UUID: 8-4-4-4-12 lowercase hex digits.
func (id HandoffID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], id[10:16])
	return string(b[:])
}

// ActionID names one action issued by a Coordinator. A coordinator numbers
// its actions 1, 2, 3, … in the order it issues them, so 0 is never an
// action's id. Ids are per coordinator: two hand-offs both have an action 1.
type ActionID uint64
