package state

// FNV-1a 32-bit parameters (the offset basis and the prime).
const (
	fnv32Offset = 2166136261
	fnv32Prime  = 16777619
)

// PartitionFNV returns the scale-out partition of partitionKey: FNV-1a
// 32-bit of the key, mod partitions. It is exactly what nats-server's
// subject transform {{partition(N,k)}} computes when it selects one token
// (the server hashes the selected tokens concatenated with no separator, so
// for several tokens pass their concatenation). It is the one function that
// places a key when instances share partitions through the server: the
// route step calls it for keys that are not a subject token, and for keys
// that are, the server computes it and the stage reads the partition from
// the subject. It is not PartitionOf (xxhash64), which places keys inside a
// single instance's store. partitions must be at least 1. It does not
// allocate.
func PartitionFNV(partitionKey []byte, partitions int) int {
	h := uint32(fnv32Offset)
	for _, c := range partitionKey {
		h ^= uint32(c)
		h *= fnv32Prime
	}
	return int(h % uint32(partitions))
}
