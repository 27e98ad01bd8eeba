package dedup

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// Key is the 128-bit hash a dedup key is stored as, so that memory per key
// does not depend on how long the publisher's keys are. It is SHA-256
// truncated: a cheap hash would let one producer forge collisions that
// silence another producer's events; with SHA instructions it costs tens of
// nanoseconds.
type Key [16]byte

// KeyOf hashes a dedup key.
func KeyOf(s string) Key {
	sum := sha256.Sum256([]byte(s))
	var k Key
	copy(k[:], sum[:16])
	return k
}

// Hi and Lo are the key's two halves, for hash tables.
func (k Key) Hi() uint64 { return binary.LittleEndian.Uint64(k[:8]) }

// Lo is the second half of the key.
func (k Key) Lo() uint64 { return binary.LittleEndian.Uint64(k[8:]) }

func (k Key) String() string { return hex.EncodeToString(k[:]) }

// MsgTag is a 32-bit fingerprint of a message ID. Stores keep it beside a
// committed key to tell a redelivery (same ID) from a republish (another ID)
// without storing the ID itself.
//
// Message IDs are assigned by the service, not by users, so a fast
// non-cryptographic hash (FNV-1a) is enough here.
func MsgTag(msgID string) uint32 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(msgID); i++ {
		h ^= uint64(msgID[i])
		h *= 1099511628211
	}
	t := uint32(h ^ h>>32)
	if t == 0 {
		t = 1 // 0 means "no tag" to stores
	}
	return t
}
