package state

// FNV-1a 32-bit parameters (the offset basis and the prime).
const (
	fnv32Offset = 2166136261
	fnv32Prime  = 16777619
)

// PartitionFNV returns the scale-out partition of partitionKey: FNV-1a
// 32-bit mod partitions (at least 1), exactly what nats-server's subject
// transform {{partition(N,k)}} computes for one token. It places keys among
// a group's instances; PartitionOf places them inside one store
// (docs/state.md). It does not allocate.
func PartitionFNV(partitionKey []byte, partitions int) int {
	h := uint32(fnv32Offset)
	for _, c := range partitionKey {
		h ^= uint32(c)
		h *= fnv32Prime
	}
	return int(h % uint32(partitions))
}
