package capability

// Scope is what a key lets its holder do.
type Scope byte

// The scopes, as an endpoint carries them.
const (
	ScopeReadWrite Scope = 0
	ScopeReadOnly  Scope = 1
	ScopeBlocks    Scope = 2 // read only, some blocks of some layouts (blockscope.go)
)

// Valid reports whether s is one of the scopes.
func (s Scope) Valid() bool { return s <= ScopeBlocks }

// Grant is what a connection's hello proved: a scope, and for a block
// scope its descriptor.
type Grant struct {
	Scope  Scope
	Blocks *BlockScope // ScopeBlocks only
}
